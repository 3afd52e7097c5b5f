// mdag's WHEP player (RFC 9725): plays a stream's annotated video (the
// frames with the app's results drawn) in a <video>. No dependencies: one
// POST (SDP offer -> 201, answer, Location) and, when the player stops or
// the page goes away, one DELETE of that Location. Served at
// /whep/player.js; used by the stream page (/stream/{app}) and the
// dashboard.
"use strict";

// whepPlay plays url (/whep/{app}/{stream}) in video and returns the
// session: {pc, resource, stop()}. token (may be empty) goes as
// Authorization: Bearer on the POST and the DELETE. onState gets the
// connection's state ("connecting", "connected", "failed", ...). It
// throws with the server's reason on a refusal (404: not live, 503: the
// viewer limit).
async function whepPlay(url, video, token, onState = () => {}) {
  const pc = new RTCPeerConnection();
  pc.addTransceiver("video", {direction: "recvonly"});
  pc.addEventListener("track", (ev) => {
    video.srcObject = ev.streams[0] || new MediaStream([ev.track]);
    video.play().catch(() => { /* autoplay: the video is muted */ });
  });
  pc.addEventListener("connectionstatechange", () => onState(pc.connectionState));
  await pc.setLocalDescription(await pc.createOffer());
  // No trickle ICE: wait for gathering (at most 2 s) so the offer has candidates.
  await new Promise((resolve) => {
    if (pc.iceGatheringState === "complete") return resolve();
    const t = setTimeout(resolve, 2000);
    pc.addEventListener("icegatheringstatechange", () => {
      if (pc.iceGatheringState === "complete") { clearTimeout(t); resolve(); }
    });
  });
  const headers = {"Content-Type": "application/sdp"};
  if (token) headers["Authorization"] = "Bearer " + token;
  let resp;
  try {
    resp = await fetch(url, {method: "POST", headers, body: pc.localDescription.sdp});
  } catch (e) {
    pc.close();
    throw e;
  }
  if (resp.status !== 201) {
    pc.close();
    throw new Error("WHEP " + resp.status + ": " + (await resp.text()).trim());
  }
  const resource = new URL(resp.headers.get("Location"), new URL(url, location.href)).toString();
  await pc.setRemoteDescription({type: "answer", sdp: await resp.text()});
  let stopped = false;
  const session = {pc, resource};
  // stop ends the viewer: DELETE (keepalive, so it also goes out while the
  // page unloads), then close the connection.
  session.stop = async () => {
    if (stopped) return;
    stopped = true;
    window.removeEventListener("pagehide", session.stop);
    const h = token ? {"Authorization": "Bearer " + token} : {};
    try { await fetch(resource, {method: "DELETE", headers: h, keepalive: true}); } catch (e) { /* closing anyway */ }
    pc.close();
    if (video.srcObject) video.srcObject = null;
  };
  window.addEventListener("pagehide", session.stop);
  return session;
}

// whepLive lists the streams that can be watched (GET /v1/whep: live), or
// null when this server has no WHEP (the lean build).
async function whepLive(token) {
  const headers = token ? {"Authorization": "Bearer " + token} : {};
  const resp = await fetch("/v1/whep", {headers, cache: "no-store"});
  if (resp.status === 404) return null;
  if (!resp.ok) throw new Error("GET /v1/whep " + resp.status + ": " + (await resp.text()).trim());
  return await resp.json();
}

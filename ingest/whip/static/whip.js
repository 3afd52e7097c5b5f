// mdag's browser client: camera -> WHIP (RFC 9725) -> mdag; results from
// the "results" DataChannel drawn over the video. No dependencies: the WHIP
// exchange is one POST (offer -> answer, Location) and one DELETE.
"use strict";

// whipPublish offers stream to url and returns {pc, dc, resource}.
async function whipPublish(url, stream, token, onResult) {
  const pc = new RTCPeerConnection();
  for (const track of stream.getVideoTracks()) {
    const tr = pc.addTransceiver(track, {direction: "sendonly"});
    try { // mdag decodes VP8: offer it first (or only)
      const vp8 = RTCRtpSender.getCapabilities("video").codecs.filter(c => /vp8|rtx/i.test(c.mimeType));
      if (vp8.length) tr.setCodecPreferences(vp8);
    } catch (e) { /* older browsers: VP8 is in every default offer */ }
  }
  const dc = pc.createDataChannel("results");
  dc.onmessage = (ev) => onResult(JSON.parse(ev.data));
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
  const resp = await fetch(url, {method: "POST", headers, body: pc.localDescription.sdp});
  if (resp.status !== 201) {
    pc.close();
    throw new Error("WHIP " + resp.status + ": " + (await resp.text()).trim());
  }
  const resource = new URL(resp.headers.get("Location"), new URL(url, location.href)).toString();
  await pc.setRemoteDescription({type: "answer", sdp: await resp.text()});
  return {pc, dc, resource};
}

async function whipStop(session, token) {
  const headers = token ? {"Authorization": "Bearer " + token} : {};
  try { await fetch(session.resource, {method: "DELETE", headers}); } catch (e) { /* closing anyway */ }
  session.pc.close();
}

// mdagStreamPage wires the page; window.mdagStats is what tests read.
function mdagStreamPage({app}) {
  const $ = (id) => document.getElementById(id);
  const video = $("video"), canvas = $("overlay"), status = $("status");
  const token = new URLSearchParams(location.hash.slice(1)).get("token") ||
                new URLSearchParams(location.search).get("token") || "";
  const stats = window.mdagStats = {state: "idle", results: 0, finished: 0, late: 0, dropped: 0, error: "", last: null};
  let session = null, camera = null;

  function show() {
    const rate = stats.results ? (100 * stats.finished / stats.results).toFixed(1) + "%" : "-";
    const last = stats.last;
    status.className = stats.error ? "err" : "";
    status.textContent = stats.error ? stats.error :
      `${stats.state}: ${stats.results} results, finished within SLO ${rate}` +
      (last ? `; last frame ${last.frame} ${last.outcome} in ${last.latency_ms.toFixed(1)} ms` +
              (last.reason ? ` (${last.module}: ${last.reason})` : "") +
              (last.counts ? " " + JSON.stringify(last.counts) : "") : "");
  }

  function draw(r) {
    if (r.ended !== undefined) { // the server ended the stream: say why
      stats.state = "ended"; stats.error = "the server ended the stream: " + r.ended; show();
      if (session) session.pc.close();
      if (camera) camera.getTracks().forEach(t => t.stop());
      session = camera = null;
      $("stop").disabled = true; $("start").disabled = false;
      return;
    }
    stats.results++;
    stats[r.outcome] = (stats[r.outcome] || 0) + 1;
    stats.last = r;
    canvas.width = video.clientWidth; canvas.height = video.clientHeight;
    const g = canvas.getContext("2d");
    g.clearRect(0, 0, canvas.width, canvas.height);
    if (r.width && r.boxes) {
      const sx = canvas.width / r.width, sy = canvas.height / r.height;
      g.lineWidth = 2; g.font = "13px sans-serif";
      for (const b of r.boxes) {
        g.strokeStyle = g.fillStyle = r.outcome === "finished" ? "#3f3" : "#fa3";
        g.strokeRect(b.x * sx, b.y * sy, b.w * sx, b.h * sy);
        if (b.class) g.fillText(b.class, b.x * sx + 3, b.y * sy + 14);
      }
    }
    show();
  }

  async function start() {
    $("start").disabled = true; stats.error = "";
    try {
      stats.state = "opening camera"; show();
      camera = await navigator.mediaDevices.getUserMedia({video: {width: 640, height: 480}, audio: false});
      video.srcObject = camera;
      stats.state = "connecting"; show();
      session = await whipPublish("/whip/" + encodeURIComponent(app), camera, token, draw);
      session.pc.addEventListener("connectionstatechange", () => { stats.state = session.pc.connectionState; show(); });
      stats.state = "streaming"; show();
      $("stop").disabled = false;
    } catch (e) {
      stats.error = String(e.message || e); stats.state = "failed"; show();
      if (camera) camera.getTracks().forEach(t => t.stop());
      $("start").disabled = false;
    }
  }

  async function stop() {
    $("stop").disabled = true;
    if (session) await whipStop(session, token);
    if (camera) camera.getTracks().forEach(t => t.stop());
    session = camera = null; stats.state = "stopped"; show();
    $("start").disabled = false;
  }

  $("start").onclick = start;
  $("stop").onclick = stop;
  window.mdagStart = start;
  window.mdagStop = stop;
  if (new URLSearchParams(location.search).has("autostart")) start();
  show();
}

// mdag's browser client: camera (or, for an app with media: audio, the
// microphone: Opus) -> WHIP (RFC 9725) -> mdag; results from the "results"
// DataChannel drawn over the video. No dependencies: the WHIP
// exchange is one POST (offer -> answer, Location) and one DELETE.
"use strict";

// codecSupport says whether this browser can choose the codec it offers:
// {choose: false} without RTCRtpTransceiver.setCodecPreferences (the offer
// then carries the browser's defaults and the server picks), and which of
// mdag's codecs it can send.
function codecSupport() {
  const choose = typeof RTCRtpTransceiver !== "undefined" &&
                 typeof RTCRtpTransceiver.prototype.setCodecPreferences === "function";
  let caps = [];
  try { caps = RTCRtpSender.getCapabilities("video").codecs.map(c => c.mimeType.toLowerCase()); } catch (e) { /* unknown */ }
  return {choose, vp8: caps.includes("video/vp8"), h264: caps.includes("video/h264")};
}

// codecsOf lists the codecs of an SDP's kind ("video", the default, or
// "audio") sections in their order ("VP8", "H264", "rtx", ...; each name
// once).
function codecsOf(sdp, kind = "video") {
  const out = [];
  let video = false;
  for (const line of sdp.split(/\r?\n/)) {
    if (line.startsWith("m=")) video = line.startsWith("m=" + kind);
    const m = video && /^a=rtpmap:\d+ ([^/]+)\//.exec(line);
    if (m && !out.includes(m[1])) out.push(m[1]);
  }
  return out;
}

// whipPublish offers stream to url and returns {pc, dc, resource, offered,
// codec}. opts.codec "vp8" or "h264" offers only that codec (with rtx):
// setCodecPreferences; "auto" (default) offers the browser's codecs and
// the server picks by its order (--codecs). opts.simulcast sends three
// layers (rid q: a quarter of the size, h: half, f: full); the server
// decodes the one that fits its app.
async function whipPublish(url, stream, token, onResult, opts = {}) {
  const codec = opts.codec || "auto";
  const pc = new RTCPeerConnection();
  for (const track of stream.getVideoTracks()) {
    const init = {direction: "sendonly"};
    if (opts.simulcast) {
      init.sendEncodings = [{rid: "q", scaleResolutionDownBy: 4}, {rid: "h", scaleResolutionDownBy: 2}, {rid: "f"}];
    }
    const tr = pc.addTransceiver(track, init);
    if (codec !== "auto") {
      if (!codecSupport().choose) {
        pc.close();
        throw new Error("this browser cannot choose the codec it sends (no RTCRtpTransceiver.setCodecPreferences): pick auto");
      }
      const re = codec === "h264" ? /h264|rtx/i : /vp8|rtx/i;
      const prefs = RTCRtpSender.getCapabilities("video").codecs.filter(c => re.test(c.mimeType));
      if (!prefs.some(c => !/rtx/i.test(c.mimeType))) {
        pc.close();
        throw new Error(`this browser has no ${codec.toUpperCase()} encoder`);
      }
      tr.setCodecPreferences(prefs);
    }
  }
  for (const track of stream.getAudioTracks()) { // an audio app's microphone: Opus, the browser's default
    pc.addTransceiver(track, {direction: "sendonly"});
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
  const answer = await resp.text();
  await pc.setRemoteDescription({type: "answer", sdp: answer});
  // The server answers exactly one codec: the first of the answer's.
  const kind = stream.getVideoTracks().length ? "video" : "audio";
  const answered = codecsOf(answer, kind).filter(c => !/^(rtx|red|ulpfec|CN|telephone-event)$/i.test(c));
  return {pc, dc, resource, offered: codecsOf(pc.localDescription.sdp, kind), codec: answered[0] || ""};
}

async function whipStop(session, token) {
  const headers = token ? {"Authorization": "Bearer " + token} : {};
  try { await fetch(session.resource, {method: "DELETE", headers}); } catch (e) { /* closing anyway */ }
  session.pc.close();
}

// mdagStreamPage wires the page; window.mdagStats is what tests read.
// media "audio" (an app with media: audio) sends the microphone instead of
// the camera: no codec choice (Opus), no simulcast.
function mdagStreamPage({app, media}) {
  const audio = media === "audio";
  const $ = (id) => document.getElementById(id);
  const video = $("video"), canvas = $("overlay"), status = $("status");
  const token = new URLSearchParams(location.hash.slice(1)).get("token") ||
                new URLSearchParams(location.search).get("token") || "";
  const query = new URLSearchParams(location.search);
  const stats = window.mdagStats = {state: "idle", results: 0, finished: 0, late: 0, dropped: 0, error: "", last: null,
                                    codec: "", offered: [], simulcast: false};
  const picker = $("codec"), support = codecSupport();
  if (["auto", "vp8", "h264"].includes((query.get("codec") || "").toLowerCase())) picker.value = query.get("codec").toLowerCase();
  if (query.has("simulcast")) $("simulcast").checked = true;
  const notes = [];
  if (!support.choose) {
    notes.push("This browser cannot choose the codec it sends (no RTCRtpTransceiver.setCodecPreferences): it offers its defaults and the server picks.");
    picker.value = "auto"; picker.disabled = true;
  }
  for (const c of ["vp8", "h264"]) {
    if (!support[c]) {
      notes.push(`This browser has no ${c.toUpperCase()} encoder.`);
      picker.querySelector(`option[value=${c}]`).disabled = true;
    }
  }
  $("codecnote").textContent = audio ? "" : notes.join(" ");
  if (audio) $("videoopts").hidden = true;
  let session = null, camera = null;

  function show() {
    const rate = stats.results ? (100 * stats.finished / stats.results).toFixed(1) + "%" : "-";
    const last = stats.last;
    status.className = stats.error ? "err" : "";
    status.textContent = stats.error ? stats.error :
      `${stats.state}` + (stats.codec ? ` (${stats.codec}${stats.simulcast ? ", simulcast" : ""})` : "") + `: ${stats.results} results, finished within SLO ${rate}` +
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
      stats.state = audio ? "opening microphone" : "opening camera"; show();
      // Simulcast needs a large enough picture: browsers send fewer
      // layers below 960x540 (Chromium: one at 320x180, two at 640x360).
      const size = $("simulcast").checked ? {width: 1280, height: 720} : {width: 640, height: 480};
      camera = await navigator.mediaDevices.getUserMedia(audio ? {audio: true, video: false} : {video: size, audio: false});
      if (!audio) video.srcObject = camera;
      stats.state = "connecting"; show();
      stats.simulcast = !audio && $("simulcast").checked;
      session = await whipPublish("/whip/" + encodeURIComponent(app), camera, token, draw,
                                  {codec: picker.value, simulcast: stats.simulcast});
      stats.codec = session.codec; stats.offered = session.offered;
      stats.stream = session.resource.split("/").pop(); // the stream id (Mdag-Stream)
      refreshWatch(stats.stream);
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

  // Watching (WHEP, /whep/player.js; absent in the lean build): the
  // annotated video of any live stream, by default the one this page sends.
  const watch = stats.watch = {state: "not watching", error: "", stream: ""};
  let viewer = null;
  const wstatus = $("whepstatus"), pick = $("whepstream");
  function showWatch() {
    wstatus.className = watch.error ? "err" : "";
    wstatus.textContent = watch.error || (watch.stream ? `${watch.stream}: ${watch.state}` : watch.state);
  }
  async function refreshWatch(prefer) {
    if (typeof whepLive !== "function") return;
    try {
      const st = await whepLive(token);
      if (!st) return;
      const cur = prefer || pick.value;
      pick.replaceChildren(...(st.live.length ? st.live : [""]).map((s) => {
        const o = document.createElement("option");
        o.value = s; o.textContent = s || "(no live stream yet)";
        return o;
      }));
      if (st.live.includes(cur)) pick.value = cur;
    } catch (e) {
      watch.error = String(e.message || e); showWatch();
    }
  }
  async function startWatch(stream) {
    stream = stream || pick.value;
    $("watch").disabled = true; watch.error = ""; watch.stream = stream;
    if (viewer) await viewer.stop();
    try {
      if (!stream) throw new Error("no live stream to watch: press Start, or send one");
      watch.state = "connecting"; showWatch();
      const url = "/whep/" + encodeURIComponent(app) + "/" + encodeURIComponent(stream);
      // a stream that has just started is live once its first frames are in: retry a 404 a few times
      for (let i = 0; ; i++) {
        try {
          viewer = await whepPlay(url, $("annotated"), token, (s) => { watch.state = s; showWatch(); });
          break;
        } catch (e) {
          if (i >= 10 || !/^WHEP 404/.test(e.message)) throw e;
          watch.state = "waiting for the stream's first frames"; showWatch();
          await new Promise((r) => setTimeout(r, 1000));
        }
      }
      watch.state = "playing"; showWatch();
      $("unwatch").disabled = false;
    } catch (e) {
      viewer = null; watch.error = String(e.message || e); watch.state = "failed"; showWatch();
    }
    $("watch").disabled = false;
  }
  async function stopWatch() {
    $("unwatch").disabled = true;
    if (viewer) await viewer.stop();
    viewer = null; watch.state = "not watching"; showWatch();
  }
  if (typeof whepPlay !== "function" || audio) {
    // no WHEP here (the lean build), or an audio app (no picture)
    $("watchsec").hidden = true;
  } else {
    $("watch").onclick = () => startWatch();
    $("unwatch").onclick = stopWatch;
    pick.onfocus = () => refreshWatch();
    refreshWatch();
  }
  window.mdagWatch = startWatch;
  window.mdagUnwatch = stopWatch;

  $("start").onclick = start;
  $("stop").onclick = stop;
  window.mdagStart = start;
  window.mdagStop = stop;
  if (query.has("autostart")) start().then(() => { if (query.has("watch") && stats.stream) startWatch(stats.stream); });
  show();
}

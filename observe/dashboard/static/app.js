// mdag dashboard: history from /v1/dashboard, then one SSE "sample" event
// per second from /v1/dashboard/events. Charts are plain SVG.
"use strict";

const KEEP = 900;
const PALETTE = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#ca8a04", "#db2777"];
const state = { apps: new Map(), replans: [], instances: [], policy: "", now: 0, interval: 1 };
let dirty = false;

function el(tag, attrs, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}

function svgEl(tag, attrs) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  return e;
}

function fmt(v, digits) {
  if (v === undefined || v === null || Number.isNaN(v)) return "–";
  return Number(v).toFixed(digits === undefined ? 1 : digits);
}

function pct(v) { return fmt(100 * v, 1) + "%"; }

// parseTime reads Go's RFC 3339 times (nanoseconds cut to milliseconds).
function parseTime(s) { return Date.parse(String(s).replace(/(\.\d{3})\d+/, "$1")); }

function rateClass(v) { return v >= 0.95 ? "good" : v >= 0.8 ? "meh" : "poor"; }

// ---- data ----

function merge(snap, full) {
  state.now = snap.now || state.now;
  state.policy = snap.policy || state.policy;
  state.interval = snap.interval_s || state.interval;
  if (snap.instances) state.instances = snap.instances;
  if (snap.ingest) state.ingest = snap.ingest;
  if (snap.outputs) state.outputs = snap.outputs;
  if (snap.clips) state.clips = snap.clips;
  for (const a of snap.apps || []) {
    let cur = state.apps.get(a.app);
    if (!cur || full) {
      cur = { points: [], windows: [] };
      state.apps.set(a.app, cur);
    }
    cur.slo = a.slo_ms; cur.fps = a.fps; cur.latest = a.latest || cur.latest; cur.thumbs = a.thumbs || [];
    const lastT = cur.points.length ? cur.points[cur.points.length - 1].t : -1;
    for (const p of a.points || []) if (p.t > lastT) cur.points.push(p);
    const lastW = cur.windows.length ? cur.windows[cur.windows.length - 1].t : -1;
    for (const w of a.windows || []) if (w.t > lastW) cur.windows.push(w);
    if (cur.points.length > KEEP) cur.points.splice(0, cur.points.length - KEEP);
    if (cur.windows.length > KEEP) cur.windows.splice(0, cur.windows.length - KEEP);
  }
  if (full) state.replans = [];
  const lastN = state.replans.length ? state.replans[state.replans.length - 1].n : 0;
  for (const r of snap.replans || []) if (r.n > lastN) state.replans.push(r);
  if (state.replans.length > 200) state.replans.splice(0, state.replans.length - 200);
  dirty = true;
}

// accessToken is the page's own ?access_token= (mdag serve --tokens: an
// api token), else the one the sign-in page (signin.js) kept in this
// tab's sessionStorage, passed on to every data request: EventSource and
// img cannot set an Authorization header.
const accessToken = new URLSearchParams(location.search).get("access_token") || storedToken();
const authQuery = accessToken ? "access_token=" + encodeURIComponent(accessToken) : "";

// storedToken is the token signin.js kept under this key ("" when none or
// when storage is unavailable).
function storedToken() {
  try { return sessionStorage.getItem("mdag.access_token") || ""; } catch (e) { return ""; }
}

async function loadHistory() {
  const resp = await fetch("/v1/dashboard" + (authQuery ? "?" + authQuery : ""), { cache: "no-store" });
  if (!resp.ok) throw new Error("/v1/dashboard: " + resp.status);
  merge(await resp.json(), true);
}

function connect() {
  const conn = document.getElementById("conn");
  const es = new EventSource("/v1/dashboard/events" + (authQuery ? "?" + authQuery : ""));
  let broken = false;
  es.addEventListener("open", () => {
    conn.textContent = "live"; conn.className = "conn live";
    if (broken) { broken = false; loadHistory().catch(() => {}); }
  });
  es.addEventListener("sample", (ev) => merge(JSON.parse(ev.data), false));
  es.addEventListener("end", () => { conn.textContent = "server stopped"; conn.className = "conn down"; es.close(); });
  es.addEventListener("error", () => { broken = true; conn.textContent = "reconnecting"; conn.className = "conn down"; });
}

// ---- charts ----

// chart draws series [{name, pts: [[t, v]...]}] over the last span seconds.
function chart(title, opts) {
  const box = el("div", { class: "chart", "data-chart": opts.id });
  box.append(el("h3", {}, title));
  const W = 480, H = 150, L = 40, R = 8, T = 8, B = 18;
  const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" });
  const t1 = state.now, t0 = t1 - opts.span * 1000;
  let lo = opts.min !== undefined ? opts.min : Infinity, hi = opts.max !== undefined ? opts.max : -Infinity;
  let n = 0;
  for (const s of opts.series) for (const [t, v] of s.pts) {
    if (t < t0) continue;
    n++;
    if (opts.min === undefined) lo = Math.min(lo, v);
    if (opts.max === undefined) hi = Math.max(hi, v);
  }
  if (opts.guide !== undefined && opts.max === undefined) hi = Math.max(hi, opts.guide * 1.1);
  if (!Number.isFinite(lo)) lo = 0;
  if (!Number.isFinite(hi) || hi <= lo) hi = lo + 1;
  if (opts.min === undefined) lo = Math.min(0, lo);
  let ticks = 4;
  if (opts.integer) { hi = Math.max(1, Math.ceil(hi)); ticks = Math.min(4, hi - lo); }
  const x = (t) => L + (W - L - R) * (t - t0) / (t1 - t0);
  const y = (v) => T + (H - T - B) * (1 - (v - lo) / (hi - lo));
  for (let i = 0; i <= ticks; i++) {
    const v = lo + (hi - lo) * i / ticks;
    svg.append(svgEl("line", { class: "axis", x1: L, x2: W - R, y1: y(v), y2: y(v) }));
    const lab = svgEl("text", { x: L - 4, y: y(v) + 3, "text-anchor": "end" });
    lab.textContent = opts.fmt ? opts.fmt(v) : fmt(v, hi - lo < 5 ? 2 : 0);
    svg.append(lab);
  }
  for (let s = 0; s <= opts.span; s += opts.span / 4) {
    const lab = svgEl("text", { x: x(t0 + s * 1000), y: H - 4, "text-anchor": "middle" });
    lab.textContent = s === opts.span ? "now" : "-" + Math.round(opts.span - s) + "s";
    svg.append(lab);
  }
  for (const t of opts.marks || []) {
    if (t >= t0) svg.append(svgEl("line", { class: "mark", x1: x(t), x2: x(t), y1: T, y2: H - B }));
  }
  if (opts.guide !== undefined) {
    svg.append(svgEl("line", { class: "guide", x1: L, x2: W - R, y1: y(opts.guide), y2: y(opts.guide) }));
  }
  const legend = el("div", { class: "legend" });
  opts.series.forEach((s, i) => {
    const color = PALETTE[i % PALETTE.length];
    const pts = s.pts.filter(([t]) => t >= t0);
    const line = svgEl("polyline", { class: "line", stroke: color, "data-series": s.name, "data-n": pts.length,
      points: pts.map(([t, v]) => `${x(t).toFixed(1)},${y(v).toFixed(1)}`).join(" ") });
    svg.append(line);
    const swatch = el("i", {});
    swatch.style.background = color; // a CSSOM property: the page's CSP refuses style attributes
    legend.append(swatch, s.name);
  });
  if (n === 0) {
    const t = svgEl("text", { class: "empty", x: W / 2, y: H / 2, "text-anchor": "middle" });
    t.textContent = "no data yet";
    svg.append(t);
  }
  box.append(svg, legend);
  return box;
}

// ---- rendering ----

function kpi(label, value, cls) {
  return el("div", { class: "kpi" }, el("b", { class: cls || "" }, value), el("span", {}, label));
}

function renderApp(id, a, span) {
  const sec = el("section", { class: "app", id: "app-" + id });
  const l = a.latest || {};
  const wins = a.windows;
  const lastWin = wins.length ? wins[wins.length - 1] : null;
  const ended = l.total ? l.total.finished + l.total.late + l.total.dropped : 0;
  sec.append(el("h2", {}, `app ${id}`, el("small", {}, `${l.streams || 0} streams at ${fmt(a.fps, 0)} fps · SLO ${fmt(a.slo, 0)} ms · policy ${state.policy}`)));
  const k = el("div", { class: "kpis" });
  k.append(
    kpi("finish rate, last second", lastWin ? pct(lastWin.finish_rate) : "–", lastWin ? rateClass(lastWin.finish_rate) : ""),
    kpi("finish rate, all frames ended so far", ended ? pct(l.total.finished / ended) : "–", ended ? rateClass(l.total.finished / ended) : ""),
    kpi("frames sent / finished / late / dropped", l.total ? `${l.total.sent} / ${l.total.finished} / ${l.total.late} / ${l.total.dropped}` : "–"),
    kpi("latency p50 / p99 (ms)", `${fmt(l.p50_ms, 0)} / ${fmt(l.p99_ms, 0)}`),
    kpi("ingest delay p95 / reserved (ms)", `${fmt(l.ingest_p95_ms, 0)} / ${fmt(l.ingest_reserve_ms, 0)}`),
    kpi("cost $/h whole / allocated", `${fmt(l.cost_whole_per_hour, 2)} / ${fmt(l.cost_fractional_per_hour, 2)}`),
  );
  sec.append(k);
  const ing = ingestLine(state.ingest);
  if (ing) sec.append(ing);
  const sl = streamList(state.ingest, id);
  if (sl) sec.append(sl);
  for (const o of state.outputs || []) sec.append(outputLine(o));
  const cl = clipsBlock(state.clips);
  if (cl) sec.append(cl);
  if (l.degraded) {
    // Said loudly: the plan carries only part of the frames (the rest are shed at ingest) or none at all.
    sec.append(el("p", { class: "degraded" }, `DEGRADED: the plan carries ${pct(l.admitted || 0)} of the frames. ${l.degraded.replace(/^degraded: /, "")}`));
  }
  const marks = state.replans.map((r) => parseTime(r.at));
  const pts = a.points;
  const series = (f) => pts.map((p) => [p.t, f(p)]);
  const charts = el("div", { class: "charts" });
  charts.append(chart("Finish rate per 1 s window (%)", { id: "finish", span, min: 0, max: 100, guide: 95, marks,
    series: [{ name: "finished within SLO", pts: wins.map((w) => [w.t, 100 * w.finish_rate]) }], fmt: (v) => fmt(v, 0) }));
  charts.append(chart("Latency per window (ms)", { id: "latency", span, guide: a.slo, marks,
    series: [{ name: "p50", pts: wins.map((w) => [w.t, w.p50_ms]) }, { name: "p99", pts: wins.map((w) => [w.t, w.p99_ms]) }] }));
  charts.append(chart("Cost ($/hour)", { id: "cost", span, marks, fmt: (v) => fmt(v, 2),
    series: [{ name: "whole instances", pts: series((p) => p.cost_whole) }, { name: "allocated", pts: series((p) => p.cost_allocated) }] }));
  const types = [...new Set(pts.flatMap((p) => Object.keys(p.instances || {})))].sort();
  charts.append(chart("Instances by type", { id: "instances", span, marks, integer: true, fmt: (v) => fmt(v, 0),
    series: types.map((ty) => ({ name: ty, pts: series((p) => (p.instances || {})[ty] || 0) })) }));
  charts.append(chart("Streams", { id: "streams", span, marks, integer: true, fmt: (v) => fmt(v, 0), series: [{ name: "streams", pts: series((p) => p.streams) }] }));
  const mods = (l.modules || []).map((m) => m.module);
  const modSeries = (f) => mods.map((m) => ({ name: m, pts: pts.map((p) => {
    const mp = (p.modules || []).find((x) => x.module === m);
    return [p.t, mp ? f(mp) : 0];
  }) }));
  charts.append(chart("Module rate in (items/s)", { id: "rate", span, marks, series: modSeries((m) => m.rate_in) }));
  charts.append(chart("Module latency (ms, entering the module to its output)", { id: "modlat", span, marks, series: modSeries((m) => m.latency_ms) }));
  charts.append(chart("Module execution time (ms per task)", { id: "exec", span, marks, series: modSeries((m) => m.exec_ms) }));
  charts.append(chart("GPU batch size (mean)", { id: "batch", span, marks,
    series: (l.modules || []).filter((m) => m.kind === "gpu").map((m) => m.module).map((m) => ({ name: m, pts: pts.map((p) => {
      const mp = (p.modules || []).find((x) => x.module === m);
      return [p.t, mp ? mp.batch : 0];
    }) })) }));
  charts.append(chart("Scaling factor (items out per item in)", { id: "scale", span, marks, series: modSeries((m) => m.scale) }));
  charts.append(chart("Ballooning factor (measured / profiled)", { id: "balloon", span, marks, min: 0, guide: 1.1, series: modSeries((m) => m.balloon) }));
  sec.append(charts);

  const table = el("table", { class: "modules" });
  table.append(el("thead", {}, el("tr", {}, ...["module", "kind", "in/s", "out/s", "scale", "latency ms", "exec ms", "balloon", "batch", "budget ms", "allocation", "dropped"].map((h) => el("th", h === "allocation" ? { class: "l" } : {}, h)))));
  const tb = el("tbody");
  for (const m of l.modules || []) {
    tb.append(el("tr", {}, el("td", {}, m.module), el("td", {}, m.kind), el("td", {}, fmt(m.rate_in)), el("td", {}, fmt(m.rate_out)),
      el("td", {}, fmt(m.scale, 2)), el("td", {}, fmt(m.latency_ms, 2)), el("td", {}, fmt(m.exec_ms, 2)), el("td", {}, fmt(m.balloon, 2)), el("td", {}, fmt(m.mean_batch, 2)),
      el("td", {}, fmt(m.budget_ms)), el("td", { class: "l", title: m.why || "" }, allocText(m.allocation)), el("td", {}, String(m.dropped))));
  }
  table.append(tb);
  sec.append(table);
  // Stateful modules: where each stream's state is and what happened to it (a reset, state lost
  // with no checkpoint, is said loudly).
  for (const m of (l.modules || []).filter((x) => x.state)) {
    const st = m.state, ev = st.events || {};
    const bad = (ev.reset || 0) + (ev.failed || 0);
    let txt = `${m.module} (stateful): ${st.streams} stream(s) with state, ${st.moving || 0} moving; ` +
      `migrations ${ev.migrate || 0}` + (st.migration_pause_p50_ms !== undefined ? ` (pause p50 ${fmt(st.migration_pause_p50_ms, 2)} ms, max ${fmt(st.migration_pause_max_ms, 2)} ms)` : "") +
      `, restores from checkpoint ${ev.restore || 0}, state resets ${ev.reset || 0}, failed moves ${ev.failed || 0}`;
    if (st.last_event) txt += `. Last: ${st.last_event}`;
    sec.append(el("p", { class: bad ? "degraded state" : "state" }, txt));
  }
  const why = (l.modules || []).filter((m) => m.why);
  if (why.length) {
    const ul = el("ul", { class: "why" });
    for (const m of why) ul.append(el("li", {}, el("b", {}, m.module + ": "), m.why));
    sec.append(el("details", { class: "why" }, el("summary", {}, `why this allocation (critical path ${l.critical_path || "–"}, ${fmt(l.critical_ms)} of ${fmt(a.slo, 0)} ms)`), ul));
  }
  const drops = Object.entries(l.drops || {}).sort((x, y) => y[1] - x[1]);
  if (drops.length) sec.append(el("div", { class: "drops" }, "drops (module: reason = frames): " + drops.map(([k, v]) => `${k} = ${v}`).join(", ")));
  const thumbs = el("div", { class: "thumbs" });
  const stamp = Math.floor(state.now / 2000);
  const auth = authQuery ? "&" + authQuery : "";
  for (const s of a.thumbs || []) {
    const cap = el("figcaption", {}, s);
    if (whep.on) { // WHEP: a watch link and the stream's viewers
      const n = whep.viewers.get(s) || 0;
      const w = el("a", { href: "#", class: "watch", "data-stream": s }, "watch");
      w.onclick = (ev) => { ev.preventDefault(); watchStream(id, s); };
      cap.append(" · ", w);
      if (n) cap.append(` · ${n} watching`);
    }
    thumbs.append(el("figure", {}, el("img", { src: `/v1/thumbs/${encodeURIComponent(s)}?t=${stamp}${auth}`, alt: "stream " + s, width: 160 }), cap));
  }
  if ((l.stream_ids || []).length > (a.thumbs || []).length) {
    thumbs.append(el("span", { class: "drops" }, `${(l.stream_ids || []).length} streams joined; thumbnails for those sending frames`));
  }
  sec.append(thumbs);
  return sec;
}

// outputLine is one app output (MQTT, NATS, webhook): where it sends,
// whether it is up, what it delivered, what waits in its spool and what
// was lost, by reason. Down or losing messages: said loudly.
function outputLine(o) {
  const dropped = { rejected: o.rejected, full: o.dropped_full, expired: o.expired, busy: o.dropped_busy, corrupt: o.corrupt, unspooled: o.unspooled };
  const lost = Object.entries(dropped).filter(([, v]) => v > 0).map(([k, v]) => `${k} = ${v}`).join(", ");
  const parts = [`output ${o.name} → ${o.to} (${(o.send || []).join(", ")})`,
    o.connected ? "up" : `DOWN since ${o.down_since}: ${o.last_error || ""}`,
    `${o.published} delivered, ${o.retried} retries`,
    `spool: ${o.waiting} waiting (${fmt(o.spool_bytes / 1024, 0)} KiB), lag ${fmt(o.lag_seconds, 1)} s`];
  if (lost) parts.push("LOST: " + lost);
  const bad = !o.connected || lost;
  return el("div", { class: "drops" + (bad ? " warn" : ""), id: `output-${o.name}` }, parts.join(" · "));
}

// clipsBlock is the event clips (the app's clips section): what was
// recorded, written, skipped and removed by retention, the disk used, and
// the latest clips, linked to GET /v1/clips/{name}. Frames not recorded or
// clips lost: said loudly.
function clipsBlock(c) {
  if (!c) return null;
  const auth = authQuery ? "?" + authQuery : "";
  const lost = [];
  if (c.frames_dropped) lost.push(`${c.frames_dropped} frames not recorded (the encoder behind)`);
  if (c.encode_errors) lost.push(`${c.encode_errors} frames not recorded (errors)`);
  if (c.write_errors) lost.push(`${c.write_errors} clips lost (write errors)`);
  if (c.ring_drops) lost.push(`${c.ring_drops} GOPs dropped from the rings (less pre-roll)`);
  const parts = [`clips → ${c.dir}: ${c.streams} streams recorded, ${c.frames} frames`,
    `${c.written} written, ${c.on_disk} on disk (${fmt(c.disk_bytes / 1048576, 1)} of ${fmt(c.max_bytes / 1048576, 0)} MiB)`,
    `retention removed ${c.removed_for_bytes} for max_bytes, ${c.removed_for_age} for max_age`,
    `${c.events} events: ${c.limited} skipped by the per-minute limit, ${c.missed} with no video`];
  if (lost.length) parts.push("LOST: " + lost.join(", "));
  const div = el("div", { id: "clips" }, el("div", { class: "drops" + (lost.length ? " warn" : "") }, parts.join(" · ")));
  if ((c.latest || []).length) {
    const ul = el("ul", { class: "clips" });
    for (const x of c.latest) {
      const when = new Date(x.start_ms).toLocaleTimeString();
      ul.append(el("li", {}, el("a", { href: `/v1/clips/${encodeURIComponent(x.name)}${auth}`, target: "_blank", rel: "noopener" }, x.name),
        ` ${x.stream} · ${when} · ${fmt(x.duration_s, 1)} s · ${x.frames} frames` + (x.frames_dropped ? ` (${x.frames_dropped} NOT RECORDED)` : "") +
        ` · ${x.event}` + (x.events > 1 ? ` +${x.events - 1} more` : "")));
    }
    div.append(ul);
  }
  return div;
}

// ingestLine is the WebRTC ingest's admission state: streams admitted and
// pending, the CPU load against capacity, refusals and streams ended
// by the server (shed, connect timeouts), so overload is visible here.
function ingestLine(g) {
  if (!g) return null;
  const list = (m, skip) => Object.entries(m || {}).filter(([k]) => !skip.includes(k)).sort((x, y) => y[1] - x[1]).map(([k, v]) => `${k} = ${v}`).join(", ");
  const load = g.capacity_cores ? g.load_cores / g.capacity_cores : 0;
  const parts = [`ingest: ${g.admitted} admitted (max ${g.max_streams}), ${g.pending} pending`,
    `CPU load ${fmt(g.load_cores, 2)} of ${fmt(g.capacity_cores, 2)} cores admission fills (${pct(load)}), a new stream ≈ ${fmt(g.stream_cost_cores, 2)}`];
  if (g.overloaded_for_ns > 0) parts.push(`OVERLOADED for ${fmt(g.overloaded_for_ns / 1e9, 0)} s`);
  const refused = list(g.refused, []);
  if (refused) parts.push("refused: " + refused);
  const ended = list(g.ended, ["client", "shutdown"]);
  if (ended) parts.push("ended by the server: " + ended);
  const bad = g.overloaded_for_ns > 0 || refused || ended;
  return el("div", { class: "drops" + (bad ? " warn" : ""), id: "ingest" }, parts.join(" · "));
}

// streamList is the app's live ingest streams, WHIP and cameras: codec,
// size, simulcast layer, where from; a camera that is lost says so loudly.
function streamList(g, app) {
  const ss = ((g && g.streams) || []).filter((s) => s.app === app);
  const cams = ((g && g.cameras) || []).filter((c) => c.app === app);
  if (!ss.length && !cams.length) return null;
  const ul = el("ul", { class: "streams", id: "streams-" + app });
  let down = false;
  for (const c of cams) {
    // A camera that is not streaming (unreachable, wrong password, lost) is said loudly.
    const bad = c.state !== "streaming";
    down = down || bad;
    const parts = [c.state, c.codec || "", c.source];
    if (c.reconnects) parts.push(`${c.reconnects} reconnects`);
    if (c.camera_lost) parts.push(`lost ${c.camera_lost}×`);
    // a coordinator's camera: the ingest worker reading it; read by the
    // coordinator itself (its pixels come through it) or by no one is said loudly
    const here = c.read_by === "coordinator", none = c.read_by === "-";
    if (c.read_by && !here && !none) parts.push("read by " + c.read_by);
    const li = el("li", { class: bad || here || none ? "warn" : "" }, el("b", {}, "camera " + c.name + ": "), parts.filter((p) => p).join(" · "));
    if (here) li.append(el("span", { class: "warn" }, " — READ BY THE COORDINATOR (no ingest worker takes it: its pixels come through the coordinator)"));
    if (none) li.append(el("span", { class: "warn" }, " — WAITING FOR AN INGEST WORKER"));
    if (bad && c.last_error) li.append(el("span", { class: "warn" }, ` — DOWN ${fmt((c.down_ns || 0) / 1e9, 0)} s: ${c.last_error}`));
    ul.append(li);
  }
  for (const s of ss) {
    const parts = [s.state, s.codec || "", s.width ? `${s.width}x${s.height}` : ""];
    if (s.layer) parts.push(`layer ${s.layer} of ${(s.layers || []).join(", ")}` + (s.layer_down ? ` (${s.layer_down} down)` : ""));
    parts.push(s.source === "whip" ? "WHIP" : s.source || "");
    if (s.read_by) parts.push("media on " + s.read_by);
    if (s.camera_lost) parts.push(`camera lost ${s.camera_lost}×`);
    const li = el("li", { class: s.waiting ? "warn" : "" }, el("b", {}, s.id + ": "), parts.filter((p) => p).join(" · "));
    if (s.waiting) li.append(el("span", { class: "warn" }, " — " + s.waiting.toUpperCase()));
    ul.append(li);
  }
  const attrs = { class: "why" };
  if (down || ss.some((s) => s.waiting)) attrs.open = ""; // a lost camera is shown, not folded away
  const title = `${ss.length} ingest streams` + (cams.length ? `, ${cams.length} cameras` + (down ? " (SOME DOWN)" : "") : "");
  return el("details", attrs, el("summary", {}, title), ul);
}

// allocText is a module's allocation: "2 × V100<8,1> + P100<1,1> ×0.35 partial".
function allocText(allocs) {
  if (!allocs || !allocs.length) return "–";
  return allocs.map((x) => x.partial
    ? `${x.worker}<${x.batch},${x.concurrency}> ×${x.instances < 0.1 ? Number(x.instances).toPrecision(2) : fmt(x.instances, 2)} partial`
    : `${fmt(x.instances, 0)} × ${x.worker}<${x.batch},${x.concurrency}>`).join(" + ");
}

function moveSummary(moves) {
  const count = {};
  for (const m of moves || []) count[m.kind] = (count[m.kind] || 0) + 1;
  const parts = Object.entries(count).map(([k, v]) => `${k} ×${v}`);
  return parts.length ? parts.join(", ") : "no moves";
}

function renderReplans() {
  const ol = document.getElementById("replans");
  ol.replaceChildren();
  const list = state.replans.slice().reverse().slice(0, 60);
  for (let i = 0; i < list.length; i++) {
    const r = list[i], prev = list[i + 1];
    const li = el("li");
    const when = new Date(parseTime(r.at)).toLocaleTimeString();
    const cost = prev ? `$${fmt(prev.cost_whole_per_hour, 2)}/h → $${fmt(r.cost_whole_per_hour, 2)}/h` : `$${fmt(r.cost_whole_per_hour, 2)}/h`;
    li.append(el("div", {}, el("span", { class: "kind" }, "#" + r.n), r.trigger));
    li.append(el("div", { class: "when" }, `${when} · ${moveSummary(r.moves)} · ${cost} whole, $${fmt(r.cost_fractional_per_hour, 2)}/h allocated · planned in ${fmt(r.plan_ms, 1)} ms`));
    const ul = el("ul");
    for (const m of (r.moves || []).filter((m) => m.kind !== "reroute").slice(0, 8)) {
      ul.append(el("li", {}, `${m.kind} ${m.instance}${m.module ? " " + m.app + "/" + m.module : ""}: ${m.reason}`));
    }
    for (const s of r.sessions || []) {
      if (!s.feasible && s.reason) ul.append(el("li", { class: "problem" }, `${s.app}: ${s.reason}`));
    }
    for (const p of r.problems || []) ul.append(el("li", { class: "problem" }, p));
    if (ul.childElementCount) li.append(ul);
    ol.append(li);
  }
  if (!list.length) ol.append(el("li", {}, "no re-plans yet"));
}

function renderInstances() {
  const tb = document.querySelector("#instances tbody");
  tb.replaceChildren();
  for (const i of state.instances) {
    tb.append(el("tr", {}, el("td", {}, i.id), el("td", { class: "l" }, i.type), el("td", { class: "l" }, i.state),
      el("td", {}, String(i.outstanding)), el("td", { class: "mods" }, (i.modules || []).join(" "))));
  }
  const cost = [...state.apps.values()].reduce((s, a) => s + ((a.latest || {}).cost_whole_per_hour || 0), 0);
  const active = state.instances.filter((i) => i.state !== "warm").length;
  document.getElementById("cluster").textContent = `${active} active instances · $${fmt(cost, 2)}/h`;
}

// WHEP (annotated video out; /whep/player.js, absent in the lean build):
// viewers per stream from GET /v1/whep every 5 s, a refusal said loudly,
// and one inline player (#watch) for the stream picked by its "watch" link.
const whep = { on: typeof whepPlay === "function", viewers: new Map(), line: "", session: null, stream: "" };

async function pollWhep() {
  try {
    const st = await whepLive(accessToken);
    if (!st) { whep.on = false; return; }
    whep.viewers = new Map((st.streams || []).map((x) => [x.stream, x.viewers]));
    const refused = Object.entries(st.refused || {}).filter(([, v]) => v > 0);
    whep.line = `WHEP: ${st.viewers} of ${st.max_viewers} viewers (at most ${st.max_per_stream} a stream)` +
      (refused.length ? "; refused: " + refused.map(([k, v]) => `${k} ${v}`).join(", ") : "") +
      ((st.totals || {}).errors ? `; ${st.totals.errors} encoder errors` : "");
    const line = document.getElementById("whepline");
    line.textContent = whep.line;
    line.className = refused.length || (st.totals || {}).errors ? "drops" : "";
  } catch (e) {
    document.getElementById("whepline").textContent = "WHEP status unavailable: " + e.message;
    document.getElementById("whepline").className = "drops";
  }
  dirty = true;
}

async function watchStream(app, stream) {
  const box = document.getElementById("watch"), status = document.getElementById("watchstatus");
  box.hidden = false;
  if (whep.session) await whep.session.stop();
  whep.session = null; whep.stream = stream;
  status.className = ""; status.textContent = `${app}/${stream}: connecting`;
  try {
    whep.session = await whepPlay(`/whep/${encodeURIComponent(app)}/${encodeURIComponent(stream)}`, document.getElementById("watchvideo"), accessToken,
      (st) => { status.textContent = `${app}/${stream}: ${st}`; status.className = st === "failed" ? "drops" : ""; });
  } catch (e) {
    status.textContent = `${app}/${stream}: ${e.message}`; status.className = "drops";
  }
  pollWhep();
}

async function unwatch() {
  if (whep.session) await whep.session.stop();
  whep.session = null;
  document.getElementById("watch").hidden = true;
  pollWhep();
}
window.mdagWatch = watchStream;
window.mdagUnwatch = unwatch;
document.getElementById("unwatch").onclick = unwatch;
if (whep.on) { pollWhep(); setInterval(pollWhep, 5000); }

function render() {
  if (!dirty) return;
  dirty = false;
  let span = Number(document.getElementById("span").value);
  if (span === 0) {
    // auto: from the first sample to now, between 1 and 15 minutes.
    const first = Math.min(...[...state.apps.values()].map((a) => (a.points.length ? a.points[0].t : state.now)));
    span = Math.min(900, Math.max(60, Math.ceil((state.now - first) / 60000) * 60));
  }
  const root = document.getElementById("apps");
  const ids = [...state.apps.keys()].sort();
  root.replaceChildren(...ids.map((id) => renderApp(id, state.apps.get(id), span)));
  if (!ids.length) root.append(el("section", { class: "panel" }, "no apps deployed"));
  renderReplans();
  renderInstances();
}

function loop() {
  render();
  setTimeout(() => requestAnimationFrame(loop), 500);
}

document.getElementById("span").addEventListener("change", () => { dirty = true; render(); });
loadHistory().catch((e) => {
  const conn = document.getElementById("conn");
  conn.textContent = "history unavailable: " + e.message; conn.className = "conn down";
}).finally(() => { connect(); loop(); });

#!/usr/bin/env python3
"""Builds the GPU check's report from what tools/gpu-check.sh collected in DIR.

    python3 tools/gpu_report.py DIR   ->  DIR/gpu-report.md, DIR/gpu-report.json

Reads DIR/meta.json, DIR/raw-MODEL.json (runners/torch --bench), DIR/profiles/MODEL.json
(mdag profile --executor kserve -o json) and DIR/sweep/N.* (the coordinator's /v1/status and
/metrics before and after each load, GPU utilisation sampled each second). Standard library only.
"""

import json
import math
import os
import re
import sys

# Symphony (Chen et al.), Appendix B: alpha and beta (ms) of l(b) = alpha*b + beta.
SYMPHONY = {
    # model: (1080Ti Table 5, A100 Table 6)
    "resnet50": ((2.050, 5.378), (0.268, 5.172)),
    "mobilenetv2": ((1.180, 3.483), (0.190, 2.892)),
    "densenet121": ((1.061, 10.312), (0.054, 10.546)),
    "resnet152": ((4.599, 11.212), (0.390, 10.449)),
    "inception_resnet_v2": ((5.090, 18.368), (1.112, 15.27)),
}

GOAL_PROTOCOL = 1.3  # kserve p50 per batch <= 1.3x the raw model time at b8 and b32
GOAL_GOODPUT = 0.85  # goodput >= 85% of the raw throughput at the scheduler's batch


def load(path):
    with open(path) as f:
        return json.load(f)


def raw_times(doc, model):
    """{batch: median ms} of one model from runners/torch --bench's JSON (the model alone: CUDA
    events around the graph's replay on a GPU)."""
    m = doc.get("models", {}).get(model, {})
    return {int(b): float(v["median_ms"]) for b, v in m.get("batches", {}).items()}


def kserve_times(doc, conc=1, key="p50_ns"):
    """{batch: p50 ms} (key: mean_ns for the mean) of one concurrency from mdag profile -o json."""
    out = {}
    for p in (doc.get("sweep") or {}).get("points", []):
        if p["concurrency"] == conc and key in p:
            out[p["batch"]] = p[key] / 1e6
    return out


def raw_copies(doc, model):
    """{batch: median ms} of runners/torch --bench's run() with its copies (host bytes in, the
    H2D and D2H copies, the replay, the sync): what the runner does per request beside gRPC."""
    m = doc.get("models", {}).get(model, {})
    return {int(b): float(v["with_copies_median_ms"]) for b, v in m.get("batches", {}).items()
            if "with_copies_median_ms" in v}


def kserve_phases(doc, conc=1):
    """{batch: {phase: mean ms}} of one concurrency: where the kserve executor's batch time went
    (pack, shm-write, call, split; mdag profile's points carry them)."""
    out = {}
    for p in (doc.get("sweep") or {}).get("points", []):
        if p["concurrency"] == conc and p.get("phases"):
            out[p["batch"]] = {ph["name"]: ph["mean_ns"] / 1e6 for ph in p["phases"]}
    return out


def runner_stats_c1(d, model="resnet50"):
    """{batch: {part_ms: mean}} of the runner's handler over the sweep at concurrency 1 alone: the
    difference of its --stats before and after that sweep (totals = requests x means)."""
    pa, pb = os.path.join(d, "runner-stats-c1-before.json"), os.path.join(d, "runner-stats-c1-after.json")
    if not os.path.exists(pb):
        return {}
    before = load(pa).get(model, {}) if os.path.exists(pa) else {}
    out = {}
    for b, v in load(pb).get(model, {}).items():
        u = before.get(b, {})
        n = v.get("requests", 0) - u.get("requests", 0)
        if n <= 0:
            continue
        out[int(b)] = {k: (v[k] * v["requests"] - u.get(k, 0) * u.get("requests", 0)) / n
                       for k in v if k.endswith("_ms")}
    return out


def fit(times):
    """Least-squares alpha, beta (ms) of l(b) = alpha*b + beta."""
    pts = sorted(times.items())
    if len(pts) < 2:
        return None
    n = len(pts)
    sx = sum(b for b, _ in pts)
    sy = sum(t for _, t in pts)
    sxx = sum(b * b for b, _ in pts)
    sxy = sum(b * t for b, t in pts)
    d = n * sxx - sx * sx
    if d == 0:
        return None
    a = (n * sxy - sx * sy) / d
    return a, (sy - a * sx) / n


def interp(times, b):
    """The raw time at a (fractional) batch, linear between measured batches."""
    pts = sorted(times.items())
    if not pts:
        return None
    if b <= pts[0][0]:
        return pts[0][1]
    for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
        if b <= b1:
            return t0 + (t1 - t0) * (b - b0) / (b1 - b0)
    return pts[-1][1] * b / pts[-1][0]


METRIC = re.compile(r'^([a-z_:]+)(?:\{([^}]*)\})? ([0-9.eE+-]+|NaN)$')


def metrics(path):
    """[(name, {label: value}, value)] of a Prometheus text page."""
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            m = METRIC.match(line.strip())
            if not m:
                continue
            labels = dict(re.findall(r'([a-z_]+)="([^"]*)"', m.group(2) or ""))
            out.append((m.group(1), labels, float(m.group(3))))
    return out


def metric_sum(ms, name, **want):
    return sum(v for n, l, v in ms if n == name and all(l.get(k) == w for k, w in want.items()))


def batch_histogram(before, after, module):
    """{le: count} of the scheduler's batch sizes for a module during one load."""
    def buckets(ms):
        return {l["le"]: v for n, l, v in ms if n == "mdag_scheduler_batch_size_bucket" and l.get("module") == module}
    b0, b1 = buckets(before), buckets(after)
    cum = {le: b1.get(le, 0) - b0.get(le, 0) for le in b1}
    order = sorted(cum, key=lambda le: math.inf if le == "+Inf" else float(le))
    out, prev = {}, 0
    for le in order:
        out[le] = cum[le] - prev
        prev = cum[le]
    return out


def session(status, app="gpu-check"):
    for s in status.get("sessions", []):
        if s.get("app") == app:
            return s
    return {}


def seconds(d):
    """A Go duration (20s, 1m30s, 500ms) in seconds."""
    parts = re.findall(r"([0-9.]+)(ms|h|m|s)", d)
    if not parts or "".join(a + u for a, u in parts) != d:
        raise ValueError("duration %r: want a Go duration like 20s or 1m30s" % d)
    return sum(float(a) * {"ms": 1e-3, "s": 1, "m": 60, "h": 3600}[u] for a, u in parts)


def sweep(d, meta, raw):
    rows = []
    dur = seconds(meta["duration"])
    for n in [int(x) for x in meta["streams"].split(",")]:
        base = os.path.join(d, "sweep", str(n))
        if not os.path.exists(base + ".status.json"):
            continue
        s0 = session(load(base + ".status-before.json")).get("total", {})
        s1 = session(load(base + ".status.json"))
        t1 = s1.get("total", {})
        sent = t1.get("sent", 0) - s0.get("sent", 0)
        fin = t1.get("finished", 0) - s0.get("finished", 0)
        m0, m1 = metrics(base + ".metrics-before.txt"), metrics(base + ".metrics-after.txt")
        items = metric_sum(m1, "mdag_scheduler_batch_size_sum", module="classify") - metric_sum(m0, "mdag_scheduler_batch_size_sum", module="classify")
        batches = metric_sum(m1, "mdag_scheduler_batch_size_count", module="classify") - metric_sum(m0, "mdag_scheduler_batch_size_count", module="classify")
        util = []
        if os.path.exists(base + ".gpu.txt"):
            with open(base + ".gpu.txt") as f:
                util = [float(x) for x in f.read().split()]
        mean_b = items / batches if batches else 0
        rate = fin / sent if sent else 0
        goodput = items / dur * rate if dur > 0 else 0
        t = interp(raw, mean_b) if mean_b else None
        raw_tput = mean_b / t * 1000 if t else None
        rows.append({
            "streams": n, "frames_sent": sent, "frames_finished": fin, "finish_rate": rate,
            "drops": s1.get("drops", {}), "p50_ms": s1.get("p50_ms"), "p99_ms": s1.get("p99_ms"),
            "classify_items": items, "classify_batches": batches, "mean_batch": mean_b,
            "batch_histogram": batch_histogram(m0, m1, "classify"),
            "gpu_utilization": sum(util) / len(util) if util else None,
            "goodput_items_per_s": goodput, "raw_items_per_s_at_batch": raw_tput,
            "goodput_vs_raw": goodput / raw_tput if raw_tput else None,
        })
    return rows


def fmt(v, spec=".2f", none="-"):
    return none if v is None else format(v, spec)


def pct(v):
    return "-" if v is None else "%.0f%%" % (100 * v)


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: gpu_report.py DIR")
    d = sys.argv[1]
    meta = load(os.path.join(d, "meta.json"))
    models = sorted(f[len("raw-"):-len(".json")] for f in os.listdir(d) if f.startswith("raw-") and f.endswith(".json"))
    raw = {m: raw_times(load(os.path.join(d, "raw-%s.json" % m)), m) for m in models}
    prof = {}
    for m in models:
        p = os.path.join(d, "profiles", m + ".json")
        if os.path.exists(p):
            prof[m] = load(p)
    rows = sweep(d, meta, raw.get("resnet50", {}))

    protocol = []
    for m in models:
        ks = kserve_times(prof.get(m, {}))
        for b in sorted(raw[m]):
            if b in ks:
                protocol.append({"model": m, "batch": b, "raw_ms": raw[m][b], "kserve_ms": ks[b], "ratio": ks[b] / raw[m][b]})
    goal_rows = [p for p in protocol if p["model"] == "resnet50" and p["batch"] in (8, 32)]
    # both batches measured, both within the goal (a CPU run stops at b8: not met, not measured)
    protocol_ok = len(goal_rows) == 2 and all(p["ratio"] <= GOAL_PROTOCOL for p in goal_rows)
    good = [r for r in rows if r["finish_rate"] >= 0.95 and r["goodput_vs_raw"] is not None]
    best = max(good, key=lambda r: r["goodput_items_per_s"]) if good else None
    goodput_ok = best is not None and best["goodput_vs_raw"] >= GOAL_GOODPUT

    zoo = []
    for m in models:
        f_raw = fit(raw[m])
        f_ks = fit(kserve_times(prof.get(m, {})))
        sym = SYMPHONY.get(m)
        zoo.append({"model": m, "raw_fit_ms": f_raw, "kserve_fit_ms": f_ks,
                    "symphony_1080ti_ms": sym[0] if sym else None, "symphony_a100_ms": sym[1] if sym else None})

    report = {"meta": meta, "protocol": protocol, "sweep": rows, "zoo": zoo,
              "goals": {"protocol_le_1.3x_at_b8_b32": protocol_ok, "goodput_ge_85pct_of_raw": goodput_ok,
                        "best_load": best}}
    with open(os.path.join(d, "gpu-report.json"), "w") as f:
        json.dump(report, f, indent=2)

    L = []
    L.append("# GPU check report\n")
    L.append("Generated by `tools/gpu-check.sh` (%s). Device **%s**: %s; %s CPUs; torch %s; %s.\n" % (
        meta["date"], meta["device"], meta.get("gpu") or "no NVIDIA GPU", meta.get("cpus"), meta.get("torch"), meta.get("mdag")))
    L.append("## Goals\n")
    L.append("| goal | result |\n| --- | --- |")
    verdict = "met" if protocol_ok else ("**missed**" if len(goal_rows) == 2 else "**not measured at both b8 and b32**")
    L.append("| kserve p50 per batch <= %.1fx the raw model time (ResNet-50, b8 and b32) | %s: %s |" % (
        GOAL_PROTOCOL, verdict, ", ".join("b%d %.2fx" % (p["batch"], p["ratio"]) for p in goal_rows) or "-"))
    if best:
        L.append("| ResNet-50 goodput >= %d%% of the raw throughput at the scheduler's batch (%s SLO) | %s: %.0f items/s at mean batch %.1f = %.0f%% of %.0f |" % (
            GOAL_GOODPUT * 100, meta.get("slo", "50ms"), "met" if goodput_ok else "**missed**", best["goodput_items_per_s"], best["mean_batch"],
            100 * best["goodput_vs_raw"], best["raw_items_per_s_at_batch"]))
    else:
        L.append("| ResNet-50 goodput >= %d%% of raw | **no load finished >= 95%% of its frames** |" % (GOAL_GOODPUT * 100))
    L.append("")
    L.append("## The protocol's cost: time per batch through mdag's kserve executor against the raw model\n")
    L.append("Raw: `runners/torch --bench` (the model alone%s, median). kserve: `mdag profile --executor kserve`, p50 at concurrency 1: "
             "preprocessing in the worker, the Open Inference Protocol (shared memory when on one host), the runner's copy and model.\n" % (
                 ", CUDA graphs" if meta["device"] == "cuda" else ", eager on CPU"))
    L.append("| model | batch | raw ms | kserve ms | ratio |\n| --- | --- | --- | --- | --- |")
    for p in protocol:
        L.append("| %s | %d | %.2f | %.2f | %.2fx |" % (p["model"], p["batch"], p["raw_ms"], p["kserve_ms"], p["ratio"]))
    L.append("")
    ph = kserve_phases(prof.get("resnet50", {}))
    rstats = runner_stats_c1(d)
    copies = raw_copies(load(os.path.join(d, "raw-resnet50.json")), "resnet50") if "resnet50" in raw else {}
    if ph:
        L.append("### Where the time goes (ResNet-50, concurrency 1)\n")
        L.append("The kserve executor times each batch's parts (mean ms): packing the frames into the tensor (prep, on the "
                 "worker's cores), the copy into the shared memory region, the ModelInfer call, splitting the outputs; "
                 "the rest is the mean batch time outside those parts (decoding each item's output, taking a slot). "
                 "The runner's part of the call is its `run()` with copies (`--bench`: host bytes in, H2D, replay, D2H, sync); "
                 "the rest of the call is gRPC both ways and the runner's Python per request.\n")
        L.append("The runner's handler (`--stats`, over a sweep at concurrency 1 alone): checking the "
                 "request, waiting for a slot, its run(), building the response; call - handler is gRPC both ways "
                 "(Go client, Python server) and the server's thread hand-offs.\n")
        L.append("| batch | kserve p50 | pack | shm write | call | split | rest (decode) | runner run() with copies | call - run() "
                 "| handler: check / slot wait / run / respond | call - handler |\n"
                 "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        ks = kserve_times(prof.get("resnet50", {}))
        km = kserve_times(prof.get("resnet50", {}), key="mean_ns")
        for b in sorted(ph):
            p = ph[b]
            c = copies.get(b)
            r = rstats.get(b)
            hs = [r.get(k + "_ms", 0) for k in ("check", "slot_wait", "run", "respond")] if r else None
            parts = sum(p.get(k, 0) for k in ("pack", "shm-write", "call", "split"))
            L.append("| %d | %s | %.2f | %.2f | %.2f | %.2f | %s | %s | %s | %s | %s |" % (
                b, fmt(ks.get(b), ".2f"), p.get("pack", 0), p.get("shm-write", 0), p.get("call", 0), p.get("split", 0),
                fmt(km[b] - parts if km.get(b) is not None else None, ".2f"),
                fmt(c, ".2f"), fmt(p.get("call", 0) - c if c is not None else None, ".2f"),
                " / ".join("%.2f" % h for h in hs) if hs else "-",
                fmt(p.get("call", 0) - sum(hs) if hs else None, ".2f")))
        L.append("")
    L.append("## Live: examples/gpu-check (detector, crop, ResNet-50 on every crop; %s SLO)\n" % meta.get("slo", "50ms"))
    L.append("%s fps per stream, %s objects per frame, %s per load, the sources streaming to the %s. Goodput = ResNet-50 items per second x the finish rate; "
             "raw = the runner's throughput at the mean batch the scheduler ran.\n" % (meta["fps"], meta["objects"], meta["duration"], "worker (it ingests them; no pixel crosses the coordinator)" if meta.get("ingest", "coordinator") == "worker" else "coordinator"))
    L.append("| streams | frames | finish rate | p50 / p99 ms | ResNet-50 items/s (goodput) | mean batch | raw items/s at that batch | goodput / raw | GPU util | batch sizes |")
    L.append("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        hist = ", ".join("<=%s: %d" % (le, c) for le, c in r["batch_histogram"].items() if c)
        L.append("| %d | %d | %.1f%% | %s / %s | %.0f | %.1f | %s | %s | %s | %s |" % (
            r["streams"], r["frames_sent"], 100 * r["finish_rate"], fmt(r["p50_ms"], ".1f"), fmt(r["p99_ms"], ".1f"),
            r["goodput_items_per_s"], r["mean_batch"], fmt(r["raw_items_per_s_at_batch"], ".0f"),
            pct(r["goodput_vs_raw"]), pct(r["gpu_utilization"]), hist))
    for r in rows:
        if r["drops"]:
            L.append("\n%d streams: drops %s" % (r["streams"], ", ".join("%s=%d" % kv for kv in sorted(r["drops"].items()))))
    L.append("")
    L.append("## Profiles of the zoo on this device beside Symphony's (l(b) = alpha*b + beta, ms)\n")
    L.append("| model | raw alpha / beta | through mdag (kserve) alpha / beta | Symphony 1080Ti (Table 5) | Symphony A100 (Table 6) |")
    L.append("| --- | --- | --- | --- | --- |")
    for z in zoo:
        def ab(f):
            return "-" if not f else "%.3f / %.3f" % tuple(f)
        L.append("| %s | %s | %s | %s | %s |" % (z["model"], ab(z["raw_fit_ms"]), ab(z["kserve_fit_ms"]), ab(z["symphony_1080ti_ms"]), ab(z["symphony_a100_ms"])))
    L.append("")
    with open(os.path.join(d, "gpu-report.md"), "w") as f:
        f.write("\n".join(L))
    print("\n".join(L))


if __name__ == "__main__":
    main()

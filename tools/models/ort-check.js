// ort-check.js: runs the models of build/models on ONNX Runtime (onnxruntime-node, CPU) and checks
// that a batch of 8 gives the same outputs as 8 runs at batch 1 (max |diff| <= 1e-4), that every
// output is finite, and (given ORIGINAL=REWRITTEN pairs) that a rewritten model equals its original
// at batch 1. Optional: it needs onnxruntime-node installed where node can require it, e.g.
//   npm install --prefix /tmp/ortnode --ignore-scripts ~/.cache/mdag/onnxruntime-node-1.30.0/onnxruntime-node-1.30.0.tgz
//   NODE_PATH=/tmp/ortnode/node_modules node tools/models/ort-check.js build/models/*.onnx ORIG=REWRITTEN ...
// It is a check by hand (make models does not need node's ORT); the Go executor's tests are the gate.
'use strict';
const ort = require('onnxruntime-node');

const TOL = 1e-4;
const B = 8;

// deterministic input in [-1, 1): a linear congruential generator, seeded per sample
function fill(n, seed) {
  const a = new Float32Array(n);
  let s = (seed * 2654435761) >>> 0;
  for (let i = 0; i < n; i++) {
    s = (Math.imul(s, 1664525) + 1013904223) >>> 0;
    a[i] = s / 2 ** 31 - 1;
  }
  return a;
}

function dims(session) {
  // the first input's shape with the batch left out, from the model's metadata
  const meta = session.inputMetadata[0];
  return meta.shape.slice(1);
}

async function runBatch(session, name, shape, samples) {
  const per = shape.reduce((p, d) => p * d, 1);
  const data = new Float32Array(per * samples.length);
  samples.forEach((x, i) => data.set(x, i * per));
  const t0 = process.hrtime.bigint();
  const out = await session.run({ [name]: new ort.Tensor('float32', data, [samples.length, ...shape]) });
  const ms = Number(process.hrtime.bigint() - t0) / 1e6;
  return { out, ms };
}

function maxDiff(a, b) {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

async function batchCheck(file) {
  const s = await ort.InferenceSession.create(file, { intraOpNumThreads: 2 });
  const name = s.inputNames[0];
  const shape = dims(s);
  const per = shape.reduce((p, d) => p * d, 1);
  const samples = Array.from({ length: B }, (_, i) => fill(per, i + 1));
  await runBatch(s, name, shape, [samples[0]]); // warm-up
  const singles = [];
  let ms1 = 0;
  for (const x of samples) {
    const r = await runBatch(s, name, shape, [x]);
    singles.push(r.out);
    ms1 += r.ms;
  }
  const batch = await runBatch(s, name, shape, samples);
  let worst = 0;
  const ranges = [];
  for (const o of s.outputNames) {
    const t = batch.out[o];
    if (t.dims[0] !== B) throw new Error(`${file}: output ${o} dims ${t.dims}, want batch ${B} leading`);
    const n = t.data.length / B;
    let lo = Infinity, hi = -Infinity;
    for (const v of t.data) {
      if (!Number.isFinite(v)) throw new Error(`${file}: output ${o} not finite`);
      lo = Math.min(lo, v); hi = Math.max(hi, v);
    }
    ranges.push(`${o} [${t.dims}] in [${lo.toPrecision(3)}, ${hi.toPrecision(3)}]`);
    for (let i = 0; i < B; i++) worst = Math.max(worst, maxDiff(t.data.subarray(i * n, (i + 1) * n), singles[i][o].data));
  }
  const ok = worst <= TOL;
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${file}: batch ${B} vs ${B} x batch 1: max |diff| ${worst.toExponential(2)}; ` +
    `${(ms1 / B).toFixed(1)} ms/item at batch 1, ${(batch.ms / B).toFixed(1)} ms/item at batch ${B}; ${ranges.join('; ')}`);
  return ok;
}

async function pairCheck(orig, rewritten) {
  const a = await ort.InferenceSession.create(orig);
  const b = await ort.InferenceSession.create(rewritten);
  const shape = dims(b);
  const x = fill(shape.reduce((p, d) => p * d, 1), 99);
  const ra = await runBatch(a, a.inputNames[0], shape, [x]);
  const rb = await runBatch(b, b.inputNames[0], shape, [x]);
  let worst = 0;
  for (const o of a.outputNames) worst = Math.max(worst, maxDiff(ra.out[o].data, rb.out[o].data));
  const ok = worst <= TOL;
  console.log(`${ok ? 'ok  ' : 'FAIL'} ${rewritten} vs ${orig} at batch 1: max |diff| ${worst.toExponential(2)}`);
  return ok;
}

(async () => {
  let ok = true;
  for (const arg of process.argv.slice(2)) {
    const [a, b] = arg.split('=');
    ok = (b ? await pairCheck(a, b) : await batchCheck(a)) && ok;
  }
  process.exit(ok ? 0 : 1);
})().catch((e) => { console.error(e.message || e); process.exit(1); });

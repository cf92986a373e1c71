'use strict';
const test = require('node:test');
const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const util = require('node:util');
const ra = require('../replayauth');
const { loadVectors, VECTORS } = require('./helpers');

// JSON.parse reads user_id 9007199254740993 as a Number and loses it: the
// signing inputs take the exact digits from the raw text.
function exactUserIds() {
  const raw = fs.readFileSync(VECTORS, 'utf8');
  return [...raw.matchAll(/\n    "user_id": (-?[0-9]+),/g)].map((m) => m[1]);
}

test('vectors', async (t) => {
  const vs = loadVectors();
  const uids = exactUserIds();
  assert.equal(uids.length, vs.length);
  for (const [vi, v] of vs.entries()) {
    await t.test(v.name, async () => {
      const uid = uids[vi];
      const c = ra.canonical(v.timestamp, v.nonce, v.method, v.path, uid, v.idempotency_key, v.body);
      assert.equal(c.toString('utf8'), v.canonical);
      assert.equal(ra.sign(v.secrets, v.timestamp, v.nonce, v.method, v.path, uid, v.idempotency_key, v.body), v.header);
      let now = 0;
      const ver = new ra.Verifier(v.verifier_secrets, { skew: v.skew, clock: () => now });
      assert.ok(v.steps.length > 0);
      for (const [i, st] of v.steps.entries()) {
        now = st.now;
        const r = st.request;
        const run = () => ver.verify(st.header, r.method, r.path, r.idempotency_key, Buffer.from(r.body, 'utf8'));
        if (st.expect === 'ok') {
          assert.equal(await run(), st.user_id, `step ${i}`);
        } else {
          await assert.rejects(run, (e) => e instanceof ra.ReplayError && e.reason === st.expect, `step ${i}: want ${st.expect}`);
        }
      }
    });
  }
});

test('secrets', () => {
  assert.throws(() => new ra.Secret('short'), RangeError);
  const raw = 's'.repeat(32);
  const s = new ra.Secret(raw);
  for (const out of [String(s), JSON.stringify({ s }), util.inspect(s), util.inspect([s])]) {
    assert.ok(!out.includes(raw), out);
  }
  const d = fs.mkdtempSync(path.join(os.tmpdir(), 'idemd-'));
  try {
    fs.writeFileSync(path.join(d, 'cur'), `${'a'.repeat(32)}\n`);
    assert.equal(ra.readSecretFiles(path.join(d, 'cur'), '').length, 1);
    assert.throws(() => ra.readSecretFiles(path.join(d, 'missing')));
    assert.throws(() => ra.readSecretFiles(''), RangeError);
  } finally {
    fs.rmSync(d, { recursive: true });
  }
});

test('memory store expires by time without capacity', () => {
  let now = 1000;
  const m = new ra.MemoryNonceStore({ clock: () => now });
  for (let i = 0; i < 20000; i++) assert.ok(m.use(`n${i}`, 1300));
  assert.ok(!m.use('n1', 1300));
  now = 1300;
  assert.ok(!m.use('n2', 1600), 'refused up to its expiry');
  now = 1300.5;
  assert.ok(m.use('n3', 1600), 'expired: fresh again');
  now = 1300 + ra.MEMORY_SWEEP_INTERVAL;
  assert.ok(m.use('n4', 1600));
  assert.equal(m.size, 2, 'expired nonces swept');
});

test('a nonce store failure fails closed', async () => {
  const broken = { use: async () => { throw new Error('database down'); } };
  const v = new ra.Verifier('k'.repeat(32), { nonceStore: broken, clock: () => 1800000000 });
  const h = ra.sign('k'.repeat(32), 1800000000, 'n', 'POST', '/x', 1, 'key', '');
  await assert.rejects(v.verify(h, 'POST', '/x', 'key', ''), (e) => e.reason === 'nonce_store' && e.status === 503);
});

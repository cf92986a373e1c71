'use strict';
// The PostgreSQL nonce store and key lookup on a real database, as the
// API's role. Debian's node-pg cannot be installed beside a nodejs from
// elsewhere, so the query function here runs each statement through psql:
// PREPARE with the library's own SQL and $n parameters, EXECUTE with the
// values, and psql's ROW_COUNT. An application passes its driver's query
// instead ((sql, params) => pool.query(sql, params) with node-pg). The Go
// test that runs these (clients, TestNode) creates the database, records a
// nonce through Go's idem.ReplayNonces first, and names it in
// IDEMD_GO_NONCE.
const test = require('node:test');
const assert = require('node:assert/strict');
const { spawn } = require('node:child_process');
const ra = require('../replayauth');
const uk = require('../uniquekey');
const { loadUniqueVectors, quietLogger, vectorOpts } = require('./helpers');

const DB = process.env.IDEMD_TEST_DATABASE_URL;
const PSQL = process.env.IDEMD_PSQL || 'psql';
const SECRET = '0123456789abcdef0123456789abcdef';
const skip = DB ? false : 'IDEMD_TEST_DATABASE_URL needed';

// query runs one parameterised statement and resolves to { rowCount, rows }.
function query(sql, params = []) {
  return new Promise((resolve, reject) => {
    const args = ['-X', '-q', '-A', '-t', '-v', 'ON_ERROR_STOP=1', '-d', DB];
    params.forEach((p, i) => args.push('-v', `p${i + 1}=${p}`));
    const values = params.map((_, i) => `:'p${i + 1}'`).join(', ');
    const script = `PREPARE q AS ${sql};\nEXECUTE q${values ? `(${values})` : ''};\n\\echo idemd-rows :ROW_COUNT\n`;
    const child = spawn(PSQL, args, { stdio: ['pipe', 'pipe', 'pipe'] });
    let out = ''; let err = '';
    child.stdout.on('data', (c) => { out += c; });
    child.stderr.on('data', (c) => { err += c; });
    child.on('error', reject);
    child.on('close', (code) => {
      const lines = out.trim().split('\n');
      const m = /^idemd-rows (\d+)$/.exec(lines.pop() || '');
      if (code !== 0 || !m) {
        reject(new Error(`psql exited ${code}: ${err.trim()}`));
        return;
      }
      resolve({ rowCount: Number(m[1]), rows: lines.filter((l) => l !== '') });
    });
    child.stdin.end(script);
  });
}

async function scalar(sql, params = []) {
  return (await query(sql, params)).rows[0];
}

// Stages every unique-key vector's job with plain SQL and the helper's key
// and states, as docs/languages/README.md shows. clients' Go TestNode
// inserted the same jobs with River's InsertTx before and moves these rows
// with the enqueuer after: River must keep one job per vector. The args
// are written with goJSON: JSON.stringify cannot write the BigInt values.
test('stage every unique-key vector', { skip }, async () => {
  const vs = loadUniqueVectors();
  for (const v of vs) {
    const key = uk.uniqueKey(v.kind, v.args, vectorOpts(v));
    await query('INSERT INTO staged_jobs (job_name, job_args, queue, unique_key, unique_states) VALUES ($1, $2, $3, $4, $5::bit(8))',
      [v.kind, uk.goJSON(v.args), v.queue, `\\x${key.toString('hex')}`, uk.uniqueStates(v.unique.by_state || null)]);
  }
  assert.equal(await scalar("SELECT count(*) FROM staged_jobs WHERE job_name LIKE 'uk\\_%'"), String(vs.length));
});

test('use records once, with the window as expiry', { skip }, async () => {
  const store = new ra.PostgresNonceStore(query);
  assert.equal(await store.use('js-once', 1800000300), true);
  assert.equal(await store.use('js-once', 1800000300), false);
  assert.equal(await scalar('SELECT extract(epoch FROM expires_at)::bigint FROM idemd_replay_nonces WHERE nonce = $1', ['js-once']), '1800000300');
});

test('the verifier records t + skew', { skip }, async () => {
  const v = new ra.Verifier(SECRET, { nonceStore: new ra.PostgresNonceStore(query), clock: () => 1800000000 });
  const h = ra.sign(SECRET, 1800000000, 'js-verifier', 'POST', '/orders', 42, 'k', '{}');
  assert.equal(await v.verify(h, 'POST', '/orders', 'k', '{}'), '42');
  await assert.rejects(v.verify(h, 'POST', '/orders', 'k', '{}'), (e) => e.reason === 'replayed');
  assert.equal(await scalar('SELECT extract(epoch FROM expires_at)::bigint FROM idemd_replay_nonces WHERE nonce = $1', ['js-verifier']), '1800000300');
});

test('a nonce Go recorded is refused', { skip: skip || (!process.env.IDEMD_GO_NONCE && 'IDEMD_GO_NONCE not set') }, async () => {
  const ts = Number(process.env.IDEMD_GO_NONCE_TS);
  const v = new ra.Verifier(SECRET, { nonceStore: new ra.PostgresNonceStore(query), clock: () => ts });
  const h = ra.sign(SECRET, ts, process.env.IDEMD_GO_NONCE, 'POST', '/orders', 42, 'k', '');
  await assert.rejects(v.verify(h, 'POST', '/orders', 'k', ''), (e) => e.reason === 'replayed');
});

test('concurrent uses of one nonce: exactly one is fresh', { skip }, async () => {
  const store = new ra.PostgresNonceStore(query);
  const results = await Promise.all(Array.from({ length: 8 }, () => store.use('js-race', 1800000300)));
  assert.equal(results.filter((r) => r).length, 1);
});

test('cleanup: bounded batches, live and in-grace rows kept', { skip }, async () => {
  await query("INSERT INTO idemd_replay_nonces (nonce, expires_at) SELECT 'js-old-' || i, now() - interval '10 minutes' FROM generate_series(1, 7) i");
  await query("INSERT INTO idemd_replay_nonces (nonce, expires_at) VALUES ('js-in-grace', now() - interval '30 seconds'), ('js-live', now() + interval '5 minutes')");
  let now = 0;
  const store = new ra.PostgresNonceStore(query, { cleanupBatch: 3, cleanupInterval: 60, clock: () => now });
  const old = "SELECT count(*) FROM idemd_replay_nonces WHERE nonce LIKE 'js-old-%'";
  await store.use('js-c1', 1800000300); // a full batch of 3: again on the next use
  assert.equal(await scalar(old), '4');
  await store.use('js-c2', 1800000300);
  assert.equal(await scalar(old), '1');
  await store.use('js-c3', 1800000300); // 1 < 3: the next cleanup waits an interval
  assert.equal(await scalar(old), '0');
  await query("INSERT INTO idemd_replay_nonces (nonce, expires_at) VALUES ('js-old-8', now() - interval '10 minutes')");
  await store.use('js-c4', 1800000300);
  assert.equal(await scalar(old), '1', 'cleaned before the interval passed');
  now = 60;
  await store.use('js-c5', 1800000300);
  assert.equal(await scalar(old), '0');
  assert.equal(await scalar("SELECT count(*) FROM idemd_replay_nonces WHERE nonce IN ('js-in-grace', 'js-live')"), '2');
  assert.equal(store.deleted, 8);
});

test('a failed cleanup does not fail the request', { skip }, async () => {
  const failing = (sql, params) => (sql.startsWith('DELETE') ? Promise.reject(new Error('cleanup refused')) : query(sql, params));
  const store = new ra.PostgresNonceStore(failing, { logger: quietLogger });
  assert.equal(await store.use('js-cleanup-fails', 1800000300), true);
  assert.equal(store.cleanupErrors, 1);
});

test('an unreachable database fails closed', async () => {
  const down = () => Promise.reject(new Error('could not connect'));
  const v = new ra.Verifier(SECRET, { nonceStore: new ra.PostgresNonceStore(down), clock: () => 1800000000 });
  const h = ra.sign(SECRET, 1800000000, 'js-down', 'POST', '/orders', 42, 'k', '');
  await assert.rejects(v.verify(h, 'POST', '/orders', 'k', ''), (e) => e.reason === 'nonce_store' && e.status === 503);
});

test('key lookup', { skip }, async () => {
  await query("INSERT INTO idempotency_keys (idempotency_key, user_id, request_method, request_path, request_params, recovery_point) VALUES ('js-open', 7, 'POST', '/orders', '{}', 'order_created'), ('js-done', 7, 'POST', '/orders', '{}', 'finished')");
  const lookup = ra.PostgresKeyLookup(query);
  assert.equal(await lookup('7', 'js-open', 'POST', '/orders'), true);
  assert.equal(await lookup('7', 'js-open', 'post', '/orders'), true, 'method compared case-insensitively');
  assert.equal(await lookup('7', 'js-done', 'POST', '/orders'), false, 'finished key');
  assert.equal(await lookup('8', 'js-open', 'POST', '/orders'), false, "another user's key");
  assert.equal(await lookup('7', 'js-open', 'POST', '/orders/2'), false, 'another path');
  assert.equal(await lookup('7', 'js-open', 'PUT', '/orders'), false, 'another method');
  assert.equal(await lookup('7', 'js-none', 'POST', '/orders'), false, 'no such key');
});

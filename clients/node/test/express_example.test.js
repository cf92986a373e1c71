'use strict';
// example/express_app.js served on a local port, against the database the
// Go side migrated (clients, TestNode): a signed form-encoded replay (what
// the completer sends with --request-encoding form) finishes an abandoned
// key, a forged one is refused, and without a secret the app still loads
// and refuses every signed request. Express and pg come from the example's
// own npm install (scripts/ensure-runtimes.sh runs npm ci there).
const test = require('node:test');
const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const ra = require('../replayauth');

const DB = process.env.IDEMD_TEST_DATABASE_URL;
const EXAMPLE = path.join(__dirname, '..', 'example');
const SECRET = '0123456789abcdef0123456789abcdef';
const FORGED = "an attacker's guess at the secret!";
const USER = 42;
const FORM = 'quantity=2&sku=book'; // the completer's form encoding of {"quantity":2,"sku":"book"}
const skip = DB ? false : 'IDEMD_TEST_DATABASE_URL needed';

test('the Express example', { skip }, async (t) => {
  const { createApp, canonical, fingerprint } = require(EXAMPLE + '/express_app.js');
  const { Pool } = require(require.resolve('pg', { paths: [EXAMPLE] }));
  const db = new Pool({ connectionString: DB, max: 2 });
  t.after(() => db.end());
  await db.query('SET client_min_messages = warning');
  await db.query(`CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL,
    key_id bigint NOT NULL UNIQUE, sku text NOT NULL, quantity int NOT NULL)`);
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'idemd-express-'));
  t.after(() => fs.rmSync(dir, { recursive: true, force: true }));
  const secretFile = path.join(dir, 'secret');
  fs.writeFileSync(secretFile, `${SECRET}\n`);

  const quiet = { log() {}, error() {}, warn() {} };
  const realConsole = { log: console.log, error: console.error, warn: console.warn };
  Object.assign(console, quiet); // the app logs each refusal it is made to give
  t.after(() => Object.assign(console, realConsole));

  async function serve(secret) {
    const app = createApp({ databaseUrl: DB, secretFile: secret });
    const server = await new Promise((resolve) => { const s = app.listen(0, '127.0.0.1', () => resolve(s)); });
    t.after(() => { server.close(); return app.locals.pool.end(); });
    return `http://127.0.0.1:${server.address().port}`;
  }

  // A key a client began and abandoned before the phase: unlocked at
  // 'started', with the canonical params the completer replays.
  async function abandonedKey() {
    const key = `express-${crypto.randomBytes(8).toString('hex')}`;
    const canon = canonical({ quantity: 2, sku: 'book' });
    await db.query(`INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at, last_run_at, request_method,
        request_path, request_params, request_fingerprint, recovery_point)
      VALUES ($1, $2, NULL, now() - interval '1 minute', 'POST', '/orders', $3::jsonb, $4, 'started')`,
    [key, USER, canon, fingerprint('POST', '/orders', canon)]);
    return key;
  }

  const post = (base, headers) => fetch(`${base}/orders`, {
    method: 'POST', body: FORM, headers: { 'content-type': 'application/x-www-form-urlencoded', ...headers },
  });
  const replay = (base, key, secret) => post(base, {
    'idempotency-key': key,
    'idemd-replay-signature': ra.sign(secret, Math.floor(Date.now() / 1000), `js-express-${crypto.randomBytes(8).toString('hex')}`,
      'POST', '/orders', USER, key, FORM),
  });
  const own = (base, key) => post(base, { 'idempotency-key': key, authorization: `Bearer user-${USER}` });
  async function stored(key) {
    const r = await db.query(`SELECT recovery_point, response_code, response_body::text AS body,
        (SELECT count(*)::int FROM orders o WHERE o.key_id = k.id) AS orders
      FROM idempotency_keys k WHERE user_id = $1 AND idempotency_key = $2`, [USER, key]);
    const k = r.rows[0];
    return [k.recovery_point, k.response_code, k.body, k.orders];
  }

  await t.test('a signed form replay finishes the key', async () => {
    const base = await serve(secretFile);
    const key = await abandonedKey();
    const res = await replay(base, key, SECRET);
    const body = await res.text();
    assert.equal(res.status, 201, body);
    const doc = JSON.parse(body);
    assert.deepEqual([doc.sku, doc.quantity], ['book', 2]);
    assert.deepEqual(await stored(key), ['finished', 201, body, 1], 'the stored response is the bytes answered');
    // Finished: another signed replay is refused (no unfinished key), and
    // the client's retry gets the stored response.
    assert.equal((await replay(base, key, SECRET)).status, 401);
    const again = await own(base, key);
    assert.deepEqual([again.status, await again.text(), again.headers.get('idempotent-replayed')], [201, body, 'true']);
  });

  await t.test('a forged replay is refused', async () => {
    const base = await serve(secretFile);
    const key = await abandonedKey();
    const res = await replay(base, key, FORGED);
    assert.equal(res.status, 401);
    assert.deepEqual(await res.json(), { error: ra.MSG_UNAUTHORIZED });
    assert.deepEqual(await stored(key), ['started', null, null, 0]);
  });

  await t.test('loads without a secret', async () => {
    const base = await serve('');
    const key = await abandonedKey();
    const res = await replay(base, key, SECRET);
    assert.deepEqual([res.status, await res.json()], [401, { error: ra.MSG_UNAUTHORIZED }], 'no secret: the replay path is closed');
    assert.deepEqual(await stored(key), ['started', null, null, 0]);
    const ownKey = `express-${crypto.randomBytes(8).toString('hex')}`;
    const r = await own(base, ownKey);
    const body = await r.text();
    assert.equal(r.status, 201, body);
    assert.deepEqual(await stored(ownKey), ['finished', 201, body, 1]);
  });
});

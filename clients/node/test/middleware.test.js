'use strict';
// replayAuth answers as idem.ReplayAuth does.
const test = require('node:test');
const assert = require('node:assert/strict');
const http = require('node:http');
const { Readable } = require('node:stream');
const ra = require('../replayauth');
const { quietLogger } = require('./helpers');

const SECRET = '0123456789abcdef0123456789abcdef';
const OTHER = "an attacker's guess at the secret!";
const NOW = 1800000000;
const BODY = '{"quantity":2,"sku":"book"}';
const KEY = 'order-key-0001';
const UNAUTHORIZED = { error: ra.MSG_UNAUTHORIZED };
const INTERNAL = { error: ra.MSG_INTERNAL };

const signed = (nonce, { secret = SECRET, path = '/orders', user = 42, key = KEY, body = BODY } = {}) =>
  ra.sign(secret, NOW, nonce, 'POST', path, user, key, body);

// A request as node:http makes it: header values are the bytes as latin1.
function fakeReq({ header, key = KEY, body = BODY, url = '/orders', originalUrl, extra = {} }) {
  const req = Readable.from([Buffer.from(body)]);
  req.method = 'POST';
  req.url = url;
  if (originalUrl) req.originalUrl = originalUrl;
  req.headers = { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(body)) };
  if (header !== undefined) req.headers['idemd-replay-signature'] = header;
  if (key !== null) req.headers['idempotency-key'] = Buffer.from(key, 'utf8').toString('latin1');
  Object.assign(req, extra);
  return req;
}

function fakeRes() {
  const res = { statusCode: 200, headers: {}, body: '' };
  res.setHeader = (k, v) => { res.headers[k.toLowerCase()] = String(v); };
  let done;
  res.finished = new Promise((r) => { done = r; });
  res.end = (b) => { res.body = b || ''; done(); };
  return res;
}

class Lookup {
  constructor() { this.answer = true; this.calls = []; }
  fn() {
    return async (uid, key, method, path) => {
      this.calls.push([uid, key, method, path]);
      if (this.answer instanceof Error) throw this.answer;
      return this.answer;
    };
  }
}

function setup(verifier = new ra.Verifier(SECRET, { clock: () => NOW }), logger = quietLogger) {
  const lookup = new Lookup();
  const seen = [];
  const mw = ra.replayAuth({ verifier, unfinishedKey: lookup.fn(), logger });
  // Runs the middleware, then the application (which reads the body as a
  // handler after it would), or the error handler.
  async function call(opts = {}) {
    const req = fakeReq(opts);
    const res = fakeRes();
    mw(req, res, async (err) => {
      if (err) {
        res.statusCode = 500;
        res.end(JSON.stringify({ error: err.message }));
        return;
      }
      let body = req.rawBody;
      if (!body) {
        const chunks = [];
        for await (const c of req) chunks.push(c);
        body = Buffer.concat(chunks);
      }
      seen.push({ user: req[ra.USER_ID_PROPERTY], body: body.toString(), parsed: req.body });
      res.statusCode = 200;
      res.end('served');
    });
    await res.finished;
    return res;
  }
  return { lookup, seen, call, mw };
}

function assertRefused(s, res, status = 401, body = UNAUTHORIZED) {
  assert.equal(res.statusCode, status);
  assert.deepEqual(JSON.parse(res.body), body);
  assert.equal(res.headers['content-type'], 'application/json');
  assert.equal(res.headers['content-length'], String(Buffer.byteLength(res.body)));
  assert.deepEqual(s.seen, [], 'the application was called');
}

test('unsigned requests pass untouched', async () => {
  const s = setup();
  const res = await s.call({ extra: { [ra.USER_ID_PROPERTY]: '7' } });
  assert.equal(res.statusCode, 200);
  assert.deepEqual(s.seen, [{ user: undefined, body: BODY, parsed: undefined }]);
  assert.deepEqual(s.lookup.calls, []);
});

test('valid: the user id, the raw body and the parsed JSON body', async () => {
  const s = setup();
  assert.equal((await s.call({ header: signed('v1') })).statusCode, 200);
  assert.deepEqual(s.seen, [{ user: '42', body: BODY, parsed: { quantity: 2, sku: 'book' } }]);
  assert.deepEqual(s.lookup.calls, [['42', KEY, 'POST', '/orders']]);
});

test('a user id beyond 2^53 stays exact', async () => {
  const s = setup();
  const h = ra.sign(SECRET, NOW, 'v2', 'POST', '/orders', '9007199254740993', KEY, BODY);
  assert.equal((await s.call({ header: h })).statusCode, 200);
  assert.equal(s.seen[0].user, '9007199254740993');
});

test('mounted under a router: originalUrl, percent-decoded, without the query', async () => {
  const s = setup();
  const res = await s.call({ header: signed('v3', { path: '/api/orders/café', key: 'clé-✓' }), key: 'clé-✓',
    url: '/orders/caf%C3%A9', originalUrl: '/api/orders/caf%C3%A9?expand=1' });
  assert.equal(res.statusCode, 200);
  assert.deepEqual(s.lookup.calls, [['42', 'clé-✓', 'POST', '/api/orders/café']]);
});

test('invalid percent-encoding is refused', async () => {
  const s = setup();
  assertRefused(s, await s.call({ header: signed('v4'), url: '/orders%zz' }));
});

test('forged, tampered, garbage, expired', async () => {
  const s = setup();
  assertRefused(s, await s.call({ header: signed('f1', { secret: OTHER }) }));
  assertRefused(s, await s.call({ header: signed('f2'), body: '{"quantity":3,"sku":"book"}' }));
  assertRefused(s, await s.call({ header: 'hello' }));
  const late = setup(new ra.Verifier(SECRET, { clock: () => NOW + 301 }));
  assertRefused(late, await late.call({ header: signed('f3') }));
  // A forged header records nothing: the real one with its nonce passes.
  assert.equal((await s.call({ header: signed('f1') })).statusCode, 200);
});

test('replayed', async () => {
  const s = setup();
  const h = signed('r1');
  assert.equal((await s.call({ header: h })).statusCode, 200);
  s.seen.length = 0;
  assertRefused(s, await s.call({ header: h }));
});

test('no unfinished key: 401; the lookup fails: 503', async () => {
  const s = setup();
  s.lookup.answer = false;
  assertRefused(s, await s.call({ header: signed('k1') }));
  s.lookup.answer = new Error('database down');
  assertRefused(s, await s.call({ header: signed('k2') }), 503, INTERNAL);
});

test('the nonce store fails: 503, logged once per outage', async () => {
  const store = { down: true, seen: new Set(), async use(n) {
    if (this.down) throw new Error('database down');
    const fresh = !this.seen.has(n);
    this.seen.add(n);
    return fresh;
  } };
  const logs = [];
  const logger = { warn() {}, error: (m) => logs.push(['error', m]), info: (m) => logs.push(['info', m]) };
  const s = setup(new ra.Verifier(SECRET, { nonceStore: store, clock: () => NOW }), logger);
  for (let i = 0; i < 3; i++) assertRefused(s, await s.call({ header: signed(`o${i}`) }), 503, INTERNAL);
  assert.deepEqual(s.lookup.calls, []);
  store.down = false;
  assert.equal((await s.call({ header: signed('o9') })).statusCode, 200);
  assert.equal((await s.call({ header: signed('o10') })).statusCode, 200);
  assert.equal(logs.filter(([l]) => l === 'error').length, 1, JSON.stringify(logs));
  assert.equal(logs.filter(([l, m]) => l === 'info' && m.includes('failures: 3')).length, 1, JSON.stringify(logs));
});

test('disabled: every signed request is 401, unsigned ones pass', async () => {
  const s = setup(null);
  assertRefused(s, await s.call({ header: signed('d1') }));
  assert.equal((await s.call({})).statusCode, 200);
});

test('invalid Idempotency-Key headers', async () => {
  const s = setup();
  for (const key of [null, '', 'a\u0001b', 'k'.repeat(256), 'tab\tkey']) {
    assertRefused(s, await s.call({ header: signed(`b-${key}`, { key: key || '' }), key }));
  }
  const bad = fakeReq({ header: signed('b-utf8') });
  bad.headers['idempotency-key'] = '\xff\xfe';
  const res = fakeRes();
  s.mw(bad, res, () => assert.fail('next called'));
  await res.finished;
  assert.equal(res.statusCode, 401);
  assert.equal((await s.call({ header: signed('b-255', { key: 'k'.repeat(255) }), key: 'k'.repeat(255) })).statusCode, 200);
});

test('body size', async () => {
  const s = setup();
  const big = 'x'.repeat(ra.MAX_REPLAY_BODY + 1);
  assertRefused(s, await s.call({ header: signed('l1', { body: big }), body: big }));
  const edge = 'x'.repeat(ra.MAX_REPLAY_BODY);
  assert.equal((await s.call({ header: signed('l2', { body: edge }), body: edge })).statusCode, 200);
});

test('after a body parser that kept the raw body', async () => {
  const s = setup();
  const rawBody = Buffer.from(BODY);
  const res = await s.call({ header: signed('p1'), extra: { rawBody, _body: true, body: { parsed: 'by express.json' } } });
  assert.equal(res.statusCode, 200);
  assert.deepEqual(s.seen[0].parsed, { parsed: 'by express.json' }, 'the parser\'s body is left alone');
});

test('after a body parser that did not keep the raw body: a configuration error', async () => {
  const s = setup();
  const res = await s.call({ header: signed('p2'), extra: { _body: true, body: {} } });
  assert.equal(res.statusCode, 500);
  assert.match(JSON.parse(res.body).error, /keepRawBody/);
});

test('unfinishedKey is required', () => {
  assert.throws(() => ra.replayAuth({ verifier: null }), TypeError);
});

test('over real HTTP', async () => {
  const lookup = new Lookup();
  const mw = ra.replayAuth({ verifier: new ra.Verifier(SECRET, { clock: () => NOW }), unfinishedKey: lookup.fn(), logger: quietLogger });
  const server = http.createServer((req, res) => mw(req, res, () => {
    res.setHeader('Content-Type', 'application/json');
    res.end(JSON.stringify({ user: req[ra.USER_ID_PROPERTY] || null, body: req.body || null }));
  }));
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const send = (headers, body = BODY) => new Promise((resolve, reject) => {
    const req = http.request({ host: '127.0.0.1', port: server.address().port, method: 'POST', path: '/orders',
      headers: { 'Content-Type': 'application/json', ...headers } }, (res) => {
      const chunks = [];
      res.on('data', (c) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode, body: JSON.parse(Buffer.concat(chunks).toString()) }));
    });
    req.on('error', reject);
    req.end(body);
  });
  try {
    const h = signed('h1');
    assert.deepEqual(await send({ 'Idemd-Replay-Signature': h, 'Idempotency-Key': KEY }),
      { status: 200, body: { user: '42', body: { quantity: 2, sku: 'book' } } });
    assert.deepEqual(await send({ 'Idemd-Replay-Signature': h, 'Idempotency-Key': KEY }), { status: 401, body: UNAUTHORIZED });
    assert.deepEqual(await send({ 'Idempotency-Key': KEY }), { status: 200, body: { user: null, body: null } });
  } finally {
    server.close();
  }
});

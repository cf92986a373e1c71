'use strict';
// idemd's replay verifier for Node APIs: Express/connect middleware.
//
// idemd's completer replays an abandoned request on behalf of the key's user
// with a signed header (docs/api-authors.md, "The replay signature"):
//
//   Idemd-Replay-Signature: t=<unix s>,n=<nonce>,u=<user id>,v1=<hex HMAC>[,v1=...]
//
// This module checks it exactly as Go's idem/replayauth and idem.ReplayAuth
// do: the header's parts, the skew window, HMAC-SHA256 over the canonical
// string compared in constant time (crypto.timingSafeEqual) against every
// secret held (two during a rotation), a nonce accepted once (in memory, or
// in idemd's PostgreSQL table idemd_replay_nonces shared with every replica
// in any language), and an existing unfinished key of the signed user for
// this method and path. Only then does the application see the user id, as
// req.idemdReplayUserId (a decimal string: user ids are int64). Refusals
// are 401 {"error": "Replay signature rejected."}; a nonce store or key
// lookup that fails is a 503 the completer retries.
//
// No dependencies: the PostgreSQL parts take a function that runs one
// parameterised statement on the application's own driver and resolves to
// the number of rows it inserted, deleted or returned (node-pg's
// pool.query resolves to a result whose rowCount is used). See
// docs/languages/node.md.

const crypto = require('node:crypto');
const fs = require('node:fs');

const HEADER = 'Idemd-Replay-Signature';
const IDEMPOTENCY_KEY_HEADER = 'Idempotency-Key';
const DEFAULT_SKEW = 300; // seconds, replayauth.DefaultSkew
const MIN_SECRET_LEN = 32; // bytes
const MAX_REPLAY_BODY = 1 << 20; // idem.MaxReplayBody
const MAX_KEY_LENGTH = 255; // characters, idem.MaxKeyLength
const MEMORY_SWEEP_INTERVAL = 60; // seconds, replayauth.MemorySweepInterval

// Where the middleware hands the signed user id to the application.
const USER_ID_PROPERTY = 'idemdReplayUserId';

// Response bodies, idem.MsgReplayUnauthorized and idem.MsgInternal.
const MSG_UNAUTHORIZED = 'Replay signature rejected.';
const MSG_INTERNAL = 'Internal server error. Please retry the request periodically with the same Idempotency-Key until it succeeds.';

// A refused replay. reason names it as the vectors do; status is the HTTP
// status the middleware answers with.
class ReplayError extends Error {
  constructor(message, reason = 'refused', status = 401) {
    super(message);
    this.name = 'ReplayError';
    this.reason = reason;
    this.status = status;
  }
}

const missing = (m) => new ReplayError(m || 'signature header missing', 'missing');
const malformed = (m) => new ReplayError(m || 'signature header malformed', 'malformed');
const expired = () => new ReplayError('timestamp outside the skew window', 'expired');
const mismatch = () => new ReplayError('no signature matches', 'mismatch');
const replayed = () => new ReplayError('nonce already used', 'replayed');
// Refused by the middleware rather than the signature: replay path
// disabled, invalid Idempotency-Key, body too large, no unfinished key.
const refused = (m) => new ReplayError(m, 'refused');
const nonceStoreError = (e) => Object.assign(new ReplayError(`nonce store unavailable: ${e && e.message}`, 'nonce_store', 503), { cause: e });
const keyLookupError = (e) => Object.assign(new ReplayError(`replay key lookup: ${e && e.message}`, 'key_lookup', 503), { cause: e });

const SECRET = Symbol('idemd.secret');

// An HMAC key of at least MIN_SECRET_LEN bytes; never printed.
class Secret {
  constructor(raw) {
    const b = raw instanceof Secret ? raw[SECRET] : Buffer.from(raw);
    if (b.length < MIN_SECRET_LEN) {
      throw new RangeError(`idemd replayauth: secret is ${b.length} bytes, need at least ${MIN_SECRET_LEN}`);
    }
    Object.defineProperty(this, SECRET, { value: Buffer.from(b), enumerable: false });
  }

  toString() { return '[redacted]'; }
  toJSON() { return '[redacted]'; }
  [Symbol.for('nodejs.util.inspect.custom')]() { return '[redacted]'; }
}

function toSecrets(list) {
  const arr = Array.isArray(list) ? list : [list];
  if (arr.length === 0) throw new RangeError('idemd replayauth: no secret configured');
  return arr.map((s) => (s instanceof Secret ? s : new Secret(s)));
}

// Reads the current secret and, during a rotation, the previous one (empty
// paths are skipped), each trimmed of surrounding whitespace.
function readSecretFiles(...paths) {
  const out = paths.filter(Boolean).map((p) => new Secret(Buffer.from(fs.readFileSync(p, 'latin1').trim(), 'latin1')));
  if (out.length === 0) throw new RangeError('idemd replayauth: no secret configured');
  return out;
}

const bytes = (v) => (Buffer.isBuffer(v) ? v : Buffer.from(v == null ? '' : String(v), 'utf8'));

// The string that is MACed (a Buffer): the fields joined by newlines.
function canonical(ts, nonce, method, path, userId, key, body) {
  const nl = Buffer.from('\n');
  const parts = [
    Buffer.from('idemd-replay-v1'),
    Buffer.from(BigInt(ts).toString()),
    bytes(nonce),
    Buffer.from(bytes(method).toString('latin1').toUpperCase(), 'latin1'),
    bytes(path),
    Buffer.from(BigInt(userId).toString()),
    bytes(key),
    Buffer.from(crypto.createHash('sha256').update(bytes(body)).digest('hex')),
  ];
  const out = [];
  parts.forEach((p, i) => { if (i > 0) out.push(nl); out.push(p); });
  return Buffer.concat(out);
}

const mac = (secret, msg) => crypto.createHmac('sha256', secret[SECRET]).update(msg).digest();

// The header idemd's completer would send (for tests of an API).
function sign(secrets, ts, nonce, method, path, userId, key, body) {
  const c = canonical(ts, nonce, method, path, userId, key, body);
  const parts = [`t=${BigInt(ts)}`, `n=${nonce}`, `u=${BigInt(userId)}`];
  for (const s of toSecrets(secrets)) parts.push(`v1=${mac(s, c).toString('hex')}`);
  return parts.join(',');
}

const INT64 = /^[+-]?[0-9]+$/;
const HEX32 = /^[0-9a-fA-F]{64}$/;
const MIN_INT64 = -(2n ** 63n);
const MAX_INT64 = 2n ** 63n - 1n;

function int64(v) {
  if (!INT64.test(v)) throw malformed();
  const n = BigInt(v);
  if (n < MIN_INT64 || n > MAX_INT64) throw malformed();
  return n;
}

const trimASCII = (s) => s.replace(/^[ \t\n\v\f\r]+|[ \t\n\v\f\r]+$/g, '');

// Decodes a header value (a string, or a Buffer of its bytes) without
// checking it (not exported, as Go's: nothing in it is verified): { timestamp: BigInt, nonce: Buffer, userId: BigInt, v1: [Buffer] }.
function parse(header) {
  // One character per byte, so lengths are Go's byte lengths.
  const h = Buffer.isBuffer(header) ? header.toString('latin1') : bytes(header).toString('latin1');
  if (h === '') throw missing();
  let ts = null; let nonce = null; let uid = null;
  const v1 = [];
  for (const part of h.split(',')) {
    const p = trimASCII(part);
    const i = p.indexOf('=');
    if (i < 0) throw malformed();
    const k = p.slice(0, i); const v = p.slice(i + 1);
    if (k === 't') {
      if (ts !== null) throw malformed();
      ts = int64(v);
    } else if (k === 'n') {
      if (v === '' || v.length > 64 || nonce !== null) throw malformed();
      nonce = Buffer.from(v, 'latin1');
    } else if (k === 'u') {
      if (uid !== null) throw malformed();
      uid = int64(v);
    } else if (k === 'v1') {
      if (!HEX32.test(v) || v1.length >= 4) throw malformed();
      v1.push(Buffer.from(v, 'hex'));
    }
    // Unknown schemes are ignored, so a future v2 can sit beside v1.
  }
  if (ts === null || nonce === null || uid === null || v1.length === 0) throw malformed();
  return { timestamp: ts, nonce, userId: uid, v1 };
}

const wallClock = () => Date.now() / 1000;

// Nonces in this process's memory until they expire, by time, with no
// capacity: for an API with one process, and tests. Replicas each have
// their own; use PostgresNonceStore for more than one process.
class MemoryNonceStore {
  constructor({ clock = wallClock } = {}) {
    this.clock = clock;
    this.seen = new Map();
    this.nextSweep = -Infinity;
  }

  // Records nonce until expiresAt (unix seconds); false when it is already
  // recorded and not expired.
  use(nonce, expiresAt, now = this.clock()) {
    if (now >= this.nextSweep) {
      for (const [k, exp] of this.seen) if (now > exp) this.seen.delete(k);
      this.nextSweep = now + MEMORY_SWEEP_INTERVAL;
    }
    const exp = this.seen.get(nonce);
    // Refused up to and including the instant it expires, the last instant
    // its signature still passes the window.
    if (exp !== undefined && now <= exp) return false;
    this.seen.set(nonce, expiresAt);
    return true;
  }

  get size() { return this.seen.size; }
}

// The row count a query function resolved to: a number, or a result with
// rowCount (node-pg).
function rows(result) {
  if (typeof result === 'number' && Number.isInteger(result)) return result;
  if (result && Number.isInteger(result.rowCount)) return result.rowCount;
  throw new TypeError('idemd replayauth: the query function must resolve to the number of rows');
}

// The statements of idem.ReplayNonces and idem.ReplayAuth.
const INSERT_NONCE_SQL = 'INSERT INTO idemd_replay_nonces (nonce, expires_at) VALUES ($1, to_timestamp($2)) ON CONFLICT (nonce) DO NOTHING';
const CLEANUP_NONCES_SQL = 'DELETE FROM idemd_replay_nonces WHERE ctid = ANY (ARRAY(SELECT ctid FROM idemd_replay_nonces WHERE expires_at < now() - make_interval(secs => $1) ORDER BY expires_at LIMIT $2))';
const UNFINISHED_KEY_SQL = "SELECT 1 FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2 AND recovery_point <> 'finished' AND upper(request_method) = upper($3) AND request_path = $4 LIMIT 1";

// Logs the first failure of a run and the first success after it.
class Outage {
  constructor() { this.down = false; this.failed = 0; }

  fail(logger, msg, err) {
    this.failed += 1;
    if (!this.down) {
      this.down = true;
      logger.error(`${msg}: ${err && err.message}`);
    }
  }

  ok(logger, msg) {
    if (this.down) {
      logger.info(`${msg} (failures: ${this.failed})`);
    }
    this.down = false;
    this.failed = 0;
  }
}

// Nonces in idemd's table idemd_replay_nonces, shared by every replica of
// the API in any language (idem.ReplayNonces in Go): a nonce accepted by
// one is refused by all.
//
// query(sql, params) runs one statement on the application's driver,
// outside any transaction of the request, and resolves to the number of
// rows (a number, or node-pg's result). With node-pg:
//
//   const store = new PostgresNonceStore((sql, params) => pool.query(sql, params));
//
// Recording is one INSERT ... ON CONFLICT (nonce) DO NOTHING with
// expires_at = the signature's timestamp + the skew window; after a use, at
// most once per cleanupInterval seconds, up to cleanupBatch rows expired for
// longer than grace seconds (database clock) are deleted, and again on the
// next use while batches come back full. A failed insert rejects (the
// verifier refuses with 503); a failed cleanup is logged once per outage.
class PostgresNonceStore {
  constructor(query, { cleanupInterval = 60, cleanupBatch = 1000, grace = 60, clock = () => performance.now() / 1000, logger = console } = {}) {
    this.query = query;
    this.cleanupInterval = cleanupInterval > 0 ? cleanupInterval : 60;
    this.cleanupBatch = cleanupBatch > 0 ? Math.floor(cleanupBatch) : 1000;
    this.grace = grace > 0 ? grace : 60;
    this.clock = clock;
    this.logger = logger;
    this.nextClean = -Infinity;
    this.cleaning = false;
    this.down = new Outage();
    this.useErrors = 0;
    this.cleanupErrors = 0;
    this.deleted = 0;
  }

  async use(nonce, expiresAt) {
    let n;
    try {
      n = rows(await this.query(INSERT_NONCE_SQL, [nonce, Math.trunc(expiresAt)]));
    } catch (e) {
      this.useErrors += 1;
      throw e;
    }
    await this.maybeCleanup();
    return n === 1;
  }

  // Deletes up to cleanupBatch rows expired for longer than grace; resolves
  // to how many.
  async cleanup() {
    return rows(await this.query(CLEANUP_NONCES_SQL, [this.grace, this.cleanupBatch]));
  }

  async maybeCleanup() {
    const now = this.clock();
    if (now < this.nextClean || this.cleaning) return;
    this.cleaning = true;
    try {
      const deleted = await this.cleanup();
      this.deleted += deleted;
      this.nextClean = deleted >= this.cleanupBatch ? now : now + this.cleanupInterval;
      this.down.ok(this.logger, 'idemd replayauth: deleting expired replay nonces works again');
    } catch (e) {
      this.cleanupErrors += 1;
      this.nextClean = now + this.cleanupInterval;
      this.down.fail(this.logger, 'idemd replayauth: deleting expired replay nonces failed; retrying every cleanup interval', e);
    } finally {
      this.cleaning = false;
    }
  }
}

// The middleware's second check (idem.ReplayAuth's): the signed user has an
// existing, unfinished key with this value, stored for this same method and
// path. query as for PostgresNonceStore.
function PostgresKeyLookup(query) {
  return async (userId, key, method, path) => rows(await query(UNFINISHED_KEY_SQL, [String(userId), key, method, path])) > 0;
}

// Checks signature headers (replayauth.Verifier).
//
// secrets: one, or two during a rotation (strings, Buffers or Secrets of at
// least 32 bytes); a request signed with any of them is accepted. skew: the
// window in seconds. nonceStore: undefined keeps nonces in this process's
// memory (one process only); PostgresNonceStore shares them with every
// replica. clock: unix seconds (tests).
class Verifier {
  constructor(secrets, { skew = DEFAULT_SKEW, nonceStore = null, clock = wallClock } = {}) {
    this.secrets = toSecrets(secrets);
    this.skew = skew > 0 ? skew : DEFAULT_SKEW;
    this.nonceStore = nonceStore;
    this.clock = clock;
    this.memory = new MemoryNonceStore({ clock });
  }

  // Resolves to the signed user id (a decimal string) or rejects with a
  // ReplayError. The nonce is recorded only after the MAC and the window
  // check pass.
  async verify(header, method, path, key, body = Buffer.alloc(0)) {
    const p = parse(header);
    const k = bytes(key); const pa = bytes(path);
    if (k.includes(0x0a) || k.includes(0x0d) || pa.includes(0x0a) || pa.includes(0x0d)) throw malformed();
    const now = this.clock();
    const d = now - Number(p.timestamp);
    if (d > this.skew || d < -this.skew) throw expired();
    const c = canonical(p.timestamp, p.nonce, method, pa, p.userId, k, body);
    let ok = false;
    for (const s of this.secrets) {
      const want = mac(s, c);
      // Every comparison runs: timing tells nothing about which secret or
      // signature matched.
      for (const got of p.v1) ok = crypto.timingSafeEqual(want, got) || ok;
    }
    if (!ok) throw mismatch();
    const nonce = p.nonce.toString('utf8');
    const expiresAt = Number(p.timestamp) + this.skew;
    let fresh;
    try {
      fresh = this.nonceStore
        ? await this.nonceStore.use(nonce, expiresAt)
        : this.memory.use(nonce, expiresAt, now);
    } catch (e) {
      throw nonceStoreError(e);
    }
    if (!fresh) throw replayed();
    return p.userId.toString();
  }
}

const utf8 = new TextDecoder('utf-8', { fatal: true });

// idem.ValidateKey: present, UTF-8, at most 255 characters, no control
// characters. Takes the header's bytes; returns the key as a string.
function validateKey(key) {
  if (!key || key.length === 0) throw refused('Idempotency-Key header missing');
  let s;
  try {
    s = utf8.decode(key);
  } catch {
    throw refused('idempotency key has invalid characters');
  }
  if ([...s].length > MAX_KEY_LENGTH) throw refused('idempotency key too long');
  if (/[\u0000-\u001f\u007f-\u009f]/.test(s)) throw refused('idempotency key has invalid characters');
  return s;
}

// The request's full path, percent-decoded to bytes as Go's r.URL.Path:
// from req.originalUrl (Express, unchanged by mounting) or req.url. null
// when an escape is invalid.
function requestPath(req) {
  let raw = req.originalUrl || req.url || '/';
  raw = raw.replace(/^[a-zA-Z][a-zA-Z0-9+.-]*:\/\/[^/]*/, '');
  const q = raw.indexOf('?');
  if (q >= 0) raw = raw.slice(0, q);
  const b = Buffer.from(raw, 'latin1');
  const out = [];
  for (let i = 0; i < b.length; i++) {
    if (b[i] !== 0x25) { out.push(b[i]); continue; }
    const hex = b.slice(i + 1, i + 3).toString('latin1');
    if (!/^[0-9a-fA-F]{2}$/.test(hex)) return null;
    out.push(parseInt(hex, 16));
    i += 2;
  }
  return Buffer.from(out);
}

function readBody(req) {
  if (Buffer.isBuffer(req.rawBody)) {
    if (req.rawBody.length > MAX_REPLAY_BODY) return Promise.reject(refused('body too large or unreadable'));
    return Promise.resolve(req.rawBody);
  }
  if (req._body || req.readableEnded) {
    const e = new Error('idemd replayauth: the request body was read before the replay middleware and ' +
      'req.rawBody is not set: mount replayAuth before body parsers, or keep the raw body ' +
      '(express.json({ verify: replayauth.keepRawBody }))');
    e.config = true;
    return Promise.reject(e);
  }
  const len = req.headers['content-length'];
  if (len !== undefined && (!/^[0-9]+$/.test(len) || Number(len) > MAX_REPLAY_BODY)) {
    return Promise.reject(refused('body too large or unreadable'));
  }
  return new Promise((resolve, reject) => {
    const chunks = []; let size = 0; let done = false;
    const finish = (err, val) => {
      if (done) return;
      done = true;
      req.removeListener('data', onData);
      req.removeListener('end', onEnd);
      req.removeListener('error', onError);
      if (err) reject(err); else resolve(val);
    };
    const onData = (c) => {
      size += c.length;
      if (size > MAX_REPLAY_BODY) {
        req.pause();
        finish(refused('body too large or unreadable'));
        return;
      }
      chunks.push(c);
    };
    const onEnd = () => finish(null, Buffer.concat(chunks));
    const onError = () => finish(refused('body too large or unreadable'));
    req.on('data', onData);
    req.on('end', onEnd);
    req.on('error', onError);
  });
}

// For express.json({ verify: keepRawBody }) (or express.raw /
// express.urlencoded): keeps the bytes the parser read as req.rawBody, so
// the replay middleware can be mounted after the parser.
function keepRawBody(req, res, buf) {
  req.rawBody = Buffer.from(buf);
}

// What the middleware hands the application when it read the stream
// itself: req.rawBody, and req.body parsed as express.json() would for a
// JSON body (the completer sends its replays as JSON), marked parsed so a
// later body parser leaves it alone.
function hand(req, body) {
  if (Buffer.isBuffer(req.rawBody)) return;
  req.rawBody = body;
  req._body = true;
  const type = String(req.headers['content-type'] || '').split(';')[0].trim().toLowerCase();
  if (type === 'application/json' || type.endsWith('+json')) {
    try {
      req.body = body.length ? JSON.parse(body.toString('utf8')) : {};
    } catch {
      req.body = undefined;
    }
  } else if (type === 'application/x-www-form-urlencoded') {
    req.body = Object.fromEntries(new URLSearchParams(body.toString('utf8')));
  }
}

// Express/connect middleware (idem.ReplayAuth). A request without the
// signature header passes through untouched, to the API's own
// authentication. A signed one reaches the next handler only when the
// signature verifies and unfinishedKey(userId, key, method, path) resolves
// true; req.idemdReplayUserId is then the signed user id (a decimal
// string).
//
//   app.use(replayAuth({
//     verifier: new Verifier(readSecretFiles(cur, prev), { nonceStore: new PostgresNonceStore(query) }),
//     unfinishedKey: PostgresKeyLookup(query),
//   }));
//
// verifier null disables the replay path: every signed request gets 401.
function replayAuth({ verifier, unfinishedKey, logger = console } = {}) {
  if (typeof unfinishedKey !== 'function') {
    throw new TypeError('idemd replayauth: unfinishedKey is required (PostgresKeyLookup(query)): ' +
      'a replay may only finish an existing unfinished key of the signed user');
  }
  const nonceDown = new Outage();
  const answered = () => nonceDown.ok(logger, 'idemd replayauth: recording replay nonces works again');

  function respond(res, status, msg) {
    const body = JSON.stringify({ error: msg });
    res.statusCode = status;
    res.setHeader('Content-Type', 'application/json');
    res.setHeader('Content-Length', Buffer.byteLength(body));
    res.end(body);
  }

  async function check(req, header) {
    if (!verifier) throw refused('replay path disabled: no verifier configured');
    const path = requestPath(req);
    if (path === null) throw malformed('request path is not valid percent-encoding');
    const keyHeader = req.headers['idempotency-key'];
    const key = validateKey(typeof keyHeader === 'string' ? Buffer.from(keyHeader, 'latin1') : null);
    const body = await readBody(req);
    const method = req.method;
    let uid;
    try {
      uid = await verifier.verify(Buffer.from(header, 'latin1'), method, path, key, body);
    } catch (e) {
      if (e.reason === 'replayed') answered();
      throw e;
    }
    answered();
    let found;
    try {
      found = await unfinishedKey(uid, key, method, path.toString('utf8'));
    } catch (e) {
      throw keyLookupError(e);
    }
    if (!found) throw refused('no unfinished key of the signed user for this method and path');
    return { uid, body, path };
  }

  return function idemdReplayAuth(req, res, next) {
    // Only this middleware sets it.
    delete req[USER_ID_PROPERTY];
    const header = req.headers['idemd-replay-signature'];
    if (!header) {
      next();
      return;
    }
    check(req, header).then(({ uid, body }) => {
      hand(req, body);
      req[USER_ID_PROPERTY] = uid;
      next();
    }, (err) => {
      if (err.config) {
        next(err);
        return;
      }
      if (err.reason === 'nonce_store') {
        nonceDown.fail(logger, 'idemd replayauth: cannot record replay nonces; signed replays are refused with 503 until it answers again', err);
        respond(res, 503, MSG_INTERNAL);
        return;
      }
      if (err.reason === 'key_lookup') {
        logger.error(`idemd replayauth: replay key lookup failed: ${err.message}`);
        respond(res, 503, MSG_INTERNAL);
        return;
      }
      if (!(err instanceof ReplayError)) {
        next(err);
        return;
      }
      // The reason goes to the log, never to the caller.
      logger.warn(`idemd replayauth: replay signature rejected: path=${JSON.stringify(req.originalUrl || req.url)} reason=${err.message}`);
      if (err.reason === 'refused' && !req.readableEnded) res.setHeader('Connection', 'close');
      respond(res, 401, MSG_UNAUTHORIZED);
    });
  };
}

module.exports = {
  HEADER,
  IDEMPOTENCY_KEY_HEADER,
  DEFAULT_SKEW,
  MIN_SECRET_LEN,
  MAX_REPLAY_BODY,
  MAX_KEY_LENGTH,
  MEMORY_SWEEP_INTERVAL,
  USER_ID_PROPERTY,
  MSG_UNAUTHORIZED,
  MSG_INTERNAL,
  INSERT_NONCE_SQL,
  CLEANUP_NONCES_SQL,
  UNFINISHED_KEY_SQL,
  ReplayError,
  Secret,
  readSecretFiles,
  canonical,
  sign,
  Verifier,
  MemoryNonceStore,
  PostgresNonceStore,
  PostgresKeyLookup,
  validateKey,
  keepRawBody,
  replayAuth,
};

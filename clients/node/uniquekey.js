'use strict';
// River's unique key for a job staged with plain SQL.
//
// A staged row's unique_key is the SHA-256 of the string River's Go client
// builds from the job's kind, args, period and queue, and unique_states the
// bitmask of the states in which an existing job counts as the same job
// (docs/languages/README.md, "Unique jobs from another language"). This
// file computes both exactly as River's Go client does (Go's encoding/json
// for the args, Go's time.Truncate for the period), so a job staged from
// Node and the same job inserted by a Go API with River's InsertTx are one
// job. clients/testdata/unique_keys.json holds the vectors. JSON.stringify
// differs from Go's encoding (& < >, U+2028, -0, key order).
//
//   const key = uniqueKey('send_invoice', args, { queue: 'billing', byArgs: true,
//     fields: ['customer_id', 'month'], byPeriod: 3600 });
//   await pool.query(`INSERT INTO staged_jobs (job_name, job_args, queue, unique_key, unique_states)
//                     VALUES ($1, $2, 'billing', $3, $4::bit(8))`,
//                    ['send_invoice', JSON.stringify(args), key, uniqueStates()]);
const crypto = require('node:crypto');

// Seconds from Go's zero time (January 1, year 1, UTC), which
// time.Truncate counts periods from, to the Unix epoch.
const GO_ZERO_TO_UNIX = 62135596800n;

// River's job states, in the order PostgreSQL prints unique_states (bit 7
// first).
const STATE_BITS = ['scheduled', 'running', 'retryable', 'pending', 'discarded', 'completed', 'cancelled', 'available'];
const DEFAULT_STATES = ['available', 'completed', 'pending', 'retryable', 'running', 'scheduled'];
const REQUIRED_STATES = ['available', 'pending', 'running', 'scheduled'];

// uniqueKeyString is the string unique_key hashes. args is the job's args
// as the Go API's args struct encodes them (values null, booleans,
// numbers, BigInt for integers beyond 2^53, strings, arrays, plain
// objects); fields are the paths ('customer.id') of the fields marked
// river:"unique", or none for all args; byPeriod is whole seconds; at is
// the job's scheduled_at or the insert's now (a Date or Unix seconds).
function uniqueKeyString(kind, args = {}, opts = {}) {
  const {
    queue = 'default', byArgs = false, fields = null, byPeriod = null, byQueue = false, excludeKind = false, at = null,
  } = opts;
  if (excludeKind && !byArgs && !byPeriod && !byQueue) {
    throw new Error('excludeKind requires byArgs, byQueue or byPeriod');
  }
  let s = '';
  if (!excludeKind) s += `&kind=${kind}`;
  if (byArgs) s += `&args=${uniqueArgs(args, fields)}`;
  if (byPeriod) s += `&period=${periodStart(at === null ? new Date() : at, byPeriod)}`;
  if (byQueue) s += `&queue=${queue}`;
  return s;
}

// uniqueKey is the 32-byte key (a Buffer) for staged_jobs.unique_key.
function uniqueKey(kind, args = {}, opts = {}) {
  return crypto.createHash('sha256').update(uniqueKeyString(kind, args, opts), 'utf8').digest();
}

// uniqueStates is unique_states as a bit string for a bit(8) parameter:
// River's default (every state but cancelled and discarded) without states.
function uniqueStates(states = null) {
  const st = states || DEFAULT_STATES;
  const unknown = st.filter((s) => !STATE_BITS.includes(s));
  if (unknown.length) throw new Error(`unknown job states: ${unknown.join(', ')}`);
  const missing = REQUIRED_STATES.filter((s) => !st.includes(s));
  if (missing.length) throw new Error(`unique states must contain ${missing.join(', ')}`);
  return STATE_BITS.map((s) => (st.includes(s) ? '1' : '0')).join('');
}

function isObject(v) {
  return v !== null && typeof v === 'object' && !Array.isArray(v);
}

// Go sorts keys by their UTF-8 bytes; JavaScript's sort compares UTF-16
// units, which orders U+E000..U+FFFF after astral characters.
function byUtf8(a, b) {
  return Buffer.compare(Buffer.from(a, 'utf8'), Buffer.from(b, 'utf8'));
}

// Marks the objects uniqueArgs builds from marked paths, apart from
// object values taken whole from the args.
const PICKED = Symbol('picked');

function uniqueArgs(args, fields) {
  if (!isObject(args)) throw new TypeError('args must be an object');
  if (!fields || fields.length === 0) {
    return `{${Object.keys(args).sort(byUtf8).map((k) => `${topKey(k)}:${goJSON(args[k])}`).join(',')}}`;
  }
  const picked = { [PICKED]: true };
  for (const path of [...fields].sort(byUtf8)) {
    const parts = path.split('.');
    let obj = args;
    let found = true;
    for (const p of parts) {
      if (!isObject(obj) || !Object.prototype.hasOwnProperty.call(obj, p)) {
        found = false;
        break;
      }
      obj = obj[p];
    }
    if (!found) continue;
    let node = picked;
    for (const p of parts.slice(0, -1)) {
      if (!Object.prototype.hasOwnProperty.call(node, p)) node[p] = { [PICKED]: true };
      node = node[p];
    }
    node[parts[parts.length - 1]] = obj;
  }
  return pickedJSON(picked);
}

function pickedJSON(node) {
  return `{${Object.keys(node).map((k) => `${topKey(k)}:${isObject(node[k]) && node[k][PICKED] ? pickedJSON(node[k]) : goJSON(node[k])}`).join(',')}}`;
}

// topKey writes a top-level key as River does: between quotes as it is
// when all of it is printable ASCII other than " and \, else as Go
// encodes a string.
function topKey(k) {
  return /^[\x20-\x21\x23-\x5b\x5d-\x7f]*$/.test(k) ? `"${k}"` : goString(k);
}

const ESCAPES = {
  '"': '\\"', '\\': '\\\\', '\b': '\\b', '\f': '\\f', '\n': '\\n', '\r': '\\r', '\t': '\\t',
};

const LONE_SURROGATE = /[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/;

// goString writes a string as Go encodes it: ", \, the control characters
// (\b \f \n \r \t short, the rest \u00XX), < > & and U+2028, U+2029
// escaped; the rest as UTF-8.
function goString(s) {
  if (LONE_SURROGATE.test(s)) throw new Error(`string has a lone surrogate: ${JSON.stringify(s)}`);
  return `"${s.replace(/["\\<>&\u2028\u2029\x00-\x1f]/g,
    (c) => ESCAPES[c] || `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`)}"`;
}

// goJSON writes a value as Go's encoding/json.Marshal does. A number is
// written as Go's float64 is: JavaScript's shortest form is Go's, but for
// -0, which Go writes -0.
function goJSON(v) {
  if (v === null) return 'null';
  switch (typeof v) {
    case 'boolean': return v ? 'true' : 'false';
    case 'bigint': return v.toString();
    case 'number':
      if (!Number.isFinite(v)) throw new Error(`${v} has no JSON form`);
      return Object.is(v, -0) ? '-0' : String(v);
    case 'string': return goString(v);
    default:
  }
  if (Array.isArray(v)) return `[${v.map(goJSON).join(',')}]`;
  if (isObject(v) && Object.getPrototypeOf(v) === Object.prototype) {
    return `{${Object.keys(v).map((k) => `${goString(k)}:${goJSON(v[k])}`).join(',')}}`;
  }
  throw new TypeError(`${Object.prototype.toString.call(v)} has no JSON form here: convert it as the Go API's args struct encodes it`);
}

// periodStart is the start of the period at falls in, in UTC, as RFC 3339:
// Go's Time.Truncate counts periods from its zero time, not from 1970,
// which matters for periods that do not divide a day (a week starts on a
// Monday).
function periodStart(at, period) {
  if (!Number.isInteger(period) || period < 1) throw new Error('byPeriod must be whole seconds, at least 1');
  const ms = at instanceof Date ? at.getTime() : at * 1000;
  if (!Number.isFinite(ms)) throw new Error('at must be a Date or Unix seconds');
  const secs = BigInt(Math.floor(ms / 1000));
  const p = BigInt(period);
  let q = (secs + GO_ZERO_TO_UNIX) / p;
  if ((secs + GO_ZERO_TO_UNIX) % p < 0n) q -= 1n; // floor, not truncation
  const start = Number(q * p - GO_ZERO_TO_UNIX);
  return `${new Date(start * 1000).toISOString().slice(0, 19)}Z`;
}

module.exports = {
  uniqueKey, uniqueKeyString, uniqueStates, goJSON,
};

'use strict';
const fs = require('node:fs');
const path = require('node:path');

const VECTORS = process.env.IDEMD_VECTORS
  || path.join(__dirname, '..', '..', '..', 'idem', 'replayauth', 'testdata', 'vectors.json');

function loadVectors() {
  const vs = JSON.parse(fs.readFileSync(VECTORS, 'utf8'));
  if (vs.length <= 10) throw new Error('expected the full vector set');
  return vs;
}

const UNIQUE_VECTORS = process.env.IDEMD_UNIQUE_VECTORS
  || path.join(__dirname, '..', '..', 'testdata', 'unique_keys.json');

// parseExact is JSON.parse but for integers beyond 2^53, which it reads
// as BigInt, as an application holding int64 values must.
function parseExact(text) {
  const marked = text.replace(/("(?:[^"\\]|\\.)*")|(?<![\d.])(-?\d{16,})(?![.eE\d])/g,
    (m, str, int) => (str !== undefined ? str : `"\\u0000bigint:${int}"`));
  return JSON.parse(marked, (k, v) => {
    if (typeof v === 'string' && v.startsWith('\u0000bigint:')) {
      const n = BigInt(v.slice(8));
      return Number.isSafeInteger(Number(n)) && BigInt(Number(n)) === n ? Number(n) : n;
    }
    return v;
  });
}

function loadUniqueVectors() {
  const vs = parseExact(fs.readFileSync(UNIQUE_VECTORS, 'utf8'));
  if (vs.length <= 20) throw new Error('expected the full unique-key vector set');
  return vs;
}

// vectorOpts are a unique-key vector's options for uniqueKey.
function vectorOpts(v) {
  const u = v.unique;
  return {
    queue: v.queue,
    byArgs: u.by_args || false,
    fields: u.fields || null,
    byPeriod: u.by_period || null,
    byQueue: u.by_queue || false,
    excludeKind: u.exclude_kind || false,
    at: new Date(v.at),
  };
}

// The middleware logs every refusal; the tests make many on purpose.
const quietLogger = { warn() {}, error() {}, info() {} };

module.exports = {
  loadVectors, loadUniqueVectors, parseExact, quietLogger, vectorOpts, VECTORS,
};

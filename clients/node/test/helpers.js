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

// The middleware logs every refusal; the tests make many on purpose.
const quietLogger = { warn() {}, error() {}, info() {} };

module.exports = { loadVectors, quietLogger, VECTORS };

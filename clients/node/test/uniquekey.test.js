'use strict';
// Every published unique-key vector (clients/testdata/unique_keys.json,
// held to River's own InsertTx by clients' Go tests).
const test = require('node:test');
const assert = require('node:assert/strict');
const uk = require('../uniquekey');
const { loadUniqueVectors, vectorOpts } = require('./helpers');

test('unique-key vectors', async (t) => {
  for (const v of loadUniqueVectors()) {
    await t.test(v.name, () => {
      const opts = vectorOpts(v);
      assert.equal(uk.uniqueKeyString(v.kind, v.args, opts), v.key_string);
      assert.equal(uk.uniqueKey(v.kind, v.args, opts).toString('hex'), v.unique_key);
      assert.equal(uk.uniqueStates(v.unique.by_state || null), v.unique_states);
    });
  }
});

test('unique-key refusals', () => {
  assert.throws(() => uk.uniqueStates(['available', 'running']));
  assert.throws(() => uk.uniqueKeyString('k', {}, { excludeKind: true }));
  assert.throws(() => uk.uniqueKeyString('k', { f: NaN }, { byArgs: true }));
  assert.throws(() => uk.uniqueKeyString('k', { s: '\ud800' }, { byArgs: true }));
  assert.throws(() => uk.uniqueKeyString('k', {}, { byPeriod: 1.5, at: 0 }));
  assert.throws(() => uk.uniqueKeyString('k', { d: new Date() }, { byArgs: true }), TypeError);
});

'use strict';
// An Express API on idemd's schema contract, with form-encoded parameters,
// behind idemd's replay verifier: one phase, the framework-shaped example of
// docs/languages/node.md.
//
// POST /orders with sku=book&quantity=2 (application/x-www-form-urlencoded),
// an Idempotency-Key and "Authorization: Bearer user-<id>" (a stand-in for
// the API's own authentication) claims the key, then in one phase inserts the
// order and finishes the key with the response. idemd's completer, run with
// --request-encoding form, replays an abandoned key as the same form body,
// signed; the middleware turns the signature into the user id.
//
//   DATABASE_URL                        the API's database (its role is a member of idemd_api)
//   IDEMD_REPLAY_SECRET_FILE            the secret the completer signs with (--auth-secret-file)
//   IDEMD_REPLAY_SECRET_PREVIOUS_FILE   during a rotation, the other one
//
// The secret is optional where the app is loaded without one (tests,
// scripts, a REPL): the middleware is mounted all the same, with no
// verifier, and refuses every signed request with 401, so the replay path
// is closed rather than open. A deployment that runs the completer sets it.
//
// npm install in this directory brings express, pg and idemd-replayauth
// (from ..). Its table, orders, is the API's own:
//   CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL,
//     key_id bigint NOT NULL UNIQUE, sku text NOT NULL, quantity int NOT NULL);

const crypto = require('node:crypto');
const express = require('express');
const { Pool } = require('pg');
const ra = require('idemd-replayauth');

const LOCK_TIMEOUT = 90; // seconds: the completer's --lock-timeout
const MSG_PARAMS_MISMATCH = "There was a mismatch between this request's parameters and the parameters "
  + 'of a previously stored request with the same Idempotency-Key.';
const MSG_IN_PROGRESS = 'An API request with the same Idempotency-Key is already in progress.';
const MSG_CONFLICT = 'Conflict detected with a concurrent request. Please retry with the same Idempotency-Key.';

// The validated parameters, typed: the form's strings become what the JSON
// would have carried, so the replay (the stored params, form-encoded by the
// completer) validates to the same canonical bytes.
function validate(form) {
  const sku = typeof form.sku === 'string' ? form.sku : '';
  const qty = typeof form.quantity === 'string' && /^[0-9]{1,3}$/.test(form.quantity) ? Number(form.quantity) : 0;
  if (sku.length < 1 || sku.length > 100 || qty < 1 || qty > 100) return null;
  return { quantity: qty, sku };
}

// Sorted keys, no whitespace (this API's parameters are flat).
function canonical(params) {
  return JSON.stringify(Object.fromEntries(Object.keys(params).sort().map((k) => [k, params[k]])));
}

function fingerprint(method, path, canon) {
  return crypto.createHash('sha256').update(['idemd-fp-v1', method.toUpperCase(), path, canon].join('\n')).digest('hex');
}

function createApp({ databaseUrl = process.env.DATABASE_URL, secretFile = process.env.IDEMD_REPLAY_SECRET_FILE } = {}) {
  const pool = new Pool({ connectionString: databaseUrl, max: 10 });
  // One statement, outside any transaction of the request: the nonce
  // store's and the key lookup's way into the database (rowCount counts).
  const query = (sql, params) => pool.query(sql, params);

  // Claims the key (docs/languages/node.md, "Begin"): a new key, an existing
  // unfinished and unlocked one, or a finished one to replay.
  async function beginKey(userId, key, path, canon, fp) {
    for (let i = 0; i < 4; i++) {
      let r = await query(`INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at, last_run_at,
            request_method, request_path, request_params, request_fingerprint, recovery_point, upstream_idempotency_key)
          VALUES ($1, $2, now(), now(), 'POST', $3, $4::jsonb, $5, 'started', $6)
          ON CONFLICT (user_id, idempotency_key) DO NOTHING
          RETURNING id, locked_at::text`, [key, userId, path, canon, fp, crypto.randomUUID()]);
      if (r.rows.length) return { id: r.rows[0].id, lockedAt: r.rows[0].locked_at };
      // response_body::text: the same text whether the column is the
      // article's JSONB or idemd's TEXT.
      r = await query(`SELECT id, recovery_point, request_fingerprint, response_code, response_body::text AS body,
            locked_at IS NOT NULL AND locked_at > now() - make_interval(secs => $3) AS locked
          FROM idempotency_keys WHERE user_id = $1 AND idempotency_key = $2`, [userId, key, LOCK_TIMEOUT]);
      if (!r.rows.length) continue;
      const k = r.rows[0];
      if (k.request_fingerprint !== null && k.request_fingerprint !== fp) return [422, MSG_PARAMS_MISMATCH];
      if (k.recovery_point === 'finished') return { finished: [k.response_code, k.body] };
      if (k.locked) return [409, MSG_IN_PROGRESS];
      r = await query(`UPDATE idempotency_keys SET locked_at = now(), last_run_at = now(),
            request_fingerprint = COALESCE(request_fingerprint, $2),
            upstream_idempotency_key = COALESCE(upstream_idempotency_key, $3)
          WHERE id = $1 AND recovery_point <> 'finished'
            AND (locked_at IS NULL OR locked_at <= now() - make_interval(secs => $4))
          RETURNING id, locked_at::text`, [k.id, fp, crypto.randomUUID(), LOCK_TIMEOUT]);
      if (r.rows.length) return { id: r.rows[0].id, lockedAt: r.rows[0].locked_at };
    }
    return [409, MSG_CONFLICT];
  }

  // The one phase: the key row locked and checked to be still this
  // request's, the order inserted, the key finished with the response, in
  // one transaction. null when the lock was lost.
  async function createOrder(k, userId, params) {
    const c = await pool.connect();
    try {
      await c.query('BEGIN');
      const held = await c.query('SELECT locked_at = $1::timestamptz AS ours FROM idempotency_keys WHERE id = $2 FOR UPDATE',
        [k.lockedAt, k.id]);
      if (!held.rows.length || !held.rows[0].ours) {
        await c.query('ROLLBACK');
        return null;
      }
      const o = await c.query('INSERT INTO orders (user_id, key_id, sku, quantity) VALUES ($1, $2, $3, $4) RETURNING id',
        [userId, k.id, params.sku, params.quantity]);
      // The body is encoded here, once, and stored as those bytes: a
      // string parameter, which PostgreSQL takes on JSONB and on TEXT.
      const body = JSON.stringify({ order_id: Number(o.rows[0].id), quantity: params.quantity, sku: params.sku });
      const done = await c.query(`UPDATE idempotency_keys SET locked_at = NULL, recovery_point = 'finished',
            response_code = 201, response_body = $3
          WHERE id = $1 AND locked_at = $2::timestamptz`, [k.id, k.lockedAt, body]);
      if (done.rowCount !== 1) {
        await c.query('ROLLBACK');
        return null;
      }
      await c.query('COMMIT');
      return [201, body];
    } catch (err) {
      await c.query('ROLLBACK').catch(() => {});
      await query('UPDATE idempotency_keys SET locked_at = NULL WHERE id = $1 AND locked_at = $2::timestamptz',
        [k.id, k.lockedAt]).catch(() => {});
      throw err;
    } finally {
      c.release();
    }
  }

  let verifier = null;
  if (secretFile) {
    verifier = new ra.Verifier(
      ra.readSecretFiles(secretFile, process.env.IDEMD_REPLAY_SECRET_PREVIOUS_FILE),
      { nonceStore: new ra.PostgresNonceStore(query) },
    );
  } else {
    console.warn("IDEMD_REPLAY_SECRET_FILE is not set: the completer's signed replays are refused (401)");
  }

  const app = express();
  // Before any body parser: the middleware reads a signed request's body
  // itself and sets req.body (a flat object for a form body); the parser
  // below then leaves it alone, and parses unsigned requests.
  app.use(ra.replayAuth({ verifier, unfinishedKey: ra.PostgresKeyLookup(query), logger: console }));
  app.use(express.urlencoded({ extended: false }));

  const reply = (res, status, body) => res.status(status).type('application/json').send(body);
  const refuse = (res, status, message) => reply(res, status, JSON.stringify({ error: message }));

  // The replay path first: the middleware set the signed user's id.
  function currentUserId(req) {
    if (req.idemdReplayUserId !== undefined) return req.idemdReplayUserId;
    const m = /^Bearer user-([0-9]+)$/.exec(req.get('authorization') || '');
    return m ? m[1] : null; // a decimal string, as the middleware's
  }

  app.post('/orders', async (req, res, next) => {
    try {
      const uid = currentUserId(req);
      if (uid === null) return refuse(res, 401, 'Authentication required.');
      const key = req.get('idempotency-key') || '';
      if (!key || key.length > 255) return refuse(res, 400, 'Please specify an idempotency key with the Idempotency-Key header.');
      const params = validate(req.body || {});
      if (!params) return refuse(res, 422, 'sku (1 to 100 characters) and quantity (1 to 100) are required.');
      const canon = canonical(params);
      const path = req.baseUrl + req.path; // the full path, as the completer signs it
      const k = await beginKey(uid, key, path, canon, fingerprint('POST', path, canon));
      if (Array.isArray(k)) return refuse(res, ...k);
      if (k.finished) {
        res.set('Idempotent-Replayed', 'true');
        return reply(res, ...k.finished);
      }
      const out = await createOrder(k, uid, params);
      return out ? reply(res, ...out) : refuse(res, 409, MSG_CONFLICT);
    } catch (err) {
      return next(err);
    }
  });

  app.use((err, req, res, next) => { // eslint-disable-line no-unused-vars
    console.error('request failed:', err.message);
    refuse(res, 500, ra.MSG_INTERNAL);
  });
  app.locals.pool = pool;
  return app;
}

module.exports = { createApp, canonical, fingerprint };

if (require.main === module) {
  const port = Number(process.env.PORT || 3000);
  createApp().listen(port, () => console.log(`listening on :${port}`));
}

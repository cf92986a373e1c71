"""A Flask API on idemd's schema contract, with form-encoded parameters:
the framework-shaped companion of orders_api.py, cut down to one phase,
with idemd's replay verifier mounted as WSGI middleware.
docs/languages/python.md walks through it.

POST /orders with sku=book&quantity=2 (application/x-www-form-urlencoded),
an Idempotency-Key and "Authorization: Bearer user-<id>" (a stand-in for the
API's own authentication) claims the key, then in one phase inserts the
order and finishes the key with the response. idemd's completer, run with
--request-encoding form, replays an abandoned key as the same form body,
signed; the middleware turns the signature into the user id.

    DATABASE_URL=... IDEMD_REPLAY_SECRET_FILE=/etc/idemd/replay-secret \\
        flask --app flask_app run

  DATABASE_URL                        the API's database (its role is a member of idemd_api)
  IDEMD_REPLAY_SECRET_FILE            the secret the completer signs with (--auth-secret-file)
  IDEMD_REPLAY_SECRET_PREVIOUS_FILE   during a rotation, the other one

The secret is optional where the app is loaded without one (tests, scripts,
`flask shell`): the middleware is mounted all the same, with no verifier,
and refuses every signed request with 401, so the replay path is closed
rather than open. A deployment that runs the completer sets it.

Needs Flask and psycopg2 (Debian: python3-flask, python3-psycopg2) and
idemd_replayauth (../, or `pip install` of clients/python). Its table,
orders, is the API's own:
  CREATE TABLE orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL,
    key_id bigint NOT NULL UNIQUE, sku text NOT NULL, quantity int NOT NULL);
"""

import hashlib
import json
import os
import re
import sys
import uuid

import psycopg2.pool
from flask import Flask, request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # or pip install
import idemd_replayauth as ra  # noqa: E402

LOCK_TIMEOUT = 90  # seconds: the completer's --lock-timeout
MSG_PARAMS_MISMATCH = ("There was a mismatch between this request's parameters and the parameters "
                       "of a previously stored request with the same Idempotency-Key.")
MSG_IN_PROGRESS = "An API request with the same Idempotency-Key is already in progress."
MSG_CONFLICT = "Conflict detected with a concurrent request. Please retry with the same Idempotency-Key."


def validate(form):
    """The validated parameters, typed: the form's strings become what the
    JSON would have carried, so the replay (the stored params, form-encoded
    by the completer) validates to the same canonical bytes."""
    sku = form.get("sku", "")
    qty = form.get("quantity", "")
    if not (1 <= len(sku) <= 100 and re.fullmatch(r"[0-9]{1,3}", qty) and 1 <= int(qty) <= 100):
        return None
    return {"quantity": int(qty), "sku": sku}


def canonical(params):
    return json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(method, path, canon):
    return hashlib.sha256("\n".join(["idemd-fp-v1", method.upper(), path, canon]).encode()).hexdigest()


def create_app(database_url=None, secret_file=None):
    database_url = database_url or os.environ["DATABASE_URL"]
    if secret_file is None:
        secret_file = os.environ.get("IDEMD_REPLAY_SECRET_FILE", "")
    pool = psycopg2.pool.ThreadedConnectionPool(1, 10, database_url)

    def run(fn):
        """fn(cursor) in one transaction on a pooled connection."""
        conn = pool.getconn()
        try:
            with conn, conn.cursor() as cur:  # commits, or rolls back on an error
                return fn(cur)
        finally:
            pool.putconn(conn)

    def query(sql, params):
        """One statement, committed on its own: the nonce store's and the
        key lookup's way into the database. Returns the number of rows."""
        def one(cur):
            cur.execute(sql, params)
            return cur.rowcount
        return run(one)

    def row(sql, params):
        def one(cur):
            cur.execute(sql, params)
            return cur.fetchone()
        return run(one)

    def begin_key(user_id, key, path, canon, fp):
        """Claims the key (docs/languages/python.md, "Begin"): a new key, an
        existing unfinished and unlocked one, or a finished one to replay."""
        for _ in range(4):
            r = row("""INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at, last_run_at,
                           request_method, request_path, request_params, request_fingerprint,
                           recovery_point, upstream_idempotency_key)
                       VALUES (%s, %s, now(), now(), 'POST', %s, %s::jsonb, %s, 'started', %s)
                       ON CONFLICT (user_id, idempotency_key) DO NOTHING
                       RETURNING id, locked_at::text""", (key, user_id, path, canon, fp, str(uuid.uuid4())))
            if r:
                return {"id": r[0], "locked_at": r[1]}
            # response_body::text: the same text whether the column is the
            # article's JSONB or idemd's TEXT.
            r = row("""SELECT id, recovery_point, request_fingerprint, response_code, response_body::text,
                              locked_at IS NOT NULL AND locked_at > now() - make_interval(secs => %s)
                       FROM idempotency_keys WHERE user_id = %s AND idempotency_key = %s""",
                    (LOCK_TIMEOUT, user_id, key))
            if r is None:
                continue
            kid, point, stored_fp, code, body, locked = r
            if stored_fp is not None and stored_fp != fp:
                return 422, MSG_PARAMS_MISMATCH
            if point == "finished":
                return {"finished": (code, body)}
            if locked:
                return 409, MSG_IN_PROGRESS
            r = row("""UPDATE idempotency_keys SET locked_at = now(), last_run_at = now(),
                              request_fingerprint = COALESCE(request_fingerprint, %s),
                              upstream_idempotency_key = COALESCE(upstream_idempotency_key, %s)
                       WHERE id = %s AND recovery_point <> 'finished'
                         AND (locked_at IS NULL OR locked_at <= now() - make_interval(secs => %s))
                       RETURNING id, locked_at::text""", (fp, str(uuid.uuid4()), kid, LOCK_TIMEOUT))
            if r:
                return {"id": r[0], "locked_at": r[1]}
        return 409, MSG_CONFLICT

    def create_order(k, user_id, params):
        """The one phase: the key row locked and checked to be still this
        request's, the order inserted, the key finished with the response,
        in one transaction. None when the lock was lost."""
        def phase(cur):
            cur.execute("SELECT locked_at = %s::timestamptz FROM idempotency_keys WHERE id = %s FOR UPDATE",
                        (k["locked_at"], k["id"]))
            held = cur.fetchone()
            if not held or not held[0]:
                return None
            cur.execute("INSERT INTO orders (user_id, key_id, sku, quantity) VALUES (%s, %s, %s, %s) RETURNING id",
                        (user_id, k["id"], params["sku"], params["quantity"]))
            order_id = cur.fetchone()[0]
            # The body is encoded here, once, and stored as those bytes: a
            # plain string parameter, which PostgreSQL takes on JSONB and on TEXT.
            body = json.dumps({"order_id": order_id, "quantity": params["quantity"], "sku": params["sku"]},
                              separators=(",", ":"))
            cur.execute("""UPDATE idempotency_keys SET locked_at = NULL, recovery_point = 'finished',
                                  response_code = 201, response_body = %s
                           WHERE id = %s AND locked_at = %s::timestamptz""", (body, k["id"], k["locked_at"]))
            if cur.rowcount != 1:
                raise LockLost()
            return 201, body
        try:
            return run(phase)
        except LockLost:
            return None
        except Exception:
            query("UPDATE idempotency_keys SET locked_at = NULL WHERE id = %s AND locked_at = %s::timestamptz",
                  (k["id"], k["locked_at"]))
            raise

    app = Flask(__name__)

    def reply(status, body, replayed=False):
        headers = {"Content-Type": "application/json"}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        return body, status, headers

    def refuse(status, message):
        return reply(status, json.dumps({"error": message}, separators=(",", ":")))

    def current_user_id():
        """The replay path first: the middleware set the signed user's id."""
        uid = request.environ.get(ra.USER_ID_KEY)
        if uid is not None:
            return uid
        m = re.fullmatch(r"Bearer user-([0-9]+)", request.headers.get("Authorization", ""))
        return int(m.group(1)) if m else None

    @app.post("/orders")
    def orders():
        uid = current_user_id()
        if uid is None:
            return refuse(401, "Authentication required.")
        key = request.headers.get("Idempotency-Key", "")
        if not key or len(key) > 255:
            return refuse(400, "Please specify an idempotency key with the Idempotency-Key header.")
        params = validate(request.form)
        if params is None:
            return refuse(422, "sku (1 to 100 characters) and quantity (1 to 100) are required.")
        canon = canonical(params)
        path = request.script_root + request.path  # the full path, as the completer signs it
        k = begin_key(uid, key, path, canon, fingerprint("POST", path, canon))
        if isinstance(k, tuple):
            return refuse(*k)
        if "finished" in k:
            return reply(*k["finished"], replayed=True)
        out = create_order(k, uid, params)
        return reply(*out) if out else refuse(409, MSG_CONFLICT)

    @app.errorhandler(500)
    def internal(err):
        return refuse(500, ra.MSG_INTERNAL)

    # Outermost, before anything that reads the body: Flask parses the form
    # after it.
    verifier = None
    if secret_file:
        verifier = ra.Verifier(
            ra.read_secret_files(secret_file, os.environ.get("IDEMD_REPLAY_SECRET_PREVIOUS_FILE")),
            nonce_store=ra.PostgresNonceStore(query))
    else:
        app.logger.warning("IDEMD_REPLAY_SECRET_FILE is not set: the completer's signed replays are refused (401)")
    app.wsgi_app = ra.ReplayAuthWSGI(app.wsgi_app, verifier, ra.PostgresKeyLookup(query))
    app.extensions["orders_pool"] = pool
    return app


class LockLost(Exception):
    pass

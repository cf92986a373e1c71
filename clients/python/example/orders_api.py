#!/usr/bin/env python3
"""A minimal order API in Python on idemd's schema contract.

Python's standard library (wsgiref, threads) and psycopg2, nothing else:
the idempotency-key protocol of docs/api-authors.md written out by hand,
as an API that is not in Go would, with idemd's replay verifier
(idemd_replayauth) mounted as WSGI middleware so idemd's completer can
finish what clients abandon. docs/languages/python.md walks through it.

POST /orders {"sku": "book", "quantity": 2} with an Idempotency-Key and
"Authorization: Bearer user-<id>" (a stand-in for the API's own
authentication) goes through the recovery points

    started        -> insert the order                       -> order_created
    order_created  -> stage send_order_receipt, answer 201   -> finished

as Go's idem does by default: Begin claims the key with autocommitted
atomic statements, and each phase is one READ COMMITTED transaction that
first locks the key row (SELECT ... FOR UPDATE), checks locked_at is still
this request's, does its work and moves the key on. The job is staged in
staged_jobs inside the last phase's transaction, with River's optional
columns, so it exists exactly when the response does; idemd's enqueuer
moves it to River.

With --test-control, PUT /_test/faults sets faults for the end-to-end test
(internal/testing/e2e/polyglot): [{"at": "order_created", "action": "fail" |
"hang", "seconds": 2}] fails or stalls each request as it reaches that
recovery point.
"""

import argparse
import hashlib
import json
import logging
import os
import random
import sys
import threading
import time
import uuid
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

import psycopg2
import psycopg2.errors
import psycopg2.extensions
import psycopg2.pool

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import idemd_replayauth as ra  # noqa: E402

log = logging.getLogger("orders_api")

# Messages of idem's error responses (idem/http.go).
MSG_KEY_MISSING = "Please specify an idempotency key with the Idempotency-Key header."
MSG_KEY_TOO_LONG = "Idempotency-Key must be at most 255 characters long."
MSG_KEY_INVALID = "Idempotency-Key must be UTF-8 text without control characters."
MSG_PARAMS_MISMATCH = ("There was a mismatch between this request's parameters and the parameters "
                       "of a previously stored request with the same Idempotency-Key.")
MSG_IN_PROGRESS = "An API request with the same Idempotency-Key is already in progress."
MSG_CONFLICT = "Conflict detected with a concurrent request. Please retry with the same Idempotency-Key."
MSG_INTERNAL = ra.MSG_INTERNAL

RETRIES = 5  # deadlocks and serialization failures, per phase
CLAIM_ROUNDS = 8  # Begin's rounds while the key changes under it


class HTTPError(Exception):
    def __init__(self, status, msg):
        super().__init__(msg)
        self.status = status
        self.msg = msg


class LockLost(HTTPError):
    def __init__(self):
        super().__init__(409, MSG_CONFLICT)


def canonical_params(params):
    """idem.CanonicalParams for this API's parameters (a string and an
    integer): sorted keys, no whitespace. Stored in request_params and
    fingerprinted, so the completer's replay of the stored params (after a
    JSONB round trip) gives the same bytes."""
    return json.dumps(params, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def fingerprint(method, path, canon):
    """idem.Fingerprint: hex SHA-256 of "idemd-fp-v1\\nMETHOD\\npath\\ncanonical"."""
    return hashlib.sha256("\n".join(["idemd-fp-v1", method.upper(), path, canon]).encode()).hexdigest()


def parse_params(body):
    try:
        doc = json.loads(body or b"{}")
    except ValueError:
        raise HTTPError(400, "Could not read the request body.") from None
    if not isinstance(doc, dict):
        raise HTTPError(422, "The body must be a JSON object.")
    sku, qty = doc.get("sku"), doc.get("quantity")
    if not isinstance(sku, str) or not 0 < len(sku) <= 100:
        raise HTTPError(422, "sku must be a string of 1 to 100 characters.")
    if isinstance(qty, float) and qty.is_integer():
        qty = int(qty)
    if isinstance(qty, bool) or not isinstance(qty, int) or not 1 <= qty <= 100:
        raise HTTPError(422, "quantity must be an integer from 1 to 100.")
    return {"sku": sku, "quantity": qty}


def validate_key(key):
    if not key:
        raise HTTPError(400, MSG_KEY_MISSING)
    try:
        return ra.validate_key(key)
    except ra.Refused as e:
        raise HTTPError(400, MSG_KEY_TOO_LONG if "long" in str(e) else MSG_KEY_INVALID) from None


class InjectedFault(Exception):
    pass


class Faults:
    def __init__(self):
        self.rules = []
        self.lock = threading.Lock()

    def set(self, rules):
        with self.lock:
            self.rules = list(rules)

    def at(self, point):
        with self.lock:
            rules = [r for r in self.rules if r.get("at") == point]
        for r in rules:
            if r.get("action") == "hang":
                time.sleep(float(r.get("seconds", 3600)))
            raise InjectedFault("injected fault at %s" % point)


class API:
    def __init__(self, pool, lock_timeout, faults, stage_jobs=True):
        self.pool = pool
        # False: the API stages no job (run the completer and the reaper
        # without the enqueuer).
        self.stage_jobs = stage_jobs
        self.lock_timeout = lock_timeout
        self.faults = faults

    # -- Database plumbing -------------------------------------------------

    def query(self, sql, params):
        """One statement in its own transaction: the query callable of
        idemd_replayauth's nonce store and key lookup."""
        conn = self.pool.getconn()
        try:
            conn.isolation_level = psycopg2.extensions.ISOLATION_LEVEL_READ_COMMITTED
            with conn, conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.rowcount
        finally:
            self.pool.putconn(conn)

    def transaction(self, fn):
        """Runs fn(cursor) in one READ COMMITTED transaction, again on a
        deadlock or serialization failure, with jittered backoff; then 409."""
        for attempt in range(RETRIES + 1):
            conn = self.pool.getconn()
            try:
                conn.isolation_level = psycopg2.extensions.ISOLATION_LEVEL_READ_COMMITTED
                with conn, conn.cursor() as cur:
                    return fn(cur)
            except (psycopg2.errors.SerializationFailure, psycopg2.errors.DeadlockDetected):
                pass
            finally:
                self.pool.putconn(conn)
            time.sleep(random.uniform(0, min(0.1, 0.002 * 2 ** attempt)))
        raise HTTPError(409, MSG_CONFLICT)

    def row(self, sql, params):
        """One autocommitted statement; its first row or None."""
        conn = self.pool.getconn()
        try:
            conn.isolation_level = psycopg2.extensions.ISOLATION_LEVEL_READ_COMMITTED
            with conn, conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchone() if cur.description else None
        finally:
            self.pool.putconn(conn)

    # -- The protocol ------------------------------------------------------

    def begin(self, user_id, key, method, path, canon, fp):
        """Claims the key (idem's Begin) with autocommitted statements, each
        atomic on its own: insert it locked, or take the existing one if it
        is unfinished and unlocked. Returns the key as a dict; a finished
        key comes back unlocked, for replay."""
        for _ in range(CLAIM_ROUNDS):
            r = self.row("""INSERT INTO idempotency_keys
                                (idempotency_key, user_id, locked_at, last_run_at, request_method,
                                 request_path, request_params, request_fingerprint, recovery_point,
                                 upstream_idempotency_key)
                            VALUES (%s, %s, now(), now(), %s, %s, %s::jsonb, %s, 'started', %s)
                            ON CONFLICT (user_id, idempotency_key) DO NOTHING
                            RETURNING id, recovery_point, locked_at""",
                         (key, user_id, method, path, canon, fp, str(uuid.uuid4())))
            if r is not None:
                return {"id": r[0], "recovery_point": r[1], "locked_at": r[2]}
            r = self.row("""SELECT id, recovery_point, request_fingerprint, response_code, response_body,
                                   locked_at IS NOT NULL AND locked_at > now() - make_interval(secs => %s)
                            FROM idempotency_keys WHERE user_id = %s AND idempotency_key = %s""",
                         (self.lock_timeout, user_id, key))
            if r is None:
                continue  # deleted since the insert found it: insert again
            kid, point, stored_fp, code, body, locked = r
            if stored_fp is not None and stored_fp != fp:
                raise HTTPError(422, MSG_PARAMS_MISMATCH)
            if point == "finished":
                return {"id": kid, "recovery_point": point, "response_code": code, "response_body": body}
            if locked:
                raise HTTPError(409, MSG_IN_PROGRESS)
            # PostgreSQL re-checks this WHERE after a concurrent writer
            # commits: of two requests taking one key, one gets the row.
            r = self.row("""UPDATE idempotency_keys SET locked_at = now(), last_run_at = now(),
                                request_fingerprint = COALESCE(request_fingerprint, %s),
                                upstream_idempotency_key = COALESCE(upstream_idempotency_key, %s)
                            WHERE id = %s AND recovery_point <> 'finished'
                              AND (locked_at IS NULL OR locked_at <= now() - make_interval(secs => %s))
                            RETURNING recovery_point, locked_at""",
                         (fp, str(uuid.uuid4()), kid, self.lock_timeout))
            if r is not None:
                return {"id": kid, "recovery_point": r[0], "locked_at": r[1]}
            # Someone else changed the key meanwhile: look again.
        raise HTTPError(409, MSG_CONFLICT)

    def phase(self, k, fn):
        """One atomic phase: the key row locked and checked to be still
        ours at its recovery point, then fn(cur, k) does the work and
        returns the new recovery point or a (status, body) response,
        applied to the key in the same transaction."""
        def tx(cur):
            cur.execute("""SELECT locked_at = %s AND recovery_point = %s
                           FROM idempotency_keys WHERE id = %s FOR UPDATE""",
                        (k["locked_at"], k["recovery_point"], k["id"]))
            held = cur.fetchone()
            if not held or not held[0]:
                raise LockLost()
            res = fn(cur, k)
            if isinstance(res, tuple):
                status, body = res
                cur.execute("""UPDATE idempotency_keys
                               SET locked_at = NULL, recovery_point = 'finished',
                                   response_code = %s, response_body = %s
                               WHERE id = %s AND locked_at = %s""", (status, body, k["id"], k["locked_at"]))
            else:
                cur.execute("""UPDATE idempotency_keys SET recovery_point = %s
                               WHERE id = %s AND locked_at = %s""", (res, k["id"], k["locked_at"]))
            if cur.rowcount != 1:
                raise LockLost()
            return res
        try:
            res = self.transaction(tx)
        except LockLost:
            raise  # the key is another request's now: leave its lock alone
        except Exception:
            self.unlock(k)
            raise
        if isinstance(res, tuple):
            k.update(recovery_point="finished", response_code=res[0], response_body=res[1], locked_at=None)
        else:
            k["recovery_point"] = res

    def unlock(self, k):
        """Releases our lock so a retry (the client's or the completer's)
        need not wait for the lock timeout; the timeout is the backstop."""
        try:
            self.query("UPDATE idempotency_keys SET locked_at = NULL WHERE id = %s AND locked_at = %s",
                       [k["id"], k["locked_at"]])
        except Exception as e:  # noqa: BLE001
            log.warning("unlock of key %s failed; it stays locked until the lock timeout: %s", k["id"], e)

    # -- The phases of POST /orders --------------------------------------

    def create_order(self, cur, k):
        self.faults.at("started")
        cur.execute("INSERT INTO orders (user_id, key_id, sku, quantity) VALUES (%s, %s, %s, %s)",
                    (k["user_id"], k["id"], k["params"]["sku"], k["params"]["quantity"]))
        return "order_created"

    def stage_receipt(self, cur, k):
        self.faults.at("order_created")
        cur.execute("SELECT id FROM orders WHERE key_id = %s", (k["id"],))
        order_id = cur.fetchone()[0]
        # The job exists exactly when this transaction commits. NULL in an
        # optional column means River's default.
        if self.stage_jobs:
            cur.execute("""INSERT INTO staged_jobs
                           (job_name, job_args, queue, priority, max_attempts, scheduled_at, tags, metadata)
                           VALUES ('send_order_receipt', %s::jsonb, 'receipts', 2, 5, NULL, %s, %s::jsonb)""",
                        (json.dumps({"order_id": order_id}), ["orders"], json.dumps({"source": "python-example"})))
        body = json.dumps({"order_id": order_id, "sku": k["params"]["sku"], "quantity": k["params"]["quantity"]},
                          separators=(",", ":"))
        return (201, body)

    PHASES = {"started": create_order, "order_created": stage_receipt}

    def create(self, user_id, key, body):
        params = parse_params(body)
        canon = canonical_params(params)
        k = self.begin(user_id, key, "POST", "/orders", canon, fingerprint("POST", "/orders", canon))
        k.update(user_id=user_id, params=params)
        replayed = k["recovery_point"] == "finished"
        while k["recovery_point"] != "finished":
            fn = self.PHASES.get(k["recovery_point"])
            if fn is None:
                self.unlock(k)
                raise HTTPError(500, MSG_INTERNAL)
            self.phase(k, lambda cur, kk, fn=fn: fn(self, cur, kk))
        return k["response_code"], k["response_body"], replayed

    # -- WSGI --------------------------------------------------------------

    def __call__(self, environ, start_response):
        method, path = environ["REQUEST_METHOD"], environ.get("PATH_INFO", "")
        try:
            if path == "/healthz":
                return respond(start_response, 200, '{"status":"ok"}')
            if path == "/_test/faults" and method == "PUT" and environ.get("orders.test_control"):
                self.faults.set(json.loads(read(environ) or b"[]"))
                return respond(start_response, 200, "{}")
            if path != "/orders" or method != "POST":
                raise HTTPError(404, "Not found.")
            user_id = self.authenticate(environ)
            key = validate_key(environ.get("HTTP_IDEMPOTENCY_KEY", "").encode("latin-1"))
            status, body, replayed = self.create(user_id, key, read(environ))
            return respond(start_response, status, body, replayed)
        except HTTPError as e:
            return respond(start_response, e.status, json.dumps({"error": e.msg}))
        except InjectedFault as e:
            log.warning("request failed: %s", e)
            return respond(start_response, 500, json.dumps({"error": MSG_INTERNAL}))
        except Exception:  # noqa: BLE001 - the key is unlocked; the client retries
            log.exception("request failed")
            return respond(start_response, 500, json.dumps({"error": MSG_INTERNAL}))

    def authenticate(self, environ):
        # The replay path first: the middleware set this only for a valid
        # signature on an unfinished key of that user. Then the API's own
        # authentication (here a stand-in).
        uid = environ.get(ra.USER_ID_KEY)
        if uid is not None:
            log.info("replay accepted user=%s key=%s", uid, environ.get("HTTP_IDEMPOTENCY_KEY"))
            return uid
        auth = environ.get("HTTP_AUTHORIZATION", "")
        if auth.startswith("Bearer user-") and auth[len("Bearer user-"):].isdigit():
            return int(auth[len("Bearer user-"):])
        raise HTTPError(401, "Unauthorized.")


def read(environ):
    n = int(environ.get("CONTENT_LENGTH") or 0)
    return environ["wsgi.input"].read(n) if n > 0 else b""


REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 401: "Unauthorized", 404: "Not Found",
           409: "Conflict", 422: "Unprocessable Entity", 500: "Internal Server Error",
           503: "Service Unavailable"}


def respond(start_response, status, body, replayed=False):
    b = body.encode() if isinstance(body, str) else body
    headers = [("Content-Type", "application/json"), ("Content-Length", str(len(b)))]
    if replayed:
        headers.append(("Idempotent-Replayed", "true"))
    start_response("%d %s" % (status, REASONS.get(status, "Status")), headers)
    return [b]


class Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    request_queue_size = 64


class Handler(WSGIRequestHandler):
    def log_message(self, fmt, *args):  # quiet: one line per request is noise here
        pass


def migrate(query):
    """The API's own table. idemd's tables come from `idemctl migrate`."""
    query("""CREATE TABLE IF NOT EXISTS orders (
                 id         BIGSERIAL   PRIMARY KEY,
                 user_id    BIGINT      NOT NULL,
                 key_id     BIGINT      NOT NULL UNIQUE, -- idempotency_keys.id; no FK: the reaper deletes keys
                 sku        TEXT        NOT NULL,
                 quantity   INT         NOT NULL,
                 created_at TIMESTAMPTZ NOT NULL DEFAULT now())""", [])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--addr", default="127.0.0.1:8080")
    p.add_argument("--database-url", default=os.environ.get("DATABASE_URL"))
    p.add_argument("--replay-secret-file", required=True)
    p.add_argument("--replay-secret-file-previous", default="")
    p.add_argument("--lock-timeout", type=float, default=90.0, help="seconds; match the completer's --lock-timeout")
    p.add_argument("--test-control", action="store_true", help="serve PUT /_test/faults")
    p.add_argument("--jobs", choices=["staged", "none"], default="staged",
                   help="staged: stage send_order_receipt in the last phase (needs the enqueuer and a River "
                        "worker); none: stage nothing (the completer and the reaper alone)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    pool = psycopg2.pool.ThreadedConnectionPool(1, 32, args.database_url)
    api = API(pool, args.lock_timeout, Faults(), stage_jobs=args.jobs == "staged")
    migrate(api.query)

    verifier = ra.Verifier(ra.read_secret_files(args.replay_secret_file, args.replay_secret_file_previous),
                           nonce_store=ra.PostgresNonceStore(api.query))
    app = ra.ReplayAuthWSGI(api, verifier, ra.PostgresKeyLookup(api.query))
    if args.test_control:
        inner = app

        def app(environ, start_response):
            environ["orders.test_control"] = True
            return inner(environ, start_response)

    host, port = args.addr.rsplit(":", 1)
    server = Server((host, int(port)), Handler)
    server.set_app(app)
    log.info("listening on %s", args.addr)
    server.serve_forever()


if __name__ == "__main__":
    main()

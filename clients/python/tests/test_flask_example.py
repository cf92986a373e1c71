"""example/flask_app.py through Flask's test client, against the database
the Go side migrated (clients, TestPython): a signed form-encoded replay
(what the completer sends with --request-encoding form) finishes an
abandoned key, a forged one is refused, and without a secret the app still
loads and refuses every signed request."""

import json
import os
import secrets
import sys
import tempfile
import time
import unittest

from helpers import HERE

import idemd_replayauth as ra

DB = os.environ.get("IDEMD_TEST_DATABASE_URL")
SECRET = "0123456789abcdef0123456789abcdef"
FORGED = "an attacker's guess at the secret!"
USER = 42
FORM = "quantity=2&sku=book"  # the completer's form encoding of {"quantity":2,"sku":"book"}

try:
    import flask  # noqa: F401
    import psycopg2
except ImportError:  # pragma: no cover - the Go test requires both
    psycopg2 = None

sys.path.insert(0, os.path.join(HERE, "..", "example"))


@unittest.skipUnless(DB and psycopg2, "IDEMD_TEST_DATABASE_URL, Flask and psycopg2 needed")
class FlaskExample(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        import flask_app
        cls.mod = flask_app
        cls.db = psycopg2.connect(DB)
        cls.db.autocommit = True
        with cls.db.cursor() as cur:
            cur.execute("SET client_min_messages = warning")
            cur.execute("CREATE TABLE IF NOT EXISTS orders (id bigserial PRIMARY KEY, user_id bigint NOT NULL, "
                        "key_id bigint NOT NULL UNIQUE, sku text NOT NULL, quantity int NOT NULL)")
        cls.dir = tempfile.TemporaryDirectory()
        cls.secret_file = os.path.join(cls.dir.name, "secret")
        with open(cls.secret_file, "w") as f:
            f.write(SECRET + "\n")

    @classmethod
    def tearDownClass(cls):
        cls.db.close()
        cls.dir.cleanup()

    def client(self, secret_file):
        app = self.mod.create_app(DB, secret_file)
        self.addCleanup(app.extensions["orders_pool"].closeall)
        return app.test_client()

    def abandoned_key(self):
        """A key a client began and abandoned before the phase: unlocked at
        'started', with the canonical params the completer replays."""
        key = "flask-" + secrets.token_hex(8)
        canon = self.mod.canonical({"quantity": 2, "sku": "book"})
        with self.db.cursor() as cur:
            cur.execute("""INSERT INTO idempotency_keys (idempotency_key, user_id, locked_at, last_run_at,
                               request_method, request_path, request_params, request_fingerprint, recovery_point)
                           VALUES (%s, %s, NULL, now() - interval '1 minute', 'POST', '/orders', %s::jsonb, %s,
                                   'started')""", (key, USER, canon, self.mod.fingerprint("POST", "/orders", canon)))
        return key

    def replay(self, client, key, secret):
        header = ra.sign(secret, int(time.time()), "py-flask-" + secrets.token_hex(8), "POST", "/orders",
                         USER, key, FORM)
        return client.post("/orders", data=FORM, content_type="application/x-www-form-urlencoded",
                           headers={"Idempotency-Key": key, "Idemd-Replay-Signature": header})

    def own(self, client, key):
        return client.post("/orders", data=FORM, content_type="application/x-www-form-urlencoded",
                           headers={"Idempotency-Key": key, "Authorization": "Bearer user-%d" % USER})

    def stored(self, key):
        with self.db.cursor() as cur:
            cur.execute("""SELECT recovery_point, response_code, response_body::text,
                                  (SELECT count(*) FROM orders o WHERE o.key_id = k.id)
                           FROM idempotency_keys k WHERE user_id = %s AND idempotency_key = %s""", (USER, key))
            return cur.fetchone()

    def test_signed_form_replay_finishes_the_key(self):
        c = self.client(self.secret_file)
        key = self.abandoned_key()
        res = self.replay(c, key, SECRET)
        self.assertEqual(res.status_code, 201, res.get_data(as_text=True))
        body = res.get_data(as_text=True)
        doc = json.loads(body)
        self.assertEqual((doc["sku"], doc["quantity"]), ("book", 2))
        self.assertEqual(self.stored(key), ("finished", 201, body, 1), "the stored response is the bytes answered")
        # Finished: another signed replay is refused (no unfinished key),
        # and the client's retry gets the stored response.
        self.assertEqual(self.replay(c, key, SECRET).status_code, 401)
        again = self.own(c, key)
        self.assertEqual((again.status_code, again.get_data(as_text=True), again.headers.get("Idempotent-Replayed")),
                         (201, body, "true"))

    def test_forged_replay_is_refused(self):
        c = self.client(self.secret_file)
        key = self.abandoned_key()
        res = self.replay(c, key, FORGED)
        self.assertEqual(res.status_code, 401)
        self.assertEqual(res.get_json(), {"error": ra.MSG_UNAUTHORIZED})
        self.assertEqual(self.stored(key), ("started", None, None, 0))

    def test_loads_without_a_secret(self):
        c = self.client("")
        key = self.abandoned_key()
        res = self.replay(c, key, SECRET)
        self.assertEqual((res.status_code, res.get_json()), (401, {"error": ra.MSG_UNAUTHORIZED}),
                         "no secret: the replay path is closed")
        self.assertEqual(self.stored(key), ("started", None, None, 0))
        own = "flask-" + secrets.token_hex(8)
        res = self.own(c, own)
        self.assertEqual(res.status_code, 201, res.get_data(as_text=True))
        self.assertEqual(self.stored(own), ("finished", 201, res.get_data(as_text=True), 1))


if __name__ == "__main__":
    unittest.main()

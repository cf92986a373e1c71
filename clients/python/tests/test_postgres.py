"""The PostgreSQL nonce store and key lookup on a real database, through
psycopg2 (Debian's python3-psycopg2), as the API's role. The Go test that
runs these (clients, TestPython) creates the database, records a nonce
through Go's idem.ReplayNonces first, and names it in IDEMD_GO_NONCE."""

import asyncio
import json
import os
import threading
import unittest

from helpers import Clock, load_unique_vectors
from test_unique_key import vector_opts

import idemd_replayauth as ra

DB = os.environ.get("IDEMD_TEST_DATABASE_URL")
SECRET = "0123456789abcdef0123456789abcdef"

try:
    import psycopg2
    import psycopg2.pool
except ImportError:  # pragma: no cover - the Go test requires it
    psycopg2 = None


@unittest.skipUnless(DB and psycopg2, "IDEMD_TEST_DATABASE_URL and psycopg2 needed")
class Postgres(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.pool = psycopg2.pool.ThreadedConnectionPool(1, 10, DB)

    @classmethod
    def tearDownClass(cls):
        cls.pool.closeall()

    def query(self, sql, params):
        conn = self.pool.getconn()
        try:
            with conn:  # commits, or rolls back on an error
                with conn.cursor() as cur:
                    cur.execute(sql, params)
                    return cur.rowcount
        finally:
            self.pool.putconn(conn)

    def scalar(self, sql, params=()):
        conn = self.pool.getconn()
        try:
            with conn, conn.cursor() as cur:
                cur.execute(sql, params)
                return cur.fetchone()[0]
        finally:
            self.pool.putconn(conn)

    def test_stage_unique_vectors(self):
        """Stages every unique-key vector's job with plain SQL and the helper's
        key and states, as docs/languages/README.md shows. clients' Go
        TestPython inserted the same jobs with River's InsertTx before and
        moves these rows with the enqueuer after: River must keep one job per
        vector."""
        vs = load_unique_vectors()
        for v in vs:
            key = ra.unique_key(v["kind"], v["args"], **vector_opts(v))
            self.query("INSERT INTO staged_jobs (job_name, job_args, queue, unique_key, unique_states) "
                       "VALUES (%s, %s, %s, %s, %s::bit(8))",
                       (v["kind"], json.dumps(v["args"]), v["queue"], key, ra.unique_states(v["unique"].get("by_state"))))
        self.assertEqual(self.scalar("SELECT count(*) FROM staged_jobs WHERE job_name LIKE 'uk\\_%%'"), len(vs))

    def test_use_records_once_with_the_window_as_expiry(self):
        store = ra.PostgresNonceStore(self.query)
        self.assertTrue(store.use("py-once", 1800000300))
        self.assertFalse(store.use("py-once", 1800000300))
        self.assertEqual(self.scalar("SELECT extract(epoch FROM expires_at)::bigint FROM idemd_replay_nonces WHERE nonce = %s",
                                     ("py-once",)), 1800000300)

    def test_verifier_records_t_plus_skew(self):
        store = ra.PostgresNonceStore(self.query)
        v = ra.Verifier(SECRET, nonce_store=store, clock=Clock(1800000000))
        h = ra.sign(SECRET, 1800000000, "py-verifier", "POST", "/orders", 42, "k", b"{}")
        self.assertEqual(v.verify(h, "POST", "/orders", "k", b"{}"), 42)
        with self.assertRaises(ra.Replayed):
            v.verify(h, "POST", "/orders", "k", b"{}")
        self.assertEqual(self.scalar("SELECT extract(epoch FROM expires_at)::bigint FROM idemd_replay_nonces WHERE nonce = %s",
                                     ("py-verifier",)), 1800000000 + 300)

    def test_nonce_recorded_by_go_is_refused(self):
        nonce = os.environ.get("IDEMD_GO_NONCE")
        if not nonce:
            self.skipTest("IDEMD_GO_NONCE not set")
        ts = int(os.environ["IDEMD_GO_NONCE_TS"])
        v = ra.Verifier(SECRET, nonce_store=ra.PostgresNonceStore(self.query), clock=Clock(ts))
        h = ra.sign(SECRET, ts, nonce, "POST", "/orders", 42, "k", b"")
        with self.assertRaises(ra.Replayed):
            v.verify(h, "POST", "/orders", "k", b"")

    def test_concurrent_uses_of_one_nonce(self):
        store = ra.PostgresNonceStore(self.query)
        results = []
        barrier = threading.Barrier(8)

        def use():
            barrier.wait()
            results.append(store.use("py-race", 1800000300))
        threads = [threading.Thread(target=use) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.assertEqual(sorted(results), [False] * 7 + [True])

    def test_cleanup_bounded_batches_keeps_live_and_in_grace_rows(self):
        self.query("INSERT INTO idemd_replay_nonces (nonce, expires_at) "
                   "SELECT 'py-old-' || i, now() - interval '10 minutes' FROM generate_series(1, 7) i", [])
        self.query("INSERT INTO idemd_replay_nonces (nonce, expires_at) VALUES "
                   "('py-in-grace', now() - interval '30 seconds'), ('py-live', now() + interval '5 minutes')", [])
        clock = Clock(0.0)
        store = ra.PostgresNonceStore(self.query, cleanup_batch=3, cleanup_interval=60, clock=clock)
        old = "SELECT count(*) FROM idemd_replay_nonces WHERE nonce LIKE 'py-old-%%'"
        store.use("py-c1", 1800000300)  # full batch of 3: again on the next use
        self.assertEqual(self.scalar(old), 4)
        store.use("py-c2", 1800000300)  # another full batch
        self.assertEqual(self.scalar(old), 1)
        store.use("py-c3", 1800000300)  # 1 < 3: the next cleanup waits an interval
        self.assertEqual(self.scalar(old), 0)
        self.query("INSERT INTO idemd_replay_nonces (nonce, expires_at) VALUES ('py-old-8', now() - interval '10 minutes')", [])
        store.use("py-c4", 1800000300)
        self.assertEqual(self.scalar(old), 1, "cleaned before the interval passed")
        clock.now = 60.0
        store.use("py-c5", 1800000300)
        self.assertEqual(self.scalar(old), 0)
        self.assertEqual(self.scalar("SELECT count(*) FROM idemd_replay_nonces WHERE nonce IN ('py-in-grace', 'py-live')"), 2)
        self.assertEqual(store.deleted, 8)

    def test_failed_cleanup_does_not_fail_the_request(self):
        calls = []

        def query(sql, params):
            calls.append(sql)
            if sql.startswith("DELETE"):
                raise psycopg2.OperationalError("cleanup refused")
            return self.query(sql, params)
        store = ra.PostgresNonceStore(query)
        self.assertTrue(store.use("py-cleanup-fails", 1800000300))
        self.assertEqual(store.cleanup_errors, 1)

    def test_unreachable_database_fails_closed(self):
        def query(sql, params):
            raise psycopg2.OperationalError("could not connect")
        v = ra.Verifier(SECRET, nonce_store=ra.PostgresNonceStore(query), clock=Clock(1800000000))
        h = ra.sign(SECRET, 1800000000, "py-down", "POST", "/orders", 42, "k", b"")
        with self.assertRaises(ra.NonceStoreError):
            v.verify(h, "POST", "/orders", "k", b"")

    def test_key_lookup(self):
        self.query("INSERT INTO idempotency_keys (idempotency_key, user_id, request_method, request_path, request_params, recovery_point) VALUES "
                   "('py-open', 7, 'POST', '/orders', '{}', 'order_created'), "
                   "('py-done', 7, 'POST', '/orders', '{}', 'finished')", [])
        lookup = ra.PostgresKeyLookup(self.query)
        self.assertTrue(lookup(7, "py-open", "POST", "/orders"))
        self.assertTrue(lookup(7, "py-open", "post", "/orders"), "method compared case-insensitively")
        self.assertFalse(lookup(7, "py-done", "POST", "/orders"), "finished key")
        self.assertFalse(lookup(8, "py-open", "POST", "/orders"), "another user's key")
        self.assertFalse(lookup(7, "py-open", "POST", "/orders/2"), "another path")
        self.assertFalse(lookup(7, "py-open", "PUT", "/orders"), "another method")
        self.assertFalse(lookup(7, "py-none", "POST", "/orders"), "no such key")

    def test_async_query(self):
        async def aquery(sql, params):
            return await asyncio.to_thread(self.query, sql, params)
        store = ra.PostgresNonceStore(aquery)
        lookup = ra.PostgresKeyLookup(aquery)

        async def run():
            self.assertTrue(await store.use_async("py-async", 1800000300))
            self.assertFalse(await store.use_async("py-async", 1800000300))
            self.assertFalse(await lookup.call_async(7, "py-none", "POST", "/orders"))
        asyncio.run(run())


if __name__ == "__main__":
    unittest.main()

import unittest

from helpers import Clock, load_vectors

import idemd_replayauth as ra

ERRORS = {
    "missing": ra.Missing, "malformed": ra.Malformed, "expired": ra.Expired,
    "mismatch": ra.Mismatch, "replayed": ra.Replayed,
}


class Vectors(unittest.TestCase):
    def test_vectors(self):
        vs = load_vectors()
        for v in vs:
            with self.subTest(v["name"]):
                self.run_vector(v)

    def run_vector(self, v):
        c = ra.canonical(v["timestamp"], v["nonce"], v["method"], v["path"], v["user_id"],
                         v["idempotency_key"], v["body"])
        self.assertEqual(c, v["canonical"].encode("utf-8"))
        self.assertEqual(ra.sign(v["secrets"], v["timestamp"], v["nonce"], v["method"], v["path"],
                                 v["user_id"], v["idempotency_key"], v["body"]), v["header"])
        clock = Clock(0)
        ver = ra.Verifier(v["verifier_secrets"], skew=v["skew"], clock=clock)
        self.assertTrue(v["steps"])
        for i, st in enumerate(v["steps"]):
            clock.now = st["now"]
            r = st["request"]
            args = (st["header"], r["method"], r["path"], r["idempotency_key"], r["body"].encode("utf-8"))
            if st["expect"] == "ok":
                self.assertEqual(str(ver.verify(*args)), st["user_id"], "step %d" % i)
            else:
                with self.assertRaises(ERRORS[st["expect"]], msg="step %d" % i):
                    ver.verify(*args)


class Secrets(unittest.TestCase):
    def test_short_secret_refused(self):
        with self.assertRaises(ValueError):
            ra.Secret("short")

    def test_never_printed(self):
        raw = "s" * 32
        s = ra.Secret(raw)
        self.assertNotIn(raw, repr(s) + str(s) + repr([s]))

    def test_read_secret_files(self):
        import os
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            p = os.path.join(d, "cur")
            with open(p, "w") as f:
                f.write("a" * 32 + "\n")
            self.assertEqual(len(ra.read_secret_files(p, "")), 1)
            with self.assertRaises(OSError):
                ra.read_secret_files(os.path.join(d, "missing"))
            with self.assertRaises(ValueError):
                ra.read_secret_files("")


class Memory(unittest.TestCase):
    def test_expires_by_time_without_capacity(self):
        clock = Clock(1000.0)
        m = ra.MemoryNonceStore(clock)
        for i in range(20000):
            self.assertTrue(m.use("n%d" % i, 1300.0))
        self.assertFalse(m.use("n1", 1300.0))
        clock.now = 1300.0
        self.assertFalse(m.use("n2", 1600.0), "refused up to its expiry")
        clock.now = 1300.5
        self.assertTrue(m.use("n3", 1600.0), "expired: fresh again")
        clock.now = 1300.0 + ra.MEMORY_SWEEP_INTERVAL
        self.assertTrue(m.use("n4", 1600.0))
        self.assertEqual(len(m), 2, "expired nonces swept")

    def test_store_failure_fails_closed(self):
        class Broken:
            def use(self, nonce, expires_at):
                raise ConnectionError("database down")
        v = ra.Verifier("k" * 32, nonce_store=Broken(), clock=Clock(1800000000))
        h = ra.sign("k" * 32, 1800000000, "n", "POST", "/x", 1, "key", b"")
        with self.assertRaises(ra.NonceStoreError) as cm:
            v.verify(h, "POST", "/x", "key", b"")
        self.assertEqual(cm.exception.status, 503)


if __name__ == "__main__":
    unittest.main()

"""Every published unique-key vector (clients/testdata/unique_keys.json,
held to River's own InsertTx by clients' Go tests)."""

import datetime
import unittest

from helpers import load_unique_vectors

import idemd_replayauth as ra


def vector_opts(v):
    u = v["unique"]
    return dict(queue=v["queue"], by_args=u.get("by_args", False), fields=u.get("fields"),
                by_period=u.get("by_period"), by_queue=u.get("by_queue", False),
                exclude_kind=u.get("exclude_kind", False),
                at=datetime.datetime.fromisoformat(v["at"].replace("Z", "+00:00")))


class UniqueKey(unittest.TestCase):
    def test_vectors(self):
        for v in load_unique_vectors():
            with self.subTest(v["name"]):
                opts = vector_opts(v)
                self.assertEqual(ra.unique_key_string(v["kind"], v["args"], **opts), v["key_string"])
                self.assertEqual(ra.unique_key(v["kind"], v["args"], **opts).hex(), v["unique_key"])
                self.assertEqual(ra.unique_states(v["unique"].get("by_state")), v["unique_states"])

    def test_refusals(self):
        with self.assertRaises(ValueError):
            ra.unique_states(["available", "running"])
        with self.assertRaises(ValueError):
            ra.unique_key_string("k", exclude_kind=True)
        with self.assertRaises(ValueError):
            ra.unique_key_string("k", {"f": float("nan")}, by_args=True)
        with self.assertRaises(ValueError):
            ra.unique_key_string("k", by_period=1.5, at=0)
        with self.assertRaises(ValueError):
            ra.unique_key_string("k", by_period=60, at=datetime.datetime(2026, 1, 1))
        with self.assertRaises(TypeError):
            ra.unique_key_string("k", {"t": datetime.datetime.now()}, by_args=True)

    def test_timedelta_period_and_unix_seconds(self):
        a = ra.unique_key_string("k", by_period=datetime.timedelta(hours=1), at=1800000123.5)
        self.assertEqual(a, ra.unique_key_string("k", by_period=3600, at=1800000000))


if __name__ == "__main__":
    unittest.main()

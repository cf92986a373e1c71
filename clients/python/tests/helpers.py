"""Shared by the tests: the published vectors and a fake clock."""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

VECTORS = os.environ.get("IDEMD_VECTORS") or os.path.join(
    HERE, "..", "..", "..", "idem", "replayauth", "testdata", "vectors.json")


def load_vectors():
    with open(VECTORS, encoding="utf-8") as f:
        vs = json.load(f)
    assert len(vs) > 10, "expected the full vector set"
    return vs


UNIQUE_VECTORS = os.environ.get("IDEMD_UNIQUE_VECTORS") or os.path.join(
    HERE, "..", "..", "testdata", "unique_keys.json")


def load_unique_vectors():
    with open(UNIQUE_VECTORS, encoding="utf-8") as f:
        vs = json.load(f)
    assert len(vs) > 20, "expected the full unique-key vector set"
    return vs


class Clock:
    def __init__(self, now):
        self.now = now

    def __call__(self):
        return self.now


# The middleware logs every refusal; the tests make many on purpose.
import logging  # noqa: E402

logging.getLogger("idemd_replayauth").addHandler(logging.NullHandler())
logging.getLogger("idemd_replayauth").propagate = False

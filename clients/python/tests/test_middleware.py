"""ReplayAuthWSGI and ReplayAuthASGI answer as idem.ReplayAuth does."""

import asyncio
import io
import json
import unittest

from helpers import Clock

import idemd_replayauth as ra

SECRET = "0123456789abcdef0123456789abcdef"
OTHER = "an attacker's guess at the secret!"
NOW = 1800000000
BODY = b'{"quantity":2,"sku":"book"}'
KEY = "order-key-0001"


class Lookup:
    def __init__(self, answer=True):
        self.answer = answer
        self.calls = []

    def __call__(self, user_id, key, method, path):
        self.calls.append((user_id, key, method, path))
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class BrokenStore:
    def use(self, nonce, expires_at):
        raise ConnectionError("database down")


def signed(nonce, secret=SECRET, path="/orders", user=42, key=KEY, body=BODY, method="POST"):
    return ra.sign(secret, NOW, nonce, method, path, user, key, body)


def wsgi_app(seen):
    def app(environ, start_response):
        seen.append({"user": environ.get(ra.USER_ID_KEY), "body": environ["wsgi.input"].read()})
        start_response("200 OK", [("Content-Type", "text/plain")])
        return [b"served"]
    return app


def wsgi_call(mw, header=None, key=KEY, body=BODY, path="/orders", script="", method="POST", extra=None):
    environ = {"REQUEST_METHOD": method, "SCRIPT_NAME": script,
               "PATH_INFO": path.encode("utf-8").decode("latin-1"),
               "wsgi.input": io.BytesIO(body), "CONTENT_LENGTH": str(len(body))}
    if header is not None:
        environ["HTTP_IDEMD_REPLAY_SIGNATURE"] = header
    if key is not None:
        environ["HTTP_IDEMPOTENCY_KEY"] = key.encode("utf-8").decode("latin-1")
    environ.update(extra or {})
    out = {}

    def start_response(status, headers):
        out["status"] = int(status.split()[0])
        out["headers"] = dict(headers)
    out["body"] = b"".join(mw(environ, start_response))
    return out


UNAUTHORIZED = {"error": ra.MSG_UNAUTHORIZED}
INTERNAL = {"error": ra.MSG_INTERNAL}


class WSGI(unittest.TestCase):
    def setUp(self):
        self.seen = []
        self.lookup = Lookup()
        self.verifier = ra.Verifier(SECRET, clock=Clock(NOW))
        self.mw = ra.ReplayAuthWSGI(wsgi_app(self.seen), self.verifier, self.lookup)

    def refused(self, out, status=401, body=UNAUTHORIZED):
        self.assertEqual(out["status"], status)
        self.assertEqual(json.loads(out["body"]), body)
        self.assertEqual(out["headers"]["Content-Type"], "application/json")
        self.assertEqual(self.seen, [], "the application was called")

    def test_unsigned_passes_untouched(self):
        out = wsgi_call(self.mw, extra={ra.USER_ID_KEY: 7})
        self.assertEqual(out["status"], 200)
        self.assertEqual(self.seen, [{"user": None, "body": BODY}])
        self.assertEqual(self.lookup.calls, [])

    def test_valid(self):
        out = wsgi_call(self.mw, signed("v1"))
        self.assertEqual(out["status"], 200)
        self.assertEqual(self.seen, [{"user": 42, "body": BODY}])
        self.assertEqual(self.lookup.calls, [(42, KEY, "POST", "/orders")])

    def test_mounted_under_a_prefix_signs_the_full_path(self):
        out = wsgi_call(self.mw, signed("v2", path="/api/orders"), script="/api", path="/orders")
        self.assertEqual(out["status"], 200)
        self.assertEqual(self.lookup.calls[0][3], "/api/orders")

    def test_utf8_path_and_key(self):
        out = wsgi_call(self.mw, signed("v3", path="/orders/café", key="clé-✓"), path="/orders/café", key="clé-✓")
        self.assertEqual(out["status"], 200)
        self.assertEqual(self.lookup.calls, [(42, "clé-✓", "POST", "/orders/café")])

    def test_forged(self):
        self.refused(wsgi_call(self.mw, signed("f1", secret=OTHER)))
        # A forged header records nothing: the real one with its nonce passes.
        self.assertEqual(wsgi_call(self.mw, signed("f1"))["status"], 200)

    def test_tampered_body(self):
        self.refused(wsgi_call(self.mw, signed("f2"), body=b'{"quantity":3,"sku":"book"}'))

    def test_garbage(self):
        self.refused(wsgi_call(self.mw, "hello"))

    def test_expired(self):
        self.verifier._clock = Clock(NOW + 301)
        self.refused(wsgi_call(self.mw, signed("f3")))

    def test_replayed(self):
        h = signed("f4")
        self.assertEqual(wsgi_call(self.mw, h)["status"], 200)
        self.seen.clear()
        self.refused(wsgi_call(self.mw, h))

    def test_no_unfinished_key(self):
        self.lookup.answer = False
        self.refused(wsgi_call(self.mw, signed("k1")))

    def test_key_lookup_fails(self):
        self.lookup.answer = ConnectionError("database down")
        self.refused(wsgi_call(self.mw, signed("k2")), 503, INTERNAL)

    def test_nonce_store_fails(self):
        mw = ra.ReplayAuthWSGI(wsgi_app(self.seen), ra.Verifier(SECRET, nonce_store=BrokenStore(), clock=Clock(NOW)), self.lookup)
        self.refused(wsgi_call(mw, signed("s1")), 503, INTERNAL)
        self.assertEqual(self.lookup.calls, [])

    def test_nonce_store_outage_logged_once(self):
        import logging

        class Flaky:
            down = True
            seen = set()

            def use(self, nonce, expires_at):
                if self.down:
                    raise ConnectionError("database down")
                fresh = nonce not in self.seen
                self.seen.add(nonce)
                return fresh
        store = Flaky()
        logger = logging.getLogger("idemd_replayauth.test_outage")
        mw = ra.ReplayAuthWSGI(wsgi_app(self.seen), ra.Verifier(SECRET, nonce_store=store, clock=Clock(NOW)),
                               self.lookup, logger=logger)
        with self.assertLogs(logger, "INFO") as logs:
            for i in range(3):
                self.assertEqual(wsgi_call(mw, signed("o%d" % i))["status"], 503)
            store.down = False
            self.assertEqual(wsgi_call(mw, signed("o9"))["status"], 200)
            self.assertEqual(wsgi_call(mw, signed("o10"))["status"], 200)
        errors = [r for r in logs.records if r.levelno == logging.ERROR]
        infos = [r for r in logs.records if r.levelno == logging.INFO]
        self.assertEqual(len(errors), 1, logs.output)
        self.assertEqual(len(infos), 1, logs.output)
        self.assertIn("failures: 3", infos[0].getMessage())

    def test_disabled(self):
        mw = ra.ReplayAuthWSGI(wsgi_app(self.seen), None, self.lookup)
        self.refused(wsgi_call(mw, signed("d1")))
        self.assertEqual(wsgi_call(mw)["status"], 200, "unsigned requests still pass")

    def test_bad_idempotency_keys(self):
        for key in (None, "", "a\x01b", "k" * 256, "tab\tkey"):
            with self.subTest(key=key):
                self.refused(wsgi_call(self.mw, signed("b-%r" % key, key=key or ""), key=key))
        self.assertEqual(wsgi_call(self.mw, signed("b-255", key="k" * 255), key="k" * 255)["status"], 200)

    def test_body_too_large(self):
        big = b"x" * (ra.MAX_REPLAY_BODY + 1)
        self.refused(wsgi_call(self.mw, signed("l1", body=big), body=big))
        edge = b"x" * ra.MAX_REPLAY_BODY
        self.assertEqual(wsgi_call(self.mw, signed("l2", body=edge), body=edge)["status"], 200)

    def test_lookup_is_required(self):
        with self.assertRaises(ValueError):
            ra.ReplayAuthWSGI(wsgi_app([]), self.verifier, None)


def asgi_call(mw, header=None, key=KEY, body=BODY, path="/orders", root="", chunks=1, scope_extra=None):
    headers = [(b"content-type", b"application/json")]
    if header is not None:
        headers.append((b"idemd-replay-signature", header.encode()))
    if key is not None:
        headers.append((b"idempotency-key", key.encode()))
    scope = {"type": "http", "method": "POST", "path": root + path, "root_path": root, "headers": headers}
    scope.update(scope_extra or {})
    step = max(1, -(-len(body) // chunks))
    parts = [body[i:i + step] for i in range(0, len(body), step)] or [b""]
    msgs = [{"type": "http.request", "body": p, "more_body": i < len(parts) - 1} for i, p in enumerate(parts)]
    msgs.append({"type": "http.disconnect"})
    sent = []

    async def receive():
        return msgs.pop(0)

    async def send(m):
        sent.append(m)

    asyncio.run(mw(scope, receive, send))
    out = {"status": sent[0]["status"], "headers": dict(sent[0].get("headers", [])),
           "body": b"".join(m.get("body", b"") for m in sent[1:])}
    return out


def asgi_app(seen):
    async def app(scope, receive, send):
        body = b""
        while True:
            m = await receive()
            body += m.get("body", b"")
            if not m.get("more_body"):
                break
        seen.append({"user": scope.get(ra.USER_ID_KEY), "body": body})
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"served"})
    return app


class AsyncStore:
    """A nonce store on an async driver."""

    def __init__(self):
        self.seen = set()

    async def use_async(self, nonce, expires_at):
        await asyncio.sleep(0)
        if nonce in self.seen:
            return False
        self.seen.add(nonce)
        return True

    def use(self, nonce, expires_at):
        raise AssertionError("the ASGI middleware must call use_async")


class ASGI(unittest.TestCase):
    def setUp(self):
        self.seen = []
        self.lookup = Lookup()
        self.mw = ra.ReplayAuthASGI(asgi_app(self.seen), ra.Verifier(SECRET, clock=Clock(NOW)), self.lookup)

    def refused(self, out, status=401, body=UNAUTHORIZED):
        self.assertEqual(out["status"], status)
        self.assertEqual(json.loads(out["body"]), body)
        self.assertEqual(out["headers"][b"content-type"], b"application/json")
        self.assertEqual(self.seen, [])

    def test_unsigned_passes_untouched(self):
        out = asgi_call(self.mw, scope_extra={ra.USER_ID_KEY: 7})
        self.assertEqual(out["status"], 200)
        self.assertEqual(self.seen, [{"user": None, "body": BODY}])

    def test_valid_body_in_chunks(self):
        out = asgi_call(self.mw, signed("a1"), chunks=3)
        self.assertEqual(out["status"], 200)
        self.assertEqual(self.seen, [{"user": 42, "body": BODY}])
        self.assertEqual(self.lookup.calls, [(42, KEY, "POST", "/orders")])

    def test_root_path(self):
        out = asgi_call(self.mw, signed("a2", path="/api/orders"), root="/api")
        self.assertEqual(out["status"], 200)

    def test_forged_and_replayed(self):
        self.refused(asgi_call(self.mw, signed("a3", secret=OTHER)))
        h = signed("a3")
        self.assertEqual(asgi_call(self.mw, h)["status"], 200)
        self.seen.clear()
        self.refused(asgi_call(self.mw, h))

    def test_async_store_and_lookup(self):
        store = AsyncStore()

        async def lookup(user_id, key, method, path):
            return user_id == 42
        mw = ra.ReplayAuthASGI(asgi_app(self.seen), ra.Verifier(SECRET, nonce_store=store, clock=Clock(NOW)), lookup)
        self.assertEqual(asgi_call(mw, signed("a4"))["status"], 200)
        self.seen.clear()
        self.refused(asgi_call(mw, signed("a4")))
        self.refused(asgi_call(mw, signed("a5", user=43)))

    def test_failures_are_503(self):
        mw = ra.ReplayAuthASGI(asgi_app(self.seen), ra.Verifier(SECRET, nonce_store=BrokenStore(), clock=Clock(NOW)), self.lookup)
        self.refused(asgi_call(mw, signed("a6")), 503, INTERNAL)
        self.lookup.answer = ConnectionError("down")
        self.refused(asgi_call(self.mw, signed("a7")), 503, INTERNAL)

    def test_body_too_large(self):
        big = b"x" * (ra.MAX_REPLAY_BODY + 1)
        self.refused(asgi_call(self.mw, signed("a8", body=big), body=big, chunks=4))


if __name__ == "__main__":
    unittest.main()

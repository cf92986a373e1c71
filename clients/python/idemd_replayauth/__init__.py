"""idemd's replay verifier for Python APIs: WSGI and ASGI middleware.

idemd's completer replays an abandoned request on behalf of the key's user
with a signed header (docs/api-authors.md, "The replay signature"):

    Idemd-Replay-Signature: t=<unix s>,n=<nonce>,u=<user id>,v1=<hex HMAC>[,v1=...]

This module checks it exactly as Go's idem/replayauth and idem.ReplayAuth
do: the header's parts, the skew window, HMAC-SHA256 over the canonical
string compared in constant time (hmac.compare_digest) against every secret
held (two during a rotation), a nonce accepted once (in memory, or in
idemd's PostgreSQL table idemd_replay_nonces shared with every replica in
any language), and an existing unfinished key of the signed user for this
method and path. Only then does the application see the user id, under
environ["idemd.replay_user_id"] (WSGI) or scope["idemd.replay_user_id"]
(ASGI). Refusals are 401 {"error": "Replay signature rejected."}; a nonce
store or key lookup that fails is a 503 the completer retries.

No dependencies: the PostgreSQL parts take a callable that runs one
parameterised statement on the application's own driver and returns the
number of rows it inserted, deleted or returned. See docs/languages/python.md.
"""

import hashlib
import hmac
import inspect
import io
import json
import logging
import re
import threading
import time

from .unique_key import unique_key, unique_key_string, unique_states

__all__ = [
    "HEADER", "IDEMPOTENCY_KEY_HEADER", "DEFAULT_SKEW", "MIN_SECRET_LEN", "MAX_REPLAY_BODY",
    "USER_ID_KEY", "MSG_UNAUTHORIZED", "MSG_INTERNAL",
    "ReplayError", "Missing", "Malformed", "Expired", "Mismatch", "Replayed", "NonceStoreError",
    "KeyLookupError", "Refused",
    "Secret", "read_secret_files", "canonical", "sign", "Verifier",
    "MemoryNonceStore", "PostgresNonceStore", "PostgresKeyLookup", "validate_key",
    "ReplayAuthWSGI", "ReplayAuthASGI",
    "unique_key", "unique_key_string", "unique_states",
]

HEADER = "Idemd-Replay-Signature"
IDEMPOTENCY_KEY_HEADER = "Idempotency-Key"
DEFAULT_SKEW = 300  # seconds, replayauth.DefaultSkew
MIN_SECRET_LEN = 32  # bytes
MAX_REPLAY_BODY = 1 << 20  # idem.MaxReplayBody
MAX_KEY_LENGTH = 255  # characters, idem.MaxKeyLength
MEMORY_SWEEP_INTERVAL = 60  # seconds, replayauth.MemorySweepInterval

# Where the middleware hands the signed user id to the application.
USER_ID_KEY = "idemd.replay_user_id"

# Response bodies, idem.MsgReplayUnauthorized and idem.MsgInternal.
MSG_UNAUTHORIZED = "Replay signature rejected."
MSG_INTERNAL = ("Internal server error. Please retry the request periodically "
                "with the same Idempotency-Key until it succeeds.")

_log = logging.getLogger("idemd_replayauth")


class ReplayError(Exception):
    """A refused replay. reason names it as the vectors do; status is the
    HTTP status the middleware answers with."""

    reason = "refused"
    status = 401


class Missing(ReplayError):
    reason = "missing"


class Malformed(ReplayError):
    reason = "malformed"


class Expired(ReplayError):
    reason = "expired"


class Mismatch(ReplayError):
    reason = "mismatch"


class Replayed(ReplayError):
    reason = "replayed"


class Refused(ReplayError):
    """Refused by the middleware rather than the signature: replay path
    disabled, invalid Idempotency-Key, body too large, no unfinished key."""


class NonceStoreError(ReplayError):
    """The nonce could not be recorded: refused (fail closed) with a 503."""

    reason = "nonce_store"
    status = 503


class KeyLookupError(ReplayError):
    """The unfinished-key lookup failed: refused with a 503."""

    reason = "key_lookup"
    status = 503


class Secret:
    """An HMAC key of at least MIN_SECRET_LEN bytes; never printed."""

    __slots__ = ("_b",)

    def __init__(self, raw):
        b = raw.encode("utf-8") if isinstance(raw, str) else bytes(raw)
        if len(b) < MIN_SECRET_LEN:
            raise ValueError("idemd_replayauth: secret is %d bytes, need at least %d" % (len(b), MIN_SECRET_LEN))
        self._b = b

    def __repr__(self):
        return "[redacted]"

    __str__ = __repr__


def _secrets(secrets):
    if isinstance(secrets, (str, bytes, bytearray, Secret)):
        secrets = [secrets]
    out = [s if isinstance(s, Secret) else Secret(s) for s in secrets]
    if not out:
        raise ValueError("idemd_replayauth: no secret configured")
    return out


def read_secret_files(*paths):
    """Reads the current secret and, during a rotation, the previous one
    (empty paths are skipped), each stripped of surrounding whitespace."""
    out = []
    for p in paths:
        if not p:
            continue
        with open(p, "rb") as f:
            out.append(Secret(f.read().strip()))
    if not out:
        raise ValueError("idemd_replayauth: no secret configured")
    return out


def _b(v):
    if v is None:
        return b""
    return v.encode("utf-8") if isinstance(v, str) else bytes(v)


def canonical(ts, nonce, method, path, user_id, idempotency_key, body):
    """The string that is MACed (bytes): the fields joined by newlines."""
    return b"\n".join([
        b"idemd-replay-v1",
        str(int(ts)).encode(),
        _b(nonce),
        _b(method).upper(),
        _b(path),
        str(int(user_id)).encode(),
        _b(idempotency_key),
        hashlib.sha256(_b(body)).hexdigest().encode(),
    ])


def _mac(secret, msg):
    return hmac.new(secret._b, msg, hashlib.sha256).digest()


def sign(secrets, ts, nonce, method, path, user_id, idempotency_key, body):
    """The header idemd's completer would send (for tests of an API)."""
    c = canonical(ts, nonce, method, path, user_id, idempotency_key, body)
    parts = ["t=%d" % int(ts), "n=%s" % nonce, "u=%d" % int(user_id)]
    parts += ["v1=" + _mac(s, c).hex() for s in _secrets(secrets)]
    return ",".join(parts)


_WS = b" \t\n\v\f\r"
_INT64 = re.compile(rb"[+-]?[0-9]+\Z")
_HEX32 = re.compile(rb"[0-9a-fA-F]{64}\Z")


def _int64(v):
    if not _INT64.match(v):
        raise Malformed("signature header malformed")
    n = int(v)
    if not -(1 << 63) <= n < (1 << 63):
        raise Malformed("signature header malformed")
    return n


def _parse(header):
    """Decodes a header value (str or bytes) without checking it:
    (timestamp, nonce bytes, user id, [32-byte signatures]). Private, as
    Go's: nothing in it is verified."""
    h = _b(header)
    if not h:
        raise Missing("signature header missing")
    ts = nonce = uid = None
    v1 = []
    for part in h.split(b","):
        k, eq, v = part.strip(_WS).partition(b"=")
        if not eq:
            raise Malformed("signature header malformed")
        if k == b"t":
            if ts is not None:
                raise Malformed("signature header malformed")
            ts = _int64(v)
        elif k == b"n":
            if not v or len(v) > 64 or nonce is not None:
                raise Malformed("signature header malformed")
            nonce = v
        elif k == b"u":
            if uid is not None:
                raise Malformed("signature header malformed")
            uid = _int64(v)
        elif k == b"v1":
            if not _HEX32.match(v) or len(v1) >= 4:
                raise Malformed("signature header malformed")
            v1.append(bytes.fromhex(v.decode("ascii")))
        # Unknown schemes are ignored, so a future v2 can sit beside v1.
    if ts is None or nonce is None or uid is None or not v1:
        raise Malformed("signature header malformed")
    return ts, nonce, uid, v1


class MemoryNonceStore:
    """Nonces in this process's memory until they expire, by time, with no
    capacity: for an API with one process, and tests. Replicas each have
    their own; use PostgresNonceStore for more than one process. Expired
    nonces are dropped at most once per MEMORY_SWEEP_INTERVAL."""

    def __init__(self, clock=time.time):
        self._clock = clock
        self._seen = {}
        self._next_sweep = float("-inf")
        self._lock = threading.Lock()

    def use(self, nonce, expires_at, now=None):
        """Records nonce until expires_at (unix seconds); False if it is
        already recorded and not expired."""
        if now is None:
            now = self._clock()
        with self._lock:
            if now >= self._next_sweep:
                self._seen = {k: e for k, e in self._seen.items() if now <= e}
                self._next_sweep = now + MEMORY_SWEEP_INTERVAL
            exp = self._seen.get(nonce)
            # Refused up to and including the instant it expires, the last
            # instant its signature still passes the window.
            if exp is not None and now <= exp:
                return False
            self._seen[nonce] = expires_at
            return True

    def __len__(self):
        with self._lock:
            return len(self._seen)


def _rows(result):
    """The row count a query callable returned: an int, or a cursor-like
    object with rowcount."""
    if isinstance(result, bool):
        raise TypeError("idemd_replayauth: the query callable must return a row count, not a bool")
    if isinstance(result, int):
        return result
    n = getattr(result, "rowcount", None)
    if isinstance(n, int):
        return n
    raise TypeError("idemd_replayauth: the query callable must return the number of rows, got %r" % (result,))


def _placeholders(sql, paramstyle):
    if paramstyle == "numeric_dollar":
        return sql
    if paramstyle == "format":
        return re.sub(r"\$[0-9]+", "%s", sql)
    raise ValueError("idemd_replayauth: paramstyle is 'format' (%s) or 'numeric_dollar' ($1)")


# The statements of idem.ReplayNonces and idem.ReplayAuth, in PostgreSQL's
# own $n placeholders (rewritten to %s for paramstyle "format").
INSERT_NONCE_SQL = ("INSERT INTO idemd_replay_nonces (nonce, expires_at) VALUES ($1, to_timestamp($2)) "
                    "ON CONFLICT (nonce) DO NOTHING")
CLEANUP_NONCES_SQL = ("DELETE FROM idemd_replay_nonces WHERE ctid = ANY (ARRAY("
                      "SELECT ctid FROM idemd_replay_nonces "
                      "WHERE expires_at < now() - make_interval(secs => $1) "
                      "ORDER BY expires_at LIMIT $2))")
UNFINISHED_KEY_SQL = ("SELECT 1 FROM idempotency_keys "
                      "WHERE user_id = $1 AND idempotency_key = $2 AND recovery_point <> 'finished' "
                      "AND upper(request_method) = upper($3) AND request_path = $4 LIMIT 1")


class _Outage:
    """Logs the first failure of a run and the first success after it."""

    def __init__(self):
        self.down = False
        self.failed = 0
        self._lock = threading.Lock()

    def fail(self, logger, msg, err):
        with self._lock:
            self.failed += 1
            first, self.down = not self.down, True
        if first:
            logger.error("%s: %s", msg, err)

    def ok(self, logger, msg):
        with self._lock:
            was, self.down = self.down, False
            n, self.failed = self.failed, 0
        if was:
            logger.info("%s (failures: %d)", msg, n)


class PostgresNonceStore:
    """Nonces in idemd's table idemd_replay_nonces, shared by every replica
    of the API in any language (idem.ReplayNonces in Go): a nonce accepted
    by one is refused by all.

    query(sql, params) runs one statement on the application's driver, in
    its own transaction (autocommit), and returns the number of rows it
    inserted or deleted (an int, or a cursor with rowcount). With psycopg2:

        def query(sql, params):
            with pool.connection() as conn, conn.cursor() as cur:  # commits
                cur.execute(sql, params)
                return cur.rowcount

    Recording is one INSERT ... ON CONFLICT (nonce) DO NOTHING with
    expires_at = the signature's timestamp + the skew window; after a use,
    at most once per cleanup_interval, up to cleanup_batch rows expired for
    longer than grace (database clock) are deleted, and again on the next
    use while batches come back full. A failed insert raises (the verifier
    refuses with 503); a failed cleanup is logged once per outage and
    retried at the next interval. For ASGI, query may be a coroutine
    function: the middleware calls use_async."""

    def __init__(self, query, paramstyle="format", cleanup_interval=60.0, cleanup_batch=1000,
                 grace=60.0, clock=time.monotonic, logger=None):
        self._query = query
        self._insert = _placeholders(INSERT_NONCE_SQL, paramstyle)
        self._cleanup = _placeholders(CLEANUP_NONCES_SQL, paramstyle)
        self.cleanup_interval = cleanup_interval if cleanup_interval > 0 else 60.0
        self.cleanup_batch = int(cleanup_batch) if cleanup_batch > 0 else 1000
        self.grace = float(grace) if grace > 0 else 60.0
        self._clock = clock
        self._logger = logger or _log
        self._lock = threading.Lock()
        self._next_clean = float("-inf")
        self._cleaning = False
        self._down = _Outage()
        self.use_errors = 0
        self.cleanup_errors = 0
        self.deleted = 0

    def use(self, nonce, expires_at):
        try:
            n = _rows(self._query(self._insert, [nonce, int(expires_at)]))
        except Exception:
            self.use_errors += 1
            raise
        self._maybe_cleanup()
        return n == 1

    async def use_async(self, nonce, expires_at):
        try:
            res = self._query(self._insert, [nonce, int(expires_at)])
            if inspect.isawaitable(res):
                res = await res
            n = _rows(res)
        except Exception:
            self.use_errors += 1
            raise
        due, now = self._claim_cleanup()
        if due:
            try:
                res = self._query(self._cleanup, [self.grace, self.cleanup_batch])
                if inspect.isawaitable(res):
                    res = await res
                self._cleaned(now, _rows(res), None)
            except Exception as e:  # noqa: BLE001 - a cleanup never fails the request
                self._cleaned(now, 0, e)
        return n == 1

    def _claim_cleanup(self):
        now = self._clock()
        with self._lock:
            if now < self._next_clean or self._cleaning:
                return False, now
            self._cleaning = True
            return True, now

    def _cleaned(self, now, deleted, err):
        with self._lock:
            self._cleaning = False
            nxt = now + self.cleanup_interval
            if err is None and deleted >= self.cleanup_batch:
                nxt = now  # more to delete: again on the next use
            self._next_clean = nxt
        if err is None:
            self.deleted += deleted
            self._down.ok(self._logger, "idemd_replayauth: deleting expired replay nonces works again")
        else:
            self.cleanup_errors += 1
            self._down.fail(self._logger, "idemd_replayauth: deleting expired replay nonces failed; "
                            "retrying every cleanup interval", err)

    def _maybe_cleanup(self):
        due, now = self._claim_cleanup()
        if not due:
            return
        try:
            deleted = self.cleanup()
        except Exception as e:  # noqa: BLE001 - a cleanup never fails the request
            self._cleaned(now, 0, e)
            return
        self._cleaned(now, deleted, None)

    def cleanup(self):
        """Deletes up to cleanup_batch rows expired for longer than grace;
        returns how many."""
        return _rows(self._query(self._cleanup, [self.grace, self.cleanup_batch]))


class PostgresKeyLookup:
    """The middleware's second check (idem.ReplayAuth's): the signed user
    has an existing, unfinished key with this value, stored for this same
    method and path. query as for PostgresNonceStore; it returns the number
    of rows the SELECT returned (cursor.rowcount)."""

    def __init__(self, query, paramstyle="format"):
        self._query = query
        self._sql = _placeholders(UNFINISHED_KEY_SQL, paramstyle)

    def __call__(self, user_id, idempotency_key, method, path):
        return _rows(self._query(self._sql, [user_id, idempotency_key, method, path])) > 0

    async def call_async(self, user_id, idempotency_key, method, path):
        res = self._query(self._sql, [user_id, idempotency_key, method, path])
        if inspect.isawaitable(res):
            res = await res
        return _rows(res) > 0


class Verifier:
    """Checks signature headers (replayauth.Verifier).

    secrets: one, or two during a rotation (str, bytes or Secret, each at
    least 32 bytes); a request signed with any of them is accepted.
    skew: the window in seconds. nonce_store: None keeps nonces in this
    process's memory (one process only); PostgresNonceStore shares them
    with every replica. clock: unix seconds (tests)."""

    def __init__(self, secrets, skew=DEFAULT_SKEW, nonce_store=None, clock=time.time):
        self._secrets = _secrets(secrets)
        self.skew = skew if skew and skew > 0 else DEFAULT_SKEW
        self.nonce_store = nonce_store
        self._clock = clock
        self._memory = MemoryNonceStore(clock)

    def _check(self, header, method, path, idempotency_key, body):
        ts, nonce, uid, v1 = _parse(header)
        key, path = _b(idempotency_key), _b(path)
        if b"\n" in key or b"\r" in key or b"\n" in path or b"\r" in path:
            raise Malformed("signature header malformed")
        now = self._clock()
        d = now - ts
        if d > self.skew or d < -self.skew:
            raise Expired("timestamp outside the skew window")
        c = canonical(ts, nonce, method, path, uid, key, body)
        ok = False
        for s in self._secrets:
            want = _mac(s, c)
            for got in v1:
                # Every comparison runs: timing tells nothing about which
                # secret or signature matched.
                ok |= hmac.compare_digest(want, got)
        if not ok:
            raise Mismatch("no signature matches")
        return now, ts, nonce.decode("utf-8", "surrogateescape"), uid

    def verify(self, header, method, path, idempotency_key, body=b""):
        """Returns the signed user id, or raises a ReplayError. The nonce is
        recorded only after the MAC and the window check pass."""
        now, ts, nonce, uid = self._check(header, method, path, idempotency_key, body)
        try:
            if self.nonce_store is None:
                fresh = self._memory.use(nonce, ts + self.skew, now=now)
            else:
                fresh = self.nonce_store.use(nonce, ts + self.skew)
        except Exception as e:
            raise NonceStoreError("nonce store unavailable: %s" % e) from e
        if not fresh:
            raise Replayed("nonce already used")
        return uid

    async def verify_async(self, header, method, path, idempotency_key, body=b""):
        """verify, for a nonce store whose use is a coroutine (use_async)."""
        now, ts, nonce, uid = self._check(header, method, path, idempotency_key, body)
        try:
            if self.nonce_store is None:
                fresh = self._memory.use(nonce, ts + self.skew, now=now)
            else:
                use = getattr(self.nonce_store, "use_async", None) or self.nonce_store.use
                fresh = use(nonce, ts + self.skew)
                if inspect.isawaitable(fresh):
                    fresh = await fresh
        except Exception as e:
            raise NonceStoreError("nonce store unavailable: %s" % e) from e
        if not fresh:
            raise Replayed("nonce already used")
        return uid


def validate_key(key):
    """idem.ValidateKey: present, UTF-8, at most 255 characters, no control
    characters. Takes the header's bytes; returns the key as str."""
    if not key:
        raise Refused("Idempotency-Key header missing")
    try:
        s = key.decode("utf-8") if isinstance(key, (bytes, bytearray)) else key
    except UnicodeDecodeError:
        raise Refused("idempotency key has invalid characters") from None
    if len(s) > MAX_KEY_LENGTH:
        raise Refused("idempotency key too long")
    for ch in s:
        o = ord(ch)
        if o < 0x20 or 0x7F <= o <= 0x9F or 0xD800 <= o <= 0xDFFF:
            raise Refused("idempotency key has invalid characters")
    return s


def _json_body(msg):
    return json.dumps({"error": msg}, separators=(",", ":")).encode()


class _Middleware:
    def __init__(self, app, verifier, unfinished_key, logger=None):
        if unfinished_key is None:
            raise ValueError("idemd_replayauth: unfinished_key is required (PostgresKeyLookup(query)): "
                             "a replay may only finish an existing unfinished key of the signed user")
        self.app = app
        self.verifier = verifier
        self.unfinished_key = unfinished_key
        self.logger = logger or _log
        self._nonce_down = _Outage()

    def _refusal(self, err, path):
        """Logs a refusal; returns (status, body)."""
        if isinstance(err, NonceStoreError):
            self._nonce_down.fail(self.logger, "idemd_replayauth: cannot record replay nonces; "
                                  "signed replays are refused with 503 until it answers again", err)
            return 503, _json_body(MSG_INTERNAL)
        if isinstance(err, KeyLookupError):
            self.logger.error("idemd_replayauth: replay key lookup failed: %s", err)
            return 503, _json_body(MSG_INTERNAL)
        # The reason goes to the log, never to the caller.
        self.logger.warning("idemd_replayauth: replay signature rejected: path=%s reason=%s", path, err)
        return 401, _json_body(MSG_UNAUTHORIZED)

    def _answered(self):
        self._nonce_down.ok(self.logger, "idemd_replayauth: recording replay nonces works again")


class ReplayAuthWSGI(_Middleware):
    """WSGI middleware (idem.ReplayAuth). A request without the signature
    header passes through untouched, to the API's own authentication. A
    signed one reaches the application only when the signature verifies and
    unfinished_key(user_id, key, method, path) is true; the application then
    finds the user id in environ["idemd.replay_user_id"] (an int) and the
    body, which the middleware read, in wsgi.input as before.

        app = ReplayAuthWSGI(app, Verifier(read_secret_files(cur, prev),
                                           nonce_store=PostgresNonceStore(query)),
                             PostgresKeyLookup(query))

    verifier None disables the replay path: every signed request gets 401."""

    def __call__(self, environ, start_response):
        # Only this middleware sets the key (a client's headers become
        # HTTP_* keys and cannot).
        environ.pop(USER_ID_KEY, None)
        header = environ.get("HTTP_IDEMD_REPLAY_SIGNATURE", "")
        if not header:
            return self.app(environ, start_response)
        # WSGI strings are the request's bytes, decoded as latin-1.
        path = (environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")).encode("latin-1")
        try:
            uid = self._verify(environ, header.encode("latin-1"), path)
        except ReplayError as err:
            status, body = self._refusal(err, path.decode("utf-8", "replace"))
            start_response("%d %s" % (status, "Unauthorized" if status == 401 else "Service Unavailable"),
                           [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        environ[USER_ID_KEY] = uid
        return self.app(environ, start_response)

    def _verify(self, environ, header, path):
        if self.verifier is None:
            raise Refused("replay path disabled: no verifier configured")
        key = validate_key(environ.get("HTTP_IDEMPOTENCY_KEY", "").encode("latin-1"))
        body = _read_wsgi_body(environ)
        method = environ.get("REQUEST_METHOD", "GET")
        try:
            uid = self.verifier.verify(header, method, path, key, body)
        except Replayed:
            self._answered()
            raise
        self._answered()
        try:
            found = self.unfinished_key(uid, key, method, path.decode("utf-8", "surrogateescape"))
        except Exception as e:
            raise KeyLookupError("replay key lookup: %s" % e) from e
        if not found:
            raise Refused("no unfinished key of the signed user for this method and path")
        return uid


def _read_wsgi_body(environ):
    stream = environ.get("wsgi.input")
    length = environ.get("CONTENT_LENGTH") or ""
    if length:
        try:
            n = int(length)
        except ValueError:
            raise Refused("body too large or unreadable") from None
        if n < 0 or n > MAX_REPLAY_BODY:
            raise Refused("body too large or unreadable")
    elif environ.get("wsgi.input_terminated"):
        n = MAX_REPLAY_BODY + 1
    else:
        n = 0
    chunks, got = [], 0
    while stream is not None and got < n:
        c = stream.read(n - got)
        if not c:
            break
        chunks.append(c)
        got += len(c)
    body = b"".join(chunks)
    if len(body) > MAX_REPLAY_BODY or (length and len(body) != n):
        raise Refused("body too large or unreadable")
    # The application reads the bytes the signature covered.
    environ["wsgi.input"] = io.BytesIO(body)
    environ["CONTENT_LENGTH"] = str(len(body))
    return body


class ReplayAuthASGI(_Middleware):
    """ASGI middleware (idem.ReplayAuth) for http scopes: as ReplayAuthWSGI,
    with the user id in scope["idemd.replay_user_id"] and the body replayed
    to the application's receive. The nonce store and key lookup may be
    async (PostgresNonceStore / PostgresKeyLookup on an async driver)."""

    async def __call__(self, scope, receive, send):
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        scope = dict(scope)
        scope.pop(USER_ID_KEY, None)
        header = b""
        key = b""
        for name, value in scope.get("headers", ()):
            n = name.lower()
            if n == b"idemd-replay-signature" and not header:
                header = value
            elif n == b"idempotency-key" and not key:
                key = value
        if not header:
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")
        root = scope.get("root_path", "")
        if root and not path.startswith(root):
            path = root + path
        path = path.encode("utf-8", "surrogateescape")
        try:
            uid, body = await self._verify(scope, receive, header, key, path)
        except _Disconnected:
            return
        except ReplayError as err:
            status, payload = self._refusal(err, path.decode("utf-8", "replace"))
            await send({"type": "http.response.start", "status": status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(payload)).encode())]})
            await send({"type": "http.response.body", "body": payload})
            return
        scope[USER_ID_KEY] = uid
        sent = False

        async def replay_receive():
            nonlocal sent
            if not sent:
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay_receive, send)

    async def _verify(self, scope, receive, header, key, path):
        if self.verifier is None:
            raise Refused("replay path disabled: no verifier configured")
        key = validate_key(key)
        chunks, size = [], 0
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                raise _Disconnected()
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > MAX_REPLAY_BODY:
                raise Refused("body too large or unreadable")
            chunks.append(chunk)
            if not msg.get("more_body", False):
                break
        body = b"".join(chunks)
        method = scope.get("method", "GET")
        try:
            uid = await self.verifier.verify_async(header, method, path, key, body)
        except Replayed:
            self._answered()
            raise
        self._answered()
        try:
            lookup = getattr(self.unfinished_key, "call_async", None) or self.unfinished_key
            found = lookup(uid, key, method, path.decode("utf-8", "surrogateescape"))
            if inspect.isawaitable(found):
                found = await found
        except Exception as e:
            raise KeyLookupError("replay key lookup: %s" % e) from e
        if not found:
            raise Refused("no unfinished key of the signed user for this method and path")
        return uid, body


class _Disconnected(Exception):
    pass

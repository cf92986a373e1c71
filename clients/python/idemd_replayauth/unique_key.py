"""River's unique key for a job staged with plain SQL.

A staged row's unique_key is the SHA-256 of the string River's Go client
builds from the job's kind, args, period and queue, and unique_states the
bitmask of the states in which an existing job counts as the same job
(docs/languages/README.md, "Unique jobs from another language"). This
module computes both exactly as River's Go client does (Go's encoding/json
for the args, Go's time.Truncate for the period), so a job staged from
Python and the same job inserted by a Go API with River's InsertTx are one
job. clients/testdata/unique_keys.json holds the vectors. Python's own
json.dumps differs from Go's (1.0, & < >, U+2028, key order), and so does
River's own Python client.

    key = unique_key("send_invoice", args, queue="billing", by_args=True,
                     fields=["customer_id", "month"], by_period=3600)
    cur.execute("INSERT INTO staged_jobs (job_name, job_args, queue, unique_key, unique_states) "
                "VALUES (%s, %s, 'billing', %s, %s::bit(8))",
                ("send_invoice", json.dumps(args), key, unique_states()))
"""

import datetime
import hashlib
import math
import re

__all__ = ["unique_key", "unique_key_string", "unique_states", "go_json"]

# Seconds from Go's zero time (January 1, year 1, UTC), which time.Truncate
# counts periods from, to the Unix epoch.
GO_ZERO_TO_UNIX = 62135596800

# River's job states, in the order PostgreSQL prints unique_states (bit 7
# first).
STATE_BITS = ("scheduled", "running", "retryable", "pending", "discarded", "completed", "cancelled", "available")
DEFAULT_STATES = ("available", "completed", "pending", "retryable", "running", "scheduled")
REQUIRED_STATES = ("available", "pending", "running", "scheduled")

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)


def unique_key(kind, args=None, **opts):
    """The 32-byte key for staged_jobs.unique_key (see unique_key_string)."""
    return hashlib.sha256(unique_key_string(kind, args, **opts).encode("utf-8")).digest()


def unique_key_string(kind, args=None, *, queue="default", by_args=False, fields=None, by_period=None,
                      by_queue=False, exclude_kind=False, at=None):
    """The string unique_key hashes.

    args is the job's args as the Go API's args struct encodes them (str
    keys; values None, bool, int, float, str, list, tuple, dict); fields
    are the paths ("customer.id") of the fields marked river:"unique", or
    None for all args; by_period is whole seconds (or a timedelta of whole
    seconds); at is the job's scheduled_at or the insert's now, an aware
    datetime or Unix seconds.
    """
    if exclude_kind and not (by_args or by_period or by_queue):
        raise ValueError("exclude_kind requires by_args, by_queue or by_period")
    out = []
    if not exclude_kind:
        out.append("&kind=" + kind)
    if by_args:
        out.append("&args=" + _unique_args({} if args is None else args, fields))
    if by_period:
        out.append("&period=" + _period_start(at, by_period))
    if by_queue:
        out.append("&queue=" + queue)
    return "".join(out)


def unique_states(states=None):
    """unique_states as a bit string for a bit(8) parameter: River's default
    (every state but cancelled and discarded) when states is None."""
    states = list(DEFAULT_STATES if states is None else states)
    unknown = [s for s in states if s not in STATE_BITS]
    if unknown:
        raise ValueError("unknown job states: " + ", ".join(unknown))
    missing = [s for s in REQUIRED_STATES if s not in states]
    if missing:
        raise ValueError("unique states must contain " + ", ".join(missing))
    return "".join("1" if s in states else "0" for s in STATE_BITS)


class _Picked(dict):
    """An object unique_args builds from marked paths, apart from dict
    values taken whole from the args."""


def _unique_args(args, fields):
    if not isinstance(args, dict):
        raise TypeError("args must be a dict")
    if not fields:
        # Python orders str by code point, which is UTF-8's byte order, as Go sorts.
        return "{" + ",".join(_top_key(k) + ":" + go_json(args[k]) for k in sorted(args)) + "}"
    picked = _Picked()
    for path in sorted(fields):
        parts = path.split(".")
        obj, found = args, True
        for p in parts:
            if not isinstance(obj, dict) or p not in obj:
                found = False
                break
            obj = obj[p]
        if not found:
            continue
        node = picked
        for p in parts[:-1]:
            node = node.setdefault(p, _Picked())
        node[parts[-1]] = obj
    return _picked_json(picked)


def _picked_json(node):
    return "{" + ",".join(
        _top_key(k) + ":" + (_picked_json(v) if isinstance(v, _Picked) else go_json(v)) for k, v in node.items()) + "}"


def _top_key(key):
    """A top-level key as River writes it: between quotes as it is when all
    of it is printable ASCII other than " and \\, else as Go encodes a string."""
    if not isinstance(key, str):
        raise TypeError("object keys must be str")
    if all(0x20 <= ord(c) <= 0x7F and c not in '"\\' for c in key):
        return '"' + key + '"'
    return _go_string(key)


def go_json(value):
    """value as Go's encoding/json.Marshal writes it."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return _go_float(value)
    if isinstance(value, str):
        return _go_string(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(go_json(v) for v in value) + "]"
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise TypeError("object keys must be str")
        return "{" + ",".join(_go_string(k) + ":" + go_json(v) for k, v in value.items()) + "}"
    raise TypeError(f"{type(value).__name__} has no JSON form here: convert it as the Go API's args struct encodes it")


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
_ESCAPE_RE = re.compile('["\\\\<>&\u2028\u2029\x00-\x1f]')


def _go_string(s):
    """A string as Go encodes it: ", \\, the control characters (\\b \\f \\n
    \\r \\t short, the rest \\u00XX), < > & and U+2028, U+2029 escaped; the
    rest as UTF-8."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"string is not valid Unicode: {s!r}") from e
    return '"' + _ESCAPE_RE.sub(lambda m: _ESCAPES.get(m.group(0)) or "\\u%04x" % ord(m.group(0)), s) + '"'


def _go_float(f):
    """A float as Go's float64 encodes it: the shortest digits that read back
    as the same float, plain for 1e-6 <= |f| < 1e21, with an exponent outside
    it (1, 0.1, 1e+21, 1e-7, -0)."""
    if math.isnan(f) or math.isinf(f):
        raise ValueError(f"{f} has no JSON form")
    if f == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    mant, _, exp = repr(abs(f)).partition("e")
    whole, _, frac = mant.partition(".")
    digits = whole + frac
    point = len(whole) + (int(exp) if exp else 0)
    stripped = digits.lstrip("0")
    point -= len(digits) - len(stripped)
    digits = stripped.rstrip("0")
    sign = "-" if f < 0 else ""
    if abs(f) < 1e-6 or abs(f) >= 1e21:
        x = point - 1
        m = digits[0] + ("." + digits[1:] if len(digits) > 1 else "")
        return sign + m + ("e-%d" % -x if x < 0 else "e+%02d" % x)
    if point <= 0:
        return sign + "0." + "0" * -point + digits
    if point >= len(digits):
        return sign + digits + "0" * (point - len(digits))
    return sign + digits[:point] + "." + digits[point:]


def _period_start(at, period):
    if isinstance(period, datetime.timedelta):
        if period % datetime.timedelta(seconds=1):
            raise ValueError("by_period must be whole seconds, at least 1")
        period = period // datetime.timedelta(seconds=1)
    if isinstance(period, bool) or not isinstance(period, int) or period < 1:
        raise ValueError("by_period must be whole seconds, at least 1")
    if at is None:
        at = datetime.datetime.now(datetime.timezone.utc)
    if isinstance(at, datetime.datetime):
        if at.tzinfo is None:
            raise ValueError("at must be an aware datetime: a naive one names no instant")
        secs = (at - _EPOCH) // datetime.timedelta(seconds=1)
    else:
        secs = math.floor(at)
    start = (secs + GO_ZERO_TO_UNIX) // period * period - GO_ZERO_TO_UNIX
    d = _EPOCH + datetime.timedelta(seconds=start)
    return f"{d.year:04d}-{d.month:02d}-{d.day:02d}T{d.hour:02d}:{d.minute:02d}:{d.second:02d}Z"

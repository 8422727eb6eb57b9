"""The wire format of ``POST /v1/events`` and its validation.

Body: ``{"events": [EVENT, ...]}``, each EVENT an object with exactly these fields:

| field | type | rule |
|---|---|---|
| ``event_id`` | string | 1-256 bytes of UTF-8, printable (no control or invisible |
| | | format characters), not only spaces |
| ``sender`` | string | ``[A-Za-z0-9._-]{1,64}``; with authentication, the token's own |
| ``system_time`` | integer, microseconds since the epoch | > 0, <= now + ``max_clock_skew`` |
| ``user`` | string | 0-256 bytes of UTF-8, no control characters |
| ``event_time`` | integer, microseconds since the epoch | >= 0 (1970), <= now + skew |
| ``bytes`` | integer | >= 0 |

A batch is accepted as a whole or not at all: any invalid event rejects the request with
400 and one reason per rejected event (``{"error", "rejected": [{"index", "event_id",
"reason"}]}``, at most :data:`MAX_LISTED` listed, ids cut to :data:`ECHO_CHARS`
characters); malformed JSON or a body that is not UTF-8 is 400; more events than the
limit, or a body larger than the limit allows, is 413.

Work is bounded before anything is parsed: the body size is capped at
:attr:`Limits.max_body_bytes` (``max_events`` x :data:`EVENT_JSON_BYTES`), and a body
whose JSON objects, arrays and separators outnumber what ``max_events`` events can hold is
refused without parsing it (a body of millions of ``{}`` costs a scan, not a parse).
"""

from __future__ import annotations

import io
import json
import re
import time
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from onceflow.errors import ConfigError

FIELDS = {"event_id": str, "sender": str, "system_time": int, "user": str, "event_time": int,
          "bytes": int}
MAX_ID_BYTES = 256
MAX_USER_BYTES = 256
SENDER_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
"""Sender names: also the namespace of their event ids (``<sender>/<event_id>``)."""
EVENT_JSON_BYTES = 2048
"""Body bytes allowed per event: a largest valid event, every non-ASCII character
``\\uXXXX``-escaped, is ~1.8 KB of JSON."""
ECHO_CHARS = 64
"""Characters of an event id echoed in a rejection."""
MAX_LISTED = 100
"""Rejected events listed by index in one answer (the rest are counted)."""
_CONTROL = r"[\x00-\x1f\x7f-\x9f]"
_CONTROL_RE = re.compile(_CONTROL)
_STRING_RE = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)


@dataclass(frozen=True)
class Limits:
    """What one request may carry.

    Attributes:
        max_events: Most events in one request (more: 413).
        max_clock_skew_s: How far ``system_time`` and ``event_time`` may be ahead of the
            receiver's clock (a sender clock further ahead would create buckets the GC
            cannot drop for that long).
    """

    max_events: int = 10_000
    max_clock_skew_s: float = 300.0

    def __post_init__(self) -> None:
        if self.max_events < 1:
            raise ConfigError(f"max_events must be >= 1, got {self.max_events}")
        if not 0 <= self.max_clock_skew_s <= 86_400:
            raise ConfigError(f"max_clock_skew must be between 0 and 1 day, got {self.max_clock_skew_s} s")

    @property
    def max_body_bytes(self) -> int:
        """The largest body a request may have."""
        return self.max_events * EVENT_JSON_BYTES + 1024

    @property
    def max_values(self) -> int:
        """Most ``{``, ``[`` and ``,`` outside strings in a body of ``max_events`` events."""
        return 8 * self.max_events + 8


class EventBatchError(Exception):
    """A request the receiver refuses, with the HTTP status and the reasons."""

    def __init__(self, status: int, error: str, rejected: list[dict[str, Any]] | None = None):
        super().__init__(error)
        self.status = status
        self.error = error
        self.rejected = rejected or []

    def to_json(self) -> dict[str, Any]:
        """The response body."""
        return {"error": self.error, "rejected": self.rejected}


def echo(value: Any) -> Any:
    """An event id as a rejection may show it: strings cut to :data:`ECHO_CHARS`."""
    if isinstance(value, str) and len(value) > ECHO_CHARS:
        return value[:ECHO_CHARS] + f"...({len(value)} chars)"
    return value if isinstance(value, (str, int, float, bool)) or value is None else type(value).__name__


def _problem(event: Any, now_us: int, skew_us: int) -> str | None:
    """Why one event is invalid (None if it is valid); mirrors :func:`_bad_values`."""
    if not isinstance(event, dict):
        return "an event must be a JSON object"
    missing = [f for f in FIELDS if f not in event]
    if missing:
        return f"missing fields {missing}"
    extra = sorted(set(event) - set(FIELDS))
    if extra:
        return f"unknown fields {[echo(x) for x in extra[:10]]}"
    for name, kind in FIELDS.items():
        value = event[name]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{name} must be an integer, got {type(value).__name__}"
        if kind is int and not -(2**63) <= value < 2**63:
            return f"{name} must fit in 64 bits"
        if kind is str and not isinstance(value, str):
            return f"{name} must be a string, got {type(value).__name__}"
    eid, user = event["event_id"], event["user"]
    if not eid.strip():
        return "event_id is empty"
    if len(eid.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        return f"event_id longer than {MAX_ID_BYTES} bytes (UTF-8)"
    if not eid.isprintable():
        return "event_id has a control or invisible character (ids must be printable)"
    if not SENDER_RE.match(event["sender"]):
        return "sender must match [A-Za-z0-9._-]{1,64}"
    if len(user.encode("utf-8", "surrogatepass")) > MAX_USER_BYTES:
        return f"user longer than {MAX_USER_BYTES} bytes (UTF-8)"
    if _CONTROL_RE.search(user):
        return "user has a control character"
    for name in ("system_time", "event_time"):
        if event[name] > now_us + skew_us:
            return (f"{name} is {(event[name] - now_us) / 1e6:.0f} s ahead of the receiver's clock (at most "
                    f"{skew_us / 1e6:.0f} s allowed): fix the sender's clock")
    if event["system_time"] <= 0:
        return "system_time must be > 0 (microseconds since the epoch)"
    if event["event_time"] < 0:
        return "event_time must be >= 0 (microseconds since 1970-01-01)"
    if event["bytes"] < 0:
        return "bytes must be >= 0"
    return None


_EVENT = pa.struct([("event_id", pa.string()), ("sender", pa.string()), ("system_time", pa.int64()),
                    ("user", pa.string()), ("event_time", pa.int64()), ("bytes", pa.int64())])
_PARSE = pajson.ParseOptions(explicit_schema=pa.schema([("events", pa.list_(_EVENT))]),
                             unexpected_field_behavior="error")


def _now_us() -> int:
    return time.time_ns() // 1000


def precheck(body: bytes, limits: Limits) -> None:
    """The checks that cost a scan, not a parse: size, UTF-8, an object, how many values.

    pyarrow 26's JSON reader dies with a segmentation fault on the body ``null`` (measured):
    nothing that does not start with ``{`` reaches it.

    Args:
        body: The raw body.
        limits: The receiver's limits.

    Raises:
        EventBatchError: 413 (too large, too many values) or 400 (not UTF-8).
    """
    if len(body) > limits.max_body_bytes:
        raise EventBatchError(413, f"request body of {len(body)} bytes; the limit is {limits.max_body_bytes} "
                                   f"({limits.max_events} events of at most {EVENT_JSON_BYTES} bytes)")
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EventBatchError(400, f"the body is not valid UTF-8 (byte {exc.start}): {exc.reason}") from None
    if not body.strip().startswith(b"{"):  # also: Arrow's JSON reader crashes on a body "null"
        raise EventBatchError(400, 'the body must be {"events": [...]}, one JSON object')
    values = body.count(b"{") + body.count(b"[") + body.count(b",")
    if values > limits.max_values:  # maybe inside strings: count again without them
        values = sum(map(_STRING_RE.sub(b'""', body).count, (b"{", b"[", b",")))
        if values > limits.max_values:
            raise EventBatchError(413, f"the body holds {values} JSON objects, arrays and values; "
                                       f"{limits.max_events} events hold at most {limits.max_values}")


def parse_batch(body: bytes, limits: Limits | int, now_us: int | None = None) -> pa.Table:
    """Parse and validate a request body.

    The fast path parses with Arrow's JSON reader straight into columns (strict types,
    unknown fields refused) and checks the values with vectorized kernels; anything it
    does not accept is re-read in Python to name every rejected event and why (bounded:
    :func:`precheck` ran first).

    Args:
        body: The raw body.
        limits: The receiver's limits (an int: ``max_events`` with default limits).
        now_us: The receiver's clock (microseconds); the wall clock when None.

    Returns:
        The events as a table with the columns of :data:`FIELDS` (all valid).

    Raises:
        EventBatchError: Malformed, oversized, or with an invalid event (nothing accepted).
    """
    if isinstance(limits, int):
        limits = Limits(max_events=limits)
    now = _now_us() if now_us is None else now_us
    skew = int(limits.max_clock_skew_s * 1e6)
    precheck(body, limits)
    try:
        doc = pajson.read_json(io.BytesIO(body), parse_options=_PARSE,
                               read_options=pajson.ReadOptions(use_threads=False,
                                                               block_size=max(len(body) + 1, 1 << 16)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        _explain(body, limits, now, skew)
        raise EventBatchError(400, f"cannot read the batch: {str(exc)[:200]}") from None
    if doc.num_rows != 1 or doc.column(0).null_count:
        _explain(body, limits, now, skew)
        raise EventBatchError(400, 'the body must be one object {"events": [...]}')
    events = doc.column(0).combine_chunks().flatten()
    if len(events) > limits.max_events:
        raise EventBatchError(413, f"{len(events)} events in one batch; the limit is {limits.max_events}")
    table = pa.Table.from_batches([pa.RecordBatch.from_struct_array(events)])
    if events.null_count or any(c.null_count for c in table.columns) or _bad_values(table, now, skew):
        _explain(body, limits, now, skew)
        raise EventBatchError(400, "the batch has invalid events")
    return table


def scoped_ids(events: pa.Table) -> pa.ChunkedArray:
    """The ids as the catalog and the log keep them: ``<sender>/<event_id>``.

    Sender names cannot contain ``/``, so the pair is unambiguous: one sender's ids can
    never collide with another's.
    """
    senders, ids = events.column("sender"), events.column("event_id")
    if events.num_rows and pc.count_distinct(senders).as_py() == 1:  # one sender: the faster path
        return pc.binary_join_element_wise(pa.scalar(senders[0].as_py()), ids, "/")
    return pc.binary_join_element_wise(senders, ids, "/")


def _any(mask: pa.ChunkedArray | pa.Array) -> bool:
    return bool(pc.any(mask).as_py())


def _bad_values(table: pa.Table, now_us: int, skew_us: int) -> bool:
    """Whether any event breaks a rule of :func:`_problem` (no nulls in ``table``)."""
    if not table.num_rows:
        return False
    for name in ("event_id", "sender", "user"):
        try:
            table.column(name).validate(full=True)  # Arrow's JSON reader passes bad UTF-8 through
        except pa.ArrowInvalid:
            return True
    eid, user = table.column("event_id"), table.column("user")
    id_len = pc.min_max(pc.binary_length(eid)).as_py()
    if id_len["min"] == 0 or id_len["max"] > MAX_ID_BYTES or _any(pc.utf8_is_space(eid)):
        return True
    if not pc.all(pc.utf8_is_printable(eid)).as_py():
        return True
    if not pc.all(pc.match_substring_regex(table.column("sender"), SENDER_RE.pattern)).as_py():
        return True
    if pc.max(pc.binary_length(user)).as_py() > MAX_USER_BYTES or _any(
            pc.match_substring_regex(user, _CONTROL)):
        return True
    st, et = pc.min_max(table.column("system_time")).as_py(), pc.min_max(table.column("event_time")).as_py()
    return bool(st["min"] <= 0 or et["min"] < 0 or max(st["max"], et["max"]) > now_us + skew_us
                or pc.min(table.column("bytes")).as_py() < 0)


def _explain(body: bytes, limits: Limits, now_us: int, skew_us: int) -> None:
    """The slow path: raise an EventBatchError naming every problem (or return if none)."""
    try:
        doc = json.loads(body)
    except RecursionError:
        raise EventBatchError(400, "malformed batch: JSON nested too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise EventBatchError(400, f"malformed JSON: {str(exc)[:200]}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("events"), list):
        raise EventBatchError(400, 'the body must be {"events": [...]}')
    extra = sorted(set(doc) - {"events"})
    if extra:
        raise EventBatchError(400, f"unknown top-level fields {[echo(x) for x in extra[:10]]}; "
                                   "the body is {\"events\": [...]}")
    events = doc["events"]
    if len(events) > limits.max_events:
        raise EventBatchError(413, f"{len(events)} events in one batch; the limit is {limits.max_events}")
    rejected = []
    for i, event in enumerate(events):
        reason = _problem(event, now_us, skew_us)
        if reason is not None:
            eid = event.get("event_id") if isinstance(event, dict) else None
            rejected.append({"index": i, "event_id": echo(eid), "reason": reason})
    if rejected:
        more = f" ({len(rejected) - MAX_LISTED} more not listed)" if len(rejected) > MAX_LISTED else ""
        raise EventBatchError(400, f"{len(rejected)} of {len(events)} events invalid; none accepted{more}",
                              rejected[:MAX_LISTED])

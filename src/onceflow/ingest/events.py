"""The wire format of ``POST /v1/events`` and its validation.

Body: ``{"events": [EVENT, ...]}``, each EVENT an object with exactly these fields:

| field | type | meaning |
|---|---|---|
| ``event_id`` | non-empty string (<= 256 chars) | stable id assigned by the producer |
| ``sender`` | non-empty string | the sending producer |
| ``system_time`` | integer > 0, microseconds | the sender's clock (strictly increasing) |
| ``user`` | string | |
| ``event_time`` | integer, microseconds since the epoch | |
| ``bytes`` | integer >= 0 | |

A batch is accepted as a whole or not at all: any invalid event rejects the request with
400 and one reason per rejected event (``{"error", "rejected": [{"index", "event_id",
"reason"}]}``); malformed JSON is 400, more than the receiver's limit of events is 413.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

FIELDS = {"event_id": str, "sender": str, "system_time": int, "user": str, "event_time": int,
          "bytes": int}
MAX_ID_LEN = 256


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


def _problem(event: Any) -> str | None:
    if not isinstance(event, dict):
        return "an event must be a JSON object"
    missing = [f for f in FIELDS if f not in event]
    if missing:
        return f"missing fields {missing}"
    extra = sorted(set(event) - set(FIELDS))
    if extra:
        return f"unknown fields {extra}"
    for name, kind in FIELDS.items():
        value = event[name]
        if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
            return f"{name} must be an integer, got {type(value).__name__}"
        if kind is str and not isinstance(value, str):
            return f"{name} must be a string, got {type(value).__name__}"
    if not event["event_id"].strip():
        return "event_id is empty"
    if len(event["event_id"]) > MAX_ID_LEN:
        return f"event_id longer than {MAX_ID_LEN} characters"
    if not event["sender"].strip():
        return "sender is empty"
    if event["system_time"] <= 0:
        return "system_time must be > 0 (microseconds since the epoch)"
    if event["bytes"] < 0:
        return "bytes must be >= 0"
    return None


_EVENT = pa.struct([("event_id", pa.string()), ("sender", pa.string()), ("system_time", pa.int64()),
                    ("user", pa.string()), ("event_time", pa.int64()), ("bytes", pa.int64())])
_PARSE = pajson.ParseOptions(explicit_schema=pa.schema([("events", pa.list_(_EVENT))]),
                             unexpected_field_behavior="error")


def parse_batch(body: bytes, max_events: int) -> pa.Table:
    """Parse and validate a request body.

    The fast path parses with Arrow's JSON reader straight into columns (strict types,
    unknown fields refused) and checks the values with vectorized kernels; anything it
    does not accept is re-read in Python to name every rejected event and why.

    Args:
        body: The raw body.
        max_events: Most events a batch may carry.

    Returns:
        The events as a table with the columns of :data:`FIELDS` (all valid).

    Raises:
        EventBatchError: Malformed, oversized, or with an invalid event (nothing accepted).
    """
    try:
        doc = pajson.read_json(io.BytesIO(body), parse_options=_PARSE,
                               read_options=pajson.ReadOptions(use_threads=False,
                                                               block_size=max(len(body) + 1, 1 << 16)))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        _explain(body, max_events)
        raise EventBatchError(400, f"cannot read the batch: {exc}") from None
    if doc.num_rows != 1 or doc.column(0).null_count:
        _explain(body, max_events)
        raise EventBatchError(400, 'the body must be one object {"events": [...]}')
    events = doc.column(0).combine_chunks().flatten()
    if len(events) > max_events:
        raise EventBatchError(413, f"{len(events)} events in one batch; the limit is {max_events}")
    table = pa.Table.from_batches([pa.RecordBatch.from_struct_array(events)])
    if events.null_count or any(c.null_count for c in table.columns) or _bad_values(table):
        _explain(body, max_events)
        raise EventBatchError(400, "the batch has invalid events")
    return table


def _bad_text(col: pa.ChunkedArray, max_len: int | None) -> bool:
    """Empty, whitespace-only, or (with ``max_len``) too long strings, in a few passes."""
    size = pc.min_max(pc.binary_length(col)).as_py()
    if size["min"] == 0 or pc.any(pc.utf8_is_space(col)).as_py():
        return True
    return max_len is not None and size["max"] > max_len and pc.max(pc.utf8_length(col)).as_py() > max_len


def _bad_values(table: pa.Table) -> bool:
    """Whether any event breaks a rule of :func:`_problem` (no nulls in ``table``)."""
    if not table.num_rows:
        return False
    return (_bad_text(table.column("event_id"), MAX_ID_LEN) or _bad_text(table.column("sender"), None)
            or pc.min(table.column("system_time")).as_py() <= 0 or pc.min(table.column("bytes")).as_py() < 0)


def _explain(body: bytes, max_events: int) -> None:
    """The slow path: raise an EventBatchError naming every problem (or return if none)."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise EventBatchError(400, f"malformed JSON: {exc}") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("events"), list):
        raise EventBatchError(400, 'the body must be {"events": [...]}')
    extra = sorted(set(doc) - {"events"})
    if extra:
        raise EventBatchError(400, f"unknown top-level fields {extra}; the body is {{\"events\": [...]}}")
    events = doc["events"]
    if len(events) > max_events:
        raise EventBatchError(413, f"{len(events)} events in one batch; the limit is {max_events}")
    rejected = []
    for i, event in enumerate(events):
        reason = _problem(event)
        if reason is not None:
            eid = event.get("event_id") if isinstance(event, dict) else None
            rejected.append({"index": i, "event_id": eid, "reason": reason})
    if rejected:
        raise EventBatchError(400, f"{len(rejected)} of {len(events)} events invalid; none accepted",
                              rejected)

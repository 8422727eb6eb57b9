"""The event record: the schema shared by the event log, the generator and the example pipelines.

Every event carries a stable ``event_id`` assigned by its producer where the record is born. The
pipeline never mints IDs: a replay would mint new ones and deduplication would be impossible.
"""

from __future__ import annotations

import pyarrow as pa

EVENT_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("event_id", pa.string()),
    ("user", pa.string()),
    ("event_time", pa.timestamp("us", tz="UTC")),
    ("system_time", pa.timestamp("us", tz="UTC")),
    ("bytes", pa.int64()),
)
"""Field names and Arrow types of an event, in column order."""

EVENT_SCHEMA: pa.Schema = pa.schema(list(EVENT_FIELDS))
"""Arrow schema of an event segment."""

EVENT_DDL = (
    "event_id STRING, user STRING, event_time TIMESTAMP, system_time TIMESTAMP, bytes BIGINT"
)
"""The same schema as a Spark DDL string (Spark reads segments with it, never infers)."""

WINDOW_MS = 60_000
"""Width of the fixed event-time windows of Example 5-1 (one minute)."""


def schema_problems(schema: pa.Schema, expected: pa.Schema | None = None) -> list[str]:
    """Compare a segment's schema with the log's (:data:`EVENT_SCHEMA` by default).

    Args:
        schema: The Arrow schema read from a segment file.
        expected: The log's schema.

    Returns:
        Human-readable differences; empty when the schema matches. Timestamp
        units and time zones must match exactly, because Spark reads the file
        with a fixed schema and a silent reinterpretation would shift times.
    """
    problems: list[str] = []
    found = {f.name: f.type for f in schema}
    fields = EVENT_FIELDS if expected is None else tuple((f.name, f.type) for f in expected)
    for name, typ in fields:
        if name not in found:
            problems.append(f"missing column {name!r} (expected {typ})")
        elif found[name] != typ:
            problems.append(f"column {name!r} has type {found[name]}, expected {typ}")
    extra = sorted(set(found) - {n for n, _ in fields})
    if extra:
        problems.append(f"unexpected columns {extra}")
    return problems

"""The sink backends the contract suite runs against, and a child process that commits one batch.

``python -m tests.sinks.backends KIND LOCATION BATCH`` commits the fixed batch ``B0`` (batch
0) or ``B1`` (any other) as ``BATCH`` into a sink of ``KIND`` (with ``ONCEFLOW_CRASH_AT`` from
the environment, so the process can be SIGKILLed at a crash point).
"""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow.sinks._core.base import BatchStats
from onceflow.sinks.postgres import sql as pg
from onceflow.sinks.sqlite.db import read_batches
from onceflow.verify.sinks import SinkOptions, make_sink, marker_id
from onceflow.verify.verdict import read_counts, read_pg_counts
from tests.helpers import commit_deltas

KINDS = ["sqlite", "postgres", "postgres-staged", "postgres-2pc"]
"""The ``onceflow run --sink`` choices that write exactly once."""


class Example51Sink:
    """A generic sink with Example 5-1's tables, fed the way its ``per_batch`` feeds it."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink

    def bind(self, query_id: str) -> None:
        self.sink.bind(query_id)

    def commit_batch(self, batch_id: int, deltas: pa.Table, stats: BatchStats) -> bool:
        return commit_deltas(self.sink, batch_id, deltas, stats)

    def flush(self) -> None:
        """Wait until every accepted batch is in the tables (the SQLite sink applies staged
        batches beside the caller)."""
        flush = getattr(self.sink, "flush", None)
        if flush is not None:
            flush()

    def close(self) -> None:
        self.sink.close()


def deltas(rows: list[tuple[str, int, int]]) -> pa.Table:
    return pa.table({
        "user": [r[0] for r in rows],
        "window_start_ms": pa.array([r[1] for r in rows], pa.int64()),
        "window_end_ms": pa.array([r[1] + 60_000 for r in rows], pa.int64()),
        "count": pa.array([r[2] for r in rows], pa.int64()),
    })


B0 = deltas([("a", 0, 3), ("b", 0, 2), ("a", 60_000, 1)])
B1 = deltas([("a", 60_000, 4), ("c", 120_000, 5)])
STATS = BatchStats(input_rows=20, late_dropped=2, late_watermark_ms=7)

_PG_BOOM = """
CREATE OR REPLACE FUNCTION boom() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN IF NEW.window_start_ms = 999 THEN RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $$;
CREATE TRIGGER boom BEFORE INSERT ON user_counts FOR EACH ROW EXECUTE FUNCTION boom();
"""


class Backend:
    """One sink implementation at one location (a SQLite file or a PostgreSQL database)."""

    def __init__(self, kind: str, location: str) -> None:
        self.kind = kind
        self.location = location

    @property
    def sqlite(self) -> bool:
        return self.kind.startswith("sqlite")

    @property
    def spark_side(self) -> bool:
        return self.kind in ("postgres-staged", "postgres-2pc")

    def make(self, sink_id: str = "user_counts") -> Example51Sink:
        where = SinkOptions(db=Path(self.location)) if self.sqlite else SinkOptions(pg_dsn=self.location)
        return Example51Sink(make_sink(self.kind, where, sink_id))

    def counts(self) -> tuple[dict[tuple[str, int], int], dict[int, int]]:
        if self.sqlite:
            return read_counts(self.location)
        return read_pg_counts(self.location)

    def batches(self, sink_id: str = "user_counts") -> list[dict[str, Any]]:
        if self.sqlite:
            return read_batches(self.location, sink_id)
        return pg.read_batches(self.location, marker_id(self.kind, "user_counts", sink_id))

    def break_window_999(self, broken: bool) -> None:
        """Make inserting a user_counts row of window 999 fail (a trigger), or repair it."""
        if self.sqlite:
            with sqlite3.connect(self.location) as conn:
                conn.execute(
                    "CREATE TRIGGER boom BEFORE INSERT ON user_counts WHEN NEW.window_start_ms = 999 "
                    "BEGIN SELECT RAISE(ABORT, 'boom'); END" if broken else "DROP TRIGGER boom")
            return
        with pg.session(self.location) as conn:
            conn.execute(_PG_BOOM if broken else "DROP TRIGGER boom ON user_counts")

    def staged(self) -> list[int]:
        """Batches the SQLite sink staged and has not applied."""
        if not self.sqlite or not Path(self.location).exists():
            return []
        with sqlite3.connect(self.location) as conn:
            return [r[0] for r in conn.execute("SELECT batch_id FROM onceflow_staged ORDER BY batch_id")]

    def prepared(self) -> list[str]:
        if self.sqlite:
            return []
        with pg.session(self.location) as conn:
            return pg.prepared_gids(conn, "of:")


def main(argv: list[str]) -> None:
    kind, location, batch = argv[0], argv[1], int(argv[2])
    backend = Backend(kind, location)
    if backend.spark_side:
        from onceflow.runtime.session import session

        session(app_name="contract-child", conf={"spark.task.maxFailures": "1"})
    sink = backend.make()
    sink.bind("q1")
    sink.commit_batch(batch, B0 if batch == 0 else B1, STATS)
    sink.close()


if __name__ == "__main__":
    main(sys.argv[1:])

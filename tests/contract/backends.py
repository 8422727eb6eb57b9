"""The sink backends the contract suite runs against, and a child process that commits one batch.

``python -m tests.contract.backends KIND LOCATION BATCH`` commits the fixed batch ``B0`` as
``BATCH`` into a fresh sink of ``KIND`` (with ``ONCEFLOW_CRASH_AT`` from the environment, so
the process can be SIGKILLed at a crash point).
"""

from __future__ import annotations

import sqlite3
import sys
from typing import Any

import pyarrow as pa

from onceflow.sinks import pg
from onceflow.sinks.base import BatchStats, ExactlyOnceSink
from onceflow.sinks.postgres import PostgresSink, PostgresWriterSink
from onceflow.sinks.postgres import read_counts as pg_counts
from onceflow.sinks.sqlite import SQLiteSink, read_batches, read_counts, read_staged

KINDS = ["sqlite", "sqlite-direct", "postgres", "postgres-staged", "postgres-2pc"]
"""``sqlite`` is the staged SQLite sink (the default), ``sqlite-direct`` applies in the batch."""


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

    def make(self, sink_id: str = "user_counts") -> ExactlyOnceSink:
        if self.sqlite:
            return SQLiteSink(self.location, sink_id=sink_id, staged=self.kind == "sqlite")
        if self.kind == "postgres":
            return PostgresSink(self.location, sink_id=sink_id)
        return PostgresWriterSink(self.location, protocol=self.kind.removeprefix("postgres-"),
                                  sink_id=sink_id)

    def counts(self) -> tuple[dict[tuple[str, int], int], dict[int, int]]:
        if self.sqlite:
            return read_counts(self.location)
        return pg_counts(self.location)

    def batches(self, sink_id: str = "user_counts") -> list[dict[str, Any]]:
        if self.sqlite:
            return read_batches(self.location, sink_id)
        return pg.read_batches(self.location, sink_id)

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
        """Batch ids durably staged but not yet applied (the staged SQLite sink only)."""
        return read_staged(self.location) if self.kind == "sqlite" else []

    def prepared(self) -> list[str]:
        if self.sqlite:
            return []
        with pg.session(self.location) as conn:
            return pg.prepared_gids(conn, "of:")


def main(argv: list[str]) -> None:
    kind, location, batch = argv[0], argv[1], int(argv[2])
    backend = Backend(kind, location)
    if backend.spark_side:
        from onceflow.spark import session

        session(app_name="contract-child", conf={"spark.task.maxFailures": "1"})
    sink = backend.make()
    sink.bind("q1")
    sink.commit_batch(batch, B0, STATS)
    sink.close()


if __name__ == "__main__":
    main(sys.argv[1:])

"""PostgreSQL sink for Example 5-1: rows and batch marker in one transaction.

Runs the commit protocol of :mod:`onceflow.sinks.base` on the driver, with the
batch's deltas (small: one row per user and minute) COPYed into a temporary
table and merged with one ``INSERT … ON CONFLICT`` per result table. Large,
record-level outputs use the executor-side writer of
:mod:`onceflow.sinks.pg_writer` instead.

Tables (the same interface as the SQLite sink; ``"user"`` is quoted, it is a
reserved word in SQL):

* ``user_counts("user", window_start_ms, window_end_ms, count)``, key ``("user", window_start_ms)``;
* ``global_counts(window_start_ms, window_end_ms, count)``;
* the metadata tables of :mod:`onceflow.sinks.pg`.
"""

from __future__ import annotations

import json
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc

from onceflow.errors import ConfigError
from onceflow.faults import CrashPoint, maybe_crash
from onceflow.sinks import pg
from onceflow.sinks.base import DELTA_COLUMNS, BatchStats, ExactlyOnceSink

SCHEMA = """
CREATE TABLE IF NOT EXISTS user_counts(
    "user" text, window_start_ms bigint, window_end_ms bigint, count bigint,
    PRIMARY KEY("user", window_start_ms));
CREATE TABLE IF NOT EXISTS global_counts(
    window_start_ms bigint PRIMARY KEY, window_end_ms bigint, count bigint);
"""

_MERGE_USER = """
INSERT INTO user_counts("user", window_start_ms, window_end_ms, count)
SELECT "user", window_start_ms, window_end_ms, count FROM onceflow_deltas
ON CONFLICT ("user", window_start_ms) DO UPDATE SET count = user_counts.count + excluded.count
"""
_MERGE_GLOBAL = """
INSERT INTO global_counts(window_start_ms, window_end_ms, count)
SELECT window_start_ms, min(window_end_ms), sum(count) FROM onceflow_deltas GROUP BY window_start_ms
ON CONFLICT (window_start_ms) DO UPDATE SET count = global_counts.count + excluded.count
"""

Mode = Literal["exactly_once", "naive"]


class PostgresSink(ExactlyOnceSink):
    """Example 5-1 counts in PostgreSQL, one transaction per micro-batch.

    Args:
        dsn: Connection string; ``$ONCEFLOW_PG_DSN`` when None.
        sink_id: Marker namespace for this sink.
        mode: ``"exactly_once"`` (the protocol) or ``"naive"``: no marker check,
            the at-least-once ``foreachBatch`` people write by hand — a negative
            control for tests and the auditor, never for real data.
    """

    def __init__(self, dsn: str | None = None, sink_id: str = "user_counts",
                 mode: Mode = "exactly_once") -> None:
        if mode not in ("exactly_once", "naive"):
            raise ConfigError(f"mode must be 'exactly_once' or 'naive', got {mode!r}")
        self.dsn = pg.resolve_dsn(dsn)
        self.sink_id = pg.check_sink_id(sink_id)
        self.mode: Mode = mode
        self._conn: Any = None

    @property
    def conn(self) -> Any:
        """The open autocommit connection (opened, with the schema, on first use)."""
        if self._conn is None:
            conn = pg.connect(self.dsn)
            pg.ensure_meta(conn)
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(hashtext('onceflow:ddl'))")
                conn.execute(SCHEMA)
            self._conn = conn
        return self._conn

    def bind(self, query_id: str) -> None:
        """Tie the sink to a checkpoint (see :meth:`ExactlyOnceSink.bind`).

        Args:
            query_id: The checkpoint's query id.
        """
        pg.bind_sink(self.conn, self.sink_id, query_id, pg.redact(self.dsn))

    def commit_batch(self, batch_id: int, deltas: pa.Table, stats: BatchStats) -> bool:
        """Apply batch ``batch_id`` exactly once (steps 2-7 of :mod:`onceflow.sinks.base`).

        Args:
            batch_id: Spark's micro-batch id.
            deltas: Columns ``user, window_start_ms, window_end_ms, count``.
            stats: The batch's input and late counts.

        Returns:
            True if this call committed the batch, False for a replay.
        """
        from psycopg import sql

        maybe_crash(CrashPoint.BEFORE_SINK_WRITE, batch_id)  # 2
        deltas = deltas.select(list(DELTA_COLUMNS))
        counted = int(pc.sum(deltas.column("count")).as_py() or 0)
        conn = self.conn
        with conn.transaction():  # 3
            pg.lock_sink(conn, self.sink_id)
            if self.mode != "naive" and pg.has_marker(conn, self.sink_id, batch_id):  # 4
                return False
            conn.execute(
                "CREATE TEMP TABLE onceflow_deltas("
                '"user" text, window_start_ms bigint, window_end_ms bigint, count bigint) '
                "ON COMMIT DROP"
            )
            pg.copy_arrow(conn, sql.Identifier("onceflow_deltas"), list(DELTA_COLUMNS), deltas)  # 5
            conn.execute(_MERGE_USER)
            conn.execute(_MERGE_GLOBAL)
            pg.insert_marker(conn, self.sink_id, batch_id, {
                "input_rows": stats.input_rows,
                "late_dropped": stats.late_dropped,
                "duplicates_dropped": stats.input_rows - stats.late_dropped - counted,
                "events_counted": counted,
                "rows_written": deltas.num_rows,
                "late_watermark_ms": stats.late_watermark_ms,
            })
            maybe_crash(CrashPoint.INSIDE_SINK_TXN, batch_id)
        # 6: the transaction block committed on exit
        maybe_crash(CrashPoint.AFTER_SINK_COMMIT, batch_id)
        maybe_crash(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return True  # 7

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresWriterSink(ExactlyOnceSink):
    """Example 5-1 counts written by Spark's executors (``onceflow_postgres`` data source).

    Each batch is two writes, ``user_counts`` and ``global_counts``, each its own
    sink id and exactly once by the staged or two-phase protocol of
    :mod:`onceflow.sinks.pg_writer`. (A crash between the two leaves one table a
    batch ahead until the re-run completes the other.)

    Args:
        dsn: Connection string; ``$ONCEFLOW_PG_DSN`` when None.
        protocol: ``staged`` or ``2pc``.
        sink_id: Marker namespace of the per-user table; the global table uses
            ``<sink_id>.global``.
    """

    executor_side = True

    def __init__(self, dsn: str | None = None, protocol: str = "staged",
                 sink_id: str = "user_counts") -> None:
        if protocol not in ("staged", "2pc"):
            raise ConfigError(f"protocol must be 'staged' or '2pc', got {protocol!r}")
        self.dsn = pg.resolve_dsn(dsn)
        self.protocol = protocol
        self.sink_id = pg.check_sink_id(sink_id)
        self.query_id = ""

    def bind(self, query_id: str) -> None:
        """Tie both sink ids to a checkpoint (see :meth:`ExactlyOnceSink.bind`).

        Args:
            query_id: The checkpoint's query id.
        """
        with pg.session(self.dsn) as conn:
            for sid in (self.sink_id, f"{self.sink_id}.global"):
                pg.bind_sink(conn, sid, query_id, pg.redact(self.dsn))
        self.query_id = query_id

    def commit_frame(self, batch_id: int, deltas: Any, stats: BatchStats) -> bool:
        """Write both tables from the executors, each exactly once.

        Args:
            batch_id: Spark's micro-batch id.
            deltas: DataFrame with columns ``user, window_start_ms, window_end_ms, count``.
            stats: The batch's input and late counts (stored in the marker).

        Returns:
            True if the per-user table's batch was committed by this call.
        """
        from pyspark.sql import functions as F

        from onceflow.sinks.pg_datasource import write_frame

        maybe_crash(CrashPoint.BEFORE_SINK_WRITE, batch_id)
        with pg.session(self.dsn) as conn:
            replay = pg.has_marker(conn, self.sink_id, batch_id)
        metrics = json.dumps({"input_rows": stats.input_rows, "late_dropped": stats.late_dropped,
                              "late_watermark_ms": stats.late_watermark_ms})
        glob = deltas.groupBy("window_start_ms").agg(
            F.min("window_end_ms").alias("window_end_ms"), F.sum("count").alias("count"))
        for frame, table, sid, key in (
            (deltas, "user_counts", self.sink_id, "user,window_start_ms"),
            (glob, "global_counts", f"{self.sink_id}.global", "window_start_ms"),
        ):
            write_frame(frame, dsn=self.dsn, table=table, sink_id=sid, mode="upsert", key=key, add="count",
                        protocol=self.protocol, batch_id=batch_id, query_id=self.query_id, metrics=metrics)
        return not replay

    def commit_batch(self, batch_id: int, deltas: pa.Table, stats: BatchStats) -> bool:
        """Apply an Arrow delta table (made into a DataFrame, then :meth:`commit_frame`).

        Args:
            batch_id: Spark's micro-batch id.
            deltas: Columns ``user, window_start_ms, window_end_ms, count``.
            stats: The batch's input and late counts.

        Returns:
            True if this call committed the batch, False for a replay.
        """
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise ConfigError("PostgresWriterSink needs an active SparkSession")
        return self.commit_frame(batch_id, spark.createDataFrame(deltas), stats)

    def close(self) -> None:
        """Nothing to release (connections are per write)."""


def read_counts(dsn: str) -> tuple[dict[tuple[str, int], int], dict[int, int]]:
    """Read the Example 5-1 result tables.

    Args:
        dsn: Connection string.

    Returns:
        ``({(user, window_start_ms): count}, {window_start_ms: count})``; empty for a
        table that does not exist yet.
    """
    with pg.session(dsn) as conn:
        users: dict[tuple[str, int], int] = {}
        glob: dict[int, int] = {}
        if conn.execute("SELECT to_regclass('user_counts') IS NOT NULL").fetchone()[0]:
            users = {(u, int(w)): int(c) for u, w, c in conn.execute(
                'SELECT "user", window_start_ms, count FROM user_counts')}
        if conn.execute("SELECT to_regclass('global_counts') IS NOT NULL").fetchone()[0]:
            glob = {int(w): int(c) for w, c in conn.execute(
                "SELECT window_start_ms, count FROM global_counts")}
    return users, glob

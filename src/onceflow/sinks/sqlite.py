"""SQLite sink for Example 5-1 (the embedded default).

Every transaction is ``BEGIN IMMEDIATE`` … ``COMMIT`` with WAL journaling and
``synchronous=FULL``, so a committed transaction survives a SIGKILL or power loss.

Tables (the first two are a fixed interface other tools read):

* ``user_counts(user, window_start_ms, window_end_ms, count)``, key ``(user, window_start_ms)``,
  created ``WITHOUT ROWID`` (one B-tree instead of table + key index: upserts ~1.3x faster,
  ``benchmarks/bench_sqlite_sink.py``; readers see the same columns and key; a table an earlier
  version created with a rowid keeps working);
* ``global_counts(window_start_ms, window_end_ms, count)``, the sum of ``user_counts`` per window;
* ``onceflow_batches`` — one marker row per applied batch with its metrics;
* ``onceflow_staged`` — batches durably handed over but not yet applied (staged mode);
* ``onceflow_sinks`` — which checkpoint (query id) each sink id belongs to.

Staged commit protocol (the default; ``staged=False`` runs the protocol of
:mod:`onceflow.sinks.base` directly in the batch). Upserting ~20k rows takes ~0.1 s
of a ~2.5 s micro-batch; staging takes ~5 ms, so the batch returns to Spark after
the stage and the upserts run beside Spark's next batch. For batch N:

1. Crash point ``before_sink_write``. Wait for the apply of the previous batch (step 6);
   if it failed, apply every staged batch again (step 7), and if that fails too, raise —
   the query stops with the batch still staged, nothing is lost.
2. Transaction: if the marker ``(sink_id, N)`` exists, roll back and return False (a
   replay). Else insert (or replace) the staged row ``(sink_id, N)``: the deltas as
   compressed Arrow IPC and the batch's stats. Crash point ``inside_sink_txn``.
3. Commit durably. Crash point ``after_sink_commit`` (fault ``ambiguous_commit``):
   Spark has not written ``commits/N``; a restart applies the staged N (step 7) and
   Spark's re-run of N stops at step 2's marker.
4. Hand N to the applier thread and return True; Spark writes ``commits/N``.
5. Crash point ``apply_pending``: Spark has committed N, the apply has not run (the
   applier holds N back; the next batch or :meth:`SQLiteSink.flush` dies). Only the
   staged row has N's deltas; step 7 applies it after the restart.
6. Apply, one transaction: if the marker exists, only delete the staged row; else add
   the deltas to ``user_counts`` and ``global_counts``, insert the marker, delete the
   staged row; commit. A crash inside leaves the staged row for step 7.
7. Recovery (in :meth:`SQLiteSink.bind`, before the first batch of a process, and in
   step 1 after a failed apply): apply every staged row of this sink in batch order.

Invariant: Spark's ``commits/N`` is written only after N is staged or applied, and a
batch's deltas reach the tables only in the transaction that writes its marker; so a
batch Spark will not re-run is applied exactly once, and a batch it re-runs is skipped.
:meth:`SQLiteSink.flush` (called at the end of a run and by ``close``) waits until every
accepted batch is in the tables.
"""

from __future__ import annotations

import sqlite3
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Literal

import pyarrow as pa

from onceflow.errors import CheckpointMismatchError, ConfigError, SinkApplyError
from onceflow.faults import CrashPoint, armed_for, maybe_crash
from onceflow.sinks.base import DELTA_COLUMNS, BatchStats, ExactlyOnceSink

COUNTS_SCHEMA = """
CREATE TABLE IF NOT EXISTS user_counts(
    user TEXT, window_start_ms INTEGER, window_end_ms INTEGER, count INTEGER,
    PRIMARY KEY(user, window_start_ms)) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS global_counts(
    window_start_ms INTEGER PRIMARY KEY, window_end_ms INTEGER, count INTEGER);
"""
"""Example 5-1's tables."""

META_SCHEMA = """
CREATE TABLE IF NOT EXISTS onceflow_sinks(
    sink_id TEXT PRIMARY KEY, query_id TEXT NOT NULL, bound_ms INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS onceflow_batches(
    sink_id TEXT NOT NULL, batch_id INTEGER NOT NULL, committed_ms INTEGER NOT NULL,
    input_rows INTEGER NOT NULL, late_dropped INTEGER NOT NULL,
    duplicates_dropped INTEGER NOT NULL, events_counted INTEGER NOT NULL,
    rows_written INTEGER NOT NULL, late_watermark_ms INTEGER NOT NULL,
    PRIMARY KEY(sink_id, batch_id));
CREATE TABLE IF NOT EXISTS onceflow_staged(
    sink_id TEXT NOT NULL, batch_id INTEGER NOT NULL, staged_ms INTEGER NOT NULL,
    input_rows INTEGER NOT NULL, late_dropped INTEGER NOT NULL,
    late_watermark_ms INTEGER NOT NULL, deltas BLOB NOT NULL,
    PRIMARY KEY(sink_id, batch_id));
"""
"""onceflow's own tables (every SQLite sink)."""

SCHEMA = COUNTS_SCHEMA + META_SCHEMA

_UPSERT_USER = (
    "INSERT INTO user_counts(user, window_start_ms, window_end_ms, count) VALUES (?,?,?,?) "
    "ON CONFLICT(user, window_start_ms) DO UPDATE SET count = count + excluded.count"
)
_UPSERT_GLOBAL = (
    "INSERT INTO global_counts(window_start_ms, window_end_ms, count) VALUES (?,?,?) "
    "ON CONFLICT(window_start_ms) DO UPDATE SET count = count + excluded.count"
)

_INSERT_MARKER = "INSERT OR REPLACE INTO onceflow_batches VALUES (?,?,?,?,?,?,?,?,?)"
_HAS_MARKER = "SELECT 1 FROM onceflow_batches WHERE sink_id = ? AND batch_id = ?"
_STAGE = "INSERT OR REPLACE INTO onceflow_staged VALUES (?,?,?,?,?,?,?)"
_UNSTAGE = "DELETE FROM onceflow_staged WHERE sink_id = ? AND batch_id = ?"

CACHE_KIB = 65_536
"""Page cache per connection (64 MiB): the counts of a long run stay in memory (the
default 2 MiB made every batch re-read ``user_counts`` pages: upserts ~1.3x slower)."""

Mode = Literal["exactly_once", "naive", "lossy"]


def connect(path: str | Path, schema: str = SCHEMA) -> sqlite3.Connection:
    """Open a SQLite database with onceflow's durability settings and schema.

    Args:
        path: Database file (created if missing).
        schema: DDL run on open (Example 5-1's tables and onceflow's, by default).

    Returns:
        A connection in autocommit mode (transactions are explicit).
    """
    conn = sqlite3.connect(str(path), timeout=60, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
    conn.executescript(schema)
    return conn


def check_sink_args(mode: str, sink_id: str) -> None:
    """Validate the mode and sink id every SQLite sink takes.

    Raises:
        ConfigError: An unknown mode or an empty sink id.
    """
    if mode not in ("exactly_once", "naive", "lossy"):
        raise ConfigError(f"mode must be 'exactly_once', 'naive' or 'lossy', got {mode!r}")
    if not sink_id:
        raise ConfigError("sink_id must be a non-empty string")


def bind_query(conn: sqlite3.Connection, path: Path, sink_id: str, query_id: str) -> None:
    """Record (or check) which checkpoint a sink id of this database belongs to.

    Raises:
        CheckpointMismatchError: The sink id belongs to another checkpoint.
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        row = conn.execute("SELECT query_id FROM onceflow_sinks WHERE sink_id = ?", (sink_id,)).fetchone()
        if row is None:
            conn.execute("INSERT INTO onceflow_sinks VALUES (?,?,?)",
                         (sink_id, query_id, int(time.time() * 1000)))
        elif row[0] != query_id:
            raise CheckpointMismatchError(
                f"database {path} holds sink {sink_id!r} of the checkpoint with "
                f"query id {row[0]}, but this run's checkpoint has query id {query_id}. "
                "A new checkpoint restarts batch ids at 0, so continuing would skip or "
                "double-count data. Run with the original checkpoint, or start a new "
                "database (or a different sink id) for the new checkpoint."
            )
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # SQLite has rolled back by itself after a full disk
            conn.execute("ROLLBACK")
        raise


def _to_ipc(deltas: pa.Table) -> bytes:
    """The deltas as an LZ4-compressed Arrow IPC stream (~1 ms and ~340 kB for 20k rows)."""
    out = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    with pa.ipc.new_stream(out, deltas.schema, options=options) as writer:
        writer.write_table(deltas)
    return bytes(out.getvalue())


def _from_ipc(blob: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(blob)).read_all()


class SQLiteSink(ExactlyOnceSink):
    """Example 5-1 counts in SQLite, each micro-batch exactly once.

    Args:
        path: Database file.
        sink_id: Marker namespace for this sink.
        mode: ``"exactly_once"`` (the protocol) or ``"naive"`` — the
            at-least-once sink people write by hand: no marker check, so a
            replayed batch is added twice; or ``"lossy"`` — the marker is committed in
            its own transaction *before* the rows, so a crash in between loses the
            batch. Both exist as negative controls for tests and the auditor; never use
            them for real data.
        staged: Run the staged protocol of this module (exactly-once mode only): a batch
            is made durable in ~5 ms and applied beside Spark's next batch. False applies
            it inside the batch (the protocol of :mod:`onceflow.sinks.base`).
    """

    def __init__(self, path: str | Path, sink_id: str = "user_counts",
                 mode: Mode = "exactly_once", staged: bool = True):
        check_sink_args(mode, sink_id)
        self.path = Path(path)
        self.sink_id = sink_id
        self.mode: Mode = mode
        self.staged = staged and mode == "exactly_once"
        self._conn: sqlite3.Connection | None = None
        self._applier: ThreadPoolExecutor | None = None
        self._pending: tuple[int, Future[bool]] | None = None
        self._held: int | None = None  # a batch the ``apply_pending`` crash point holds back

    @property
    def conn(self) -> sqlite3.Connection:
        """The open connection (opened on first use)."""
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = connect(self.path)
        return self._conn

    def bind(self, query_id: str) -> None:
        """Tie the sink to a checkpoint, then apply what an earlier process staged.

        See :meth:`ExactlyOnceSink.bind`; the staged batches are applied by step 7.

        Args:
            query_id: The checkpoint's query id.

        Raises:
            CheckpointMismatchError: The database belongs to another checkpoint.
        """
        bind_query(self.conn, self.path, self.sink_id, query_id)
        self.flush()
        self.apply_staged()

    def commit_batch(self, batch_id: int, deltas: pa.Table, stats: BatchStats) -> bool:
        """Accept batch ``batch_id`` exactly once.

        Staged steps 1-4 of this module, or steps 2-7 of :mod:`onceflow.sinks.base` when
        not staged.

        Args:
            batch_id: Spark's micro-batch id.
            deltas: Columns ``user, window_start_ms, window_end_ms, count``.
            stats: The batch's input and late counts.

        Returns:
            True if this call committed (staged) the batch, False for a replay.

        Raises:
            SinkApplyError: The previous batch could not be applied (it stays staged).
        """
        maybe_crash(CrashPoint.BEFORE_SINK_WRITE, batch_id)  # 1
        if not self.staged:
            return self._apply(batch_id, deltas, stats, staged=False)
        self.flush()
        blob = _to_ipc(deltas)
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")  # 2
        try:
            if conn.execute(_HAS_MARKER, (self.sink_id, batch_id)).fetchone() is not None:
                conn.execute("ROLLBACK")
                return False
            conn.execute(_STAGE, (self.sink_id, batch_id, int(time.time() * 1000),
                                  stats.input_rows, stats.late_dropped,
                                  stats.late_watermark_ms, blob))
            maybe_crash(CrashPoint.INSIDE_SINK_TXN, batch_id)
            conn.execute("COMMIT")  # 3
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        maybe_crash(CrashPoint.AFTER_SINK_COMMIT, batch_id)
        maybe_crash(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        if armed_for(CrashPoint.APPLY_PENDING, batch_id):  # 5
            self._held = batch_id
            return True
        if self._applier is None:
            self._applier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-apply")
        self._pending = (batch_id, self._applier.submit(  # 4, 6
            self._apply, batch_id, deltas, stats, True))
        return True

    def flush(self) -> None:
        """Wait until every accepted batch is in the tables (staged step 1).

        Raises:
            SinkApplyError: A staged batch could not be applied, also on a second try;
                it stays staged and a restart applies it.
        """
        if self._held is not None:
            maybe_crash(CrashPoint.APPLY_PENDING, self._held)  # armed: does not return
            self._held = None
            self.apply_staged()
        pending, self._pending = self._pending, None
        if pending is None:
            return
        batch_id, future = pending
        try:
            future.result()
        except Exception as exc:
            try:  # a transient failure (e.g. a lock held past the timeout) heals here
                self.apply_staged()
            except Exception as again:
                raise SinkApplyError(
                    f"batch {batch_id} of sink {self.sink_id!r} is safely staged in "
                    f"{self.path} (table onceflow_staged) but could not be added to the "
                    f"counts: {again}. Fix the cause and restart with the same checkpoint "
                    "and database: the restart applies it."
                ) from exc

    def apply_staged(self) -> int:
        """Apply every staged batch of this sink in batch order (staged step 7).

        Returns:
            How many staged batches were found.
        """
        rows = self.conn.execute(
            "SELECT batch_id, input_rows, late_dropped, late_watermark_ms, deltas "
            "FROM onceflow_staged WHERE sink_id = ? ORDER BY batch_id", (self.sink_id,)
        ).fetchall()
        for batch_id, input_rows, late, watermark, blob in rows:
            self._apply(batch_id, _from_ipc(blob), BatchStats(input_rows, late, watermark),
                        staged=True)
        return len(rows)

    def _apply(self, batch_id: int, deltas: pa.Table, stats: BatchStats, staged: bool) -> bool:
        """Add one batch's deltas and its marker in one transaction.

        Staged step 6, or steps 3-7 of :mod:`onceflow.sinks.base` when not staged.

        Returns:
            True if this call added the batch, False if its marker was there.
        """
        # Key order: neighbouring upserts touch the same B-tree pages (~15% faster, measured).
        ordered = deltas.sort_by([("user", "ascending"), ("window_start_ms", "ascending")])
        user_rows = list(zip(*(ordered.column(c).to_pylist() for c in DELTA_COLUMNS), strict=True))
        windows = deltas.group_by(["window_start_ms", "window_end_ms"]).aggregate(
            [("count", "sum")])
        window_rows = list(zip(*(windows.column(c).to_pylist() for c in
                                 ("window_start_ms", "window_end_ms", "count_sum")), strict=True))
        counted = sum(r[2] for r in window_rows)
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        try:
            if self.mode != "naive":
                if conn.execute(_HAS_MARKER, (self.sink_id, batch_id)).fetchone() is not None:
                    if staged:  # applied before a crash that left the staged row behind
                        conn.execute(_UNSTAGE, (self.sink_id, batch_id))
                    conn.execute("COMMIT")
                    return False
            marker = (
                self.sink_id, batch_id, int(time.time() * 1000), stats.input_rows,
                stats.late_dropped, stats.input_rows - stats.late_dropped - counted, counted,
                len(user_rows), stats.late_watermark_ms,
            )
            if self.mode == "lossy":  # the bug this mode demonstrates: marker first, own txn
                conn.execute(_INSERT_MARKER, marker)
                conn.execute("COMMIT")
                conn.execute("BEGIN IMMEDIATE")
            conn.executemany(_UPSERT_USER, user_rows)
            conn.executemany(_UPSERT_GLOBAL, window_rows)
            if self.mode != "lossy":
                conn.execute(_INSERT_MARKER, marker)
            if staged:
                conn.execute(_UNSTAGE, (self.sink_id, batch_id))
            else:
                maybe_crash(CrashPoint.INSIDE_SINK_TXN, batch_id)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if not staged:
            maybe_crash(CrashPoint.AFTER_SINK_COMMIT, batch_id)
            maybe_crash(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return True

    def close(self) -> None:
        """Apply what is pending, then close the connection (idempotent).

        Raises:
            SinkApplyError: See :meth:`flush`; the connection is closed anyway.
        """
        try:
            if self._conn is not None:
                self.flush()
        finally:
            if self._applier is not None:
                self._applier.shutdown(wait=True)
                self._applier = None
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def read_counts(path: str | Path) -> tuple[dict[tuple[str, int], int], dict[int, int]]:
    """Read the result tables of a SQLite sink.

    Args:
        path: Database file.

    Returns:
        ``({(user, window_start_ms): count}, {window_start_ms: count})``; empty for a
        database that does not exist yet.
    """
    if not Path(path).exists():
        return {}, {}
    conn = sqlite3.connect(str(path))
    try:
        users = {
            (u, w): c
            for u, w, c in conn.execute("SELECT user, window_start_ms, count FROM user_counts")
        }
        glob = dict(conn.execute("SELECT window_start_ms, count FROM global_counts").fetchall())
    finally:
        conn.close()
    return users, glob


def read_batches(path: str | Path, sink_id: str = "user_counts") -> list[dict[str, int]]:
    """Read the per-batch markers and metrics of one sink.

    Args:
        path: Database file.
        sink_id: The sink.

    Returns:
        One dict per committed batch, in batch order; none for a missing database.
    """
    if not Path(path).exists():
        return []
    conn = sqlite3.connect(str(path))
    conn.row_factory = sqlite3.Row
    try:
        rows = conn.execute(
            "SELECT * FROM onceflow_batches WHERE sink_id = ? ORDER BY batch_id", (sink_id,)
        ).fetchall()
    finally:
        conn.close()
    return [dict(r) for r in rows]


def read_staged(path: str | Path, sink_id: str = "user_counts") -> list[int]:
    """Batch ids of one sink that are staged but not yet applied (the staged protocol).

    Args:
        path: Database file.
        sink_id: The sink.

    Returns:
        Batch ids in order; none for a missing database.
    """
    if not Path(path).exists():
        return []
    conn = sqlite3.connect(str(path))
    try:
        return [r[0] for r in conn.execute(
            "SELECT batch_id FROM onceflow_staged WHERE sink_id = ? ORDER BY batch_id", (sink_id,))]
    finally:
        conn.close()

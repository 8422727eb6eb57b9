"""The generic SQLite sink: DataFrames of any schema into tables, each micro-batch exactly once.

Every table of a batch and the batch's marker commit in one SQLite transaction
(``BEGIN IMMEDIATE`` ... ``COMMIT``, WAL, ``synchronous=FULL``). A batch takes one of two
paths through :meth:`SQLiteTablesSink.commit_tables`.

**Direct** — the batch is written inside Spark's batch. Taken when a table is new, is a table
of the user's own (its definition is not exactly the one onceflow creates, or it has triggers or
indexes of its own: its constraints can refuse rows), is ``append`` with a key (a key of an
earlier batch would conflict), or the sink was made with ``staged=False``. For batch N:

1. Crash point ``before_sink_write``. Every table's rows are checked against its spec
   (:func:`onceflow.sinks._core.checks.check_batch`) and against what SQLite stores as given
   (:func:`onceflow.sinks.sqlite.values.check_values`: no NaN, no ``-0.0``, no decimal a double
   does not hold); a batch that does not fit raises :class:`onceflow.errors.BatchRejectedError`
   here — nothing is written and Spark does not write ``commits/N``. May run any number of times.
2. Open the transaction. If the marker ``(sink_id, N)`` exists, roll back and return False:
   an earlier attempt committed N (a replay after a crash is a no-op).
3. Create missing tables from the batch's schema (key = primary key); an existing table that
   lacks a column of the batch, has another key, or declares a column of another type is
   refused (:class:`ConfigError`) before any row is written; an integer ``add`` column whose
   sum would leave 64 bits is refused naming the key
   (:class:`onceflow.sinks.sqlite.values.AddBounds`). Write each table by its mode
   (``append``: insert; ``upsert``: insert or replace the non-key columns; ``add``: insert or
   add the ``add`` columns), in key order.
   A constraint the rows break (e.g. a ``NOT NULL`` or ``CHECK`` of the user's own table)
   rolls everything back and raises :class:`BatchRejectedError` naming the table.
4. Insert the marker with the batch's metrics. Crash point ``inside_sink_txn``: nothing is
   visible until the commit.
5. Commit durably. Crash point ``after_sink_commit`` (and the ``ambiguous_commit`` fault):
   Spark has not written ``commits/N``; it re-runs N after a restart and step 2 skips it.
6. Return True; Spark writes ``commits/N``.

**Staged** — every other batch (the usual case once onceflow created the tables): the batch is
made durable in one small write and applied beside Spark's next batch, off its critical path.

S1. Crash point ``before_sink_write``; the checks of step 1. Wait for the apply of the previous
    batch (S5); if it failed, apply every staged batch again (S6), and if that fails too raise
    :class:`onceflow.errors.SinkApplyError` — the query stops before ``commits/N``, the earlier
    batch stays staged, nothing is lost.
S2. Proof that the batch will apply: every table exists exactly as onceflow creates it for this
    spec and these columns (same ``CREATE TABLE`` text), with no trigger and no index but its
    primary key, and is not ``append`` with a key, and no integer ``add`` column can leave 64
    bits (the bounds of :class:`onceflow.sinks.sqlite.values.AddBounds`). Its only constraint is
    then the primary key, which S1 proved non-null and unique within the batch, and upsert/add
    cannot conflict with earlier rows; SQLite's columns take any value of their type. Else: the
    direct path.
S3. Transaction: if the marker or a staged row ``(sink_id, N)`` exists, roll back, apply what
    is staged (S6) and return False (a replay). Else insert the staged row: the tables as
    LZ4-compressed Arrow IPC with their specs and the batch's metrics. Crash point
    ``inside_sink_txn``. Commit durably. Crash point ``after_sink_commit`` (fault
    ``ambiguous_commit``): Spark has not written ``commits/N``; the restart applies the staged
    N (S6) and Spark's re-run of N stops at S3.
S4. Hand N to the applier thread and return True; Spark writes ``commits/N``. Crash point
    ``apply_pending``: Spark committed N and the apply has not run (the applier holds N back;
    the next batch or :meth:`SQLiteTablesSink.flush` dies). Only the staged row has N's rows;
    S6 applies them after the restart.
S5. Apply, one transaction: if the marker exists, only delete the staged row; else write the
    tables as step 3 does, insert the marker, delete the staged row; commit. A crash inside
    leaves the staged row for S6.
S6. Recovery (in :meth:`SQLiteTablesSink.bind`, before the first batch of a process, and in S1
    after a failed apply): apply every staged row of this sink, in batch order.

Invariant: Spark writes ``commits/N`` only after N is staged or applied, and a batch's rows
reach the tables only in the transaction that writes its marker; so a batch Spark will not
re-run is applied exactly once, and a batch it re-runs is skipped. While a query runs, its
tables may be one batch behind Spark's commit log; :meth:`SQLiteTablesSink.flush` (called when
a :class:`onceflow.OnceQuery` ends, and by ``close``) waits until every accepted batch is in them.
What can still stop an apply is the machine (a full disk, a lock held past 60 s) or someone
changing a table between S2 and S5: the batch then stays staged and a restart applies it.

**Tasks** — a batch whose input has ``collect_below`` rows or more (a backlog), given as
DataFrames (:meth:`SQLiteTablesSink.commit_frames`; :func:`onceflow.write_stream` decides by the
input's rows before the batch runs): the driver never holds the batch, the tasks convert it.

T1. Crash point ``before_sink_write``. Spark checks the keys (:func:`onceflow.sinks._core.checks.check_frame`:
    a missing column, a null key, a key twice) without collecting the rows. Wait for the apply of
    the previous batch (S1).
T2. If the marker ``(sink_id, N)`` exists, return False: a replay runs no task.
T3. Spark's tasks check and convert each table's rows and write them to scratch SQLite files
    beside the database (:mod:`onceflow.sinks.sqlite.tasks`, steps 1-2: a value SQLite would
    change fails the task naming it; of a retried or speculative task only the attempt Spark
    kept counts; crash point ``task_after_write`` kills a task's first attempt after its files; a
    long task completes a file every ``chunk_bytes`` and goes on in the next).
    Meanwhile the driver opens T4's transaction and copies each complete file of an ``append``
    or ``upsert`` table into it, a file read into memory removed once copied (:mod:`onceflow.sinks.
    sqlite.early`; kept in T4 only if every file copied is of an attempt Spark kept, with its rows;
    else rolled back, and T3 runs again without it where a kept file was removed).
T4. One transaction: if the marker exists, roll back and return False. Create or check the
    tables as step 3 does; open each file not copied in T3 (:class:`onceflow.sinks.sqlite.tasks.
    Scratches`: read into memory, or attached) and copy it with SQLite's
    ``INSERT ... SELECT`` (in key order; an integer ``add`` sum that could leave 64 bits checked
    exactly by a join first), its row count checked against its task's; a constraint the rows
    break rolls back and raises :class:`BatchRejectedError`. Insert the marker. Crash point
    ``inside_sink_txn``.
T5. Commit durably (the WAL; copying it into the database file, SQLite's checkpoint, runs in the
    apply thread beside Spark's next batch). Crash point ``after_sink_commit`` (and
    ``ambiguous_commit``); return True.
T6. Remove the attempt's scratch files, whatever happened (``bind`` removes a killed process's).

One table without a key may come uncached (``settle``, ``Sink.writes_uncached``): T3 is the batch's
only Spark job; the marker's numbers are settled from the files' rows before T4.

Types and the values refused: :mod:`onceflow.sinks.sqlite.values`; the marker: :mod:`~.sqlite.db`.
"""

from __future__ import annotations

import contextlib
import shutil
import sqlite3
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow import faults
from onceflow.errors import OnceflowError, SinkApplyError
from onceflow.sinks._core import marker
from onceflow.sinks._core.base import Settle, SinkBase, collected
from onceflow.sinks._core.checks import check_existing, check_frame, check_outputs, expected_columns
from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.sqlite import tasks
from onceflow.sinks.sqlite.db import (
    HAS_MARKER,
    bind_query,
    broken,
    check_sink_id,
    claim_tables,
    connect,
    decode_staged,
    encode_staged,
    only_own_tables,
)
from onceflow.sinks.sqlite.early import EarlyCopy, FilesGone
from onceflow.sinks.sqlite.values import (
    AddBounds,
    check_types,
    check_values,
    ddl,
    declared_types,
    insert_sql,
    quote,
    stored,
)

_MARKER = marker.insert_sql("?", verb="INSERT OR REPLACE")
_UNSTAGE = "DELETE FROM onceflow_staged WHERE sink_id = ? AND batch_id = ?"
AUTOCHECKPOINT_PAGES = 1000
"""SQLite's default ``wal_autocheckpoint``, restored after a large batch's commit (T5)."""


class SQLiteTablesSink(SinkBase):
    """Tables of any schema in one SQLite database (see the module protocol).

    Args:
        path: Database file (created with its directory if missing).
        sink_id: Marker namespace: two queries writing to one database need different ids.
        staged: Allow the staged path; False writes every batch on the direct path.
        collect_below: A batch with fewer rows (all tables) is collected to the driver as Arrow;
            a larger one is converted and written to scratch files by Spark's tasks and copied
            into the tables by SQLite (the tasks path, :mod:`onceflow.sinks.sqlite.tasks`).
    """

    all_or_nothing = True
    """Every table of a batch commits in one transaction."""
    writes_uncached = True
    copies_early = True
    """T3 copies complete scratch files while later tasks run (:mod:`onceflow.sinks.sqlite.early`)."""

    def __init__(self, path: str | Path, sink_id: str = "default", staged: bool = True,
                 collect_below: int = 100_000) -> None:
        check_sink_id(sink_id)
        self.path = Path(path)
        self.sink_id = sink_id
        self.staged = staged
        self.collect_below = collect_below
        self._conn: sqlite3.Connection | None = None
        self._checked: dict[str, tuple[Table, tuple[str, ...]]] = {}
        self._applier: ThreadPoolExecutor | None = None
        self._pending: tuple[int, Future[bool]] | None = None
        self._held: int | None = None  # a batch the ``apply_pending`` crash point holds back
        self._bounds = AddBounds()

    def __repr__(self) -> str:
        return f"onceflow.sqlite({str(self.path)!r}, sink_id={self.sink_id!r})"

    def repair_options(self) -> str:
        """``--db PATH --sink-id ID``."""
        return f"--db {self.path} --sink-id {self.sink_id}"

    @property
    def conn(self) -> sqlite3.Connection:
        """The open connection (opened on first use; the applier thread uses it between batches)."""
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = connect(self.path)
        return self._conn

    def bind(self, query_id: str) -> None:
        """Tie the sink to the checkpoint with ``query_id`` (idempotent), then apply what is staged (S6).

        Raises:
            CheckpointMismatchError: The database holds this sink id for another checkpoint.
            SinkApplyError: A staged batch cannot be applied (it stays staged).
        """
        self.flush()
        bind_query(self.conn, self.path, self.sink_id, query_id)
        self._recover()
        shutil.rmtree(tasks.stage_root(self.path, self.sink_id), ignore_errors=True)  # a dead process's files

    def _fit(self, name: str, spec: Table, schema: pa.Schema) -> None:
        """Step 3's table check: create the table, or check that an existing one fits.

        Runs inside the batch's transaction (a table it creates exists only if the batch
        commits); :meth:`_apply` remembers the tables that fit once it committed.
        """
        cols = tuple(schema.names)
        if self._checked.get(name) == (spec, cols):
            return
        info = self.conn.execute(f"PRAGMA table_info({quote(name)})").fetchall()
        if not info:
            self.conn.execute(ddl(name, spec, schema))
            return
        self._fits(name, spec, cols, info, schema)

    def _fits(self, name: str, spec: Table, cols: Sequence[str], info: list[Any],
              schema: pa.Schema | None) -> None:
        """An existing table (its ``PRAGMA table_info``) has the columns, the key and the types."""
        pk = [r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5])]
        check_existing(str(self.path), name, spec, cols, [r[1] for r in info], pk)
        if schema is not None:
            check_types(str(self.path), name, schema, declared_types(info))

    def check(self, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:
        """Open the database; check the tables that exist; claim them (:mod:`onceflow.sinks._core.owners`)."""
        for name, spec in specs.items():
            info = self.conn.execute(f"PRAGMA table_info({quote(name)})").fetchall()
            if info:
                self._fits(name, spec, expected_columns(name, spec, schemas), info, schemas.get(name))
        claim_tables(self.conn, str(self.path), self.sink_id, specs, f"--db {self.path}")

    def _appliable(self, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table]) -> bool:
        """Step S2: whether every table is onceflow's own, so that writing the batch cannot fail."""
        return self.staged and bool(outputs) and only_own_tables(self.conn, outputs, specs, self._bounds)

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Accept batch ``batch_id`` unless it was already committed (steps 1 and S1-S4).

        May be called again with the same arguments (after a crash); only the first call
        that commits (or stages) has an effect.

        Args:
            batch_id: Spark's micro-batch id.
            outputs: Table name -> the batch's rows for it.
            specs: Table name -> its spec (every output needs one).
            stats: The batch's input rows and late drops.
            rows_out: Rows of the batch's DataFrame (after deduplication and late drops).

        Returns:
            True if this call committed or staged the batch, False for a replay.

        Raises:
            BatchRejectedError: The rows do not fit the specs or the tables (nothing written).
            ConfigError: An existing table does not fit (nothing written).
            SinkApplyError: The previous batch could not be applied (it stays staged).
        """
        faults.reached(faults.CrashPoint.BEFORE_SINK_WRITE, batch_id)  # 1, S1
        check_outputs(outputs, specs)
        for name, rows in outputs.items():
            check_values(name, specs[name], rows)
        self.flush()
        if not self._appliable(outputs, specs):  # S2
            return self._apply(batch_id, outputs, specs, stats, rows_out, staged=False)
        meta, data = encode_staged(outputs, specs, stats, rows_out)
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")  # S3
        try:
            done = conn.execute(HAS_MARKER, (self.sink_id, batch_id)).fetchone() or conn.execute(
                "SELECT 1 FROM onceflow_staged WHERE sink_id = ? AND batch_id = ?",
                (self.sink_id, batch_id)).fetchone()
            if done:
                conn.execute("ROLLBACK")
                self.apply_staged()
                return False
            conn.execute("INSERT INTO onceflow_staged VALUES (?,?,?,?,?)",
                         (self.sink_id, batch_id, int(time.time() * 1000), meta, data))
            faults.reached(faults.CrashPoint.INSIDE_SINK_TXN, batch_id)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        self._accepted(outputs, specs)
        faults.reached(faults.CrashPoint.AFTER_SINK_COMMIT, batch_id)
        faults.reached(faults.CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        if faults.armed_for(faults.CrashPoint.APPLY_PENDING, batch_id):  # S4
            self._held = batch_id
            return True
        self._pending = (batch_id, self._apply_thread().submit(  # S5
            self._apply, batch_id, outputs, specs, stats, rows_out, True))
        return True

    def _apply_thread(self) -> ThreadPoolExecutor:
        """The thread that applies staged batches (S5) and checkpoints after a large one (T5)."""
        if self._applier is None:
            self._applier = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-apply")
        return self._applier

    def _checkpoint(self) -> bool:
        """After T5, beside Spark's next batch: copy the large commit's WAL into the database file.

        The commit is durable without it (the WAL is); a checkpoint that cannot run now (a reader
        holds the WAL) runs at a later commit.
        """
        self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        return True

    def _apply(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
               stats: BatchStats, rows_out: int, staged: bool) -> bool:
        """Write one batch's tables and its marker in one transaction (steps 2-6, or S5).

        Returns:
            True if this call wrote the batch, False if its marker was there.
        """
        prepared = []
        for name, rows in outputs.items():
            spec = specs[name]
            if spec.key:  # key order: neighbouring rows touch the same B-tree pages
                rows = rows.sort_by([(k, "ascending") for k in spec.key])
            values = list(zip(*(stored(rows.column(c)) for c in rows.column_names), strict=True))
            prepared.append((name, spec, rows.schema, values))
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")  # 2
        try:
            if self._committed(batch_id):
                if staged:  # applied before a crash that left the staged row behind
                    conn.execute(_UNSTAGE, (self.sink_id, batch_id))
                    conn.execute("COMMIT")
                else:
                    conn.execute("ROLLBACK")
                return False
            self._before_rows(batch_id, stats, rows_out, {n: len(v) for n, _, _, v in prepared})
            written = {}
            for name, spec, schema, values in prepared:  # 3
                self._fit(name, spec, schema)
                if not staged:
                    self._bounds.check(conn, str(self.path), name, spec, outputs[name])
                try:
                    conn.executemany(insert_sql(name, spec, schema.names), values)
                except sqlite3.IntegrityError as exc:
                    raise broken(name, exc) from None
                written[name] = len(values)
            self._marker(batch_id, stats, rows_out, written)  # 4
            if staged:
                conn.execute(_UNSTAGE, (self.sink_id, batch_id))
            else:
                faults.reached(faults.CrashPoint.INSIDE_SINK_TXN, batch_id)
            conn.execute("COMMIT")  # 5
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        for name, spec, schema, _ in prepared:
            self._checked[name] = (spec, tuple(schema.names))
        if not staged:
            self._accepted(outputs, specs)
            faults.reached(faults.CrashPoint.AFTER_SINK_COMMIT, batch_id)
            faults.reached(faults.CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return True  # 6

    def commit_frames(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int, written: Mapping[str, int] | None = None,
                      settle: Settle | None = None) -> bool:
        """Accept batch ``batch_id`` given as DataFrames (the tasks path, T1-T6).

        A batch under ``collect_below`` rows (or :func:`onceflow.sinks.sqlite.tasks.too_many_tables`)
        is collected and goes through :meth:`commit_tables`. With ``settle``, one table's frame
        that is not cached: its rows are counted from the scratch files, and the batch's numbers
        settled before T4.

        Raises:
            BatchRejectedError: The rows do not fit the specs or the tables (nothing written).
            ConfigError: An existing table does not fit (nothing written).
            SinkApplyError: The previous batch could not be applied (it stays staged).
        """
        from onceflow.sinks._core.checks import arrow_schema

        counts = None if settle is not None else self._counted(batch_id, frames, specs, written)  # T1
        if counts is None:  # written once, by the tasks: nothing counts or reads it before
            self._check_start(batch_id, frames, specs)
        elif sum(counts.values()) < self.collect_below or tasks.too_many_tables(len(frames)):
            return self.commit_tables(batch_id, collected(frames), specs, stats, rows_out)
        for name, frame in frames.items():
            check_frame(name, specs[name], frame)
        self.flush()
        if self._committed(batch_id):  # T2, before the tasks run (checked again in T4's transaction)
            return False
        for copies_early in (self.copies_early, False):  # the second: T3 again after FilesGone in T4
            token, found, each = uuid.uuid4().hex[:12], {}, tasks.tasks_per_table(len(frames))
            stage = tasks.TaskSpec(str(self.path), "", self.sink_id, batch_id, token)
            early = EarlyCopy(self, batch_id, stage.folder(batch_id)) if copies_early else None
            try:
                for name, frame in frames.items():  # T3
                    spec = tasks.TaskSpec(str(self.path), name, self.sink_id, batch_id, token,
                                          specs[name].describe())
                    schema = arrow_schema(frame.schema)
                    with early.watching(name, specs[name], schema) if early else contextlib.nullcontext():
                        files = tasks.run(frame, spec, each) if counts is None or counts[name] else []
                    found[name] = (schema, files)
                return self.apply_files(batch_id, found, specs, stats, rows_out, settle=settle, early=early)
            except FilesGone:
                continue
            finally:
                if early is not None:
                    early.close()
                tasks.discard(stage, batch_id)  # T6
        raise AssertionError("unreachable: T3-T4 without an early copy never raise FilesGone")

    def apply_files(self, batch_id: int, found: Mapping[str, tuple[pa.Schema, list[dict[str, Any]]]],
                    specs: Mapping[str, Table], stats: BatchStats, rows_out: int,
                    check_keys: bool = False, settle: Settle | None = None,
                    early: EarlyCopy | None = None) -> bool:
        """T4-T5: the tasks' scratch files of every table and the marker, in one transaction.

        Args:
            batch_id: The micro-batch.
            found: Table name -> (its columns, the files its tasks wrote: their messages).
            specs: Table name -> its spec.
            stats: The batch's input rows and late drops.
            rows_out: Rows of the batch's DataFrame.
            check_keys: Look for a key twice in the files (T1 did not: the format on its own).
            settle: The batch's numbers from the files' rows (``stats`` and ``rows_out`` are
                placeholders then).
            early: What T3 copied already (:mod:`onceflow.sinks.sqlite.early`): kept if right; T4
                opens the rest of the files as it did (its ``scratches``).

        Returns:
            True if this call wrote the batch, False if its marker was there.
        """
        conn = self.conn
        counts = {n: sum(int(f["rows"]) for f in files) for n, (_, files) in found.items()}
        extents = {n: tasks.folded(files) for n, (_, files) in found.items()}
        if settle is not None:
            stats, rows_out = settle(counts)
        copied = early.hand_over(found) if early is not None else set()
        scratches = early.scratches if early is not None else tasks.Scratches(conn)
        conn.execute("PRAGMA wal_autocheckpoint=0")  # the commit's checkpoint: after T5, off the batch's path
        if not conn.in_transaction:
            conn.execute("BEGIN IMMEDIATE")  # T4 (or begun in T3 by the early copy)
        try:
            if self._committed(batch_id):
                conn.execute("ROLLBACK")
                return False
            self._before_rows(batch_id, stats, rows_out, counts)
            for name, (schema, files) in found.items():
                spec = specs[name]
                self._fit(name, spec, schema)
                for f in [left for left in files if left["path"] not in copied]:
                    alias = scratches.open(f["path"])
                    if check_keys and spec.key:
                        scratches.check_keys(name, spec, alias)
                    self._copy(batch_id, name, spec, list(schema.names), f, extents[name], alias)
            self._marker(batch_id, stats, rows_out, counts)
            faults.reached(faults.CrashPoint.INSIDE_SINK_TXN, batch_id)
            conn.execute("COMMIT")  # T5
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        finally:
            scratches.close()
            conn.execute(f"PRAGMA wal_autocheckpoint={AUTOCHECKPOINT_PAGES}")
        for name, (schema, _) in found.items():
            self._checked[name] = (specs[name], tuple(schema.names))
            self._bounds.widen(name, extents[name])
        self._pending = (batch_id, self._apply_thread().submit(self._checkpoint))
        faults.reached(faults.CrashPoint.AFTER_SINK_COMMIT, batch_id)
        faults.reached(faults.CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return True

    def _copy(self, batch_id: int, name: str, spec: Table, columns: list[str], f: Mapping[str, Any],
              extents: Mapping[str, tuple[int, int]], alias: str) -> int:
        """T4 for one scratch file ``f`` (attached as ``alias``): checked, copied by SQLite, counted.

        ``extents`` are the table's integer ``add`` columns' lowest and highest values over all its
        files. Returns the rows copied (checked against ``f["rows"]`` unless that is None).
        """
        conn = self.conn
        self._bounds.check_attached(conn, str(self.path), name, spec, extents, alias)
        try:
            table_columns = [r[1] for r in conn.execute(f"PRAGMA main.table_info({quote(name)})")]
            cur = conn.execute(tasks.insert_select(name, spec, columns, alias, table_columns))
        except sqlite3.IntegrityError as exc:
            raise broken(name, exc) from None
        if f["rows"] is not None and cur.rowcount != f["rows"]:
            raise OnceflowError(f"batch {batch_id}: scratch file {f['path']} of table {name!r} gave "
                                f"{cur.rowcount} rows, its task wrote {f['rows']}; the batch runs again")
        return int(cur.rowcount)

    def _accepted(self, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table]) -> None:
        """Widen the ``add`` columns' bounds by a batch committed or staged (once per batch)."""
        for name, rows in outputs.items():
            self._bounds.accepted(name, specs[name], rows)

    def _committed(self, batch_id: int) -> bool:
        """Step 2's check: whether the marker of ``batch_id`` is there (inside the transaction, and T2)."""
        return self.conn.execute(HAS_MARKER, (self.sink_id, batch_id)).fetchone() is not None

    def _before_rows(self, batch_id: int, stats: BatchStats, rows_out: int, counts: dict[str, int]) -> None:
        """Between steps 2 and 3, inside the transaction: nothing here (a hook for test variants)."""

    def _marker(self, batch_id: int, stats: BatchStats, rows_out: int, written: dict[str, int]) -> None:
        self.conn.execute(_MARKER, marker.marker_row(self.sink_id, batch_id, stats, rows_out, written))
        for sql, values in marker.amendments("?", self.sink_id, stats):  # the batch before's, on Connect
            self.conn.execute(sql, values)

    def apply_staged(self) -> int:
        """Apply every staged batch of this sink in batch order (S6).

        Returns:
            How many staged batches were found.
        """
        rows = self.conn.execute("SELECT batch_id, meta, data FROM onceflow_staged WHERE sink_id = ? "
                                 "ORDER BY batch_id", (self.sink_id,)).fetchall()
        for batch_id, meta, data in rows:
            outputs, specs, stats, rows_out = decode_staged(meta, data)
            self._apply(batch_id, outputs, specs, stats, rows_out, staged=True)
        return len(rows)

    def staged_batches(self) -> list[int]:
        """Batch ids staged and not yet applied (empty after :meth:`flush`)."""
        return [r[0] for r in self.conn.execute(
            "SELECT batch_id FROM onceflow_staged WHERE sink_id = ? ORDER BY batch_id", (self.sink_id,))]

    def flush(self) -> None:
        """Wait until every accepted batch is in the tables (S1).

        Raises:
            SinkApplyError: A staged batch could not be applied, also on a second try;
                it stays staged and a restart applies it.
        """
        if self._held is not None:
            faults.reached(faults.CrashPoint.APPLY_PENDING, self._held)  # armed: does not return
            self._held = None
            self.apply_staged()
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending[1].result()
        except Exception:  # a transient failure (e.g. a lock held past the timeout) heals here
            self._recover()

    def _recover(self) -> None:
        """S6, with an error that says the batch is safe.

        Raises:
            SinkApplyError: A staged batch could not be applied; it stays staged.
        """
        try:
            self.apply_staged()
        except Exception as exc:
            staged = self.staged_batches()
            raise SinkApplyError(
                f"batch {staged[0] if staged else '?'} of sink {self.sink_id!r} is safely staged in "
                f"{self.path} (table onceflow_staged) but could not be written to its tables: {exc}. Fix "
                "the cause and restart with the same checkpoint and database: the restart applies it."
            ) from exc

    def batches(self) -> list[dict[str, Any]]:
        """This sink's marker rows, by batch id (what the auditor and users read), after :meth:`flush`."""
        self.flush()
        cur = self.conn.execute("SELECT * FROM onceflow_batches WHERE sink_id = ? ORDER BY batch_id",
                                (self.sink_id,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur]

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

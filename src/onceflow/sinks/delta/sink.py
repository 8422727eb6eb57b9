"""The generic Delta Lake sink (``deltalake``): each micro-batch exactly once per table.

Each table is a Delta table ``<root>/<name>``; the marker of batch N is the Delta *app
transaction* ``(app_id, N)`` with ``app_id = "onceflow:<sink_id>"``, committed in the same
Delta commit as the batch's rows (the idiom of Delta's idempotent ``foreachBatch`` writes,
``txnAppId``/``txnVersion``). delta-rs writes a repeated version twice and accepts a version
going backwards (measured), so onceflow checks it, on the snapshot the commit is based on.
Commit protocol of :meth:`DeltaTablesSink.commit_tables` for batch N:

1. **Check.** Crash point ``before_sink_write``. Every table's rows are checked against its spec
   (:class:`onceflow.errors.BatchRejectedError`: nothing written). May run any number of times.
2. **Decide**, per table, in the order of ``tables=``: load the table's snapshot. If its
   ``transaction_version(app_id) >= N``, this table already has batch N: skip it (a replay).
3. **Write** and 4. **mark** in one Delta commit on that snapshot: the rows with
   ``Transaction(app_id, N)`` and the batch's metrics (commit metadata ``onceflow``).
   ``append`` writes them, ``upsert`` and ``add`` MERGE on the key (``add`` adds the ``add``
   columns). A table's part with no rows is an empty append: a MERGE of nothing commits
   nothing (measured), which would lose the batch's marker and metrics (e.g. a batch whose
   every row was late). A concurrent commit carrying the same app id makes delta-rs refuse this
   one (measured: "Concurrent transaction failed"): the snapshot is reloaded and step 2 decides
   again — two writers never both commit N. Crash point ``inside_sink_txn`` between two
   tables' commits (after the first table's).
5. **Commit**: each table's Delta commit is durable when it returns. Crash point
   ``after_sink_commit`` (and the ``ambiguous_commit`` fault) after the last table: Spark
   re-runs N, step 2 skips every table.
6. **Return** True if any table was written.

A batch whose input has ``collect_below`` rows or more (counted before it runs, by
:func:`onceflow.write_stream`: the sink is a :class:`onceflow.sinks._core.base.CollectingSink`) and
whose tables hold as many (a backlog after downtime) never passes through the driver:
:meth:`DeltaTablesSink.commit_frames` checks the DataFrames with Spark
(:func:`onceflow.sinks._core.checks.check_frame`), skips every table that has N already (step 2, before
any task runs), and has Spark's tasks write the rest — each table's files committed by the
driver with the marker in one Delta commit (:mod:`onceflow.sinks.delta.files`, steps 1-4 there);
the crash points are the same. Smaller batches are collected and take the steps above (one
Spark job, no files to list). A large batch of one table without a key reaches the sink not
cached (:attr:`onceflow.sinks._core.base.Sink.writes_uncached`): its tasks write it in the batch's
only Spark job (Spark's own Parquet writer where the columns have the table's types:
:mod:`onceflow.sinks.delta.spark_files`), and the sink commits the files with the
marker, whose numbers (the rows the tasks wrote) it learns only then; its crash point
``inside_sink_txn`` is between the tasks' write and that commit.

Delta has no transaction across tables: a crash between two tables' commits leaves the first
with N and the second without; the re-run of N writes only the second (step 2), so every
table gets N exactly once — readers may briefly see one table a batch ahead of another.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import time
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow import faults
from onceflow.errors import CheckpointMismatchError, ConfigError, OnceflowError
from onceflow.faults import CrashPoint
from onceflow.sinks._core import marker, owners
from onceflow.sinks._core.base import Settle, SinkBase, collected
from onceflow.sinks._core.checks import check_existing, check_frame, check_outputs, expected_columns
from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.delta import files, spark_files
from onceflow.sinks.delta._log import onceflow_commits, require, writers

RETRIES = files.RETRIES
"""Commits tried per table when a concurrent writer wins (step 3): the task-written path's number."""

_log = logging.getLogger("onceflow.retry")


class DeltaTablesSink(SinkBase):
    """Delta tables under one root directory (see the module protocol).

    Args:
        root: Directory holding one Delta table per table name.
        sink_id: Marker namespace (the app id is ``onceflow:<sink_id>``).
        collect_below: A batch with fewer rows (all tables) is collected to the driver and
            committed from Arrow; a larger one is written by Spark's tasks (0: always).
        maintain_every: After every this many batches' commits (batch ids ``N - 1, 2N - 1``...),
            compact and vacuum the batch's tables in the driver
            (:func:`onceflow.sinks.delta.maintain.maintain`; None: never).
        retention_hours: The vacuum's retention of removed files when ``maintain_every`` is set.
    """

    all_or_nothing = False
    """Each table of a batch commits on its own."""
    writes_uncached = True

    def __init__(self, root: str | Path, sink_id: str = "default", collect_below: int = 100_000,
                 maintain_every: int | None = None, retention_hours: float = 7 * 24) -> None:
        self.dl = require()
        self.collect_below = collect_below
        if maintain_every is not None and maintain_every < 1:
            raise ConfigError(f"maintain_every must be >= 1 batch (or None), got {maintain_every}")
        self.maintain_every, self.retention_hours = maintain_every, retention_hours
        if not sink_id or not sink_id.replace("_", "a").replace("-", "a").replace(".", "a").isalnum():
            raise ConfigError(f"sink id {sink_id!r} is invalid: use letters, digits, _ . -")
        self.root = Path(root)
        self.sink_id = sink_id
        self.app_id = f"onceflow:{sink_id}"

    def __repr__(self) -> str:
        return f"onceflow.delta({str(self.root)!r}, sink_id={self.sink_id!r})"

    def repair_options(self) -> str:
        """``--delta ROOT --sink-id ID``."""
        return f"--delta {self.root} --sink-id {self.sink_id}"

    def bind(self, query_id: str) -> None:
        """Tie the sink to the checkpoint with ``query_id`` (a file ``_onceflow/<sink_id>.json``).

        Raises:
            CheckpointMismatchError: The tables hold this sink id for another checkpoint.
        """
        meta = self.root / "_onceflow" / f"{self.sink_id}.json"
        if meta.exists():
            found = json.loads(meta.read_text())["query_id"]
            if found != query_id:
                raise CheckpointMismatchError(
                    f"the Delta tables under {self.root} hold sink {self.sink_id!r} of the checkpoint with "
                    f"query id {found}, but this run's checkpoint has query id {query_id}; a new checkpoint "
                    "restarts batch ids at 0. Run with the original checkpoint, or use another sink id.")
            return
        meta.parent.mkdir(parents=True, exist_ok=True)
        tmp = meta.with_name(f".{meta.name}.tmp")
        tmp.write_text(json.dumps({"query_id": query_id, "bound_ms": int(time.time() * 1000)}))
        os.replace(tmp, meta)

    def _commit_one(self, name: str, spec: Table, rows: pa.Table, batch_id: int, metadata: str) -> bool:
        """Steps 2-3 for one table; False if it already had the batch."""
        dl = self.dl
        path = str(self.root / name)
        props = dl.CommitProperties(app_transactions=[dl.Transaction(self.app_id, batch_id)],
                                    custom_metadata={"onceflow": metadata})
        for attempt in range(RETRIES):
            if not dl.DeltaTable.is_deltatable(path):
                try:
                    dl.write_deltalake(path, rows, mode="append", commit_properties=props)
                    return True
                except Exception as exc:  # another writer created it first: decide again
                    if not dl.DeltaTable.is_deltatable(path):
                        raise OnceflowError(f"creating Delta table {path} failed: {exc}") from None
                    continue
            table = dl.DeltaTable(path)
            if self._committed(table, batch_id):  # 2
                return False
            have = {f.name for f in table.schema().fields}
            missing = [c for c in rows.column_names if c not in have]
            if missing:
                raise ConfigError(f"Delta table {path} has no column(s) {missing} that the batch has (it "
                                  f"has {sorted(have)}); add them or write to another table")
            try:
                if not rows.num_rows:  # 3, 4: no rows, but the batch's marker and metrics all the same
                    dl.write_deltalake(table, pa.schema(table.schema().to_arrow()).empty_table(),
                                       mode="append", commit_properties=props)
                elif spec.mode == "append":
                    dl.write_deltalake(table, rows, mode="append", commit_properties=props)
                else:
                    files.merge_into(table, rows, spec.key, spec.merged, rows.column_names, props)
                return True
            except dl.exceptions.CommitFailedError as exc:  # a concurrent commit won: reload, decide again
                why = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
                _log.warning("onceflow: batch %d: table %s: a concurrent Delta commit won (%s); deciding "
                             "again (%d of %d)", batch_id, name, why, attempt + 1, RETRIES)
                continue
        raise OnceflowError(f"batch {batch_id} could not be committed to {path}: {RETRIES} concurrent "
                            "commits won")

    def check(self, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:
        """Check the Delta tables that exist; claim them (:mod:`onceflow.sinks._core.owners`).

        The registry is ``<root>/_onceflow/tables.json``, changed under an exclusive lock of
        ``<root>/_onceflow/tables.lock``; a table that exists and is not in it yet is first
        credited to the sink ids its commits name (their ``onceflow`` metadata).
        """
        for name, spec in specs.items():
            if len(name.encode()) > 255:  # a directory name, on every common file system
                raise ConfigError(f"table name {name[:40]!r}... is {len(name.encode())} bytes; a Delta table "
                                  "is a directory and a directory name has at most 255 bytes")
            path = str(self.root / name)
            if self.dl.DeltaTable.is_deltatable(path):
                have = [f.name for f in self.dl.DeltaTable(path).schema().fields]
                cols = expected_columns(name, spec, schemas)
                check_existing(f"Delta ({path})", name, spec, cols, have, None)
        with self.registry() as rows:
            def read(table: str) -> list[tuple[str, bool]]:
                if table not in rows:
                    rows[table] = {s: {"shared": False, "claimed_ms": owners.now_ms()}
                                   for s in self._writers_in_history(table)}
                return [(s, bool(v["shared"])) for s, v in rows[table].items()]

            def write(table: str, shared: bool) -> None:
                rows.setdefault(table, {})[self.sink_id] = {"shared": shared, "claimed_ms": owners.now_ms()}

            owners.claim(read, write, str(self.root), self.sink_id, specs, f"--delta {self.root}")

    def _commits(self, path: Path) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
        """A table's commits that carry onceflow's metadata: ``(metadata, history entry)``, newest first."""
        return onceflow_commits(self.dl.DeltaTable(str(path)))

    def _writers_in_history(self, name: str) -> list[str]:
        """The sink ids that committed to an existing table (its commits' ``onceflow`` metadata)."""
        path = self.root / name
        if not self.dl.DeltaTable.is_deltatable(str(path)):
            return []
        return writers(self.dl.DeltaTable(str(path)))

    @contextlib.contextmanager
    def registry(self) -> Iterator[dict[str, dict[str, dict[str, Any]]]]:
        """The table registry (table -> sink id -> claim), locked; written back when the block ends."""
        import fcntl

        folder = self.root / "_onceflow"
        folder.mkdir(parents=True, exist_ok=True)
        path = folder / "tables.json"
        with open(folder / "tables.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            rows = json.loads(path.read_text()) if path.exists() else {}
            before = json.dumps(rows, sort_keys=True)
            yield rows
            if json.dumps(rows, sort_keys=True) != before:
                tmp = folder / ".tables.json.tmp"
                tmp.write_text(json.dumps(rows, indent=1, sort_keys=True))
                os.replace(tmp, path)

    def _committed(self, table: Any, batch_id: int) -> bool:
        """Step 2's check: whether ``table``'s app transaction of this sink reached ``batch_id``."""
        done = table.transaction_version(self.app_id)
        return done is not None and done >= batch_id

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Write batch ``batch_id`` to every table that does not have it yet (see the module).

        Raises:
            BatchRejectedError: The rows do not fit the specs (nothing written).
            ConfigError: A table lacks a column of the batch.
        """
        faults.reached(CrashPoint.BEFORE_SINK_WRITE, batch_id)  # 1
        check_outputs(outputs, specs)
        metadata = self._metadata(batch_id, stats, rows_out, {n: t.num_rows for n, t in outputs.items()})
        wrote = False
        for i, (name, rows) in enumerate(outputs.items()):
            wrote |= self._commit_one(name, specs[name], rows, batch_id, metadata)
            if i == 0:
                faults.reached(CrashPoint.INSIDE_SINK_TXN, batch_id)
        faults.reached(CrashPoint.AFTER_SINK_COMMIT, batch_id)  # 5
        faults.reached(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return self._maintained(batch_id, list(outputs), wrote)  # 6

    def _maintained(self, batch_id: int, names: list[str], wrote: bool) -> bool:
        """``wrote``, after compacting and vacuuming ``names`` when this batch is a ``maintain_every``-th.

        Runs after the batch's commits: a crash here is a crash after the commit (the replay
        skips the batch), and the batch's marker is read back unchanged (maintain's step 4).
        """
        if self.maintain_every is not None and (batch_id + 1) % self.maintain_every == 0:
            from onceflow.sinks.delta.maintain import maintain

            here = [n for n in names if (self.root / n / "_delta_log").is_dir()]
            for done in maintain(self.root, here, retention_hours=self.retention_hours):
                _log.info("Delta table %s maintained after batch %d: %d -> %d files (%d vacuumed)",
                          done.table, batch_id, done.files_before, done.files_after, done.vacuumed)
        return wrote

    def _metadata(self, batch_id: int, stats: BatchStats, rows_out: int, written: Mapping[str, int]) -> str:
        """The batch's marker row as a commit's ``onceflow`` metadata (the commit has a time of its own)."""
        record = marker.marker_record(self.sink_id, batch_id, stats, rows_out, written)
        return json.dumps({k: v for k, v in record.items() if k != "committed_ms"})

    def commit_frames(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int, written: Mapping[str, int] | None = None,
                      settle: Settle | None = None) -> bool:
        """Write batch ``batch_id``'s DataFrames to every table that does not have it yet.

        Small batches (under ``collect_below`` rows) are collected and go through
        :meth:`commit_tables`; larger ones are written by Spark's tasks (see the module); with
        ``settle``, one table's frame that is not cached (:meth:`_commit_uncached`).

        Raises:
            BatchRejectedError: A null or repeated key (nothing written).
            ConfigError: A table lacks a column of the batch, or a value does not fit its type.
        """
        if settle is not None:
            return self._commit_uncached(batch_id, frames, specs, settle)
        counts = self._counted(batch_id, frames, specs, written)  # 1
        if sum(counts.values()) < self.collect_below:
            return self.commit_tables(batch_id, collected(frames), specs, stats, rows_out)
        for name, frame in frames.items():
            check_frame(name, specs[name], frame)
        metadata = self._metadata(batch_id, stats, rows_out, counts)
        wrote = False
        for i, (name, frame) in enumerate(frames.items()):
            spec = specs[name]
            if counts[name] == 0:  # Spark may run no task, and no commit, for a frame without rows
                wrote |= self._commit_one(name, spec, frame.toArrow(), batch_id, metadata)
            elif not self._has(table := self._table(name), batch_id):  # 2
                job = self._files_spec(name, spec, batch_id, metadata=metadata)
                messages = self._task_files(frame, spec, job, table)  # 3, 4: the tasks' files, committed here
                wrote |= files.commit(job, batch_id, self._schema(table, frame), messages)
            if i == 0:
                faults.reached(CrashPoint.INSIDE_SINK_TXN, batch_id)
        faults.reached(CrashPoint.AFTER_SINK_COMMIT, batch_id)  # 5
        faults.reached(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return self._maintained(batch_id, list(frames), wrote)  # 6

    def _table(self, name: str) -> Any | None:
        """Table ``name`` as it is now (a ``DeltaTable``; None: none yet), read once for steps 2-3."""
        path = str(self.root / name)
        return self.dl.DeltaTable(path) if self.dl.DeltaTable.is_deltatable(path) else None

    def _has(self, table: Any | None, batch_id: int) -> bool:
        """Step 2 before any task runs: whether the table (:meth:`_table`) exists and has ``batch_id``."""
        return table is not None and self._committed(table, batch_id)

    def _files_spec(self, name: str, spec: Table, batch_id: int, metadata: str = "{}") -> files.FilesSpec:
        """Table ``name``'s write of ``batch_id`` by Spark's tasks (:mod:`onceflow.sinks.delta.files`)."""
        return files.FilesSpec(str(self.root), name, self.sink_id, batch_id, key=tuple(spec.key),
                               merged=dict(spec.merged), mode="append" if spec.mode == "append" else "merge",
                               metadata=metadata)

    def _task_files(self, frame: Any, spec: Table, job: files.FilesSpec,
                    table: Any | None) -> list[dict[str, Any]]:
        """Step 3's files of one table, written by Spark's tasks; their messages (for ``files.commit``).

        Spark's own Parquet writer writes an append whose columns have the table's types
        (:mod:`onceflow.sinks.delta.spark_files` says when); otherwise :func:`files.write_task`
        in each task, through :func:`onceflow.sinks._core.tasks.run_tasks`.
        """
        from onceflow.sinks.delta.datasource import write_files

        order = spark_files.columns(frame, table) if spec.mode == "append" else None
        if order is not None:
            return spark_files.write(frame.select(*order), job, job.batch_id)
        return write_files(frame, job, files.arrow_schema(table))

    @staticmethod
    def _schema(table: Any | None, frame: Any) -> pa.Schema:
        """The table's Arrow schema (:meth:`_table`); the frame's if a commit of this batch creates it."""
        from onceflow.sinks._core.checks import arrow_schema

        return files.arrow_schema(table) or arrow_schema(frame.schema)

    def _commit_uncached(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table],
                         settle: Settle) -> bool:
        """Steps 1-6 for one table's frame that is not cached: written by its tasks, then committed here.

        The tasks write the files in the batch's only Spark job — Spark's own Parquet writer when
        the batch's columns have the table's types (:mod:`onceflow.sinks.delta.spark_files`), else
        :func:`files.write_task` (through ``run_tasks``); the batch's numbers come from
        ``settle`` once the tasks have run, and the files are committed with them and the marker
        (:func:`files.commit`, steps 2-4 there: decided again on the snapshot the commit is based on).
        """
        self._check_start(batch_id, frames, specs)  # 1
        ((name, frame),) = frames.items()
        spec = specs[name]
        check_frame(name, spec, frame)
        table = self._table(name)
        if self._has(table, batch_id):  # 2
            return False
        job = self._files_spec(name, spec, batch_id)
        messages = self._task_files(frame, spec, job, table)  # 3: the tasks' files
        counts = {name: sum(int(m["rows"]) for m in messages)}
        stats, rows_out = settle(counts)
        schema = self._schema(table, frame)
        faults.reached(CrashPoint.INSIDE_SINK_TXN, batch_id)  # files written, in no commit: nothing visible
        wrote = files.commit(replace(job, metadata=self._metadata(batch_id, stats, rows_out, counts)),
                             batch_id, schema, messages)  # 2-4
        faults.reached(CrashPoint.AFTER_SINK_COMMIT, batch_id)  # 5
        faults.reached(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return self._maintained(batch_id, [name], wrote)  # 6

    def batches(self) -> list[dict[str, Any]]:
        """One dict per batch id found in the tables' commit metadata (by batch id).

        A batch's metrics known only from the batch after (Spark Connect) come from that
        batch's metadata (:func:`onceflow.sinks._core.marker.with_amendments`).
        """
        found: dict[int, dict[str, Any]] = {}
        tables = sorted(p for p in self.root.iterdir() if (p / "_delta_log").is_dir()) \
            if self.root.exists() else []
        for path in tables:
            for meta, entry in self._commits(path):
                if meta.get("sink_id") == self.sink_id:  # + the commit's time, as other sinks' markers
                    found.setdefault(int(meta["batch_id"]), {**meta, "committed_ms": entry.get("timestamp")})
        return marker.with_amendments([found[b] for b in sorted(found)])

    def flush(self) -> None:
        """Nothing to wait for: a batch is in the tables when ``commit_tables`` returns."""

    def close(self) -> None:
        """Nothing to release."""

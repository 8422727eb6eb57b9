"""A large batch's SQLite rows converted and written by Spark's tasks, applied by the driver with its marker.

The executor side of :class:`onceflow.sinks.sqlite.sink.SQLiteTablesSink` for a batch of
``collect_below`` rows or more, and the ``onceflow_sqlite`` format (a PySpark Python data
source, so ``writeStream.format("onceflow_sqlite")`` works on its own). SQLite has one writer,
so the rows still reach the database through one process — but never as one batch in memory,
and the costly part (each value turned into what SQLite stores, checked, inserted) runs in the
tasks, in parallel. For table T and batch N, each commit attempt of N draws a token, and:

1. **Task** (partition p, attempt a), any number of times (Spark's retries, speculation, a re-run
   after a crash): each Arrow batch of its rows is checked for values SQLite would not store as
   given (:func:`onceflow.sinks.sqlite.values.check_values`: the task fails naming the table,
   column, key and value), converted as the sink stores it
   (:func:`onceflow.sinks.sqlite.values.stored_array`) and inserted into a scratch SQLite file of
   its own, ``<db>.onceflow-stage/<sink_id>/<N>-<token>/<T>-<p>-<a>-<uuid>.db`` (one STRICT table
   ``rows`` of the table's types, filled by Arrow's SQLite driver; no journal: nobody reads the
   file before it is complete; it has that name only then, ``.part`` added before: the sink may
   copy it while other tasks run, :mod:`onceflow.sinks.sqlite.early`). It returns the file's
   path, its rows, and the lowest and highest value of each integer ``add`` column — a few
   hundred bytes, whatever the rows.
2. **Kept files** (the driver: the format's ``commit``, or the sink through
   :func:`onceflow.sinks.formats.run_tasks`): the messages of the attempts Spark kept, one per
   partition (:func:`kept_files`). Files of attempts Spark dropped are in none.
3. **Apply** (the driver, :meth:`SQLiteTablesSink.commit_frames`, or the format's ``commit``):
   one transaction for every table of N and its marker — the files attached and copied by
   SQLite itself (``INSERT ... SELECT``, in key order; each file's row count checked against its
   message). See the sink's protocol.
4. **Clean up**: the attempt's directory, whatever happened (the sink's ``bind`` removes what a
   dead process left).

SQLite attaches at most :data:`MAX_FILES` files to one connection, so the sink coalesces each
table's rows into at most ``MAX_FILES // tables`` tasks; a batch of more tables than that is
collected instead.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
import sqlite3
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow import faults
from onceflow.errors import BatchRejectedError, ConfigError
from onceflow.sinks.formats import kept_messages, run_tasks, running_task
from onceflow.sinks.sqlite.values import AddBounds, check_values, conflict_clause, ddl, quote, stored_array
from onceflow.tables import Table

MAX_FILES = 10
"""Files one connection may attach (SQLite's ``SQLITE_MAX_ATTACHED`` default)."""
SCRATCH_PAGE_SIZE = 65536
"""The scratch files' page size (SQLite's largest): fewer pages to fill, and to read in the copy."""
STAGE_SUFFIX = ".onceflow-stage"
"""The scratch files' directory: the database's path with this suffix."""


def scratch_name(table: str, partition: int, attempt: int) -> str:
    """A task attempt's scratch file name (unique: a random part; complete once it has this name)."""
    return f"{table}-{partition:05d}-{attempt}-{uuid.uuid4().hex[:8]}.db"


def is_scratch_of(table: str, name: str) -> bool:
    """Whether ``name`` is a complete scratch file of ``table`` (:func:`scratch_name`'s shape)."""
    return re.fullmatch(re.escape(table) + r"-\d{5}-\d+-[0-9a-f]{8}\.db", name) is not None


def stage_root(db: str | Path, sink_id: str) -> Path:
    """Where a sink's tasks put their scratch files (beside the database)."""
    return Path(str(db) + STAGE_SUFFIX) / sink_id


@dataclass(frozen=True)
class TaskSpec:
    """One table's write of one batch (the data source's options).

    Attributes:
        db: The database file.
        table: The table.
        sink_id: The marker namespace.
        batch_id: The micro-batch (-1: a streaming write, where Spark gives it).
        token: This commit attempt's token (names its directory).
        spec: The table's spec (:meth:`onceflow.tables.Table.describe`).
    """

    db: str
    table: str
    sink_id: str = "default"
    batch_id: int = -1
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    spec: dict[str, Any] = field(default_factory=lambda: {"mode": "append"})

    def folder(self, batch_id: int) -> Path:
        """This attempt's directory of scratch files."""
        return stage_root(self.db, self.sink_id) / f"{batch_id}-{self.token}"

    def table_spec(self) -> Table:
        """The spec as a :class:`onceflow.tables.Table` (an unknown keyword refused, naming it)."""
        return Table(**self.spec)

    def options(self) -> dict[str, str]:
        """As data source options."""
        return {k: v if isinstance(v, str) else json.dumps(v) for k, v in asdict(self).items()}

    @classmethod
    def from_options(cls, options: Mapping[str, str]) -> TaskSpec:
        """From data source options (keys case-insensitive).

        Raises:
            ConfigError: ``db`` or ``table`` missing, or a spec that is not a table spec.
        """
        opts = {k.lower(): v for k, v in options.items()}
        for need in ("db", "table"):
            if not opts.get(need):
                raise ConfigError(f"onceflow_sqlite needs option {need!r} (the database file, the table)")
        spec = json.loads(opts["spec"]) if opts.get("spec") else {"mode": opts.get("mode", "append")}
        if opts.get("key"):
            spec["key"] = [k.strip() for k in opts["key"].split(",") if k.strip()]
        made = cls(db=opts["db"], table=opts["table"], sink_id=opts.get("sink_id", "default"),
                   batch_id=int(opts.get("batch_id", "-1")), token=opts.get("token") or uuid.uuid4().hex[:12],
                   spec=spec)
        try:
            made.table_spec()
        except (ConfigError, TypeError, ValueError) as exc:
            raise ConfigError(f"onceflow_sqlite: table {made.table!r}: {exc}") from None
        return made


def _fold(into: dict[str, tuple[int, int]], more: Mapping[str, Sequence[int]]) -> None:
    """Widen ``into`` (column -> (lowest, highest)) by ``more`` (a batch's, or a file's, the same)."""
    for col, (low, high) in more.items():
        was = into.get(col, (low, high))
        into[col] = (min(was[0], low), max(was[1], high))


class _Scratch:
    """A task's scratch file: one table ``rows``, no journal, filled from Arrow in one transaction.

    Arrow's SQLite driver (ADBC) binds each column's values in C, as the standard library's
    ``executemany`` would bind the same values one Python object at a time: an integer, a
    double, a text or a blob, stored as given, a null as NULL.
    """

    def __init__(self, path: Path, schema: pa.Schema, page_size: int = SCRATCH_PAGE_SIZE) -> None:
        """``rows`` has the columns and types onceflow creates a table of ``schema`` with (STRICT).

        So that SQLite copies an append table's file record by record (its transfer
        optimization: same columns, same types, ``INSERT INTO t SELECT * FROM rows``).
        """
        import adbc_driver_sqlite.dbapi as adbc

        self.conn = adbc.connect(str(path), autocommit=True)
        self.cur = self.conn.cursor()
        self.cur.execute(f"PRAGMA page_size={page_size}")
        self.cur.execute("PRAGMA journal_mode=OFF")
        self.cur.execute("PRAGMA synchronous=OFF")
        self.cur.execute(ddl("rows", Table(), schema))
        self.cur.execute("BEGIN")

    def add(self, rows: pa.Table) -> None:
        """Append ``rows`` (the values as stored: :func:`onceflow.sinks.sqlite.values.stored_array`)."""
        self.cur.adbc_ingest("rows", rows, mode="append")

    def commit(self) -> None:
        """The file's rows, durable enough for a file nobody reads unless the task returns."""
        self.cur.execute("COMMIT")

    def close(self) -> None:
        """Close the file (rolled back unless committed)."""
        try:
            self.cur.close()
        finally:
            self.conn.close()


def write_task(spec: TaskSpec, batches: Iterable[pa.RecordBatch]) -> dict[str, Any]:
    """Step 1: one partition's rows as one scratch SQLite file; the file's message (no rows: no file).

    Returns:
        ``{"path", "rows", "extents"}`` (``path`` None when the partition had no rows).

    Raises:
        BatchRejectedError: A value SQLite would not store as given.
    """
    task = running_task()
    batch_id = spec.batch_id if spec.batch_id >= 0 else task.batch_id
    table = spec.table_spec()
    folder = spec.folder(batch_id)
    path = folder / scratch_name(spec.table, task.partition, task.attempt)
    part = path.with_name(path.name + ".part")  # its name until complete
    scratch: _Scratch | None = None
    rows = 0
    extents: dict[str, tuple[int, int]] = {}  # the integer add columns' (lowest, highest)
    try:
        for raw in batches:
            if not raw.num_rows:
                continue
            batch = pa.Table.from_batches([raw])
            check_values(spec.table, table, batch)
            _fold(extents, AddBounds.extents(table, batch))
            if scratch is None:
                folder.mkdir(parents=True, exist_ok=True)
                scratch = _Scratch(part, batch.schema)
            scratch.add(pa.table([stored_array(batch.column(c)) for c in batch.column_names],
                                 names=batch.column_names))
            rows += batch.num_rows
            faults.maybe_kill_executor(faults.CrashPoint.TASK_MID_WRITE, batch_id, task.attempt)  # open
        if scratch is not None:
            scratch.commit()
    finally:
        if scratch is not None:
            scratch.close()
    if scratch is None:
        return {"path": None, "rows": 0, "extents": {}}
    part.replace(path)  # complete: the driver may copy it while other tasks still run
    faults.maybe_kill_task(faults.CrashPoint.TASK_AFTER_WRITE, batch_id, task.attempt)
    return {"path": str(path), "rows": rows, "extents": extents}


def run(frame: Any, spec: TaskSpec) -> list[dict[str, Any]]:
    """Step 1 in Spark's tasks, for the sink (:func:`onceflow.sinks.formats.run_tasks`): the kept files."""
    return [m for m in run_tasks(frame, functools.partial(write_task, spec)) if m["path"] is not None]


def kept_files(spec: TaskSpec, batch_id: int, messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Step 2: the files of the attempts Spark kept (a partition without rows has none).

    Raises:
        OnceflowError: A task's message is missing (Spark passes None for a task that failed).
    """
    missing = (f"batch {batch_id}: a task writing SQLite table {spec.table!r} sent no message; the batch "
               "runs again")
    return [m for m in kept_messages(messages, missing) if m["path"] is not None]


def discard(spec: TaskSpec, batch_id: int) -> None:
    """Step 4: the attempt's scratch files, kept or not."""
    shutil.rmtree(spec.folder(batch_id), ignore_errors=True)


def insert_select(name: str, spec: Table, columns: list[str], source: str,
                  table_columns: Sequence[str]) -> str:
    """Step 3's copy of the scratch file attached as ``source`` into table ``name``, by its mode.

    An append table without a key whose columns (``table_columns``, in order) are the file's:
    ``SELECT *`` in the file's order, which SQLite copies record by record when the types are
    the same too (its transfer optimization); any other table by name, in key order.
    """
    if spec.mode == "append" and not spec.key and list(table_columns) == list(columns):
        return f"INSERT INTO main.{quote(name)} SELECT * FROM {source}.rows"
    cols = ", ".join(quote(c) for c in columns)
    order = f" ORDER BY {', '.join(quote(k) for k in spec.key)}" if spec.key else ""
    where = " WHERE true"  # so that SQLite reads ON CONFLICT as the upsert's, not a join's
    copy = f"INSERT INTO main.{quote(name)}({cols}) SELECT {cols} FROM {source}.rows{where}{order}"
    return copy + conflict_clause(spec, columns)


def check_keys(conn: sqlite3.Connection, name: str, spec: Table, sources: list[str]) -> None:
    """Refuse a batch whose scratch files (attached as ``sources``) hold a key twice.

    Raises:
        BatchRejectedError: Naming the table and the key.
    """
    keys = ", ".join(quote(k) for k in spec.key)
    union = " UNION ALL ".join(f"SELECT {keys} FROM {s}.rows" for s in sources)
    found = conn.execute(f"SELECT {keys}, count(*) FROM ({union}) GROUP BY {keys} HAVING count(*) > 1 "
                         "LIMIT 1").fetchone()
    if found:
        key = dict(zip(spec.key, found[:-1], strict=True))
        raise BatchRejectedError(f"table {name!r}: key {key} appears {found[-1]} times in one batch; "
                                 "aggregate per key before writing; nothing of the batch was written")


def folded(files: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """Column -> (lowest, highest) over every file's ``extents``."""
    out: dict[str, tuple[int, int]] = {}
    for f in files:
        _fold(out, f["extents"])
    return out


def frames_per_table(tables: int) -> int:
    """How many files (tasks) each of ``tables`` tables may have: :data:`MAX_FILES` in all."""
    return max(1, MAX_FILES // max(1, tables))

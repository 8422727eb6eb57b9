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
   its own, ``<db>.onceflow-stage/<sink_id>/<N>-<token>/<T>-<p>-<a>-<c>-<uuid>.db`` (one STRICT
   table ``rows`` of the table's types, filled by Arrow's SQLite driver; no journal: nobody reads
   the file before it is complete; it has that name only then, ``.part`` added before: the sink
   may copy it while other tasks run, :mod:`onceflow.sinks.sqlite.early`). A file holds at most
   ``chunk_bytes`` of Arrow data (a batch more); the task then completes it and goes on in file
   ``c + 1``, so the driver copies a long task's rows while the task still runs. It returns each
   file's path and rows, and the lowest and highest value of each integer ``add`` column — a few
   hundred bytes a file, whatever the rows.
2. **Kept files** (the driver: the format's ``commit``, or the sink through
   :func:`onceflow.sinks._core.tasks.run_tasks`): the files of the attempts Spark kept, one message
   per partition (:func:`kept_files`). Files of attempts Spark dropped are in none.
3. **Apply** (the driver, :meth:`SQLiteTablesSink.commit_frames`, or the format's ``commit``):
   one transaction for every table of N and its marker — each file opened in that transaction
   (:class:`Scratches`) and copied by SQLite itself (``INSERT ... SELECT``, in key order; each
   file's row count checked against its message). See the sink's protocol.
4. **Clean up**: the attempt's directory, whatever happened (the sink's ``bind`` removes what a
   dead process left).

SQLite keeps a database attached to a transaction until it ends, and attaches at most
:data:`MAX_FILES`. Where Python's ``sqlite3`` deserializes (3.11+), the driver reads each file
into one in-memory database, attached once: a batch may have any number of files. Elsewhere
each file is attached: a task writes one file, and the sink coalesces each table's rows into at
most ``MAX_FILES // tables`` tasks (a batch of more tables than that is collected instead).
"""

from __future__ import annotations

import functools
import json
import os
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
from onceflow.sinks._core.tables import Table
from onceflow.sinks._core.tasks import kept_messages, run_tasks, running_task
from onceflow.sinks.sqlite.values import AddBounds, check_values, conflict_clause, ddl, quote, stored_array

MAX_FILES = 10
"""Files one connection may attach (SQLite's ``SQLITE_MAX_ATTACHED`` default)."""
CHUNK_BYTES = 8 << 20
"""A scratch file's Arrow bytes (about its size) where the driver reads files into memory."""
SCRATCH_PAGE_SIZE = 65536
"""The scratch files' page size (SQLite's largest): fewer pages to fill, and to read in the copy."""
STAGE_SUFFIX = ".onceflow-stage"
"""The scratch files' directory: the database's path with this suffix."""


def scratch_name(table: str, partition: int, attempt: int, chunk: int = 0) -> str:
    """A task attempt's ``chunk``-th scratch file name (unique: a random part; complete once it has it)."""
    return f"{table}-{partition:05d}-{attempt}-{chunk:05d}-{uuid.uuid4().hex[:8]}.db"


def is_scratch_of(table: str, name: str) -> bool:
    """Whether ``name`` is a complete scratch file of ``table`` (:func:`scratch_name`'s shape)."""
    return re.fullmatch(re.escape(table) + r"-\d{5}-\d+-\d{5}-[0-9a-f]{8}\.db", name) is not None


def reads_into_memory() -> bool:
    """Whether this Python's ``sqlite3`` deserializes (3.11+): see :class:`Scratches`."""
    return hasattr(sqlite3.Connection, "deserialize")


def default_chunk_bytes() -> int:
    """A task's file size bound for this driver: :data:`CHUNK_BYTES`, or 0 (one file) without memory reads."""
    return CHUNK_BYTES if reads_into_memory() else 0


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
        spec: The table's spec (:meth:`onceflow.sinks._core.tables.Table.describe`).
        chunk_bytes: A task starts a new file after this many Arrow bytes (0: one file a task);
            set by the driver, which reads the files (:func:`default_chunk_bytes`).
    """

    db: str
    table: str
    sink_id: str = "default"
    batch_id: int = -1
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:12])
    spec: dict[str, Any] = field(default_factory=lambda: {"mode": "append"})
    chunk_bytes: int = field(default_factory=default_chunk_bytes)

    def folder(self, batch_id: int) -> Path:
        """This attempt's directory of scratch files."""
        return stage_root(self.db, self.sink_id) / f"{batch_id}-{self.token}"

    def table_spec(self) -> Table:
        """The spec as a :class:`onceflow.sinks._core.tables.Table` (an unknown keyword refused by name)."""
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
                   spec=spec, chunk_bytes=int(opts.get("chunk_bytes", default_chunk_bytes())))
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


class _Files:
    """A task attempt's scratch files of one table: filled one after another, each made complete."""

    def __init__(self, spec: TaskSpec, batch_id: int, partition: int, attempt: int) -> None:
        self.spec, self.partition, self.attempt = spec, partition, attempt
        self.folder = spec.folder(batch_id)
        self.done: list[dict[str, Any]] = []
        self._open: tuple[_Scratch, Path] | None = None
        self._rows = 0
        self._bytes = 0
        self._extents: dict[str, tuple[int, int]] = {}

    def add(self, rows: pa.Table, extents: Mapping[str, Sequence[int]]) -> None:
        """Append ``rows`` (as stored) to the open file (one opened first); complete it once full."""
        if self._open is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            path = self.folder / scratch_name(self.spec.table, self.partition, self.attempt, len(self.done))
            self._open = (_Scratch(path.with_name(path.name + ".part"), rows.schema), path)
        self._open[0].add(rows)
        self._rows += rows.num_rows
        self._bytes += rows.nbytes
        _fold(self._extents, extents)
        if self.spec.chunk_bytes and self._bytes >= self.spec.chunk_bytes:
            self.complete()

    def complete(self) -> None:
        """Commit and close the open file and give it its final name (the driver may copy it now)."""
        if self._open is None:
            return
        scratch, path = self._open
        self._open = None
        try:
            scratch.commit()
        finally:
            scratch.close()
        path.with_name(path.name + ".part").replace(path)
        self.done.append({"path": str(path), "rows": self._rows, "extents": self._extents})
        self._rows, self._bytes, self._extents = 0, 0, {}

    def close(self) -> None:
        """Close an open file without completing it (a failed task: the file stays ``.part``)."""
        if self._open is not None:
            self._open[0].close()
            self._open = None


def write_task(spec: TaskSpec, batches: Iterable[pa.RecordBatch]) -> dict[str, Any]:
    """Step 1: one partition's rows as scratch SQLite files; their messages (no rows: no file).

    Returns:
        ``{"files": [{"path", "rows", "extents"}, ...]}`` (empty when the partition had no rows).

    Raises:
        BatchRejectedError: A value SQLite would not store as given.
    """
    task = running_task()
    batch_id = spec.batch_id if spec.batch_id >= 0 else task.batch_id
    table = spec.table_spec()
    files = _Files(spec, batch_id, task.partition, task.attempt)
    try:
        for raw in batches:
            if not raw.num_rows:
                continue
            batch = pa.Table.from_batches([raw])
            check_values(spec.table, table, batch)
            files.add(pa.table([stored_array(batch.column(c)) for c in batch.column_names],
                               names=batch.column_names), AddBounds.extents(table, batch))
            faults.task_reached(faults.CrashPoint.TASK_MID_WRITE, batch_id, task.attempt)  # open
        files.complete()
    finally:
        files.close()
    if files.done:
        faults.task_reached(faults.CrashPoint.TASK_AFTER_WRITE, batch_id, task.attempt)
    return {"files": files.done}


def run(frame: Any, spec: TaskSpec, tasks_at_most: int | None = None) -> list[dict[str, Any]]:
    """Step 1 in Spark's tasks, for the sink (:func:`onceflow.sinks._core.tasks.run_tasks`): the kept files.

    ``tasks_at_most`` coalesces the frame's partitions first (:func:`tasks_per_table`).
    """
    frame = frame if tasks_at_most is None else frame.coalesce(tasks_at_most)
    return [f for m in run_tasks(frame, functools.partial(write_task, spec)) for f in m["files"]]


def kept_files(spec: TaskSpec, batch_id: int, messages: Iterable[Any]) -> list[dict[str, Any]]:
    """Step 2: the files of the attempts Spark kept, each ``{"path", "rows", "extents"}``.

    A partition without rows has none.

    Raises:
        OnceflowError: A task's message is missing (Spark passes None for a task that failed).
    """
    missing = (f"batch {batch_id}: a task writing SQLite table {spec.table!r} sent no message; the batch "
               "runs again")
    return [f for m in kept_messages(messages, missing) for f in m["files"]]


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


class Scratches:
    """The scratch files a transaction of the driver reads (step 3): opened one by one, closed after it.

    SQLite holds a database attached to a transaction until the transaction ends, so a file
    cannot be detached after its copy. Where ``sqlite3`` deserializes, one in-memory database
    is attached once and each file read into it in turn (the file's bytes replace the last
    one's): any number of files. Elsewhere each file is attached (at most :data:`MAX_FILES`).

    Args:
        conn: The sink's connection.
        memory: Read files into memory (default: where this Python can).
    """

    ALIAS = "onceflow_scratch"

    def __init__(self, conn: sqlite3.Connection, memory: bool | None = None) -> None:
        self.conn = conn
        self.memory = reads_into_memory() if memory is None else memory
        self.aliases: list[str] = []  # the schemas attached in this transaction
        self._keys: dict[str, str] = {}  # table -> the temporary table of its keys seen
        self._buffer = bytearray()

    def room(self) -> bool:
        """Whether another file can be opened in this transaction."""
        return self.memory or len(self.aliases) < MAX_FILES

    def open(self, path: str) -> str:
        """Open the scratch file ``path``; the schema name its table ``rows`` is under.

        Raises:
            ConfigError: A file more than SQLite attaches (files attached: Python 3.10).
        """
        if not self.room():
            raise ConfigError(f"a batch's rows came in more than {MAX_FILES} scratch files, and this "
                              f"Python's sqlite3 ({sqlite3.sqlite_version}, Python < 3.11) can only attach "
                              f"them, {MAX_FILES} at most: coalesce the batch to {MAX_FILES} partitions "
                              "or fewer, or run the driver on Python 3.11+")
        if not self.memory:
            alias = f"onceflow_task{len(self.aliases)}"
            self.conn.execute(f"ATTACH DATABASE ? AS {alias}", (path,))
            self.aliases.append(alias)
            return alias
        if not self.aliases:
            self.conn.execute(f"ATTACH DATABASE ':memory:' AS {self.ALIAS}")
            self.aliases.append(self.ALIAS)
        with open(path, "rb") as f:  # into one buffer, reused: SQLite copies what it is given
            size = os.fstat(f.fileno()).st_size
            if len(self._buffer) < size:
                self._buffer = bytearray(size)
            view = memoryview(self._buffer)[:size]
            f.readinto(view)
        self.conn.deserialize(view, name=self.ALIAS)  # type: ignore[attr-defined]
        return self.ALIAS

    def check_keys(self, name: str, spec: Table, source: str) -> None:
        """Refuse a batch whose files (this one, ``source``, and those checked before) hold a key twice.

        The keys seen so far are kept in a temporary table of this transaction.

        Raises:
            BatchRejectedError: Naming the table and the key.
        """
        keys = ", ".join(quote(k) for k in spec.key)
        seen_keys = self._keys.get(name)
        if seen_keys is None:
            seen_keys = self._keys[name] = f"onceflow_keys{len(self._keys)}"
            self.conn.execute(f"CREATE TEMP TABLE {seen_keys} AS SELECT {keys} FROM {source}.rows "
                              "WHERE false")
            self.conn.execute(f"CREATE UNIQUE INDEX temp.{seen_keys}_unique ON {seen_keys}({keys})")
        found = self.conn.execute(f"SELECT {keys}, count(*) FROM {source}.rows GROUP BY {keys} "
                                  "HAVING count(*) > 1 LIMIT 1").fetchone()
        if not found:  # not twice in this file: once in it and once in a file before?
            match = " AND ".join(f"k.{quote(c)} IS s.{quote(c)}" for c in spec.key)
            seen = self.conn.execute(
                f"SELECT {keys} FROM {source}.rows AS s WHERE EXISTS "
                f"(SELECT 1 FROM temp.{seen_keys} AS k WHERE {match}) LIMIT 1").fetchone()
            found = (*seen, 2) if seen else None
        if found:
            key = dict(zip(spec.key, found[:-1], strict=True))
            raise BatchRejectedError(f"table {name!r}: key {key} appears {found[-1]} times in one batch; "
                                     "aggregate per key before writing; nothing of the batch was written")
        self.conn.execute(f"INSERT INTO temp.{seen_keys} SELECT {keys} FROM {source}.rows")

    def close(self) -> None:
        """Detach every file (after the transaction) and drop the keys checked."""
        for seen_keys in self._keys.values():
            self.conn.execute(f"DROP TABLE IF EXISTS temp.{seen_keys}")
        self._keys = {}
        for alias in self.aliases:
            self.conn.execute(f"DETACH DATABASE {alias}")
        self.aliases = []


def folded(files: Iterable[Mapping[str, Any]]) -> dict[str, tuple[int, int]]:
    """Column -> (lowest, highest) over every file's ``extents``."""
    out: dict[str, tuple[int, int]] = {}
    for f in files:
        _fold(out, f["extents"])
    return out


def tasks_per_table(tables: int) -> int | None:
    """How many tasks each of ``tables`` tables may have.

    Any (None) where files are read into memory; else :data:`MAX_FILES` files in all, one a task.
    """
    return None if reads_into_memory() else max(1, MAX_FILES // max(1, tables))


def too_many_tables(tables: int) -> bool:
    """Whether a batch of ``tables`` tables cannot take the tasks path (attached: a file a table at least)."""
    return not reads_into_memory() and tables > MAX_FILES

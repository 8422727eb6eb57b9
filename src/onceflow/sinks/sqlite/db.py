"""What every onceflow SQLite database shares: connection settings, onceflow's tables, binding.

Every transaction is ``BEGIN IMMEDIATE`` ... ``COMMIT`` with WAL journaling and
``synchronous=FULL``, so a committed transaction survives a SIGKILL or power loss.

onceflow's own tables (the user's tables are created by the sink, see
:mod:`onceflow.sinks.sqlite.sink`):

* ``onceflow_batches`` — one marker row per committed batch and sink id, with the batch's
  metrics (input rows, late drops, its DataFrame's rows ``events_counted``, duplicates dropped,
  rows written: all tables, and per table as JSON);
* ``onceflow_staged`` — batches durably handed over but not yet in the tables (the staged
  protocol of :mod:`onceflow.sinks.sqlite.sink`), as compressed Arrow IPC;
* ``onceflow_sinks`` — which checkpoint (query id) each sink id belongs to.
"""

from __future__ import annotations

import contextlib
import io
import json
import sqlite3
import time
from collections.abc import Iterator, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow.errors import BatchRejectedError, CheckpointMismatchError, ConfigError, StorageError
from onceflow.sinks._core import marker, owners
from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.sqlite.values import AddBounds, ddl

META_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS onceflow_sinks(
    sink_id TEXT PRIMARY KEY, query_id TEXT NOT NULL, bound_ms INTEGER NOT NULL);
{marker.create_table_sql("INTEGER", "TEXT")}
CREATE TABLE IF NOT EXISTS onceflow_staged(
    sink_id TEXT NOT NULL, batch_id INTEGER NOT NULL, staged_ms INTEGER NOT NULL,
    meta TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY(sink_id, batch_id));
"""
"""onceflow's own tables (every SQLite sink)."""

HAS_MARKER = "SELECT 1 FROM onceflow_batches WHERE sink_id = ? AND batch_id = ?"

PAGE_SIZE = 16_384
"""The page size of a database onceflow creates (SQLite's default is 4 KiB): a large batch's copy
(the tasks path) builds a quarter as many pages. Set before the file's first table; a database
made elsewhere keeps its own."""

CACHE_KIB = 65_536
"""Page cache per connection (64 MiB): the counts of a long run stay in memory (with SQLite's
default every batch of Example 5-1 re-read its table's pages: slower upserts, BENCHMARKS.md)."""

BUSY_TIMEOUT_S = 10
"""How long a statement waits for a lock another connection holds before ``database is locked``
(a batch's commit is then retried for ``write_stream(retry_for=)``, :mod:`onceflow.sinks._core.retry`)."""


def connect(path: str | Path, schema: str = META_SCHEMA) -> sqlite3.Connection:
    """Open a SQLite database with onceflow's durability settings and schema.

    Args:
        path: Database file (created if missing).
        schema: DDL run on open (onceflow's own tables, by default).

    Returns:
        A connection in autocommit mode (transactions are explicit).

    Raises:
        StorageError: The file or its directory cannot be opened or written (read-only, missing
            permissions, not a database), naming the path.
    """
    try:
        conn = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S, isolation_level=None,
                               check_same_thread=False)
        conn.execute(f"PRAGMA page_size={PAGE_SIZE}")  # a new file's; an existing one keeps its own
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(f"PRAGMA cache_size=-{CACHE_KIB}")
        conn.executescript(schema)
        relax_markers(conn)
    except sqlite3.DatabaseError as exc:
        text = str(exc).lower()
        if "locked" in text or "busy" in text:  # passes: retried by the caller (onceflow.sinks._core.retry)
            raise
        kind = "read_only" if "readonly" in text or "read-only" in text or "unable to open" in text else "io"
        raise StorageError(kind, f"cannot open the SQLite database {Path(path).resolve()}: {exc}. onceflow "
                                 "needs to read and write the file and create files beside it (its WAL "
                                 "journal): check the path, its directory's permissions and that the file "
                                 "system is writable") from exc
    return conn


def relax_markers(conn: sqlite3.Connection) -> None:
    """Make the metric columns of a marker table made by an older onceflow nullable (once).

    SQLite cannot drop a ``NOT NULL``: the table is copied into one of the current schema, in
    one transaction (a crash leaves the old table, and the next open does it again).
    """
    info = conn.execute(f"PRAGMA table_info({marker.TABLE})").fetchall()
    for name, kind in marker.ADDED if info else ():  # an older onceflow's table: add what it lacks
        if any(r[1] == name for r in info):
            continue
        try:
            conn.execute(f"ALTER TABLE {marker.TABLE} ADD COLUMN {name} {kind.upper()}")
        except sqlite3.OperationalError as exc:  # another connection added it first
            if "duplicate column" not in str(exc):
                raise
    if not any(r[1] in marker.METRICS and r[1] != "rejected_rows" and r[3] for r in info):
        return
    cols = ", ".join(r[1] for r in info if r[1] in marker.COLUMNS)
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute(f"ALTER TABLE {marker.TABLE} RENAME TO onceflow_batches_old")
        conn.execute(marker.create_table_sql("INTEGER", "TEXT"))
        conn.execute(f"INSERT INTO {marker.TABLE}({cols}) SELECT {cols} FROM onceflow_batches_old")
        conn.execute("DROP TABLE onceflow_batches_old")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


@contextlib.contextmanager
def immediate(conn: sqlite3.Connection) -> Iterator[sqlite3.Connection]:
    """One ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction (exclusive against other writers).

    Rolled back when the block raises (SQLite may have rolled back by itself, after a full disk).
    """
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise


def check_sink_id(sink_id: str) -> None:
    """Validate the sink id every SQLite sink takes.

    Raises:
        ConfigError: An empty sink id.
    """
    if not sink_id:
        raise ConfigError("sink_id must be a non-empty string")


def bind_query(conn: sqlite3.Connection, path: Path, sink_id: str, query_id: str) -> None:
    """Record (or check) which checkpoint a sink id of this database belongs to.

    Raises:
        CheckpointMismatchError: The sink id belongs to another checkpoint.
    """
    with immediate(conn):
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


def read_batches(path: str | Path, sink_id: str) -> list[dict[str, int]]:
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


def encode_staged(outputs: Mapping[str, pa.Table], specs: Mapping[str, Table], stats: BatchStats,
                  rows_out: int) -> tuple[str, bytes]:
    """A batch as a staged row (S3): metadata JSON and the tables as LZ4 Arrow IPC streams."""
    data = io.BytesIO()
    parts = []
    options = pa.ipc.IpcWriteOptions(compression="lz4")
    for name, rows in outputs.items():
        start = data.tell()
        with pa.ipc.new_stream(data, rows.schema, options=options) as writer:
            writer.write_table(rows)
        spec = specs[name]
        parts.append({"name": name, **spec.describe(), "bytes": data.tell() - start})
    meta = {"tables": parts, **asdict(stats), "rows_out": rows_out}  # Spark Connect's amendment too
    return json.dumps(meta), data.getvalue()


def decode_staged(meta_json: str,
                  data: bytes) -> tuple[dict[str, pa.Table], dict[str, Table], BatchStats, int]:
    """A staged row back as the arguments of :meth:`SQLiteTablesSink.commit_tables`."""
    meta = json.loads(meta_json)
    outputs, specs, offset = {}, {}, 0
    view = memoryview(data)
    for part in meta["tables"]:
        chunk = view[offset:offset + part["bytes"]]
        offset += part["bytes"]
        outputs[part["name"]] = pa.ipc.open_stream(pa.py_buffer(chunk)).read_all()
        described = ("key", "add", "max", "min", "mode", "shared")  # (max, min, shared: absent in older rows)
        specs[part["name"]] = Table(**{k: part[k] for k in described if k in part})
    stats = BatchStats.from_dict(meta)  # its BatchStats fields (some absent in an older row)
    return outputs, specs, stats, int(meta["rows_out"])


def broken(name: str, exc: sqlite3.IntegrityError) -> BatchRejectedError:
    """Step 3 / T4 of the sink: the rows break a constraint of table ``name`` (the transaction rolls back)."""
    return BatchRejectedError(f"table {name!r}: the batch breaks a constraint of the table ({exc}); "
                              "nothing of the batch was written")


def only_own_tables(conn: sqlite3.Connection, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                    bounds: AddBounds) -> bool:
    """Whether every table of a batch is exactly as onceflow creates it, with nothing of the user's.

    The sink's step S2: such a table's only constraint is its primary key (no trigger, no index
    but the key, not ``append`` with a key), and no integer ``add`` column can leave 64 bits
    (``bounds``), so that writing the batch later cannot fail.
    """
    names = list(outputs)
    marks = ",".join("?" * len(names))
    schema = conn.execute(f"SELECT type, name, tbl_name, sql FROM sqlite_master WHERE tbl_name IN "
                          f"({marks})", names).fetchall()
    created = {tbl: sql for typ, _, tbl, sql in schema if typ == "table"}
    for name, rows in outputs.items():
        spec = specs[name]
        try:
            if spec.mode == "append" and spec.key or created.get(name) not in (
                    ddl(name, spec, rows.schema), ddl(name, spec, rows.schema, strict=False)):
                return False
        except ConfigError:  # e.g. a column of type null (an empty batch): the direct path decides
            return False
        if not bounds.safe(conn, name, spec, rows):  # a sum could leave 64 bits: checked there
            return False
    # a trigger, or an index the user added (onceflow's tables have only their primary key)
    return not any(typ == "trigger" or typ == "index" and sql is not None for typ, _, _, sql in schema)


def claim_tables(conn: Any, where: str, sink_id: str, specs: Mapping[str, Table], tool: str) -> None:
    """:func:`onceflow.sinks._core.owners.claim` on a SQLite database (one ``BEGIN IMMEDIATE``).

    Runs on the driver at the sink's start-up check (and an HTTP ledger's), any number of times.
    """
    registry = owners.TABLE

    def read(table: str) -> list[tuple[str, bool]]:
        rows = conn.execute(f"SELECT sink_id, shared FROM {registry} WHERE table_name = ?", (table,))
        return [(str(s), bool(f)) for s, f in rows]

    def write(table: str, shared: bool) -> None:
        conn.execute(f"INSERT INTO {registry} VALUES (?,?,?,?) ON CONFLICT(table_name, sink_id) DO UPDATE "
                     "SET shared = excluded.shared", (table, sink_id, int(shared), owners.now_ms()))

    conn.execute(owners.create_sql("INTEGER", "TEXT"))
    with immediate(conn):
        owners.claim(read, write, where, sink_id, specs, tool)


def table_owners(conn: Any) -> list[tuple[str, str, bool, int]]:
    """Every row of a SQLite database's registry: ``(table, sink_id, shared, claimed_ms)``."""
    conn.execute(owners.create_sql("INTEGER", "TEXT"))
    return [(t, s, bool(f), int(m)) for t, s, f, m in conn.execute(
        f"SELECT table_name, sink_id, shared, claimed_ms FROM {owners.TABLE} ORDER BY 1, 2")]


def hand_over_table(conn: Any, table: str, to: str) -> list[str]:
    """Give ``table`` to sink id ``to`` (``onceflow tables --hand-over``); the sink ids that held it."""
    registry = owners.TABLE
    conn.execute(owners.create_sql("INTEGER", "TEXT"))
    with immediate(conn):
        held = conn.execute(f"SELECT sink_id FROM {registry} WHERE table_name = ?", (table,))
        before = [r[0] for r in held]
        conn.execute(f"DELETE FROM {registry} WHERE table_name = ?", (table,))
        conn.execute(f"INSERT INTO {registry} VALUES (?,?,0,?)", (table, to, owners.now_ms()))
    return before

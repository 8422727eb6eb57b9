"""The generic SQLite sink: DataFrames of any schema into tables, each micro-batch exactly once.

Every table of a batch and the batch's marker commit in one SQLite transaction
(``BEGIN IMMEDIATE`` ... ``COMMIT``, WAL, ``synchronous=FULL``). Commit protocol of
:meth:`SQLiteTablesSink.commit_tables` for batch N:

1. Crash point ``before_sink_write``. Every table's rows are checked against its spec
   (:func:`onceflow.tables.check_batch`) and converted to SQLite values; a batch that does
   not fit raises :class:`onceflow.errors.BatchRejectedError` here — nothing is written and
   Spark does not write ``commits/N``. May run any number of times.
2. Open the transaction. If the marker ``(sink_id, N)`` exists, roll back and return False:
   an earlier attempt committed N (a replay after a crash is a no-op).
3. Create missing tables from the batch's schema (key = primary key); an existing table that
   lacks a column of the batch or has another key is refused (:class:`ConfigError`) before
   any row is written. Write each table by its mode (``append``: insert; ``upsert``: insert
   or replace the non-key columns; ``add``: insert or add the ``add`` columns), in key order.
   A constraint the rows break (e.g. a ``NOT NULL`` or ``CHECK`` of the user's own table)
   rolls everything back and raises :class:`BatchRejectedError` naming the table.
4. Insert the marker with the batch's metrics. Crash point ``inside_sink_txn``: nothing is
   visible until the commit.
5. Commit durably. Crash point ``after_sink_commit`` (and the ``ambiguous_commit`` fault):
   Spark has not written ``commits/N``; it re-runs N after a restart and step 2 skips it.
6. Return True; Spark writes ``commits/N``.

Types: integers and booleans are ``INTEGER``, floats and decimals ``REAL``, strings
``TEXT``, binary ``BLOB``, timestamps ``TEXT`` in UTC (``YYYY-MM-DD HH:MM:SS.ffffff``, which
sorts and compares correctly and SQLite's date functions read), dates ``TEXT``
(``YYYY-MM-DD``). Nested types are refused.

The marker row (``onceflow_batches``, :mod:`onceflow.sinks.sqlite`) holds the batch's
input rows, late drops, the rows its DataFrame had (``events_counted``), duplicates dropped
(input minus late minus those), rows written over all tables and per table (``tables``, JSON).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from onceflow.errors import BatchRejectedError, ConfigError
from onceflow.faults import CrashPoint, maybe_crash
from onceflow.sinks.base import BatchStats
from onceflow.sinks.sqlite import HAS_MARKER, Mode, bind_query, check_sink_args, connect
from onceflow.tables import Table, check_outputs

_MARKER = ("INSERT OR REPLACE INTO onceflow_batches(sink_id, batch_id, committed_ms, input_rows, "
           "late_dropped, duplicates_dropped, events_counted, rows_written, late_watermark_ms, tables) "
           "VALUES (?,?,?,?,?,?,?,?,?,?)")


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def sql_type(typ: pa.DataType) -> str:
    """The SQLite column type an Arrow type is stored as.

    Raises:
        ConfigError: A nested or otherwise unsupported type.
    """
    if pa.types.is_dictionary(typ):
        return sql_type(typ.value_type)
    if pa.types.is_integer(typ) or pa.types.is_boolean(typ):
        return "INTEGER"
    if pa.types.is_floating(typ) or pa.types.is_decimal(typ):
        return "REAL"
    if pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_timestamp(typ) \
            or pa.types.is_date(typ):
        return "TEXT"
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        return "BLOB"
    raise ConfigError(f"type {typ} cannot be stored in a SQLite column; select or flatten it first")


def _column(col: pa.ChunkedArray) -> list[Any]:
    """Python values of a column as SQLite stores them (see the module's types)."""
    typ = col.type
    if pa.types.is_dictionary(typ):
        col = col.cast(typ.value_type)
        typ = typ.value_type
    if pa.types.is_timestamp(typ):
        if typ.tz is not None:
            col = col.cast(pa.timestamp(typ.unit, tz="UTC"))
        return pc.strftime(col, format="%Y-%m-%d %H:%M:%S").to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_date(typ):
        return col.cast(pa.string()).to_pylist()  # type: ignore[no-any-return]
    if pa.types.is_decimal(typ):
        return col.cast(pa.float64()).to_pylist()  # type: ignore[no-any-return]
    return col.to_pylist()  # type: ignore[no-any-return]


def _statements(name: str, spec: Table, columns: list[str]) -> str:
    cols = ", ".join(_quote(c) for c in columns)
    insert = f"INSERT INTO {_quote(name)}({cols}) VALUES ({', '.join('?' * len(columns))})"
    if spec.mode == "append":
        return insert
    rest = [c for c in columns if c not in spec.key]
    sets = [f"{_quote(c)} = {_quote(c)} + excluded.{_quote(c)}" if c in spec.add
            else f"{_quote(c)} = excluded.{_quote(c)}" for c in rest]
    conflict = f" ON CONFLICT({', '.join(_quote(k) for k in spec.key)})"
    return insert + (conflict + " DO UPDATE SET " + ", ".join(sets) if sets else conflict + " DO NOTHING")


class SQLiteTablesSink:
    """Tables of any schema in one SQLite database (see the module protocol).

    Args:
        path: Database file (created with its directory if missing).
        sink_id: Marker namespace: two queries writing to one database need different ids.
        mode: ``exactly_once``; ``naive`` (no marker check: a replay is written again) and
            ``lossy`` (marker committed before the rows) are negative controls for tests.
    """

    def __init__(self, path: str | Path, sink_id: str = "default", mode: Mode = "exactly_once") -> None:
        check_sink_args(mode, sink_id)
        self.path = Path(path)
        self.sink_id = sink_id
        self.mode = mode
        self._conn: sqlite3.Connection | None = None
        self._checked: dict[str, tuple[Table, tuple[str, ...]]] = {}

    def __repr__(self) -> str:
        return f"onceflow.sqlite({str(self.path)!r}, sink_id={self.sink_id!r})"

    @property
    def conn(self) -> sqlite3.Connection:
        """The open connection (opened on first use)."""
        if self._conn is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._conn = connect(self.path)
            cols = {r[1] for r in self._conn.execute("PRAGMA table_info(onceflow_batches)")}
            if "tables" not in cols:
                self._conn.execute("ALTER TABLE onceflow_batches ADD COLUMN tables TEXT")
        return self._conn

    def bind(self, query_id: str) -> None:
        """Tie the sink to the checkpoint with ``query_id`` (idempotent).

        Raises:
            CheckpointMismatchError: The database holds this sink id for another checkpoint.
        """
        bind_query(self.conn, self.path, self.sink_id, query_id)

    def _fit(self, name: str, spec: Table, schema: pa.Schema) -> None:
        """Step 3's table check: create the table, or check that an existing one fits.

        Runs inside the batch's transaction (a table it creates exists only if the batch
        commits); :meth:`commit_tables` remembers the tables that fit once it committed.
        """
        cols = tuple(schema.names)
        if self._checked.get(name) == (spec, cols):
            return
        types = [sql_type(schema.field(c).type) for c in cols]
        info = self.conn.execute(f"PRAGMA table_info({_quote(name)})").fetchall()
        if not info:
            key = f", PRIMARY KEY({', '.join(_quote(k) for k in spec.key)})" if spec.key else ""
            body = ", ".join(f"{_quote(c)} {t}" for c, t in zip(cols, types, strict=True))
            rowid = " WITHOUT ROWID" if spec.key else ""  # one B-tree keyed by the key: faster upserts
            self.conn.execute(f"CREATE TABLE IF NOT EXISTS {_quote(name)}({body}{key}){rowid}")
        else:
            have = {r[1] for r in info}
            missing = [c for c in cols if c not in have]
            if missing:
                raise ConfigError(f"table {name!r} in {self.path} has no column(s) {missing} that the batch "
                                  f"has (it has {sorted(have)}); add them or write to another table")
            pk = tuple(r[1] for r in sorted((r for r in info if r[5]), key=lambda r: r[5]))
            if spec.key and set(pk) != set(spec.key):
                raise ConfigError(f"table {name!r} in {self.path} has primary key {list(pk)}, but its spec "
                                  f"says key={list(spec.key)}; {spec.mode} needs them to be the same")

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Write batch ``batch_id`` to every table unless it was already committed.

        May be called again with the same arguments (after a crash); only the first call
        that commits has an effect.

        Args:
            batch_id: Spark's micro-batch id.
            outputs: Table name -> the batch's rows for it.
            specs: Table name -> its spec (every output needs one).
            stats: The batch's input rows and late drops.
            rows_out: Rows of the batch's DataFrame (after deduplication and late drops).

        Returns:
            True if this call committed the batch, False for a replay.

        Raises:
            BatchRejectedError: The rows do not fit the specs or the tables (nothing written).
            ConfigError: An existing table does not fit (nothing written).
        """
        maybe_crash(CrashPoint.BEFORE_SINK_WRITE, batch_id)  # 1
        check_outputs(outputs, specs)
        prepared = []
        for name, rows in outputs.items():
            spec = specs[name]
            if spec.key:
                rows = rows.sort_by([(k, "ascending") for k in spec.key])
            values = list(zip(*(_column(rows.column(c)) for c in rows.column_names), strict=True))
            prepared.append((name, spec, rows.schema, values))
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")  # 2
        try:
            if self.mode != "naive" and conn.execute(HAS_MARKER, (self.sink_id, batch_id)).fetchone():
                conn.execute("ROLLBACK")
                return False
            if self.mode == "lossy":  # negative control: the marker commits before the rows
                self._marker(batch_id, stats, rows_out, {n: len(v) for n, _, _, v in prepared})
                conn.execute("COMMIT")
                maybe_crash(CrashPoint.INSIDE_SINK_TXN, batch_id)
                conn.execute("BEGIN IMMEDIATE")
            written = {}
            for name, spec, schema, values in prepared:  # 3
                self._fit(name, spec, schema)
                try:
                    conn.executemany(_statements(name, spec, schema.names), values)
                except sqlite3.IntegrityError as exc:
                    raise BatchRejectedError(f"table {name!r}: the batch breaks a constraint of the table "
                                             f"({exc}); nothing of the batch was written") from None
                written[name] = len(values)
            if self.mode != "lossy":
                self._marker(batch_id, stats, rows_out, written)  # 4
                maybe_crash(CrashPoint.INSIDE_SINK_TXN, batch_id)
            conn.execute("COMMIT")  # 5
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        for name, spec, schema, _ in prepared:
            self._checked[name] = (spec, tuple(schema.names))
        maybe_crash(CrashPoint.AFTER_SINK_COMMIT, batch_id)
        maybe_crash(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return True  # 6

    def _marker(self, batch_id: int, stats: BatchStats, rows_out: int, written: dict[str, int]) -> None:
        dropped = max(stats.input_rows - stats.late_dropped - rows_out, 0)
        self.conn.execute(_MARKER, (self.sink_id, batch_id, int(time.time() * 1000), stats.input_rows,
                                    stats.late_dropped, dropped, rows_out, sum(written.values()),
                                    stats.late_watermark_ms, json.dumps(written)))

    def batches(self) -> list[dict[str, Any]]:
        """This sink's marker rows, by batch id (what the auditor and users read)."""
        cur = self.conn.execute("SELECT * FROM onceflow_batches WHERE sink_id = ? ORDER BY batch_id",
                                (self.sink_id,))
        names = [d[0] for d in cur.description]
        return [dict(zip(names, r, strict=True)) for r in cur]

    def flush(self) -> None:
        """Nothing to wait for: every batch is applied inside its commit."""

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None

"""The generic PostgreSQL sink, driver side: DataFrames of any schema, each micro-batch exactly once.

For outputs a driver can hold (per-window aggregates, a batch's few thousand rows). The same
table specs and checks as the SQLite sink (:mod:`onceflow.sinks.sqlite.sink`); the rows go
from the driver to the server with ``COPY``. Commit protocol of
:meth:`PostgresTablesSink.commit_tables` for batch N:

1. Crash point ``before_sink_write``. Every table's rows are checked against its spec (and for
   a string with a NUL character, which PostgreSQL's text cannot hold:
   :func:`onceflow.sinks.postgres.refusals.check_text`); a batch that does not fit raises
   :class:`onceflow.errors.BatchRejectedError` — nothing written, Spark does not write
   ``commits/N``. May run any number of times.
2. Open a transaction and take the sink's advisory lock (one writer per sink). If the marker
   ``(sink_id, N)`` exists, end it and return False (a replay).
3. Per table: create it from the batch's schema if missing (key = primary key), else check
   that it has the batch's columns and the spec's key; ``COPY`` the rows into a temporary
   table dropped at commit; then one ``INSERT ... SELECT`` into the target: plain (``append``),
   ``ON CONFLICT (key) DO UPDATE SET`` the other columns (``upsert``), or adding the ``add``
   columns (``add``). A constraint the rows break rolls everything back
   (:class:`BatchRejectedError` naming the table).
4. Insert the marker with the batch's metrics. Crash point ``inside_sink_txn``.
5. Commit (the server's ``synchronous_commit`` must stay on). Crash point
   ``after_sink_commit`` and the ``ambiguous_commit`` fault: Spark re-runs N, step 2 skips it.
6. Return True; Spark writes ``commits/N``.

A batch whose input has ``collect_below`` rows or more (a backlog; :func:`onceflow.write_stream`
decides before the batch runs) never passes through the driver, in the same one transaction
(:meth:`PostgresTablesSink.commit_frames`):

T1. Crash point ``before_sink_write``. Spark checks the keys (:func:`onceflow.sinks._core.checks.check_frame`:
    a missing column, a null key, a key twice).
T2. If the marker exists, return False (a replay runs no task). Tables that do not exist are
    created as step 3 would (each in a transaction of its own: an empty table).
T3. Spark's tasks ``COPY`` each table's rows into its unlogged staging table and the driver
    records the attempts Spark kept (:mod:`onceflow.sinks.postgres.stage`, steps 1-2). A NUL in a
    string fails a task's ``COPY``: the batch is refused naming the row.
T4. One transaction, the sink's lock: if the marker exists, delete what N staged and return
    False. Per table: the kept rows counted and moved by the table's mode (a savepoint: a
    constraint they break, or an ``add`` past bigint, refuses the batch naming the table and
    the key). Insert the marker; delete the staged rows. Crash point ``inside_sink_txn``.
T5. Commit. Crash point ``after_sink_commit`` (and ``ambiguous_commit``); return True.

One table without a key may come uncached (``settle``, ``Sink.writes_uncached``): T3 is the batch's
only Spark job; T4 settles the marker's numbers from the rows it moved.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import pyarrow as pa

from onceflow import faults
from onceflow.errors import BatchRejectedError, ConfigError, PostgresError
from onceflow.faults import CrashPoint
from onceflow.sinks._core import marker
from onceflow.sinks._core.base import Settle, SinkBase, collected
from onceflow.sinks._core.checks import check_existing, check_frame, check_outputs
from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.postgres import refusals, stage
from onceflow.sinks.postgres import sql as pg
from onceflow.sinks.postgres.conn import require_psycopg
from onceflow.sinks.postgres.writer import TargetSpec

_MARKER = marker.insert_sql("%s", suffix="ON CONFLICT (sink_id, batch_id) DO NOTHING")


def _stage_options(dsn: str, sink_id: str, name: str, spec: Table, batch_id: int) -> dict[str, Any]:
    """The ``onceflow_postgres`` options of one table's T3 (protocol ``stage``, the sink's marker)."""
    mode = "append" if spec.mode == "append" else "upsert"
    return {"dsn": dsn, "table": name, "sink_id": sink_id, "mode": mode, "key": ",".join(spec.key),
            "add": ",".join(spec.add), "max": ",".join(spec.max), "min": ",".join(spec.min),
            "protocol": "stage", "batch_id": batch_id, "query_id": "", "metrics": "{}"}


class PostgresTablesSink(SinkBase):
    """Tables of any schema in PostgreSQL, written from the driver (see the module protocol).

    Args:
        dsn: Connection string (else ``$ONCEFLOW_PG_DSN``).
        sink_id: Marker namespace: two queries writing to one database need different ids.
        collect_below: A batch with fewer rows (all tables) is collected to the driver; a larger
            one is staged by Spark's tasks and moved by the driver (T1-T5), in one transaction
            all the same.
    """

    all_or_nothing = True
    """Every table of a batch commits in one transaction."""
    writes_uncached = True

    def __init__(self, dsn: str | None = None, sink_id: str = "default",
                 collect_below: int = 100_000) -> None:
        require_psycopg()
        self.dsn = pg.resolve_dsn(dsn)
        self.sink_id = pg.check_sink_id(sink_id)
        self.collect_below = collect_below
        self._conn: Any = None
        self._checked: dict[str, tuple[Table, tuple[str, ...]]] = {}

    def __repr__(self) -> str:
        return f"onceflow.postgres({pg.redact(self.dsn)!r}, sink_id={self.sink_id!r})"

    def repair_options(self) -> str:
        """``--dsn DSN --sink-id ID`` (the password left out)."""
        return f"--dsn {pg.redact(self.dsn)} --sink-id {self.sink_id}"

    @property
    def conn(self) -> Any:
        """The open autocommit connection (opened, with onceflow's tables, on first use)."""
        if self._conn is None or self._conn.broken:
            conn = pg.connect(self.dsn)
            pg.ensure_meta(conn)
            self._conn = conn
        return self._conn

    def bind(self, query_id: str) -> None:
        """Tie the sink to the checkpoint with ``query_id`` (idempotent).

        Raises:
            CheckpointMismatchError: The database holds this sink id for another checkpoint.
        """
        pg.bind_sink(self.conn, self.sink_id, query_id, pg.redact(self.dsn))

    def _fit(self, conn: Any, name: str, spec: Table, schema: pa.Schema) -> None:
        """Step 3's table check (inside the batch's transaction)."""
        from psycopg import sql

        cols = tuple(schema.names)
        if self._checked.get(name) == (spec, cols):
            return
        found = pg.existing_table(conn, name)
        if found is None:
            types = {c: pg.pg_type(schema.field(c).type) for c in cols}
            conn.execute(sql.SQL("CREATE TABLE {} ({})").format(sql.Identifier(name),
                                                                pg.table_body(types, spec.key)))
            return
        check_existing("PostgreSQL", name, spec, cols, *found)

    def check(self, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:
        """Connect; check the tables that exist; claim them (:meth:`onceflow.sinks._core.base.Sink.check`)."""
        pg.check_names(specs, schemas)
        pg.check_tables(self.conn, specs, schemas)
        pg.claim_tables(self.conn, pg.redact(self.dsn), self.sink_id, specs, "--dsn DSN")

    def _write(self, conn: Any, name: str, spec: Table, rows: pa.Table) -> int:
        from psycopg import sql

        cols = rows.column_names
        tmp = sql.Identifier(pg.derived_name(name, prefix="onceflow_in_"))
        target = sql.Identifier(name)
        collist = sql.SQL(", ").join(map(sql.Identifier, cols))
        conn.execute(sql.SQL("CREATE TEMP TABLE {} ON COMMIT DROP AS SELECT {} FROM {} WITH NO DATA")
                     .format(tmp, collist, target))
        pg.copy_arrow(conn, tmp, cols, rows)
        insert = sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(target, collist, collist, tmp)
        if spec.mode != "append":
            insert = insert + pg.on_conflict(cols, spec.key, target, spec.merged)
        conn.execute(insert)
        return int(rows.num_rows)

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Write batch ``batch_id`` to every table unless it was already committed.

        Same contract as :meth:`onceflow.sinks.sqlite.sink.SQLiteTablesSink.commit_tables`.

        Raises:
            BatchRejectedError: The rows do not fit the specs or the tables (nothing written).
            ConfigError: An existing table does not fit (nothing written).
            PostgresError: The server failed the transaction (nothing written).
        """
        faults.reached(CrashPoint.BEFORE_SINK_WRITE, batch_id)  # 1
        check_outputs(outputs, specs)
        for name, rows in outputs.items():
            refusals.check_text(name, specs[name], rows)

        def write(name: str) -> Callable[[Any], int]:
            def run(conn: Any) -> int:
                self._fit(conn, name, specs[name], outputs[name].schema)
                return self._write(conn, name, specs[name], outputs[name])
            return run

        def overflow(conn: Any, name: str) -> str | None:
            return refusals.collected_overflow(conn, name, specs[name], outputs[name])

        done = self._transact(batch_id, {n: write(n) for n in outputs}, overflow, stats, rows_out)  # 2-5
        if done:
            for name, rows in outputs.items():
                self._checked[name] = (specs[name], tuple(rows.schema.names))
        return done  # 6

    def commit_frames(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int, written: Mapping[str, int] | None = None,
                      settle: Settle | None = None) -> bool:
        """Write batch ``batch_id`` given as DataFrames (T1-T5; a small batch collected: steps 1-6).

        Raises:
            BatchRejectedError: The rows do not fit the specs or the tables (nothing written).
            ConfigError: An existing table does not fit (nothing written).
            PostgresError: The server failed the transaction (nothing written).
        """
        from onceflow.sinks._core.checks import arrow_schema
        from onceflow.sinks.postgres.datasource import stage_frame

        counts = None if settle is not None else self._counted(batch_id, frames, specs, written)  # T1
        if counts is None:  # written once, by the tasks: nothing counts or reads it before
            self._check_start(batch_id, frames, specs)
        elif sum(counts.values()) < self.collect_below:
            return self.commit_tables(batch_id, collected(frames), specs, stats, rows_out)
        for name, frame in frames.items():
            check_frame(name, specs[name], frame)
        if self._committed(self.conn, batch_id):  # T2
            return False
        for name, frame in frames.items():
            with self.conn.transaction():
                self._fit(self.conn, name, specs[name], arrow_schema(frame.schema))
        options = {n: _stage_options(self.dsn, self.sink_id, n, specs[n], batch_id) for n in frames}
        for name, frame in frames.items():  # T3
            if counts is None or counts[name]:
                try:
                    stage_frame(frame, **options[name])
                except Exception as exc:
                    if "0x00" in str(exc):  # a task's COPY met a NUL: named here, on the error path only
                        refusals.refuse_nul(name, specs[name], frame)
                    raise
        targets = {n: TargetSpec.from_options(o, frames[n].schema) for n, o in options.items()}
        return self._move(batch_id, targets, counts, specs, stats, rows_out, settle)

    def _move(self, batch_id: int, targets: Mapping[str, TargetSpec], counts: Mapping[str, int] | None,
              specs: Mapping[str, Table], stats: BatchStats,
              rows_out: int, settle: Settle | None = None) -> bool:
        """T4-T5: every table's staged rows and the marker, in one transaction (``settle``: its numbers)."""
        def move(name: str) -> Callable[[Any], int]:
            moved = counts is None or bool(counts[name])
            return lambda conn: stage.move(conn, targets[name], batch_id) if moved else 0

        def overflow(conn: Any, name: str) -> str | None:
            return refusals.staged_overflow(conn, name, specs[name], targets[name], batch_id)

        def forget(conn: Any) -> None:  # the stage's rows of the batch go with the commit (or the replay)
            stage.forget(conn, targets.values(), self.sink_id, batch_id)

        writes = {n: move(n) for n in targets}
        return self._transact(batch_id, writes, overflow, stats, rows_out, settle, forget)

    def _transact(self, batch_id: int, writes: Mapping[str, Callable[[Any], int]],
                  overflow: Callable[[Any, str], str | None], stats: BatchStats, rows_out: int,
                  settle: Settle | None = None, done: Callable[[Any], None] | None = None) -> bool:
        """Steps 2-5 (T4-T5) of either path: one transaction for every table of the batch and its marker.

        ``writes[name](conn)`` writes a table in a savepoint (an error names its table; a bigint
        out of range also its key, from ``overflow``) and returns its rows; ``settle`` gives the
        marker's numbers from them; ``done`` runs in the transaction last, a replay's too.

        Raises:
            BatchRejectedError: A table's constraint refused the rows (nothing written).
            PostgresError: The server failed the transaction (nothing written).
        """
        psycopg = require_psycopg()
        conn = self.conn
        try:
            with conn.transaction():  # 2
                pg.lock_sink(conn, self.sink_id)
                if self._committed(conn, batch_id):
                    if done is not None:
                        done(conn)
                    return False
                written = {}
                for name, write in writes.items():  # 3
                    try:
                        with conn.transaction():  # a savepoint: the error names the table
                            written[name] = write(conn)
                    except (psycopg.errors.IntegrityError, psycopg.errors.DataError) as exc:
                        which = overflow(conn, name) \
                            if isinstance(exc, psycopg.errors.NumericValueOutOfRange) else None
                        raise BatchRejectedError(f"table {name!r}: the batch breaks a constraint of the "
                                                 f"table ({str(exc).strip()}){which or ''}; nothing of the "
                                                 "batch was written") from None
                if settle is not None:
                    stats, rows_out = settle(written)
                row = marker.marker_row(self.sink_id, batch_id, stats, rows_out, written)
                conn.execute(_MARKER, row)  # 4
                for sql, values in marker.amendments("%s", self.sink_id, stats):  # the batch before's
                    conn.execute(sql, values)
                if done is not None:
                    done(conn)
                faults.reached(CrashPoint.INSIDE_SINK_TXN, batch_id)
        except psycopg.Error as exc:
            raise PostgresError(f"batch {batch_id} of sink {self.sink_id!r} failed in PostgreSQL: "
                                f"{pg.scrub(str(exc), self.dsn).strip()}") from None
        faults.reached(CrashPoint.AFTER_SINK_COMMIT, batch_id)  # 5
        faults.reached(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
        return True

    def _committed(self, conn: Any, batch_id: int) -> bool:
        """Step 2's check, inside the transaction: whether the marker of ``batch_id`` is there."""
        return bool(pg.has_marker(conn, self.sink_id, batch_id))

    def batches(self) -> list[dict[str, Any]]:
        """This sink's marker rows, by batch id."""
        return pg.read_batches(self.dsn, self.sink_id)

    def flush(self) -> None:
        """Nothing to wait for: a batch is in the tables when ``commit_tables`` returns."""

    def close(self) -> None:
        """Close the connection (idempotent)."""
        if self._conn is not None:
            self._conn.close()
            self._conn = None


class PostgresFramesSink(SinkBase):
    """Tables of any schema in PostgreSQL, written by Spark's executors (large outputs).

    Each table of a batch goes through the ``onceflow_postgres`` data source with the
    ``staged`` or ``2pc`` protocol of :mod:`onceflow.sinks.postgres.writer`, under the sink id
    ``<sink_id>.<table>``: each table gets each batch exactly once, by its own marker (a crash
    between two tables' commits leaves one a batch ahead until the re-run writes the other).
    Once every table committed, the batch's own row is added under ``sink_id`` (with the
    rows each table's marker recorded): the same history as every other sink's.
    Before anything is written the batch is checked with Spark (null keys, a key twice):
    :class:`onceflow.errors.BatchRejectedError` with the first bad row. A value the server then
    refuses (a NUL in text, an ``add`` sum past bigint) fails the batch before its commit; the
    error is replaced by one naming the row's key and value, found on that error path only.

    Args:
        dsn: Connection string (else ``$ONCEFLOW_PG_DSN``).
        sink_id: Marker namespace prefix.
        protocol: ``staged`` or ``2pc``.
    """

    all_or_nothing = False
    """Each table of a batch commits on its own."""

    def __init__(self, dsn: str | None = None, sink_id: str = "default", protocol: str = "staged") -> None:
        require_psycopg()
        if protocol not in ("staged", "2pc"):
            raise ConfigError(f"protocol must be 'driver', 'staged' or '2pc', got {protocol!r}")
        self.dsn = pg.resolve_dsn(dsn)
        self.sink_id = pg.check_sink_id(sink_id)
        self.protocol = protocol
        self.query_id = ""

    def __repr__(self) -> str:
        return (f"onceflow.postgres({pg.redact(self.dsn)!r}, sink_id={self.sink_id!r}, "
                f"protocol={self.protocol!r})")

    def repair_options(self) -> str:
        """``--dsn DSN --sink-id ID`` (the password left out)."""
        return f"--dsn {pg.redact(self.dsn)} --sink-id {self.sink_id}"

    def bind(self, query_id: str) -> None:
        """Tie the sink id to the checkpoint; each table's ``<sink_id>.<table>`` is bound by its first write.

        Raises:
            CheckpointMismatchError: The sink id belongs to another checkpoint.
        """
        with pg.session(self.dsn) as conn:
            pg.bind_sink(conn, self.sink_id, query_id, pg.redact(self.dsn))
        self.query_id = query_id

    def commit_frames(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int, written: Mapping[str, int] | None = None) -> bool:
        """Write each table's DataFrame from the executors, each exactly once.

        Returns:
            True if the first table's batch was committed by this call (False: a replay).
        """
        from onceflow.sinks.postgres.datasource import write_frame

        faults.reached(CrashPoint.BEFORE_SINK_WRITE, batch_id)
        check_outputs(frames, specs, rows=False)
        for name, frame in frames.items():
            check_frame(name, specs[name], frame)
        first = next(iter(frames), None)
        with pg.session(self.dsn) as conn:
            replay = first is not None and pg.has_marker(conn, f"{self.sink_id}.{first}", batch_id)
        metrics = json.dumps(stats.metrics(rows_out))
        for name, frame in frames.items():
            spec = specs[name]
            try:
                write_frame(frame, dsn=self.dsn, table=name, sink_id=f"{self.sink_id}.{name}",
                            mode="append" if spec.mode == "append" else "upsert", key=",".join(spec.key),
                            add=",".join(spec.add), max=",".join(spec.max), min=",".join(spec.min),
                            protocol=self.protocol, batch_id=batch_id,
                            query_id=self.query_id, metrics=metrics)
            except Exception as exc:
                if "0x00" in str(exc):  # a task's COPY met a NUL: named here, on the error path only
                    refusals.refuse_nul(name, spec, frame)
                if "out of range" in str(exc):  # a merge left bigint: which key
                    refusals.refuse_overflow(self.dsn, name, spec, frame)
                raise
        self._summarize(batch_id, list(frames), stats, rows_out)
        return not replay

    def check(self, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:
        """Connect; check the tables that exist (see :meth:`onceflow.sinks._core.base.Sink.check`)."""
        pg.check_names(specs, schemas, self.sink_id)
        with pg.session(self.dsn) as conn:
            pg.check_tables(conn, specs, schemas)
            pg.claim_tables(conn, pg.redact(self.dsn), self.sink_id, specs, "--dsn DSN")

    def _summarize(self, batch_id: int, tables: list[str], stats: BatchStats, rows_out: int) -> None:
        """The batch's row under ``sink_id``, from its tables' markers (after every table committed).

        Idempotent: the rows written per table are those each table's marker recorded when it
        committed, whichever attempt adds the row; a replay adds nothing new.
        """
        ids = {f"{self.sink_id}.{t}": t for t in tables}
        with pg.session(self.dsn) as conn, conn.transaction():
            pg.lock_sink(conn, self.sink_id)
            if pg.has_marker(conn, self.sink_id, batch_id):
                return
            found = conn.execute("SELECT sink_id, rows_written FROM onceflow_batches WHERE sink_id = ANY(%s) "
                                 "AND batch_id = %s", (list(ids), batch_id)).fetchall()
            written = {ids[sid]: int(n or 0) for sid, n in found}
            row = marker.marker_row(self.sink_id, batch_id, stats, rows_out,
                                    {t: written.get(t, 0) for t in tables})
            conn.execute(_MARKER, row)
            for sql, values in marker.amendments("%s", self.sink_id, stats):  # the batch before's
                conn.execute(sql, values)

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Arrow tables (made into DataFrames, then :meth:`commit_frames`)."""
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            raise ConfigError("the executor-side PostgreSQL sink needs an active SparkSession")
        return self.commit_frames(batch_id, {n: spark.createDataFrame(t) for n, t in outputs.items()}, specs,
                                  stats, rows_out)

    def batches(self) -> list[dict[str, Any]]:
        """This sink's batch rows (under ``sink_id``, added once every table committed), by batch id."""
        return pg.read_batches(self.dsn, self.sink_id)

    def flush(self) -> None:
        """Nothing to wait for: a batch is in the tables when ``commit_tables`` returns."""

    def close(self) -> None:
        """Nothing to release (connections are per write)."""

"""Record-level exactly-once writes into PostgreSQL from Spark executors.

Large outputs never pass through the driver: every Spark task writes its own
partition, and the driver only decides which task attempts make up a batch.
Two protocols, selected by the ``protocol`` option. Against the shared steps of
:mod:`onceflow.sinks._core.base`: *check* ran before, on the driver
(:class:`onceflow.sinks.postgres.sink.PostgresFramesSink`); step 1 below is the executors' part
of *write*; 2 is *decide*; 3 checks what the tasks wrote; 4 finishes *write* and *marks*; 5 is
*commit*; then cleanup and recovery.

**Staged** (default). For batch N:

1. Task (partition p, attempt a) draws a fresh token, COPYs its rows into the
   unlogged staging table ``<table>_onceflow_stage`` (cut, with a digest, to PostgreSQL's 63
   bytes: :func:`onceflow.sinks.postgres.sql.derived_name`) tagged ``(N, token)`` and
   returns ``(token, rows)`` to the driver. May run any number of times
   (retries, speculation, a re-run after a crash): every run has a new token,
   so leftovers are never mistaken for the winner.
2. Driver ``commit(messages, N)``, one transaction: lock the sink; if the
   marker ``(sink, N)`` exists, delete the staged rows of batches <= N and stop
   (a replay is a no-op).
3. Count the staged rows of the winning tokens; if they differ from what the
   tasks reported (the staging table is unlogged: a server crash empties it),
   fail — Spark re-runs the batch and step 1 stages it again.
4. Move the winners into the target (append, or upsert by key), insert the
   marker, delete the staged rows of batches <= N. Crash point
   ``inside_sink_txn``: nothing visible.
5. Commit. Crash point ``after_sink_commit`` / fault ``ambiguous_commit``: Spark
   re-runs N; its tasks see the marker and stage nothing; step 2 skips it.
6. ``abort(messages, N)`` and the next commit delete the staged rows of failed
   attempts; losers that stage after the commit are deleted by batch N+1's.

**Two-phase** (``protocol=2pc``; needs ``max_prepared_transactions > 0`` and
Spark's default ``spark.speculation=false``). For batch N:

1. Task (p, a): roll back prepared transactions left by earlier attempts of
   (N, p) in an undecided batch (without speculation they failed); write its
   rows into the target inside a transaction and ``PREPARE TRANSACTION`` with
   gid ``of:<sink>:<N>:<p>:<a>:<token>``; return the gid. The rows are invisible
   and survive any crash of the task, the driver, or the server.
2. Driver ``commit``, one transaction: lock the sink; if the marker exists,
   roll back this batch's prepared transactions that are not in the recorded
   decision and stop.
3. Check that every winning gid is still prepared (else fail: Spark re-runs N).
4. Record the decision ``(sink, N, gids)`` and the marker. Crash point
   ``inside_sink_txn``: undecided — recovery rolls the gids back, Spark re-runs N.
5. Commit the decision. Crash point ``after_sink_commit``: decided — recovery
   commits the gids.
6. ``COMMIT PREPARED`` every winner, then roll back losers of batches <= N.
7. Recovery, whenever a writer is created (query start, each ``foreachBatch``
   write, and the commit of every streaming batch) and after step 6: every
   prepared transaction of the sink in a batch up to the last committed one is
   committed if the decision lists it, else rolled back. A crashed undecided
   batch is re-run by Spark: its new tasks roll back their partition's stale
   transactions (step 1) and its commit the rest (step 6). Once a run has
   drained, ``pg_prepared_xacts`` holds nothing of the sink.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from onceflow import faults
from onceflow.errors import ConfigError, PostgresError, refuse_unknown
from onceflow.faults import CrashPoint
from onceflow.sinks._core.tables import merges
from onceflow.sinks._core.tasks import running_task
from onceflow.sinks.postgres import sql as pg

GID_PREFIX = "of"

_PG_TYPES = {
    "string": "text", "bigint": "bigint", "long": "bigint", "int": "integer",
    "integer": "integer", "smallint": "smallint", "short": "smallint", "double": "double precision",
    "float": "real", "boolean": "boolean", "timestamp": "timestamptz", "timestamp_ntz": "timestamp",
    "date": "date",
}


OPTIONS = {"table", "dsn", "mode", "key", "add", "max", "min", "protocol", "sink_id", "batch_id", "metrics",
           "query_id"}
"""The options of ``onceflow_postgres`` (lower-case, as Spark passes them)."""
SPARK_OPTIONS = {"path", "checkpointlocation", "queryname"}
"""Options Spark itself may pass along to a data source."""


@dataclass(frozen=True)
class TargetSpec:
    """Where and how a DataFrame's rows go (from the data source's options).

    Attributes:
        dsn: Connection string.
        table: Target table, ``name`` or ``schema.name``.
        columns: Column names, in the DataFrame's order.
        types: Their PostgreSQL types.
        key: Key columns (required for upsert; in append mode a repeated key is skipped).
        mode: ``append`` or ``upsert``.
        add: Upsert only: columns added to the stored value instead of replacing it.
        max: Upsert only: columns that keep the greater of the stored and the new value.
        min: Upsert only: columns that keep the smaller of the stored and the new value.
        protocol: ``staged`` or ``2pc``.
        sink_id: Marker namespace (default: the table name).
        query_id: The checkpoint's query id to bind to ('' when unknown).
        batch_id: Batch writes only: the micro-batch id (-1 for streaming writes).
        metrics: Extra marker metrics (see :data:`onceflow.sinks._core.marker.METRICS`).
    """

    dsn: str
    table: str
    columns: tuple[str, ...]
    types: tuple[str, ...]
    key: tuple[str, ...] = ()
    mode: str = "append"
    add: tuple[str, ...] = ()
    max: tuple[str, ...] = ()
    min: tuple[str, ...] = ()
    protocol: str = "staged"
    sink_id: str = ""
    query_id: str = ""
    batch_id: int = -1
    metrics: dict[str, int | None] = field(default_factory=dict)

    @classmethod
    def from_options(cls, options: Mapping[str, str], schema: Any) -> TargetSpec:
        """Validate the data source options against the DataFrame's schema.

        Args:
            options: Spark options (keys case-insensitive).
            schema: The DataFrame's ``StructType``.

        Returns:
            The spec.

        Raises:
            ConfigError: An option is missing or invalid (the message says which and why).
        """
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        refuse_unknown(set(opts), OPTIONS | SPARK_OPTIONS, "the onceflow_postgres data source")
        table = opts.get("table", "").strip()
        if not table or len(table.split(".")) > 2:
            raise ConfigError("onceflow_postgres needs option 'table' ('name' or 'schema.name')")
        columns = tuple(f.name for f in schema.fields)
        types = []
        for f in schema.fields:
            name = f.dataType.simpleString()
            if name.startswith("decimal"):
                types.append(name.replace("decimal", "numeric"))
            elif name in _PG_TYPES:
                types.append(_PG_TYPES[name])
            else:
                raise ConfigError(
                    f"column {f.name!r} has Spark type {name}, which onceflow_postgres cannot "
                    f"write; cast it to one of: {', '.join(sorted(_PG_TYPES))}, decimal"
                )
        mode = opts.get("mode", "append")
        if mode not in ("append", "upsert"):
            raise ConfigError(f"option 'mode' must be 'append' or 'upsert', got {mode!r}")
        protocol = opts.get("protocol", "staged")
        if protocol not in ("staged", "2pc", "stage"):  # stage: the driver sink's tasks path
            raise ConfigError(f"option 'protocol' must be 'staged' or '2pc', got {protocol!r}")
        key = _names(opts.get("key", ""))
        add = _names(opts.get("add", ""))
        maxes, mins = _names(opts.get("max", "")), _names(opts.get("min", ""))
        for opt, names in (("key", key), ("add", add), ("max", maxes), ("min", mins)):
            unknown = [n for n in names if n not in columns]
            if unknown:
                raise ConfigError(f"option '{opt}' names columns {unknown} not in the DataFrame "
                                  f"(columns: {list(columns)})")
        if mode == "upsert" and not key:
            raise ConfigError("mode 'upsert' needs option 'key' (comma-separated key columns)")
        merged = (*add, *maxes, *mins)
        if merged and mode != "upsert":
            raise ConfigError("options 'add', 'max' and 'min' are for mode 'upsert' only")
        if set(merged) & set(key) or len(set(merged)) < len(merged):
            raise ConfigError("a column can be in only one of 'key', 'add', 'max' and 'min'")
        try:
            batch_id = int(opts.get("batch_id", "-1"))
            raw = json.loads(opts.get("metrics", "{}")).items()
            metrics = {k: None if v is None else int(v) for k, v in raw}
        except (ValueError, AttributeError) as exc:
            raise ConfigError(f"options 'batch_id'/'metrics' are invalid: {exc}") from None
        return cls(
            dsn=pg.resolve_dsn(opts.get("dsn")), table=table, columns=columns, types=tuple(types),
            key=key, mode=mode, add=add, max=maxes, min=mins, protocol=protocol,
            sink_id=pg.check_sink_id(opts.get("sink_id") or table), query_id=opts.get("query_id", ""),
            batch_id=batch_id, metrics=metrics,
        )

    def ident(self, suffix: str = "") -> Any:
        """The (optionally suffixed) table name as a safe SQL identifier."""
        from psycopg import sql

        parts = self.table.split(".")
        parts[-1] = pg.derived_name(parts[-1], suffix=suffix) if suffix else parts[-1]
        return sql.Identifier(*parts)

    @property
    def merged(self) -> dict[str, str]:
        """Merged column -> ``add``, ``max`` or ``min``."""
        return merges(self.add, self.max, self.min)

    @property
    def stage(self) -> Any:
        """The staging table's identifier."""
        return self.ident("_onceflow_stage")


def _names(raw: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in raw.split(",") if n.strip())


@dataclass(frozen=True)
class TaskMessage:
    """What one task attempt reports to the driver.

    Attributes:
        token: The attempt's unique token.
        partition: Spark partition id.
        attempt: Spark attempt number.
        rows: Rows written.
        gid: Two-phase only: the prepared transaction's id.
        skipped: The batch was already committed; nothing was written.
        query_id: The streaming query's id, when the task could see it.
    """

    token: str
    partition: int
    attempt: int
    rows: int
    gid: str = ""
    skipped: bool = False
    query_id: str = ""

    def to_json(self) -> str:
        """Serialized form (commit messages must pickle; a string always does)."""
        return json.dumps(asdict(self))

    @staticmethod
    def from_json(raw: str) -> TaskMessage:
        """Inverse of :meth:`to_json`."""
        return TaskMessage(**json.loads(raw))


def ensure_tables(spec: TargetSpec) -> None:
    """Create the target and staging tables if missing; check an existing target's columns.

    Args:
        spec: The target.

    Raises:
        ConfigError: The existing target lacks columns of the DataFrame.
        PostgresError: Two-phase commit requested but disabled on the server.
    """
    from psycopg import sql

    types = dict(zip(spec.columns, spec.types, strict=True))  # types come from _PG_TYPES only
    cols = pg.table_body(types, [])
    with pg.session(spec.dsn) as conn:
        if spec.protocol == "2pc":
            pg.require_prepared(conn)
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(hashtext('onceflow:ddl'))")
            conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                spec.ident(), pg.table_body(types, spec.key)))
            conn.execute(sql.SQL(
                "CREATE UNLOGGED TABLE IF NOT EXISTS {} (_of_batch bigint, _of_token text, {})"
            ).format(spec.stage, cols))
            found = {r[0] for r in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
                "AND attnum > 0 AND NOT attisdropped",
                (spec.ident().as_string(conn),),
            )}
        missing = [c for c in spec.columns if c not in found]
        if missing:
            raise ConfigError(f"table {spec.table} exists without columns {missing}; add them or "
                              "write to another table")


def write_task(spec: TargetSpec, batches: Iterable[Any]) -> TaskMessage:
    """Executor side, step 1 of either protocol: write one partition.

    Args:
        spec: The target.
        batches: The partition's rows as ``pyarrow.RecordBatch`` objects.

    Returns:
        The message for the driver.
    """
    import pyarrow as pa

    task = running_task()
    batch_id = spec.batch_id if spec.batch_id >= 0 else task.batch_id
    token = uuid.uuid4().hex[:16]
    conn = pg.connect(spec.dsn)
    try:
        if pg.has_marker(conn, spec.sink_id, batch_id):
            return TaskMessage(token, task.partition, task.attempt, 0, skipped=True, query_id=task.query_id)
        if spec.protocol in ("staged", "stage"):
            rows = 0
            with conn.transaction():
                for rb in batches:
                    tagged = pa.RecordBatch.from_arrays(
                        [pa.array([batch_id] * rb.num_rows, pa.int64()),
                         pa.array([token] * rb.num_rows, pa.string()), *rb.columns],
                        names=["_of_batch", "_of_token", *spec.columns])
                    rows += pg.copy_arrow(conn, spec.stage, ["_of_batch", "_of_token", *spec.columns],
                                          tagged)
                    faults.task_reached(CrashPoint.TASK_MID_WRITE, batch_id, task.attempt)  # its COPY open
            if rows:
                faults.task_reached(CrashPoint.TASK_AFTER_WRITE, batch_id, task.attempt)
            return TaskMessage(token, task.partition, task.attempt, rows, query_id=task.query_id)
        gid = f"{GID_PREFIX}:{spec.sink_id}:{batch_id}:{task.partition}:{task.attempt}:{token}"
        _rollback_stale(conn, spec, batch_id, task.partition)
        conn.execute("SET lock_timeout = '120s'")
        conn.autocommit = False
        rows = 0
        for rb in batches:
            if spec.mode == "append" and not spec.key:
                rows += pg.copy_arrow(conn, spec.ident(), list(spec.columns), rb)
                continue
            tagged = pa.RecordBatch.from_arrays(
                [pa.array([batch_id] * rb.num_rows, pa.int64()),
                 pa.array([token] * rb.num_rows, pa.string()), *rb.columns],
                names=["_of_batch", "_of_token", *spec.columns])
            rows += pg.copy_arrow(conn, spec.stage, ["_of_batch", "_of_token", *spec.columns], tagged)
        if spec.mode == "upsert" or spec.key:
            conn.execute(merge_sql(spec), (batch_id, [token]))
            conn.execute(_delete_staged_sql(spec, "_of_token = ANY(%s)"), ([token],))
        conn.execute(_prepare_sql(gid))
        conn.autocommit = True
        return TaskMessage(token, task.partition, task.attempt, rows, gid=gid, query_id=task.query_id)
    finally:
        conn.close()


def _prepare_sql(gid: str) -> Any:
    from psycopg import sql

    return sql.SQL("PREPARE TRANSACTION {}").format(sql.Literal(gid))


def _finish_prepared(conn: Any, gid: str, commit: bool) -> None:
    """COMMIT or ROLLBACK PREPARED ``gid`` (autocommit connection)."""
    from psycopg import sql

    verb = "COMMIT PREPARED {}" if commit else "ROLLBACK PREPARED {}"
    conn.execute(sql.SQL(verb).format(sql.Literal(gid)))


def _parse_gid(gid: str) -> tuple[int, int]:
    """(batch, partition) of an onceflow gid."""
    parts = gid.split(":")
    return int(parts[2]), int(parts[3])


def _rollback_stale(conn: Any, spec: TargetSpec, batch_id: int, partition: int) -> None:
    """Two-phase step 1: roll back earlier attempts of (batch, partition) of an undecided batch."""
    decided = conn.execute("SELECT 1 FROM onceflow_decisions WHERE sink_id = %s AND batch_id = %s",
                           (spec.sink_id, batch_id)).fetchone()
    if decided is not None:
        return
    for gid in pg.prepared_gids(conn, f"{GID_PREFIX}:{spec.sink_id}:{batch_id}:{partition}:"):
        _finish_prepared(conn, gid, commit=False)


def merge_sql(spec: TargetSpec) -> Any:
    """INSERT … SELECT of a batch's staged rows of the given tokens (params: batch, tokens)."""
    from psycopg import sql

    cols = sql.SQL(", ").join(map(sql.Identifier, spec.columns))
    where = sql.SQL("_of_batch = %s AND _of_token = ANY(%s)")
    if spec.mode == "append":
        tail: sql.Composable = sql.SQL("")
        if spec.key:
            tail = pg.on_conflict(spec.columns, spec.key, spec.ident(), update=False)
        return sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {} WHERE {}{}").format(
            spec.ident(), cols, cols, spec.stage, where, tail)
    keys = sql.SQL(", ").join(map(sql.Identifier, spec.key))
    merged = spec.merged
    if merged:  # pre-aggregate: one row per key, merged columns by their aggregate
        select = sql.SQL(", ").join(
            sql.Identifier(c) if c in spec.key
            else sql.SQL("{}({})").format(sql.SQL({"add": "sum", "min": "min"}.get(merged.get(c, ""), "max")),
                                          sql.Identifier(c))
            for c in spec.columns)
        source = sql.SQL("SELECT {} FROM {} WHERE {} GROUP BY {}").format(select, spec.stage, where, keys)
    else:
        source = sql.SQL("SELECT {} FROM {} WHERE {}").format(cols, spec.stage, where)
    return sql.SQL("INSERT INTO {} ({}) {}{}").format(
        spec.ident(), cols, source, pg.on_conflict(spec.columns, spec.key, spec.ident(), merged))


def _delete_staged_sql(spec: TargetSpec, where: str) -> Any:
    from psycopg import sql

    return sql.SQL("DELETE FROM {} WHERE " + where).format(spec.stage)  # where: fixed literals only


def _bind(conn: Any, spec: TargetSpec, tasks: list[TaskMessage]) -> None:
    query_id = spec.query_id or next((t.query_id for t in tasks if t.query_id), "")
    if query_id:
        pg.bind_sink(conn, spec.sink_id, query_id, pg.redact(spec.dsn))


def commit(spec: TargetSpec, batch_id: int, messages: Iterable[str | None]) -> bool:
    """Driver side: commit batch ``batch_id`` exactly once (steps 2-5 / 2-6 of the module).

    Args:
        spec: The target.
        batch_id: The micro-batch.
        messages: The tasks' :meth:`TaskMessage.to_json` strings.

    Returns:
        True if this call committed the batch, False for a replay.

    Raises:
        PostgresError: Staged rows or prepared transactions went missing; the batch fails
            and Spark re-runs it.
    """
    tasks = [TaskMessage.from_json(m) for m in messages if m]
    with pg.session(spec.dsn) as conn:
        _bind(conn, spec, tasks)
        if spec.protocol == "2pc":
            return _commit_2pc(conn, spec, batch_id, tasks)
        return _commit_staged(conn, spec, batch_id, tasks)


def _metrics(spec: TargetSpec, rows: int) -> dict[str, int | None]:
    return {"rows_written": rows, **spec.metrics}


def _commit_staged(conn: Any, spec: TargetSpec, batch_id: int, tasks: list[TaskMessage]) -> bool:
    winners = [t.token for t in tasks if not t.skipped]
    expected = sum(t.rows for t in tasks if not t.skipped)
    with conn.transaction():
        pg.lock_sink(conn, spec.sink_id)  # 2
        if pg.has_marker(conn, spec.sink_id, batch_id):
            conn.execute(_delete_staged_sql(spec, "_of_batch <= %s"), (batch_id,))
            return False
        if any(t.skipped for t in tasks):
            raise PostgresError(f"batch {batch_id} of sink {spec.sink_id}: tasks saw a marker "
                                   "that is gone; refusing to commit a partial batch")
        from psycopg import sql

        staged = conn.execute(sql.SQL(  # 3
            "SELECT count(*) FROM {} WHERE _of_batch = %s AND _of_token = ANY(%s)"
        ).format(spec.stage), (batch_id, winners)).fetchone()[0]
        if staged != expected:
            raise PostgresError(
                f"batch {batch_id} of sink {spec.sink_id}: {staged} staged rows found, tasks wrote "
                f"{expected} (server restart?); the batch will be re-run")
        if winners:
            conn.execute(merge_sql(spec), (batch_id, winners))  # 4
        pg.insert_marker(conn, spec.sink_id, batch_id, _metrics(spec, expected))
        conn.execute(_delete_staged_sql(spec, "_of_batch <= %s"), (batch_id,))
        faults.reached(CrashPoint.INSIDE_SINK_TXN, batch_id)
    faults.reached(CrashPoint.AFTER_SINK_COMMIT, batch_id)  # 5
    faults.reached(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
    return True


def _commit_2pc(conn: Any, spec: TargetSpec, batch_id: int, tasks: list[TaskMessage]) -> bool:
    gids = [t.gid for t in tasks if t.gid]
    with conn.transaction():
        pg.lock_sink(conn, spec.sink_id)  # 2
        replay = pg.has_marker(conn, spec.sink_id, batch_id)
        if not replay:
            if any(t.skipped for t in tasks):
                raise PostgresError(f"batch {batch_id} of sink {spec.sink_id}: tasks saw a "
                                       "marker that is gone; refusing to commit a partial batch")
            prepared = set(pg.prepared_gids(conn, f"{GID_PREFIX}:{spec.sink_id}:{batch_id}:"))
            missing = [g for g in gids if g not in prepared]  # 3
            if missing:
                raise PostgresError(
                    f"batch {batch_id} of sink {spec.sink_id}: prepared transactions {missing[:3]} "
                    "are gone; the batch will be re-run")
            conn.execute("INSERT INTO onceflow_decisions VALUES (%s, %s, %s, "  # 4
                         "(extract(epoch from clock_timestamp()) * 1000)::bigint)",
                         (spec.sink_id, batch_id, gids))
            pg.insert_marker(conn, spec.sink_id, batch_id,
                             _metrics(spec, sum(t.rows for t in tasks)))
            faults.reached(CrashPoint.INSIDE_SINK_TXN, batch_id)
    if not replay:  # 5: the decision is durable
        faults.reached(CrashPoint.AFTER_SINK_COMMIT, batch_id)
    resolve_prepared(conn, spec, up_to_batch=batch_id)  # 6
    if not replay:
        faults.reached(CrashPoint.AMBIGUOUS_COMMIT, batch_id)
    return not replay


def resolve_prepared(conn: Any, spec: TargetSpec, up_to_batch: int | None = None) -> dict[str, int]:
    """Commit decided and roll back undecided prepared transactions of the sink (step 7).

    Args:
        conn: An autocommit connection.
        spec: The target.
        up_to_batch: Only transactions of batches <= this (None: all, for when no task of
            the sink can be running).

    Returns:
        ``{"committed": n, "rolled_back": m}``.
    """
    done = {"committed": 0, "rolled_back": 0}
    for gid in pg.prepared_gids(conn, f"{GID_PREFIX}:{spec.sink_id}:"):
        batch, _ = _parse_gid(gid)
        if up_to_batch is not None and batch > up_to_batch:
            continue
        row = conn.execute("SELECT %s = ANY(gids) FROM onceflow_decisions "
                           "WHERE sink_id = %s AND batch_id = %s", (gid, spec.sink_id, batch)).fetchone()
        commit_it = bool(row and row[0])
        _finish_prepared(conn, gid, commit=commit_it)
        done["committed" if commit_it else "rolled_back"] += 1
    return done


def recover(spec: TargetSpec) -> dict[str, int]:
    """Clean up after crashed runs, up to the last committed batch (step 7).

    Runs whenever a writer is created — Spark also creates one in the process that
    commits a streaming batch, while that batch's transactions are prepared — so it
    touches only batches up to the sink's last marker: their prepared transactions are
    committed (listed in the decision) or rolled back, their staged rows deleted. A later,
    undecided batch is left to its own tasks and commit.

    Args:
        spec: The target.

    Returns:
        What was done (``committed``/``rolled_back`` prepared transactions, ``staged_deleted``).
    """
    with pg.session(spec.dsn) as conn:
        last = conn.execute("SELECT max(batch_id) FROM onceflow_batches WHERE sink_id = %s",
                            (spec.sink_id,)).fetchone()[0]
        if last is None:
            return {"committed": 0, "rolled_back": 0, "staged_deleted": 0}
        done = resolve_prepared(conn, spec, up_to_batch=int(last))
        cur = conn.execute(_delete_staged_sql(spec, "_of_batch <= %s"), (int(last),))
        done["staged_deleted"] = cur.rowcount
    return done


def abort(spec: TargetSpec, batch_id: int) -> None:
    """Driver side, after a failed task: drop the batch's staged rows / undecided prepared ones.

    Args:
        spec: The target.
        batch_id: The micro-batch.
    """
    with pg.session(spec.dsn) as conn:
        with conn.transaction():
            pg.lock_sink(conn, spec.sink_id)
            if pg.has_marker(conn, spec.sink_id, batch_id):
                return
            conn.execute(_delete_staged_sql(spec, "_of_batch = %s"), (batch_id,))
        if spec.protocol == "2pc":
            for gid in pg.prepared_gids(conn, f"{GID_PREFIX}:{spec.sink_id}:{batch_id}:"):
                _finish_prepared(conn, gid, commit=False)

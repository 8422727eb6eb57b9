"""Spark's Real-Time Mode into PostgreSQL: each record upserted as it arrives, effectively once.

Spark 4.1+ runs a stateless query with ``trigger(realTime=...)`` as long-running tasks that
hand each record to the sink as it arrives (milliseconds, BENCHMARKS.md "Real-Time Mode"); the
trigger's duration is how often the offsets are logged. It refuses ``foreachBatch``, and a
Python ``foreach`` writer gets its rows only when each real-time batch ends — so onceflow's
micro-batch sinks cannot serve it. :func:`write_realtime` runs a JVM ``ForeachWriter``
(``jvm/UpsertWriter.scala``, compiled by :mod:`onceflow.runtime.scalac` against the session's Spark, with
PostgreSQL's JDBC driver from ``onceflow jars fetch postgres-jdbc``) that upserts every row into
one table, keyed by what identifies the record, one autocommitted statement per row.

Why nothing is written twice: a crash replays the records after the last logged real-time
batch; each replayed record upserts the row it upserted before (same key, same values — the
query must be stateless and its columns computed from the record alone). The table after any
number of crashes and replays is the table of one run without them. Producer duplicates with
the same id (a key of the id) land on one row. This is for one-row-per-record tables;
counts, windows and anything stateful need micro-batches (:func:`onceflow.write_stream`).

Start-up steps of :func:`write_realtime`:

1. the DataFrame is checked: streaming, the key's columns present, every column of a type a
   PostgreSQL column holds, no more Kafka partitions to read than the session has task slots
   (Real-Time Mode runs one long task per partition, all at once: a partition without a slot
   is never read, and the query reports no error); a ``rejects=`` table must be another table;
   the connection string must have a JDBC equivalent, the duration must not be shorter than
   Spark's minimum;
2. an existing table must have the same columns and the key as its primary key (and an existing
   ``rejects=`` table the columns of a rejects table, keyed by ``record``), both asked in one
   connection;
3. the session must carry the writer's jars — a refusal at steps 1-3 creates and writes
   nothing;
4. the table (and the ``rejects=`` table) is created if it does not exist (one connection), the
   temporary log files of a query killed before it committed its first batch are removed
   (:func:`onceflow.engine.startup.clear_unfinished_start`: Spark would refuse the checkpoint), the
   writer is built in the driver JVM with the upsert's SQL and the connection's settings (the password
   never reaches a message), and the query is started with ``trigger(realTime=duration)`` and
   ``outputMode("update")`` (Real-Time Mode's only mode), the session's state store provider
   unset while it starts if it is onceflow's id store (Real-Time Mode refuses any but RocksDB;
   the query keeps no state);
5. while it runs, a listener reads each real-time batch's progress: when the query's Kafka
   sources name more partitions than the session has task slots (partitions added to a topic
   after the start: Spark lists them, and never reads one without a slot), the query is stopped
   and :meth:`RealtimeQuery.awaitTermination` raises :class:`onceflow.errors.ConfigError` saying
   how many cores it needs. The records of the unread partition wait in Kafka; a restart with
   enough slots reads them from the checkpoint's offsets.

Rows PostgreSQL refuses (SQLSTATE classes 22 and 23: a value out of range, a ``CHECK`` or
``NOT NULL`` constraint of the user's table) fail the query, naming the row's key — and a
restarted query meets the same record again. With ``rejects="table"`` such a row goes to that
table instead (the layout of onceflow's rejects tables, :mod:`onceflow.engine.rejects`: ``record`` the
row's key as JSON, ``value`` the row as JSON, ``rule`` ``postgres``, ``column`` the column or
constraint PostgreSQL named, ``reason`` the SQLSTATE and message, ``batch_id`` the real-time
batch), once however often the record is replayed, and the query goes on.

The session must carry the writer's jars: :func:`onceflow.session` with ``realtime=True`` (a
session of your own: put :func:`onceflow.runtime.jvmparts.realtime_jars` on ``spark.jars``).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from onceflow.api.durations import parse_duration
from onceflow.engine.startup import clear_unfinished_start
from onceflow.errors import ConfigError
from onceflow.runtime import jvmparts
from onceflow.sinks._core.checks import check_existing
from onceflow.sinks._core.tables import Table
from onceflow.sinks.postgres import sql as pg
from onceflow.sinks.postgres.sql import pg_type
from onceflow.sources.kafka import native as kafka_native

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.streaming.query import StreamingQuery

_JAR_NAME = jvmparts.REALTIME_JAR_NAME
MIN_DURATION_KEY = "spark.sql.streaming.realTimeMode.minBatchDuration"
_log = logging.getLogger("onceflow.realtime")
REJECT_COLUMNS = ("record", "batch_id", "value", "rule", "column", "reason")
"""The columns of a rejects table the writer fills (the others, Kafka's and files', stay null)."""


def jdbc_target(dsn: str) -> tuple[str, str | None, str | None]:
    """A libpq connection string or URL as a JDBC URL, user and password.

    Args:
        dsn: ``host=... dbname=...`` or ``postgresql://user:pw@host:port/db``.

    Returns:
        ``(jdbc:postgresql://host:port/db[?params], user, password)``.

    Raises:
        ConfigError: A connection parameter the JDBC driver has no equivalent for here.
    """
    from psycopg.conninfo import conninfo_to_dict

    try:
        params = {k: str(v) for k, v in conninfo_to_dict(dsn).items() if v is not None}
    except Exception as exc:  # psycopg.ProgrammingError: a malformed DSN
        raise ConfigError(f"cannot read the PostgreSQL connection string {pg.redact(dsn)!r}: "
                          f"{pg.scrub(str(exc), dsn)}") from None
    host = params.pop("host", None) or params.pop("hostaddr", None) or "localhost"
    if host.startswith("/"):
        raise ConfigError(f"the real-time writer connects over TCP (JDBC has no Unix sockets): give "
                          f"host=127.0.0.1 (or the server's name) instead of the socket directory {host}")
    port = params.pop("port", "5432")
    dbname = params.pop("dbname", None)
    user = params.pop("user", None) or os.environ.get("PGUSER")
    password = params.pop("password", None) or os.environ.get("PGPASSWORD")
    jdbc_names = {"sslmode": "sslmode", "application_name": "ApplicationName",
                  "connect_timeout": "connectTimeout", "options": "options"}
    passed = {jdbc_names[k]: params.pop(k) for k in list(params) if k in jdbc_names}
    if params:
        raise ConfigError(f"the real-time writer's JDBC connection has no equivalent for "
                          f"{', '.join(sorted(params))} in {pg.redact(dsn)!r}: drop them (host, port, "
                          f"dbname, user, password, sslmode, application_name, connect_timeout, options "
                          f"are used)")
    query = "&".join(f"{k}={quote(v, safe='')}" for k, v in sorted(passed.items()))
    url = f"jdbc:postgresql://{host}:{port}/{dbname or user or ''}" + (f"?{query}" if query else "")
    return url, user, password


def _columns(df: DataFrame, key: Sequence[str]) -> dict[str, str]:
    """Step 1: every column's PostgreSQL type, the key checked."""
    from onceflow.sinks._core.checks import arrow_schema

    if not df.isStreaming:
        raise ConfigError("write_realtime takes a streaming DataFrame (spark.readStream...); write a "
                          "batch DataFrame with Spark's JDBC writer (df.write.jdbc)")
    missing = [k for k in key if k not in df.columns]
    if not key or missing:
        raise ConfigError(f"write_realtime's key {list(key)} must name columns of the DataFrame "
                          f"({', '.join(df.columns)}): what identifies the record, e.g. its id, or "
                          f"topic, partition, offset for Kafka")
    return _pg_types(arrow_schema(df.schema))


def _pg_types(schema: pa.Schema) -> dict[str, str]:
    """Each column's PostgreSQL type."""
    return {f.name: pg_type(f.type) for f in schema}


_STREAM_ONLY = {"startingoffsets", "startingoffsetsbytimestamp", "startingtimestamp",
                "startingoffsetsbytimestampstrategy", "maxoffsetspertrigger", "minoffsetspertrigger",
                "maxtriggerdelay"}
"""Kafka source options a batch read refuses (the partition count does not depend on them)."""


def kafka_partitions(df: DataFrame) -> int | None:
    """How many Kafka partitions the streaming DataFrame reads.

    Each Kafka source of the plan is planned once more as a batch read with the same options
    (its topics' partitions as they are now; no records are read).

    Args:
        df: A streaming DataFrame.

    Returns:
        The partitions of every Kafka source of its plan together; None when it reads none.
    """
    spark = df.sparkSession
    total, found = 0, False
    leaves = df._jdf.queryExecution().logical().collectLeaves().iterator()
    while leaves.hasNext():
        leaf = leaves.next()
        if leaf.nodeName() != "StreamingRelationV2":  # the only leaf with a sourceName
            continue
        if str(leaf.sourceName()) not in ("kafka", kafka_native.PROVIDER):
            continue
        options = {str(k): str(v) for k, v in dict(leaf.extraOptions().asCaseSensitiveMap()).items()
                   if str(k).lower() not in _STREAM_ONLY}
        total += int(spark.read.format("kafka").options(**options).load()._jdf.rdd().getNumPartitions())
        found = True
    return total if found else None


def progress_partitions(progress: Any) -> int | None:
    """How many Kafka partitions a query's progress report names (its Kafka sources together).

    Spark's Kafka source reports offsets per topic and partition as JSON (``{"t": {"0": 12}}``)
    and names a partition added to a topic from the first batch after it appeared, read or not.

    Args:
        progress: A ``StreamingQueryProgress`` (a listener's ``event.progress``).

    Returns:
        The partitions named by its end and latest offsets; None when it has no Kafka source.
    """
    total, found = 0, False
    for source in progress.sources:
        if not str(source.description).startswith(("KafkaV2", "KafkaSource")):
            continue
        found = True
        named: set[tuple[str, str]] = set()
        for text in (source.endOffset, source.latestOffset):
            try:
                offsets = json.loads(text) if text else None
            except ValueError:
                continue
            if isinstance(offsets, dict):
                named |= {(t, p) for t, parts in offsets.items() if isinstance(parts, dict) for p in parts}
        total += len(named)
    return total if found else None


def _too_many(partitions: int, slots: int, added: bool) -> str:
    """Steps 1 and 5: what to do when the Kafka partitions outnumber the task slots."""
    what = (f"the query reads {partitions} Kafka partitions" if not added else
            f"the query's topics now have {partitions} Kafka partitions (added while it ran)")
    stop = (" The query was stopped: the records of the partition without a slot wait in Kafka, "
            "and a restart with enough cores reads them from the checkpoint." if added else "")
    return (f"write_realtime: {what} but the session has {slots} task slots (cores): Real-Time Mode runs "
            f"one long task per partition, all at the same time, and a partition without a slot is never "
            f"read — its records would wait, unprocessed, while the query reports no error.{stop} Give the "
            f"session at least {partitions} cores (onceflow.session(master='local[{partitions}]') on "
            f"one machine, more executor cores on a cluster) or read fewer partitions")


def _check_slots(df: DataFrame) -> None:
    """Step 1: every Kafka partition the query reads gets a task slot of its own."""
    try:
        partitions = kafka_partitions(df)
    except Exception as exc:  # py4j: the brokers unreachable now: the query reports that itself
        _log.warning("write_realtime: could not count the Kafka partitions to read (%s); the "
                     "session needs a task slot for each", str(exc).splitlines()[0])
        return
    slots = int(df.sparkSession.sparkContext.defaultParallelism)
    if partitions is not None and partitions > slots:
        raise ConfigError(_too_many(partitions, slots, added=False))


class RealtimeQuery:
    """A running :func:`write_realtime` query: Spark's ``StreamingQuery`` and step 5's watch.

    Every attribute of Spark's query (``stop``, ``isActive``, ``lastProgress``, ...) is
    available here; ``query`` is Spark's own object.

    Attributes:
        query: Spark's ``StreamingQuery``.
        stopped_because: Why step 5 stopped the query (None while it has not).
    """

    def __init__(self, query: StreamingQuery, spark: Any, slots: int) -> None:
        from pyspark.sql.streaming.listener import StreamingQueryListener

        self.query = query
        self.stopped_because: str | None = None
        watch, query_id = self, str(query.id)

        class SlotWatch(StreamingQueryListener):
            def onQueryStarted(self, event: Any) -> None:  # noqa: D102, N802
                pass

            def onQueryProgress(self, event: Any) -> None:  # noqa: D102, N802
                progress = event.progress
                if watch.stopped_because is not None or str(progress.id) != query_id:
                    return
                partitions = progress_partitions(progress)
                if partitions is not None and partitions > slots:
                    watch.stopped_because = _too_many(partitions, slots, added=True)
                    _log.error(watch.stopped_because)
                    # not in the listener's own call: stopping waits for the query's thread
                    threading.Thread(target=query.stop, name="onceflow-slot-watch", daemon=True).start()

            def onQueryIdle(self, event: Any) -> None:  # noqa: D102, N802
                pass

            def onQueryTerminated(self, event: Any) -> None:  # noqa: D102, N802
                if str(event.id) == query_id:
                    threading.Thread(target=spark.streams.removeListener, args=(self,),
                                     name="onceflow-slot-watch-end", daemon=True).start()

        self._listener = SlotWatch()
        spark.streams.addListener(self._listener)
        if not query.isActive:  # ended before the listener was there: no termination event comes
            spark.streams.removeListener(self._listener)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.query, name)

    def awaitTermination(self, timeout: float | None = None) -> bool | None:  # noqa: N802
        """Spark's ``awaitTermination``; raises step 5's stop.

        Raises:
            ConfigError: The query was stopped because its topics gained partitions beyond the
                session's task slots (what to change, in the message).
            StreamingQueryException: The query failed (Spark's own error).
        """
        done = (self.query.awaitTermination() if timeout is None
                else self.query.awaitTermination(timeout))  # type: ignore[arg-type]  # Spark takes floats too
        if self.stopped_because is not None and not self.query.isActive:
            raise ConfigError(self.stopped_because)
        return done


def _check_duration(spark: Any, duration: str) -> None:
    """Step 1: the real-time batch is not shorter than Spark allows."""
    least = spark.conf.get(MIN_DURATION_KEY, "5s") or "5s"
    try:
        floor = parse_duration(least)
    except ConfigError:  # a form of Spark's own that onceflow does not read: Spark checks it
        return
    if parse_duration(duration) < floor:
        raise ConfigError(f"write_realtime's duration {duration!r} is shorter than Spark's minimum real-time "
                          f"batch ({MIN_DURATION_KEY} = {least}): the duration is how often offsets are "
                          f"logged, not a latency (rows are written as they arrive); use '{least}' or more")


def _check_rejects_name(table: str, rejects: str | None) -> None:
    """Step 1: the ``rejects=`` table is another table."""
    if rejects is not None and (not rejects or rejects == table):
        raise ConfigError(f"write_realtime's rejects={rejects!r} must name a table other than {table!r}: "
                          f"where rows PostgreSQL refuses go, e.g. rejects='{table}_rejected'")


def _check_tables(dsn: str, table: str, types: dict[str, str], key: Sequence[str],
                  rejects: str | None) -> None:
    """Step 2: an existing table fits, and an existing ``rejects=`` table (one connection for both)."""
    from onceflow.engine import rejects as rj

    with pg.session(dsn) as conn:
        found = pg.existing_table(conn, table)
        found_rejects = pg.existing_table(conn, rejects) if rejects is not None else None
    if found is not None:
        check_existing("PostgreSQL", table, Table(key=list(key), mode="upsert"), tuple(types), *found)
    if rejects is not None and found_rejects is not None:
        check_existing("PostgreSQL", rejects, rj.SPEC, rj.COLUMNS, *found_rejects)


def _check_jars(spark: Any) -> None:
    """Step 3: the session carries the writer's jars."""
    given = spark.conf.get("spark.jars", "") or ""
    if _JAR_NAME not in given or "postgresql-" not in given:
        raise ConfigError("write_realtime runs a JVM writer that must be on the session's classpath "
                          "when it starts: create the session with onceflow.session(realtime=True) "
                          "(or add onceflow.runtime.jvmparts.realtime_jars() to spark.jars)")


def _create(conn: Any, name: str, types: Mapping[str, str], key: Sequence[str], columns: Sequence[str],
            *, update: bool) -> str:
    """Step 4: one table created if missing.

    Returns:
        Its insert of ``columns`` (``?`` parameters): on a key conflict the row is updated
        (``update``) or left as it is.
    """
    from psycopg import sql

    ident = sql.Identifier
    conn.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(ident(name), pg.table_body(types, key)))
    return str(sql.SQL("INSERT INTO {} ({}) VALUES ({}){}").format(
        ident(name), sql.SQL(", ").join(map(ident, columns)),
        sql.SQL(", ").join(sql.SQL("?") for _ in columns),
        pg.on_conflict(list(columns), key, ident(name), update=update)).as_string(conn))


def _create_tables(dsn: str, table: str, types: dict[str, str], key: Sequence[str],
                   rejects: str | None) -> tuple[str, str | None]:
    """Step 4: the table (and the ``rejects=`` table) created if missing, in one connection.

    Returns:
        The upsert's SQL and the reject's insert (None without ``rejects``), with ``?`` parameters.
    """
    from onceflow.engine import rejects as rj

    with pg.session(dsn) as conn:
        upsert = _create(conn, table, types, key, list(types), update=True)
        if rejects is None:
            return upsert, None
        reject = _create(conn, rejects, _pg_types(rj.ARROW_SCHEMA), rj.SPEC.key, REJECT_COLUMNS, update=False)
        return upsert, reject


def _writer(spark: Any, target: tuple[str, str | None, str | None], upsert: str, key_indexes: list[int],
            retry_ms: int, reject: str | None) -> Any:
    """Step 4: the writer built in the driver JVM (``target``: :func:`jdbc_target`'s answer)."""
    url, user, password = target
    gateway = spark.sparkContext._gateway
    indexes = gateway.new_array(gateway.jvm.int, len(key_indexes))
    for i, k in enumerate(key_indexes):
        indexes[i] = k
    writer_class = gateway.jvm.org.apache.spark.sql.onceflow.UpsertWriter
    return writer_class(url, user, password, upsert, indexes, retry_ms, reject)


def write_realtime(df: DataFrame, table: str, key: str | Sequence[str], checkpoint: str | os.PathLike[str], *,
                   dsn: str | None = None, duration: str = "5 seconds", retry_for: str | float = "1 minute",
                   rejects: str | None = None, query_name: str | None = None) -> RealtimeQuery:
    """Start a Real-Time Mode query that upserts each row into a PostgreSQL table as it arrives.

    Args:
        df: A stateless streaming DataFrame (e.g. Kafka read by Spark's connector, then
            ``select``/``withColumn``/``filter``), one output row per input record at most.
        table: The PostgreSQL table (created with ``key`` as its primary key if missing).
        key: The column(s) that identify the record: its id, or ``topic, partition, offset``.
            A replay after a crash rewrites the same rows because of it.
        checkpoint: Spark checkpoint directory; reuse it to resume.
        dsn: PostgreSQL connection string (else ``$ONCEFLOW_PG_DSN``); TCP (host=...), as the
            writer connects over JDBC from Spark's JVM.
        duration: The real-time batch's duration: how often Spark logs the offsets read (a
            crash replays at most that much input); not a latency. At least Spark's
            ``spark.sql.streaming.realTimeMode.minBatchDuration`` (5 s by default).
        retry_for: How long one row's upsert is retried across connection errors (the server
            restarting) before the query fails.
        rejects: A table for the rows PostgreSQL refuses (SQLSTATE classes 22 and 23), each once
            (module docstring); without it such a row fails the query, naming its key.
        query_name: The query's name (``spark.streams``, the progress listener).

    Returns:
        The running query (:class:`RealtimeQuery`: Spark's ``StreamingQuery``, stopped with an
        error if its topics gain partitions beyond the session's task slots: step 5).

    Raises:
        ConfigError: Not a streaming DataFrame, a key that is not a column, a column type
            PostgreSQL cannot hold, more Kafka partitions than the session has task slots, an
            existing table of other columns or key, a session
            without the writer's jars, a DSN the JDBC driver cannot use, a ``rejects`` table
            that is the table itself or of other columns.
    """
    keys = [key] if isinstance(key, str) else list(key)
    types = _columns(df, keys)
    _check_slots(df)
    _check_rejects_name(table, rejects)
    resolved = pg.resolve_dsn(dsn)
    target = jdbc_target(resolved)  # a DSN the JDBC driver cannot use is refused before anything is created
    retry_ms = int(parse_duration(retry_for) * 1000)
    _check_duration(df.sparkSession, duration)
    _check_tables(resolved, table, types, keys, rejects)
    _check_jars(df.sparkSession)
    upsert, reject = _create_tables(resolved, table, types, keys, rejects)
    clear_unfinished_start(Path(checkpoint))
    names = list(types)
    jwriter = _writer(df.sparkSession, target, upsert, [names.index(k) for k in keys], retry_ms, reject)
    writer: Any = df.writeStream.outputMode("update").option("checkpointLocation", str(checkpoint))
    writer = writer.trigger(realTime=duration)
    if query_name:
        writer = writer.queryName(query_name)
    writer._jwrite.foreach(jwriter)
    with _stateless_conf(df.sparkSession):
        query: StreamingQuery = writer.start()
    spark = df.sparkSession
    return RealtimeQuery(query, spark, int(spark.sparkContext.defaultParallelism))


@contextmanager
def _stateless_conf(spark: Any) -> Iterator[None]:
    """Step 4: the query started without onceflow's id state store named in the session.

    Real-Time Mode refuses a session whose state store provider is set to anything but RocksDB,
    and a stateless query keeps no state: the session's provider (onceflow's id store, the
    default of :func:`onceflow.session`) is unset while Spark starts the query (which
    copies the session's settings) and set back afterwards.
    """
    from onceflow.runtime import idstore

    held = spark.conf.get(idstore.PROVIDER_KEY, None)
    if held != idstore.PROVIDER_CLASS:
        yield
        return
    spark.conf.unset(idstore.PROVIDER_KEY)
    try:
        yield
    finally:
        spark.conf.set(idstore.PROVIDER_KEY, held)

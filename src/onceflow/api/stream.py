"""The public API: make your own streaming query exactly once by changing a few lines.

::

    import onceflow
    from onceflow import Table

    events = spark.readStream.schema(schema).parquet("payments/")       # any replayable source
    clean = onceflow.deduplicate(events, id="payment_id", event_time="ts", within="10 minutes")
    query = onceflow.write_stream(
        clean, sink=onceflow.sqlite("app.db"), checkpoint="ck/",
        tables={"revenue": Table(key=["account", "window_start"], add=["amount"])},
        per_batch=lambda df: {"revenue": revenue_deltas(df)})
    query.awaitTermination()

:func:`write_stream` is a thin face: its start is :class:`onceflow.engine.start.Start` (numbered
steps), what it does per micro-batch is :mod:`onceflow.engine.batch` (one method per step), the
sink's commit protocol :mod:`onceflow.sinks._core.base`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.api.durations import parse_duration
from onceflow.api.query import OnceQuery
from onceflow.engine import contract
from onceflow.engine.batch import PerBatch
from onceflow.engine.start import EVENT_TIME, IDS, Start, StreamOptions
from onceflow.errors import ConfigError, refuse_unknown
from onceflow.runtime import plans
from onceflow.sinks._core.base import TablesSink
from onceflow.sinks._core.tables import Table
from onceflow.sinks.sqlite.sink import SQLiteTablesSink

if TYPE_CHECKING:
    from pyspark.sql import DataFrame


def deduplicate(df: DataFrame, id: str | list[str], event_time: str, within: str | float | None = None,
                **unknown: Any) -> DataFrame:
    """Drop duplicates by an id column, with state bounded by an event-time watermark.

    Rows with the same id whose event times are within ``within`` of each other are
    duplicates: the first one seen is kept. Rows more than ``within`` behind the latest event
    time seen are late: Spark drops them, and :func:`write_stream` counts them per batch.

    A record with a null or empty id, or a null event time, is never merged with another as
    "one id": it is a bad record (rules ``id`` and ``event_time`` of :mod:`onceflow.engine.contract`).
    When ``df`` is a bare source or what :func:`onceflow.expect` returned, such records go to
    :func:`write_stream`'s ``rejects=`` table (or stop the query naming the first one); on a
    stream transformed in between, the query stops at the first one, naming it.

    Args:
        df: A streaming DataFrame.
        id: The id column(s) (a producer-assigned, stable id, never one minted in the query).
        event_time: A timestamp column.
        within: How long ids are remembered, e.g. ``"10 minutes"`` or ``"90s"`` (required:
            an unbounded dedup would keep every id forever).
        **unknown: Refused (a misspelt keyword is named with the nearest valid one).

    Returns:
        The deduplicated streaming DataFrame.

    Raises:
        ConfigError: A missing column, a missing, zero or unreadable ``within``, or an unknown
            keyword (naming the nearest valid one).
    """
    refuse_unknown(set(unknown), {"df", "id", "event_time", "within"}, "onceflow.deduplicate")
    ids = [id] if isinstance(id, str) else list(id)
    missing = [c for c in [*ids, event_time] if c not in df.columns]
    if missing:
        raise ConfigError(f"deduplicate: no column(s) {missing} in the DataFrame (it has {df.columns})")
    if within is None or within == "" or within == 0:
        raise ConfigError("deduplicate needs within= (how long ids are remembered, e.g. '10 minutes'): "
                          "without it the state would keep every id forever")
    seconds = parse_duration(within)
    if seconds <= 0:
        raise ConfigError(f"deduplicate: within must be > 0, got {within!r}")
    routed = contract.id_rules(df, ids, event_time)  # null ids / event times: rejected, never one id
    df = routed if routed is not None else contract.guard_ids(df, ids, event_time)
    out = df.withWatermark(event_time, f"{int(seconds * 1000)} milliseconds")
    out = out.dropDuplicatesWithinWatermark(ids)
    plans.remember(out, EVENT_TIME, event_time)
    plans.remember(out, IDS, ids)
    return out


def sqlite(path: str | Path, sink_id: str = "default", *, collect_below: int = 100_000) -> SQLiteTablesSink:
    """The embedded SQLite sink (see :mod:`onceflow.sinks.sqlite.sink`).

    Args:
        path: Database file.
        sink_id: Marker namespace; two queries writing to one database need different ids.
        collect_below: A batch whose input has fewer rows is collected to the driver as Arrow
            (one Spark job); a larger one (a backlog) is converted and written to scratch files
            beside the database by Spark's tasks, then copied into the tables by SQLite, so the
            driver never holds the batch (:mod:`onceflow.sinks.sqlite.tasks`).
    """
    return SQLiteTablesSink(path, sink_id=sink_id, collect_below=collect_below)


def postgres(dsn: str | None = None, sink_id: str = "default", protocol: str = "driver", *,
             collect_below: int = 100_000) -> TablesSink:
    """The PostgreSQL sink (see :mod:`onceflow.sinks.postgres.sink`).

    Args:
        dsn: Connection string; ``$ONCEFLOW_PG_DSN`` when None (keeps a password out of code).
        sink_id: Marker namespace; two queries writing to one database need different ids.
        protocol: ``driver`` (every table and the marker in one transaction: a batch under
            ``collect_below`` rows through the driver, a larger one staged by Spark's tasks and
            moved by the driver), or ``staged`` / ``2pc`` (written by Spark's executors, each
            table exactly once by its own marker).
        collect_below: ``driver`` only: the input rows from which a batch is staged by the tasks
            instead of collected (a backlog after downtime never sits in the driver's memory).

    Raises:
        ConfigError: psycopg is missing (``pip install 'onceflow[postgres]'``), no DSN, or an
            unknown protocol.
    """
    from onceflow.sinks.postgres.sink import PostgresFramesSink, PostgresTablesSink

    if protocol == "driver":
        return PostgresTablesSink(dsn, sink_id=sink_id, collect_below=collect_below)
    return PostgresFramesSink(dsn, sink_id=sink_id, protocol=protocol)


def delta(root: str | Path, sink_id: str = "default", *, collect_below: int = 100_000,
          maintain_every: int | None = None, retention_hours: float = 7 * 24) -> TablesSink:
    """The Delta Lake sink: one Delta table per table name under ``root``.

    Each table commits each batch once, with the app transaction ``(onceflow:<sink_id>,
    batch_id)`` (see :mod:`onceflow.sinks.delta`). A batch whose input has ``collect_below`` rows
    or more (counted before it runs; unknown counts as more), and whose tables then hold that
    many, is written by Spark's tasks and committed by the driver: no row of it passes through
    the driver's Python, whatever its size. A smaller one is collected (one Spark job).
    ``maintain_every=N`` compacts and vacuums the batch's tables after every N-th batch's commit
    (removed files kept ``retention_hours``; :mod:`onceflow.sinks.delta.maintain`).

    Raises:
        ConfigError: deltalake is missing (``pip install 'onceflow[delta]'``).
    """
    from onceflow.sinks.delta.sink import DeltaTablesSink

    return DeltaTablesSink(root, sink_id=sink_id, collect_below=collect_below, maintain_every=maintain_every,
                           retention_hours=retention_hours)


def iceberg(catalog_uri: str, warehouse: str | Path, namespace: str = "onceflow",
            sink_id: str = "default", *, catalog_name: str = "onceflow") -> TablesSink:
    """The Apache Iceberg sink: one Iceberg table per table name in ``namespace`` of a SQL catalog.

    Every batch's Parquet files are written by Spark's tasks and committed by the driver with
    the batch's marker (table properties and the snapshot summary) in one Iceberg commit per
    table (see :mod:`onceflow.sinks.iceberg.sink`). Every kind of table: a keyed one's batch is
    merged into the data files its keys touch, rewritten by Spark's tasks (copy-on-write).

    Args:
        catalog_uri: pyiceberg's SQL catalog database: ``sqlite:////path/catalog.db`` or
            ``postgresql+psycopg://user@host/db``.
        warehouse: The directory new tables' files go to (every executor must reach it).
        namespace: The tables' namespace (created if missing).
        sink_id: Marker namespace; two queries writing to one table need different ids.
        catalog_name: The catalog's name (a SQL catalog's rows carry it; readers open the catalog
            under the same name, e.g. ``SqlCatalog("onceflow", uri=...)``).

    Raises:
        ConfigError: pyiceberg is missing (``pip install 'onceflow[iceberg]'``), or the warehouse
            is not a file system path.
    """
    from onceflow.sinks.iceberg.sink import IcebergTablesSink

    return IcebergTablesSink(catalog_uri, warehouse, namespace=namespace, sink_id=sink_id,
                             catalog_name=catalog_name)


def kafka(bootstrap_servers: str, sink_id: str = "default", *,
          marker_topic: str = "onceflow_batches.{sink_id}", partitions: int = 1,
          options: Mapping[str, str] | None = None, batch_headers: bool = False,
          collect_below: int = 100_000) -> TablesSink:
    """The exactly-once Kafka sink: each table a topic, each batch in Kafka transactions.

    Consumers with ``isolation.level=read_committed`` see every batch's records once (see
    :mod:`onceflow.sinks.kafka.sink` for the records' keys, values and headers, and the protocol).
    A batch whose input has fewer than ``collect_below`` rows is produced by the driver in one
    transaction; a larger one (a backlog) by Spark's tasks, each task in a transaction of its own
    (:mod:`onceflow.sinks.kafka.tasks`): a reader may see part of such a batch before the rest.

    Args:
        bootstrap_servers: ``host:port`` of the brokers.
        sink_id: Marker namespace and transactional id ``onceflow.<sink_id>``: one running query
            per sink id (a second driver fences the first).
        marker_topic: Topic of the batch markers (``{sink_id}`` replaced; one partition, created
            when missing; one per sink).
        partitions: Partitions of an output topic the sink creates.
        options: librdkafka settings (e.g. ``{"security.protocol": "SASL_SSL", ...}``).
        batch_headers: Give every record the headers ``onceflow.sink`` (the sink id) and
            ``onceflow.batch`` (its batch id); off by default (they halve the produce rate).
        collect_below: The input rows from which a batch is produced by Spark's tasks (0: every
            batch).

    Raises:
        ConfigError: confluent-kafka is missing (``pip install 'onceflow[kafka]'``) or a bad
            sink id.
    """
    from onceflow.sinks.kafka.sink import KafkaTopicsSink

    return KafkaTopicsSink(bootstrap_servers, sink_id=sink_id, marker_topic=marker_topic,
                           partitions=partitions, options=options, batch_headers=batch_headers,
                           collect_below=collect_below)


def http(url: str, ledger: str | Path, sink_id: str = "default", idempotent: bool = True,
         concurrency: int = 16, retries: int = 5, timeout_s: float = 10.0,
         headers: Mapping[str, str] | None = None, *, collect_below: int = 100_000) -> TablesSink:
    """A side-effect sink: each output row is one ``POST`` to ``url`` (:mod:`onceflow.sinks.http.sink`).

    Each table needs ``key=[...]``: the columns that name an effect; its idempotency key is
    ``<sink_id>/<table>/<key values>``. Pair it with ``write_stream(..., stable=True)`` when
    ``per_batch`` is not deterministic. A batch whose input has ``collect_below`` rows or more (a
    backlog) is called by Spark's tasks against the same ledger (:mod:`onceflow.sinks.http.tasks`:
    every task must reach the ledger — a SQLite path they share, or a PostgreSQL database).

    Args:
        url: Where effects are POSTed (the row as JSON, an ``Idempotency-Key`` header).
        ledger: The ledger of started and confirmed keys: a SQLite file, or a PostgreSQL
            database's ``postgresql://`` URL (reached by a cluster's tasks over the network).
        sink_id: Namespace of keys and markers.
        idempotent: The service honours ``Idempotency-Key``: effects exactly once. False: at
            most one completed call per key; ambiguous ones are listed for reconciliation.
        concurrency: Calls in flight at once.
        retries: Calls per key at most.
        timeout_s: Seconds a call may take.
        headers: Extra headers (e.g. ``Authorization``).
        collect_below: The input rows from which a batch is called by Spark's tasks (0: every batch).
    """
    from onceflow.sinks.http.sink import HttpEffectsSink

    return HttpEffectsSink(url, ledger, sink_id=sink_id, idempotent=idempotent, concurrency=concurrency,
                           retries=retries, timeout_s=timeout_s, headers=headers, collect_below=collect_below)


def write_stream(df: DataFrame, sink: TablesSink | Mapping[str, TablesSink], checkpoint: str | Path,
                 tables: Mapping[str, Table] | None = None, per_batch: PerBatch | None = None, *,
                 once: bool = False,
                 trigger: str = "1 second", event_time: str | None = None,
                 on_batch: Callable[[dict[str, Any]], None] | None = None,
                 check_files: Callable[[list[Path]], object] | None = None, late: str | None = None,
                 stable: bool | Sequence[str] = False,
                 count_rows: Callable[[dict[str, Any]], int] | None = None, output_mode: str = "append",
                 rejects: str | None = None, retry_for: str | float = "1 minute",
                 **unknown: Any) -> OnceQuery:
    """Start a query that writes every micro-batch to ``tables`` exactly once.

    Args:
        df: The streaming DataFrame (e.g. from :func:`deduplicate`); its source must be
            replayable by offset (files, the onceflow event log, Kafka).
        sink: Where the tables live: :func:`sqlite`, :func:`postgres`, :func:`delta`,
            :func:`iceberg`, :func:`kafka` or :func:`http`; or a dict ``{table_name: sink}``
            sending each table (``late=`` and ``rejects=`` tables too) to its own sink, the
            source read once (:mod:`onceflow.sinks._core.several`).
        checkpoint: Spark checkpoint directory; reuse it to resume exactly.
        tables: Table name -> :class:`Table` (write mode and key); required.
        per_batch: Turns one micro-batch's DataFrame into ``{table_name: DataFrame}`` (or one
            DataFrame when there is one table; a ``pyarrow.Table`` works in place of a
            DataFrame); plain PySpark, run once per batch attempt. It may take the batch id as
            a second argument, like a ``foreachBatch`` function (stable across retries of the
            batch: e.g. part of a side effect's key).
            Without it the batch's rows go to the single table as they are.
        once: Process everything available now, then stop (``availableNow``).
        trigger: Processing-time trigger of a continuous query.
        event_time: The event-time column for late counting; taken from :func:`deduplicate` when
            ``df`` is its result — pass it when the query transforms the DataFrame in between.
        on_batch: Called after every batch with its numbers (e.g. to print progress).
        check_files: Called with each batch's input files (file sources) before anything of the
            batch is written; raise to stop the query (e.g. ``EventLog(dir).validate``, which
            refuses a file whose schema Spark would silently read as nulls).
        late: A table that receives, exactly once, the input rows each batch's watermark
            dropped (file sources): the rows as they are in the input files, plus
            ``missed_watermark``; one per id when ``df`` comes from :func:`deduplicate`. Its
            spec is ``tables[late]`` if given, else upsert by the dedup id (else append).
        stable: Stable input (:mod:`onceflow.engine.stable`): ``True`` persists every table of each
            batch's ``per_batch`` output the first time it is computed, and every retry of the
            batch (after a task failure, a crash, an ambiguous commit) writes the persisted copy
            instead of computing again; or a list of the table names to keep stable. Needed when
            ``per_batch`` is not deterministic (clock, random numbers, a lookup whose answer
            changes) and the sink has side effects (e.g. :func:`http`).
        output_mode: Spark's output mode: ``append`` (default: rows once, when final — an
            event-time aggregation writes a window once the watermark passes its end),
            ``update`` (each batch the changed aggregate rows: upsert them by their key; exact
            at every batch boundary, nothing left behind when the input ends) or ``complete``
            (each batch every aggregate row). See :mod:`onceflow.engine.startup`.
        count_rows: How many rows the batch had (after deduplication and late drops), computed
            from what ``per_batch`` returned (``{table: DataFrame or pyarrow.Table}``; Arrow
            tables for driver-side sinks) — for outputs that carry the count already, e.g. ``lambda out:
            pc.sum(out["counts"]["count"]).as_py()``. Without it the first Spark job that reads
            the batch counts its rows (``DataFrame.observe``: a small cost, BENCHMARKS.md).
        rejects: A table that receives, exactly once and in each batch's own commit, the input
            records the query's input contract rejected (:func:`onceflow.expect`, and the null
            id / event time rules of :func:`deduplicate`), with their source coordinates, the
            raw record and the rule they broke (columns in :mod:`onceflow.engine.rejects`). Without
            it, a batch with a bad record stops the query naming the first one; add
            ``rejects=`` and restart on the same checkpoint: the batch runs again, nothing is lost.
        retry_for: How long a batch's commit is retried, with backoff and a log line per retry,
            when it fails for a reason that passes (:mod:`onceflow.sinks._core.retry`: the database restarting
            or unreachable, a lock held by another process, a serialization failure, Delta
            commits of other writers) before the query fails; ``0`` fails at once. Each retry
            runs the sink's commit from its first step (the marker decides): never twice.
        **unknown: Refused (a misspelt keyword is named with the nearest valid one).

    Returns:
        The running query; :meth:`OnceQuery.awaitTermination` raises onceflow's errors.

    Raises:
        ConfigError: Bad tables, a DataFrame that is not streaming, an unknown keyword (naming
            the nearest valid one, e.g. ``tabels`` -> ``tables``), an output mode that does not
            fit the tables or the query, a table whose key or merged columns the output lacks,
            or an existing table that does not fit (checked before the query starts).
        PostgresError: The sink's database cannot be reached (e.g. a wrong password).
    """
    refuse_unknown(set(unknown), {"df", "sink", "checkpoint", "tables", "per_batch", "once", "trigger",
                                  "event_time", "on_batch", "check_files", "late", "stable",
                                  "count_rows", "output_mode", "rejects", "retry_for"},
                   "onceflow.write_stream")
    options = StreamOptions(tables=tables, per_batch=per_batch, once=once, trigger=trigger,
                            event_time=event_time, on_batch=on_batch, check_files=check_files, late=late,
                            stable=stable, count_rows=count_rows, output_mode=output_mode, rejects=rejects,
                            retry_s=parse_duration(retry_for))
    started = Start(df, sink, checkpoint, options).run()
    return OnceQuery(started.query, started.writer, started.sink, started.listener, restart=started.restart,
                     checkpoint_on_server=started.checkpoint_on_server)

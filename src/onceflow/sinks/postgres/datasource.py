"""``onceflow_postgres``: a Spark Python data source writing to PostgreSQL exactly once.

Streaming (the batch id comes from Spark)::

    from onceflow.sinks.postgres.datasource import register
    register(spark)
    (df.writeStream.format("onceflow_postgres")
       .option("table", "billing").option("mode", "upsert").option("key", "account,window_start")
       .option("checkpointLocation", "/ck").outputMode("update").start())

Inside ``foreachBatch`` (pass the batch id; several tables per batch, each exactly once)::

    (batch_df.write.format("onceflow_postgres").mode("append")
       .option("table", "late_events").option("key", "event_id").option("batch_id", batch_id)
       .save())

Options: ``table`` (required), ``dsn`` (else ``$ONCEFLOW_PG_DSN``), ``mode``
(``append``/``upsert``), ``key``, ``add`` (upsert: columns added instead of
replaced), ``protocol`` (``staged``/``2pc``), ``sink_id`` (default: the table),
``batch_id`` and ``metrics`` (batch writes), ``query_id`` (bind the sink to a
checkpoint). The protocols are in :mod:`onceflow.sinks.postgres.writer`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from onceflow.errors import ConfigError, from_spark
from onceflow.sinks.postgres import stage
from onceflow.sinks.postgres import writer as pg_writer
from onceflow.sinks.postgres.writer import TargetSpec

NAME = "onceflow_postgres"


@dataclass
class PgCommitMessage(WriterCommitMessage):
    """A task's :class:`onceflow.sinks.postgres.writer.TaskMessage`, serialized."""

    payload: str


def _payloads(messages: list[Any]) -> list[str | None]:
    return [m.payload if isinstance(m, PgCommitMessage) else None for m in messages]


class _Writer:
    """What the streaming and the batch writer share: prepare on creation, write a task."""

    def __init__(self, spec: TargetSpec) -> None:
        self.spec = spec
        pg_writer.ensure_tables(spec)
        pg_writer.recover(spec)

    def write(self, iterator: Iterator[Any]) -> PgCommitMessage:
        """Executor side: write one partition (protocol step 1)."""
        return PgCommitMessage(pg_writer.write_task(self.spec, iterator).to_json())


class PgStreamWriter(_Writer, DataSourceStreamArrowWriter):
    """Streaming writer: Spark supplies the batch id."""

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        """Driver side: commit the batch (replays are no-ops)."""
        pg_writer.commit(self.spec, batchId, _payloads(messages))

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        """Driver side: drop what failed attempts left."""
        pg_writer.abort(self.spec, batchId)


class PgBatchWriter(_Writer, DataSourceArrowWriter):
    """Batch writer for ``foreachBatch``: the ``batch_id`` option names the micro-batch."""

    def commit(self, messages: list[Any]) -> None:
        """Driver side: commit the batch (replays are no-ops); ``stage``: record its tasks for the sink."""
        if self.spec.protocol == "stage":
            stage.record_winners(self.spec, self.spec.batch_id, _payloads(messages))
            return
        pg_writer.commit(self.spec, self.spec.batch_id, _payloads(messages))

    def abort(self, messages: list[Any]) -> None:
        """Driver side: drop what failed attempts left."""
        pg_writer.abort(self.spec, self.spec.batch_id)


class PostgresDataSource(DataSource):
    """The ``onceflow_postgres`` format (write only)."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return NAME

    def writer(self, schema: Any, overwrite: bool) -> PgBatchWriter:
        """A batch writer; needs the ``batch_id`` option.

        Raises:
            ConfigError: No ``batch_id``, or overwrite mode.
        """
        spec = TargetSpec.from_options(self.options, schema)
        if spec.batch_id < 0:
            raise ConfigError(
                "a batch write to onceflow_postgres needs option 'batch_id' (the micro-batch id "
                "foreachBatch passes): exactly once is defined per batch id"
            )
        if overwrite:
            raise ConfigError("onceflow_postgres does not overwrite; use mode('append')")
        return PgBatchWriter(spec)

    def streamWriter(self, schema: Any, overwrite: bool) -> PgStreamWriter:  # noqa: N802
        """A streaming writer (batch ids from Spark).

        Raises:
            ConfigError: Protocol ``stage`` (the driver sink's own, for batch writes only).
        """
        spec = TargetSpec.from_options(self.options, schema)
        if spec.protocol == "stage":
            raise ConfigError("option 'protocol' must be 'staged' or '2pc' for a streaming write")
        return PgStreamWriter(spec)


def register(spark: Any) -> None:
    """Register ``onceflow_postgres`` with a session (idempotent).

    Args:
        spark: The SparkSession.
    """
    spark.dataSource.register(PostgresDataSource)


def write_frame(frame: Any, *, dsn: str, table: str, sink_id: str, mode: str, key: str, add: str,
                max: str, min: str, protocol: str, batch_id: int, query_id: str,  # noqa: A002
                metrics: str) -> None:
    """Write one micro-batch's DataFrame to ``table`` through ``onceflow_postgres``, exactly once.

    The options are those of the module; an onceflow error raised in Spark's Python workers
    reaches the caller as itself (:func:`onceflow.errors.from_spark`).
    """
    register(frame.sparkSession)
    try:
        (frame.write.format(NAME).mode("append")
         .option("dsn", dsn).option("table", table).option("sink_id", sink_id)
         .option("mode", mode).option("key", key).option("add", add)
         .option("max", max).option("min", min)
         .option("protocol", protocol).option("batch_id", batch_id)
         .option("query_id", query_id).option("metrics", metrics)
         .save())
    except Exception as exc:
        raise from_spark(exc) from None


def _task(spec: TargetSpec, batches: Iterator[Any]) -> str:
    """Executor side: one partition staged (protocol step 1), its message."""
    return pg_writer.write_task(spec, batches).to_json()


def stage_frame(frame: Any, **options: Any) -> None:
    """The ``stage`` protocol's tasks for the driver sink, without the data source (same options).

    What :func:`write_frame` does with ``protocol="stage"`` — the tables made sure of and an
    earlier attempt's leftovers recovered, the tasks staged, the kept attempts recorded, a
    failed write's leftovers dropped — run through :func:`onceflow.sinks.base.run_tasks`.
    """
    from onceflow.sinks.base import run_tasks

    spec = TargetSpec.from_options(options, frame.schema)
    pg_writer.ensure_tables(spec)
    pg_writer.recover(spec)
    try:
        payloads = run_tasks(frame, functools.partial(_task, spec))
    except BaseException:
        pg_writer.abort(spec, spec.batch_id)
        raise
    stage.record_winners(spec, spec.batch_id, payloads)

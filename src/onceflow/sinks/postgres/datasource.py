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

from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter

from onceflow.errors import ConfigError
from onceflow.sinks._core.tasks import BatchCommits, FormatWriter, StreamCommits, WriteFormat, save_frame
from onceflow.sinks.postgres import stage
from onceflow.sinks.postgres import writer as pg_writer
from onceflow.sinks.postgres.writer import TargetSpec

NAME = "onceflow_postgres"


class PgWriter(FormatWriter):
    """The format's write of a batch (:mod:`onceflow.sinks._core.tasks`), prepared on creation (driver)."""

    def __init__(self, spec: TargetSpec) -> None:
        self.spec = spec
        pg_writer.ensure_tables(spec)
        pg_writer.recover(spec)

    def task(self, iterator: Iterator[Any]) -> str:
        """Executor side: one partition written (protocol step 1)."""
        return pg_writer.write_task(self.spec, iterator).to_json()

    def apply(self, bodies: list[Any], batch_id: int) -> None:
        """Driver side: commit the batch (replays are no-ops); ``stage``: record its tasks for the sink."""
        if self.spec.protocol == "stage":
            stage.record_winners(self.spec, batch_id, bodies)
            return
        pg_writer.commit(self.spec, batch_id, bodies)

    def discard(self, batch_id: int) -> None:
        """Driver side: drop what failed attempts left."""
        pg_writer.abort(self.spec, batch_id)


class PgStreamWriter(StreamCommits, PgWriter, DataSourceStreamArrowWriter):
    """Streaming writer: Spark supplies the batch id."""


class PgBatchWriter(BatchCommits, PgWriter, DataSourceArrowWriter):
    """Batch writer for ``foreachBatch``: the ``batch_id`` option names the micro-batch."""


class PostgresDataSource(WriteFormat):
    """The ``onceflow_postgres`` format (write only)."""

    NAME = NAME

    def spec(self, schema: Any) -> TargetSpec:
        """The options parsed."""
        return TargetSpec.from_options(self.options, schema)

    def batch_writer(self, spec: TargetSpec, schema: Any) -> PgBatchWriter:
        """A batch writer."""
        return PgBatchWriter(spec)

    def stream_writer(self, spec: TargetSpec, schema: Any) -> PgStreamWriter:
        """A streaming writer.

        Raises:
            ConfigError: Protocol ``stage`` (the driver sink's own, for batch writes only).
        """
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
    save_frame(frame, PostgresDataSource, {
        "dsn": dsn, "table": table, "sink_id": sink_id, "mode": mode, "key": key, "add": add, "max": max,
        "min": min, "protocol": protocol, "batch_id": batch_id, "query_id": query_id, "metrics": metrics})


def stage_frame(frame: Any, **options: Any) -> None:
    """The ``stage`` protocol's tasks for the driver sink, without the data source (same options).

    What :func:`write_frame` does with ``protocol="stage"`` — the tables made sure of and an
    earlier attempt's leftovers recovered, the tasks staged, the kept attempts recorded, a
    failed write's leftovers dropped — run through :meth:`onceflow.sinks._core.tasks.FormatWriter.run`.
    """
    spec = TargetSpec.from_options(options, frame.schema)
    PgWriter(spec).run(frame, spec.batch_id)

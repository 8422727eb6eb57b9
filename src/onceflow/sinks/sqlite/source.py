"""``onceflow_sqlite``: a Spark Python data source writing one SQLite table exactly once per batch.

Streaming (the batch id comes from Spark)::

    from onceflow.sinks.sqlite.source import register
    register(spark)
    (df.writeStream.format("onceflow_sqlite")
       .option("db", "/data/app.db").option("table", "events").option("sink_id", "events")
       .option("checkpointLocation", "/ck").start())

Inside ``foreachBatch`` (pass the batch id)::

    (batch_df.write.format("onceflow_sqlite").mode("append")
       .option("db", "/data/app.db").option("table", "totals").option("key", "account")
       .option("spec", '{"mode": "merge", "key": ["account"], "add": ["amount"]}')
       .option("batch_id", batch_id).save())

Options: ``db`` and ``table`` (required), ``sink_id`` (default ``default``; the marker is the row
``(sink_id, batch)`` of ``onceflow_batches``), ``spec`` (JSON of :class:`onceflow.tables.Table`'s
arguments; default ``{"mode": "append"}``), ``key`` (comma-separated), ``batch_id`` (batch
writes). The database must be a file the driver (the Spark Connect server, on Connect) reaches,
the scratch files a directory beside it that the tasks reach. Tasks convert and write the rows,
the driver copies them into the table with the marker: :mod:`onceflow.sinks.sqlite.tasks`.
``onceflow.write_stream`` with ``onceflow.sqlite(...)`` uses the same tasks for a large batch,
every table of the batch in one transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)

from onceflow.sinks.base import check_batch_write
from onceflow.sinks.marker import BatchStats
from onceflow.sinks.sqlite import tasks
from onceflow.sinks.sqlite.tasks import TaskSpec

NAME = "onceflow_sqlite"


@dataclass
class SQLiteCommitMessage(WriterCommitMessage):
    """A task's scratch file (:func:`onceflow.sinks.sqlite.tasks.write_task`)."""

    written: dict[str, Any]


class _Writer:
    """What the streaming and the batch writer share."""

    def __init__(self, spec: TaskSpec, schema: Any) -> None:
        from pyspark.sql.pandas.types import to_arrow_schema

        self.spec = spec
        self.schema = to_arrow_schema(schema, timezone="UTC")

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SQLiteCommitMessage:
        """Executor side: one partition's scratch file (step 1)."""
        return SQLiteCommitMessage(tasks.write_task(self.spec, iterator))

    def _commit(self, messages: list[Any], batch_id: int) -> None:
        """Driver side: the kept files (step 2), then the batch applied (steps 3-4)."""
        spec = replace(self.spec, batch_id=batch_id)
        files = tasks.kept_files(spec, batch_id, tasks.messages_of(iter(messages)))
        from onceflow.sinks.sqlite.sink import SQLiteTablesSink

        sink = SQLiteTablesSink(spec.db, sink_id=spec.sink_id)
        rows = sum(int(f["rows"]) for f in files)
        try:
            sink.apply_files(batch_id, {spec.table: (self.schema, files)}, {spec.table: spec.table_spec()},
                             BatchStats(rows, 0, 0), rows, check_keys=True)
        finally:
            sink.close()
            tasks.discard(spec, batch_id)

    def _abort(self, batch_id: int) -> None:
        """Driver side: the attempt's scratch files removed (nothing of them is in a table)."""
        tasks.discard(self.spec, batch_id)


class SQLiteStreamWriter(_Writer, DataSourceStreamArrowWriter):
    """Streaming writer: Spark supplies the batch id."""

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        """Driver side: apply the batch (a replay is a no-op)."""
        self._commit(messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        """Driver side: remove the attempt's files."""
        self._abort(batchId)


class SQLiteBatchWriter(_Writer, DataSourceArrowWriter):
    """Batch writer for ``foreachBatch``: the ``batch_id`` option names the micro-batch."""

    def commit(self, messages: list[Any]) -> None:
        """Driver side: apply the batch (a replay is a no-op)."""
        self._commit(messages, self.spec.batch_id)

    def abort(self, messages: list[Any]) -> None:
        """Driver side: remove the attempt's files."""
        self._abort(self.spec.batch_id)


class SQLiteDataSource(DataSource):
    """The ``onceflow_sqlite`` format (write only)."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return NAME

    def writer(self, schema: Any, overwrite: bool) -> SQLiteBatchWriter:
        """A batch writer; needs the ``batch_id`` option.

        Raises:
            ConfigError: No ``batch_id``, or overwrite mode.
        """
        spec = TaskSpec.from_options(self.options)
        check_batch_write(NAME, spec.batch_id, overwrite)
        return SQLiteBatchWriter(spec, schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> SQLiteStreamWriter:  # noqa: N802
        """A streaming writer (batch ids from Spark)."""
        return SQLiteStreamWriter(TaskSpec.from_options(self.options), schema)


def register(spark: Any) -> None:
    """Register ``onceflow_sqlite`` with a session (idempotent)."""
    spark.dataSource.register(SQLiteDataSource)

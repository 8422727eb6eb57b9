"""``onceflow_sqlite``: a Spark Python data source writing one SQLite table exactly once per batch.

Streaming (the batch id comes from Spark)::

    from onceflow.sinks.sqlite.datasource import register
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
``(sink_id, batch)`` of ``onceflow_batches``), ``spec`` (JSON of :class:`onceflow.sinks._core.tables.Table`'s
arguments; default ``{"mode": "append"}``), ``key`` (comma-separated), ``batch_id`` (batch
writes), ``chunk_bytes`` (a task completes a scratch file after this many bytes of Arrow data and
goes on in a new one; default 8 MiB where the driver's Python reads files into memory, 3.11+, else
0: one file a task). The database must be a file the driver (the Spark Connect server, on Connect)
reaches, the scratch files a directory beside it that the tasks reach. Tasks convert and write the
rows, the driver copies them into the table with the marker: :mod:`onceflow.sinks.sqlite.tasks`.
``onceflow.write_stream`` with ``onceflow.sqlite(...)`` uses the same tasks for a large batch,
every table of the batch in one transaction.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter

from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks._core.tasks import BatchCommits, FormatWriter, StreamCommits, WriteFormat
from onceflow.sinks.sqlite import tasks
from onceflow.sinks.sqlite.tasks import TaskSpec

NAME = "onceflow_sqlite"


class SQLiteWriter(FormatWriter):
    """The format's write of one batch (:mod:`onceflow.sinks._core.tasks`): scratch files, then one copy."""

    def __init__(self, spec: TaskSpec, schema: Any) -> None:
        from onceflow.sinks._core.checks import arrow_schema

        self.spec = spec
        self.schema = arrow_schema(schema)

    def task(self, iterator: Iterator[pa.RecordBatch]) -> dict[str, Any]:
        """Executor side: one partition's scratch file (step 1)."""
        return tasks.write_task(self.spec, iterator)

    def apply(self, bodies: list[Any], batch_id: int) -> None:
        """Driver side: the kept files (step 2), then the batch applied (steps 3-4)."""
        spec = replace(self.spec, batch_id=batch_id)
        files = tasks.kept_files(spec, batch_id, bodies)
        from onceflow.sinks.sqlite.sink import SQLiteTablesSink

        sink = SQLiteTablesSink(spec.db, sink_id=spec.sink_id)
        rows = sum(int(f["rows"]) for f in files)
        try:
            sink.apply_files(batch_id, {spec.table: (self.schema, files)}, {spec.table: spec.table_spec()},
                             BatchStats(rows, 0, 0), rows, check_keys=True)
        finally:
            sink.close()
            tasks.discard(spec, batch_id)

    def discard(self, batch_id: int) -> None:
        """Driver side: the attempt's scratch files removed (nothing of them is in a table)."""
        tasks.discard(self.spec, batch_id)


class SQLiteStreamWriter(StreamCommits, SQLiteWriter, DataSourceStreamArrowWriter):
    """Streaming writer: Spark supplies the batch id."""


class SQLiteBatchWriter(BatchCommits, SQLiteWriter, DataSourceArrowWriter):
    """Batch writer for ``foreachBatch``: the ``batch_id`` option names the micro-batch."""


class SQLiteDataSource(WriteFormat):
    """The ``onceflow_sqlite`` format (write only)."""

    NAME = NAME

    def spec(self, schema: Any) -> TaskSpec:
        """The options parsed."""
        return TaskSpec.from_options(self.options)

    def batch_writer(self, spec: TaskSpec, schema: Any) -> SQLiteBatchWriter:
        """A batch writer."""
        return SQLiteBatchWriter(spec, schema)

    def stream_writer(self, spec: TaskSpec, schema: Any) -> SQLiteStreamWriter:
        """A streaming writer."""
        return SQLiteStreamWriter(spec, schema)


def register(spark: Any) -> None:
    """Register ``onceflow_sqlite`` with a session (idempotent)."""
    spark.dataSource.register(SQLiteDataSource)

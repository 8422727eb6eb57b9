"""``onceflow_delta``: a Spark Python data source writing Delta tables exactly once per batch.

Streaming (the batch id comes from Spark)::

    from onceflow.sinks.delta.datasource import register
    register(spark)
    (df.writeStream.format("onceflow_delta")
       .option("root", "/lake").option("table", "events").option("sink_id", "events")
       .option("checkpointLocation", "/ck").start())

Inside ``foreachBatch`` (pass the batch id; each table exactly once)::

    (batch_df.write.format("onceflow_delta").mode("append")
       .option("root", "/lake").option("table", "totals").option("mode", "merge")
       .option("key", "account").option("merged", '{"amount": "add"}')
       .option("batch_id", batch_id).save())

Options: ``root`` and ``table`` (required), ``sink_id`` (default ``default``; the marker is the
Delta app transaction ``onceflow:<sink_id>``), ``mode`` (``append``, ``upsert`` or ``merge``),
``key`` (comma-separated), ``merged`` (JSON: column -> ``add``/``max``/``min``), ``batch_id``
(batch writes), ``metadata`` (the commit's ``onceflow`` metadata, JSON). Tasks write the files,
the driver commits them with the marker: :mod:`onceflow.sinks.delta.files`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter

from onceflow.sinks._core.tasks import BatchCommits, FormatWriter, StreamCommits, WriteFormat
from onceflow.sinks.delta import files
from onceflow.sinks.delta.files import FilesSpec

NAME = "onceflow_delta"


class DeltaWriter(FormatWriter):
    """The format's write of a batch (:mod:`onceflow.sinks._core.tasks`); the schema from the driver."""

    def __init__(self, spec: FilesSpec, schema: Any, found: pa.Schema | None) -> None:
        """``found``: the table's Arrow schema as the caller read it (None: no table yet)."""
        from onceflow.sinks._core.checks import arrow_schema

        self.rows_schema = arrow_schema(schema)
        self.spec = replace(spec, schema=files.encode_schema(found)) if found is not None else spec
        self.commit_schema = found if found is not None else self.rows_schema

    def task(self, iterator: Iterator[pa.RecordBatch]) -> dict[str, Any]:
        """Executor side: one partition's file (step 1)."""
        return files.write_task(self.spec, iterator)

    def apply(self, bodies: list[Any], batch_id: int) -> None:
        """Driver side: commit the batch (replays are no-ops; uncommitted files are in no commit)."""
        files.commit(self.spec, batch_id, self.commit_schema, bodies)


class DeltaStreamWriter(StreamCommits, DeltaWriter, DataSourceStreamArrowWriter):
    """Streaming writer: Spark supplies the batch id."""


class DeltaBatchWriter(BatchCommits, DeltaWriter, DataSourceArrowWriter):
    """Batch writer for ``foreachBatch``: the ``batch_id`` option names the micro-batch."""


class DeltaDataSource(WriteFormat):
    """The ``onceflow_delta`` format (write only)."""

    NAME = NAME

    def spec(self, schema: Any) -> FilesSpec:
        """The options parsed."""
        return FilesSpec.from_options(self.options)

    def batch_writer(self, spec: FilesSpec, schema: Any) -> DeltaBatchWriter:
        """A batch writer (the table's schema read here, on the driver)."""
        return DeltaBatchWriter(spec, schema, files.table_schema(spec.path))

    def stream_writer(self, spec: FilesSpec, schema: Any) -> DeltaStreamWriter:
        """A streaming writer (the table's schema read here, on the driver)."""
        return DeltaStreamWriter(spec, schema, files.table_schema(spec.path))


def register(spark: Any) -> None:
    """Register ``onceflow_delta`` with a session (idempotent)."""
    spark.dataSource.register(DeltaDataSource)


def write_files(frame: Any, spec: FilesSpec, found: pa.Schema | None) -> list[dict[str, Any]]:
    """Step 1 for the sink, without the data source (:func:`onceflow.sinks._core.tasks.run_tasks`).

    Each task casts its rows to the table's schema ``found`` (the sink read it; None: no table
    yet), as the format's tasks do.

    Returns:
        The kept attempts' messages.
    """
    from onceflow.sinks._core.tasks import run_tasks

    writer = DeltaWriter(spec, frame.schema, found)
    return run_tasks(frame, functools.partial(files.write_task, writer.spec))

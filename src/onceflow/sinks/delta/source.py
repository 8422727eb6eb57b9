"""``onceflow_delta``: a Spark Python data source writing Delta tables exactly once per batch.

Streaming (the batch id comes from Spark)::

    from onceflow.sinks.delta.source import register
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
from onceflow.sinks.delta import files
from onceflow.sinks.delta.files import FilesSpec

NAME = "onceflow_delta"


@dataclass
class DeltaCommitMessage(WriterCommitMessage):
    """A task's files (:func:`onceflow.sinks.delta.files.write_task`)."""

    written: dict[str, Any]


def _written(messages: list[Any]) -> list[dict[str, Any] | None]:
    return [m.written if isinstance(m, DeltaCommitMessage) else None for m in messages]


class _Writer:
    """What the streaming and the batch writer share: the table's schema read once, on the driver."""

    def __init__(self, spec: FilesSpec, schema: Any, found: pa.Schema | None) -> None:
        """``found``: the table's Arrow schema as the caller read it (None: no table yet)."""
        from pyspark.sql.pandas.types import to_arrow_schema

        self.rows_schema = to_arrow_schema(schema, timezone="UTC")
        self.spec = replace(spec, schema=files.encode_schema(found)) if found is not None else spec
        self.commit_schema = found if found is not None else self.rows_schema

    def write(self, iterator: Iterator[pa.RecordBatch]) -> DeltaCommitMessage:
        """Executor side: one partition's file (step 1)."""
        return DeltaCommitMessage(files.write_task(self.spec, iterator))

    def _commit(self, messages: list[Any], batch_id: int) -> None:
        """Driver side: commit the batch (replays are no-ops)."""
        files.commit(self.spec, batch_id, self.commit_schema, _written(messages))


class DeltaStreamWriter(_Writer, DataSourceStreamArrowWriter):
    """Streaming writer: Spark supplies the batch id."""

    def commit(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        """Driver side: commit the batch (replays are no-ops)."""
        self._commit(messages, batchId)

    def abort(self, messages: list[Any], batchId: int) -> None:  # noqa: N803
        """Driver side: nothing to undo (uncommitted files are in no commit)."""


class DeltaBatchWriter(_Writer, DataSourceArrowWriter):
    """Batch writer for ``foreachBatch``: the ``batch_id`` option names the micro-batch."""

    def commit(self, messages: list[Any]) -> None:
        """Driver side: commit the batch (replays are no-ops)."""
        self._commit(messages, self.spec.batch_id)

    def abort(self, messages: list[Any]) -> None:
        """Driver side: nothing to undo (uncommitted files are in no commit)."""


class DeltaDataSource(DataSource):
    """The ``onceflow_delta`` format (write only)."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return NAME

    def writer(self, schema: Any, overwrite: bool) -> DeltaBatchWriter:
        """A batch writer; needs the ``batch_id`` option.

        Raises:
            ConfigError: No ``batch_id``, or overwrite mode.
        """
        spec = FilesSpec.from_options(self.options)
        check_batch_write(NAME, spec.batch_id, overwrite)
        return DeltaBatchWriter(spec, schema, files.table_schema(spec.path))

    def streamWriter(self, schema: Any, overwrite: bool) -> DeltaStreamWriter:  # noqa: N802
        """A streaming writer (batch ids from Spark)."""
        spec = FilesSpec.from_options(self.options)
        return DeltaStreamWriter(spec, schema, files.table_schema(spec.path))


def register(spark: Any) -> None:
    """Register ``onceflow_delta`` with a session (idempotent)."""
    spark.dataSource.register(DeltaDataSource)


def write_files(frame: Any, spec: FilesSpec, found: pa.Schema | None) -> list[dict[str, Any]]:
    """Step 1 for the sink, without the data source (:func:`onceflow.sinks.base.run_tasks`).

    Each task casts its rows to the table's schema ``found`` (the sink read it; None: no table
    yet), as the format's tasks do.

    Returns:
        The kept attempts' messages.
    """
    from onceflow.sinks.base import run_tasks

    writer = _Writer(spec, frame.schema, found)
    return run_tasks(frame, functools.partial(files.write_task, writer.spec))

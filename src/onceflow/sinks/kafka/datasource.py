"""The ``onceflow_kafka_topics`` format: Kafka records produced by Spark's tasks, on its own.

The ``onceflow_kafka_topics`` format (a PySpark Python data source, write only) runs the tasks; its rows
are ``topic`` (string), ``key`` and ``value`` (binary or string) and optionally ``h`` (long, the
record's hash). Options: ``bootstrap`` (required), ``sink_id``, ``conf`` (JSON librdkafka
settings), ``batch_id`` (batch writes), ``query_id``, ``tasks_topic``, ``headers`` (``true``: each
record gets ``onceflow.sink``/``onceflow.batch``), ``expected`` (JSON topic -> records: the commit
checks the tasks' counts against it) and ``mark`` (``true``, the default: the data source's commit
writes the batch's marker; :class:`onceflow.sinks.kafka.sink.KafkaTopicsSink` writes its own).

The tasks are :mod:`onceflow.sinks.kafka.tasks`; :class:`KafkaWriter`'s commit (on the driver) checks
their counts and, with ``mark``, writes the marker through the driver-side sink.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter

from onceflow.sinks._core.tasks import BatchCommits, FormatWriter, StreamCommits, WriteFormat, save_frame
from onceflow.sinks.kafka.sink import KafkaTopicsSink
from onceflow.sinks.kafka.tasks import (
    NAME,
    TASK_PARTITIONS,
    TASKS_TOPIC_CONFIG,
    TaskSpec,
    checked_sums,
    records_task,
)


class KafkaWriter(FormatWriter):
    """The format's write of a batch (:mod:`onceflow.sinks._core.tasks`): records from tasks, checked sums."""

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec
        if spec.mark:  # the format on its own: its tasks topic made sure of (the sink makes its own)
            self._sink().ensure_topic(spec.tasks_topic, TASK_PARTITIONS, TASKS_TOPIC_CONFIG)

    def _sink(self) -> KafkaTopicsSink:
        conf = {k: v for k, v in self.spec.conf.items() if k != "bootstrap.servers"}
        return KafkaTopicsSink(str(self.spec.conf["bootstrap.servers"]), sink_id=self.spec.sink_id,
                               options=conf, tasks_topic=self.spec.tasks_topic)

    def task(self, iterator: Iterator[pa.RecordBatch]) -> dict[str, Any]:
        """Executor side: one partition's records (steps K1-K6)."""
        return records_task(self.spec, iterator)

    def apply(self, bodies: list[Any], batch_id: int) -> None:
        """Driver side: every task's message there, the counts the expected ones; the marker if asked.

        Nothing to undo on abort: a committed task's records are the batch's, kept by its marker.

        Raises:
            OnceflowError: A task's message missing, or the tasks' records not the batch's.
        """
        got = checked_sums(self.spec, batch_id, bodies)
        if self.spec.mark:
            sink = self._sink()
            query_id = self.spec.query_id or next((str(m["query_id"]) for m in bodies if m), "")
            if not query_id:  # no task ran: nothing produced, nothing to mark
                return
            try:
                sink.bind(query_id)
                sink.mark(batch_id, got)
            finally:
                sink.close()


class KafkaStreamWriter(StreamCommits, KafkaWriter, DataSourceStreamArrowWriter):
    """Streaming writer: Spark supplies the batch id."""


class KafkaBatchWriter(BatchCommits, KafkaWriter, DataSourceArrowWriter):
    """Batch writer for ``foreachBatch``: the ``batch_id`` option names the micro-batch."""


class KafkaDataSource(WriteFormat):
    """The ``onceflow_kafka_topics`` format (write only; ``onceflow_kafka`` is onceflow's Kafka reader)."""

    NAME = NAME

    def spec(self, schema: Any) -> TaskSpec:
        """The options parsed."""
        return TaskSpec.from_options(self.options)

    def batch_writer(self, spec: TaskSpec, schema: Any) -> KafkaBatchWriter:
        """A batch writer."""
        return KafkaBatchWriter(spec)

    def stream_writer(self, spec: TaskSpec, schema: Any) -> KafkaStreamWriter:
        """A streaming writer."""
        return KafkaStreamWriter(spec)


def write_frame(frame: Any, spec: TaskSpec) -> None:
    """Produce one micro-batch's records (``topic, key, value, h``) through ``onceflow_kafka_topics``."""
    save_frame(frame, KafkaDataSource, spec.options())

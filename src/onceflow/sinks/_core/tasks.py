"""Every sink's executor side, written once: tasks write and return a message, the driver commits.

Every onceflow sink that writes from Spark's tasks (SQLite's scratch files, Delta's data files,
PostgreSQL's staged rows, Kafka's per-task transactions, HTTP's calls) has the same shape,
Spark's own for a data source write:

* a **task function** ``task(batches) -> message`` runs in each of Spark's tasks over its
  partition's Arrow batches and returns a small JSON-able message (what it wrote: a file, a
  stage, a span of records, counts) — never the rows;
* the **driver** gets the messages of the attempts Spark kept, one per partition, and commits
  them with the batch's marker in the sink's one commit (``apply``), or undoes what an
  attempt left (``discard``).

That shape reaches Spark two ways, both here:

* :func:`run_tasks` — for ``onceflow.write_stream``: the task function as an identity
  ``mapInArrow`` whose output is the messages; the sink's own protocol then commits them.
* :class:`WriteFormat` — the sink's ``writeStream.format(...)`` / ``write.format(...)`` data
  source (PySpark's ``pyspark.sql.datasource``): a format subclasses :class:`FormatWriter`
  (``task``, ``apply``, ``discard``) once, and its streaming and batch writers are that class
  with :class:`StreamCommits` or :class:`BatchCommits` and PySpark's Arrow writer base.

Data source classes are pickled by reference: Spark's workers import them from the installed
package, so each format's classes live at module level of an onceflow module.
"""

from __future__ import annotations

import abc
import contextlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import pyarrow as pa
from pyspark.sql.datasource import DataSource, WriterCommitMessage

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

__all__ = ["BatchCommits", "FormatWriter", "RunningTask", "StreamCommits", "TaskMessage", "WriteFormat",
           "check_batch_write", "kept_messages", "run_tasks", "running_task", "save_frame"]


@dataclass
class TaskMessage(WriterCommitMessage):
    """What a format's task returned (the task function's message), as Spark hands it to the driver."""

    body: Any


class FormatWriter(abc.ABC):
    """One format's write of one batch: :meth:`task` on the executors, :meth:`apply` on the driver.

    Attributes:
        spec: The format's options, parsed (picklable: no connection, no session); its
            ``batch_id`` is the micro-batch of a batch write (-1 for a streaming one).
    """

    spec: Any

    def write(self, iterator: Iterator[pa.RecordBatch]) -> TaskMessage:
        """Executor side: one partition through :meth:`task`."""
        return TaskMessage(self.task(iterator))

    @abc.abstractmethod
    def task(self, iterator: Iterator[pa.RecordBatch]) -> Any:
        """Executor side: one partition's rows written; their small message (JSON-able)."""

    @abc.abstractmethod
    def apply(self, bodies: list[Any], batch_id: int) -> None:
        """Driver side: the kept tasks' messages committed as batch ``batch_id``.

        A message is None where a task sent none. A replay of a batch the sink has is a no-op.
        """

    def discard(self, batch_id: int) -> None:  # noqa: B027 - most formats have nothing to undo
        """Driver side: what the failed write of ``batch_id`` left, undone (default: nothing to undo)."""

    def run(self, frame: DataFrame, batch_id: int) -> None:
        """The same write without the data source (:func:`run_tasks`): the tasks, then :meth:`apply`.

        A failed run is undone (:meth:`discard`) before the error reaches the caller.
        """
        try:
            bodies = run_tasks(frame, self.task)
        except BaseException:
            self.discard(batch_id)
            raise
        self.apply(bodies, batch_id)

    @staticmethod
    def bodies(messages: Iterable[Any]) -> list[Any]:
        """The tasks' messages Spark passes, unwrapped (None where Spark has none)."""
        return [m.body if isinstance(m, TaskMessage) else None for m in messages]


class StreamCommits:
    """A streaming writer's commit and abort: Spark supplies the batch id."""

    def commit(self: Any, messages: list[Any], batchId: int) -> None:  # noqa: N803
        """Driver side: the batch committed (:meth:`FormatWriter.apply`)."""
        self.apply(FormatWriter.bodies(messages), batchId)

    def abort(self: Any, messages: list[Any], batchId: int) -> None:  # noqa: N803
        """Driver side: the attempt's leftovers undone (:meth:`FormatWriter.discard`)."""
        self.discard(batchId)


class BatchCommits:
    """A batch writer's commit and abort (``foreachBatch``): the ``batch_id`` option names the batch."""

    def commit(self: Any, messages: list[Any]) -> None:
        """Driver side: the batch committed (:meth:`FormatWriter.apply`)."""
        self.apply(FormatWriter.bodies(messages), self.spec.batch_id)

    def abort(self: Any, messages: list[Any]) -> None:
        """Driver side: the attempt's leftovers undone (:meth:`FormatWriter.discard`)."""
        self.discard(self.spec.batch_id)


class WriteFormat(DataSource):
    """A write-only onceflow format: its name, its options parsed, its two writers.

    Subclasses set :attr:`NAME` and implement :meth:`spec`, :meth:`batch_writer` and
    :meth:`stream_writer`; a batch write is refused before any writer exists unless it names
    its micro-batch and appends (:func:`check_batch_write`).
    """

    NAME: ClassVar[str]

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return cls.NAME

    @abc.abstractmethod
    def spec(self, schema: Any) -> Any:
        """The options parsed (``self.options``); ``schema`` is the rows' Spark schema."""

    @abc.abstractmethod
    def batch_writer(self, spec: Any, schema: Any) -> FormatWriter:
        """The batch writer for ``spec``."""

    @abc.abstractmethod
    def stream_writer(self, spec: Any, schema: Any) -> FormatWriter:
        """The streaming writer for ``spec``."""

    def writer(self, schema: Any, overwrite: bool) -> Any:
        """A batch writer; needs the ``batch_id`` option.

        Raises:
            ConfigError: No ``batch_id``, or overwrite mode.
        """
        spec = self.spec(schema)
        check_batch_write(self.NAME, spec.batch_id, overwrite)
        return self.batch_writer(spec, schema)

    def streamWriter(self, schema: Any, overwrite: bool) -> Any:  # noqa: N802
        """A streaming writer (batch ids from Spark)."""
        return self.stream_writer(self.spec(schema), schema)


def check_batch_write(fmt: str, batch_id: int, overwrite: bool) -> None:
    """A batch write to one of onceflow's formats names its micro-batch and appends.

    Raises:
        ConfigError: No ``batch_id`` option, or overwrite mode.
    """
    from onceflow.errors import ConfigError

    if batch_id < 0:
        raise ConfigError(f"a batch write to {fmt} needs option 'batch_id' (the micro-batch id foreachBatch "
                          "passes): exactly once is defined per batch id")
    if overwrite:
        raise ConfigError(f"{fmt} does not overwrite; use mode('append')")


def save_frame(frame: DataFrame, source: Any, options: Mapping[str, Any]) -> None:
    """``frame`` written through the data source class ``source`` (registered here) with ``options``.

    An onceflow error raised in Spark's Python workers reaches the caller as itself
    (:func:`onceflow.errors.from_spark`).
    """
    from onceflow.errors import from_spark

    frame.sparkSession.dataSource.register(source)
    writer = frame.write.format(source.name()).mode("append")
    for k, v in options.items():
        writer = writer.option(k, v)
    try:
        writer.save()
    except Exception as exc:
        raise from_spark(exc) from None


ARROW_MAX_BYTES = "spark.sql.execution.arrow.maxBytesPerBatch"
"""Spark's byte bound on one Arrow batch handed to Python (checked after every row)."""
ARROW_MAX_BYTES_DEFAULT = "67108864b"
"""That bound's default as Spark reports it (64 MiB)."""
UNMETERED = str(2**31 - 1)
"""The value at which Spark skips the bound's check (Java's ``Integer.MAX_VALUE``)."""


@contextlib.contextmanager
def unmetered_arrow(spark: Any) -> Iterator[None]:
    """Spark's per-row byte check of Arrow batches off for the jobs started inside, if at its default.

    To keep each Arrow batch it hands to Python under
    ``spark.sql.execution.arrow.maxBytesPerBatch``, Spark measures the batch's vectors after
    every row it adds; for a sink's tasks that measuring is a large part of the JVM's work
    (BENCHMARKS.md). Inside this block the session's bound is Java's ``Integer.MAX_VALUE``,
    where Spark skips the measure: batches are then bounded by ``maxRecordsPerBatch`` rows
    alone, as before Spark 4.0. A bound the user set (anything but the default) is kept, and
    so is the default where this Spark refuses the value. Jobs of other threads of the same
    session that start meanwhile see the same setting.
    """
    try:
        lift = spark.conf.get(ARROW_MAX_BYTES) == ARROW_MAX_BYTES_DEFAULT
        if lift:
            spark.conf.set(ARROW_MAX_BYTES, UNMETERED)
    except Exception:  # noqa: BLE001 - an older or stricter Spark: its bound stays
        lift = False
    try:
        yield
    finally:
        if lift:
            with contextlib.suppress(Exception):
                spark.conf.unset(ARROW_MAX_BYTES)


def run_tasks(frame: DataFrame, task: Callable[[Iterator[pa.RecordBatch]], Any]) -> list[Any]:
    """Each partition of ``frame`` through ``task`` in its Spark task; the tasks' messages on the driver.

    What a data source's ``write`` does, without the data source: ``task`` runs in the Python
    worker of each of Spark's tasks over the partition's Arrow batches (an identity
    ``mapInArrow`` whose only output is ``task``'s message, JSON), and the driver gets one
    message per partition — of the attempt Spark kept, as a data source's commit does — in
    the one Spark job of the call, with Spark's per-row byte check of the Arrow batches off
    (:func:`unmetered_arrow`). A Python data source write starts Python processes for its
    lookup, its planning and its commit besides the tasks' workers, one after another, in
    each new process; this starts none of those. ``task`` and what it holds must pickle (no
    connection, no session).

    Raises:
        OnceflowError: A task failed (an onceflow error raised in a task reaches the caller as itself).
    """
    from onceflow.errors import from_spark

    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        message = json.dumps(task(batches))
        yield pa.RecordBatch.from_arrays([pa.array([message], pa.string())], names=["message"])

    try:
        with unmetered_arrow(frame.sparkSession):
            found = frame.mapInArrow(run, "message string").toArrow()
    except Exception as exc:
        raise from_spark(exc) from None
    return [json.loads(m) for m in found.column("message").to_pylist()]


def kept_messages(messages: Iterable[Any], missing: str) -> list[Any]:
    """The task messages Spark's commit passes (one per task), all of them there.

    Raises:
        OnceflowError: ``missing``: Spark passes None for a task that failed.
    """
    from onceflow.errors import OnceflowError

    found = list(messages)
    if any(m is None for m in found):
        raise OnceflowError(missing)
    return found


@dataclass(frozen=True)
class RunningTask:
    """The Spark task a sink's row writer runs in (on an executor).

    Attributes:
        batch_id: The streaming micro-batch (-1: not a streaming write, or not in a task).
        partition: The task's partition.
        attempt: Spark's attempt number (retries and speculative copies count up).
        query_id: The streaming query's id ("" outside one).
    """

    batch_id: int
    partition: int
    attempt: int
    query_id: str


def running_task() -> RunningTask:
    """The running Spark task (batch -1, partition 0, attempt 0 outside a task)."""
    from pyspark import TaskContext

    tc = TaskContext.get()
    if tc is None:
        return RunningTask(-1, 0, 0, "")
    raw = tc.getLocalProperty("streaming.sql.batchId")
    return RunningTask(int(raw) if raw else -1, tc.partitionId(), tc.attemptNumber(),
                       tc.getLocalProperty("sql.streaming.queryId") or "")

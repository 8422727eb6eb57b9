"""The sink contracts: every micro-batch reaches the sink's tables exactly once.

A sink receives, for each micro-batch, the rows of each of its tables (see
:class:`onceflow.sinks._core.tables.Table` for the write modes). ``append`` and ``add`` are not
idempotent — a batch written twice duplicates rows or double-counts — so the sink keeps a
marker per ``(sink_id, batch_id)`` (:mod:`onceflow.sinks._core.marker`) and writes it in the
transaction that writes the rows.

**The commit steps**, numbered the same in every sink's docstring (a backend may split a step
into parts, e.g. the SQLite sink's staged path S1-S6, or add its own crash points):

1. **Check.** Crash point ``before_sink_write``. The rows are checked against the tables'
   specs (null keys or ``add`` values, a key twice, a value the backend cannot hold): a batch
   that cannot be written is refused here with :class:`onceflow.errors.BatchRejectedError`,
   before anything is written and before Spark's commit log. Spark computed batch N from a
   replayable input, so after a crash it re-runs N with the same input and hands over the
   same rows: this step may run any number of times.
2. **Decide.** Open a write transaction (exclusive against other writers of the marker). If
   the marker ``(sink_id, N)`` exists, an earlier attempt committed N: end the transaction and
   return False. Nothing changes — a replay is a no-op.
3. **Write.** Write every table by its mode (creating a missing table from the batch's schema).
4. **Mark.** Insert the marker with the batch's metrics. Crash point ``inside_sink_txn``:
   a crash here leaves nothing visible.
5. **Commit** durably. Crash point ``after_sink_commit``: Spark has not written its commit
   log, so it re-runs N after a restart and step 2 skips it. Fault ``ambiguous_commit``: the
   commit succeeded but the caller sees an error — the same: N fails, is re-run, is skipped.
6. **Return** True; Spark then writes ``commits/N``.

A sink may also make N durable in step 5 in a form it applies to the tables later (the SQLite
sink's staged path): its recovery (in ``bind``) must then apply whatever is durable and not
applied, in batch order, and ``flush`` waits for the apply.

Two kinds of sink, as types:

* :class:`DriverSink` takes each table's rows as a ``pyarrow.Table`` collected to the driver
  (SQLite, PostgreSQL ``driver``, Delta, HTTP): small and medium outputs.
* :class:`ExecutorSink` takes each table as a Spark DataFrame, and Spark's executors write the
  rows (PostgreSQL ``staged`` and ``2pc``, :mod:`onceflow.sinks.postgres.writer`: each table
  then has its own marker, written in the transaction that makes its rows visible or records
  the decision to).

Most sinks are both: SQLite, PostgreSQL ``driver``, Delta, Kafka and HTTP collect a small
batch to the driver and have a large one written by Spark's tasks, chosen per batch by its
input rows (``collect_below``); Iceberg's batches are always written by Spark's tasks.

Every method runs on the driver, in the process that started the query; only the row writes
of an :class:`ExecutorSink` run on executors: their contract (a task function returning a message,
the driver committing the messages) is :mod:`onceflow.sinks._core.tasks`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pyarrow as pa

from onceflow.sinks._core.marker import BatchStats

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from onceflow.sinks._core.tables import Table

__all__ = ["BatchStats", "CollectingSink", "DriverSink", "ExecutorSink", "Settle", "Sink", "SinkBase",
           "TablesSink", "collected"]

@dataclass(frozen=True)
class Settle:
    """The batch's numbers for its marker, known only once the tasks have run its plan.

    Given to :meth:`ExecutorSink.commit_frames` for a frame that is not cached (it is computed
    once, by the write): called with the rows each table got (summed from the tasks' messages),
    after the tasks' write and before the marker; returns the batch's :class:`BatchStats` and
    ``rows_out``.

    Attributes:
        numbers: What a call runs.
        input_rows: The batch's input rows as known before it runs (its files' row counts, its
            offsets, or its files' bytes over a row's size) — the same in every attempt of the
            batch, so a sink may size its tasks by it; None: unknown.
    """

    numbers: Callable[[Mapping[str, int]], tuple[BatchStats, int]]
    input_rows: int | None = None

    def __call__(self, written: Mapping[str, int]) -> tuple[BatchStats, int]:
        """The batch's :class:`BatchStats` and ``rows_out``, given the rows each table got."""
        return self.numbers(written)


class Sink(Protocol):
    """What every sink has, whatever side writes its rows."""

    sink_id: str
    """The marker namespace: two queries writing to one database need different ids."""

    all_or_nothing: bool
    """Whether a batch's tables commit together (one transaction): no reader, and no later
    attempt, ever sees part of a batch. False where each table commits on its own (Delta,
    executor-side PostgreSQL, HTTP effects): a crash can leave a batch in some tables only, so
    its other tables must be written from the same computation (:mod:`onceflow.engine.stable`)."""

    keeps_markers: bool
    """Whether the sink keeps a marker per batch it committed (every sink of onceflow's does;
    verify's negative controls do not): the start-up check that the sink is in step with the
    checkpoint (:func:`onceflow.checkpoint.guard.check_start`) needs them."""

    tables_are_topics: bool
    """Whether a table name is a Kafka topic name (``.`` and ``-`` allowed,
    :func:`onceflow.sinks._core.tables.check_specs`)."""

    writes_uncached: bool
    """Whether :meth:`ExecutorSink.commit_frames` takes a frame that is not cached, with ``settle``:
    its tasks count the rows, and the marker is written after them. :func:`onceflow.write_stream`
    then computes a large one-table batch once, in the sink's own write (no cache, no count
    before it), when nothing else reads the frame (no key to check, no ``stable=``, ``late=`` or
    input contract)."""

    @property
    def parts(self) -> Sequence[Sink]:
        """The sinks of a query with several; empty for one sink.

        :class:`onceflow.sinks._core.several.SeveralSinks` has them; the start-up and replay checks
        (:mod:`onceflow.checkpoint.guard`) read each.
        """

    @property
    def ahead(self) -> int:
        """The last batch any of :attr:`parts` had when bound (-1: none, or one sink)."""

    def all_batches(self) -> list[dict[str, Any]]:
        """Every marker the sink keeps: of several sinks, of every batch any of them has.

        What ``onceflow repair`` restores plans from. Runs on the driver; reads only.
        """

    def recent_batches(self) -> list[dict[str, Any]]:
        """The markers of the last committed batches (at least the last one), by batch id.

        What the start-up check reads; a sink whose full history is costly to read (a Kafka
        marker topic) reads only its end. Runs on the driver; reads only.
        """

    def repair_options(self) -> str:
        """The ``onceflow repair`` options that name this sink (a password left out)."""

    def bind(self, query_id: str) -> None:
        """Tie the sink to the checkpoint with ``query_id``; recover what an earlier process left.

        Runs on the driver, before the first batch of every process (and may run again with
        the same id: idempotent). A new checkpoint restarts batch ids at 0 and step 2 would then
        wrongly skip new data, so a sink bound to another query id raises
        :class:`onceflow.errors.CheckpointMismatchError`.
        """

    def check(self, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:
        """Before the query starts: connect, and check the tables that exist against the specs.

        Runs on the driver, once per :func:`onceflow.write_stream` (a wrong password or an
        unreachable server fails here, not at the first batch); reads only — it creates none
        of the user's tables (the first batch does, from its rows).

        Args:
            specs: Table name -> spec.
            schemas: Table name -> the columns its output will have, where known.

        Raises:
            ConfigError: An existing table lacks a column, or has another primary key.
        """

    def batches(self) -> list[dict[str, Any]]:
        """The sink's marker rows (:mod:`onceflow.sinks._core.marker`), by batch id.

        Runs on the driver, any number of times; reads only.
        """

    def flush(self) -> None:
        """Wait until every batch the sink accepted is in its tables.

        Runs on the driver, any number of times (after every batch it may, when the query ends
        it does); a no-op for a sink whose ``commit`` returns with the rows in place.
        """

    def close(self) -> None:
        """Release connections. Runs on the driver; idempotent."""


def _remade(cls: type[SinkBase], args: tuple[Any, ...], kwargs: dict[str, Any]) -> SinkBase:
    """A sink made again from the arguments it was made with (see :meth:`SinkBase.__reduce__`)."""
    return cls(*args, **kwargs)


class SinkBase:
    """The defaults every sink of onceflow's declares (see :class:`Sink` for each member).

    A sink pickles as the arguments it was made with, never its connections, threads or
    pending work: on Spark Connect the ``foreachBatch`` function (and the sink in it) is
    pickled on the client and runs in a Python worker on the server, where the sink opens its
    own connections — as a new driver process would.
    """

    sink_id: str
    keeps_markers: bool = True
    tables_are_topics: bool = False
    writes_uncached: bool = False
    _made_with: tuple[tuple[Any, ...], dict[str, Any]]

    def __new__(cls, *args: Any, **kwargs: Any) -> SinkBase:
        """A new sink that remembers the arguments it is made with (for pickling)."""
        made = super().__new__(cls)
        made._made_with = (args, kwargs)
        return made

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as its class and the arguments it was made with (see the class)."""
        args, kwargs = self._made_with
        return (_remade, (type(self), args, kwargs))

    def _check_start(self, batch_id: int, frames: Mapping[str, DataFrame],
                     specs: Mapping[str, Table]) -> None:
        """Step 1's start for a batch given as DataFrames: the crash point, the specs' columns.

        Raises:
            BatchRejectedError: A table's spec names a column its frame lacks.
        """
        from onceflow import faults
        from onceflow.sinks._core.checks import check_outputs

        faults.reached(faults.CrashPoint.BEFORE_SINK_WRITE, batch_id)
        check_outputs(frames, specs, rows=False)

    def _counted(self, batch_id: int, frames: Mapping[str, DataFrame], specs: Mapping[str, Table],
                 written: Mapping[str, int] | None) -> dict[str, int]:
        """:meth:`_check_start`, then the rows per table (``written``, else counted by Spark).

        Raises:
            BatchRejectedError: A table's spec names a column its frame lacks.
        """
        self._check_start(batch_id, frames, specs)
        return dict(written) if written is not None else {n: f.count() for n, f in frames.items()}

    def batches(self) -> list[dict[str, Any]]:
        """The sink's marker rows, by batch id (each sink reads its own)."""
        raise NotImplementedError

    parts: Sequence[Sink] = ()
    ahead: int = -1

    def all_batches(self) -> list[dict[str, Any]]:
        """Every marker: here :meth:`batches` (several sinks merge theirs)."""
        return self.batches()

    def recent_batches(self) -> list[dict[str, Any]]:
        """The markers of the last committed batches: here every marker (:meth:`batches`)."""
        return self.batches()

    def repair_options(self) -> str:
        """The ``onceflow repair`` options that name this sink (each sink names its database)."""
        raise NotImplementedError


@runtime_checkable
class DriverSink(Sink, Protocol):
    """A sink whose rows are collected to the driver as Arrow tables."""

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Steps 1-6 for batch ``batch_id``: write every table and the marker, unless the marker exists.

        Runs on the driver, inside Spark's ``foreachBatch``; once per attempt of the batch, so
        any number of times with the same arguments (after a crash, a task failure, an
        ambiguous commit). Idempotent per ``batch_id``: only the first call that commits has an
        effect.

        Args:
            batch_id: Spark's micro-batch id.
            outputs: Table name -> the batch's rows for it.
            specs: Table name -> its spec (every output needs one).
            stats: The batch's input rows and late drops (for the marker).
            rows_out: Rows of the batch's DataFrame (after deduplication and late drops).

        Returns:
            True if this call committed (or durably staged) the batch, False for a replay.
        """


@runtime_checkable
class ExecutorSink(Sink, Protocol):
    """A sink whose rows go from Spark's executors straight to the database."""

    def commit_frames(self, batch_id: int, frames: Mapping[str, DataFrame], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int, written: Mapping[str, int] | None = None,
                      settle: Settle | None = None) -> bool:
        """Steps 1-6 for batch ``batch_id``, each table by its own marker ``<sink_id>.<table>``.

        Runs on the driver, inside Spark's ``foreachBatch``; the row writes of step 3 run on the
        executors, one task per partition, each task any number of times (Spark retries tasks).
        Called once per attempt of the batch and idempotent per ``batch_id`` and table.
        ``frames`` are cached by the caller: the checks of step 1 and the write read them once;
        ``written`` is their row counts when the caller has them (else the sink counts). With
        ``settle`` (only to a sink that :attr:`Sink.writes_uncached`), one frame that is not
        cached: the sink neither counts nor reads it before its write, and takes ``stats`` and
        ``rows_out`` from ``settle`` once its tasks have run (the arguments are placeholders).

        Returns:
            True if the batch's first table was committed by this call (False: a replay).
        """


@runtime_checkable
class CollectingSink(DriverSink, ExecutorSink, Protocol):
    """A sink with both paths (Delta): a small batch collected, a large one written by the tasks.

    :func:`onceflow.write_stream` takes the collected path (one Spark job, no cache) when the
    batch's input has fewer than ``collect_below`` rows — counted before the batch runs, from its
    files or its offsets — and the executor-side path otherwise, or when the input's size is
    unknown.
    """

    collect_below: int


TablesSink = DriverSink | ExecutorSink
"""Any sink :func:`onceflow.write_stream` takes."""


def collected(frames: Mapping[str, DataFrame]) -> dict[str, pa.Table]:
    """A small batch's DataFrames as Arrow tables on the driver (the collected path)."""
    return {n: f.toArrow() for n, f in frames.items()}

"""What :func:`onceflow.write_stream` does per micro-batch: one method per step.

:class:`BatchWriter` is the ``foreachBatch`` function. For micro-batch N (the sink's own
commit protocol is in :mod:`onceflow.sinks._core.base`, numbered the same in every sink):

1. **Bind** (:meth:`BatchWriter._bind`), before the first batch of a process: tie the sink to the
   checkpoint's query id (a database written by another checkpoint is refused: batch ids restart
   at 0 there); check that the sink is neither behind nor ahead of the checkpoint
   (:func:`onceflow.checkpoint.guard.check_start`); delete the stable copies of batches Spark's commit log
   has. For a checkpoint that exists, :meth:`BatchWriter.bind_at_start` runs this step before
   Spark starts the query, for the batch Spark will run next — so a sink restored from a backup
   is refused at start, also when no batch would run (``once=True`` and no new input).
2. **Count** (:meth:`BatchWriter._count`, in a thread beside Spark's own work): N's input files and
   late watermark from Spark's checkpoint, their rows and (when the event-time column is in
   them) late rows, for Parquet file sources. After step 4 ran N's plan, Spark's metrics of it
   (:func:`onceflow.checkpoint.logs.plan_counts`) give the late drops and the duplicates a
   deduplication dropped, and the input rows of other sources (Kafka, ...); a count onceflow
   cannot know is None (NULL in the marker), never a difference (:meth:`BatchWriter._stats`).
   On Spark Connect (no plan to read) N's commit carries N-1's metrics from the query's
   progress, for N-1's marker (:mod:`onceflow.engine.progress`).
3. **Prepare** (:meth:`BatchWriter._prepare`): run ``per_batch`` on N's DataFrame (lazily: no job
   yet). ``per_batch`` may run more than once for N (after a crash): it must be deterministic given
   N's rows, which Spark guarantees for the rows themselves. With ``stable=``, a copy of N's output
   persisted by an earlier attempt replaces the fresh one before anything is materialized
   (protocol: :mod:`onceflow.engine.stable`). The batch's row count is observed by the first job that
   reads the batch (``DataFrame.observe``: no job of its own; a ``per_batch`` that first runs a
   partial action on the batch — ``limit``, ``isEmpty`` — makes that count partial), unless
   ``count_rows=`` computes it from the outputs.
4. **Materialize** (:meth:`BatchWriter._materialize`): for a driver-side sink, collect each
   DataFrame output as Arrow (one Spark job each; a ``pyarrow.Table`` output is taken as it is;
   outputs all ``pyarrow.Table`` take a sink's collected path at any size, unless
   ``collect_below=0``); for an executor-side sink, cache and count each output so its checks
   and its write read it once — except one output that nothing but the write reads (no key to
   check, no ``stable=``, ``late=`` or contract) into a sink that counts in its tasks
   (:attr:`onceflow.sinks._core.base.Sink.writes_uncached`): it is computed once, by the sink's write,
   and the batch's numbers below are settled after that write, before the marker
   (:meth:`BatchWriter._settle`). With several DataFrame outputs the batch is cached (read once).
   With ``stable=``, the first computation is persisted now, before any sink sees it. With
   ``late=``, the rows of N's input files that the watermark dropped (event time ``<=`` the late
   watermark, the rule :mod:`onceflow.checkpoint.logs` counts by), read back by Spark only when N
   dropped any, go to the ``late`` table with the watermark they missed. With an input contract
   (:mod:`onceflow.engine.contract`): when N's plan counted bad records (or did not run), N's input is
   read back from its offsets and the bad records go to the ``rejects`` table
   (:mod:`onceflow.engine.rejects`) — or, without ``rejects=``, the batch stops here naming the first.
5. **Commit** (:meth:`BatchWriter._commit`): the sink's commit: checked, then written with the
   marker in one transaction, or skipped when N's marker is there. An output row the sink refuses
   is traced to the input record behind it by the deduplication's id where it can be (else the
   error says it cannot be). An error that passes (a lost connection, a lock:
    :mod:`onceflow.sinks._core.retry`)
   runs the sink's commit again from its first step, with backoff, for ``retry_for``; any other
   error fails the query before Spark writes ``commits/N``;
   :meth:`onceflow.OnceQuery.awaitTermination` raises it as the onceflow error it is. With
   ``stable=``, N's persisted copy is deleted once the sink committed N.
6. **Report**: ``on_batch`` gets N's numbers (a replay wrote 0 rows). When the query ends,
   :meth:`BatchWriter.close` waits until the sink applied every batch it accepted.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from onceflow import faults
from onceflow.checkpoint import guard, ranges
from onceflow.checkpoint import logs as ckpt
from onceflow.engine import rejects as rj
from onceflow.engine.contract import Contract, rejected_count
from onceflow.engine.progress import ProgressReader, file_records, with_span
from onceflow.engine.stable import Persisted, StableOutputs
from onceflow.errors import (
    BatchRejectedError,
    ConfigError,
    OnceflowError,
    OutOfStepError,
    UncountableInputError,
)
from onceflow.runtime import plans
from onceflow.sinks._core.base import BatchStats, CollectingSink, DriverSink, ExecutorSink, Settle, TablesSink
from onceflow.sinks._core.retry import retrying
from onceflow.sinks._core.tables import Table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

BYTES_PER_ROW = 100
"""Input bytes taken as one row where a file's rows cannot be counted without reading it (JSON,
CSV): a batch of text files under ``collect_below`` times this many bytes is collected."""


def _quiet(df: DataFrame) -> None:
    """Keep the stop a user asked for out of the logs (Spark logs a query ended by an exception)."""
    import logging

    logging.getLogger("py4j").setLevel(logging.CRITICAL)
    if not plans.is_connect(df):  # Connect: the server's log is its own
        df.sparkSession.sparkContext.setLogLevel("OFF")


PerBatch = Callable[..., "Mapping[str, DataFrame | pa.Table] | DataFrame | pa.Table"]
"""``per_batch(df)`` or ``per_batch(df, batch_id)`` (as ``foreachBatch`` functions take them)."""


def takes_batch_id(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes a second positional argument (the batch id)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or a C callable: call it with the DataFrame only
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind is p.VAR_POSITIONAL for p in params)


@dataclass(frozen=True)
class _FileCounts:
    """A file source batch's rows and late rows, counted from its files (None: not countable)."""

    rows: int
    late: int | None


@dataclass
class _Attempt:
    """One attempt of batch N as it moves through the steps."""

    batch_id: int
    df: DataFrame
    counted: Future[tuple[_FileCounts | None, ckpt.BatchInput | None]]
    observation: Any
    frames: dict[str, Any]
    """Table -> DataFrame or Arrow table (step 3); cached DataFrames for an executor-side sink (4)."""
    kept: Persisted | None
    planned: ranges.InputRange
    """N's input as Spark's checkpoint planned it (kept in the marker)."""
    cached: list[Any] = field(default_factory=list)
    outputs: dict[str, Any] = field(default_factory=dict)
    """Table -> Arrow table (driver-side sink), or None (executor-side: the frames are written)."""
    rows_out: int = 0
    stats: BatchStats = BatchStats(None, None, 0)
    written: dict[str, int] = field(default_factory=dict)
    """Rows per table the batch writes (counted before the sink's commit)."""
    executor_side: bool = False
    """Whether the sink's executor-side path writes this batch (step 4 decides)."""
    uncached: bool = False
    """Whether its one output is written not cached, its numbers settled after the write (step 4)."""
    produced: dict[str, Any] = field(default_factory=dict)
    """What ``per_batch`` returned (``count_rows`` reads these)."""
    before: Future[int | None] | None = None
    """On Spark Connect: the records of N-1's JSON-lines files (engine/progress.py, step 4)."""


@dataclass(frozen=True)
class WriterOptions:
    """How :func:`onceflow.write_stream` configured its batches (validated there)."""

    specs: dict[str, Table]
    per_batch: PerBatch | None
    event_time: str | None
    on_batch: Callable[[dict[str, Any]], None] | None = None
    check_files: Callable[[list[Path]], object] | None = None
    late: str | None = None
    ids: list[str] | None = None
    stable: StableOutputs | None = None
    count_rows: Callable[[dict[str, Any]], int] | None = None
    contract: Contract | None = None
    rejects: str | None = None
    retry_s: float = 60.0


class BatchWriter:
    """The ``foreachBatch`` function of :func:`onceflow.write_stream` (steps 1-6 of the module).

    Spark wraps an exception raised inside ``foreachBatch`` into its own; the query's caller
    re-raises :attr:`error` (what the last batch raised) instead, so the user sees onceflow's
    error and its message.
    """

    error: BaseException | None = None
    restoring: int | None = None
    """The batch whose plan was restored from the sink's marker (the query is to start again)."""

    class Stopped(Exception):  # noqa: N818 - not an error: the user asked the query to stop
        """Raised at the start of a batch after :meth:`request_stop`: nothing of it was written."""

    def __init__(self, sink: TablesSink, checkpoint: Path, options: WriterOptions, spark: Any) -> None:
        self.sink, self.checkpoint, self.o = sink, checkpoint, options
        self.spark = spark  # the query's own session (foreachBatch gets a clone without it)
        self.out_specs = {n: t for n, t in options.specs.items() if n not in (options.late, options.rejects)}
        self._with_id = options.per_batch is not None and takes_batch_id(options.per_batch)
        self._executor_side = isinstance(sink, ExecutorSink)
        self._collecting = sink if isinstance(sink, CollectingSink) else None
        self._qid = ""
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-stats")
        self._stop = threading.Event()
        self._sources_checked = False
        # on Spark Connect the plan's metrics come from the query's progress, a batch late
        self._progress = ProgressReader(spark.session_id) if plans.is_connect(spark) else None

    def __getstate__(self) -> dict[str, Any]:
        """What Spark Connect ships to the server's ``foreachBatch`` worker (the function is pickled).

        The client's session, the stats thread and the stop flag stay behind; the worker makes
        its own (:meth:`__setstate__`), and the sink opens its connections where it runs. The
        sink pickles unbound (its arguments alone), so step 1 runs again in the worker even when
        :meth:`bind_at_start` ran it on the client for a checkpoint that exists.
        """
        state = dict(self.__dict__)
        for name in ("spark", "_pool", "_stop"):
            state.pop(name, None)
        state["_qid"] = ""
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.spark = None  # the worker's batches come with a session of their own; no py4j plan counts
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-stats")
        self._stop = threading.Event()

    def request_stop(self) -> None:
        """Refuse the next batch before anything of it is written (a clean stop between batches)."""
        self._stop.set()

    def __call__(self, df: DataFrame, batch_id: int) -> None:
        """Write batch ``batch_id``; remember what it raised, then raise it."""
        try:
            if self._stop.is_set():  # the query stops here; Spark runs this batch again at the next start
                _quiet(df)
                raise BatchWriter.Stopped(f"stopped before batch {batch_id}")
            self._write(df, batch_id)
        except BaseException as exc:
            self.error = exc
            if isinstance(exc, OutOfStepError):  # the query stops with onceflow's message, not Spark's log
                _quiet(df)
            raise

    def _write(self, df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        self._bind(batch_id)  # 1
        attempt = self._prepare(df, batch_id)  # 2, 3
        try:
            self._materialize(attempt)  # 4
            committed = self._commit(attempt)  # 5
        finally:
            for f in attempt.cached:
                f.unpersist()
        if self.o.on_batch is not None:  # 6
            stats = attempt.stats
            self.o.on_batch({"batch_id": batch_id, "committed": committed, "input_rows": stats.input_rows,
                             "late_dropped": stats.late_dropped, "rows_out": attempt.rows_out,
                             "duplicates_dropped": stats.duplicates, "rejected": stats.rejected,
                             "rows_written": {n: k if committed else 0 for n, k in attempt.written.items()},
                             "seconds": time.perf_counter() - started})

    def bind_at_start(self) -> None:
        """Step 1 before the query starts, for the batch Spark runs next; nothing for a new checkpoint.

        Spark runs again the last planned batch that has no commit (``offsets/N`` without
        ``commits/N``), else the one after the last commit.

        Raises:
            OutOfStepError: The sink is behind or ahead of the checkpoint
                (:func:`onceflow.checkpoint.guard.check_start`).
            CheckpointMismatchError: The sink belongs to another checkpoint.
        """
        if ckpt.query_id(self.checkpoint) is None:
            return
        planned = ckpt.offset_batches(self.checkpoint)
        committed = ckpt.committed_batches(self.checkpoint)
        if not planned and not committed:
            return
        done = committed[-1] if committed else -1
        self._bind(planned[-1] if planned and planned[-1] > done else done + 1)

    def _bind(self, batch_id: int) -> None:
        """Step 1, once per process."""
        if self._qid:
            return
        qid = ckpt.query_id(self.checkpoint)
        if qid is None:
            raise OnceflowError(f"checkpoint {self.checkpoint} has no metadata file")
        def bind() -> None:
            self.sink.bind(qid)
            guard.check_start(self.sink, self.checkpoint, batch_id)

        retrying(f"batch {batch_id}: binding the sink", self.o.retry_s, bind)
        if self.o.stable is not None:
            self.o.stable.cleanup(ckpt.committed_batches(self.checkpoint))
        self._qid = qid

    def _count(self, batch_id: int) -> tuple[_FileCounts | None, ckpt.BatchInput | None]:
        """Step 2: N's input files, and their rows and late rows (None: not countable from files)."""
        end = ckpt.source_offset(self.checkpoint, batch_id)
        if end is None or "logOffset" not in end:  # not a file source (Kafka): Spark's plan counts
            return None, None
        batch = ckpt.batch_input(self.checkpoint, batch_id)
        if self.o.check_files is not None:
            self.o.check_files(batch.files)
        # with a contract, rejected records are in the files too: late drops come from Spark's plan
        event_time = self.o.event_time if self.o.contract is None else None
        try:
            rows, late = ckpt.count_input(batch, event_time)
            return _FileCounts(rows, late if event_time else None), batch
        except UncountableInputError:  # not Parquet, or the event time is derived: ask Spark's plan
            try:
                return _FileCounts(ckpt.count_input(batch, None)[0], None), batch
            except UncountableInputError:
                return None, batch

    def _prepare(self, df: DataFrame, batch_id: int) -> _Attempt:
        """Steps 2 and 3: the count started beside, ``per_batch``'s outputs, a stable copy over them."""
        from pyspark.sql import functions as F

        counted = self._pool.submit(self._count, batch_id)  # 2
        observation: Any = None
        observed = df
        if self.o.count_rows is None:  # the first job that reads the batch counts it
            observation = plans.observation(df, f"onceflow-rows-{id(self)}-{batch_id}-{time.monotonic_ns()}")
            observed = df.observe(observation, F.count(F.lit(1)).alias("rows"))
        frames = self._outputs(observed, batch_id)  # 3
        kept = None
        if self.o.stable is not None:  # a persisted first computation replaces this one
            kept = self.o.stable.load(batch_id, self._qid, df.sparkSession,
                                      recompute=self._recomputable)
            if kept is not None:
                frames.update(kept.tables)
        planned = ranges.read(self.checkpoint, batch_id)
        faults.planned(batch_id, planned.has_input())  # crash points arm on batches with input
        attempt = _Attempt(batch_id, df, counted, observation, frames, kept, planned)
        if self._progress is not None:  # N-1's numbers are amended by this batch: their check
            attempt.before = self._pool.submit(file_records, self.checkpoint, batch_id - 1)
        if sum(not isinstance(f, pa.Table) for f in frames.values()) > 1:  # the batch is read once
            attempt.cached.append(observed.persist())
        return attempt

    def _small(self, a: _Attempt) -> bool:
        """Whether a sink with both paths collects this batch: its input has under ``collect_below`` rows.

        The input's rows are known before the batch runs: its files' row counts (step 2), its
        offsets (Kafka's per partition), or, for files whose rows cannot be counted without
        reading them (JSON, CSV), estimated from their bytes (:data:`BYTES_PER_ROW`). Unknown:
        not small (the executors write it). Outputs that are all Arrow (on the driver already)
        are small at any size, unless ``collect_below=0`` (every batch through the sink's tasks).
        """
        c = self._collecting
        if c is None:
            return False
        if c.collect_below > 0 and all(isinstance(f, pa.Table) for f in a.frames.values()):
            return True
        rows = self._input_rows(a)
        return rows is not None and rows < c.collect_below

    def _input_rows(self, a: _Attempt) -> int | None:
        """N's input rows as known before it runs (see :meth:`_small`; the same in every attempt)."""
        counted, batch = a.counted.result()
        if counted is not None:
            return int(counted.rows)
        if batch is not None and all(f.is_file() for f in batch.files):  # (not on a remote store)
            return sum(f.stat().st_size for f in batch.files) // BYTES_PER_ROW
        return a.planned.records()

    def _recomputable(self) -> bool:
        """Whether a damaged stable copy of N may be computed again: no sink can hold part of the copy.

        True when the sink commits a batch all or nothing: nothing of N is visible unless N is
        committed, and then its marker skips this attempt. A sink whose tables commit one by one
        may hold N in some tables from the copy (its markers cannot say it holds none): refused.
        """
        return bool(self.sink.all_or_nothing)

    def _outputs(self, df: DataFrame, batch_id: int) -> dict[str, Any]:
        """Step 3: what ``per_batch`` returned, as ``{table: DataFrame or Arrow table}``."""
        specs, per_batch, late = self.out_specs, self.o.per_batch, self.o.late
        if per_batch is None:
            if len(specs) != 1:
                raise ConfigError(f"with several tables ({sorted(specs)}) per_batch= must say which "
                                  "rows go where: return {table_name: DataFrame}")
            return {next(iter(specs)): df}
        out = per_batch(df, batch_id) if self._with_id else per_batch(df)
        if not isinstance(out, Mapping):
            if len(specs) != 1:
                raise ConfigError("per_batch returned one DataFrame, but tables= names several tables: "
                                  "return {table_name: DataFrame}")
            return {next(iter(specs)): out}
        if late is not None and late in out:
            raise ConfigError(f"per_batch returned rows for {late!r}, the table of late rows (late=): "
                              "onceflow fills it; write to another table")
        if self.o.rejects is not None and self.o.rejects in out:
            raise ConfigError(f"per_batch returned rows for {self.o.rejects!r}, the table of bad records "
                              "(rejects=): onceflow fills it; write to another table")
        return dict(out)

    def _materialize(self, a: _Attempt) -> None:
        """Step 4: the outputs computed (and persisted once, with ``stable=``), counted, late rows added."""
        a.produced = dict(a.frames)
        a.executor_side = self._executor_side and not self._small(a)
        if a.executor_side and self._uncached(a):  # the sink's write computes it; the numbers after
            a.uncached = True
            a.frames = {n: self._frame(a.df, f) for n, f in a.frames.items()}
            a.outputs = {n: None for n in a.frames}
            return
        if a.executor_side:  # the executors write the rows: each frame is computed once
            a.frames = {n: self._frame(a.df, f).persist() for n, f in a.frames.items()}
            a.cached.extend(a.frames.values())
            a.written = {n: f.count() for n, f in a.frames.items()}
            a.rows_out = a.kept.rows_out if a.kept is not None else self._rows_out(a, a.produced)
            if self.o.stable is not None and a.kept is None:
                a.frames.update(self.o.stable.save(a.batch_id, self._qid, a.frames, a.rows_out).tables)
            a.outputs = {n: None for n in a.frames}
        else:
            try:
                a.outputs = {n: f if isinstance(f, pa.Table) else f.toArrow() for n, f in a.frames.items()}
            except BaseException:
                a.counted.result()  # a bad input file is the clearer error: it names the file
                raise
            a.rows_out = a.kept.rows_out if a.kept is not None else self._rows_out(a, a.outputs)
            if self.o.stable is not None and a.kept is None:
                a.outputs.update(self.o.stable.save(a.batch_id, self._qid, a.outputs, a.rows_out).tables)
            a.written = {n: t.num_rows for n, t in a.outputs.items()}
        a.stats, plan_ran = self._input_stats(a)
        if self.o.contract is not None:
            self._add_rejects(a, plan_ran)
        late = self.o.late
        if late is None:
            return
        counted, batch = a.counted.result()
        if self.o.contract is not None:  # Spark's count (None: unknown, so read the late rows back)
            wanted = a.stats.late_dropped is None or a.stats.late_dropped > 0
        else:  # the files' count
            wanted = bool(counted is not None and counted.late and batch is not None)
        rows = rj.late_rows(a.df.sparkSession, self.checkpoint, a.batch_id, batch, self.o.contract,
                            str(self.o.event_time), self.o.ids) if wanted else None
        if rows is not None:
            self._add_output(a, late, rows)

    def _uncached(self, a: _Attempt) -> bool:
        """Whether N's one output is read by the sink's write only, so it need not be cached (step 4)."""
        if not self.sink.writes_uncached or len(a.frames) != 1:
            return False
        if self.o.stable is not None or self.o.late is not None or self.o.contract is not None:
            return False
        ((name, frame),) = a.frames.items()
        return not isinstance(frame, pa.Table) and not self.o.specs[name].key

    def _settle(self, a: _Attempt, written: Mapping[str, int]) -> tuple[BatchStats, int]:
        """Step 4's numbers of an uncached output, once the sink's tasks have run N's plan.

        Called by the sink between its tasks' write and its marker (maybe more than once: a
        retried commit); ``written`` is what the tasks wrote per table.
        """
        a.written = dict(written)
        if self.o.count_rows is not None:
            a.rows_out = int(self.o.count_rows(a.produced))
        elif self.o.per_batch is None:  # the output is the batch itself
            a.rows_out = sum(written.values())
        else:
            a.rows_out = self._rows_out(a, a.produced)
        a.stats = self._input_stats(a)[0]
        return a.stats, a.rows_out

    def _input_stats(self, a: _Attempt) -> tuple[BatchStats, bool]:
        """Step 4's :meth:`_stats` from N's counted input, with the input range Spark planned."""
        counted, batch = a.counted.result()
        stats, plan_ran = self._stats(a, counted, batch)
        return replace(stats, input_range=a.planned.to_json()), plan_ran

    def _add_output(self, a: _Attempt, name: str, rows: DataFrame) -> int:
        """Add a table onceflow fills (late rows, bad records) to N's outputs; its row count."""
        if a.executor_side:
            a.frames[name] = rows.persist()
            a.cached.append(a.frames[name])
            a.outputs[name] = None
            a.written[name] = a.frames[name].count()
        else:
            a.outputs[name] = rows.toArrow()
            a.written[name] = a.outputs[name].num_rows
        return a.written[name]

    def _add_rejects(self, a: _Attempt, plan_ran: bool) -> None:
        """Step 4: N's bad records, read back from its offsets when its plan counted any (or did not run).

        Without ``rejects=`` a batch with bad records stops here, naming the first one.
        """
        contract = self.o.contract
        assert contract is not None
        if not self._sources_checked:
            rj.check_sources(self.checkpoint, a.batch_id)
            self._sources_checked = True
        counted = rejected_count(self.spark, self._qid, contract) if a.kept is None and self._qid else None
        none = counted == 0 and plan_ran  # the plan ran once and counted no bad record
        rows = None if none else rj.rejected_rows(a.df.sparkSession, self.checkpoint, a.batch_id, contract)
        rejected, table = 0, self.o.rejects
        if rows is not None and table is None:
            found = rows.toArrow()
            if found.num_rows:
                rj.refuse(a.batch_id, found)
        elif rows is not None and table is not None:
            rejected = self._add_output(a, table, rows)
        a.stats = replace(a.stats, rejected=rejected)

    def _commit(self, a: _Attempt) -> bool:
        """Step 5: the sink's commit of N; then N's stable copy is no longer needed."""
        def commit() -> bool:
            sink = self.sink
            if a.uncached and isinstance(sink, ExecutorSink):
                settle = Settle(functools.partial(self._settle, a), self._input_rows(a))
                return sink.commit_frames(a.batch_id, a.frames, self.o.specs, a.stats, a.rows_out,
                                          settle=settle)
            if a.executor_side and isinstance(sink, ExecutorSink):
                return sink.commit_frames(a.batch_id, a.frames, self.o.specs, a.stats, a.rows_out,
                                          written=a.written)
            assert isinstance(sink, DriverSink)  # a collected batch: an executor-only sink never has one
            return sink.commit_tables(a.batch_id, a.outputs, self.o.specs, a.stats, a.rows_out)

        guard.check_sinks_agree(self.sink, self.checkpoint, a.planned)  # several sinks: before any writes
        try:
            committed = retrying(f"batch {a.batch_id}: the sink's commit", self.o.retry_s, commit)
        except BatchRejectedError as exc:
            raise rj.traced(a.df.sparkSession, self.checkpoint, a.batch_id, self.o.contract, self.o.ids,
                            exc) from None
        if a.uncached and not committed:  # a replay ran no task: its input's numbers only, for on_batch
            a.written = a.written or {n: 0 for n in a.frames}
            a.stats = self._input_stats(a)[0]
        if not committed:  # a replay: the marker's batch must be the batch Spark plans now
            guard.check_replay(self.sink, self.checkpoint, a.planned)
        if guard.continue_restore(self.sink, self.checkpoint, a.batch_id):  # (several sinks: one wrote)
            self.restoring = a.batch_id + 1
        if self.o.stable is not None:
            self.o.stable.drop(a.batch_id)
        return committed

    def _stats(self, a: _Attempt, files: _FileCounts | None,
               batch: ckpt.BatchInput | None) -> tuple[BatchStats, bool]:
        """Step 4's end: N's input rows, late drops and duplicates; None where they are unknown.

        From N's files (rows; late rows by Spark's rule when the event-time column is in them)
        and from Spark's metrics of N's plan (:func:`onceflow.checkpoint.logs.plan_counts`), used
        only when this attempt ran the plan exactly once: its scans read what the files hold,
        or (other sources) its top produced the batch's rows. A batch whose outputs came from
        a stable copy did not run its plan: what only the plan knows is None.

        Returns:
            The stats, and whether the plan's metrics are N's (it ran exactly once).
        """
        watermark = (batch.late_watermark_ms if batch is not None  # read with the files in step 2
                     else ckpt.late_watermark_ms(self.checkpoint, a.batch_id))
        plan = None
        if a.kept is None and self._qid and self.spark is not None:
            plan = ckpt.plan_counts(self.spark, self._qid)
        if plan is not None:
            once = (plan.input_rows == files.rows if files is not None
                    else plan.root_rows is None or plan.root_rows == a.rows_out)
            plan = plan if once else None
        rows = files.rows if files is not None else plan.input_rows if plan is not None else None
        late = plan.late_dropped if plan is not None else files.late if files is not None else None
        dups = plan.duplicates if plan is not None else None
        amend = self._progress.previous(self._qid, a.batch_id) if self._progress is not None else None
        amend = with_span(amend, a.before.result() if a.before is not None else None)
        return BatchStats(rows, late, watermark, dups, amend=amend), plan is not None

    @staticmethod
    def _frame(df: DataFrame, value: Any) -> DataFrame:
        """An output as a DataFrame (an Arrow table from ``per_batch`` becomes one)."""
        if isinstance(value, pa.Table):
            return df.sparkSession.createDataFrame(value)
        return value  # type: ignore[no-any-return]

    def _rows_out(self, a: _Attempt, outputs: dict[str, Any]) -> int:
        """Rows of the batch's DataFrame: ``count_rows(outputs)``, or observed by its first job.

        Observed: by the first Spark job that read the batch. If ``per_batch`` never read the
        batch (its outputs do not depend on it), the batch is counted by a job of its own.
        """
        if self.o.count_rows is not None:
            return int(self.o.count_rows(outputs))
        observed = plans.observed(a.observation)
        if observed is not None:
            return int(observed["rows"])
        return int(a.df.count())

    def close(self) -> None:
        """Stop the stats thread; wait until the sink applied every batch it accepted."""
        self._pool.shutdown(wait=True)
        self.sink.flush()

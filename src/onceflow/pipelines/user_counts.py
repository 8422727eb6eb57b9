"""Streaming Systems Example 5-1: per-user and global counts per minute, exactly once.

Data path::

    event log (Parquet segments, Spark file source, replayable by offset)
      -> withWatermark(event_time, allowed lateness)
      -> dropDuplicatesWithinWatermark(event_id)      # Spark state, bounded
      -> foreachBatch: per-(user, minute) deltas       # a batch aggregation
      -> sink.commit_batch(batch_id, deltas, stats)    # marker + rows, one txn
                                                       # (SQLite: staged, applied beside
                                                       # the next batch; sinks/sqlite.py)

Why deduplicate within the *event-time* watermark: Spark 4.3 allows one
watermark per query with several stateful operators, and a retried event has
its original's event time, so the dedup state of an event can be dropped once
the watermark passed it — any later copy is then late and dropped by Spark's
late rule anyway. The window counts are per-batch deltas added by the sink
instead of a second stateful aggregation: one state store less, and the sink's
batch marker makes the non-idempotent addition exactly once.

Resume contract: the checkpoint holds Spark's offset log (files of each batch
and its watermark), the dedup state and the commit log. After a crash Spark
re-runs the first batch without a commit-log entry with the same files and the
same state, so the same deltas reach the sink, which skips them if their marker
is already there. Nothing before that batch is re-read.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow.compute as pc
from pyspark.sql import functions as F

from onceflow import checkpoint as ckpt
from onceflow.api import BatchWriter
from onceflow.errors import OnceflowError
from onceflow.pipelines.common import (
    UserCountsConfig,
    deduplicated_events,
    run_foreach_batch,
)
from onceflow.records import WINDOW_MS
from onceflow.sinks.base import BatchStats, ExactlyOnceSink
from onceflow.sources.log import EventLog

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

__all__ = ["RunResult", "UserCountsConfig", "deduplicated_events", "run", "window_deltas"]


def window_deltas(events: DataFrame) -> DataFrame:
    """Per-(user, 1-minute window) counts of a (batch) DataFrame of events.

    Args:
        events: Events with the event schema.

    Returns:
        Columns ``user, window_start_ms, window_end_ms, count`` (epoch-aligned windows).
    """
    start = (F.floor(F.unix_micros("event_time") / (WINDOW_MS * 1000)) * WINDOW_MS).cast("long")
    return (
        events.groupBy("user", start.alias("window_start_ms"))
        .agg(F.count(F.lit(1)).alias("count"))
        .select(
            "user",
            "window_start_ms",
            (F.col("window_start_ms") + WINDOW_MS).alias("window_end_ms"),
            "count",
        )
    )


@dataclass
class RunResult:
    """Totals of one run (this process only).

    Attributes:
        batches_committed: Batches this run committed to the sink.
        batches_replayed: Batches found already committed (replays after a crash).
        input_rows: Rows read by committed batches.
        late_dropped: Rows dropped as late.
        duplicates_dropped: Rows dropped as duplicates.
        events_counted: Events added to the counts.
        rows_written: Per-user window rows upserted.
        seconds: Wall time from query start to stop.
        batch_log: One dict per batch handed to the sink (as given to ``on_commit``),
            the last 1000 only, so a long continuous run does not grow without bound.
        progress: Spark's own progress reports of the query (the last 100).
    """

    batches_committed: int = 0
    batches_replayed: int = 0
    input_rows: int = 0
    late_dropped: int = 0
    duplicates_dropped: int = 0
    events_counted: int = 0
    rows_written: int = 0
    seconds: float = 0.0
    batch_log: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=1000))
    progress: list[dict[str, Any]] = field(default_factory=list)

    @property
    def events_per_second(self) -> float:
        """Input rows per wall-clock second."""
        return self.input_rows / self.seconds if self.seconds > 0 else 0.0


CommitCallback = Callable[[dict[str, Any]], None]


class _BatchWriter(BatchWriter):
    """The foreachBatch function: validate, measure, aggregate, commit."""

    def __init__(self, cfg: UserCountsConfig, sink: ExactlyOnceSink, log: EventLog,
                 result: RunResult, on_commit: CommitCallback | None) -> None:
        self.cfg = cfg
        self.sink = sink
        self.log = log
        self.result = result
        self.on_commit = on_commit
        self._bound = False
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onceflow-stats")

    def close(self) -> None:
        self._pool.shutdown(wait=True)

    def _check_and_count(self, batch: ckpt.BatchInput) -> BatchStats:
        self.log.validate(batch.files)
        return _batch_stats(batch)

    def _write(self, df: DataFrame, batch_id: int) -> None:
        started = time.perf_counter()
        if not self._bound:
            qid = ckpt.query_id(self.cfg.checkpoint)
            if qid is None:
                raise OnceflowError(f"checkpoint {self.cfg.checkpoint} has no metadata file")
            self.sink.bind(qid)
            self._bound = True
        batch = ckpt.batch_input(self.cfg.checkpoint, batch_id)
        # The batch's files are validated and their late rows counted with pyarrow while
        # Spark runs the batch; nothing reaches the sink before both are done.
        pending = self._pool.submit(self._check_and_count, batch)
        if self.sink.executor_side:  # the rows go from the executors to the sink
            frame = window_deltas(df).persist()
            stats = pending.result()
            committed = self.sink.commit_frame(batch_id, frame, stats)
            total = frame.agg(F.sum("count"), F.count(F.lit(1))).first() or (0, 0)
            frame.unpersist()
            counted, num_rows = int(total[0] or 0), int(total[1])
        else:
            try:
                deltas = window_deltas(df).toArrow()
            except BaseException:
                pending.result()  # a bad segment is the clearer error: it names the file
                raise
            stats = pending.result()
            committed = self.sink.commit_batch(batch_id, deltas, stats)
            counted, num_rows = pc.sum(deltas.column("count")).as_py() or 0, deltas.num_rows
        info: dict[str, Any] = {
            "batch_id": batch_id,
            "committed": committed,
            "input_rows": stats.input_rows,
            "late_dropped": stats.late_dropped,
            "duplicates_dropped": stats.input_rows - stats.late_dropped - counted,
            "events_counted": counted,
            "rows_written": num_rows,
            "seconds": time.perf_counter() - started,
        }
        r = self.result
        if committed:
            r.batches_committed += 1
            r.input_rows += stats.input_rows
            r.late_dropped += stats.late_dropped
            r.duplicates_dropped += info["duplicates_dropped"]
            r.events_counted += counted
            r.rows_written += num_rows
        else:
            r.batches_replayed += 1
        r.batch_log.append(info)
        if self.on_commit is not None:
            self.on_commit(info)


def _batch_stats(batch: ckpt.BatchInput) -> BatchStats:
    """Input rows and late drops of a batch, from its files and late watermark."""
    rows, late = ckpt.count_input(batch, "event_time")
    return BatchStats(rows, late, batch.late_watermark_ms)


def run(
    spark: SparkSession,
    cfg: UserCountsConfig,
    sink: ExactlyOnceSink,
    once: bool = True,
    on_commit: CommitCallback | None = None,
) -> RunResult:
    """Run Example 5-1 until the log is drained (``once``) or until interrupted.

    Args:
        spark: The session (see :func:`onceflow.spark.session`).
        cfg: Pipeline configuration.
        sink: Where the counts go.
        once: Process everything available now, then return.
        on_commit: Called after every batch with its numbers.

    Returns:
        The run's totals.

    Raises:
        BadSegmentError: A segment is unreadable or has the wrong schema.
        CheckpointMismatchError: The sink belongs to another checkpoint.
    """
    log = EventLog(cfg.log_dir)
    log.directory.mkdir(parents=True, exist_ok=True)
    log.validate()
    result = RunResult()
    writer = _BatchWriter(cfg, sink, log, result, on_commit)
    try:
        result.seconds, result.progress = run_foreach_batch(
            spark, cfg, deduplicated_events(spark, cfg), writer, once)
        flushed = time.perf_counter()
        sink.flush()  # a staged sink's last batch is in the tables when run() returns
        result.seconds += time.perf_counter() - flushed
    finally:
        writer.close()
    return result

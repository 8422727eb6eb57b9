"""What every onceflow pipeline over the event log shares.

The source (Spark's file stream source over the log's segments, replayable by
offset), deduplication by ``event_id`` bounded by the event-time watermark, and
the driver loop: start a ``foreachBatch`` query, wait, turn failures into
errors that name their cause. Why the dedup state is bounded by the event-time
watermark: Spark 4.3 allows one watermark per query with several stateful
operators, and a retried event has its original's event time, so its dedup
state can go once the watermark passed it — any later copy is late and dropped
by Spark's late rule anyway.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from onceflow.errors import BadSegmentError, ConfigError
from onceflow.faults import CrashPoint, armed, commit_log_listener
from onceflow.records import EVENT_DDL
from onceflow.sources.log import EventLog

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@dataclass(frozen=True)
class PipelineConfig:
    """How to run a pipeline over the event log.

    Attributes:
        log_dir: The event log directory.
        checkpoint: Spark checkpoint directory (one per query, reused on restart).
        allowed_lateness_s: Watermark delay: events more than this behind the
            maximum event time seen are late and dropped (and counted).
        max_files_per_trigger: Segments per micro-batch; all available when None.
        trigger_interval: Processing-time trigger for continuous runs.
    """

    log_dir: Path
    checkpoint: Path
    allowed_lateness_s: float = 60.0
    max_files_per_trigger: int | None = None
    trigger_interval: str = "1 second"

    def __post_init__(self) -> None:
        if self.allowed_lateness_s <= 0:
            raise ConfigError(
                "allowed lateness must be > 0: it bounds the dedup state (a zero or "
                f"missing delay would keep every event id forever), got {self.allowed_lateness_s}"
            )
        if self.max_files_per_trigger is not None and self.max_files_per_trigger < 1:
            raise ConfigError(f"max_files_per_trigger must be >= 1, got {self.max_files_per_trigger}")


def deduplicated_events(spark: SparkSession, cfg: PipelineConfig,
                        columns: tuple[str, ...] = ("event_id", "user", "event_time")) -> DataFrame:
    """The streaming DataFrame of on-time events, deduplicated by ``event_id``.

    Args:
        spark: The session.
        cfg: Pipeline configuration.
        columns: Columns to keep (with ``event_id`` and ``event_time``); the dedup state
            keeps whole rows, so keep them few.

    Returns:
        A streaming DataFrame of ``columns``.
    """
    reader = spark.readStream.schema(EVENT_DDL)
    if cfg.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", cfg.max_files_per_trigger)
    return (
        reader.parquet(str(cfg.log_dir))
        .select(*columns)
        .withWatermark("event_time", f"{int(cfg.allowed_lateness_s * 1000)} milliseconds")
        .dropDuplicatesWithinWatermark(["event_id"])
    )


def explain_failure(exc: BaseException, log: EventLog) -> BaseException:
    """Turn a Spark failure caused by a log file into a BadSegmentError naming it."""
    text = str(exc)
    for seg in log.segments():
        if seg.path.name in text:
            return BadSegmentError(str(seg.path), f"Spark could not read it: {text[:300]}")
    return exc


UserCountsConfig = PipelineConfig
"""The Example 5-1 name of :class:`PipelineConfig`."""


class BatchFunction(Protocol):
    """A ``foreachBatch`` function that remembers the error it raised."""

    error: BaseException | None

    def __call__(self, df: DataFrame, batch_id: int) -> None: ...  # noqa: D102


def run_foreach_batch(spark: SparkSession, cfg: PipelineConfig, frame: DataFrame,
                      fn: BatchFunction, once: bool) -> tuple[float, list[dict[str, Any]]]:
    """Run ``frame`` through ``fn`` until drained (``once``) or interrupted.

    Args:
        spark: The session.
        cfg: Pipeline configuration (checkpoint, trigger, log).
        frame: The streaming DataFrame.
        fn: The ``foreachBatch`` function.
        once: Process everything available now, then return.

    Returns:
        Wall seconds and Spark's recent progress reports.

    Raises:
        BadSegmentError: Spark failed on a log segment.
    """
    log = EventLog(cfg.log_dir)
    listener = None
    selected = armed()
    if selected is not None and selected[0] is CrashPoint.AFTER_COMMIT_LOG:
        listener = commit_log_listener()
        spark.streams.addListener(listener)
    stream = frame.writeStream.foreachBatch(fn).option("checkpointLocation", str(cfg.checkpoint))
    stream = stream.trigger(availableNow=True) if once else stream.trigger(
        processingTime=cfg.trigger_interval
    )
    started = time.perf_counter()
    query = stream.start()
    try:
        query.awaitTermination()
    except KeyboardInterrupt:
        print("onceflow: stopping after the current batch ...", file=sys.stderr)
        query.stop()
    except Exception as exc:
        if fn.error is not None:
            raise fn.error from None
        raise explain_failure(exc, log) from exc
    finally:
        seconds = time.perf_counter() - started
        progress = [dict(p) for p in query.recentProgress]
        if listener is not None:
            spark.streams.removeListener(listener)
    return seconds, progress

r"""Expected Example 5-1 counts recomputed from the raw log with a plain Spark batch job.

Independent of the streaming pipeline (it imports nothing of it): it reads the segment
files directly, removes duplicate ``event_id``\\ s with a batch ``dropDuplicates``, and counts
per user and minute with its own arithmetic (epoch milliseconds, integer division). Given
a checkpoint, it applies Spark's late rule per file: a row of a file read by batch N is
dropped if its event time is ``<=`` the late watermark of batch N (read from the offset
log), and only files of committed batches are counted.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pyspark.sql import functions as F

from onceflow.checkpoint import logs as ckpt
from onceflow.sources.events import EVENT_DDL
from onceflow.sources.log import EventLog

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MINUTE_MS = 60_000
"""Example 5-1's window: one minute, aligned to the epoch (the specification, restated here)."""

UserCounts = dict[tuple[str, int], int]
GlobalCounts = dict[int, int]


def expected_counts(
    spark: SparkSession, log_dir: str | Path, checkpoint: str | Path | None = None
) -> tuple[UserCounts, GlobalCounts]:
    """Recompute the counts a correct run must have produced.

    Args:
        spark: A session (batch jobs only).
        log_dir: The event log.
        checkpoint: The run's checkpoint; when given, only files of committed
            batches count and late rows are removed by Spark's rule. When
            omitted, every segment counts and nothing is late.

    Returns:
        ``({(user, window_start_ms): count}, {window_start_ms: count})``.
    """
    if checkpoint is None:
        files = [str(s.path) for s in EventLog(log_dir).segments()]
        watermarks = {Path(f).name: 0 for f in files}
    else:
        watermarks = {}
        for batch_id in ckpt.committed_batches(checkpoint):
            bi = ckpt.batch_input(checkpoint, batch_id)
            for f in bi.files:
                watermarks[f.name] = bi.late_watermark_ms
        files = [str(Path(log_dir) / name) for name in watermarks]
    if not files:
        return {}, {}
    wm = spark.createDataFrame(list(watermarks.items()), "file STRING, wm_ms LONG")
    events = (
        spark.read.schema(EVENT_DDL)
        .parquet(*files)
        .withColumn("file", F.element_at(F.split(F.input_file_name(), "/"), -1))
        .join(F.broadcast(wm), "file")
        .where((F.col("wm_ms") <= 0) | (F.unix_micros("event_time") > F.col("wm_ms") * 1000))
        .dropDuplicates(["event_id"])
    )
    minute = (F.expr("unix_millis(event_time) div 60000") * MINUTE_MS).alias("minute")
    users: UserCounts = {}
    glob: GlobalCounts = {}
    for user, start, n in events.groupBy("user", minute).count().collect():
        users[(user, int(start))] = int(n)
        glob[int(start)] = glob.get(int(start), 0) + int(n)
    return users, glob


@dataclass(frozen=True)
class CountDiff:
    """Differences between expected and actual counts of one table.

    Attributes:
        expected_rows: Rows expected.
        actual_rows: Rows found.
        missing_rows: Expected keys absent from the table (loss).
        too_low: Keys present with a smaller count (loss).
        too_high: Keys with a larger count (duplication).
        extra_rows: Keys that should not be there (duplication or invention).
        lost_events: Sum of missing counts.
        duplicated_events: Sum of surplus counts.
    """

    expected_rows: int
    actual_rows: int
    missing_rows: int
    too_low: int
    too_high: int
    extra_rows: int
    lost_events: int
    duplicated_events: int

    @property
    def exact(self) -> bool:
        """True when the table equals the expectation."""
        return self.lost_events == 0 and self.duplicated_events == 0 and self.extra_rows == 0


def diff_counts(expected: dict[object, int], actual: dict[object, int]) -> CountDiff:
    """Compare two count tables key by key.

    Args:
        expected: The recomputed counts.
        actual: The sink's counts.

    Returns:
        The differences.
    """
    missing = too_low = too_high = extra = lost = dup = 0
    for key, want in expected.items():
        got = actual.get(key)
        if got is None:
            missing += 1
            lost += want
        elif got < want:
            too_low += 1
            lost += want - got
        elif got > want:
            too_high += 1
            dup += got - want
    for key, got in actual.items():
        if key not in expected:
            extra += 1
            dup += got
    return CountDiff(len(expected), len(actual), missing, too_low, too_high, extra, lost, dup)

"""The oracle: exact expected sink contents from the raw log and Spark's checkpoint only.

It never reads the pipeline's memory or metrics, and never uses what the pipeline uses: Spark's
checkpoint is read by the auditor's own reader (:mod:`onceflow.verify.spark_log`, not
:mod:`onceflow.checkpoint.logs`) and the late rule below is its own. For every batch in Spark's commit log,
in batch order, it reads the batch's input files (``sources/0``; for Kafka, the records of the
offset ranges in ``offsets/N``, read by the auditor's own consumer) and the late watermark
(``offsets/N-1``), then applies the pipeline's rules:

1. a row with ``event_time <= late watermark`` is dropped as late (Spark's rule), and the
   oracle remembers *which* event ids were dropped in which batch;
2. an on-time row whose ``event_id`` was already counted is a duplicate. Spark keeps dedup
   state only until the watermark passes the event, but a copy arriving after that is late
   by (1), so a set of every counted id gives the same answer;
3. the remaining events are counted per ``(user, 1-minute window)`` and summed per window.

Batches planned but not in the commit log are reported separately: after a clean final run
there are none. The oracle needs the checkpoint's whole history; Spark purges all but the
last ``spark.sql.streaming.minBatchesToRetain`` batches, so audited runs raise that limit
(``onceflow run --retain-batches``) and the oracle refuses a purged checkpoint.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from onceflow.errors import CheckpointReadError
from onceflow.sources.events import WINDOW_MS
from onceflow.verify import spark_log


@dataclass
class BatchExpectation:
    """What one committed batch must have done.

    Attributes:
        batch_id: Spark's batch id.
        files: Its input files.
        late_watermark_ms: The watermark its late rows were behind.
        input_rows: Rows in its files.
        late_ids: Event ids it dropped as late (one entry per dropped row).
        duplicates: Rows it dropped as duplicates.
        counted: Events it added to the counts.
    """

    batch_id: int
    files: list[Path]
    late_watermark_ms: int
    input_rows: int = 0
    late_ids: list[str] = field(default_factory=list)
    duplicates: int = 0
    counted: int = 0

    @property
    def late_dropped(self) -> int:
        """Rows dropped as late."""
        return len(self.late_ids)


@dataclass
class Expectation:
    """The exact result a correct run over the checkpoint's committed batches has.

    Attributes:
        user_counts: ``{(user, window_start_ms): count}``.
        global_counts: ``{window_start_ms: count}``.
        batches: Per-batch expectations in batch order.
        uncommitted_batches: Batches in the offset log without a commit-log entry.
    """

    user_counts: dict[tuple[str, int], int]
    global_counts: dict[int, int]
    batches: list[BatchExpectation]
    uncommitted_batches: list[int]


def expect(checkpoint: str | Path, inputs: Callable[[int], pa.Table] | None = None) -> Expectation:
    """Compute the expectation for a checkpoint (see the module docstring).

    Args:
        checkpoint: Spark's checkpoint directory of the pipeline.
        inputs: A batch's input rows (``event_id, user, event_time``) for a source that is not
            the file log, e.g. Kafka (:func:`onceflow.verify.kafka_rig.batch_reader`); by default
            the batch's files from ``sources/0``.

    Returns:
        The expected counts and per-batch drops.
    """
    ck = Path(checkpoint)
    committed = spark_log.committed(ck)
    planned = spark_log.planned(ck)
    if planned and planned[0] != 0:
        raise CheckpointReadError(
            f"checkpoint {checkpoint} no longer holds batches 0..{planned[0] - 1}: Spark purged "
            "them (it keeps spark.sql.streaming.minBatchesToRetain batches, 100 by default), so "
            "the input of those batches cannot be replayed. Audit a run started with "
            "'onceflow run --retain-batches N' where N exceeds its number of batches (onceflow "
            "verify does this)."
        )
    seen: set[str] = set()
    users: Counter[tuple[str, int]] = Counter()
    batches: list[BatchExpectation] = []
    entries = spark_log.source_entries(ck) if inputs is None else {}
    for batch_id in committed:
        exp = BatchExpectation(batch_id, [], spark_log.late_watermark_ms(ck, batch_id))
        if inputs is None:
            exp.files = spark_log.batch_files(ck, batch_id, entries=entries)
            cols = ["event_id", "user", "event_time"]
            table = pq.read_table(exp.files, columns=cols) if exp.files else None
        else:
            table = inputs(batch_id)
        batches.append(exp)
        if table is None or not table.num_rows:
            continue
        exp.input_rows = table.num_rows
        ids = table.column("event_id").to_pylist()
        names = table.column("user").to_pylist()
        micros = table.column("event_time").cast("int64").to_pylist()
        watermark_us = exp.late_watermark_ms * 1000
        for eid, user, ts in zip(ids, names, micros, strict=True):
            if exp.late_watermark_ms > 0 and ts <= watermark_us:  # Spark's rule: at or before it is late
                exp.late_ids.append(eid)
            elif eid in seen:
                exp.duplicates += 1
            else:
                seen.add(eid)
                exp.counted += 1
                users[(user, (ts // (WINDOW_MS * 1000)) * WINDOW_MS)] += 1
    glob: Counter[int] = Counter()
    for (_, window), count in users.items():
        glob[window] += count
    done = set(committed)
    return Expectation(dict(users), dict(glob), batches, [b for b in planned if b not in done])

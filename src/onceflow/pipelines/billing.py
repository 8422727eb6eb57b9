"""Billing: bytes per account and hour into PostgreSQL exactly once; late data kept, not lost.

Data path::

    event log -> withWatermark(event_time) -> dropDuplicatesWithinWatermark(event_id)
      -> foreachBatch(batch N), both writes by Spark's executors (onceflow_postgres):
         1. billing: per (account, 1-hour window) bytes and events of N, added by key
            ``insert_id = "<account>@<window_start_ms>"`` (sink ``billing``);
         2. late_events: the records of N's input files that Spark's late rule dropped
            (``event_time <= `` the watermark N was run with), each ``event_id`` once,
            with the watermark they missed (sink ``billing.late``).

Each write is exactly once by its own batch marker (staged or two-phase protocol,
:mod:`onceflow.sinks.pg_writer`). A crash between the two leaves ``late_events`` one
batch behind until Spark re-runs N, whose billing write is then a no-op.

``late_events`` holds every record the watermark rejected. An at-least-once producer
may have delivered an earlier, on-time copy of one of them, which was billed: such a
row has the ``event_id`` of a billed event. Whoever re-bills late events must skip
those (onceflow does not keep billed ids beyond the dedup state).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql import functions as F

from onceflow import checkpoint as ckpt
from onceflow.api import BatchWriter
from onceflow.errors import OnceflowError
from onceflow.pipelines.common import PipelineConfig, deduplicated_events, run_foreach_batch
from onceflow.records import EVENT_DDL
from onceflow.sinks import pg
from onceflow.sinks.pg_datasource import NAME, register
from onceflow.sources.log import EventLog

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

HOUR_MS = 3_600_000
SINK_ID = "billing"
LATE_SINK_ID = "billing.late"


@dataclass
class BillingResult:
    """Totals of one billing run (this process only).

    Attributes:
        batches: Micro-batches handled (committed or replayed).
        seconds: Wall time.
        progress: Spark's recent progress reports.
    """

    batches: int = 0
    seconds: float = 0.0
    progress: list[dict[str, Any]] = field(default_factory=list)


def billing_rows(events: DataFrame) -> DataFrame:
    """Per-(account, hour) bytes and event counts of a batch of events.

    Args:
        events: Deduplicated, on-time events (``event_id, user, event_time, bytes``).

    Returns:
        Columns ``insert_id, account, window_start, window_end, bytes, events``.
    """
    start_ms = (F.floor(F.unix_millis("event_time") / HOUR_MS) * HOUR_MS).cast("long")
    return (
        events.groupBy(F.col("user").alias("account"), start_ms.alias("start_ms"))
        .agg(F.sum("bytes").alias("bytes"), F.count(F.lit(1)).alias("events"))
        .select(
            F.concat_ws("@", "account", F.col("start_ms").cast("string")).alias("insert_id"),
            "account",
            F.timestamp_millis("start_ms").alias("window_start"),
            F.timestamp_millis(F.col("start_ms") + HOUR_MS).alias("window_end"),
            "bytes",
            "events",
        )
    )


def late_rows(spark: SparkSession, batch: ckpt.BatchInput, batch_id: int) -> DataFrame:
    """The records of a batch that Spark's late rule drops, read from the batch's files.

    Args:
        spark: The session.
        batch: The batch's files and late watermark (from the checkpoint).
        batch_id: The micro-batch.

    Returns:
        Columns ``event_id, account, event_time, bytes, missed_watermark, batch_id``.
    """
    if not batch.files:
        return spark.createDataFrame(
            [], "event_id string, account string, event_time timestamp, bytes long, "
                "missed_watermark timestamp, batch_id long")
    wm = batch.late_watermark_ms
    return (
        spark.read.schema(EVENT_DDL).parquet(*[str(f) for f in batch.files])
        .where(F.unix_micros("event_time") <= F.lit(wm * 1000))
        .select(
            "event_id",
            F.col("user").alias("account"),
            "event_time",
            "bytes",
            F.timestamp_millis(F.lit(wm)).alias("missed_watermark"),
            F.lit(batch_id).cast("long").alias("batch_id"),
        )
    )


class _BillingBatch(BatchWriter):
    """The foreachBatch function: both writes, each exactly once."""

    def __init__(self, cfg: PipelineConfig, dsn: str, protocol: str, log: EventLog,
                 result: BillingResult) -> None:
        self.cfg, self.dsn, self.protocol, self.log, self.result = cfg, dsn, protocol, log, result

    def _write(self, df: DataFrame, batch_id: int) -> None:
        qid = ckpt.query_id(self.cfg.checkpoint)
        if qid is None:
            raise OnceflowError(f"checkpoint {self.cfg.checkpoint} has no metadata file")
        batch = ckpt.batch_input(self.cfg.checkpoint, batch_id)
        self.log.validate(batch.files)
        spark = df.sparkSession
        metrics = json.dumps({"late_watermark_ms": batch.late_watermark_ms})
        for frame, table, sink_id, opts in (
            (billing_rows(df), "billing", SINK_ID,
             {"mode": "upsert", "key": "insert_id", "add": "bytes,events"}),
            (late_rows(spark, batch, batch_id), "late_events", LATE_SINK_ID,
             {"mode": "append", "key": "event_id"}),
        ):
            writer = (frame.write.format(NAME).mode("append").option("dsn", self.dsn)
                      .option("table", table).option("sink_id", sink_id)
                      .option("protocol", self.protocol).option("batch_id", batch_id)
                      .option("query_id", qid).option("metrics", metrics))
            for key, value in opts.items():
                writer = writer.option(key, value)
            writer.save()
        self.result.batches += 1


def run(spark: SparkSession, cfg: PipelineConfig, dsn: str | None = None,
        protocol: str = "staged", once: bool = True) -> BillingResult:
    """Run the billing pipeline until the log is drained (``once``) or interrupted.

    Args:
        spark: The session.
        cfg: Pipeline configuration.
        dsn: PostgreSQL connection string (else ``$ONCEFLOW_PG_DSN``).
        protocol: ``staged`` or ``2pc``.
        once: Process everything available now, then return.

    Returns:
        The run's totals.
    """
    dsn = pg.resolve_dsn(dsn)
    log = EventLog(cfg.log_dir)
    log.directory.mkdir(parents=True, exist_ok=True)
    log.validate()
    register(spark)
    result = BillingResult()
    frame = deduplicated_events(spark, cfg, ("event_id", "user", "event_time", "bytes"))
    fn = _BillingBatch(cfg, dsn, protocol, log, result)
    result.seconds, result.progress = run_foreach_batch(spark, cfg, frame, fn, once)
    return result

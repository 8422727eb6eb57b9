"""Billing on onceflow's public API: bytes per account and hour, exactly once; late data kept.

Events of the onceflow event log (``event_id, user, event_time, system_time, bytes``) are
billed per (account, 1-hour event-time window): each micro-batch adds its bytes and event
counts to ``billing``, keyed by ``insert_id = "<account>@<window_start_ms>"``. Records the
watermark drops are not lost: ``late=`` sends them to ``late_events`` (as they are in the
input, with the watermark they missed), exactly once, in the same commit::

    onceflow.write_stream(events, sink=onceflow.postgres(protocol="staged", sink_id="billing"),
                          checkpoint="ck/", tables=TABLES, per_batch=per_batch, late="late_events")

``onceflow run --pipeline billing`` runs this module (any ``--sink``; the default is
``postgres-staged``, written by Spark's executors).

``late_events`` holds every record the watermark rejected. An at-least-once producer may have
delivered an earlier, on-time copy of one of them, which was billed: such a row has the
``event_id`` of a billed event. Whoever re-bills late events must skip those (onceflow does
not keep billed ids beyond the dedup state).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import onceflow
from onceflow import Table
from onceflow.sources.events import EVENT_DDL
from onceflow.sources.log import EventLog

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

HOUR_MS = 3_600_000
TABLES = {
    "billing": Table(key="insert_id", add=["bytes", "events"]),
    "late_events": Table(key="event_id"),  # a record late in two batches is one late record
}


def billing_rows(events: DataFrame) -> DataFrame:
    """Per-(account, hour) bytes and event counts of a batch of events.

    Args:
        events: Deduplicated, on-time events (``user, event_time, bytes``).

    Returns:
        Columns ``insert_id, account, window_start, window_end, bytes, events``.
    """
    from pyspark.sql import functions as F

    start_ms = (F.floor(F.unix_millis("event_time") / HOUR_MS) * HOUR_MS).cast("long")
    return (events.groupBy(F.col("user").alias("account"), start_ms.alias("start_ms"))
            .agg(F.sum("bytes").alias("bytes"), F.count(F.lit(1)).alias("events"))
            .select(F.concat_ws("@", "account", F.col("start_ms").cast("string")).alias("insert_id"),
                    "account", F.timestamp_millis("start_ms").alias("window_start"),
                    F.timestamp_millis(F.col("start_ms") + HOUR_MS).alias("window_end"), "bytes", "events"))


def per_batch(batch: DataFrame) -> dict[str, DataFrame]:
    """What one micro-batch bills (its late records are added by ``late=``)."""
    return {"billing": billing_rows(batch)}


def start(spark: SparkSession, log_dir: str | Path, sink: Any, checkpoint: str | Path, *,
          within: str | float = "1 minute", max_files_per_trigger: int | None = None, once: bool = False,
          trigger: str = "1 second", on_batch: Callable[[dict[str, Any]], None] | None = None,
          ) -> onceflow.OnceQuery:
    """Start the billing pipeline (arguments as :func:`onceflow.examples.user_counts.start`)."""
    reader = spark.readStream.schema(EVENT_DDL)
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    log = reader.parquet(str(log_dir)).select("event_id", "user", "event_time", "bytes")
    events = onceflow.deduplicate(log, id="event_id", event_time="event_time", within=within)
    return onceflow.write_stream(events, sink=sink, checkpoint=checkpoint, tables=TABLES, per_batch=per_batch,
                                 late="late_events", once=once, trigger=trigger, on_batch=on_batch,
                                 check_files=EventLog(log_dir).validate)

"""Streaming Systems Example 5-1 on onceflow's public API: per-user and global counts per minute.

Events (``event_id, user, event_time``, as the onceflow event log stores them) arrive as
Parquet segments; a sender that retries sends some twice. Each micro-batch adds its counts
per (user, 1-minute window) to ``user_counts`` and per window to ``global_counts``, both
exactly once, in one commit with the batch's marker::

    events = onceflow.deduplicate(spark.readStream.schema(EVENT_DDL).parquet("log/"),
                                  id="event_id", event_time="event_time", within="1 minute")
    onceflow.write_stream(events, sink=onceflow.sqlite("counts.db"), checkpoint="ck/",
                          tables=TABLES, per_batch=per_batch)

``onceflow run`` and ``onceflow demo`` run this module (:func:`start`). Why the dedup is
bounded by the event-time watermark: a retried event has its original's event time, so its
id can be forgotten once the watermark passed it — any later copy is late and dropped by
Spark's late rule anyway (and counted in the batch's marker). Why per-batch deltas added by
the sink rather than a second stateful aggregation: Spark 4.3 allows one watermark per query
with several stateful operators, and the sink's batch marker makes the addition exactly once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

import onceflow
from onceflow import Table
from onceflow.sources.events import EVENT_DDL, WINDOW_MS
from onceflow.sources.log import EventLog

if TYPE_CHECKING:
    from collections.abc import Callable

    from pyspark.sql import DataFrame, SparkSession

TABLES = {
    "user_counts": Table(key=["user", "window_start_ms"], add=["count"]),
    "global_counts": Table(key=["window_start_ms"], add=["count"]),
}
"""Example 5-1's tables: counts added per key, batch by batch."""


def window_deltas(events: DataFrame) -> DataFrame:
    """Per-(user, 1-minute window) counts of a batch of events.

    One DataFrame operation (each one analyses the batch's whole plan again: a second one, the
    window's end, costs time in every batch); :func:`with_window_end` adds the end on the driver.

    Args:
        events: Events with ``user`` and ``event_time``.

    Returns:
        Columns ``user, window_start_ms, count`` (epoch-aligned windows).
    """
    from pyspark.sql import functions as F

    start = (F.floor(F.unix_micros("event_time") / (WINDOW_MS * 1000)) * WINDOW_MS).cast("long")
    return events.groupBy("user", start.alias("window_start_ms")).agg(F.count(F.lit(1)).alias("count"))


def with_window_end(counts: pa.Table) -> pa.Table:
    """:func:`window_deltas`'s rows with ``window_end_ms`` (start + one minute) after the start."""
    end = pc.add(counts.column("window_start_ms"), pa.scalar(WINDOW_MS, pa.int64()))
    return counts.add_column(counts.schema.get_field_index("window_start_ms") + 1, "window_end_ms", end)


def window_totals(users: pa.Table) -> pa.Table:
    """Per-window sums of per-user window counts (on the driver: no second Spark job)."""
    sums = users.group_by("window_start_ms").aggregate([("window_end_ms", "min"), ("count", "sum")])
    return pa.table({"window_start_ms": sums["window_start_ms"], "window_end_ms": sums["window_end_ms_min"],
                     "count": sums["count_sum"]})


def per_batch(batch: DataFrame) -> dict[str, pa.Table]:
    """What one micro-batch adds: its per-user window counts and their per-window sums."""
    users = with_window_end(window_deltas(batch).toArrow())
    return {"user_counts": users, "global_counts": window_totals(users)}


def events_counted(outputs: dict[str, pa.Table]) -> int:
    """The batch's events after deduplication: each is counted once in ``user_counts``.

    Passed as ``count_rows=``: the batch needs no row count of its own (no observation).
    """
    return int(pc.sum(outputs["user_counts"].column("count")).as_py() or 0)


def events(spark: SparkSession, log_dir: str | Path, within: str | float = "1 minute",
           max_files_per_trigger: int | None = None) -> DataFrame:
    """The log's events as a stream, deduplicated by ``event_id`` within ``within``.

    Args:
        spark: The session.
        log_dir: The event log directory (Parquet segments).
        within: Allowed lateness: how long ids are remembered, and how far behind the
            latest event time an event may be before it is dropped as late (and counted).
        max_files_per_trigger: Segments per micro-batch (all available when None).
    """
    reader = spark.readStream.schema(EVENT_DDL)
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    log = reader.parquet(str(log_dir)).select("event_id", "user", "event_time")
    return onceflow.deduplicate(log, id="event_id", event_time="event_time", within=within)


@dataclass(frozen=True)
class KafkaTopic:
    """Example 5-1's events from a Kafka topic instead of the event log.

    Each record's value is JSON ``{"user": ..., "event_time_us": ...}`` (event time in epoch
    microseconds) and header ``event_id`` carries the producer's id, so a producer's retries
    (new offsets, same id) are removed by the dedup step (:func:`encode_event` writes one).

    Attributes:
        bootstrap: ``host:port`` of the brokers.
        topic: The topic.
        max_offsets_per_trigger: Offsets per micro-batch (all available when None).
        connector: :func:`onceflow.read_kafka`'s ``connector`` (``auto``: Spark's when the
            session has it).
    """

    bootstrap: str
    topic: str
    max_offsets_per_trigger: int | None = None
    connector: str = "auto"


EVENT_JSON_DDL = "user STRING, event_time_us LONG"
"""Schema of a Kafka record's value (see :class:`KafkaTopic`)."""


def encode_event(user: str, event_time_us: int) -> bytes:
    """A Kafka record value of :class:`KafkaTopic`."""
    return json.dumps({"user": user, "event_time_us": event_time_us}).encode()


def kafka_events(spark: SparkSession, source: KafkaTopic, within: str | float = "1 minute") -> DataFrame:
    """The topic's events as a stream, deduplicated by the producer's ``event_id``."""
    from pyspark.sql import functions as F

    raw = onceflow.read_kafka(spark, source.bootstrap, subscribe=source.topic, id_header="event_id",
                              max_offsets_per_trigger=source.max_offsets_per_trigger,
                              connector=source.connector)
    # json_tuple: the two fields as text in one pass, faster than from_json (BENCHMARKS.md)
    fields = raw.select("record_id", F.json_tuple(F.col("value").cast("string"), "user", "event_time_us"))
    events = fields.select(F.col("record_id").alias("event_id"), F.col("c0").alias("user"),
                           F.timestamp_micros(F.col("c1").cast("long")).alias("event_time"))
    return onceflow.deduplicate(events, id="event_id", event_time="event_time", within=within)


def start(spark: SparkSession, log_dir: str | Path | KafkaTopic, sink: Any, checkpoint: str | Path, *,
          within: str | float = "1 minute", max_files_per_trigger: int | None = None, once: bool = False,
          trigger: str = "1 second", on_batch: Callable[[dict[str, Any]], None] | None = None,
          ) -> onceflow.OnceQuery:
    """Start Example 5-1 (see the module docstring).

    Args:
        spark: The session.
        log_dir: The event log directory, or a :class:`KafkaTopic`.
        sink: Where the tables live (``onceflow.sqlite(...)``, ``onceflow.postgres(...)``, ...).
        checkpoint: Spark checkpoint directory; reuse it to resume exactly.
        within: Allowed lateness (see :func:`events`).
        max_files_per_trigger: Segments per micro-batch.
        once: Process everything available now, then stop.
        trigger: Processing-time trigger of a continuous run.
        on_batch: Called after every batch with its numbers.

    Returns:
        The running query.
    """
    if isinstance(log_dir, KafkaTopic):
        stream, check = kafka_events(spark, log_dir, within), None
    else:
        stream = events(spark, log_dir, within, max_files_per_trigger)
        check = EventLog(log_dir).validate  # a bad segment: an error naming it
    return onceflow.write_stream(stream, sink=sink, checkpoint=checkpoint, tables=TABLES, per_batch=per_batch,
                                 once=once, trigger=trigger, on_batch=on_batch, count_rows=events_counted,
                                 check_files=check)

"""The orders pipeline of ``orders.py`` reading Kafka (``verify --pipeline ... --source kafka``).

``input`` is ``<bootstrap>/<topic>``; each record's value is an order as JSON, its ``order_id``
the producer's id (``id_field``), so a resent order counts once. ``build_late`` keeps late orders
in a table: onceflow refuses it (without ``onceflow.expect`` it could not read them back; an
earlier onceflow lost them unseen, which this pipeline's verify showed).
"""

from __future__ import annotations

from typing import Any

from orders import TABLES, per_batch  # the sibling module: the same tables and transform
from pyspark.sql import functions as F
from sensors import json_values  # a sibling too: format("kafka"), JSON values as columns

import onceflow
from onceflow import Table, deduplicate, write_stream

SCHEMA = "order_id STRING, customer STRING, cents LONG, ts TIMESTAMP"


def build(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    return write_stream(_orders(spark, input), sink, checkpoint, tables=TABLES, per_batch=per_batch,
                        once=once, trigger="300 milliseconds")


def _orders(spark: Any, input: str) -> Any:
    bootstrap, topic = input.rsplit("/", 1)
    raw = onceflow.read_kafka(spark, bootstrap, subscribe=topic, id_field="order_id",
                              max_offsets_per_trigger=500)
    orders = raw.select("record_id", F.from_json(F.col("value").cast("string"), SCHEMA).alias("o")).select(
        F.col("record_id").alias("order_id"), "o.customer", "o.cents", "o.ts")
    return deduplicate(orders, id="order_id", event_time="ts", within="20 minutes")


def build_late(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    return write_stream(_orders(spark, input), sink, checkpoint, tables=TABLES, per_batch=per_batch,
                        once=once, late="late_orders")


def build_spark_reader(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    """The pipeline as Spark users write it: ``format("kafka")`` (Spark's connector), the id in the value."""
    clean = deduplicate(json_values(spark, input, SCHEMA, 500), id="order_id", event_time="ts",
                        within="20 minutes")
    return write_stream(clean, sink, checkpoint, tables=TABLES, per_batch=per_batch, once=once,
                        trigger="300 milliseconds")


def build_rejects(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    """The Kafka guide's shape: an input contract on the records' JSON, bad records to ``rejected_orders``."""
    bootstrap, topic = input.rsplit("/", 1)
    raw = onceflow.read_kafka(spark, bootstrap, subscribe=topic, id_field="order_id",
                              max_offsets_per_trigger=500)
    parsed = onceflow.expect(raw, json="value", schema=SCHEMA, keep=["record_id"], required=["customer"],
                             checks={"cents_not_negative": "cents >= 0"})
    clean = deduplicate(parsed, id="record_id", event_time="ts", within="20 minutes")
    return write_stream(clean, sink, checkpoint, tables=TABLES, per_batch=per_batch, once=once,
                        trigger="300 milliseconds", rejects="rejected_orders")


def build_append_aggregate(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    """A streaming aggregation in append mode: what the oracle cannot judge (its dry run says so)."""
    hourly = _orders(spark, input).groupBy(F.window("ts", "1 hour")).agg(F.count(F.lit(1)).alias("orders"))
    return write_stream(hourly, sink, checkpoint, tables={"hourly": TABLES["hourly"]}, once=once,
                        per_batch=lambda df: df.select(F.col("window.start").alias("hour"), "orders"))


def build_channels(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    """Orders counted per sales channel, a header of each record (``include_headers=True``)."""
    bootstrap, topic = input.rsplit("/", 1)
    raw = onceflow.read_kafka(spark, bootstrap, subscribe=topic, id_field="order_id", include_headers=True,
                              max_offsets_per_trigger=500)
    channel = F.try_element_at(F.filter("headers", lambda h: h["key"] == "channel"), F.lit(1))["value"]
    channel = channel.cast("string")
    orders = raw.select("record_id", F.coalesce(channel, F.lit("none")).alias("channel"),
                        F.from_json(F.col("value").cast("string"), SCHEMA).alias("o")).select(
        F.col("record_id").alias("order_id"), "channel", "o.cents", "o.ts")
    clean = deduplicate(orders, id="order_id", event_time="ts", within="20 minutes")

    def per_channel(df: Any) -> dict[str, Any]:
        return {"channels": df.groupBy("channel").agg(F.count(F.lit(1)).alias("orders"),
                                                      F.sum("cents").alias("cents"))}

    tables = {"channels": Table(key="channel", add=["orders", "cents"])}
    return write_stream(clean, sink, checkpoint, tables=tables, per_batch=per_channel, once=once,
                        trigger="300 milliseconds")

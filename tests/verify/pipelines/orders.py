"""A user-style pipeline written for verify's tests only: orders -> two tables, stateful by merge.

``build`` follows the contract of ``onceflow verify --pipeline PATH.py:FUNCTION``. Orders arrive
as JSON lines (resent orders carry the same ``order_id``); each batch's orders are summed per
customer (count and cents added, the largest order kept with ``max``) and counted per hour (the
smallest order kept with ``min``); orders behind the watermark go to ``late_orders``.

``build_uuid`` is the same pipeline with a deliberate bug: ``per_batch`` mints the upsert key of
a third table with ``uuid4()``, so a batch that runs twice writes its rows twice.
"""

from __future__ import annotations

import uuid
from typing import Any

from pyspark.sql import functions as F
from pyspark.sql.types import StringType

import onceflow
from onceflow import Table, deduplicate, write_stream

SCHEMA = "order_id STRING, customer STRING, cents LONG, ts TIMESTAMP"


def _orders(spark: Any, input: str) -> Any:
    raw = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 2).json(input)
    return deduplicate(raw, id="order_id", event_time="ts", within="20 minutes")


def per_batch(df: Any) -> dict[str, Any]:
    customers = df.groupBy("customer").agg(F.count(F.lit(1)).alias("orders"), F.sum("cents").alias("cents"),
                                           F.max("cents").alias("largest"))
    hourly = df.groupBy(F.date_trunc("hour", "ts").alias("hour")).agg(
        F.count(F.lit(1)).alias("orders"), F.min("cents").alias("smallest"))
    return {"customers": customers, "hourly": hourly}


TABLES = {"customers": Table(key="customer", add=["orders", "cents"], max="largest"),
          "hourly": Table(key="hour", add="orders", min="smallest")}


def build(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    return write_stream(_orders(spark, input), sink, checkpoint, tables=TABLES, per_batch=per_batch,
                        once=once, trigger="300 milliseconds", late="late_orders")


def build_uuid(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    mint = F.udf(lambda: str(uuid.uuid4()), StringType()).asNondeterministic()

    def with_receipts(df: Any) -> dict[str, Any]:
        out = per_batch(df)
        out["receipts"] = df.select(mint().alias("receipt_id"), "order_id", "cents")
        return out

    return onceflow.write_stream(_orders(spark, input), sink, checkpoint,
                                 tables={**TABLES, "receipts": Table(key="receipt_id")},
                                 per_batch=with_receipts, once=once, trigger="300 milliseconds")


def build_append_aggregate(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    """A streaming aggregation in append mode: what the oracle cannot judge (windows close later)."""
    hourly = _orders(spark, input).groupBy(F.window("ts", "1 hour")).agg(F.count(F.lit(1)).alias("orders"))
    return write_stream(hourly, sink, checkpoint, tables={"hourly": Table(key="hour")}, once=once,
                        per_batch=lambda df: df.select(F.col("window.start").alias("hour"), "orders"))


def build_rejects(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    """The same orders read as text and parsed by an input contract; bad lines to ``rejected_orders``."""
    raw = spark.readStream.option("maxFilesPerTrigger", 2).text(input)
    orders = onceflow.expect(raw, json="value", schema=SCHEMA, required=["customer"],
                             checks={"cents_not_negative": "cents >= 0"})
    clean = deduplicate(orders, id="order_id", event_time="ts", within="20 minutes")
    return write_stream(clean, sink, checkpoint, tables=TABLES, per_batch=per_batch, once=once,
                        trigger="300 milliseconds", rejects="rejected_orders")

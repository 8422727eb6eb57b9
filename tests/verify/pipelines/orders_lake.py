"""A user-style pipeline written for verify's Iceberg tests only: orders kept raw, and per batch.

``build`` follows the contract of ``onceflow verify --pipeline PATH.py:FUNCTION``: orders arrive as
JSON lines (a resent order carries the same ``order_id``), are deduplicated, and are appended as
they are to ``orders``, with each batch's count and cents per customer appended to
``customer_batches`` (the batch id a column: a lake's table without a key); orders behind the
watermark go to ``late_orders``, declared an append table too (``late=``'s default is keyed by the
ids). All append tables: what the Iceberg sink writes.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from onceflow import Table, deduplicate, write_stream

SCHEMA = "order_id STRING, customer STRING, cents LONG, ts TIMESTAMP"


def per_batch(df: Any, batch_id: int) -> dict[str, Any]:
    per_customer = df.groupBy("customer").agg(F.count(F.lit(1)).alias("orders"),
                                              F.sum("cents").alias("cents"))
    return {"orders": df, "customer_batches": per_customer.withColumn("batch", F.lit(batch_id))}


def build(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    raw = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 2).json(input)
    orders = deduplicate(raw, id="order_id", event_time="ts", within="20 minutes")
    tables = {"orders": Table(), "customer_batches": Table(), "late_orders": Table()}
    return write_stream(orders, sink, checkpoint, tables=tables, per_batch=per_batch, once=once,
                        trigger="300 milliseconds", late="late_orders")

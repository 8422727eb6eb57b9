"""A user-style pipeline written for verify's several-sinks tests only: sums in a database, orders in a lake.

``build`` follows the contract of ``onceflow verify --pipeline PATH.py:FUNCTION`` run with several
sinks (``--sink sqlite+iceberg``, ``postgres+delta``...): its ``sink`` argument is ``{family: sink}``.
Orders arrive as JSON lines (a resent order carries the same ``order_id``) and are deduplicated;
each batch's count and cents per customer are added into ``customer_totals`` in the database
sink (a keyed ``add`` table: a batch written twice shows as doubled sums), each order is appended
to ``orders`` in the lake sink, and orders behind the watermark go to ``late_orders`` in the lake
too (or to topics of a Kafka sink in its place). One source read, one checkpoint, two sinks.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import functions as F

from onceflow import Table, deduplicate, write_stream

SCHEMA = "order_id STRING, customer STRING, cents LONG, ts TIMESTAMP"
TABLES = {"customer_totals": Table(key="customer", add=["orders", "cents"]), "orders": Table(),
          "late_orders": Table()}


def per_batch(df: Any) -> dict[str, Any]:
    totals = df.groupBy("customer").agg(F.count(F.lit(1)).alias("orders"), F.sum("cents").alias("cents"))
    return {"customer_totals": totals, "orders": df}


def build(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    database = sink["postgres"] if "postgres" in sink else sink["sqlite"]
    lake = next(sink[family] for family in ("iceberg", "delta", "kafka") if family in sink)
    raw = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 2).json(input)
    orders = deduplicate(raw, id="order_id", event_time="ts", within="20 minutes")
    routes = {"customer_totals": database, "orders": lake, "late_orders": lake}
    return write_stream(orders, routes, checkpoint, tables=TABLES, per_batch=per_batch, once=once,
                        trigger="300 milliseconds", late="late_orders")

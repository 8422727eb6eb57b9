"""A shipments pipeline into the Kafka sink, for the Kafka sink's crash tests.

``python -m tests.sinks.kafka_driver SOURCE CHECKPOINT BOOTSTRAP [--once] [--naive] [--tasks] [--master M]``:
SOURCE is a
directory of Parquet files (``id, warehouse, qty, ts``; one file per batch) or ``kafka:TOPIC``
(JSON values, read with Spark's Kafka connector). Deduplicated by ``id``; each batch writes the
new shipments to topic ``shipments`` (keyed by id) and per-warehouse partial sums to ``stock``
(a ``merge`` table: a reader adds them up). ``--naive``: the negative control, records produced
without a transaction or marker (:class:`onceflow.verify.sinks.NaiveKafkaSink`). ``--tasks``: every
batch produced by Spark's tasks (``collect_below=0``); ``--master``: Spark's master (e.g.
``local[2,2]``: a failed task is tried again).
"""

from __future__ import annotations

import sys
from typing import Any

from pyspark.sql import functions as F

import onceflow
from onceflow import Table
from onceflow.runtime.session import session
from onceflow.verify.sinks import NaiveKafkaSink

SCHEMA = "id STRING, warehouse STRING, qty LONG, ts TIMESTAMP"
TABLES = {"shipments": Table(key="id"), "stock": Table(key="warehouse", add=["qty", "n"])}


def per_batch(batch: Any) -> dict[str, Any]:
    return {"shipments": batch.select("id", "warehouse", "qty"),
            "stock": batch.groupBy("warehouse").agg(F.sum("qty").alias("qty"), F.count("*").alias("n"))}


if __name__ == "__main__":
    source, ck, bootstrap = sys.argv[1:4]
    once = "--once" in sys.argv
    master = sys.argv[sys.argv.index("--master") + 1] if "--master" in sys.argv else None
    spark = session(master, app_name="kafka-sink-test", shuffle_partitions=2, kafka=True)
    if source.startswith("kafka:"):
        raw = onceflow.read_kafka(spark, bootstrap, subscribe=source.removeprefix("kafka:"),
                                  max_offsets_per_trigger=300, connector="spark")
        rows = raw.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("s")).select("s.*")
    else:
        rows = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    clean = onceflow.deduplicate(rows, id="id", event_time="ts", within="7 days")
    naive = "--naive" in sys.argv
    below = 0 if "--tasks" in sys.argv else 100_000
    sink: Any = NaiveKafkaSink(bootstrap, "ship") if naive else onceflow.kafka(bootstrap, sink_id="ship",
                                                                               collect_below=below)
    onceflow.write_stream(clean, sink, ck, TABLES, per_batch=per_batch, once=once,
                          trigger="300 milliseconds").awaitTermination()
    print("drained", flush=True)

"""A shipments pipeline into the Kafka sink, for the Kafka sink's crash tests.

``python -m tests.sinks.kafka_driver SOURCE CHECKPOINT BOOTSTRAP [--once] [--naive]``: SOURCE is a
directory of Parquet files (``id, warehouse, qty, ts``; one file per batch) or ``kafka:TOPIC``
(JSON values, read with Spark's Kafka connector). Deduplicated by ``id``; each batch writes the
new shipments to topic ``shipments`` (keyed by id) and per-warehouse partial sums to ``stock``
(a ``merge`` table: a reader adds them up). ``--naive``: the negative control, records produced
without a transaction or marker (:class:`tests.sinks.kafka_driver.NaiveKafkaSink`).
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import pyarrow as pa
from pyspark.sql import functions as F

import onceflow
from onceflow import Table
from onceflow.sinks.kafka import encode
from onceflow.spark import session

SCHEMA = "id STRING, warehouse STRING, qty LONG, ts TIMESTAMP"
TABLES = {"shipments": Table(key="id"), "stock": Table(key="warehouse", add=["qty", "n"])}


def per_batch(batch: Any) -> dict[str, Any]:
    return {"shipments": batch.select("id", "warehouse", "qty"),
            "stock": batch.groupBy("warehouse").agg(F.sum("qty").alias("qty"), F.count("*").alias("n"))}


class NaiveKafkaSink:
    """Negative control: every attempt of a batch produces its records, no transaction, no marker."""

    keeps_markers = False  # nothing to check the checkpoint against

    def __init__(self, bootstrap: str) -> None:
        from confluent_kafka import Producer

        self.sink_id = "naive"
        self.p = Producer({"bootstrap.servers": bootstrap})

    def bind(self, query_id: str) -> None:  # noqa: D102
        pass

    def check(self, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:  # noqa: D102
        pass

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: Any, rows_out: int) -> bool:  # noqa: D102
        from onceflow.faults import CrashPoint, maybe_crash

        for name, rows in outputs.items():
            for key, value in encode(rows, specs[name]):
                self.p.produce(name, value=value, key=key)
        self.p.flush(30)
        maybe_crash(CrashPoint.AFTER_SINK_COMMIT, batch_id)
        return True

    def batches(self) -> list[dict[str, Any]]:  # noqa: D102
        return []

    def flush(self) -> None:  # noqa: D102
        pass

    def close(self) -> None:  # noqa: D102
        self.p.flush(30)


if __name__ == "__main__":
    source, ck, bootstrap = sys.argv[1:4]
    once = "--once" in sys.argv
    spark = session(app_name="kafka-sink-test", shuffle_partitions=2, kafka=True)
    if source.startswith("kafka:"):
        raw = onceflow.read_kafka(spark, bootstrap, subscribe=source.removeprefix("kafka:"),
                                  max_offsets_per_trigger=300, connector="spark")
        rows = raw.select(F.from_json(F.col("value").cast("string"), SCHEMA).alias("s")).select("s.*")
    else:
        rows = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(source)
    clean = onceflow.deduplicate(rows, id="id", event_time="ts", within="7 days")
    naive = "--naive" in sys.argv
    sink: Any = NaiveKafkaSink(bootstrap) if naive else onceflow.kafka(bootstrap, sink_id="ship")
    onceflow.write_stream(clean, sink, ck, TABLES, per_batch=per_batch, once=once,
                          trigger="300 milliseconds").awaitTermination()
    print("drained", flush=True)

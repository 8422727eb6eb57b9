"""A parcel-scan pipeline in Spark's Real-Time Mode into PostgreSQL, for the real-time writer's tests.

``python -m tests.sinks.realtime_driver BOOTSTRAP TOPIC DSN CHECKPOINT [REJECTS]``: reads the topic with
Spark's Kafka connector (JSON values ``{"scan": ..., "parcel": ..., "depot": ..., "grams": ...,
"at": ...}``), turns each record into one row of ``scans`` (:func:`scans`: the weight in
kilograms, the depot upper-cased, the scan time as a timestamp, the record's partition) and
upserts it keyed by the scan id with :func:`onceflow.write_realtime` (real-time batches of
5 seconds, the shortest Spark allows), rows PostgreSQL refuses to the table ``REJECTS`` when
given. Prints ``started`` once the query runs; runs until killed. ``$REALTIME_DRIVER_CORES``: the
session's task slots (``local[N]``; every core when unset).
"""

from __future__ import annotations

import sys
from typing import Any

from pyspark.sql import functions as F

SCHEMA = "scan STRING, parcel STRING, depot STRING, grams LONG, at STRING"


def scans(raw: Any) -> Any:
    """The user's transform: one ``scans`` row per Kafka record (batch or streaming DataFrame)."""
    s = F.from_json(F.col("value").cast("string"), SCHEMA)
    return raw.select(s.alias("s"), "partition").select(
        F.col("s.scan").alias("scan"), F.col("s.parcel").alias("parcel"),
        F.upper("s.depot").alias("depot"), (F.col("s.grams") / 1000.0).alias("kg"),
        F.to_timestamp("s.at").alias("at"), F.col("partition").alias("part"))


if __name__ == "__main__":
    import onceflow
    from onceflow.runtime.session import session

    bootstrap, topic, dsn, ck = sys.argv[1:5]
    rejects = sys.argv[5] if len(sys.argv) > 5 else None
    import os

    cores = os.environ.get("REALTIME_DRIVER_CORES")
    spark = session(app_name="realtime-test", shuffle_partitions=2, kafka=True, realtime=True,
                    master=f"local[{cores}]" if cores else None)
    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic).option("startingOffsets", "earliest").load())
    query = onceflow.write_realtime(scans(raw), "scans", "scan", ck, dsn=dsn, duration="5 seconds",
                                    retry_for="30 seconds", rejects=rejects)
    print("started", flush=True)
    query.awaitTermination()

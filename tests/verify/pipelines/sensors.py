"""A sensor pipeline written for ``verify --pipeline ... --sink kafka`` only: every record form.

Readings arrive as JSON lines (a resent reading has the same ``reading_id``) in files (``build``)
or as the values of Kafka records read with ``format("kafka")`` (``build_kafka``); each batch writes
three topics, one per table mode and record form of the Kafka sink:

* ``hot`` (``append``): every reading above 30 degrees, as a JSON object of its columns (a
  timestamp among them);
* ``latest`` (``upsert`` by ``sensor``): only the key column and ``value`` — the record's key is
  the sensor, its value the text of ``value`` (the batch's last reading of the sensor as JSON);
* ``per_site`` (``merge`` by ``site`` and ``day``, two key columns: the key is a JSON object):
  readings counted, degrees summed, the hottest kept.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

from pyspark.sql import Window
from pyspark.sql import functions as F

from onceflow import Table, deduplicate, write_stream

SCHEMA = "reading_id STRING, sensor STRING, site STRING, degrees DOUBLE, ts TIMESTAMP"
START = dt.datetime(2026, 5, 4, 6, 0, tzinfo=dt.timezone.utc)
TABLES = {"hot": Table(mode="append"),
          "latest": Table(key="sensor", mode="upsert"),
          "per_site": Table(key=["site", "day"], add=["readings", "degrees"], max="hottest")}


def per_batch(df: Any) -> dict[str, Any]:
    last = Window.partitionBy("sensor").orderBy(F.col("ts").desc(), F.col("reading_id").desc())
    latest = (df.withColumn("n", F.row_number().over(last)).where("n = 1")
              .select("sensor", F.to_json(F.struct("reading_id", "degrees", "ts")).alias("value")))
    per_site = df.groupBy("site", F.to_date("ts").alias("day")).agg(
        F.count(F.lit(1)).alias("readings"), F.sum("degrees").alias("degrees"),
        F.max("degrees").alias("hottest"))
    return {"hot": df.where("degrees > 30").select("reading_id", "sensor", "degrees", "ts"),
            "latest": latest, "per_site": per_site}


def build(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    """Readings from JSON-lines files in ``input``."""
    return _written(spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 2).json(input), sink,
                    checkpoint, once)


def build_kafka(spark: Any, input: str, sink: Any, checkpoint: str, once: bool) -> Any:
    """Readings from a Kafka topic (``input`` = ``<bootstrap>/<topic>``), read with Spark's own reader."""
    return _written(json_values(spark, input, SCHEMA, 400), sink, checkpoint, once)


def json_values(spark: Any, input: str, schema: str, per_trigger: int) -> Any:
    """The JSON values of a topic's records as columns, read with ``format("kafka")``.

    Args:
        spark: The session.
        input: ``<bootstrap>/<topic>`` (what ``verify --source kafka`` passes).
        schema: The values' schema (DDL).
        per_trigger: Offsets per micro-batch.
    """
    bootstrap, topic = input.rsplit("/", 1)
    raw = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
           .option("subscribe", topic).option("startingOffsets", "earliest")
           .option("maxOffsetsPerTrigger", per_trigger).load())
    return raw.select(F.from_json(F.col("value").cast("string"), schema).alias("v")).select("v.*")


def _written(readings: Any, sink: Any, checkpoint: str, once: bool) -> Any:
    clean = deduplicate(readings, id="reading_id", event_time="ts", within="30 minutes")
    return write_stream(clean, sink, checkpoint, tables=TABLES, per_batch=per_batch, once=once,
                        trigger="300 milliseconds")


def write_sample(directory: Path, files: int = 4, per_file: int = 1000, seed: int = 3) -> None:
    """``files`` JSON-lines files of readings: 10% resend an earlier reading."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    sent: list[dict[str, Any]] = []
    for f in range(files):
        lines = []
        for _ in range(per_file):
            if sent and rng.random() < 0.1:
                reading = rng.choice(sent[-200:])
            else:
                n = len(sent)
                reading = {"reading_id": f"r{n}", "sensor": f"s{rng.randrange(25)}",
                           "site": f"site{rng.randrange(3)}", "degrees": round(rng.uniform(5, 40), 2),
                           "ts": (START + dt.timedelta(seconds=n * 20)).isoformat()}
                sent.append(reading)
            lines.append(json.dumps(reading))
        (directory / f"readings-{f:03d}.json").write_text("\n".join(lines) + "\n")

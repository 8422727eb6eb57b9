"""onceflow's exactly-once Kafka sink vs Spark's own (at-least-once) Kafka sink, on the same batches.

One real broker (:class:`onceflow.verify.kafka_server.KafkaServer`), one Spark session with
Spark's Kafka connector. The input is ``--files`` Parquet files of ``--rows`` rows each
(``id, account, amount, ts``); both variants read them as a stream, one file per batch
(``maxFilesPerTrigger=1``, ``Trigger.AvailableNow``), and write every row as one record keyed by
``id`` whose value is the row as JSON:

* ``spark``    — ``df.selectExpr("id AS key", "to_json(struct(*)) AS value").writeStream
                 .format("kafka")``: Spark's executors produce the records; no transaction (a
                 replayed batch is produced again);
* ``onceflow`` — ``onceflow.write_stream(df, onceflow.kafka(...), tables={"out":
                 Table(key="id")})``: each batch collected to the driver and produced in one Kafka
                 transaction with its marker.

Each variant writes to a topic of its own (3 partitions); the records are counted back with a
``read_committed`` consumer. Prints rows/s per variant and the ratio onceflow / spark per round,
and the median (target >= 0.8).

Spark's sink keeps getting faster for several rounds (the JIT): ``--warmup`` rounds (default 3)
run first and are not counted.

Usage: python benchmarks/bench_kafka_sink.py [--files 8] [--rows 50000] [--rounds 3] [--warmup 3]
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import onceflow
from onceflow import Table
from onceflow.runtime.session import session
from onceflow.verify.kafka_rig import read_records
from onceflow.verify.kafka_server import KafkaServer

SCHEMA = "id STRING, account STRING, amount LONG, ts TIMESTAMP"


def write_input(folder: Path, files: int, rows: int) -> int:
    rng = random.Random(5)
    folder.mkdir(parents=True)
    for f in range(files):
        pq.write_table(pa.table({
            "id": [f"p{f}-{i}" for i in range(rows)],
            "account": [f"acct-{rng.randrange(1000):04d}" for _ in range(rows)],
            "amount": pa.array([rng.randrange(1, 100_000) for _ in range(rows)], pa.int64()),
            "ts": pa.array([1_780_000_000_000_000 + i * 1000 for i in range(rows)], pa.timestamp("us")),
        }), folder / f"part-{f:04d}.parquet")
    return files * rows


def spark_sink(spark: Any, src: Path, bootstrap: str, topic: str, ck: Path) -> float:
    started = time.perf_counter()
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    q = (df.selectExpr("id AS key", "to_json(struct(*)) AS value").writeStream.format("kafka")
         .option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
         .option("checkpointLocation", str(ck)).trigger(availableNow=True).start())
    q.awaitTermination()
    return time.perf_counter() - started


def onceflow_sink(spark: Any, src: Path, bootstrap: str, topic: str, ck: Path, sink_id: str) -> float:
    started = time.perf_counter()
    df = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 1).parquet(str(src))
    sink = onceflow.kafka(bootstrap, sink_id=sink_id, partitions=3)
    onceflow.write_stream(df, sink, ck, {topic: Table(key="id")}, once=True).awaitTermination()
    sink.close()
    return time.perf_counter() - started


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup", type=int, default=3, help="rounds run first and not counted (JIT)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-kafka-sink-"))
    spark = session(kafka=True)
    ratios: list[float] = []
    try:
        rows = write_input(work / "in", args.files, args.rows)
        with KafkaServer() as broker:
            for r in range(-args.warmup, args.rounds):  # r < 0: warm-up (JIT, Python workers), not counted
                t_spark, t_once = f"spark-{r + args.warmup}", f"once-{r + args.warmup}"
                for name in (t_spark, t_once):
                    broker.create_topic(name, 3)
                spark_s = spark_sink(spark, work / "in", broker.bootstrap, t_spark, work / f"ck-s{r}")
                once_s = onceflow_sink(spark, work / "in", broker.bootstrap, t_once, work / f"ck-o{r}",
                                       f"bench{r + args.warmup}")
                got_s = len(read_records(broker.bootstrap, t_spark))
                got_o = len(read_records(broker.bootstrap, t_once))
                assert got_s == rows and got_o == rows, (got_s, got_o, rows)
                if r < 0:
                    continue
                ratio = spark_s / once_s
                ratios.append(ratio)
                print(f"round {r}: spark {rows / spark_s:,.0f} rows/s, onceflow {rows / once_s:,.0f} rows/s, "
                      f"onceflow/spark {ratio:.2f}", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(f"{rows:,} rows in {args.files} batches, {args.rounds} rounds: median onceflow/spark "
          f"{statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()

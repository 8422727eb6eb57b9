"""Kafka throughput: Spark's connector and onceflow's source, and Example 5-1 from Kafka vs the log.

One real Kafka broker (:class:`onceflow.verify.kafka_server.KafkaServer`, one KRaft node on
loopback), one Spark session (``local[*]``) with Spark's Kafka connector on its classpath, the
same records for every variant of a round:

* ``consumer``        — a plain confluent-kafka consumer loop in this process: every partition
                        assigned from its first offset, ``consume(10000)`` until each partition's
                        end, touching each record's value;
* ``src-spark``       — ``read_kafka(connector="spark")`` alone: ``trigger(availableNow=True)``
                        into Spark's ``noop`` sink;
* ``src-onceflow``    — the same with onceflow's Python source (``connector="onceflow"``);
* ``spark-noop``      — Spark's own ``readStream.format("kafka")`` of the same topic (from the
                        earliest offsets), ``availableNow`` into ``noop``, with Kafka's consumer
                        defaults (what a Spark user's query has);
* ``spark-tuned``     — the same with the two consumer settings ``read_kafka`` gives the connector
                        (``onceflow.sources.kafka.native.CONSUMER_DEFAULTS``): ``src-spark``'s
                        ratio to it is what onceflow adds (the record id, the topic check);
* ``spark-tuned-id``  — that read plus the ``record_id`` column as ``read_kafka`` computes it
                        (``kafka_native.record_id``): the record id's share apart from the start;
* ``ex51-kafka``      — Example 5-1 (``onceflow.examples.user_counts``, dedup + per-batch window
                        deltas, exactly once into ``onceflow.sqlite``) reading the topic with
                        Spark's connector;
* ``ex51-kafka-py``   — the same reading with onceflow's Python source;
* ``ex51-log``        — the same pipeline and events read from the embedded event log (Parquet).

Ratios are printed per round and as medians.

``--batches N`` runs each Example 5-1 variant as N micro-batches in one query (the log in N
segments, ``maxFilesPerTrigger=1``; Kafka with ``maxOffsetsPerTrigger`` = records / N): the
per-query costs (Kafka consumers, planning) spread over several batches, as in a running stream.

``--reads-only`` runs ``consumer``, ``src-spark``, ``spark-noop``, ``spark-tuned`` and
``spark-tuned-id`` only.

Usage: python benchmarks/bench_kafka.py [--events 400000] [--partitions 12] [--rounds 3] [--batches 1]
[--reads-only]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import onceflow
from onceflow.examples.user_counts import KafkaTopic, start
from onceflow.runtime.session import session
from onceflow.sources.log import EventLog
from onceflow.verify.generator import GeneratorConfig, generate_table
from onceflow.verify.kafka_rig import produce_events
from onceflow.verify.kafka_server import KafkaServer


def plain_consumer(bootstrap: str, topic: str, partitions: int) -> tuple[int, float]:
    from confluent_kafka import Consumer, TopicPartition

    started = time.perf_counter()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=30)
            for p in range(partitions)}
    consumer.assign([TopicPartition(topic, p, lo) for p, (lo, _) in ends.items()])
    todo = {p for p, (lo, hi) in ends.items() if hi > lo}
    records = size = 0
    while todo:
        for m in consumer.consume(10_000, timeout=1.0):
            if m.error() is not None:
                continue
            records += 1
            size += len(m.value())
            if m.offset() + 1 >= ends[m.partition()][1]:
                todo.discard(m.partition())
    consumer.close()
    return records, time.perf_counter() - started


DEFINE_S: list[float] = []
"""Seconds each ``read_kafka`` call took (the topic check and the plan, before the query starts)."""


def source_alone(spark: Any, bootstrap: str, topic: str, ck: Path, connector: str) -> float:
    started = time.perf_counter()
    df = onceflow.read_kafka(spark, bootstrap, subscribe=topic, connector=connector)
    DEFINE_S.append(time.perf_counter() - started)
    q = df.writeStream.format("noop").option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    q.awaitTermination()
    return time.perf_counter() - started


def spark_alone(spark: Any, bootstrap: str, topic: str, ck: Path, tuned: bool = False,
                with_id: bool = False) -> float:
    """Spark's own Kafka read of ``topic`` (no onceflow), ``availableNow`` into ``noop``; seconds.

    ``tuned``: with the consumer settings ``read_kafka`` gives the connector; ``with_id``: plus
    ``read_kafka``'s ``record_id`` column (coordinates).
    """
    from onceflow.sources.kafka.native import CONSUMER_DEFAULTS, record_id

    started = time.perf_counter()
    df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", bootstrap)
          .options(**(CONSUMER_DEFAULTS if tuned else {}))
          .option("subscribe", topic).option("startingOffsets", "earliest").load())
    if with_id:
        df = df.withColumn("record_id", record_id(None, None))
    q = df.writeStream.format("noop").option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    q.awaitTermination()
    return time.perf_counter() - started


def example(spark: Any, source: Any, work: Path, name: str, batches: int = 1) -> float:
    started = time.perf_counter()
    sink = onceflow.sqlite(str(work / f"{name}.db"))
    q = start(spark, source, sink, work / f"ck-{name}", once=True,
              max_files_per_trigger=1 if batches > 1 and isinstance(source, Path) else None)
    q.awaitTermination()
    sink.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=1,
                        help="micro-batches of Example 5-1 per run (log: one segment each; Kafka: "
                             "maxOffsetsPerTrigger = records / batches)")
    parser.add_argument("--reads-only", action="store_true",
                        help="only the plain consumer, read_kafka into noop and Spark's own read into noop")
    args = parser.parse_args()
    table = generate_table(GeneratorConfig(events=args.events, users=1000, minutes=args.events / 50_000,
                                           duplicates=0.02, seed=7))
    rows = table.num_rows
    spark = session(kafka=True)
    ratios: dict[str, list[float]] = {"src-spark/spark-noop": [], "src-spark/spark-tuned": [],
                                      "spark-tuned-id/spark-tuned": [], "src-spark/consumer": []}
    if not args.reads_only:
        ratios.update({"src-onceflow/consumer": [], "ex51-kafka/ex51-log": [], "ex51-kafka-py/ex51-log": [],
                       "ex51-kafka/ex51-kafka-py": []})
    with KafkaServer({"bench": args.partitions}) as broker:
        produce_events(broker.bootstrap, "bench", table)
        work = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
        per = -(-rows // args.batches)
        for i in range(args.batches):  # one segment per batch
            EventLog(work / "log").append(table.slice(i * per, per))
        try:
            limit = per if args.batches > 1 else None
            warm = KafkaTopic(broker.bootstrap, "bench", connector="spark", max_offsets_per_trigger=limit)
            spark_alone(spark, broker.bootstrap, "bench", work / "warm-noop")  # JIT: once, not counted
            for connector in ("spark",) if args.reads_only else ("spark", "onceflow"):
                source_alone(spark, broker.bootstrap, "bench", work / f"warm-{connector}", connector)
                if not args.reads_only:
                    example(spark, dataclasses.replace(warm, connector=connector), work, f"warm-{connector}",
                            args.batches)
            if not args.reads_only:
                example(spark, work / "log", work, "warm-log", args.batches)
            for r in range(args.rounds):
                got, consumer_s = plain_consumer(broker.bootstrap, "bench", args.partitions)
                assert got == rows, (got, rows)
                # the reads into noop in a rotating order, so none always runs first
                order = ["spark", "noop", "tuned", "tuned-id"]
                took = {}
                for which in order[r % 4:] + order[:r % 4]:
                    took[which] = (source_alone(spark, broker.bootstrap, "bench", work / f"ck-s-{r}", "spark")
                                   if which == "spark" else
                                   spark_alone(spark, broker.bootstrap, "bench", work / f"ck-{which}-{r}",
                                               tuned=which != "noop", with_id=which == "tuned-id"))
                times = [("consumer", consumer_s), ("src-spark", took["spark"]), ("spark-noop", took["noop"]),
                         ("spark-tuned", took["tuned"]), ("spark-tuned-id", took["tuned-id"])]
                if not args.reads_only:
                    own_s = source_alone(spark, broker.bootstrap, "bench", work / f"ck-o-{r}", "onceflow")
                    kafka_s = example(spark, warm, work, f"k{r}", args.batches)
                    py = dataclasses.replace(warm, connector="onceflow")
                    py_s = example(spark, py, work, f"p{r}", args.batches)
                    log_s = example(spark, work / "log", work, f"l{r}", args.batches)
                    times += [("src-onceflow", own_s), ("ex51-kafka", kafka_s), ("ex51-kafka-py", py_s),
                              ("ex51-log", log_s)]
                rate = {n: rows / s for n, s in times}
                for name in ratios:
                    a, b = name.split("/")
                    ratios[name].append(rate[a] / rate[b])
                print(f"round {r}: " + ", ".join(f"{n} {v:,.0f} rec/s" for n, v in rate.items())
                      + " | " + ", ".join(f"{n} {v[-1]:.2f}" for n, v in ratios.items()), flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{rows:,} records, {args.partitions} partitions, {args.rounds} rounds: median "
          + ", ".join(f"{n} {statistics.median(v):.2f}" for n, v in ratios.items()))
    print(f"read_kafka's call (topic check, plan), median of {len(DEFINE_S)}: "
          f"{statistics.median(DEFINE_S):.3f} s")
    spark.stop()


if __name__ == "__main__":
    main()

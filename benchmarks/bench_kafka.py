"""Kafka throughput: onceflow's Kafka source vs a plain consumer loop, and Example 5-1 from Kafka vs the log.

One broker (librdkafka's mock cluster in a helper process, loopback), one Spark session
(``local[*]``), the same records for every variant of a round:

* ``consumer``   — a plain confluent-kafka consumer loop in this process: every partition
                   assigned from its first offset, ``consume(10000)`` until each partition's
                   end, touching each record's value;
* ``source``     — ``onceflow_kafka`` alone: ``trigger(availableNow=True)`` into Spark's
                   ``noop`` sink (one task per partition range, Arrow batches on the executors);
* ``ex51-kafka`` — Example 5-1 (``onceflow.examples.user_counts``, dedup + per-batch window
                   deltas, exactly once into ``onceflow.sqlite``) reading the topic;
* ``ex51-log``   — the same pipeline and events read from the embedded event log (Parquet).

The mock broker keeps about 5 MiB per partition (older records are deleted), so records are
spread over enough partitions to stay under it. Ratios are printed per round and as medians.

Usage: python benchmarks/bench_kafka.py [--events 400000] [--partitions 12] [--rounds 3]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import onceflow
from onceflow.examples.user_counts import KafkaTopic, start
from onceflow.sources.log import EventLog
from onceflow.spark import session
from onceflow.verify.broker import BrokerProcess
from onceflow.verify.generator import GeneratorConfig, generate_table
from onceflow.verify.kafka_rig import produce_events


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


def source_alone(spark: Any, bootstrap: str, topic: str, ck: Path) -> float:
    started = time.perf_counter()
    df = onceflow.read_kafka(spark, bootstrap, subscribe=topic)
    q = df.writeStream.format("noop").option("checkpointLocation", str(ck)).trigger(availableNow=True).start()
    q.awaitTermination()
    return time.perf_counter() - started


def example(spark: Any, source: Any, work: Path, name: str) -> float:
    started = time.perf_counter()
    sink = onceflow.sqlite(str(work / f"{name}.db"))
    q = start(spark, source, sink, work / f"ck-{name}", once=True)
    q.awaitTermination()
    sink.close()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=int, default=400_000)
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    table = generate_table(GeneratorConfig(events=args.events, users=1000, minutes=args.events / 50_000,
                                           duplicates=0.02, seed=7))
    rows = table.num_rows
    spark = session()
    ratios: dict[str, list[float]] = {"source/consumer": [], "ex51-kafka/ex51-log": []}
    with BrokerProcess({"bench": args.partitions}) as broker:
        produce_events(broker.bootstrap, "bench", table)
        work = Path(tempfile.mkdtemp(prefix="bench-kafka-"))
        EventLog(work / "log").append(table)
        try:
            source_alone(spark, broker.bootstrap, "bench", work / "warm")  # JIT, Python workers
            for r in range(args.rounds):
                got, consumer_s = plain_consumer(broker.bootstrap, "bench", args.partitions)
                assert got == rows, (got, rows)
                source_s = source_alone(spark, broker.bootstrap, "bench", work / f"ck-src-{r}")
                kafka_s = example(spark, KafkaTopic(broker.bootstrap, "bench"), work, f"k{r}")
                log_s = example(spark, work / "log", work, f"l{r}")
                rate = {n: rows / s for n, s in (("consumer", consumer_s), ("source", source_s),
                                                 ("ex51-kafka", kafka_s), ("ex51-log", log_s))}
                ratios["source/consumer"].append(rate["source"] / rate["consumer"])
                ratios["ex51-kafka/ex51-log"].append(rate["ex51-kafka"] / rate["ex51-log"])
                print(f"round {r}: " + ", ".join(f"{n} {v:,.0f} rec/s" for n, v in rate.items())
                      + f" | source/consumer {ratios['source/consumer'][-1]:.2f}"
                      + f", ex51 kafka/log {ratios['ex51-kafka/ex51-log'][-1]:.2f}", flush=True)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    print(f"{rows:,} records, {args.partitions} partitions, {args.rounds} rounds: median "
          + ", ".join(f"{n} {statistics.median(v):.2f}" for n, v in ratios.items()))
    spark.stop()


if __name__ == "__main__":
    main()

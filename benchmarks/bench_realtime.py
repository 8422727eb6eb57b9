"""Spark's Real-Time Mode on this machine: what latency it gives, and to which sinks.

Spark 4.1+ runs a stateless query with ``trigger(realTime=...)`` as long-running tasks that
pass each record on as it arrives; the trigger's duration is the checkpoint interval, not a
latency. This bench measures a stateless query (Kafka in, the record's key and value out) on
a local broker, from a record produced (and acknowledged) to the record visible downstream:

* ``kafka-rt``   — Real-Time Mode into Spark's own Kafka sink (JVM); visible = consumed from
                   the output topic by a consumer polling it;
* ``kafka-mb``   — the same query as micro-batches (``processingTime="0 seconds"``);
* ``pg-rt``      — Real-Time Mode into PostgreSQL through onceflow's real-time upsert writer
                   (:func:`onceflow.write_realtime`: a JVM ``ForeachWriter``, one autocommitted
                   upsert per record keyed by topic/partition/offset); visible = the row read
                   by a second connection polling every 1 ms (``$ONCEFLOW_PG_DSN``, or a
                   temporary server as the tests start one);
* ``pg-mb``      — the same rows as micro-batches (``processingTime="0 seconds"``) through
                   onceflow's exactly-once PostgreSQL sink (driver side), for comparison;
* ``foreach-rt`` — Real-Time Mode into a Python ``foreach`` writer that upserts each row into
                   SQLite and commits (one transaction per row, keyed by the record's
                   topic/partition/offset — an idempotent sink); visible = the row read by a
                   second connection. Sent in bursts of ``--burst`` records: the time to the
                   first row and to the last row of each burst.

Usage: python benchmarks/bench_realtime.py [--modes kafka-rt,kafka-mb,pg-rt,pg-mb,foreach-rt] [--samples 120]
       [--warmup 30] [--burst 3000] [--duration "5 seconds"]
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from contextlib import closing
from pathlib import Path
from typing import Any

from bench_latency import pct
from confluent_kafka import Consumer, Producer

import onceflow
from onceflow.runtime.session import session
from onceflow.verify.kafka_server import KafkaServer


def source(spark: Any, broker: KafkaServer, topic: str) -> Any:
    """The input topic read by Spark's connector, from its start."""
    return (spark.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest").load())


def kafka_mode(spark: Any, broker: KafkaServer, work: Path, real_time: bool,
               args: argparse.Namespace) -> list[float]:
    """Produce one record at a time; milliseconds until it is consumed from the output topic."""
    name = "rt" if real_time else "mb"
    broker.create_topic(f"in-{name}", 2)
    broker.create_topic(f"out-{name}", 2)
    writer = (source(spark, broker, f"in-{name}").selectExpr("key", "value").writeStream.format("kafka")
              .option("kafka.bootstrap.servers", broker.bootstrap).option("topic", f"out-{name}")
              .option("kafka.linger.ms", "0").option("checkpointLocation", str(work / f"ck-{name}")))
    writer = (writer.outputMode("update").trigger(realTime=args.duration) if real_time
              else writer.trigger(processingTime="0 seconds"))
    query = writer.start()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"bench-{name}",
                         "auto.offset.reset": "earliest", "fetch.wait.max.ms": 1})
    consumer.subscribe([f"out-{name}"])
    samples = []
    try:
        for i in range(args.warmup + args.samples):
            value = f"v{i}".encode()
            t0 = time.perf_counter()
            producer.produce(f"in-{name}", value=value, partition=i % 2)
            producer.flush(10)
            while True:
                msg = consumer.poll(0.01)
                if msg is not None and msg.error() is None and msg.value() == value:
                    break
                if time.perf_counter() - t0 > 60:
                    raise SystemExit(f"kafka-{name}: record {i} not seen downstream in 60 s")
            if i >= args.warmup:
                samples.append((time.perf_counter() - t0) * 1000)
            time.sleep(0.05)
    finally:
        query.stop()
        consumer.close()
    return samples


def pg_mode(spark: Any, broker: KafkaServer, work: Path, dsn: str, real_time: bool,
            args: argparse.Namespace) -> list[float]:
    """Produce one record at a time; milliseconds until its row is read from PostgreSQL."""
    import psycopg

    name = "pgrt" if real_time else "pgmb"
    broker.create_topic(f"in-{name}", 2)
    rows = source(spark, broker, f"in-{name}").selectExpr("topic", "partition", "offset",
                                                          "cast(value as string) AS v")
    table = f"bench_{name}"
    if real_time:
        query = onceflow.write_realtime(rows, table, ["topic", "partition", "offset"], work / f"ck-{name}",
                                        dsn=dsn, duration=args.duration)
    else:
        query = onceflow.write_stream(rows, onceflow.postgres(dsn, sink_id=name), work / f"ck-{name}",
                                      tables={table: onceflow.Table(key=["topic", "partition", "offset"])},
                                      trigger="0 seconds")
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    samples = []
    try:
        with psycopg.connect(dsn, autocommit=True) as reader:
            for i in range(args.warmup + args.samples):
                value = f"v{i}"
                t0 = time.perf_counter()
                producer.produce(f"in-{name}", value=value.encode(), partition=i % 2)
                producer.flush(10)
                while True:
                    try:
                        if reader.execute(f"SELECT 1 FROM {table} WHERE v = %s", (value,)).fetchone():
                            break
                    except psycopg.errors.UndefinedTable:  # the micro-batch sink creates it
                        pass
                    if time.perf_counter() - t0 > 60:
                        raise SystemExit(f"{name}: record {i} not in PostgreSQL after 60 s")
                    time.sleep(0.001)
                if i >= args.warmup:
                    samples.append((time.perf_counter() - t0) * 1000)
                time.sleep(0.05)
    finally:
        query.stop()
    return samples


class SQLiteUpserts:
    """A Python ``foreach`` writer: each row upserted by its source coordinates and committed."""

    def __init__(self, path: str) -> None:
        self.path = path

    def open(self, partition_id: int, epoch_id: int) -> bool:
        self.conn = sqlite3.connect(self.path, timeout=30)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("CREATE TABLE IF NOT EXISTS t(topic TEXT, part INT, off INT, v TEXT, "
                          "PRIMARY KEY(topic, part, off))")
        return True

    def process(self, row: Any) -> None:
        self.conn.execute("INSERT OR REPLACE INTO t VALUES (?, ?, ?, ?)",
                          (row.topic, row.partition, row.offset, row.v))
        self.conn.commit()

    def close(self, error: BaseException | None) -> None:
        self.conn.close()


def foreach_mode(spark: Any, broker: KafkaServer, work: Path,
                 args: argparse.Namespace) -> list[tuple[float, float]]:
    """Bursts of records; seconds until the first and the last of each is in SQLite."""
    broker.create_topic("in-fe", 2)
    db = work / "fe.db"
    rows = source(spark, broker, "in-fe").selectExpr("topic", "partition", "offset",
                                                     "cast(value as string) AS v")
    query = (rows.writeStream.outputMode("update").foreach(SQLiteUpserts(str(db)))
             .option("checkpointLocation", str(work / "ck-fe")).trigger(realTime=args.duration).start())
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    out = []
    try:
        time.sleep(5)  # the query's tasks start
        for b in range(3):
            t0 = time.perf_counter()
            for j in range(args.burst):
                producer.produce("in-fe", value=f"b{b}-{j}".encode(), partition=j % 2)
            producer.flush(30)
            first = None
            while True:
                n = 0
                if db.exists():
                    with closing(sqlite3.connect(db, timeout=30)) as reader:
                        try:
                            n = reader.execute("SELECT count(*) FROM t WHERE v LIKE ?",
                                               (f"b{b}-%",)).fetchone()[0]
                        except sqlite3.OperationalError:  # the table is not there yet
                            n = 0
                if n and first is None:
                    first = time.perf_counter() - t0
                if n >= args.burst:
                    break
                if time.perf_counter() - t0 > 120:
                    raise SystemExit(f"foreach-rt: burst {b} not all written in 120 s ({n} rows)")
                time.sleep(0.002)
            out.append((first or 0.0, time.perf_counter() - t0))
            print(f"  foreach-rt burst {b}: first row {out[-1][0]:.3f} s, all {out[-1][1]:.3f} s", flush=True)
    finally:
        query.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--modes", default="kafka-rt,kafka-mb,pg-rt,pg-mb,foreach-rt")
    ap.add_argument("--samples", type=int, default=120)
    ap.add_argument("--warmup", type=int, default=30)
    ap.add_argument("--burst", type=int, default=3000)
    ap.add_argument("--duration", default="5 seconds", help="the real-time trigger's batch duration")
    args = ap.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    # Real-Time Mode refuses a session naming a state store provider other than RocksDB (the
    # queries here are stateless; write_realtime unsets it itself, Spark's Kafka sink does not)
    spark = session(kafka=True, realtime=any(m.startswith("pg-") for m in modes), id_store=False)
    dsn, server = os.environ.get("ONCEFLOW_PG_DSN"), None
    if any(m.startswith("pg-") for m in modes) and not dsn:
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
        from tests.pg_server import TempPostgres

        server = TempPostgres()
        server.start()
        dsn = server.new_database()
    broker = KafkaServer({})
    work = Path(tempfile.mkdtemp(prefix="bench-realtime-"))
    try:
        for mode in modes:
            if mode in ("kafka-rt", "kafka-mb", "pg-rt", "pg-mb"):
                s = (kafka_mode(spark, broker, work, mode == "kafka-rt", args) if mode.startswith("kafka")
                     else pg_mode(spark, broker, work, str(dsn), mode == "pg-rt", args))
                print(f"{mode}: {len(s)} records: p50 {pct(s, 0.5):.1f} ms, p90 {pct(s, 0.9):.1f}, "
                      f"p99 {pct(s, 0.99):.1f}, max {max(s):.1f}", flush=True)
            elif mode == "foreach-rt":
                bursts = foreach_mode(spark, broker, work, args)
                print(f"foreach-rt: {args.burst}-record bursts: first row after "
                      f"{statistics.median(f for f, _ in bursts):.2f} s, all after "
                      f"{statistics.median(a for _, a in bursts):.2f} s (median of {len(bursts)})",
                      flush=True)
            else:
                raise SystemExit(f"unknown mode {mode!r}: kafka-rt, kafka-mb, pg-rt, pg-mb or foreach-rt")
    finally:
        spark.stop()
        broker.close()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()

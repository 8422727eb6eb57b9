"""Example 5-1 throughput: onceflow exactly-once vs noop vs the plain at-least-once version.

All variants run in one Spark session over the same log, each with a fresh checkpoint,
``trigger(availableNow=True)`` and ``maxFilesPerTrigger`` segments per micro-batch:

* ``onceflow``  — Example 5-1 on the public API (``onceflow.examples.user_counts``: dedup,
                  ``write_stream`` with per-batch window deltas) into ``onceflow.sqlite``;
* ``noop``      — the same plan (dedup + per-batch window deltas) writing to Spark's
                  ``noop`` sink: the cost of the plan without any sink;
* ``nodedup``   — the ``noop`` plan without its dedup state (the watermark kept, every event
                  counted, duplicates too): not a pipeline anyone should run, the ceiling a
                  faster deduplication could reach;
* ``noop-hdfs`` — ``noop`` with Spark's own HDFS-backed state store even when the session's
                  is onceflow's id store (``--state-store ids``): Spark's own plan, to compare;
* ``plain``     — what people write today (on Spark's own state store): dedup + a stateful
                  window count in update mode,
                  ``foreachBatch`` collecting rows and upserting them into SQLite
                  (at-least-once: no batch marker).

Each run starts from a collected heap (Python ``gc.collect()`` and the JVM's ``System.gc()``,
outside the timed part), and a sampler process measures how fast the machine's CPU is while
it runs (``machine_speed.py``: on a shared machine the same work takes up to 1.7x longer in a
slow phase); every run is also reported in reference-speed seconds (its wall time times the
reference unit time over the run's unit time), and the ratios are given both ways.

Usage: python benchmarks/bench_user_counts.py [--events 5000000] [--rounds 3]
       [--variants onceflow,noop]
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from machine_speed import Sampler
from pyspark.sql import functions as F

import onceflow
from onceflow.examples.user_counts import events, start, window_deltas
from onceflow.runtime.session import session
from onceflow.sources.events import EVENT_DDL
from onceflow.sources.log import EventLog
from onceflow.verify.generator import GeneratorConfig, generate_segments


def make_log(directory: Path, events: int, segment_size: int) -> int:
    marker = directory / f"_complete_{events}_{segment_size}"
    if marker.exists():
        return int(marker.read_text())
    shutil.rmtree(directory, ignore_errors=True)
    log = EventLog(directory)
    rows = 0
    cfg = GeneratorConfig(events=events, users=1000, minutes=events / 50_000, duplicates=0.02,
                          seed=7, segment_size=segment_size)
    for t in generate_segments(cfg):
        log.append(t)
        rows += t.num_rows
    marker.write_text(str(rows))
    return rows


Timing = tuple[float, list[float]]
"""Wall seconds of a variant and Spark's ``triggerExecution`` ms of each batch with input."""


def batch_ms(progress: list[Any]) -> list[float]:
    """Per-batch trigger times (ms) from a query's progress reports, batches with input only."""
    reports = [p if isinstance(p, dict) else json.loads(p.json) for p in progress]
    return [float(p["durationMs"]["triggerExecution"]) for p in reports if p["numInputRows"] > 0]


def drain(writer: Any, checkpoint: Path) -> Timing:
    """Run a hand-built query (a ``DataStreamWriter``) over everything in the log, timed."""
    t0 = time.perf_counter()
    query = writer.option("checkpointLocation", str(checkpoint)).trigger(availableNow=True).start()
    query.awaitTermination()
    return time.perf_counter() - t0, batch_ms(query.recentProgress)


def run_onceflow(spark: Any, log: Path, work: Path, files: int) -> Timing:
    sink = onceflow.sqlite(work / "db.sqlite")
    t0 = time.perf_counter()
    query = start(spark, log, sink, work / "ck", max_files_per_trigger=files, once=True)
    query.awaitTermination()
    sink.close()
    return time.perf_counter() - t0, batch_ms(query.query.recentProgress)


def noop_batch(df: Any, _: int) -> None:
    """The plan's per-batch window deltas, written to Spark's ``noop`` sink."""
    window_deltas(df).write.format("noop").mode("overwrite").save()


def run_noop(spark: Any, log: Path, work: Path, files: int) -> Timing:
    stream = events(spark, log, max_files_per_trigger=files)
    return drain(stream.writeStream.foreachBatch(noop_batch), work / "ck")


def run_nodedup(spark: Any, log: Path, work: Path, files: int) -> Timing:
    stream = (spark.readStream.schema(EVENT_DDL).option("maxFilesPerTrigger", files).parquet(str(log))
              .select("event_id", "user", "event_time").withWatermark("event_time", "1 minute"))
    return drain(stream.writeStream.foreachBatch(noop_batch), work / "ck")


@contextmanager
def sparks_store(spark: Any) -> Iterator[None]:
    """Queries started inside use Spark's HDFS-backed state store, whatever the session's is."""
    key = "spark.sql.streaming.stateStore.providerClass"
    before = spark.conf.get(key)
    spark.conf.set(key, "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider")
    try:
        yield
    finally:
        spark.conf.set(key, before)


def run_noop_hdfs(spark: Any, log: Path, work: Path, files: int) -> Timing:
    with sparks_store(spark):
        return run_noop(spark, log, work, files)


def run_plain(spark: Any, log: Path, work: Path, files: int) -> Timing:
    conn = sqlite3.connect(work / "plain.sqlite", check_same_thread=False)
    conn.execute("CREATE TABLE user_counts(user TEXT, window_start_ms INTEGER, "
                 "window_end_ms INTEGER, count INTEGER, PRIMARY KEY(user, window_start_ms))")

    def batch(df: Any, _: int) -> None:
        rows = [(r.user, int(r.window.start.timestamp() * 1000), int(r.window.end.timestamp() * 1000),
                 r["count"]) for r in df.collect()]
        conn.executemany("INSERT OR REPLACE INTO user_counts VALUES (?,?,?,?)", rows)
        conn.commit()

    counts = (events(spark, log, max_files_per_trigger=files)
              .groupBy(F.window("event_time", "1 minute"), "user").count())
    try:
        with sparks_store(spark):  # what people run today
            return drain(counts.writeStream.outputMode("update").foreachBatch(batch), work / "ck")
    finally:
        conn.close()


VARIANTS = {"onceflow": run_onceflow, "noop": run_noop, "noop-hdfs": run_noop_hdfs, "nodedup": run_nodedup,
            "plain": run_plain}


def settle(spark: Any) -> None:
    """Collect both heaps before a timed run, so no run pays for its predecessor's garbage."""
    gc.collect()
    spark.sparkContext._jvm.java.lang.System.gc()
    time.sleep(0.5)


def paired(a: list[float], b: list[float]) -> float:
    """Median over rounds of ``a[i] / b[i]`` (both variants of a round run back to back)."""
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--events", type=int, default=5_000_000)
    ap.add_argument("--segment-size", type=int, default=100_000)
    ap.add_argument("--files-per-batch", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--warmup-rounds", type=int, default=3,
                    help="full rounds run first and discarded (the JVM keeps getting faster over its "
                         "first ~6 runs: JIT, caches)")
    ap.add_argument("--variants", default="onceflow,noop,plain",
                    help=f"comma-separated subset of {', '.join(VARIANTS)} (onceflow and noop are required)")
    ap.add_argument("--state-store", choices=["hdfs", "rocksdb", "ids"], default="ids",
                    help="the dedup state: ids = onceflow's id state store (onceflow.runtime.idstore; "
                         "session()'s default), hdfs = Spark's HDFS-backed store, rocksdb")
    ap.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "onceflow-bench-log")
    ap.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE",
                    help="a Spark setting for the session (repeatable), e.g. spark.shuffle.compress=false")
    args = ap.parse_args()
    names = [n.strip() for n in args.variants.split(",") if n.strip()]
    if not {"onceflow", "noop"} <= set(names) or not set(names) <= set(VARIANTS):
        ap.error(f"--variants: need onceflow and noop, and only names from {', '.join(VARIANTS)}")
    variants = {n: VARIANTS[n] for n in VARIANTS if n in names}
    t0 = time.perf_counter()
    rows = make_log(args.data, args.events, args.segment_size)
    print(f"log: {rows:,} rows ({args.events:,} distinct) in {args.data} "
          f"({time.perf_counter() - t0:.1f} s to prepare)")
    conf = dict(c.split("=", 1) for c in args.conf)
    if args.state_store == "rocksdb":
        conf["spark.sql.streaming.stateStore.providerClass"] = (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider")
        conf["spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"] = "true"
    spark = session(app_name="onceflow-bench", conf=conf, id_store=args.state_store == "ids")
    print(f"spark {spark.version}, master {spark.sparkContext.master}, "
          f"shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}, "
          f"state store {args.state_store}, "
          f"{rows // (args.events // args.segment_size or 1) * args.files_per_batch:,} rows per batch")
    with tempfile.TemporaryDirectory() as warm:  # JIT and Python worker warm-up
        w = Path(warm)
        EventLog(w / "log").append(next(generate_segments(GeneratorConfig(events=50_000))))
        for name, fn in variants.items():
            (w / name).mkdir()
            fn(spark, w / "log", w / name, 1)
    times: dict[str, list[float]] = {name: [] for name in variants}
    units: dict[str, list[float]] = {name: [] for name in variants}
    batches: dict[str, list[list[float]]] = {name: [] for name in variants}
    with Sampler() as speed:
        for r in range(-args.warmup_rounds, args.rounds):
            order = list(variants.items())
            for name, fn in (order if r % 2 == 0 else order[::-1]):
                work = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
                settle(spark)
                m0 = time.monotonic()
                secs, per_batch = fn(spark, args.data, work, args.files_per_batch)
                unit = speed.window(m0, time.monotonic())
                shutil.rmtree(work, ignore_errors=True)
                label = "warm-up" if r < 0 else f"round {r + 1}"
                print(f"{label:8s} {name:9s} {secs:7.1f} s  {rows / secs:12,.0f} events/s  "
                      f"cpu unit {unit * 1000 if unit else float('nan'):5.2f} ms", flush=True)
                if r < 0:
                    continue
                times[name].append(secs)
                units[name].append(unit or float("nan"))
                batches[name].append(per_batch)
    ref = statistics.median(u for v in units.values() for u in v)
    # A run in a slow phase of the CPU did its work at ref/unit of the reference speed.
    scaled = {n: [t * ref / u for t, u in zip(times[n], units[n], strict=True)] for n in variants}
    print(f"\nreference cpu unit {ref * 1000:.2f} ms (median over all runs)")
    for name in variants:
        typical = statistics.median(times[name])
        print(f"{name:9s} best {rows / min(times[name]):12,.0f} events/s   median {rows / typical:12,.0f}"
              f"   at reference speed: median {rows / statistics.median(scaled[name]):12,.0f}"
              f"   (spread of runs {max(times[name]) / min(times[name]):.2f}x, at reference speed "
              f"{max(scaled[name]) / min(scaled[name]):.2f}x)")
    # Each round runs the variants back to back, so a per-round ratio cancels slow phases of
    # the machine that hit a whole round.
    print(f"paired ratio onceflow/noop  = {paired(times['noop'], times['onceflow']):.3f}  "
          f"(median of {args.rounds} rounds; at reference speed "
          f"{paired(scaled['noop'], scaled['onceflow']):.3f})  (target >= 0.97)")
    if "plain" in variants:
        print(f"paired ratio onceflow/plain = {paired(times['plain'], times['onceflow']):.3f}  "
              f"(at reference speed {paired(scaled['plain'], scaled['onceflow']):.3f})  (target >= 1.0)")
    # A drift over the run (the JVM still warming up, caches) favours whichever variant runs
    # later in a round; two rounds in opposite orders (A B | B A) place every variant at the
    # same mean position, so the ratio of their sums cancels a linear drift.
    blocks = [(times["noop"][i] + times["noop"][i + 1]) / (times["onceflow"][i] + times["onceflow"][i + 1])
              for i in range(0, args.rounds - 1, 2)]
    if blocks:
        print(f"block ratio onceflow/noop  = {statistics.median(blocks):.3f}  (median of {len(blocks)} "
              f"two-round blocks in opposite orders: {', '.join(f'{b:.3f}' for b in blocks)})")
    # Finer pairs: batch k of a round in one variant against batch k of the same round in the
    # other (the same files and state size). Spark's trigger time of a batch covers planning,
    # the sink call and both logs. Not covered: query start/stop.
    pairs = [n / o for rn, ro in zip(batches["noop"], batches["onceflow"], strict=True)
             for n, o in zip(rn, ro, strict=False)]
    if pairs:
        print(f"per-batch paired ratio onceflow/noop = {statistics.median(pairs):.3f}  "
              f"(median of {len(pairs)} batch pairs)")
    med = {name: statistics.median(v) for name, v in times.items()}
    print(f"median ratio onceflow/noop  = {med['noop'] / med['onceflow']:.3f}")
    if "plain" in variants:
        print(f"median ratio onceflow/plain = {med['plain'] / med['onceflow']:.3f}")
    if "noop-hdfs" in variants:
        print(f"paired ratio onceflow/noop-hdfs = {paired(times['noop-hdfs'], times['onceflow']):.3f}  "
              f"(Spark's own dedup state; target >= 1.5 with --state-store ids)")
        print(f"paired ratio noop/noop-hdfs = {paired(times['noop-hdfs'], times['noop']):.3f}  "
              f"(the same plan, the two state stores)")
    if "nodedup" in variants:
        print(f"paired ratio onceflow/nodedup = {paired(times['nodedup'], times['onceflow']):.3f}  "
              f"(the share of the plan's time left when the dedup state costs nothing)")
    spark.stop()


if __name__ == "__main__":
    main()

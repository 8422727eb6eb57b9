"""Stable input: what persisting a batch's output once costs, vs Spark's own checkpoints.

Two measurements in one Spark session (``local[2]``, 4 shuffle partitions):

1. **Per batch, in a query** — the same ``write_stream`` over ``--batches`` batches of ``--rows``
   rows each (Parquet files, one file per batch), ``per_batch`` = the batch with two derived
   columns (a transform whose output is as large as its input), into a sink that takes the
   rows and drops them, with and without ``stable=True``; Spark's ``triggerExecution`` time of
   each batch, median, and the difference in ms and % of the batch.
2. **One 1M-row DataFrame, four ways** — materialize it (``count``: the baseline); onceflow's
   ``StableOutputs.save`` (Parquet under the checkpoint, read back); ``DataFrame.checkpoint()``
   (reliable, into a checkpoint dir); ``DataFrame.localCheckpoint()`` (executor storage, lost
   with an executor); each then counted once more, as a sink would read it.

Usage: python benchmarks/bench_stable.py [--rows 1000000] [--batches 5] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa

import onceflow
from onceflow.engine.stable import StableOutputs
from onceflow.runtime.session import session
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table


class DropSink:
    """A sink that takes each batch's rows (as Arrow, through the driver) and drops them."""

    sink_id = "bench"

    def bind(self, query_id: str) -> None:
        pass

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        return True

    def batches(self) -> list[dict[str, Any]]:
        return []

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def make_input(spark: Any, directory: Path, rows: int, batches: int) -> None:
    from pyspark.sql import functions as F

    for b in range(batches):
        (spark.range(b * rows, (b + 1) * rows, numPartitions=2)
         .select(F.col("id"), (F.col("id") % 997).alias("account"), (F.rand(b) * 1000).alias("amount"),
                 F.timestamp_seconds(F.lit(1_767_225_600) + F.col("id") / 1000).alias("ts"))
         .coalesce(1).write.mode("overwrite").parquet(str(directory / f"part-{b:03d}")))
        for f in (directory / f"part-{b:03d}").glob("*.parquet"):
            f.rename(directory / f"batch-{b:03d}.parquet")
        shutil.rmtree(directory / f"part-{b:03d}")


def per_batch(df: Any) -> Any:
    from pyspark.sql import functions as F

    return df.withColumn("cents", (F.col("amount") * 100).cast("long")).withColumn("hour", F.hour("ts"))


def run_query(spark: Any, data: Path, work: Path, stable: bool) -> list[float]:
    stream = spark.readStream.schema("id long, account long, amount double, ts timestamp") \
        .option("maxFilesPerTrigger", 1).parquet(str(data))
    q = onceflow.write_stream(stream, sink=DropSink(), checkpoint=work / "ck", tables={"out": Table()},
                              per_batch=per_batch, stable=stable, once=True, event_time="ts")
    q.awaitTermination()
    reports = [json.loads(p.json) for p in q.query.recentProgress]
    return [float(p["durationMs"]["triggerExecution"]) for p in reports if p["numInputRows"] > 0]


def timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--batches", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    spark = session(app_name="onceflow-bench-stable")
    work = Path(tempfile.mkdtemp(prefix="onceflow-bench-stable-"))
    data = work / "in"
    data.mkdir()
    make_input(spark, data, args.rows, args.batches)
    print(f"spark {spark.version}, {args.batches} batches of {args.rows:,} rows, "
          f"shuffle partitions {spark.conf.get('spark.sql.shuffle.partitions')}")
    per: dict[str, list[float]] = {"without": [], "stable": []}
    for r in range(args.rounds + 1):  # round 0 warms up
        for name in (["without", "stable"] if r % 2 == 0 else ["stable", "without"]):
            run = work / f"q-{name}-{r}"
            ms = run_query(spark, data, run, stable=name == "stable")
            shutil.rmtree(run, ignore_errors=True)
            print(f"{'warm-up' if r == 0 else f'round {r}'} {name:8s} batches (ms): "
                  + ", ".join(f"{m:.0f}" for m in ms), flush=True)
            if r:
                per[name].extend(ms)
    base, with_stable = statistics.median(per["without"]), statistics.median(per["stable"])
    print(f"query: median batch {base:.0f} ms without, {with_stable:.0f} ms with stable input: "
          f"+{with_stable - base:.0f} ms ({(with_stable - base) / base * 100:+.1f}% of the batch)")

    df = per_batch(spark.read.parquet(str(data / "batch-000.parquet")))
    spark.sparkContext.setCheckpointDir(str(work / "spark-ck"))
    ways: dict[str, list[float]] = {"count": [], "onceflow stable": [], "checkpoint()": [],
                                    "localCheckpoint()": []}
    for r in range(args.rounds + 1):
        store = StableOutputs(work / f"stable-{r}")
        ways_now = {
            "count": lambda: df.count(),
            "onceflow stable": lambda s=store, r=r: s.save(r, "bench", {"t": df}, 0).tables["t"].count(),
            "checkpoint()": lambda: df.checkpoint(eager=True).count(),
            "localCheckpoint()": lambda: df.localCheckpoint(eager=True).count(),
        }
        for name, fn in ways_now.items():
            ms = timed(fn)
            if r:
                ways[name].append(ms)
    print()
    base_ms = statistics.median(ways["count"])
    for name, v in ways.items():
        med = statistics.median(v)
        print(f"{name:18s} {med:7.0f} ms  (+{med - base_ms:.0f} ms over computing it)")
    spark.stop()
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()

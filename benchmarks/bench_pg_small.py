"""Small batches into PostgreSQL: where a 40-row micro-batch's time goes, per protocol.

A file stream (one 40-row Parquet file per micro-batch, ``trigger "0 seconds"``), ``per_batch``
sums ``v`` per key ``k`` (30 keys), into ``onceflow.postgres(..., protocol=P)`` for each
``--protocols`` P (``driver``, ``staged``, ``2pc``). After ``--warmup`` batches, ``--batches``
files are added one at a time, each after the last committed; printed per protocol: the median
batch (``on_batch`` seconds) and the median of each onceflow step, timed by wrapping the
methods that run it (``BatchWriter._prepare``: ``per_batch`` and the lazy plan;
``_materialize``: the outputs computed — cached and counted for the executor-side protocols,
collected for ``driver``; the sink's commit, and inside it for ``staged`` / ``2pc`` the key
check (``PostgresFramesSink._check``), the executors' write and its driver-side commit
(``write_frame``) and the batch's summary row (``_summarize``)).

PostgreSQL: ``$ONCEFLOW_PG_DSN`` (``max_prepared_transactions > 0`` for ``2pc``), else a
temporary server as the tests start one.

Usage: python benchmarks/bench_pg_small.py [--protocols driver,staged,2pc] [--batches 20] [--warmup 10]
       [--rows 40]
"""

from __future__ import annotations

import argparse
import functools
import inspect
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import onceflow
from onceflow import Table
from onceflow.engine import batch as batch_mod
from onceflow.runtime.session import session
from onceflow.sinks.postgres import datasource
from onceflow.sinks.postgres import sink as pg_sink

STEPS: dict[str, list[float]] = defaultdict(list)


def timed(owner: Any, name: str, label: str) -> None:
    """Wrap ``owner.name`` to add its duration (ms) to ``STEPS[label]``."""
    raw = inspect.getattr_static(owner, name)
    fn = raw.__func__ if isinstance(raw, staticmethod) else getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            STEPS[label].append((time.perf_counter() - started) * 1000)

    setattr(owner, name, staticmethod(wrapper) if isinstance(raw, staticmethod) else wrapper)


def per_batch(df: Any) -> dict[str, Any]:
    from pyspark.sql import functions as F

    return {"totals": df.groupBy("k").agg(F.sum("v").alias("v"))}


def run(spark: Any, dsn: str, protocol: str, args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix=f"bench-pg-small-{protocol}-"))
    (work / "in").mkdir()
    n = 0

    def put() -> None:
        nonlocal n
        keys = [f"k{(n * args.rows + j) % 30}" for j in range(args.rows)]
        pq.write_table(pa.table({"k": keys, "v": list(range(args.rows))}), work / "in" / f"{n:06d}.parquet")
        n += 1

    done: list[dict[str, Any]] = []
    committed = threading.Event()

    def on_batch(m: dict[str, Any]) -> None:
        done.append(m)
        committed.set()

    put()
    src = (spark.readStream.schema("k string, v long").option("maxFilesPerTrigger", 1)
           .parquet(str(work / "in")))
    sink = onceflow.postgres(dsn, sink_id=f"small_{protocol}", protocol=protocol)
    query = onceflow.write_stream(src, sink=sink, checkpoint=str(work / "ck"),
                                  tables={"totals": Table(key=["k"], add=["v"])}, per_batch=per_batch,
                                  trigger="0 seconds", on_batch=on_batch)
    try:
        for i in range(args.warmup + args.batches):
            if not committed.wait(120):
                raise SystemExit(f"{protocol}: no batch committed in 120 s")
            committed.clear()
            if i == args.warmup:
                STEPS.clear()
                done.clear()
            put()
        committed.wait(120)
    finally:
        query.stop()
        sink.close()
        shutil.rmtree(work, ignore_errors=True)
    batches = [m["seconds"] * 1000 for m in done if m["input_rows"]]
    print(f"{protocol}: {len(batches)} batches of {args.rows} rows: median "
          f"{statistics.median(batches):.0f} ms per batch; steps (median ms): "
          + ", ".join(f"{k} {statistics.median(v):.0f}" for k, v in STEPS.items() if v), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--protocols", default="driver,staged,2pc")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--rows", type=int, default=40)
    args = ap.parse_args()
    dsn, server = os.environ.get("ONCEFLOW_PG_DSN"), None
    if not dsn:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
        from tests.pg_server import TempPostgres

        server = TempPostgres()
        dsn = server.start()
    timed(batch_mod.BatchWriter, "_prepare", "prepare")
    timed(batch_mod.BatchWriter, "_materialize", "materialize")
    timed(batch_mod.BatchWriter, "_commit", "commit")
    timed(pg_sink.PostgresFramesSink, "_check", "key check")
    timed(datasource, "write_frame", "executors' write + commit")
    timed(pg_sink.PostgresFramesSink, "_summarize", "summary row")
    spark = session()
    try:
        for protocol in [p for p in args.protocols.split(",") if p]:
            run(spark, dsn, protocol, args)
    finally:
        spark.stop()
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()

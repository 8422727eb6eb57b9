"""The Delta sink's append (with its app-transaction marker and check) vs a plain write_deltalake append.

Per run, in the same process: ``--batches`` batches of ``--rows`` rows appended to a fresh Delta
table, once with ``write_deltalake(path, batch, mode="append")`` (no marker, not exactly once) and
once through ``DeltaTablesSink.commit_tables`` (batch checked, snapshot loaded,
``transaction_version`` checked, commit with the app transaction and metrics). Prints both times
and the ratio plain / onceflow (target >= 0.9).

Usage: python benchmarks/bench_delta_sink.py [--rows 200000] [--batches 20] [--repeat 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.delta.sink import DeltaTablesSink


def batch(rows: int, b: int) -> pa.Table:
    rng = random.Random(b)
    return pa.table({"payment_id": [f"p{b}-{i}" for i in range(rows)],
                     "account": [f"acct-{rng.randrange(1000):04d}" for _ in range(rows)],
                     "amount_cents": pa.array([rng.randrange(1, 100_000) for _ in range(rows)], pa.int64())})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=200_000)
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    batches = [batch(args.rows, b) for b in range(args.batches)]
    ratios = []
    for r in range(args.repeat):
        work = Path(tempfile.mkdtemp(prefix="onceflow-bench-delta-"))
        started = time.perf_counter()
        for t in batches:
            write_deltalake(str(work / "plain"), t, mode="append")
        plain = time.perf_counter() - started
        sink = DeltaTablesSink(work / "onceflow")
        spec = {"payments": Table()}
        started = time.perf_counter()
        for i, t in enumerate(batches):
            sink.commit_tables(i, {"payments": t}, spec, BatchStats(t.num_rows, 0, 0), t.num_rows)
        ours = time.perf_counter() - started
        n = DeltaTable(str(work / "onceflow" / "payments")).to_pyarrow_table().num_rows
        assert n == DeltaTable(str(work / "plain")).to_pyarrow_table().num_rows == args.rows * args.batches
        ratios.append(plain / ours)
        total = args.rows * args.batches
        print(f"run {r + 1}: plain write_deltalake {plain:.2f} s ({total / plain:,.0f} rows/s)   onceflow "
              f"{ours:.2f} s ({total / ours:,.0f} rows/s)   ratio plain/onceflow {plain / ours:.3f}")
    print(f"median ratio: {statistics.median(ratios):.3f} (target >= 0.9)")


if __name__ == "__main__":
    import os
    import sys

    main()
    sys.stdout.flush()
    os._exit(0)  # delta-rs may abort the interpreter at shutdown (delta-io/delta-rs#2184)

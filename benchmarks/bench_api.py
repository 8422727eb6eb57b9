"""The public API's cost: the payments pipeline through onceflow.write_stream vs the same plan by hand.

One Spark session, one input (``--payments`` payments in files of 5,000, 5% producer retries),
three drains with ``availableNow`` and ``maxFilesPerTrigger`` (fresh checkpoint each), in an
alternating order over ``--rounds``:

* ``noop``: the same deduplicated stream, ``foreachBatch`` computing the same two outputs and
  writing them to Spark's ``noop`` format (the plan's cost, no sink);
* ``by_hand``: the at-least-once ``foreachBatch`` people write: the outputs collected to Arrow
  and upserted/inserted into SQLite with ``executemany``, one transaction, no marker;
* ``onceflow``: ``onceflow.write_stream`` with the generic SQLite sink (batch persisted and counted,
  input rows and late drops counted from the checkpoint, checks, marker).

Prints the median seconds of each and the ratios noop/onceflow and by_hand/onceflow (> 1 means
onceflow is faster).

Usage: python benchmarks/bench_api.py [--payments 200000] [--rounds 3] [--files-per-batch 10]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import onceflow
from onceflow.examples import payments
from onceflow.runtime.session import session


def drain(spark: Any, source: Path, work: Path, variant: str, files: int) -> float:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    stream = (spark.readStream.schema(payments.SCHEMA).option("maxFilesPerTrigger", files)
              .parquet(str(source)))
    clean = onceflow.deduplicate(stream, id="payment_id", event_time="ts", within="10 minutes")
    started = time.perf_counter()
    if variant == "onceflow":
        onceflow.write_stream(clean, onceflow.sqlite(work / "app.db"), work / "ck", payments.TABLES,
                              per_batch=payments.per_batch, once=True).awaitTermination()
        return time.perf_counter() - started

    conn = sqlite3.connect(work / "hand.db", isolation_level=None, check_same_thread=False) \
        if variant == "by_hand" else None
    if conn is not None:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("CREATE TABLE revenue(account TEXT, window_start TEXT, amount_cents INTEGER, "
                     "payments INTEGER, PRIMARY KEY(account, window_start))")
        conn.execute("CREATE TABLE payments(payment_id TEXT, account TEXT, amount_cents INTEGER, "
                     "ts TEXT)")

    def write(batch: Any, batch_id: int) -> None:
        outs = payments.per_batch(batch)
        if conn is None:
            for frame in outs.values():
                frame.write.format("noop").mode("overwrite").save()
            return
        rev = outs["revenue"].toArrow().to_pylist()
        pays = outs["payments"].toArrow().to_pylist()
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO revenue VALUES (?, ?, ?, ?) ON CONFLICT(account, window_start) "
                         "DO UPDATE SET amount_cents = amount_cents + excluded.amount_cents, "
                         "payments = payments + excluded.payments",
                         [(r["account"], str(r["window_start"]), r["amount_cents"], r["payments"])
                          for r in rev])
        conn.executemany("INSERT INTO payments VALUES (?, ?, ?, ?)",
                         [(r["payment_id"], r["account"], r["amount_cents"], str(r["ts"])) for r in pays])
        conn.execute("COMMIT")

    q = (clean.writeStream.foreachBatch(write).option("checkpointLocation", str(work / "ck"))
         .trigger(availableNow=True).start())
    q.awaitTermination()
    took = time.perf_counter() - started
    if conn is not None:
        conn.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--payments", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--files-per-batch", type=int, default=10)
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="onceflow-bench-api-"))
    payments.generate(root / "in", args.payments, per_file=5_000)
    spark = session(app_name="bench-api", conf={"spark.sql.session.timeZone": "UTC"})
    spark.sparkContext.setLogLevel("ERROR")
    drain(spark, root / "in", root / "warm", "onceflow", args.files_per_batch)  # JIT and caches
    times: dict[str, list[float]] = {"noop": [], "by_hand": [], "onceflow": []}
    order = list(times)
    for r in range(args.rounds):
        for variant in order if r % 2 == 0 else reversed(order):
            times[variant].append(drain(spark, root / "in", root / variant, variant, args.files_per_batch))
        print(f"round {r + 1}: " + ", ".join(f"{v} {t[-1]:.2f} s" for v, t in times.items()), flush=True)
    med = {v: statistics.median(t) for v, t in times.items()}
    n = args.payments
    print("median: " + ", ".join(f"{v} {m:.2f} s ({n / m:,.0f} payments/s)" for v, m in med.items()))
    print(f"ratios: noop/onceflow {med['noop'] / med['onceflow']:.3f}, "
          f"by_hand/onceflow {med['by_hand'] / med['onceflow']:.3f}")
    spark.stop()


if __name__ == "__main__":
    main()
    os._exit(0)

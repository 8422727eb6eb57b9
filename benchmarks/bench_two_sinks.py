"""One query into two sinks beside the same work as two queries (``write_stream(df, {table: sink})``).

Input: ``--rows`` orders as JSON lines (an order id, a customer, cents, a time; a twentieth resent
with the same id) in ``--files`` files, made once per size. The pipeline reads the JSON, drops
the resent orders (``onceflow.deduplicate``, 20 minutes), and writes each order to an Iceberg
append table (raw orders, a lake) and each customer's count and cents to a SQLite table (merged
by ``add``). In one Spark session (``local[2]``, onceflow's defaults), each round runs, in
alternating order, over fresh sinks and checkpoints, the whole input as one backlog batch
(``once=True``):

* ``one query``: ``write_stream(df, {"orders": iceberg, "customers": sqlite})``;
* ``two queries``: ``write_stream(df, iceberg)`` for the orders, then ``write_stream(df, sqlite)``
  for the customers — each reads and deduplicates the input itself (two checkpoints).

Prints each variant's seconds per round, checks the rows in both sinks (the orders once each,
the customers' sums equal to a pyarrow fold of the input), and the throughput ratio
two queries / one query (target >= 1.6).

Usage: python benchmarks/bench_two_sinks.py [--rows 2000000] [--files 8] [--rounds 4]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

SCHEMA = "order_id STRING, customer STRING, cents LONG, ts TIMESTAMP"


def make_input(folder: Path, rows: int, files: int) -> dict[str, tuple[int, int]]:
    """The JSON lines files (kept between runs of one size); each customer's (cents, orders), once each."""
    want: dict[str, tuple[int, int]] = {}
    seen: set[int] = set()
    done = folder / "_DONE"
    for f in range(files):
        lines = []
        for i in range(f * rows // files, (f + 1) * rows // files):
            n = i - 7 if i % 20 == 19 else i  # a resend of an order 7 before
            customer, cents = f"c{n % 5003}", (n * 7919) % 100_000
            if n not in seen:
                seen.add(n)
                total, count = want.get(customer, (0, 0))
                want[customer] = (total + cents, count + 1)
            at = f"2026-05-01T{(n // 3600) % 24:02d}:{(n // 60) % 60:02d}:{n % 60:02d}"
            lines.append(json.dumps({"order_id": f"o{n}", "customer": customer, "cents": cents, "ts": at}))
        if not done.exists():
            folder.mkdir(parents=True, exist_ok=True)
            (folder / f"part-{f:03d}.json").write_text("\n".join(lines) + "\n")
    done.touch()
    return want


def main() -> None:
    """Run the rounds and print the times and the ratio."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    from pyspark.sql import functions as F

    import onceflow
    from onceflow.runtime.session import session

    source = Path(tempfile.gettempdir()) / f"onceflow-two-sinks-{args.rows}-{args.files}"
    want = make_input(source, args.rows, args.files)
    spark = session(app_name="bench-two-sinks")
    tables = {"orders": onceflow.Table(), "customers": onceflow.Table(key="customer", add=["cents", "n"])}

    def orders(folder: Path) -> Any:
        raw = spark.readStream.schema(SCHEMA).json(str(folder))
        return onceflow.deduplicate(raw, "order_id", "ts", within="20 minutes")

    def per_customer(df: Any) -> Any:
        return df.groupBy("customer").agg(F.sum("cents").alias("cents"), F.count("*").alias("n"))

    def run(variant: str, work: Path, folder: Path) -> None:
        lake = onceflow.iceberg(f"sqlite:///{work / 'catalog.db'}", work / "wh")
        db = onceflow.sqlite(work / "customers.db")
        if variant == "one query":
            onceflow.write_stream(orders(folder), {"orders": lake, "customers": db}, work / "ck", tables,
                                  lambda df: {"orders": df, "customers": per_customer(df)},
                                  once=True).awaitTermination()
        else:
            onceflow.write_stream(orders(folder), lake, work / "ck-orders", {"orders": tables["orders"]},
                                  once=True).awaitTermination()
            customers = {"customers": tables["customers"]}
            onceflow.write_stream(orders(folder), db, work / "ck-customers", customers, per_customer,
                                  once=True).awaitTermination()
        db.close()

    def check(work: Path) -> None:
        from pyiceberg.catalog.sql import SqlCatalog

        lake = SqlCatalog("onceflow", uri=f"sqlite:///{work / 'catalog.db'}",
                          warehouse=(work / "wh").as_uri())
        stored = lake.load_table(("onceflow", "orders")).scan(selected_fields=("order_id",)).to_arrow()
        ids = stored.column("order_id")
        once = sum(n for _, n in want.values())
        assert stored.num_rows == len(ids.unique()) == once, "the orders are not there once each"
        with sqlite3.connect(work / "customers.db") as conn:
            got = {c: (s, n) for c, s, n in conn.execute("SELECT customer, cents, n FROM customers")}
        assert got == want, "the customers' sums differ from the input's"

    times: dict[str, list[float]] = {"one query": [], "two queries": []}
    order = list(times)
    warm = Path(tempfile.gettempdir()) / "onceflow-two-sinks-warm-up"
    make_input(warm, 20_000, 2)
    for variant in order:  # not timed: the JVM's and the Python workers' first runs
        work = Path(tempfile.mkdtemp(prefix="onceflow-bench-two-"))
        run(variant, work, warm)
        shutil.rmtree(work, ignore_errors=True)
    for r in range(args.rounds):
        for variant in order if r % 2 == 0 else order[::-1]:
            work = Path(tempfile.mkdtemp(prefix="onceflow-bench-two-"))
            started = time.perf_counter()
            run(variant, work, source)
            times[variant].append(time.perf_counter() - started)
            check(work)  # not timed
            print(f"round {r} {variant:12s} {times[variant][-1]:7.2f} s (checked)", flush=True)
            shutil.rmtree(work, ignore_errors=True)
    best = {v: statistics.median(t) for v, t in times.items()}
    print(f"median: {', '.join(f'{v} {t:.2f} s' for v, t in best.items())}")
    ratio = best["two queries"] / best["one query"]
    print(f"ratio two queries / one query (throughput, >= 1.6): {ratio:.2f}")
    spark.stop()


if __name__ == "__main__":
    main()

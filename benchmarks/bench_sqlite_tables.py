"""The generic SQLite sink's add/upsert vs a hand-written executemany upsert of the same rows.

Per run: a table gets ``--rows`` rows in a first batch (all new keys), then a second batch of
``--rows`` rows of which half update existing keys and half are new — the steady state of
per-window deltas. Baseline, in the same process: what people write by hand in
``foreachBatch`` — ``CREATE TABLE ... PRIMARY KEY``, then ``executemany`` of an
``INSERT ... ON CONFLICT DO UPDATE`` over ``df.toPandas().itertuples()`` rows, one transaction
per batch (no marker). onceflow: ``SQLiteTablesSink.commit_tables`` with the same rows
(checked, key-ordered, marker in the same transaction). Both on WAL + ``synchronous=FULL``.
Prints each time and the ratio baseline / onceflow (> 1: onceflow faster).

Usage: python benchmarks/bench_sqlite_tables.py [--rows 1000000] [--mode add|upsert] [--repeat 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.sqlite.sink import SQLiteTablesSink

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def batch(rows: int, offset: int, seed: int) -> pa.Table:
    rng = random.Random(seed)
    keys = list(range(offset, offset + rows))
    rng.shuffle(keys)  # Spark's groupBy output comes in hash order, not key order
    return pa.table({
        "account": [f"acct-{k // 288:06d}" for k in keys],
        "window_start": pa.array([T0 + dt.timedelta(minutes=5 * (k % 288)) for k in keys],
                                 pa.timestamp("us", tz="UTC")),
        "amount_cents": pa.array([rng.randrange(1, 100_000) for _ in keys], pa.int64()),
        "payments": pa.array([rng.randrange(1, 20) for _ in keys], pa.int64()),
    })


def hand_written(db: Path, batches: list[pa.Table], mode: str, rows_from: str = "pandas") -> float:
    """``rows_from``: ``pandas`` (``toPandas().itertuples()``) or ``arrow`` (column lists, as onceflow)."""
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE revenue(account TEXT, window_start TEXT, amount_cents INTEGER, "
                 "payments INTEGER, PRIMARY KEY(account, window_start))")
    op = "amount_cents + excluded.amount_cents" if mode == "add" else "excluded.amount_cents"
    op2 = "payments + excluded.payments" if mode == "add" else "excluded.payments"
    sql = ("INSERT INTO revenue VALUES (?, ?, ?, ?) ON CONFLICT(account, window_start) DO UPDATE SET "
           f"amount_cents = {op}, payments = {op2}")
    started = time.perf_counter()
    for b in batches:
        if rows_from == "pandas":
            pdf = b.to_pandas()
            pdf["window_start"] = pdf["window_start"].dt.strftime("%Y-%m-%d %H:%M:%S.%f")
            rows = pdf.itertuples(index=False)
        else:
            import pyarrow.compute as pc

            cols = [b.column(0).to_pylist(), pc.strftime(b.column(1), format="%Y-%m-%d %H:%M:%S").to_pylist(),
                    b.column(2).to_pylist(), b.column(3).to_pylist()]
            rows = zip(*cols, strict=True)
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(sql, rows)
        conn.execute("COMMIT")
    took = time.perf_counter() - started
    conn.close()
    return took


def onceflow_sink(db: Path, batches: list[pa.Table], mode: str) -> float:
    sink = SQLiteTablesSink(db)
    sink.bind("bench")
    spec = {"revenue": Table(key=["account", "window_start"], add=["amount_cents", "payments"])
            if mode == "add" else Table(key=["account", "window_start"])}
    started = time.perf_counter()
    for i, b in enumerate(batches):
        sink.commit_tables(i, {"revenue": b}, spec, BatchStats(b.num_rows, 0, 0), b.num_rows)
    sink.flush()  # a staged batch counts until it is in the table
    took = time.perf_counter() - started
    sink.close()
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--mode", choices=["add", "upsert"], default="add")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    batches = [batch(args.rows, 0, 1), batch(args.rows, args.rows // 2, 2)]
    ratios: list[float] = []
    lean_ratios: list[float] = []
    for r in range(args.repeat):
        work = Path(tempfile.mkdtemp(prefix="onceflow-bench-tables-"))
        base = hand_written(work / "hand.db", batches, args.mode)
        lean = hand_written(work / "lean.db", batches, args.mode, rows_from="arrow")
        ours = onceflow_sink(work / "onceflow.db", batches, args.mode)
        q = "SELECT count(*), sum(amount_cents), sum(payments) FROM revenue"
        answers = set()
        for name in ("hand.db", "lean.db", "onceflow.db"):
            with sqlite3.connect(work / name) as c:
                answers.add(c.execute(q).fetchone())
        assert len(answers) == 1, f"the three wrote different tables: {answers}"
        ratios.append(base / ours)
        lean_ratios.append(lean / ours)
        rows = sum(b.num_rows for b in batches)
        print(f"run {r + 1}: hand-written executemany (pandas rows) {base:.2f} s "
              f"({rows / base:,.0f} rows/s); "
              f"same from Arrow columns {lean:.2f} s; onceflow {args.mode} {ours:.2f} s "
              f"({rows / ours:,.0f} rows/s); ratios {base / ours:.2f} / {lean / ours:.2f}")
    print(f"median ratio hand-written / onceflow: {statistics.median(ratios):.2f} (target >= 1.5); "
          f"with the hand-written rows built from Arrow columns: {statistics.median(lean_ratios):.2f}")


if __name__ == "__main__":
    main()

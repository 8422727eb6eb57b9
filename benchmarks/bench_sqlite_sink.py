"""SQLite sink commit cost: ``SQLiteSink.commit_batch`` vs a plain upsert of the same deltas.

Both apply the same sequence of per-(user, minute) delta batches (shaped like Example 5-1's
1M-event micro-batches: every user active in every minute, windows advancing, rows in the
hash order Spark hands them over) to a fresh database, one transaction per batch, WAL and
``synchronous=FULL``:

* ``plain``    — the table as the fixed schema spells it (rowid table + key index),
                 ``executemany`` upserts in arrival order, no marker (what a hand-written
                 ``foreachBatch`` does);
* ``onceflow`` — ``SQLiteSink(staged=False).commit_batch``: marker check, key-ordered upserts
                 into the ``WITHOUT ROWID`` table, global sums, marker row (the apply step);
* ``staged``   — what a Spark batch waits for with the default staged sink: the staging
                 transaction only (each batch's apply runs after the timed call, untimed).

Usage: python benchmarks/bench_sqlite_sink.py [--batches 7] [--users 1000] [--minutes 20] [--rounds 5]
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from onceflow.sinks.base import DELTA_COLUMNS, BatchStats
from onceflow.sinks.sqlite import SQLiteSink, read_counts

PLAIN_SCHEMA = ("CREATE TABLE user_counts(user TEXT, window_start_ms INTEGER, "
                "window_end_ms INTEGER, count INTEGER, PRIMARY KEY(user, window_start_ms))")
PLAIN_UPSERT = ("INSERT INTO user_counts VALUES (?,?,?,?) ON CONFLICT(user, window_start_ms) "
                "DO UPDATE SET count = count + excluded.count")


def make_batches(batches: int, users: int, minutes: int, seed: int = 1) -> list[pa.Table]:
    rng = random.Random(seed)
    out = []
    for b in range(batches):
        first = max(0, b * minutes - 1)  # one window carried over from the previous batch
        rows = [(f"user-{u:05d}", m * 60_000, (m + 1) * 60_000, rng.randint(1, 100))
                for u in range(users) for m in range(first, (b + 1) * minutes)]
        rng.shuffle(rows)
        out.append(pa.table({c: [r[i] for r in rows] for i, c in enumerate(DELTA_COLUMNS)}))
    return out


def run_plain(path: Path, batches: list[pa.Table]) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(PLAIN_SCHEMA)
    t0 = time.perf_counter()
    for b in batches:
        rows = list(zip(*(b.column(c).to_pylist() for c in DELTA_COLUMNS), strict=True))
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(PLAIN_UPSERT, rows)
        conn.execute("COMMIT")
    secs = time.perf_counter() - t0
    conn.close()
    return secs


def run_onceflow(path: Path, batches: list[pa.Table]) -> float:
    sink = SQLiteSink(path, staged=False)
    sink.bind("bench")
    t0 = time.perf_counter()
    for i, b in enumerate(batches):
        sink.commit_batch(i, b, BatchStats(0, 0, 0))
    secs = time.perf_counter() - t0
    sink.close()
    return secs


def run_staged(path: Path, batches: list[pa.Table]) -> float:
    sink = SQLiteSink(path)
    sink.bind("bench")
    secs = 0.0
    for i, b in enumerate(batches):
        t0 = time.perf_counter()
        sink.commit_batch(i, b, BatchStats(0, 0, 0))
        secs += time.perf_counter() - t0
        sink.flush()  # the apply: in a pipeline it runs beside Spark's next batch
    sink.close()
    return secs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", type=int, default=7)
    ap.add_argument("--users", type=int, default=1000)
    ap.add_argument("--minutes", type=int, default=20, help="new minutes per batch")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    batches = make_batches(args.batches, args.users, args.minutes)
    rows = sum(b.num_rows for b in batches)
    print(f"{args.batches} batches, {rows:,} delta rows ({rows // args.batches:,} a batch)")
    times: dict[str, list[float]] = {"plain": [], "onceflow": [], "staged": []}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds + 1):  # round 0 warms the page cache and is discarded
            order = [("plain", run_plain), ("onceflow", run_onceflow), ("staged", run_staged)]
            for name, fn in order if r % 2 else order[::-1]:
                path = Path(tmp) / f"{name}-{r}.sqlite"
                secs = fn(path, batches)
                if name != "plain":
                    users, _ = read_counts(path)
                    assert len(users) == len({(u, w) for b in batches for u, w in zip(
                        b.column("user").to_pylist(), b.column("window_start_ms").to_pylist(),
                        strict=True)}), f"{name} sink lost rows"
                if r:
                    times[name].append(secs)
                    print(f"round {r} {name:9s} {secs:6.3f} s  {rows / secs:10,.0f} rows/s")
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"median: plain {med['plain']:.3f} s, onceflow {med['onceflow']:.3f} s "
          f"({med['onceflow'] / args.batches * 1000:.0f} ms a batch)")
    print(f"ratio plain/onceflow = {med['plain'] / med['onceflow']:.2f}  (> 1: onceflow's commit, "
          "marker and global sums included, is faster)")
    print(f"staged: a batch waits {med['staged'] / args.batches * 1000:.1f} ms for the sink "
          f"({med['onceflow'] / med['staged']:.0f}x less than applying inside the batch)")


if __name__ == "__main__":
    main()

"""SQLite page sizes for the tasks path: a scratch file's fill and its copy into the database.

What :mod:`onceflow.sinks.sqlite.tasks` and the sink's T4 do, in one process and without Spark,
on ``--rows`` rows of the backlog benchmark's schema (an id, an account, an amount, a timestamp,
a note): fill a scratch file the way a task does (Arrow's SQLite driver, no journal) with each
scratch page size, then copy it into a WAL database (``synchronous=FULL``, one transaction,
``INSERT INTO t SELECT * FROM rows``: SQLite's record-by-record transfer) of each database page
size. Each measurement ``--repeat`` times; prints the times.

Usage: python benchmarks/bench_sqlite_pages.py [--rows 2000000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import datetime as dt
import sqlite3
import tempfile
import time
from pathlib import Path

import pyarrow as pa

from onceflow.sinks._core.tables import Table
from onceflow.sinks.sqlite.tasks import _Scratch
from onceflow.sinks.sqlite.values import ddl, stored_array

SIZES = (4096, 16384, 65536)


def rows(n: int) -> pa.Table:
    """``n`` rows of ~108 bytes, the values as the sink stores them."""
    ids = pa.array(range(n), pa.int64())
    start = dt.datetime(2026, 1, 1)
    raw = pa.table({"id": ids, "account": pa.array([f"acct-{i % 9973:06d}" for i in range(n)]),
                    "amount_cents": pa.array([i * 37 % 100_000 for i in range(n)], pa.int64()),
                    "at": pa.array([start + dt.timedelta(seconds=i) for i in range(n)], pa.timestamp("us")),
                    "note": pa.array([f"payment {i} of a backlog batch, some text" for i in range(n)])})
    return pa.table([stored_array(raw.column(c)) for c in raw.column_names], names=raw.column_names)


def fill(path: Path, table: pa.Table, page_size: int) -> float:
    """Seconds to fill a scratch file of ``page_size`` pages (the tasks' way)."""
    path.unlink(missing_ok=True)
    started = time.perf_counter()
    scratch = _Scratch(path, table.schema, page_size)
    for batch in table.to_batches(10_000):  # Spark's Arrow batches
        scratch.add(pa.Table.from_batches([batch]))
    scratch.commit()
    scratch.close()
    return time.perf_counter() - started


def copy(db: Path, scratch: Path, schema: pa.Schema, page_size: int) -> float:
    """Seconds to copy ``scratch`` into a new database of ``page_size`` pages (T4's way)."""
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute(f"PRAGMA page_size={page_size}")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("PRAGMA wal_autocheckpoint=0")
    conn.execute(ddl("t", Table(), schema))
    started = time.perf_counter()
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("ATTACH DATABASE ? AS s", (str(scratch),))
    conn.execute("INSERT INTO main.t SELECT * FROM s.rows")
    conn.execute("COMMIT")
    took = time.perf_counter() - started
    conn.execute("DETACH DATABASE s")
    conn.close()
    return took


def main() -> None:
    """Run every scratch and database page size; print the seconds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=2)
    args = parser.parse_args()
    table = rows(args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        for scratch_size in SIZES:
            scratch = Path(tmp) / f"scratch-{scratch_size}.db"
            fills = [fill(scratch, table, scratch_size) for _ in range(args.repeat)]
            print(f"scratch pages {scratch_size:>6}: fill {', '.join(f'{s:.2f}' for s in fills)} s")
            for db_size in SIZES:
                db = Path(tmp) / "app.db"
                copies = [copy(db, scratch, table.schema, db_size) for _ in range(args.repeat)]
                print(f"    copy into database pages {db_size:>6}: {', '.join(f'{s:.2f}' for s in copies)} s")


if __name__ == "__main__":
    main()

"""Payments, exactly once: per-account revenue per 5-minute window, from Parquet files.

The pipeline a data engineer would write, on onceflow's public API. Payments arrive as
Parquet files in a directory (``payment_id, account, amount_cents, ts``); a producer that
retries sends some payments twice. Each micro-batch adds its per-(account, window) sums to
``revenue`` and appends its payments to ``payments``, both exactly once::

    python -m onceflow.examples.payments generate --out payments/ --payments 20000
    python -m onceflow.examples.payments run --input payments/ --db app.db --checkpoint ck/ --once

Kill it (``kill -9``) at any moment and run it again with the same ``--db`` and
``--checkpoint``: the tables end up exactly as if it had never stopped. Amounts are integer
cents, so sums are exact whatever order batches add them in.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

import onceflow
from onceflow import Table

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

SCHEMA = "payment_id STRING, account STRING, amount_cents BIGINT, ts TIMESTAMP"
TABLES = {
    "revenue": Table(key=["account", "window_start"], add=["amount_cents", "payments"]),
    "payments": Table(),  # append: every payment once
}
START = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)


def revenue(batch: DataFrame) -> DataFrame:
    """Per-account sums of one batch's payments per 5-minute event-time window."""
    from pyspark.sql import functions as F

    return (batch.groupBy("account", F.window("ts", "5 minutes").start.alias("window_start"))
            .agg(F.sum("amount_cents").alias("amount_cents"), F.count(F.lit(1)).alias("payments")))


def per_batch(batch: DataFrame) -> dict[str, DataFrame]:
    """What one micro-batch writes: its revenue deltas and its payments."""
    return {"revenue": revenue(batch), "payments": batch}


def start(spark: SparkSession, source: str | Path, db: str | Path, checkpoint: str | Path,
          once: bool = False, max_files_per_trigger: int | None = None,
          sink: Any = None) -> onceflow.OnceQuery:
    """Start the pipeline (a few lines of PySpark plus two onceflow calls); ``sink`` overrides ``db``."""
    reader = spark.readStream.schema(SCHEMA)
    if max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", max_files_per_trigger)
    payments = reader.parquet(str(source))
    clean = onceflow.deduplicate(payments, id="payment_id", event_time="ts", within="10 minutes")
    return onceflow.write_stream(clean, sink=sink or onceflow.sqlite(db), checkpoint=checkpoint,
                                 tables=TABLES, per_batch=per_batch, once=once,
                                 on_batch=lambda b: print(f"batch {b['batch_id']}: "
                                                          f"{'committed' if b['committed'] else 'replayed'}, "
                                                          f"{b['rows_out']} payments", flush=True))


def build(spark: SparkSession, input: str, sink: Any, checkpoint: str, once: bool) -> onceflow.OnceQuery:  # noqa: A002
    """The pipeline as ``onceflow verify --pipeline .../payments.py:build`` calls it (two files a batch)."""
    return start(spark, input, "", checkpoint, once=once, max_files_per_trigger=2, sink=sink)


def generate(out: Path, payments: int, accounts: int = 50, duplicates: float = 0.05, per_file: int = 1000,
             seed: int = 0, first: int = 0) -> list[Path]:
    """Write payment files as a producer would: ids unique, some payments sent twice.

    Files are written atomically (hidden name, then rename) in time order; a retried
    payment is the same row again, in the same or the next file.

    Args:
        out: The directory the pipeline reads.
        payments: Distinct payments.
        accounts: Accounts they belong to.
        duplicates: Share of payments sent twice.
        per_file: Rows per file.
        seed: Random seed (same seed, same rows).
        first: Number of the first payment (to add more files later).

    Returns:
        The files written.
    """
    rng = random.Random(seed * 1_000_003 + first)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in range(first, first + payments):
        row = (f"pay-{seed}-{n}", f"acct-{rng.randrange(accounts):03d}", rng.randrange(1, 100_000),
               START + dt.timedelta(milliseconds=250 * n + rng.randrange(5_000)))
        rows.append(row)
        if rng.random() < duplicates:
            rows.append(row)  # the producer's retry
    files: list[Path] = []
    existing = len(list(out.glob("part-*.parquet")))
    for i in range(0, len(rows), per_file):
        chunk = rows[i:i + per_file]
        table = pa.table({"payment_id": [r[0] for r in chunk], "account": [r[1] for r in chunk],
                          "amount_cents": pa.array([r[2] for r in chunk], pa.int64()),
                          "ts": pa.array([r[3] for r in chunk], pa.timestamp("us", tz="UTC"))})
        path = out / f"part-{existing + len(files):06d}.parquet"
        tmp = out / f".{path.name}.tmp"
        pq.write_table(table, tmp)
        os.replace(tmp, path)
        files.append(path)
    return files


def main(argv: list[str] | None = None) -> None:
    """``generate`` payment files, or ``run`` the pipeline."""
    ap = argparse.ArgumentParser(prog="python -m onceflow.examples.payments",
                                 description="Payments, exactly once (see the module docstring).")
    sub = ap.add_subparsers(dest="command", required=True)
    gen = sub.add_parser("generate", help="write payment files")
    gen.add_argument("--out", type=Path, required=True)
    gen.add_argument("--payments", type=int, default=20_000)
    gen.add_argument("--seed", type=int, default=0)
    gen.add_argument("--first", type=int, default=0, help="number of the first payment (to add files)")
    run = sub.add_parser("run", help="run the pipeline")
    run.add_argument("--input", type=Path, required=True)
    run.add_argument("--db", type=Path, required=True)
    run.add_argument("--checkpoint", type=Path, required=True)
    run.add_argument("--once", action="store_true", help="process what is there, then stop")
    run.add_argument("--max-files-per-trigger", type=int, default=None)
    args = ap.parse_args(argv)
    if args.command == "generate":
        files = generate(args.out, args.payments, seed=args.seed, first=args.first)
        print(f"wrote {len(files)} files to {args.out}")
        return
    from onceflow.runtime.session import session

    spark = session(app_name="payments")
    start(spark, args.input, args.db, args.checkpoint, once=args.once,
          max_files_per_trigger=args.max_files_per_trigger).awaitTermination()


if __name__ == "__main__":
    try:
        main()
    except onceflow.OnceflowError as exc:
        raise SystemExit(f"onceflow: error: {exc}") from None

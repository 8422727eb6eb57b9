"""The payments example's expected tables, recomputed with a plain Spark batch job.

Written independently of the example: its own window arithmetic (epoch seconds floored to
300), no onceflow code.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any


def expected(spark: Any, source: Path) -> tuple[dict[tuple[str, str], tuple[int, int]], dict[str, int]]:
    """``{(account, window_start): (amount_cents, payments)}`` and ``{payment_id: amount_cents}``."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(source)).dropDuplicates(["payment_id"])
    floored = F.timestamp_seconds(F.floor(F.unix_seconds("ts") / 300) * 300)
    start = F.date_format(floored, "yyyy-MM-dd HH:mm:ss")
    rev = {(r[0], r[1] + ".000000"): (int(r[2]), int(r[3])) for r in
           df.groupBy("account", start.alias("w")).agg(F.sum("amount_cents"), F.count(F.lit(1))).collect()}
    pays = {r[0]: int(r[1]) for r in df.select("payment_id", "amount_cents").collect()}
    return rev, pays


def actual(db: Path) -> tuple[dict[tuple[str, str], tuple[int, int]], dict[str, int], int]:
    """The tables the pipeline wrote, and how many rows ``payments`` has (duplicates included)."""
    with sqlite3.connect(db) as c:
        rev = {(a, w): (int(s), int(n)) for a, w, s, n in
               c.execute("SELECT account, window_start, amount_cents, payments FROM revenue")}
        rows = c.execute("SELECT payment_id, amount_cents FROM payments").fetchall()
    return rev, {p: int(a) for p, a in rows}, len(rows)

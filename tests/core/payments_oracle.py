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


Revenue = dict[tuple[str, str], tuple[int, int]]


def actual(db: Path, dsn: str | None = None) -> tuple[Revenue, dict[str, int], int]:
    """The tables the pipeline wrote (SQLite, or PostgreSQL with ``dsn``).

    Returns:
        Revenue, payments, and how many rows ``payments`` has (duplicates included).
    """
    if (db / "revenue" / "_delta_log").is_dir():  # the Delta sink's root
        from deltalake import DeltaTable

        r = DeltaTable(str(db / "revenue")).to_pyarrow_table()
        starts = [w.strftime("%Y-%m-%d %H:%M:%S.%f") for w in r.column("window_start").to_pylist()]
        rev_rows = list(zip(r.column("account").to_pylist(), starts, r.column("amount_cents").to_pylist(),
                            r.column("payments").to_pylist(), strict=True))
        p = DeltaTable(str(db / "payments")).to_pyarrow_table()
        rows = list(zip(p.column("payment_id").to_pylist(), p.column("amount_cents").to_pylist(),
                        strict=True))
    elif dsn is not None:
        import psycopg

        with psycopg.connect(dsn) as c:
            rev_rows = c.execute("SELECT account, to_char(window_start AT TIME ZONE 'UTC', "
                                 "'YYYY-MM-DD HH24:MI:SS.US'), amount_cents, payments "
                                 "FROM revenue").fetchall()
            rows = c.execute("SELECT payment_id, amount_cents FROM payments").fetchall()
    else:
        with sqlite3.connect(db) as c:
            rev_rows = c.execute("SELECT account, window_start, amount_cents, payments "
                                 "FROM revenue").fetchall()
            rows = c.execute("SELECT payment_id, amount_cents FROM payments").fetchall()
    rev = {(a, w): (int(s), int(n)) for a, w, s, n in rev_rows}
    return rev, {p: int(a) for p, a in rows}, len(rows)

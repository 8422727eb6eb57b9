"""A money-transfer pipeline written for the restore tests (not one of onceflow's examples).

Transfers arrive as Parquet files; some are sent twice (the same ``tx_id``, in one file or in a
later one). The query deduplicates by ``tx_id`` and writes, per batch, the transfers (upsert)
and each account's balance and transfer count (merged by ``add``): a stateful query with a table
that a batch written twice double-counts. :func:`expected` computes the answer from the input
files alone (pyarrow, no Spark, no onceflow); :func:`read_sink` reads what a sink holds.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import onceflow
from onceflow import Table

START = dt.datetime(2026, 5, 1)
SCHEMA = "tx_id STRING, account STRING, cents LONG, ts TIMESTAMP"
TABLES = {"transfers": Table(key=["tx_id"]), "balances": Table(key=["account"], add=["cents", "n"])}
PER_FILE = 300


def put(inputs: Path, k: int, seed: int = 5) -> Path:
    """Write input file ``k``: ``PER_FILE`` transfers, a tenth of them resent from this or the last file."""
    rng = random.Random(seed * 1000 + k)
    rows = []
    for i in range(PER_FILE):
        n = k * PER_FILE + i
        if rng.random() < 0.1 and n > 0:  # a resend: the same transfer again
            n = rng.randrange(max(0, n - PER_FILE), n)
        rows.append({"tx_id": f"t{n}", "account": f"a{n % 7}", "cents": (n * 37) % 1000 + 1,
                     "ts": START + dt.timedelta(seconds=n)})
    inputs.mkdir(parents=True, exist_ok=True)
    path = inputs / f"part-{k:04d}.parquet"
    tmp = inputs / f".part-{k:04d}.tmp"
    pq.write_table(pa.Table.from_pylist(rows), tmp)
    tmp.rename(path)
    return path


def start(spark: Any, inputs: Path, sink: Any, checkpoint: Path, **options: Any) -> Any:
    """The query: deduplicate by ``tx_id``, then the transfers and the balances per batch."""
    from pyspark.sql import functions as F

    source = spark.readStream.schema(SCHEMA).parquet(str(inputs))
    clean = onceflow.deduplicate(source, "tx_id", "ts", within="1 hour")

    def per_batch(df: Any) -> dict[str, Any]:
        return {"transfers": df.select("tx_id", "account", "cents"),
                "balances": df.groupBy("account").agg(F.sum("cents").alias("cents"), F.count("*").alias("n"))}

    options.setdefault("once", True)
    return onceflow.write_stream(clean, sink, checkpoint, tables=TABLES, per_batch=per_batch, **options)


def expected(inputs: Path) -> dict[str, Any]:
    """The answer from the input files: each transfer once, each account's sum and count."""
    transfers: dict[str, tuple[str, int]] = {}
    for path in sorted(inputs.glob("part-*.parquet")):
        for r in pq.read_table(path).to_pylist():
            transfers.setdefault(r["tx_id"], (r["account"], r["cents"]))
    balances: dict[str, tuple[int, int]] = {}
    for account, cents in transfers.values():
        total, n = balances.get(account, (0, 0))
        balances[account] = (total + cents, n + 1)
    return {"transfers": transfers, "balances": balances}


def read_sink(kind: str, location: str) -> dict[str, Any]:
    """What a SQLite (file), PostgreSQL (DSN), Delta (root), Iceberg (catalog folder) or Kafka (brokers)
    sink holds, as expected()."""
    if kind == "delta":
        from deltalake import DeltaTable

        t = DeltaTable(f"{location}/transfers").to_pyarrow_table().to_pylist()
        b = DeltaTable(f"{location}/balances").to_pyarrow_table().to_pylist()
    elif kind == "iceberg":  # pyiceberg, from the SQLite catalog in the folder
        from pyiceberg.catalog.sql import SqlCatalog

        catalog = SqlCatalog("onceflow", uri=f"sqlite:///{location}/catalog.db",
                             warehouse=Path(location, "warehouse").as_uri())
        t = catalog.load_table(("onceflow", "transfers")).scan().to_arrow().to_pylist()
        b = catalog.load_table(("onceflow", "balances")).scan().to_arrow().to_pylist()
    elif kind == "kafka":  # every record read once with read_committed; partial sums added up
        from onceflow.verify.kafka_rig import read_records

        t = [json.loads(v or b"{}") for _, v in read_records(location, "transfers")]
        sums: dict[str, list[int]] = {}
        for _, v in read_records(location, "balances"):
            row = json.loads(v or b"{}")
            total = sums.setdefault(row["account"], [0, 0])
            total[0] += row["cents"]
            total[1] += row["n"]
        b = [{"account": a, "cents": c, "n": n} for a, (c, n) in sums.items()]
    elif kind == "sqlite":
        import sqlite3

        conn = sqlite3.connect(location)
        conn.row_factory = sqlite3.Row
        t = [dict(r) for r in conn.execute("SELECT * FROM transfers")]
        b = [dict(r) for r in conn.execute("SELECT * FROM balances")]
        conn.close()
    else:
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(location) as conn:
            cur = conn.cursor(row_factory=dict_row)
            t = cur.execute("SELECT * FROM transfers").fetchall()
            b = cur.execute("SELECT * FROM balances").fetchall()
    assert len({r["tx_id"] for r in t}) == len(t)
    return {"transfers": {r["tx_id"]: (r["account"], r["cents"]) for r in t},
            "balances": {r["account"]: (r["cents"], r["n"]) for r in b}}

"""Record-level exactly-once append into PostgreSQL vs a raw COPY of the same rows.

One run, one server, the same rows (>= 2M events of the event schema, Parquet files):

* ``raw_copy``      — the baseline: the rows COPYed into the table over one connection
                      (Arrow's CSV writer feeding ``COPY … FROM STDIN``), nothing else;
* ``spark_copy``    — Spark reads the files and every task COPYs its partition straight
                      into the table (at-least-once: what a hand-written sink does);
* ``onceflow_2pc``  — ``onceflow_postgres`` append, two-phase protocol (tasks COPY into the
                      table inside prepared transactions; the driver commits them);
* ``onceflow_staged`` — ``onceflow_postgres`` append, staged protocol (tasks COPY into an
                      unlogged staging table; the driver moves the winners in one transaction).

The table is emptied (TRUNCATE) before every measurement. Ratios are rows/s over
``raw_copy``'s rows/s. The server is ``$ONCEFLOW_PG_DSN`` or, when unset, a temporary
one started for the run (as the tests do).

Usage: python benchmarks/bench_postgres_sink.py [--rows 2000000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
from psycopg import sql

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from onceflow.runtime.session import session  # noqa: E402
from onceflow.sinks.postgres import sql as pg  # noqa: E402
from onceflow.sinks.postgres import writer as pg_writer
from onceflow.sinks.postgres.datasource import NAME, register  # noqa: E402
from onceflow.verify.generator import GeneratorConfig, generate_table  # noqa: E402

COLUMNS = ["event_id", "user", "event_time", "system_time", "bytes"]
DDL = ('CREATE TABLE IF NOT EXISTS {} (event_id text, "user" text, event_time timestamptz, '
       "system_time timestamptz, bytes bigint)")


def make_files(directory: Path, rows: int, parts: int) -> list[Path]:
    directory.mkdir(parents=True, exist_ok=True)
    table = generate_table(GeneratorConfig(events=rows, users=10_000, minutes=rows / 50_000,
                                           duplicates=0.0, seed=3, segment_size=rows))
    step = -(-table.num_rows // parts)
    files = []
    for i in range(parts):
        path = directory / f"part-{i}.parquet"
        pq.write_table(table.slice(i * step, step), path)
        files.append(path)
    return files


def reset(dsn: str, table: str) -> None:
    with pg.session(dsn) as conn:
        conn.execute(sql.SQL(DDL).format(sql.Identifier(table)))
        conn.execute(sql.SQL("TRUNCATE {}").format(sql.Identifier(table)))
        conn.execute("DELETE FROM onceflow_batches")
        conn.execute("CHECKPOINT")


def count(dsn: str, table: str) -> int:
    with pg.session(dsn) as conn:
        return int(conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table)))
                   .fetchone()[0])


def raw_copy(dsn: str, files: list[Path]) -> float:
    reset(dsn, "raw")
    t0 = time.perf_counter()
    with pg.session(dsn) as conn, conn.transaction():
        for f in files:
            for batch in pq.ParquetFile(f).iter_batches(batch_size=100_000):
                pg.copy_arrow(conn, sql.Identifier("raw"), COLUMNS, batch)
    return time.perf_counter() - t0


def _copy_partition(dsn: str, batches: Any) -> Any:
    conn = pg.connect(dsn)
    try:
        with conn.transaction():
            for rb in batches:
                pg.copy_arrow(conn, sql.Identifier("spark_raw"), COLUMNS, rb)
                yield rb.slice(0, 0)
    finally:
        conn.close()


def spark_copy(spark: Any, dsn: str, files: list[Path]) -> float:
    reset(dsn, "spark_raw")
    df = spark.read.parquet(*[str(f) for f in files]).select(*COLUMNS)
    t0 = time.perf_counter()
    df.mapInArrow(lambda it: _copy_partition(dsn, it), df.schema).write.format("noop").mode(
        "overwrite").save()
    return time.perf_counter() - t0


def onceflow(spark: Any, dsn: str, files: list[Path], protocol: str, batch_id: int) -> float:
    table = f"of_{protocol}"
    reset(dsn, table)
    df = spark.read.parquet(*[str(f) for f in files]).select(*COLUMNS)
    t0 = time.perf_counter()
    (df.write.format(NAME).mode("append").option("dsn", dsn).option("table", table)
     .option("protocol", protocol).option("batch_id", batch_id).save())
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--partitions", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    server = None
    dsn = os.environ.get(pg.DSN_ENV, "")
    if not dsn:
        from tests.pg_server import TempPostgres

        server = TempPostgres(max_prepared_transactions=64)
        dsn = server.start()
    try:
        work = Path(tempfile.mkdtemp(prefix="onceflow-bench-pg-"))
        files = make_files(work / "data", args.rows, args.partitions)
        rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
        spark = session(app_name="bench-postgres")
        register(spark)
        variants = {
            "raw_copy": lambda r: raw_copy(dsn, files),
            "spark_copy": lambda r: spark_copy(spark, dsn, files),
            "onceflow_2pc": lambda r: onceflow(spark, dsn, files, "2pc", r),
            "onceflow_staged": lambda r: onceflow(spark, dsn, files, "staged", r),
        }
        tables = {"raw_copy": "raw", "spark_copy": "spark_raw", "onceflow_2pc": "of_2pc",
                  "onceflow_staged": "of_staged"}
        for fn in variants.values():  # warm-up: JVM, Python workers, table creation
            fn(10_000)
        times: dict[str, list[float]] = {n: [] for n in variants}
        for r in range(args.rounds):
            for name, fn in variants.items():
                times[name].append(fn(r))
                got = count(dsn, tables[name])
                if got != rows:
                    raise SystemExit(f"{name}: {got} rows in the table, expected {rows}")
        with pg.session(dsn) as conn:
            left = pg.prepared_gids(conn, pg_writer.GID_PREFIX)
        if left:
            raise SystemExit(f"prepared transactions left: {left[:3]}")
        base = rows / statistics.median(times["raw_copy"])
        print(f"rows: {rows:,}  partitions: {args.partitions}  rounds: {args.rounds} (median)")
        for name, ts in times.items():
            rate = rows / statistics.median(ts)
            print(f"{name:16s} {rate:12,.0f} rows/s   ratio to raw_copy {rate / base:5.2f}")
        spark.stop()
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()

"""Merge tables and output modes: what ``max``/``min`` merges and ``output_mode="update"`` cost.

Two measurements, each against a baseline in the same run:

1. **add+max vs add** (``--part merge``). Two batches of ``--rows`` rows each (the second
   updates half of the first's keys and adds as many new ones, rows in hash order, as from
   Spark's ``groupBy``) into ``revenue(account, window_start, amount_cents, payments)``, through
   ``commit_tables`` of the SQLite sink and of the PostgreSQL driver-side sink. Baseline:
   ``Table(key, add=[amount_cents, payments])``; measured: ``Table(key, add=[amount_cents],
   max=[payments])`` — the same columns, one merged by ``max``. Ratio = baseline time /
   measured time (>= 0.9: ``max`` costs at most ~10% more than ``add``).
2. **update-mode aggregation vs noop** (``--part update``). A streaming aggregation (per page
   and 1-minute window: count, max, min of ``--clicks`` deduplicated clicks in 8 Parquet files,
   one file per batch, ``availableNow``) written by ``onceflow.write_stream(output_mode="update")``
   to SQLite, vs the same query into Spark's ``noop`` sink (the aggregation alone). Ratio = noop time /
   onceflow time.

PostgreSQL is ``$ONCEFLOW_PG_DSN`` or, when unset, a temporary server (as the tests start).

Usage: python benchmarks/bench_merges.py [--part merge|update|both] [--rows 1000000]
       [--clicks 2000000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_sqlite_tables import batch  # noqa: E402
from onceflow.sinks._core.base import BatchStats  # noqa: E402
from onceflow.sinks._core.tables import Table  # noqa: E402

KEY = ["account", "window_start"]
SPECS = {"add": Table(key=KEY, add=["amount_cents", "payments"]),
         "add+max": Table(key=KEY, add=["amount_cents"], max=["payments"])}


def _commit(sink: Any, spec: Table, batches: list[Any]) -> float:
    sink.bind("bench")
    started = time.perf_counter()
    for i, b in enumerate(batches):
        sink.commit_tables(i, {"revenue": b}, {"revenue": spec}, BatchStats(b.num_rows, 0, 0), b.num_rows)
    sink.flush()
    return time.perf_counter() - started


def merge_part(rows: int, repeat: int) -> None:
    from onceflow.sinks.postgres import sql as pg
    from onceflow.sinks.postgres.sink import PostgresTablesSink
    from onceflow.sinks.sqlite.sink import SQLiteTablesSink

    batches = [batch(rows, 0, 1), batch(rows, rows // 2, 2)]
    server = None
    dsn = os.environ.get(pg.DSN_ENV, "")
    if not dsn:
        from tests.pg_server import TempPostgres

        server = TempPostgres(max_prepared_transactions=8)
        server.start()
    try:
        for backend in ("sqlite", "postgres"):
            times: dict[str, list[float]] = {name: [] for name in SPECS}
            for r in range(repeat):
                for name, spec in SPECS.items():
                    with tempfile.TemporaryDirectory() as tmp:
                        if backend == "sqlite":
                            sink: Any = SQLiteTablesSink(Path(tmp) / "m.db")
                        else:
                            sink = PostgresTablesSink(server.new_database() if server else dsn,
                                                      sink_id=f"bench{r}{len(name)}")
                        times[name].append(_commit(sink, spec, batches))
                        sink.close()
                base, measured = times["add"][-1], times["add+max"][-1]
                print(f"{backend} run {r + 1}: add {base:.2f} s, add+max {measured:.2f} s, "
                      f"ratio {base / measured:.3f}", flush=True)
            ratio = statistics.median(times["add"]) / statistics.median(times["add+max"])
            print(f"{backend}: median ratio add / add+max = {ratio:.3f} ({rows:,} rows per batch)",
                  flush=True)
    finally:
        if server is not None:
            server.stop()


def update_part(n_clicks: int, repeat: int) -> None:
    import onceflow
    from onceflow.runtime.session import session
    from tests.core import clicks

    spark = session(app_name="bench-merges", conf={"spark.sql.session.timeZone": "UTC"})
    root = Path(tempfile.mkdtemp(prefix="bench-merges-"))
    try:
        inputs = root / "in"
        clicks.generate(inputs, n_clicks, per_file=max(n_clicks // 8, 1), step_s=0.01)
        for r in range(-1, repeat):  # run -1 warms the JVM up and is not reported
            agg = clicks._aggregate(clicks._clean(spark, inputs, 1))
            started = time.perf_counter()
            (agg.writeStream.format("noop").outputMode("update").trigger(availableNow=True)
             .option("checkpointLocation", str(root / f"noop{r}")).start().awaitTermination())
            noop = time.perf_counter() - started
            agg = clicks._aggregate(clicks._clean(spark, inputs, 1))
            started = time.perf_counter()
            onceflow.write_stream(agg, onceflow.sqlite(root / f"u{r}.db"), root / f"ck{r}",
                                  {"clicks": onceflow.Table(key=clicks.KEY)}, output_mode="update",
                                  once=True).awaitTermination()
            ours = time.perf_counter() - started
            if r < 0:
                continue
            print(f"update run {r + 1}: noop {noop:.2f} s, onceflow update -> SQLite {ours:.2f} s, "
                  f"ratio {noop / ours:.3f} ({n_clicks:,} clicks)", flush=True)
    finally:
        spark.stop()
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["merge", "update", "both"], default="both")
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--clicks", type=int, default=2_000_000)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    if args.part in ("merge", "both"):
        merge_part(args.rows, args.repeat)
    if args.part in ("update", "both"):
        update_part(args.clicks, args.repeat)


if __name__ == "__main__":
    main()

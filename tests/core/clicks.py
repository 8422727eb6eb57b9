"""A click stream pipeline written for the output-mode tests (not one of onceflow's examples).

Per (page, 1-minute window): the number of distinct clicks and the worst latency. Written two
ways:

* ``deltas``: per-batch partial aggregates of the deduplicated clicks, merged by the sink
  (``Table(key=..., add=["clicks"], max=["worst_ms"], min=["best_ms"])``): no aggregation state;
* ``update``: Spark's streaming aggregation with ``output_mode="update"``, each batch's changed
  windows upserted (``Table(key=...)``);
* ``append``: the same aggregation in ``append`` mode (windows written once final), drained
  with a flush row (:func:`write_flush`) the query filters out after its watermark.

:func:`recompute` is the independent answer: pyarrow over the input files, no Spark, no onceflow.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

import onceflow
from onceflow import Table

START = dt.datetime(2026, 3, 1, tzinfo=dt.timezone.utc)
SCHEMA = "click_id STRING, page STRING, latency_ms BIGINT, ts TIMESTAMP"
FLUSH_PAGE = "__flush__"
KEY = ["page", "window_start"]
STYLES = ("deltas", "update", "append")


def generate(directory: Path, n: int, per_file: int, first: int = 0, seed: int = 1,
             retries: float = 0.1, step_s: float = 0.25) -> int:
    """Write clicks ``first`` .. ``first + n - 1`` (plus producer retries) as Parquet files.

    Click ``i`` happens ``i * step_s`` after :data:`START`, with up to 5 s of disorder, so no
    click is late against a 1-minute watermark. Returns the rows written (retries included).
    """
    rng = random.Random(seed + first)
    directory.mkdir(parents=True, exist_ok=True)
    rows: list[tuple[str, str, int, dt.datetime]] = []
    for i in range(first, first + n):
        at = START + dt.timedelta(seconds=i * step_s + rng.uniform(0, 5))
        row = (f"c{i}", f"p{rng.randrange(7)}", rng.randrange(1, 5000), at)
        rows.append(row)
        if rng.random() < retries:
            rows.append(row)  # the producer sent it again
    written = 0
    for k in range(0, len(rows), per_file):
        chunk = rows[k:k + per_file]
        path = directory / f"part-{first:08d}-{k // per_file:05d}.parquet"
        pq.write_table(_table(chunk), path)
        _stamp(path)
        written += len(chunk)
    return written


_last = [0.0]
_stamps = threading.Lock()


def _stamp(path: Path) -> None:
    """Give ``path`` a modification time after every file written before it, by >= 5 ms.

    Spark's file source reads new files in modification-time order (ms): files written in
    event-time order must not tie or swap, or a later file's rows would make an earlier one late.
    """
    with _stamps:
        _last[0] = max(time.time(), _last[0] + 0.005)
        os.utime(path, (_last[0], _last[0]))


def _table(rows: list[tuple[str, str, int, dt.datetime]]) -> pa.Table:
    return pa.table({"click_id": [r[0] for r in rows], "page": [r[1] for r in rows],
                     "latency_ms": pa.array([r[2] for r in rows], pa.int64()),
                     "ts": pa.array([r[3] for r in rows], pa.timestamp("us", tz="UTC"))})


def write_flush(directory: Path, after: dt.datetime) -> None:
    """The drain of the append pipeline: one row far enough ahead to close every open window."""
    at = after + dt.timedelta(minutes=10)
    path = directory / "zz-flush.parquet"
    pq.write_table(_table([("flush", FLUSH_PAGE, 0, at)]), path)
    _stamp(path)


def recompute(directory: Path) -> dict[tuple[str, int], tuple[int, int, int]]:
    """(page, window start ms) -> (distinct clicks, worst latency, best latency), from the files."""
    t = pq.read_table(directory)
    t = t.filter(pc.not_equal(t["page"], FLUSH_PAGE))
    first: dict[str, tuple[str, int, Any]] = {}  # a retry is the same click: one per click id
    for cid, page, lat, ts in zip(t["click_id"].to_pylist(), t["page"].to_pylist(),
                                  t["latency_ms"].to_pylist(), t["ts"].to_pylist(), strict=True):
        first.setdefault(cid, (page, lat, ts))
    out: dict[tuple[str, int], list[int]] = {}
    for cid_page, lat, ts in first.values():
        ms = int(ts.timestamp() * 1000) // 60_000 * 60_000
        cur = out.setdefault((cid_page, ms), [0, lat, lat])
        cur[0] += 1
        cur[1], cur[2] = max(cur[1], lat), min(cur[2], lat)
    return {k: (v[0], v[1], v[2]) for k, v in out.items()}


def _clean(spark: Any, inputs: Path, max_files: int) -> Any:
    events = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", max_files).parquet(str(inputs))
    return onceflow.deduplicate(events, id="click_id", event_time="ts", within="1 minute")


def _per_batch_deltas(df: Any) -> Any:
    from pyspark.sql import functions as F

    return (df.groupBy("page", F.window("ts", "1 minute").start.alias("window_start"))
            .agg(F.count(F.lit(1)).alias("clicks"), F.max("latency_ms").alias("worst_ms"),
                 F.min("latency_ms").alias("best_ms")))


def _aggregate(df: Any) -> Any:
    from pyspark.sql import functions as F

    return (df.where(F.col("page") != FLUSH_PAGE)
            .groupBy("page", F.window("ts", "1 minute"))
            .agg(F.count(F.lit(1)).alias("clicks"), F.max("latency_ms").alias("worst_ms"),
                 F.min("latency_ms").alias("best_ms"))
            .select("page", F.col("window.start").alias("window_start"), "clicks", "worst_ms", "best_ms"))


def start(spark: Any, style: str, inputs: Path, sink: Any, checkpoint: Path, *, once: bool = True,
          max_files: int = 1, **kw: Any) -> onceflow.OnceQuery:
    """Start the click pipeline in ``style`` (see the module)."""
    clean = _clean(spark, inputs, max_files)
    if style == "deltas":
        return onceflow.write_stream(
            clean, sink, checkpoint,
            {"clicks": Table(key=KEY, add=["clicks"], max=["worst_ms"], min=["best_ms"])},
            per_batch=_per_batch_deltas, once=once, **kw)
    mode = "update" if style == "update" else "append"
    return onceflow.write_stream(_aggregate(clean), sink, checkpoint, {"clicks": Table(key=KEY)}, once=once,
                                 output_mode=mode, **kw)


def as_result(rows: list[Mapping[str, Any]]) -> dict[tuple[str, int], tuple[int, int, int]]:
    """A sink table's rows in :func:`recompute`'s shape."""
    out = {}
    for r in rows:
        ws = r["window_start"]
        if isinstance(ws, str):  # SQLite: "YYYY-MM-DD HH:MM:SS" in UTC
            ws = dt.datetime.fromisoformat(ws).replace(tzinfo=dt.timezone.utc)
        ms = int(ws.timestamp() * 1000)
        out[(str(r["page"]), ms)] = (int(r["clicks"]), int(r["worst_ms"]), int(r["best_ms"]))
    return out


def read_table(kind: str, location: str) -> dict[tuple[str, int], tuple[int, int, int]]:
    """The ``clicks`` table of a sink (``sqlite`` file, ``postgres`` DSN, ``delta`` root)."""
    if kind == "sqlite":
        import sqlite3

        conn = sqlite3.connect(location)
        conn.row_factory = sqlite3.Row
        try:
            return as_result([dict(r) for r in conn.execute("SELECT * FROM clicks")])
        finally:
            conn.close()
    if kind == "postgres":
        import psycopg
        from psycopg.rows import dict_row

        with psycopg.connect(location, row_factory=dict_row) as c:
            return as_result(c.execute("SELECT * FROM clicks").fetchall())
    from deltalake import DeltaTable

    return as_result(DeltaTable(str(Path(location) / "clicks")).to_pyarrow_table().to_pylist())


def make_sink(kind: str, location: str) -> Any:
    """The sink of ``kind`` at ``location``."""
    if kind == "sqlite":
        return onceflow.sqlite(location)
    if kind == "postgres":
        return onceflow.postgres(location)
    return onceflow.delta(location)

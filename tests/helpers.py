"""Test helpers: independent expectations computed with pyarrow only (no Spark)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from onceflow.sinks._core.base import BatchStats
from onceflow.sources.log import EventLog


def distinct_counts(log_dir: str | Path) -> tuple[dict[tuple[str, int], int], dict[int, int]]:
    """Count distinct event_ids per (user, minute) and per minute, straight from the files."""
    seen: set[str] = set()
    users: Counter[tuple[str, int]] = Counter()
    for seg in EventLog(log_dir).segments():
        t = pq.read_table(seg.path, columns=["event_id", "user", "event_time"])
        ids = t.column("event_id").to_pylist()
        us = t.column("user").to_pylist()
        micros = t.column("event_time").cast("int64").to_pylist()
        for eid, user, ts in zip(ids, us, micros, strict=True):
            if eid in seen:
                continue
            seen.add(eid)
            users[(user, (ts // 60_000_000) * 60_000)] += 1
    glob: Counter[int] = Counter()
    for (_, w), c in users.items():
        glob[w] += c
    return dict(users), dict(glob)


def billing_expectation(
    checkpoint: str | Path,
) -> tuple[dict[tuple[str, int], tuple[int, int]], dict[str, int]]:
    """What the billing pipeline must hold, from the log files and Spark's checkpoint only.

    Batch by batch (committed batches): a row at or behind the batch's late watermark is late;
    otherwise the first row of an ``event_id`` is billed, later ones are duplicates.

    Returns:
        ``({(account, hour_start_ms): (bytes, events)}, {late event_id: missed watermark ms})``
        (the last watermark an event missed: ``late_events`` is upserted by ``event_id``).
    """
    from onceflow.checkpoint import logs as ckpt

    seen: set[str] = set()
    bill: dict[tuple[str, int], tuple[int, int]] = {}
    late: dict[str, int] = {}
    for batch_id in ckpt.committed_batches(checkpoint):
        bi = ckpt.batch_input(checkpoint, batch_id)
        if not bi.files:
            continue
        t = pq.read_table(bi.files, columns=["event_id", "user", "event_time", "bytes"])
        flags = ckpt.late_mask(t.column("event_time"), bi.late_watermark_ms).tolist()
        rows = zip(flags, t.column("event_id").to_pylist(), t.column("user").to_pylist(),
                   t.column("event_time").cast("int64").to_pylist(), t.column("bytes").to_pylist(),
                   strict=True)
        for is_late, eid, user, ts, nbytes in rows:
            if is_late:
                late[eid] = bi.late_watermark_ms
            elif eid not in seen:
                seen.add(eid)
                key = (user, (ts // 3_600_000_000) * 3_600_000)
                b, n = bill.get(key, (0, 0))
                bill[key] = (b + nbytes, n + 1)
    return bill, late


def commit_deltas(sink: Any, batch_id: int, deltas: pa.Table, stats: BatchStats) -> bool:
    """Commit Example 5-1 deltas (``user, window_start_ms, window_end_ms, count``) as its
    per_batch would: the per-user rows and their per-window sums, one marker."""
    from onceflow.examples.user_counts import TABLES, window_totals

    counted = int(pc.sum(deltas.column("count")).as_py() or 0)
    return bool(sink.commit_tables(batch_id, {"user_counts": deltas, "global_counts": window_totals(deltas)},
                                   TABLES, stats, counted))


def held_batches(db: str | Path, sink_id: str = "user_counts") -> list[int]:
    """Batch ids a SQLite sink holds durably: applied (a marker) or staged (applied at its restart)."""
    import sqlite3

    if not Path(db).exists():
        return []
    with sqlite3.connect(db, timeout=30) as conn:
        try:
            return sorted({r[0] for r in conn.execute(
                "SELECT batch_id FROM onceflow_batches WHERE sink_id = ? UNION "
                "SELECT batch_id FROM onceflow_staged WHERE sink_id = ?", (sink_id, sink_id))})
        except sqlite3.OperationalError:  # not created yet
            return []


def same_sorted(got: list[Any], expected: list[Any], what: str) -> None:
    """Equal sorted lists; a difference told in a line (repeated, unexpected, missing, with examples).

    pytest's own report of two unequal lists of 40,000-250,000 items (a difflib diff) runs for
    minutes to hours.
    """
    if got != expected:
        extra, missing = sorted(set(got) - set(expected)), sorted(set(expected) - set(got))
        raise AssertionError(f"{what}: {len(got)} read, {len(expected)} expected; {len(got) - len(set(got))} "
                             f"repeated, {len(extra)} unexpected (e.g. {extra[:3]}), {len(missing)} missing "
                             f"(e.g. {missing[:3]})")


def table_frames(spark: Any, rows: list[tuple[Any, ...]], schema: str) -> dict[str, Any]:
    """One batch as three tables' DataFrames (persisted): ``events`` (the rows, 3 partitions),
    ``latest`` (max ``id`` per ``k``) and ``totals`` (per ``k``, ``day``: sum of ``n``, max ``hi``,
    min ``lo``) — the append, upsert and merge tables the sinks' tasks-path tests write."""
    events = spark.createDataFrame(rows, schema)
    events = events.repartition(3) if rows else events  # an empty batch: no partition, no task
    latest = events.groupBy("k").agg({"id": "max"}).withColumnRenamed("max(id)", "id")
    totals = (events.groupBy("k", "day").agg({"n": "sum", "hi": "max", "lo": "min"})
              .withColumnRenamed("sum(n)", "n").withColumnRenamed("max(hi)", "hi")
              .withColumnRenamed("min(lo)", "lo"))
    return {"events": events.persist(), "latest": latest.persist(), "totals": totals.persist()}


def restore_from_copy(restored: str, db: Path, ck: Path, backup_db: Path, backup_ck: Path) -> None:
    """Put back the SQLite database (``restored == "database"``) or the checkpoint from their copies."""
    import shutil
    import sqlite3

    if restored == "database":
        for suffix in ("", "-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
        with sqlite3.connect(backup_db) as src, sqlite3.connect(db) as dst:
            src.backup(dst)
    else:
        shutil.rmtree(ck)
        shutil.copytree(backup_ck, ck)


def check_amendments(commit: Callable[[int, BatchStats], bool],
                     batches: Callable[[], list[dict[str, Any]]]) -> None:
    """A batch's ``amend`` fills the batch before's unknown metrics in the sink's markers, by the rule.

    Batch 0's input is unknown (a Kafka source on Spark Connect): batch 1's amendment, whose
    progress rows equal batch 0's offsets' span, fills it. Batch 1's input is known (10 rows):
    batch 2's amendment says 20 (the plan ran twice), so batch 1 keeps NULL late drops and
    duplicates. A replay of batch 2 carrying another amendment changes nothing.

    Args:
        commit: Commits batch ``batch_id`` (one row) with the given stats; whether it wrote.
        batches: The sink's markers, as its ``batches()`` returns them.
    """
    from onceflow.sinks._core.marker import Amend

    assert commit(0, BatchStats(None, None, 0))
    assert commit(1, BatchStats(10, None, 0, amend=Amend(0, 12, 1, 3, span=12)))
    assert commit(2, BatchStats(5, 0, 0, duplicates=0, amend=Amend(1, 20, 4, 4, span=None)))
    assert not commit(2, BatchStats(5, 0, 0, duplicates=0, amend=Amend(1, 10, 6, 6, span=None)))
    got = {m["batch_id"]: (m["input_rows"], m["late_dropped"], m["duplicates_dropped"]) for m in batches()}
    assert got == {0: (12, 1, 3), 1: (10, None, None), 2: (5, 0, 0)}, got
    assert all("amends" not in m for m in batches())


def duckdb_iceberg_rows(table: Any, columns: str = "*", order: str = "1") -> list[tuple[Any, ...]]:
    """An Iceberg table's rows as DuckDB's Iceberg extension reads its current metadata file.

    The extension's wheels come from PyPI (``duckdb-extension-iceberg``/``-avro``): no network at
    run time; DuckDB shares no code with pyiceberg or onceflow.
    """
    import duckdb
    import duckdb_extension_avro
    import duckdb_extension_iceberg

    conn = duckdb.connect()
    for module, name in ((duckdb_extension_avro, "avro"), (duckdb_extension_iceberg, "iceberg")):
        path = next(Path(module.__file__).parent.rglob(f"{name}.duckdb_extension"))  # type: ignore[arg-type]
        conn.execute(f"INSTALL '{path}'")
        conn.execute(f"LOAD {name}")
    location = table.metadata_location.removeprefix("file://")
    return conn.execute(f"SELECT {columns} FROM iceberg_scan('{location}') ORDER BY {order}").fetchall()


ICEBERG_CHILD = """
import sys
from pathlib import Path
import onceflow
from onceflow.runtime.session import session
from onceflow.sinks._core.tables import Table
tmp = Path(sys.argv[1])
spark = session(app_name="iceberg-crash", shuffle_partitions=2)
sink = onceflow.iceberg(f"sqlite:///{tmp / 'catalog.db'}", tmp / "warehouse")
"""
"""The head of a child driver into ``onceflow.iceberg`` (a SQLite catalog and warehouse in ``argv[1]``):
a test appends its query, which ends by printing ``done``."""


def killed_then_restarted(script: str, folder: Path, point: str,
                          between: Callable[[Any], None] | None = None) -> None:
    """Run a driver script with the crash point ``point`` armed (SIGKILL of it and its JVM), then again.

    ``between`` is called with the killed run (a ``CompletedProcess``) before the restart.

    Raises:
        AssertionError: The first run did not die by SIGKILL, or the second did not finish.
    """
    import os
    import subprocess
    import sys

    from onceflow.verify.crashes import CRASH_ENV

    path = folder / "child.py"
    path.write_text(script)
    args = [sys.executable, str(path), str(folder)]
    root = Path(__file__).resolve().parents[1]
    died = subprocess.run(args, cwd=root, env={**os.environ, CRASH_ENV: point}, capture_output=True,
                          text=True, timeout=300)
    assert died.returncode == -9, died.stderr[-3000:]
    if between is not None:
        between(died)
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    again = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "done" in again.stdout, again.stderr[-3000:]

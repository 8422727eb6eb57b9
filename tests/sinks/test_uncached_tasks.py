"""A large one-table batch written by Spark's tasks without a cache, under SIGKILLs (Delta, SQLite, PG).

The batch is computed once, by the sink's own write; its marker's numbers are settled after the
tasks ran (:data:`onceflow.sinks._core.base.Settle`). Each life of :mod:`tests.sinks.uncached_driver` runs
in its own process group: killed inside the sink's commit (after the tasks' write, nothing
committed), after the commit (before Spark's commit log: the replay must write nothing), and with
every task's first attempt killed after its file (Spark's retry writes it again: one counts). The
oracle is the test's own reading of the input files (pyarrow, the transform recomputed here): the
table must hold each kept row once, and the markers one per batch with the rows each batch wrote.
"""

from __future__ import annotations

import datetime as dt
import json
import sqlite3
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import onceflow
from onceflow.verify.driver import ProcessGroup

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PER_FILE = 2_000


def _feed(src: Path, files: int) -> None:
    """``files`` more input files of :data:`PER_FILE` rows (ids go on from the last file's)."""
    src.mkdir(exist_ok=True)
    first = len(list(src.glob("*.parquet")))
    for f in range(first, first + files):
        ids = list(range(f * PER_FILE, (f + 1) * PER_FILE))
        pq.write_table(pa.table({
            "id": pa.array(ids, pa.int64()), "account": [f"acct-{i % 17}" for i in ids],
            "v": pa.array([i * 7 % 1000 for i in ids], pa.int64()),
            "at": pa.array([dt.datetime(2026, 3, 1) + dt.timedelta(seconds=i) for i in ids],
                           pa.timestamp("us"))}), src / f"f{f:03d}.parquet")


def _expected(src: Path) -> list[tuple[Any, ...]]:
    """The driver's transform, recomputed from the input files: v not a multiple of 3, w = v + 1."""
    rows = pa.concat_tables([pq.read_table(f) for f in sorted(src.glob("*.parquet"))]).to_pylist()
    return sorted((r["id"], r["account"], r["v"], r["at"], r["v"] + 1) for r in rows if r["v"] % 3)


def _table(kind: str, out: Path, dsn: str | None) -> list[tuple[Any, ...]]:
    if kind == "postgres":
        import psycopg

        with psycopg.connect(dsn) as c:
            got = c.execute("SELECT id, account, v, at, w FROM moves").fetchall()
        return sorted((i, a, v, at.replace(tzinfo=None), w) for i, a, v, at, w in got)
    if kind == "delta":
        from deltalake import DeltaTable

        got = DeltaTable(str(out / "moves")).to_pyarrow_table().to_pylist()
        return sorted((r["id"], r["account"], r["v"], r["at"].replace(tzinfo=None), r["w"]) for r in got)
    with sqlite3.connect(out) as c:
        got = c.execute("SELECT id, account, v, at, w FROM moves").fetchall()
    return sorted((i, a, v, dt.datetime.fromisoformat(at), w) for i, a, v, at, w in got)


def _markers(kind: str, out: Path, dsn: str | None) -> list[dict[str, Any]]:
    try:
        sink = {"delta": lambda: onceflow.delta(out), "sqlite": lambda: onceflow.sqlite(out),
                "postgres": lambda: onceflow.postgres(dsn)}[kind]()
        return sink.batches()
    except Exception:  # nothing written yet
        return []


def _life(tmp: Path, kind: str, name: str, dsn: str | None, crash_at: str | None = None) -> ProcessGroup:
    out = tmp / ("lake" if kind == "delta" else "app.db")
    env = {"ONCEFLOW_CRASH_AT": crash_at} if crash_at else {}
    if dsn:
        env["ONCEFLOW_PG_DSN"] = dsn
    return ProcessGroup([str(tmp / "in"), str(out), str(tmp / "ck"), kind], tmp / f"{name}.out", env,
                        module="tests.sinks.uncached_driver")


@pytest.mark.parametrize("kind", ["delta", pytest.param("sqlite", marks=pytest.mark.long),
                                  pytest.param("postgres", marks=pytest.mark.long)])
def test_killed_inside_and_after_the_commit_and_killed_tasks_leave_each_row_once(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    dsn = request.getfixturevalue("pg_dsn") if kind == "postgres" else None
    out = tmp_path / ("lake" if kind == "delta" else "app.db")
    _feed(tmp_path / "in", 2)
    first = _life(tmp_path, kind, "first", dsn)
    assert first.wait(timeout=300) == 0, first.output()[-3000:]
    for point, rc in [("inside_sink_txn", -9), ("after_sink_commit", -9), ("task_after_write", 0)]:
        _feed(tmp_path / "in", 2)  # the batch the point hits has rows
        done = [m["batch_id"] for m in _markers(kind, out, dsn)]
        target = max(done) + 1  # after inside_sink_txn: the batch that has no marker yet
        life = _life(tmp_path, kind, point, dsn, crash_at=f"{point}@{target}")
        assert life.wait(timeout=300) == rc, (point, life.output()[-3000:])
        assert f"crash point {point} at batch {target}" in life.output(), life.output()[-3000:]
        marked = target in [m["batch_id"] for m in _markers(kind, out, dsn)]
        assert marked == (point != "inside_sink_txn"), (point, target)
    final = _life(tmp_path, kind, "final", dsn)
    assert final.wait(timeout=300) == 0, final.output()[-3000:]
    want = _expected(tmp_path / "in")
    got = _table(kind, out, dsn)
    assert len(got) == len(want) and got == want, (len(got), len(want))
    markers = _markers(kind, out, dsn)
    assert [m["batch_id"] for m in markers] == list(range(len(markers))), markers
    assert sum(int(m["rows_written"]) for m in markers) == len(want)
    assert all(json.loads(m["tables"]) == {"moves": m["rows_written"]} for m in markers), markers
    assert all(m["input_rows"] == 2 * PER_FILE for m in markers), markers  # two files per batch
    assert all(m["events_counted"] == 2 * PER_FILE for m in markers), markers  # per_batch's input rows
    if kind == "delta":  # no manifest or staged file left; the log's files all by Spark's Parquet writer
        from deltalake import DeltaTable

        assert not [p for p in (out / "_onceflow").rglob("*") if p.is_file() and "stage" in p.parts]
        adds = pa.table(DeltaTable(str(out / "moves")).get_add_actions(flatten=True))
        names = adds.column("path").to_pylist()
        by_spark = [b"org.apache.spark.version" in (pq.read_metadata(out / "moves" / n).metadata or {})
                    for n in names]
        assert names and all(by_spark), names

"""The click pipeline, written both ways, under real SIGKILLs while files arrive.

Per sink (SQLite, PostgreSQL, Delta) and style (per-batch partial aggregates merged by the sink
with ``add``/``max``/``min``; Spark's aggregation in ``output_mode="update"``): a driver killed
at a random moment after a commit, then one that dies at ``inside_sink_txn`` (for Delta: after
its table's commit, before the driver's next step) and one at
``after_sink_commit`` of a batch that has input (a no-data batch proves nothing: such a crash is
armed again at the next batch), while a feeder keeps writing click files; a last life drains.
The table must equal the recomputation from the files (:func:`tests.core.clicks.recompute`:
pyarrow, no Spark, no onceflow) and the markers must say how many rows were read and dropped.
"""

from __future__ import annotations

import os
import random
import re
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from onceflow.checkpoint import logs as ckpt
from onceflow.verify.driver import ProcessGroup, wait_until
from tests.core import clicks

pytestmark = [pytest.mark.spark, pytest.mark.faults]


def _batches(kind: str, location: str) -> list[dict[str, Any]]:
    try:
        return clicks.make_sink(kind, location).batches()
    except Exception:  # noqa: BLE001 - nothing written yet
        return []


def _has(kind: str, location: str, batch_id: int) -> bool:
    """Whether the sink has the batch: its marker, or (SQLite) durably staged, not yet applied."""
    staged = clicks.make_sink(kind, location).staged_batches() if kind == "sqlite" else []
    return batch_id in [int(m["batch_id"]) for m in _batches(kind, location)] + staged


def _driver(tmp: Path, style: str, kind: str, location: str, name: str, crash_at: str | None = None,
            once: bool = False) -> ProcessGroup:
    args = [style, kind, location, str(tmp / "in"), str(tmp / "ck"), *(["--once"] if once else [])]
    env = {"ONCEFLOW_CRASH_AT": crash_at} if crash_at else {}
    return ProcessGroup(args, tmp / f"{name}.out", env, module="tests.core.clicks_driver")


def _crash_on_data(tmp: Path, style: str, kind: str, location: str, point: str) -> int:
    """Kill a driver at ``point`` of a batch that read input; return that batch's id."""
    for attempt in range(4):
        done = [int(m["batch_id"]) for m in _batches(kind, location)]
        if kind == "sqlite":
            done += clicks.make_sink(kind, location).staged_batches()
        target = max(done) + 1 if done else 0
        d = _driver(tmp, style, kind, location, f"{point}{attempt}", crash_at=f"{point}@{target}")
        assert d.wait(timeout=300) == -9, d.output()[-3000:]
        hit = int(re.findall(rf"crash point {point} at batch (\d+)", d.output())[-1])
        if ckpt.batch_files(tmp / "ck", hit):
            return hit
    raise AssertionError(f"{point}: four crashes in a row landed on no-data batches")


LONG = pytest.mark.long  # ~45 s each: one of the six runs in make test, all in make test-long


@pytest.mark.parametrize(("kind", "style"), [
    ("postgres", "deltas"),
    pytest.param("sqlite", "update", marks=LONG), pytest.param("delta", "update", marks=LONG),
    pytest.param("sqlite", "deltas", marks=LONG), pytest.param("postgres", "update", marks=LONG),
    pytest.param("delta", "deltas", marks=LONG)])
def test_kills_while_files_arrive_leave_the_recomputed_table(tmp_path: Path, kind: str, style: str,
                                                            request: pytest.FixtureRequest) -> None:
    location = (request.getfixturevalue("pg_dsn") if kind == "postgres"
                else str(tmp_path / ("delta" if kind == "delta" else "app.db")))
    seed = int(os.environ.get("CLICKS_SEED", time.time())) % 10_000
    rng = random.Random(seed)
    fed, lock, stop = [600], threading.Lock(), threading.Event()
    clicks.generate(tmp_path / "in", 600, per_file=200, seed=seed)

    def feed() -> None:  # files keep arriving while drivers live and die
        while not stop.is_set() and fed[0] < 3_600:
            with lock:
                clicks.generate(tmp_path / "in", 200, per_file=200, first=fed[0], seed=seed)
                fed[0] += 200
            time.sleep(1.0)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        d = _driver(tmp_path, style, kind, location, "random")
        wait_until(lambda: len(_batches(kind, location)) > 1, 180, "two commits")
        time.sleep(rng.uniform(0.0, 2.0))
        d.kill()
        for point in ("inside_sink_txn", "after_sink_commit"):
            hit = _crash_on_data(tmp_path, style, kind, location, point)
            marked = _has(kind, location, hit)
            # Delta commits table by table: inside_sink_txn comes after the (only) table's commit
            assert marked == (point == "after_sink_commit" or kind == "delta"), (point, hit, seed)
            assert not (tmp_path / "ck" / "commits" / str(hit)).exists()
    finally:
        stop.set()
        feeder.join(timeout=60)
    final = _driver(tmp_path, style, kind, location, "final", once=True)
    assert final.wait(timeout=300) == 0, final.output()[-3000:]
    markers = _batches(kind, location)
    late = sum(m["late_dropped"] or 0 for m in markers)
    assert clicks.read_table(kind, location) == clicks.recompute(tmp_path / "in"), f"seed={seed} late={late}"
    assert [m["batch_id"] for m in markers] == list(range(len(markers)))  # one per batch, none twice
    files = sum(pq.read_metadata(f).num_rows for f in (tmp_path / "in").glob("*.parquet"))
    assert sum(m["input_rows"] for m in markers) == files
    assert sum(m["late_dropped"] for m in markers) == 0

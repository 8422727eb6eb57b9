"""The sink contract (``onceflow.sinks._core.base``), one suite run against every backend.

The generic sinks with Example 5-1's tables, fed as its ``per_batch`` feeds them: SQLite,
PostgreSQL with the driver-side transaction, and PostgreSQL written by Spark's executors with
the staged and the two-phase protocol. Every backend must: add deltas, skip
a replayed batch (also after a restart), leave nothing of a failed batch, record the batch's
metrics in its marker, refuse a sink of another checkpoint, and behave at the crash points
when its process is really SIGKILLed there.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.errors import CheckpointMismatchError, SinkApplyError
from onceflow.verify.crashes import CRASH_ENV
from tests.sinks.backends import B0, B1, KINDS, STATS, Backend, deltas

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(params=KINDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    kind = request.param
    if kind.startswith("sqlite"):
        yield Backend(kind, str(tmp_path / "sink.db"))
        return
    dsn = request.getfixturevalue("pg_dsn")
    if kind != "postgres":
        request.getfixturevalue("spark")  # the executor-side writers need the session
    yield Backend(kind, dsn)


def test_deltas_add_up_and_global_is_the_sum(backend: Backend) -> None:
    sink = backend.make()
    sink.bind("q1")
    assert sink.commit_batch(0, B0, STATS)
    assert sink.commit_batch(1, B1, STATS)
    sink.flush()
    users, glob = backend.counts()
    assert users == {("a", 0): 3, ("b", 0): 2, ("a", 60_000): 5, ("c", 120_000): 5}
    assert glob == {0: 5, 60_000: 5, 120_000: 5}
    markers = backend.batches()
    assert [b["batch_id"] for b in markers] == [0, 1]
    assert markers[0]["input_rows"] == 20
    assert markers[0]["late_dropped"] == 2
    assert markers[0]["late_watermark_ms"] == 7
    assert backend.prepared() == []


def test_replayed_batch_is_a_noop_also_after_restart(backend: Backend) -> None:
    sink = backend.make()
    sink.bind("q1")
    assert sink.commit_batch(0, B0, STATS)
    assert not sink.commit_batch(0, B0, STATS)
    sink.close()
    again = backend.make()  # a restarted process
    again.bind("q1")
    assert not again.commit_batch(0, B0, STATS)
    assert backend.counts()[0] == {("a", 0): 3, ("b", 0): 2, ("a", 60_000): 1}
    assert len(backend.batches()) == 1


def test_failed_batch_leaves_nothing_and_its_retry_commits(backend: Backend) -> None:
    sink = backend.make()
    sink.bind("q1")
    assert sink.commit_batch(0, B0, STATS)
    sink.flush()
    before = backend.counts()
    backend.break_window_999(True)
    with pytest.raises(Exception, match="boom"):
        sink.commit_batch(1, deltas([("a", 0, 7), ("z", 999, 1)]), STATS)
    assert backend.counts() == before
    assert [b["batch_id"] for b in backend.batches()] == [0]
    backend.break_window_999(False)
    assert sink.commit_batch(1, B1, STATS)
    sink.flush()
    assert backend.counts()[0][("a", 60_000)] == 5
    assert backend.prepared() == []


def test_sink_of_another_checkpoint_is_refused(backend: Backend) -> None:
    backend.make().bind("q1")
    backend.make().bind("q1")  # idempotent
    with pytest.raises(CheckpointMismatchError, match="query id q1.*query id q2"):
        backend.make().bind("q2")
    backend.make(sink_id="second").bind("q2")  # another sink id is fine


def _child(backend: Backend, crash_at: str, batch: int = 0) -> int:
    env = {**os.environ, CRASH_ENV: crash_at}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.sinks.backends", backend.kind, backend.location, str(batch)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, start_new_session=True)
    return proc.returncode


@pytest.mark.parametrize("backend", [*KINDS[:-1], pytest.param(KINDS[-1], marks=pytest.mark.long)],
                         indirect=True)  # postgres-2pc's two points: make test has them in
# tests/sinks/test_postgres_two_phase.py (a driver killed undecided and decided, under Spark)
def test_sigkill_inside_the_transaction_then_after_the_commit(backend: Backend) -> None:
    assert _child(backend, "inside_sink_txn") == -9
    assert backend.counts() == ({}, {})
    assert backend.batches() == []
    assert _child(backend, "after_sink_commit") == -9
    assert [b["batch_id"] for b in backend.batches()] == [0]  # the marker is there
    if backend.kind == "postgres-2pc":  # decided; the prepared rows wait for recovery
        assert len(backend.prepared()) >= 1
        assert backend.counts()[0] == {}
    else:
        assert backend.counts()[0] == {("a", 0): 3, ("b", 0): 2, ("a", 60_000): 1}
    sink = backend.make()  # the restarted driver re-runs batch 0: a no-op
    sink.bind("q1")
    assert not sink.commit_batch(0, B0, STATS)
    assert backend.counts()[0] == {("a", 0): 3, ("b", 0): 2, ("a", 60_000): 1}
    assert backend.counts()[1] == {0: 5, 60_000: 1}
    assert [b["batch_id"] for b in backend.batches()] == [0]
    assert backend.prepared() == []


B0_ONLY = {("a", 0): 3, ("b", 0): 2, ("a", 60_000): 1}
BOTH = {("a", 0): 3, ("b", 0): 2, ("a", 60_000): 5, ("c", 120_000): 5}


@pytest.mark.parametrize("point", ["inside_sink_txn", "after_sink_commit", "apply_pending"])
def test_sqlite_staged_batch_sigkilled_at_each_point(tmp_path: Path, point: str) -> None:
    """Batch 1 takes the SQLite sink's staged path (batch 0 created the tables): a real SIGKILL
    at each of its crash points, then the restart (bind applies what is staged; Spark re-runs
    batch 1 unless it wrote ``commits/1``, which it did only for ``apply_pending``)."""
    backend = Backend("sqlite", str(tmp_path / "sink.db"))
    first = backend.make()
    first.bind("q1")
    assert first.commit_batch(0, B0, STATS)
    first.close()
    assert _child(backend, f"{point}@1", batch=1) == -9
    assert backend.counts()[0] == B0_ONLY  # batch 1 is not in the tables ...
    assert [b["batch_id"] for b in backend.batches()] == [0]
    assert backend.staged() == ([] if point == "inside_sink_txn" else [1])  # ... but durably staged
    restarted = backend.make()
    restarted.bind("q1")
    assert backend.staged() == []
    if point != "apply_pending":  # Spark had not written commits/1: it re-runs batch 1
        assert restarted.commit_batch(1, B1, STATS) == (point == "inside_sink_txn")
    restarted.close()
    assert backend.counts() == (BOTH, {0: 5, 60_000: 5, 120_000: 5})
    assert [b["batch_id"] for b in backend.batches()] == [0, 1]


def test_sqlite_staged_batch_that_cannot_apply_stays_staged(tmp_path: Path) -> None:
    """A table changed between stage and apply (a trigger that refuses rows): the restart says
    the batch is safe and staged; once the trigger is gone the next restart applies it."""
    backend = Backend("sqlite", str(tmp_path / "sink.db"))
    first = backend.make()
    first.bind("q1")
    assert first.commit_batch(0, B0, STATS)
    first.close()
    assert _child(backend, "apply_pending@1", batch=1) == -9
    with sqlite3.connect(backend.location) as conn:
        conn.execute("CREATE TRIGGER boom BEFORE INSERT ON user_counts "
                     "BEGIN SELECT RAISE(ABORT, 'boom'); END")
    with pytest.raises(SinkApplyError, match=r"batch 1 of sink 'user_counts' is safely staged.*boom"):
        backend.make().bind("q1")
    assert backend.staged() == [1]
    assert backend.counts()[0] == B0_ONLY
    with sqlite3.connect(backend.location) as conn:
        conn.execute("DROP TRIGGER boom")
    again = backend.make()
    again.bind("q1")
    again.close()
    assert backend.staged() == []
    assert backend.counts()[0] == BOTH

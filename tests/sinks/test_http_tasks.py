"""The HTTP sink's tasks path: a large batch's effects called by Spark's tasks against the ledger.

Each run is a child process (:mod:`tests.sinks.http_tasks_child`: Spark, ``collect_below=0``) that
calls the demo service (a real HTTP server in its own process, :class:`ServiceProcess`); the
oracle is the child's own rows (3,000 charges per batch, one effect each, and the per-account
counts), compared with what the service applied. SIGKILLs: every task's first attempt killed after
its calls were confirmed (Spark's retry must send nothing again), the driver killed after the
batch's marker, and the tasks of a batch killed with no retry (the batch fails; the re-run sends
only what was not confirmed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from onceflow.errors import BatchRejectedError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.http.sink import HttpEffectsSink
from onceflow.verify.crashes import CRASH_ENV
from onceflow.verify.service import ServiceProcess, read_effects
from tests.helpers import check_amendments
from tests.sinks.http_tasks_child import ROWS, rows

pytestmark = [pytest.mark.spark, pytest.mark.faults]
ROOT = Path(__file__).resolve().parents[2]


def _child(url: str, ledger: Path, master: str, *batches: int,
           crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at:
        env[CRASH_ENV] = crash_at
    args = [sys.executable, "-m", "tests.sinks.http_tasks_child", url, str(ledger), master,
            *map(str, batches)]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _expected(batches: range) -> dict[str, dict[str, Any]]:
    """Every effect's key and payload, from the child's rows (this test's own fold)."""
    out: dict[str, dict[str, Any]] = {}
    for b in batches:
        counts: Counter[str] = Counter()
        for account, hour, amount in rows(b):
            out[f"default/charges/{account}/{hour}"] = {"account": account, "hour": hour, "amount": amount}
            counts[account] += 1
        for account, n in counts.items():
            out[f"default/counts/{account}/{b}"] = {"account": account, "n": n}
    return out


@pytest.mark.long  # make test-long (make test's 30 minutes); RELIABILITY.md's 20-round http-tasks verify
def test_killed_tasks_and_a_killed_driver_leave_each_effect_applied_once(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    with ServiceProcess(tmp_path / "service.db") as service:
        url = service.effects_url
        done = _child(url, ledger, "local[2,2]", 0, 1, crash_at="task_after_write@1")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "committed 0" in done.stdout and "committed 1" in done.stdout
        assert "crash point task_after_write at batch 1 (a task's first attempt)" in done.stderr
        died = _child(url, ledger, "local[2]", 2, crash_at="task_after_write@2")  # no retry: the batch fails
        assert died.returncode != 0 and "committed 2" not in died.stdout, died.stdout
        died = _child(url, ledger, "local[2]", 2, 3, crash_at="after_sink_commit@3")
        assert died.returncode == -9 and "committed 2" in died.stdout, died.stderr[-3000:]
        again = _child(url, ledger, "local[2]", 3, 4)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "replayed 3" in again.stdout and "committed 4" in again.stdout
        applied = read_effects(service.db)
        want = _expected(range(5))
        assert Counter(e["key"] for e in applied) == Counter(want.keys())  # each key once
        assert all(e["payload"] == want[e["key"]] for e in applied)
        calls = read_effects(service.db, calls=True)
        assert len(calls) == len(want)  # a confirmed key was never called again: not once
    sink = HttpEffectsSink(url, ledger)
    metrics = {m["batch_id"]: m for m in sink.effect_batches()}
    assert sorted(metrics) == [0, 1, 2, 3, 4] and metrics[0]["effects"] == ROWS + 300
    assert metrics[2]["known_keys"] > 0  # the failed first run of 2 confirmed some keys
    assert [m["batch_id"] for m in sink.batches()] == [0, 1, 2, 3, 4]
    assert sink.unconfirmed() == []
    sink.close()


def test_the_data_sources_commit_keeps_metrics_known_only_after_a_batch(tmp_path: Path) -> None:
    """The stats travel in the format's options (Spark Connect's amendment among them) to the commit."""
    from dataclasses import asdict

    from onceflow.sinks.http import tasks
    from onceflow.sinks.http.ledger import METRICS

    sink = {"url": "http://127.0.0.1:9/unused", "ledger": str(tmp_path / "ledger.db"), "sink_id": "default",
            "idempotent": True, "headers": {}}
    done: set[int] = set()

    def commit(batch_id: int, stats: BatchStats) -> bool:  # as commit_frames: a batch it has is skipped
        if batch_id in done:
            return False
        spec = tasks.HttpTaskSpec.from_options(tasks.HttpTaskSpec(sink, batch_id, asdict(stats), 1).options())
        tasks.finish(spec, batch_id, [dict.fromkeys(METRICS, 0)])
        done.add(batch_id)
        return True

    check_amendments(commit, lambda: HttpEffectsSink(sink["url"], sink["ledger"]).batches())


def test_a_value_json_cannot_hold_is_refused_before_any_call(spark: Any, tmp_path: Path) -> None:
    specs = {"readings": Table(key="sensor")}
    with ServiceProcess(tmp_path / "service.db") as service:
        sink = HttpEffectsSink(service.effects_url, tmp_path / "ledger.db", collect_below=0)
        sink.bind("q1")
        values = [(f"s{i}", float("inf") if i == 42 else i / 3, b"ok" if i != 7 else b"\xff")
                  for i in range(500)]
        frame = spark.createDataFrame(values, "sensor STRING, level DOUBLE, raw BINARY")
        with pytest.raises(BatchRejectedError, match=r"column '(level|raw)' of"):
            sink.commit_frames(0, {"readings": frame}, specs, BatchStats(500, 0, 0), 500)
        fine = spark.createDataFrame([v for v in values if v[0] not in ("s42", "s7")], "sensor STRING, "
                                     "level DOUBLE, raw BINARY")
        assert read_effects(service.db, calls=True) == []
        assert sink.commit_frames(0, {"readings": fine}, specs, BatchStats(498, 0, 0), 498)
        assert len(read_effects(service.db)) == 498
        sink.close()

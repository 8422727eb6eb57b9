"""Stable input and the side-effect sink under real SIGKILLs of the Spark driver.

The charges example: a price looked up from a service that changes its answer on every call
(a non-deterministic transform), each priced hourly total charged by one HTTP call to the demo
service (a separate process) that fails 10% of calls and times out 5% *after* applying them.
The driver is SIGKILLed at every crash point between the persisted output and Spark's commit
log; the service must have applied every charge exactly once, and seen one payload per key —
the first, stabilized one. Then the e0..e3 scenario of a window that gains an element between
two attempts of a batch, with and without stable input.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from onceflow.checkpoint import logs as ckpt
from onceflow.sinks.http.ledger import SQLiteLedger
from onceflow.sources.log import EventLog
from onceflow.verify.crashes import CRASH_ENV
from onceflow.verify.generator import GeneratorConfig, generate_segments
from onceflow.verify.service import ServiceProcess, read_effects
from tests.helpers import billing_expectation

pytestmark = [pytest.mark.spark, pytest.mark.faults]
ROOT = Path(__file__).resolve().parents[2]
POINTS = ["after_stable_save", "effects_started", "effects_sent", "after_sink_commit", "before_stable_drop",
          "after_commit_log"]


def _driver(tmp: Path, url: str, *flags: str,
            crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at:
        env[CRASH_ENV] = crash_at
    return subprocess.run([sys.executable, "-m", "tests.core.charges_driver", str(tmp / "log"),
                           str(tmp / "ck"), str(tmp / "ledger.db"), url, *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300, start_new_session=True)


def _log(tmp: Path, segments: int, seed: int = 4) -> None:
    cfg = GeneratorConfig(events=segments * 500, users=8, minutes=segments * 10, duplicates=0.05, seed=seed,
                          segment_size=500)
    for t in generate_segments(cfg):
        EventLog(tmp / "log").append(t)


def _by_key(calls: list[dict]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for c in calls:
        out[c["key"]].add(repr(sorted(c["payload"].items())))
    return out


@pytest.mark.slow
@pytest.mark.long  # make test's 30 minutes (2026-11-28); the window tests below stay in make test
def test_every_crash_point_with_a_changing_price_charges_each_key_once(tmp_path: Path) -> None:
    _log(tmp_path, len(POINTS) + 2)
    with ServiceProcess(tmp_path / "service.db", "--fail-after-apply", "0.1", "--timeout-after-apply", "0.05",
                        "--hang-s", "4", "--seed", "11") as svc:
        for point in POINTS:
            target = len(ckpt.committed_batches(tmp_path / "ck"))
            run = _driver(tmp_path, svc.effects_url, "--price-url", f"{svc.url}/price", "--once",
                          crash_at=f"{point}@{target}")
            assert run.returncode == -9, run.stderr[-3000:]
            assert f"crash point {point} at batch {target}" in run.stderr
        final = _driver(tmp_path, svc.effects_url, "--price-url", f"{svc.url}/price", "--once")
        assert final.returncode == 0, final.stderr[-3000:]
        effects, calls = read_effects(svc.db), read_effects(svc.db, calls=True)
    keys = [e["key"] for e in effects]
    assert len(keys) == len(set(keys)), "a charge was applied twice"
    versions = _by_key(calls)
    assert all(len(v) == 1 for v in versions.values()), "a key reached the service with two payloads"
    assert any(c["outcome"] == "replayed" for c in calls)  # the restarts did re-send keys
    prices = {e["payload"]["price"] for e in effects}
    assert len(prices) > 1  # the lookups really did change
    charged: dict[tuple[str, int], int] = defaultdict(int)
    for e in effects:
        charged[(e["payload"]["account"], e["payload"]["window_start_ms"])] += e["payload"]["bytes"]
    expected, _ = billing_expectation(tmp_path / "ck")
    assert dict(charged) == {k: b for k, (b, _) in expected.items()}  # nothing lost
    ledger = SQLiteLedger(tmp_path / "ledger.db", "charges")
    assert ledger.unconfirmed() == []
    assert sum(b["confirmed"] for b in ledger.batches()) >= len(effects) - sum(
        b["replayed"] for b in ledger.batches())
    assert not any((tmp_path / "ck" / "onceflow_stable").iterdir())  # every persisted batch deleted


def _e3(tmp: Path) -> None:
    """The element e3 of the window of batch 0's first charge, arriving after its first attempt."""
    first = pq.read_table(EventLog(tmp / "log").segments()[0].path)
    hour = (first.column("event_time").cast("int64")[0].as_py() // 3_600_000_000) * 3_600_000
    (tmp / "extra").mkdir(exist_ok=True)
    pq.write_table(pa.table({"account": [first.column("user")[0].as_py()], "window_start_ms": [hour],
                             "bytes": [777_777], "events": [1]}), tmp / "extra" / "0-e3.parquet")


@pytest.mark.parametrize("variant", ["stable", "unstable", "unstable-naive"])
def test_a_window_that_gains_an_element_between_attempts(tmp_path: Path, variant: str) -> None:
    """e0..e2 fire, the driver dies after the charges reached the service and before Spark's
    commit log; e3 arrives; the retry of the batch sees e0..e3. With stable input the service
    only ever sees the first version; without it the exactly-once sink refuses the retry (it
    will not send a second version), and a sink without a ledger sends both (negative control)."""
    _log(tmp_path, 2)
    flags = {"stable": [], "unstable": ["--no-stable"], "unstable-naive": ["--no-stable", "--naive"]}[variant]
    with ServiceProcess(tmp_path / "service.db") as svc:
        first = _driver(tmp_path, svc.effects_url, "--extra", str(tmp_path / "extra"), "--once", *flags,
                        crash_at="effects_sent@0")
        assert first.returncode == -9, first.stderr[-3000:]
        assert read_effects(svc.db)  # the charges of batch 0 reached the service
        _e3(tmp_path)
        retry = _driver(tmp_path, svc.effects_url, "--extra", str(tmp_path / "extra"), "--once", *flags)
        versions = _by_key(read_effects(svc.db, calls=True))
        applied = [e["key"] for e in read_effects(svc.db)]
    assert len(applied) == len(set(applied))  # the service honours keys: never applied twice
    two = [k for k, v in versions.items() if len(v) > 1]
    if variant == "stable":
        assert retry.returncode == 0, retry.stderr[-3000:]
        assert two == []
        assert 777_777 not in {e["payload"]["bytes"] for e in read_effects(tmp_path / "service.db")}
    elif variant == "unstable":
        assert retry.returncode != 0 and "UnstableOutputError" in retry.stderr
        assert two == []  # refused before any call
    else:
        assert retry.returncode == 0, retry.stderr[-3000:]
        assert len(two) == 1  # the window's charge reached the service in two versions

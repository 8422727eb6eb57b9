"""Two-phase commit into PostgreSQL under real SIGKILLs of the driver (billing pipeline).

The driver dies (1) with every task's transaction prepared but no decision recorded and
(2) with the decision recorded but nothing committed. After each crash prepared
transactions are left in ``pg_prepared_xacts``; after the restart none is, and the
billing and late tables hold exactly the expected rows.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.sinks.postgres import sql as pg
from onceflow.sources.log import EventLog
from onceflow.verify.crashes import CRASH_ENV
from onceflow.verify.generator import GeneratorConfig, generate_segments
from tests.examples.test_billing import read_billing
from tests.helpers import billing_expectation

pytestmark = [pytest.mark.spark, pytest.mark.faults]


def _run(tmp: Path, dsn: str, crash_at: str | None, tag: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, pg.DSN_ENV: dsn}
    env.pop(CRASH_ENV, None)
    if crash_at:
        env[CRASH_ENV] = crash_at
    cmd = [sys.executable, "-m", "onceflow.cli.main", "run", "--pipeline", "billing",
           "--sink", "postgres-2pc", "--log", str(tmp / "log"), "--checkpoint", str(tmp / "ck"),
           "--once", "--max-files-per-trigger", "2"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400,
                          start_new_session=True)
    (tmp / f"{tag}.out").write_text(proc.stdout + proc.stderr)
    return proc


def _prepared(dsn: str) -> list[str]:
    with pg.session(dsn) as conn:
        return pg.prepared_gids(conn, "of:")


def test_driver_killed_between_prepare_and_commit(pg_dsn: str, tmp_path: Path) -> None:
    cfg = GeneratorConfig(events=6_000, users=20, minutes=50, duplicates=0.1, late=0.05, seed=11,
                          segment_size=500)
    log = EventLog(tmp_path / "log")
    for seg in generate_segments(cfg):
        log.append(seg)
    crashed = _run(tmp_path, pg_dsn, "inside_sink_txn@1", "undecided")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    undecided = _prepared(pg_dsn)
    assert undecided and all(g.startswith("of:billing.billing:1:") for g in undecided)
    crashed = _run(tmp_path, pg_dsn, "after_sink_commit@2", "decided")
    assert crashed.returncode == -9, crashed.stderr[-2000:]
    decided = _prepared(pg_dsn)
    assert decided and all(g.startswith("of:billing.billing:2:") for g in decided)
    final = _run(tmp_path, pg_dsn, None, "final")
    assert final.returncode == 0, final.stderr[-2000:]
    assert _prepared(pg_dsn) == []
    bill, late = billing_expectation(tmp_path / "ck")
    assert len(late) >= 10  # late records kept, exactly once, through the crashes too
    assert read_billing(pg_dsn) == (bill, late)
    assert sum(n for _, n in bill.values()) > 5_000

"""``onceflow verify --sink iceberg`` on Example 5-1: merged counts (``add``) in Iceberg tables, all faults.

Example 5-1's tables are keyed (``user_counts`` and ``global_counts`` add each batch's counts), so
every batch rewrites the data files its keys touch (copy-on-write, by Spark's tasks) and commits
them with its marker. The auditor reads the tables with pyiceberg and checks each table's own
marker against Spark's last batch. The negative control (``iceberg-naive``, caught adding a
replayed batch twice) runs in make test: ``tests/verify/test_verify.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.verify.fault_kinds import default_faults
from tests.verify.verify_cli import run_verify as _verify

pytestmark = [pytest.mark.spark, pytest.mark.faults]


@pytest.mark.long  # 40 rounds: make test-long (RELIABILITY.md)
def test_forty_rounds_of_every_fault_leave_exact_counts_in_iceberg(tmp_path: Path) -> None:
    faults = default_faults("iceberg", pipeline=False)
    want = {"crash_inside_sink_txn", "crash_after_sink_commit", "ambiguous_commit", "sink_outage"}
    assert want <= set(faults)
    rc, out, rep = _verify(tmp_path, "--sink", "iceberg", "--rounds", "40", "--seed", "29", "--faults", "all",
                           timeout=3600)
    assert rc == 0, out[-3000:]
    rounds = rep["rounds"]
    assert len(rounds) == 40
    for r in rounds:
        assert not r["outcome"].startswith(("timed out", "unexpected", "fault not reached")), r
    outages = [r for r in rounds if r["fault"] == "sink_outage"]
    assert outages and all("the query went on" in r["outcome"] for r in outages), outages
    assert sum((r["rows_at_risk"] or 0) > 0 for r in rounds) >= 30  # the faults met batches with data
    verdict = rep["verdict"]
    assert verdict["lost"] == 0 and verdict["duplicated"] == 0 and not verdict["violations"]

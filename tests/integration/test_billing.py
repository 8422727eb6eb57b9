"""The billing pipeline (bytes per account and hour) into a real PostgreSQL server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from onceflow.generator import GeneratorConfig, generate_segments
from onceflow.pipelines.billing import run
from onceflow.pipelines.common import PipelineConfig
from onceflow.sinks import pg
from onceflow.sources.log import EventLog
from tests.helpers import billing_expectation


def read_billing(dsn: str) -> tuple[dict[tuple[str, int], tuple[int, int]], dict[str, int]]:
    with psycopg.connect(dsn) as conn:
        bill = {(a, int(w)): (int(b), int(n)) for a, w, b, n in conn.execute(
            "SELECT account, (extract(epoch from window_start) * 1000)::bigint, bytes, events "
            "FROM billing")}
        ids = [r[0] for r in conn.execute("SELECT insert_id FROM billing")]
        assert all(i.count("@") == 1 for i in ids)
        late = {e: int(w) for e, w in conn.execute(
            "SELECT event_id, (extract(epoch from missed_watermark) * 1000)::bigint "
            "FROM late_events")}
    return bill, late


def test_billing_is_exact_and_late_records_are_kept(spark: Any, pg_dsn: str, tmp_path: Path) -> None:
    cfg = GeneratorConfig(events=6_000, users=30, minutes=150, duplicates=0.1, late=0.05, seed=11,
                          segment_size=500)
    log = EventLog(tmp_path / "log")
    segments = list(generate_segments(cfg))
    for seg in segments[:6]:
        log.append(seg)
    pcfg = PipelineConfig(log_dir=tmp_path / "log", checkpoint=tmp_path / "ck", max_files_per_trigger=2)
    run(spark, pcfg, pg_dsn)
    for seg in segments[6:]:
        log.append(seg)
    result = run(spark, pcfg, pg_dsn)  # resumes from the checkpoint
    assert result.batches >= 3
    bill, late = billing_expectation(tmp_path / "ck")
    assert len(late) >= 10  # the test has late data to keep
    assert sum(n for _, n in bill.values()) > 5_000
    found_bill, found_late = read_billing(pg_dsn)
    assert found_bill == bill
    assert found_late == late
    markers = pg.read_batches(pg_dsn, "billing")
    assert [m["batch_id"] for m in markers] == list(range(len(markers)))
    assert len(pg.read_batches(pg_dsn, "billing.late")) == len(markers)

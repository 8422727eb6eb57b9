"""The billing pipeline (bytes per account and hour) into a real PostgreSQL server."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import psycopg

from onceflow.cli.run import PipelineConfig, Totals, run_pipeline
from onceflow.sinks.postgres import sql as pg
from onceflow.sources.log import EventLog
from onceflow.verify.generator import GeneratorConfig, generate_segments
from onceflow.verify.sinks import SinkOptions, make_sink
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


def run(spark: Any, cfg: PipelineConfig, dsn: str, kind: str = "postgres-staged") -> Totals:
    """The billing example (``onceflow.examples.billing``) as ``onceflow run --pipeline billing`` runs it."""
    sink = make_sink(kind, SinkOptions(pg_dsn=dsn), sink_id="billing")
    try:
        return run_pipeline(spark, cfg, sink, once=True, pipeline="billing")
    finally:
        sink.close()


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
    assert result.batches_committed >= 3
    bill, late = billing_expectation(tmp_path / "ck")
    assert len(late) >= 10  # the test has late data to keep
    assert sum(n for _, n in bill.values()) > 5_000
    found_bill, found_late = read_billing(pg_dsn)
    assert found_bill == bill
    assert found_late == late
    markers = pg.read_batches(pg_dsn, "billing.billing")  # executor-side: a marker per table
    assert [m["batch_id"] for m in markers] == list(range(len(markers)))
    late_markers = [m["batch_id"] for m in pg.read_batches(pg_dsn, "billing.late_events")]
    assert 1 <= len(late_markers) < len(markers)  # only batches that dropped late rows write them


def test_billing_into_sqlite_is_exact_too(spark: Any, tmp_path: Path) -> None:
    """The same example on the embedded sink: one transaction per batch for both tables."""
    import sqlite3
    from datetime import datetime, timezone

    for seg in generate_segments(GeneratorConfig(events=4_000, users=10, minutes=40, duplicates=0.1,
                                                 late=0.05, seed=12, segment_size=250)):
        EventLog(tmp_path / "log").append(seg)
    pcfg = PipelineConfig(log_dir=tmp_path / "log", checkpoint=tmp_path / "ck", max_files_per_trigger=2)
    sink = make_sink("sqlite", SinkOptions(db=tmp_path / "billing.db"), sink_id="billing")
    try:
        run_pipeline(spark, pcfg, sink, once=True, pipeline="billing")
    finally:
        sink.close()

    def ms(text: str) -> int:
        return int(datetime.fromisoformat(text).replace(tzinfo=timezone.utc).timestamp() * 1000)

    with sqlite3.connect(tmp_path / "billing.db") as conn:
        bill = {(a, ms(w)): (b, n) for a, w, b, n in conn.execute(
            "SELECT account, window_start, bytes, events FROM billing")}
        late = {e: ms(w) for e, w in conn.execute("SELECT event_id, missed_watermark FROM late_events")}
        markers = conn.execute("SELECT count(*), sum(late_dropped) FROM onceflow_batches "
                               "WHERE sink_id = 'billing'").fetchone()
    exp_bill, exp_late = billing_expectation(tmp_path / "ck")
    assert len(exp_late) >= 5
    assert bill == exp_bill
    assert late == exp_late
    assert markers[0] >= 3 and markers[1] >= len(exp_late)  # late rows counted, then kept

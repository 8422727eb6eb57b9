"""``onceflow verify --pipeline PATH.py:FUNCTION --input DIR``: a user's own pipeline, proven or caught.

The pipelines: ``tests/verify/pipelines/orders.py`` (written for these tests only: two tables
merged with ``add``/``max``/``min``, late orders in their own table; ``build_uuid`` is the same with
a key minted by ``uuid4()`` in ``per_batch``) and the payments example (an ``add`` table and an
``append`` table), through :mod:`onceflow.testing` as a user's CI would call it.
"""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onceflow.examples import payments
from onceflow.testing import explain, verify_pipeline
from tests.verify.pipelines import sample
from tests.verify.verify_cli import run_verify as _verify

pytestmark = [pytest.mark.spark, pytest.mark.faults]

ORDERS = str(Path(__file__).parent / "pipelines" / "orders.py")
KAFKA = str(Path(__file__).parent / "pipelines" / "orders_kafka.py")


@pytest.mark.long  # make test measured 32:53 on a slow day (2026-11-27): multi-round runs go long
def test_every_fault_kind_on_the_orders_pipeline_leaves_exact_tables(orders_sample: Path,
                                                                      tmp_path: Path) -> None:
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{ORDERS}:build", "--input", str(orders_sample),
                           "--rounds", "9", "--seed", "5", "--faults", "all")
    assert rc == 0, out
    kinds = [r["fault"] for r in rep["rounds"]]
    assert sorted(kinds) == sorted(["kill_random", "crash_before_sink_write", "crash_inside_sink_txn",
                                    "crash_after_sink_commit", "crash_after_commit_log",
                                    "crash_apply_pending", "ambiguous_commit", "trigger_change",
                                    "sink_outage"])
    for r in rep["rounds"]:
        assert not r["outcome"].startswith(("timed out", "unexpected", "fault not reached")), r
        if r["fault"].startswith("crash_") or r["fault"] in ("ambiguous_commit", "sink_outage"):
            assert r["rows_at_risk"] > 0, r  # each crash met a batch with orders in it
    outage = next(r for r in rep["rounds"] if r["fault"] == "sink_outage")
    assert "locked by another process" in outage["outcome"] and "the query went on" in outage["outcome"]
    assert " 0 retries" not in outage["outcome"], outage  # the batch waited out the lock by retrying
    tables = rep["verdict"]["tables"]
    assert set(tables) == {"customers", "hourly"}
    assert tables["customers"]["expected_rows"] == 40 and tables["hourly"]["expected_rows"] > 1
    assert rep["verdict"]["late_expected"] == rep["verdict"]["late_recorded"] > 0  # late orders, by id
    # the oracle's tables are the user's own transform over each order once: check one total by hand
    rows = [json.loads(ln) for f in sorted(orders_sample.iterdir()) for ln in f.read_text().splitlines()]
    with sqlite3.connect(tmp_path / "work" / "sink.db") as conn:
        stored = conn.execute("SELECT sum(orders) FROM customers").fetchone()[0]
        late = conn.execute("SELECT count(*) FROM late_orders").fetchone()[0]
    distinct = len({r["order_id"] for r in rows})  # each counted at most once; late or counted
    assert stored <= distinct <= stored + late


@pytest.mark.long  # ~90 s: every driver starts a Spark Connect server of its own
def test_the_orders_pipeline_verified_through_spark_connect(orders_sample: Path, tmp_path: Path) -> None:
    """``--cluster connect``: each driver a Connect client of its own server; the crash points fire
    in the server's foreachBatch worker and take the server down; every fault hits data."""
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{ORDERS}:build", "--input", str(orders_sample),
                           "--cluster", "connect", "--rounds", "3", "--seed", "5",
                           "--faults", "kill_random,crash_inside_sink_txn,crash_after_sink_commit")
    assert rc == 0, out
    assert [r["fault"] for r in rep["rounds"]] == ["kill_random", "crash_inside_sink_txn",
                                                   "crash_after_sink_commit"]
    assert all(r["rows_at_risk"] > 0 for r in rep["rounds"]), rep["rounds"]
    assert "OK: nothing lost, nothing duplicated" in out


@pytest.mark.long  # make test's 30 minutes (2026-11-28); test_report_risk.py's naive sink stays there
def test_a_negative_control_sink_is_caught_on_the_orders_pipeline(orders_sample: Path,
                                                                   tmp_path: Path) -> None:
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{ORDERS}:build", "--input", str(orders_sample),
                           "--rounds", "2", "--seed", "5", "--faults", "crash_after_sink_commit",
                           "--sink", "naive")
    assert rc == 1, out
    assert all(r["rows_at_risk"] > 0 for r in rep["rounds"]), rep["rounds"]
    assert rep["verdict"]["tables"]["customers"]["duplicated_events"] > 0
    assert "too high (duplicated)" in out


@pytest.mark.long  # make test's 30 minutes (2026-11-28); test_report_risk.py's naive sink stays there
def test_a_key_minted_with_uuid4_in_per_batch_is_caught(orders_sample: Path, tmp_path: Path) -> None:
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{ORDERS}:build_uuid", "--input", str(orders_sample),
                           "--rounds", "1", "--seed", "5", "--faults", "crash_after_sink_commit")
    assert rc == 1, out
    receipts = rep["verdict"]["tables"]["receipts"]
    assert receipts["lost_events"] == receipts["expected_rows"] > 0
    assert "uuid4()" in out
    assert rep["verdict"]["tables"]["customers"]["lost_events"] == 0  # the rest of the pipeline is exact


@pytest.mark.long  # make test's time: PostgreSQL restarts (tests/core/test_outages.py) and crashes inside
# its transaction (tests/sinks/test_contract_example51.py) are proven in make test
def test_postgres_outage_and_a_crash_inside_the_transaction(orders_sample: Path, tmp_path: Path,
                                                             pg_dsn: str) -> None:
    """The orders pipeline on PostgreSQL: its connections terminated mid-batch, then a crash."""
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{ORDERS}:build", "--input", str(orders_sample),
                           "--rounds", "2", "--seed", "6", "--faults", "sink_outage,crash_inside_sink_txn",
                           "--sink", "postgres", env={"ONCEFLOW_PG_DSN": pg_dsn})
    assert rc == 0, out
    outage, crash = rep["rounds"]
    assert "connections terminated" in outage["outcome"] and "the query went on" in outage["outcome"], outage
    assert outage["rows_at_risk"] > 0 and crash["rows_at_risk"] > 0, rep["rounds"]
    assert rep["verdict"]["tables"]["customers"]["expected_rows"] == 40
    schema = rep["config"]["sink_location"].rsplit(" schema ", 1)[1]
    assert f"schema {schema} dropped" in out  # verify leaves nothing in the user's database
    with psycopg.connect(pg_dsn) as conn:
        assert conn.execute("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'onceflow_verify_%%'"
                            ).fetchall() == []


def test_the_payments_example_through_onceflow_testing_on_delta(tmp_path: Path) -> None:
    inputs = tmp_path / "sample"
    payments.generate(inputs, 6_000, per_file=1_000, duplicates=0.05, seed=9)
    result = verify_pipeline(f"{payments.__file__}:build", inputs, workdir=tmp_path / "v", rounds=3, seed=2,
                             sink="delta", faults=["crash_inside_sink_txn", "crash_after_sink_commit",
                                                   "kill_random"])
    text = explain(result)
    assert result.ok, text
    assert set(result.verdict.tables) == {"revenue", "payments"}
    assert result.verdict.tables["payments"].expected_rows == 6_000  # append: each payment once
    assert (tmp_path / "v" / "report.html").exists()
    assert "with data at risk" in text


@pytest.mark.long  # ~150 s (the Kafka source reads ~500 offsets a batch): make test-long
def test_a_kafka_pipeline_under_crashes(orders_sample: Path, tmp_path: Path) -> None:
    """``--source kafka``: verify produces the records (resends included) to a topic in rounds."""
    records = tmp_path / "records.jsonl"
    records.write_text("".join(f.read_text() for f in sorted(orders_sample.iterdir())))
    kafka = ["--pipeline", f"{KAFKA}:build", "--source", "kafka", "--input", str(records), "--seed", "7"]
    rc, out, rep = _verify(tmp_path / "report", *kafka, "--rounds", "3",
                           "--faults", "crash_inside_sink_txn,crash_after_sink_commit,kill_random")
    assert rc == 0, out
    assert all(r["rows_at_risk"] > 0 for r in rep["rounds"] if r["fault"].startswith("crash_")), rep["rounds"]
    assert rep["verdict"]["tables"]["customers"]["expected_rows"] == 40
    rc, out, rep = _verify(tmp_path / "naive", *kafka, "--rounds", "1", "--faults", "crash_after_sink_commit",
                           "--sink", "naive")
    assert rc == 1 and rep["verdict"]["tables"]["customers"]["duplicated_events"] > 0, out


@pytest.mark.long  # ~50 s: make test-long (test_kafka_native.py checks the columns in make test)
def test_a_kafka_pipeline_reading_headers_is_judged(orders_sample: Path, tmp_path: Path) -> None:
    """``include_headers=True``: the oracle gives the batch the records' headers as the reader does."""
    records, channels = tmp_path / "records.jsonl", ["web", "app", "store"]
    lines = [ln for f in sorted(orders_sample.iterdir()) for ln in f.read_text().splitlines() if ln.strip()]
    with records.open("w") as out:  # a resent order is the same record: its channel follows its id
        for i, line in enumerate(lines):
            order = json.loads(line)
            n = sum(str(order.get("order_id")).encode())
            headers = {"channel": channels[n % 3]} if n % 7 else {}  # every 7th id without it: 'none'
            out.write(json.dumps({"value": order, "key": f"k{i}", "headers": headers}) + "\n")
    rc, out, rep = _verify(tmp_path / "report", "--pipeline", f"{KAFKA}:build_channels", "--source", "kafka",
                           "--input", str(records), "--rounds", "2", "--seed", "9",
                           "--faults", "crash_after_sink_commit,kill_random")
    assert rc == 0, out
    assert rep["verdict"]["tables"]["channels"]["expected_rows"] == 4, rep["verdict"]["tables"]
    with sqlite3.connect(tmp_path / "report" / "work" / "sink.db") as conn:
        got = {c for (c,) in conn.execute("SELECT channel FROM channels")}
    assert got == {*channels, "none"}, got


@pytest.mark.long  # make test-long (make test's 30 minutes); the same judging on files runs in make test
def test_an_input_contract_on_kafka_records_and_its_rejects_are_judged(tmp_path: Path) -> None:
    """read_kafka + expect(json="value") + deduplicate + rejects= (the guide's shape), verify producing."""
    sample_dir = tmp_path / "sample"
    sample.write(sample_dir, files=3, per_file=500, seed=8)
    bad = sample.add_bad_lines(sample_dir, seed=8)
    records = tmp_path / "records.jsonl"
    records.write_text("".join(f.read_text() for f in sorted(sample_dir.iterdir())))
    rc, out, rep = _verify(tmp_path / "report", "--pipeline", f"{KAFKA}:build_rejects", "--source", "kafka",
                           "--input", str(records), "--rounds", "2", "--seed", "4",
                           "--faults", "crash_after_sink_commit,kill_random")
    assert rc == 0, out
    rejected = rep["verdict"]["tables"]["rejected_orders"]
    assert rejected["expected_rows"] == rejected["actual_rows"] == len(bad), rejected
    with sqlite3.connect(tmp_path / "report" / "work" / "sink.db") as conn:
        rules = sorted(r for (r,) in conn.execute("SELECT rule FROM rejected_orders"))
        coords = [r for (r,) in conn.execute("SELECT record FROM rejected_orders")]
    assert rules == sorted(r for _, _, r, _ in bad)
    assert all(c.startswith("verify-events/") for c in coords), coords  # topic/partition/offset


@pytest.mark.long  # ~50 s; make test runs format("kafka") in test_pipeline_kafka_sink.py
def test_a_pipeline_reading_kafka_with_spark_s_reader_into_kafka(orders_sample: Path, tmp_path: Path) -> None:
    """``format("kafka")`` in the user's code (Spark's connector, its columns) and ``--sink kafka``."""
    records = tmp_path / "records.jsonl"
    records.write_text("".join(f.read_text() for f in sorted(orders_sample.iterdir())))
    rc, out, rep = _verify(tmp_path / "report", "--pipeline", f"{KAFKA}:build_spark_reader", "--source",
                           "kafka", "--sink", "kafka", "--input", str(records), "--seed", "7",
                           "--rounds", "1", "--faults", "crash_after_sink_commit")
    assert rc == 0, out
    assert rep["rounds"][0]["rows_at_risk"] > 0, rep["rounds"]
    assert rep["verdict"]["tables"]["customers"]["expected_rows"] == 40
    entry = (tmp_path / "report" / "work" / "checkpoint" / "offsets" / "0").read_text().splitlines()[-1]
    logged = json.loads(entry)  # Spark's connector's form: {topic: {partition: offset}}
    assert list(logged) == ["verify-events"]
    assert all(isinstance(v, int) for v in logged["verify-events"].values())


def test_pipeline_mistakes_are_named_before_any_round(tmp_path: Path, orders_sample: Path) -> None:
    rc, out, _ = _verify(tmp_path, "--pipeline", f"{ORDERS}:nope", "--input", str(orders_sample))
    assert rc == 2 and "has no function 'nope'" in out and "build" in out
    rc, out, _ = _verify(tmp_path, "--pipeline", ORDERS, "--input", str(orders_sample))
    assert rc == 2 and "PATH.py:FUNCTION" in out
    rc, out, _ = _verify(tmp_path, "--pipeline", f"{ORDERS}:build")
    assert rc == 2 and "--input" in out
    rc, out, _ = _verify(tmp_path, "--pipeline", f"{ORDERS}:build", "--input", str(orders_sample),
                         "--faults", "late_events,kill_random")
    assert rc == 2 and "the sample is the input" in out
    rc, out, _ = _verify(tmp_path, "--pipeline", f"{ORDERS}:build", "--input", str(orders_sample),
                         "--sink", "http")
    assert rc == 2 and "--sink sqlite" in out


def test_a_pipeline_the_oracle_cannot_rerun_is_refused_before_any_round(tmp_path: Path,
                                                                       orders_sample: Path) -> None:
    """A streaming aggregation in append mode: refused in seconds by the dry run, no round run."""
    started = time.monotonic()
    rc, out, rep = _verify(tmp_path, "--pipeline", f"{ORDERS}:build_append_aggregate", "--input",
                           str(orders_sample), "--rounds", "3")
    assert rc == 2, out
    assert "the oracle cannot rerun" in out and "build_append_aggregate" in out and "nothing was run" in out
    assert "output_mode='update'" in out, out
    assert not (tmp_path / "work" / "checkpoint").exists() and rep == {}
    assert time.monotonic() - started < 120  # a session start and one static batch, not three rounds
    records = tmp_path / "records.jsonl"  # the same with --source kafka: the sample as one batch
    records.write_text("".join(f.read_text() for f in sorted(orders_sample.iterdir())))
    rc, out, rep = _verify(tmp_path / "kafka", "--pipeline", f"{KAFKA}:build_append_aggregate", "--source",
                           "kafka", "--input", str(records), "--rounds", "3")
    assert rc == 2 and "the oracle cannot rerun" in out and "output_mode='update'" in out, out
    assert rep == {}


def test_an_input_contract_and_its_rejects_table_are_judged(tmp_path: Path) -> None:
    """The Kafka guide's shape on text files: expect(json=...) + deduplicate + rejects=, under faults."""
    sample_dir = tmp_path / "sample"
    sample.write(sample_dir, files=4, per_file=600, seed=7)
    bad = sample.add_bad_lines(sample_dir, seed=7)
    rc, out, rep = _verify(tmp_path / "report", "--pipeline", f"{ORDERS}:build_rejects", "--input",
                           str(sample_dir), "--rounds", "2", "--seed", "3",
                           "--faults", "kill_random,crash_after_sink_commit")
    assert rc == 0, out
    assert all(r["rows_at_risk"] > 0 for r in rep["rounds"]), rep["rounds"]
    rejected = rep["verdict"]["tables"]["rejected_orders"]
    assert rejected["expected_rows"] == rejected["actual_rows"] == len(bad), rejected
    with sqlite3.connect(tmp_path / "report" / "work" / "sink.db") as conn:  # by hand, against the sample
        got = sorted((r, c) for r, c in conn.execute("SELECT rule, \"column\" FROM rejected_orders"))
    assert got == sorted((r, c) for _, _, r, c in bad)


def test_the_testing_plugin_gives_a_temporary_sink(onceflow_sink: Any, tmp_path: Path) -> None:
    from onceflow.sinks.sqlite.sink import SQLiteTablesSink

    assert isinstance(onceflow_sink, SQLiteTablesSink)
    assert onceflow_sink.path.parent == tmp_path

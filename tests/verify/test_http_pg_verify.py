"""``--sink http-tasks-pg``: the HTTP sink's tasks path with its ledger in PostgreSQL, as verify runs it.

No Spark here: the sink verify builds, the schema and service verify prepares (a real PostgreSQL
server and the demo service's process), and the auditor reading the PostgreSQL ledger — which must
be able to fail (a key left ``started``, a marker the ledger lacks). The rounds themselves (task
deaths, crash points, a killed executor) run in ``make test-long``: tests/verify/test_verify.py and
tests/verify/test_verify_kafka.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from onceflow.errors import ConfigError
from onceflow.sinks.http.ledger import Effect, PgLedger
from onceflow.sinks.http.sink import HttpEffectsSink
from onceflow.verify.fault_kinds import default_faults, reaches
from onceflow.verify.oracle import Expectation
from onceflow.verify.sinks import SinkOptions, make_sink
from onceflow.verify.targets import SinkTarget
from onceflow.verify.verdict import judge_effects, started_keys

KIND = "http-tasks-pg"


def test_the_kind_needs_a_service_and_a_postgresql_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ONCEFLOW_PG_DSN", raising=False)
    with pytest.raises(ConfigError, match="--effects-url"):
        make_sink(KIND, SinkOptions(pg_dsn="host=127.0.0.1 dbname=x"))
    with pytest.raises(ConfigError, match="ONCEFLOW_PG_DSN"):  # no --db fallback: the ledger is PostgreSQL's
        make_sink(KIND, SinkOptions(effects_url="http://127.0.0.1:9/", db=Path("ledger.db")))


def test_its_faults_are_the_tasks_ones_without_a_transaction_to_crash_inside() -> None:
    assert reaches(KIND, "crash_task_after_write") and reaches(KIND, "executor_kill_mid_write")
    assert not reaches(KIND, "crash_inside_sink_txn") and not reaches(KIND, "sink_outage")
    assert not reaches(KIND, "crash_effects_sent")  # the driver-side path's points: never on this path
    assert "executor_kill_mid_write" in default_faults(KIND, "standalone")


def test_verify_puts_the_ledger_in_a_schema_of_its_own_and_its_auditor_reads_it(tmp_path: Path,
                                                                               pg_dsn: str) -> None:
    target = SinkTarget(KIND, tmp_path, pg_dsn)
    target.prepare()
    try:
        assert target.is_postgres and target.schema.startswith("onceflow_verify_")
        assert target.extra_args()[0] == "--effects-url"  # the demo service runs
        sink = make_sink(KIND, SinkOptions(effects_url=target.service.effects_url, pg_dsn=target.dsn),
                         sink_id="user_counts")
        assert isinstance(sink, HttpEffectsSink) and sink.ledger_ref == target.dsn
        ledger = sink.ledger
        assert isinstance(ledger, PgLedger)
        assert not list(tmp_path.glob("*ledger*"))  # no file: the tasks of a cluster reach the database

        empty = Expectation(user_counts={}, global_counts={}, batches=[], uncommitted_batches=[])
        assert started_keys(target.dsn, "user_counts") == 0
        assert judge_effects(tmp_path / "service.db", target.dsn, empty, "user_counts").ok
        plan = ledger.start(0, [Effect("user_counts/user_counts/a/0", '{"count": 1}'),
                                Effect("user_counts/user_counts/b/0", '{"count": 2}')], resend_started=True)
        assert plan is not None and len(plan.send) == 2
        assert started_keys(target.dsn, "user_counts") == 2  # recorded before any call, never confirmed
        verdict = judge_effects(tmp_path / "service.db", target.dsn, empty, "user_counts")
        assert not verdict.ok
        assert "2 effects started and never confirmed in the ledger" in verdict.violations
        ledger.confirm([("user_counts/user_counts/a/0", 200, 1), ("user_counts/user_counts/b/0", 200, 1)])
        assert started_keys(target.dsn, "user_counts") == 0
        assert target.batches() == [] and target.committed_batches() == 0
        sink.close()
    finally:
        target.close()
        said = target.drop()
    assert f"schema {target.schema} dropped" in said

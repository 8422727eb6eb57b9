"""The side-effect sink against the real demo service (a separate process), without Spark.

Every crash test SIGKILLs a real child process at a named crash point, then restarts it;
the service's own records (every call received, every effect applied) are the evidence.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from onceflow.errors import EffectsFailedError, UnstableOutputError
from onceflow.sinks.http.sink import HttpEffectsSink, effects_of
from onceflow.verify.crashes import CRASH_ENV
from onceflow.verify.service import ServiceProcess, read_effects
from tests.sinks.http_child import SPECS, STATS, charges

pytestmark = pytest.mark.faults

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    with ServiceProcess(tmp_path / "service.db") as s:
        yield s


def _child(url: str, ledger: Path, batch: int, version: int = 0, *flags: str,
           crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at:
        env[CRASH_ENV] = crash_at
    return subprocess.run([sys.executable, "-m", "tests.sinks.http_child", url, str(ledger), str(batch),
                           str(version), *flags], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def _applied(db: Path) -> Counter[str]:
    return Counter(e["key"] for e in read_effects(db))


def test_every_row_is_applied_once_and_a_replay_sends_nothing(tmp_path: Path,
                                                              service: ServiceProcess) -> None:
    sink = HttpEffectsSink(service.effects_url, tmp_path / "ledger.db")
    sink.bind("q1")
    assert sink.commit_tables(0, charges(0), SPECS, STATS, 20)
    assert not sink.commit_tables(0, charges(0), SPECS, STATS, 20)  # replay: nothing sent
    assert sink.commit_tables(1, charges(1), SPECS, STATS, 20)
    applied = _applied(service.db)
    assert len(applied) == 40 and set(applied.values()) == {1}
    assert len(read_effects(service.db, calls=True)) == 40  # the replay made no call
    effects = read_effects(service.db)
    assert effects[0]["key"] == "default/charges/acct-000/0"
    assert effects[0]["payload"] == {"account": "acct-000", "hour": 0, "amount": 100}
    metrics = sink.effect_batches()
    assert [(m["batch_id"], m["new_keys"], m["calls"], m["applied"], m["confirmed"]) for m in metrics] == \
        [(0, 20, 20, 20, 20), (1, 20, 20, 20, 20)]
    assert sink.unconfirmed() == []
    assert [m["rows_written"] for m in sink.batches()] == [20, 20]
    sink.close()


@pytest.mark.parametrize("point", ["effects_started", "effects_sent", "after_sink_commit"])
def test_sigkill_at_each_point_then_restart_applies_each_key_exactly_once(tmp_path: Path, point: str) -> None:
    """An idempotent service that also fails 20% of calls after applying them (500) and times
    out 10% after applying them: the retries and the restart send keys again, never twice applied."""
    with ServiceProcess(tmp_path / "service.db", "--fail-after-apply", "0.2", "--timeout-after-apply", "0.1",
                        "--hang-s", "3", "--seed", "5") as svc:
        ledger = tmp_path / "ledger.db"
        crashed = _child(svc.effects_url, ledger, 0, crash_at=point)
        assert crashed.returncode == -9, crashed.stderr[-2000:]
        again = _child(svc.effects_url, ledger, 0)
        assert again.returncode == 0, again.stderr[-2000:]
        assert again.stdout.strip() == ("replayed" if point == "after_sink_commit" else "committed")
        applied = _applied(svc.db)
        assert len(applied) == 20 and set(applied.values()) == {1}
        calls = read_effects(svc.db, calls=True)
        if point == "effects_sent":  # the restart sent the keys again: the service recognised them
            assert any(c["outcome"] == "replayed" for c in calls)
        if point == "after_sink_commit":
            assert len({c["key"] for c in calls}) == 20  # nothing new was sent by the restart


def test_a_service_without_idempotency_gets_at_most_one_completed_call_per_key(tmp_path: Path) -> None:
    """Killed after its calls, before the ledger recorded them: the restart never calls those keys
    again; the ledger lists them as started, not confirmed, for reconciliation."""
    with ServiceProcess(tmp_path / "service.db", "--ignore-keys") as svc:
        ledger = tmp_path / "ledger.db"
        crashed = _child(svc.effects_url, ledger, 0, 0, "--ignore-keys", crash_at="effects_sent")
        assert crashed.returncode == -9
        again = _child(svc.effects_url, ledger, 0, 0, "--ignore-keys")
        assert again.returncode == 0 and "reconcile" in again.stderr
        applied = _applied(svc.db)
        assert len(applied) == 20 and set(applied.values()) == {1}
        sink = HttpEffectsSink(svc.effects_url, ledger, idempotent=False)
        held = sink.unconfirmed()
        assert len(held) == 20  # applied by the service, never confirmed: the user reconciles these
        assert sink.effect_batches()[0]["held"] == 20 and sink.effect_batches()[0]["calls"] == 0
        sink.close()
    cli = [sys.executable, "-m", "onceflow.cli.main", "effects", "--ledger", str(ledger),
           "--sink-id", "default"]
    listed = subprocess.run([*cli, "--unconfirmed"], capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    keys = [json.loads(line)["key"] for line in listed.stdout.splitlines()]
    assert sorted(keys) == sorted(e.key for e in effects_of("default", "charges", SPECS["charges"],
                                                            charges(0)["charges"], 0))
    summary = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert "1 batches: 20 effects, 0 calls attempted, 0 confirmed" in summary.stdout
    assert "20 keys started and never confirmed" in summary.stdout
    missing = subprocess.run([*cli[:-4], "--ledger", str(tmp_path / "nope.db")], capture_output=True,
                             text=True, timeout=60)
    assert missing.returncode == 1 and "no ledger at" in missing.stderr


def test_negative_control_without_the_ledger_a_crash_after_the_call_duplicates(tmp_path: Path) -> None:
    with ServiceProcess(tmp_path / "service.db", "--ignore-keys") as svc:
        ledger = tmp_path / "ledger.db"
        # the naive sink has no ledger: the crash after its calls, then the retry, calls again
        crashed = _child(svc.effects_url, ledger, 0, 0, "--ignore-keys", "--naive", crash_at="effects_sent")
        assert crashed.returncode == -9
        assert _child(svc.effects_url, ledger, 0, 0, "--ignore-keys", "--naive").returncode == 0
        applied = _applied(svc.db)
        assert len(applied) == 20 and set(applied.values()) == {2}  # every effect twice


def test_another_payload_on_a_retry_is_refused_before_any_call(tmp_path: Path,
                                                               service: ServiceProcess) -> None:
    ledger = tmp_path / "ledger.db"
    assert _child(service.effects_url, ledger, 0, 0, crash_at="effects_started").returncode == -9
    retry = _child(service.effects_url, ledger, 0, 1)  # the retry computed other amounts
    assert retry.returncode != 0
    assert "UnstableOutputError" in retry.stderr and "stable=True" in retry.stderr
    assert read_effects(service.db, calls=True) == []  # nothing reached the service
    sink = HttpEffectsSink(service.effects_url, ledger)
    sink.bind("q1")
    with pytest.raises(UnstableOutputError, match="batch 0: effect default/charges/acct-000/0"):
        sink.commit_tables(0, charges(0, 1), SPECS, STATS, 20)
    assert sink.commit_tables(0, charges(0, 0), SPECS, STATS, 20)  # the first version goes through


def test_refused_and_undeliverable_effects_fail_the_batch_and_are_sent_again(tmp_path: Path) -> None:
    ledger = tmp_path / "ledger.db"
    sink = HttpEffectsSink("http://127.0.0.1:9/effects", ledger, retries=2, backoff_s=0.01)  # nothing listens
    sink.bind("q1")
    with pytest.raises(EffectsFailedError, match=r"20 of 20 effects were not confirmed: 20 never reached the "
                                                 r"service \(not applied\) .*no connection"):
        sink.commit_tables(0, charges(0), SPECS, STATS, 20)
    assert sink.unconfirmed() == []  # never reached a service: forgotten, sent as new next time
    assert sink.batches() == []
    with ServiceProcess(tmp_path / "service.db") as svc:
        sink.url = svc.effects_url
        assert sink.commit_tables(0, charges(0), SPECS, STATS, 20)
        assert len(_applied(svc.db)) == 20
    sink.close()


def test_bad_configuration_is_refused(tmp_path: Path) -> None:
    from onceflow.errors import ConfigError
    from onceflow.sinks._core.tables import Table

    with pytest.raises(ConfigError, match="must start with http"):
        HttpEffectsSink("localhost:8080", tmp_path / "l.db")
    sink = HttpEffectsSink("http://127.0.0.1:9/effects", tmp_path / "l.db")
    with pytest.raises(ConfigError, match="needs key"):
        sink.commit_tables(0, charges(0), {"charges": Table()}, STATS, 20)


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_is_refused_naming_where_it_points_and_nothing_counts_as_applied(
        tmp_path: Path, service: ServiceProcess, status: int) -> None:
    sink = HttpEffectsSink(f"{service.url}/moved/{status}", tmp_path / "ledger.db")
    sink.bind("q1")
    with pytest.raises(EffectsFailedError, match=rf"20 of 20 effects were not confirmed: 20 refused by the "
                                                 rf"service \(e.g. .*HTTP {status} redirect to /effects"):
        sink.commit_tables(0, charges(0), SPECS, STATS, 20)
    assert sink.batches() == [] and sink.unconfirmed() == []  # refused keys are forgotten: resent on restart
    assert read_effects(service.db) == []
    sink.close()
    fixed = HttpEffectsSink(service.effects_url, tmp_path / "ledger.db")  # the URL corrected, batch re-run
    fixed.bind("q1")
    assert fixed.commit_tables(0, charges(0), SPECS, STATS, 20)
    assert len(_applied(service.db)) == 20
    fixed.close()


def test_an_unknown_outcome_is_not_called_not_applied(tmp_path: Path) -> None:
    """Every call applied and then answered 500: the sink must not say 'not applied'."""
    with ServiceProcess(tmp_path / "service.db", "--fail-after-apply", "1.0") as svc:
        sink = HttpEffectsSink(svc.effects_url, tmp_path / "ledger.db", retries=2, backoff_s=0.01)
        sink.bind("q1")
        with pytest.raises(EffectsFailedError) as err:
            sink.commit_tables(0, charges(0), SPECS, STATS, 20)
        assert "20 have an unknown outcome (timeouts or 5xx answers: the service may have applied them)" \
            in str(err.value)
        assert "not applied" not in str(err.value)
        assert len(_applied(svc.db)) == 20  # the service did apply them
        sink.close()


def test_an_upsert_table_sends_a_later_batchs_new_value_for_a_known_key(tmp_path: Path,
                                                                       service: ServiceProcess) -> None:
    from onceflow.sinks._core.tables import Table

    sink = HttpEffectsSink(service.effects_url, tmp_path / "ledger.db")
    sink.bind("q1")
    specs = {"charges": Table(key=["account", "hour"])}  # upsert: the key's latest value
    first, second = charges(0), charges(0, version=1)  # the same keys, other amounts
    assert sink.commit_tables(0, first, specs, STATS, 20)
    assert sink.commit_tables(1, second, specs, STATS, 20)
    assert not sink.commit_tables(1, second, specs, STATS, 20)  # a replay sends nothing
    latest: dict[tuple[str, int], int] = {}
    for effect in read_effects(service.db):  # in the order the service applied them
        latest[(effect["payload"]["account"], effect["payload"]["hour"])] = effect["payload"]["amount"]
    want = {(r["account"], r["hour"]): r["amount"] for r in second["charges"].to_pylist()}
    assert latest == want and len(read_effects(service.db)) == 40
    sink.close()

"""The HTTP sink with its ledger in PostgreSQL: no file shared with the tasks, the same guarantees.

The tasks path (a child process, :mod:`tests.sinks.http_tasks_child`, ``collect_below=0``) calls a
real HTTP service (:class:`ServiceProcess`) with the ledger in a real PostgreSQL database: a task's
first attempt SIGKILLed after its calls were confirmed (Spark's retry must send nothing again), the
driver SIGKILLed after a batch's marker (the re-run replays it). The oracle is the child's own rows
(:func:`tests.sinks.http_tasks_child.rows`, folded here), compared with what the service applied and
with every call it received. The driver-side path and the commands that read a ledger (``onceflow
effects``, ``tables``, ``repair``'s markers) take the same PostgreSQL URL.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from click.testing import CliRunner

from onceflow.cli.main import cli
from onceflow.errors import ConfigError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.http.ledger import PgLedger, is_dsn, open_ledger
from onceflow.sinks.http.sink import HttpEffectsSink
from onceflow.verify.crashes import CRASH_ENV
from onceflow.verify.service import ServiceProcess, read_effects
from tests.sinks.http_tasks_child import ROWS, rows

pytestmark = [pytest.mark.spark, pytest.mark.faults]
ROOT = Path(__file__).resolve().parents[2]


def _child(url: str, ledger: str, master: str, *batches: int,
           crash_at: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != CRASH_ENV}
    if crash_at:
        env[CRASH_ENV] = crash_at
    args = [sys.executable, "-m", "tests.sinks.http_tasks_child", url, ledger, master, *map(str, batches)]
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def _want(batches: range) -> Counter[str]:
    """Every effect key of the batches, once each (this test's own fold of the child's rows)."""
    keys: Counter[str] = Counter()
    for b in batches:
        accounts = set()
        for account, hour, _amount in rows(b):
            keys[f"default/charges/{account}/{hour}"] += 1
            accounts.add(account)
        keys.update(f"default/counts/{a}/{b}" for a in accounts)
    return keys


def test_tasks_reach_a_postgresql_ledger_and_killed_tasks_or_driver_apply_each_effect_once(
        tmp_path: Path, pg_dsn: str) -> None:
    assert is_dsn(pg_dsn)
    with ServiceProcess(tmp_path / "service.db") as service:
        url = service.effects_url
        done = _child(url, pg_dsn, "local[2,2]", 0, 1, crash_at="task_after_write@1")
        assert done.returncode == 0, done.stderr[-3000:]
        assert "committed 0" in done.stdout and "committed 1" in done.stdout
        assert "crash point task_after_write at batch 1 (a task's first attempt)" in done.stderr
        died = _child(url, pg_dsn, "local[2]", 2, crash_at="after_sink_commit@2")
        assert died.returncode == -9 and "committed 2" not in died.stdout, died.stderr[-3000:]
        again = _child(url, pg_dsn, "local[2]", 2, 3)
        assert again.returncode == 0, again.stderr[-3000:]
        assert "replayed 2" in again.stdout and "committed 3" in again.stdout
        want = _want(range(4))
        assert Counter(e["key"] for e in read_effects(service.db)) == want  # each key applied once
        assert len(read_effects(service.db, calls=True)) == len(want)  # and called once: no retry resent
    assert not (ROOT / pg_dsn).exists()  # the URL was never taken for a SQLite file's name
    sink = HttpEffectsSink(url, pg_dsn)
    assert [m["batch_id"] for m in sink.batches()] == [0, 1, 2, 3]
    metrics = {m["batch_id"]: m for m in sink.effect_batches()}
    assert metrics[0]["effects"] == ROWS + 300 and metrics[3]["confirmed"] == ROWS + 300
    assert sink.unconfirmed() == []
    sink.close()


def test_the_driver_path_and_the_commands_take_a_postgresql_ledger(tmp_path: Path, pg_dsn: str) -> None:
    specs = {"charges": Table(key="id", mode="append")}
    batch = pa.table({"id": [f"c{i}" for i in range(50)], "amount": list(range(50))})
    with ServiceProcess(tmp_path / "service.db") as service:
        sink = HttpEffectsSink(service.effects_url, pg_dsn, sink_id="billing")
        sink.check(specs, {"charges": batch.schema})
        sink.bind("q1")
        assert sink.commit_tables(0, {"charges": batch}, specs, BatchStats(50, 0, 0), 50)
        assert not sink.commit_tables(0, {"charges": batch}, specs, BatchStats(50, 0, 0), 50)  # a replay
        assert len(read_effects(service.db, calls=True)) == 50
        sink.close()
        other = HttpEffectsSink(service.effects_url, pg_dsn, sink_id="other")
        with pytest.raises(ConfigError, match="charges"):  # a second sink id on the table: refused
            other.check(specs, {"charges": batch.schema})
        other.close()
    runner = CliRunner()
    shown = runner.invoke(cli, ["effects", "--ledger", pg_dsn, "--sink-id", "billing"])
    assert shown.exit_code == 0, shown.output
    assert "1 batches: 50 effects, 50 calls attempted, 50 confirmed" in shown.output
    owners = runner.invoke(cli, ["tables", "--ledger", pg_dsn])
    assert owners.exit_code == 0 and "charges" in owners.output and "billing" in owners.output, owners.output
    ledger = open_ledger(pg_dsn, "billing")
    assert isinstance(ledger, PgLedger) and ledger.has_marker(0) and not ledger.has_marker(1)
    ledger.close()


def test_a_sink_id_postgresql_cannot_hold_is_refused(pg_dsn: str) -> None:
    with pytest.raises(ConfigError, match="sink id"):
        open_ledger(pg_dsn, "no spaces allowed")


def test_the_onceflow_http_format_streams_into_a_postgresql_ledger_and_a_replayed_batch_sends_nothing(
        spark: Any, tmp_path: Path, pg_dsn: str) -> None:
    import json
    import shutil

    from onceflow.sinks.http import tasks

    source, ck = tmp_path / "in", tmp_path / "ck"
    source.mkdir()

    def drop(part: int) -> None:
        rows = [{"key": f"fmt/{part}/{i}", "payload": json.dumps({"n": i, "part": part})} for i in range(40)]
        (source / f"part-{part}.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")

    with ServiceProcess(tmp_path / "service.db") as service:
        def run() -> None:
            spark.dataSource.register(tasks.HttpDataSource)
            q = (spark.readStream.schema("key STRING, payload STRING").option("maxFilesPerTrigger", 1)
                 .json(str(source)).writeStream.format(tasks.NAME).option("url", service.effects_url)
                 .option("ledger", pg_dsn).option("sink_id", "fmt").option("checkpointLocation", str(ck))
                 .trigger(availableNow=True).start())
            q.awaitTermination(120)
            assert q.exception() is None, q.exception()

        drop(0)
        drop(1)
        run()
        drop(2)
        run()
        shutil.rmtree(ck / "commits" / "2", ignore_errors=True)
        (ck / "commits" / "2").unlink(missing_ok=True)  # Spark re-runs batch 2: the sink has it
        run()
        assert (ck / "commits" / "2").exists()  # batch 2 ran again, and Spark committed it
        applied = Counter(e["key"] for e in read_effects(service.db))
        assert applied == Counter(f"fmt/{p}/{i}" for p in range(3) for i in range(40))
        assert len(read_effects(service.db, calls=True)) == 120  # the replay called nothing
    ledger = open_ledger(pg_dsn, "fmt")
    assert [ledger.has_marker(b) for b in range(4)] == [True, True, True, False]
    assert [b["confirmed"] for b in ledger.batches()] == [40, 40, 40]
    ledger.close()

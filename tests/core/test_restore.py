"""A sink or a checkpoint restored from a backup: refused without repair, exact after ``onceflow repair``.

The transfer pipeline of :mod:`tests.core.transfers` (stateful: deduplication), one input file
per run, ``availableNow`` runs on one checkpoint (each run is a data batch and a no-data batch).
A backup of one side is taken after run 1 and restored after run 2; run 3 brings new input:

* **database restored** (the sink is behind): run 3 is refused naming the batches the sink lacks;
  repair rewinds the checkpoint; the next run writes them and run 3's input once.
* **checkpoint restored** (the sink is ahead): Spark plans batch 2 over run 2's and run 3's
  input; onceflow refuses it (the sink has batch 3, or batch 2 over other input); repair restores
  batches 2-3 from the sink's markers; the next run runs them again (skipped by the sink) and
  then run 3's input once.

The answer is computed from the input files by :func:`tests.core.transfers.expected`.
"""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import onceflow
from onceflow.errors import OutOfStepError
from tests.core import transfers
from tests.helpers import restore_from_copy

pytestmark = pytest.mark.spark


class _Sink:
    """One sink kind: how to open it, back it up, restore it, and name it to ``onceflow repair``."""

    def __init__(self, kind: str, tmp: Path, request: pytest.FixtureRequest) -> None:
        self.kind, self.tmp = kind, tmp
        if kind == "sqlite":
            self.location = str(tmp / "out.db")
            self.option = ["--db", self.location]
        elif kind == "delta":
            self.location = str(tmp / "lake")
            self.option = ["--delta", self.location]
        elif kind == "iceberg":  # a SQLite catalog; its backup and restore: the catalog's database only
            self.location = str(tmp / "ice")
            self.option = ["--iceberg", f"sqlite:///{tmp / 'ice' / 'catalog.db'}", "--warehouse",
                           str(tmp / "ice" / "warehouse"), "--namespace", "onceflow"]
        elif kind == "kafka":
            self.location = request.getfixturevalue("kafka_broker").bootstrap
            self.option = ["--kafka", self.location]
        else:
            self.server = request.getfixturevalue("pg_server")
            self.location = request.getfixturevalue("pg_dsn")
            self.name = self.location.rsplit("dbname=", 1)[1]
            self.option = ["--dsn", self.location]

    def open(self) -> Any:
        if self.kind == "sqlite":
            return onceflow.sqlite(self.location)
        if self.kind == "kafka":
            return onceflow.kafka(self.location)
        if self.kind == "iceberg":
            return onceflow.iceberg(f"sqlite:///{self.location}/catalog.db", f"{self.location}/warehouse")
        return onceflow.delta(self.location) if self.kind == "delta" else onceflow.postgres(self.location)

    def backup(self) -> None:
        if self.kind == "iceberg":  # the warehouse's files stay where they are: only the catalog goes back
            with sqlite3.connect(f"{self.location}/catalog.db") as src, \
                    sqlite3.connect(self.tmp / "catalog-backup.db") as dst:
                src.backup(dst)
        elif self.kind == "sqlite":
            with sqlite3.connect(self.location) as src, sqlite3.connect(self.tmp / "backup.db") as dst:
                src.backup(dst)
        elif self.kind == "delta":
            shutil.copytree(self.location, self.tmp / "lake-backup")
        else:
            self._admin(f"CREATE DATABASE {self.name}_bak TEMPLATE {self.name}")

    def restore(self) -> None:
        if self.kind == "iceberg":
            with sqlite3.connect(self.tmp / "catalog-backup.db") as src, \
                    sqlite3.connect(f"{self.location}/catalog.db") as dst:
                src.backup(dst)
        elif self.kind == "sqlite":
            for suffix in ("", "-wal", "-shm"):
                Path(self.location + suffix).unlink(missing_ok=True)
            with sqlite3.connect(self.tmp / "backup.db") as src, sqlite3.connect(self.location) as dst:
                src.backup(dst)
        elif self.kind == "delta":
            shutil.rmtree(self.location)
            shutil.copytree(self.tmp / "lake-backup", self.location)
        else:
            self._admin(f"DROP DATABASE {self.name} WITH (FORCE)")
            self._admin(f"CREATE DATABASE {self.name} TEMPLATE {self.name}_bak")

    def _admin(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(self.server.dsn, autocommit=True) as conn:
            conn.execute(sql)


def _run(spark: Any, tmp: Path, sink: _Sink) -> None:
    s = sink.open()
    try:
        transfers.start(spark, tmp / "in", s, tmp / "ck").awaitTermination()
    finally:
        s.close()


def _repair(tmp: Path, sink: _Sink, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "onceflow.cli.main", "repair", "--checkpoint", str(tmp / "ck")]
    return subprocess.run([*command, *sink.option, *extra], capture_output=True, text=True, timeout=120)


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def kafka_broker() -> Any:
    from onceflow.verify.kafka_server import KafkaServer

    with KafkaServer() as broker:
        yield broker


@pytest.mark.parametrize(("kind", "restored"), [
    (kind, restored) for kind in ("sqlite", "postgres", "delta") for restored in ("database", "checkpoint")
] + [("kafka", "checkpoint"),  # a Kafka topic is not restored from a backup
     pytest.param("iceberg", "database", marks=pytest.mark.long),  # make test: test_several.py repairs
     pytest.param("iceberg", "checkpoint", marks=pytest.mark.long)])
def test_a_restore_is_refused_then_repaired_exactly(spark: Any, tmp_path: Path, kind: str, restored: str,
                                                    request: pytest.FixtureRequest) -> None:
    sink = _Sink(kind, tmp_path, request)
    transfers.put(tmp_path / "in", 0)
    _run(spark, tmp_path, sink)
    if restored == "database":
        sink.backup()
    else:
        shutil.copytree(tmp_path / "ck", tmp_path / "ck-backup")
    transfers.put(tmp_path / "in", 1)
    _run(spark, tmp_path, sink)
    if restored == "database":
        sink.restore()
    else:
        shutil.rmtree(tmp_path / "ck")
        shutil.copytree(tmp_path / "ck-backup", tmp_path / "ck")
    transfers.put(tmp_path / "in", 2)
    with pytest.raises(OutOfStepError) as refused:
        _run(spark, tmp_path, sink)
    message = str(refused.value)
    assert ("lacks batches 2-3" in message) if restored == "database" else ("has batch 3" in message)
    assert "onceflow repair --checkpoint" in message
    assert kind == "postgres" or " ".join(sink.option) in message  # the command names the sink (dsn redacted)

    before = _tree(tmp_path / "ck")
    dry = _repair(tmp_path, sink, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    # a restored checkpoint is refused before Spark plans batch 2 over the new file: nothing to remove
    assert ("would remove" if restored == "database" else "would restore offsets/2") in dry.stdout, dry.stdout
    assert _tree(tmp_path / "ck") == before  # a dry run changes nothing
    if kind == "kafka":  # a wrong sink id is not an empty sink: refused, the checkpoint unchanged
        wrong = _repair(tmp_path, sink, "--sink-id", "nosuch")
        assert wrong.returncode != 0 and "no marker topic onceflow_batches.nosuch" in wrong.stderr, wrong
        assert _tree(tmp_path / "ck") == before
    fixed = _repair(tmp_path, sink)
    assert fixed.returncode == 0, fixed.stderr
    _run(spark, tmp_path, sink)
    assert transfers.read_sink(kind, sink.location) == transfers.expected(tmp_path / "in")
    again = _repair(tmp_path, sink)
    assert again.returncode == 0 and "nothing to repair" in again.stdout, again.stdout + again.stderr

    transfers.put(tmp_path / "in", 3)  # and the query goes on as before
    _run(spark, tmp_path, sink)
    assert transfers.read_sink(kind, sink.location) == transfers.expected(tmp_path / "in")
    markers = sink.open().batches()
    assert [m["batch_id"] for m in markers] == list(range(len(markers)))
    assert sum(m["input_rows"] or 0 for m in markers) == 4 * transfers.PER_FILE


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "delta"])
def test_a_restored_sink_is_refused_at_start_even_with_no_new_input(spark: Any, tmp_path: Path, kind: str,
                                                                    request: pytest.FixtureRequest) -> None:
    """once=True over input the checkpoint has all read: Spark runs no batch, the start refuses."""
    sink = _Sink(kind, tmp_path, request)
    transfers.put(tmp_path / "in", 0)
    _run(spark, tmp_path, sink)
    sink.backup()
    transfers.put(tmp_path / "in", 1)
    _run(spark, tmp_path, sink)
    sink.restore()
    s = sink.open()
    try:
        with pytest.raises(OutOfStepError, match=r"the sink lacks batches 2-3, which Spark's checkpoint"):
            transfers.start(spark, tmp_path / "in", s, tmp_path / "ck")  # refused before Spark starts
    finally:
        s.close()
    assert not spark.streams.active
    assert _repair(tmp_path, sink).returncode == 0
    _run(spark, tmp_path, sink)  # still no new input: the repaired checkpoint writes batches 2-3 again
    assert transfers.read_sink(kind, sink.location) == transfers.expected(tmp_path / "in")


def test_repair_refuses_when_the_input_to_write_again_is_gone(spark: Any, tmp_path: Path,
                                                               request: pytest.FixtureRequest) -> None:
    sink = _Sink("sqlite", tmp_path, request)
    transfers.put(tmp_path / "in", 0)
    _run(spark, tmp_path, sink)
    sink.backup()
    lost = transfers.put(tmp_path / "in", 1)
    _run(spark, tmp_path, sink)
    sink.restore()
    lost.unlink()  # the file of the batch the sink lacks is gone
    before = _tree(tmp_path / "ck")
    refused = _repair(tmp_path, sink)
    assert refused.returncode == 1
    assert "cannot repair" in refused.stderr and lost.name in refused.stderr
    assert _tree(tmp_path / "ck") == before


@pytest.mark.long
def test_onceflow_run_after_a_database_restore_exits_1_then_repair_makes_it_exact(tmp_path: Path) -> None:
    """The issue's measurement: Example 5-1 with ``onceflow run``; the database restored from a backup."""
    from onceflow.sources.log import EventLog
    from onceflow.verify.generator import GeneratorConfig, generate_segments
    from onceflow.verify.oracle import expect
    from onceflow.verify.verdict import judge_sqlite

    log, db = EventLog(tmp_path / "log"), tmp_path / "out.db"
    segments = list(generate_segments(GeneratorConfig(events=6_000, users=20, minutes=6, seed=4,
                                                      segment_size=2_000)))

    cli = [sys.executable, "-m", "onceflow.cli.main"]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, "run", "--log", str(log.directory), "--checkpoint", str(tmp_path / "ck"),
                               "--db", str(db), "--once"], capture_output=True, text=True, timeout=300)

    log.append(segments[0])
    assert run().returncode == 0
    with sqlite3.connect(db) as src, sqlite3.connect(tmp_path / "backup.db") as dst:
        src.backup(dst)
    log.append(segments[1])
    assert run().returncode == 0
    for suffix in ("", "-wal", "-shm"):
        Path(str(db) + suffix).unlink(missing_ok=True)
    with sqlite3.connect(tmp_path / "backup.db") as src, sqlite3.connect(db) as dst:
        src.backup(dst)
    log.append(segments[2])
    refused = run()
    assert refused.returncode == 1, refused.stderr
    assert "onceflow: error: the sink lacks batch" in refused.stderr
    assert "Traceback" not in refused.stderr
    fixed = subprocess.run([*cli, "repair", "--checkpoint", str(tmp_path / "ck"), "--db", str(db),
                            "--sink-id", "user_counts"], capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    assert run().returncode == 0
    verdict = judge_sqlite(db, expect(tmp_path / "ck"))
    assert verdict.ok, verdict.violations


@pytest.mark.long  # ~2 minutes: every run starts a Spark Connect server of its own
@pytest.mark.parametrize("restored", ["database", "checkpoint"])
def test_a_restore_over_spark_connect_is_refused_then_repaired_exactly(tmp_path: Path,
                                                                        restored: str) -> None:
    """Example 5-1 with ``onceflow run --remote local`` (each run a Connect client of its own server).

    The database, or the checkpoint, restored from a copy taken after the first run: the next run
    is refused naming ``onceflow repair``; after it, runs write every event once (a restored
    checkpoint's batches are replayed from the sink's markers: the query restarts per batch).
    """
    import shutil

    from onceflow.sources.log import EventLog
    from onceflow.verify.generator import GeneratorConfig, generate_segments
    from onceflow.verify.oracle import expect
    from onceflow.verify.verdict import judge_sqlite

    log, db, ck = EventLog(tmp_path / "log"), tmp_path / "out.db", tmp_path / "ck"
    segments = list(generate_segments(GeneratorConfig(events=6_000, users=20, minutes=6, seed=5,
                                                      segment_size=2_000)))
    cli = [sys.executable, "-m", "onceflow.cli.main"]

    def run() -> subprocess.CompletedProcess[str]:
        return subprocess.run([*cli, "run", "--log", str(log.directory), "--checkpoint", str(ck),
                               "--db", str(db), "--once", "--max-files-per-trigger", "1",
                               "--remote", "local"], capture_output=True, text=True, timeout=600)

    log.append(segments[0])
    first = run()
    assert first.returncode == 0, first.stdout + first.stderr
    with sqlite3.connect(db) as src, sqlite3.connect(tmp_path / "backup.db") as dst:
        src.backup(dst)
    shutil.copytree(ck, tmp_path / "ck-backup")
    log.append(segments[1])
    assert run().returncode == 0
    restore_from_copy(restored, db, ck, tmp_path / "backup.db", tmp_path / "ck-backup")
    log.append(segments[2])
    refused = run()
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "onceflow repair --checkpoint" in refused.stderr, refused.stderr[-3000:]
    fixed = subprocess.run([*cli, "repair", "--checkpoint", str(ck), "--db", str(db), "--sink-id",
                            "user_counts"], capture_output=True, text=True, timeout=120)
    assert fixed.returncode == 0, fixed.stderr
    again = run()
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    verdict = judge_sqlite(db, expect(ck))
    assert verdict.ok, verdict.violations

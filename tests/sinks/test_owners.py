"""A table knows who writes it: a second sink id is refused at start unless shared; handing a table over."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from onceflow.errors import ConfigError
from onceflow.sinks._core.tables import Table
from onceflow.sinks.http.sink import HttpEffectsSink
from onceflow.sinks.postgres.sink import PostgresFramesSink, PostgresTablesSink
from onceflow.sinks.sqlite.sink import SQLiteTablesSink

SCHEMA = {"orders": pa.schema([("id", pa.int64()), ("n", pa.int64())])}


def _sinks(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[Any, Any, list[str]]:
    """Two sinks of one kind on one database, sink ids 'first' and 'second', and the CLI's option."""
    if kind == "sqlite":
        return (SQLiteTablesSink(tmp_path / "app.db", sink_id="first"),
                SQLiteTablesSink(tmp_path / "app.db", sink_id="second"), ["--db", str(tmp_path / "app.db")])
    if kind == "delta":
        from onceflow.sinks.delta.sink import DeltaTablesSink

        root = tmp_path / "lake"
        return (DeltaTablesSink(root, sink_id="first"), DeltaTablesSink(root, sink_id="second"),
                ["--delta", str(root)])
    if kind == "http":
        ledger = tmp_path / "ledger.db"
        return (HttpEffectsSink("http://127.0.0.1:9/e", ledger, sink_id="first"),
                HttpEffectsSink("http://127.0.0.1:9/e", ledger, sink_id="second"), ["--ledger", str(ledger)])
    if kind == "kafka":
        from onceflow.sinks.kafka.sink import KafkaTopicsSink

        bootstrap = request.getfixturevalue("kafka_broker").bootstrap
        return (KafkaTopicsSink(bootstrap, sink_id="first"), KafkaTopicsSink(bootstrap, sink_id="second"),
                ["--kafka", bootstrap])
    dsn = request.getfixturevalue("pg_dsn")
    second = PostgresFramesSink(dsn, sink_id="second") if kind == "postgres-frames" else \
        PostgresTablesSink(dsn, sink_id="second")
    return PostgresTablesSink(dsn, sink_id="first"), second, ["--dsn", dsn]


@pytest.fixture(scope="module")
def kafka_broker() -> Any:
    from onceflow.verify.kafka_server import KafkaServer

    with KafkaServer() as b:
        yield b


@pytest.mark.parametrize("kind", ["sqlite", "postgres", "postgres-frames", "http", "delta", "kafka"])
def test_a_second_sink_id_is_refused_unless_both_share_then_a_hand_over(
        tmp_path: Path, kind: str, request: pytest.FixtureRequest) -> None:
    first, second, option = _sinks(kind, tmp_path, request)
    own = {"orders": Table(key="id")}
    first.check(own, SCHEMA)
    first.check(own, SCHEMA)  # again: the same claim
    with pytest.raises(ConfigError, match=r"table 'orders' in .* is written by sink id 'first', and this "
                                          r"query's sink id is 'second' \(sink 'first' did not declare it "
                                          r"shared\).*"
                                          r"onceflow tables .*--hand-over orders --to second"):
        second.check(own, SCHEMA)
    shared = {"orders": Table(key="id", shared=True)}
    with pytest.raises(ConfigError, match="did not declare it shared"):
        second.check(shared, SCHEMA)  # one side shared is not enough
    first.check(shared, SCHEMA)
    second.check(shared, SCHEMA)  # both declare it: both write their own streams into it
    with pytest.raises(ConfigError, match="it is not declared shared by this query"):
        second.check(own, SCHEMA)
    cli = [sys.executable, "-m", "onceflow.cli.main", "tables", *option]
    listed = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert listed.returncode == 0, listed.stderr
    assert [line.split("\t")[:3] for line in listed.stdout.splitlines()] == [
        ["orders", "first", "shared"], ["orders", "second", "shared"]]
    moved = subprocess.run([*cli, "--hand-over", "orders", "--to", "second"], capture_output=True, text=True,
                           timeout=60)
    assert moved.returncode == 0, moved.stderr
    assert "handed over from 'first', 'second' to 'second'" in moved.stdout
    second.check(own, SCHEMA)  # the table is the second's now
    with pytest.raises(ConfigError, match="is written by sink id 'second'"):
        first.check(own, SCHEMA)
    for sink in (first, second):
        sink.close()


def test_a_delta_table_written_before_the_registry_is_credited_to_its_writer(tmp_path: Path) -> None:
    from onceflow.sinks._core.base import BatchStats
    from onceflow.sinks.delta.sink import DeltaTablesSink

    old = DeltaTablesSink(tmp_path / "lake", sink_id="old")
    old.bind("q1")
    assert old.commit_tables(0, {"orders": pa.table({"id": [1], "n": [2]})}, {"orders": Table(key="id")},
                             BatchStats(1, 0, 0), 1)
    (tmp_path / "lake" / "_onceflow" / "tables.json").unlink(missing_ok=True)  # as an older onceflow left it
    with pytest.raises(ConfigError, match="is written by sink id 'old', and this query's sink id is 'new'"):
        DeltaTablesSink(tmp_path / "lake", sink_id="new").check({"orders": Table(key="id")}, SCHEMA)


def test_two_queries_with_other_sink_ids_on_one_table(spark: Any, tmp_path: Path) -> None:
    """The issue's case with real queries: the copy started by mistake is refused before it reads anything."""
    import onceflow
    from tests.core import transfers

    transfers.put(tmp_path / "in", 0)
    db = tmp_path / "out.db"
    query = transfers.start(spark, tmp_path / "in", onceflow.sqlite(db, sink_id="orders"), tmp_path / "ck-a")
    query.awaitTermination()
    with pytest.raises(ConfigError, match="is written by sink id 'orders', and this query's sink id is "
                                          "'copy'"):
        transfers.start(spark, tmp_path / "in", onceflow.sqlite(db, sink_id="copy"), tmp_path / "ck-b")
    assert transfers.read_sink("sqlite", str(db)) == transfers.expected(tmp_path / "in")  # not doubled


def _race(bootstrap: str, table: str) -> tuple[list[Any], dict[int, str]]:
    """Two Kafka sinks of other sink ids claiming ``table`` at the same moment: each one's outcome."""
    from onceflow.sinks.kafka.sink import KafkaTopicsSink

    sinks = [KafkaTopicsSink(bootstrap, sink_id=f"{table}-{i}") for i in range(2)]
    outcome: dict[int, str] = {}
    gate = threading.Barrier(2)

    def start(i: int) -> None:
        gate.wait()
        try:
            sinks[i].check({table: Table(key="id")}, SCHEMA)
            outcome[i] = "claimed"
        except ConfigError as exc:
            outcome[i] = str(exc)

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    return sinks, outcome


def test_two_kafka_sink_ids_starting_at_once_one_is_refused(kafka_broker: Any) -> None:
    """Kafka cannot lock the registry: of claims written at the same moment, the first in the topic wins."""
    from onceflow.sinks.kafka.owners import Registry

    for round_ in range(4):
        table = f"race{round_}"
        sinks, outcome = _race(kafka_broker.bootstrap, table)
        assert sorted(outcome) == [0, 1] and list(outcome.values()).count("claimed") == 1, outcome
        winner = next(i for i, o in outcome.items() if o == "claimed")
        assert f"is written by sink id '{table}-{winner}'" in outcome[1 - winner]
        listed = [r[:2] for r in Registry({"bootstrap.servers": kafka_broker.bootstrap}).listed()
                  if r[0] == table]
        assert listed == [(table, f"{table}-{winner}")]  # the loser's claim withdrawn
        for sink in sinks:
            sink.close()


def test_a_kafka_claim_written_after_another_is_withdrawn(kafka_broker: Any) -> None:
    """Step 3 alone: this query's step 1 read the registry before the other's claim landed."""
    from onceflow.sinks.kafka.owners import Registry

    conf = {"bootstrap.servers": kafka_broker.bootstrap}
    Registry(conf).claim("early", {"late_race": Table(key="id")})

    class ReadTooSoon(Registry):
        """The first read sees an empty registry, as it would have a moment before 'early' wrote."""

        reads = 0

        def read(self, upto: int | None = None) -> Any:
            self.reads += 1
            return {} if self.reads == 1 else super().read(upto)

    late = ReadTooSoon(conf)
    with pytest.raises(ConfigError, match="'late_race' .* is written by sink id 'early', and this query's "
                                          "sink id is 'late'"):
        late.claim("late", {"late_race": Table(key="id"), "own_topic": Table(key="id")})
    assert late.reads == 2
    assert [r[:2] for r in Registry(conf).listed() if r[0] in ("late_race", "own_topic")] == [
        ("late_race", "early")]  # both of 'late''s new claims withdrawn

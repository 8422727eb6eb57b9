"""The real-time upsert writer (``onceflow.write_realtime``) under SIGKILL and a database restart.

A parcel-scan pipeline written for these tests (``tests.sinks.realtime_driver``: Kafka read by
Spark's connector in Real-Time Mode, one row per record, upserted by scan id into PostgreSQL)
runs as a child driver while this process produces to a real broker, with retried sends (the
same record again at a later offset). The oracle runs the pipeline's transform over the topic
with Spark's batch Kafka reader and keeps one row per scan: the table must equal it, row for
row. That a kill hit rows in flight is checked, not assumed: the server's own statistics
count the upserts that found their row already there — the retried sends, plus the records
the restarted driver replayed. A plain ``INSERT`` would have written each replayed record
twice. Some records are poison for the user's table (a weight or depot its ``CHECK``
constraints refuse): they must reach the ``rejects=`` table, each once, and the query go on;
without ``rejects=`` the query stops at one, naming its key and the way out.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest
from confluent_kafka import Producer

import onceflow
from onceflow.api.realtime import jdbc_target
from onceflow.errors import ConfigError
from onceflow.verify.driver import ProcessGroup, wait_until
from onceflow.verify.kafka_server import KafkaServer
from tests.sinks.realtime_driver import scans

pytestmark = [pytest.mark.spark, pytest.mark.faults]

TOPIC = "scans"


@pytest.fixture
def broker() -> Any:
    with KafkaServer({TOPIC: 2}) as b:
        yield b


DEPOTS = ("BER", "MUC", "HAM")
USER_TABLE = f"""CREATE TABLE scans (scan text PRIMARY KEY, parcel text,
    depot text CONSTRAINT known_depot CHECK (depot IN {DEPOTS}),
    kg double precision CONSTRAINT positive_weight CHECK (kg > 0), at timestamptz, part integer)"""
"""The user's own table: its constraints are what makes a record poison."""


def _sends(n: int, seed: int, poison: float = 0.0) -> tuple[list[tuple[str, bytes]], list[str]]:
    """``n`` scans as (key, JSON value), ~6% sent again later, a ``poison`` share the table refuses.

    Returns:
        The sends in order, and the scans sent twice.
    """
    rng = random.Random(seed)
    scans_ = []
    for i in range(n):
        at = f"2026-11-26T{10 + i // 3600:02d}:{i // 60 % 60:02d}:{i % 60:02d}"
        value = {"scan": f"s{i:05d}", "parcel": f"p{rng.randrange(300)}",
                 "depot": rng.choice(["ber", "muc", "ham"]), "grams": rng.randrange(50, 30_000), "at": at}
        if rng.random() < poison:  # a scale reading nothing, or a depot the table does not know
            value.update(rng.choice([{"grams": 0}, {"depot": "xyz"}]))
        scans_.append((value["scan"], json.dumps(value).encode()))
    sends = list(scans_)
    resent = []
    for i in range(0, n, 17):  # a retried send: the same record at a later offset
        sends.insert(min(len(sends), i + 40 + len(resent)), scans_[i])
        resent.append(scans_[i][0])
    return sends, resent


def _feeder(bootstrap: str, sends: list[tuple[str, bytes]], per_s: float) -> threading.Thread:
    def feed() -> None:
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        for start in range(0, len(sends), 25):
            for key, value in sends[start:start + 25]:
                producer.produce(TOPIC, key=key.encode(), value=value)
            producer.flush(30)
            time.sleep(25 / per_s)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread


def _driver(tmp: Path, bootstrap: str, dsn: str, name: str, *rejects: str, topic: str = TOPIC,
            env: dict[str, str] | None = None) -> ProcessGroup:
    return ProcessGroup([bootstrap, topic, dsn, str(tmp / "ck"), *rejects], tmp / f"{name}.out", env=env,
                        module="tests.sinks.realtime_driver")


def _rows(dsn: str, table: str = "scans") -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        try:
            return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])  # type: ignore[index]
        except psycopg.errors.UndefinedTable:
            return 0


def _table(dsn: str) -> dict[str, tuple[Any, ...]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute("SELECT scan, parcel, depot, kg, at, part FROM scans").fetchall()
    return {r[0]: (r[1], r[2], r[3], r[4].isoformat(), r[5]) for r in rows}


def _oracle(spark: Any, bootstrap: str) -> dict[str, tuple[Any, ...]]:
    """The pipeline's transform over the whole topic (Spark's batch reader), one row per scan."""
    from datetime import timezone

    raw = (spark.read.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("subscribe", TOPIC)
           .option("startingOffsets", "earliest").option("endingOffsets", "latest").load())
    out: dict[str, tuple[Any, ...]] = {}
    for r in scans(raw).collect():
        row = (r.parcel, r.depot, r.kg, r.at.replace(tzinfo=timezone.utc).isoformat(), r.part)
        assert out.setdefault(r.scan, row) == row, f"two different records of scan {r.scan}"
    return out


def _upserts_onto_existing(dsn: str, inserted: int) -> int:
    """The table's updates by the server's statistics, once every closed connection reported."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        deadline = time.monotonic() + 30
        while True:
            ins, upd = conn.execute("SELECT n_tup_ins, n_tup_upd FROM pg_stat_user_tables "
                                    "WHERE relname = 'scans'").fetchone()  # type: ignore[misc]
            if ins >= inserted or time.monotonic() > deadline:
                assert ins == inserted, f"statistics report {ins} inserts for {inserted} rows"
                return int(upd)
            time.sleep(0.3)
            conn.execute("SELECT pg_stat_clear_snapshot()")


def _started(driver: ProcessGroup) -> bool:
    if not driver.group_alive() or driver.proc.poll() is not None:
        raise AssertionError(f"the driver exited:\n{driver.output()[-3000:]}")
    return "started" in driver.output()


def _running(tmp: Path, bootstrap: str, dsn: str, sends: list[tuple[str, bytes]], per_s: float,
             rows: int, *rejects: str) -> tuple[ProcessGroup, threading.Thread]:
    """A driver whose query runs, a producer started after it, and ``rows`` rows written."""
    driver = _driver(tmp, bootstrap, dsn, "first", *rejects)
    try:
        wait_until(lambda: _started(driver), 180, "the query started")
        feeder = _feeder(bootstrap, sends, per_s=per_s)  # records arrive while the query runs
        wait_until(lambda: _rows(dsn) >= rows, 120, "first rows written")
    except BaseException:
        driver.kill()
        raise
    return driver, feeder


def _rejected(dsn: str) -> dict[str, tuple[Any, ...]]:
    """The rejects table by scan: the row as the writer saw it, and what PostgreSQL named."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        rows = conn.execute('SELECT record, value, rule, "column", reason, batch_id '
                            'FROM scans_rejected').fetchall()
    out = {}
    for record, value, rule, column, reason, batch_id in rows:
        row = json.loads(value)
        assert json.loads(record) == {"scan": row["scan"]} and rule == "postgres" and batch_id >= 0, rows[0]
        assert "SQLSTATE 23514" in reason and column in reason, (column, reason)
        out[row["scan"]] = (row["depot"], row["kg"], column)
    return out


def test_sigkill_mid_stream_replays_onto_the_same_rows(tmp_path: Path, broker: Any, pg_dsn: str,
                                                       utc_spark: Any) -> None:
    sends, resent = _sends(2400, seed=7, poison=0.04)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(USER_TABLE)
    first, feeder = _running(tmp_path, broker.bootstrap, pg_dsn, sends, 240, 500,  # ~10 s of input
                             "scans_rejected")
    try:
        assert feeder.is_alive(), "the producer finished before the kill: nothing was in flight"
        time.sleep(random.Random(3).uniform(0.2, 1.8))  # a random moment inside a real-time batch
        at_kill = _rows(pg_dsn)
    finally:
        first.kill()
    assert 500 <= at_kill < 2400
    second = _driver(tmp_path, broker.bootstrap, pg_dsn, "second", "scans_rejected")
    try:
        feeder.join(120)
        wait_until(lambda: _started(second) and _rows(pg_dsn) + _rows(pg_dsn, "scans_rejected") >= 2400,
                   180, "every scan written or rejected")
        time.sleep(3)  # a real-time batch more: a late duplicate would show
    finally:
        second.kill()
    every = _oracle(utc_spark, broker.bootstrap)
    assert len(every) == 2400
    expected = {s: r for s, r in every.items() if r[1] in DEPOTS and r[2] > 0}
    poison = {s: (r[1], r[2]) for s, r in every.items() if s not in expected}
    assert 50 < len(poison) < 150
    got = _table(pg_dsn)
    assert sorted(set(expected) - set(got))[:5] == [] and sorted(set(got) - set(expected))[:5] == []
    assert got == expected
    rejected = _rejected(pg_dsn)
    assert {s: r[:2] for s, r in rejected.items()} == poison
    assert all((r[2] == "known_depot") == (r[0] not in DEPOTS) for r in rejected.values())
    replayed = _upserts_onto_existing(pg_dsn, len(expected)) - sum(s in expected for s in resent)
    print(f"rows at the kill {at_kill}; replayed onto their rows {replayed}; rejected {len(rejected)}")
    assert replayed > 0, "the restarted driver replayed nothing: the kill hit no row in flight"


def test_a_database_restart_mid_stream_loses_and_repeats_nothing(tmp_path: Path, broker: Any, pg_server: Any,
                                                                 utc_spark: Any) -> None:
    dsn = pg_server.new_database()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(USER_TABLE)
    sends, _resent = _sends(1600, seed=11)
    driver, feeder = _running(tmp_path, broker.bootstrap, dsn, sends, per_s=120, rows=300)  # ~13 s of input
    try:
        pg_server.halt("fast")  # the server goes down while records keep arriving
        time.sleep(3)
        pg_server.resume()
        assert feeder.is_alive(), "the producer finished during the outage: test the restart mid-stream"
        feeder.join(120)
        wait_until(lambda: _started(driver) and _rows(dsn) >= 1600, 180, "every scan written")
        assert _started(driver), "the query did not survive the database restart"
        # then a poison record, and no rejects= table: the query stops, naming it and the way out
        poison = {"scan": "s99999", "parcel": "p1", "depot": "ber", "grams": 0, "at": "2026-11-26T12:00:00"}
        _feeder(broker.bootstrap, [("s99999", json.dumps(poison).encode())], per_s=1000).join(30)
        wait_until(lambda: driver.proc.poll() is not None, 120, "the query stopped at the poison record")
    finally:
        driver.kill()
    out = driver.output()
    assert "key (s99999)" in out and "SQLSTATE 23514" in out and 'pass rejects="<table>"' in out, out[-3000:]
    assert _table(dsn) == {s: r for s, r in _oracle(utc_spark, broker.bootstrap).items() if s != "s99999"}


def test_refusals_name_what_to_change(spark: Any, pg_dsn: str, tmp_path: Path) -> None:
    stream = spark.readStream.format("rate").load()
    with pytest.raises(ConfigError, match="streaming DataFrame"):
        onceflow.write_realtime(spark.range(3), "t", "id", tmp_path / "ck", dsn=pg_dsn)
    with pytest.raises(ConfigError, match=r"key \['offset'\] must name columns"):
        onceflow.write_realtime(stream, "t", "offset", tmp_path / "ck", dsn=pg_dsn)
    with pytest.raises(ConfigError, match="shorter than Spark's minimum"):
        onceflow.write_realtime(stream, "t", "value", tmp_path / "ck", dsn=pg_dsn, duration="1 second")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE other_key (timestamp timestamptz, value bigint PRIMARY KEY)")
    with pytest.raises(ConfigError, match="other_key"):
        onceflow.write_realtime(stream, "other_key", "timestamp", tmp_path / "ck", dsn=pg_dsn)
    with pytest.raises(ConfigError, match="rejects='t' must name a table other than 't'"):
        onceflow.write_realtime(stream, "t", "value", tmp_path / "ck", dsn=pg_dsn, rejects="t")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE not_rejects (record text PRIMARY KEY, note text)")
    with pytest.raises(ConfigError, match="not_rejects.*no column"):
        onceflow.write_realtime(stream, "t", "value", tmp_path / "ck", dsn=pg_dsn, rejects="not_rejects")
    # this session was started without realtime=True: refused before any table is created
    with pytest.raises(ConfigError, match=r"session\(realtime=True\)"):
        onceflow.write_realtime(stream, "fresh", "value", tmp_path / "ck", dsn=pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('fresh')").fetchone() == (None,)


def test_more_kafka_partitions_than_task_slots_is_refused(spark: Any, broker: Any, pg_dsn: str,
                                                         tmp_path: Path) -> None:
    slots = spark.sparkContext.defaultParallelism
    broker.create_topic("wide", slots + 1)

    def stream(topic: str) -> Any:
        return scans(spark.readStream.format("kafka").option("kafka.bootstrap.servers", broker.bootstrap)
                     .option("subscribe", topic).option("startingOffsets", "earliest").load())

    with pytest.raises(ConfigError, match=rf"reads {slots + 1} Kafka partitions but the session has {slots} "
                                          rf"task slots.*never read.*local\[{slots + 1}\]"):
        onceflow.write_realtime(stream("wide"), "scans", "scan", tmp_path / "ck", dsn=pg_dsn)
    assert onceflow.api.realtime.kafka_partitions(stream(f"wide,{TOPIC}")) == slots + 3
    for other in (spark.readStream.format("rate").load(), spark.readStream.text(str(tmp_path))):
        assert onceflow.api.realtime.kafka_partitions(other) is None  # no Kafka source: nothing to count
    # as many partitions as slots passes this check (and stops at the next: this session lacks the jars)
    with pytest.raises(ConfigError, match=r"session\(realtime=True\)"):
        onceflow.write_realtime(stream(TOPIC), "scans", "scan", tmp_path / "ck", dsn=pg_dsn)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.execute("SELECT to_regclass('scans')").fetchone() == (None,)


@pytest.mark.long  # make test measured 32:53 on a slow day (2026-11-27): multi-round runs go long
def test_a_partition_added_beyond_the_slots_stops_the_query_and_a_restart_reads_it(
        tmp_path: Path, broker: Any, pg_dsn: str) -> None:
    """The topic gains a partition the session has no task slot for, while the query runs.

    Spark lists it and never reads it, without an error (measured before the check). Now the
    query stops at the next real-time batch with what to change; the partition's records wait
    in Kafka, and a driver with one more core writes them, every scan once.
    """
    from confluent_kafka.admin import NewPartitions

    slots = os.cpu_count() or 2  # the driver's session: local[<cores>]
    broker.create_topic("grow", slots)
    first = _driver(tmp_path, broker.bootstrap, pg_dsn, "first", topic="grow")
    try:
        wait_until(lambda: _started(first), 180, "the query started")
        sends = list(dict(_sends(60, seed=11)[0]).items())  # 60 scans, each sent once
        producer = Producer({"bootstrap.servers": broker.bootstrap})
        for i, (key, value) in enumerate(sends[:20]):
            producer.produce("grow", key=key.encode(), value=value, partition=i % slots)
        producer.flush(30)
        wait_until(lambda: _rows(pg_dsn) >= 20, 60, "the first records written")
        admin = broker.admin()
        for done in admin.create_partitions([NewPartitions("grow", slots + 1)]).values():
            done.result(30)
        producer = Producer({"bootstrap.servers": broker.bootstrap})

        def known() -> int:
            return len(producer.list_topics("grow", timeout=10).topics["grow"].partitions)

        wait_until(lambda: known() == slots + 1, 30, "the producer knows the new partition")
        for i, (key, value) in enumerate(sends[20:60]):
            producer.produce("grow", key=key.encode(), value=value, partition=i % (slots + 1))
        producer.flush(30)
        wait_until(lambda: first.proc.poll() is not None, 90, "the query stopped")
    finally:
        first.kill()
    out = first.output()
    assert first.proc.returncode != 0
    assert f"now have {slots + 1} Kafka partitions (added while it ran) but the session has {slots}" in out
    assert f"local[{slots + 1}]" in out and "wait in Kafka" in out
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        parts = dict(conn.execute("SELECT part, count(*) FROM scans GROUP BY part").fetchall())
    assert slots not in parts, "the new partition was read: nothing to catch"
    unread = sum(1 for i in range(40) if i % (slots + 1) == slots)
    assert sum(parts.values()) == 60 - unread
    second = _driver(tmp_path, broker.bootstrap, pg_dsn, "second", topic="grow",
                     env={"REALTIME_DRIVER_CORES": str(slots + 1)})
    try:
        wait_until(lambda: _started(second) and _rows(pg_dsn) >= 60, 180, "every scan written")
    finally:
        second.kill()
    got = _table(pg_dsn)
    assert sorted(got) == sorted(key for key, _ in sends)
    assert {r[4] for r in got.values()} == set(range(slots + 1))


def test_jdbc_targets_from_libpq_strings() -> None:
    assert jdbc_target("postgresql://app:s3cret@db.example:6543/sales?sslmode=require") == (
        "jdbc:postgresql://db.example:6543/sales?sslmode=require", "app", "s3cret")
    assert jdbc_target("host=127.0.0.1 dbname=app user=u application_name=feed connect_timeout=5") == (
            "jdbc:postgresql://127.0.0.1:5432/app?ApplicationName=feed&connectTimeout=5", "u", None)
    assert jdbc_target("host=h dbname=app options='-c search_path=ops'")[0] == (
        "jdbc:postgresql://h:5432/app?options=-c%20search_path%3Dops")
    with pytest.raises(ConfigError, match="TCP") as err:
        jdbc_target("host=/var/run/postgresql dbname=app password=s3cret")
    assert "s3cret" not in str(err.value)
    with pytest.raises(ConfigError, match="target_session_attrs") as err:
        jdbc_target("host=h dbname=app password=s3cret target_session_attrs=read-write")
    assert "s3cret" not in str(err.value)

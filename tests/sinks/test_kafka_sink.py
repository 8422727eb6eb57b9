"""The Kafka sink on a real broker: every record once for ``read_committed`` readers, under SIGKILLs.

The pipeline (:mod:`tests.sinks.kafka_driver`) deduplicates shipments and writes each batch's new
shipments (topic ``shipments``) and per-warehouse partial sums (``stock``) in one Kafka
transaction. The oracle recomputes both from the input files with pyarrow; the topics are read
by the auditor's consumer (:mod:`onceflow.verify.kafka_rig`), never by the sink's code.
``read_uncommitted`` is the negative control of the reading: it sees the records of the
transactions a crash left open (aborted later).
"""

from __future__ import annotations

import json
import random
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from onceflow.errors import OnceflowError, SourceReadError
from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.kafka.records import row_json
from onceflow.sinks.kafka.sink import KafkaTopicsSink
from onceflow.verify.driver import ProcessGroup, wait_until
from onceflow.verify.kafka_rig import read_markers, read_messages, read_records
from onceflow.verify.kafka_server import KafkaServer
from tests.helpers import check_amendments, same_sorted

pytestmark = [pytest.mark.spark, pytest.mark.faults]

POINTS = ["before_sink_write", "inside_sink_txn", "after_sink_commit"]
"""The sink's own points (``after_commit_log`` does not depend on the sink: tests/core)."""


@pytest.fixture
def broker() -> Any:
    with KafkaServer() as b:
        yield b


def _write_files(folder: Path, files: int, rows: int, seed: int, first: int = 0) -> list[dict[str, Any]]:
    """Shipment files; ~15% of the rows repeat an earlier id (the same shipment sent again)."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    sent: list[dict[str, Any]] = []
    for f in range(first, first + files):
        batch = []
        for i in range(rows):
            if sent and rng.random() < 0.15:
                batch.append(rng.choice(sent))
                continue
            row = {"id": f"s-{f}-{i}", "warehouse": f"w{rng.randrange(7)}", "qty": rng.randrange(1, 50),
                   "ts": 1_780_000_000_000_000 + (f * rows + i) * 1000}
            sent.append(row)
            batch.append(row)
        table = pa.table({"id": [r["id"] for r in batch], "warehouse": [r["warehouse"] for r in batch],
                          "qty": pa.array([r["qty"] for r in batch], pa.int64()),
                          "ts": pa.array([r["ts"] for r in batch], pa.timestamp("us"))})
        tmp = folder / f".part-{f:04d}.parquet"
        pq.write_table(table, tmp)
        tmp.rename(folder / f"part-{f:04d}.parquet")
    return sent


def _expected(folder: Path) -> tuple[dict[str, tuple[str, int]], dict[str, tuple[int, int]]]:
    """The oracle: distinct shipments by id, and per warehouse (sum of qty, count)."""
    rows = pq.read_table(folder).to_pylist()
    ships = {r["id"]: (r["warehouse"], r["qty"]) for r in rows}
    stock: dict[str, tuple[int, int]] = {}
    for wh, qty in ships.values():
        q, n = stock.get(wh, (0, 0))
        stock[wh] = (q + qty, n + 1)
    return ships, stock


def _markers(bootstrap: str) -> list[int]:
    return [m["batch_id"] for m in read_markers(bootstrap, "ship")]


def _judge(bootstrap: str, folder: Path) -> tuple[Counter[str], dict[str, tuple[int, int]], list[int]]:
    ships, stock = _expected(folder)
    records = read_records(bootstrap, "shipments")
    got = Counter(key.decode() for key, _ in records)
    for key, raw in records:
        value = json.loads(raw)
        assert (value["warehouse"], value["qty"]) == ships[key.decode()]
    folded: dict[str, tuple[int, int]] = {}
    for _, raw in read_records(bootstrap, "stock"):
        value = json.loads(raw)
        q, n = folded.get(value["warehouse"], (0, 0))
        folded[value["warehouse"]] = (q + value["qty"], n + value["n"])
    assert folded == stock, (folded, stock)
    return got, folded, _markers(bootstrap)


def _driver(tmp: Path, source: str, bootstrap: str, name: str, crash_at: str | None = None,
            once: bool = False, naive: bool = False, extra: list[str] | None = None) -> ProcessGroup:
    args = [source, str(tmp / "ck"), bootstrap, *(["--once"] if once else []),
            *(["--naive"] if naive else []), *(extra or [])]
    return ProcessGroup(args, tmp / f"{name}.out", {"ONCEFLOW_CRASH_AT": crash_at} if crash_at else {},
                        module="tests.sinks.kafka_driver")


@pytest.mark.slow
@pytest.mark.long  # make test-long (make test's 30 minutes); the kafka and kafka-tasks verifies there too
def test_every_crash_point_and_a_random_kill_leave_each_record_once(broker: Any, tmp_path: Path) -> None:
    seed = int(time.time()) % 10_000
    folder = tmp_path / "in"
    _write_files(folder, 14, 300, seed)
    d = _driver(tmp_path, str(folder), broker.bootstrap, "random")
    wait_until(lambda: len(_markers(broker.bootstrap)) >= 1, 180, "a committed batch")
    time.sleep(random.Random(seed).uniform(0.0, 1.0))
    d.kill()
    for point in POINTS:
        target = len(_markers(broker.bootstrap))  # markers 0..n-1: the next batch (with input)
        d = _driver(tmp_path, str(folder), broker.bootstrap, point, crash_at=f"{point}@{target}")
        assert d.wait(timeout=300) == -9, d.output()[-3000:]
        assert f"crash point {point} at batch" in d.output(), d.output()[-2000:]
    final = _driver(tmp_path, str(folder), broker.bootstrap, "final", once=True)
    assert final.wait(timeout=300) == 0, final.output()[-3000:]
    got, _, markers = _judge(broker.bootstrap, folder)
    ships, _ = _expected(folder)
    assert set(got) == set(ships) and set(got.values()) == {1}, (seed, got.most_common(3))
    assert markers == list(range(len(markers))), markers  # every batch once, in order
    dirty = Counter(k.decode() for k, _ in read_records(broker.bootstrap, "shipments", "read_uncommitted"))
    assert max(dirty.values()) > 1, "the crash inside the transaction left no aborted records"
    assert sum(dirty.values()) > sum(got.values())


def test_the_naive_sink_is_caught_duplicating(broker: Any, tmp_path: Path) -> None:
    folder = tmp_path / "in"
    _write_files(folder, 4, 200, seed=3)
    d = _driver(tmp_path, str(folder), broker.bootstrap, "crash", crash_at="after_sink_commit@1", naive=True)
    assert d.wait(timeout=300) == -9, d.output()[-3000:]
    final = _driver(tmp_path, str(folder), broker.bootstrap, "final", once=True, naive=True)
    assert final.wait(timeout=300) == 0, final.output()[-3000:]
    with pytest.raises(AssertionError):  # the stock sums count batch 1 twice
        _judge(broker.bootstrap, folder)
    got = Counter(k.decode() for k, _ in read_records(broker.bootstrap, "shipments"))
    assert max(got.values()) == 2


def test_a_second_driver_of_the_sink_id_fences_the_first(broker: Any) -> None:
    spec = {"shipments": Table(key="id")}
    rows = pa.table({"id": ["a", "b"], "warehouse": ["w1", "w2"], "qty": [1, 2]})
    stats = BatchStats(2, 0, 0)
    first = KafkaTopicsSink(broker.bootstrap, sink_id="fence")
    first.bind("q1")
    assert first.commit_tables(0, {"shipments": rows}, spec, stats, 2)
    assert not first.commit_tables(0, {"shipments": rows}, spec, stats, 2)  # a replay: nothing produced
    # a zombie with the transactional id (an earlier driver), mid-transaction when the next one starts
    zombie = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "onceflow.fence"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    zombie.produce("shipments", key=b"zombie", value=b"{}")
    zombie.flush(10)
    second = KafkaTopicsSink(broker.bootstrap, sink_id="fence")
    second.bind("q1")  # aborts the zombie's open transaction and fences every earlier producer
    with pytest.raises(KafkaException):
        zombie.commit_transaction(30)
    with pytest.raises(OnceflowError, match="fenced this one"):
        first.commit_tables(1, {"shipments": rows}, spec, stats, 2)
    assert second.commit_tables(1, {"shipments": rows.slice(0, 1)}, spec, stats, 1)
    keys = [k for k, _ in read_records(broker.bootstrap, "shipments")]
    assert keys == [b"a", b"b", b"a"]
    assert b"zombie" in [k for k, _ in read_records(broker.bootstrap, "shipments", "read_uncommitted")]
    assert [m["batch_id"] for m in second.batches()] == [0, 1]
    other = KafkaTopicsSink(broker.bootstrap, sink_id="fence")
    with pytest.raises(OnceflowError, match="query id q1"):
        other.bind("q2")  # another checkpoint's batch ids restart at 0
    for s in (first, second, other):
        s.close()


def test_a_new_driver_reads_the_marker_topics_end_past_aborted_transactions(broker: Any) -> None:
    """bind reads the markers from the topic's end back, not its whole history; aborted ones are skipped."""
    spec = {"parcels": Table(key="id")}
    rows = pa.table({"id": ["p"], "qty": [1]})
    sink = KafkaTopicsSink(broker.bootstrap, sink_id="tail")
    sink.bind("q1")
    for b in range(300):  # 600 offsets: each marker and its transaction's commit record
        assert sink.commit_tables(b, {"parcels": rows}, spec, BatchStats(1, 0, 0), 1)
    sink.close()
    # an earlier driver's transaction after the last commit: 150 marker-like records, then aborted
    zombie = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "onceflow.other"})
    zombie.init_transactions(30)
    zombie.begin_transaction()
    for _ in range(150):
        zombie.produce("onceflow_batches.tail", key=b"tail", value=json.dumps({"batch_id": 999}).encode())
    zombie.flush(10)
    zombie.abort_transaction(30)
    fresh = KafkaTopicsSink(broker.bootstrap, sink_id="tail")
    recent = fresh.recent_batches()
    ids = [m["batch_id"] for m in recent]  # 64 offsets from the end: aborted only; then 512 more
    assert ids and ids == list(range(ids[0], 300)) and ids[0] > 0, ids
    assert [m["batch_id"] for m in fresh.batches()] == list(range(300))
    fresh.bind("q1")
    assert not fresh.commit_tables(299, {"parcels": rows}, spec, BatchStats(1, 0, 0), 1)  # a replay
    assert fresh.commit_tables(300, {"parcels": rows}, spec, BatchStats(1, 0, 0), 1)
    assert fresh.recent_batches()[-1]["batch_id"] == 300  # read again after a commit
    fresh.close()
    topic = ConfigResource(ResourceType.TOPIC, "onceflow_batches.tail")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    conf = admin.describe_configs([topic])[topic].result(30)
    assert conf["cleanup.policy"].value == "compact"  # the last marker is never deleted by retention
    assert int(conf["min.compaction.lag.ms"].value) == 7 * 24 * 3600 * 1000


def test_the_auditor_and_repair_read_a_transaction_committed_a_moment_ago(broker: Any) -> None:
    """The broker writes a commit's markers just after commit_transaction returns: the reads wait."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic("just_now", 3, 1)])["just_now"].result(30)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "auditor-just-now"})
    producer.init_transactions(30)
    for n in range(1, 6):
        producer.begin_transaction()
        for i in range(10):
            producer.produce("just_now", key=f"{n}-{i}".encode(), value=b"v", partition=i % 3)
        producer.commit_transaction(30)
        assert len(read_records(broker.bootstrap, "just_now")) == 10 * n  # read at once
    producer.begin_transaction()
    producer.produce("just_now", key=b"open", value=b"v", partition=1)
    producer.flush(10)
    still_open = r"just_now: a transaction is still open on partition\(s\) \[1\]"
    with pytest.raises(SourceReadError, match=still_open):
        read_messages(broker.bootstrap, "just_now", timeout_s=2)
    assert len(read_records(broker.bootstrap, "just_now", "read_uncommitted")) == 51
    producer.abort_transaction(30)
    assert len(read_records(broker.bootstrap, "just_now")) == 50
    # onceflow repair's reader of a sink's markers (no producer of its own to settle a commit
    # first) waits the same way: a marker committed by a driver a moment ago is read
    sink = KafkaTopicsSink(broker.bootstrap, sink_id="just")
    sink.bind("q1")
    rows = pa.table({"id": ["p"], "qty": [1]})
    assert sink.commit_tables(0, {"parcels": rows}, {"parcels": Table(key="id")}, BatchStats(1, 0, 0), 1)
    sink.close()
    row = {**sink.batches()[0], "batch_id": 1}
    driver = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": "onceflow.just.late"})
    driver.init_transactions(30)
    driver.begin_transaction()
    driver.produce(sink.marker_topic, key=b"just", value=json.dumps(row).encode())
    driver.flush(10)
    reader = KafkaTopicsSink(broker.bootstrap, sink_id="just")
    assert reader.wait_settled(0) == [0]  # the control: read now, batch 1 is not there yet
    assert [m["batch_id"] for m in reader.batches()] == [0]
    threading.Timer(1.0, driver.commit_transaction, args=(30,)).start()
    assert reader.wait_settled(30) == []
    assert [m["batch_id"] for m in reader.batches()] == [0, 1]
    # a transaction a killed driver left open: after the wait the markers are read as they are
    driver.begin_transaction()
    driver.produce(sink.marker_topic, key=b"just", value=json.dumps({**row, "batch_id": 2}).encode())
    driver.flush(10)
    assert reader.wait_settled(1) == [0]
    assert [m["batch_id"] for m in reader.batches()] == [0, 1]
    driver.abort_transaction(30)


def test_a_batchs_metrics_known_only_after_it_reach_its_marker(broker: Any) -> None:
    """Spark Connect's per-batch metrics arrive with the next batch: the marker topic keeps them."""
    spec = {"parcels": Table(key="id")}
    rows = pa.table({"id": ["p"], "qty": [1]})
    sink = KafkaTopicsSink(broker.bootstrap, sink_id="amends")
    sink.bind("q1")
    check_amendments(lambda b, stats: sink.commit_tables(b, {"parcels": rows}, spec, stats, 1), sink.batches)
    sink.close()


def test_a_compacted_marker_topic_still_decides_replays(broker: Any) -> None:
    """Compaction (here within seconds) leaves the last marker: a new driver skips it, writes the next."""
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    quick = {"cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.001",
             "min.compaction.lag.ms": "0", "delete.retention.ms": "0"}
    for fut in admin.create_topics([NewTopic("onceflow_batches.packed", 1, -1, config=quick)]).values():
        fut.result(30)
    spec = {"boxes": Table(key="id")}
    rows = pa.table({"id": ["b"], "qty": [1]})
    sink = KafkaTopicsSink(broker.bootstrap, sink_id="packed")
    sink.bind("q1")
    for b in range(30):
        assert sink.commit_tables(b, {"boxes": rows}, spec, BatchStats(1, 0, 0), 1)
        time.sleep(0.15)  # segments roll: the log cleaner may compact them
    sink.close()
    left = lambda: len(read_messages(broker.bootstrap, "onceflow_batches.packed", "read_uncommitted"))  # noqa: E731
    wait_until(lambda: left() < 10, 60, "the marker topic compacted")
    fresh = KafkaTopicsSink(broker.bootstrap, sink_id="packed")
    assert [m["batch_id"] for m in fresh.batches()][-1] == 29
    fresh.bind("q1")
    assert not fresh.commit_tables(29, {"boxes": rows}, spec, BatchStats(1, 0, 0), 1)  # a replay
    assert fresh.commit_tables(30, {"boxes": rows}, spec, BatchStats(1, 0, 0), 1)
    fresh.close()
    assert len(read_records(broker.bootstrap, "boxes")) == 31


def test_a_large_batch_is_one_transaction_with_headers_only_when_asked(broker: Any) -> None:
    """250k rows: several encode slices, one produce_batch each; each record once, its JSON the row's."""
    n = 250_000
    rows = pa.table({"id": [f"r{i}" for i in range(n)], "warehouse": [f'w"{i % 7}' for i in range(n)],
                     "qty": pa.array([i % 1000 for i in range(n)], pa.int64())})
    spec = {"big": Table(key="id")}
    plain = KafkaTopicsSink(broker.bootstrap, sink_id="big", partitions=3)
    plain.check(spec, {})
    plain.bind("q1")
    assert plain.commit_tables(0, {"big": rows}, spec, BatchStats(n, 0, 0), n)
    # the coordinator writes the commit markers to the partitions after commit_transaction returns:
    # a read_committed reader may see the last stable offset still before them for a moment
    wait_until(lambda: len(read_messages(broker.bootstrap, "big")) >= n, 60, "the committed records")
    got = read_messages(broker.bootstrap, "big")
    same_sorted(sorted((m.key(), m.value()) for m in got),
                sorted((r["id"].encode(), row_json(r)) for r in rows.to_pylist()), "records of 'big'")
    assert all(not m.headers() for m in got)
    tagged = KafkaTopicsSink(broker.bootstrap, sink_id="tagged", batch_headers=True)
    tagged.bind("q1")
    assert tagged.commit_tables(3, {"tagged": rows.slice(0, 5)}, {"tagged": Table(key="id")},
                                BatchStats(5, 0, 0), 5)
    headers = [m.headers() for m in read_messages(broker.bootstrap, "tagged")]
    assert headers == [[("onceflow.sink", b"tagged"), ("onceflow.batch", b"3")]] * 5
    assert [m["batch_id"] for m in read_markers(broker.bootstrap, "big")] == [0]
    for s in (plain, tagged):
        s.close()


@pytest.mark.slow
def test_a_broker_restart_mid_stream_loses_and_repeats_nothing(broker: Any, tmp_path: Path) -> None:
    """Kafka in (Spark's connector), Kafka out; the broker is SIGKILLed and restarted mid-stream."""
    broker.create_topic("incoming", 2)
    folder = tmp_path / "in"
    sent = _write_files(folder, 8, 250, seed=9)
    p = Producer({"bootstrap.servers": broker.bootstrap})

    def produce(rows: list[dict[str, Any]]) -> None:
        for r in rows:
            ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(r["ts"] / 1e6)) + "Z"
            p.produce("incoming", json.dumps({**r, "ts": ts}).encode(), key=r["id"].encode())
        p.flush(60)

    records = [{**r, "ts": int(r["ts"].timestamp() * 1e6)} for r in pq.read_table(folder).to_pylist()]
    produce(records[:600])
    d = _driver(tmp_path, "kafka:incoming", broker.bootstrap, "live")
    wait_until(lambda: len(_markers(broker.bootstrap)) >= 1, 180, "a committed batch")

    def feed() -> None:  # a producer keeps producing through the restart (its retries: same ids)
        for i in range(600, len(records), 150):
            produce(records[i:i + 150])
            time.sleep(0.4)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    time.sleep(1.0)
    broker.restart(hard=True)  # SIGKILL, then the same ports and data
    at = len(_markers(broker.bootstrap))
    feeder.join(timeout=180)
    wait_until(lambda: len(_markers(broker.bootstrap)) > at + 1, 180, "commits after the restart")
    assert d.proc.poll() is None, d.output()[-3000:]  # the live driver rode out the restart
    d.kill()
    final = _driver(tmp_path, "kafka:incoming", broker.bootstrap, "final", once=True)
    assert final.wait(timeout=300) == 0, final.output()[-3000:]
    got, _, markers = _judge(broker.bootstrap, folder)
    assert set(got) == {r["id"] for r in sent} and set(got.values()) == {1}
    assert markers == list(range(len(markers)))


def test_topic_names_may_hold_dots_and_dashes_table_names_may_not() -> None:
    from onceflow.errors import ConfigError
    from onceflow.sinks._core.tables import check_specs

    assert list(check_specs({"orders-out.v1": Table()}, topics=True)) == ["orders-out.v1"]
    with pytest.raises(ConfigError, match="table name 'orders-out.v1'"):
        check_specs({"orders-out.v1": Table()})
    with pytest.raises(ConfigError, match="topic name 'a b'"):
        check_specs({"a b": Table()}, topics=True)

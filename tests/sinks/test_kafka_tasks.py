"""The Kafka sink's tasks path on a real broker: each task a transaction, each record once.

Batches given as DataFrames go through :meth:`KafkaTopicsSink.commit_frames` with
``collect_below=0``: an append table (no key), an upsert table (a string key) and a merge table
(a two-column key), values of many types with quotes, unicode and nulls. The oracle is this
test's own rows, compared field by field with the JSON ``read_committed`` readers get (read by
the auditor's consumer, :mod:`onceflow.verify.kafka_rig`). A driver that died between its tasks'
commits and its marker is played by running the tasks alone (the sink's own format), then the
batch again. The SIGKILL tests run the shipments pipeline (:mod:`tests.sinks.kafka_driver`) with
``--tasks``: a driver killed inside its marker's transaction, and every task's first attempt killed
after its transaction committed (Spark's retry must find it committed).
"""

from __future__ import annotations

import datetime as dt
import json
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from onceflow.errors import BatchRejectedError, OnceflowError
from onceflow.sinks._core.base import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.kafka import datasource as kds
from onceflow.sinks.kafka import tasks as kt
from onceflow.sinks.kafka.sink import KafkaTopicsSink
from onceflow.verify.kafka_rig import read_markers, read_messages, read_records
from onceflow.verify.kafka_server import KafkaServer
from tests.sinks.test_kafka_sink import _driver, _expected, _judge, _markers, _write_files

pytestmark = [pytest.mark.spark]

SPECS = {"events": Table(), "latest": Table(key="k", mode="upsert"),
         "totals": Table(key=["k", "day"], add="n")}
SCHEMA = "id LONG, k STRING, day DATE, n LONG, x DOUBLE, at TIMESTAMP, note STRING"
UTC = dt.timezone.utc


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaServer]:
    with KafkaServer() as b:
        yield b


def _rows(b: int, n: int) -> list[tuple[Any, ...]]:
    return [(b * 100_000 + i, f'k"{i % 7}é', dt.date(2026, 1, 1 + i % 3), i if i % 4 else None,
             i / 8 if i % 5 else None, dt.datetime(2026, 1, 1, 0, 0, i % 60, 1000 * (i % 999), tzinfo=UTC),
             "line\\n" * (i % 2)) for i in range(n)]


def _frames(spark: Any, rows: list[tuple[Any, ...]]) -> dict[str, Any]:
    events = spark.createDataFrame(rows, SCHEMA).repartition(3)
    latest = events.groupBy("k").agg({"id": "max"}).withColumnRenamed("max(id)", "id")
    totals = events.groupBy("k", "day").agg({"n": "sum"}).withColumnRenamed("sum(n)", "n")
    return {"events": events.persist(), "latest": latest.persist(), "totals": totals.persist()}


def _event(row: tuple[Any, ...]) -> dict[str, Any]:
    """One input row as the record's JSON must read (this test's own conversion)."""
    return dict(zip(["id", "k", "day", "n", "x", "at", "note"], row, strict=True))


def _parsed(value: dict[str, Any]) -> dict[str, Any]:
    out = dict(value)
    out["day"] = dt.date.fromisoformat(out["day"])
    at = dt.datetime.fromisoformat(out["at"])
    out["at"] = at if at.tzinfo else at.replace(tzinfo=UTC)
    return out


def _check(bootstrap: str, topic_prefix: str, batches: list[list[tuple[Any, ...]]]) -> None:
    """Each topic holds exactly what the batches' rows say, each record once."""
    want_events = Counter(json.dumps(_event(r), default=str, sort_keys=True)
                          for rows in batches for r in rows)
    got = read_records(bootstrap, f"{topic_prefix}events")
    assert all(k is None for k, _ in got)
    got_events = Counter(json.dumps(_parsed(json.loads(v)), default=str, sort_keys=True) for _, v in got)
    assert got_events == want_events
    latest: list[dict[str, int]] = []
    totals: Counter[tuple[str, str]] = Counter()
    for rows in batches:
        per: dict[str, int] = {}
        for r in rows:
            per[r[1]] = max(per.get(r[1], -1), r[0])
            totals[(r[1], r[2].isoformat())] += r[3] or 0
        latest.append(per)
    got_latest = Counter((k.decode(), json.loads(v)["id"])
                         for k, v in read_records(bootstrap, f"{topic_prefix}latest"))
    assert got_latest == Counter((k, i) for per in latest for k, i in per.items())
    folded: Counter[tuple[str, str]] = Counter()
    for k, v in read_records(bootstrap, f"{topic_prefix}totals"):
        key, value = json.loads(k), json.loads(v)
        assert (key["k"], key["day"]) == (value["k"], value["day"])
        folded[(key["k"], key["day"])] += value["n"] or 0
    assert folded == +totals


def _specs(prefix: str) -> dict[str, Table]:
    return {f"{prefix}{n}": t for n, t in SPECS.items()}


def _named(prefix: str, frames: dict[str, Any]) -> dict[str, Any]:
    return {f"{prefix}{n}": f for n, f in frames.items()}


def test_the_tasks_produce_each_row_once_and_a_replay_nothing(spark: Any, broker: KafkaServer) -> None:
    specs = _specs("a_")
    sink = KafkaTopicsSink(broker.bootstrap, sink_id="tasks-a", partitions=3, collect_below=0)
    sink.check(specs, {})
    sink.bind("q1")
    b0, b1 = _rows(0, 3000), _rows(1, 2000)
    frames0 = _named("a_", _frames(spark, b0))
    assert sink.commit_frames(0, frames0, specs, BatchStats(3000, 0, 0), 3000)
    assert not sink.commit_frames(0, frames0, specs, BatchStats(3000, 0, 0), 3000)  # a replay
    # batch 1: the tasks committed, the driver died before its marker (the format alone runs them)
    frames1 = _named("a_", _frames(spark, b1))
    counts = {n: f.count() for n, f in frames1.items()}
    spec = kt.TaskSpec({"bootstrap.servers": broker.bootstrap}, "tasks-a", sink.tasks_topic, 1, "q1",
                       mark=False)
    kds.write_frame(kt.records_frame(frames1, specs, kt.task_count(sum(counts.values()))), spec)
    assert sink.commit_frames(1, frames1, specs, BatchStats(2000, 0, 0), 2000)  # every task finds its own
    _check(broker.bootstrap, "a_", [b0, b1])
    assert [m["batch_id"] for m in read_markers(broker.bootstrap, "tasks-a")] == [0, 1]
    assert json.loads(read_markers(broker.bootstrap, "tasks-a")[1]["tables"]) == counts
    task_markers = [json.loads(m.value()) for m in read_messages(broker.bootstrap, sink.tasks_topic)]
    assert {(m["batch_id"], m["partition"]) for m in task_markers} == {(0, 0), (1, 0)}  # 1 task each
    sink.close()


def test_a_partition_unlike_its_committed_attempt_is_refused(spark: Any, broker: KafkaServer) -> None:
    specs = {"b_events": Table()}
    sink = KafkaTopicsSink(broker.bootstrap, sink_id="tasks-b", collect_below=0)
    sink.check(specs, {})
    sink.bind("q1")
    rows = _rows(0, 500)
    first = {"b_events": spark.createDataFrame(rows, SCHEMA)}
    spec = kt.TaskSpec({"bootstrap.servers": broker.bootstrap}, "tasks-b", sink.tasks_topic, 0, "q1",
                       mark=False)
    sink.ensure_topic("b_events", 1)
    sink.ensure_topic(sink.tasks_topic, kt.TASK_PARTITIONS, kt.TASKS_TOPIC_CONFIG)
    kds.write_frame(kt.records_frame(first, specs, 1), spec)  # the tasks of an attempt that died
    changed = [(r[0], r[1] + "!" if r[0] == 7 else r[1], *r[2:]) for r in rows]  # a clock, a lookup...
    with pytest.raises(OnceflowError, match="committed this partition with other records"):
        sink.commit_frames(0, {"b_events": spark.createDataFrame(changed, SCHEMA)}, specs,
                           BatchStats(500, 0, 0), 500)
    assert read_markers(broker.bootstrap, "tasks-b") == []
    assert len(read_records(broker.bootstrap, "b_events")) == 500  # the first attempt's, once
    sink.close()


def test_an_uncached_frame_is_encoded_by_the_tasks_that_produce_it(spark: Any, broker: KafkaServer) -> None:
    """One append table not cached (``settle``): tasks by the input rows, each record once, a replay none."""
    from onceflow.sinks._core.base import Settle

    specs = {"u_events": Table()}
    sink = KafkaTopicsSink(broker.bootstrap, sink_id="tasks-u", partitions=3, collect_below=0)
    sink.check(specs, {})
    sink.bind("q1")
    seen: list[dict[str, int]] = []

    def numbers(written: Any) -> tuple[BatchStats, int]:
        seen.append(dict(written))
        return BatchStats(4000, 0, 0), sum(written.values())

    rows = _rows(0, 3000)
    frame = spark.createDataFrame(rows, SCHEMA).repartition(5)
    settle = Settle(numbers, input_rows=kt.ROWS_PER_TASK + 1)  # two tasks, whatever the frame's partitions
    assert sink.commit_frames(0, {"u_events": frame}, specs, BatchStats(0, 0, 0), 0, settle=settle)
    assert not sink.commit_frames(0, {"u_events": frame}, specs, BatchStats(0, 0, 0), 0, settle=settle)
    with_map = spark.createDataFrame([(1, {"a": 1})], "id LONG, m MAP<STRING, LONG>")  # no hash in Spark
    assert sink.commit_frames(1, {"u_events": with_map}, specs, BatchStats(0, 0, 0), 0,
                              settle=Settle(numbers))
    got = read_records(broker.bootstrap, "u_events")
    want = Counter(json.dumps(_event(r), default=str, sort_keys=True) for r in rows)
    assert Counter(json.dumps(_parsed(json.loads(v)), default=str, sort_keys=True)
                   for _, v in got if b'"m"' not in v) == want
    assert [json.loads(v) for _, v in got if b'"m"' in v] == [{"id": 1, "m": [["a", 1]]}]  # a map's pairs
    assert seen == [{"u_events": 3000}, {"u_events": 1}]
    markers = read_markers(broker.bootstrap, "tasks-u")
    assert [(m["batch_id"], json.loads(m["tables"])) for m in markers] == [(0, {"u_events": 3000}),
                                                                            (1, {"u_events": 1})]
    task_markers = [json.loads(m.value()) for m in read_messages(broker.bootstrap, sink.tasks_topic)]
    first = sorted((m["batch_id"], m["partition"]) for m in task_markers if m["batch_id"] == 0)
    assert first == [(0, 0), (0, 1)]
    sink.close()


def test_a_value_json_cannot_hold_is_refused_before_any_task(spark: Any, broker: KafkaServer) -> None:
    specs = {"c_events": Table(key="id")}
    sink = KafkaTopicsSink(broker.bootstrap, sink_id="tasks-c", collect_below=0)
    sink.check(specs, {})
    sink.bind("q1")
    rows = [(*r[:4], float("nan") if r[0] == 11 else r[4], *r[5:]) for r in _rows(0, 300)]
    with pytest.raises(BatchRejectedError, match=r"column 'x' .*'id': 11.*JSON has no NaN"):
        sink.commit_frames(0, {"c_events": spark.createDataFrame(rows, SCHEMA)}, specs,
                           BatchStats(300, 0, 0), 300)
    topics = AdminClient({"bootstrap.servers": broker.bootstrap}).list_topics(timeout=30).topics
    assert "c_events" not in topics or read_records(broker.bootstrap, "c_events", "read_uncommitted") == []
    sink.close()


def test_the_format_on_its_own_produces_each_batch_once(spark: Any, broker: KafkaServer,
                                                        tmp_path: Path) -> None:
    folder, ck = tmp_path / "in", tmp_path / "ck"
    folder.mkdir()
    want = Counter()
    for f in range(2):
        rows = [{"topic": "d_out", "key": f"k{f}-{i}".encode(), "value": f'{{"n": {i}}}'.encode()}
                for i in range(400)]
        want.update((r["key"], r["value"]) for r in rows)
        pq.write_table(pa.Table.from_pylist(rows), folder / f"part-{f}.parquet")
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})  # kept while its futures are pending
    for made in admin.create_topics([NewTopic("d_out", 2, 1)]).values():
        made.result(30)

    def run() -> None:
        spark.dataSource.register(kds.KafkaDataSource)
        (spark.readStream.schema("topic STRING, key BINARY, value BINARY").option("maxFilesPerTrigger", 1)
         .parquet(str(folder)).writeStream.format(kt.NAME).option("bootstrap", broker.bootstrap)
         .option("sink_id", "fmt").option("checkpointLocation", str(ck)).trigger(availableNow=True)
         .start().awaitTermination())

    run()
    (ck / "commits" / "1").unlink()  # Spark runs batch 1 again: its tasks and its marker are there
    run()
    assert (ck / "commits" / "1").exists()  # batch 1 ran again
    assert Counter(read_records(broker.bootstrap, "d_out")) == want
    assert [m["batch_id"] for m in read_markers(broker.bootstrap, "fmt")] == [0, 1]
    tasks = [json.loads(m.value()) for m in read_messages(broker.bootstrap, "onceflow_tasks.fmt")]
    assert Counter(m["batch_id"] for m in tasks) == Counter({0: 1, 1: 1})  # the replay produced nothing


@pytest.mark.slow
@pytest.mark.faults
@pytest.mark.long  # make test-long (make test's 30 minutes); RELIABILITY.md's 40-round kafka-tasks verify
def test_a_killed_driver_and_killed_task_attempts_leave_each_record_once(broker: KafkaServer,
                                                                       tmp_path: Path) -> None:
    folder = tmp_path / "in"
    _write_files(folder, 6, 300, seed=11)
    d = _driver(tmp_path, str(folder), broker.bootstrap, "txn", crash_at="inside_sink_txn@1",
                extra=["--tasks"])
    assert d.wait(timeout=300) == -9, d.output()[-3000:]
    assert "crash point inside_sink_txn at batch 1" in d.output()
    assert _markers(broker.bootstrap) == [0]
    d = _driver(tmp_path, str(folder), broker.bootstrap, "task", crash_at="task_after_write@2",
                once=True, extra=["--tasks", "--master", "local[2,2]"])  # a failed task is tried again
    assert d.wait(timeout=300) == 0, d.output()[-3000:]
    assert "crash point task_after_write at batch 2 (a task's first attempt)" in d.output()
    got, _, markers = _judge(broker.bootstrap, folder)
    ships, _ = _expected(folder)
    assert set(got) == set(ships) and set(got.values()) == {1}, got.most_common(3)
    assert markers == list(range(len(markers))) and len(markers) >= 3, markers
    task_markers = [json.loads(m.value()) for m in read_messages(broker.bootstrap, "onceflow_tasks.ship")]
    assert any(m["batch_id"] == 2 and m["attempt"] == 0 for m in task_markers)  # the killed attempts'

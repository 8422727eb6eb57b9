"""Example 5-1 from Kafka under real SIGKILLs while a producer keeps producing, read by either connector.

The topic is fed from this process (another process than the pipeline's), with producer
retries (the same event id produced again at a new offset). The pipeline (``onceflow run
--kafka``) dies at a random moment after a commit, then at crash points of the SQLite sink
(:data:`POINTS`); a last run drains. The sink must equal the oracle's recomputation from the
topic's records (read by the auditor's own consumer) and the offsets Spark logged, with every
event id counted once, and each marker's input rows must be the oracle's. The negative control
of this oracle with a Kafka source (the naive sink duplicates) is in
``tests/verify/test_verify_kafka.py``.
"""

from __future__ import annotations

import random
import re
import threading
import time
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from onceflow.checkpoint import logs as ckpt
from onceflow.sinks.sqlite.db import read_batches
from onceflow.verify.driver import ProcessGroup, committed_batches, wait_until
from onceflow.verify.generator import GeneratorConfig, generate_table
from onceflow.verify.kafka_rig import batch_reader, produce_events, topic_records
from onceflow.verify.kafka_server import KafkaServer
from onceflow.verify.oracle import expect
from onceflow.verify.verdict import judge_sqlite

pytestmark = [pytest.mark.spark, pytest.mark.faults]

POINTS = ["before_sink_write", "apply_pending"]
"""Crash points here; inside_sink_txn, after_sink_commit and after_commit_log with a Kafka source
run in ``tests/verify/test_verify_kafka.py`` (whose negative control also proves the oracle and
the judge used here can fail)."""
TOPIC = "clicks"


@pytest.fixture
def broker() -> Any:
    with KafkaServer({TOPIC: 3}) as b:
        yield b


def _driver(tmp: Path, bootstrap: str, name: str, sink: str = "sqlite", crash_at: str | None = None,
            once: bool = False, connector: str = "spark") -> ProcessGroup:
    args = ["run", "--kafka", bootstrap, "--topic", TOPIC, "--kafka-connector", connector,
            "--checkpoint", str(tmp / "ck"),
            "--db", str(tmp / "counts.db"), "--sink", sink, "--max-offsets-per-trigger", "400",
            "--trigger", "200 milliseconds", "--retain-batches", "100000", *(["--once"] if once else [])]
    return ProcessGroup(args, tmp / f"{name}.out", {"ONCEFLOW_CRASH_AT": crash_at} if crash_at else {})


def _feeder(bootstrap: str, events: Any, chunk: int,
            pace_s: float) -> tuple[threading.Thread, threading.Event]:
    stop = threading.Event()

    def feed() -> None:
        for start in range(0, events.num_rows, chunk):
            if stop.is_set():
                return
            produce_events(bootstrap, TOPIC, events.slice(start, chunk))
            time.sleep(pace_s)

    thread = threading.Thread(target=feed, daemon=True)
    thread.start()
    return thread, stop


def _judge(tmp: Path, bootstrap: str) -> tuple[Any, Any, Any]:
    records = topic_records(bootstrap, TOPIC)
    exp = expect(tmp / "ck", batch_reader(tmp / "ck", records, TOPIC))
    return exp, judge_sqlite(tmp / "counts.db", exp), records


@pytest.mark.slow
@pytest.mark.parametrize("connector", [  # onceflow's source: make test-long (make test's 30 minutes)
    "spark", pytest.param("onceflow", marks=pytest.mark.long)])
def test_kafka_crash_points_and_random_kills_leave_exact_counts(broker: Any, tmp_path: Path,
                                                                connector: str) -> None:
    seed = int(time.time()) % 10_000
    rng = random.Random(seed)
    events = generate_table(GeneratorConfig(events=30_000, users=40, minutes=30, duplicates=0.1,
                                            max_disorder_s=5, seed=seed))
    produce_events(broker.bootstrap, TOPIC, events.slice(0, 1_000))
    feeder, stop = _feeder(broker.bootstrap, events.slice(1_000), chunk=200, pace_s=1.0)
    db = tmp_path / "counts.db"
    try:
        before = committed_batches(db)
        d = _driver(tmp_path, broker.bootstrap, "random", connector=connector)
        wait_until(lambda: committed_batches(db) > before, 180, "a commit")
        time.sleep(rng.uniform(0.0, 2.0))
        d.kill()
        for point in POINTS:
            target = committed_batches(db)  # markers are 0..n-1: the next batch
            d = _driver(tmp_path, broker.bootstrap, point, crash_at=f"{point}@{target}",
                        once=point == "apply_pending", connector=connector)
            assert d.wait(timeout=300) == -9, d.output()[-3000:]
            # the point fires at the first batch from target on that has input (an empty batch
            # Spark planned before the kill, e.g. a watermark's no-data batch, is committed first)
            hit = re.search(rf"crash point {point} at batch (\d+)", d.output())
            assert hit is not None and int(hit.group(1)) >= target, d.output()[-2000:]
    finally:
        stop.set()
        feeder.join(timeout=120)
    final = _driver(tmp_path, broker.bootstrap, "final", once=True, connector=connector)
    assert final.wait(timeout=300) == 0, final.output()[-3000:]
    exp, verdict, records = _judge(tmp_path, broker.bootstrap)
    end = ckpt.source_offset(tmp_path / "ck", 0)  # the connector asked for read the topic
    assert end is not None and ("offsets" in end) == (connector == "onceflow"), end
    assert verdict.ok, (seed, verdict.violations)
    assert not exp.uncommitted_batches
    distinct = len(pc.unique(records["event_id"]))
    assert sum(b.late_dropped for b in exp.batches) == 0  # on-time input: every id must count
    assert sum(exp.user_counts.values()) == distinct < records.num_rows, seed  # retries removed by id
    assert sum(b.input_rows for b in exp.batches) == records.num_rows  # every record read once
    markers = {m["batch_id"]: m for m in read_batches(tmp_path / "counts.db", "user_counts")}
    # the markers' input rows (Spark's plan metrics for a Kafka batch) are the oracle's, batch by batch
    assert {b.batch_id: b.input_rows for b in exp.batches} == {i: m["input_rows"] for i, m in markers.items()}

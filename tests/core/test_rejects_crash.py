"""Bad records under SIGKILLs while records arrive: every good record once, every bad one in rejects once.

A driver of :mod:`tests.core.orders` (20% bad records of every kind, 10% resends) is killed at a
random moment after a commit, then at ``inside_sink_txn`` and at ``after_sink_commit`` of a batch
that read input (a crash landing on a no-data batch is armed again), while a feeder keeps writing
files (or producing to a Kafka topic of two partitions); a last life drains. The tables and the
rejects must equal the generator's manifest (:func:`tests.core.orders.expected`), and every
marker must add up. The files run is in ``make test``; the Kafka run (~60 s) in ``make test-long``
(``make test`` is at its 30 minutes).
"""

from __future__ import annotations

import os
import random
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from onceflow.checkpoint import logs as ckpt
from onceflow.verify.driver import ProcessGroup, wait_until
from tests.core import orders

pytestmark = [pytest.mark.spark, pytest.mark.faults]


@pytest.fixture
def kafka_broker() -> Any:
    from onceflow.verify.kafka_server import KafkaServer

    with KafkaServer() as b:
        yield b


def _committed(db: Path) -> list[int]:
    try:
        conn = sqlite3.connect(db)
        try:
            marked = [r[0] for r in conn.execute("SELECT batch_id FROM onceflow_batches")]
            staged = [r[0] for r in conn.execute("SELECT batch_id FROM onceflow_staged")]
            return sorted(marked + staged)
        finally:
            conn.close()
    except sqlite3.Error:  # nothing written yet
        return []


def _driver(tmp: Path, name: str, crash_at: str | None = None, once: bool = False,
            kafka: tuple[str, str] | None = None) -> ProcessGroup:
    source = [kafka[0]] if kafka else [str(tmp / "in")]
    args = [*source, str(tmp / "ck"), str(tmp / "app.db"), *(["--once"] if once else []),
            *(["--topic", kafka[1]] if kafka else [])]
    env = {"ONCEFLOW_CRASH_AT": crash_at} if crash_at else {}
    return ProcessGroup(args, tmp / f"{name}.out", env, module="tests.core.orders_driver")


def _read_input(tmp: Path, batch_id: int, kafka: bool) -> bool:
    """Whether the batch read anything (its files, or offsets past the previous batch's)."""
    if not kafka:
        return bool(ckpt.batch_files(tmp / "ck", batch_id))
    before = ckpt.source_offset(tmp / "ck", batch_id - 1) if batch_id > 0 else {}
    return (before or {}).get("offsets") != (ckpt.source_offset(tmp / "ck", batch_id) or {}).get("offsets")


def _crash_on_data(tmp: Path, point: str, kafka: tuple[str, str] | None = None) -> int:
    """Kill a driver at ``point`` of a batch that read input; return that batch's id."""
    for attempt in range(4):
        done = _committed(tmp / "app.db")
        target = max(done) + 1 if done else 0
        d = _driver(tmp, f"{point}{attempt}", crash_at=f"{point}@{target}", kafka=kafka)
        assert d.wait(timeout=300) == -9, d.output()[-3000:]
        hit = int(re.findall(rf"crash point {point} at batch (\d+)", d.output())[-1])
        if _read_input(tmp, hit, kafka is not None):
            return hit
    raise AssertionError(f"{point}: four crashes in a row landed on no-data batches")


@pytest.mark.long  # make test's 30 minutes (2026-11-28); test_connect.py keeps rejects= killed
@pytest.mark.parametrize("source", ["files", pytest.param("kafka", marks=pytest.mark.long)])
def test_kills_while_bad_records_arrive_leave_every_record_once(tmp_path: Path, source: str,
                                                                request: pytest.FixtureRequest) -> None:
    seed = int(os.environ.get("ORDERS_SEED", time.time())) % 10_000
    rng = random.Random(seed)
    manifest = tmp_path / "manifest.jsonl"
    kafka = None
    if source == "kafka":
        broker = request.getfixturevalue("kafka_broker")
        broker.create_topic("orders", 2)
        kafka = (broker.bootstrap, "orders")

    def add(first: int) -> None:
        if kafka is None:
            orders.generate(tmp_path / "in", manifest, first, 200, bad_rate=0.2, seed=seed)
        else:
            orders.produce(kafka[0], kafka[1], manifest, first, 200, bad_rate=0.2, seed=seed)

    for k in range(3):
        add(k * 200)
    fed, stop = [600], threading.Event()

    def feed() -> None:  # records keep arriving while drivers live and die
        while not stop.is_set() and fed[0] < 3_000:
            add(fed[0])
            fed[0] += 200
            time.sleep(1.0)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        d = _driver(tmp_path, "random", kafka=kafka)
        wait_until(lambda: len(_committed(tmp_path / "app.db")) > 1, 180, "two commits")
        time.sleep(rng.uniform(0.0, 2.0))
        d.kill()
        for point in ("inside_sink_txn", "after_sink_commit"):
            hit = _crash_on_data(tmp_path, point, kafka)
            assert (hit in _committed(tmp_path / "app.db")) == (point == "after_sink_commit"), (point, seed)
            assert not (tmp_path / "ck" / "commits" / str(hit)).exists()
    finally:
        stop.set()
        feeder.join(timeout=60)
    final = _driver(tmp_path, "final", once=True, kafka=kafka)
    assert final.wait(timeout=300) == 0, final.output()[-3000:]
    entries = orders.read_manifest(manifest)
    assert orders.read_result(tmp_path / "app.db") == orders.expected(entries), f"seed={seed}"
    conn = sqlite3.connect(tmp_path / "app.db")
    markers = conn.execute("SELECT batch_id, input_rows, events_counted, duplicates_dropped, late_dropped, "
                           "rejected_rows FROM onceflow_batches ORDER BY batch_id").fetchall()
    assert [m[0] for m in markers] == list(range(len(markers)))  # one per batch, none twice
    for _, rows, counted, dups, late, rejected in markers:
        assert rows == counted + dups + late + rejected, (markers, seed)
    assert sum(m[1] for m in markers) == len(entries)
    assert sum(m[5] for m in markers) == conn.execute("SELECT count(*) FROM rejected").fetchone()[0] \
        == sum(orders.KINDS[e["kind"]] is not None for e in entries)

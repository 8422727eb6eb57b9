"""Kafka for the auditor: produce Example 5-1's events to a topic, read a topic back independently.

The producer side writes what :class:`onceflow.examples.user_counts.KafkaTopic` documents
(value JSON ``{"user", "event_time_us"}``, header ``event_id``, key = the user); a producer
retry is simply the same event produced again, at a new offset.

The reading side is the oracle's own: a plain ``confluent-kafka`` consumer per partition
(not onceflow's source, which is what is being checked) that returns every record of the
topic with its coordinates, so the oracle can cut each batch's input out of it by the offsets
Spark logged (:func:`batch_events`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from onceflow.errors import SourceReadError


def produce_events(bootstrap: str, topic: str, events: pa.Table) -> int:
    """Produce ``events`` (``event_id, user, event_time``) to ``topic``, in row order.

    Returns:
        Records produced (all acknowledged by the broker).
    """
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    failed: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            failed.append(str(err))

    micros = events.column("event_time").cast(pa.int64()).to_pylist()
    for eid, user, us in zip(events.column("event_id").to_pylist(), events.column("user").to_pylist(),
                             micros, strict=True):
        value = json.dumps({"user": user, "event_time_us": us}).encode()
        while True:
            try:
                producer.produce(topic, key=user.encode(), value=value, headers=[("event_id", eid.encode())],
                                 on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(60) or failed:
        raise SourceReadError(f"producing to {topic} failed: {failed[:3] or 'not acknowledged in 60 s'}")
    return int(events.num_rows)


def read_topic(bootstrap: str, topic: str, timeout_s: float = 60.0) -> list[dict[str, Any]]:
    """Every record of ``topic`` as the broker holds it, read by the auditor's own consumer.

    Returns:
        One dict per record, partition by partition in offset order: ``partition, offset, key,
        value, timestamp_ms, timestamp_type, headers`` (a list of ``(name, bytes)``).

    Raises:
        SourceReadError: A partition stopped short of its end offset for ``timeout_s``.
    """
    from confluent_kafka import Consumer, TopicPartition

    consumer: Any = Consumer({"bootstrap.servers": bootstrap, "group.id": "onceflow-oracle",
                              "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    out: list[dict[str, Any]] = []
    try:
        parts = consumer.list_topics(topic, timeout=timeout_s).topics[topic].partitions
        for part in sorted(parts):
            low, high = consumer.get_watermark_offsets(TopicPartition(topic, part), timeout=timeout_s)
            consumer.assign([TopicPartition(topic, part, low)])
            position, deadline = low, time.monotonic() + timeout_s
            while position < high:
                if time.monotonic() > deadline:
                    raise SourceReadError(f"oracle: {topic}/{part} stopped at offset {position} of {high}")
                for m in consumer.consume(1000, timeout=1.0):
                    if m.error() is not None or m.offset() >= high:
                        continue
                    kind, ms = m.timestamp()
                    out.append({"partition": part, "offset": m.offset(), "key": m.key(), "value": m.value(),
                                "timestamp_ms": ms, "timestamp_type": kind,
                                "headers": list(m.headers() or [])})
                    position = m.offset() + 1
    finally:
        consumer.close()
    return out


def topic_records(bootstrap: str, topic: str, timeout_s: float = 60.0) -> pa.Table:
    """Every record of ``topic``: ``partition, offset, event_id, user, event_time`` (offset order)."""
    raw = read_topic(bootstrap, topic, timeout_s)
    values = [json.loads(r["value"]) for r in raw]
    return pa.table({"partition": pa.array([r["partition"] for r in raw], pa.int32()),
                     "offset": pa.array([r["offset"] for r in raw], pa.int64()),
                     "event_id": pa.array([dict(r["headers"]).get("event_id", b"").decode() for r in raw],
                                          pa.string()),
                     "user": pa.array([v["user"] for v in values], pa.string()),
                     "event_time": pa.array([v["event_time_us"] for v in values], pa.int64())
                     .cast(pa.timestamp("us"))})


def offset_ranges(topic: str, start: Any, end: Any) -> dict[int, tuple[int, int]]:
    """Per partition of ``topic``, the offsets ``[lo, until)`` a batch of a Kafka source read.

    Args:
        topic: The topic.
        start: The previous batch's logged source offset (batch 0: :func:`spark_log.kafka_start`,
            None: from offset 0).
        end: This batch's logged source offset, in either source's form (see
            :mod:`onceflow.verify.spark_log`; ``from``, where it resumed after skipped offsets,
            honoured).
    """
    if not isinstance(end, dict):
        return {}
    ends, resumed = _logged(end)
    begin = _logged(start)[0]
    resumed_t, begin_t = resumed.get(topic, {}), begin.get(topic, {})
    return {int(part): (int(resumed_t.get(part, begin_t.get(part, 0))), int(until))
            for part, until in ends.get(topic, {}).items()}


def _logged(value: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(topic -> {partition: offset}, resumed)`` of a logged offset in either source's form."""
    if not isinstance(value, dict):
        return {}, {}
    nested = value.get("offsets")
    if isinstance(nested, dict) and all(isinstance(v, dict) for v in nested.values()):
        return nested, value.get("from", {}) or {}
    return value, {}


def batch_events(records: pa.Table, topic: str, start: dict[str, Any] | None,
                 end: dict[str, Any]) -> pa.Table:
    """The records a batch read: per partition ``[start, end)`` of the offsets Spark logged.

    Args:
        records: :func:`topic_records` of the topic.
        topic: The topic.
        start: The previous batch's logged source offset (None for batch 0: from offset 0).
        end: This batch's logged source offset (``from`` honoured: skipped offsets).
    """
    pieces = []
    for part, (lo, until) in offset_ranges(topic, start, end).items():
        offsets = records["offset"]
        mask = pc.and_(pc.equal(records["partition"], part),
                       pc.and_(pc.greater_equal(offsets, lo), pc.less(offsets, until)))
        pieces.append(records.filter(mask))
    if not pieces:
        return records.slice(0, 0)
    return pa.concat_tables(pieces).sort_by([("partition", "ascending"), ("offset", "ascending")])


def batch_reader(checkpoint: str | Path, records: pa.Table, topic: str) -> Callable[[int], pa.Table]:
    """The input of each batch of a Kafka-fed checkpoint, for :func:`onceflow.verify.oracle.expect`."""
    from onceflow.verify import spark_log

    ck = Path(checkpoint)

    def offset(batch_id: int) -> Any:
        return spark_log.read_offsets(ck, batch_id).offsets[0]

    def read(batch_id: int) -> pa.Table:
        end: Any = offset(batch_id) or {}
        start: Any = offset(batch_id - 1) if batch_id > 0 else spark_log.kafka_start(ck)
        return batch_events(records, topic, start, end)

    return read


def read_messages(bootstrap: str, topic: str, isolation: str = "read_committed",
                  timeout_s: float = 120.0) -> list[Any]:
    """Every record of ``topic`` (confluent-kafka messages), read to its end by the auditor's consumer.

    A ``read_committed`` read first waits until no transaction is open on the topic (each
    partition's last stable offset is its end): Kafka writes a committed transaction's markers just
    after the producer's commit returns, so a read at that moment would end before the records of
    a transaction that did commit, and the auditor would call them lost.

    Args:
        bootstrap: ``host:port`` of the brokers.
        topic: The topic (a missing topic has no records).
        isolation: ``read_committed`` (what a transactional sink's readers see) or ``read_uncommitted``.
        timeout_s: Longest read, the wait for open transactions included.

    Raises:
        SourceReadError: A transaction still open, or the end not reached, in ``timeout_s``.
    """
    from confluent_kafka import Consumer, TopicPartition

    def consumer(level: str) -> Any:
        return Consumer({"bootstrap.servers": bootstrap, "enable.auto.commit": False,
                         "isolation.level": level, "group.id": f"onceflow-auditor-{time.monotonic_ns()}"})

    deadline = time.monotonic() + timeout_s
    c = consumer(isolation)
    raw = consumer("read_uncommitted") if isolation == "read_committed" else None
    try:
        meta = c.list_topics(topic, timeout=30).topics.get(topic)
        if meta is None or meta.error is not None:
            return []
        ends = (_ends(c, topic, meta.partitions) if raw is None
                else _settled_ends(raw, c, topic, sorted(meta.partitions), deadline, timeout_s))
        c.assign([TopicPartition(topic, p, lo) for p, (lo, _) in ends.items()])
        out: list[Any] = []
        todo = {p for p, (lo, hi) in ends.items() if hi > lo}
        while todo:
            if time.monotonic() > deadline:
                raise SourceReadError(f"the auditor could not read {topic} to its end in {timeout_s:.0f} s")
            out += [m for m in c.consume(1000, timeout=0.5) if m.error() is None]
            todo = {p for p in todo if c.position([TopicPartition(topic, p)])[0].offset < ends[p][1]}
        return out
    finally:
        c.close()
        if raw is not None:
            raw.close()


def _ends(c: Any, topic: str, partitions: Any) -> dict[int, tuple[int, int]]:
    """Each partition's first offset and end, as ``c``'s isolation level sees them."""
    from onceflow.sinks.kafka.records import watermarks

    return {p: watermarks(c, topic, 30.0, p) for p in partitions}


def _settled_ends(raw: Any, committed: Any, topic: str, partitions: list[int], deadline: float,
                  timeout_s: float) -> dict[int, tuple[int, int]]:
    """The ``read_committed`` ends once each equals the partition's end (no transaction open).

    Raises:
        SourceReadError: A partition's transaction still open at ``deadline`` (a producer that
            died inside one is aborted by its coordinator after its ``transaction.timeout.ms``).
    """
    from onceflow.sinks.kafka.records import settled_ends

    settled, open_ = settled_ends(committed, raw, topic, partitions, deadline - time.monotonic(), 30.0)
    if open_:
        raise SourceReadError(
            f"the auditor could not read {topic}: a transaction is still open on partition(s) "
            f"{open_} after {timeout_s:.0f} s (a producer that died inside one is aborted after its "
            "transaction.timeout.ms); read again later")
    return settled


def read_records(bootstrap: str, topic: str, isolation: str = "read_committed",
                 timeout_s: float = 120.0) -> list[tuple[bytes | None, bytes | None]]:
    """Every record of ``topic`` as ``(key, value)`` (see :func:`read_messages`)."""
    return [(m.key(), m.value()) for m in read_messages(bootstrap, topic, isolation, timeout_s)]


def read_markers(bootstrap: str, sink_id: str) -> list[dict[str, Any]]:
    """The Kafka sink's committed markers (records of ``onceflow_batches.<sink_id>``), by batch id."""
    found: dict[int, dict[str, Any]] = {}
    from onceflow.sinks.kafka.sink import MARKER_TOPIC

    for owner, value in read_records(bootstrap, MARKER_TOPIC.replace("{sink_id}", sink_id)):
        if owner == sink_id.encode():
            row = json.loads(value or b"{}")
            found.setdefault(int(row["batch_id"]), row)
    return [found[b] for b in sorted(found)]

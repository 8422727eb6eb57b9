"""Reading one planned Kafka offset range into Arrow record batches (runs on executors).

A range is half-open: ``[start, until)`` of one topic partition, fixed in Spark's offset
log before the batch runs (:mod:`onceflow.sources.kafka.source`). Reading it:

1. assign a fresh consumer (no group membership, no offset commits) to the partition at
   ``start``, with ``auto.offset.reset=error`` so that a start offset the broker no longer
   holds is an error, never a silent jump;
2. consume until a record at offset ``>= until`` arrives (not kept) or the partition's end
   (``>= until``) is reported. Offsets without a record (transaction markers, aborted records
   under ``read_committed``, compacted records) are simply absent: the range still ends at
   ``until``, so a re-run reads exactly the same records;
3. a start offset deleted by retention fails the task with
   :class:`~onceflow.errors.SourceDataLossError` unless the query opted in to skipping
   (``failOnDataLoss=false``): then the consumer continues from the earliest offset held
   and logs how many offsets it skipped;
4. rows are yielded as ``pyarrow.RecordBatch`` of at most ``batch_rows`` rows, with the
   record id: the producer's (a header, or a field of a JSON value) when configured and
   present, else ``topic/partition/offset``; the ``headers`` column only when asked for
   (``includeHeaders``, as Spark's connector).
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from onceflow.errors import SourceDataLossError, SourceReadError
from onceflow.sources.kafka.client_log import with_logger

_log = logging.getLogger("onceflow.kafka")

ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ("record_id", pa.string()),
])
"""The source's columns with ``includeHeaders``: Spark's Kafka source columns, headers included, plus
``record_id``; without the option, the same without ``headers`` (:func:`arrow_schema`)."""


def arrow_schema(include_headers: bool) -> pa.Schema:
    """The source's columns: :data:`ARROW_SCHEMA`, without ``headers`` unless ``include_headers``."""
    return ARROW_SCHEMA if include_headers else pa.schema([f for f in ARROW_SCHEMA if f.name != "headers"])


@dataclass(frozen=True)
class ReadSpec:
    """What every read task of a query needs (pickled to the executors).

    Attributes:
        consumer: librdkafka consumer settings (``bootstrap.servers`` and the user's ``kafka.*``).
        fail_on_data_loss: Deleted offsets fail the query (else skipped, counted, logged).
        id_header: Header holding the producer's record id.
        id_field: Top-level field of a JSON value holding the producer's record id.
        read_timeout_s: Longest wait for a record the range says exists.
        batch_rows: Rows per Arrow record batch.
        include_headers: Rows carry the ``headers`` column (Spark's ``includeHeaders``); the
            headers are read for ``id_header`` either way.
    """

    consumer: dict[str, str]
    fail_on_data_loss: bool = True
    id_header: str | None = None
    id_field: str | None = None
    read_timeout_s: float = 120.0
    batch_rows: int = 20_000
    include_headers: bool = False


@dataclass(frozen=True)
class OffsetRange:
    """``[start, until)`` of one topic partition."""

    topic: str
    partition: int
    start: int
    until: int

    def __str__(self) -> str:
        return f"{self.topic}/{self.partition} offsets [{self.start}, {self.until})"


def consumer_config(spec: ReadSpec) -> dict[str, Any]:
    """Settings of a range-reading consumer: the user's, plus what replay by offset needs."""
    return {"group.id": f"onceflow-read-{uuid.uuid4().hex[:8]}", **spec.consumer,
            "enable.auto.commit": False, "enable.auto.offset.store": False,
            "enable.partition.eof": True, "auto.offset.reset": "error"}


class _Columns:
    """Column buffers of the batch being built."""

    def __init__(self) -> None:
        self.keys: list[bytes | None] = []
        self.values: list[bytes | None] = []
        self.offsets: list[int] = []
        self.times: list[int | None] = []
        self.kinds: list[int | None] = []
        self.headers: list[list[dict[str, Any]] | None] = []
        self.ids: list[str] = []

    def batch(self, topic: str, partition: int, include_headers: bool) -> pa.RecordBatch:
        n = len(self.offsets)
        times = pa.array(self.times, pa.int64())
        headers = [pa.array(self.headers, ARROW_SCHEMA.field("headers").type)] if include_headers else []
        return pa.RecordBatch.from_arrays([
            pa.array(self.keys, pa.binary()), pa.array(self.values, pa.binary()),
            pa.repeat(topic, n).cast(pa.string()) if n else pa.array([], pa.string()),
            pa.array([partition] * n, pa.int32()), pa.array(self.offsets, pa.int64()),
            pc.multiply(times, 1000).cast(pa.timestamp("us", tz="UTC")),
            pa.array(self.kinds, pa.int32()), *headers, pa.array(self.ids, pa.string()),
        ], schema=arrow_schema(include_headers))


def _producer_id(spec: ReadSpec, value: bytes | None, headers: list[tuple[str, bytes]] | None) -> str | None:
    if spec.id_header and headers:
        for name, raw in headers:
            if name == spec.id_header and raw is not None:
                return raw.decode("utf-8", "replace")
    if spec.id_field and value:
        try:
            found = json.loads(value).get(spec.id_field)
        except (ValueError, AttributeError):
            return None
        return None if found is None else str(found)
    return None


def read_range(spec: ReadSpec, rng: OffsetRange) -> Iterator[pa.RecordBatch]:
    """Read ``rng`` (protocol in the module docstring).

    Args:
        spec: The query's read settings.
        rng: The planned range.

    Yields:
        Record batches in :func:`arrow_schema`, in offset order.

    Raises:
        SourceDataLossError: Offsets of the range were deleted and ``fail_on_data_loss``.
        SourceReadError: The broker did not deliver the range within ``read_timeout_s``.
    """
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer: Any = Consumer(with_logger(consumer_config(spec)))
    try:
        consumer.assign([TopicPartition(rng.topic, rng.partition, rng.start)])
        position, cols = rng.start, _Columns()
        deadline = time.monotonic() + spec.read_timeout_s
        coords = f"{rng.topic}/{rng.partition}/"
        while position < rng.until:
            messages = consumer.consume(num_messages=min(10_000, rng.until - position), timeout=1.0)
            if not messages and time.monotonic() > deadline:
                raise SourceReadError(
                    f"{rng}: no record at offset {position} within {spec.read_timeout_s:.0f} s although "
                    "the broker reported it; is the broker reachable from the executors?")
            for m in messages:
                err = m.error()
                if err is not None:
                    code = err.code()
                    if code == KafkaError._PARTITION_EOF:
                        if m.offset() >= rng.until:  # the range's tail is offsets without records
                            position = rng.until
                            break
                    elif code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
                        position = _skip_deleted(consumer, spec, rng, position)
                        break
                    elif err.fatal():
                        raise SourceReadError(f"{rng}: {err.str()}")
                    continue
                offset = m.offset()
                if offset >= rng.until:
                    position = rng.until
                    break
                value, headers = m.value(), m.headers()
                kind, ms = m.timestamp()
                cols.keys.append(m.key())
                cols.values.append(value)
                cols.offsets.append(offset)
                cols.times.append(ms if kind else None)
                cols.kinds.append(kind - 1 if kind else None)
                if spec.include_headers:
                    cols.headers.append([{"key": k, "value": v} for k, v in headers] if headers else None)
                cols.ids.append(_producer_id(spec, value, headers) or coords + str(offset))
                position = offset + 1
            deadline = time.monotonic() + spec.read_timeout_s if messages else deadline
            if len(cols.offsets) >= spec.batch_rows:
                yield cols.batch(rng.topic, rng.partition, spec.include_headers)
                cols = _Columns()
        if cols.offsets:
            yield cols.batch(rng.topic, rng.partition, spec.include_headers)
    finally:
        consumer.close()


def _skip_deleted(consumer: Any, spec: ReadSpec, rng: OffsetRange, position: int) -> int:
    """Protocol step 3: the broker no longer holds ``position``. Returns where to go on."""
    from confluent_kafka import TopicPartition

    earliest, _ = consumer.get_watermark_offsets(TopicPartition(rng.topic, rng.partition),
                                                 timeout=30, cached=False)
    if earliest <= position:
        raise SourceReadError(f"{rng}: offset {position} reported out of range, yet the broker holds "
                              f"offsets from {earliest}; was the topic recreated?")
    end = min(earliest, rng.until)
    if spec.fail_on_data_loss:
        raise SourceDataLossError(
            f"{rng}: offsets [{position}, {earliest}) were deleted (retention) before onceflow read "
            "them. Nothing was skipped: to skip them (counted and logged), restart with the source "
            "option failOnDataLoss=false")
    _log.warning("onceflow_kafka: %s: skipped %d offsets [%d, %d) deleted before they were read "
                 "(failOnDataLoss=false)", rng, end - position, position, end)
    if end < rng.until:
        consumer.assign([TopicPartition(rng.topic, rng.partition, end)])
    return int(end)

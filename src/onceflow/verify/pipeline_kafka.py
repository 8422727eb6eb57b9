"""A user pipeline that reads Kafka: verify produces the user's records; the oracle reads them back.

``onceflow verify --pipeline PATH.py:FUNCTION --source kafka --input RECORDS`` feeds a topic on the
Kafka broker verify starts (:class:`onceflow.verify.kafka_server.KafkaServer`) and calls the user's
function with ``input = "<bootstrap>/<topic>"`` (split it with ``input.rsplit("/", 1)``).

``RECORDS`` is a file (or a directory of files) of JSON lines, one record each: an object with
``value`` (a string, or any JSON value: it is produced as its JSON text) and optionally ``key``
(a string) and ``headers`` (``{name: string}``); any other line is produced as the value itself.
:func:`pieces` cuts them into rounds; :class:`KafkaRecordsInput` produces a piece (all of it
acknowledged before the round goes on).

The oracle reads the whole topic with its own consumer (:func:`onceflow.verify.kafka_rig.read_topic`)
and cuts each committed batch out of it (:func:`batch_records`) by the offsets Spark logged
(``offsets/N-1`` to ``offsets/N`` of the source: per partition the next offset to read;
``from``: where onceflow's source resumed after skipped offsets); :func:`batch_table` builds the
batch with the documented columns of Spark's connector (``format("kafka")``: ``key, value, topic,
partition, offset, timestamp, timestampType``, and ``headers`` with ``includeHeaders``) or of
onceflow's source (those, ``headers`` with ``includeHeaders``, and ``record_id``: the header
``idHeader``, else the JSON field ``idField`` of the value, else ``topic/partition/offset``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa

from onceflow.errors import ConfigError
from onceflow.verify import spark_log
from onceflow.verify.inputs import rounds_of
from onceflow.verify.kafka_rig import offset_ranges

COLUMNS = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
    ("record_id", pa.string()),
])
"""The ``onceflow_kafka`` source's columns with ``includeHeaders``, as its documentation gives them."""
NATIVE = pa.schema([f for f in COLUMNS if f.name != "record_id"])
"""Spark's Kafka connector's columns, as Spark's documentation gives them (``headers`` only with
the option ``includeHeaders=true``)."""

Record = dict[str, Any]


def _record(line: str) -> Record:
    try:
        raw = json.loads(line)
    except ValueError:
        raw = None
    if isinstance(raw, dict) and "value" in raw:
        value = raw["value"]
        return {"key": raw.get("key"), "headers": dict(raw.get("headers") or {}),
                "value": value if isinstance(value, str) else json.dumps(value)}
    return {"key": None, "headers": {}, "value": line}


def dry_records(records: Path) -> list[Record]:
    """Every record of the input as one batch of partition 0 would hold it (the dry run's batch).

    Raises:
        ConfigError: No such file or directory, or no records in it.
    """
    out = []
    every = (r for round_ in pieces(records, 1, 1) for piece in round_ for r in piece)
    for i, r in enumerate(every):
        def raw(v: Any) -> bytes | None:
            return v.encode() if isinstance(v, str) else v

        out.append({"partition": 0, "offset": i, "key": raw(r["key"]), "value": raw(r["value"]),
                    "timestamp_ms": 0, "timestamp_type": 0,
                    "headers": [(k, raw(v)) for k, v in dict(r["headers"]).items()]})
    return out


def pieces(records: Path, rounds: int, per_round: int = 3) -> list[list[list[Record]]]:
    """The records cut into ``rounds`` lists of about ``per_round`` pieces each, in file order.

    Raises:
        ConfigError: No such file or directory, or no records in it.
    """
    if not records.exists():
        raise ConfigError(f"--input {records}: no such file or directory (give a JSON-lines file of "
                          "records)")
    files = sorted(p for p in records.iterdir() if p.is_file()) if records.is_dir() else [records]
    every = [_record(ln) for f in files for ln in f.read_text().splitlines() if ln.strip()]
    if not every:
        raise ConfigError(f"--input {records} has no records")
    wanted = rounds * per_round
    step = max(-(-len(every) // wanted), 1)
    cut = [every[i:i + step] for i in range(0, len(every), step)]
    return rounds_of(cut, rounds)


class KafkaRecordsInput:
    """The topic a user's Kafka pipeline reads, on a Kafka broker this input starts.

    Args:
        pipeline: ``PATH.py:FUNCTION``.
        topic: The topic.
        partitions: Its partitions.
    """

    def __init__(self, pipeline: str, topic: str, partitions: int = 4) -> None:
        from onceflow.verify.kafka_server import KafkaServer

        self.pipeline, self.topic = pipeline, topic
        self.broker = KafkaServer({topic: partitions})

    def append(self, piece: list[Record]) -> None:
        """Produce one piece's records, every one acknowledged."""
        from confluent_kafka import Producer

        producer = Producer({"bootstrap.servers": self.broker.bootstrap, "linger.ms": 5,
                             "enable.idempotence": True})
        failed: list[str] = []
        for r in piece:
            producer.produce(self.topic, value=r["value"].encode(),
                             key=r["key"].encode() if r["key"] is not None else None,
                             headers=[(k, str(v).encode()) for k, v in r["headers"].items()],
                             on_delivery=lambda err, _m: failed.append(str(err)) if err else None)
            producer.poll(0)
        if producer.flush(60) or failed:
            raise ConfigError(f"producing to {self.topic} failed: {failed[:3] or 'not all acknowledged'}")

    def in_place(self) -> int:
        """Pieces already produced (a Kafka-fed run does not resume)."""
        return 0

    def driver_kw(self) -> dict[str, Any]:
        """``--pipeline``/``--input <bootstrap>/<topic>``."""
        return {"pipeline": (self.pipeline, f"{self.broker.bootstrap}/{self.topic}")}

    def close(self) -> None:
        """Stop the broker."""
        self.broker.close()


def _record_id(r: Record, topic: str, id_header: str | None, id_field: str | None) -> str:
    if id_header:
        for name, raw in r["headers"]:
            if name == id_header and raw is not None:
                return str(raw.decode("utf-8", "replace"))
    if id_field and r["value"]:
        try:
            found = json.loads(r["value"]).get(id_field)
        except (ValueError, AttributeError):
            found = None
        if found is not None:
            return str(found)
    return f"{topic}/{r['partition']}/{r['offset']}"


def batch_records(records: list[Record], checkpoint: Path, batch_id: int, topic: str) -> list[Record]:
    """Batch ``batch_id``'s records (see the module), by partition and offset."""
    def logged(b: int) -> Any:
        if b < 0:
            return spark_log.kafka_start(checkpoint)
        return spark_log.read_offsets(checkpoint, b).offsets[0]

    ranges = offset_ranges(topic, logged(batch_id - 1), logged(batch_id))
    chosen = [r for r in records if r["partition"] in ranges
              and ranges[r["partition"]][0] <= r["offset"] < ranges[r["partition"]][1]]
    return sorted(chosen, key=lambda r: (r["partition"], r["offset"]))


def batch_table(chosen: list[Record], topic: str, options: dict[str, Any], native: bool = False) -> pa.Table:
    """A batch's records (:func:`batch_records`) with the source's columns.

    Args:
        chosen: The batch's records.
        topic: Their topic.
        options: The reader's options (``idHeader``/``idField``: where the record id is;
            ``includeHeaders``: both readers give headers only when ``true``).
        native: Spark's connector (:data:`NATIVE`) instead of onceflow's source (:data:`COLUMNS`).
    """
    header, field = options.get("idHeader"), options.get("idField")
    table = pa.Table.from_pylist([
        {"key": r["key"], "value": r["value"], "topic": topic, "partition": r["partition"],
         "offset": r["offset"], "timestamp": r["timestamp_ms"] * 1000, "timestampType": r["timestamp_type"],
         "headers": [{"key": k, "value": v} for k, v in r["headers"]] or None,  # none: null, as both readers
         "record_id": _record_id(r, topic, header, field)} for r in chosen], schema=COLUMNS)
    with_headers = any(str(k).lower() == "includeheaders" and str(v).lower() == "true"
                       for k, v in options.items())
    schema = NATIVE if native else COLUMNS
    return table.select([f.name for f in schema if with_headers or f.name != "headers"])

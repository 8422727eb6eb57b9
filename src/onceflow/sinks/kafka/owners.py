"""Which sink ids produce into each topic of a Kafka sink: the registry of :mod:`onceflow.sinks._core.owners`.

Kafka has no table to lock, so the registry is a topic of the cluster, ``onceflow_tables`` (one
partition, compacted): one record per topic and sink id that writes it, keyed by the topic, a
NUL byte and the sink id, its value ``{"table", "sink_id", "shared", "claimed_ms"}`` as JSON; a
hand-over writes a tombstone (a null value) for each old claim. A claim is *live* when the last
record of its key is not a tombstone; among a topic's live claims the one written first (the
lowest offset) is the topic's writer.

Kafka gives no transaction that makes reading and writing the registry exclusive, so two
queries starting at once are settled by the order of their claims in the one partition.
:meth:`Registry.claim`, in the sink's start-up check:

1. Read the registry to its end: every topic's live claims, in offset order.
2. Another sink id holds a topic and either of them did not declare it shared: refuse, naming
   both ids and the two ways out (:func:`onceflow.sinks._core.owners.refusal`).
3. Write this sink id's claim (unless it is there with the same ``shared``), wait for its offset,
   then read the registry up to it again: a claim of another sink id that blocks this one and
   was written first (a query that started at the same moment) wins — this claim is withdrawn
   (a tombstone) and the start refused as in step 2. Several starts of one sink id write the
   same claim again, which changes nothing.

:meth:`Registry.hand_over` gives a topic to another sink id (``onceflow tables --kafka BOOTSTRAP
--hand-over TOPIC --to SINK_ID``): a tombstone for each old claim, then the new one's claim.
Topics written before the registry existed belong to the first sink id that starts on them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from onceflow.errors import ConfigError, OnceflowError
from onceflow.sinks._core import owners
from onceflow.sinks._core.tables import Table
from onceflow.sinks.kafka import records as kafka_records
from onceflow.sources.kafka.client_log import with_logger

TOPIC = "onceflow_tables"
"""The registry topic (one partition, compacted)."""
TOPIC_CONFIG = {"cleanup.policy": "compact"}
_TIMEOUT_S = 60.0

Claims = dict[str, dict[str, tuple[int, bool, int]]]
"""topic -> sink id -> (offset of its live claim, shared, claimed_ms), in offset order."""


def _key(table: str, sink_id: str) -> bytes:
    return f"{table}\x00{sink_id}".encode()


def _fold(claims: Claims, offset: int, key: bytes, value: bytes | None) -> None:
    """One registry record into ``claims`` (a claim written again keeps its first offset and time)."""
    table, _, sink_id = key.decode().partition("\x00")
    held = claims.setdefault(table, {})
    if value is None:
        held.pop(sink_id, None)
        return
    shared = bool(json.loads(value)["shared"])
    first, since = (held[sink_id][0], held[sink_id][2]) if sink_id in held else \
        (offset, int(json.loads(value)["claimed_ms"]))
    held[sink_id] = (first, shared, since)


class Registry:
    """The registry topic of one Kafka cluster, read and written with a client's settings.

    Args:
        conf: librdkafka settings with ``bootstrap.servers`` (and security, if any).
        topic: The registry topic.
    """

    def __init__(self, conf: Mapping[str, Any], topic: str = TOPIC) -> None:
        import confluent_kafka

        self.ck = confluent_kafka
        self.conf = dict(conf)
        self.topic = topic
        self.where = f"Kafka {self.conf.get('bootstrap.servers')}"

    def _ensure(self) -> None:
        """The registry topic, created when the brokers lack it (created meanwhile by another: fine)."""
        from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

        admin = AdminClient(with_logger(self.conf))
        if self.topic in admin.list_topics(timeout=_TIMEOUT_S).topics:
            return
        for fut in admin.create_topics([NewTopic(self.topic, 1, -1, config=TOPIC_CONFIG)]).values():
            try:
                fut.result(timeout=_TIMEOUT_S)
            except Exception as exc:
                if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                    raise OnceflowError(f"onceflow.kafka: cannot create the registry topic {self.topic} "
                                        f"on {self.where}: {exc}") from None

    def read(self, upto: int | None = None) -> Claims:
        """Step 1: the live claims of every topic, from the registry's start to its end (or ``upto``).

        Args:
            upto: Read the offsets before this one only (None: to the end as of now).
        """
        consumer = self.ck.Consumer(with_logger({**self.conf, "group.id": "onceflow.tables.reader",
                                                 "enable.auto.commit": False,
                                                 "isolation.level": "read_committed"}))
        claims: Claims = {}
        try:
            low, high = kafka_records.watermarks(consumer, self.topic, _TIMEOUT_S)
            if upto is not None:
                high = min(high, upto)
            if high <= low:
                return claims
            for m in kafka_records.read_span(consumer, self.topic, low, high,
                                             f"the registry topic {self.topic} on {self.where}", _TIMEOUT_S):
                if m.key() is not None:
                    _fold(claims, m.offset(), m.key(), m.value())
        finally:
            consumer.close()
        return claims

    def _write(self, records: Sequence[tuple[bytes, bytes | None]]) -> int:
        """Produce ``records`` in order; the offset of the last one."""
        producer = self.ck.Producer(with_logger({**self.conf, "enable.idempotence": True}))
        offsets: list[int] = []
        errors: list[Any] = []

        def done(err: Any, msg: Any) -> None:
            if err is not None:
                errors.append(err)
            else:
                offsets.append(msg.offset())

        for key, value in records:
            producer.produce(self.topic, value, key, on_delivery=done)
        if producer.flush(_TIMEOUT_S) or errors:
            raise OnceflowError(f"onceflow.kafka: writing the registry topic {self.topic} on {self.where} "
                                f"failed: {errors[0] if errors else 'not delivered in time'}")
        return max(offsets)

    def _claim_record(self, table: str, sink_id: str, shared: bool, since: int) -> tuple[bytes, bytes]:
        value = {"table": table, "sink_id": sink_id, "shared": shared, "claimed_ms": since}
        return _key(table, sink_id), json.dumps(value, separators=(",", ":")).encode()

    def claim(self, sink_id: str, specs: Mapping[str, Table]) -> None:
        """Steps 1-3 for every topic of ``specs``.

        Raises:
            ConfigError: Another sink id writes a topic (see :func:`onceflow.sinks._core.owners.refusal`).
        """
        self._ensure()
        tool = f"--kafka {self.conf.get('bootstrap.servers')}"
        claims = self.read()  # 1

        def others(held: dict[str, tuple[int, bool, int]]) -> list[tuple[str, bool]]:
            return [(s, f) for s, (_, f, _) in sorted(held.items(), key=lambda i: i[1][0]) if s != sink_id]

        todo, new = [], []
        for name, spec in specs.items():
            held = claims.get(name, {})
            why = owners.refusal(self.where, name, sink_id, others(held), spec.shared, tool)  # 2
            if why:
                raise ConfigError(why)
            if held.get(sink_id, (0, None, 0))[1] != spec.shared:
                since = held[sink_id][2] if sink_id in held else owners.now_ms()
                new += [] if sink_id in held else [name]
                todo.append(self._claim_record(name, sink_id, spec.shared, since))
        if not todo:
            return
        mine = self._write(todo)  # 3
        after = self.read(upto=mine + 1)
        for name, spec in specs.items():
            held = after.get(name, {})
            at = held.get(sink_id, (mine, spec.shared, 0))[0]
            earlier = [(s, f) for s, f in others(held) if held[s][0] < at]
            why = owners.refusal(self.where, name, sink_id, earlier, spec.shared, tool)
            if why:
                self._write([(_key(n, sink_id), None) for n in new])
                raise ConfigError(why)

    def listed(self) -> list[tuple[str, str, bool, int]]:
        """Every live claim: ``(topic, sink_id, shared, claimed_ms)``, by topic and sink id."""
        self._ensure()
        return [(t, s, f, m) for t, held in sorted(self.read().items())
                for s, (_, f, m) in sorted(held.items())]

    def hand_over(self, table: str, to: str) -> list[str]:
        """Give ``table`` to sink id ``to``; the sink ids that held it."""
        self._ensure()
        before = sorted(self.read().get(table, {}))
        records: list[tuple[bytes, bytes | None]] = [(_key(table, s), None) for s in before]
        self._write([*records, self._claim_record(table, to, False, owners.now_ms())])
        return before

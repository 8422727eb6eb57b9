"""A real Kafka broker per module (one KRaft node on loopback: onceflow.verify.kafka_server.KafkaServer)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from onceflow.verify.kafka_server import KafkaServer


@pytest.fixture(scope="module")
def broker() -> Iterator[KafkaServer]:
    with KafkaServer() as b:
        yield b

"""A Kafka-protocol broker (librdkafka's mock cluster in a helper process) for the module."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from onceflow.verify.broker import BrokerProcess


@pytest.fixture(scope="module")
def broker() -> Iterator[BrokerProcess]:
    with BrokerProcess() as b:
        yield b

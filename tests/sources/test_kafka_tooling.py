"""What a user of onceflow's Kafka broker and clients sees: the broker's log, Kafka's tools, clients' lines.

A real KRaft broker (``onceflow.verify.kafka_server.KafkaServer``), Kafka's own tools run by
``onceflow kafka-tool`` as a user runs them, and real librdkafka clients (confluent-kafka) against
a port nothing listens on.
"""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from onceflow.errors import OnceflowError
from onceflow.sources.kafka.client_log import NAME, with_logger
from onceflow.verify.kafka_server import KafkaServer

pytestmark = pytest.mark.jvm  # Kafka brokers of its own


def _tool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "onceflow.cli.main", "kafka-tool", *args],
                          capture_output=True, text=True, timeout=180)


def test_the_broker_logs_and_kafkas_own_tools_run(broker: KafkaServer) -> None:
    log = (broker.dir / "broker.log").read_text()
    assert "INFO" in log and "Kafka Server started" in log, log[-2000:]  # Log4j 2 through SLF4J
    assert "NOP" not in log and "Defaulting to no-operation" not in log
    made = _tool("topics", "--bootstrap-server", broker.bootstrap, "--create", "--topic", "tooling",
                 "--partitions", "2")
    assert made.returncode == 0, made.stderr
    listed = _tool("topics", "--bootstrap-server", broker.bootstrap, "--list")
    assert "tooling" in listed.stdout.split()
    sent = _tool("verifiable-producer", "--bootstrap-server", broker.bootstrap, "--topic", "tooling",
                 "--max-messages", "7", "--acks", "-1")
    assert sent.returncode == 0 and '"acked":7' in sent.stdout, sent.stdout[-500:] + sent.stderr[-500:]
    read = _tool("console-consumer", "--bootstrap-server", broker.bootstrap, "--topic", "tooling",
                 "--from-beginning", "--max-messages", "7", "--isolation-level", "read_committed")
    assert sorted(read.stdout.split()) == [str(i) for i in range(7)], read.stderr
    offsets = _tool("get-offsets", "--bootstrap-server", broker.bootstrap, "--topic", "tooling")
    assert sum(int(line.rsplit(":", 1)[1]) for line in offsets.stdout.split()) == 7
    wrong = _tool("topicz")
    assert wrong.returncode == 2 and "topics" in wrong.stderr


def test_a_broker_that_cannot_start_says_why(tmp_path: Path) -> None:
    server = KafkaServer(data_dir=tmp_path / "k", start=False)
    with socket.socket() as taken:  # its port held by another process's socket
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        taken.bind(("127.0.0.1", server.port))
        taken.listen()
        with pytest.raises(OnceflowError, match="Kafka broker exited with code") as caught:
            server.start()
    assert "Address already in use" in str(caught.value) or "BindException" in str(caught.value), caught.value


def test_librdkafkas_lines_go_through_logging_each_kind_explained_once(
        caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka import KafkaException, Producer

    with socket.socket() as s:  # a port nothing listens on: every connect is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    caplog.set_level(logging.INFO, logger=NAME)
    producer = Producer(with_logger({"bootstrap.servers": f"127.0.0.1:{port}", "transactional.id": "t",
                                     "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 100}))
    with pytest.raises(KafkaException):
        producer.init_transactions(3)
    producer.poll(0.5)
    lines = [r.getMessage() for r in caplog.records if r.name == NAME]
    refused = [line for line in lines if "Connect to ipv4" in line]
    assert refused, lines  # librdkafka retried every ~100 ms for 3 s: dozens of attempts
    assert "onceflow: the Kafka broker does not answer" in refused[0]
    assert len(refused) == 1, refused  # the repeats counted, not printed
    assert all("onceflow:" not in line for line in refused[1:])

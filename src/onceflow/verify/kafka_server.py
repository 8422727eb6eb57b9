"""A real single-node Kafka broker (KRaft mode) on loopback, for tests, demos and verify.

The broker is Apache Kafka's own server (``kafka.Kafka``) from the pinned ``kafka-broker`` jars
(:mod:`onceflow.runtime.jars`; fetched on first use, or ahead with ``onceflow jars fetch kafka-broker``),
one JVM acting as broker and controller, its data in a directory of its own. Unlike
librdkafka's mock cluster it runs transactions for real: a ``read_committed`` consumer never
sees an aborted record, and a producer with a ``transactional.id`` fences the one before it.

Starting (:meth:`KafkaServer.start`):

1. a new data directory is formatted (``kafka.tools.StorageTool format --standalone``) with a
   fresh cluster id; a restart keeps the directory and its ports;
2. the JVM starts (512 MB heap), its output to ``broker.log`` in the data directory: Log4j 2 at
   INFO (``log4j2-info.properties`` there; the settings dumps, request and state-change loggers
   at WARN), so a broker that does not get ready says why in the error's last lines of that log;
3. the server is ready when an admin client lists its topics; the topics asked for are created
   (and waited for) before :meth:`start` returns.
"""

from __future__ import annotations

import base64
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

from onceflow.errors import OnceflowError
from onceflow.runtime import jars
from onceflow.runtime.java import find_java

READY_TIMEOUT_S = 60.0

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = out
appender.out.target = {target}
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.out.ref = out
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
logger.config.name = org.apache.kafka.common.config.AbstractConfig
logger.config.level = WARN
"""
"""Log4j 2's settings: the broker's (INFO, to its stdout: ``broker.log``), a tool's (WARN, stderr)."""

TOOLS = {
    "topics": "org.apache.kafka.tools.TopicCommand",
    "console-consumer": "org.apache.kafka.tools.consumer.ConsoleConsumer",
    "console-producer": "org.apache.kafka.tools.ConsoleProducer",
    "consumer-groups": "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand",
    "get-offsets": "org.apache.kafka.tools.GetOffsetShell",
    "transactions": "org.apache.kafka.tools.TransactionsCommand",
    "verifiable-producer": "org.apache.kafka.tools.VerifiableProducer",
    "verifiable-consumer": "org.apache.kafka.tools.VerifiableConsumer",
    "dump-log": "kafka.tools.DumpLogSegments",
}
"""``onceflow kafka-tool NAME`` -> the class of Kafka's own tool (``kafka-topics.sh`` is ``topics``)."""


def log_settings(where: Path, level: str = "INFO", target: str = "SYSTEM_OUT") -> Path:
    """Write Log4j 2's settings for a broker or a tool into ``where``; the file."""
    where.mkdir(parents=True, exist_ok=True)
    path = where / f"log4j2-{level.lower()}.properties"
    path.write_text(_LOG4J2.format(level=level, target=target), encoding="utf-8")
    return path


def tool_command(name: str, args: list[str], settings_dir: Path) -> list[str]:
    """The command that runs Kafka's tool ``name`` (:data:`TOOLS`) with ``args``, its logs at WARN on stderr.

    Raises:
        OnceflowError: Not a tool of :data:`TOOLS`.
    """
    if name not in TOOLS:
        raise OnceflowError(f"no Kafka tool {name!r}: the tools are {', '.join(TOOLS)}")
    classpath = os.pathsep.join(str(p) for p in jars.fetch(jars.BROKER))
    return _java(classpath, log_settings(settings_dir, "WARN", "SYSTEM_ERR"), TOOLS[name], *args)


def _java(classpath: str, settings: Path, main: str, *args: str) -> list[str]:
    """A JVM on ``classpath`` running ``main`` (a small heap, a quick start), Log4j 2 set by ``settings``."""
    return [find_java(), "-Xmx512m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={settings}", "-cp", classpath, main, *args]

_PROPERTIES = """\
process.roles=broker,controller
node.id=1
controller.quorum.bootstrap.servers=127.0.0.1:{controller}
listeners=PLAINTEXT://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller}
advertised.listeners=PLAINTEXT://127.0.0.1:{port}
controller.listener.names=CONTROLLER
listener.security.protocol.map=CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT
inter.broker.listener.name=PLAINTEXT
log.dirs={data}
num.partitions=1
auto.create.topics.enable=false
offsets.topic.replication.factor=1
offsets.topic.num.partitions=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
transaction.state.log.num.partitions=1
group.initial.rebalance.delay.ms=0
broker.heartbeat.interval.ms=500
broker.session.timeout.ms=3000
share.coordinator.state.topic.replication.factor=1
share.coordinator.state.topic.min.isr=1
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class KafkaServer:
    """One Kafka broker process; a context manager that stops it and removes its data.

    Args:
        topics: ``{name: partitions}`` created when it starts.
        data_dir: Where the broker keeps its logs (a new temporary directory when None; removed
            on :meth:`close` only when onceflow made it).
        start: Start at once (else call :meth:`start`).
    """

    def __init__(self, topics: dict[str, int] | None = None, data_dir: str | Path | None = None,
                 start: bool = True) -> None:
        self._own_dir = data_dir is None
        made = data_dir is None
        self.dir = Path(tempfile.mkdtemp(prefix="onceflow-kafka-")) if made else Path(str(data_dir))
        self.port, self.controller = _free_port(), _free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None
        self._topics = dict(topics or {})
        fetched = jars.fetch(jars.BROKER, progress=lambda line: print(line, file=sys.stderr))  # once
        self._classpath = os.pathsep.join(str(p) for p in fetched)
        if start:
            self.start()

    def _java(self, main: str, *args: str) -> list[str]:
        return _java(self._classpath, log_settings(self.dir), main, *args)

    def start(self) -> KafkaServer:
        """Start the broker (steps 1-3 of the module docstring); a restart keeps its data.

        A broker that is running already is left as it is (a second process would hold the
        same data directory, and the first one would be lost to :meth:`stop`).

        Raises:
            OnceflowError: The broker exited or did not get ready (its log's errors and last lines
                are in the message).
        """
        if self.proc is not None and self.proc.poll() is None:
            return self
        props = self.dir / "server.properties"
        data = self.dir / "data"
        if not props.exists():
            data.mkdir(parents=True, exist_ok=True)
            props.write_text(_PROPERTIES.format(port=self.port, controller=self.controller, data=data),
                             encoding="utf-8")
            cluster = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
            done = subprocess.run(self._java("kafka.tools.StorageTool", "format", "--standalone",
                                             f"--cluster-id={cluster}",  # an id may start with "-"
                                             "--config", str(props)), capture_output=True, text=True,
                                  timeout=120)
            if done.returncode != 0:
                props.unlink()
                raise OnceflowError(f"cannot format the Kafka broker's storage in {data}: "
                                    f"{(done.stderr or done.stdout).strip()[-2000:]}")
        log = open(self.dir / "broker.log", "ab")  # noqa: SIM115 (the child writes it)
        try:
            self.proc = subprocess.Popen(self._java("kafka.Kafka", str(props)), stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        self._wait_ready()
        for name, parts in self._topics.items():
            self.create_topic(name, parts)
        self._topics = {}
        return self

    def admin(self) -> Any:
        """An admin client of the broker."""
        from confluent_kafka.admin import AdminClient

        return AdminClient({"bootstrap.servers": self.bootstrap})

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc is not None and self.proc.poll() is not None:
                break
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
            except OSError:  # not listening yet: no client (it would log each refused connect)
                time.sleep(0.1)
                continue
            try:
                self.admin().list_topics(timeout=5)
                return
            except Exception:  # confluent_kafka.KafkaException while it starts
                time.sleep(0.2)
        lines = (self.dir / "broker.log").read_text(errors="replace").splitlines()
        exited = self.proc.poll() if self.proc is not None else None
        self.stop()
        how = (f"exited with code {exited}" if exited is not None
               else f"did not get ready in {READY_TIMEOUT_S:.0f} s")
        errors = [ln for ln in lines if " ERROR " in ln or " FATAL " in ln or "Exception:" in ln][:6]
        said = f"its errors:\n{chr(10).join(errors)}\n... its log ends:\n" if errors else "its log ends:\n"
        raise OnceflowError(f"the Kafka broker {how} ({self.dir / 'broker.log'}); {said}"
                            + "\n".join(lines[-8:]))

    def create_topic(self, topic: str, partitions: int) -> None:
        """Create a topic and wait until its partitions have a leader.

        Raises:
            OnceflowError: The broker refused it.
        """
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        admin = self.admin()
        try:
            for fut in admin.create_topics([NewTopic(topic, partitions, 1)]).values():
                fut.result(timeout=30)
        except Exception as exc:
            raise OnceflowError(f"Kafka broker: cannot create topic {topic}: {exc}") from None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            meta = admin.list_topics(topic, timeout=5).topics.get(topic)
            if meta is not None and meta.error is None and len(meta.partitions) == partitions \
                    and all(p.leader >= 0 for p in meta.partitions.values()):
                return
            time.sleep(0.1)
        raise OnceflowError(f"Kafka broker: topic {topic} has no leader 30 s after it was created")

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Delete the partition's records before an offset (as retention would).

        Raises:
            OnceflowError: The broker refused it.
        """
        from confluent_kafka import TopicPartition

        admin = self.admin()  # kept: its futures never complete once the client is gone
        try:
            for fut in admin.delete_records([TopicPartition(topic, partition, before)]).values():
                fut.result(timeout=30)
        except Exception as exc:
            raise OnceflowError(f"Kafka broker: cannot delete records of {topic}/{partition}: "
                                f"{exc}") from None

    def kill(self) -> None:
        """SIGKILL the broker (its data stays; :meth:`start` brings it back)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        """Stop the broker cleanly (SIGTERM; killed after 20 s)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self, hard: bool = False) -> None:
        """Stop (``hard``: SIGKILL) and start again on the same ports and data."""
        self.kill() if hard else self.stop()
        self.start()

    def close(self) -> None:
        """Stop the broker and remove the data directory onceflow made."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> KafkaServer:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

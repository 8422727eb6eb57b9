"""A Kafka-protocol broker on loopback for tests, demos and ``onceflow verify``.

librdkafka's mock cluster (shipped inside ``confluent-kafka``) speaks the real Kafka
protocol for produce, fetch, list-offsets, metadata and consumer groups. It lives inside
one client process; this module holds it in a helper process of its own, so that
producers, Spark's driver and its executors all reach it over TCP like any broker::

    python -m onceflow.verify.broker --topic events:4
    # prints: bootstrap 127.0.0.1:40123

The helper then reads commands on its standard input, one per line (answers ``ok`` or
``error <text>`` on standard output):

- ``create <topic> <partitions>``: create a topic (the mock has no CreateTopics API, and
  auto-created topics get 4 partitions);
- ``delete <topic> <partition> <offset>``: delete records before ``offset``, as retention
  would (the partition's earliest offset becomes ``offset``).

What the mock does not do (measured with librdkafka 2.16): CreatePartitions (no partitions
can be added to an existing topic; a new topic matching a subscribed pattern is how new
partitions appear here), ``offsets_for_times``, and hiding aborted transactional records
under ``read_committed``. :class:`BrokerProcess` starts the helper from Python.
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import os
import subprocess
import sys
import threading
from types import TracebackType
from typing import IO

from onceflow.errors import OnceflowError

READY = "bootstrap "
"""Prefix of the line the helper prints once it serves."""


def _library() -> ctypes.CDLL:
    """The librdkafka that confluent-kafka ships, with the mock cluster's C API typed."""
    import confluent_kafka

    here = os.path.dirname(confluent_kafka.__file__)
    found = sorted(glob.glob(os.path.join(here, os.pardir, "confluent_kafka.libs", "librdkafka*")))
    lib = ctypes.CDLL(found[0] if found else "librdkafka.so.1")
    vp, cp = ctypes.c_void_p, ctypes.c_char_p
    lib.rd_kafka_conf_new.restype = vp
    lib.rd_kafka_conf_set.argtypes = [vp, cp, cp, cp, ctypes.c_size_t]
    lib.rd_kafka_new.restype = vp
    lib.rd_kafka_new.argtypes = [ctypes.c_int, vp, cp, ctypes.c_size_t]
    lib.rd_kafka_mock_cluster_new.restype = vp
    lib.rd_kafka_mock_cluster_new.argtypes = [vp, ctypes.c_int]
    lib.rd_kafka_mock_cluster_bootstraps.restype = cp
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [vp]
    lib.rd_kafka_mock_topic_create.argtypes = [vp, cp, ctypes.c_int, ctypes.c_int]
    lib.rd_kafka_mock_partition_delete_records.argtypes = [vp, cp, ctypes.c_int32, ctypes.c_int64]
    lib.rd_kafka_err2str.restype = cp
    return lib


class MockCluster:
    """librdkafka's mock cluster, held by this process.

    Args:
        brokers: Number of brokers.
    """

    def __init__(self, brokers: int = 1) -> None:
        self._lib = _library()
        err = ctypes.create_string_buffer(512)
        conf = self._lib.rd_kafka_conf_new()
        self._lib.rd_kafka_conf_set(conf, b"log_level", b"3", err, len(err))
        self._rk = self._lib.rd_kafka_new(0, conf, err, len(err))  # 0: a producer handle
        if not self._rk:
            raise OnceflowError(f"cannot create a Kafka client for the mock cluster: {err.value.decode()}")
        self._cluster = self._lib.rd_kafka_mock_cluster_new(self._rk, brokers)
        if not self._cluster:
            raise OnceflowError("librdkafka could not start a mock cluster")
        self.bootstrap: str = self._lib.rd_kafka_mock_cluster_bootstraps(self._cluster).decode()

    def _check(self, code: int, what: str) -> None:
        if code:
            raise OnceflowError(f"{what}: {self._lib.rd_kafka_err2str(code).decode()}")

    def create_topic(self, topic: str, partitions: int) -> None:
        """Create ``topic`` with ``partitions`` partitions."""
        self._check(self._lib.rd_kafka_mock_topic_create(self._cluster, topic.encode(), partitions, 1),
                    f"create topic {topic!r}")

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Delete the records of ``topic``/``partition`` before offset ``before`` (retention)."""
        self._check(self._lib.rd_kafka_mock_partition_delete_records(
            self._cluster, topic.encode(), partition, before), f"delete records of {topic}/{partition}")


def _serve(cluster: MockCluster, commands: IO[str], answers: IO[str]) -> None:
    for line in commands:
        words = line.split()
        try:
            if words[:1] == ["create"] and len(words) == 3:
                cluster.create_topic(words[1], int(words[2]))
            elif words[:1] == ["delete"] and len(words) == 4:
                cluster.delete_records(words[1], int(words[2]), int(words[3]))
            else:
                raise OnceflowError(f"unknown command {line.strip()!r}")
            answers.write("ok\n")
        except (OnceflowError, ValueError) as exc:
            answers.write(f"error {exc}\n")
        answers.flush()


def main(argv: list[str] | None = None) -> int:
    """Run the helper until its standard input closes (see the module docstring)."""
    parser = argparse.ArgumentParser(prog="python -m onceflow.verify.broker",
                                     description="A Kafka-protocol mock broker on loopback.")
    parser.add_argument("--brokers", type=int, default=1)
    parser.add_argument("--topic", action="append", default=[], metavar="NAME:PARTITIONS",
                        help="create a topic first (repeatable)")
    args = parser.parse_args(argv)
    cluster = MockCluster(args.brokers)
    for spec in args.topic:
        name, _, parts = spec.partition(":")
        cluster.create_topic(name, int(parts or 1))
    print(READY + cluster.bootstrap, flush=True)
    _serve(cluster, sys.stdin, sys.stdout)
    return 0


class BrokerProcess:
    """The helper as a child process; a context manager that stops it on exit.

    Args:
        topics: ``{name: partitions}`` created before it reports ready.
        brokers: Number of brokers.
    """

    def __init__(self, topics: dict[str, int] | None = None, brokers: int = 1) -> None:
        args = [sys.executable, "-m", "onceflow.verify.broker", "--brokers", str(brokers)]
        for name, parts in (topics or {}).items():
            args += ["--topic", f"{name}:{parts}"]
        self.proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, bufsize=1)
        self._lock = threading.Lock()
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith(READY):
            self.stop()
            raise OnceflowError(f"the Kafka mock broker did not start (it printed {line!r})")
        self.bootstrap = line[len(READY):].strip()

    def _ask(self, command: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(command + "\n")
            self.proc.stdin.flush()
            answer = self.proc.stdout.readline().strip()
        if answer != "ok":
            raise OnceflowError(f"mock broker: {command!r}: {answer or 'no answer (it exited)'}")

    def create_topic(self, topic: str, partitions: int) -> None:
        """Create a topic (see :meth:`MockCluster.create_topic`)."""
        self._ask(f"create {topic} {partitions}")

    def delete_records(self, topic: str, partition: int, before: int) -> None:
        """Delete records before an offset (see :meth:`MockCluster.delete_records`)."""
        self._ask(f"delete {topic} {partition} {before}")

    def stop(self) -> None:
        """Stop the helper (closing its input ends it; killed if it lingers)."""
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> BrokerProcess:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()


if __name__ == "__main__":
    sys.exit(main())

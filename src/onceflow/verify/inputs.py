"""Where ``onceflow verify`` feeds its input: the event log, or a Kafka topic.

Both take the same generated chunks (:func:`chunks`) and are fed from a thread while a round
runs (:class:`Feeder`); each knows the ``onceflow run`` arguments that read it and what the
oracle needs to cut each batch's input out of it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pyarrow as pa

from onceflow.sources.log import EventLog
from onceflow.verify.generator import GeneratorConfig, generate_segments

T = TypeVar("T")

TOPIC = "verify-events"
"""The topic a Kafka-fed verify run produces to."""


def chunks(total: int, rounds: int, segment_size: int, seed: int, duplicates: bool,
           late: bool) -> list[list[pa.Table]]:
    """The whole generated input, cut into per-round lists of segments.

    Args:
        total: Distinct events over all rounds.
        rounds: Number of rounds.
        segment_size: Rows per segment (a Kafka-fed run produces a segment's rows at once).
        seed: Input seed.
        duplicates: Add producer retries (5%).
        late: Add late events (2%).
    """
    gen = GeneratorConfig(events=total, users=50, minutes=max(total / 2_000, 1.0), seed=seed,
                          duplicates=0.05 if duplicates else 0.0, late=0.02 if late else 0.0,
                          segment_size=segment_size)
    return rounds_of(list(generate_segments(gen)), rounds)


def rounds_of(items: list[T], rounds: int) -> list[list[T]]:
    """``items`` in order, cut into ``rounds`` lists of equal length; the last takes what is left."""
    per = max(len(items) // rounds, 1)
    out = [items[i * per:(i + 1) * per] for i in range(rounds)]
    out[-1].extend(items[rounds * per:])
    return out


class Input(Protocol):
    """An input of a verify run."""

    def append(self, table: pa.Table) -> None:
        """Make one segment's rows available to the pipeline."""

    def driver_kw(self) -> dict[str, Any]:
        """Keyword arguments of :class:`onceflow.verify.driver.Driver` that read this input."""

    def oracle_inputs(self, checkpoint: Path) -> Callable[[int], pa.Table] | None:
        """The oracle's per-batch input reader (None: the log's files, from ``sources/0``)."""

    def close(self) -> None:
        """Release what the input holds."""


class LogInput:
    """The onceflow event log in ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.log = EventLog(directory)

    def append(self, table: pa.Table) -> None:
        """Append one atomic segment."""
        self.log.append(table)

    def driver_kw(self) -> dict[str, Any]:
        """Nothing beyond the log directory every driver gets."""
        return {}

    def oracle_inputs(self, checkpoint: Path) -> Callable[[int], pa.Table] | None:
        """The batch's files (the oracle's default)."""
        return None

    def close(self) -> None:
        """Nothing to release."""


class KafkaInput:
    """A topic on a mock Kafka broker that this input starts (a helper process).

    Args:
        partitions: Partitions of the topic.
        rows_per_file: Rows of a segment: a driver's ``max_files`` x this = its offsets per batch.
    """

    def __init__(self, partitions: int = 4, rows_per_file: int = 1_000) -> None:
        from onceflow.verify.kafka_server import KafkaServer

        self.broker = KafkaServer({TOPIC: partitions})
        self.rows_per_file = rows_per_file

    def append(self, table: pa.Table) -> None:
        """Produce the rows (a producer retry is a row produced again)."""
        from onceflow.verify.kafka_rig import produce_events

        produce_events(self.broker.bootstrap, TOPIC, table)

    def driver_kw(self) -> dict[str, Any]:
        """``--kafka``/``--topic`` instead of ``--log``."""
        return {"kafka": (self.broker.bootstrap, TOPIC, self.rows_per_file)}

    def oracle_inputs(self, checkpoint: Path) -> Callable[[int], pa.Table] | None:
        """Each batch's records, by the offsets Spark logged, read by the auditor's own consumer."""
        from onceflow.verify.kafka_rig import batch_reader, topic_records

        return batch_reader(checkpoint, topic_records(self.broker.bootstrap, TOPIC), TOPIC)

    def close(self) -> None:
        """Stop the broker (its records live in its memory)."""
        self.broker.close()


class Feeder:
    """Appends tables to an input from a thread, one every ``pace_s``, while a round runs."""

    def __init__(self, append: Callable[[pa.Table], None], tables: list[pa.Table], pace_s: float) -> None:
        self.appended = 0
        self._thread = threading.Thread(target=self._run, args=(append, tables, pace_s), daemon=True)
        self._thread.start()

    def _run(self, append: Callable[[pa.Table], None], tables: list[pa.Table], pace_s: float) -> None:
        for t in tables:
            time.sleep(pace_s)
            append(t)
            self.appended += 1

    def join(self) -> None:
        """Wait until every table is appended."""
        self._thread.join()

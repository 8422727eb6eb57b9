"""Kafka records produced by Spark's tasks, each task in a transaction of its own, fenced and marked.

A large batch for :class:`onceflow.sinks.kafka.sink.KafkaTopicsSink` never passes through the
driver: its rows are encoded as records by Spark (:func:`records_frame`: each table's rows as
``topic, key, value`` exactly as the driver-side path encodes them, hash-partitioned on the
record into a number of tasks that depends on the batch's rows only), and each task produces
its partition in one Kafka transaction (:func:`write_task`). Kafka has no transaction that
several producers share, so a batch is one transaction per task; a task's transaction also
writes a *task marker* to partition ``p`` of the sink's tasks topic ``onceflow_tasks.<sink_id>``
(compacted: the last marker of each partition is what counts). A ``read_committed`` reader sees a
task's records when its transaction commits, before the batch's marker: part of a batch may be
visible for a moment (never a record twice).

A task's decision rests on two facts: every attempt of partition ``p``, in every batch and every
process, uses the one transactional id ``onceflow.<sink_id>.task.<p>`` — so its
``init_transactions`` aborts what an earlier attempt left open and fences it (a zombie's commit
fails) — and the rows of partition ``p`` of batch N are the same in every attempt (Spark replays
N's input; the partitioning hashes the encoded record). Each task carries a digest of its
records (count, bytes, and the sum of Spark's ``xxhash64`` of each record when the frame has it)
into its marker; an attempt that finds its partition committed compares digests, so a replay
whose partitions differ is refused instead of trusted.

The ``onceflow_kafka_topics`` format that runs these tasks on its own is
:mod:`onceflow.sinks.kafka.datasource`.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from onceflow import faults
from onceflow.errors import ConfigError, OnceflowError
from onceflow.sinks._core.checks import check_json_frame, spark_name
from onceflow.sinks._core.tables import Table
from onceflow.sinks._core.tasks import run_tasks, running_task
from onceflow.sinks.kafka import records as kafka_records
from onceflow.sources.kafka.client_log import with_logger

NAME = "onceflow_kafka_topics"
TASKS_TOPIC = "onceflow_tasks.{sink_id}"
"""The default tasks topic: one task marker per batch and task partition, compacted."""
TASK_PARTITIONS = 32
"""Partitions of a tasks topic the sink creates: the most tasks a batch is written by."""
ROWS_PER_TASK = 500_000
"""Records per task (the batch's task count is its records over this, 1 to :data:`TASK_PARTITIONS`)."""
TASKS_TOPIC_CONFIG = {"cleanup.policy": "compact"}
RECORDS_SCHEMA = "topic string, key binary, value binary, h long"
_TIMEOUT_S = 60.0
_MASK = (1 << 32) - 1
AHEAD_BYTES = 64 << 20
"""The most encoded bytes a task holds while it waits for its fence (:class:`_Fencing`)."""


def task_count(records: int, partitions: int = TASK_PARTITIONS) -> int:
    """The tasks a batch of ``records`` records is written by: its records only decide it."""
    return max(1, min(partitions, math.ceil(records / ROWS_PER_TASK)))


@dataclass(frozen=True)
class TaskSpec:
    """What a task needs (every field picklable: no connection, no session).

    Attributes:
        conf: librdkafka settings (``bootstrap.servers`` and the sink's ``options``).
        sink_id: The sink id (transactional ids ``onceflow.<sink_id>.task.<p>``).
        tasks_topic: The tasks topic.
        batch_id: The micro-batch (-1: Spark's, in a streaming write).
        query_id: The checkpoint's query id ("" : Spark's, in a streaming write).
        headers: Each record gets the headers ``onceflow.sink`` and ``onceflow.batch``.
        expected: Topic -> records the batch has (the commit checks the tasks' sums); None: unchecked.
        mark: The data source's commit writes the batch's marker.
    """

    conf: dict[str, Any]
    sink_id: str = "default"
    tasks_topic: str = ""
    batch_id: int = -1
    query_id: str = ""
    headers: bool = False
    expected: dict[str, int] | None = None
    mark: bool = True

    @staticmethod
    def from_options(options: Mapping[str, str]) -> TaskSpec:
        """The spec the format's options describe.

        Raises:
            ConfigError: No ``bootstrap``, or an option is not what it should be.
        """
        bootstrap = options.get("bootstrap") or ""
        if not bootstrap:
            raise ConfigError(f"{NAME} needs option 'bootstrap' (host:port of the brokers)")
        try:
            conf = {**json.loads(options.get("conf") or "{}"), "bootstrap.servers": bootstrap}
            expected = json.loads(options["expected"]) if options.get("expected") else None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"{NAME}: option 'conf' or 'expected' is not JSON: {exc}") from None
        sink_id = options.get("sink_id") or "default"
        topic = options.get("tasks_topic") or TASKS_TOPIC.replace("{sink_id}", sink_id)
        return TaskSpec(conf, sink_id, topic,
                        int(options.get("batch_id", -1)), options.get("query_id") or "",
                        (options.get("headers") or "false").lower() == "true", expected,
                        (options.get("mark") or "true").lower() == "true")

    def options(self) -> dict[str, str]:
        """The format's options for this spec (the inverse of :meth:`from_options`)."""
        conf = {k: v for k, v in self.conf.items() if k != "bootstrap.servers"}
        out = {"bootstrap": str(self.conf["bootstrap.servers"]), "sink_id": self.sink_id,
               "tasks_topic": self.tasks_topic, "batch_id": str(self.batch_id), "query_id": self.query_id,
               "headers": str(self.headers).lower(), "mark": str(self.mark).lower(), "conf": json.dumps(conf)}
        if self.expected is not None:
            out["expected"] = json.dumps(self.expected)
        return out


def check_frame_values(name: str, spec: Table, frame: Any) -> None:
    """Step T1 of the tasks path: a value a record's JSON cannot hold, found by Spark.

    Raises:
        BatchRejectedError: Naming the topic, the column, the row's key and the value.
    """
    from onceflow.sinks._core.checks import arrow_schema

    columns = kafka_records.json_columns(arrow_schema(frame.schema).empty_table(), spec)
    check_json_frame(f"topic {name!r}", spec, frame, columns)


def encoder(name: str, spec: Table) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """A ``mapInArrow`` function: a table's rows as its records (:func:`kafka_records.encode_arrays`)."""
    def run(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            if batch.num_rows:
                keys, values = kafka_records.encode_arrays(pa.Table.from_batches([batch]), spec)
                topics = pa.array([name] * batch.num_rows, pa.string())
                yield pa.RecordBatch.from_arrays([topics, keys, values], names=["topic", "key", "value"])
    return run


def records_frame(frames: Mapping[str, Any], specs: Mapping[str, Table], tasks: int) -> Any:
    """Every table's rows as records ``topic, key, value, h``, in ``tasks`` partitions by the record.

    The partitioning hashes the whole record, so a replay of the batch puts the same records in
    each partition; ``h`` is Spark's ``xxhash64`` of the record (the tasks' digest).
    """
    from pyspark.sql import functions as F

    encoded = [frame.mapInArrow(encoder(name, specs[name]), "topic string, key binary, value binary")
               for name, frame in frames.items()]
    union = encoded[0]
    for more in encoded[1:]:
        union = union.unionByName(more)
    return (union.repartition(tasks, "topic", "key", "value")
            .withColumn("h", F.xxhash64("topic", "key", "value")))


HASH = "onceflow_row_hash"
"""The column of Spark's ``xxhash64`` of each row, in :func:`rows_frame` (the tasks' digest)."""


def rows_frame(frame: Any, tasks: int) -> Any:
    """One table's rows in ``tasks`` partitions by Spark's ``xxhash64`` of the row, as column :data:`HASH`.

    For a frame the tasks encode themselves (:func:`run_rows`): a replay of the batch puts the
    same rows in each partition, as :func:`records_frame` does with the records. A map column
    has no hash in Spark: a row with one is hashed as its JSON.
    """
    from pyspark.sql import functions as F

    if HASH in frame.columns:
        raise ConfigError(f"column {HASH!r} is onceflow's own in a Kafka write; rename it")
    cols = [F.col(spark_name(f.name)) for f in frame.schema.fields]
    plain = all("map<" not in f.dataType.simpleString() for f in frame.schema.fields)
    digest = F.xxhash64(*cols) if plain else F.xxhash64(F.to_json(F.struct(*cols)))
    return frame.withColumn(HASH, digest).repartition(tasks, HASH)


Slice = tuple[str, pa.Array, pa.Array, pa.Array | None]
"""One topic's records of a task: ``(topic, keys, values, hashes)`` (hashes None: none)."""


def _encoded(name: str, spec: Table, batches: Iterable[pa.RecordBatch]) -> Iterator[Slice]:
    """A partition of :func:`rows_frame` as one topic's records (the driver-side bytes) and hashes."""
    for batch in batches:
        if batch.num_rows:
            rows = pa.Table.from_batches([batch])
            keys, values = kafka_records.encode_arrays(rows.drop_columns([HASH]), spec)
            yield name, keys, values, rows.column(HASH).combine_chunks()


def _rows_task(spec: TaskSpec, name: str, table: Table, batches: Iterable[pa.RecordBatch]) -> dict[str, Any]:
    """A task of :func:`run_rows`: its rows encoded where they are, then K1-K6."""
    return write_task(spec, _encoded(name, table, batches))


def run_rows(frame: Any, name: str, table: Table, spec: TaskSpec) -> dict[str, int]:
    """One table's rows (:func:`rows_frame`) encoded and produced by Spark's tasks; the checked sums.

    One Python crossing per row: the writing task encodes its partition (:func:`encoder` runs in
    a Spark stage of its own before the shuffle on the record).

    Raises:
        OnceflowError: A task failed, or the tasks' records are not the batch's.
    """
    task = functools.partial(_rows_task, spec, name, table)
    return checked_sums(spec, spec.batch_id, run_tasks(frame, task))


@dataclass
class Digest:
    """What a task's records were: per topic the records, and over all the bytes and the hashes."""

    records: dict[str, int] = field(default_factory=dict)
    size: int = 0
    hash_lo: int = 0
    hash_hi: int = 0

    def add(self, topic: str, keys: pa.Array, values: pa.Array, hashes: pa.Array | None) -> None:
        """Fold one topic's slice of a batch in (exact integer sums: no order, no overflow)."""
        self.records[topic] = self.records.get(topic, 0) + len(values)
        for arr in (keys, values):
            self.size += int(pc.sum(pc.binary_length(arr)).as_py() or 0)
        if hashes is not None:
            h = pc.cast(hashes, pa.uint64(), safe=False)
            self.hash_lo += int(pc.sum(pc.bit_wise_and(h, pa.scalar(_MASK, pa.uint64()))).as_py() or 0)
            self.hash_hi += int(pc.sum(pc.shift_right(h, pa.scalar(32, pa.uint64()))).as_py() or 0)

    def same(self, other: Mapping[str, Any]) -> bool:
        """Whether a marker's digest is this one."""
        sums = (int(other.get(k, -1)) for k in ("size", "hash_lo", "hash_hi"))
        theirs = (dict(other.get("records") or {}), *sums)
        return theirs == (self.records, self.size, self.hash_lo, self.hash_hi)


def _slices(batches: Iterable[pa.RecordBatch]) -> Iterator[Slice]:
    """Batches of records (``topic, key, value`` and maybe ``h``) split by topic."""
    for batch in batches:
        names = batch.schema.names
        topics = batch.column(names.index("topic"))
        keys, values = (pc.cast(batch.column(names.index(c)), pa.binary()) for c in ("key", "value"))
        hashes = batch.column(names.index("h")) if "h" in names else None
        for topic in pc.unique(topics).to_pylist():
            if topic is None:
                raise OnceflowError(f"{NAME}: a record without a topic (column 'topic' is null)")
            mask = pc.equal(topics, topic)
            yield (topic, pc.filter(keys, mask), pc.filter(values, mask),
                   pc.filter(hashes, mask) if hashes is not None else None)


def records_task(spec: TaskSpec, batches: Iterable[pa.RecordBatch]) -> dict[str, Any]:
    """A task of records ``topic, key, value`` (and maybe ``h``): steps K1-K6 (:func:`write_task`)."""
    return write_task(spec, _slices(batches))


def last_marker(conf: Mapping[str, Any], topic: str, partition: int, sink_id: str) -> dict[str, Any] | None:
    """The last committed task marker of ``sink_id`` in ``partition`` of the tasks topic (None: none).

    Read with ``read_committed`` from the partition's end backwards (16 offsets, then 8x more:
    aborted transactions and their control records take offsets too).
    """
    from confluent_kafka import Consumer

    consumer = Consumer(with_logger({**conf, "group.id": f"onceflow.{sink_id}.tasks",
                                     "enable.auto.commit": False, "isolation.level": "read_committed"}))
    try:
        low, high = kafka_records.watermarks(consumer, topic, _TIMEOUT_S, partition)
        start, tail = max(low, high - 16), 16
        while True:
            found = None
            if high > start:
                for m in kafka_records.read_span(consumer, topic, start, high, f"the task markers of {topic}",
                                                 _TIMEOUT_S, partition):
                    if m.key() == sink_id.encode():
                        found = json.loads(m.value())
            if found is not None or start <= low:
                return found
            tail *= 8
            high, start = start, max(low, start - tail)
    finally:
        consumer.close()


class _Fencing(threading.Thread):
    """Steps K1 and K2 of a task in a thread of their own, while the task encodes its first slices.

    ``init_transactions`` waits on the brokers (the coordinator found, the producer id given;
    librdkafka's waits there are often whole retry intervals) without holding the GIL, so the
    task's encoding goes on meanwhile. At most :data:`AHEAD_BYTES` of slices are held before
    the fence's result is waited for; none is produced before it.
    """

    def __init__(self, producer: Any, spec: TaskSpec, partition: int) -> None:
        super().__init__(name=f"onceflow-fence-{partition}", daemon=True)
        self._job = (producer, spec, partition)
        self._out: tuple[dict[str, Any] | None, BaseException | None] = (None, None)
        self.start()

    def run(self) -> None:
        producer, spec, p = self._job
        try:
            producer.init_transactions(_TIMEOUT_S)  # K1
            self._out = (last_marker(spec.conf, spec.tasks_topic, p, spec.sink_id), None)  # K2
        except BaseException as exc:  # noqa: BLE001 - raised again in the task's own thread
            self._out = (None, exc)

    def result(self, slices: Iterable[Slice]) -> tuple[Iterable[Slice], dict[str, Any] | None]:
        """The slices (those read ahead first) and the partition's last task marker, once fenced.

        Raises:
            KafkaException: ``init_transactions`` failed.
            OnceflowError: The marker could not be read.
        """
        rest = iter(slices)
        ahead: list[Slice] = []
        held = 0
        while self.is_alive() and held < AHEAD_BYTES:
            item = next(rest, None)
            if item is None:
                break
            ahead.append(item)
            held += item[2].nbytes + item[1].nbytes
        self.join()
        done, failed = self._out
        if failed is not None:
            raise failed
        return itertools.chain(ahead, rest), done


def write_task(spec: TaskSpec, slices: Iterable[Slice]) -> dict[str, Any]:
    """One task's records (each topic's slices) in one transaction with its task marker; steps K1-K6.

    1. **Fence**: a producer with the transactional id ``onceflow.<sink_id>.task.<p>`` runs
       ``init_transactions``: an earlier attempt's open transaction is aborted, its producer fenced.
       Steps 1 and 2 run in a thread while the task encodes its first slices (:class:`_Fencing`).
    2. **Decide**: the last committed task marker of partition ``p`` (stable: no transaction of
       this id is open any more). This batch's, of this query: an earlier attempt committed the
       partition — its digest must be this attempt's (else refused: the batch's partitions are
       not what they were), and this attempt produces nothing. A later batch's: refused.
    3. **Write**: begin a transaction; produce each record to its topic.
    4. **Mark**: produce the task marker (batch, query id, tasks, digest) to partition ``p`` of
       the tasks topic; wait for every record to be in the brokers' logs.
    5. **Commit** the transaction. Crash point ``task_after_write``: the task dies after its
       commit, before its message reaches the driver; Spark's next attempt decides at step 2.
    6. **Return** the digest (the driver's commit sums the records per topic).

    Raises:
        OnceflowError: Fenced by a newer attempt, a partition that differs from its committed
            attempt's, a later batch's marker, or a transaction that failed (Spark retries the task).
    """
    from confluent_kafka import KafkaException, Producer

    task = running_task()
    batch_id = spec.batch_id if spec.batch_id >= 0 else task.batch_id
    query_id = spec.query_id or task.query_id
    p = task.partition
    where = f"batch {batch_id}: task {p} of Kafka sink {spec.sink_id!r}"
    failed: list[str] = []  # the first delivery error names the cause (an unknown topic, a size)

    def delivered(err: Any, msg: Any) -> None:
        if err is not None and not failed:
            failed.append(f"{msg.topic()}: {err.str()}")

    producer = Producer(with_logger({**kafka_records.PRODUCER, **spec.conf,
                                     "transactional.id": f"onceflow.{spec.sink_id}.task.{p}",
                                     "delivery.report.only.error": True, "on_delivery": delivered}))
    digest = Digest()
    try:
        fencing = _Fencing(producer, spec, p)  # K1, K2 in a thread, the first slices encoded meanwhile
        slices, done = fencing.result(slices)
        if done is not None and str(done.get("query_id")) == query_id and int(done["batch_id"]) > batch_id:
            raise OnceflowError(f"{where}: the tasks topic {spec.tasks_topic} has batch {done['batch_id']} "
                                "already, a later one; the sink is ahead of the checkpoint")
        if done is not None and str(done.get("query_id")) == query_id and int(done["batch_id"]) == batch_id:
            for topic, keys, values, hashes in slices:
                digest.add(topic, keys, values, hashes)
            if not digest.same(done):
                raise OnceflowError(
                    f"{where}: an earlier attempt committed this partition with other records "
                    f"({done.get('records')}, now {digest.records}): the batch's rows are not the same in "
                    "every attempt; make per_batch deterministic (no clock, random numbers or changing "
                    "lookups), or use stable= (onceflow.engine.stable)")
            return {**asdict(digest), "skipped": True, "query_id": query_id}
        headers = ([("onceflow.sink", spec.sink_id.encode()), ("onceflow.batch", str(batch_id).encode())]
                   if spec.headers else None)
        producer.begin_transaction()  # K3
        for topic, keys, values, hashes in slices:
            digest.add(topic, keys, values, hashes)
            kafka_records.produce(producer, topic, keys.to_pylist(), values.to_pylist(), headers)
        faults.task_reached(faults.CrashPoint.TASK_MID_WRITE, batch_id, task.attempt)  # txn open
        value = json.dumps({"sink_id": spec.sink_id, "batch_id": batch_id, "query_id": query_id,
                            "partition": p, "attempt": task.attempt, **asdict(digest)}).encode()
        producer.produce(spec.tasks_topic, value, spec.sink_id.encode(), partition=p)  # K4
        if producer.flush(_TIMEOUT_S):
            raise OnceflowError(f"{where}: records not delivered in {_TIMEOUT_S:.0f} s")
        producer.commit_transaction(_TIMEOUT_S)  # K5
    except KafkaException as exc:
        cause = f"; the first record refused: {failed[0]}" if failed else ""
        raise OnceflowError(f"{where}: the transaction failed ({exc.args[0].str()}{cause}); Spark tries the "
                            "task again") from None
    faults.task_reached(faults.CrashPoint.TASK_AFTER_WRITE, batch_id, task.attempt)
    return {**asdict(digest), "skipped": False, "query_id": query_id}  # K6


def sums(batch_id: int, messages: Iterable[Any]) -> dict[str, int]:
    """The records per topic the tasks' messages report.

    Raises:
        OnceflowError: A task sent no message (Spark passes None for a task that failed).
    """
    out: dict[str, int] = {}
    for m in messages:
        if m is None:
            raise OnceflowError(f"batch {batch_id}: a task producing to Kafka sent no message; the batch "
                                "runs again")
        for topic, n in m["records"].items():
            out[topic] = out.get(topic, 0) + int(n)
    return out


def checked_sums(spec: TaskSpec, batch_id: int, found: Iterable[Any]) -> dict[str, int]:
    """The records per topic of the tasks' messages, checked against ``spec.expected``.

    Raises:
        OnceflowError: A task's message missing, or the tasks' records not the batch's.
    """
    got = sums(batch_id, found)
    want = spec.expected
    if want is not None and {t: n for t, n in got.items() if n} != {t: n for t, n in want.items() if n}:
        raise OnceflowError(f"batch {batch_id}: the tasks of Kafka sink {spec.sink_id!r} produced "
                            f"{got} records per topic, the batch has {want}; the batch runs again")
    return got


def run(frame: Any, spec: TaskSpec) -> dict[str, int]:
    """Steps K1-K6 in Spark's tasks (:func:`onceflow.sinks._core.tasks.run_tasks`): the checked sums.

    Raises:
        OnceflowError: A task failed, or the tasks' records are not the batch's.
    """
    return checked_sums(spec, spec.batch_id, run_tasks(frame, functools.partial(records_task, spec)))

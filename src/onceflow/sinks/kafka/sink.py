"""The exactly-once Kafka sink: each micro-batch's records produced in one Kafka transaction.

Every table of ``tables=`` is a topic. A batch's records go to their topics in one Kafka
transaction, together with the batch's marker record, so a consumer with ``isolation.level=
read_committed`` sees every batch once, and a replay after a crash is recognised and produces
nothing. The marker topic is the sink's own, ``onceflow_batches.<sink_id>`` (one partition; key
``sink_id``, value the marker row as JSON plus ``query_id``): read with ``read_committed`` it
holds exactly the committed batches, and no other writer's open transaction can hold its reads
back. (Kafka Streams and Flink commit a consumer group's offset in the transaction instead;
librdkafka 2.16 was measured to hang in ``send_offsets_to_transaction``, past its timeout, after
a broker restart, so onceflow keeps its marker as a record.)

Records: a table's key columns (``Table(key=...)``) are the record's key (one string or binary
column as its bytes, else a JSON object); its value is the column ``value`` as its bytes when
the rows have only that and the key columns, else a JSON object of every column
(:mod:`onceflow.sinks.kafka.records`). With ``batch_headers=True`` each record has headers
``onceflow.sink`` (the sink id) and ``onceflow.batch`` (the batch id); the marker always has
them. (Off by default: measured, headers halve librdkafka's ``produce`` rate.) Kafka keeps no
stored value to merge into: an ``append`` table's rows are records; an ``upsert`` table's rows
are records keyed by the key (the last record of a key is its value, as a compacted topic
keeps it); a ``merge`` table's rows are the batch's partial aggregates per key, which a reader
folds (``add`` columns summed, ``max``/``min`` kept), as Example 5-1's per-batch counts are.

Commit protocol of :meth:`KafkaTopicsSink.commit_tables` for batch N (``bind`` first waits for
``init_transactions`` — which ``check`` started in the background while Spark starts the query,
else ``bind`` runs it — with the transactional id ``onceflow.<sink_id>``: Kafka aborts what an
earlier producer with that id left open, and fences it — a zombie driver's next send or commit
fails with ``ProducerFenced``; then it reads the marker topic's last records with ``read_committed``
(stable: no transaction of this id is open any more; :meth:`KafkaTopicsSink.recent_batches`) for
the last committed batch and the query id of the checkpoint that wrote it):

1. **Check.** Crash point ``before_sink_write``. The rows are checked against the tables' specs
   (:class:`onceflow.errors.BatchRejectedError`: nothing produced).
2. **Decide.** If the last committed batch is ``>= N``, N was committed: return False. (Only
   this producer commits for the sink id until another driver fences it, and a fenced producer
   commits nothing, so the value read at ``bind`` and advanced by each commit stays true.)
3. **Write.** Begin a transaction; encode every table's rows as records and produce them to
   its topic, 20,000 rows at a time (librdkafka sends a slice while the next is encoded; a
   missing topic is created first, ``partitions`` partitions).
4. **Mark.** Produce the marker record, and wait until every record is in the brokers' logs.
   Crash point ``inside_sink_txn``: a crash here leaves an open transaction, aborted by the
   next driver's ``init_transactions`` (``read_committed`` readers never see its records).
5. **Commit** the transaction (a retriable error is retried; one that requires an abort aborts
   and fails the batch, which Spark runs again). Crash point ``after_sink_commit`` and the
   ``ambiguous_commit`` fault: Spark re-runs N, the next ``bind`` reads N's marker, step 2
   skips it.
6. **Return** True.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from onceflow import faults
from onceflow.errors import CheckpointMismatchError, ConfigError, OnceflowError
from onceflow.faults import CrashPoint
from onceflow.sinks._core import marker
from onceflow.sinks._core.base import Settle, SinkBase, collected
from onceflow.sinks._core.checks import check_frame, check_outputs
from onceflow.sinks._core.marker import BatchStats
from onceflow.sinks._core.tables import Table
from onceflow.sinks.kafka import owners as kafka_owners
from onceflow.sinks.kafka import records as kafka_records
from onceflow.sinks.kafka.records import encode
from onceflow.sources.kafka.client_log import with_logger

MARKER_TOPIC = "onceflow_batches.{sink_id}"
"""The default marker topic (one partition; records keyed by sink id)."""
MARKER_TOPIC_CONFIG = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(7 * 24 * 3600 * 1000)}
"""A marker topic the sink creates: every marker kept 7 days (for ``onceflow repair`` of a restored
checkpoint, and audits), then compacted to the last one per sink id — the one a replay is
decided by, which time retention could delete once a later (aborted) record rolled its segment."""

_log = logging.getLogger("onceflow.kafka")
_TIMEOUT_S = 60.0
_SLICE = 20_000


def _require() -> Any:
    try:
        import confluent_kafka
    except ImportError:
        raise ConfigError("the Kafka sink needs confluent-kafka: pip install 'onceflow[kafka]'") from None
    return confluent_kafka


class KafkaTopicsSink(SinkBase):
    """Topics of one Kafka cluster, each batch in one transaction (see the module protocol).

    Args:
        bootstrap_servers: ``host:port`` of the brokers.
        sink_id: Marker namespace; also names the transactional id ``onceflow.<sink_id>``: one
            running query per sink id (a second fences the first).
        marker_topic: The marker topic (``{sink_id}`` is replaced; created with one partition
            when missing). Give each sink a topic of its own.
        partitions: Partitions of a topic the sink creates.
        options: librdkafka settings for the producer and the marker reader (e.g. security).
        batch_headers: Give every record the headers ``onceflow.sink`` and ``onceflow.batch``.
        collect_below: A batch whose input has fewer rows is collected to the driver and produced
            in one transaction; a larger one is produced by Spark's tasks, a transaction each
            (:meth:`commit_frames`; 0: always the tasks).
        tasks_topic: The tasks' markers' topic (``{sink_id}`` is replaced; created with
            :data:`onceflow.sinks.kafka.tasks.TASK_PARTITIONS` partitions when missing).
    """

    all_or_nothing = False
    """A collected batch commits in one transaction; a batch the tasks produce commits one
    transaction per task, so a ``read_committed`` reader may see part of it before the rest."""
    writes_uncached = True

    tables_are_topics = True
    """Table names are topic names (``.``, ``-`` allowed: :func:`onceflow.sinks._core.tables.check_specs`)."""

    def __init__(self, bootstrap_servers: str, sink_id: str = "default", marker_topic: str = MARKER_TOPIC,
                 partitions: int = 1, options: Mapping[str, str] | None = None,
                 batch_headers: bool = False, collect_below: int = 100_000,
                 tasks_topic: str = "onceflow_tasks.{sink_id}") -> None:
        self.ck = _require()
        self.collect_below = collect_below
        if not sink_id or not sink_id.replace("_", "a").replace("-", "a").replace(".", "a").isalnum():
            raise ConfigError(f"sink id {sink_id!r} is invalid: use letters, digits, _ . -")
        if not bootstrap_servers:
            raise ConfigError("onceflow.kafka needs bootstrap_servers (host:port of the brokers)")
        self.bootstrap = bootstrap_servers
        self.sink_id = sink_id
        self.marker_topic = marker_topic.replace("{sink_id}", sink_id)
        if len(self.marker_topic) > 249:  # Kafka's limit on a topic name
            raise ConfigError(f"sink id {sink_id!r} makes the marker topic name {len(self.marker_topic)} "
                              "characters long; Kafka allows 249: use a shorter sink id")
        self.tasks_topic = tasks_topic.replace("{sink_id}", sink_id)
        self.partitions = partitions
        self.batch_headers = batch_headers
        self.transactional_id = f"onceflow.{sink_id}"
        self._conf: dict[str, Any] = {"bootstrap.servers": bootstrap_servers, **dict(options or {})}
        self._producer: Any = None
        self._starting: Future[Any] | None = None
        self._last: int | None = None
        self._query_id: str | None = None
        self._topics: set[str] = set()
        self._recent: list[dict[str, Any]] | None = None

    def __repr__(self) -> str:
        return f"onceflow.kafka({self.bootstrap!r}, sink_id={self.sink_id!r})"

    def repair_options(self) -> str:
        """``--kafka BOOTSTRAP --sink-id ID``."""
        return f"--kafka {self.bootstrap} --sink-id {self.sink_id}"

    def _admin(self) -> Any:
        from confluent_kafka.admin import AdminClient

        return AdminClient(with_logger(self._conf))

    def ensure_topic(self, topic: str, partitions: int, config: Mapping[str, str] | None = None) -> None:
        """Create ``topic`` with ``partitions`` partitions unless the brokers have it (once per sink).

        Args:
            topic: The topic.
            partitions: Its partitions, when created.
            config: Its topic settings, when created.

        Raises:
            OnceflowError: The brokers refused to create it (another writer creating it meanwhile
                is fine).
        """
        if topic in self._topics:
            return
        from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

        client = self._producer or self._admin()  # the producer is connected already: faster
        if topic not in client.list_topics(timeout=_TIMEOUT_S).topics:  # all topics: none auto-created
            admin = self._admin()  # kept while its futures are pending
            futures = admin.create_topics([NewTopic(topic, partitions, -1, config=dict(config or {}))])
            for fut in futures.values():
                try:
                    fut.result(timeout=_TIMEOUT_S)
                except Exception as exc:  # created meanwhile by another writer: fine
                    if "TOPIC_ALREADY_EXISTS" not in str(exc) and "already exists" not in str(exc):
                        raise OnceflowError(f"onceflow.kafka: cannot create topic {topic}: {exc}") from None
        self._topics.add(topic)

    def _reachable_topics(self) -> set[str]:
        """The brokers' topics, listed by a new admin client (a wrong address or credentials fail here).

        Raises:
            ConfigError: The brokers cannot be reached.
        """
        try:
            return set(self._admin().list_topics(timeout=_TIMEOUT_S).topics)
        except Exception as exc:  # confluent_kafka.KafkaException
            raise ConfigError(f"onceflow.kafka: cannot reach the brokers {self.bootstrap}: {exc}") from None

    def has_marker_topic(self) -> bool:
        """Whether the brokers have this sink's marker topic (a sink that committed a batch does).

        Raises:
            ConfigError: The brokers cannot be reached.
        """
        return self.marker_topic in self._reachable_topics()

    def wait_settled(self, wait_s: float = 15.0) -> list[int]:
        """Wait until no transaction is open on the marker topic; the partitions still open after ``wait_s``.

        A reader without this sink's producer (``onceflow repair``) has no ``init_transactions`` to
        settle a commit first: Kafka writes a committed transaction's markers just after the
        committing driver's ``commit_transaction`` returns, and until then a ``read_committed`` read
        ends before that batch's marker. A transaction a killed driver left open (its batch never
        committed) stays open until its ``transaction.timeout.ms``: after ``wait_s`` the markers
        are read as they are, without that batch, which is what the sink holds.
        """
        committed, raw = self._reader("read_committed"), self._reader("read_uncommitted")
        try:
            topic = self.marker_topic
            meta = committed.list_topics(topic, timeout=_TIMEOUT_S).topics.get(topic)
            partitions = sorted(meta.partitions) if meta is not None and meta.error is None else []
            _, still = kafka_records.settled_ends(committed, raw, topic, partitions, wait_s, _TIMEOUT_S)
            return still
        finally:
            committed.close()
            raw.close()

    def _start(self) -> Any:
        """The marker topic made sure of; a transactional producer, its ``init_transactions`` done."""
        self.ensure_topic(self.marker_topic, 1, MARKER_TOPIC_CONFIG)
        producer = self.ck.Producer(with_logger({**kafka_records.PRODUCER, **self._conf,
                                                 "transactional.id": self.transactional_id}))
        producer.list_topics(timeout=_TIMEOUT_S)  # connected first: else librdkafka may find no broker
        producer.init_transactions(_TIMEOUT_S)    # for its coordinator query and wait 0.5 s for the next
        return producer

    def bind(self, query_id: str) -> None:
        """Fence earlier producers of this sink id, abort what they left open, check the query id.

        Raises:
            CheckpointMismatchError: The marker group holds this sink id for another checkpoint.
        """
        if self._producer is None:
            starting, self._starting = self._starting, None
            self._producer = starting.result() if starting is not None else self._start()
        markers = self._recent = self.recent_batches()
        found = str(markers[-1].get("query_id") or "") or None if markers else None
        if found is not None and found != query_id:
            raise CheckpointMismatchError(
                f"Kafka sink {self.sink_id!r} on {self.bootstrap} holds batches of the checkpoint with "
                f"query id {found}, but this run's checkpoint has query id {query_id}; a new checkpoint "
                "restarts batch ids at 0. Run with the original checkpoint, or use another sink id.")
        self._last = int(markers[-1]["batch_id"]) if markers else None
        self._query_id = query_id

    def check(self, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:
        """Reach the brokers, claim the topics, then start :meth:`_start`.

        A wrong address or credentials fail first; a topic another sink id writes is refused
        (:mod:`onceflow.sinks.kafka.owners`). The producer's ``init_transactions`` runs in the
        background while Spark starts the query; :meth:`bind` waits for it.

        Raises:
            ConfigError: The brokers cannot be reached, or another sink id writes a topic.
        """
        self._reachable_topics()
        kafka_owners.Registry(self._conf).claim(self.sink_id, specs)
        if self._producer is None and self._starting is None:
            pool = ThreadPoolExecutor(1, thread_name_prefix="onceflow-kafka-start")
            self._starting = pool.submit(self._start)
            pool.shutdown(wait=False)

    def commit_tables(self, batch_id: int, outputs: Mapping[str, pa.Table], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int) -> bool:
        """Steps 1-6 for batch ``batch_id`` (see the module).

        Raises:
            BatchRejectedError: The rows do not fit the specs (nothing produced).
            OnceflowError: The transaction failed (fenced by another driver of this sink id, or
                aborted); Spark runs the batch again.
        """
        faults.reached(CrashPoint.BEFORE_SINK_WRITE, batch_id)  # 1
        check_outputs(outputs, specs)
        for name, rows in outputs.items():
            kafka_records.check_values(name, specs[name], rows)
        if self._decided(batch_id):  # 2
            return False
        for name in outputs:
            self.ensure_topic(name, self.partitions)
        written = {n: rows.num_rows for n, rows in outputs.items()}  # one record per row
        headers = self._headers(batch_id) if self.batch_headers else None

        def produce() -> None:  # 3: encoded a slice at a time, librdkafka sends one while the next
            for name, rows in outputs.items():  # is encoded
                for start in range(0, rows.num_rows, _SLICE):
                    keys, values = encode(rows.slice(start, _SLICE), specs[name])
                    kafka_records.produce(self._producer, name, keys, values, headers)

        self._transaction(batch_id, produce, self._marker(batch_id, stats, rows_out, written))  # 4, 5
        return True  # 6

    def commit_frames(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int, written: Mapping[str, int] | None = None,
                      settle: Settle | None = None) -> bool:
        """Batch ``batch_id``'s DataFrames: a small batch collected, a large one produced by the tasks.

        Under ``collect_below`` rows: collected, steps 1-6 of the module. Otherwise steps T1-T6:

        1. **Check** (T1). Crash point ``before_sink_write``. Spark checks the frames: a null or
           repeated key (:func:`onceflow.sinks._core.checks.check_frame`), a value JSON cannot hold
           (:func:`onceflow.sinks.kafka.tasks.check_frame_values`) — before any task produces.
        2. **Decide** (T2) as step 2 of the module: the batch's marker there, a replay: False.
        3. **Write** (T3). Spark encodes every table's rows as records and hash-partitions them
           on the record into tasks (their number from the batch's rows only); each task
           produces its partition in a transaction of its own with its task marker, fenced per
           partition, and skips a partition an earlier attempt committed
           (:func:`onceflow.sinks.kafka.tasks.write_task`, K1-K6; crash point
           ``task_after_write``). The driver checks that every task answered and
           that the records per topic are the batch's rows.
        4. **Mark** (T4): the batch's marker in the sink's own transaction. Crash point
           ``inside_sink_txn``: the tasks' records are committed, the marker is not; the re-run
           of N finds every task's partition committed (K2) and only marks.
        5. **Commit** (T5) that transaction. Crash point ``after_sink_commit`` and the
           ``ambiguous_commit`` fault: the re-run skips N at T2.
        6. **Return** True (T6).

        Raises:
            BatchRejectedError: A null or repeated key, or a value JSON cannot hold (nothing produced).
            OnceflowError: A task or the marker's transaction failed; Spark runs the batch again.
        """
        from onceflow.sinks.kafka import tasks as kt

        if settle is not None:
            return self._commit_uncached(batch_id, frames, specs, settle)
        counts = self._counted(batch_id, frames, specs, written)  # T1
        if sum(counts.values()) < self.collect_below:
            return self.commit_tables(batch_id, collected(frames), specs, stats, rows_out)
        most = self._ready(batch_id, frames, specs)  # T1's checks, T2
        if most is None:
            return False
        tasks = kt.task_count(sum(counts.values()), most)
        live = {n: f for n, f in frames.items() if counts[n]}
        if live:  # T3
            spec = kt.TaskSpec(self._conf, self.sink_id, self.tasks_topic, batch_id, str(self._query_id),
                               self.batch_headers, {n: counts[n] for n in live}, mark=False)
            kt.run(kt.records_frame(live, specs, tasks), spec)
        self._transaction(batch_id, lambda: None, self._marker(batch_id, stats, rows_out, counts))  # T4, T5
        return True  # T6

    def _commit_uncached(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table],
                         settle: Settle) -> bool:
        """T1-T6 for one table's frame that is not cached: its tasks encode and produce, then the marker.

        The frame is computed once, by the tasks that produce it: partitioned by Spark's hash of
        each row into as many tasks as the batch's input rows call for (known before it runs,
        the same in every attempt: :attr:`onceflow.sinks._core.base.Settle.input_rows`), each task
        encoding its rows and producing them in its transaction (K1-K6,
        :func:`onceflow.sinks.kafka.tasks.run_rows`); the batch's numbers come from ``settle``
        once they have run, then T4-T5 mark the batch.
        """
        from onceflow.sinks.kafka import tasks as kt

        self._check_start(batch_id, frames, specs)  # T1
        ((name, frame),) = frames.items()
        most = self._ready(batch_id, frames, specs)  # T1's checks, T2
        if most is None:
            return False
        tasks = kt.task_count(settle.input_rows, most) if settle.input_rows is not None else most
        spec = kt.TaskSpec(self._conf, self.sink_id, self.tasks_topic, batch_id, str(self._query_id),
                           self.batch_headers, None, mark=False)
        got = kt.run_rows(kt.rows_frame(frame, tasks), name, specs[name], spec)  # T3
        counts = {name: got.get(name, 0)}
        stats, rows_out = settle(counts)
        self._transaction(batch_id, lambda: None, self._marker(batch_id, stats, rows_out, counts))  # T4, T5
        return True  # T6

    def _ready(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table]) -> int | None:
        """T1's checks by Spark, T2, and the topics made sure of, before any task produces.

        Returns:
            The partitions of the tasks topic (the most tasks a batch may have); None: the batch
            has its marker already (a replay).

        Raises:
            BatchRejectedError: A null or repeated key, or a value JSON cannot hold (nothing produced).
        """
        from onceflow.sinks.kafka import tasks as kt

        for name, frame in frames.items():
            check_frame(name, specs[name], frame)
            kt.check_frame_values(name, specs[name], frame)
        if self._decided(batch_id):  # T2
            return None
        for name in frames:
            self.ensure_topic(name, self.partitions)
        self.ensure_topic(self.tasks_topic, kt.TASK_PARTITIONS, kt.TASKS_TOPIC_CONFIG)
        return self._partitions_of(self.tasks_topic)

    def mark(self, batch_id: int, written: Mapping[str, int]) -> bool:
        """The marker of a batch the ``onceflow_kafka_topics`` format's tasks produced (steps 2, 4, 5).

        Returns:
            False if batch ``batch_id`` has its marker already.
        """
        if self._decided(batch_id):
            return False
        rows = sum(written.values())
        self._transaction(batch_id, lambda: None, self._marker(batch_id, BatchStats(None, None, 0), rows,
                                                               dict(written)))
        return True

    def _decided(self, batch_id: int) -> bool:
        """Step 2: whether batch ``batch_id`` is committed (an attempt of unknown outcome settled first).

        Raises:
            OnceflowError: Not bound.
        """
        if self._query_id is None:
            raise OnceflowError("onceflow.kafka: commit before bind")
        if self._producer is None:  # an earlier attempt's outcome is unknown: settle it, read again
            self.bind(self._query_id)
        if self._last is not None and self._last >= batch_id:
            return True
        self._recent = None  # what bind read is about to be out of date
        return False

    def _headers(self, batch_id: int) -> list[tuple[str, bytes]]:
        return [("onceflow.sink", self.sink_id.encode()), ("onceflow.batch", str(batch_id).encode())]

    def _marker(self, batch_id: int, stats: BatchStats, rows_out: int, written: dict[str, int]) -> bytes:
        """The marker record's value: the marker row as JSON, with the query id (and an amendment)."""
        record = marker.marker_record(self.sink_id, batch_id, stats, rows_out, written)
        return json.dumps({**record, "query_id": self._query_id}, separators=(",", ":")).encode()

    def _transaction(self, batch_id: int, produce: Callable[[], None], value: bytes) -> None:
        """Steps 3-5: begin, ``produce`` the rows' records (or none), the marker, flush, commit.

        Raises:
            OnceflowError: The transaction failed (see :meth:`_fail`).
        """
        p = self._producer
        try:
            p.begin_transaction()  # 3
            produce()
            key: list[bytes | None] = [self.sink_id.encode()]
            kafka_records.produce(p, self.marker_topic, key, [value], self._headers(batch_id))  # 4
            if p.flush(_TIMEOUT_S):  # in the brokers' logs, not committed (the commit flushes too)
                raise OnceflowError(f"onceflow.kafka: batch {batch_id}: records not delivered in "
                                    f"{_TIMEOUT_S:.0f} s")
            faults.reached(CrashPoint.INSIDE_SINK_TXN, batch_id)
            self._commit(batch_id)  # 5
        except self.ck.KafkaException as exc:
            self._fail(batch_id, exc)
        self._last = batch_id
        faults.reached(CrashPoint.AFTER_SINK_COMMIT, batch_id)
        faults.reached(CrashPoint.AMBIGUOUS_COMMIT, batch_id)

    def _partitions_of(self, topic: str) -> int:
        """The partitions ``topic`` has (it exists)."""
        client = self._producer or self._admin()
        return len(client.list_topics(topic, timeout=_TIMEOUT_S).topics[topic].partitions)

    def _commit(self, batch_id: int) -> None:
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            try:
                self._producer.commit_transaction(_TIMEOUT_S)
                return
            except self.ck.KafkaException as exc:
                err = exc.args[0]
                if err.retriable() and time.monotonic() < deadline:
                    _log.warning("onceflow.kafka: batch %d: commit: %s; trying again", batch_id, err.str())
                    continue
                raise

    def _fail(self, batch_id: int, exc: Any) -> None:
        """A failed transaction: abort it when Kafka says so, else drop the producer.

        Only an abort that succeeded proves the batch is not committed. Otherwise (a fatal
        error, a commit whose answer never came) the producer is dropped: the next attempt's
        ``bind`` makes a new one, whose ``init_transactions`` completes or aborts what is in
        doubt, and reads the markers again.

        Raises:
            OnceflowError: Always (fenced, or the transaction failed).
        """
        err = exc.args[0]
        if err.code() == self.ck.KafkaError._FENCED or "fenced" in err.str().lower():
            self._producer = None  # unusable: a newer driver of this sink id owns it
            raise OnceflowError(
                f"onceflow.kafka: batch {batch_id}: another driver started with sink id {self.sink_id!r} "
                f"(transactional id {self.transactional_id}) and fenced this one; it stops here, the other "
                "one goes on") from None
        aborted = False
        if err.txn_requires_abort():
            try:
                self._producer.abort_transaction(_TIMEOUT_S)
                aborted = True
            except self.ck.KafkaException:
                pass
        if not aborted:
            self._producer = None
        raise OnceflowError(f"onceflow.kafka: batch {batch_id}: the transaction failed ({err.str()}); "
                            + ("it was aborted" if aborted else "the next attempt settles it first")
                            ) from None

    def batches(self) -> list[dict[str, Any]]:
        """The sink's markers from the marker topic (``read_committed``), by batch id."""
        return self._read_markers(None)

    def recent_batches(self) -> list[dict[str, Any]]:
        """The markers of the last committed batches (at least the last one), by batch id.

        Read from the marker topic's end backwards — 64 offsets, then 8x more each time no
        marker of this sink is among them (aborted transactions and their control records take
        offsets too) — so a process's first batch does not read the whole history. After
        :meth:`bind` and until a commit, what bind read.
        """
        if self._recent is not None:
            return list(self._recent)
        return self._read_markers(64)

    def _read_markers(self, tail: int | None) -> list[dict[str, Any]]:
        """Markers from the last ``tail`` offsets on (growing until one is found), or all (None).

        A batch this process committed is waited for: Kafka's coordinator writes a transaction's
        commit markers into the partitions after ``commit_transaction`` returns, so a
        ``read_committed`` read just after a commit may end before its records for a moment.
        """
        deadline = time.monotonic() + _TIMEOUT_S
        while True:
            found = self._read_markers_once(tail)
            if self._last is None or (found and found[-1]["batch_id"] >= self._last) \
                    or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def _read_markers_once(self, tail: int | None) -> list[dict[str, Any]]:
        """:meth:`_read_markers`, one read."""
        consumer = self._reader("read_committed")
        try:
            try:  # read_committed: the high mark is the last stable offset (open transactions excluded)
                low, high = kafka_records.watermarks(consumer, self.marker_topic, _TIMEOUT_S)
            except self.ck.KafkaException:
                return []  # no marker topic yet
            start = low if tail is None else max(low, high - tail)
            while True:
                found = self._read_range(consumer, start, high)
                if found or start <= low:  # a batch's metrics known only after it: from the next one's
                    return marker.with_amendments([found[b] for b in sorted(found)])
                tail = 8 * (tail or 64)
                high, start = start, max(low, start - tail)
        finally:
            consumer.close()

    def _reader(self, isolation: str) -> Any:
        """A consumer of the marker topic with ``isolation`` (no offsets committed)."""
        return self.ck.Consumer(with_logger({**self._conf, "group.id": f"onceflow.{self.sink_id}.reader",
                                             "enable.auto.commit": False, "isolation.level": isolation}))

    def _read_range(self, consumer: Any, start: int, high: int) -> dict[int, dict[str, Any]]:
        """This sink's markers at offsets ``[start, high)`` of the marker topic."""
        found: dict[int, dict[str, Any]] = {}
        if high <= start:
            return found
        for m in kafka_records.read_span(consumer, self.marker_topic, start, high,
                                         f"the markers of {self.marker_topic}", _TIMEOUT_S):
            if m.key() == self.sink_id.encode():
                row = json.loads(m.value())
                found.setdefault(int(row["batch_id"]), row)
        return found

    def flush(self) -> None:
        """Nothing to wait for: a batch is visible when its transaction committed."""

    def close(self) -> None:
        """Close the producer (an open transaction is aborted by the broker)."""
        starting, self._starting = self._starting, None
        if starting is not None and self._producer is None:
            try:
                self._producer = starting.result()
            except Exception:  # it never started: nothing to close
                return
        if self._producer is not None:
            self._producer.flush(10)
            self._producer = None

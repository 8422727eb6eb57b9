"""``onceflow_kafka``: Kafka as a replayable Spark streaming source (Python DataSource API).

Spark's own Kafka connector is a jar the session must be started with (and cannot be added from a
Spark Connect client); this source reads Kafka with ``confluent-kafka`` in the Python workers and
takes the options and columns of Spark's, so existing code ports by changing the format name::

    onceflow.sources.kafka.source.register(spark)    # once per session (read_kafka does it)
    raw = (spark.readStream.format("onceflow_kafka")
           .option("kafka.bootstrap.servers", "broker:9092")
           .option("subscribe", "payments")              # or subscribePattern
           .option("idHeader", "event_id")               # the producer's id, if it sends one
           .load())                                      # key, value, topic, partition, ...

Columns: ``key, value, topic, partition, offset, timestamp, timestampType`` as in Spark's Kafka
source, ``headers`` with ``includeHeaders=true`` (as Spark's), and ``record_id``: the producer's
record id (header ``idHeader`` or JSON field ``idField`` of the value) when it sends one, else
``topic/partition/offset``. Deduplicate on it (``onceflow.deduplicate(raw, id="record_id",
...)``) so that a producer's retries, which land at new offsets, count once.

Options: ``kafka.bootstrap.servers`` (required); ``subscribe`` (comma-separated topics) or
``subscribePattern`` (a regular expression matched against whole topic names);
``startingOffsets`` (``earliest`` (default), ``latest``, or JSON ``{"topic": {"0": 42}}`` with
-2 for earliest and -1 for latest; partitions it omits start at earliest);
``maxOffsetsPerTrigger`` (offsets per micro-batch, shared among partitions by their backlog);
``includeHeaders`` (default false: the ``headers`` column costs time for every record; an
``idHeader`` is read either way);
``maxRecordsPerTask`` (ranges longer than this are split into several tasks, default
100000); ``failOnDataLoss`` (default true); ``idHeader`` / ``idField``; ``readTimeoutMs``
(longest wait for a planned record, default 120000); ``allowMissingTopics`` (default false:
a ``subscribe`` topic the brokers do not have stops the query when it starts, with the
nearest existing name; true: it is read once it exists); every other ``kafka.<name>`` is passed
to the consumer as librdkafka setting ``<name>`` (security: ``kafka.security.protocol``,
``kafka.sasl.mechanism``, ``kafka.ssl.ca.location``, ...). ``kafka.enable.auto.commit`` and
``kafka.auto.offset.reset`` are refused: offsets are the checkpoint's business. librdkafka
reads ``read_committed`` by default (``kafka.isolation.level`` to change it).

Resume contract (what makes a micro-batch replayable):

1. Before batch N runs, :meth:`KafkaStreamReader.latestOffset` fixes its end offsets, per
   topic partition the *next* offset to read (exclusive end), and Spark writes them to the
   checkpoint's offset log (``offsets/N``). Batch N reads ``[end of N-1, end of N)``:
   the record at the end offset itself belongs to batch N+1. A re-run of N after a crash
   reads the same ranges from the log, so the same records (:mod:`onceflow.sources.kafka.read`).
2. Ends come from the broker's end offsets as a consumer with the query's settings sees them;
   under ``read_committed`` that is the last stable offset, so open transactions are not
   planned. Offsets without a record (transaction markers, aborted records, compacted
   records) are skipped by offset: a range may hold fewer records than offsets.
3. A partition that was not in the previous end (a new partition of a subscribed topic, or a
   new topic matching the pattern) is read from offset 0; it is logged.
4. Offsets deleted before they were read (retention) stop the query with
   :class:`~onceflow.errors.SourceDataLossError`. With ``failOnDataLoss=false`` the batch's
   end records where reading resumes instead (key ``from``); the skipped offsets are
   logged, and counted by :func:`skipped_offsets` from the checkpoint.
5. ``Trigger.AvailableNow`` (``write_stream(once=True)``) reads up to the end offsets of when
   the query started; partitions found later wait for the next run.
"""

from __future__ import annotations

import json
import logging
import math
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)

from onceflow.errors import ConfigError, SourceDataLossError, SourceReadError, refuse_unknown
from onceflow.runtime import plans
from onceflow.sources.kafka import native as kafka_native
from onceflow.sources.kafka.client_log import with_logger
from onceflow.sources.kafka.read import OffsetRange, ReadSpec, arrow_schema, read_range

NAME = "onceflow_kafka"

_log = logging.getLogger("onceflow.kafka")

_OPTIONS = {"kafka.bootstrap.servers", "subscribe", "subscribepattern", "startingoffsets",
            "maxoffsetspertrigger", "maxrecordspertask", "failondataloss", "idheader", "idfield",
            "readtimeoutms", "includeheaders", "allowmissingtopics", "onceflow.range.start",
            "onceflow.range.end"}
_REFUSED = {"kafka.enable.auto.commit": "Spark's checkpoint records what was read",
            "kafka.auto.offset.reset": "startingOffsets chooses where a new query starts; later "
                                       "offsets come from the checkpoint",
            "kafka.enable.partition.eof": "the reader needs partition-end events"}

TP = tuple[str, int]
Offsets = dict[TP, int]


@dataclass(frozen=True)
class KafkaOptions:
    """The source's options, checked (see the module docstring)."""

    spec: ReadSpec
    topics: tuple[str, ...]
    pattern: str | None
    starting: str
    max_per_trigger: int | None
    max_per_task: int
    allow_missing: bool = False

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> KafkaOptions:
        """Check and convert the options Spark passes (keys case-insensitive).

        Raises:
            ConfigError: An unknown, refused, missing or malformed option.
        """
        opts = {str(k).lower(): str(v) for k, v in options.items()}
        passthrough = {k[len("kafka."):]: v for k, v in opts.items()
                       if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
        for name, why in _REFUSED.items():
            if name in opts:
                raise ConfigError(f"onceflow_kafka: option {name!r} is not allowed: {why}")
        refuse_unknown({k for k in opts if not k.startswith("kafka.") or k == "kafka.bootstrap.servers"},
                       _OPTIONS, f"the {NAME} data source")
        if not opts.get("kafka.bootstrap.servers"):
            raise ConfigError(f"{NAME} needs option 'kafka.bootstrap.servers' (host:port of the brokers)")
        topics = tuple(t.strip() for t in opts.get("subscribe", "").split(",") if t.strip())
        pattern = opts.get("subscribepattern") or None
        if bool(topics) == bool(pattern):
            raise ConfigError(f"{NAME} needs exactly one of 'subscribe' (topic names, comma-separated) "
                              "or 'subscribePattern' (a regular expression)")
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ConfigError(f"{NAME}: subscribePattern {pattern!r} is not a regular expression: "
                                  f"{exc}") from None
        starting = opts.get("startingoffsets", "earliest").strip()
        if starting not in ("earliest", "latest"):
            _starting_json(starting)
        spec = ReadSpec(
            consumer={"bootstrap.servers": opts["kafka.bootstrap.servers"], **passthrough},
            fail_on_data_loss=_boolean(opts, "failondataloss", True),
            id_header=opts.get("idheader") or None, id_field=opts.get("idfield") or None,
            read_timeout_s=_positive(opts, "readtimeoutms", 120_000) / 1000,
            include_headers=_boolean(opts, "includeheaders", False))
        per_trigger = opts.get("maxoffsetspertrigger")
        return cls(spec, topics, pattern, starting,
                   _positive(opts, "maxoffsetspertrigger", 1) if per_trigger else None,
                   _positive(opts, "maxrecordspertask", 100_000),
                   _boolean(opts, "allowmissingtopics", False))


def _boolean(opts: Mapping[str, str], name: str, default: bool) -> bool:
    raw = opts.get(name, str(default)).strip().lower()
    if raw not in ("true", "false"):
        raise ConfigError(f"{NAME}: option {name!r} must be true or false, not {raw!r}")
    return raw == "true"


def _positive(opts: Mapping[str, str], name: str, default: int) -> int:
    raw = opts.get(name, str(default))
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value <= 0:
        raise ConfigError(f"{NAME}: option {name!r} must be a positive integer, not {raw!r}")
    return value


def _starting_json(raw: str) -> Offsets:
    try:
        parsed = json.loads(raw)
        return {(str(t), int(p)): int(o) for t, parts in parsed.items() for p, o in parts.items()}
    except (ValueError, AttributeError, TypeError):
        raise ConfigError(f"{NAME}: startingOffsets must be 'earliest', 'latest' or JSON like "
                          f'{{"topic": {{"0": 42, "1": -2}}}}, not {raw!r}') from None


def to_json(offsets: Offsets) -> dict[str, dict[str, int]]:
    """``{(topic, partition): offset}`` as the offset log stores it (sorted, string keys)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, part), off in sorted(offsets.items()):
        out.setdefault(topic, {})[str(part)] = off
    return out


def from_json(data: Mapping[str, Any] | None) -> Offsets:
    """The inverse of :func:`to_json`."""
    return {(t, int(p)): int(o) for t, parts in (data or {}).items() for p, o in parts.items()}


def logged_offsets(value: Mapping[str, Any] | None) -> tuple[Offsets, Offsets]:
    """A Kafka source's offset as the checkpoint logs it: its end offsets, and where it resumed.

    Reads both sources' forms: onceflow's Python source logs ``{"offsets": {topic: {partition:
    offset}}, "from": {...}}`` (``from``: where it resumed after offsets deleted unread), Spark's
    connector ``{topic: {partition: offset}}``. (A topic named ``offsets`` in the connector's form
    maps partitions to numbers, not to objects, so the two never look alike.)
    """
    if not value:
        return {}, {}
    nested = value.get("offsets")
    if isinstance(nested, Mapping) and all(isinstance(v, Mapping) for v in nested.values()):
        return from_json(nested), from_json(value.get("from"))
    return from_json(value), {}


class KafkaPartition(InputPartition):
    """One read task: an :class:`~onceflow.sources.kafka.read.OffsetRange`."""


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Plans offset ranges on the driver; tasks read them (contract in the module docstring)."""

    def __init__(self, options: KafkaOptions) -> None:
        self.options = options
        self._consumer: Any = None
        self._target: Offsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_consumer": None}

    def _client(self) -> Any:
        if self._consumer is None:
            from confluent_kafka import Consumer

            conf = {"group.id": "onceflow-planner", **self.options.spec.consumer, "enable.auto.commit": False}
            self._consumer = Consumer(with_logger(conf))
        return self._consumer

    def _partitions(self) -> list[TP]:
        """The subscribed topic partitions the brokers report now."""
        try:
            meta = self._client().list_topics(timeout=30)
        except Exception as exc:  # confluent_kafka.KafkaException
            raise SourceReadError(f"{NAME}: cannot read topic metadata from "
                                  f"{self.options.spec.consumer['bootstrap.servers']}: {exc}") from None
        opts = self.options
        names = [t for t in meta.topics if (t in opts.topics if opts.pattern is None
                                            else re.fullmatch(opts.pattern, t) and not t.startswith("__"))]
        missing = [t for t in opts.topics if t not in meta.topics]
        if missing and not opts.allow_missing:
            raise ConfigError(kafka_native.missing_topics_message(NAME, missing, list(meta.topics),
                                                     opts.spec.consumer["bootstrap.servers"]))
        return sorted((t, p) for t in names for p in meta.topics[t].partitions)

    def _watermarks(self, tp: TP) -> tuple[int, int]:
        from confluent_kafka import TopicPartition

        try:
            low, high = self._client().get_watermark_offsets(TopicPartition(*tp), timeout=30, cached=False)
        except Exception as exc:  # confluent_kafka.KafkaException
            raise SourceReadError(f"{NAME}: cannot read the offsets of {tp[0]}/{tp[1]}: {exc}") from None
        return int(low), int(high)

    def initialOffset(self) -> dict[str, Any]:  # noqa: N802
        """Where a new query starts (``startingOffsets``), per subscribed partition."""
        starting = self.options.starting
        given = {} if starting in ("earliest", "latest") else _starting_json(starting)
        offsets: Offsets = {}
        for tp in self._partitions():
            low, high = self._watermarks(tp)
            want = given.get(tp, -1 if starting == "latest" else -2)
            offsets[tp] = low if want == -2 else high if want == -1 else want
        return {"offsets": to_json(offsets)}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        """``maxOffsetsPerTrigger`` as Spark's read limit."""
        per = self.options.max_per_trigger
        return ReadMaxRows(per) if per else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:  # noqa: N802
        """Fix the end offsets of ``Trigger.AvailableNow`` (contract step 5)."""
        self._target = {tp: self._watermarks(tp)[1] for tp in self._partitions()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:  # noqa: N802
        """The next batch's end offsets (contract steps 1, 3, 4)."""
        begin = from_json(start.get("offsets"))
        ends, starts = dict(begin), dict(begin)
        resumed: Offsets = {}
        for tp in self._partitions():
            low, high = self._watermarks(tp)
            if self._target is not None:
                high = min(high, self._target.get(tp, begin.get(tp, 0)))
            if tp not in begin:
                _log.warning("%s: new partition %s/%d: reading it from offset 0", NAME, *tp)
                starts[tp] = ends[tp] = 0
            at = starts[tp]
            if high < at:
                raise SourceDataLossError(
                    f"{NAME}: {tp[0]}/{tp[1]} ends at offset {high} but the checkpoint already read up to "
                    f"{at}: the topic was deleted and recreated? Start a new checkpoint for the new topic")
            if low > at:
                self._lost(tp, at, low)
                resumed[tp] = starts[tp] = low
            ends[tp] = high
        ends = _limit(starts, ends, limit)
        if ends == begin and not resumed:
            return start
        out: dict[str, Any] = {"offsets": to_json(ends)}
        if resumed:
            out["from"] = to_json(resumed)
        return out

    def _lost(self, tp: TP, at: int, low: int) -> None:
        if self.options.spec.fail_on_data_loss:
            raise SourceDataLossError(
                f"{NAME}: offsets [{at}, {low}) of {tp[0]}/{tp[1]} were deleted (retention) before "
                "onceflow read them. Nothing was skipped: to skip them (counted and logged), restart "
                "with the source option failOnDataLoss=false")
        _log.warning("%s: %s/%d: skipping %d offsets [%d, %d) deleted before they were read "
                     "(failOnDataLoss=false)", NAME, tp[0], tp[1], low - at, at, low)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        """Tasks of ``[start, end)``: one per partition range, long ranges split."""
        return range_tasks(start, end, self.options.max_per_task)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Executor side: the range's records as Arrow record batches."""
        yield from read_range(self.options.spec, partition.value)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: what was read lives in Spark's checkpoint, not in Kafka."""

    def stop(self) -> None:
        """Close the planner's consumer."""
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None


def range_tasks(start: Mapping[str, Any], end: Mapping[str, Any], step: int) -> list[InputPartition]:
    """Read tasks of ``[start, end)`` (two offsets as the checkpoint logs them): one per partition range."""
    begin, (ends, resumed) = logged_offsets(start)[0], logged_offsets(end)
    tasks: list[InputPartition] = []
    for tp in sorted(ends):
        lo, hi = resumed.get(tp, begin.get(tp, 0)), ends[tp]
        for s in range(lo, hi, step):
            tasks.append(KafkaPartition(OffsetRange(tp[0], tp[1], s, min(s + step, hi))))
    return tasks


class KafkaRangeReader(DataSourceReader):
    """A batch read of one logged range: what a micro-batch read, read again (``onceflow.range.*``).

    Options ``onceflow.range.start`` / ``onceflow.range.end``: the source's offsets of batches
    N-1 and N as the checkpoint's offset log holds them (JSON); start ``{}`` reads from 0.
    :mod:`onceflow.engine.rejects` reads a batch's records again this way.
    """

    def __init__(self, options: KafkaOptions, start: Mapping[str, Any], end: Mapping[str, Any]) -> None:
        self.options, self.start, self.end = options, start, end

    def partitions(self) -> Sequence[InputPartition]:
        """The range's tasks, as the stream planned them."""
        return range_tasks(self.start, self.end, self.options.max_per_task)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        """Executor side: the range's records as Arrow record batches."""
        yield from read_range(self.options.spec, partition.value)


def _limit(starts: Offsets, ends: Offsets, limit: ReadLimit) -> Offsets:
    """Cap ``ends`` by a :class:`ReadMaxRows` limit, shared by backlog (largest first)."""
    if not isinstance(limit, ReadMaxRows):
        return ends
    backlog = {tp: ends[tp] - starts.get(tp, 0) for tp in ends if ends[tp] > starts.get(tp, 0)}
    total = sum(backlog.values())
    if total <= limit.max_rows:
        return ends
    share = {tp: math.floor(limit.max_rows * n / total) for tp, n in backlog.items()}
    left = limit.max_rows - sum(share.values())
    for tp in sorted(backlog, key=lambda t: (-backlog[t], t))[:left]:
        share[tp] += 1
    return {tp: starts.get(tp, 0) + share[tp] if tp in share else off for tp, off in ends.items()}


class KafkaDataSource(DataSource):
    """The ``onceflow_kafka`` format (a stream; a batch read of a logged range with ``onceflow.range.*``)."""

    @classmethod
    def name(cls) -> str:
        """The format name."""
        return NAME

    def schema(self) -> Any:
        """Spark's Kafka columns (``headers`` with ``includeHeaders=true``) plus ``record_id``."""
        from pyspark.sql.pandas.types import from_arrow_schema

        opts = {str(k).lower(): str(v) for k, v in self.options.items()}
        return from_arrow_schema(arrow_schema(_boolean(opts, "includeheaders", False)))

    def streamReader(self, schema: Any) -> KafkaStreamReader:  # noqa: N802
        """The stream reader (options checked here, before the query starts)."""
        require_client()
        _show_logs()
        return KafkaStreamReader(KafkaOptions.parse(self.options))

    def reader(self, schema: Any) -> KafkaRangeReader:
        """A batch read of the range ``onceflow.range.start`` .. ``onceflow.range.end``."""
        require_client()
        opts = {str(k).lower(): str(v) for k, v in self.options.items()}
        if "onceflow.range.end" not in opts:
            raise ConfigError(f"{NAME} reads batches only of a logged range (options onceflow.range.start "
                              "and onceflow.range.end); read a stream with spark.readStream")
        start = json.loads(opts.get("onceflow.range.start") or "{}")
        end = json.loads(opts["onceflow.range.end"])
        return KafkaRangeReader(KafkaOptions.parse(self.options), start, end)


def _show_logs() -> None:
    """Let the source's log lines reach stderr in Spark's Python workers (no logging set up there)."""
    if not logging.getLogger().handlers and not _log.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        _log.addHandler(handler)
        _log.setLevel(logging.INFO)


def register(spark: Any) -> None:
    """Register ``onceflow_kafka`` with a session (idempotent).

    Args:
        spark: The SparkSession.
    """
    spark.dataSource.register(KafkaDataSource)


def read_kafka(spark: Any, bootstrap_servers: str, *, subscribe: str | Sequence[str] | None = None,
               subscribe_pattern: str | None = None, starting_offsets: str | Mapping[str, Any] = "earliest",
               max_offsets_per_trigger: int | None = None, id_header: str | None = None,
               id_field: str | None = None, fail_on_data_loss: bool = True,
               allow_missing_topics: bool = False, include_headers: bool = False,
               options: Mapping[str, str] | None = None, connector: str = "auto", **unknown: Any) -> Any:
    """A Kafka stream as a DataFrame: through Spark's connector when the session has it, else onceflow's.

    With ``connector="auto"`` (the default) the stream is read by Spark's own Kafka connector
    (``format("kafka")``, :mod:`onceflow.sources.kafka.native`) when its jar is on the session's
    classpath (``onceflow.session(kafka=True)``), and by onceflow's Python source
    (``onceflow_kafka``, registered with the session if needed) otherwise; one log line on logger
    ``onceflow.kafka`` says which. Both give the same columns and the same guarantees.

    Args:
        spark: The SparkSession.
        bootstrap_servers: ``host:port`` of one or more brokers, comma-separated.
        subscribe: Topic name(s).
        subscribe_pattern: Or a regular expression matched against whole topic names.
        starting_offsets: ``earliest``, ``latest`` or ``{"topic": {"0": 42}}`` (new queries only).
        max_offsets_per_trigger: Offsets per micro-batch (all available when None).
        id_header: Header carrying the producer's record id.
        id_field: Top-level field of a JSON value carrying the producer's record id.
        fail_on_data_loss: Offsets deleted before they were read stop the query (else skipped,
            counted and logged).
        allow_missing_topics: A ``subscribe`` topic the brokers do not have is waited for (read
            once it exists) instead of refused when the query starts.
        include_headers: Give the ``headers`` column (Spark's ``includeHeaders``; off by default as
            there: building every record's headers costs time). ``id_header`` reads the headers
            for the record id either way.
        options: More source options, e.g. ``{"kafka.security.protocol": "SASL_SSL"}`` (``kafka.*``
            go to the consumer: librdkafka's names for onceflow's source, the Java client's for
            Spark's connector; the common ones are the same).
        connector: ``auto``, ``spark`` (Spark's connector; an error when the session lacks it) or
            ``onceflow`` (onceflow's Python source).
        **unknown: Refused (a misspelt keyword is named with the nearest valid one).

    Returns:
        The streaming DataFrame (columns in the module docstring).

    Raises:
        ConfigError: confluent-kafka is missing for onceflow's source (``pip install
            'onceflow[kafka]'``), ``connector="spark"`` without the connector, an unknown keyword or
            a bad option. A topic the brokers do not have is refused here with Spark's connector,
            when the query starts with onceflow's (:meth:`onceflow.OnceQuery.awaitTermination`
            raises the error).
    """
    refuse_unknown(set(unknown), {"spark", "bootstrap_servers", "subscribe", "subscribe_pattern",
                                  "starting_offsets", "max_offsets_per_trigger", "id_header", "id_field",
                                  "fail_on_data_loss", "allow_missing_topics", "include_headers", "options",
                                  "connector"},
                   "onceflow.read_kafka")
    kafka_native.refuse_connector(connector)
    given: dict[str, str] = {"kafka.bootstrap.servers": bootstrap_servers,
                             "failOnDataLoss": str(fail_on_data_loss).lower(),
                             "allowMissingTopics": str(allow_missing_topics).lower(),
                             "includeHeaders": str(include_headers).lower(),
                             "startingOffsets": starting_offsets if isinstance(starting_offsets, str)
                             else json.dumps(starting_offsets)}
    if subscribe is not None:
        given["subscribe"] = subscribe if isinstance(subscribe, str) else ",".join(subscribe)
    for name, value in (("subscribePattern", subscribe_pattern), ("idHeader", id_header),
                        ("idField", id_field), ("maxOffsetsPerTrigger", max_offsets_per_trigger)):
        if value is not None:
            given[name] = str(value)
    given.update(options or {})
    parsed = KafkaOptions.parse(given)  # a bad option fails here, in the caller's code
    native = connector != "onceflow" and kafka_native.has_connector(spark)
    if connector == "spark" and not native:
        raise ConfigError("onceflow.read_kafka(connector='spark'): Spark's Kafka connector is not on this "
                          "session's classpath: 'onceflow jars fetch kafka-connector', then "
                          "onceflow.session(kafka=True) (or spark.jars naming its jars)")
    kafka_native.say_which(native, forced=connector != "auto")
    if native:
        if _has_client():
            register(spark)  # rejects and late rows read a batch again with onceflow's reader
        df = kafka_native.read(spark, given, parsed.spec)
    else:
        require_client()
        register(spark)
        df = spark.readStream.format(NAME).options(**given).load()
    plans.remember(df, plans.KAFKA_OPTIONS, dict(given))  # what the contract reads a batch again with
    return df


def _has_client() -> bool:
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        return False
    return True


def require_client() -> None:
    """Fail clearly when ``confluent-kafka`` is not installed.

    Raises:
        ConfigError: Naming the extra to install.
    """
    if not _has_client():
        raise ConfigError("the Kafka source needs confluent-kafka: pip install 'onceflow[kafka]'")


def skipped_offsets(checkpoint: str | Path, source: int = 0) -> dict[int, dict[str, int]]:
    """Offsets each batch skipped under ``failOnDataLoss=false`` (contract step 4).

    Args:
        checkpoint: The query's checkpoint directory.
        source: The source's index in the query (0 for a single source).

    Returns:
        ``{batch_id: {"topic/partition": skipped offsets}}`` for the batches that skipped any.
    """
    from onceflow.checkpoint import logs as ckpt

    out: dict[int, dict[str, int]] = {}
    for batch_id in ckpt.offset_batches(checkpoint):
        end: Any = ckpt.source_offset(checkpoint, batch_id, source) or {}
        resumed = logged_offsets(end)[1]
        if not resumed:
            continue
        before: Any = ckpt.source_offset(checkpoint, batch_id - 1, source) if batch_id > 0 else None
        prev = logged_offsets(before)[0]
        out[batch_id] = {f"{t}/{p}": off - prev.get((t, p), 0) for (t, p), off in resumed.items()}
    return out


__all__ = ["NAME", "KafkaDataSource", "KafkaOptions", "logged_offsets", "read_kafka", "register",
           "require_client", "skipped_offsets"]

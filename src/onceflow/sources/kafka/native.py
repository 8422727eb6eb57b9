"""Reading Kafka with Spark's own connector (``format("kafka")``) under onceflow's rules.

:func:`onceflow.read_kafka` uses this when the session has Spark's Kafka connector on its
classpath (``onceflow.session(kafka=True)``, or ``spark.jars`` / ``spark.jars.packages``
naming ``spark-sql-kafka-0-10``), and onceflow's Python source otherwise. Both give the same
columns: Spark's Kafka columns (``headers`` with ``includeHeaders``: the connector builds them
for every record, so they are read only when asked for or for ``idHeader``), plus ``record_id``:
the producer's id from a header (``id_header``) or a top-level field of a JSON value
(``id_field``) when present, else ``topic/partition/offset``, exactly as
:mod:`onceflow.sources.kafka.read` derives it.

What onceflow relies on, and how it holds with the connector:

1. **Offsets in the checkpoint.** Spark logs each batch's end offsets as
   ``{"topic": {"partition": offset}}`` (the Python source nests them under ``"offsets"``);
   :func:`onceflow.sources.kafka.source.logged_offsets` reads both, so a batch's input range,
   its records read again for rejects and late rows, and verify's oracle work with either.
   Batch 0 starts at the offsets Spark resolved from ``startingOffsets`` and wrote once to
   ``sources/<i>/0`` (:func:`initial_offsets`).
2. **A missing topic** is refused when ``read_kafka`` is called (the connector itself would wait
   for it silently), unless ``allow_missing_topics=True``.
3. **Data loss** (offsets deleted before they were read) is Spark's ``failOnDataLoss``: the
   query stops, or with ``false`` the connector skips them and logs a warning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from onceflow.errors import ConfigError, nearest
from onceflow.sources.kafka.client_log import with_logger
from onceflow.sources.kafka.read import ReadSpec

_log = logging.getLogger("onceflow.kafka")

PROVIDER = "org.apache.spark.sql.kafka010.KafkaSourceProvider"
"""The connector's data source class (present when its jar is on the driver's classpath)."""

SPARK_OPTIONS = ("kafka.bootstrap.servers", "subscribe", "subscribePattern", "startingOffsets",
                 "failOnDataLoss", "maxOffsetsPerTrigger")
"""onceflow's source options that mean the same to the connector (others are onceflow's own)."""

CONSUMER_DEFAULTS = {"kafka.fetch.max.wait.ms": "10", "kafka.max.poll.records": "5000"}
"""The connector's Java consumer settings onceflow changes (``options=`` overrides them).

Each task reads one partition's range and stops at its end offset; with Kafka's default
``fetch.max.wait.ms`` (500) a fetch at a range's end waits half a second for records that are
not needed; a short wait and larger polls read several times faster (``benchmarks/bench_kafka.py``;
BENCHMARKS.md)."""


def has_connector(spark: Any) -> bool:
    """Whether the session's driver can load Spark's Kafka connector."""
    try:
        jvm = spark.sparkContext._jvm
        loader = jvm.Thread.currentThread().getContextClassLoader()
        jvm.java.lang.Class.forName(PROVIDER, False, loader)
        return True
    except Exception:  # py4j error: the class is not there (or the session has no JVM access)
        return False


def record_id(id_header: str | None, id_field: str | None) -> Any:
    """The ``record_id`` column: the producer's id (header, then JSON field), else the coordinates."""
    from pyspark.sql import functions as F

    found = []
    if id_header:
        # the first header with that key; array_position is compiled, a filter lambda is interpreted
        at = F.array_position(F.col("headers.key"), id_header)
        found.append(F.when(at > 0, F.element_at(F.col("headers.value"), at.cast("int")).cast("string")))
    if id_field:
        path = "$." + id_field.replace("'", "\\'")
        found.append(F.get_json_object(F.col("value").cast("string"), path))
    coords = F.concat_ws("/", "topic", F.col("partition").cast("string"), F.col("offset").cast("string"))
    return F.coalesce(*found, coords)


def missing_topics_message(reader: str, missing: list[str], existing: list[str], servers: str) -> str:
    """Why a query refuses to start on topics the brokers do not have, and what to do.

    Args:
        reader: Who refuses (``onceflow_kafka`` when the query starts, ``onceflow.read_kafka``).
        missing: The subscribed topics the brokers do not have.
        existing: The topics they have.
        servers: The bootstrap servers.
    """
    visible = sorted(t for t in existing if not t.startswith("__"))
    hints = []
    for topic in missing:
        near = nearest(topic, visible)
        hints.append(f"{topic!r}" + (f" (did you mean {near!r}?)" if near else ""))
    return (f"{reader}: no topic {', '.join(hints)} on {servers} (it has {visible[:20]}); fix subscribe=, "
            "create the topic, or pass allow_missing_topics=True (option allowMissingTopics) to wait for it")


def check_topics(servers: str, topics: list[str], consumer: dict[str, str]) -> None:
    """Refuse subscribed topics the brokers do not have (step 2 of the module docstring).

    Raises:
        ConfigError: A topic is missing (named, with the nearest existing one).
    """
    try:
        from confluent_kafka.admin import AdminClient
    except ImportError:  # nothing to check with: the connector waits for the topic
        return
    admin = AdminClient(with_logger({**consumer, "bootstrap.servers": servers}))
    try:
        existing = list(admin.list_topics(timeout=30).topics)
    except Exception as exc:  # confluent_kafka.KafkaException
        raise ConfigError(f"onceflow.read_kafka: cannot list the topics of {servers}: {exc}") from None
    missing = [t for t in topics if t not in existing]
    if missing:
        raise ConfigError(missing_topics_message("onceflow.read_kafka", missing, existing, servers))


def read(spark: Any, given: dict[str, str], spec: ReadSpec) -> Any:
    """The stream through Spark's connector, with ``record_id`` (columns as the Python source's).

    Args:
        spark: The session (its driver has the connector).
        given: The options :func:`onceflow.read_kafka` checked (onceflow's names; ``kafka.*``
            passed to the Java consumer as they are).
        spec: What those options say of the record id and the headers (parsed as onceflow's
            source parses them).
    """
    opts = {**CONSUMER_DEFAULTS,
            **{k: v for k, v in given.items() if k in SPARK_OPTIONS or k.startswith("kafka.")}}
    if given.get("allowMissingTopics", "false") != "true" and given.get("subscribe"):
        consumer = {k[len("kafka."):]: v for k, v in given.items()
                    if k.startswith("kafka.") and k != "kafka.bootstrap.servers"}
        check_topics(given["kafka.bootstrap.servers"], given["subscribe"].split(","), consumer)
    keep = spec.include_headers
    raw = (spark.readStream.format("kafka").options(**opts)
           .option("includeHeaders", str(keep or bool(spec.id_header)).lower()).load())
    out = raw.withColumn("record_id", record_id(spec.id_header, spec.id_field))
    return out if keep or not spec.id_header else out.drop("headers")


def initial_offsets(checkpoint: str | Path, source: int = 0) -> dict[str, Any] | None:
    """The start of batch 0: the offsets the connector resolved and wrote to ``sources/<i>/0``.

    Returns:
        ``{"topic": {"partition": offset}}``, or None when the file is absent (onceflow's
        Python source, whose batch 0 starts at each partition's first offset).
    """
    path = Path(checkpoint) / "sources" / str(source) / "0"
    try:
        text = path.read_bytes().decode("utf-8", "replace").lstrip("\x00")
    except OSError:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 2 or not lines[0].startswith("v"):
        return None
    try:
        value = json.loads(lines[1])
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def say_which(native: bool, forced: bool) -> None:
    """One log line naming the reader :func:`onceflow.read_kafka` picked."""
    if native:
        _log.info("onceflow.read_kafka: reading with Spark's Kafka connector (format 'kafka')")
    elif not forced:
        _log.warning("onceflow.read_kafka: Spark's Kafka connector is not on this session's classpath: "
                     "reading with onceflow's Python source (slower). For the connector: "
                     "'onceflow jars fetch kafka-connector' and onceflow.session(kafka=True)")


def refuse_connector(connector: str) -> None:
    """Refuse an unknown ``connector=`` value.

    Raises:
        ConfigError: Naming the valid ones.
    """
    if connector not in ("auto", "spark", "onceflow"):
        raise ConfigError(f"onceflow.read_kafka: connector must be 'auto', 'spark' or 'onceflow', "
                          f"not {connector!r}")

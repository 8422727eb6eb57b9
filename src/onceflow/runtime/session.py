"""A SparkSession with the defaults onceflow's pipelines need.

Defaults: a local master with every core, a 4 GiB driver heap (``ONCEFLOW_DRIVER_MEMORY``;
the in-memory state store lives there in local mode), ``spark.sql.shuffle.partitions`` equal
to the core count (the 200 default is several times slower on a small machine;
note that the value is fixed in a checkpoint at its first run), UTC session
time, workers running this interpreter, the UI off, and corrupt files never
ignored, the parallel collector in the driver JVM (unless the options name another), and
local files (``file:`` paths: checkpoints, state, logs) through Hadoop's raw local file system,
without ``.crc`` side files (:data:`RAW_LOCAL_FS`), and a local checkpoint's files written through
Hadoop's FileSystem API (:data:`CHECKPOINT_FILES_CLASS`). ``ONCEFLOW_DRIVER_JAVA_OPTIONS`` adds
driver JVM options (see :mod:`onceflow.runtime.jvmstart`).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from onceflow.errors import ConfigError
from onceflow.runtime import driverjvm, idstore, jvmparts
from onceflow.runtime.java import find_java
from onceflow.runtime.jvmparts import CHECKPOINT_FILES_CLASS, CHECKPOINT_FILES_KEY
from onceflow.runtime.jvmstart import JAVA_OPTIONS_ENV

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


THROUGHPUT_GC = "-XX:+UseParallelGC"
"""The driver JVM's collector unless the options name one: the parallel (throughput)
collector ran Example 5-1 faster than Java's default G1 (BENCHMARKS.md)."""

_GC_OPTION = re.compile(r"-XX:\+Use\w*GC\b")

RAW_LOCAL_FS = {"spark.hadoop.fs.file.impl": "org.apache.hadoop.fs.RawLocalFileSystem",
                "spark.hadoop.fs.AbstractFileSystem.file.impl": "org.apache.hadoop.fs.local.RawLocalFs"}
"""Hadoop's local file system without checksum side files, for ``file:`` paths.

Spark's checkpoint (offset and commit logs, state store files) is written a small file at a
time, each as a temporary file renamed into place; Hadoop's default local file system writes a
``.crc`` file beside each and renames both; without them a small micro-batch's log writes are
quicker (``benchmarks/bench_latency.py``, BENCHMARKS.md). Each file still
appears whole or not at all (the rename); checkpoints written either way are read either way.
Not applied when ``conf`` names either key, or when ``ONCEFLOW_LOCAL_CHECKSUMS`` is ``1``/``true``
(Hadoop's checksummed local file system, as plain Spark)."""

CHECKSUMS_ENV = "ONCEFLOW_LOCAL_CHECKSUMS"
"""Set to ``1`` (or ``true``) to keep Hadoop's checksummed local file system (see :data:`RAW_LOCAL_FS`)."""

SESSION_DEFAULTS = {
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.files.ignoreCorruptFiles": "false",
    "spark.sql.files.ignoreMissingFiles": "false",
    # State store snapshots are written by maintenance only (default every 60 s): a driver
    # restarted more often would replay every delta file since the first batch.
    "spark.sql.streaming.stateStore.maintenanceInterval": "5s",
    # A batch an executor-side sink writes (or with several outputs) is cached for the few jobs
    # of its batch and dropped after: building the cache uncompressed is the cheaper way
    # (BENCHMARKS.md, "A backlog batch through the Delta sink").
    "spark.sql.inMemoryColumnarStorage.compressed": "false",
}
"""Settings :func:`session` gives every session (besides cores, Python and host)."""


def server_conf(cores: int, jars: bool = True) -> dict[str, str]:
    """The settings of onceflow's sessions as a server's (a Spark Connect server's ``--conf``).

    What :func:`session` sets in a driver it starts, for a driver someone else starts: the
    defaults above, Hadoop's raw local file system (:data:`RAW_LOCAL_FS`), the throughput
    collector, and with ``jars`` onceflow's id state store and checkpoint file manager (their
    jars on the server's ``--jars``). Its Python workers import compiled PySpark by the install's
    start-up line (``onceflow._import_pyspark_from_its_package``), not by a setting.

    Args:
        cores: The server's cores (its shuffle partitions).
        jars: Name onceflow's classes (the server has their jars).
    """
    conf = {**SESSION_DEFAULTS, "spark.sql.shuffle.partitions": str(cores),
            "spark.driver.extraJavaOptions": THROUGHPUT_GC, **RAW_LOCAL_FS}
    if jars:
        conf[CHECKPOINT_FILES_KEY] = CHECKPOINT_FILES_CLASS
        conf[idstore.PROVIDER_KEY] = idstore.PROVIDER_CLASS
    return conf


SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
"""The Spark Connect server's main class (in PySpark's ``jars/spark-connect_*.jar``)."""


def server_command(host: str = "127.0.0.1", port: int = 15002, cores: int | None = None,
                   memory: str = "4g", jars: bool = True, conf: dict[str, str] | None = None) -> list[str]:
    """The ``spark-submit`` command of a Spark Connect server with onceflow's settings.

    What ``start-connect-server.sh`` runs, in the foreground and without a Spark distribution:
    PySpark's ``spark-submit`` with the server's class, a ``local[cores]`` master, the heap,
    :func:`server_conf` (the throughput collector among them), this interpreter as the server's
    Python and, with ``jars``, onceflow's jars on ``--jars``. Its environment needs
    ``PYSPARK_PYTHON`` set to this interpreter too (:func:`server_environment`): Spark Connect
    runs a client's Python functions with it. Runs where a server is started, once.

    Args:
        host: The address the server listens on (``0.0.0.0``: every interface).
        port: The gRPC port.
        cores: Cores of its local master (this machine's when None).
        memory: The driver's heap (``--driver-memory``).
        jars: onceflow's id state store and checkpoint file manager on its class path.
        conf: More ``--conf`` settings, applied last.
    """
    import pyspark

    from onceflow.runtime import scalac

    cores = cores or os.cpu_count() or 2
    submit = Path(pyspark.__file__).parent / "bin" / "spark-submit"
    settings = {**server_conf(cores, jars), "spark.connect.grpc.binding.port": str(port),
                "spark.connect.grpc.binding.address": host, "spark.pyspark.python": sys.executable,
                "spark.pyspark.driver.python": sys.executable, **(conf or {})}
    cmd = [str(submit), "--class", SERVER_CLASS, "--master", f"local[{cores}]", "--driver-memory", memory]
    if jars:
        cmd += ["--jars", ",".join(str(p) for p in scalac.shipped_jars())]
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    return cmd


def server_environment() -> dict[str, str]:
    """This process's environment with this interpreter as a Connect server's Python, its commands first."""
    env = dict(os.environ)
    env.update(PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    bin_dir = str(Path(sys.executable).parent)  # this environment's commands first
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return env


def _load_classes(spark: SparkSession, conf: dict[str, str], kafka: bool, realtime: bool) -> None:
    """Make onceflow's classes loadable in a driver JVM started before the session (spark-submit)."""
    from onceflow.runtime import jars

    wanted: dict[str, tuple[str, list[Path]]] = {}
    if conf.get(CHECKPOINT_FILES_KEY) == CHECKPOINT_FILES_CLASS:
        wanted[CHECKPOINT_FILES_KEY] = (CHECKPOINT_FILES_CLASS, [jvmparts.checkpoint_files_jar()])
    if conf.get(idstore.PROVIDER_KEY) == idstore.PROVIDER_CLASS:
        wanted[idstore.PROVIDER_KEY] = (idstore.PROVIDER_CLASS, [idstore.build()])
    if kafka:
        wanted["kafka"] = ("org.apache.spark.sql.kafka010.KafkaSourceProvider", jars.require(jars.CONNECTOR))
    if realtime:
        wanted["realtime"] = (jvmparts.REALTIME_WRITER_CLASS, jvmparts.realtime_jars())
    fallback = {CHECKPOINT_FILES_KEY: "Spark's checkpoint file manager (slower local writes, the same files)",
                idstore.PROVIDER_KEY: "Spark's state store"}
    for key in driverjvm.load_classes(spark, wanted, fallback):
        spark.conf.unset(key)


def session(
    master: str | None = None,
    app_name: str = "onceflow",
    shuffle_partitions: int | None = None,
    conf: dict[str, str] | None = None,
    fast_start: bool = False,
    kafka: bool = False,
    id_store: bool | None = None,
    realtime: bool = False,
    remote: str | None = None,
) -> SparkSession:
    """Get or create a SparkSession with onceflow's defaults.

    Runs on the driver, once per application (a session that exists is returned as it is).
    Besides the session, it sets ``PYSPARK_PYTHON`` (and, when unset, ``SPARK_LOCAL_IP`` and
    ``PYSPARK_DRIVER_PYTHON``) in this process's environment: PySpark reads the Python its
    workers run from that variable, and the workers must import the onceflow of this
    interpreter.

    Args:
        master: Spark master URL; ``local[<cores>]`` when omitted.
        app_name: Application name.
        shuffle_partitions: ``spark.sql.shuffle.partitions``; the core count when
            omitted.
        conf: Extra Spark configuration, applied last (overrides defaults).
        fast_start: Start the driver JVM from a class-data archive of Spark's classes
            (:mod:`onceflow.runtime.jvmstart`): the first driver with it records the archive when it exits
            normally, the next ones start faster (a restart after a crash gets to its first batch
            sooner). Changes nothing a query computes. Ignored when
            ``ONCEFLOW_DRIVER_JAVA_OPTIONS`` is set.
        kafka: Put Spark's own Kafka connector on ``spark.jars`` (the jars of
            ``onceflow jars fetch kafka-connector``, :mod:`onceflow.runtime.jars`), so that
            ``format("kafka")`` and :func:`onceflow.read_kafka` read with it. Applies to a new
            session only (``spark.jars`` is read when the JVM starts).
        id_store: Keep ``deduplicate``'s ids in onceflow's id state store
            (:mod:`onceflow.runtime.idstore`: faster, BENCHMARKS.md; compiled on first use)
            instead of Spark's HDFS-backed store; other stateful operators keep Spark's.
            ``None`` (default): on unless ``$ONCEFLOW_ID_STORE`` is ``0`` or ``conf`` names a
            state store provider; should it not compile here, Spark's store, with a warning.
            ``True``: on, or an error. A checkpoint keeps the store its query started with.
        realtime: Put the real-time upsert writer (:func:`onceflow.write_realtime`) and
            PostgreSQL's JDBC driver (``onceflow jars fetch postgres-jdbc``) on ``spark.jars``;
            the writer is compiled on first use. Applies to a new session only.
        remote: A Spark Connect URL (``sc://host:port``): a Connect session instead of a local
            JVM (:func:`onceflow.runtime.connect.remote_session`;
            ``master``, ``fast_start``, ``kafka`` and ``realtime`` do
            not apply: the server has its own).

    Returns:
        The session.

    Raises:
        JavaNotFoundError: No Java runtime.
        ConfigError: ``kafka=True`` (``realtime=True``) and the connector's (JDBC driver's)
            jars were not fetched; ``id_store`` and
            ``conf`` name different state store providers, or the id store does not compile.
    """
    if remote is not None:
        from onceflow.runtime.connect import remote_session

        return remote_session(remote, shuffle_partitions, conf, id_store)
    find_java()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    cores = os.cpu_count() or 2
    prestarted = driverjvm.started_before()  # spark-submit: its JVM takes no heap, options or class path now
    builder = SparkSession.builder.appName(app_name)
    if master or not prestarted:  # spark-submit's --master stands unless one is given here
        builder = builder.master(master or f"local[{cores}]")
    builder = builder.config(map={"spark.sql.shuffle.partitions": str(shuffle_partitions or cores),
                                  "spark.pyspark.python": sys.executable,
                                  "spark.pyspark.driver.python": sys.executable,
                                  "spark.driver.host": os.environ["SPARK_LOCAL_IP"], **SESSION_DEFAULTS})
    conf = dict(conf or {})
    memory = {"spark.driver.memory": os.environ.get("ONCEFLOW_DRIVER_MEMORY", "4g")}
    if not prestarted:
        builder = builder.config("spark.driver.memory", memory["spark.driver.memory"])
    if id_store:
        conf = idstore.session_conf(conf)
    elif id_store is None and idstore.enabled_by_env() and idstore.PROVIDER_KEY not in conf:
        try:
            conf = idstore.session_conf(conf)
        except ConfigError as exc:  # the default cannot be had here: Spark's store, said once
            logging.getLogger("onceflow.idstore").warning("using Spark's state store: %s", exc)
    if kafka:
        from onceflow.runtime import jars

        conf = jars.with_jars(conf, jars.require(jars.CONNECTOR))
    if realtime:
        from onceflow.runtime import jars

        conf = jars.with_jars(conf, jvmparts.realtime_jars())
    key = "spark.driver.extraJavaOptions"
    extra = os.environ.get(JAVA_OPTIONS_ENV, "").strip()
    if fast_start and not extra:
        from onceflow.runtime.jvmstart import archive_options

        extra = archive_options()
    if extra:  # e.g. a class-data archive (onceflow.runtime.jvmstart)
        conf[key] = f"{conf[key]} {extra}" if conf.get(key) else extra
    conf = jvmparts.with_checkpoint_files(conf)
    checksums = os.environ.get(CHECKSUMS_ENV, "").strip().lower() in ("1", "true", "yes")
    if not checksums and not any(k in conf for k in RAW_LOCAL_FS):
        conf.update(RAW_LOCAL_FS)
    running = ""  # a running JVM's options (spark-submit): a collector named there stands
    if prestarted:
        running = " ".join(driverjvm.running_conf(k) or "" for k in (key, "spark.driver.defaultJavaOptions"))
    if not _GC_OPTION.search(f"{conf.get(key, '')} {running} {os.environ.get('JAVA_TOOL_OPTIONS', '')}"):
        conf[key] = f"{conf.get(key, '')} {THROUGHPUT_GC}".strip()
    if prestarted:  # what the JVM's start would have had, said (its heap, its options) and left out
        conf = driverjvm.start_settings(conf, memory)
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if prestarted:
        _load_classes(spark, conf, kafka, realtime)
    spark.sparkContext.setLogLevel(os.environ.get("ONCEFLOW_SPARK_LOG_LEVEL", "ERROR"))
    return spark


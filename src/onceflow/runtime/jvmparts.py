"""onceflow's JVM parts used by a session: the local checkpoint file manager and the real-time writer.

Each is a Scala file of ``jvm/`` compiled into a jar by :mod:`onceflow.runtime.scalac` (the wheel
carries the checkpoint file manager built; the writer is compiled on first use, beside PostgreSQL's
JDBC driver). :func:`onceflow.session` puts them on ``spark.jars`` and names their classes; a
Spark Connect session asks its server for them (:mod:`onceflow.runtime.connect`). The id state
store has a module of its own (:mod:`onceflow.runtime.idstore`). Every function runs on the
driver, once per session.
"""

from __future__ import annotations

import logging
from pathlib import Path

from onceflow.errors import ConfigError
from onceflow.runtime import scalac

CHECKPOINT_FILES_KEY = "spark.sql.streaming.checkpointFileManagerClass"

CHECKPOINT_FILES_CLASS = "org.apache.spark.sql.onceflow.LocalCheckpointFileManager"
"""The checkpoint file manager :func:`onceflow.session` names (``jvm/LocalCheckpointFileManager.scala``).

Spark writes each checkpoint file (offset and commit logs, a file source's log, state store files)
as a temporary file renamed into place, through Hadoop's FileContext API by default. On a local
file system without Hadoop's native library (a pip-installed PySpark), FileContext's rename
resolves links by running ``readlink`` in child processes (four per rename, seen with strace),
several times slower per file written than Hadoop's FileSystem API (Spark's
``FileSystemBasedCheckpointFileManager``), with the same atomic rename. This class uses the latter
for local paths and Spark's own choice for any other (HDFS, object stores): a small micro-batch's
log writes take a fraction of the time (BENCHMARKS.md, "End-to-end latency"). The files are the
same either way: a checkpoint is continued by a session with or without it.
Not applied when ``conf`` names ``spark.sql.streaming.checkpointFileManagerClass`` (e.g.
``FileContextBasedCheckpointFileManager``: Spark's own behaviour); should the class not compile
here, Spark's, with a warning."""

_CHECKPOINT_FILES_SOURCES = scalac.sources("onceflow-checkpoint")


def checkpoint_files_jar() -> Path:
    """The jar of :data:`CHECKPOINT_FILES_CLASS`: the wheel's, or compiled now for this Spark (seconds).

    Raises:
        ConfigError: PySpark ships no Scala compiler, or the source does not compile.
    """
    return scalac.build("onceflow-checkpoint", _CHECKPOINT_FILES_SOURCES,
                        "onceflow's local checkpoint file manager",
                        remedy=f" (Spark's own needs none: name it in conf as {CHECKPOINT_FILES_KEY})")


def with_checkpoint_files(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with :data:`CHECKPOINT_FILES_CLASS`, unless it names a manager or it cannot be built."""
    if CHECKPOINT_FILES_KEY in conf:
        return conf
    try:
        jar = checkpoint_files_jar()
    except ConfigError as exc:  # Spark's own manager: slower local writes, the same files
        logging.getLogger("onceflow.spark").warning("Spark's checkpoint file manager: %s", exc)
        return conf
    from onceflow.runtime.jars import with_jars

    return {**with_jars(conf, [jar]), CHECKPOINT_FILES_KEY: CHECKPOINT_FILES_CLASS}


REALTIME_WRITER_CLASS = "org.apache.spark.sql.onceflow.UpsertWriter"
"""The JVM ``ForeachWriter`` of :func:`onceflow.write_realtime` (``jvm/UpsertWriter.scala``)."""

REALTIME_JAR_NAME = "onceflow-realtime"
_REALTIME_SOURCES = (scalac.JVM_DIR / "UpsertWriter.scala",)


def realtime_writer_jar() -> Path:
    """The real-time writer's jar, compiled now if this Spark and source have none yet.

    Raises:
        ConfigError: PostgreSQL's JDBC driver was not fetched, or the writer does not compile.
    """
    from onceflow.runtime import jars  # not at import: ``python -m onceflow.runtime.jars`` imports this first

    return scalac.build(REALTIME_JAR_NAME, _REALTIME_SOURCES, "onceflow's real-time upsert writer",
                        extra=jars.require(jars.POSTGRES_JDBC))


def realtime_jars() -> list[Path]:
    """The jars a session needs on ``spark.jars`` for :func:`onceflow.write_realtime`.

    Raises:
        ConfigError: See :func:`realtime_writer_jar`.
    """
    from onceflow.runtime import jars

    return [realtime_writer_jar(), *jars.require(jars.POSTGRES_JDBC)]

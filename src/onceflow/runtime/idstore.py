"""onceflow's id state store: Spark's ``dropDuplicatesWithinWatermark`` with a faster state.

``onceflow.deduplicate`` (and any ``dropDuplicatesWithinWatermark``) keeps each partition's
ids in a Spark state store. Spark's default, the HDFS-backed store, holds them in a
``ConcurrentHashMap`` of ``UnsafeRow`` objects, copies the whole map for each new version and
writes every put and every removal to its delta file: most of Example 5-1's time (BENCHMARKS.md,
"Throughput ceiling"). The id store
(``jvm/IdStateStoreProvider.scala`` and ``jvm/IdTable.scala`` beside this module) keeps the
same ids in flat arrays with an open-addressing index, outside the Java heap (the collector never
copies them; its memory per id and per partition is in BENCHMARKS.md, beside ``spark.driver.memory``),
answers most lookups of new ids from a Bloom filter small enough to stay in cache (the newest
ids wait in a small index of their own and go into the big one together), updates one table in place
from version to version, and writes an eviction of everything up to an expiry as one record. It
stores the same things in the same checkpoint directory with Spark's own atomic file writes,
so crash recovery stays Spark's: a version is committed when its delta file is renamed into
place, and a failed task's table is rebuilt from the files. Every other stateful operator of
the query (aggregations, joins) goes to Spark's HDFS-backed store unchanged.

It is Scala compiled against the session's own Spark (:mod:`onceflow.runtime.scalac`: the Scala
compiler PySpark ships, once per Spark version and source, into ``<cache>/jvm/``).

:func:`onceflow.session` uses it by default (``id_store=False`` or ``ONCEFLOW_ID_STORE=0``
keep Spark's store; a ``conf`` naming another provider, e.g. RocksDB, is kept). Spark records the
state store provider in the checkpoint at a query's first batch: a query started with the id
store must be restarted with it, and one started without it (e.g. before onceflow made it the
default) keeps Spark's store.
"""

from __future__ import annotations

import os
from pathlib import Path

from onceflow.errors import ConfigError
from onceflow.runtime import scalac

PROVIDER_CLASS = "org.apache.spark.sql.onceflow.IdStateStoreProvider"
"""The value of ``spark.sql.streaming.stateStore.providerClass`` for the id store."""

PROVIDER_KEY = "spark.sql.streaming.stateStore.providerClass"

ENV = "ONCEFLOW_ID_STORE"
"""``0``/``false``: :func:`onceflow.session` uses Spark's store unless told otherwise (the
id store is the default)."""

SOURCES = scalac.sources("onceflow-idstore")
"""The Scala sources, shipped in the package (and built into the wheel: :mod:`onceflow.runtime.scalac`)."""


def enabled_by_env() -> bool:
    """Whether ``$ONCEFLOW_ID_STORE`` leaves the id store on: unset (the default), ``1``/``true``.

    Raises:
        ConfigError: A value that is neither on (``1``, ``true``, ``yes``, ``on``) nor off
            (``0``, ``false``, ``no``, ``off``).
    """
    value = os.environ.get(ENV, "").strip().lower()
    if value in ("", "1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{ENV}={value!r}: use 1 (onceflow's id state store, the default) or 0 "
                      f"(Spark's HDFS-backed store)")


def jar_path() -> Path:
    """Where the jar is compiled on first use when the wheel has none for this Spark."""
    return scalac.jar_path("onceflow-idstore", SOURCES)


def build() -> Path:
    """The id store's jar: the wheel's, or compiled now if it has none for this Spark (seconds).

    Returns:
        The jar's path.

    Raises:
        ConfigError: PySpark ships no Scala compiler (use Spark's default state store:
            ``session(id_store=False)``), or the source does not compile against this Spark.
    """
    return scalac.build("onceflow-idstore", SOURCES, "onceflow's id state store",
                        remedy=f" (Spark's own store needs none: session(id_store=False) or {ENV}=0)")


def session_conf(conf: dict[str, str]) -> dict[str, str]:
    """``conf`` with the id store's jar on ``spark.jars`` and its provider class set.

    Args:
        conf: The session's configuration so far (not changed).

    Returns:
        A new dict.

    Raises:
        ConfigError: ``conf`` names another state store provider.
    """
    given = conf.get(PROVIDER_KEY)
    if given and given != PROVIDER_CLASS:
        raise ConfigError(f"session(id_store=True) sets {PROVIDER_KEY}, and conf names {given}: "
                          f"drop one of them")
    from onceflow.runtime.jars import with_jars

    return {**with_jars(conf, [build()]), PROVIDER_KEY: PROVIDER_CLASS}


def check_checkpoint(checkpoint: str | os.PathLike[str], session_jars: str) -> None:
    """Refuse to restart a query of the id store in a session without it, with what to do.

    Args:
        checkpoint: The query's checkpoint directory.
        session_jars: The session's ``spark.jars``.

    Raises:
        ConfigError: The checkpoint's query started with the id store and the session does not
            have its jar (Spark would fail to load the class in its first stateful task).
    """
    from onceflow.checkpoint import logs as ckpt
    from onceflow.checkpoint import ranges

    root = Path(checkpoint)
    fixed = ranges.checkpoint_conf(root, ckpt.offset_batches(root)) or {}
    if fixed.get(PROVIDER_KEY) == PROVIDER_CLASS and "onceflow-idstore" not in session_jars:
        raise ConfigError(f"the query in {checkpoint} started with onceflow's id state store, and Spark "
                          f"restarts it with the store it started with: create the session with "
                          f"onceflow.session() (the id store is its default; not id_store=False, "
                          f"{ENV}=0 or onceflow run --spark-store), or id_store=True")

"""A driver JVM onceflow did not start: ``spark-submit``, ``pyspark``, a notebook's kernel.

:func:`onceflow.session` asks for settings that only a JVM's start can take: the driver's
heap (``spark.driver.memory``), its JVM options and its class path (onceflow's jars: the local
checkpoint file manager, the id state store, connectors). Under ``spark-submit`` the driver JVM
runs before the application's Python, so those settings would be recorded in the session's
conf and never applied — a 1 GiB driver whose conf says 4 GiB, and a
``ClassNotFoundException`` when the query starts. Instead:

1. :func:`started_before` tells whether the JVM was started by someone else
   (``PYSPARK_GATEWAY_PORT`` is set: PySpark connects to it instead of launching one);
2. :func:`start_settings` says, in one warning each, what cannot be applied and the flag that
   would apply it (``--driver-memory 4g``), and leaves it out of the conf;
3. :func:`load_classes` makes each onceflow class loadable in the running driver: already on its
   class path (``--jars``), else added to the driver's class loader (``spark-submit``'s loader
   takes jars at run time); a class that still cannot be loaded is dropped from the conf with a
   warning naming ``--jars`` (Spark's own checkpoint manager or state store then run), or refused
   when it has no fallback (a connector).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

GATEWAY_ENV = "PYSPARK_GATEWAY_PORT"
"""Set by ``spark-submit`` (and ``pyspark``) for the Python it starts: the JVM already runs."""

START_ONLY = ("spark.driver.memory", "spark.driver.extraJavaOptions", "spark.driver.extraClassPath")
"""Settings read when the driver JVM starts only."""

_FLAGS = {"spark.driver.memory": "--driver-memory {value}",
          "spark.driver.extraJavaOptions": "--driver-java-options '{value}'",
          "spark.driver.extraClassPath": "--driver-class-path {value}"}
_RUNTIME_LOADERS = ("org.apache.spark.util.MutableURLClassLoader",
                    "org.apache.spark.util.ChildFirstURLClassLoader")
"""Class loaders that take jars at run time (``addURL``): ``spark-submit`` runs the driver's
application in one."""
_log = logging.getLogger("onceflow.spark")


def started_before() -> bool:
    """Whether this process's driver JVM was started before it (``spark-submit``, ``pyspark``)."""
    from pyspark import SparkContext

    return bool(os.environ.get(GATEWAY_ENV)) and SparkContext._active_spark_context is None


def running_conf(key: str) -> str | None:
    """The running driver JVM's setting ``key`` as ``spark-submit`` was given it (None: unset)."""
    from pyspark import SparkConf

    value = SparkConf().get(key)
    return None if value is None else str(value)


def start_settings(conf: dict[str, str], wanted: Mapping[str, str]) -> dict[str, str]:
    """``conf`` without the settings a running JVM cannot take, each one said when it differs.

    Args:
        conf: The session's conf so far (``START_ONLY`` keys among them are removed).
        wanted: Settings onceflow would apply at a JVM's start (e.g. its 4 GiB driver heap), to
            compare with the running JVM's.

    Returns:
        A new dict.
    """
    out = {k: v for k, v in conf.items() if k not in START_ONLY}
    for key, value in {**wanted, **{k: v for k, v in conf.items() if k in START_ONLY}}.items():
        if key == "spark.driver.memory":
            given = running_conf(key)  # spark-submit's --driver-memory, the JVM's -Xmx
            if given is not None and _bytes(given) >= _bytes(value):
                continue
            heap = _max_heap()  # else what the JVM has, which reports less than its -Xmx (the
            if heap >= 0.85 * _bytes(value):  # parallel collector leaves out a survivor space: ~11%)
                continue
            have = f"a {heap / 2**30:.1f} GiB heap"
        else:
            given = running_conf(key) or ""
            if value.strip() in given:
                continue
            have = f"{key}={given or '(unset)'}"
        flag = _FLAGS[key].format(value=value)
        _log.warning("the driver JVM was started before onceflow's session (spark-submit) with %s; onceflow "
                     "would set %s=%s, which only a JVM's start applies: pass %s to spark-submit",
                     have, key, value, flag)
    return out


def load_classes(spark: SparkSession, wanted: Mapping[str, tuple[str, list[Path]]],
                 fallback: Mapping[str, str]) -> list[str]:
    """Make each class of ``wanted`` loadable by the running driver, or say what to pass.

    Args:
        spark: The session (classic: its driver JVM).
        wanted: A conf key -> (the class it names, the jars it needs).
        fallback: A conf key -> what runs without the class (e.g. "Spark's checkpoint file
            manager"); a key not here has none.

    Returns:
        The conf keys whose class cannot be had: the caller leaves them unset.

    Raises:
        ConfigError: A class without a fallback cannot be loaded.
    """
    jvm: Any = spark.sparkContext._jvm
    loader = jvm.java.lang.Thread.currentThread().getContextClassLoader()
    missing = []
    takes_jars = str(loader.getClass().getName()) in _RUNTIME_LOADERS
    for key, (name, jars) in wanted.items():
        if _loads(jvm, loader, name):
            continue
        if takes_jars:
            for jar in jars:
                loader.addURL(jvm.java.io.File(str(jar)).toURI().toURL())
            if _loads(jvm, loader, name):
                _log.info("%s added to the running driver's class path", ", ".join(j.name for j in jars))
                continue
        flag = "--jars " + ",".join(str(j) for j in jars)
        if key not in fallback:
            raise ConfigError(f"the driver JVM was started without {name} and it cannot be added now: "
                              f"pass {flag} to spark-submit (`onceflow jars path NAME` prints a set's jars)")
        _log.warning("the driver JVM was started without %s and it cannot be added now: %s runs instead; "
                     "pass --jars \"$(onceflow jars path onceflow)\" to spark-submit to use it",
                     name, fallback[key])
        missing.append(key)
    return missing


def _max_heap() -> int:
    """The running driver JVM's maximum heap in bytes."""
    from pyspark import SparkContext

    SparkContext._ensure_initialized()
    jvm: Any = SparkContext._jvm
    return int(jvm.java.lang.Runtime.getRuntime().maxMemory())


def _bytes(size: str) -> int:
    """A JVM memory size (``4g``, ``512m``, ``1024k``, bytes) in bytes."""
    text = size.strip().lower().rstrip("b")
    scale = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40}.get(text[-1:], 1)
    try:
        return int(float(text.rstrip("kmgt")) * scale)
    except ValueError:
        raise ConfigError(f"driver memory {size!r} is not a JVM size (e.g. 4g, 512m)") from None


def _loads(jvm: Any, loader: Any, name: str) -> bool:
    """Whether ``loader`` loads the class ``name``."""
    try:
        jvm.java.lang.Class.forName(name, False, loader)
    except Exception:  # noqa: BLE001 - py4j's wrapper of ClassNotFoundException
        return False
    return True

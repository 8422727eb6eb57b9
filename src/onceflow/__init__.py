"""onceflow: exactly-once stream processing for PySpark Structured Streaming.

The names a user needs::

    import onceflow
    clean = onceflow.deduplicate(events, id="payment_id", event_time="ts", within="10 minutes")
    query = onceflow.write_stream(clean, sink=onceflow.sqlite("app.db"), checkpoint="ck/",
                                  tables={"revenue": onceflow.Table(key=["account"], add=["amount"])},
                                  per_batch=to_revenue)

The names are imported when first used: a Spark worker that runs one of onceflow's task
functions imports the modules of that function only, not the whole library.
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any


def _import_pyspark_from_its_package() -> None:
    """Where Spark put its zips first on the path, import PySpark from its installed package instead.

    Spark starts its Python processes — ``spark-submit``'s driver, the executors' workers, a Spark
    Connect server's ``foreachBatch`` worker — with ``$SPARK_HOME/python/lib/pyspark.zip`` (and
    py4j's zip) first on ``PYTHONPATH``. A zip holds no bytecode, so Python compiles every PySpark
    module such a process imports, at each start: seconds that ``python app.py`` (the installed
    package, its bytecode cached) does not spend. When the zip is the installed package's own
    (pip's PySpark: ``SPARK_HOME`` is the package's directory, the same files), the zips go to the
    end of ``sys.path``: PySpark's zip, and py4j's when the installed py4j is the zip's version. A
    zip of another Spark install stays where it is, and nothing moves once PySpark is imported.

    Runs when onceflow is imported, and at the start of every Python of the environment where
    Spark put that zip on the path: the install's ``onceflow-pyspark.pth`` (``setup.py``) imports
    onceflow there, before the process's own code.
    """
    if "pyspark" in sys.modules:
        return
    package = next((d for d in sys.path if not d.endswith(".zip")
                    and os.path.isfile(os.path.join(d, "pyspark", "__init__.py"))), None)
    if package is None:
        return
    lib = os.path.join(package, "pyspark", "python", "lib")
    moved = []
    for d in sys.path:
        where, name = os.path.split(os.path.normpath(d))
        if where != lib:
            continue
        if name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith("-src.zip") and os.path.isdir(
                os.path.join(package, name[:-len("-src.zip")] + ".dist-info"))):
            moved.append(d)
    sys.path[:] = [d for d in sys.path if d not in moved] + moved


_import_pyspark_from_its_package()

from onceflow.errors import BatchRejectedError, ConfigError, OnceflowError  # noqa: E402

if TYPE_CHECKING:
    from onceflow.api.query import OnceQuery
    from onceflow.api.realtime import write_realtime
    from onceflow.api.stream import deduplicate, delta, http, iceberg, kafka, postgres, sqlite, write_stream
    from onceflow.engine.contract import expect
    from onceflow.runtime.session import session
    from onceflow.sinks._core.tables import Table
    from onceflow.sources.kafka.source import read_kafka
    from onceflow.sources.log import EventLog

__version__ = "0.1.0"

_WHERE = {**dict.fromkeys(("deduplicate", "delta", "http", "iceberg", "kafka", "postgres", "sqlite",
                           "write_stream"),
                          "onceflow.api.stream"),
          "expect": "onceflow.engine.contract", "OnceQuery": "onceflow.api.query",
          "write_realtime": "onceflow.api.realtime", "read_kafka": "onceflow.sources.kafka.source",
          "EventLog": "onceflow.sources.log", "Table": "onceflow.sinks._core.tables",
          "session": "onceflow.runtime.session"}
"""Each public name the package imports on first use -> its module."""

__all__ = ["BatchRejectedError", "ConfigError", "EventLog", "OnceQuery", "OnceflowError", "Table",
           "__version__", "deduplicate", "delta", "expect", "http", "iceberg", "kafka", "postgres",
           "read_kafka", "session", "sqlite", "write_realtime", "write_stream"]


def __getattr__(name: str) -> Any:
    """A public name (or a submodule), imported the first time it is asked for."""
    module = _WHERE.get(name)
    if module is None:
        try:
            return importlib.import_module(f"onceflow.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"onceflow.{name}":
                raise
            raise AttributeError(f"module 'onceflow' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The package's names, those not imported yet included."""
    return sorted({*globals(), *__all__})

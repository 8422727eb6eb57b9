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
    """Under ``spark-submit``, import PySpark from its installed package rather than from Spark's zip.

    ``spark-submit app.py`` puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's zip) first on
    the driver's ``PYTHONPATH``. A zip holds no bytecode, so Python compiles every PySpark module
    the driver imports at each start, which ``python app.py`` (importing the installed package,
    its bytecode cached) does not. When the zip is the installed package's own (pip's PySpark:
    ``SPARK_HOME`` is the package's directory, the same files), the zips go to the end of
    ``sys.path``. Only before PySpark is imported (import onceflow first), and only for those
    zips: a zip of another Spark install stays where it is.
    """
    if "pyspark" in sys.modules or "PYSPARK_GATEWAY_PORT" not in os.environ:
        return
    package = next((d for d in sys.path if not d.endswith(".zip")
                    and os.path.isfile(os.path.join(d, "pyspark", "__init__.py"))), None)
    if package is None:
        return
    lib = os.path.join(package, "pyspark", "python", "lib")
    zips = {os.path.join(lib, "pyspark.zip")}
    try:  # py4j's zip only when the installed py4j is the zip's version
        from importlib.metadata import version

        zips.add(os.path.join(lib, f"py4j-{version('py4j')}-src.zip"))
    except ImportError:  # no installed py4j (PackageNotFoundError is an ImportError)
        pass
    moved = [d for d in sys.path if os.path.normpath(d) in zips]
    sys.path[:] = [d for d in sys.path if d not in moved] + moved


_import_pyspark_from_its_package()

from onceflow.errors import BatchRejectedError, ConfigError, OnceflowError  # noqa: E402

if TYPE_CHECKING:
    from onceflow.api import deduplicate, delta, http, iceberg, kafka, postgres, sqlite, write_stream
    from onceflow.contract import expect
    from onceflow.query import OnceQuery
    from onceflow.realtime import write_realtime
    from onceflow.sources.kafka import read_kafka
    from onceflow.sources.log import EventLog
    from onceflow.tables import Table

__version__ = "0.1.0"

_WHERE = {**dict.fromkeys(("deduplicate", "delta", "http", "iceberg", "kafka", "postgres", "sqlite",
                           "write_stream"),
                          "onceflow.api"),
          "expect": "onceflow.contract", "OnceQuery": "onceflow.query",
          "write_realtime": "onceflow.realtime", "read_kafka": "onceflow.sources.kafka",
          "EventLog": "onceflow.sources.log", "Table": "onceflow.tables"}
"""Each public name the package imports on first use -> its module."""

__all__ = ["BatchRejectedError", "ConfigError", "EventLog", "OnceQuery", "OnceflowError", "Table",
           "__version__", "deduplicate", "delta", "expect", "http", "iceberg", "kafka", "postgres",
           "read_kafka", "sqlite", "write_realtime", "write_stream"]


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

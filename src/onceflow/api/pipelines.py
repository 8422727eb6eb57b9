"""A user's pipeline as a function: ``PATH.py:FUNCTION``, for ``onceflow run`` and ``onceflow verify``.

The contract with the user's module is one function::

    def build(spark, input, sink, checkpoint, once):
        events = spark.readStream.schema(SCHEMA).json(input)
        clean = onceflow.deduplicate(events, id="event_id", event_time="ts", within="10 minutes")
        return onceflow.write_stream(clean, sink=sink, checkpoint=checkpoint, once=once,
                                     tables={...}, per_batch=...)

* ``spark``: the SparkSession to build the query in;
* ``input``: the directory the pipeline reads (verify feeds it while the query runs);
* ``sink``: where the tables go (an :func:`onceflow.sqlite`, :func:`onceflow.postgres` or
  :func:`onceflow.delta` sink the caller chose: the same function runs against any); with
  several sinks (``--sink sqlite+iceberg``) a dict by family, ``{"sqlite": ..., "iceberg": ...}``,
  which the function routes its tables to (``write_stream(df, {table: sink[family]})``);
* ``checkpoint``: Spark's checkpoint directory;
* ``once``: process what is there, then stop (``availableNow``).

It returns what :func:`onceflow.write_stream` returned (the running :class:`OnceQuery`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from onceflow.errors import ConfigError

PARAMETERS = ("spark", "input", "sink", "checkpoint", "once")
"""What the pipeline function is called with, in this order."""


def split(spec: str) -> tuple[Path, str]:
    """``PATH.py:FUNCTION`` as the module's path and the function's name.

    Raises:
        ConfigError: Not of that form, or no such file.
    """
    path, sep, name = spec.rpartition(":")
    if not sep or not path or not name.isidentifier():
        raise ConfigError(f"--pipeline {spec!r}: give PATH.py:FUNCTION, e.g. pipelines/orders.py:build "
                          "(the function that builds the query with onceflow.write_stream)")
    file = Path(path).expanduser().absolute()
    if not file.is_file():
        raise ConfigError(f"--pipeline {spec!r}: there is no file {file}")
    return file, name


def load(spec: str, fresh: bool = False) -> Callable[..., Any]:
    """The pipeline function ``PATH.py:FUNCTION`` names (see the module for its contract).

    Args:
        spec: ``PATH.py:FUNCTION``.
        fresh: Load the module again under a name of its own, even when it was loaded before
            (the oracle imports it with its own ``onceflow`` functions in place).

    Raises:
        ConfigError: A bad spec, a module that fails to import (its error named), no such
            function, or one that does not take the five arguments.
    """
    file, name = split(spec)
    digest = hashlib.sha1(str(file).encode()).hexdigest()[:10]
    modname = f"onceflow_pipeline_{file.stem}_{digest}" + ("_fresh" if fresh else "")
    module = None if fresh else sys.modules.get(modname)
    if module is None:
        where = importlib.util.spec_from_file_location(modname, file)
        if where is None or where.loader is None:
            raise ConfigError(f"--pipeline {spec!r}: {file} is not a Python module")
        module = importlib.util.module_from_spec(where)
        sys.path.insert(0, str(file.parent))  # the module's own imports of its neighbours
        try:
            where.loader.exec_module(module)
        except Exception as exc:
            raise ConfigError(f"--pipeline {spec!r}: importing {file} failed: {type(exc).__name__}: {exc}") \
                from exc
        finally:
            sys.path.remove(str(file.parent))
        if not fresh:
            sys.modules[modname] = module
            # its functions pickled by value: a Spark Connect server (whose foreachBatch worker
            # runs per_batch) cannot import a module loaded from a path under a name of ours
            from pyspark import cloudpickle

            cloudpickle.register_pickle_by_value(module)  # type: ignore[no-untyped-call]
    fn = getattr(module, name, None)
    if not callable(fn):
        have = sorted(n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_"))
        raise ConfigError(f"--pipeline {spec!r}: {file.name} has no function {name!r} (its functions: "
                          f"{', '.join(have) or 'none'})")
    try:
        inspect.signature(fn).bind(*PARAMETERS)
    except TypeError:
        raise ConfigError(f"--pipeline {spec!r}: {name}{inspect.signature(fn)} must take the five arguments "
                          f"({', '.join(PARAMETERS)})") from None
    return fn  # type: ignore[no-any-return]


def start(fn: Callable[..., Any], spark: Any, input: str | Path, sink: Any, checkpoint: str | Path,
          once: bool, realtime: bool = False) -> Any:
    """Call the pipeline function; the query it returned.

    Args:
        fn: The pipeline function.
        spark: The session.
        input: What it reads.
        sink: Where it writes (a sink; with ``realtime``, the PostgreSQL connection string).
        checkpoint: Spark's checkpoint directory.
        once: Process what is there, then stop.
        realtime: The function writes with :func:`onceflow.write_realtime` (a Real-Time Mode
            query: it returns a :class:`onceflow.api.realtime.RealtimeQuery`).

    Raises:
        ConfigError: It returned something else than the query of the writer it must use.
    """
    from onceflow.api.query import OnceQuery

    query = fn(spark, str(input), sink, str(checkpoint), once)
    if realtime:
        from onceflow.api.realtime import RealtimeQuery

        if not isinstance(query, RealtimeQuery):
            raise ConfigError(f"the pipeline function {getattr(fn, '__name__', fn)} returned "
                              f"{type(query).__name__}; with --sink realtime it must return what "
                              "onceflow.write_realtime returned (its sink argument is the connection "
                              "string: write_realtime(df, table, key, checkpoint, dsn=sink))")
        return query
    if not isinstance(query, OnceQuery):
        raise ConfigError(f"the pipeline function {getattr(fn, '__name__', fn)} returned "
                          f"{type(query).__name__}; it must return what onceflow.write_stream returned")
    return query

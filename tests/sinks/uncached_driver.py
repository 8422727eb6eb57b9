"""A one-table pipeline for the uncached tasks path: ``python -m tests.sinks.uncached_driver IN OUT CK SINK``.

Reads the Parquet files under IN (two per batch), keeps the rows whose ``v`` is not a multiple of 3
and adds ``w = v + 1`` (a ``per_batch`` of its own, so the batch's rows and the table's differ),
and appends them to table ``moves`` of ``onceflow.delta(OUT)``, ``onceflow.sqlite(OUT)`` or (SINK
``postgres``, OUT unused) ``onceflow.postgres()`` on ``$ONCEFLOW_PG_DSN``, with
``collect_below=0``: every batch is large, has one table and no key, so it is written by Spark's
tasks without a cache (:attr:`onceflow.sinks._core.base.Sink.writes_uncached`). ``local[2,2]``: a task
killed by a crash point is tried again.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import onceflow
from onceflow.runtime.session import session

SCHEMA = "id LONG, account STRING, v LONG, at TIMESTAMP"

if __name__ == "__main__":
    source, out, ck, kind = sys.argv[1:5]
    spark = session(master="local[2,2]", app_name="uncached-test")
    sink = {"delta": lambda: onceflow.delta(Path(out), collect_below=0),
            "sqlite": lambda: onceflow.sqlite(Path(out), collect_below=0),
            "postgres": lambda: onceflow.postgres(collect_below=0)}[kind]()
    stream = spark.readStream.schema(SCHEMA).option("maxFilesPerTrigger", 2).parquet(source)
    onceflow.write_stream(stream, sink, Path(ck), {"moves": onceflow.Table()},
                          per_batch=lambda df: df.where("v % 3 != 0").selectExpr("*", "v + 1 AS w"),
                          once=True).awaitTermination()
    print("drained", flush=True)
    sys.stderr.flush()
    os._exit(0)  # delta-rs may abort the interpreter at shutdown (delta-io/delta-rs#2184)

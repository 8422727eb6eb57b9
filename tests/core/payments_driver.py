"""A payments driver for the crash tests: the example's pipeline with a chosen sink mode.

``python -m tests.core.payments_driver INPUT DB CHECKPOINT MODE BACKEND [--once]``; MODE
``exactly_once``, or ``naive`` / ``lossy`` for the negative controls; BACKEND ``sqlite`` (DB is
the file), ``postgres`` (driver-side; the DSN from ``ONCEFLOW_PG_DSN``), ``postgres-staged`` /
``postgres-2pc`` (written by the executors), ``delta`` (DB is the root of the Delta tables) or
``delta-tasks`` (the same, every batch's files written by Spark's tasks; a task is tried twice) or
``sqlite-tasks`` (SQLite, every batch converted and written to scratch files by Spark's tasks) or
``postgres-tasks`` (driver-side PostgreSQL, every batch staged by Spark's tasks).
"""

from __future__ import annotations

import sys
from pathlib import Path

from onceflow.examples import payments
from onceflow.runtime.session import session
from onceflow.sinks.sqlite.sink import SQLiteTablesSink

if __name__ == "__main__":
    source, db, ck, mode, backend = sys.argv[1:6]
    spark = session(master="local[2,2]" if backend.endswith("-tasks") else None, app_name="payments-test",
                    conf={"spark.sql.session.timeZone": "UTC"})
    if backend in ("postgres", "postgres-tasks"):
        from onceflow.sinks.postgres.sink import PostgresTablesSink
        from onceflow.verify.sinks import NaivePostgresSink

        sink: object = (NaivePostgresSink if mode == "naive" else PostgresTablesSink)(
            None, collect_below=0 if backend == "postgres-tasks" else 100_000)
    elif backend.startswith("postgres-"):  # executor side: staged or 2pc
        import onceflow

        sink = onceflow.postgres(None, protocol=backend.removeprefix("postgres-"))
    elif backend.startswith("delta"):
        from onceflow.sinks.delta.sink import DeltaTablesSink

        # DB is the root directory of the Delta tables
        sink = DeltaTablesSink(Path(db), collect_below=0 if backend == "delta-tasks" else 100_000)
    else:
        from onceflow.verify.sinks import LossySQLiteSink, NaiveSQLiteSink

        cls = {"naive": NaiveSQLiteSink, "lossy": LossySQLiteSink}.get(mode, SQLiteTablesSink)
        sink = SQLiteTablesSink(Path(db), collect_below=0) if backend == "sqlite-tasks" else cls(Path(db))
    payments.start(spark, source, db, ck, once="--once" in sys.argv, max_files_per_trigger=2,
                   sink=sink).awaitTermination()
    print("drained", flush=True)
    if backend.startswith("delta"):  # delta-rs may abort the interpreter at shutdown (delta-io/delta-rs#2184)
        import os

        sys.stderr.flush()
        os._exit(0)

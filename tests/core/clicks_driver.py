"""A click-stream driver for the crash tests (:mod:`tests.core.clicks`), one driver life.

``python -m tests.core.clicks_driver STYLE KIND LOCATION INPUT CHECKPOINT [--once]``: STYLE
``deltas`` / ``update`` / ``append``; KIND ``sqlite`` (LOCATION: the file), ``postgres`` (a DSN)
or ``delta`` (the root of the tables). ``ONCEFLOW_CRASH_AT`` arms a crash point.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from onceflow.runtime.session import session
from tests.core import clicks

if __name__ == "__main__":
    style, kind, location, inputs, checkpoint = sys.argv[1:6]
    spark = session(app_name="clicks-test", conf={"spark.sql.session.timeZone": "UTC"})
    clicks.start(spark, style, Path(inputs), clicks.make_sink(kind, location), Path(checkpoint),
                 once="--once" in sys.argv).awaitTermination()
    print("drained", flush=True)
    if kind == "delta":  # delta-rs may abort the interpreter at shutdown (delta-io/delta-rs#2184)
        sys.stderr.flush()
        os._exit(0)

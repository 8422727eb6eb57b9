"""An order-pipeline driver for the rejects crash tests (:mod:`tests.core.orders`), one driver life.

``python -m tests.core.orders_driver INPUT CHECKPOINT DB [--once] [--topic TOPIC]``: INPUT is the
directory of JSON-lines files, or with ``--topic`` the Kafka brokers. ``ONCEFLOW_CRASH_AT`` arms a
crash point.
"""

from __future__ import annotations

import sys
from pathlib import Path

import onceflow
from onceflow.runtime.session import session
from tests.core import orders

if __name__ == "__main__":
    inputs, checkpoint, db = sys.argv[1:4]
    topic = sys.argv[sys.argv.index("--topic") + 1] if "--topic" in sys.argv else None
    spark = session(app_name="orders-test", conf={"spark.sql.session.timeZone": "UTC"})
    orders.start(spark, inputs if topic else Path(inputs), onceflow.sqlite(db), Path(checkpoint),
                 once="--once" in sys.argv, topic=topic).awaitTermination()
    print("drained", flush=True)

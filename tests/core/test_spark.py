"""The session's JVM really runs with onceflow's defaults (a live Spark session)."""

from __future__ import annotations

import os
from typing import Any


def test_driver_jvm_uses_the_parallel_collector(spark: Any) -> None:
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory \
        .getGarbageCollectorMXBeans()
    names = {beans.get(i).getName() for i in range(beans.size())}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names


def test_shuffle_partitions_match_the_cores(spark: Any) -> None:
    assert spark.conf.get("spark.sql.shuffle.partitions") == str(os.cpu_count() or 2)
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"

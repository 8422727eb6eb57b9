"""The session's JVM really runs with onceflow's defaults (a live Spark session; one test runs drivers)."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from onceflow.runtime.session import CHECKSUMS_ENV
from onceflow.sources.log import EventLog
from onceflow.verify.driver import wait_until
from onceflow.verify.generator import GeneratorConfig, generate_segments
from onceflow.verify.verdict import read_counts
from tests.helpers import distinct_counts

pytestmark = pytest.mark.spark


def test_driver_jvm_uses_the_parallel_collector(spark: Any) -> None:
    beans = spark.sparkContext._jvm.java.lang.management.ManagementFactory \
        .getGarbageCollectorMXBeans()
    names = {beans.get(i).getName() for i in range(beans.size())}
    assert names == {"PS Scavenge", "PS MarkSweep"}, names


def test_shuffle_partitions_match_the_cores(spark: Any) -> None:
    assert spark.conf.get("spark.sql.shuffle.partitions") == str(os.cpu_count() or 2)
    assert spark.conf.get("spark.sql.session.timeZone") == "UTC"


def test_local_files_go_through_the_raw_local_file_system(spark: Any) -> None:
    from onceflow.runtime.session import RAW_LOCAL_FS

    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    for key, value in RAW_LOCAL_FS.items():
        assert hadoop.get(key.removeprefix("spark.hadoop.")) == value


@pytest.mark.long  # ~23 s: make test is near its 30 minutes (the raw file system is checked above)
def test_a_checkpoint_resumes_across_checksummed_and_raw_local_files(tmp_path: Path) -> None:
    """Example 5-1 run three times on one checkpoint: checksummed, raw (the default), checksummed.

    Each run gets new segments; every run must resume where the last stopped and the counts
    must equal a recomputation from the log. ``.crc`` files tell which file system wrote.
    """
    log = EventLog(tmp_path / "log")
    ck = tmp_path / "ck"
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    written: list[set[str]] = []
    for n, checksums in enumerate((True, False, True)):
        for t in generate_segments(GeneratorConfig(events=4_000, users=30, minutes=4, duplicates=0.1,
                                                   seed=n, segment_size=1_000,
                                                   start=start + timedelta(minutes=4 * n))):
            log.append(t)
        before = {str(p) for p in ck.rglob("*")} if ck.exists() else set()
        env = {k: v for k, v in os.environ.items() if k != CHECKSUMS_ENV}
        if checksums:
            env[CHECKSUMS_ENV] = "1"
        proc = subprocess.run(
            [sys.executable, "-m", "onceflow.cli.main", "run", "--log", str(tmp_path / "log"),
             "--checkpoint", str(ck), "--db", str(tmp_path / "db.sqlite"), "--once",
             "--max-files-per-trigger", "2"],
            capture_output=True, text=True, timeout=300, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        written.append({p for p in (str(p) for p in ck.rglob("*")) if p not in before})
        assert read_counts(tmp_path / "db.sqlite") == distinct_counts(tmp_path / "log")
    crc = [{p for p in new if p.endswith(".crc")} for new in written]
    assert crc[0] and crc[2], "Hadoop's checksummed local file system writes .crc files"
    assert not crc[1], f"the raw local file system wrote checksum files: {sorted(crc[1])[:3]}"
    assert any("/commits/" in p for p in written[1]) and any("/state/" in p for p in written[1])


MANAGERS = "org.apache.spark.sql.execution.streaming.checkpointing."
SPARKS_MANAGER = MANAGERS + "FileContextBasedCheckpointFileManager"
FS_BASED_MANAGER = MANAGERS + "FileSystemBasedCheckpointFileManager"


def _manager(spark: Any, path: str) -> tuple[str, str]:
    """(class, writer class) of the checkpoint file manager Spark creates for ``path`` now."""
    jvm = spark.sparkContext._jvm
    conf = spark._jsparkSession.sessionState().newHadoopConf()
    fm = jvm.org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.create(
        jvm.org.apache.hadoop.fs.Path(path), conf)
    name = fm.getClass().getName()
    return name, fm.writer().getClass().getName() if name.endswith("LocalCheckpointFileManager") else name


def test_local_checkpoints_are_written_through_the_file_system_api(spark: Any, tmp_path: Path) -> None:
    from onceflow.runtime.jvmparts import CHECKPOINT_FILES_CLASS, CHECKPOINT_FILES_KEY

    assert spark.conf.get(CHECKPOINT_FILES_KEY) == CHECKPOINT_FILES_CLASS
    assert _manager(spark, str(tmp_path)) == (CHECKPOINT_FILES_CLASS, FS_BASED_MANAGER)
    assert _manager(spark, f"file:{tmp_path}") == (CHECKPOINT_FILES_CLASS, FS_BASED_MANAGER)
    # any other file system: Spark's own choice (no server is contacted to create the manager)
    assert _manager(spark, "hdfs://127.0.0.1:9/ck") == (CHECKPOINT_FILES_CLASS, SPARKS_MANAGER)


def test_a_checkpoint_resumes_across_sparks_and_onceflows_file_managers(spark: Any, tmp_path: Path) -> None:
    """Example 5-1 run three times on one checkpoint: Spark's manager, onceflow's, Spark's again.

    Each run gets new segments; every run must resume where the last stopped (the counts equal
    a recomputation from the log) and leave no temporary file behind.
    """
    from onceflow import sqlite
    from onceflow.examples.user_counts import start as start_example
    from onceflow.runtime.jvmparts import CHECKPOINT_FILES_CLASS, CHECKPOINT_FILES_KEY

    log = EventLog(tmp_path / "log")
    ck = tmp_path / "ck"
    begin = datetime(2026, 1, 1, tzinfo=timezone.utc)
    try:
        for n, manager in enumerate((SPARKS_MANAGER, CHECKPOINT_FILES_CLASS, SPARKS_MANAGER)):
            for t in generate_segments(GeneratorConfig(events=3_000, users=30, minutes=3, duplicates=0.1,
                                                       seed=n, segment_size=1_000,
                                                       start=begin + timedelta(minutes=3 * n))):
                log.append(t)
            spark.conf.set(CHECKPOINT_FILES_KEY, manager)
            assert _manager(spark, str(ck))[0] == manager
            sink = sqlite(tmp_path / "db.sqlite")
            query = start_example(spark, tmp_path / "log", sink, ck, max_files_per_trigger=1, once=True)
            query.awaitTermination()
            sink.close()
            assert read_counts(tmp_path / "db.sqlite") == distinct_counts(tmp_path / "log"), f"run {n}"
            assert len(list((ck / "commits").iterdir())) >= 3 * (n + 1), "every segment is a batch"
            # a snapshot the state store's maintenance writes as the query ends is renamed moments later
            wait_until(lambda: not list(ck.rglob("*.tmp")), 20, "no temporary file left in the checkpoint")
    finally:
        spark.conf.set(CHECKPOINT_FILES_KEY, CHECKPOINT_FILES_CLASS)

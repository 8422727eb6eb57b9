"""onceflow's id state store against Spark's own store, in one live session (onceflow.runtime.idstore).

The session (conftest) has the id store's jar on its classpath; each query here chooses its
state store with ``spark.sql.streaming.stateStore.providerClass``, which Spark reads when a
query starts. Spark's HDFS-backed store is the reference: the same log, the same plan, the same
rows per batch.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import onceflow
from onceflow.runtime import idstore
from onceflow.sources.events import EVENT_DDL
from onceflow.sources.log import EventLog
from onceflow.verify.generator import GeneratorConfig, generate_segments
from tests.helpers import same_sorted

pytestmark = pytest.mark.spark

HDFS = "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider"


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """12 segments: 10% retried sends (often a segment or more after their original), 3% late."""
    root = tmp_path_factory.mktemp("idstore") / "log"
    events = EventLog(root)
    for t in generate_segments(GeneratorConfig(events=6_000, users=40, minutes=12, duplicates=0.1, late=0.03,
                                               seed=5, segment_size=550, max_disorder_s=40)):
        events.append(t)
    for i, seg in enumerate(events.segments()):  # Spark's file source takes files in mtime order
        os.utime(seg.path, (1_700_000_000 + i, 1_700_000_000 + i))
    return root


def run(spark: Any, provider: str, log: Path, checkpoint: Path, *, fail_batch: int | None = None,
        flag: Path | None = None, aggregate: bool = False) -> dict[int, list[Any]]:
    """Drain the log through ``deduplicate`` with ``provider``; each batch's rows, sorted.

    ``fail_batch``: that batch's dedup stage fails once (a UDF in the same stage raises while
    ``flag`` does not exist, then creates it), after the store took the batch's ids.
    ``aggregate``: also count per user in a stateful aggregation (update mode).
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    spark.conf.set(idstore.PROVIDER_KEY, provider)
    stream = (spark.readStream.schema(EVENT_DDL).option("maxFilesPerTrigger", 1).parquet(str(log))
              .select("event_id", "user", "event_time"))
    events = onceflow.deduplicate(stream, id="event_id", event_time="event_time", within="1 minute")
    if fail_batch is not None:
        assert flag is not None
        marker = str(flag)

        def check(_: str) -> bool:
            import os

            if os.path.exists(marker + ".armed") and not os.path.exists(marker):
                open(marker, "w").close()
                raise RuntimeError("injected task failure after the store took the batch's ids")
            return True

        events = events.where(F.udf(check, BooleanType())("event_id"))
    if aggregate:
        events = events.groupBy("user").agg(F.count(F.lit(1)).alias("n"))
    out: dict[int, list[Any]] = {}

    def batch(df: Any, batch_id: int) -> None:
        out[batch_id] = sorted(tuple(r) for r in df.collect())  # runs the batch's dedup stage
        if fail_batch is not None and batch_id == fail_batch - 1 and flag is not None:
            Path(str(flag) + ".armed").touch()  # the next batch's dedup stage fails once

    writer = events.writeStream.foreachBatch(batch).option("checkpointLocation", str(checkpoint))
    if aggregate:
        writer = writer.outputMode("update")
    query = writer.trigger(availableNow=True).start()
    try:
        query.awaitTermination()
    finally:
        spark.conf.set(idstore.PROVIDER_KEY, HDFS)
    # the ids the store holds after each batch (a reloaded table must not keep evicted ones)
    STATE_ROWS[str(checkpoint)] = [p["stateOperators"][0]["numRowsTotal"] for p in query.recentProgress
                                   if p["numInputRows"]]
    return out


STATE_ROWS: dict[str, list[int]] = {}
"""Per checkpoint, the dedup state's row count after each batch with input."""


def state_files(checkpoint: Path, suffix: str) -> list[Path]:
    return sorted((checkpoint / "state").rglob(f"*.{suffix}"))


@pytest.fixture(scope="module")
def reference(spark: Any, log: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[Any]]:
    """Each batch's deduplicated rows with Spark's own state store."""
    ck = tmp_path_factory.mktemp("hdfs") / "ck"
    REFERENCE_CK.append(str(ck))
    return run(spark, HDFS, log, ck)


REFERENCE_CK: list[str] = []


def test_same_rows_as_sparks_store_in_every_batch(spark: Any, log: Path, tmp_path: Path,
                                                  reference: dict[int, list[Any]]) -> None:
    got = run(spark, idstore.PROVIDER_CLASS, log, tmp_path / "ck")
    assert len(reference) >= 12 and sum(map(len, reference.values())) > 5_000
    assert got == reference
    assert STATE_ROWS[str(tmp_path / "ck")] == STATE_ROWS[REFERENCE_CK[0]]
    assert state_files(tmp_path / "ck", "iddelta"), "the id store wrote no delta files"
    assert not state_files(tmp_path / "ck", "delta"), "Spark's store ran instead"


def test_a_copied_checkpoint_is_rebuilt_from_its_files(spark: Any, log: Path, tmp_path: Path,
                                                       reference: dict[int, list[Any]]) -> None:
    """Half the log, a snapshot, the checkpoint copied (a new path: no table in memory), the rest."""
    half = tmp_path / "half"
    half.mkdir()
    segments = EventLog(log).segments()
    for seg in segments[:7]:
        shutil.copy2(seg.path, half / seg.path.name)  # with its mtime
    spark.conf.set("spark.sql.streaming.stateStore.minDeltasForSnapshot", "2")
    try:
        first = run(spark, idstore.PROVIDER_CLASS, half, tmp_path / "ck")
    finally:
        spark.conf.unset("spark.sql.streaming.stateStore.minDeltasForSnapshot")
    import time

    deadline = time.monotonic() + 30  # maintenance writes snapshots every 5 s (the session's setting)
    while not state_files(tmp_path / "ck", "idsnap") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert state_files(tmp_path / "ck", "idsnap"), "no snapshot was written"
    shutil.copytree(tmp_path / "ck", tmp_path / "ck2")
    for seg in segments[7:]:
        shutil.copy2(seg.path, half / seg.path.name)  # with its mtime
    rest = run(spark, idstore.PROVIDER_CLASS, half, tmp_path / "ck2")
    assert min(rest) > max(first)
    # the ids held after each batch: as Spark's store held them (the reloaded table included)
    assert STATE_ROWS[str(tmp_path / "ck")] + STATE_ROWS[str(tmp_path / "ck2")] == STATE_ROWS[REFERENCE_CK[0]]
    # the first run ended with a no-data batch (its watermark moved): compare the batches with rows
    def with_rows(batches: dict[int, list[Any]]) -> list[list[Any]]:
        return [rows for _, rows in sorted(batches.items()) if rows]

    assert with_rows({**first, **rest}) == with_rows(reference)


def test_a_failed_task_leaves_no_ids_behind(spark: Any, log: Path, tmp_path: Path,
                                            reference: dict[int, list[Any]]) -> None:
    """Batch 4's dedup stage fails after the store took its ids; the restarted query re-runs it."""
    flag = tmp_path / "failed"
    with pytest.raises(Exception, match="injected task failure"):
        run(spark, idstore.PROVIDER_CLASS, log, tmp_path / "ck", fail_batch=4, flag=flag)
    assert flag.exists()
    got = run(spark, idstore.PROVIDER_CLASS, log, tmp_path / "ck", fail_batch=4, flag=flag)
    assert min(got) == 4, sorted(got)
    assert got == {b: rows for b, rows in reference.items() if b >= 4}


def test_a_retried_task_starts_from_the_committed_ids(log: Path, tmp_path: Path,
                                                     reference: dict[int, list[Any]]) -> None:
    """Spark retries the failed task in the same query run: the provider saw the failed attempt."""
    cmd = [sys.executable, "-m", "tests.core.idstore_retry_driver", str(log), str(tmp_path / "ck"),
           str(tmp_path / "failed")]
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (tmp_path / "failed").exists(), "the task did not fail"
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {str(b): [[str(v) for v in row] for row in rows] for b, rows in reference.items()}


def test_other_stateful_operators_keep_sparks_store(spark: Any, log: Path, tmp_path: Path,
                                                    tmp_path_factory: pytest.TempPathFactory) -> None:
    want = run(spark, HDFS, log, tmp_path_factory.mktemp("hdfs-agg") / "ck", aggregate=True)
    got = run(spark, idstore.PROVIDER_CLASS, log, tmp_path / "ck", aggregate=True)
    assert got == want and len(got) >= 12
    assert state_files(tmp_path / "ck", "iddelta") and state_files(tmp_path / "ck", "delta")


def test_another_provider_in_conf_is_refused() -> None:
    from onceflow.errors import ConfigError

    with pytest.raises(ConfigError, match="drop one of them"):
        idstore.session_conf({idstore.PROVIDER_KEY: HDFS})
    conf = idstore.session_conf({"spark.jars": "/x.jar"})
    assert conf[idstore.PROVIDER_KEY] == idstore.PROVIDER_CLASS
    assert conf["spark.jars"].split(",")[0] == "/x.jar" and conf["spark.jars"].endswith(".jar")


def test_a_checkpoint_of_the_id_store_needs_it_at_restart(spark: Any, log: Path, tmp_path: Path) -> None:
    from onceflow.errors import ConfigError

    run(spark, idstore.PROVIDER_CLASS, log, tmp_path / "ids")
    run(spark, HDFS, log, tmp_path / "hdfs")
    jars = spark.conf.get("spark.jars")
    assert "onceflow-idstore" in jars
    idstore.check_checkpoint(tmp_path / "ids", jars)  # the session has it: fine
    idstore.check_checkpoint(tmp_path / "hdfs", "")
    idstore.check_checkpoint(tmp_path / "new", "")  # not started
    with pytest.raises(ConfigError, match=r"id_store=True"):
        idstore.check_checkpoint(tmp_path / "ids", "")


def test_onceflow_run_on_the_default_store_and_on_a_checkpoint_of_sparks(tmp_path: Path) -> None:
    """The id store is the default; a checkpoint started on Spark's store stays on it (an upgrade);
    one started on the id store and run with ``--spark-store`` is refused."""
    from onceflow.verify.verdict import read_counts
    from tests.helpers import distinct_counts

    events = EventLog(tmp_path / "log")
    segments = list(generate_segments(GeneratorConfig(events=3_000, users=20, minutes=3, duplicates=0.1,
                                                      seed=3, segment_size=1_000)))
    for t in segments[:2]:
        events.append(t)
    env = {k: v for k, v in os.environ.items() if k != idstore.ENV}

    def run_cli(ck: str, *flags: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "onceflow.cli.main", "run", "--log", str(tmp_path / "log"),
               "--checkpoint", str(tmp_path / ck), "--db", str(tmp_path / f"{ck}.sqlite"), "--once",
               "--max-files-per-trigger", "1", *flags]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)

    old = run_cli("old", "--spark-store")  # as a checkpoint from before the id store was the default
    assert old.returncode == 0, old.stderr[-2000:]
    assert state_files(tmp_path / "old", "delta") and not state_files(tmp_path / "old", "iddelta")
    for t in segments[2:]:
        events.append(t)
    upgraded = run_cli("old")  # the default now: Spark restarts the query on the store it started with
    assert upgraded.returncode == 0, upgraded.stderr[-2000:]
    assert read_counts(tmp_path / "old.sqlite") == distinct_counts(tmp_path / "log")
    assert not state_files(tmp_path / "old", "iddelta")

    new = run_cli("new")
    assert new.returncode == 0, new.stderr[-2000:]
    assert read_counts(tmp_path / "new.sqlite") == distinct_counts(tmp_path / "log")
    assert state_files(tmp_path / "new", "iddelta") and not state_files(tmp_path / "new", "delta")
    refused = run_cli("new", "--spark-store")
    assert refused.returncode != 0
    assert "started with onceflow's id state store" in refused.stderr + refused.stdout


def test_the_environment_turns_the_default_off_or_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from onceflow.errors import ConfigError

    for value, on in (("", True), ("1", True), ("true", True), ("0", False), ("off", False)):
        monkeypatch.setenv(idstore.ENV, value)
        assert idstore.enabled_by_env() is on, value
    monkeypatch.setenv(idstore.ENV, "maybe")
    with pytest.raises(ConfigError, match="use 1"):
        idstore.enabled_by_env()


def test_the_installed_package_carries_the_jars_built(tmp_path: Path) -> None:
    """``pip install`` compiled the jars (setup.py): a session needs no compile and no cache."""
    from onceflow.runtime import scalac

    env = dict(os.environ, ONCEFLOW_CACHE_DIR=str(tmp_path / "cache"))
    code = "from onceflow.runtime import scalac; print(','.join(map(str, scalac.shipped_jars())))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    jars = [Path(p) for p in done.stdout.strip().split(",")]
    assert [p.parent for p in jars] == [scalac.SHIPPED_DIR] * len(scalac.SHIPPED), jars
    assert all(p.stat().st_size > 1000 for p in jars)
    assert not (tmp_path / "cache").exists()


@pytest.mark.long  # make test's 30 minutes (2026-11-28)
def test_drivers_starting_together_each_get_the_jar(tmp_path: Path) -> None:
    """Three processes build into an empty cache at once (verify starts standby drivers together)."""
    env = dict(os.environ, ONCEFLOW_CACHE_DIR=str(tmp_path / "cache"))
    code = ("from pathlib import Path; from onceflow.runtime import idstore, scalac; "
            "scalac.SHIPPED_DIR = Path('/nonexistent'); print(idstore.build())")  # not the wheel's jar
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(3)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-1000:] for _, err in outs]
    jars = {out.strip() for out, _ in outs}
    assert len(jars) == 1 and Path(jars.pop()).is_file()
    assert [p.name for p in (tmp_path / "cache" / "jvm").iterdir()] == [Path(outs[0][0].strip()).name]


def _key_row(jvm: Any, text: str) -> Any:
    """An UnsafeRow of one string field (Spark's layout: null bits, offset and size, the bytes)."""
    import struct

    data = text.encode()
    padded = data + bytes((len(data) + 7) // 8 * 8 - len(data))
    return _row(jvm, bytes(8) + struct.pack("<q", (16 << 32) | len(data)) + padded)


def _row(jvm: Any, data: bytes) -> Any:
    row = jvm.org.apache.spark.sql.catalyst.expressions.UnsafeRow(1)
    row.pointTo(bytearray(data), len(data))
    return row


def test_a_row_of_the_iterator_never_reads_moved_ids(spark: Any, tmp_path: Path) -> None:
    """The ids live outside the heap: a row pointing at them is refused once they moved, never read.

    Spark's own calls on the store (py4j): an iterator's key row, then enough new ids to outgrow
    the table's key memory, then that row used again; and the table rebuilt from its files.
    """
    import struct

    from py4j.protocol import Py4JJavaError

    jvm = spark._jvm
    state = jvm.org.apache.spark.sql.execution.streaming.state
    types = jvm.org.apache.spark.sql.types.DataType
    keys = types.fromJson(json.dumps({"type": "struct", "fields": [
        {"name": "event_id", "type": "string", "nullable": True, "metadata": {}}]}))
    values = types.fromJson(json.dumps({"type": "struct", "fields": [
        {"name": "expiresAtMicros", "type": "long", "nullable": False, "metadata": {}}]}))
    none = jvm.scala.Option.empty()

    def provider() -> Any:
        p = jvm.org.apache.spark.sql.onceflow.IdStateStoreProvider()
        no_options = getattr(getattr(jvm.scala.collection.immutable, "Map$"), "MODULE$").empty()
        conf = state.StateStoreConf(spark._jsparkSession.sessionState().conf(), no_options)
        p.init(state.StateStoreId(str(tmp_path / "state"), 0, 0, "default"), keys, values,
               state.NoPrefixKeyStateEncoderSpec(keys), False, conf, spark._jsc.hadoopConfiguration(),
               False, none)
        return p

    def expiry(micros: int) -> Any:
        return _row(jvm, bytes(8) + struct.pack("<q", micros))

    p = provider()
    store = p.getStore(0, none, False, False)
    for i in range(3):
        store.put(_key_row(jvm, f"a{i}"), expiry(100 + i), "default")
    assert store.commit() == 1
    store = p.getStore(1, none, False, False)
    it = store.iterator("default")
    first = it.next().key()
    assert first.getString(0) == "a0" and store.get(first, "default").getLong(0) == 100
    store.remove(first, "default")
    assert store.get(first, "default") is None
    long_ids = ["b" * 1000 + str(i) for i in range(400)]  # 400 KB of ids: the key memory (256 KB) grows
    for k in long_ids:
        store.put(_key_row(jvm, k), expiry(200), "default")
    with pytest.raises(Py4JJavaError) as err:
        store.get(first, "default")
    assert "an iterator's row used after the table changed" in str(err.value.java_exception.getMessage())
    with pytest.raises(Py4JJavaError, match="changed under an iterator"):
        it.hasNext()
    assert store.commit() == 2
    reloaded = provider().getStore(2, none, False, False)  # a new provider: rebuilt from the files
    asked = ["a0", "a1", "a2", "zz", *long_ids]
    found = {k for k in asked if reloaded.get(_key_row(jvm, k), "default") is not None}
    assert found == {"a1", "a2", *long_ids}
    assert reloaded.metrics().numKeys() == 402


def _ids_file(files: Path, k: int) -> list[str]:
    """File k of the test below: 40,000 new ids with copies; its ids."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    base_us = 1_700_000_000_000_000
    ids = [f"k{k}-{i}" for i in range(40_000)]
    rows = []
    for i, id_ in enumerate(ids):
        rows.append((id_, base_us + k * 600_000_000 + i * 1_000))  # file k: 10 minutes after k-1
        for back, every in ((3, 7), (9_000, 11), (35_000, 13)):
            if i >= back and i % every == 0:
                rows.append((ids[i - back], base_us + k * 600_000_000 + (i - back) * 1_000))
        if k and i % 5 == 0:  # a copy of the previous file's id i (not late: within the watermark)
            rows.append((f"k{k - 1}-{i}", base_us + (k - 1) * 600_000_000 + i * 1_000))
    times = pa.array([r[1] for r in rows], pa.timestamp("us", tz="UTC"))
    pq.write_table(pa.table({"event_id": [r[0] for r in rows], "user": ["u"] * len(rows), "event_time": times,
                             "system_time": times, "bytes": pa.array([1] * len(rows), pa.int64())}),
                   files / f"part-{k}.parquet")
    os.utime(files / f"part-{k}.parquet", (1_700_000_000 + k, 1_700_000_000 + k))
    return ids


def _drain_ids(spark: Any, files: Path, checkpoint: Path) -> tuple[dict[int, list[str]], Any]:
    """Everything in ``files`` through ``deduplicate`` on the id store: each batch's ids, and the query."""
    spark.conf.set(idstore.PROVIDER_KEY, idstore.PROVIDER_CLASS)
    try:
        stream = (spark.readStream.schema(EVENT_DDL).option("maxFilesPerTrigger", 1).parquet(str(files))
                  .select("event_id", "event_time"))
        events = onceflow.deduplicate(stream, id="event_id", event_time="event_time", within="2 minutes")
        got: dict[int, list[str]] = {}

        def batch(df: Any, batch_id: int) -> None:
            ids = sorted(df.select("event_id").toArrow().column(0).to_pylist())
            if ids:
                got[batch_id] = ids

        query = (events.writeStream.foreachBatch(batch).option("checkpointLocation", str(checkpoint))
                 .trigger(availableNow=True).start())
        query.awaitTermination()
    finally:
        spark.conf.set(idstore.PROVIDER_KEY, HDFS)
    return got, query


def test_ids_pending_flushed_compacted_and_rebuilt_are_all_found(spark: Any, tmp_path: Path) -> None:
    """Lookups through the table's filter and its pending entries find every id it holds.

    Four batches of 40,000 new ids each (about 20,000 per partition a batch: past the 16,384
    entries kept pending before they go into the index, and past two index growths), each with
    copies of ids 3, 9,000 and 35,000 rows back in the same file (pending, or indexed by then)
    and, from the second file on, of ids of the file before (the table's older entries; from
    the third, after an eviction compacted the table and rebuilt its filter). Then the checkpoint
    is copied to a new path (no table in memory: rebuilt from its files, ~20,000 ids a partition)
    and a fifth file with copies of the fourth's ids is read. The expected rows come from a set
    of the ids seen so far, not from any state store.
    """
    files, seen = tmp_path / "in", set()
    files.mkdir()
    expected = {}
    for k in range(4):
        ids = _ids_file(files, k)
        expected[k] = sorted(set(ids) - seen)
        seen |= set(ids)
    got, query = _drain_ids(spark, files, tmp_path / "ck")
    assert sorted(got) == [0, 1, 2, 3]
    for k in range(4):
        same_sorted(got[k], expected[k], f"batch {k}")
        assert len(got[k]) == 40_000, f"batch {k}"
    evicted = [p["stateOperators"][0]["numRowsRemoved"] for p in query.recentProgress]
    assert sum(evicted) >= 40_000, "no eviction compacted the table: the test lost its third part"
    shutil.copytree(tmp_path / "ck", tmp_path / "copy")
    fifth = sorted(_ids_file(files, 4))
    got, _ = _drain_ids(spark, files, tmp_path / "copy")
    assert len(got) == 1
    same_sorted(next(iter(got.values())), fifth, "the batch on the copied checkpoint")


def test_a_truncated_delta_file_is_named_with_its_remedy(spark: Any, log: Path, tmp_path: Path) -> None:
    """A delta file cut short (a damaged disk): the rebuild names the file, not a bare buffer underflow."""
    part = tmp_path / "log"
    part.mkdir()
    segments = sorted(log.glob("*.parquet"), key=lambda p: p.stat().st_mtime)
    for seg in segments[:3]:
        shutil.copy2(seg, part / seg.name)
    run(spark, idstore.PROVIDER_CLASS, part, tmp_path / "ck")
    deltas = [p for p in state_files(tmp_path / "ck", "iddelta") if p.stat().st_size > 64]
    victim = max(deltas, key=lambda p: int(p.name.split(".")[0]))
    victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    shutil.copytree(tmp_path / "ck", tmp_path / "copy")  # a new path: the table is rebuilt from the files
    shutil.copy2(segments[3], part / segments[3].name)
    with pytest.raises(Exception) as err:
        run(spark, idstore.PROVIDER_CLASS, part, tmp_path / "copy")
    text = str(err.value)
    assert victim.name in text and "is truncated or damaged (BufferUnderflowException)" in text, text[-3000:]
    assert "bring the checkpoint's state directory back from a backup" in text


def test_one_source_text_serves_each_spark_version() -> None:
    """Lines tagged ``// spark>=X.Y`` / ``// spark<X.Y`` are compiled only where they belong (blank
    elsewhere, so the compiler's line numbers hold); the id store's source carries both of 4.1's and
    4.2+'s ``getStore`` (make test-long compiles and runs it on PySpark 4.1 and 4.2:
    scripts/spark_versions.sh)."""
    from onceflow.runtime import scalac

    text = "a\nnew() // spark>=4.3\nold() // spark<4.3\nb\n"
    assert scalac.for_spark(text, "4.3.0") == "a\nnew() // spark>=4.3\n\nb\n"
    assert scalac.for_spark(text, "4.2.1") == "a\n\nold() // spark<4.3\nb\n"
    assert scalac.for_spark(text, "4.10.0") == "a\nnew() // spark>=4.3\n\nb\n"  # compared as numbers
    provider = (Path(idstore.__file__).parent / "jvm" / "IdStateStoreProvider.scala").read_text()
    for version in ("4.1.4", "4.2.1", "4.3.0"):
        code = scalac.for_spark(provider, version)
        assert code.count("override def getStore(") == 1, version
        assert len(code.splitlines()) == len(provider.splitlines())

"""Fast start: the class-data archive is trained, published and really mapped by the JVM; workers compiled."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from onceflow.jvmstart import (
    DAEMON_MODULE,
    JAVA_OPTIONS_ENV,
    QUICK_JIT,
    dump_options,
    publish,
    use_options,
    without_pyspark_zip,
)
from onceflow.verify.driver import fast_start_archive

_PROBE = """
import sys
from pathlib import Path
from onceflow.spark import session
s = session()
pid = s.sparkContext._gateway.proc.pid
maps = Path(f"/proc/{pid}/maps").read_text()
args = Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\\0")
print("MAPPED" if sys.argv[1] in maps else "NOT-MAPPED")
print("C1" if "-XX:TieredStopAtLevel=1" in args else "TIERED")
s.range(10).count()
s.stop()
"""


def _probe(archive: Path, options: str | None) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k != JAVA_OPTIONS_ENV}
    if options is not None:
        env[JAVA_OPTIONS_ENV] = options
    out = subprocess.run([sys.executable, "-c", _PROBE, str(archive)], capture_output=True,
                         text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_use_options_without_archive_is_only_the_quick_jit(tmp_path: Path) -> None:
    assert use_options(None) == QUICK_JIT
    assert use_options(tmp_path / "missing.jsa") == QUICK_JIT
    assert f"-XX:ArchiveClassesAtExit={tmp_path / 'x'}" in dump_options(tmp_path / "x")


def test_publish_refuses_a_missing_or_empty_dump(tmp_path: Path) -> None:
    target = tmp_path / "cache" / "a.jsa"
    assert not publish(tmp_path / "never-written", target)
    empty = tmp_path / "empty.tmp"
    empty.write_bytes(b"")
    assert not publish(empty, target)
    assert not empty.exists() and not target.exists()


def test_trained_archive_is_mapped_by_the_driver_jvm(tmp_path: Path) -> None:
    archive = fast_start_archive(tmp_path / "training")
    assert archive is not None and archive.stat().st_size > 10_000_000
    assert _probe(archive, use_options(archive)) == ["MAPPED", "C1"]
    assert _probe(archive, None) == ["NOT-MAPPED", "TIERED"]


def test_only_the_installed_pysparks_own_zip_leaves_the_path(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"
    (site / "pyspark" / "python" / "lib").mkdir(parents=True)
    (site / "pyspark" / "__init__.py").write_text("")
    own = str(site / "pyspark" / "python" / "lib" / "pyspark.zip")
    other = str(tmp_path / "spark-home" / "python" / "lib" / "pyspark.zip")
    py4j = str(site / "pyspark" / "python" / "lib" / "py4j-0.10.9.9-src.zip")
    assert without_pyspark_zip([own, py4j, str(site)]) == [py4j, str(site)]
    assert without_pyspark_zip([other, py4j, str(site)]) == [other, py4j, str(site)]
    assert without_pyspark_zip([own, py4j]) == [own, py4j]  # the installed package not on the path


def test_a_local_sessions_python_workers_import_compiled_pyspark(spark: Any) -> None:
    import pyarrow as pa

    def where(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyspark.worker

        for _ in batches:
            pass
        zipped = any(p.endswith("pyspark.zip") for p in sys.path)
        yield pa.RecordBatch.from_pydict({"zip": [zipped], "worker": [pyspark.worker.__file__]})

    assert spark.conf.get("spark.python.daemon.module") == DAEMON_MODULE
    found = spark.range(4).repartition(2).mapInArrow(where, "zip boolean, worker string").collect()
    assert found and all(not r.zip for r in found)
    assert all(".zip" not in r.worker and Path(r.worker).is_file() for r in found)

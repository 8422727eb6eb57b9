"""Fast start: the class-data archive is trained, published and really mapped by the JVM; PySpark
imported from its package where Spark put its zip first.

Spark starts its Python processes (``spark-submit``'s driver, executors' workers, a Spark Connect
server's ``foreachBatch`` worker) with the installed PySpark's own ``pyspark.zip`` first on
``PYTHONPATH``; the ``onceflow-pyspark.pth`` the install puts in site-packages moves it (and py4j's
zip) behind the package. Those tests start a real Python with such a path and ask it where
``pyspark`` and ``py4j`` came from. Spark's own processes: ``tests/core/test_serverside.py`` (a
driver's and an executor's Python worker) and ``tests/core/test_connect.py`` (the server's
``foreachBatch`` worker).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from onceflow.runtime.jvmstart import JAVA_OPTIONS_ENV, QUICK_JIT, dump_options, publish, use_options
from onceflow.verify.driver import fast_start_archive

ROOT = Path(__file__).resolve().parents[2]
PTH = "onceflow-pyspark.pth"
SITE = Path(sysconfig.get_paths()["purelib"])
LIB = SITE / "pyspark" / "python" / "lib"
ASK = "import pyspark, py4j; print(pyspark.__file__); print(py4j.__file__)"

_PROBE = """
import sys
from pathlib import Path
from onceflow.runtime.session import session
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


@pytest.mark.jvm
def test_a_process_that_waits_for_the_training_uses_the_archive_it_published(tmp_path: Path) -> None:
    # test workers or verifies started together train the archive once: a second caller waits on
    # the lock beside the archive, then returns what the first published without training again
    import fcntl

    cache = tmp_path / "cache"
    env = {**os.environ, "ONCEFLOW_CACHE_DIR": str(cache)}
    ask = ("import sys; from pathlib import Path; from onceflow.verify.driver import fast_start_archive; "
           "print('GOT', fast_start_archive(Path(sys.argv[1]), lambda m: print('SAID', m)))")
    where = subprocess.run([sys.executable, "-c", "from onceflow.runtime.jvmstart import archive_path; "
                            "print(archive_path())"], env=env, capture_output=True, text=True, check=True)
    archive = Path(where.stdout.strip())
    archive.parent.mkdir(parents=True)
    with open(archive.parent / f".{archive.name}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # "another process" trains
        waiting = subprocess.Popen([sys.executable, "-c", ask, str(tmp_path / "scratch")], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        with pytest.raises(subprocess.TimeoutExpired):
            waiting.wait(timeout=3)  # it waits while the lock is held
        archive.write_bytes(b"published")
    out, _ = waiting.communicate(timeout=60)
    assert f"GOT {archive}" in out and "SAID" not in out, out  # no training of its own
    assert not (tmp_path / "scratch").exists()


def test_trained_archive_is_mapped_by_the_driver_jvm(tmp_path: Path) -> None:
    archive = fast_start_archive(tmp_path / "training")
    assert archive is not None and archive.stat().st_size > 10_000_000
    assert _probe(archive, use_options(archive)) == ["MAPPED", "C1"]
    assert _probe(archive, None) == ["NOT-MAPPED", "TIERED"]


def _py4j_zip() -> Path:
    return next(LIB.glob("py4j-*-src.zip"))


def _imported(path: list[Path], *flags: str, code: str = ASK) -> list[str]:
    """Where a fresh Python with ``path`` as its ``PYTHONPATH`` imports pyspark and py4j from."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, path)), "SPARK_HOME": str(SITE / "pyspark")}
    done = subprocess.run([sys.executable, *flags, "-c", code], env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


def test_the_install_puts_the_start_up_line_in_site_packages() -> None:
    line = (SITE / PTH).read_text()
    assert line.startswith("import ") and line.count("\n") == 1  # site.py runs a line that starts so
    assert "__import__('onceflow')" in line


def test_a_python_with_sparks_zips_first_imports_the_installed_pyspark() -> None:
    zips = [LIB / "pyspark.zip", _py4j_zip()]
    assert _imported(zips) == [str(SITE / "pyspark" / "__init__.py"), str(SITE / "py4j" / "__init__.py")]
    # without site.py's start-up lines (-S; site-packages put back by hand) the zips win: what
    # Spark's processes did before the line
    back = f"import sys; sys.path.append({str(SITE)!r}); " + ASK
    assert _imported(zips, "-S", code=back) == [str(LIB / "pyspark.zip" / "pyspark" / "__init__.py"),
                                                 str(_py4j_zip() / "py4j" / "__init__.py")]


def test_a_zip_of_another_spark_install_stays_first(tmp_path: Path) -> None:
    other = tmp_path / "spark" / "python" / "lib"
    other.mkdir(parents=True)
    shutil.copy(LIB / "pyspark.zip", other / "pyspark.zip")
    pyspark_from, py4j_from = _imported([other / "pyspark.zip", _py4j_zip()])
    assert pyspark_from == str(other / "pyspark.zip" / "pyspark" / "__init__.py")  # not the package's own
    assert py4j_from == str(SITE / "py4j" / "__init__.py")  # the installed py4j's own zip still moves


def test_the_wheel_carries_the_start_up_line(tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(ROOT / "src", src, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info", "*.jar"))
    for name in ("setup.py", "pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tmp_path / name)
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(tmp_path)],
                          env={**os.environ, "ONCEFLOW_BUILD_JARS": "0"}, capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    with zipfile.ZipFile(next((tmp_path / "dist").glob("onceflow-*.whl"))) as wheel:
        assert wheel.read(PTH) == (SITE / PTH).read_bytes()  # at the wheel's top: site-packages
        record = next(n for n in wheel.namelist() if n.endswith(".dist-info/RECORD"))
        assert any(line.startswith(f"{PTH},") for line in wheel.read(record).decode().splitlines())

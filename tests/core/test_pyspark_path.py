"""The install's start-up line: PySpark imported from its package where Spark put its zip first.

Spark starts its Python processes (``spark-submit``'s driver, executors' workers, a Spark Connect
server's ``foreachBatch`` worker) with the installed PySpark's own ``pyspark.zip`` first on
``PYTHONPATH``; the ``onceflow-pyspark.pth`` the install puts in site-packages moves it (and py4j's
zip) behind the package. Each test starts a real Python with such a path and asks it where
``pyspark`` and ``py4j`` came from. Spark's own processes: ``tests/core/test_serverside.py``
(a driver's and an executor's Python worker) and ``tests/core/test_connect.py`` (the server's
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

ROOT = Path(__file__).resolve().parents[2]
PTH = "onceflow-pyspark.pth"
SITE = Path(sysconfig.get_paths()["purelib"])
LIB = SITE / "pyspark" / "python" / "lib"
ASK = "import pyspark, py4j; print(pyspark.__file__); print(py4j.__file__)"


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

"""onceflow's JVM parts: Scala sources compiled into jars with the Scala compiler PySpark ships.

onceflow's JVM parts (the id state store, :mod:`onceflow.runtime.idstore`; the local checkpoint file
manager, :mod:`onceflow.runtime.session`; the real-time upsert writer, :mod:`onceflow.api.realtime`) are Scala
files shipped as package data in ``jvm/``, compiled against Spark's own jars by
``scala.tools.nsc.Main`` from ``pyspark/jars/scala-compiler-*.jar``. Nothing is downloaded.

The jars of :data:`SHIPPED` are compiled when the wheel is built (``setup.py`` calls
:func:`build_shipped`) into ``jvm/lib/`` of the package, for the build's Spark version: a
session on that version starts without compiling, from a read-only install too, and
``onceflow jars path onceflow`` prints them for ``spark-submit --jars``. On another Spark version
(or for the upsert writer, which needs PostgreSQL's JDBC driver) the jar is compiled on first use
into ``<cache>/jvm/`` (:func:`onceflow.runtime.java.cache_dir`); later sessions reuse it.

Finding a jar (:func:`build`):

1. the jar's name carries a digest of the sources, the extra classpath's file names and the
   Spark version: the shipped jar of that name, else the cached one, is used as it is;
2. otherwise the sources are compiled into a temporary directory (a compile error is raised with
   the compiler's messages; a cache that cannot be written, e.g. read-only, is a
   :class:`~onceflow.errors.ConfigError` too, so callers fall back to Spark's own classes);
3. the classes are zipped into a temporary jar beside the target, which is renamed into place:
   the jar is whole or absent, and drivers started together may each build it.

One source text serves several Spark versions: a line that ends with ``// spark>=X.Y`` is
compiled only for Spark X.Y and later, one that ends with ``// spark<X.Y`` only before it
(:func:`for_spark`) — e.g. an override of a method Spark's trait gained in 4.3.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from onceflow.errors import ConfigError
from onceflow.runtime.java import cache_dir, find_java

JVM_DIR = Path(__file__).parent / "jvm"
"""The shipped Scala sources."""

SHIPPED_DIR = JVM_DIR / "lib"
"""The jars compiled when the wheel was built (empty in a source tree until ``pip install``)."""

SHIPPED: dict[str, tuple[str, ...]] = {
    "onceflow-idstore": ("IdTable.scala", "IdStateStoreProvider.scala"),
    "onceflow-checkpoint": ("LocalCheckpointFileManager.scala",),
}
"""The jars the wheel carries built: name -> its Scala files in ``jvm/``. They need only Spark."""


def sources(name: str) -> tuple[Path, ...]:
    """The Scala files of the shipped jar ``name`` (a key of :data:`SHIPPED`)."""
    return tuple(JVM_DIR / f for f in SHIPPED[name])


def spark_jars() -> Path:
    """PySpark's own jar directory."""
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def _file_name(name: str, sources: Sequence[Path], extra: Sequence[Path]) -> str:
    """The jar's file name: one per source text, extra classpath names and Spark version."""
    version = spark_version()
    text = b"".join(p.read_bytes() for p in sources) + version.encode()
    text += "".join(p.name for p in extra).encode()
    digest = hashlib.sha256(text).hexdigest()[:16]
    return f"{name}-{version}-{digest}.jar"


def jar_path(name: str, sources: Sequence[Path], extra: Sequence[Path] = ()) -> Path:
    """Where the jar built from ``sources`` is cached when it is compiled on first use.

    Args:
        name: The jar's name prefix, e.g. ``onceflow-idstore``.
        sources: The Scala files.
        extra: Jars compiled against besides Spark's (their file names enter the digest).
    """
    return cache_dir() / "jvm" / _file_name(name, sources, extra)


def shipped_path(name: str, sources: Sequence[Path], extra: Sequence[Path] = ()) -> Path:
    """Where the wheel carries the jar of ``sources`` built for this Spark (it may be absent)."""
    return SHIPPED_DIR / _file_name(name, sources, extra)


def shipped_jars() -> list[Path]:
    """The jars of :data:`SHIPPED` for this Spark: the wheel's, else cached or compiled now.

    Raises:
        ConfigError: See :func:`build`.
    """
    return [build(name, sources(name), f"onceflow's {name} jar") for name in SHIPPED]


def build_shipped(out_dir: Path = SHIPPED_DIR) -> list[Path]:
    """Compile the jars of :data:`SHIPPED` into ``out_dir`` for this Spark (the wheel's build step).

    A jar already there for this source text and Spark version is kept; jars of other sources
    or versions are removed, so a wheel carries one jar per name.

    Returns:
        The jars' paths.

    Raises:
        ConfigError: No Scala compiler in PySpark, no Java, or a source that does not compile.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    built = []
    for name in SHIPPED:
        target = out_dir / _file_name(name, sources(name), ())
        if not target.exists():
            _compile(target, name, sources(name), f"onceflow's {name} jar", (), "")
        built.append(target)
    for old in out_dir.glob("onceflow-*.jar"):
        if old not in built:
            old.unlink()
    return built


def build(name: str, sources: Sequence[Path], what: str, extra: Sequence[Path] = (),
          remedy: str = "") -> Path:
    """The jar of ``sources``: the shipped one, the cached one, or compiled now (seconds).

    Args:
        name: The jar's name prefix.
        sources: The Scala files.
        what: What the jar is, for error messages (e.g. ``onceflow's id state store``).
        extra: Jars to compile against besides Spark's.
        remedy: What the user can do instead, appended to an error (e.g. another store).

    Returns:
        The jar's path.

    Raises:
        ConfigError: PySpark ships no Scala compiler, the source does not compile against this
            Spark (the compiler's messages are in the error), or the cache cannot be written.
    """
    for found in (shipped_path(name, sources, extra), jar_path(name, sources, extra)):
        if found.exists():
            return found
    target = jar_path(name, sources, extra)
    try:
        return _compile(target, name, sources, what, extra, remedy)
    except OSError as exc:  # e.g. a read-only cache: the caller falls back, nothing breaks
        raise ConfigError(f"{what} is not shipped built for Spark {spark_version()} and cannot be compiled "
                          f"into {target.parent} ({exc.strerror or exc}): set ONCEFLOW_CACHE_DIR to a "
                          f"writable directory{remedy}") from None


def for_spark(text: str, version: str) -> str:
    """``text`` with the lines marked for other Spark versions blanked (kept as empty lines).

    A line ending with ``// spark>=X.Y`` is kept when ``version`` is X.Y or later; one ending
    with ``// spark<X.Y`` when it is earlier. Blank lines keep the compiler's line numbers.
    """
    import re

    have = tuple(int(x) for x in re.findall(r"\d+", version)[:2])
    lines = []
    for line in text.splitlines():
        tag = re.search(r"//\s*spark(>=|<)(\d+)\.(\d+)\s*$", line)
        if tag is not None:
            bound = (int(tag.group(2)), int(tag.group(3)))
            keep = have >= bound if tag.group(1) == ">=" else have < bound
            line = line if keep else ""
        lines.append(line)
    return "\n".join(lines) + "\n"


def spark_version() -> str:
    """PySpark's version."""
    import pyspark

    return str(pyspark.__version__)


def _compile(target: Path, name: str, sources: Sequence[Path], what: str, extra: Sequence[Path],
             remedy: str) -> Path:
    """Compile ``sources`` into the jar ``target`` (steps 2-3 of the module's docstring)."""
    jars = sorted(spark_jars().glob("*.jar"))
    if not any(j.name.startswith("scala-compiler") for j in jars):
        raise ConfigError(f"{what} is compiled with the Scala compiler PySpark ships, and "
                          f"{spark_jars()} has none{remedy}")
    classpath = os.pathsep.join(str(j) for j in [*jars, *extra])
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        out = Path(tmp) / "classes"
        out.mkdir()
        texts = Path(tmp) / "src"
        texts.mkdir()
        version = spark_version()
        for p in sources:  # the lines of this Spark version only
            (texts / p.name).write_text(for_spark(p.read_text(encoding="utf-8"), version), encoding="utf-8")
        cmd = [find_java(), "-cp", classpath, "scala.tools.nsc.Main", "-classpath", classpath,
               "-nowarn", "-d", str(out), *(str(texts / p.name) for p in sources)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0:
            raise ConfigError(f"{what} does not compile against this Spark ({spark_jars()}){remedy}: "
                              f"{(done.stdout + done.stderr).strip()[-2000:]}")
        staged = Path(tmp) / target.name
        with zipfile.ZipFile(staged, "w", zipfile.ZIP_DEFLATED) as jar:
            jar.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nCreated-By: onceflow\n\n")
            for f in sorted(out.rglob("*.class")):
                jar.write(f, f.relative_to(out).as_posix())
        moving = target.parent / f".{target.name}.{os.getpid()}.tmp"
        shutil.move(str(staged), str(moving))
        os.replace(moving, target)
    return target

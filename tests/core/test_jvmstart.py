"""Fast start: the class-data archive is trained, published and really mapped by the JVM."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from onceflow.jvmstart import JAVA_OPTIONS_ENV, QUICK_JIT, dump_options, publish, use_options
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

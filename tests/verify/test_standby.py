"""Hot standby drivers (verify --fast-start): nothing is touched before the release."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onceflow.runtime.jvmstart import JAVA_OPTIONS_ENV, archive_path, use_options
from onceflow.sources.log import EventLog
from onceflow.verify.driver import Driver, Standby, wait_until
from onceflow.verify.generator import GeneratorConfig, generate_segments
from onceflow.verify.recompute import diff_counts
from onceflow.verify.verdict import read_counts
from tests.helpers import distinct_counts

pytestmark = [pytest.mark.spark, pytest.mark.faults]
FAST = {JAVA_OPTIONS_ENV: use_options(archive_path())}


def _log(path: Path) -> EventLog:
    log = EventLog(path)
    for t in generate_segments(GeneratorConfig(events=3_000, users=7, minutes=3, seed=5,
                                               duplicates=0.1, segment_size=1_000)):
        log.append(t)
    return log


def test_a_standby_touches_nothing_until_released_then_runs_exactly(tmp_path: Path) -> None:
    log = _log(tmp_path / "log")
    ck, db, out, go = tmp_path / "ck", tmp_path / "db.sqlite", tmp_path / "s.out", tmp_path / "s.go"
    made: list[Driver] = []

    def make(tag: str, **kw: object) -> Driver:
        made.append(Driver(log.directory, ck, db, out, env=FAST, **kw))  # type: ignore[arg-type]
        return made[-1]

    sb = Standby(make, tmp_path)
    sb.prestart([("s", {"once": True})])
    d = made[0]
    try:
        wait_until(lambda: "standby: Spark is up" in d.output(), 180, "the standby's Spark session")
        time.sleep(1.0)
        assert d.proc.poll() is None
        assert not ck.exists() and not db.exists()  # neither checkpoint nor sink opened
        assert sb.take("s", [], once=True) is d and go.exists()
        assert d.wait(timeout=300) == 0, d.output()[-2000:]
    finally:
        if d.proc.poll() is None:
            d.kill()
    users, glob = read_counts(db)
    exp_users, exp_glob = distinct_counts(log.directory)
    assert diff_counts(exp_users, users).exact  # type: ignore[arg-type]
    assert glob == exp_glob and sum(glob.values()) == 3_000


@pytest.mark.long  # make test is near its 30 minutes (29:24 measured)
def test_standby_queue_releases_a_matching_spec_and_kills_the_rest(tmp_path: Path) -> None:
    log = _log(tmp_path / "log")
    made: list[Driver] = []

    def make(tag: str, **kw: object) -> Driver:
        d = Driver(log.directory, tmp_path / "ck", tmp_path / "db.sqlite", tmp_path / f"{tag}.out",
                   env=FAST, **kw)  # type: ignore[arg-type]
        made.append(d)
        return d

    sb = Standby(make, tmp_path)
    first = sb.take("a", [("b", {"once": True})], once=True)
    assert len(made) == 2 and first is made[0]
    assert first.wait(timeout=300) == 0, first.output()[-2000:]
    # a spec that does not match the queued standby kills it and starts the driver normally
    other = sb.take("x", [], once=True, max_files=1)
    assert other is made[2] and not made[1].group_alive()
    assert made[1].proc.returncode == -signal.SIGKILL and not (tmp_path / "b.go").exists()
    assert other.wait(timeout=300) == 0
    sb.close()


def test_a_standby_exits_when_its_starter_dies(tmp_path: Path) -> None:
    log = _log(tmp_path / "log")
    starter = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from onceflow.verify.driver import Driver\n"
        "d = Driver(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]),"
        " once=True, standby=Path(sys.argv[5]))\n"
        "print(d.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    out = tmp_path / "s.out"
    p = subprocess.Popen([sys.executable, "-c", starter, str(log.directory), str(tmp_path / "ck"),
                          str(tmp_path / "db.sqlite"), str(out), str(tmp_path / "never.go")],
                         stdout=subprocess.PIPE, text=True, env={**os.environ, **FAST})
    assert p.stdout is not None
    pid = int(p.stdout.readline())
    wait_until(lambda: "standby: Spark is up" in out.read_text(), 180, "the standby's Spark session")
    os.kill(p.pid, signal.SIGKILL)
    p.wait()

    def gone() -> bool:
        try:
            os.killpg(pid, 0)
            return False
        except ProcessLookupError:
            return True

    wait_until(gone, 60, "the orphaned standby's process group to exit")
    assert "released by nobody" in out.read_text()
    assert not (tmp_path / "ck").exists()

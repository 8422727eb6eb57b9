"""Resuming a verify run (``onceflow verify --resume``): a soak may outlive one machine session.

Resume contract:

1. Before its first round and after every round, the run writes ``state.json`` in its work
   directory (atomically: temp file, fsync, rename): the configuration, the rounds done with
   their records, the input rows fed, the active seconds so far, the RNG state and the
   PostgreSQL schema of the sink, if any. A round that was cut off is not in it.
2. Every process the run starts (drivers, receiver, senders) appends its process-group id
   to ``pids`` — the run after starting it, and the process itself first thing (through
   ``ONCEFLOW_PROCESS_REGISTRY``), so a run killed between the two leaves no unlisted
   process behind. On resume, each listed group whose leader is still an onceflow process (or
   has exited, leaving members such as its JVM behind) is SIGKILLed first — nothing of the old
   run may keep writing — and the list is cleared.
3. The input is regenerated from the seed (it is deterministic) and the run continues with
   the first round not in the state. Segments of the cut-off round that already reached the
   log are not appended again (the log's segment count says how many; with ``--ingest`` the
   round's sender resumes from its own outbox instead). The checkpoint, the sink and the log
   are kept as they are: the resumed pipeline restarts from its checkpoint, one more restart
   for the auditor to check.
4. A cut-off round whose segments had all reached the log has nothing left to feed, and
   whatever its driver had processed is committed: a fault that waits for a new batch would
   wait forever. That round is recorded as ``verify_kill`` (verify and the round's driver
   were SIGKILLed — a fault in its own right) and its pipeline restarts with ``--once`` to
   drain; the scheduled fault moves to the next round.
5. Resuming requires the same configuration (seed, rounds, faults, sink, sizes); a mismatch is
   a usage error, as is a work directory without state.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

from onceflow.errors import ConfigError

STATE = "state.json"
PIDS = "pids"
SAME = ("rounds", "faults", "seed", "sink", "cluster", "ingest", "events_per_round", "segment_size")
"""Configuration fields a resumed run must share with the original."""


def save_state(work: Path, state: dict[str, Any]) -> None:
    """Step 1: write ``state.json`` atomically."""
    tmp = work / f".{STATE}.tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    tmp.replace(work / STATE)


def load_state(work: Path, config: dict[str, Any]) -> dict[str, Any]:
    """Step 5: read the state and check the configuration matches.

    Args:
        work: The verify work directory.
        config: The new run's configuration (``asdict`` of its ``VerifyConfig``).

    Returns:
        The saved state.

    Raises:
        ConfigError: No state, or a different configuration.
    """
    path = work / STATE
    if not path.exists():
        raise ConfigError(f"nothing to resume: {path} does not exist (run without --resume first)")
    state: dict[str, Any] = json.loads(path.read_text())
    old = state["config"]
    diff = [k for k in SAME if old.get(k) != config.get(k)]
    if diff:
        raise ConfigError("--resume needs the configuration of the run it continues; these differ: "
                          + ", ".join(f"{k} (was {old.get(k)!r}, now {config.get(k)!r})" for k in diff))
    return state


REGISTRY_ENV = "ONCEFLOW_PROCESS_REGISTRY"
"""Set for the processes a run starts: the file each appends its own process group to."""


def register(work: Path, pid: int) -> None:
    """Step 2: remember a process group the run started (by the run, after starting it)."""
    with open(work / PIDS, "a") as f:
        f.write(f"{pid}\n")


def register_self() -> None:
    """Step 2, by the started process itself, first thing.

    A run killed between starting a process and its own :func:`register` would otherwise
    leave that process unlisted, running on unseen.
    """
    path = os.environ.get(REGISTRY_ENV)
    if path:
        with open(path, "a") as f:
            f.write(f"{os.getpgrp()}\n")


def kill_stale(work: Path) -> int:
    """Step 2: SIGKILL the process groups of the previous run that are still alive.

    Returns:
        How many were killed.
    """
    path = work / PIDS
    if not path.exists():
        return 0
    killed = 0
    for line in path.read_text().split():
        pid = int(line)
        try:
            cmdline: bytes | None = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (FileNotFoundError, ProcessLookupError):
            # The leader is gone; members of its group (a JVM) may live on. The number cannot
            # belong to another group while any member is alive, so killing it is safe.
            cmdline = None
        except PermissionError:
            continue
        if cmdline is not None and b"onceflow" not in cmdline:
            continue  # the pid was reused by something else
        try:
            os.killpg(pid, signal.SIGKILL)
            killed += 1
        except ProcessLookupError:
            pass
    path.write_text("")
    return killed


def rng_state(state: Any) -> Any:
    """A ``random.Random`` state from its JSON form (lists back to tuples)."""
    version, internal, gauss = state
    return (version, tuple(internal), gauss)

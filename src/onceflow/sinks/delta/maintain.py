"""Compaction and vacuum of onceflow's Delta tables, while the query writes them.

A Delta sink commits one or more small Parquet files per table and batch; readers slow down as
the files pile up. :func:`maintain` (``onceflow maintain --delta ROOT``, or the sink's
``maintain_every=N``, which runs it in the driver after every N-th batch's commit) compacts and
vacuums each table. Steps, per table:

1. **Read the markers**: the table's app transactions (``transaction_version`` of every
   ``onceflow:<sink_id>`` that committed to it, from its commits' ``onceflow`` metadata).
2. **Compact** (delta-rs ``optimize.compact``): small files rewritten into files of about
   ``target_size``, in one commit that changes no row (``dataChange=false``). A sink's commit
   racing it is decided as any concurrent commit is: a blind append goes through; a merge that
   read a file the compaction removed is refused and decided again from a fresh snapshot
   (:mod:`onceflow.sinks.delta.files`, step 3). Compaction refused by a racing commit is tried
   again (``RETRIES`` times) on a fresh snapshot.
3. **Vacuum** (delta-rs ``vacuum``, not ``full``): the files that versions older than
   ``retention`` removed (what compaction and merges replaced) are deleted. Never a file of the
   log, never a file no commit ever named — so never the files a running batch's tasks wrote
   before the driver's commit adds them. A reader (or a merge) holding a snapshot older than the
   retention may find a file gone: it fails and, in onceflow's sink, the batch runs again — keep
   the retention above the longest batch (Delta's own default, 7 days, unless the table says
   otherwise). ``orphans=True`` also deletes files no commit names that are older than
   ``max(retention, ORPHAN_MIN_AGE)`` (what a killed attempt left): a full vacuum, which would
   delete a running batch's files were they that old.
4. **Check the markers**: every app transaction of step 1 is still there, at the same or a
   later batch (a sink's commit may have come in between) — else :class:`OnceflowError`. The
   replay decision (step 2 of the sink's protocol) reads exactly these. Compaction and vacuum
   write no log entry away: the batches' metrics stay in the commits' metadata (Delta removes
   log entries older than ``delta.logRetentionDuration``, 30 days by default, at checkpoints,
   whoever writes).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from onceflow.errors import ConfigError, OnceflowError
from onceflow.sinks.delta._log import require, writers

_log = logging.getLogger("onceflow.delta")

RETRIES = 5
"""Compactions tried per table when a concurrent commit wins."""
ORPHAN_MIN_AGE_H = 24
"""Hours a file no commit names must have existed before ``orphans=True`` deletes it."""
DEFAULT_RETENTION_H = 7 * 24
"""Delta's own default retention of removed files (``delta.deletedFileRetentionDuration``)."""


@dataclass
class Maintained:
    """What :func:`maintain` did to one table.

    Attributes:
        table: The table's directory name.
        files_before: Data files of the table's current version before.
        files_after: Data files after.
        compacted: Files compaction rewrote (0: nothing small enough, or ``compact=False``).
        vacuumed: Files vacuum deleted.
        markers: App id -> last batch, as step 4 checked it.
    """

    table: str
    files_before: int
    files_after: int
    compacted: int
    vacuumed: int
    markers: dict[str, int]


def tables_under(root: Path) -> list[str]:
    """The Delta tables directly under ``root`` (its ``_onceflow`` folder is not one)."""
    if not root.is_dir():
        return []
    return sorted(p.name for p in root.iterdir()
                  if (p / "_delta_log").is_dir() and not p.name.startswith("_"))


def app_transactions(table: Any) -> dict[str, int]:
    """Step 1: ``app id -> last batch`` of every onceflow sink that committed to ``table``."""
    found = {f"onceflow:{s}": table.transaction_version(f"onceflow:{s}") for s in sorted(writers(table))}
    return {app: int(v) for app, v in found.items() if v is not None}


def maintain(root: str | Path, tables: list[str] | None = None, *, compact: bool = True, vacuum: bool = True,
             retention_hours: float = DEFAULT_RETENTION_H, target_size: int | None = None,
             orphans: bool = False) -> list[Maintained]:
    """Compact and vacuum onceflow's Delta tables under ``root`` (steps in the module docstring).

    Args:
        root: The sink's root directory (``onceflow.delta(root)``).
        tables: The tables to maintain (default: every Delta table under ``root``).
        compact: Rewrite small files into larger ones.
        vacuum: Delete files older versions removed, older than ``retention_hours``.
        retention_hours: How long a removed file is kept (readers of older snapshots need it).
        target_size: Compacted files' size in bytes (delta-rs's default: the table's
            ``delta.targetFileSize``, else 100 MiB).
        orphans: Also delete files no commit names, older than ``max(retention_hours,
            ORPHAN_MIN_AGE_H)``.

    Returns:
        One :class:`Maintained` per table.

    Raises:
        ConfigError: deltalake is missing, a table is not under ``root``, or a negative retention.
        OnceflowError: A marker went backwards (step 4), or compaction kept losing to concurrent commits.
    """
    dl = require()
    where = Path(root)
    names = tables_under(where) if tables is None else list(tables)
    missing = [n for n in names if not (where / n / "_delta_log").is_dir()]
    if missing:
        raise ConfigError(f"no Delta table {missing[0]!r} under {where} (tables there: "
                          f"{', '.join(tables_under(where)) or 'none'})")
    if retention_hours < 0:
        raise ConfigError(f"retention must be >= 0 hours, got {retention_hours}")
    return [_one(dl, where / name, compact, vacuum, retention_hours, target_size, orphans) for name in names]


def _one(dl: Any, path: Path, compact: bool, vacuum: bool, retention_h: float, target_size: int | None,
         orphans: bool) -> Maintained:
    table = dl.DeltaTable(str(path))
    before = app_transactions(table)  # 1
    files_before = len(table.file_uris())
    compacted = vacuumed = 0
    if compact:  # 2
        done = _retried(dl, path, "compaction", lambda t: t.optimize.compact(target_size=target_size))
        compacted = int(done.get("numFilesRemoved", 0))
    if vacuum:  # 3
        vacuumed = len(_retried(dl, path, "vacuum", lambda t: t.vacuum(
            retention_hours=int(retention_h), dry_run=False, enforce_retention_duration=False)))
        if orphans:
            older = int(max(retention_h, ORPHAN_MIN_AGE_H))
            vacuumed += len(_retried(dl, path, "vacuum", lambda t: t.vacuum(
                retention_hours=older, dry_run=False, enforce_retention_duration=False, full=True)))
    table = dl.DeltaTable(str(path))
    after = {app: table.transaction_version(app) for app in before}  # 4
    lost = {app: (v, after[app]) for app, v in before.items() if after[app] is None or int(after[app]) < v}
    if lost:
        raise OnceflowError(f"Delta table {path}: maintenance moved app transactions back {lost}; "
                            "the sink would write those batches again — restore the table's log")
    return Maintained(path.name, files_before, len(table.file_uris()), compacted, vacuumed,
                      {app: int(v) for app, v in after.items() if v is not None})


def _retried(dl: Any, path: Path, what: str, step: Any) -> Any:
    """``step(table)`` on a fresh snapshot, again when a concurrent commit refuses its own (``RETRIES``)."""
    for attempt in range(RETRIES):
        try:
            return step(dl.DeltaTable(str(path)))
        except dl.exceptions.CommitFailedError as exc:
            _log.info("%s of %s lost to a concurrent commit (%s); trying again", what, path.name,
                      str(exc).splitlines()[0])
            time.sleep(0.05 * (attempt + 1))
    raise OnceflowError(f"{what} of Delta table {path} lost to concurrent commits {RETRIES} times; run it "
                        "again (a refused attempt changes nothing)")

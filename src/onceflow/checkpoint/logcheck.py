"""Spark's checkpoint logs checked before a query starts: consecutive, readable, complete.

Spark reads its logs lazily and trusts them: a commit file holding garbage stops the query with
Jackson's ``JsonParseException`` naming no file, and a file source's log entry that is gone
(``sources/0/N``) makes Spark take the next files for entry ``N`` again, so the offsets never
move and the new files are never read — ``once=True`` exits 0 with rows unread. Before Spark
starts the query, :func:`check` reads what a restart depends on:

1. ``offsets/`` and ``commits/``: the retained batch ids are consecutive (Spark deletes old ones
   from the low end only), and every retained file has Spark's version line and a JSON object
   on each line after it (``-`` stands for a source without an offset in ``offsets/N``);
2. each file source's log (``sources/<i>/``): every entry from the last compact file up to the
   log offset of the last planned batch exists (as its own file, or within a later compact
   file), and each such file reads as above.

:func:`damage` lists every problem with the file it is in; :class:`onceflow.checkpoint.repair.Repair`
(``onceflow repair``) mends what the sink's markers can restore, and says which file to bring
back from a backup for the rest.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from onceflow.errors import CheckpointReadError

_COMPACT = re.compile(r"^(\d+)\.compact$")


class CheckpointDamagedError(CheckpointReadError):
    """A file of Spark's checkpoint is missing or unreadable; the query was not started."""


@dataclass(frozen=True)
class Damage:
    """One problem of a checkpoint.

    Attributes:
        path: The file that is missing or damaged.
        problem: What is wrong with it.
        source: For a missing file-source log entry: ``(source index, log id)``.
    """

    path: Path
    problem: str
    source: tuple[int, int] | None = None

    def describe(self) -> str:
        """The problem in a line."""
        return f"{self.path}: {self.problem}"


def _unreadable(path: Path, offsets: bool = False) -> str | None:
    """Why a log file cannot be read as Spark writes it, or None."""
    try:
        lines = path.read_text().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        return f"cannot be read ({exc})"
    if not lines or not re.fullmatch(r"v\d+", lines[0].strip()):
        return f"has no version line (it starts {lines[0][:40]!r})" if lines else "is empty"
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip() or offsets and line.strip() == "-":
            continue
        try:
            json.loads(line)
        except ValueError as exc:
            return f"line {n} is not JSON ({exc}): {line[:60]!r}"
    return None


def _ids(directory: Path) -> list[int]:
    return sorted(int(p.name) for p in directory.iterdir() if p.name.isdigit()) if directory.is_dir() else []


def _log_damage(directory: Path, offsets: bool) -> list[Damage]:
    """Step 1 for one log: consecutive ids, each file readable."""
    ids = _ids(directory)
    found = []
    for gap in sorted(set(range(ids[0], ids[-1] + 1)) - set(ids)) if ids else ():
        found.append(Damage(directory / str(gap), f"is missing: {directory.name}/ holds batches {ids[0]}-"
                                                  f"{ids[-1]} but not {gap}"))
    for i in ids:
        why = _unreadable(directory / str(i), offsets)
        if why:
            found.append(Damage(directory / str(i), why))
    return found


def _last_offsets(checkpoint: Path) -> list[str] | None:
    """The source lines of the last readable ``offsets/N`` (None: no such file)."""
    for i in reversed(_ids(checkpoint / "offsets")):
        path = checkpoint / "offsets" / str(i)
        if _unreadable(path, offsets=True) is None:
            return path.read_text().splitlines()[2:]
    return None


def _source_damage(checkpoint: Path) -> list[Damage]:
    """Step 2: each file source's log complete up to the last planned batch's log offset."""
    lines = _last_offsets(checkpoint)
    found: list[Damage] = []
    for source, line in enumerate(lines or []):
        directory = checkpoint / "sources" / str(source)
        try:
            offset = json.loads(line) if line.strip() != "-" else None
        except ValueError:
            continue
        if not directory.is_dir() or not isinstance(offset, dict) or "logOffset" not in offset:
            continue
        last = int(offset["logOffset"])
        compacts = sorted(int(m.group(1)) for p in directory.iterdir() if (m := _COMPACT.match(p.name)))
        below = [c for c in compacts if c <= last]
        first = below[-1] + 1 if below else 0
        if below:
            why = _unreadable(directory / f"{below[-1]}.compact")
            if why:
                found.append(Damage(directory / f"{below[-1]}.compact", why))
        for log_id in range(first, last + 1):
            plain = directory / str(log_id)
            if plain.exists():
                why = _unreadable(plain)
                if why:
                    found.append(Damage(plain, why))
            elif not any(c >= log_id for c in compacts):
                found.append(Damage(plain, f"is missing: the last planned batch read file source {source}'s "
                                           f"log up to entry {last}, and entry {log_id} is gone",
                                    source=(source, log_id)))
    return found


def damage(checkpoint: str | Path) -> list[Damage]:
    """Every problem :func:`check` finds (empty for a sound or a new checkpoint)."""
    root = Path(checkpoint)
    return [*_log_damage(root / "offsets", offsets=True), *_log_damage(root / "commits", offsets=False),
            *_source_damage(root)]


def check(checkpoint: str | Path, repair_command: str) -> None:
    """Refuse to start on a checkpoint with a missing or damaged log file.

    Args:
        checkpoint: Spark's checkpoint directory.
        repair_command: The ``onceflow repair`` command for this query's sink.

    Raises:
        CheckpointDamagedError: Naming every such file, the repair and the backup to restore from.
    """
    found = damage(checkpoint)
    if not found:
        return
    listed = "; ".join(d.describe() for d in found[:5])
    listed += f"; and {len(found) - 5} more" if len(found) > 5 else ""
    raise CheckpointDamagedError(
        f"Spark's checkpoint {checkpoint} is damaged, so the query was not started: {listed}. Spark would "
        f"fail on it or skip input without an error. Run `{repair_command} --dry-run` to see what the "
        "sink's markers can restore (then without --dry-run); a file they cannot restore must come back "
        "from a backup of the checkpoint.")

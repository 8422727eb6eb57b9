"""``onceflow repair``: the checkpoint rewritten so that the sink and it are in step again.

The guard of every start and batch (:mod:`onceflow.checkpoint.guard`) refuses a sink behind or
ahead of Spark's checkpoint; :class:`Repair` (run by ``onceflow repair``, on the machine that sees
the checkpoint, once per repair) rewinds the checkpoint to the sink, or restores the checkpoint's
plan of the sink's batches from their markers, so that the next start writes every missing
batch once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from onceflow.checkpoint import logcheck, ranges
from onceflow.checkpoint import logs as ckpt
from onceflow.checkpoint.guard import RESTORE_FILE, MarkedSink, log_id_of, markers_of, span
from onceflow.checkpoint.ranges import InputRange
from onceflow.errors import OutOfStepError

_VERSION = re.compile(r"^(\d+)(?:_[^.]*)?\.(delta|snapshot|zip|changelog|iddelta|idsnap)$")
"""A state store's version file (HDFS-backed: delta, snapshot; RocksDB: zip, changelog;
onceflow's id store, :mod:`onceflow.runtime.idstore`: iddelta, idsnap)."""



def state_dirs(checkpoint: Path) -> list[Path]:
    """The state store directories of a stateful query (one per operator, partition and store)."""
    root = checkpoint / "state"
    if not root.is_dir():
        return []
    return sorted({p.parent for p in root.rglob("*") if p.is_file() and _VERSION.match(p.name)})


def _state_files_after(checkpoint: Path, version: int) -> list[Path]:
    found = []
    for d in state_dirs(checkpoint):
        for p in d.iterdir():
            m = _VERSION.match(p.name)
            if m and int(m.group(1)) > version:
                found.append(p)
    return sorted(found)


def _has_version(directory: Path, version: int) -> bool:
    return version == 0 or any((m := _VERSION.match(p.name)) and int(m.group(1)) == version
                               for p in directory.iterdir())


@dataclass
class RepairPlan:
    """What :class:`Repair` changes in the checkpoint, or why it cannot.

    Attributes:
        summary: What it found, in a sentence.
        remove: Checkpoint files to delete (Spark's log entries and state versions after the
            point of agreement).
        restore: Batches whose plan is written back from the sink's markers (the first by
            :meth:`Repair.apply`, each next one when Spark ran the one before).
        refused: Why the checkpoint cannot be repaired (None: it can).
        notes: What the user must see to (a source that must still hold some input).
        mend: File-source log entries written back from the sink's markers: ``(source log
            directory, log id, entries)``.
    """

    summary: str
    remove: list[Path] = field(default_factory=list)
    restore: list[InputRange] = field(default_factory=list)
    refused: str | None = None
    notes: list[str] = field(default_factory=list)
    mend: list[tuple[Path, int, list[dict[str, Any]]]] = field(default_factory=list)

    @property
    def changes(self) -> bool:
        """Whether there is anything to change."""
        return bool(self.remove or self.restore or self.mend)


class Repair:
    """Bring Spark's checkpoint back into agreement with the sink, losing nothing (``onceflow repair``).

    :meth:`plan` is steps 0-4 and changes nothing (a dry run prints it); :meth:`apply` is step 5.

    0. **Mend the logs** (:mod:`onceflow.checkpoint.logcheck`): a missing or damaged file-source log entry
       is written back from the sink's marker of the batch that read it (the marker's range
       keeps the entries as Spark wrote them); a damaged last ``commits/N`` is removed (Spark
       runs N again and the sink's marker decides whether it is a replay). Anything else
       damaged is refused naming the file to bring back from a backup. Only this step runs
       while the logs are damaged; run repair again afterwards for steps 1-5.
    1. **Read** the checkpoint's planned batches (``offsets/``), committed batches (``commits/``)
       and state store versions, and the sink's markers with their input ranges.
    2. **Agree on the past.** A batch both committed must have had the same input in both (where
       the checkpoint still has its plan and the marker its range); otherwise refuse: their
       histories diverged, and no rewrite of the checkpoint brings back what either side did.
    3. **Sink behind** (its last batch L < the checkpoint's last committed C): rewind the
       checkpoint to L — remove ``commits/N`` and ``offsets/N`` for N > L and the state versions
       after L+1 (the state after batch L is version L+1). Refuse when the checkpoint no longer
       has ``offsets/L`` or state version L+1 (Spark keeps ``minBatchesToRetain``, 100 by
       default), or when a file of L+1..C is gone; a Kafka topic must still hold the offsets of
       L+1..C, which is said. A file source's log is kept: the next start plans the files of
       L+1..C (and newer ones) as new batches, and the sink writes them once.
       Several sinks (``write_stream(df, {table: sink})``) with one behind the others: rewind
       to its last batch and restore the later batches' plans from the others' markers (step 4),
       so that each sink sees each batch over the same input (:meth:`Repair._several`).
    4. **Sink ahead** (markers after C that are not what the checkpoint planned): remove the
       checkpoint's own plans after C (``offsets/``, a file source's log ids after C's, state
       versions after C+1), and restore the plans of C+1..L from the markers' ranges. Spark
       rebuilds the query's state by running them again (the sink skips each as a replay,
       having checked its range); it runs one restored batch per start and plans the next over
       all the input there is, so the plan of C+1 is written now and each next one by
       :func:`continue_restore` after Spark ran the one before (``onceflow-restore.json`` says
       until which batch). The input after L (e.g. files the wrongly planned batch read) is
       planned anew after L.
    5. **Apply**, in an order that leaves a checkpoint Spark can start from if repair stops
       halfway (run it again to finish): delete commits (newest first), then plans, state
       versions and log entries; then write the first restored batch's log entries and plan.
    """

    def __init__(self, checkpoint: str | Path, sink: MarkedSink) -> None:
        self.checkpoint, self.sink = Path(checkpoint), sink

    def plan(self) -> RepairPlan:  # noqa: C901 - the numbered steps, in order
        """Steps 1-4: what would change, or why it cannot (changes nothing)."""
        root = self.checkpoint
        if ckpt.query_id(root) is None:  # 1
            return RepairPlan("", refused=f"{root} is not a started Spark checkpoint (no metadata file)")
        markers = {int(m["batch_id"]): m for m in markers_of(self.sink)}
        damaged = logcheck.damage(root)
        if damaged:  # 0
            return self._mend(damaged, markers)
        planned, done = ckpt.offset_batches(root), ckpt.committed_batches(root)
        c = done[-1] if done else -1
        last = max(markers, default=-1)
        for b in sorted(markers):  # 2
            if b > c or b not in planned or not markers[b].get("input_range"):
                continue
            kept = InputRange.from_json(b, str(markers[b]["input_range"]))
            now = ranges.read(root, b)
            if not kept.same_input(now):
                return RepairPlan("", refused=(
                    f"batch {b} is committed in both, over different input — sink: {kept.describe()}; "
                    f"checkpoint: {now.describe()}. Their histories diverged before either was restored; "
                    "restore the sink and the checkpoint from backups taken together, or start over with a "
                    "new checkpoint and an empty sink"))
        lasts = self.sink.lasts() if hasattr(self.sink, "lasts") else [last]
        if min(lasts) < min(c, last):  # 3': several sinks, one behind the checkpoint and the others
            return self._several(min(lasts), c, markers, planned)
        if last < c:  # 3
            return self._rewind(last, c, planned)
        ahead = [b for b in sorted(markers) if b > c]
        if not ahead:
            return RepairPlan(f"the sink and the checkpoint agree (last batch {c}): nothing to repair")
        f = c + 1
        if ahead == [f] and planned and planned[-1] == f and _same(markers[f], root, f):
            return RepairPlan(f"the sink and the checkpoint agree: Spark runs batch {f} again at the next "
                              "start and the sink skips it as a replay; nothing to repair")
        return self._restore(c, ahead, markers, planned)  # 4

    def _mend(self, damaged: list[logcheck.Damage], markers: dict[int, dict[str, Any]]) -> RepairPlan:
        """Step 0: what the sink's markers restore of damaged logs, and what must come from a backup."""
        root = self.checkpoint
        listed = "; ".join(d.describe() for d in damaged[:3])
        plan = RepairPlan(f"Spark's checkpoint logs are damaged ({listed}): what the sink's markers keep is "
                          "written back; run onceflow repair again afterwards")
        done = ckpt.committed_batches(root)
        for d in damaged:
            if d.source is not None:
                source, log_id = d.source
                entries = [e for m in markers.values() if m.get("input_range")
                           for e in InputRange.from_json(int(m["batch_id"]), str(m["input_range"])).files.get(
                               source, []) if int(e.get("batchId", -1)) == log_id]
                if entries:
                    plan.mend.append((d.path.parent, log_id, entries))
                    continue
            elif done and d.path == root / "commits" / str(done[-1]) and d.path.exists():
                plan.remove.append(d.path)  # Spark runs the batch again; the sink's marker decides
                continue
            plan.refused = (f"{d.describe()}, and the sink's markers do not keep it: bring the file back "
                            "from a backup of the checkpoint (or start over with a new checkpoint and an "
                            "empty sink)")
            return plan
        return plan

    def _rewind(self, last: int, c: int, planned: list[int]) -> RepairPlan:
        """Step 3: the sink is behind; the checkpoint goes back to its last batch."""
        root = self.checkpoint
        back = last if last >= 0 else "none (the start)"
        plan = RepairPlan(f"the sink lacks {span(last + 1, c)}, which the checkpoint committed: the "
                          f"checkpoint goes back to batch {back}, and the next start "
                          f"writes {span(last + 1, c)} and what came after once")
        if last >= 0 and last not in planned:
            plan.refused = (f"the checkpoint no longer has batch {last}'s plan (offsets/{last}; Spark keeps "
                            "the last spark.sql.streaming.minBatchesToRetain batches): it cannot go back "
                            "that far. Restore the sink from a newer backup, or start over with a new "
                            "checkpoint")
            return plan
        gone = [d for d in state_dirs(root) if not _has_version(d, last + 1)]
        if gone:
            plan.refused = (f"the checkpoint no longer has the query's state after batch {last} (version "
                            f"{last + 1} in {gone[0]}; Spark keeps minBatchesToRetain versions): it cannot "
                            "go back that far. Restore the sink from a newer backup, or start over")
            return plan
        missing, offsets = [], False
        for b in [b for b in planned if b > last]:
            r = ranges.read(root, b)
            missing += [p for es in r.files.values() for e in es if not (p := _local(e)).exists()]
            offsets = offsets or any(i not in r.files for i in range(len(r.end)))
        if missing:
            plan.refused = (f"input of the batches to write again is gone: {missing[0]}"
                            + (f" and {len(missing) - 1} more file(s)" if len(missing) > 1 else "")
                            + "; put the files back, or restore the sink from a newer backup")
            return plan
        if offsets:
            plan.notes.append(f"the source must still hold the input of {span(last + 1, c)} (e.g. a "
                              "Kafka topic's retention): Spark reads it again from the offsets the "
                              "checkpoint keeps")
        plan.remove = ([root / "commits" / str(b) for b in reversed(ckpt.committed_batches(root)) if b > last]
                       + [root / "offsets" / str(b) for b in reversed(planned) if b > last]
                       + _state_files_after(root, last + 1))
        return plan

    def _several(self, low: int, c: int, markers: dict[int, dict[str, Any]],
                 planned: list[int]) -> RepairPlan:
        """Step 3': of several sinks, one is behind (last batch ``low``) the others and the checkpoint.

        A plain rewind would let Spark plan ``low``+1 anew over more input, which the sinks that
        have it would skip: the checkpoint goes back to ``low`` (its commits after it removed) and
        the plans of ``low``+1.. are restored from the other sinks' markers (step 4), so every sink
        sees each batch over the same input — skipped where it is, written where it is not.
        """
        last = max(markers, default=-1)
        plan = self._restore(low, list(range(low + 1, last + 1)), markers, planned)
        back = low if low >= 0 else "none"
        plan.summary = (f"a sink of the query lacks {span(low + 1, max(c, last))}, which the checkpoint or "
                        f"its other sinks have: the checkpoint goes back to batch {back} and the plans of "
                        f"{span(low + 1, last)} are restored from the other sinks' markers; the next start "
                        "writes them into the sink that lacks them (the others skip them)")
        commits = [self.checkpoint / "commits" / str(b) for b in ckpt.committed_batches(self.checkpoint)
                   if b > low]
        plan.remove = [*reversed(commits), *plan.remove]
        return plan

    def _restore(self, c: int, ahead: list[int], markers: dict[int, dict[str, Any]],
                 planned: list[int]) -> RepairPlan:
        """Step 4: the sink is ahead; the checkpoint gets the plans of its batches back."""
        root, last = self.checkpoint, ahead[-1]
        plan = RepairPlan(f"the sink has {span(c + 1, last)}, which the checkpoint lacks or planned over "
                          "other input: their plans are restored from the sink's markers, and the input "
                          "after them is planned anew at the next start")
        if ahead != list(range(c + 1, last + 1)):
            plan.refused = f"the sink's batches after {c} are not consecutive ({ahead}): it was edited"
            return plan
        unknown = [b for b in ahead if not markers[b].get("input_range")]
        if unknown:
            plan.refused = (f"the sink's marker of batch {unknown[0]} has no input range (written by an "
                            "older onceflow): its plan cannot be restored")
            return plan
        gone = [d for d in state_dirs(root) if not _has_version(d, c + 1)]
        conf = ranges.checkpoint_conf(root, planned)
        if gone or conf is None:
            plan.refused = (f"the checkpoint lacks the query's state after batch {c} ({gone[0]})" if gone else
                            "the checkpoint has no plan to take Spark's settings from (offsets/ is empty)")
            return plan
        restored = [InputRange.from_json(b, str(markers[b]["input_range"])) for b in ahead]
        missing = [p for r in restored for es in r.files.values() for e in es
                   if not (p := _local(e)).exists()]
        if missing:
            plan.refused = f"input of batch(es) to run again is gone: {missing[0]}; put the files back"
            return plan
        logs = {}  # file sources: their log ids after batch c's
        if c >= 0:
            for i, line in enumerate(ranges.offsets_lines(root, c)[1]):
                pos = ranges.log_position(line)
                if (d := ranges.source_log(root, i)).is_dir() and pos is not None:
                    logs[d] = pos
        elif (root / "sources").is_dir():
            logs = {d: -1 for d in (root / "sources").iterdir() if d.is_dir()}
        compacted = [p for d, pos in logs.items() for p in d.glob("*.compact")
                     if int(log_id_of(p) or 0) > pos]
        if compacted:
            plan.refused = (f"Spark compacted the file source's log after batch {c} ({compacted[0]}): "
                            "onceflow does not rewrite a compacted log; start over with a new checkpoint")
            return plan
        plan.remove = ([root / "offsets" / str(b) for b in reversed(planned) if b > c]
                       + [p for d, pos in logs.items() for p in sorted(d.iterdir(), reverse=True)
                          if log_id_of(p) is not None and int(log_id_of(p) or 0) > pos]
                       + _state_files_after(root, c + 1))
        plan.restore = restored
        return plan

    def apply(self, plan: RepairPlan) -> list[str]:
        """Step 5: make the changes of ``plan``; what was done, one line each.

        Raises:
            OutOfStepError: The plan refused (nothing is changed).
        """
        if plan.refused:
            raise OutOfStepError(f"cannot repair {self.checkpoint}: {plan.refused}")
        done = []
        planned = ckpt.offset_batches(self.checkpoint)
        conf = ranges.checkpoint_conf(self.checkpoint, planned) or {}  # before plans go
        for p in plan.remove:
            ranges.remove(p)
            done.append(f"removed {p.relative_to(self.checkpoint)}")
        for directory, log_id, entries in plan.mend:
            ranges.write_source_log(directory, log_id, entries)
            done.append(f"restored {directory.relative_to(self.checkpoint)}/{log_id} from the sink's markers "
                        f"({len(entries)} file(s))")
        if plan.restore:  # the first now; each next one when Spark ran the one before (continue_restore)
            first = plan.restore[0]
            ranges.write(self.checkpoint, first, conf)
            done.append(f"restored offsets/{first.batch_id} from the sink's marker ({first.describe()})")
            until = plan.restore[-1].batch_id
            if until > first.batch_id:
                (self.checkpoint / RESTORE_FILE).write_text(json.dumps({"until": until}))
                done.append(f"{span(first.batch_id + 1, until)} follow(s) at the next start, one at a "
                            f"time, from the sink's markers ({RESTORE_FILE})")
        return done


def _same(found: dict[str, Any], root: Path, batch_id: int) -> bool:
    raw = found.get("input_range")
    return not raw or InputRange.from_json(batch_id, str(raw)).same_input(ranges.read(root, batch_id))


def _local(entry: dict[str, Any]) -> Path:
    from urllib.parse import unquote, urlparse

    return Path(unquote(urlparse(str(entry["path"])).path))



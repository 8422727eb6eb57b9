"""The guard of every start and batch: the sink and Spark's checkpoint in step.

A query is exactly once while two records agree: Spark's checkpoint (which batches were planned,
over what input, and committed) and the sink's markers (which batches reached the tables, over
what input: :mod:`onceflow.checkpoint.ranges`). A backup restored on one side only breaks that:

* **The sink is behind** (the database restored from an older backup): the checkpoint committed
  batches the sink lacks. Spark would never run them again: their rows would be lost.
* **The sink is ahead** (the checkpoint restored from an older copy): the sink has batches the
  checkpoint does not, and Spark re-plans them over whatever input is there now. Skipping such a
  batch as a replay would lose the input it did not have before.

:func:`check_start` (step 1 of :class:`onceflow.engine.batch.BatchWriter`, on the driver, once per
process) and :func:`check_replay` (step 5, once per batch whose marker the sink found) refuse both
with :class:`OutOfStepError` before anything is written; ``onceflow repair``
(:mod:`onceflow.checkpoint.repair`) rewrites the checkpoint so that the next start writes every
missing batch once, and :func:`continue_restore` carries a restore on from batch to batch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from onceflow.checkpoint import logs as ckpt
from onceflow.checkpoint import ranges
from onceflow.checkpoint.ranges import InputRange
from onceflow.errors import OutOfStepError


class MarkedSink(Protocol):
    """What the guard and the repair read of a sink (every sink of onceflow's is one).

    :class:`onceflow.sinks._core.base.SinkBase` gives every sink these; several sinks of one
    query (:class:`onceflow.sinks._core.several.SeveralSinks`) have ``parts`` and ``ahead``.
    """

    @property
    def keeps_markers(self) -> bool:
        """Whether the sink keeps markers at all (verify's negative controls keep none)."""
        ...

    @property
    def parts(self) -> Sequence[MarkedSink]:
        """The sinks of a query with several (empty for one sink)."""
        ...

    @property
    def ahead(self) -> int:
        """The last batch any of ``parts`` had when bound (-1: none, or one sink)."""
        ...

    def repair_options(self) -> str:
        """The ``onceflow repair`` options that name this sink."""
        ...

    def batches(self) -> list[dict[str, Any]]:
        """The sink's marker rows."""
        ...

    def recent_batches(self) -> list[dict[str, Any]]:
        """The markers of the last committed batches."""
        ...

    def all_batches(self) -> list[dict[str, Any]]:
        """Every marker, of every batch any of ``parts`` has."""
        ...


RESTORE_FILE = "onceflow-restore.json"
"""In the checkpoint while batches are restored from the sink's markers: ``{"until": L}``."""

def repair_command(checkpoint: Path, sink: MarkedSink) -> str:
    """The ``onceflow repair`` command line for a query's checkpoint and sink (a DSN's secrets left out)."""
    return f"onceflow repair --checkpoint {checkpoint} {sink.repair_options()}"



def span(first: int, last: int) -> str:
    """``batch N`` or ``batches N-M``, for messages."""
    return f"batch {first}" if first == last else f"batches {first}-{last}"


def check_start(sink: MarkedSink, checkpoint: Path, batch_id: int) -> None:
    """Step 1 of a process's first batch: the sink is neither behind nor ahead of the checkpoint.

    Args:
        sink: The bound sink (staged batches recovered).
        checkpoint: Spark's checkpoint.
        batch_id: The batch Spark runs now.

    Raises:
        OutOfStepError: The sink lacks batches the checkpoint committed, or has batches after
            the one Spark runs now.
    """
    if not sink.keeps_markers:
        return
    have = sorted(int(m["batch_id"]) for m in sink.recent_batches())  # only the last matters here
    last = have[-1] if have else None
    committed = ckpt.committed_batches(checkpoint)
    done = committed[-1] if committed else None
    if done is not None and (last is None or last < done):
        first = 0 if last is None else last + 1
        raise OutOfStepError(
            f"the sink lacks {span(first, done)}, which Spark's checkpoint {checkpoint} committed (the "
            f"sink's last batch is {last if last is not None else 'none'}): the database was restored from "
            "a backup older than the checkpoint (or the checkpoint belongs to another sink). Their rows are "
            "not in the tables and Spark will not run them again; nothing was written now. Run "
            f"`{repair_command(checkpoint, sink)}`: it rewinds the checkpoint to the sink's last batch, and "
            "the next start writes the missing batches once.")
    if last is not None and last > batch_id and last > _restoring_until(checkpoint):
        raise OutOfStepError(
            f"the sink has {span(batch_id + 1, last)}, which Spark's checkpoint {checkpoint} has not "
            f"planned (it runs batch {batch_id} now): the checkpoint was restored from an older copy. "
            "Spark would plan those batch ids over other input; nothing was written now. Run "
            f"`{repair_command(checkpoint, sink)}`: it restores the checkpoint's plan of those batches from "
            "the sink's markers.")


def check_replay(sink: MarkedSink, checkpoint: Path, now: InputRange | None) -> None:
    """Step 5 when the sink found batch N's marker: N's input then was the input Spark plans now.

    A marker written without a range (an older onceflow) is taken as it is.

    Raises:
        OutOfStepError: The marker's range is not the planned one (nothing of N was written).
    """
    if now is None:
        return
    check_replaymarker_of(marker_of(sink.batches(), now.batch_id), now, sink, sink, checkpoint)


def check_replaymarker_of(found: dict[str, Any] | None, now: InputRange, sink: MarkedSink, part: MarkedSink,
                        checkpoint: Path) -> None:
    """:func:`check_replay` on the marker ``found`` of ``part`` (one of ``sink``'s sinks, or ``sink``).

    Raises:
        OutOfStepError: The marker's range is not the planned one (nothing of N was written).
    """
    if found is None or not found.get("input_range"):
        return
    kept = InputRange.from_json(now.batch_id, str(found["input_range"]))
    if kept.same_input(now):
        return
    which = "the sink" if part is sink else f"the sink {part!r}"
    raise OutOfStepError(
        f"batch {now.batch_id} is in {which} over another input than Spark's checkpoint {checkpoint} plans "
        "for it now — "
        f"committed: {kept.describe()}; planned now: {now.describe()}. The checkpoint (or another of the "
        "query's sinks) was restored from an older copy, or edited, and skipping the batch as a replay would "
        f"lose the input it did not have. Nothing of this attempt was written. Run "
        f"`{repair_command(checkpoint, sink)}`: it restores "
        "the checkpoint's plan of the sink's batches from their markers, and the next start reads the rest "
        "as new batches.")


def check_sinks_agree(sink: MarkedSink, checkpoint: Path, now: InputRange | None) -> None:
    """Before several sinks commit N: each sink that has N has it over the input Spark plans now.

    Up to the last batch any of them had when bound (``sink.ahead``); a single sink: nothing here
    (its own replay is checked by :func:`check_replay`).

    Raises:
        OutOfStepError: Naming the sink, both inputs and the repair command (nothing written).
    """
    if now is None or not sink.parts or now.batch_id > sink.ahead:
        return
    for part in sink.parts:
        check_replaymarker_of(marker_of(part.batches(), now.batch_id), now, sink, part, checkpoint)


def marker_of(markers: list[dict[str, Any]], batch_id: int) -> dict[str, Any] | None:
    """Batch ``batch_id``'s marker among ``markers`` (None: not there)."""
    return next((m for m in markers if int(m["batch_id"]) == batch_id), None)


def markers_of(sink: MarkedSink) -> list[dict[str, Any]]:
    """Every marker a sink keeps (several sinks: of every batch any of them has)."""
    return list(sink.all_batches())


def _restoring_until(checkpoint: Path) -> int:
    """The last batch ``onceflow repair`` restores from the sink's markers (-1: no restore under way)."""
    try:
        return int(json.loads((checkpoint / RESTORE_FILE).read_text())["until"])
    except FileNotFoundError:
        return -1
    except (ValueError, KeyError, TypeError) as exc:
        raise OutOfStepError(f"{checkpoint / RESTORE_FILE} is damaged ({exc}): run onceflow repair again") \
            from None


def restore_under_way(checkpoint: Path) -> bool:
    """Whether ``onceflow repair`` is restoring batches of ``checkpoint`` from the sink's markers."""
    return _restoring_until(checkpoint) >= 0


def continue_restore(sink: MarkedSink, checkpoint: Path, batch_id: int) -> bool:
    """After the replay of a restored batch N (its range checked): restore the plan of N+1.

    ``onceflow repair`` restores the first of the sink's batches the checkpoint lacks; Spark
    rebuilds the query's state by running it again (the sink skips it). Spark plans each next
    batch over all the input there is, so the next restored batch's plan is written here, before
    Spark plans it: Spark then refuses to plan N+1 (its plan exists), the query stops, and
    :class:`onceflow.OnceQuery` starts it again, which runs N+1 as planned. A file source's log
    ids after N+1's are removed (what Spark logged while planning over the new input): those
    files are planned anew after the last restored batch.

    Returns:
        True when N+1's plan was written (the query is to start again), False otherwise (no
        restore under way, or N was its last batch: the restore is done).
    """
    until = _restoring_until(checkpoint)
    if until < 0:
        return False
    if batch_id >= until:
        ranges.remove(checkpoint / RESTORE_FILE)
        return False
    found = marker_of(markers_of(sink), batch_id + 1)
    if found is None or not found.get("input_range"):
        raise OutOfStepError(f"restoring batch {batch_id + 1} from the sink's marker: the sink has no "
                             "marker of it with an input range any more; run onceflow repair again")
    nxt = InputRange.from_json(batch_id + 1, str(found["input_range"]))
    for i, line in enumerate(nxt.end):
        directory, pos = ranges.source_log(checkpoint, i), ranges.log_position(line)
        if pos is not None and directory.is_dir():
            for p in directory.iterdir():
                if (found_id := log_id_of(p)) is not None and found_id > pos:
                    ranges.remove(p)
    ranges.write(checkpoint, nxt, ranges.checkpoint_conf(checkpoint, ckpt.offset_batches(checkpoint)) or {})
    return True


def log_id_of(p: Path) -> int | None:
    """The batch id of a log file (``N`` or ``N.compact``; None: not a log file)."""
    name = p.name.removesuffix(".compact")
    return int(name) if name.isdigit() else None



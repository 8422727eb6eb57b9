"""Several sinks in one query: each table to its own sink, the source read once.

``onceflow.write_stream(stream, {"customers": pg, "orders": lake}, ...)`` routes each table of the
query (``late=`` and ``rejects=`` tables too) to a sink; the batch is computed once and every sink
commits its own tables with its own marker, by its own protocol. Commit protocol of
:meth:`SeveralSinks.commit_frames` for batch N:

1. **Check.** Every table goes to a sink (checked before the query starts, :meth:`SeveralSinks.
   check`, where each sink checks its own tables and names).
2. **Agree**: up to the last batch any sink had at the start (:attr:`SeveralSinks.ahead`), a sink
   that has N must have it over the input Spark plans now — else the others would write N over
   input that sink never saw (:func:`onceflow.checkpoint.guard.check_sinks_agree`, before anything is
   written; ``onceflow repair`` restores N's plan from the markers).
3. **Each sink in turn**, in the order its first table has in the mapping: its tables of N go
   through its own steps 1-6 — decide by its marker (a sink that has N skips it), write, mark,
   commit. A sink that takes collected batches (:class:`onceflow.sinks._core.base.CollectingSink`)
   gets its tables as Arrow when they have fewer rows than its ``collect_below``, else as
   DataFrames for its tasks; an executor-only sink (Iceberg, PostgreSQL ``staged``/``2pc``)
   always as DataFrames. Each sink's crash points are its own: ``after_sink_commit`` of the first
   sink falls between the two sinks' commits.
4. **Return** True if any sink wrote N.

There is no transaction across sinks: a crash between two sinks' commits leaves the first with N
and the second without; Spark runs N again (its commit log lacks N), the first sink skips it by its
marker and the second writes it — every table gets N exactly once, and readers may see one sink a
batch ahead of another. A replayed N is recomputed from the same input (as for a sink whose
tables commit one by one: ``stable=`` keeps a ``per_batch`` that is not deterministic exact).

The query's markers (:meth:`SeveralSinks.batches`) are the batches **every** sink has: a sink
restored from an older backup makes the query's last batch its own, so the start-up check finds
the checkpoint ahead of it and ``onceflow repair`` rewinds the checkpoint to it; the next start
writes the missing batches into that sink only (the others skip them by their markers).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from onceflow.errors import ConfigError
from onceflow.sinks._core.base import BatchStats, CollectingSink, Settle, SinkBase, collected
from onceflow.sinks._core.tables import Table, check_specs


class SeveralSinks(SinkBase):
    """Tables routed to several sinks (see the module protocol).

    Args:
        routes: Table name -> the sink that holds it (every table of the query, ``late=`` and
            ``rejects=`` tables included). The sinks share one sink id (each keeps its markers in
            its own database, so the same id in two sinks never collides).

    Raises:
        ConfigError: No route, a route to something that is not a sink, or sinks with different
            sink ids.
    """

    writes_uncached = False
    parts: list[Any]
    ahead = -1
    """The last batch any sink had when they were bound: up to it, a sink may skip a batch the others
    write, so each batch's plan is checked against every sink's marker first
    (:func:`onceflow.checkpoint.guard.check_sinks_agree`)."""

    def __init__(self, routes: Mapping[str, Any]) -> None:
        if not isinstance(routes, Mapping) or not routes:
            raise ConfigError("several sinks: pass a dict {table_name: sink}")
        parts: list[Any] = []
        for name, sink in routes.items():
            if not hasattr(sink, "batches") or not hasattr(sink, "sink_id"):
                raise ConfigError(f"table {name!r} goes to {sink!r}, which is not an onceflow sink "
                                  "(onceflow.sqlite, postgres, delta, iceberg, kafka or http)")
            if isinstance(sink, SeveralSinks):
                raise ConfigError(f"table {name!r} goes to several sinks at once: route each table to "
                                  "one sink")
            if not any(sink is p for p in parts):
                parts.append(sink)
        ids = sorted({p.sink_id for p in parts})
        if len(ids) > 1:
            raise ConfigError(f"the sinks of one query have sink ids {ids}: give them one sink_id (each sink "
                              "keeps its markers in its own database, so one id never collides)")
        self.routes = dict(routes)
        self.parts = parts
        self.sink_id = ids[0]
        self.all_or_nothing = len(parts) == 1 and bool(getattr(parts[0], "all_or_nothing", False))
        self.keeps_markers = all(bool(getattr(p, "keeps_markers", True)) for p in parts)
        self.tables_are_topics = any(bool(getattr(p, "tables_are_topics", False)) for p in parts)

    def __repr__(self) -> str:
        return "onceflow.several({" + ", ".join(f"{n!r}: {s!r}" for n, s in self.routes.items()) + "})"

    def _tables(self, part: Any, names: Any) -> list[str]:
        """The names among ``names`` that go to ``part``, in their order."""
        return [n for n in names if self.routes.get(n) is part]

    def repair_options(self) -> str:
        """Every sink's options, the sink id once (``onceflow repair`` takes several sinks)."""
        tail = f"--sink-id {self.sink_id}"
        return " ".join(p.repair_options().replace(tail, "").strip() for p in self.parts) + f" {tail}"

    def bind(self, query_id: str) -> None:
        """Bind every sink to the checkpoint; remember the last batch any of them has (:attr:`ahead`)."""
        for part in self.parts:
            part.bind(query_id)
        self.ahead = max(self.lasts(), default=-1)

    def check(self, specs: Mapping[str, Table], schemas: Mapping[str, pa.Schema]) -> None:
        """Every table goes to a sink; each sink checks its tables (names by its own rule, columns).

        Raises:
            ConfigError: A table with no sink (named, with the tables routed), or a sink's refusal.
        """
        lost = [n for n in specs if n not in self.routes]
        if lost:
            raise ConfigError(f"table(s) {lost} go to no sink: add them to the sinks mapping (it routes "
                              f"{sorted(self.routes)}; late= and rejects= tables need a route too)")
        for part in self.parts:
            names = self._tables(part, specs)
            if names:
                check_specs({n: specs[n] for n in names}, bool(part.tables_are_topics))
                part.check({n: specs[n] for n in names}, {n: schemas[n] for n in names if n in schemas})

    def check_outputs(self, outputs: list[str]) -> None:
        """Each sink holds a table of ``per_batch``'s output (``outputs``), which every batch has.

        A sink holding only the ``late=`` or ``rejects=`` table would get nothing, and so no
        marker, in a batch without late or bad rows: the query's markers (:meth:`batches`) would
        then look behind.

        Raises:
            ConfigError: Naming the sink and its tables.
        """
        for part in self.parts:
            if not any(self.routes.get(n) is part for n in outputs):
                raise ConfigError(f"{part!r} holds only {self._tables(part, self.routes)}, which onceflow "
                                  "fills in some batches only (late=, rejects=): route one of per_batch's "
                                  "tables to it too, or those tables to another sink")

    def commit_frames(self, batch_id: int, frames: Mapping[str, Any], specs: Mapping[str, Table],
                      stats: BatchStats, rows_out: int, written: Mapping[str, int] | None = None,
                      settle: Settle | None = None) -> bool:
        """Steps 3 and 4 of the module protocol: each sink in turn; True if any sink wrote the batch."""
        wrote = False
        for part in self.parts:
            names = self._tables(part, frames)
            if not names:
                continue
            mine = {n: frames[n] for n in names}
            their_specs = {n: specs[n] for n in names}
            rows = {n: written[n] for n in names} if written is not None else None
            small = rows is not None and sum(rows.values()) < getattr(part, "collect_below", 0)
            if isinstance(part, CollectingSink) and small:
                wrote |= bool(part.commit_tables(batch_id, collected(mine), their_specs, stats, rows_out))
            else:
                wrote |= bool(part.commit_frames(batch_id, mine, their_specs, stats, rows_out, written=rows))
        return wrote

    def lasts(self) -> list[int]:
        """Each sink's last batch (-1: none), in the sinks' order."""
        return [max((int(m["batch_id"]) for m in _recent(p)), default=-1) for p in self.parts]

    def all_batches(self) -> list[dict[str, Any]]:
        """The markers of every batch any sink has, by batch id (``onceflow repair`` restores from them)."""
        return _merged([p.batches() for p in self.parts], common=False)

    def batches(self) -> list[dict[str, Any]]:
        """The markers of the batches every sink has, by batch id (the first sink's where several)."""
        return _merged([p.batches() for p in self.parts], common=True)

    def recent_batches(self) -> list[dict[str, Any]]:
        """As :meth:`batches`, from each sink's last markers (what the start-up check reads)."""
        return _merged([_recent(p) for p in self.parts], common=True)

    def flush(self) -> None:
        """Wait for every sink."""
        for part in self.parts:
            part.flush()

    def close(self) -> None:
        """Close every sink (each even when one fails; the first failure raised after)."""
        failed: BaseException | None = None
        for part in self.parts:
            try:
                part.close()
            except Exception as exc:  # noqa: BLE001 - the others still close
                failed = failed or exc
        if failed is not None:
            raise failed


def _merged(lists: list[list[dict[str, Any]]], common: bool) -> list[dict[str, Any]]:
    """The sinks' markers by batch id, the first sink's where several have a batch.

    ``common``: only the batches every sink has (up to the last batch of the sink most behind).
    """
    last = min((max((int(m["batch_id"]) for m in found), default=-1) for found in lists), default=-1) \
        if common else None
    merged: dict[int, dict[str, Any]] = {}
    for found in lists:
        for m in found:
            if last is None or int(m["batch_id"]) <= last:
                merged.setdefault(int(m["batch_id"]), m)
    return [merged[b] for b in sorted(merged)]


def _recent(part: Any) -> list[dict[str, Any]]:
    """A sink's last markers (its ``recent_batches``; every marker where it reads only those: a ledger)."""
    recent = getattr(part, "recent_batches", None)
    return list(recent() if recent is not None else part.batches())

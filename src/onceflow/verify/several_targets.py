"""The sinks of one verify run whose pipeline writes several (``--sink sqlite+iceberg``).

A pipeline of several sinks (:mod:`onceflow.sinks._core.several`) gets ``{family: sink}`` as its
``sink`` argument and routes each table to one of them. Verify runs it like any pipeline: each
part is a :class:`onceflow.verify.targets.SinkTarget` in the same work directory (their files do
not overlap: one of each family), and this class answers for all of them:

* the run's committed batches are those **every** sink has marked (the least of the parts), so a
  round waits until a batch reached every sink;
* a ``sink_outage`` takes one of the sinks away (the run's random choice, said in the round's
  outcome): the query must wait for it while the other sinks have the batch already;
* a crash point fires where the first sink that reaches it is (``crash_after_sink_commit``: after
  the first sink's commit, before the next sink's: the point between two sinks);
* the auditor reads each table from the sink the pipeline routed it to (the oracle runs the
  pipeline with each sink's family name in its place, so it knows the routes) and checks every
  sink's markers against Spark's commit log.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from onceflow.errors import ConfigError
from onceflow.verify.sinks import family, location_flag, parts
from onceflow.verify.targets import SinkTarget

if TYPE_CHECKING:
    from onceflow.verify.oracle import Expectation
    from onceflow.verify.pipeline_verdict import Folded, Reader, Rows
    from onceflow.verify.verdict import Verdict

def families(kind: str) -> tuple[str, ...]:
    """The sink families of a ``--sink`` value of several sinks, in order; () for one sink."""
    return tuple(family(n) for n in parts(kind)) if "+" in kind else ()


class SeveralTargets:
    """The sinks of a ``--sink a+b`` run, answering as one :class:`SinkTarget` does.

    Args:
        kind: The ``--sink`` value, e.g. ``postgres+iceberg``.
        workdir: The verify work directory.
        pg_dsn: PostgreSQL connection string for a PostgreSQL part (else ``$ONCEFLOW_PG_DSN``).
        sink_id: The sink id every part writes under.

    Raises:
        ConfigError: As :func:`onceflow.verify.sinks.parts` does, or a single sink.
    """

    db: Path | None = None
    """No single location: :meth:`extra_args` names each part's."""
    service: Any = None

    def __init__(self, kind: str, workdir: Path, pg_dsn: str | None, sink_id: str) -> None:
        names = self.check(kind)
        self.kind, self.sink_id, self.workdir = kind, sink_id, workdir
        self.parts = {family(n): SinkTarget(n, workdir, pg_dsn, sink_id=sink_id) for n in names}
        self._down: str | None = None

    @staticmethod
    def check(kind: str) -> list[str]:
        """The parts of ``kind``, or the :class:`ConfigError` the class docstring names."""
        names = parts(kind)
        if len(names) < 2:
            raise ConfigError(f"--sink {kind}: several sinks are joined by '+', e.g. sqlite+iceberg")
        return names

    @property
    def schema(self) -> str:
        """The PostgreSQL part's schema ('' without one)."""
        return next((p.schema for p in self.parts.values() if p.is_postgres), "")

    @property
    def broker(self) -> Any:
        """The Kafka part's broker (None without a Kafka part, or before :meth:`prepare`)."""
        return next((p.broker for p in self.parts.values() if p.broker is not None), None)

    def json_tables(self, routes: Mapping[str, str]) -> set[str]:
        """The tables ``routes`` sends to the Kafka part: their values are compared as JSON holds them."""
        return {table for table, fam in routes.items() if fam == "kafka"}

    @property
    def is_postgres(self) -> bool:
        """Whether a part is in PostgreSQL."""
        return any(p.is_postgres for p in self.parts.values())

    def prepare(self, schema: str | None = None) -> None:
        """Each part's :meth:`SinkTarget.prepare` (``schema``: the PostgreSQL part's of a resumed run)."""
        for part in self.parts.values():
            part.prepare(schema if part.is_postgres else None)

    @property
    def name(self) -> str:
        """Every part's name, joined by `` + ``."""
        return " + ".join(p.name for p in self.parts.values())

    def extra_args(self) -> list[str]:
        """Each part's location flag and arguments for ``onceflow run``."""
        args: list[str] = []
        for part in self.parts.values():
            if part.db is not None:  # PostgreSQL's DSN: in the environment
                args += [location_flag(part.kind), str(part.db)]
            args += part.extra_args()
        return args

    def env(self) -> dict[str, str]:
        """Every part's environment for the driver."""
        return {k: v for p in self.parts.values() for k, v in p.env().items()}

    def close(self) -> None:
        """Each part's :meth:`SinkTarget.close`."""
        for part in self.parts.values():
            part.close()

    def drop(self) -> str:
        """Each part's :meth:`SinkTarget.drop`; what was done."""
        return "; ".join(p.drop() for p in self.parts.values())

    def batches(self) -> list[dict[str, Any]]:
        """The markers of the batches every sink has (the first sink's, with their metrics)."""
        each = list(self.marked().values())
        common = set.intersection(*({int(m["batch_id"]) for m in got} for got in each))
        return [m for m in each[0] if int(m["batch_id"]) in common]

    def marked(self) -> dict[str, list[dict[str, Any]]]:
        """Each sink's own markers, by family."""
        return {fam: p.batches() for fam, p in self.parts.items()}

    def committed_batches(self) -> int:
        """The fewest markers a sink has (a batch counts once every sink has it)."""
        return min(p.committed_batches() for p in self.parts.values())

    def outage_seconds(self, rng: random.Random) -> float:
        """Picks the sink the next :meth:`outage` takes away; how long that outage lasts."""
        self._down = rng.choice(sorted(self.parts))
        return self.parts[self._down].outage_seconds(rng)

    def outage(self, seconds: float, during: Callable[[], None]) -> str:
        """One sink's outage (the one :meth:`outage_seconds` picked); what was done."""
        fam = self._down or next(iter(self.parts))
        return f"{fam}: {self.parts[fam].outage(seconds, during)}"

    def reader(self, routes: Mapping[str, str] | None = None) -> Reader:
        """Reads each table from the sink ``routes`` (table -> family) sends it to.

        A table without a route is looked for in every sink (the first that has it).
        """
        readers = {fam: p.reader() for fam, p in self.parts.items()}

        def read(name: str, want: Folded | None) -> Rows | None:
            fam = (routes or {}).get(name)
            if fam is not None and fam in readers:
                return readers[fam](name, want)
            for one in readers.values():
                got = one(name, want)
                if got is not None:
                    return got
            return None
        return read

    def judge(self, expectation: Expectation) -> Verdict:
        """Example 5-1 writes one sink: never judged here."""
        raise ConfigError(f"--sink {self.kind}: several sinks are for a --pipeline that routes its tables")

"""The oracle of a Real-Time Mode pipeline: its tables from the topic, without onceflow's writer.

``onceflow verify --pipeline PATH.py:FUNCTION --source kafka --sink realtime`` proves a pipeline
that writes with :func:`onceflow.write_realtime`. The oracle never runs the writer (the JVM
``UpsertWriter``, its SQL, Spark's real-time trigger): it runs the user's function, which is
what is being proven, over records it read itself.

Procedure (:class:`RealtimeOracle`):

1. Read the topic with verify's own consumer (:func:`onceflow.verify.kafka_rig.read_topic`),
   or the records at or before given offsets (the rows at risk of a kill, below).
2. Call the user's function with a session whose ``readStream`` gives those records as a static
   DataFrame with the columns of Spark's Kafka connector (or of onceflow's source), and with the
   oracle's own ``write_realtime`` in place: it keeps the DataFrame, the table and the key.
3. The table the writer must leave is one row per key (:func:`expected`): upserted record by
   record, a replayed record rewrites its row, so the table is the transform's rows keyed by
   ``key``. Two records of one key with different rows are a finding, not a guess: which one
   the table keeps depends on the order the writer met them in (two partitions), so the key
   does not identify the record (:attr:`Expected.conflicts`).
4. :func:`judge` compares the table PostgreSQL holds with it, key by key, in the canonical form
   of :mod:`onceflow.verify.pipeline_verdict`.

Rows at risk of a kill (:func:`rows_beyond`): the rows in the table right after the SIGKILL
minus the keys of the records at or before the offsets Spark had logged as done — rows the
writer wrote from records Spark had not logged, which the restarted query reads and writes
again. A kill with none proves nothing.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from onceflow import pipelines
from onceflow.errors import ConfigError
from onceflow.tables import Table
from onceflow.verify import kafka_rig, pipeline_kafka
from onceflow.verify.pipeline_oracle import BatchSession, replaced
from onceflow.verify.pipeline_verdict import Folded, Reader, canon, compare_table
from onceflow.verify.recompute import CountDiff
from onceflow.verify.verdict import Verdict

Record = dict[str, Any]


@dataclass
class Written:
    """What one ``write_realtime`` call of the user's function would write (step 2)."""

    table: str
    key: list[str]
    rows: pa.Table


@dataclass
class Expected:
    """One table the writer must leave (step 3)."""

    table: str
    folded: Folded
    conflicts: list[str] = field(default_factory=list)
    """Keys whose records give different rows (examples, at most 5)."""
    conflicting: set[tuple[Any, ...]] = field(default_factory=set)
    """The keys whose records give different rows."""


class RealtimeOracle:
    """Steps 1-3 of the module for the pipeline ``PATH.py:FUNCTION`` over one topic.

    Args:
        pipeline: ``PATH.py:FUNCTION``.
        bootstrap: The broker verify started.
        topic: The topic the pipeline reads.
    """

    def __init__(self, pipeline: str, bootstrap: str, topic: str) -> None:
        self.spec, self.bootstrap, self.topic = pipeline, bootstrap, topic
        self.records: list[Record] = []

    def read(self) -> list[Record]:
        """Step 1: every record of the topic (kept for :meth:`written`)."""
        self.records = kafka_rig.read_topic(self.bootstrap, self.topic)
        return self.records

    def ends(self) -> dict[int, int]:
        """Per partition with records, the offset after its last record read."""
        out: dict[int, int] = {}
        for r in self.records:
            out[r["partition"]] = max(out.get(r["partition"], 0), r["offset"] + 1)
        return out

    def written(self, spark: Any, upto: dict[int, int] | None = None) -> list[Written]:
        """Step 2 over the records read, or those before ``upto`` (partition -> next offset).

        Args:
            spark: A SparkSession for the static DataFrames (the oracle's own).
            upto: Only the records before these offsets.

        Raises:
            ConfigError: The function wrote with something else than ``write_realtime``, or with
                ``rejects=`` (not judged).
        """
        chosen = self.records if upto is None else \
            [r for r in self.records if r["offset"] < upto.get(r["partition"], 0)]
        batch = functools.partial(pipeline_kafka.batch_table, chosen, self.topic)
        calls: list[Written] = []
        with _installed(calls):
            fn = pipelines.load(self.spec, fresh=True)
            fn(BatchSession(spark, [], batch), f"{self.bootstrap}/{self.topic}", "", "", False)
        if not calls:
            raise ConfigError(f"--sink realtime: {self.spec} did not call onceflow.write_realtime")
        return calls


@contextlib.contextmanager
def _installed(calls: list[Written]) -> Iterator[None]:
    """The oracle's ``write_realtime`` in place of onceflow's while inside (step 2)."""
    import onceflow
    from onceflow import realtime

    def write_realtime(df: Any, table: str, key: str | Sequence[str], checkpoint: Any = None,
                       **kw: Any) -> Written:
        if kw.get("rejects") is not None:
            raise ConfigError("verify --sink realtime does not judge rejects= yet: run the pipeline "
                              "without it")
        keys = [key] if isinstance(key, str) else list(key)
        missing = [k for k in keys if k not in df.columns]
        if not keys or missing:
            raise ConfigError(f"write_realtime: the key {keys} must name columns of {df.columns} "
                              "(the pipeline fails too)")
        calls.append(Written(table, keys, df.toArrow()))
        return calls[-1]

    with replaced((onceflow, realtime), write_realtime=write_realtime):
        yield


def expected(calls: list[Written]) -> dict[str, Expected]:
    """Step 3: per table, its rows keyed by the key, and the keys whose records disagree."""
    out: dict[str, Expected] = {}
    for call in calls:
        exp = out.setdefault(call.table, Expected(call.table, Folded(Table(key=call.key))))
        seen = exp.folded.keyed
        for raw in call.rows.to_pylist():
            row = {k: canon(v) for k, v in raw.items()}
            key = tuple(row[c] for c in call.key)
            if key in seen and seen[key] != row and key not in exp.conflicting:
                exp.conflicting.add(key)
                if len(exp.conflicts) < 5:
                    exp.conflicts.append(f"key {key}: {seen[key]} and {row}")
            seen[key] = row
        exp.folded.columns = exp.folded.columns or list(call.rows.column_names)
    return out


def judge(sink: str, want: dict[str, Expected], read: Reader) -> Verdict:
    """Step 4: the tables ``read`` gives against ``want``; a verdict with every difference."""
    violations: list[str] = []
    tables: dict[str, CountDiff] = {}
    for name, exp in sorted(want.items()):
        if exp.conflicting:
            violations.append(f"{name}: {len(exp.conflicting)} keys have records with different rows (e.g. "
                              f"{exp.conflicts[0]}): the key {exp.folded.spec.key} does not identify the "
                              "record, and the row a replay leaves depends on timing; key by the "
                              "record's id, or topic, partition, offset")
        got = read(name, exp.folded)
        if got is None:
            got = []
            if exp.folded.rows():
                violations.append(f"{name}: the table does not exist; {exp.folded.rows()} rows expected")
        tables[name] = compare_table(name, exp.folded, got, violations)
    return Verdict(sink, tables, 0, 0, violations=violations)


def rows_beyond(oracle: RealtimeOracle, spark: Any, logged: dict[int, int], rows_at_kill: int) -> int:
    """Rows at risk of a kill: ``rows_at_kill`` minus the keys of the records before ``logged``.

    Args:
        oracle: The oracle, its records read.
        spark: The oracle's SparkSession.
        logged: Per partition, the next offset after what Spark had logged as done at the kill.
        rows_at_kill: The table's rows right after the kill (every table the pipeline writes).
    """
    before = expected(oracle.written(spark, logged))
    return max(rows_at_kill - sum(e.folded.rows() for e in before.values()), 0)

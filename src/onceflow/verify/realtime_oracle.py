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

With ``rejects=``, which rows belong in the rejects table is decided without the writer
(:func:`refused_by_postgres`): every expected row is inserted, each in a savepoint, into an empty
temporary copy of the user's table (``LIKE ... INCLUDING ALL``: its types, ``NOT NULL`` and
``CHECK`` constraints), rolled back at the end; the rows PostgreSQL refuses there (SQLSTATE
classes 22 and 23, as the writer routes them) must be in the rejects table, keyed by their key,
each once, and absent from the table; every other row must be in the table and not rejected.

Rows at risk of a kill (:func:`rows_beyond`): the rows in the table right after the SIGKILL
minus the keys of the records at or before the offsets Spark had logged as done — rows the
writer wrote from records Spark had not logged, which the restarted query reads and writes
again. A kill with none proves nothing.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from onceflow.api import pipelines
from onceflow.errors import ConfigError
from onceflow.sinks._core.tables import Table
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
    rejects: str | None = None
    """The ``rejects=`` table the call named."""


@dataclass
class Expected:
    """One table the writer must leave (step 3)."""

    table: str
    folded: Folded
    conflicts: list[str] = field(default_factory=list)
    """Keys whose records give different rows (examples, at most 5)."""
    conflicting: set[tuple[Any, ...]] = field(default_factory=set)
    """The keys whose records give different rows."""
    raw: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)
    """The last row of each key as the transform gave it (not canonical): what a trial inserts."""
    rejects: str | None = None
    """The ``rejects=`` table of the table's writer."""


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
            ConfigError: The function wrote with something else than ``write_realtime``.
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
    from onceflow.api import realtime

    def write_realtime(df: Any, table: str, key: str | Sequence[str], checkpoint: Any = None,
                       **kw: Any) -> Written:
        keys = [key] if isinstance(key, str) else list(key)
        missing = [k for k in keys if k not in df.columns]
        if not keys or missing:
            raise ConfigError(f"write_realtime: the key {keys} must name columns of {df.columns} "
                              "(the pipeline fails too)")
        calls.append(Written(table, keys, df.toArrow(), kw.get("rejects")))
        return calls[-1]

    with replaced((onceflow, realtime), write_realtime=write_realtime):
        yield


def expected(calls: list[Written]) -> dict[str, Expected]:
    """Step 3: per table, its rows keyed by the key, and the keys whose records disagree."""
    out: dict[str, Expected] = {}
    for call in calls:
        exp = out.setdefault(call.table, Expected(call.table, Folded(Table(key=call.key))))
        exp.rejects = exp.rejects or call.rejects
        seen = exp.folded.keyed
        for raw in call.rows.to_pylist():
            row = {k: canon(v) for k, v in raw.items()}
            key = tuple(row[c] for c in call.key)
            if key in seen and seen[key] != row and key not in exp.conflicting:
                exp.conflicting.add(key)
                if len(exp.conflicts) < 5:
                    exp.conflicts.append(f"key {key}: {seen[key]} and {row}")
            seen[key] = row
            exp.raw[key] = raw
        exp.folded.columns = exp.folded.columns or list(call.rows.column_names)
    return out


Refuses = Callable[[Expected], set[tuple[Any, ...]]]
"""An expected table -> the keys whose rows PostgreSQL refuses (:func:`refused_by_postgres`)."""


def judge(sink: str, want: dict[str, Expected], read: Reader, refuses: Refuses | None = None) -> Verdict:
    """Step 4: the tables ``read`` gives against ``want``; a verdict with every difference.

    Args:
        sink: The sink's name (for the verdict).
        want: Step 3's tables.
        read: The tables PostgreSQL holds.
        refuses: Decides the rows of a ``rejects=`` table (needed when a table has one).

    Raises:
        ConfigError: A table has a ``rejects=`` table and no ``refuses`` was given.
    """
    violations: list[str] = []
    tables: dict[str, CountDiff] = {}
    for name, exp in sorted(want.items()):
        if exp.conflicting:
            violations.append(f"{name}: {len(exp.conflicting)} keys have records with different rows (e.g. "
                              f"{exp.conflicts[0]}): the key {exp.folded.spec.key} does not identify the "
                              "record, and the row a replay leaves depends on timing; key by the "
                              "record's id, or topic, partition, offset")
        folded = exp.folded
        if exp.rejects is not None:
            if refuses is None:
                raise ConfigError(f"{name} has rejects={exp.rejects!r}: the judge needs the database to "
                                  "decide which rows PostgreSQL refuses")
            refused = refuses(exp)
            folded = Folded(folded.spec)
            folded.columns = exp.folded.columns
            folded.keyed = {k: r for k, r in exp.folded.keyed.items() if k not in refused}
            tables[exp.rejects] = _judge_rejects(exp, refused, read(exp.rejects, None) or [], violations)
        got = read(name, folded)
        if got is None:
            got = []
            if folded.rows():
                violations.append(f"{name}: the table does not exist; {folded.rows()} rows expected")
        tables[name] = compare_table(name, folded, got, violations)
    return Verdict(sink, tables, 0, 0, violations=violations)


def _judge_rejects(exp: Expected, refused: set[tuple[Any, ...]], got: list[dict[str, Any]],
                   violations: list[str]) -> CountDiff:
    """The rejects table's keys (its ``record``, the key as JSON) against the refused keys."""
    name, keys = exp.rejects, exp.folded.spec.key
    found: Counter[tuple[Any, ...]] = Counter()
    for row in got:
        record = json.loads(row["record"]) if row.get("record") else {}
        found[tuple(canon(record.get(c)) for c in keys)] += 1
    missing = [k for k in refused if k not in found]
    extra = [k for k in found if k not in refused]
    twice = sum(n - 1 for k, n in found.items() if n > 1 and k in refused)
    if missing:
        violations.append(f"{name}: {len(missing)} rows PostgreSQL refuses are not in the rejects table "
                          f"(lost), e.g. key {missing[0]}: {exp.raw.get(missing[0])}")
    if extra:
        why = " (PostgreSQL takes its row: it belongs in the table)" if extra[0] in exp.folded.keyed \
            else " (no record gives that key)"
        violations.append(f"{name}: {len(extra)} rejects of rows that should not be there, e.g. key "
                          f"{extra[0]}{why}")
    if twice:
        violations.append(f"{name}: {twice} rows rejected more than once")
    return CountDiff(len(refused), sum(found.values()), len(missing), 0, twice, len(extra), len(missing),
                     twice + len(extra))


def refused_by_postgres(dsn: str, exp: Expected) -> set[tuple[Any, ...]]:
    """The keys of ``exp`` whose rows PostgreSQL refuses (SQLSTATE classes 22 and 23) in its table.

    Each row is inserted, in a savepoint of its own, into an empty temporary copy of the table
    (``LIKE ... INCLUDING ALL``); the transaction is rolled back: nothing is left behind.

    Args:
        dsn: The database (its ``search_path`` names the schema the pipeline wrote to).
        exp: The table's expected rows.
    """
    import psycopg
    from psycopg import sql

    refused: set[tuple[Any, ...]] = set()
    with psycopg.connect(dsn) as conn:
        conn.execute(sql.SQL("CREATE TEMP TABLE onceflow_trial (LIKE {} INCLUDING ALL) ON COMMIT DROP")
                     .format(sql.Identifier(exp.table)))
        for key, row in exp.raw.items():
            insert = sql.SQL("INSERT INTO onceflow_trial ({}) VALUES ({})").format(
                sql.SQL(", ").join(sql.Identifier(c) for c in row),
                sql.SQL(", ").join(sql.Placeholder() * len(row)))
            try:
                with conn.transaction():
                    conn.execute(insert, list(row.values()))
            except (psycopg.DataError, psycopg.IntegrityError):  # classes 22 and 23 (NUL: client-side 22)
                refused.add(key)
        conn.rollback()
    return refused


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

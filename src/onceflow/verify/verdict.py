"""Compare a sink's contents with the oracle's expectation and name every violation.

Per table it reports rows expected and found, **lost** events (missing rows or too-low
counts) and **duplicated** events (too-high counts or extra rows). Per batch it compares the
late drops the sink recorded with the late drops the oracle predicts, and checks that
every batch in Spark's commit log has exactly one marker in the sink.
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from onceflow.sinks.http.ledger import is_dsn
from onceflow.sinks.http.ledger import read_batches as read_ledger_batches
from onceflow.sinks.sqlite.db import read_batches
from onceflow.verify.oracle import Expectation
from onceflow.verify.recompute import CountDiff, diff_counts

Counts = tuple[dict[tuple[str, int], int], dict[int, int]]
"""Example 5-1's tables as read back: ``({(user, window_start_ms): count}, {window_start_ms: count})``."""


def read_counts(path: str | Path) -> Counts:
    """Read Example 5-1's tables from a SQLite database (empty for tables not created yet)."""
    if not Path(path).exists():
        return {}, {}
    conn = sqlite3.connect(str(path))
    try:
        have = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        users = {(u, w): c for u, w, c in conn.execute(
            "SELECT user, window_start_ms, count FROM user_counts")} if "user_counts" in have else {}
        glob = dict(conn.execute("SELECT window_start_ms, count FROM global_counts").fetchall()
                    ) if "global_counts" in have else {}
    finally:
        conn.close()
    return users, glob


def read_pg_counts(dsn: str) -> Counts:
    """Read Example 5-1's tables from PostgreSQL (empty for tables not created yet)."""
    from onceflow.sinks.postgres import sql as pg

    with pg.session(dsn) as conn:
        users: dict[tuple[str, int], int] = {}
        glob: dict[int, int] = {}
        if conn.execute("SELECT to_regclass('user_counts') IS NOT NULL").fetchone()[0]:
            users = {(u, int(w)): int(c) for u, w, c in conn.execute(
                'SELECT "user", window_start_ms, count FROM user_counts')}
        if conn.execute("SELECT to_regclass('global_counts') IS NOT NULL").fetchone()[0]:
            glob = {int(w): int(c) for w, c in conn.execute(
                "SELECT window_start_ms, count FROM global_counts")}
    return users, glob


def read_lake_counts(read: Callable[[str], list[dict[str, Any]] | None]) -> tuple[Counts, int]:
    """Read Example 5-1's tables through ``read`` (a table's rows; None: not created yet).

    Returns:
        The counts, and how many rows repeat a key already read (a lake table has no primary
        key: a key written twice is a duplicate the counts alone would hide).
    """
    found = [read(name) or [] for name in ("user_counts", "global_counts")]
    users = {(r["user"], int(r["window_start_ms"])): int(r["count"]) for r in found[0]}
    glob = {int(r["window_start_ms"]): int(r["count"]) for r in found[1]}
    return (users, glob), len(found[0]) - len(users) + len(found[1]) - len(glob)


@dataclass
class Verdict:
    """The auditor's finding for one sink.

    Attributes:
        sink: A name for the sink (e.g. ``sqlite:/path/db``).
        tables: Per result table, the count differences.
        late_expected: Late drops the oracle predicts over committed batches.
        late_recorded: Late drops the sink's markers record for those batches.
        late_mismatches: Batch ids whose recorded late count differs.
        missing_markers: Batches Spark committed that have no marker in the sink.
        violations: Human-readable list of everything wrong; empty when exact.
    """

    sink: str
    tables: dict[str, CountDiff]
    late_expected: int
    late_recorded: int
    late_mismatches: list[int] = field(default_factory=list)
    missing_markers: list[int] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the sink holds exactly the expected result."""
        return not self.violations

    @property
    def lost(self) -> int:
        """Lost events over all tables."""
        return sum(d.lost_events for d in self.tables.values())

    @property
    def duplicated(self) -> int:
        """Duplicated events over all tables."""
        return sum(d.duplicated_events for d in self.tables.values())

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        out = asdict(self)
        out["ok"] = self.ok
        out["lost"] = self.lost
        out["duplicated"] = self.duplicated
        return out


def judge_sqlite(db: str | Path, expectation: Expectation, sink_id: str = "user_counts") -> Verdict:
    """Judge a SQLite Example 5-1 sink against the expectation.

    Args:
        db: The database file.
        expectation: From :func:`onceflow.verify.oracle.expect`.
        sink_id: The sink's marker namespace.

    Returns:
        The verdict (a batch left staged, never applied, is a violation).
    """
    users, glob = read_counts(db)
    verdict = judge(f"sqlite:{db}", users, glob, read_batches(db, sink_id), expectation)
    staged = _staged(db, sink_id)
    if staged:
        verdict.violations.append(f"{len(staged)} staged batches never applied: {staged[:10]}")
    return verdict


def judge_lake(where: str, read: Callable[[str], list[dict[str, Any]] | None], batches: list[dict[str, Any]],
               last_of: Callable[[str], int | None], expectation: Expectation) -> Verdict:
    """Judge Example 5-1 in lake tables (Delta, Iceberg), whose tables commit one by one.

    Besides the counts and markers, every table must hold the last batch Spark committed: a
    table a batch behind another is a violation, as is a key twice in a table.

    Args:
        where: The sink, for the verdict.
        read: A table's rows by name (None: not created yet).
        batches: The sink's markers.
        last_of: The last batch a table's own marker names (None: none).
        expectation: From :func:`onceflow.verify.oracle.expect`.
    """
    (users, glob), repeated = read_lake_counts(read)
    verdict = judge(where, users, glob, batches, expectation)
    if repeated:
        verdict.violations.append(f"{repeated} rows repeat a key of their table")
    last = max((b.batch_id for b in expectation.batches), default=None)
    for name in ("user_counts", "global_counts"):
        have = last_of(name)
        if last is not None and have != last:
            verdict.violations.append(f"{name}: its last batch is {have}, Spark's is {last}")
    return verdict


def judge_delta(root: str | Path, expectation: Expectation, sink_id: str = "user_counts") -> Verdict:
    """Judge Example 5-1 in Delta tables (``--sink delta``) by :func:`judge_lake`.

    The markers are the commits' ``onceflow`` metadata; a table's last batch is its app
    transaction ``onceflow:<sink_id>``.
    """
    from deltalake import DeltaTable

    from onceflow.sinks.delta.sink import DeltaTablesSink

    def last_of(name: str) -> int | None:
        path = Path(root) / name
        return DeltaTable(str(path)).transaction_version(f"onceflow:{sink_id}") \
            if (path / "_delta_log").is_dir() else None

    def read(name: str) -> list[dict[str, Any]] | None:
        path = Path(root) / name
        return DeltaTable(str(path)).to_pyarrow_table().to_pylist() if (path / "_delta_log").is_dir() \
            else None

    return judge_lake(f"delta:{root}", read, DeltaTablesSink(root, sink_id=sink_id).batches(), last_of,
                      expectation)


def judge_kafka(bootstrap: str, expectation: Expectation, sink_id: str = "user_counts") -> Verdict:
    """Judge Example 5-1 in Kafka topics (``--sink kafka``) against the expectation.

    The auditor's own consumer reads ``user_counts`` and ``global_counts`` with
    ``read_committed`` (what the sink's readers see) and adds up each key's per-batch counts;
    the markers are the records of ``onceflow_batches.<sink_id>``.
    """
    from onceflow.verify.kafka_rig import read_markers, read_records

    users: dict[tuple[str, int], int] = {}
    for _, value in read_records(bootstrap, "user_counts"):
        row = json.loads(value or b"{}")
        key = (str(row["user"]), int(row["window_start_ms"]))
        users[key] = users.get(key, 0) + int(row["count"])
    glob: dict[int, int] = {}
    for _, value in read_records(bootstrap, "global_counts"):
        row = json.loads(value or b"{}")
        glob[int(row["window_start_ms"])] = glob.get(int(row["window_start_ms"]), 0) + int(row["count"])
    return judge(f"kafka:{bootstrap}", users, glob, read_markers(bootstrap, sink_id), expectation)


def _staged(db: str | Path, sink_id: str) -> list[int]:
    """Batches a SQLite sink staged and did not apply (none after a run that ended cleanly)."""
    if not Path(db).exists():
        return []
    conn = sqlite3.connect(str(db))
    try:
        if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'onceflow_staged'").fetchone():
            return []
        return [r[0] for r in conn.execute(
            "SELECT batch_id FROM onceflow_staged WHERE sink_id = ? ORDER BY batch_id", (sink_id,))]
    finally:
        conn.close()


def judge_postgres(dsn: str, expectation: Expectation, sink_id: str = "user_counts",
                   gid_prefix: str | None = None) -> Verdict:
    """Judge a PostgreSQL Example 5-1 sink (any protocol) against the expectation.

    Besides the counts and markers, a prepared transaction of the sink still pending
    after the run is a violation (two-phase commit must always be resolved).

    Args:
        dsn: Connection string (its ``search_path`` selects the schema).
        expectation: From :func:`onceflow.verify.oracle.expect`.
        sink_id: The sink's marker namespace.
        gid_prefix: Prepared transactions that count as the sink's (default ``of:<sink_id>``;
            the executor-side sinks prepare one per table: ``of:<sink_id>.<table>:...``).

    Returns:
        The verdict.
    """
    from onceflow.sinks.postgres import sql as pg

    users, glob = read_pg_counts(dsn)
    with pg.session(dsn) as conn:
        pending = pg.prepared_gids(conn, gid_prefix or f"of:{sink_id}")
    verdict = judge(f"postgres:{pg.redact(dsn)}", users, glob, pg.read_batches(dsn, sink_id),
                    expectation)
    if pending:
        verdict.violations.append(f"{len(pending)} prepared transactions left unresolved: "
                                  f"{pending[:3]}")
    return verdict


def judge_effects(service_db: str | Path, ledger: str | Path, expectation: Expectation,
                  sink_id: str = "user_counts") -> Verdict:
    """Judge Example 5-1 written as effects (``--sink http``) from what the *service* recorded.

    Every applied effect of ``user_counts`` / ``global_counts`` is one per-batch delta; their
    sums per window must equal the expectation. Also violations: a key applied more than once,
    a key that reached the service with two payloads, a key the ledger left unconfirmed.

    Args:
        service_db: The demo service's database (its own record of every call and effect).
        ledger: The sink's ledger (markers, with late drops, and unconfirmed keys): a SQLite file's
            path, or a PostgreSQL connection string (``http-tasks-pg``).
        expectation: From :func:`onceflow.verify.oracle.expect`.
        sink_id: The sink's id (key prefix and marker namespace).

    Returns:
        The verdict.
    """
    from onceflow.verify.service import read_effects

    users: Counter[tuple[str, int]] = Counter()
    glob: Counter[int] = Counter()
    applied: Counter[str] = Counter()
    for e in read_effects(service_db):
        applied[e["key"]] += 1
        table, p = e["key"].split("/")[1], e["payload"]
        if table == "user_counts":
            users[(p["user"], int(p["window_start_ms"]))] += int(p["count"])
        elif table == "global_counts":
            glob[int(p["window_start_ms"])] += int(p["count"])
    payloads: dict[str, set[str]] = {}
    for c in read_effects(service_db, calls=True):
        payloads.setdefault(c["key"], set()).add(json.dumps(c["payload"], sort_keys=True))
    batches = read_ledger_batches(ledger, sink_id)
    verdict = judge(f"http:{service_db}", dict(users), dict(glob), batches, expectation)
    twice = sorted(k for k, n in applied.items() if n > 1)
    if twice:
        verdict.violations.append(f"{len(twice)} effects applied more than once: {twice[:3]}")
    versions = sorted(k for k, v in payloads.items() if len(v) > 1)
    if versions:
        verdict.violations.append(f"{len(versions)} keys reached the service with two payloads: "
                                  f"{versions[:3]}")
    left = started_keys(ledger, sink_id)
    if left:
        verdict.violations.append(f"{left} effects started and never confirmed in the ledger")
    return verdict


def started_keys(ledger: str | Path, sink_id: str) -> int:
    """Keys the ledger left ``started`` (never confirmed); 0 when it has no effects table yet."""
    query = "SELECT count(*) FROM onceflow_effects WHERE sink_id = {p} AND state = 'started'"
    if not is_dsn(ledger):
        if not Path(ledger).exists():
            return 0
        conn = sqlite3.connect(str(ledger))
        try:
            return int(conn.execute(query.format(p="?"), (sink_id,)).fetchone()[0])
        except sqlite3.OperationalError:
            return 0
        finally:
            conn.close()
    from psycopg import errors

    from onceflow.sinks.postgres import sql as pg

    with pg.connect(str(ledger)) as conn:
        try:
            return int(conn.execute(query.format(p="%s"), (sink_id,)).fetchone()[0])
        except errors.UndefinedTable:
            return 0


def judge(name: str, users: dict[tuple[str, int], int], glob: dict[int, int],
          batches: list[dict[str, int]], expectation: Expectation) -> Verdict:
    """Compare what a sink holds with the expectation.

    Args:
        name: How to name the sink in the verdict.
        users: ``{(user, window_start_ms): count}`` found.
        glob: ``{window_start_ms: count}`` found.
        batches: The sink's markers (dicts with ``batch_id`` and ``late_dropped``).
        expectation: From :func:`onceflow.verify.oracle.expect`.

    Returns:
        The verdict.
    """
    tables = {
        "user_counts": diff_counts(expectation.user_counts, users),  # type: ignore[arg-type]
        "global_counts": diff_counts(expectation.global_counts, glob),  # type: ignore[arg-type]
    }
    markers = {b["batch_id"]: b for b in batches}
    verdict = Verdict(name, tables, 0, 0)
    for b in expectation.batches:
        verdict.late_expected += b.late_dropped
        marker = markers.get(b.batch_id)
        if marker is None:  # every batch reaches foreachBatch, also one without data
            verdict.missing_markers.append(b.batch_id)
            continue
        verdict.late_recorded += int(marker["late_dropped"])
        if int(marker["late_dropped"]) != b.late_dropped:
            verdict.late_mismatches.append(b.batch_id)
    for name, d in tables.items():
        if d.lost_events:
            verdict.violations.append(
                f"{name}: {d.lost_events} events lost ({d.missing_rows} rows missing, "
                f"{d.too_low} rows too low)"
            )
        if d.duplicated_events or d.extra_rows:
            verdict.violations.append(
                f"{name}: {d.duplicated_events} events duplicated ({d.too_high} rows too high, "
                f"{d.extra_rows} unexpected rows)"
            )
    if verdict.missing_markers:
        verdict.violations.append(
            f"batches committed by Spark without a sink marker: {verdict.missing_markers[:10]}"
        )
    if verdict.late_mismatches:
        verdict.violations.append(
            f"late drops recorded {verdict.late_recorded} vs expected {verdict.late_expected}; "
            f"batches differing: {verdict.late_mismatches[:10]}"
        )
    return verdict

"""``onceflow verify --pipeline ... --sink realtime``: a Real-Time Mode pipeline proven, or caught.

The pipeline (``tests/verify/pipelines/auths.py``, written for these tests: card authorizations
read with Spark's Kafka connector, upserted by id with ``onceflow.write_realtime``) runs as real
drivers against a real broker and PostgreSQL while verify SIGKILLs them mid-stream and cuts the
database connections. The table is then checked twice: by verify's oracle, and here by hand
from the records written to the input file (no Spark, no onceflow).
"""

from __future__ import annotations

import decimal
import json
from pathlib import Path
from typing import Any

import psycopg
import pytest

from onceflow.testing import explain, verify_pipeline
from onceflow.verify.pipeline_verdict import postgres_reader
from onceflow.verify.realtime_oracle import RealtimeOracle, expected, judge, refused_by_postgres, rows_beyond
from tests.verify.pipelines import auths
from tests.verify.verify_cli import run_verify as _verify

pytestmark = [pytest.mark.spark, pytest.mark.faults]

AUTHS = str(Path(auths.__file__))


def _table(dsn: str, schema: str, name: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(dsn, autocommit=True) as conn:
        cur = conn.execute(f'SELECT * FROM "{schema}"."{name}"')
        cols = [d.name for d in cur.description or []]
        return {r[0]: dict(zip(cols, r, strict=True)) for r in cur}


@pytest.mark.long  # make test-long (make test's 30 minutes); the 40-round realtime verify there too
def test_kills_and_an_outage_leave_every_authorization_once(tmp_path: Path, pg_dsn: str) -> None:
    """With ``rejects=``: the rows PostgreSQL refuses (a NUL in the currency) are judged too."""
    records = tmp_path / "auths.jsonl"
    sent = auths.write_records(records, 900, seed=5, poison=0.03)
    poisoned = {i for i, a in sent.items() if "\x00" in a["currency"]}
    assert len(poisoned) > 10
    rc, out, rep = _verify(tmp_path / "report", "--pipeline", f"{AUTHS}:build_with_rejects", "--input",
                           str(records), "--source", "kafka", "--sink", "realtime", "--rounds", "3", "--seed",
                           "2", "--keep-sink", env={"ONCEFLOW_PG_DSN": pg_dsn})
    assert rc == 0, out
    rounds = rep["rounds"]
    assert [r["fault"] for r in rounds] == ["kill_random", "sink_outage", "kill_random"], rounds
    # every kill cut off rows written from records Spark had not logged: the restart wrote them again
    assert all(r["rows_at_risk"] > 0 for r in rounds), rounds
    assert "terminated" in rounds[1]["outcome"], rounds[1]
    table = rep["verdict"]["tables"]["authorizations"]
    assert table["expected_rows"] == table["actual_rows"] == len(sent) - len(poisoned), table
    rejected = rep["verdict"]["tables"]["auth_rejects"]
    assert rejected["expected_rows"] == rejected["actual_rows"] == len(poisoned), rejected
    schema = rep["config"]["sink_location"].rsplit(" schema ", 1)[1]
    got = _table(pg_dsn, schema, "authorizations")
    assert set(got) == set(sent) - poisoned
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        rows = conn.execute(f'SELECT record FROM "{schema}".auth_rejects')
        refused = {json.loads(r)["auth_id"] for r, in rows}
    assert refused == poisoned
    for auth_id in got:  # the transform by hand
        a, row = sent[auth_id], got[auth_id]
        assert row["amount"] == decimal.Decimal(a["cents"]) / 100
        assert row["card"] == "**** " + a["card"][-4:]
        assert row["currency"] == a["currency"].upper()
        assert row["at"].strftime("%Y-%m-%dT%H:%M:%S") == a["at"]


@pytest.mark.long  # ~40 s (make test is near its 30 minutes); the oracle's own test below runs in it
def test_a_key_that_does_not_identify_the_record_is_caught(tmp_path: Path, pg_dsn: str) -> None:
    """Through ``onceflow.testing.verify_pipeline``, as a user's own test would run it."""
    records = tmp_path / "auths.jsonl"
    auths.write_records(records, 200, seed=6)
    result = verify_pipeline(f"{AUTHS}:build_by_card", records, workdir=tmp_path / "v", rounds=1,
                             sink="realtime", faults="kill_random", pg_dsn=pg_dsn)
    assert not result.ok
    assert any("does not identify the record" in v for v in result.verdict.violations), explain(result)
    assert (tmp_path / "v" / "report.html").exists()


def test_what_a_realtime_verify_cannot_run_is_refused(tmp_path: Path) -> None:
    records = tmp_path / "r.jsonl"
    records.write_text(json.dumps({"value": {"auth_id": "a"}}) + "\n")
    cases = [(["--source", "log"], "--source kafka"),
             (["--source", "kafka", "--faults", "crash_inside_sink_txn"], "drop ['crash_inside_sink_txn']"),
             (["--source", "kafka", "--cluster", "local"], "--cluster")]
    for args, says in cases:
        rc, out, _ = _verify(tmp_path / "r", "--pipeline", f"{AUTHS}:build", "--input", str(records),
                             "--sink", "realtime", *args, env={"ONCEFLOW_PG_DSN": "host=127.0.0.1 dbname=x"})
        assert rc == 2 and says in out, out


def _records(sent: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records as verify's consumer reads them (one partition, offsets in order)."""
    return [{"partition": 0, "offset": i, "key": None, "value": json.dumps(a).encode(), "timestamp_ms": 0,
             "timestamp_type": 0, "headers": []} for i, a in enumerate(sent)]


def test_the_oracle_finds_lost_wrong_unexpected_and_ambiguous_rows(spark: Any, pg_dsn: str) -> None:
    """The oracle's steps 2-4 on records given to it, against a table of PostgreSQL written by hand."""
    sent = [{"auth_id": f"a{i}", "card": f"4000 0000 0000 00{i % 3:02d}", "cents": 1000 + i,
             "currency": "eur", "at": f"2026-11-26T08:00:{i:02d}"} for i in range(6)]
    sent.append(dict(sent[2]))  # a retried send
    sent.append({"card": "4000 0000 0000 0099", "cents": 5})  # no id: the transform drops it
    oracle = RealtimeOracle(f"{AUTHS}:build", "127.0.0.1:9", "auths")
    oracle.records = _records(sent)
    want = expected(oracle.written(spark))
    assert list(want) == ["authorizations"] and want["authorizations"].folded.rows() == 6
    assert not want["authorizations"].conflicting
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE authorizations (auth_id text PRIMARY KEY, card text, "
                     "amount numeric(12,2), currency text, at timestamptz)")
        for a in sent[:6]:
            conn.execute("INSERT INTO authorizations VALUES (%s, %s, %s, %s, %s)",
                         (a["auth_id"], "**** " + a["card"][-4:], decimal.Decimal(a["cents"]) / 100,
                          a["currency"].upper(), a["at"] + "Z"))
    assert judge("pg", want, postgres_reader(pg_dsn)).ok
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # one lost, one wrong, one never sent
        conn.execute("DELETE FROM authorizations WHERE auth_id = 'a0'")
        conn.execute("UPDATE authorizations SET amount = 0 WHERE auth_id = 'a1'")
        conn.execute("INSERT INTO authorizations VALUES ('zz', '**** 0000', 1, 'EUR', now())")
    verdict = judge("pg", want, postgres_reader(pg_dsn))
    table = verdict.tables["authorizations"]
    assert (table.missing_rows, table.too_low, table.extra_rows) == (1, 1, 1), verdict.violations
    # rows at risk of a kill: rows in the table beyond the keys of the records before the logged offsets
    assert rows_beyond(oracle, spark, {0: 3}, 5) == 2  # a0-a2 logged: 2 of 5 rows written beyond
    assert rows_beyond(oracle, spark, {0: 7}, 5) == 0  # the retried send adds no key
    by_card = RealtimeOracle(f"{AUTHS}:build_by_card", "127.0.0.1:9", "auths")
    by_card.records = oracle.records
    ambiguous = expected(by_card.written(spark))["by_card"]
    assert len(ambiguous.conflicting) == 3  # three cards, two amounts each
    assert "does not identify the record" in judge("pg", {"by_card": ambiguous},
                                                   postgres_reader(pg_dsn)).violations[0]


def test_the_oracle_decides_the_rejects_by_a_trial_in_postgres(spark: Any, pg_dsn: str) -> None:
    """A ``rejects=`` table judged against the rows PostgreSQL refuses in a trial, not the writer's word."""
    sent = [{"auth_id": f"r{i}", "card": "4000 0000 0000 0001", "cents": 100 + i, "currency": "eur",
             "at": f"2026-11-26T08:00:{i:02d}"} for i in range(5)]
    sent[1]["currency"] = "e\x00ur"  # PostgreSQL refuses a NUL in text
    oracle = RealtimeOracle(f"{AUTHS}:build_with_rejects", "127.0.0.1:9", "auths")
    oracle.records = _records(sent)
    want = expected(oracle.written(spark))
    assert want["authorizations"].rejects == "auth_rejects"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("CREATE TABLE authorizations (auth_id text PRIMARY KEY, card text, "
                     "amount numeric(12,2), currency text CHECK (currency <> 'USD'), at timestamptz)")
        conn.execute("CREATE TABLE auth_rejects (record text PRIMARY KEY)")
        for a in sent:
            if a["auth_id"] != "r1":
                conn.execute("INSERT INTO authorizations VALUES (%s, %s, %s, %s, %s)",
                             (a["auth_id"], "**** 0001", decimal.Decimal(a["cents"]) / 100, "EUR",
                              a["at"] + "Z"))
        conn.execute("""INSERT INTO auth_rejects VALUES ('{"auth_id":"r1"}')""")

    def refuses(exp: Any) -> set[Any]:
        return refused_by_postgres(pg_dsn, exp)

    assert refuses(want["authorizations"]) == {("r1",)}
    verdict = judge("pg", want, postgres_reader(pg_dsn), refuses)
    assert verdict.ok, verdict.violations
    assert verdict.tables["auth_rejects"].expected_rows == verdict.tables["auth_rejects"].actual_rows == 1
    with psycopg.connect(pg_dsn, autocommit=True) as conn:  # a reject lost, and a good row rejected
        conn.execute("DELETE FROM auth_rejects")
        conn.execute("""INSERT INTO auth_rejects VALUES ('{"auth_id":"r3"}')""")
        conn.execute("DELETE FROM authorizations WHERE auth_id = 'r3'")
    verdict = judge("pg", want, postgres_reader(pg_dsn), refuses)
    text = " | ".join(verdict.violations)
    assert "1 rows PostgreSQL refuses are not in the rejects table (lost), e.g. key ('r1',)" in text, text
    assert "e.g. key ('r3',) (PostgreSQL takes its row: it belongs in the table)" in text, text
    assert verdict.tables["authorizations"].missing_rows == 1
    sent[2]["currency"] = "usd"  # the table's CHECK refuses it (class 23): the trial sees constraints too
    oracle.records = _records(sent)
    assert refuses(expected(oracle.written(spark))["authorizations"]) == {("r1",), ("r2",)}

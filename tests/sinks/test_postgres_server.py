"""The real PostgreSQL server the Postgres sinks are tested against (issue: Postgres sinks)."""

from __future__ import annotations

import psycopg


def test_server_supports_two_phase_commit(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert conn.info.server_version >= 150000
        assert int(conn.execute("SHOW max_prepared_transactions").fetchone()[0]) > 0
        conn.execute("CREATE TABLE t(x int)")
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t VALUES (1)")
        conn.execute("PREPARE TRANSACTION 'onceflow-test-1'")
    # a prepared transaction survives its session and is committed from another one
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        gids = [r[0] for r in conn.execute("SELECT gid FROM pg_prepared_xacts")]
        assert gids == ["onceflow-test-1"]
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 0
        conn.execute("COMMIT PREPARED 'onceflow-test-1'")
        assert conn.execute("SELECT count(*) FROM t").fetchone()[0] == 1
        assert conn.execute("SELECT count(*) FROM pg_prepared_xacts").fetchone()[0] == 0

"""PostgreSQL connections for every part of onceflow that talks to a server.

The DSN comes from an option or ``ONCEFLOW_PG_DSN``; passwords never reach a message
(:func:`redact`, :func:`scrub`). psycopg 3 is the ``postgres`` extra.
"""

from __future__ import annotations

import os
from typing import Any

from onceflow.errors import ConfigError, PostgresError

DSN_ENV = "ONCEFLOW_PG_DSN"
SECRET_KEYS = ("password", "sslpassword")
"""Connection parameters never shown in a message (key=value and URL forms alike)."""


def require_psycopg() -> Any:
    """The psycopg module, or a ConfigError naming the extra to install.

    Raises:
        ConfigError: psycopg is not installed.
    """
    try:
        import psycopg
    except ImportError:
        raise ConfigError("PostgreSQL support needs psycopg, which is not installed: "
                          "pip install 'onceflow[postgres]'") from None
    return psycopg


def resolve_dsn(dsn: str | None) -> str:
    """The DSN to use: the given one, else ``$ONCEFLOW_PG_DSN``.

    Args:
        dsn: A libpq connection string or URL, or None/empty.

    Returns:
        The DSN.

    Raises:
        ConfigError: Neither is set, or the string does not parse (at once: a typo is never
            retried as if the server were down).
    """
    found = (dsn or "").strip() or os.environ.get(DSN_ENV, "").strip()
    example = "e.g. 'host=127.0.0.1 port=5432 dbname=app user=app'"
    if not found:
        raise ConfigError(
            "no PostgreSQL connection string: pass one (--pg-dsn, or the 'dsn' option of the "
            f"onceflow_postgres data source) or set {DSN_ENV}, {example}"
        )
    try:
        from psycopg.conninfo import conninfo_to_dict
    except ImportError:  # checked where a connection is made (require_psycopg names the extra)
        return found
    try:
        conninfo_to_dict(found)
    except Exception as exc:
        source = "the connection string" if (dsn or "").strip() else f"${DSN_ENV}"
        raise ConfigError(f"{source} does not parse: {scrub(str(exc), found).strip()}; write libpq's "
                          f"key=value pairs or a postgresql:// URL, {example}") from None
    return found


def redact(dsn: str) -> str:
    """The DSN without its secrets, for messages.

    Args:
        dsn: A libpq connection string or URL (a password in a URL's user part included).

    Returns:
        ``key=value`` pairs of every parameter but :data:`SECRET_KEYS`.
    """
    try:
        from psycopg.conninfo import conninfo_to_dict

        params = conninfo_to_dict(dsn)
    except Exception:  # unparsable, or psycopg missing: show nothing of it
        return "<connection string>"
    return " ".join(f"{k}={v}" for k, v in params.items() if k not in SECRET_KEYS)


def scrub(text: str, dsn: str) -> str:
    """Remove the DSN's secrets (and the DSN itself, if quoted whole) from ``text``."""
    try:
        from psycopg.conninfo import conninfo_to_dict

        secrets = [str(v) for k, v in conninfo_to_dict(dsn).items() if k in SECRET_KEYS and v]
    except Exception:
        secrets = []
    for secret in [dsn, *secrets]:
        text = text.replace(secret, "***")
    return text


def connect(dsn: str, autocommit: bool = True) -> Any:
    """Open a psycopg connection.

    Args:
        dsn: Connection string (see :func:`resolve_dsn`).
        autocommit: Whether statements commit on their own (transactions are then
            opened explicitly with ``conn.transaction()``).

    Returns:
        A ``psycopg.Connection``.

    Raises:
        PostgresError: The server cannot be reached or refused the login.
    """
    psycopg = require_psycopg()
    try:
        return psycopg.connect(dsn, autocommit=autocommit, connect_timeout=30)
    except psycopg.Error as exc:
        raise PostgresError(
            f"cannot connect to PostgreSQL ({redact(dsn)}): {scrub(str(exc), dsn).strip()}"
        ) from None

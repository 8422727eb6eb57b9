"""A demo external service for side effects: applies effects, records each one, misbehaves on demand.

``python -m onceflow.verify.service --db effects.db [--port 0] [--ignore-keys]
[--fail-after-apply 0.1] [--timeout-after-apply 0.05] [--fail-before-apply 0.05]`` starts it on
loopback and prints ``listening on http://127.0.0.1:<port>`` once it accepts requests.

Endpoints:

* ``POST /effects`` — apply one effect: a JSON object (e.g. ``{"account": "a", "amount": 12}``),
  with an ``Idempotency-Key`` header. The effect is *applied* by recording it (one row in the
  ``effects`` table of ``--db``, committed before the answer). With ``--honour-keys`` (the
  default) a key applied before is not applied again: the first answer is returned again
  (``200`` with ``"replayed": true``); with ``--ignore-keys`` every call applies — a service
  without idempotency.
* ``GET /effects`` — every applied effect: ``[{"seq", "key", "payload", "applied_ms"}]``.
  Every call received is also recorded (table ``calls``: key, payload, outcome ``applied`` /
  ``replayed`` / ``failed_before``, and the answer it got: ``200``, ``503``, ``500`` or ``late``),
  so a test can see every version of a key that reached it.
* ``POST /moved/{status}`` — a redirect (``3xx``) to ``/effects`` that applies nothing: a moved URL.
* ``GET /price?account=A`` — a price that changes on every call (a non-deterministic lookup
  for enrichment steps): ``{"account": "A", "price": <int>}``.
* ``GET /health``.

Failure injection, decided per call by a seeded RNG (``--seed``):

* ``--fail-before-apply P``: answer ``503`` without applying (a clean failure: retry is safe);
* ``--fail-after-apply P``: apply, then answer ``500`` as if it had failed (the ambiguous RPC);
* ``--timeout-after-apply P``: apply, then hold the answer for ``--hang-s`` seconds (longer
  than the client's timeout: the client sees a timeout; the effect is applied).

Every effect is committed before any answer (SQLite, WAL), so the record of
what was applied survives a kill of the service.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

_SCHEMA = """
CREATE TABLE IF NOT EXISTS effects(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, payload TEXT NOT NULL,
    applied_ms INTEGER NOT NULL);
CREATE INDEX IF NOT EXISTS effects_key ON effects(key);
CREATE TABLE IF NOT EXISTS calls(
    seq INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, payload TEXT NOT NULL,
    outcome TEXT NOT NULL, answer TEXT NOT NULL, received_ms INTEGER NOT NULL);
"""


class EffectService:
    """The service's state: its database, its switches and its RNG.

    Args:
        db: SQLite file that records every applied effect.
        honour_keys: Apply a key at most once (else every call applies).
        fail_before: Share of calls answered 503 without applying.
        fail_after: Share of calls applied, then answered 500.
        timeout_after: Share of calls applied, then held for ``hang_s``.
        hang_s: How long a held answer waits.
        seed: RNG seed of the failure decisions and prices.
    """

    def __init__(self, db: Path, honour_keys: bool = True, fail_before: float = 0.0,
                 fail_after: float = 0.0, timeout_after: float = 0.0, hang_s: float = 30.0,
                 seed: int = 0) -> None:
        for name, p in (("fail_before", fail_before), ("fail_after", fail_after),
                        ("timeout_after", timeout_after)):
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be a probability in [0, 1], got {p}")
        self.conn = sqlite3.connect(str(db), isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")  # WAL: survives a kill of the service
        self.conn.executescript(_SCHEMA)
        self.honour_keys = honour_keys
        self.fail_before, self.fail_after, self.timeout_after = fail_before, fail_after, timeout_after
        self.hang_s = hang_s
        self.rng = random.Random(seed)
        self.prices = 0
        self.lock = asyncio.Lock()

    def _apply(self, key: str, payload: str, answer: str) -> tuple[int, bool]:
        """Record the call and its answer; apply the effect unless ``503`` or a key seen before.

        Returns:
            The effect's sequence number (0 if not applied) and whether it was a replay.
        """
        now = int(time.time() * 1000)
        self.conn.execute("BEGIN IMMEDIATE")
        try:
            row = None
            fail = answer == "503"
            if self.honour_keys and not fail:
                row = self.conn.execute("SELECT seq FROM effects WHERE key = ? ORDER BY seq LIMIT 1",
                                        (key,)).fetchone()
            outcome = "failed_before" if fail else "replayed" if row is not None else "applied"
            self.conn.execute("INSERT INTO calls(key, payload, outcome, answer, received_ms) "
                              "VALUES (?,?,?,?,?)", (key, payload, outcome, answer, now))
            seq = int(row[0]) if row is not None else 0
            if outcome == "applied":
                cur = self.conn.execute("INSERT INTO effects(key, payload, applied_ms) VALUES (?,?,?)",
                                        (key, payload, now))
                seq = int(cur.lastrowid or 0)
            self.conn.execute("COMMIT")
            return seq, row is not None
        except BaseException:
            if self.conn.in_transaction:
                self.conn.execute("ROLLBACK")
            raise

    async def post_effect(self, request: web.Request) -> web.Response:
        """``POST /effects``: apply one effect (see the module)."""
        key = request.headers.get("Idempotency-Key", "")
        if not key:
            return web.json_response({"error": "an Idempotency-Key header is required"}, status=400)
        try:
            payload = json.dumps(await request.json(), sort_keys=True)
        except (ValueError, UnicodeDecodeError):
            return web.json_response({"error": "the body must be a JSON object"}, status=400)
        roll = self.rng.random()
        answer = "200"
        for label, p in (("503", self.fail_before), ("500", self.fail_after), ("late", self.timeout_after)):
            if roll < p:
                answer = label
                break
            roll -= p
        async with self.lock:  # one writer; the commit is short
            seq, replayed = self._apply(key, payload, answer)
        if answer == "503":
            return web.json_response({"error": "injected failure before applying"}, status=503)
        if answer == "500":
            return web.json_response({"error": "injected failure after applying"}, status=500)
        if answer == "late":
            await asyncio.sleep(self.hang_s)
        return web.json_response({"seq": seq, "replayed": replayed})

    async def moved(self, request: web.Request) -> web.Response:
        """``POST /moved/{status}``: answer with that redirect (3xx) to ``/effects``, applying nothing.

        A service behind a moved URL: a client that follows the redirect repeats the POST as a
        GET (301, 302, 303), which ``GET /effects`` answers with 200 without applying anything.
        """
        status = int(request.match_info["status"])
        if not 300 <= status < 400:
            return web.json_response({"error": "the status must be a redirect (3xx)"}, status=400)
        return _redirect(status)

    async def get_effects(self, _: web.Request) -> web.Response:
        """``GET /effects``: every applied effect, in order."""
        rows = self.conn.execute("SELECT seq, key, payload, applied_ms FROM effects ORDER BY seq").fetchall()
        return web.json_response([{"seq": s, "key": k, "payload": json.loads(p), "applied_ms": t}
                                  for s, k, p, t in rows])

    async def get_price(self, request: web.Request) -> web.Response:
        """``GET /price``: a price that changes on every call."""
        self.prices += 1
        return web.json_response({"account": request.query.get("account", ""),
                                  "price": 100 + self.prices % 7 + self.rng.randrange(3)})

    def app(self) -> web.Application:
        """The aiohttp application."""
        app = web.Application()
        app.router.add_post("/effects", self.post_effect)
        app.router.add_get("/effects", self.get_effects)
        app.router.add_post("/moved/{status}", self.moved)
        app.router.add_get("/price", self.get_price)
        app.router.add_get("/health", lambda _: _ok())
        return app


def _redirect(status: int) -> web.Response:
    return web.Response(status=status, headers={"Location": "/effects"})


async def _ok() -> web.Response:
    return web.json_response({"ok": True})


def read_effects(db: str | Path, calls: bool = False) -> list[dict[str, Any]]:
    """The effects a service applied (or every call it received), read from its database.

    Args:
        db: The service's ``--db``.
        calls: Every call received (with its ``outcome``) instead of the applied effects.

    Returns:
        ``[{"seq", "key", "payload", ...}]`` in order; empty before the first.
    """
    if not Path(db).exists():
        return []
    sql = ("SELECT seq, key, payload, outcome FROM calls ORDER BY seq" if calls
           else "SELECT seq, key, payload, applied_ms FROM effects ORDER BY seq")
    last = "outcome" if calls else "applied_ms"
    conn = sqlite3.connect(str(db))
    try:
        rows = conn.execute(sql).fetchall()
    except sqlite3.OperationalError:
        return []
    finally:
        conn.close()
    return [{"seq": s, "key": k, "payload": json.loads(p), last: t} for s, k, p, t in rows]


class ServiceProcess:
    """The demo service as a separate process on loopback (what tests, the demo and benchmarks use).

    Args:
        db: Its ``--db``.
        *flags: Further command line flags (e.g. ``"--ignore-keys"``, ``"--fail-after-apply", "0.1"``).
    """

    def __init__(self, db: str | Path, *flags: str) -> None:
        self.db = Path(db)
        self.flags = list(flags)
        self.proc: Any = None
        self.url = ""
        self.log = self.db

    def start(self, timeout_s: float = 30.0) -> ServiceProcess:
        """Start it and wait for its address.

        Raises:
            RuntimeError: It exited or did not print its address in time.
        """
        import subprocess

        self.log = self.db.with_name(self.db.name + ".log")
        with open(self.log, "w") as out:  # a file, not a pipe: a full pipe would block the service
            self.proc = subprocess.Popen([sys.executable, "-m", "onceflow.verify.service", "--db",
                                          str(self.db), *self.flags], stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for line in self.log.read_text().splitlines():
                if line.startswith("listening on "):
                    self.url = line.split()[-1].strip()
                    return self
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"the demo service did not start (exit {self.proc.returncode}): "
                           f"{self.log.read_text()[-1000:]}")

    @property
    def effects_url(self) -> str:
        """The URL effects are POSTed to."""
        return f"{self.url}/effects"

    def stop(self) -> None:
        """Stop it (SIGKILL; its records are committed before every answer)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *_: object) -> None:
        self.stop()


async def _serve(service: EffectService, port: int) -> None:
    runner = web.AppRunner(service.app(), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    bound = runner.addresses[0][1]
    print(f"listening on http://127.0.0.1:{bound}", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> None:
    """Command line entry (see the module)."""
    ap = argparse.ArgumentParser(prog="python -m onceflow.verify.service",
                                 description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True, help="SQLite file recording every applied effect")
    ap.add_argument("--port", type=int, default=0, help="TCP port on 127.0.0.1 (0: any free port)")
    keys = ap.add_mutually_exclusive_group()
    keys.add_argument("--honour-keys", dest="honour", action="store_true", default=True)
    keys.add_argument("--ignore-keys", dest="honour", action="store_false")
    ap.add_argument("--fail-before-apply", type=float, default=0.0)
    ap.add_argument("--fail-after-apply", type=float, default=0.0)
    ap.add_argument("--timeout-after-apply", type=float, default=0.0)
    ap.add_argument("--hang-s", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    try:
        service = EffectService(args.db, args.honour, args.fail_before_apply, args.fail_after_apply,
                                args.timeout_after_apply, args.hang_s, args.seed)
    except ValueError as exc:
        ap.error(str(exc))
    try:
        asyncio.run(_serve(service, args.port))
    except KeyboardInterrupt:
        sys.exit(0)


if __name__ == "__main__":
    main()

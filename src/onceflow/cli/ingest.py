"""``onceflow ingest serve`` (the receiver) and ``onceflow send`` (a sender with an outbox)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from onceflow.cli.options import Duration, fraction, read_secret_file, secret_dsn


@click.group()
def ingest() -> None:
    """The exactly-once ingest receiver."""


@ingest.command()
@click.option("--log", "log_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Event log directory the receiver appends to (it must be its only writer).")
@click.option("--catalog", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="SQLite file of the dedup catalog (or use --catalog-dsn / --catalog-dsn-file).")
@click.option("--catalog-dsn", default=None, envvar="ONCEFLOW_CATALOG_DSN", show_envvar=True,
              callback=secret_dsn,
              help="Keep the dedup catalog in PostgreSQL instead (libpq DSN or URL); prefer the "
                   "environment variable or --catalog-dsn-file, which keep a password out of ps.")
@click.option("--catalog-dsn-file", type=click.Path(dir_okay=False), default=None,
              help="Read the PostgreSQL DSN of the catalog from this file.")
@click.option("--catalog-name", default="ingest", show_default=True,
              help="Name of the catalog in PostgreSQL ([a-z0-9_], one receiver per name).")
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to bind; other than loopback needs --tokens or --tls-client-ca "
                   "(or --allow-unauthenticated).")
@click.option("--port", default=8787, show_default=True, type=click.IntRange(0, 65535))
@click.option("--tokens", "tokens_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Token file: lines '<sender-name> <token>' (or sha256:<hex>); requests need "
                   "'Authorization: Bearer <token>' and may only use their own sender name.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Serve HTTPS with this certificate (PEM; with --tls-key).")
@click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--tls-client-ca", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Require client certificates signed by this CA (mutual TLS); without --tokens "
                   "the certificate's common name is the sender name.")
@click.option("--allow-unauthenticated", is_flag=True,
              help="Serve without authentication on a non-loopback address (anyone who reaches "
                   "the port can send as any sender).")
@click.option("--id-scope", type=click.Choice(["sender", "global"]), default="sender", show_default=True,
              help="sender: the log keeps ids as '<sender>/<event_id>' (no sender can squat another's "
                   "ids); global: ids are shared by all senders.")
@click.option("--gc-delay", default="1h", show_default=True, type=Duration(),
              help="How long event ids are remembered (sender system time).")
@click.option("--bucket", default="10m", show_default=True, type=Duration(),
              help="System-time bucket of the rolling Bloom filters.")
@click.option("--max-clock-skew", default="5m", show_default=True, type=Duration(),
              help="How far system_time / event_time may be ahead of the receiver's clock.")
@click.option("--expected-rate", default=10_000.0, show_default=True, type=float,
              help="Expected new events per second (sizes the Bloom filters).")
@click.option("--fpr", default=0.01, show_default=True, type=float, callback=fraction,
              help="Target false-positive rate of a fresh id's check (split over the live buckets' filters).")
@click.option("--max-events", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Most events one request may carry (more: 413); bodies may be 2 KiB per event.")
@click.option("--max-requests", default=64, show_default=True, type=click.IntRange(min=1),
              help="Most POSTs in progress at once (more: 503, retried by senders).")
@click.option("--max-inflight-mb", default=64, show_default=True, type=click.IntRange(min=1),
              help="Most request-body megabytes in progress at once (more: 503).")
@click.option("--body-timeout", default="30s", show_default=True, type=Duration(),
              help="Longest a request body may take to arrive (slower: 408).")
def serve(log_dir: Path, catalog: Path | None, catalog_dsn: str | None, catalog_dsn_file: str | None,
          catalog_name: str, host: str, port: int, tokens_file: Path | None, tls_cert: Path | None,
          tls_key: Path | None, tls_client_ca: Path | None, allow_unauthenticated: bool, id_scope: str,
          gc_delay: float, bucket: float, max_clock_skew: float, expected_rate: float, fpr: float,
          max_events: int, max_requests: int, max_inflight_mb: int, body_timeout: float) -> None:
    """Receive events over HTTP (POST /v1/events), deduplicate, append to the log exactly once."""
    from onceflow.errors import OnceflowError
    from onceflow.ingest.auth import TokenFile, is_loopback, server_tls
    from onceflow.ingest.catalog import CatalogConfig
    from onceflow.ingest.catalog.store import CatalogStore
    from onceflow.ingest.events import Limits
    from onceflow.ingest.receiver import Receiver
    from onceflow.ingest.server import IngestServer, ServerConfig
    from onceflow.ingest.server import serve as run_server

    catalog_dsn = read_secret_file(catalog_dsn_file, "a PostgreSQL DSN") or catalog_dsn
    if (catalog is None) == (catalog_dsn is None):
        raise click.UsageError("give the dedup catalog: --catalog FILE (SQLite) or --catalog-dsn DSN "
                               "(PostgreSQL), not both")
    if (tls_cert is None) != (tls_key is None) or (tls_client_ca is not None and tls_cert is None):
        raise click.UsageError("TLS needs --tls-cert and --tls-key together (and both for --tls-client-ca)")
    authenticated = tokens_file is not None or tls_client_ca is not None
    if not authenticated and not is_loopback(host):
        if not allow_unauthenticated:
            raise click.UsageError(f"--host {host} is reachable from other machines and no authentication "
                                   "is configured: give --tokens FILE (or --tls-client-ca), or "
                                   "--allow-unauthenticated if anyone who reaches the port may send")
        click.echo(f"onceflow ingest: WARNING: serving WITHOUT AUTHENTICATION on {host}:{port}: anyone who "
                   "reaches this port can send events under any sender name", err=True)
    elif not authenticated:
        click.echo("onceflow ingest: no authentication (loopback only): any local process can send under "
                   "any sender name; give --tokens FILE to require tokens", err=True)
    try:
        limits = Limits(max_events=max_events, max_clock_skew_s=max_clock_skew)
        cfg = CatalogConfig(gc_delay_s=gc_delay, bucket_s=min(bucket, gc_delay),
                            expected_rate_per_s=expected_rate, fpr=fpr,
                            max_clock_skew_s=min(max_clock_skew, gc_delay))
        server_cfg = ServerConfig(limits=limits, tokens=TokenFile(tokens_file) if tokens_file else None,
                                  mtls=tls_client_ca is not None, id_scope=id_scope,
                                  body_timeout_s=body_timeout, max_requests=max_requests,
                                  max_inflight_bytes=max(max_inflight_mb << 20, limits.max_body_bytes))
        tls = server_tls(tls_cert, tls_key, tls_client_ca) if tls_cert and tls_key else None
        store: Path | CatalogStore
        if catalog_dsn is not None:
            from onceflow.ingest.catalog.pgstore import PostgresStore

            store = PostgresStore(catalog_dsn, catalog_name)
        else:
            assert catalog is not None
            store = catalog
        receiver = Receiver(log_dir, store, cfg, id_scope=id_scope)
    except OnceflowError as exc:
        raise click.ClickException(str(exc)) from exc
    run_server(IngestServer(receiver, server_cfg), host, port, tls)


@ingest.command()
@click.option("--sender", "sender_name", required=True, help="The sender name the token is for.")
@click.option("--tokens", "tokens_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Append the token's line to this token file (created with mode 600 if missing) "
                   "and print only the token.")
def token(sender_name: str, tokens_file: Path | None) -> None:
    """Make a new random token for a sender.

    The token goes to the sender (``onceflow send --token-file``, or ONCEFLOW_SENDER_TOKEN);
    the receiver's token file gets the line ``<sender> sha256:<digest>``, which reveals no
    token. A running receiver picks the new line up within a second.
    """
    import os

    from onceflow.ingest.auth import new_token
    from onceflow.ingest.events import SENDER_RE

    if not SENDER_RE.match(sender_name):
        raise click.BadParameter("must match [A-Za-z0-9._-]{1,64}", param_hint="--sender")
    secret, hashed = new_token()
    if tokens_file is None:
        click.echo(f"token:      {secret}")
        click.echo(f"token file: {sender_name} {hashed}")
        return
    fd = os.open(tokens_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "a", encoding="utf-8") as f:
        f.write(f"{sender_name} {hashed}\n")
    click.echo(secret)


@click.command()
@click.option("--url", required=True, help="The receiver, e.g. http://127.0.0.1:8787")
@click.option("--outbox", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="This sender's durable outbox (SQLite); reuse it to resume after a crash.")
@click.option("--sender-id", required=True, help="This sender's name.")
@click.option("--token-file", type=click.Path(dir_okay=False), default=None,
              help="File holding this sender's bearer token (or set ONCEFLOW_SENDER_TOKEN).")
@click.option("--ca-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Verify an https:// receiver against this CA certificate (PEM).")
@click.option("--client-cert", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Client certificate (PEM) for a receiver that requires mutual TLS.")
@click.option("--client-key", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--events", default=0, show_default=True, type=click.IntRange(min=0),
              help="Generate this many events (unguessable ids 'ev-<sender>-<n>-<hmac>') into the "
                   "outbox first.")
@click.option("--input", "inputs", multiple=True, type=click.Path(exists=True, path_type=Path),
              help="Send the events of these Parquet segments (files or directories, e.g. from "
                   "'onceflow generate') instead of generated ones; repeatable.")
@click.option("--rate", default=0.0, show_default=True, type=float,
              help="Put at most this many events per second into the outbox (0: no limit).")
@click.option("--batch-size", default=1_000, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int)
def send(url: str, outbox: Path, sender_id: str, token_file: str | None, ca_file: Path | None,
         client_cert: Path | None, client_key: Path | None, events: int, inputs: tuple[Path, ...],
         rate: float, batch_size: int, seed: int) -> None:
    """Send events with retries until acked (resumes a crashed sender's outbox first).

    Generated event ids are unguessable by others (an HMAC of the event's number under a
    key kept beside the outbox, ``OUTBOX.idkey``) and the same after a restart; with
    ``--input`` the events keep their ids and fields (the sender stamps its own system
    time). The number of events put into the outbox so far is kept beside it, so a sender
    killed and restarted with the same arguments resumes: no event is skipped, and one
    stored twice is the same event (deduplicated by the receiver).
    """
    import os

    from onceflow.errors import OnceflowError
    from onceflow.ingest.auth import client_tls
    from onceflow.ingest.sender import Sender, id_key

    token = read_secret_file(token_file, "a sender token") or os.environ.get("ONCEFLOW_SENDER_TOKEN") or None
    try:
        source = _FileEvents(inputs) if inputs else _Generated(sender_id, events, seed, id_key(outbox))
        tls = client_tls(ca_file, client_cert, client_key) if url.startswith("https:") else None
        sender = Sender(url, outbox, sender_id, batch_size=batch_size, token=token, ssl_context=tls)
    except OnceflowError as exc:
        raise click.UsageError(str(exc)) from exc
    left = sender.flush()  # what a previous life left behind
    made = _generated(outbox)
    t0 = time.monotonic()
    start = made
    for chunk in source.chunks(made, batch_size):  # an OnceflowError: one 'onceflow: error:' line, exit 1
        sender.send(chunk)
        made += len(chunk)
        _set_generated(outbox, made)
        left = sender.flush()
        if rate > 0:
            time.sleep(max(0.0, (made - start) / rate - (time.monotonic() - t0)))
    left = sender.flush()
    s = sender.stats
    click.echo(f"sent: {made} events put into the outbox, {s.acked} acked ({s.duplicates} were "
               f"duplicates of an earlier try), {s.rejected} rejected, {s.retries} retries, {left} left")
    sender.close()
    if s.rejected:
        raise SystemExit(f"{s.rejected} events were rejected by the receiver; they are in the "
                         f"outbox_rejected table of {outbox} with the reason")


class _Generated:
    """``--events N``: synthetic events with unguessable ids (:func:`generated_id`)."""

    def __init__(self, sender_id: str, events: int, seed: int, key: bytes) -> None:
        self.sender_id, self.events, self.seed, self.key = sender_id, events, seed, key

    def chunks(self, skip: int, size: int) -> Iterator[list[dict[str, Any]]]:
        import random

        from onceflow.ingest.sender import generated_id

        rng = random.Random(self.seed * 1_000_003 + skip)
        for lo in range(skip, self.events, size):
            now = time.time_ns() // 1000
            yield [{"event_id": generated_id(self.key, self.sender_id, n),
                    "user": f"user-{rng.randrange(100):05d}",
                    "event_time": now - rng.randrange(5_000_000), "bytes": rng.randrange(1, 10_000)}
                   for n in range(lo, min(lo + size, self.events))]


class _FileEvents:
    """``--input``: the rows of Parquet segments, in file-name order within a directory."""

    def __init__(self, inputs: tuple[Path, ...]) -> None:
        import pyarrow.parquet as pq

        from onceflow.errors import ConfigError

        self.files: list[Path] = []
        for p in inputs:
            self.files += sorted(f for f in p.glob("*.parquet") if not f.name.startswith(".")) \
                if p.is_dir() else [p]
        self.rows = []
        for f in self.files:
            try:
                self.rows.append(pq.ParquetFile(f).metadata.num_rows)
            except Exception as exc:  # pyarrow raises several types for a bad file
                raise ConfigError(f"--input {f} is not a readable Parquet file: {exc}") from None

    def chunks(self, skip: int, size: int) -> Iterator[list[dict[str, Any]]]:
        import pyarrow.parquet as pq

        from onceflow.errors import ConfigError

        cols = ["event_id", "user", "event_time", "bytes"]
        for f, n in zip(self.files, self.rows, strict=True):
            if skip >= n:
                skip -= n
                continue
            try:
                t = pq.read_table(f, columns=cols).slice(skip)
            except Exception as exc:
                raise ConfigError(f"--input {f}: cannot read columns {cols}: {exc}") from None
            skip = 0
            t = t.set_column(2, "event_time", t.column("event_time").cast("int64"))
            for b in t.to_batches(max_chunksize=size):
                yield b.to_pylist()


def _generated(outbox: Path) -> int:
    p = outbox.with_name(outbox.name + ".generated")
    return int(p.read_text()) if p.exists() else 0


def _set_generated(outbox: Path, n: int) -> None:
    p = outbox.with_name(outbox.name + ".generated")
    tmp = p.with_name("." + p.name + ".tmp")
    tmp.write_text(str(n))
    tmp.replace(p)

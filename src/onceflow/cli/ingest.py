"""``onceflow ingest serve`` (the receiver) and ``onceflow send`` (a sender with an outbox)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click

from onceflow.cli.options import Duration, fraction


@click.group()
def ingest() -> None:
    """The exactly-once ingest receiver."""


@ingest.command()
@click.option("--log", "log_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Event log directory the receiver appends to (it must be its only writer).")
@click.option("--catalog", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="SQLite file of the dedup catalog (or use --catalog-dsn).")
@click.option("--catalog-dsn", default=None, envvar="ONCEFLOW_CATALOG_DSN", show_envvar=True,
              help="Keep the dedup catalog in PostgreSQL instead (libpq DSN or URL).")
@click.option("--catalog-name", default="ingest", show_default=True,
              help="Name of the catalog in PostgreSQL ([a-z0-9_], one receiver per name).")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8787, show_default=True, type=click.IntRange(0, 65535))
@click.option("--gc-delay", default="1h", show_default=True, type=Duration(),
              help="How long event ids are remembered (sender system time).")
@click.option("--bucket", default="10m", show_default=True, type=Duration(),
              help="System-time bucket of the rolling Bloom filters.")
@click.option("--expected-rate", default=10_000.0, show_default=True, type=float,
              help="Expected new events per second (sizes the Bloom filters).")
@click.option("--fpr", default=0.01, show_default=True, type=float, callback=fraction,
              help="Target false-positive rate of a fresh id's check (split over the live buckets' filters).")
@click.option("--max-events", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Most events one request may carry (more: 413).")
def serve(log_dir: Path, catalog: Path | None, catalog_dsn: str | None, catalog_name: str, host: str,
          port: int, gc_delay: float, bucket: float, expected_rate: float, fpr: float,
          max_events: int) -> None:
    """Receive events over HTTP (POST /v1/events), deduplicate, append to the log exactly once."""
    from onceflow.dedup import CatalogConfig
    from onceflow.dedup.store import CatalogStore
    from onceflow.errors import OnceflowError
    from onceflow.ingest.receiver import Receiver
    from onceflow.ingest.receiver import serve as run_server

    if (catalog is None) == (catalog_dsn is None):
        raise click.UsageError("give the dedup catalog: --catalog FILE (SQLite) or --catalog-dsn DSN "
                               "(PostgreSQL), not both")
    try:
        cfg = CatalogConfig(gc_delay_s=gc_delay, bucket_s=min(bucket, gc_delay),
                            expected_rate_per_s=expected_rate, fpr=fpr)
        store: Path | CatalogStore
        if catalog_dsn is not None:
            from onceflow.dedup.pgstore import PostgresStore

            store = PostgresStore(catalog_dsn, catalog_name)
        else:
            assert catalog is not None
            store = catalog
        receiver = Receiver(log_dir, store, cfg, max_events=max_events)
    except OnceflowError as exc:
        raise click.ClickException(str(exc)) from exc
    run_server(receiver, host, port)


@click.command()
@click.option("--url", required=True, help="The receiver, e.g. http://127.0.0.1:8787")
@click.option("--outbox", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="This sender's durable outbox (SQLite); reuse it to resume after a crash.")
@click.option("--sender-id", required=True, help="This sender's name.")
@click.option("--events", default=0, show_default=True, type=click.IntRange(min=0),
              help="Generate this many events (ids 'ev-<sender>-<n>') into the outbox first.")
@click.option("--input", "inputs", multiple=True, type=click.Path(exists=True, path_type=Path),
              help="Send the events of these Parquet segments (files or directories, e.g. from "
                   "'onceflow generate') instead of generated ones; repeatable.")
@click.option("--rate", default=0.0, show_default=True, type=float,
              help="Put at most this many events per second into the outbox (0: no limit).")
@click.option("--batch-size", default=1_000, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int)
def send(url: str, outbox: Path, sender_id: str, events: int, inputs: tuple[Path, ...], rate: float,
         batch_size: int, seed: int) -> None:
    """Send events with retries until acked (resumes a crashed sender's outbox first).

    Generated event ids are deterministic (``ev-<sender-id>-<n>``); with ``--input`` the
    events keep their ids and fields (the sender stamps its own system time). The number of
    events put into the outbox so far is kept beside it, so a sender killed and restarted
    with the same arguments resumes: no event is skipped, and one stored twice is the same
    event (deduplicated by the receiver).
    """
    from onceflow.errors import OnceflowError
    from onceflow.ingest.sender import Sender

    try:
        source = _FileEvents(inputs) if inputs else _Generated(sender_id, events, seed)
    except OnceflowError as exc:
        raise click.UsageError(str(exc)) from exc
    sender = Sender(url, outbox, sender_id, batch_size=batch_size)
    left = sender.flush()  # what a previous life left behind
    made = _generated(outbox)
    t0 = time.monotonic()
    start = made
    try:
        for chunk in source.chunks(made, batch_size):
            sender.send(chunk)
            made += len(chunk)
            _set_generated(outbox, made)
            left = sender.flush()
            if rate > 0:
                time.sleep(max(0.0, (made - start) / rate - (time.monotonic() - t0)))
    except OnceflowError as exc:
        raise click.ClickException(str(exc)) from exc
    left = sender.flush()
    s = sender.stats
    click.echo(f"sent: {made} events put into the outbox, {s.acked} acked ({s.duplicates} were "
               f"duplicates of an earlier try), {s.rejected} rejected, {s.retries} retries, {left} left")
    sender.close()
    if s.rejected:
        raise SystemExit(f"{s.rejected} events were rejected by the receiver; they are in the "
                         f"outbox_rejected table of {outbox} with the reason")


class _Generated:
    """``--events N``: synthetic events with ids ``ev-<sender>-<n>``."""

    def __init__(self, sender_id: str, events: int, seed: int) -> None:
        self.sender_id, self.events, self.seed = sender_id, events, seed

    def chunks(self, skip: int, size: int) -> Iterator[list[dict[str, Any]]]:
        import random

        rng = random.Random(self.seed * 1_000_003 + skip)
        for lo in range(skip, self.events, size):
            now = time.time_ns() // 1000
            yield [{"event_id": f"ev-{self.sender_id}-{n}", "user": f"user-{rng.randrange(100):05d}",
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

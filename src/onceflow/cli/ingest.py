"""``onceflow ingest serve`` (the receiver) and ``onceflow send`` (a sender with an outbox)."""

from __future__ import annotations

import time
from pathlib import Path

import click

from onceflow.cli.options import Duration, fraction


@click.group()
def ingest() -> None:
    """The exactly-once ingest receiver."""


@ingest.command()
@click.option("--log", "log_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Event log directory the receiver appends to (it must be its only writer).")
@click.option("--catalog", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="SQLite file of the dedup catalog.")
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8787, show_default=True, type=click.IntRange(0, 65535))
@click.option("--gc-delay", default="1h", show_default=True, type=Duration(),
              help="How long event ids are remembered (sender system time).")
@click.option("--bucket", default="10m", show_default=True, type=Duration(),
              help="System-time bucket of the rolling Bloom filters.")
@click.option("--expected-rate", default=10_000.0, show_default=True, type=float,
              help="Expected new events per second (sizes the Bloom filters).")
@click.option("--fpr", default=0.01, show_default=True, type=float, callback=fraction,
              help="Target false-positive rate of each Bloom filter.")
@click.option("--max-events", default=10_000, show_default=True, type=click.IntRange(min=1),
              help="Most events one request may carry (more: 413).")
def serve(log_dir: Path, catalog: Path, host: str, port: int, gc_delay: float, bucket: float,
          expected_rate: float, fpr: float, max_events: int) -> None:
    """Receive events over HTTP (POST /v1/events), deduplicate, append to the log exactly once."""
    from onceflow.dedup import CatalogConfig
    from onceflow.ingest.receiver import Receiver
    from onceflow.ingest.receiver import serve as run_server

    cfg = CatalogConfig(gc_delay_s=gc_delay, bucket_s=min(bucket, gc_delay),
                        expected_rate_per_s=expected_rate, fpr=fpr)
    run_server(Receiver(log_dir, catalog, cfg, max_events=max_events), host, port)


@click.command()
@click.option("--url", required=True, help="The receiver, e.g. http://127.0.0.1:8787")
@click.option("--outbox", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="This sender's durable outbox (SQLite); reuse it to resume after a crash.")
@click.option("--sender-id", required=True, help="This sender's name.")
@click.option("--events", default=0, show_default=True, type=click.IntRange(min=0),
              help="Generate this many events (ids 'ev-<sender>-<n>') into the outbox first.")
@click.option("--rate", default=0.0, show_default=True, type=float,
              help="Generate at most this many events per second (0: all at once).")
@click.option("--batch-size", default=1_000, show_default=True, type=click.IntRange(min=1))
@click.option("--seed", default=0, show_default=True, type=int)
def send(url: str, outbox: Path, sender_id: str, events: int, rate: float, batch_size: int,
         seed: int) -> None:
    """Send events with retries until acked (resumes a crashed sender's outbox first).

    Event ids are deterministic (``ev-<sender-id>-<n>``) and the count generated so far is kept
    beside the outbox, so a sender killed and restarted with the same arguments resumes: no id
    is skipped, and one generated twice is the same event (deduplicated by the receiver).
    """
    import random

    from onceflow.ingest.sender import Sender

    sender = Sender(url, outbox, sender_id, batch_size=batch_size)
    left = sender.flush()  # what a previous life left behind
    rng = random.Random(seed)
    made = _generated(outbox)
    t0 = time.monotonic()
    while made < events:
        n = min(batch_size, events - made)
        now = time.time_ns() // 1000
        sender.send({"event_id": f"ev-{sender_id}-{made + i}", "user": f"user-{rng.randrange(100):05d}",
                     "event_time": now - rng.randrange(5_000_000), "bytes": rng.randrange(1, 10_000)}
                    for i in range(n))
        made += n
        _set_generated(outbox, made)
        left = sender.flush()
        if rate > 0:
            time.sleep(max(0.0, made / rate - (time.monotonic() - t0)))
    left = sender.flush()
    s = sender.stats
    click.echo(f"sent: {made} events generated, {s.acked} acked ({s.duplicates} were duplicates of "
               f"an earlier try), {s.rejected} rejected, {s.retries} retries, {left} left")
    sender.close()


def _generated(outbox: Path) -> int:
    p = outbox.with_name(outbox.name + ".generated")
    return int(p.read_text()) if p.exists() else 0


def _set_generated(outbox: Path, n: int) -> None:
    p = outbox.with_name(outbox.name + ".generated")
    tmp = p.with_name("." + p.name + ".tmp")
    tmp.write_text(str(n))
    tmp.replace(p)

"""The ingest leg of ``onceflow verify --ingest``: senders -> receiver -> log, under faults.

With ``--ingest`` the verify rounds do not append segments to the log themselves: each
round's input goes through a real ``onceflow send`` process (durable outbox, retries) to a
real ``onceflow ingest serve`` process (dedup catalog, group commit), which is the log's
only writer. Protocol of the rig:

1. At the start one receiver is started on a free loopback port, with authentication on
   (a token file granting the sender name ``verify`` one token; the senders read it from a
   file); with the ``dropped_acks`` fault its replies are dropped at random after the
   commit, so senders retry batches that did get in.
2. Each round writes its input as Parquet files under ``input/round-NNNN`` and starts one
   sender for them (its own outbox, the sender name ``verify``: a producer retry sent in a
   later round is the same id, ``verify/<event_id>`` in the log). Ingest faults of the round: the
   receiver SIGKILLed mid-stream, the receiver dying at one of its crash points
   (restarted with ``ONCEFLOW_CRASH_AT`` before the round, restarted clean after it
   died), or the sender SIGKILLed mid-stream and restarted with the same arguments.
3. A round ends only when its sender exited 0: every event of the round acknowledged.
4. After the last round the receiver is stopped and :func:`check_log` compares the log
   with the input: every distinct ``event_id`` sent must be in the log exactly once (as
   ``verify/<event_id>``: the receiver scopes ids by sender).

The Spark side of each round (driver faults, the oracle) is unchanged: the oracle reads the
log the receiver wrote and Spark's checkpoint.
"""

from __future__ import annotations

import json
import socket
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from onceflow.sources.log import EventLog
from onceflow.verify.crashes import CRASH_ENV, DROP_ACKS_ENV
from onceflow.verify.driver import ProcessGroup

RECEIVER_CRASHES = {
    "receiver_crash_after_stage": "ingest_after_stage",
    "receiver_crash_after_record": "ingest_after_record",
    "receiver_crash_after_publish": "ingest_after_publish",
}
"""Fault name -> receiver crash point (the receiver SIGKILLs itself there)."""

INGEST_ROUND_FAULTS = ["receiver_kill", *RECEIVER_CRASHES, "sender_kill"]
"""Ingest faults that make a round."""

INGEST_INPUT_FAULTS = ["dropped_acks"]
"""Ingest faults that hold for the whole run."""

DROP_ACKS = 0.2
"""Share of receiver replies dropped under the ``dropped_acks`` fault."""

SENDER = "verify"
"""The sender name of every round (ids in the log: ``verify/<event_id>``)."""


def free_port() -> int:
    """A free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class IngestCheck:
    """The ingest leg's finding: the log against what the senders had to deliver.

    Attributes:
        ids_sent: Distinct event ids in the input.
        rows_in_log: Rows in the log.
        lost: Ids sent (and acknowledged) but not in the log.
        duplicated: Extra rows: ids in the log more than once.
        unexpected: Ids in the log that nobody sent.
        receiver_lives: Receiver processes started.
        sender_lives: Sender processes started.
    """

    ids_sent: int
    rows_in_log: int
    lost: int
    duplicated: int
    unexpected: int
    receiver_lives: int = 0
    sender_lives: int = 0
    violations: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every id sent is in the log exactly once."""
        return not self.violations


def check_log(log_dir: Path, sent_ids: set[str]) -> IngestCheck:
    """Step 4: compare the log's event ids with the ids sent.

    Args:
        log_dir: The event log the receiver wrote.
        sent_ids: Every distinct id the senders were given.

    Returns:
        The finding (``violations`` empty when each id is in the log exactly once).
    """
    ids: list[str] = []
    for seg in EventLog(log_dir).segments():
        ids += pq.read_table(seg.path, columns=["event_id"]).column(0).to_pylist()
    found = set(ids)
    chk = IngestCheck(len(sent_ids), len(ids), len(sent_ids - found), len(ids) - len(found),
                      len(found - sent_ids))
    if chk.lost:
        chk.violations.append(f"ingest: {chk.lost} sent events are missing from the log")
    if chk.duplicated:
        chk.violations.append(f"ingest: {chk.duplicated} events were appended to the log more than once")
    if chk.unexpected:
        chk.violations.append(f"ingest: {chk.unexpected} events in the log were never sent")
    return chk


class IngestRig:
    """Runs the receiver and the per-round senders of a verify run (see the module protocol).

    Args:
        work: The verify work directory.
        log_dir: The event log (the receiver is its only writer).
        drop_acks: Share of replies the receiver drops (0: none).
        rate: Events per second each sender puts into its outbox.
    """

    def __init__(self, work: Path, log_dir: Path, drop_acks: float = 0.0, rate: float = 4_000.0) -> None:
        self.work, self.log_dir, self.rate = work, log_dir, rate
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = {DROP_ACKS_ENV: str(drop_acks)} if drop_acks else {}
        self.receiver: ProcessGroup | None = None
        self.sender: ProcessGroup | None = None
        self._sender_args: list[str] = []
        self._sender_out = work / "out" / "sender.out"
        self.receiver_lives = 0
        self.sender_lives = 0
        self.sent_ids: set[str] = set()
        self.tokens = work / "tokens"
        self.sender_token = work / "sender.token"
        if not self.tokens.exists():  # kept across a resumed verify
            from onceflow.ingest.auth import write_token_file

            self.sender_token.write_text(write_token_file(self.tokens, [SENDER])[SENDER])

    def expect(self, tables: list[pa.Table]) -> None:
        """Remember the ids of input sent to the receiver (as the log will hold them)."""
        for t in tables:
            self.sent_ids.update(f"{SENDER}/{i}" for i in t.column("event_id").to_pylist())

    # ------------------------------------------------------------- receiver
    def start_receiver(self, crash_at: str | None = None, timeout: float = 60.0) -> None:
        """Start a receiver life; wait until it answers (or until it died at its crash point)."""
        self.receiver_lives += 1
        env = {**self.env, **({CRASH_ENV: crash_at} if crash_at else {})}
        self.receiver = ProcessGroup(
            ["ingest", "serve", "--log", str(self.log_dir), "--catalog", str(self.work / "catalog.db"),
             "--port", str(self.port), "--tokens", str(self.tokens)],
            self.work / "out" / f"receiver{self.receiver_lives:04d}.out", env)
        deadline = time.monotonic() + timeout
        while self.health() is None:
            if self.receiver.proc.poll() is not None:
                if crash_at and self.receiver.proc.returncode == -9:
                    return  # died at its crash point already
                raise AssertionError(f"the receiver exited with {self.receiver.proc.returncode}: "
                                     f"{self.receiver.output()[-2000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"the receiver did not answer within {timeout} s")
            time.sleep(0.1)

    def kill_receiver(self) -> None:
        """SIGKILL the receiver."""
        if self.receiver is not None:
            self.receiver.kill()

    def health(self) -> dict[str, Any] | None:
        """The receiver's ``/v1/health`` answer, or None while it is down."""
        try:
            with urllib.request.urlopen(f"{self.url}/v1/health", timeout=2) as r:
                return json.loads(r.read())  # type: ignore[no-any-return]
        except (OSError, ValueError):
            return None

    def events_new(self) -> int:
        """Events the current receiver life appended (0 while it is down)."""
        h = self.health()
        return int(h["receiver"]["events_new"]) if h else 0

    # --------------------------------------------------------------- sender
    def feed(self, round_no: int, tables: list[pa.Table]) -> None:
        """Step 2: write the round's input and start its sender."""
        folder = self.work / "input" / f"round-{round_no:04d}"
        folder.mkdir(parents=True, exist_ok=True)
        for i, t in enumerate(tables):
            pq.write_table(t, folder / f"part-{i:05d}.parquet")
        self.expect(tables)
        outbox = self.work / "senders" / f"round-{round_no:04d}.db"
        self._sender_args = ["send", "--url", self.url, "--outbox", str(outbox), "--sender-id", SENDER,
                             "--token-file", str(self.sender_token), "--input", str(folder),
                             "--batch-size", "500", "--rate", str(self.rate)]
        self.start_sender()

    def start_sender(self) -> None:
        """Start (or restart, resuming its outbox) the round's sender."""
        self.sender_lives += 1
        self.sender = ProcessGroup(self._sender_args, self._sender_out)

    def kill_sender(self) -> None:
        """SIGKILL the round's sender."""
        if self.sender is not None:
            self.sender.kill()

    def wait_sender(self, timeout: float) -> None:
        """Step 3: wait until the round's sender delivered everything and exited 0.

        Raises:
            AssertionError: It failed or did not finish in time.
        """
        assert self.sender is not None
        rc = self.sender.wait(timeout=timeout)
        if rc != 0:
            raise AssertionError(f"the sender exited with {rc}: {self.sender.output()[-2000:]}")

    def stop(self) -> IngestCheck:
        """Step 4: stop the processes and check the log against the input."""
        if self.sender is not None and self.sender.proc.poll() is None:
            self.kill_sender()
        self.kill_receiver()
        chk = check_log(self.log_dir, self.sent_ids)
        chk.receiver_lives, chk.sender_lives = self.receiver_lives, self.sender_lives
        return chk

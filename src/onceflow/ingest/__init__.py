"""Exactly-once ingest: senders with a durable outbox -> HTTP receiver -> dedup catalog -> event log."""

"""Durable local files: flush a file or a directory to stable storage, hash a file's bytes.

Used where a file must survive a crash once written (stable copies, the event log's segments, the
sender's clock) and where a fetched jar is checked against its pinned SHA-256.
"""

from __future__ import annotations

import hashlib
import os


def fsync_path(path: str | os.PathLike[str]) -> None:
    """Flush a file or a directory (its entries: a rename into it) to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def file_sha256(path: str | os.PathLike[str]) -> str:
    """The SHA-256 of a file's bytes (hex), read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

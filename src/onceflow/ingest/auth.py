"""Who may send to the ingest receiver: bearer tokens from a file, and TLS.

Token file (``onceflow ingest serve --tokens FILE``), kept by the operator; one line per
token, ``#`` starts a comment::

    # sender-name   token (>= 16 characters), or sha256:<hex digest of the token>
    billing-eu      4f0c1c1e0b6a4e53a3f9d2c8
    billing-us      sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08

A sender name may have several tokens (rotation: add the new one, move the senders, delete
the old one). The file is read again when it changes (checked at most once a second); a
file that no longer parses keeps the previous tokens in force and is reported on stderr.
Tokens are compared by their SHA-256 digest, so the file may hold digests only
(``onceflow ingest token`` prints a new token and its digest line).

A request's ``Authorization: Bearer <token>`` names its sender; every event of the request
must carry that sender name (else 403). With mutual TLS and no token file, the client
certificate's common name is the sender name instead.
"""

from __future__ import annotations

import hashlib
import ipaddress
import os
import re
import secrets
import ssl
import stat
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from onceflow.errors import ConfigError
from onceflow.ingest.events import SENDER_RE

MIN_TOKEN_CHARS = 16
_LINE = re.compile(r"^(\S+)\s+(\S+)$")


def digest(token: str) -> bytes:
    """The SHA-256 digest a token is known by."""
    return hashlib.sha256(token.encode("utf-8")).digest()


def new_token() -> tuple[str, str]:
    """A fresh random token and its ``sha256:<hex>`` form for the token file."""
    token = secrets.token_urlsafe(24)
    return token, "sha256:" + digest(token).hex()


def write_token_file(path: Path, senders: list[str]) -> dict[str, str]:
    """Create a token file granting each sender one new token (digests only, mode 600).

    Args:
        path: The file to (over)write.
        senders: Sender names.

    Returns:
        Sender name -> its token (to hand to that sender).
    """
    tokens, lines = {}, []
    for name in senders:
        tokens[name], hashed = new_token()
        lines.append(f"{name} {hashed}\n")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write("".join(lines))
    return tokens


def parse_tokens(text: str, source: str) -> dict[bytes, str]:
    """Parse a token file.

    Args:
        text: The file's content.
        source: Its name, for messages.

    Returns:
        Token digest -> sender name.

    Raises:
        ConfigError: A line that is not ``<sender> <token>``, a bad sender name, a short
            token, or one token given to two senders.
    """
    out: dict[bytes, str] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _LINE.match(line)
        if m is None:
            raise ConfigError(f"{source} line {n}: expected '<sender-name> <token>'")
        sender, token = m.groups()
        if not SENDER_RE.match(sender):
            raise ConfigError(f"{source} line {n}: sender name must match [A-Za-z0-9._-]{{1,64}}")
        if token.startswith("sha256:"):
            try:
                key = bytes.fromhex(token[len("sha256:"):])
            except ValueError:
                key = b""
            if len(key) != 32:
                raise ConfigError(f"{source} line {n}: sha256: needs 64 hex digits")
        elif len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(f"{source} line {n}: tokens need at least {MIN_TOKEN_CHARS} characters "
                              "('onceflow ingest token' makes one)")
        else:
            key = digest(token)
        if out.get(key, sender) != sender:
            raise ConfigError(f"{source} line {n}: this token already belongs to sender {out[key]!r}")
        out[key] = sender
    if not out:
        raise ConfigError(f"{source} holds no tokens: add lines '<sender-name> <token>'")
    return out


@dataclass
class TokenFile:
    """The token file, re-read when it changes.

    Args:
        path: The file.

    Raises:
        ConfigError: It is missing or does not parse (at start-up).
    """

    path: Path
    _tokens: dict[bytes, str] = field(default_factory=dict)
    _stamp: tuple[int, int] = (0, 0)
    _checked: float = 0.0

    def __post_init__(self) -> None:
        try:
            st = self.path.stat()
        except OSError as exc:
            raise ConfigError(f"--tokens {self.path}: {exc.strerror}") from None
        if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            print(f"onceflow ingest: warning: the token file {self.path} is readable by other users; "
                  f"chmod 600 it (or keep only sha256: digests in it)", file=sys.stderr, flush=True)
        self._load(st)

    def _load(self, st: os.stat_result) -> None:
        self._tokens = parse_tokens(self.path.read_text(encoding="utf-8"), str(self.path))
        self._stamp = (st.st_mtime_ns, st.st_size)

    def _refresh(self) -> None:
        now = time.monotonic()
        if now - self._checked < 1.0:
            return
        self._checked = now
        try:
            st = self.path.stat()
            if (st.st_mtime_ns, st.st_size) != self._stamp:
                self._load(st)
                print(f"onceflow ingest: reloaded {len(self._tokens)} tokens from {self.path}",
                      file=sys.stderr, flush=True)
        except (OSError, ConfigError, UnicodeDecodeError) as exc:
            print(f"onceflow ingest: error: cannot reload {self.path} ({exc}); the previous tokens "
                  "stay in force", file=sys.stderr, flush=True)

    def sender(self, authorization: str | None) -> str | None:
        """The sender an ``Authorization`` header authenticates, or None."""
        if not authorization or not authorization.startswith("Bearer "):
            return None
        self._refresh()
        return self._tokens.get(digest(authorization[len("Bearer "):].strip()))

    @property
    def senders(self) -> set[str]:
        """Sender names that have a token."""
        return set(self._tokens.values())


def server_tls(cert: Path, key: Path, client_ca: Path | None) -> ssl.SSLContext:
    """The receiver's TLS context (mutual TLS when ``client_ca`` is given).

    Raises:
        ConfigError: A file cannot be loaded.
    """
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(cert, key)
        if client_ca is not None:
            ctx.load_verify_locations(client_ca)
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS files ({cert}, {key}, {client_ca}): {exc}") from None
    return ctx


def client_tls(ca: Path | None, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A sender's TLS context: verify the receiver against ``ca`` (else the system's CAs).

    Raises:
        ConfigError: A file cannot be loaded.
    """
    try:
        ctx = ssl.create_default_context(cafile=str(ca) if ca else None)
        if cert is not None:
            ctx.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"cannot load the TLS files ({ca}, {cert}, {key}): {exc}") from None
    return ctx


def peer_common_name(peercert: dict[str, object] | None) -> str | None:
    """The common name of a verified client certificate (``SSLSocket.getpeercert()``)."""
    for rdn in (peercert or {}).get("subject", ()):  # type: ignore[attr-defined]
        for name, value in rdn:
            if name == "commonName":
                return str(value)
    return None


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` keeps the port on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False

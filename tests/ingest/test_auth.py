"""Authentication end to end: tokens, TLS and mutual TLS, token rotation, refusals that keep data."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from onceflow.errors import SenderRefusedError
from onceflow.ingest.auth import client_tls
from onceflow.ingest.sender import Sender
from tests.ingest.receiver_proc import Proc, Receiver, body, event, free_port, health, log_ids, write_tokens

pytestmark = pytest.mark.faults


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, a server certificate for 127.0.0.1 and a client certificate with CN 'alice'."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
             "-days", "2", "-subj", "/CN=onceflow test CA", cwd=d)
    (d / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ext in (("server", ["-extfile", "server.ext"]), ("alice", [])):
        _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                 "-subj", f"/CN={'127.0.0.1' if name == 'server' else name}", cwd=d)
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", *ext, cwd=d)
    return d


def _tls_receiver(tmp: Path, pki: Path, *extra: str) -> tuple[Proc, int]:
    port = free_port()
    proc = Proc(["ingest", "serve", "--log", str(tmp / "log"), "--catalog", str(tmp / "cat.db"),
                 "--port", str(port), "--tls-cert", str(pki / "server.pem"),
                 "--tls-key", str(pki / "server.key"), *extra], tmp / "rx.out")
    ctx = client_tls(pki / "ca.pem", pki / "alice.pem", pki / "alice.key")
    deadline = time.monotonic() + 60
    import urllib.request

    while True:
        try:
            urllib.request.urlopen(f"https://127.0.0.1:{port}/v1/health", timeout=2, context=ctx).read()
            return proc, port
        except OSError:
            assert proc.p.poll() is None, (tmp / "rx.out").read_text()
            assert time.monotonic() < deadline
            time.sleep(0.1)


def test_tokens_over_tls(tmp_path: Path, pki: Path) -> None:
    tokens = write_tokens(tmp_path, "alice")
    proc, port = _tls_receiver(tmp_path, pki, "--tokens", str(tmp_path / "tokens"))
    try:
        url = f"https://127.0.0.1:{port}"
        plain = Sender(url.replace("https", "http"), tmp_path / "plain.db", "alice", token=tokens["alice"])
        plain.send([event("p", "alice")])
        assert plain.flush(deadline_s=1) == 1  # plain HTTP to a TLS port: never delivered
        s = Sender(url, tmp_path / "out.db", "alice", token=tokens["alice"],
                   ssl_context=client_tls(pki / "ca.pem"))
        s.send([event(f"e{i}", "alice") for i in range(20)])
        assert s.flush() == 0 and s.stats.acked == 20
        unverified = Sender(url, tmp_path / "unv.db", "alice", token=tokens["alice"],
                            ssl_context=client_tls(None))  # system CAs do not know the test CA
        unverified.send([event("u", "alice")])
        assert unverified.flush(deadline_s=1) == 1
        assert sorted(log_ids(tmp_path / "log")) == sorted(f"alice/e{i}" for i in range(20))
    finally:
        proc.kill()


def test_mutual_tls_names_the_sender_by_its_certificate(tmp_path: Path, pki: Path) -> None:
    proc, port = _tls_receiver(tmp_path, pki, "--tls-client-ca", str(pki / "ca.pem"), "--host", "0.0.0.0")
    try:
        url = f"https://127.0.0.1:{port}"
        ctx = client_tls(pki / "ca.pem", pki / "alice.pem", pki / "alice.key")
        s = Sender(url, tmp_path / "out.db", "alice", ssl_context=ctx)
        s.send([event("m1", "alice")])
        assert s.flush() == 0
        bob = Sender(url, tmp_path / "bob.db", "bob", ssl_context=ctx)  # alice's certificate, bob's name
        bob.send([event("b1", "bob")])
        with pytest.raises(SenderRefusedError, match="HTTP 403"):
            bob.flush()
        assert bob.pending() == 1  # kept for a restart with the right identity
        nocert = Sender(url, tmp_path / "nocert.db", "alice", ssl_context=client_tls(pki / "ca.pem"))
        nocert.send([event("n1", "alice")])
        assert nocert.flush(deadline_s=1) == 1  # the handshake fails without a client certificate
        assert log_ids(tmp_path / "log") == ["alice/m1"]
    finally:
        proc.kill()


def test_a_refused_token_stops_the_sender_and_keeps_its_events(tmp_path: Path) -> None:
    tokens = write_tokens(tmp_path, "alice")
    r = Receiver(tmp_path / "log", tmp_path / "cat.db", tmp_path / "rx.out",
                 "--tokens", str(tmp_path / "tokens"))
    try:
        url = f"http://127.0.0.1:{r.port}"
        wrong = Sender(url, tmp_path / "out.db", "alice", token="wrong-token-0123456789")
        wrong.send([event(f"e{i}", "alice") for i in range(10)])
        with pytest.raises(SenderRefusedError, match="HTTP 401"):
            wrong.flush()
        assert wrong.pending() == 10 and wrong.stats.rejected == 0
        wrong.close()
        (tmp_path / "wrong.token").write_text("wrong-token-0123456789")
        res = subprocess.run([sys.executable, "-m", "onceflow.cli.main", "send", "--url", url, "--outbox",
                              str(tmp_path / "cli.db"), "--sender-id", "alice", "--token-file",
                              str(tmp_path / "wrong.token"), "--events", "5"], capture_output=True, text=True,
                             timeout=60)
        assert res.returncode == 1
        assert "onceflow: error: the receiver refused sender 'alice' (HTTP 401)" in res.stderr
        # rotation: a second token for alice, the file re-read while the receiver runs
        secret = subprocess.run([sys.executable, "-m", "onceflow.cli.main", "ingest", "token",
                                 "--sender", "alice", "--tokens", str(tmp_path / "tokens")],
                                capture_output=True, text=True, check=True).stdout.strip()
        assert secret not in (tmp_path / "tokens").read_text()  # the file holds its digest only
        time.sleep(1.2)
        again = Sender(url, tmp_path / "out.db", "alice", token=secret)
        assert again.flush() == 0 and again.stats.acked == 10
        assert r.post(body(event("old", "alice")), tokens["alice"])[0] == 200  # the old one still works
        assert "reloaded 2 tokens" in (tmp_path / "rx.out").read_text()
    finally:
        r.kill()


def test_no_authentication_off_loopback_is_refused_unless_allowed(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "onceflow.cli.main", "ingest", "serve", "--log", str(tmp_path / "log"),
            "--catalog", str(tmp_path / "cat.db"), "--host", "0.0.0.0", "--port", str(free_port())]
    res = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "no authentication is configured" in res.stderr
    port = free_port()
    proc = Proc([*base[3:-1], str(port), "--allow-unauthenticated"], tmp_path / "open.out")
    try:
        deadline = time.monotonic() + 60
        while health(port) is None:
            assert proc.p.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert "WARNING: serving WITHOUT AUTHENTICATION" in (tmp_path / "open.out").read_text()
    finally:
        proc.kill()


def test_the_id_scope_is_fixed_in_the_catalog(tmp_path: Path) -> None:
    r = Receiver(tmp_path / "log", tmp_path / "cat.db", tmp_path / "rx.out")
    r.kill()
    res = subprocess.run([sys.executable, "-m", "onceflow.cli.main", "ingest", "serve", "--log",
                          str(tmp_path / "log"), "--catalog", str(tmp_path / "cat.db"),
                          "--id-scope", "global", "--port", str(free_port())],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode != 0 and "holds ids of id scope 'sender'" in res.stderr

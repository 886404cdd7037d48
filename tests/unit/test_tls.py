"""The TLS rule (when the server serves HTTPS) and the server's own CA: made once, kept, leaf
re-issued for new hosts, keys private, and one fingerprint whichever side computes it."""

from __future__ import annotations

import ipaddress
import socket
import stat
from pathlib import Path

import pytest
from cryptography import x509

from batchyard import tlstrust
from batchyard.errors import SpecError
from batchyard.server.main import decide_tls, is_loopback
from batchyard.server.tls import ca_fingerprint, ensure_server_tls

# host, tls_cert, tls_key, force_tls, insecure_http -> mode
TABLE = [
    ("127.0.0.1", None, None, False, False, "http"),
    ("127.1.2.3", None, None, False, False, "http"),
    ("localhost", None, None, False, False, "http"),
    ("::1", None, None, False, False, "http"),
    ("[::1]", None, None, False, False, "http"),
    ("127.0.0.1", None, None, True, False, "self-signed"),
    ("127.0.0.1", "c.pem", "k.pem", False, False, "given"),
    ("127.0.0.1", None, None, False, True, "http"),
    ("0.0.0.0", None, None, False, False, "self-signed"),
    ("::", None, None, False, False, "self-signed"),
    ("10.1.2.3", None, None, False, False, "self-signed"),
    ("gpu-box.lan", None, None, False, False, "self-signed"),
    ("10.1.2.3", "c.pem", "k.pem", False, False, "given"),
    ("0.0.0.0", "c.pem", "k.pem", True, False, "given"),
    ("10.1.2.3", None, None, False, True, "http"),
    ("0.0.0.0", None, None, False, True, "http"),
]


@pytest.mark.parametrize(("host", "cert", "key", "force", "insecure", "mode"), TABLE)
def test_decide_tls(host, cert, key, force, insecure, mode):
    assert decide_tls(host, cert, key, force, insecure) == mode


@pytest.mark.parametrize(("cert", "key", "force", "insecure", "flag"), [
    ("c.pem", None, False, False, "--tls-key"),
    (None, "k.pem", False, False, "--tls-cert"),
    ("c.pem", "k.pem", False, True, "--insecure-http"),
    (None, None, True, True, "--insecure-http"),
])
def test_decide_tls_refuses_inconsistent_flags(cert, key, force, insecure, flag):
    with pytest.raises(SpecError, match=flag):
        decide_tls("10.1.2.3", cert, key, force, insecure)


def test_is_loopback():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("LOCALHOST")
    assert not is_loopback("0.0.0.0") and not is_loopback("192.168.1.4")
    assert not is_loopback("example.org")


def _sans(cert_path: Path) -> tuple[set[str], set[str]]:
    leaf = x509.load_pem_x509_certificate(cert_path.read_bytes())
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return (set(san.get_values_for_type(x509.DNSName)),
            {str(ip) for ip in san.get_values_for_type(x509.IPAddress)})


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_ensure_server_tls_creates_private_keys_and_a_chain(tmp_path):
    files = ensure_server_tls(tmp_path, ["10.9.8.7", "gpu-box.lan"])
    tls = tmp_path / "tls"
    assert files.ca == tls / "ca.pem" and files.cert == tls / "server.pem"
    assert files.key == tls / "server.key"
    assert _mode(tls / "ca.key") == 0o600
    assert _mode(files.key) == 0o600
    chain = x509.load_pem_x509_certificates(files.cert.read_bytes())
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    assert len(chain) == 2 and chain[1] == ca  # leaf followed by the CA
    chain[0].verify_directly_issued_by(ca)
    names, ips = _sans(files.cert)
    assert {"gpu-box.lan", "localhost", socket.gethostname().lower()} <= names
    assert {"10.9.8.7", "127.0.0.1"} <= ips
    assert all(ipaddress.ip_address(ip) for ip in ips)  # IPs as IP SANs, not DNS names
    assert "10.9.8.7" not in names
    days = (ca.not_valid_after_utc - ca.not_valid_before_utc).days
    assert days >= 3649
    leaf_days = (chain[0].not_valid_after_utc - chain[0].not_valid_before_utc).days
    assert 729 <= leaf_days <= 731


def test_ensure_server_tls_is_idempotent(tmp_path):
    first = ensure_server_tls(tmp_path, ["10.9.8.7"])
    before = {p.name: p.read_bytes() for p in (tmp_path / "tls").iterdir()}
    second = ensure_server_tls(tmp_path, ["10.9.8.7"])
    third = ensure_server_tls(tmp_path, [])  # a subset of what the leaf covers
    after = {p.name: p.read_bytes() for p in (tmp_path / "tls").iterdir()}
    assert first == second == third
    assert before == after


def test_new_host_reissues_the_leaf_and_keeps_the_ca(tmp_path):
    files = ensure_server_tls(tmp_path, ["10.9.8.7"])
    ca_before = files.ca.read_bytes()
    ca_key_before = (tmp_path / "tls" / "ca.key").read_bytes()
    leaf_before = files.cert.read_bytes()
    ensure_server_tls(tmp_path, ["10.9.8.7", "192.168.77.5", "other-name"])
    assert files.ca.read_bytes() == ca_before
    assert (tmp_path / "tls" / "ca.key").read_bytes() == ca_key_before
    assert files.cert.read_bytes() != leaf_before
    names, ips = _sans(files.cert)
    assert {"10.9.8.7", "192.168.77.5"} <= ips and "other-name" in names
    assert _mode(files.key) == 0o600


def test_lost_ca_key_makes_a_new_ca_and_leaf(tmp_path):
    files = ensure_server_tls(tmp_path, [])
    old_ca = files.ca.read_bytes()
    (tmp_path / "tls" / "ca.key").unlink()
    ensure_server_tls(tmp_path, [])
    assert files.ca.read_bytes() != old_ca
    ca = x509.load_pem_x509_certificate(files.ca.read_bytes())
    x509.load_pem_x509_certificates(files.cert.read_bytes())[0].verify_directly_issued_by(ca)


def test_fingerprints_agree(tmp_path):
    files = ensure_server_tls(tmp_path, [])
    pem = files.ca.read_text()
    fp = ca_fingerprint(files.ca)
    assert fp == ca_fingerprint(pem.encode()) == tlstrust.fingerprint_pem(pem)
    assert len(fp) == 64 and fp == fp.lower()
    assert tlstrust.normalize_pin(":".join(fp[i:i + 2].upper() for i in range(0, 64, 2))) == fp
    # the chain file starts with the leaf, whose fingerprint differs
    assert tlstrust.fingerprint_pem(files.cert.read_text()) != fp


def test_ssl_context_only_for_https(tmp_path):
    files = ensure_server_tls(tmp_path, [])
    assert tlstrust.ssl_context(None) is None
    assert tlstrust.ssl_context(str(files.ca), "http://127.0.0.1:1") is None
    ctx = tlstrust.ssl_context(str(files.ca), "https://127.0.0.1:1")
    assert ctx is not None and ctx.check_hostname


def test_ca_file_order(tmp_path, monkeypatch):
    from batchyard import config, errors

    monkeypatch.setenv("BATCHYARD_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("BATCHYARD_CA", raising=False)
    monkeypatch.delenv("BATCHYARD_CA_SHA256", raising=False)
    monkeypatch.delenv("BATCHYARD_SERVER", raising=False)
    assert config.ca_file() is None  # system CAs
    files = ensure_server_tls(tmp_path / "home", [])
    assert config.ca_file() == str(files.ca)  # the home's own CA
    other = tmp_path / "other-ca.pem"
    other.write_text(files.ca.read_text())
    monkeypatch.setenv("BATCHYARD_CA", str(other))
    assert config.ca_file() == str(other)  # the env wins
    monkeypatch.setenv("BATCHYARD_CA", str(tmp_path / "missing.pem"))
    with pytest.raises(errors.UserError, match="BATCHYARD_CA"):
        config.ca_file()

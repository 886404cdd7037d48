"""The server's own small CA and its TLS certificate.

A server that leaves loopback must not send bearer tokens in clear, and most users have no
certificate for a lab machine. So the server makes a private CA once (kept in
``$BATCHYARD_HOME/tls``) and issues itself a leaf for the addresses it serves on. Clients that
share the home trust ``ca.pem`` directly; others get it with ``BATCHYARD_CA`` or pin its
sha256 (``ca_fingerprint``), which ``batchyard.tlstrust`` checks.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 730
RENEW_BEFORE = dt.timedelta(days=30)  # re-issue a leaf this close to its end
_WILDCARD = {"0.0.0.0", "::", ""}

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class TlsFiles:
    """Paths uvicorn and clients need: leaf chain (leaf + CA), its key, and the CA."""

    cert: Path
    key: Path
    ca: Path


def ca_fingerprint(ca_pem: bytes | Path) -> str:
    """Lowercase hex sha256 of the CA certificate's DER: the value users pin."""
    data = ca_pem.read_bytes() if isinstance(ca_pem, Path) else ca_pem
    cert = x509.load_pem_x509_certificate(data)
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def default_hosts() -> list[str]:
    """Names every leaf covers, so local clients work whatever address they use."""
    return ["localhost", "127.0.0.1", "::1", socket.gethostname()]


def ensure_server_tls(home: Path, hosts: list[str]) -> TlsFiles:
    """Create (first use) or reuse the CA and a leaf covering ``hosts``; the CA is kept
    across re-issues so clients that trust or pinned it keep working."""
    tls_dir = home / "tls"
    tls_dir.mkdir(parents=True, exist_ok=True)
    os.chmod(tls_dir, 0o700)
    files = TlsFiles(cert=tls_dir / "server.pem", key=tls_dir / "server.key",
                     ca=tls_dir / "ca.pem")
    ca_key_path = tls_dir / "ca.key"
    ca_cert, ca_key = _load_ca(files.ca, ca_key_path)
    if ca_cert is None or ca_key is None:
        ca_cert, ca_key = _make_ca()
        _write(ca_key_path, _key_pem(ca_key), private=True)
        _write(files.ca, ca_cert.public_bytes(serialization.Encoding.PEM), private=False)
    names, ips = _split_hosts([*hosts, *default_hosts()])
    if not _leaf_ok(files.cert, files.key, ca_cert, names, ips):
        leaf, leaf_key = _make_leaf(ca_cert, ca_key, names, ips)
        _write(files.key, _key_pem(leaf_key), private=True)
        chain = (leaf.public_bytes(serialization.Encoding.PEM)
                 + ca_cert.public_bytes(serialization.Encoding.PEM))
        _write(files.cert, chain, private=False)
    return files


# --- internals ---------------------------------------------------------------------------------


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _write(path: Path, data: bytes, *, private: bool) -> None:
    """Atomic write; a private file is created 0600 so the key is never readable by others,
    not even for an instant."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.chmod(tmp, 0o600 if private else 0o644)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _split_hosts(hosts: list[str]) -> tuple[list[str], list[IPAddress]]:
    names: list[str] = []
    ips: list[IPAddress] = []
    for raw in hosts:
        host = raw.strip().strip("[]")
        if host in _WILDCARD:
            continue
        try:
            ip = ipaddress.ip_address(host)
        except ValueError:
            name = host.lower().rstrip(".")
            if name and name not in names:
                names.append(name)
            continue
        if ip not in ips:
            ips.append(ip)
    return names, ips


def _same_key(cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> bool:
    spki = serialization.PublicFormat.SubjectPublicKeyInfo
    der = serialization.Encoding.DER
    return cert.public_key().public_bytes(der, spki) == key.public_key().public_bytes(der, spki)


def _load_ca(cert_path: Path, key_path: Path
             ) -> tuple[x509.Certificate | None, ec.EllipticCurvePrivateKey | None]:
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (FileNotFoundError, ValueError):
        return None, None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return None, None
    if not _same_key(cert, key):
        return None, None  # a half-replaced pair: start again rather than serve a broken chain
    return cert, key


def _leaf_ok(cert_path: Path, key_path: Path, ca: x509.Certificate, names: list[str],
             ips: list[IPAddress]) -> bool:
    """True when the existing leaf was issued by ``ca``, matches its key, is not near its
    end and covers every wanted name and address."""
    try:
        leaf = x509.load_pem_x509_certificate(cert_path.read_bytes())
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (FileNotFoundError, ValueError):
        return False
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        return False
    if not _same_key(leaf, key):
        return False
    if leaf.issuer != ca.subject:
        return False
    try:
        leaf.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError):
        return False
    if leaf.not_valid_after_utc - RENEW_BEFORE < _now():
        return False
    try:
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    have_names = {n.lower() for n in san.get_values_for_type(x509.DNSName)}
    have_ips = set(san.get_values_for_type(x509.IPAddress))
    return set(names) <= have_names and set(ips) <= have_ips


def _make_ca() -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "batchyard"),
        x509.NameAttribute(NameOID.COMMON_NAME,
                           f"batchyard CA {socket.gethostname()} {os.urandom(4).hex()}"),
    ])
    now = _now()
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name).issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=False, key_cert_sign=True, crl_sign=True,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(ski, critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return cert, key


def _make_leaf(ca: x509.Certificate, ca_key: ec.EllipticCurvePrivateKey, names: list[str],
               ips: list[IPAddress]) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    common = names[0] if names else str(ips[0]) if ips else "batchyard server"
    subject = x509.Name([
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "batchyard"),
        x509.NameAttribute(NameOID.COMMON_NAME, common[:64]),
    ])
    san: list[x509.GeneralName] = [x509.DNSName(n) for n in names]
    san += [x509.IPAddress(ip) for ip in ips]
    ca_ski = ca.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    now = _now()
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject).issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(min(now + dt.timedelta(days=LEAF_DAYS), ca.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                     key_encipherment=False, data_encipherment=False,
                                     key_agreement=True, key_cert_sign=False, crl_sign=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                       critical=False)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                       critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key

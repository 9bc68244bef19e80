"""TLS for the API: a private CA and a server certificate, made on first start.

kubectl and the Kubernetes clients send bearer tokens only over HTTPS, so Tessera always serves
HTTPS (`--insecure-http` exists for tests). The CA certificate goes into every kubeconfig.

Other processes read these files while a server starts (a client waiting for it, `tessera
kubeconfig` in another terminal, a second server on the same data directory), so each file
appears whole or not at all (written aside, then renamed into place), and only one process at a
time makes them (a lock on `DIRECTORY/.lock`): two starts at once agree on one CA.
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import ipaddress
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from app.files import write_whole

VALID_DAYS = 3650


@dataclass(frozen=True)
class TLSFiles:
    ca_cert: Path
    cert: Path
    key: Path


def ensure_tls(directory: Path, hosts: list[str]) -> TLSFiles:
    """Create the CA and a server certificate for `hosts` unless they exist and cover them."""
    directory.mkdir(parents=True, exist_ok=True)
    files = TLSFiles(directory / "ca.crt", directory / "server.crt", directory / "server.key")
    ca_key_path = directory / "ca.key"
    with _locked(directory / ".lock"):
        if not files.ca_cert.exists() or not ca_key_path.exists():
            _write_ca(files.ca_cert, ca_key_path)
        if not files.cert.exists() or not files.key.exists() or not _covers(files.cert, hosts):
            _write_server(files, ca_key_path, hosts)
    return files


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on `path` (made if missing) for the block; released when the
    process dies, too."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _write_ca(cert_path: Path, key_path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "Tessera CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    _write_key(key_path, key)
    write_whole(cert_path, cert.public_bytes(serialization.Encoding.PEM))


def _write_server(files: TLSFiles, ca_key_path: Path, hosts: list[str]) -> None:
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), password=None)
    ca_cert = x509.load_pem_x509_certificate(files.ca_cert.read_bytes())
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    names: list[x509.GeneralName] = []
    for host in sorted(set(hosts)):
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tessera-api")]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())  # type: ignore[arg-type]
    )
    _write_key(files.key, key)
    write_whole(files.cert, cert.public_bytes(serialization.Encoding.PEM))


def _covers(cert_path: Path, hosts: list[str]) -> bool:
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return False
    present = {str(v) for v in sans.get_values_for_type(x509.IPAddress)} | set(
        sans.get_values_for_type(x509.DNSName)
    )
    expires = cert.not_valid_after_utc
    return set(hosts) <= present and expires > datetime.datetime.now(
        datetime.UTC
    ) + datetime.timedelta(days=30)


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_whole(path, data, 0o600)


def default_hosts(host: str, extra: list[str]) -> list[str]:
    hosts = {"127.0.0.1", "::1", "localhost", *extra}
    if host not in ("0.0.0.0", "::", ""):
        hosts.add(host)
    return sorted(hosts)

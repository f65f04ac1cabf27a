"""Development PKI: a throwaway CA and one certificate per party, for TLS on every link.

For development and tests only. A production deployment brings its own CA.
"""

from __future__ import annotations

import datetime as _dt
import ipaddress
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

DEFAULT_NAMES: tuple[str, ...] = ("h1", "h2")
DEFAULT_PROVIDERS: tuple[str, ...] = ("p1", "p2", "p3")
CA_NAME = "ca"
VALIDITY_DAYS = 365

_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


@dataclass(frozen=True)
class CertPaths:
    """Where one party's certificate, private key and the CA certificate are."""

    cert: Path
    key: Path
    ca: Path


def _check_names(names: Sequence[str]) -> list[str]:
    out: list[str] = []
    for name in names:
        if not _NAME_RE.match(name):
            raise ValueError(
                f"invalid certificate name {name!r}: use letters, digits and inner hyphens "
                "(a DNS label, at most 63 characters)"
            )
        if name.lower() == CA_NAME:
            raise ValueError(f"{name!r} is reserved for the CA")
        if name.lower() in (n.lower() for n in out):
            raise ValueError(f"duplicate certificate name {name!r}")
        out.append(name)
    if not out:
        raise ValueError("no certificate names given")
    return out


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create ``path`` with ``mode`` from the start (O_EXCL: never over an existing file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), mode)
    try:
        os.fchmod(fd, mode)  # the umask may have cleared bits we want; it never adds any
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
    finally:
        os.close(fd)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _make_ca(now: _dt.datetime) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "SPGC development"),
            x509.NameAttribute(NameOID.COMMON_NAME, "SPGC development CA"),
        ]
    )
    ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(ski, critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False
        )
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _load_ca(
    key_path: Path, cert_path: Path
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """The development CA made earlier in the same directory."""
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), None)
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except (ValueError, TypeError) as exc:
        raise ValueError(f"cannot use the CA in {key_path.parent}: {exc}") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.public_key() != cert.public_key():
        raise ValueError(f"{key_path} is not the key of {cert_path}")
    return key, cert


def _make_leaf(
    name: str,
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    now: _dt.datetime,
    client_only: bool = False,
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    # A provider only ever dials out: without serverAuth a TLS client refuses its certificate
    # as a server's, so a provider cannot pose as one even where names or addresses overlap.
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if not client_only:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    ca_ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    san = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
    if name.lower() != "localhost":
        san.append(x509.DNSName(name))
    cert = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "SPGC development"),
                    x509.NameAttribute(NameOID.COMMON_NAME, name),
                ]
            )
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _dt.timedelta(minutes=5))
        .not_valid_after(now + _dt.timedelta(days=VALIDITY_DAYS))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=True,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return key, cert


def make_dev_pki(
    directory: Path,
    names: Sequence[str] = DEFAULT_NAMES,
    force: bool = False,
    providers: Sequence[str] = (),
) -> dict[str, CertPaths]:
    """Write a development CA and one leaf certificate per name into ``directory``.

    Files: ``ca.pem``/``ca.key`` and ``NAME.pem``/``NAME.key`` for each name in ``names`` and
    ``providers``. Leaves are EC P-256, valid for one year (SAN: localhost, 127.0.0.1, NAME);
    those in ``names`` (the servers) serve TLS and authenticate as clients, those in
    ``providers`` only authenticate as clients (no serverAuth).
    Private keys are created with mode 0600. A CA already in ``directory`` signs the new
    certificates (adding a party); existing files are never overwritten unless ``force``;
    then they are replaced (the CA too: removed and created anew, mode 0600 again).

    Raises ``FileExistsError`` when a file exists and ``force`` is false, ``ValueError`` for a bad
    name, ``OSError`` for file-system errors.
    """
    checked = _check_names([*names, *providers])
    client_only = set(checked[len(names) :])
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(f"{directory} exists and is not a directory")
    directory.mkdir(parents=True, exist_ok=True)

    ca_pem, ca_key_path = directory / f"{CA_NAME}.pem", directory / f"{CA_NAME}.key"
    # A CA already here signs the new parties (adding one to a deployment), unless --force.
    keep_ca = not force and ca_pem.is_file() and ca_key_path.is_file()
    targets = [] if keep_ca else [ca_pem, ca_key_path]
    for name in checked:
        targets += [directory / f"{name}.pem", directory / f"{name}.key"]
    existing = [p for p in targets if p.exists() or p.is_symlink()]
    if existing and not force:
        listed = ", ".join(str(p) for p in existing)
        raise FileExistsError(f"refusing to overwrite {listed} (use --force to replace)")
    for p in existing:
        p.unlink()

    now = _dt.datetime.now(_dt.timezone.utc)
    if keep_ca:
        ca_key, ca_cert = _load_ca(ca_key_path, ca_pem)
    else:
        ca_key, ca_cert = _make_ca(now)
        _write_new(ca_key_path, _key_pem(ca_key), 0o600)
        _write_new(ca_pem, _cert_pem(ca_cert), 0o644)

    result: dict[str, CertPaths] = {}
    for name in checked:
        key, cert = _make_leaf(name, ca_key, ca_cert, now, client_only=name in client_only)
        key_path, cert_path = directory / f"{name}.key", directory / f"{name}.pem"
        _write_new(key_path, _key_pem(key), 0o600)
        _write_new(cert_path, _cert_pem(cert), 0o644)
        result[name] = CertPaths(cert=cert_path, key=key_path, ca=ca_pem)
    return result


def make_ledger_keys(
    directory: Path, names: Sequence[str], force: bool = False
) -> dict[str, tuple[Path, Path]]:
    """One Ed25519 key pair per server name for signing its privacy ledger (spgc.privacy.ledger):
    ``NAME.ledger.key`` (private, mode 0600; the server's ``ledger_key``) and
    ``NAME.ledger.pub`` (public; what a verifier pins with ``spgc account --keys``).
    Existing files are refused unless ``force``."""
    checked = _check_names(names)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    made = {}
    for name in checked:
        key_path = directory / f"{name}.ledger.key"
        pub_path = directory / f"{name}.ledger.pub"
        existing = [p for p in (key_path, pub_path) if p.exists() or p.is_symlink()]
        if existing and not force:
            listed = ", ".join(str(p) for p in existing)
            raise FileExistsError(f"refusing to overwrite {listed} (use --force to replace)")
        for path in existing:
            path.unlink()
        key = Ed25519PrivateKey.generate()
        private = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        public = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        _write_new(key_path, private, 0o600)
        _write_new(pub_path, public, 0o644)
        made[name] = (key_path, pub_path)
    return made

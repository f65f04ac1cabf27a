"""A throwaway PKI for channel tests: a CA and leaf certificates (EC P-256)."""

from __future__ import annotations

import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _write_key(path: Path, key) -> None:
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    path.chmod(0o600)


def _make_ca(directory: Path, stem: str, cn: str):
    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(_name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
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
        .sign(key, hashes.SHA256())
    )
    ca_path = directory / f"{stem}.pem"
    ca_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key, cert, ca_path


def _make_leaf(directory: Path, name: str, ca_key, ca_cert) -> tuple[str, str]:
    now = datetime.datetime.now(datetime.timezone.utc)
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName(name), x509.DNSName("localhost")]),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    cert_path = directory / f"{name}.crt.pem"
    key_path = directory / f"{name}.key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key_path, key)
    return str(cert_path), str(key_path)


def make_test_pki(tmp_path, names, other_ca: bool = False) -> dict:
    """Creates ``tmp_path/ca.pem`` and a certificate + key per name, signed by that CA.

    Returns ``{"ca": ca_path, name: (cert_path, key_path), ...}``. With ``other_ca=True``
    a second, unrelated CA (``other_ca.pem``) is made too and every name also gets a
    certificate from it under the key ``"other:" + name``; ``"other_ca"`` is its path.
    """
    directory = Path(tmp_path)
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_cert, ca_path = _make_ca(directory, "ca", "SPGC test CA")
    out: dict = {"ca": str(ca_path)}
    for n in names:
        out[n] = _make_leaf(directory, n, ca_key, ca_cert)
    if other_ca:
        o_key, o_cert, o_path = _make_ca(directory, "other_ca", "Unrelated CA")
        out["other_ca"] = str(o_path)
        for n in names:
            out["other:" + n] = _make_leaf(directory, "other_" + n, o_key, o_cert)
    return out

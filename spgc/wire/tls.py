"""TLS material for gRPC: one party's certificate, key and CA (PEM files), as credentials."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Protocol

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization


class _HasTlsPaths(Protocol):
    cert: Path
    key: Path
    ca: Path


@dataclass(frozen=True)
class TlsFiles:
    """One party's certificate chain, private key and the CA that verifies its peers (PEM)."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def from_dir(cls, directory: Path | str, name: str) -> TlsFiles:
        """``NAME.pem``, ``NAME.key`` and ``ca.pem`` in ``directory`` (``spgc certs`` layout)."""
        d = Path(directory)
        return cls(cert=d / f"{name}.pem", key=d / f"{name}.key", ca=d / "ca.pem")

    @classmethod
    def of(cls, paths: _HasTlsPaths) -> TlsFiles:
        """From any object with ``cert``, ``key`` and ``ca`` (e.g.
        ``spgc.protocol.certs.CertPaths``)."""
        return cls(cert=Path(paths.cert), key=Path(paths.key), ca=Path(paths.ca))

    def check(self) -> None:
        """The files as TLS will use them, with one line naming the file for what is wrong
        (gRPC itself only says it cannot bind, or fails every handshake): each one parses,
        the key is the certificate's, the certificate is in its validity period. (Whether
        ``ca`` signed it is not checked: ``ca`` verifies the OTHER parties, whose CA may be
        another organisation's.) ValueError or OSError."""
        certs = _pem_certificates(self.cert, "certificate")
        _pem_certificates(self.ca, "CA certificate")
        try:
            key = serialization.load_pem_private_key(_read(self.key, "private key"), None)
        except (ValueError, TypeError) as exc:
            why = "it is encrypted" if "password" in str(exc).lower() else "not a PEM private key"
            raise ValueError(f"private key {self.key} cannot be used: {why}") from None
        leaf = certs[0]
        if key.public_key() != leaf.public_key():
            raise ValueError(f"private key {self.key} is not the key of certificate {self.cert}")
        now = datetime.now(timezone.utc)
        if not leaf.not_valid_before_utc <= now <= leaf.not_valid_after_utc:
            raise ValueError(
                f"certificate {self.cert} is valid from {leaf.not_valid_before_utc:%Y-%m-%d} "
                f"to {leaf.not_valid_after_utc:%Y-%m-%d}, not now"
            )


def _pem_certificates(path: Path, what: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(_read(path, what))
    except ValueError:
        raise ValueError(f"{what} {path} is not a PEM certificate") from None
    return certs



def _read(path: Path | str, what: str) -> bytes:
    p = Path(path)
    try:
        data = p.read_bytes()
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {p} does not exist") from None
    if not data.strip():
        raise ValueError(f"{what} {p} is empty")
    return data


def server_credentials(
    cert: Path | str, key: Path | str, ca: Path | str, require_client_auth: bool = True
) -> grpc.ServerCredentials:
    """TLS credentials for a server: its certificate and key; clients verified against ``ca``.

    With ``require_client_auth`` (the default) a client without a certificate from ``ca`` fails
    the handshake.
    """
    return grpc.ssl_server_credentials(
        [(_read(key, "private key"), _read(cert, "certificate"))],
        root_certificates=_read(ca, "CA certificate"),
        require_client_auth=require_client_auth,
    )


def channel_credentials(
    cert: Path | str, key: Path | str, ca: Path | str
) -> grpc.ChannelCredentials:
    """TLS credentials for a client: the server is verified against ``ca``; the client presents
    its certificate and key (client authentication)."""
    return grpc.ssl_channel_credentials(
        root_certificates=_read(ca, "CA certificate"),
        private_key=_read(key, "private key"),
        certificate_chain=_read(cert, "certificate"),
    )

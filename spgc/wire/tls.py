"""TLS material for gRPC: one party's certificate, key and CA (PEM files), as credentials."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import grpc


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
        """From any object with ``cert``, ``key`` and ``ca`` (e.g. ``spgc.certs.CertPaths``)."""
        return cls(cert=Path(paths.cert), key=Path(paths.key), ca=Path(paths.ca))


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

"""Who is calling: the authenticated client certificate's name, checked against a claim and an
allow-list; and the CSPRNG submission ids that make replays detectable."""

from __future__ import annotations

import ipaddress
import re
import secrets
from collections.abc import Container, Sequence
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.x509.oid import NameOID

from spgc.wire.errors import InvalidArgumentError, PermissionDeniedError, UnauthenticatedError

#: Length of the submission ids :func:`new_submission_id` makes.
SUBMISSION_ID_BYTES = 16
#: Longest submission id accepted.
MAX_SUBMISSION_ID_BYTES = 64
_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


def _decoded(values: Sequence[bytes] | None) -> list[str]:
    return [v.decode("utf-8", "replace") for v in values or ()]


def _identity_of(common: Sequence[str], alternative: Sequence[str]) -> str | None:
    """The common name when there is exactly one; otherwise the only DNS name of the subject
    alternative names besides "localhost" (IP addresses skipped); else None."""
    if len(common) == 1 and common[0]:
        return common[0]
    names = []
    for san in alternative:
        try:
            ipaddress.ip_address(san)
            continue
        except ValueError:
            pass
        if san.lower() != "localhost":
            names.append(san)
    return names[0] if len(names) == 1 else None


def peer_identity(context: grpc.ServicerContext) -> str | None:
    """The name in the client's verified certificate, or None (plaintext, or no certificate),
    by the rule of :func:`_identity_of`. gRPC fills the auth context only from a certificate
    that verified against the server's CA."""
    auth = context.auth_context()
    if _decoded(auth.get("transport_security_type")) != ["ssl"]:
        return None
    return _identity_of(
        _decoded(auth.get("x509_common_name")),
        _decoded(auth.get("x509_subject_alternative_name")),
    )


def certificate_identity(cert_pem: Path) -> str | None:
    """The name this party's own certificate (the first in the PEM file) gives it, by the same
    rule as :func:`peer_identity`: what the other parties see it as."""
    cert = x509.load_pem_x509_certificate(Path(cert_pem).read_bytes())
    common = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        alternative = [str(v) for v in san.get_values_for_type(x509.DNSName)]
    except x509.ExtensionNotFound:
        alternative = []
    return _identity_of(common, alternative)


def caller_identity(
    context: grpc.ServicerContext,
    claimed: str = "",
    *,
    insecure: bool,
    allowed: Container[str] | None = None,
) -> str:
    """The identity a request is counted under; raises a :class:`WireError` subclass.

    With TLS the certificate decides: ``claimed`` (a payload's provider_id) must be empty or
    equal (PermissionDeniedError), a connection without a certificate identity is refused
    (UnauthenticatedError). Only a server running with ``insecure=True`` takes ``claimed``, which
    must then be a valid name (InvalidArgumentError). ``allowed``: the registered identities
    (PermissionDeniedError for others).
    """
    identity = peer_identity(context)
    if identity is None:
        if not insecure:
            raise UnauthenticatedError("no authenticated client certificate on this connection")
        if not claimed:
            raise InvalidArgumentError(
                "this server runs without TLS (--insecure): the request must name its provider_id"
            )
        if not _NAME_RE.match(claimed):
            raise InvalidArgumentError(f"invalid provider_id {claimed!r}")
        identity = claimed
    elif claimed and claimed != identity:
        raise PermissionDeniedError(
            f"the request claims to be {claimed!r}, the client certificate says {identity!r}"
        )
    if allowed is not None and identity not in allowed:
        raise PermissionDeniedError(f"{identity!r} is not a registered party of this run")
    return identity


def new_submission_id() -> bytes:
    """A fresh submission id: :data:`SUBMISSION_ID_BYTES` bytes from the OS CSPRNG."""
    return secrets.token_bytes(SUBMISSION_ID_BYTES)

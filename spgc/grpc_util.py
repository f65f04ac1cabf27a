"""gRPC plumbing shared by the server daemons and the provider client.

- Transport: :class:`TlsFiles`, :func:`server_credentials`, :func:`channel_credentials`,
  :func:`make_server`, :func:`make_channel` (TLS by default; plaintext only with
  ``insecure=True``), :func:`add_health` (standard ``grpc.health.v1``).
- Identity: :func:`peer_identity` (the authenticated client certificate's name) and
  :func:`caller_identity` (that name, checked against a payload's claim and an allow-list).
- Errors: :class:`WireError` and its subclasses carry a gRPC status code;
  :func:`abort_on_error` turns them (and any exception with a ``code`` attribute naming a status)
  into ``context.abort(code, message)`` in a servicer method.
- Vectors: :func:`iter_vector_chunks` cuts a vector into chunks, :class:`ChunkValidator` checks a
  chunk stream (order, sizes, count, ring range, SHA-256) without buffering it,
  :class:`ChunkReassembler` also rebuilds the vector.
- Messages: :func:`share_messages` / :func:`read_share_header` / :func:`iter_share_payload` /
  :func:`read_share_stream` for SubmitShare, :func:`model_messages` / :func:`read_model_stream`
  for FetchModel.

Sizes (also documented in proto/spgc/v1/aggregation.proto): chunk payloads are at most
:data:`MAX_CHUNK_BYTES` (1 MiB); every channel and server sets gRPC's maximum message size to
:data:`DEFAULT_MAX_MESSAGE_BYTES` (1 MiB + 64 KiB), so a larger message is refused by gRPC itself
with RESOURCE_EXHAUSTED.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import ipaddress
import logging
import re
import secrets
from collections.abc import Callable, Container, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import grpc
import numpy as np

from spgc.wire import aggregation_pb2, vector_sha256

log = logging.getLogger(__name__)

#: Largest chunk payload in bytes (131,072 uint64/float64 values).
MAX_CHUNK_BYTES = 1 << 20
#: The chunk size senders use unless told otherwise.
DEFAULT_CHUNK_BYTES = MAX_CHUNK_BYTES
#: gRPC message size limit on both sides: a full chunk plus room for the protobuf framing.
DEFAULT_MAX_MESSAGE_BYTES = MAX_CHUNK_BYTES + (64 << 10)
#: Largest whole vector a reader accepts unless told otherwise (1G values of 8 bytes).
DEFAULT_MAX_VECTOR_BYTES = 8 << 30
#: Length of the submission ids :func:`new_submission_id` makes.
SUBMISSION_ID_BYTES = 16
#: Longest submission id accepted.
MAX_SUBMISSION_ID_BYTES = 64

_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_F = TypeVar("_F", bound=Callable[..., Any])


# ----------------------------------------------------------------------------- errors


class WireError(Exception):
    """A request refused for a reason the caller should see; ``code`` is its gRPC status."""

    code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


class InvalidArgumentError(WireError):
    """Malformed data: wrong length, order, range, hash, missing or repeated header."""

    code = grpc.StatusCode.INVALID_ARGUMENT


class ResourceExhaustedError(WireError):
    """A chunk, message or vector above the size limits."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class FailedPreconditionError(WireError):
    """Valid data at the wrong time: another run, a past or future round, a closed round."""

    code = grpc.StatusCode.FAILED_PRECONDITION


class AlreadyExistsError(WireError):
    """A second submission for the same round, or a submission id used before."""

    code = grpc.StatusCode.ALREADY_EXISTS


class PermissionDeniedError(WireError):
    """An identity that may not do this (unknown provider, payload claiming another name)."""

    code = grpc.StatusCode.PERMISSION_DENIED


class UnauthenticatedError(WireError):
    """No usable certificate identity on a TLS connection."""

    code = grpc.StatusCode.UNAUTHENTICATED


def status_code_of(exc: BaseException) -> grpc.StatusCode | None:
    """The gRPC status an exception maps to, or None for an unexpected error.

    :class:`WireError` carries one; so does any exception whose ``code`` attribute is a
    ``grpc.StatusCode`` or the name of one (e.g. ``"ALREADY_EXISTS"``), which lets modules that
    do not import grpc (such as the share intake) define their own refusals.
    """
    code = getattr(exc, "code", None)
    if isinstance(code, grpc.StatusCode):
        return code
    if isinstance(code, str) and code in grpc.StatusCode.__members__:
        return grpc.StatusCode[code]
    return None


def _abort_if_mapped(exc: Exception, context: grpc.ServicerContext) -> None:
    code = status_code_of(exc)
    if code is not None and code is not grpc.StatusCode.OK:
        message = getattr(exc, "message", None)
        context.abort(code, message if isinstance(message, str) else str(exc))


def abort_on_error(method: _F) -> _F:
    """Decorator for servicer methods: a mapped exception becomes ``context.abort``.

    Works for unary and streaming responses (generator methods). Unmapped exceptions propagate
    (gRPC reports them as UNKNOWN and logs them): they are bugs, not refusals.
    """
    if inspect.isgeneratorfunction(method):

        @functools.wraps(method)
        def gen_wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            try:
                yield from method(self, request, context)
            except Exception as exc:
                _abort_if_mapped(exc, context)
                raise

        return gen_wrapper  # type: ignore[return-value]

    @functools.wraps(method)
    def wrapper(self: Any, request: Any, context: grpc.ServicerContext) -> Any:
        try:
            return method(self, request, context)
        except Exception as exc:
            _abort_if_mapped(exc, context)
            raise

    return wrapper  # type: ignore[return-value]


# ----------------------------------------------------------------------------- transport


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


def _check_transport(tls: TlsFiles | None, insecure: bool, what: str) -> None:
    if tls is None and not insecure:
        raise ValueError(
            f"refusing to {what} without TLS: give certificate files (cert, key, CA), or pass "
            "insecure=True (--insecure) to run in plaintext explicitly"
        )
    if tls is not None and insecure:
        raise ValueError(f"cannot {what}: both TLS files and insecure=True were given")


def _is_loopback(host: str) -> bool:
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _message_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    if max_message_bytes < 1024:
        raise ValueError(f"max_message_bytes={max_message_bytes} is too small")
    return [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]


def make_server(
    bind: str,
    servicer_adders: Iterable[Callable[[grpc.Server], object]],
    tls: TlsFiles | None,
    insecure: bool = False,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    require_client_auth: bool = True,
    max_workers: int = 16,
    maximum_concurrent_rpcs: int | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> tuple[grpc.Server, int]:
    """A gRPC server bound to ``bind`` ("host:port"; port 0 picks a free one), not yet started.

    ``servicer_adders`` are called with the server, e.g.
    ``functools.partial(aggregation_pb2_grpc.add_AggregatorServicer_to_server, servicer)``.
    With ``tls`` clients must present a certificate from ``tls.ca`` (unless
    ``require_client_auth=False``). Plaintext needs ``insecure=True`` (ValueError otherwise).
    Each streaming RPC holds one of the ``max_workers`` threads while it runs.
    SO_REUSEPORT is off, so a second daemon on the same port fails instead of sharing it.

    Returns ``(server, port)``; raises OSError when the address cannot be bound.
    """
    _check_transport(tls, insecure, f"serve gRPC on {bind}")
    opts = [*_message_options(max_message_bytes), ("grpc.so_reuseport", 0), *options]
    creds = None
    if tls is not None:
        creds = server_credentials(tls.cert, tls.key, tls.ca, require_client_auth)
    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="spgc-grpc"),
        options=opts,
        maximum_concurrent_rpcs=maximum_concurrent_rpcs,
    )
    for add in servicer_adders:
        add(server)
    try:
        if creds is not None:
            port = server.add_secure_port(bind, creds)
        else:
            host = bind.rsplit(":", 1)[0]
            if not _is_loopback(host):
                log.warning("serving plaintext gRPC on %s (--insecure): traffic is readable", bind)
            port = server.add_insecure_port(bind)
    except RuntimeError as exc:
        raise OSError(f"cannot bind gRPC server to {bind}: {exc}") from exc
    if port == 0:
        raise OSError(f"cannot bind gRPC server to {bind}")
    return server, port


def make_channel(
    target: str,
    tls: TlsFiles | None,
    insecure: bool = False,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    server_name: str | None = None,
    options: Sequence[tuple[str, Any]] = (),
) -> grpc.Channel:
    """A channel to ``target`` ("host:port"), over mutual TLS unless ``insecure=True``.

    ``server_name`` is the name the server's certificate must carry when it differs from the
    host in ``target`` (e.g. "h2" when dialling 10.0.0.7:50051). Daemons should always pass the
    expected peer's certificate name: the development certificates all list localhost and
    127.0.0.1, so dialling 127.0.0.1 alone does not tell one party's certificate from another's.
    """
    _check_transport(tls, insecure, f"connect to {target}")
    opts = [*_message_options(max_message_bytes), *options]
    if tls is None:
        return grpc.insecure_channel(target, options=opts)
    if server_name:
        opts.append(("grpc.ssl_target_name_override", server_name))
    creds = channel_credentials(tls.cert, tls.key, tls.ca)
    return grpc.secure_channel(target, creds, options=opts)


def add_health(server: grpc.Server, services: Iterable[str] = ()) -> Any:
    """Add the standard ``grpc.health.v1.Health`` service; mark "" and ``services`` SERVING.

    Returns the ``grpc_health.v1.health.HealthServicer``: call ``set(name, status)`` to change
    a status and ``enter_graceful_shutdown()`` before stopping. Health uses the server's
    transport, so over TLS the prober needs a client certificate too.
    """
    from grpc_health.v1 import health, health_pb2, health_pb2_grpc

    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *services):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return servicer


# ----------------------------------------------------------------------------- identity


def _decoded(values: Sequence[bytes] | None) -> list[str]:
    return [v.decode("utf-8", "replace") for v in values or ()]


def peer_identity(context: grpc.ServicerContext) -> str | None:
    """The name in the client's verified certificate, or None (plaintext, or no certificate).

    The common name when the certificate has exactly one; otherwise the only DNS name of the
    subject alternative names besides "localhost" (IP addresses skipped). gRPC fills the auth
    context only from a certificate that verified against the server's CA.
    """
    auth = context.auth_context()
    if _decoded(auth.get("transport_security_type")) != ["ssl"]:
        return None
    common = _decoded(auth.get("x509_common_name"))
    if len(common) == 1 and common[0]:
        return common[0]
    names = []
    for san in _decoded(auth.get("x509_subject_alternative_name")):
        try:
            ipaddress.ip_address(san)
            continue
        except ValueError:
            pass
        if san.lower() != "localhost":
            names.append(san)
    return names[0] if len(names) == 1 else None


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


# ----------------------------------------------------------------------------- chunking


def _little_endian(vec: np.ndarray) -> np.ndarray:
    arr = np.asarray(vec)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D vector, got shape {arr.shape}")
    return np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False))


def _check_send_chunk_bytes(chunk_bytes: int, itemsize: int) -> None:
    if not 0 < chunk_bytes <= MAX_CHUNK_BYTES or chunk_bytes % itemsize:
        raise ValueError(
            f"chunk_bytes={chunk_bytes} must be a positive multiple of {itemsize} "
            f"of at most {MAX_CHUNK_BYTES}"
        )


def chunk_count(total_bytes: int, chunk_bytes: int) -> int:
    """Number of chunks of ``chunk_bytes`` (the last one shorter) that hold ``total_bytes``."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    return -(-total_bytes // chunk_bytes)


def iter_vector_chunks(vec: np.ndarray, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """The vector's little-endian bytes in chunks of ``chunk_bytes`` (the last one shorter).

    ``chunk_bytes`` must be a multiple of the item size and at most :data:`MAX_CHUNK_BYTES`.
    """
    arr = _little_endian(vec)
    _check_send_chunk_bytes(chunk_bytes, arr.dtype.itemsize)
    view = memoryview(arr).cast("B")
    for start in range(0, len(view), chunk_bytes):
        yield bytes(view[start : start + chunk_bytes])


class ChunkValidator:
    """Checks one streamed vector chunk by chunk, without keeping it.

    The layout is fixed by the header: ``num_elements`` values of ``itemsize`` bytes, in
    ``chunk_count`` chunks of ``chunk_bytes`` (the last one holds the rest). :meth:`check` each
    chunk as it arrives, then :meth:`finish`. Every violation raises a :class:`WireError`:
    InvalidArgumentError for wrong layout, order, length, range or hash; ResourceExhaustedError
    for a chunk or vector above the limits. Layout errors are raised by the constructor, before
    any payload is read.
    """

    def __init__(
        self,
        num_elements: int,
        chunk_bytes: int,
        chunk_count: int | None = None,
        *,
        itemsize: int = 8,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
        max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
        sha256: bytes | None = None,
        ring_bits: int | None = None,
    ) -> None:
        if num_elements < 1:
            raise InvalidArgumentError(f"vector length {num_elements} (must be at least 1)")
        total = num_elements * itemsize
        if total > max_total_bytes:
            raise ResourceExhaustedError(
                f"vector of {num_elements:,} values ({total:,} bytes) exceeds the limit of "
                f"{max_total_bytes:,} bytes"
            )
        if chunk_bytes <= 0 or chunk_bytes % itemsize:
            raise InvalidArgumentError(
                f"chunk_bytes={chunk_bytes} is not a positive multiple of {itemsize}"
            )
        if chunk_bytes > max_chunk_bytes:
            raise ResourceExhaustedError(
                f"chunk_bytes={chunk_bytes:,} exceeds the limit of {max_chunk_bytes:,}"
            )
        expected = -(-total // chunk_bytes)
        if chunk_count is not None and chunk_count != expected:
            raise InvalidArgumentError(
                f"chunk_count={chunk_count} does not match {num_elements:,} values in chunks of "
                f"{chunk_bytes:,} bytes (expected {expected})"
            )
        if sha256 is not None and len(sha256) != 32:
            raise InvalidArgumentError(f"sha256 must be 32 bytes, got {len(sha256)}")
        if ring_bits is not None and not 1 <= ring_bits <= 64:
            raise InvalidArgumentError(f"ring_bits={ring_bits} is not in 1..64")
        self.num_elements = num_elements
        self.itemsize = itemsize
        self.chunk_bytes = chunk_bytes
        self.chunk_count = expected
        self.total_bytes = total
        self.max_chunk_bytes = max_chunk_bytes
        self.ring_bits = ring_bits
        self._expected_sha256 = sha256
        self._hash = hashlib.sha256()
        self.next_index = 0
        self.received_bytes = 0
        self.finished = False

    def expected_length(self, index: int) -> int:
        """Payload bytes chunk ``index`` must carry."""
        if index < self.chunk_count - 1:
            return self.chunk_bytes
        return self.total_bytes - self.chunk_bytes * (self.chunk_count - 1)

    def check(self, index: int, data: bytes) -> bytes:
        """Validate the next chunk; returns ``data`` (for streaming it on)."""
        if self.finished:
            raise InvalidArgumentError("chunk after the end of the stream")
        if index >= self.chunk_count:
            raise InvalidArgumentError(
                f"extra chunk {index}: the header announced {self.chunk_count} chunk(s)"
            )
        if index != self.next_index:
            raise InvalidArgumentError(
                f"chunk {index} out of order: expected chunk {self.next_index}"
            )
        n = len(data)
        if n > self.max_chunk_bytes:
            raise ResourceExhaustedError(
                f"chunk {index} has {n:,} bytes, above the limit of {self.max_chunk_bytes:,}"
            )
        want = self.expected_length(index)
        if n != want:
            raise InvalidArgumentError(
                f"chunk {index} has {n:,} bytes; expected {want:,} "
                f"({self.num_elements:,} values in chunks of {self.chunk_bytes:,} bytes)"
            )
        if self.ring_bits is not None and self.ring_bits < 64:
            values = np.frombuffer(data, dtype="<u8")
            high = values >> np.uint64(self.ring_bits)
            if high.any():
                pos = int(np.flatnonzero(high)[0])
                element = index * (self.chunk_bytes // 8) + pos
                raise InvalidArgumentError(
                    f"element {element:,} = {int(values[pos])} is outside Z_2^{self.ring_bits}"
                )
        self._hash.update(data)
        self.next_index += 1
        self.received_bytes += n
        return data

    def finish(self) -> bytes:
        """Check that the stream is complete (and the hash, if announced); returns the SHA-256."""
        if self.next_index != self.chunk_count:
            raise InvalidArgumentError(
                f"stream ended after {self.next_index} of {self.chunk_count} chunk(s) "
                f"({self.received_bytes:,} of {self.total_bytes:,} bytes)"
            )
        digest = self._hash.digest()
        if self._expected_sha256 is not None and digest != self._expected_sha256:
            raise InvalidArgumentError("SHA-256 of the received vector does not match the header's")
        self.finished = True
        return digest


class ChunkReassembler(ChunkValidator):
    """A :class:`ChunkValidator` that also rebuilds the vector (``dtype``: uint64 or float64).

    Allocates the whole vector when constructed, i.e. after the layout has been validated
    against the limits. :meth:`finish` returns it in native byte order.
    """

    def __init__(
        self,
        num_elements: int,
        chunk_bytes: int,
        chunk_count: int | None = None,
        *,
        dtype: np.dtype | type = np.uint64,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
        max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
        sha256: bytes | None = None,
        ring_bits: int | None = None,
    ) -> None:
        dt = np.dtype(dtype)
        if dt.kind not in "uf" or dt.itemsize != 8:
            raise ValueError(f"dtype must be uint64 or float64, not {dt}")
        if ring_bits is not None and dt.kind != "u":
            raise ValueError("ring_bits applies to uint64 vectors only")
        super().__init__(
            num_elements,
            chunk_bytes,
            chunk_count,
            itemsize=8,
            max_chunk_bytes=max_chunk_bytes,
            max_total_bytes=max_total_bytes,
            sha256=sha256,
            ring_bits=ring_bits,
        )
        self._array = np.empty(num_elements, dtype=dt.newbyteorder("<"))
        self._bytes = memoryview(self._array).cast("B")

    def add(self, index: int, data: bytes) -> None:
        """Validate the next chunk and store it."""
        self.check(index, data)
        start = index * self.chunk_bytes
        self._bytes[start : start + len(data)] = data

    def finish(self) -> np.ndarray:  # type: ignore[override]
        """The complete vector (raises like :meth:`ChunkValidator.finish`)."""
        super().finish()
        self._bytes.release()
        return self._array.astype(self._array.dtype.newbyteorder("="), copy=False)


# ----------------------------------------------------------------------------- messages


def _chunks_of(messages: Iterator[Any], what: str) -> Iterator[tuple[int, bytes]]:
    """(index, data) of the chunk messages after a header; a second header is refused."""
    for msg in messages:
        kind = msg.WhichOneof("kind")
        if kind == "chunk":
            yield msg.chunk.index, msg.chunk.data
        elif kind == "header":
            raise InvalidArgumentError(f"a second {what} header in the stream")
        else:
            raise InvalidArgumentError(f"empty message in the {what} stream")


def share_messages(
    vec: np.ndarray,
    *,
    run_id: str,
    round_number: int,
    server_role: int,
    ring_bits: int,
    submission_id: bytes,
    provider_id: str = "",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    compute_seconds: float = 0.0,
) -> Iterator[aggregation_pb2.ShareChunk]:
    """The SubmitShare request stream for a share vector (uint64, values < 2^ring_bits).

    ``server_role``: the ServerRole the share is for. ``provider_id`` only matters to a server
    running with --insecure. ValueError for a vector that is not a valid share.
    """
    arr = _little_endian(vec)
    if arr.dtype.kind != "u" or arr.dtype.itemsize != 8:
        raise ValueError(f"a share is a uint64 vector, not {arr.dtype}")
    if not 1 <= ring_bits <= 64:
        raise ValueError(f"ring_bits={ring_bits} is not in 1..64")
    if ring_bits < 64 and (arr >> np.uint64(ring_bits)).any():
        raise ValueError(f"share has values outside Z_2^{ring_bits}")
    if not 1 <= len(submission_id) <= MAX_SUBMISSION_ID_BYTES:
        raise ValueError(f"submission_id must be 1..{MAX_SUBMISSION_ID_BYTES} bytes")
    _check_send_chunk_bytes(chunk_bytes, 8)
    header = aggregation_pb2.ShareHeader(
        run_id=run_id,
        round=round_number,
        server_role=server_role,
        num_elements=len(arr),
        ring_bits=ring_bits,
        chunk_bytes=chunk_bytes,
        chunk_count=chunk_count(arr.nbytes, chunk_bytes),
        submission_id=submission_id,
        sha256=vector_sha256(arr),
        provider_id=provider_id,
        compute_seconds=compute_seconds,
    )
    yield aggregation_pb2.ShareChunk(header=header)
    for i, data in enumerate(iter_vector_chunks(arr, chunk_bytes)):
        yield aggregation_pb2.ShareChunk(chunk=aggregation_pb2.VectorChunk(index=i, data=data))


def _share_validator(
    header: aggregation_pb2.ShareHeader,
    max_chunk_bytes: int,
    max_total_bytes: int,
    reassemble: bool,
) -> ChunkValidator:
    cls: Any = ChunkReassembler if reassemble else ChunkValidator
    return cls(
        header.num_elements,
        header.chunk_bytes,
        header.chunk_count,
        max_chunk_bytes=max_chunk_bytes,
        max_total_bytes=max_total_bytes,
        sha256=header.sha256,
        ring_bits=header.ring_bits,
    )


def read_share_header(
    messages: Iterator[aggregation_pb2.ShareChunk],
    *,
    num_elements: int | None = None,
    ring_bits: int | None = None,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
) -> aggregation_pb2.ShareHeader:
    """Read and check the first message of a SubmitShare stream; returns the ShareHeader.

    Checks everything the header alone determines: it is a header; ring bits and length equal
    ``ring_bits``/``num_elements`` when given; submission id 1..64 bytes; a 32-byte SHA-256;
    chunk size and count consistent and within the limits. Run, round, role and identity are
    the caller's to check (they need the server's state). Raises a :class:`WireError` subclass.
    """
    first = next(messages, None)
    if first is None:
        raise InvalidArgumentError("empty stream: the first message must be a ShareHeader")
    if first.WhichOneof("kind") != "header":
        raise InvalidArgumentError("the first message of a share stream must be a ShareHeader")
    header = first.header
    if not 1 <= header.ring_bits <= 64:
        raise InvalidArgumentError(f"ring_bits={header.ring_bits} is not in 1..64")
    if ring_bits is not None and header.ring_bits != ring_bits:
        raise InvalidArgumentError(
            f"share is in Z_2^{header.ring_bits}; this run aggregates in Z_2^{ring_bits}"
        )
    if num_elements is not None and header.num_elements != num_elements:
        raise InvalidArgumentError(
            f"share has {header.num_elements:,} values; the model has {num_elements:,} parameters"
        )
    if not 1 <= len(header.submission_id) <= MAX_SUBMISSION_ID_BYTES:
        raise InvalidArgumentError(
            f"submission_id must be 1..{MAX_SUBMISSION_ID_BYTES} bytes, "
            f"got {len(header.submission_id)}"
        )
    if len(header.sha256) != 32:
        raise InvalidArgumentError(f"sha256 must be 32 bytes, got {len(header.sha256)}")
    _share_validator(header, max_chunk_bytes, max_total_bytes, reassemble=False)
    return header


def iter_share_payload(
    messages: Iterator[aggregation_pb2.ShareChunk],
    header: aggregation_pb2.ShareHeader,
    *,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
) -> Iterator[bytes]:
    """The validated chunk payloads of a share stream whose header was read already.

    Streams (memory O(chunk)): each chunk is yielded once checked (order, length, ring range);
    after the last one the count and SHA-256 are checked, so a consumer must treat the data as
    valid only once the iterator is exhausted without an exception.
    """
    validator = _share_validator(header, max_chunk_bytes, max_total_bytes, reassemble=False)
    for index, data in _chunks_of(messages, "share"):
        yield validator.check(index, data)
    validator.finish()


def read_share_stream(
    messages: Iterator[aggregation_pb2.ShareChunk],
    *,
    check_header: Callable[[aggregation_pb2.ShareHeader], object] | None = None,
    num_elements: int | None = None,
    ring_bits: int | None = None,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
) -> tuple[aggregation_pb2.ShareHeader, np.ndarray]:
    """Read a whole SubmitShare stream into a uint64 vector; returns (header, vector).

    ``check_header`` runs on the header before any chunk is read (raise a :class:`WireError`
    there to refuse, e.g., a replayed round without receiving its payload).
    """
    header = read_share_header(
        messages,
        num_elements=num_elements,
        ring_bits=ring_bits,
        max_chunk_bytes=max_chunk_bytes,
        max_total_bytes=max_total_bytes,
    )
    if check_header is not None:
        check_header(header)
    assembler = _share_validator(header, max_chunk_bytes, max_total_bytes, reassemble=True)
    assert isinstance(assembler, ChunkReassembler)
    for index, data in _chunks_of(messages, "share"):
        assembler.add(index, data)
    return header, assembler.finish()


def model_messages(
    params: np.ndarray,
    *,
    run_id: str,
    version: int,
    model: str = "",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    sha256: bytes | None = None,
) -> Iterator[aggregation_pb2.ModelChunk]:
    """The FetchModel response stream for a float64 parameter vector.

    ``sha256``: the vector's hash when the caller has it already (it is recomputed otherwise).
    """
    arr = _little_endian(params)
    if arr.dtype != np.dtype("<f8"):
        raise ValueError(f"model parameters travel as float64, not {arr.dtype}")
    _check_send_chunk_bytes(chunk_bytes, 8)
    header = aggregation_pb2.ModelHeader(
        run_id=run_id,
        version=version,
        num_parameters=len(arr),
        sha256=sha256 if sha256 is not None else vector_sha256(arr),
        chunk_bytes=chunk_bytes,
        chunk_count=chunk_count(arr.nbytes, chunk_bytes),
        model=model,
    )
    header.published_at.GetCurrentTime()
    yield aggregation_pb2.ModelChunk(header=header)
    for i, data in enumerate(iter_vector_chunks(arr, chunk_bytes)):
        yield aggregation_pb2.ModelChunk(chunk=aggregation_pb2.VectorChunk(index=i, data=data))


def read_model_stream(
    messages: Iterable[aggregation_pb2.ModelChunk],
    *,
    version: int | None = None,
    num_parameters: int | None = None,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
) -> tuple[aggregation_pb2.ModelHeader, np.ndarray]:
    """Read a FetchModel stream; returns (header, float64 vector), hash verified.

    Raises a :class:`WireError` subclass for a malformed stream or a version/length other than
    the expected one.
    """
    it = iter(messages)
    first = next(it, None)
    if first is None or first.WhichOneof("kind") != "header":
        raise InvalidArgumentError("the first message of a model stream must be a ModelHeader")
    header = first.header
    if version is not None and header.version != version:
        raise FailedPreconditionError(
            f"server sent model version {header.version}, expected {version}"
        )
    if num_parameters is not None and header.num_parameters != num_parameters:
        raise InvalidArgumentError(
            f"model has {header.num_parameters:,} parameters, expected {num_parameters:,}"
        )
    if len(header.sha256) != 32:
        raise InvalidArgumentError(f"sha256 must be 32 bytes, got {len(header.sha256)}")
    assembler = ChunkReassembler(
        header.num_parameters,
        header.chunk_bytes,
        header.chunk_count,
        dtype=np.float64,
        max_chunk_bytes=max_chunk_bytes,
        max_total_bytes=max_total_bytes,
        sha256=header.sha256,
    )
    for index, data in _chunks_of(it, "model"):
        assembler.add(index, data)
    return header, assembler.finish()

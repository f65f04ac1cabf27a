"""gRPC servers and channels: TLS by default (plaintext only with ``insecure=True``), message
size limits on both sides, and the standard ``grpc.health.v1`` service.

Every channel and server sets gRPC's maximum message size to :data:`DEFAULT_MAX_MESSAGE_BYTES`
(1 MiB + 64 KiB), so a larger message is refused by gRPC itself with RESOURCE_EXHAUSTED.

:func:`add_servicer` registers a servicer so that a request which does not parse, or whose
numbers are out of bounds (:mod:`spgc.wire.bounds`), is refused with INVALID_ARGUMENT and a
one-line warning instead of gRPC's INTERNAL and a logged traceback.
"""

from __future__ import annotations

import asyncio
import errno
import ipaddress
import logging
import threading
import traceback
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc
from google.protobuf import message_factory
from google.protobuf.descriptor import MethodDescriptor, ServiceDescriptor
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as aio_health

from spgc.wire.bounds import check_bounds
from spgc.wire.chunks import MAX_CHUNK_BYTES
from spgc.wire.errors import WireError
from spgc.wire.identity import peer_identity
from spgc.wire.tls import TlsFiles, channel_credentials, server_credentials

log = logging.getLogger(__name__)
_T = TypeVar("_T")

#: gRPC message size limit on both sides: a full chunk plus room for the protobuf framing.
DEFAULT_MAX_MESSAGE_BYTES = MAX_CHUNK_BYTES + (64 << 10)


def _check_transport(tls: TlsFiles | None, insecure: bool, what: str) -> None:
    if tls is None and not insecure:
        raise ValueError(
            f"refusing to {what} without TLS: give certificate files (cert, key, CA), or pass "
            "insecure=True (--insecure) to run in plaintext explicitly"
        )
    if tls is not None and insecure:
        raise ValueError(f"cannot {what}: both TLS files and insecure=True were given")


def split_host_port(address: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[v6 host]:port"`` as (host, port); ValueError unless the host is
    non-empty and the port is 0..65535 in ASCII digits (0: any free port, for a listener)."""
    host, _, port = address.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"{address[:64]!r} is not host:port (port 0..65535)")
    return host, int(port)


def ray_cluster_endpoint(address: str) -> tuple[str, int] | None:
    """The (host, port) a Ray cluster address names (``host:port``, the head's GCS;
    ``ray://host:port``, Ray Client), or None for those Ray resolves itself: "" (the servers'
    private local cluster), "local" and "auto". ValueError for anything else."""
    if address in ("", "local", "auto"):
        return None
    try:
        host, port = split_host_port(address.removeprefix("ray://"))
    except ValueError:
        raise ValueError(
            f"{address[:64]!r} is not host:port, ray://host:port, auto or empty"
        ) from None
    if port == 0:  # "any free port" means nothing for a cluster that already listens
        raise ValueError(f"{address[:64]!r}: a Ray cluster's port cannot be 0")
    return host, port


def join_host_port(host: str, port: int) -> str:
    """The inverse of :func:`split_host_port` (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


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


def _server_transport(
    bind: str,
    tls: TlsFiles | None,
    insecure: bool,
    max_message_bytes: int,
    require_client_auth: bool,
    options: Sequence[tuple[str, Any]],
) -> tuple[list[tuple[str, Any]], grpc.ServerCredentials | None]:
    """The options and credentials every server of ours gets (sync or asyncio)."""
    _check_transport(tls, insecure, f"serve gRPC on {bind}")
    opts = [*_message_options(max_message_bytes), ("grpc.so_reuseport", 0), *options]
    creds = None
    if tls is not None:
        creds = server_credentials(tls.cert, tls.key, tls.ca, require_client_auth)
    return opts, creds


def _register_and_bind(
    server: Any,
    servicer_adders: Iterable[Callable[[Any], object]],
    bind: str,
    creds: grpc.ServerCredentials | None,
) -> int:
    """Add the servicers, bind the port; returns the port (OSError when it cannot be bound)."""
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
    return port


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
    interceptors: Sequence[grpc.ServerInterceptor] = (),
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
    opts, creds = _server_transport(
        bind, tls, insecure, max_message_bytes, require_client_auth, options
    )
    server = grpc.server(
        ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="spgc-grpc"),
        options=opts,
        maximum_concurrent_rpcs=maximum_concurrent_rpcs,
        interceptors=list(interceptors),
    )
    return server, _register_and_bind(server, servicer_adders, bind, creds)


def make_aio_server(
    bind: str,
    servicer_adders: Iterable[Callable[[grpc.aio.Server], object]],
    tls: TlsFiles | None,
    insecure: bool = False,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
    *,
    require_client_auth: bool = True,
    maximum_concurrent_rpcs: int | None = None,
    options: Sequence[tuple[str, Any]] = (),
    interceptors: Sequence[grpc.aio.ServerInterceptor] = (),
) -> tuple[grpc.aio.Server, int]:
    """:func:`make_server` for an asyncio gRPC server: every call is a coroutine on one event
    loop, so thousands of long polls cost no thread each. Call it from the loop's thread (the
    server belongs to the running loop); start it with ``await server.start()``."""
    opts, creds = _server_transport(
        bind, tls, insecure, max_message_bytes, require_client_auth, options
    )
    server = grpc.aio.server(
        options=opts,
        maximum_concurrent_rpcs=maximum_concurrent_rpcs,
        interceptors=list(interceptors),
    )
    return server, _register_and_bind(server, servicer_adders, bind, creds)


def _quiet_poller_shutdown(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """grpc.aio's completion-queue poller may run one last callback on its file descriptor
    after the server stopped and closed it (EBADF): a harmless shutdown race that asyncio
    would print as a traceback. Anything else goes to the default handler."""
    exc = context.get("exception")
    if (
        isinstance(exc, OSError)
        and exc.errno == errno.EBADF
        and "completion_queue" in "".join(traceback.format_tb(exc.__traceback__))
    ):
        log.debug("asyncio callback after its descriptor was closed (ignored): %s", exc)
        return
    loop.default_exception_handler(context)


class LoopThread:
    """An asyncio event loop on a thread of its own: how a threaded program (the daemon, a
    test) runs an asyncio gRPC server. ``run(coro)`` runs a coroutine on the loop and returns
    its result (or raises its exception) in the calling thread."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.set_exception_handler(_quiet_poller_shutdown)
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, _T], timeout: float | None = 30.0) -> _T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        """Stop the loop (after its servers were stopped) and wait for its thread."""
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        if not self._thread.is_alive():
            self.loop.close()


# A lost connection is dialled again after 0.25 s, backing off (with gRPC's own jitter) to at
# most 2 s between attempts, not gRPC's default of up to 120 s: a server that restarts is
# reached within about 2 s of coming back, by providers and by the other server alike.
RECONNECT_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 250),
    ("grpc.min_reconnect_backoff_ms", 250),
    ("grpc.max_reconnect_backoff_ms", 2000),
)


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
    opts = [*_message_options(max_message_bytes), *RECONNECT_OPTIONS, *options]
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
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *services):
        servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return servicer


async def add_aio_health(server: grpc.aio.Server, services: Iterable[str] = ()) -> Any:
    """:func:`add_health` for an asyncio server (its ``set`` and ``enter_graceful_shutdown``
    are coroutines, to run on the server's loop)."""
    servicer = aio_health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    for name in ("", *services):
        await servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return servicer


# ----------------------------------------------------------------------------- servicers


class MalformedRequest(WireError):
    """A request that does not parse as its message, or with a number out of bounds; ``code``
    is INVALID_ARGUMENT (RESOURCE_EXHAUSTED for a size above its limit). A WireError, so a
    servicer's :func:`~spgc.wire.errors.abort_on_error` reports it like its own refusals."""


#: ``on_refused(who, method, code, reason)``: told of each request refused before its handler
#: (who: the caller's certificate name, else its address; code: the gRPC status name).
RefusalHandler = Callable[[str, str, str, str], None]


class _RequestParser:
    """Parses the raw requests of one method; a refusal goes to ``on_refused`` (else it is
    logged in one line)."""

    def __init__(
        self, method: MethodDescriptor, bounds: bool, on_refused: RefusalHandler | None = None
    ) -> None:
        self.method = method
        self.message_class: Any = message_factory.GetMessageClass(method.input_type)
        self.bounds = bounds
        self.on_refused = on_refused

    def _refused(
        self,
        context: grpc.ServicerContext,
        message: str,
        code: grpc.StatusCode = grpc.StatusCode.INVALID_ARGUMENT,
    ) -> MalformedRequest:
        if self.on_refused is None:
            log.warning("%s from %s refused: %s", self.method.full_name, context.peer(), message)
        else:
            who = peer_identity(context) or context.peer()
            self.on_refused(who, self.method.name, code.name, message)
        return MalformedRequest(message, code)

    def parse(self, raw: bytes, context: grpc.ServicerContext, index: int | None = None) -> Any:
        """The request message; raises :class:`MalformedRequest`."""
        where = "" if index is None else f" {index}"
        try:
            request = self.message_class.FromString(raw)
        except Exception as exc:  # DecodeError, or anything else the parser raises
            what = str(exc) or type(exc).__name__
            message = f"malformed {self.method.name} message{where}: {what}"
            raise self._refused(context, message) from None
        if self.bounds:
            try:
                check_bounds(request)
            except WireError as exc:
                message = f"{self.method.name} message{where}: {exc.message}"
                raise self._refused(context, message, exc.code) from None
        return request

    def stream(self, raw: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[Any]:
        """The parsed request stream; raises :class:`MalformedRequest` where a message fails."""
        for index, item in enumerate(raw):
            yield self.parse(item, context, index)

    async def astream(self, raw: AsyncIterator[bytes], context: Any) -> AsyncIterator[Any]:
        """:meth:`stream` of an asyncio server's request stream."""
        index = 0
        async for item in raw:
            yield self.parse(item, context, index)
            index += 1


def _abort_refused(exc: MalformedRequest, context: grpc.ServicerContext) -> None:
    context.abort(exc.code, exc.message)


def _method_handler(
    servicer: object, method: MethodDescriptor, bounds: bool, on_refused: RefusalHandler | None
) -> Any:
    behaviour = getattr(servicer, method.name)
    parser = _RequestParser(method, bounds, on_refused)
    serialize = message_factory.GetMessageClass(method.output_type).SerializeToString

    if not method.client_streaming:

        def unary_request(raw: bytes, context: grpc.ServicerContext) -> Any:
            try:
                request = parser.parse(raw, context)
            except MalformedRequest as exc:
                return _abort_refused(exc, context)  # context.abort raises
            return behaviour(request, context)

        make = (
            grpc.unary_stream_rpc_method_handler
            if method.server_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        return make(unary_request, request_deserializer=None, response_serializer=serialize)

    # A malformed message in a request stream surfaces inside the servicer's own iteration:
    # abort_on_error maps it (MalformedRequest is a WireError); otherwise it is aborted here.
    if not method.server_streaming:

        def stream_unary(raw: Iterator[bytes], context: grpc.ServicerContext) -> Any:
            try:
                return behaviour(parser.stream(raw, context), context)
            except MalformedRequest as exc:
                _abort_refused(exc, context)

        return grpc.stream_unary_rpc_method_handler(
            stream_unary, request_deserializer=None, response_serializer=serialize
        )

    def stream_stream(raw: Iterator[bytes], context: grpc.ServicerContext) -> Iterator[Any]:
        try:
            yield from behaviour(parser.stream(raw, context), context)
        except MalformedRequest as exc:
            _abort_refused(exc, context)

    return grpc.stream_stream_rpc_method_handler(
        stream_stream, request_deserializer=None, response_serializer=serialize
    )


def _aio_method_handler(
    servicer: object, method: MethodDescriptor, bounds: bool, on_refused: RefusalHandler | None
) -> Any:
    """:func:`_method_handler` for a ``grpc.aio`` server: the servicer's methods are
    coroutines (async generators for streamed responses)."""
    behaviour = getattr(servicer, method.name)
    parser = _RequestParser(method, bounds, on_refused)
    serialize = message_factory.GetMessageClass(method.output_type).SerializeToString

    async def parse_or_abort(raw: bytes, context: Any) -> Any:
        try:
            return parser.parse(raw, context)
        except MalformedRequest as exc:
            await context.abort(exc.code, exc.message)  # raises

    if not method.client_streaming and not method.server_streaming:

        async def unary_unary(raw: bytes, context: Any) -> Any:
            return await behaviour(await parse_or_abort(raw, context), context)

        return grpc.unary_unary_rpc_method_handler(
            unary_unary, request_deserializer=None, response_serializer=serialize
        )
    if not method.client_streaming:

        async def unary_stream(raw: bytes, context: Any) -> AsyncIterator[Any]:
            async for item in behaviour(await parse_or_abort(raw, context), context):
                yield item

        return grpc.unary_stream_rpc_method_handler(
            unary_stream, request_deserializer=None, response_serializer=serialize
        )
    if not method.server_streaming:

        async def stream_unary(raw: AsyncIterator[bytes], context: Any) -> Any:
            try:
                return await behaviour(parser.astream(raw, context), context)
            except MalformedRequest as exc:
                await context.abort(exc.code, exc.message)

        return grpc.stream_unary_rpc_method_handler(
            stream_unary, request_deserializer=None, response_serializer=serialize
        )

    async def stream_stream(raw: AsyncIterator[bytes], context: Any) -> AsyncIterator[Any]:
        try:
            async for item in behaviour(parser.astream(raw, context), context):
                yield item
        except MalformedRequest as exc:
            await context.abort(exc.code, exc.message)

    return grpc.stream_stream_rpc_method_handler(
        stream_stream, request_deserializer=None, response_serializer=serialize
    )


def add_servicer(
    server: grpc.Server | grpc.aio.Server,
    servicer: object,
    service: ServiceDescriptor,
    *,
    bounds: bool = True,
    on_refused: RefusalHandler | None = None,
) -> grpc.GenericRpcHandler:
    """Register ``servicer`` for ``service`` on ``server``; returns the handler added.

    The generated ``add_XServicer_to_server`` lets gRPC parse each request: bytes that do not
    parse end the call with INTERNAL and a logged traceback. Here every request (each message
    of a request stream too) is parsed as it reaches the method: a malformed one is refused
    with INVALID_ARGUMENT ("malformed SubmitShare message: ...") and one warning line, and, with
    ``bounds``, so is a number outside :data:`spgc.wire.bounds.FIELD_BOUNDS`
    (RESOURCE_EXHAUSTED for a size above its limit); ``on_refused`` is told of each such
    refusal instead of the warning line. Responses are serialised as the generated
    code does. ``service`` is a descriptor of the generated modules, e.g.
    ``aggregation_pb2.DESCRIPTOR.services_by_name["Aggregator"]``; ``servicer`` has one method
    per RPC (subclass the generated ``XServicer`` for UNIMPLEMENTED defaults). For
    :func:`make_server`: ``functools.partial(add_servicer, servicer=s, service=d)``. On a
    ``grpc.aio`` server (:func:`make_aio_server`) the servicer's methods are coroutines.
    """
    make = _aio_method_handler if isinstance(server, grpc.aio.Server) else _method_handler
    handlers = {m.name: make(servicer, m, bounds, on_refused) for m in service.methods}
    generic = grpc.method_handlers_generic_handler(service.full_name, handlers)
    server.add_generic_rpc_handlers((generic,))
    server.add_registered_method_handlers(service.full_name, handlers)
    return generic

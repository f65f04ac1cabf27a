"""Limits on provider traffic, enforced before a handler reads anything (a gRPC interceptor).

The providers' port is open to every holder of a certificate of the deployment CA, so each call
to the Aggregator service is checked first:

- **Who.** With TLS, a certificate name outside the configured ``providers`` is refused with
  PERMISSION_DENIED at once: no request message is read, no memory reserved for it.
- **How many at once.** At most ``max_streams`` calls in flight per identity
  (RESOURCE_EXHAUSTED beyond): a provider needs a long poll, an upload and a model download at
  most; one identity cannot hold the server's threads.
- **How often.** A token bucket per identity: ``rate`` calls per second on average, bursts of
  ``burst`` (RESOURCE_EXHAUSTED beyond).
- **Idle and slow streams.** A request stream that sends nothing for ``idle_seconds``, or is
  still open after ``stream_seconds``, is ended with CANCELLED (each message is awaited with
  the time it has left).

Without TLS (``insecure``) identities are unauthenticated: the limits count per peer address.
The server-to-server Peer service runs on its own gRPC server and port (``peer_listen``), so
provider traffic can never starve it; its own gate (:class:`PeerGate`) refuses every
certificate but the other server's before a request is read. The providers' gate is a
``grpc.aio`` interceptor: it runs on the providers' server's event loop, so its counters
need no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Container
from dataclasses import dataclass
from typing import Any

import grpc

from spgc.wire.identity import peer_identity

__all__ = ["PeerGate", "ProviderGate", "ProviderLimits"]

log = logging.getLogger(__name__)

_GUARDED_PREFIX = "/spgc.v1.Aggregator/"
_PEER_PREFIX = "/spgc.v1.Peer/"


@dataclass(frozen=True)
class ProviderLimits:
    """The per-identity limits (server configuration keys ``provider_*``)."""

    max_streams: int = 4
    rate: float = 200.0
    burst: int = 400
    idle_seconds: float = 30.0
    stream_seconds: float = 600.0


class _Bucket:
    def __init__(self, rate: float, burst: int) -> None:
        self.rate, self.burst = rate, float(burst)
        self.tokens, self.at = float(burst), time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class ProviderGate(grpc.aio.ServerInterceptor):
    """The interceptor of the providers' gRPC server (see the module docstring).

    ``allowed``: the configured provider names (empty: any certificate of the CA);
    ``on_refused(identity, method, code, reason)``: called for every refusal (the audit
    trail; ``code`` is the gRPC status name).
    """

    def __init__(
        self,
        limits: ProviderLimits,
        allowed: Container[str] | None,
        insecure: bool,
        on_refused: Callable[[str, str, str, str], None] | None = None,
    ) -> None:
        self.limits = limits
        self.allowed = allowed
        self.insecure = insecure
        self.on_refused = on_refused
        self._in_flight: dict[str, int] = {}
        self._buckets: dict[str, _Bucket] = {}

    # ------------------------------------------------------------------ interceptor

    async def intercept_service(
        self, continuation: Callable[[Any], Awaitable[Any]], handler_call_details: Any
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if handler is None or not method.startswith(_GUARDED_PREFIX):
            return handler
        name = method[len(_GUARDED_PREFIX) :]
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(
                self._guard(name, handler.unary_unary, streamed=False),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                self._guard(name, handler.unary_stream, streamed=False, yields=True),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(
                self._guard(name, handler.stream_unary, streamed=True),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return grpc.stream_stream_rpc_method_handler(
            self._guard(name, handler.stream_stream, streamed=True, yields=True),
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _guard(
        self, method: str, behaviour: Callable, *, streamed: bool, yields: bool = False
    ) -> Callable:
        """``behaviour`` run only once the call is admitted, its request stream (if any)
        watched for silence and length; the slot is released when it ends."""

        async def run(request: Any, context: Any) -> Any:
            who = await self._admit(method, context)
            try:
                if streamed:
                    request = self._watched(request, context)
                return await behaviour(request, context)
            finally:
                self._release(who)

        async def run_yielding(request: Any, context: Any) -> AsyncIterator[Any]:
            who = await self._admit(method, context)
            try:
                if streamed:
                    request = self._watched(request, context)
                async for item in behaviour(request, context):
                    yield item
            finally:
                self._release(who)

        return run_yielding if yields else run

    async def _admit(self, method: str, context: Any) -> str:
        """The caller's key for the limits; aborts the call (never returns) when refused."""
        who = peer_identity(context)
        if who is None:
            if not self.insecure:
                await self._refuse(context, context.peer(), method,
                                   grpc.StatusCode.UNAUTHENTICATED,
                                   "no authenticated client certificate")  # fmt: skip
            who = context.peer()  # plaintext: counted per address
        elif self.allowed and who not in self.allowed:
            await self._refuse(context, who, method, grpc.StatusCode.PERMISSION_DENIED,
                               f"{who!r} is not a provider of this run")  # fmt: skip
        limits = self.limits
        bucket = self._buckets.setdefault(who, _Bucket(limits.rate, limits.burst))
        allowed_rate = bucket.take()
        busy = self._in_flight.get(who, 0)
        if allowed_rate and busy < limits.max_streams:
            self._in_flight[who] = busy + 1
            return who
        reason = (
            f"more than {limits.max_streams} calls at once from {who!r}"
            if allowed_rate
            else f"more than {limits.rate:g} calls per second from {who!r}"
        )
        await self._refuse(context, who, method, grpc.StatusCode.RESOURCE_EXHAUSTED, reason)
        raise AssertionError("unreachable")  # context.abort raises

    async def _refuse(
        self, context: Any, who: str, method: str, code: grpc.StatusCode, reason: str
    ) -> None:
        if self.on_refused is not None:
            self.on_refused(who, method, code.name, reason)
        await context.abort(code, reason)

    def _release(self, who: str) -> None:
        left = self._in_flight.get(who, 1) - 1
        if left > 0:
            self._in_flight[who] = left
        else:
            self._in_flight.pop(who, None)

    async def _watched(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
        """The request stream, ended with CANCELLED when it goes silent for ``idle_seconds``
        or runs past ``stream_seconds``."""
        limits = self.limits
        started = time.monotonic()
        messages = requests.__aiter__()
        while True:
            open_for = time.monotonic() - started
            wait = min(limits.idle_seconds, limits.stream_seconds - open_for)
            try:
                message = await asyncio.wait_for(messages.__anext__(), max(0.0, wait))
            except StopAsyncIteration:
                return
            except TimeoutError:
                idle = limits.idle_seconds <= limits.stream_seconds - open_for
                reason = (
                    f"silent for {limits.idle_seconds:g} s"
                    if idle
                    else f"open longer than {limits.stream_seconds:g} s"
                )
                log.warning("cancelling a provider stream from %s: %s", context.peer(), reason)
                await context.abort(grpc.StatusCode.CANCELLED, reason)
            yield message


class PeerGate(grpc.ServerInterceptor):
    """The interceptor of the Peer service's (threaded) gRPC server: with TLS, a caller whose
    certificate name is not ``peer_name`` is refused with PERMISSION_DENIED (UNAUTHENTICATED
    without a name) before its request is parsed, and reported to ``on_refused(identity,
    method, code, reason)`` like a provider refusal. The servicer checks the role besides."""

    def __init__(
        self,
        peer_name: str,
        insecure: bool,
        on_refused: Callable[[str, str, str, str], None] | None = None,
    ) -> None:
        self.peer_name = peer_name
        self.insecure = insecure
        self.on_refused = on_refused

    def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = continuation(details)
        if handler is None or not details.method.startswith(_PEER_PREFIX):
            return handler
        name = details.method[len(_PEER_PREFIX) :]
        kinds = ("unary_unary", "unary_stream", "stream_unary", "stream_stream")
        kind = next(k for k in kinds if getattr(handler, k) is not None)
        behaviour = getattr(handler, kind)

        def guarded(request: Any, context: grpc.ServicerContext) -> Any:
            self._admit(name, context)
            return behaviour(request, context)

        make = getattr(grpc, f"{kind}_rpc_method_handler")
        return make(
            guarded,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )

    def _admit(self, method: str, context: grpc.ServicerContext) -> None:
        who = peer_identity(context)
        if who is None and self.insecure:
            return
        if who is None:
            who, code = context.peer(), grpc.StatusCode.UNAUTHENTICATED
            reason = "no authenticated server certificate"
        elif who != self.peer_name:
            code = grpc.StatusCode.PERMISSION_DENIED
            reason = f"{who!r} is not the peer server {self.peer_name!r}"
        else:
            return
        if self.on_refused is not None:
            self.on_refused(who, method, code.name, reason)
        context.abort(code, reason)

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
  still open after ``stream_seconds``, is cancelled (a watchdog thread checks every second).

Without TLS (``insecure``) identities are unauthenticated: the limits count per peer address.
The server-to-server Peer service runs on its own gRPC server and port (``peer_listen``), so
provider traffic can never starve it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass
from typing import Any

import grpc

from spgc.wire.identity import peer_identity

__all__ = ["ProviderGate", "ProviderLimits"]

log = logging.getLogger(__name__)

_GUARDED_PREFIX = "/spgc.v1.Aggregator/"


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


class _Stream:
    """One request stream under watch: when it last sent, when it started."""

    def __init__(self, context: grpc.ServicerContext) -> None:
        self.context = context
        self.started = self.last = time.monotonic()


class ProviderGate(grpc.ServerInterceptor):
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
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}
        self._buckets: dict[str, _Bucket] = {}
        self._streams: set[_Stream] = set()
        self._stop = threading.Event()
        self._watchdog = threading.Thread(
            target=self._watch, name="spgc-stream-watchdog", daemon=True
        )
        self._watchdog.start()

    def close(self) -> None:
        self._stop.set()

    # ------------------------------------------------------------------ interceptor

    def intercept_service(
        self, continuation: Callable[[Any], Any], handler_call_details: Any
    ) -> Any:
        handler = continuation(handler_call_details)
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
        def run(request: Any, context: grpc.ServicerContext) -> Any:
            with self._admitted(method, request, context, streamed) as watched:
                return behaviour(watched, context)

        def run_yielding(request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
            with self._admitted(method, request, context, streamed) as watched:
                yield from behaviour(watched, context)

        return run_yielding if yields else run

    @contextlib.contextmanager
    def _admitted(
        self, method: str, request: Any, context: grpc.ServicerContext, streamed: bool
    ) -> Iterator[Any]:
        """Admit one call (or refuse it: the context is aborted), hand the handler its request
        (a streamed one watched for silence and length), release the slot afterwards."""
        who = self._admit(method, context)
        stream = _Stream(context) if streamed else None
        try:
            if stream is not None:
                with self._lock:
                    self._streams.add(stream)
                request = self._watched(request, stream)
            yield request
        finally:
            self._release(who, stream)

    def _admit(self, method: str, context: grpc.ServicerContext) -> str:
        """The caller's key for the limits; aborts the call (never returns) when refused."""
        who = peer_identity(context)
        if who is None:
            if not self.insecure:
                self._refuse(context, context.peer(), method, grpc.StatusCode.UNAUTHENTICATED,
                             "no authenticated client certificate")  # fmt: skip
            who = context.peer()  # plaintext: counted per address
        elif self.allowed and who not in self.allowed:
            self._refuse(context, who, method, grpc.StatusCode.PERMISSION_DENIED,
                         f"{who!r} is not a provider of this run")  # fmt: skip
        limits = self.limits
        with self._lock:
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
        self._refuse(context, who, method, grpc.StatusCode.RESOURCE_EXHAUSTED, reason)
        raise AssertionError("unreachable")  # context.abort raises

    def _refuse(
        self,
        context: grpc.ServicerContext,
        who: str,
        method: str,
        code: grpc.StatusCode,
        reason: str,
    ) -> None:
        if self.on_refused is not None:
            self.on_refused(who, method, code.name, reason)
        context.abort(code, reason)

    def _release(self, who: str, stream: _Stream | None) -> None:
        with self._lock:
            left = self._in_flight.get(who, 1) - 1
            if left > 0:
                self._in_flight[who] = left
            else:
                self._in_flight.pop(who, None)
            if stream is not None:
                self._streams.discard(stream)

    @staticmethod
    def _watched(requests: Iterator[Any], stream: _Stream) -> Iterator[Any]:
        for message in requests:
            stream.last = time.monotonic()
            yield message

    def _watch(self) -> None:
        """Cancel request streams that went silent or run too long."""
        limits = self.limits
        while not self._stop.wait(1.0):
            now = time.monotonic()
            with self._lock:
                late = [
                    s
                    for s in self._streams
                    if now - s.last > limits.idle_seconds or now - s.started > limits.stream_seconds
                ]
            for s in late:
                idle = now - s.last > limits.idle_seconds
                log.warning(
                    "cancelling a provider stream from %s: %s",
                    s.context.peer(),
                    f"silent for {now - s.last:.0f} s" if idle else "open too long",
                )
                s.context.cancel()

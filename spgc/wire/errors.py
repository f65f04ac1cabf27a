"""Errors a servicer reports as gRPC statuses, and the decorator that maps them.

:class:`WireError` and its subclasses carry a gRPC status code; :func:`abort_on_error` turns them
(and any exception with a ``code`` attribute naming a status) into ``context.abort(code,
message)`` in a servicer method; :func:`is_unavailable` tells a dead peer from a refusal.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, TypeVar

import grpc

_F = TypeVar("_F", bound=Callable[..., Any])


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


class StreamEndedEarly(InvalidArgumentError):
    """A request stream that ended before its header or its last chunk."""


class NotPairedError(WireError):
    """A peer call before this server's Handshake with the caller (a restarted server): the
    caller treats it as a lost peer and pairs again."""

    code = grpc.StatusCode.UNAVAILABLE


class ResourceExhaustedError(WireError):
    """A chunk, message or vector above the size limits; its message says "exceeds the
    limit" (:data:`SIZE_REFUSALS`)."""

    code = grpc.StatusCode.RESOURCE_EXHAUSTED


#: Words of a RESOURCE_EXHAUSTED that refuses a size (ours; gRPC's own for a message above
#: its maximum): sending the same again fails the same way. Every other RESOURCE_EXHAUSTED is
#: a limit on calls (at once, per second) that a later retry gets past.
SIZE_REFUSALS = ("exceeds the limit", "larger than max")


def is_size_refusal(exc: BaseException) -> bool:
    """A gRPC error refusing a size (:data:`SIZE_REFUSALS`): not worth a retry."""
    if not isinstance(exc, grpc.RpcError) or not isinstance(exc, grpc.Call):
        return False
    details = exc.details() or ""
    return exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and any(
        words in details for words in SIZE_REFUSALS
    )


class FailedPreconditionError(WireError):
    """Valid data at the wrong time: another run, a past or future round, a closed round."""

    code = grpc.StatusCode.FAILED_PRECONDITION


#: The words of a wrong-run refusal (FAILED_PRECONDITION): a provider that reads them in a
#: refusal knows the servers started another run and connects again (Hello) to learn its plan.
WRONG_RUN = "is not this server's run"


def wrong_run(run_id: str) -> FailedPreconditionError:
    """The refusal of a request naming another run than the server's."""
    return FailedPreconditionError(f"run {run_id[:80]!r} {WRONG_RUN}")


#: The words of an ALREADY_EXISTS refusal whose held share is a half of ANOTHER vector of the
#: provider (ShareHeader.vector_id differs): the round will likely leave the provider out.
ANOTHER_VECTOR = "a share of ANOTHER vector"


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


def _mapped_status(exc: Exception) -> tuple[grpc.StatusCode, str] | None:
    code = status_code_of(exc)
    if code is None or code is grpc.StatusCode.OK:
        return None
    message = getattr(exc, "message", None)
    return code, message if isinstance(message, str) else str(exc)


def _abort_if_mapped(exc: Exception, context: grpc.ServicerContext) -> None:
    mapped = _mapped_status(exc)
    if mapped is not None:
        context.abort(*mapped)


async def _abort_if_mapped_async(exc: Exception, context: Any) -> None:
    mapped = _mapped_status(exc)
    if mapped is not None:
        await context.abort(*mapped)


def abort_on_error(method: _F) -> _F:
    """Decorator for servicer methods: a mapped exception becomes ``context.abort``.

    Works for unary and streaming responses (generator methods), and for the coroutine and
    async generator methods of a ``grpc.aio`` servicer. Unmapped exceptions propagate (gRPC
    reports them as UNKNOWN and logs them): they are bugs, not refusals.
    """
    if inspect.isasyncgenfunction(method):

        @functools.wraps(method)
        async def async_gen_wrapper(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            try:
                async for item in method(self, request, context):
                    yield item
            except Exception as exc:
                await _abort_if_mapped_async(exc, context)
                raise

        return async_gen_wrapper  # type: ignore[return-value]

    if inspect.iscoroutinefunction(method):

        @functools.wraps(method)
        async def async_wrapper(self: Any, request: Any, context: Any) -> Any:
            try:
                return await method(self, request, context)
            except Exception as exc:
                await _abort_if_mapped_async(exc, context)
                raise

        return async_wrapper  # type: ignore[return-value]

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


def is_unavailable(exc: BaseException) -> bool:
    """A gRPC error that means "not up yet" (retry the handshake)."""
    return isinstance(exc, grpc.RpcError) and exc.code() in (  # type: ignore[attr-defined]
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )

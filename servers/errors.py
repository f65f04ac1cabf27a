"""The errors that stop a server or end its pairing with the other server, and how the daemon
tells them apart and says them in one line (the state, the round driver and the daemon's parts
all raise them, so they live below all of those)."""

from __future__ import annotations

import grpc

import garbled_core
from spgc.wire.errors import is_unavailable


class PeerMismatchError(RuntimeError):
    """The two servers disagree (configuration or model hash): training must stop."""


class BudgetExceededError(PeerMismatchError):
    """A release would take the run past its privacy budget. The round loop never opens such
    a round, so this is a broken invariant: the run stops, as on a mismatch."""


class PeerDeviatedError(PeerMismatchError):
    """The engine caught the other server deviating (garbled_core.PeerDeviated): this server
    recorded the abort and stops the run (servers.deviation)."""


class PeerLost(Exception):
    """The other server stopped, restarted or stopped answering."""


def peer_gone(exc: BaseException) -> bool:
    """Whether a daemon's error means the other server stopped answering."""
    # ChannelError: the data link broke (closed, reset, timed out, or interrupted when the
    # peer was found gone), PeerClosedError included.
    if isinstance(exc, (PeerLost, TimeoutError, garbled_core.ChannelError)):
        return True
    return isinstance(exc, grpc.RpcError) and is_unavailable(exc)


def describe_error(exc: BaseException) -> str:
    """One line for the log and the audit log (a gRPC error's repr spans several)."""
    if isinstance(exc, grpc.RpcError):
        return f"{exc.code().name}: {exc.details()}"  # type: ignore[attr-defined]
    return str(exc) or type(exc).__name__

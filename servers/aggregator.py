"""The provider-facing Aggregator service: Hello, FetchModel, SubmitShare, RoundStatus.

Identity comes from the client certificate (spgc.wire.identity.caller_identity); every refusal is a
WireError or an intake SubmissionRejected, which abort_on_error turns into the documented gRPC
status, and a refused submission never touches the round's sum. Every request's numbers are
range-checked (spgc.wire.bounds) before use: INVALID_ARGUMENT out of bounds. Hello refuses another
protocol version than ours with FAILED_PRECONDITION.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import grpc

from spgc import __version__
from spgc.servers.intake import SubmissionRejected
from spgc.servers.state import ServerState
from spgc.wire import PROTOCOL_VERSION, aggregation_pb2_grpc
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.bounds import check_bounds
from spgc.wire.chunks import MAX_CHUNK_BYTES
from spgc.wire.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    WireError,
    abort_on_error,
)
from spgc.wire.identity import caller_identity, peer_identity
from spgc.wire.messages import (
    check_protocol_version,
    iter_share_payload,
    model_messages,
    read_share_header,
)
from spgc.wire.transport import DEFAULT_MAX_MESSAGE_BYTES

MAX_LONG_POLL_SECONDS = 30.0


log = logging.getLogger(__name__)


def _role_name(role: int) -> str:
    try:
        return pb.ServerRole.Name(role)
    except ValueError:
        return f"server role {role}"


class AggregatorServicer(aggregation_pb2_grpc.AggregatorServicer):
    """One server's intake of providers' shares and publication of models."""

    def __init__(self, state: ServerState, server_name: str, insecure: bool) -> None:
        self.state = state
        self.server_name = server_name
        self.insecure = insecure
        self.allowed = frozenset(state.plan.cfg.providers)

    def _identity(self, context: grpc.ServicerContext, claimed: str = "") -> str:
        who = self._authenticate(context, claimed)
        self._require_ready()
        return who

    def _authenticate(self, context: grpc.ServicerContext, claimed: str) -> str:
        return caller_identity(context, claimed, insecure=self.insecure, allowed=self.allowed)

    def _require_ready(self) -> None:
        if not self.state.ready:  # no run id / agreed configuration before the Handshake
            raise WireError(
                "the servers have not completed their handshake yet", grpc.StatusCode.UNAVAILABLE
            )

    @abort_on_error
    def Hello(self, request: pb.HelloRequest, context: grpc.ServicerContext) -> pb.ServerInfo:
        check_bounds(request)
        who = self._authenticate(context, request.provider_id)
        # Before the readiness check: another version will never work, so say so at once.
        check_protocol_version(request.protocol_version, PROTOCOL_VERSION, "client")
        self._require_ready()
        return pb.ServerInfo(
            protocol_version=PROTOCOL_VERSION,
            software_version=f"spgc {__version__}",
            role=self.state.role,
            server_name=self.server_name,
            provider_id=who,
            config=self.state.config,
            round=self.state.round_info(None, who),
            limits=pb.WireLimits(
                max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES,
                max_chunk_bytes=MAX_CHUNK_BYTES,
                preferred_chunk_bytes=MAX_CHUNK_BYTES,
            ),
        )

    @abort_on_error
    def FetchModel(
        self, request: pb.ModelRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.ModelChunk]:
        check_bounds(request)
        self._identity(context, request.provider_id)
        want = request.version if request.HasField("version") else None
        try:
            version, params, sha = self.state.model(want)
        except KeyError:
            raise FailedPreconditionError(f"model version {want} is not served") from None
        chunk = request.chunk_bytes or MAX_CHUNK_BYTES
        chunk = max(8, min(chunk, MAX_CHUNK_BYTES) // 8 * 8)
        yield from model_messages(
            params,
            run_id=self.state.run_id,
            version=version,
            model=self.state.plan.model_name,
            chunk_bytes=chunk,
            sha256=sha,
        )

    @abort_on_error
    def SubmitShare(
        self, request_iterator: Iterator[pb.ShareChunk], context: grpc.ServicerContext
    ) -> pb.SubmitReceipt:
        seen: dict[str, object] = {}
        try:
            return self._submit_share(request_iterator, context, seen)
        except (WireError, SubmissionRejected) as exc:
            # Every refused share leaves a trail (who, which round, why).
            code = exc.code.name if isinstance(exc, WireError) else exc.code
            self.state.audit.record(
                "share_refused",
                identity=seen.get("who") or peer_identity(context) or context.peer(),
                round=seen.get("round"),
                code=code,
                reason=str(exc),
            )
            raise

    def _submit_share(
        self,
        request_iterator: Iterator[pb.ShareChunk],
        context: grpc.ServicerContext,
        seen: dict[str, object],
    ) -> pb.SubmitReceipt:
        plan = self.state.plan
        header = read_share_header(
            request_iterator, num_elements=plan.dim, ring_bits=plan.ring_bits
        )
        seen["round"] = header.round
        who = self._identity(context, header.provider_id)
        seen["who"] = who
        if header.run_id != self.state.run_id:
            raise FailedPreconditionError(f"share for run {header.run_id!r}, not this run")
        if header.server_role != self.state.role:
            # G = s1 - s2 mod 2^L: s1 is H1's, s2 H2's; a swapped share would negate the sum.
            raise InvalidArgumentError(
                f"share meant for {_role_name(header.server_role)}, this server is "
                f"{_role_name(self.state.role)}"
            )
        # The intake checks round, duplicates, replays and identity before reading the payload.
        payload = iter_share_payload(request_iterator, header)
        self.state.intake.receive(
            who,
            header.round,
            header.submission_id,
            header.num_elements,
            header.ring_bits,
            payload,
            on_admit=self.state.note_receiving,
        )
        self.state.note_accepted(header.round, who)  # compute_seconds: reserved, ignored
        receipt = pb.SubmitReceipt(
            run_id=header.run_id,
            round=header.round,
            submission_id=header.submission_id,
            provider_id=who,
            num_elements=header.num_elements,
            sha256=header.sha256,
        )
        receipt.accepted_at.GetCurrentTime()
        return receipt

    @abort_on_error
    def DeclinePlan(
        self, request: pb.DeclineRequest, context: grpc.ServicerContext
    ) -> pb.DeclineReply:
        check_bounds(request)
        who = self._identity(context, request.provider_id)
        reason = " ".join(request.reason.split())[:1000] or "(no reason given)"
        if request.run_id != self.state.run_id:
            raise WireError(
                f"run {request.run_id!r} is not this server's run", grpc.StatusCode.NOT_FOUND
            )
        self.state.note_declined(who, reason)
        log.warning("provider %s declined the plan of run %s: %s", who, request.run_id, reason)
        return pb.DeclineReply()

    @abort_on_error
    def FetchLedger(
        self, request: pb.LedgerRequest, context: grpc.ServicerContext
    ) -> pb.LedgerReply:
        check_bounds(request)  # from_line: at most 2^63 - 1; past the end: no lines
        self._identity(context, request.provider_id)
        if request.run_id != self.state.run_id:
            raise WireError(
                f"run {request.run_id!r} is not this server's run", grpc.StatusCode.NOT_FOUND
            )
        lines = self.state.ledger_lines()
        return pb.LedgerReply(lines=lines[request.from_line :], total_lines=len(lines))

    @abort_on_error
    def RoundStatus(
        self, request: pb.RoundStatusRequest, context: grpc.ServicerContext
    ) -> pb.RoundInfo:
        check_bounds(request)  # round, after_round <= 2^63 - 1; wait_seconds finite, >= 0
        who = self._identity(context, request.provider_id)
        number = request.round if request.HasField("round") else None
        if number is None and request.wait_seconds > 0:
            after = request.after_round if request.HasField("after_round") else None
            limit = min(request.wait_seconds, MAX_LONG_POLL_SECONDS)
            remaining = context.time_remaining()
            if remaining is not None:
                limit = min(limit, max(0.0, remaining - 1.0))  # answer before the caller gives up
            self.state.wait_collecting(after, limit, who)
        try:
            return self.state.round_info(number, who)
        except KeyError:
            raise WireError(f"round {number} is unknown", grpc.StatusCode.NOT_FOUND) from None

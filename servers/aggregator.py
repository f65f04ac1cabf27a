"""The provider-facing Aggregator service: Hello, FetchModel, SubmitShare, RoundStatus.

Identity comes from the client certificate (spgc.wire.identity.caller_identity); every refusal is a
WireError or an intake SubmissionRejected, which abort_on_error turns into the documented gRPC
status, and a refused submission never touches the round's sum. Every request's numbers are
range-checked (spgc.wire.bounds) before use: INVALID_ARGUMENT out of bounds. Hello refuses another
protocol version than ours with FAILED_PRECONDITION.

The service runs on an asyncio gRPC server (one event loop, see ServerDaemon): a provider's long
poll is a coroutine waiting for the round to change, not a thread, so a thousand providers cost
a thousand small objects. What may wait on a disk (counting an ldp release, adding a complete
share to the sum) runs on a small thread pool; everything else is quick and runs on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import grpc

from spgc import __version__
from spgc.common.logs import printable
from spgc.servers.audit import host_of
from spgc.servers.intake import SubmissionRejected
from spgc.servers.state import ServerState
from spgc.wire import PROTOCOL_VERSION, aggregation_pb2_grpc
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.bounds import check_bounds
from spgc.wire.chunks import MAX_CHUNK_BYTES
from spgc.wire.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    StreamEndedEarly,
    WireError,
    abort_on_error,
    wrong_run,
)
from spgc.wire.identity import caller_identity, peer_identity
from spgc.wire.messages import (
    aiter_share_payload,
    check_protocol_version,
    inline_model,
    model_messages,
    read_share_header,
    share_element_width,
    share_encoding_name,
)
from spgc.wire.pages import ledger_page
from spgc.wire.transport import DEFAULT_MAX_MESSAGE_BYTES, MalformedRequest

MAX_LONG_POLL_SECONDS = 30.0
BLOCKING_THREADS = 4  # threads for the few steps that may wait on a disk

_T = TypeVar("_T")


#: Why a share stream may end before its last chunk besides the provider closing it: gRPC
#: ends the request stream the same way, unseen by the servicer, when the provider cancels
#: or sends a message above the size limit (the provider then gets CANCELLED or
#: RESOURCE_EXHAUSTED, not this refusal).
ENDED_EARLY = (
    "the provider closed or cancelled the call, or sent a message above the size limit "
    "(gRPC refuses that one with RESOURCE_EXHAUSTED)"
)

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
        self._blocking = ThreadPoolExecutor(BLOCKING_THREADS, thread_name_prefix="spgc-intake")
        # Verified inputs: each accepted share's coin-free verifier work, one share at a time.
        self._proof_prep = ThreadPoolExecutor(1, thread_name_prefix="spgc-proof-prep")
        self._round_changed: asyncio.Event | None = None  # replaced at every change
        self._inlined: tuple[int, bytes] = (-1, b"")  # (model version, its inline bytes)

    def close(self) -> None:
        self._blocking.shutdown(wait=False, cancel_futures=True)
        self._proof_prep.shutdown(wait=False, cancel_futures=True)

    def _prepare_proof(self, provider: str, round_number: int) -> None:
        """The accepted share's wraparound dots, ahead of the round's agreement. Best effort:
        a share whose turn comes after the intake closed, or in a round that moved on, is
        computed (or not) at the agreement, as without this step."""
        state, params = self.state, self.state.plan.norm_proof
        if params is None or state.round != round_number:
            return
        if state.phase != pb.ROUND_PHASE_COLLECTING:
            return  # the agreement computes what is left: no second copy of its work
        try:
            state.proof_dots.prepare(state.intake, params, state.run_id, round_number, provider)
        except Exception as exc:  # any failure only loses the head start
            log.debug("no head start on %s's proof of round %d: %s", provider, round_number, exc)

    async def _off_loop(self, fn: Callable[..., _T], *args: Any) -> _T:
        return await asyncio.get_running_loop().run_in_executor(self._blocking, fn, *args)

    def _round_event(self) -> asyncio.Event:
        """The event set at the next change of the round (on the server's loop)."""
        if self._round_changed is None:
            loop = asyncio.get_running_loop()
            self._round_changed = asyncio.Event()

            def on_change() -> None:  # any thread, holding the state's lock: schedule only
                # RuntimeError: the loop is closed (the server stopped).
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._signal_round_change)

            self.state.add_round_listener(on_change)
        return self._round_changed

    def _signal_round_change(self) -> None:
        changed, self._round_changed = self._round_changed, asyncio.Event()
        if changed is not None:
            changed.set()

    async def _long_poll(self, after: int | None, limit: float, who: str) -> None:
        """Until :meth:`ServerState.long_poll_over` or ``limit`` seconds."""
        loop = asyncio.get_running_loop()
        end = loop.time() + limit
        while True:
            changed = self._round_event()  # taken before the check: no change is missed
            if self.state.long_poll_over(after, who):
                return
            left = end - loop.time()
            if left <= 0:
                return
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                return

    def _identity(self, context: Any, claimed: str = "") -> str:
        who = self._authenticate(context, claimed)
        self._require_ready()
        return who

    def _authenticate(self, context: Any, claimed: str) -> str:
        certified = peer_identity(context)
        if claimed and certified is not None and claimed != certified:
            self._claim_refused(context, certified, claimed)  # caller_identity refuses it next
        who = caller_identity(context, claimed, insecure=self.insecure, allowed=self.allowed)
        self.state.note_caller(who)
        return who

    def _claim_refused(self, context: Any, certified: str, claimed: str) -> None:
        """A caller whose request names another provider than its certificate (a provider
        configured as one, holding another's certificate): audited and logged, then refused."""
        address = str(context.peer())
        if self.state.audit.record(
            "identity_refused",
            repeat_key=f"{certified} {claimed}",
            identity=certified,
            claimed=printable(claimed),
            peer=address,
            reason="the request's provider_id is not its certificate's name",
        ):
            log.warning(
                "refused a call from %s (certificate %s) claiming to be %r",
                printable(address),
                printable(certified),
                printable(claimed),
            )

    def _require_ready(self) -> None:
        if not self.state.ready:  # no run id / agreed configuration before the Handshake
            raise WireError(
                "the servers have not completed their handshake yet", grpc.StatusCode.UNAVAILABLE
            )

    @abort_on_error
    async def Hello(self, request: pb.HelloRequest, context: Any) -> pb.ServerInfo:
        check_bounds(request)
        who = self._authenticate(context, request.provider_id)
        # Before the readiness check: another version will never work, so say so at once.
        check_protocol_version(request.protocol_version, PROTOCOL_VERSION, "client")
        self._require_ready()
        self.state.note_hello(who)
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
    async def FetchModel(
        self, request: pb.ModelRequest, context: Any
    ) -> AsyncIterator[pb.ModelChunk]:
        check_bounds(request)
        self._identity(context, request.provider_id)
        want = request.version if request.HasField("version") else None
        try:
            version, params, sha = self.state.model(want)
        except KeyError:
            raise FailedPreconditionError(f"model version {want} is not served") from None
        plan = self.state.plan
        if request.part == pb.MODEL_PART_FROZEN:
            if not plan.coordinates.anything_frozen:
                raise WireError("the model has no frozen parameters", grpc.StatusCode.NOT_FOUND)
            params, sha = plan.frozen_vector(), plan.coordinates.frozen_sha256(plan.initial_params)
        else:
            params = plan.model_vector(params)
        chunk = request.chunk_bytes or MAX_CHUNK_BYTES
        chunk = max(8, min(chunk, MAX_CHUNK_BYTES) // 8 * 8)
        for message in model_messages(
            params,
            run_id=self.state.run_id,
            version=version,
            model=self.state.plan.model_name,
            chunk_bytes=chunk,
            sha256=sha,
            part=request.part,
        ):
            yield message

    @abort_on_error
    async def SubmitShare(
        self, request_iterator: AsyncIterator[pb.ShareChunk], context: Any
    ) -> pb.SubmitReceipt:
        seen: dict[str, object] = {}
        try:
            return await self._submit_share(request_iterator, context, seen)
        except MalformedRequest:
            raise  # audited and logged where it was parsed (add_servicer's on_refused)
        except (WireError, SubmissionRejected) as exc:
            # Every refused share leaves a trail (who, which round, why): the audit log, and
            # a log line (repeats of one kind by one caller, for one round near the current
            # one or for any far one: once per 10 s, counted).
            code = exc.code.name if isinstance(exc, WireError) else exc.code
            who = seen.get("who") or peer_identity(context) or context.peer()
            reason = str(exc)
            if isinstance(exc, StreamEndedEarly):
                reason = f"{reason}: {ENDED_EARLY}"
            if self.state.audit.record(
                "share_refused",
                repeat_key=f"{host_of(str(who))} {code} {self._round_bucket(seen.get('round'))}",
                identity=who,
                round=seen.get("round"),
                code=code,
                reason=reason,
            ):
                # A retry's "already" or a superseded upload is the protocol working.
                benign = code in ("ALREADY_EXISTS", "ABORTED")
                log.log(
                    logging.INFO if benign else logging.WARNING,
                    "refused a share from %s for round %s: %s: %s",
                    printable(str(who)),
                    seen.get("round", "?"),
                    code,
                    reason,
                )
            raise

    async def _submit_share(
        self,
        request_iterator: AsyncIterator[pb.ShareChunk],
        context: Any,
        seen: dict[str, object],
    ) -> pb.SubmitReceipt:
        plan = self.state.plan
        first = await anext(request_iterator, None)
        if first is not None and first.WhichOneof("kind") == "header":
            seen["round"] = first.header.round  # for the audit, should the header be refused
        field = None if plan.norm_proof is None else plan.norm_proof.p
        if field is not None and first is not None and first.WhichOneof("kind") == "header":
            sent = first.header
            if sent.encoding != pb.SHARE_ENCODING_FIELD and not sent.norm_seed:
                raise InvalidArgumentError(
                    "this run verifies inputs (TrainingConfig.verify_inputs l2): send field "
                    "shares with a norm proof (SHARE_ENCODING_FIELD to H1, a norm_seed to H2; "
                    "docs/CLIENTS.md, section 4.4), not ring shares"
                )
        header = read_share_header(
            iter(() if first is None else (first,)),
            num_elements=self.state.intake.length,
            ring_bits=plan.ring_bits,
            field_modulus=field,
        )
        seen["round"] = header.round
        who = self._identity(context, header.provider_id)
        seen["who"] = who
        self._check_run(header.run_id)
        if header.HasField("model_version"):
            want = self.state.collecting_model_version(header.round)
            if want is not None and header.model_version != want:
                raise FailedPreconditionError(
                    f"share computed on model v{header.model_version}; round {header.round} "
                    f"trains model v{want}"
                )
        if header.server_role != self.state.role:
            # G = s1 - s2 mod 2^L: s1 is H1's, s2 H2's; a swapped share would negate the sum.
            raise InvalidArgumentError(
                f"share meant for {_role_name(header.server_role)}, this server is "
                f"{_role_name(self.state.role)}"
            )
        # The intake checks round, duplicates, replays and identity before reading the payload.
        submission = self.state.intake.begin(
            who,
            header.round,
            header.submission_id,
            header.num_elements,
            header.ring_bits,
            header.vector_id,
            (header.norm_blind, header.norm_joint_part, header.norm_seed),
        )
        try:
            if self.state.counts_on_receipt:
                await self._off_loop(self.state.note_receiving, header.round)
            async for data in aiter_share_payload(request_iterator, header, field_modulus=field):
                submission.write(data)
            await self._off_loop(submission.commit)
        finally:
            submission.discard()
        if plan.norm_proof is not None:  # off the round's agreement: see PreparedDots
            self._proof_prep.submit(self._prepare_proof, who, header.round)
        self.state.note_accepted(  # compute_seconds: reserved, ignored
            header.round,
            who,
            share_encoding_name(header),
            header.num_elements * share_element_width(header, field) + len(header.norm_seed),
        )
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

    def _round_bucket(self, number: object) -> str:
        """The round a refusal names, for its repeat key: itself near the current round, else
        one bucket. The caller picks the number: a new key per call would defeat the limit
        and let a registered provider fill the disk with refusal lines."""
        if isinstance(number, int) and abs(number - self.state.round) <= 1:
            return str(number)
        return "far"

    def _check_run(self, run_id: str) -> None:
        if run_id != self.state.run_id:  # the contract's "wrong run"
            raise wrong_run(run_id)

    @abort_on_error
    async def DeclinePlan(self, request: pb.DeclineRequest, context: Any) -> pb.DeclineReply:
        check_bounds(request)
        who = self._identity(context, request.provider_id)
        reason = printable(" ".join(request.reason.split())) or "(no reason given)"
        self._check_run(request.run_id)
        self.state.note_declined(who, reason)
        if self.state.audit.record(
            "plan_declined", repeat_key=who, identity=who, run_id=request.run_id, reason=reason
        ):
            log.warning("provider %s declined the plan of run %s: %s", who, request.run_id, reason)
        return pb.DeclineReply()

    @abort_on_error
    async def FetchLedger(self, request: pb.LedgerRequest, context: Any) -> pb.LedgerReply:
        check_bounds(request)  # from_line: at most 2^63 - 1; past the end: no lines
        self._identity(context, request.provider_id)
        self._check_run(request.run_id)
        lines = self.state.ledger_lines()
        # A page of lines: the caller asks again from the next one (a whole ledger of
        # thousands of rounds would not fit one message).
        page = ledger_page(lines, request.from_line)
        return pb.LedgerReply(lines=page, total_lines=len(lines))

    @abort_on_error
    async def RoundStatus(self, request: pb.RoundStatusRequest, context: Any) -> pb.RoundInfo:
        check_bounds(request)  # round, after_round <= 2^63 - 1; wait_seconds finite, >= 0
        who = self._identity(context, request.provider_id)
        number = request.round if request.HasField("round") else None
        if number is None and request.wait_seconds > 0:
            after = request.after_round if request.HasField("after_round") else None
            limit = min(request.wait_seconds, MAX_LONG_POLL_SECONDS)
            remaining = context.time_remaining()
            if remaining is not None:
                limit = min(limit, max(0.0, remaining - 1.0))  # answer before the caller gives up
            await self._long_poll(after, limit, who)
        try:
            info = self.state.round_info(number, who)
        except KeyError:
            raise WireError(f"round {number} is unknown", grpc.StatusCode.NOT_FOUND) from None
        if request.include_model and info.phase == pb.ROUND_PHASE_COLLECTING:
            info.model_parameters = self._inline_model(info.model_version)
        return info

    def _inline_model(self, version: int) -> bytes:
        """RoundInfo.model_parameters of a version (empty for a model too large to inline);
        the last one is kept: every provider asks for the same."""
        if self._inlined[0] != version:
            _, params, _ = self.state.model(version)
            self._inlined = (version, inline_model(self.state.plan.model_vector(params)) or b"")
        return self._inlined[1]

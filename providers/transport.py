"""The provider's link to the servers: channels, Hello, retries with backoff, RoundStatus,
model downloads and share submission (one of :class:`~spgc.providers.client.ProviderClient`'s
parts; see that module for a round's steps).

Every call to a server that may fail goes through :meth:`Transport._call_with_retry` (jittered
exponential backoff; a server still starting up is waited for until ``connect_timeout``).
:meth:`Transport._submit` delivers one share vector to one server and never another vector for
the same round: a retry resends the same vector under a new submission id, and only after
RoundStatus said the share was not accepted.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np
from grpc.experimental import ChannelOptions

from spgc import __version__
from spgc.learning.models import flatten_params, load_flat_params
from spgc.providers.errors import ProviderRefusal, RoundFailed
from spgc.providers.plan_checks import in_bounds
from spgc.providers.training import OutgoingShare
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import PROTOCOL_VERSION, aggregation_pb2, aggregation_pb2_grpc, vector_sha256
from spgc.wire.errors import ANOTHER_VECTOR, WireError, is_size_refusal
from spgc.wire.identity import new_submission_id
from spgc.wire.messages import (
    read_inline_model,
    read_model_stream,
    share_encoding_for,
    share_messages,
    share_payload,
)
from spgc.wire.transport import make_channel

__all__ = ["RETRYABLE", "SubmitResult", "Transport"]

log = logging.getLogger("spgc.provider")

pb = aggregation_pb2

#: Seconds for the one RoundStatus that tells a server we saw training end elsewhere.
FINISHED_CALL_TIMEOUT = 2.0

#: Codes after which the same submission may be tried again (after checking RoundStatus):
#: the server is down or restarting, or it is shedding load (RESOURCE_EXHAUSTED: this
#: identity's calls in flight or call rate are at their limit), or it cut a call that stalled
#: or that it was stopping under (CANCELLED); nothing was admitted.
RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
    }
)

# Seconds at most between two calls to a server that is not up (starting, or restarting while
# we wait for a round); jittered like every backoff here.
STARTUP_RETRY_MAX = 2.0
#: A round a server still collects although, by our clock, its deadline passed longer ago than
#: this: our clock is ahead of the servers' (their intake closes at their own deadline).
CLOCK_AHEAD_SECONDS = 5.0
_JITTER = secrets.SystemRandom()  # backoff jitter (the OS generator: nothing to seed)


@dataclass
class _Server:
    """One server as the client sees it."""

    role: int
    name: str
    address: str
    channel: grpc.Channel
    stub: Any
    info: Any = None  # ServerInfo from Hello


@dataclass
class SubmitResult:
    """How one server took this provider's share for a round."""

    server: str
    accepted: bool
    attempts: int
    submission_id: bytes
    how: str  # "receipt", "status" (receipt lost, RoundStatus says accepted), "duplicate"
    bytes_sent: int = 0  # the share's payload in one attempt (ShareHeader.encoding's bytes)


class Transport:
    """The calls a provider makes to its servers (a part of ProviderClient: the attributes
    below are set by ``ProviderClient.__init__`` and ``connect``)."""

    cfg: ProviderConfig
    servers: list[_Server]
    training: Any
    last_round: int | None
    _sleep: Callable[[float], None]
    _clock: Callable[[], float]
    _senders: concurrent.futures.ThreadPoolExecutor | None
    _model_source: int
    _model: Any
    _trained: Any
    _round_infos: list[Any]

    def close(self) -> None:
        """Close the channels (and the senders' threads)."""
        if self._senders is not None:
            self._senders.shutdown(wait=True)
            self._senders = None
        for s in self.servers:
            s.channel.close()
        self.servers = []

    def _open(self, role: int, name: str, address: str) -> _Server:
        channel = make_channel(
            address,
            self.cfg.tls,
            insecure=self.cfg.insecure,
            server_name=name,
            # FetchModel's stream is read in the calling thread: no helper thread per download.
            options=[(ChannelOptions.SingleThreadedUnaryStream, 1)],
        )
        return _Server(role, name, address, channel, aggregation_pb2_grpc.AggregatorStub(channel))

    def _decline(self, run_id: str, reason: str) -> None:
        """Tell the servers why this provider does not take part (best effort: the refusal
        stands whether or not they hear it)."""
        request = pb.DeclineRequest(run_id=run_id, reason=reason, provider_id=self.cfg.name)
        for server in self.servers:
            try:
                server.stub.DeclinePlan(request, timeout=min(10.0, self.cfg.rpc_timeout))
            except grpc.RpcError as exc:
                log.debug("%s: DeclinePlan: %s", server.name, exc)

    def _hello(self, server: _Server) -> Any:
        request = pb.HelloRequest(
            protocol_version=PROTOCOL_VERSION,
            software_version=f"spgc {__version__}",
            provider_id=self.cfg.name,
        )
        info = self._call_with_retry(
            lambda: server.stub.Hello(request, timeout=self.cfg.rpc_timeout),
            f"Hello to {server.name} at {server.address}",
            deadline=self._clock() + self.cfg.connect_timeout,
            waiting=f"{server.name} at {server.address}",
        )
        if info.protocol_version != PROTOCOL_VERSION:
            raise ProviderRefusal(
                f"{server.name} speaks protocol version {info.protocol_version}, this provider "
                f"{PROTOCOL_VERSION}"
            )
        # The config is checked in connect() (check_wire_contract), where a refusal is declined.
        in_bounds(info.round, "ServerInfo.round", server.name)
        in_bounds(info.limits, "ServerInfo.limits", server.name)
        if info.server_name and info.server_name != server.name:
            raise ProviderRefusal(
                f"the server at {server.address} calls itself {info.server_name!r}, expected "
                f"{server.name!r}"
            )
        if info.provider_id and info.provider_id != self.cfg.name:
            raise ProviderRefusal(
                f"{server.name} knows this provider as {info.provider_id!r}, but name is "
                f"{self.cfg.name!r} (check the certificate)"
            )
        server.info = info
        return info

    def _backoffs(self) -> Iterator[float]:
        """Exponential backoff with jitter: each wait is drawn in [delay/2, delay], so that
        providers cut off together (a server restart) do not come back in lockstep."""
        delay = self.cfg.backoff_initial
        while True:
            yield delay * (0.5 + 0.5 * _JITTER.random())
            delay = min(delay * 2, self.cfg.backoff_max)

    def _call_with_retry(
        self,
        call: Callable[[], Any],
        what: str,
        error: type[Exception] = ProviderRefusal,
        deadline: float | None = None,
        waiting: str | None = None,
    ) -> Any:
        """``call()``, retried with backoff on UNAVAILABLE/DEADLINE_EXCEEDED; other gRPC errors
        and exhausted retries raise ``error``. With a ``deadline`` (by ``self._clock``) the call
        is retried until then instead of ``retries`` times (a server that is still starting up);
        ``waiting`` ("h1 at ADDRESS") then names whom it waits for, in a line said once and
        repeated at the configured backoff (:class:`_WaitingNote`), not a warning per attempt."""
        delays = self._backoffs()
        attempt = 0
        note = _WaitingNote(self, waiting, deadline) if waiting and deadline is not None else None
        while True:
            attempt += 1
            try:
                return call()
            except grpc.RpcError as exc:
                code = exc.code()
                refused = _server_certificate_refused(exc.details() or "")
                if code == grpc.StatusCode.UNAVAILABLE and refused:
                    # Our check of the server's certificate failed: retrying cannot help.
                    raise ConnectionError(f"{what}: {refused} ({exc.details()})") from None
                exhausted = (
                    attempt >= self.cfg.retries if deadline is None else self._clock() >= deadline
                )
                if code in RETRYABLE and exhausted and error is ProviderRefusal:
                    # Not a refusal of the plan: the server could not be reached (exit 1).
                    raise ConnectionError(
                        f"{what} failed after {attempt} attempts: {code.name}: {exc.details()}"
                    ) from None
                if code not in RETRYABLE or exhausted:
                    raise error(
                        f"{what} failed: {code.name}: {exc.details()}"
                        if code not in RETRYABLE
                        else f"{what} failed after {attempt} attempts: {code.name}: {exc.details()}"
                    ) from None
                delay = next(delays)
                if deadline is not None:  # a server starting up: ask again soon
                    delay = min(delay, STARTUP_RETRY_MAX)
                if note is not None:
                    note.failed(code.name, delay)
                else:
                    log.warning("%s: %s, retrying in %.1fs", what, code.name, delay)
                self._sleep(delay)

    def _status(
        self,
        server: _Server,
        round_number: int | None = None,
        wait: float = 0.0,
        include_model: bool = False,
    ) -> Any | None:
        """RoundStatus at one server; None on a transient error. ``wait`` > 0: long poll until
        the server collects a round after the last one we took part in (or ``wait`` s).
        ``include_model``: ask for a small model inline (RoundInfo.model_parameters)."""
        if round_number is not None:
            req = pb.RoundStatusRequest(round=round_number, provider_id=self.cfg.name)
        else:
            req = pb.RoundStatusRequest(
                wait_seconds=wait, provider_id=self.cfg.name, include_model=include_model
            )
            if wait > 0 and self.last_round is not None:
                req.after_round = self.last_round
        try:
            info = server.stub.RoundStatus(req, timeout=self.cfg.rpc_timeout)
        except grpc.RpcError as exc:
            # CANCELLED: the server stopped while holding our long poll (a restart, or the
            # end of training); asking again tells which.
            if exc.code() in RETRYABLE:
                log.warning("RoundStatus at %s: %s", server.name, exc.code().name)
                return None
            raise
        in_bounds(info, "RoundInfo", server.name)
        return info

    def _check_ledger_heads(self, infos: list[Any]) -> None:
        """The co-signed ledger head each server names for its latest model: after the same
        number of releases, the same head, or a server's ledger is not the one both signed.
        (Different counts are a moment between two servers' publications, or a restart.)"""
        heads = {(i.ledger_head_releases, bytes(i.ledger_head)) for i in infos if i.ledger_head}
        if len(heads) > 1 and len({n for n, _ in heads}) == 1:
            detail = ", ".join(
                f"{s.name}: {bytes(i.ledger_head).hex()[:16]}"
                for s, i in zip(self.servers, infos, strict=False)
            )
            raise ProviderRefusal(
                f"the servers name different co-signed ledger heads after {next(iter(heads))[0]} "
                f"release(s) ({detail}): their ledgers are not one record of the run"
            )

    def fetch_model(self, info: Any) -> np.ndarray:
        """Model version ``info.model_version``, downloaded from one server and checked against
        the hash EVERY server announced for the round (their RoundInfo): differing hashes are
        refused. One download, not one per server: each server's word on the model is its
        hash. Which server serves it is fixed per provider (spreads the load)."""
        tc = self.training
        announced = [
            (s.name, bytes(i.model_sha256))
            for s, i in zip(self.servers, self._round_infos or [info], strict=False)
        ]
        if len({h for _, h in announced}) != 1:
            detail = ", ".join(f"{n}: {h.hex()[:16]}" for n, h in announced)
            raise ProviderRefusal(
                f"the servers serve different models for version {info.model_version} ({detail})"
            )
        self._check_ledger_heads(self._round_infos or [info])
        s = self.servers[self._model_source]
        want = announced[0][1]
        source_info = self._round_infos[self._model_source] if self._round_infos else info
        inline = bytes(source_info.model_parameters)
        if inline:  # a small model came with the round's RoundInfo: no FetchModel call
            try:
                return read_inline_model(inline, tc.num_parameters, want)
            except WireError as exc:
                raise ProviderRefusal(f"{s.name} sent a malformed model: {exc}") from None
        request = pb.ModelRequest(
            version=info.model_version, chunk_bytes=self.cfg.chunk_bytes, provider_id=self.cfg.name
        )

        def fetch() -> tuple[Any, np.ndarray]:
            return read_model_stream(
                s.stub.FetchModel(request, timeout=self.cfg.rpc_timeout),
                version=info.model_version,
                num_parameters=tc.num_parameters,
            )

        try:
            header, params = self._call_with_retry(
                fetch, f"FetchModel v{info.model_version} from {s.name}", RoundFailed
            )
        except WireError as exc:
            raise ProviderRefusal(f"{s.name} sent a malformed model: {exc}") from None
        if header.run_id and header.run_id != tc.run_id:
            raise ProviderRefusal(f"{s.name} sent a model of run {header.run_id!r}")
        digest = bytes(header.sha256)  # read_model_stream checked the values against it
        if want and digest != want:
            raise ProviderRefusal(
                f"the servers serve different models for version {info.model_version}: "
                f"{s.name} sent {digest.hex()[:16]}, the round announces {want.hex()[:16]}"
            )
        return params

    def _fetch_frozen(self, tc: Any) -> np.ndarray:
        """The model's frozen coordinates, once per run (FetchModel, MODEL_PART_FROZEN), checked
        against the frozen_sha256 both servers announced; loaded into the local model."""
        s = self.servers[self._model_source]
        request = pb.ModelRequest(
            part=pb.MODEL_PART_FROZEN, chunk_bytes=self.cfg.chunk_bytes, provider_id=self.cfg.name
        )

        def fetch() -> tuple[Any, np.ndarray]:
            return read_model_stream(
                s.stub.FetchModel(request, timeout=self.cfg.rpc_timeout),
                num_parameters=self._trained.frozen_count,
            )

        try:
            header, frozen = self._call_with_retry(
                fetch, f"FetchModel (frozen part) from {s.name}", ProviderRefusal
            )
        except WireError as exc:
            raise ProviderRefusal(f"{s.name} sent a malformed frozen part: {exc}") from None
        if bytes(header.sha256) != bytes(tc.frozen_sha256):
            raise ProviderRefusal(
                f"{s.name} sent frozen parameters whose SHA-256 {bytes(header.sha256).hex()[:16]}"
                f" is not the announced {bytes(tc.frozen_sha256).hex()[:16]}"
            )
        trained = self._trained.trainable_part(flatten_params(self._model))
        load_flat_params(self._model, self._trained.assemble(trained, frozen))
        return frozen

    def _submit(
        self, server: _Server, out: OutgoingShare, info: Any, vector_id: bytes
    ) -> SubmitResult:
        """Deliver ``out`` for round ``info.round`` to one server; never another vector.
        ``vector_id``: the same for both halves of one vector (ShareHeader.vector_id)."""
        tc, t = self.training, info.round
        vec, field = out.values, out.field_modulus
        # Field shares with verified inputs, else packed where the server accepts it.
        encoding = pb.SHARE_ENCODING_FIELD if field is not None else share_encoding_for(tc)
        payload = share_payload(vec, tc.ring_bits, encoding, field)[0]
        digest, payload_bytes = vector_sha256(payload), payload.nbytes
        delays = self._backoffs()
        sid = b""
        for attempt in range(1, self.cfg.retries + 1):
            sid = new_submission_id()
            messages = share_messages(
                vec,
                run_id=tc.run_id,
                round_number=t,
                server_role=server.role,
                ring_bits=tc.ring_bits,
                submission_id=sid,
                provider_id=self.cfg.name,
                chunk_bytes=self._chunk_bytes(server),
                vector_id=vector_id,
                model_version=info.model_version,
                encoding=encoding,
                sha256=digest,  # hashed once for every attempt and the receipt's check
                field_modulus=field,
                norm_blind=out.norm_blind,
                norm_joint_part=out.norm_joint_part,
                norm_seed=out.norm_seed,
            )
            try:
                receipt = server.stub.SubmitShare(messages, timeout=self.cfg.rpc_timeout)
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.ALREADY_EXISTS:
                    # Fresh ids are never reused: a share of ours for round t is already in
                    # (of another vector if we restarted mid-round: the round then leaves us
                    # out, as the servers' details say).
                    other = ANOTHER_VECTOR in (exc.details() or "")
                    log.log(
                        logging.WARNING if other else logging.INFO,
                        "%s: round %d share already accepted (%s)",
                        server.name,
                        t,
                        exc.details(),
                    )
                    return SubmitResult(server.name, True, attempt, sid, "duplicate", payload_bytes)
                if code not in RETRYABLE or is_size_refusal(exc):
                    raise RoundFailed(
                        f"{server.name} refused the share for round {t}: {code.name}: "
                        f"{exc.details()}"
                    ) from None
                log.warning(
                    "%s: SubmitShare round %d attempt %d: %s", server.name, t, attempt, code.name
                )
                if attempt == self.cfg.retries:
                    break
                self._sleep(next(delays))
                try:
                    status = self._status(server, t)
                except grpc.RpcError as status_exc:  # e.g. NOT_FOUND: the round is not known
                    raise RoundFailed(
                        f"{server.name}: RoundStatus for round {t}: {status_exc.code().name}: "
                        f"{status_exc.details()}"
                    ) from None
                if status is not None and status.caller_share_accepted:
                    log.info("%s: round %d share was accepted (receipt lost)", server.name, t)
                    return SubmitResult(server.name, True, attempt, sid, "status", payload_bytes)
                if status is not None and status.phase != pb.ROUND_PHASE_COLLECTING:
                    raise RoundFailed(
                        f"{server.name}: round {t} closed ({pb.RoundPhase.Name(status.phase)}) "
                        "before the share got through"
                    ) from None
                if _deadline_passed(info):
                    raise RoundFailed(f"{server.name}: round {t} deadline passed") from None
                continue
            if receipt.round != t or bytes(receipt.submission_id) != sid:
                raise RoundFailed(f"{server.name} sent a receipt for another submission")
            if bytes(receipt.sha256) != digest:
                raise RoundFailed(f"{server.name} received a share with another SHA-256")
            return SubmitResult(server.name, True, attempt, sid, "receipt", payload_bytes)
        raise RoundFailed(
            f"{server.name}: share for round {t} not delivered after {self.cfg.retries} attempts"
        )

    def _chunk_bytes(self, server: _Server) -> int:
        limits = server.info.limits if server.info is not None else None
        want = self.cfg.chunk_bytes or (limits.preferred_chunk_bytes if limits else 0)
        if limits and limits.max_chunk_bytes:
            want = min(want or limits.max_chunk_bytes, limits.max_chunk_bytes)
        want = want or (1 << 20)
        return max(8, want - want % 8)


class _WaitingNote:
    """What a provider says while a server it calls is not up yet (it starts after the
    provider, or restarts): "waiting for h1 at ADDRESS (up to N s)" once, then a reminder at
    the configured backoff (``backoff_initial``, doubling up to ``backoff_max``, on the
    client's clock), each attempt in between at debug level only."""

    def __init__(self, client: Transport, who: str, deadline: float) -> None:
        self.client, self.who = client, who
        self.start = client._clock()
        self.limit = max(0.0, deadline - self.start)
        self.gap = client.cfg.backoff_initial
        self.next_at: float | None = None

    def failed(self, code: str, delay: float) -> None:
        """One attempt failed with ``code``; the next comes in ``delay`` seconds."""
        now = self.client._clock()
        if self.next_at is None:
            log.info("waiting for %s (up to %s s)", self.who, _seconds(self.limit))
        elif now >= self.next_at:
            log.info(
                "%s: still %s after %s s (waiting up to %s s)",
                self.who,
                code,
                _seconds(now - self.start),
                _seconds(self.limit),
            )
            self.gap = min(self.gap * 2, self.client.cfg.backoff_max)
        else:
            log.debug("%s: %s, retrying in %.1fs", self.who, code, delay)
            return
        self.next_at = now + self.gap


def _seconds(value: float) -> str:
    """Seconds as people write them: 300, 2.5."""
    return f"{round(value, 1):g}"


def _server_certificate_refused(details: str) -> str:
    """Why this client refused the server's TLS certificate, from gRPC's error text ("" when it
    did not): a wrong name or another CA is a configuration error, not an outage."""
    if "Hostname Verification Check failed" in details:
        return (
            "the server's certificate does not carry the name this provider expects (h1_name "
            "/ h2_name), or the address is another server's"
        )
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return "the server's certificate is not signed by this provider's tls_ca"
    return ""


def _seconds_past_deadline(info: Any) -> float:
    """How long ago, by this machine's clock, the round's announced deadline passed (negative:
    still ahead; -inf: none announced)."""
    if not info.HasField("deadline") or info.deadline.seconds == 0:
        return -math.inf
    return time.time() - (info.deadline.seconds + info.deadline.nanos * 1e-9)


def _deadline_passed(info: Any) -> bool:
    """The round's deadline passed by this machine's clock, by at most CLOCK_AHEAD_SECONDS.
    Further past, while a server still collects, means our clock is ahead of the servers'; the
    server's own deadline is what counts then (it refuses a late share itself)."""
    return 0 < _seconds_past_deadline(info) <= CLOCK_AHEAD_SECONDS

"""The Peer (server-to-server control) service. H1 calls it on H2; H2's handlers carry out the
follower's side of each round step (servers.coordinator documents the sequence).

Only the other server's certificate name is accepted (PERMISSION_DENIED otherwise): providers
hold certificates of the same CA, so mutual TLS alone does not make a caller a server.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import grpc

import garbled_core
from spgc import __version__
from spgc.common.logs import printable
from spgc.privacy.ledger_format import LedgerError
from spgc.protocol.modes import DEFAULT_SECURITY
from spgc.servers.checkpoint import CheckpointError
from spgc.servers.coordinator import (
    agreement_with_proofs,
    checked_seed_commitment,
    compute_round,
    end_run_for_want_of_providers,
    log_round,
    own_verifier_messages,
    seed_commitment_message,
)
from spgc.servers.deviation import peer_aborted, peer_notice
from spgc.servers.errors import PeerDeviatedError, PeerMismatchError
from spgc.servers.ledger_state import release_counts_problem
from spgc.servers.noise_pool import (
    BLOCK_ID_BYTES,
    MAX_BLOCK_SAMPLES,
    PoolError,
)
from spgc.servers.norm_checks import round_coin
from spgc.servers.pool_sync import (
    BlockSeed,
    adopt_peer_pool,
    pool_state_message,
    produce_pool_run,
    slice_from_message,
)
from spgc.servers.state import RPC_SLACK, ServerState
from spgc.wire import (
    PEER_PROTOCOL_VERSION,
    peer_pb2,
    peer_pb2_grpc,
    provider_set_digest,
    seed_commitment,
)
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    NotPairedError,
    PermissionDeniedError,
    UnauthenticatedError,
    WireError,
    abort_on_error,
)
from spgc.wire.identity import peer_identity
from spgc.wire.pages import agreement_pages, join_provider_set
from spgc.wire.transport import split_host_port

log = logging.getLogger(__name__)

MAX_STATEMENT_BYTES = 4096  # a release statement is a few hundred bytes of JSON
MAX_ADDRESS_BYTES = 300  # "host:port": a DNS name is at most 253 bytes


def parse_worker_addresses(addresses: Any, workers: int) -> list[tuple[str, int]]:
    """PairWorkers' ``addresses`` as (host, port) pairs, exactly ``workers`` of them, each
    "host:port" or "[v6 host]:port" with a port in 1..65535; InvalidArgumentError otherwise."""
    if len(addresses) != workers:
        raise InvalidArgumentError(
            f"WorkerPairing names {len(addresses)} worker address(es) for {workers} workers"
        )
    out = []
    for i, address in enumerate(addresses):
        try:
            host, port = split_host_port(address)
        except ValueError:
            host, port = "", 0
        if len(address.encode()) > MAX_ADDRESS_BYTES or port == 0:  # port 0 only to listen
            raise InvalidArgumentError(
                f"WorkerPairing.addresses[{i}]={address[:64]!r} is not host:port (port 1..65535, "
                f"at most {MAX_ADDRESS_BYTES} bytes)"
            )
        out.append((host, port))
    return out


#: Seconds a round or noise-block call waits for this server's side of the data link.
LINK_WAIT = 15.0

# TrainingConfig fields named otherwise in the servers' configuration (docs/CONFIG.md).
_CONFIG_KEYS = {
    "max_rounds": "rounds",
    "step_delta": "target_delta",
    "num_parameters": "model (parameters)",
    "model_fingerprint": "model (architecture)",
    "l2_bound_units": "scale/clip_norm (sensitivity)",
    "noise_std_units": "noise (derived from the privacy keys)",
    "learning_rate": "lr",
    "model_parameters": "model (parameters, frozen included)",
    "trainable": "model (which parameters are frozen)",
    "frozen_sha256": "model / initial_model (the frozen parameters' values)",
}
# String fields whose empty value names a default (how a plan without the field reads).
_EMPTY_MEANS = {"security": DEFAULT_SECURITY}


def config_differences(
    a: pb.TrainingConfig, b: pb.TrainingConfig, names: tuple[str, str] = ("h1", "h2")
) -> list[str]:
    """The plan keys whose values differ, each with both servers' values (``names``: whose
    ``a`` and ``b`` are), e.g. ``rounds (h1 3, h2 5)``."""
    out = []
    for field in pb.TrainingConfig.DESCRIPTOR.fields:
        va, vb = getattr(a, field.name), getattr(b, field.name)
        if va != vb:
            key = _CONFIG_KEYS.get(field.name, field.name)
            if field.is_repeated:
                out.append(_list_difference(key, list(va), list(vb), names))
            else:
                va, vb = (v or _EMPTY_MEANS.get(field.name, v) for v in (va, vb))
                out.append(f"{key} ({names[0]} {va!r}, {names[1]} {vb!r})")
    return out


_SHOWN_ITEMS = 3  # a list key's items shown around its first difference (a sparse mask may
# have 100,000 ranges: the message names where the lists part, not all of them)


def _list_difference(key: str, va: list, vb: list, names: tuple[str, str]) -> str:
    """``key``'s two lists, in full when short, else their lengths and a few items from the
    first index at which they differ."""
    if len(va) + len(vb) <= 2 * _SHOWN_ITEMS:
        return f"{key} ({names[0]} {_items(va)}, {names[1]} {_items(vb)})"
    first = next(
        (i for i, (x, y) in enumerate(zip(va, vb, strict=False)) if x != y), min(len(va), len(vb))
    )
    end = first + _SHOWN_ITEMS
    return (
        f"{key} ({names[0]} {len(va)} items, {names[1]} {len(vb)}; they first differ at item "
        f"{first}: {names[0]} {_items(va[first:end])}, {names[1]} {_items(vb[first:end])})"
    )


def _items(values: list) -> str:
    return "[" + ", ".join(_item(v) for v in values) + "]"


def _item(value: object) -> str:
    """A list item: a message as all its fields, zeros included (``start 0, length 3``)."""
    descriptor = getattr(value, "DESCRIPTOR", None)
    if descriptor is None:
        return repr(value)
    return "(" + ", ".join(f"{f.name} {getattr(value, f.name)!r}" for f in descriptor.fields) + ")"


class PeerServicer(peer_pb2_grpc.PeerServicer):
    """H2's follower side (on H1 only the Handshake answers: H1 drives and is never driven)."""

    def __init__(
        self,
        state: ServerState,
        peer_name: str,
        insecure: bool,
        get_link: Callable[[float], Any],
        on_handshake: Callable[[str], None],
        align: Callable[[pb.RoundInfo], None],
        on_repair: Callable[[str], None] | None = None,
        on_paired: Callable[[], None] | None = None,
        link_workers: Callable[[list[tuple[str, int]], int, float], int] | None = None,
        on_link_probe: Callable[[peer_pb2.PeerHello], peer_pb2.PeerHello] | None = None,
        check_backend: Callable[[peer_pb2.PeerHello], None] | None = None,
    ) -> None:
        self.state = state
        self.peer_name = peer_name
        self.insecure = insecure
        self.get_link = get_link  # waits (timeout s) for the GC link; raises if not up
        self.on_handshake = on_handshake  # sets run id and config from the agreed run id
        self.align = align  # steps back a checkpoint when this server is one round ahead
        # A Handshake while paired: the other server restarted; the daemon drops the link and
        # the round in progress and goes back to its last checkpoint before answering.
        self.on_repair = on_repair
        self.on_paired = on_paired  # after each successful Handshake (the daemon's bookkeeping)
        # workers > 1: (H1's worker addresses, H1's worker count, timeout s) -> this server's
        # worker count, once each of its workers is linked to H1's of the same index.
        self.link_workers = link_workers
        # backend: auto (servers/link_probe.py): H1's probe Handshake (this server dials the
        # probe connection), and H1's choice checked from its figures before the plans compare.
        self.on_link_probe = on_link_probe
        self.check_backend = check_backend
        # Set once the peer heard this server's abort (a call answered with it).
        self.abort_told = threading.Event()
        self.paired = False  # a Handshake agreed and nothing since says the peer is gone
        self.epoch = 0  # successful Handshakes so far (a new one: a new pairing)
        # Rounds whose release ran in this pairing: one release per round (a round abandoned
        # with its peer runs again only after a new Handshake, which clears this).
        self._released: set[int] = set()
        self._worker: threading.Thread | None = None
        self._lock = threading.Lock()  # one control call changes the round at a time
        self._noise_job: _NoiseJob | None = None

    def wait_idle(self) -> None:
        """Until no control call is changing the round (the last round's CheckModel handler
        evaluates and checkpoints after `finished` is set: let it answer H1 first)."""
        with self._lock:
            pass

    def unpair(self) -> None:
        """The peer is gone: refuse round calls (UNAVAILABLE) until the next Handshake, and
        forget the round in progress (seeds, recorded entries)."""
        with self._lock:
            self.paired = False
            self._released.clear()
            self._worker = None
            self._noise_job = None

    def link_users(self) -> list[threading.Thread]:
        """H2's threads that may be using the data link (a round, a noise block)."""
        jobs = [self._worker, None if self._noise_job is None else self._noise_job.thread]
        return [t for t in jobs if t is not None]

    # ------------------------------------------------------------------ checks

    def _check_caller(self, context: grpc.ServicerContext, role: int) -> None:
        who = peer_identity(context)
        if who is None and not self.insecure:
            raise UnauthenticatedError("no authenticated server certificate")
        if who is not None and who != self.peer_name:
            raise PermissionDeniedError(f"{who!r} is not the peer server {self.peer_name!r}")
        want = pb.SERVER_ROLE_H1 if self.state.role == pb.SERVER_ROLE_H2 else pb.SERVER_ROLE_H2
        if role != want:
            raise PermissionDeniedError(f"caller claims role {role}, expected {want}")
        self.state.last_peer_call = time.monotonic()

    def _check(self, context: grpc.ServicerContext, run_id: str, role: int) -> None:
        self._check_caller(context, role)
        self._refuse_if_aborted()
        if self.state.role != pb.SERVER_ROLE_H2:
            raise FailedPreconditionError("H1 drives the rounds; it takes no round calls")
        if not self.paired:
            raise NotPairedError(
                f"this server is not paired with {self.peer_name} (it restarted, or lost the "
                "peer): Handshake first"
            )
        if not self.state.ready or run_id != self.state.run_id:
            raise FailedPreconditionError(f"unknown run {run_id!r}")

    def _refuse_if_aborted(self) -> None:
        """This server caught the peer deviating and stopped the run: every call of the peer
        (its Handshake to re-pair included) hears why, once its caller is known to be the
        peer, instead of a closed port after peer_timeout (``abort_told`` set)."""
        aborted = self.state.aborted
        if aborted is not None:
            self.abort_told.set()
            raise FailedPreconditionError(peer_notice(self.state.plan.cfg.role_name, aborted))

    # ------------------------------------------------------------------ RPCs

    @abort_on_error
    def Handshake(
        self, request: peer_pb2.PeerHello, context: grpc.ServicerContext
    ) -> peer_pb2.PeerHello:
        self._check_caller(context, request.role)
        self._refuse_if_aborted()
        if request.protocol_version != PEER_PROTOCOL_VERSION:
            raise FailedPreconditionError(
                f"the peer speaks the servers' protocol version {request.protocol_version}, this "
                f"server {PEER_PROTOCOL_VERSION} (spgc {__version__}): run the same spgc "
                "release on both servers"
            )
        if request.link_probe:  # pairs nothing: see servers/link_probe.py
            if self.on_link_probe is None:
                raise FailedPreconditionError("this server takes no link probe")
            return self.on_link_probe(request)
        if self.paired and self.on_repair is not None:
            # Refuse another run or plan before dropping the round in progress for it.
            with self._lock:
                if self.state.ready and self.state.config is not None:
                    self._refuse_other_plan(request.config)
            self.on_repair(
                f"{self.peer_name} paired again (it restarted, or re-paired after a failure, "
                "such as a lost circuit worker)"
            )
        with self._lock:
            own_run = self.state.plan.cfg.run_id
            if own_run and own_run != request.config.run_id:
                raise FailedPreconditionError(
                    f"run id {request.config.run_id!r} differs from the configured {own_run!r}"
                )
            if self.check_backend is not None:
                self.check_backend(request)
            if not self.state.ready:
                self.on_handshake(request.config.run_id)
            assert self.state.config is not None
            self._refuse_other_plan(request.config)
            try:
                self.state.set_peer_ledger_key(request.ledger_public_key)
            except PeerMismatchError as exc:
                self.state.fail(str(exc))
                log.error("refusing to start: %s", exc)
                raise FailedPreconditionError(str(exc)) from None
            if request.HasField("round"):
                self.align(request.round)
                _, _, sha = self.state.model(None)
                theirs = request.round
                if theirs.model_version == self.state.version and theirs.model_sha256 != sha:
                    msg = (
                        f"model v{self.state.version} differs between the servers: h1 "
                        f"{theirs.model_sha256.hex()[:16]}, h2 {sha.hex()[:16]}"
                        + (
                            " (model_seed or initial_model differ?)"
                            if not theirs.model_version
                            else ""
                        )
                    )
                    self.state.fail(msg)
                    log.error("refusing to start: %s", msg)
                    raise FailedPreconditionError(msg)
            problem = release_counts_problem(request.ledger_releases, self.state.releases)
            if problem is None:
                try:
                    self.state.open_ledger()  # checked now: another key, a damaged file
                except (LedgerError, CheckpointError) as exc:
                    problem = str(exc)
            if problem:
                self.state.fail(problem)
                log.error("refusing to start: %s", problem)
                raise FailedPreconditionError(problem)
            self.paired = True
            self.epoch += 1
            if self.on_paired is not None:
                self.on_paired()
            log.info(
                "handshake with %s: configurations agree (run %s)",
                self.peer_name,
                self.state.run_id,
            )
            answer = peer_pb2.PeerHello(
                protocol_version=PEER_PROTOCOL_VERSION,
                software_version=f"spgc {__version__}",
                role=self.state.role,
                config=self.state.config,
                round=self.state.round_info(None, None),
                ledger_public_key=self.state.ledger_public_key(),
                ledger_releases=self.state.releases,
            )
            last = self.state.last_release_statement()
            if answer.ledger_releases == request.ledger_releases + 1 and last is not None:
                # H1 never recorded our last release (H2 records first): it records it now.
                t, statement, signature = last
                answer.unmatched_release.CopyFrom(
                    peer_pb2.ReleaseStatement(
                        run_id=self.state.run_id,
                        round=t,
                        role=self.state.role,
                        statement=statement,
                        signature=signature,
                    )
                )
            return answer

    def _own_link(self) -> Any:
        """This server's side of the data link, waited for LINK_WAIT s at most: H1 calls only
        once its side is up, so a longer wait means this side was lost (or never came up),
        and H1 must hear it at once (UNAVAILABLE: it pairs again), not at its call's deadline,
        by which time this server may have given up dialing."""
        try:
            return self.get_link(LINK_WAIT)
        except RuntimeError as exc:
            raise NotPairedError(str(exc)) from None

    def _refuse_a_second_release(self, t: int) -> None:
        """One release per round per pairing: its co-signed entry, seed and circuit once."""
        if t in self._released:
            raise FailedPreconditionError(f"round {t}: its release already ran")

    def _refuse_other_plan(self, theirs: pb.TrainingConfig) -> None:
        """FailedPreconditionError (and this server's run failed) when H1's plan differs."""
        assert self.state.config is not None
        diff = config_differences(theirs, self.state.config)  # (h1, h2)
        if diff:
            msg = "training configurations differ in: " + ", ".join(diff)
            self.state.fail(msg)
            log.error("refusing to start: %s", msg)
            raise FailedPreconditionError(msg)

    @abort_on_error
    def RoundBarrier(
        self, request: peer_pb2.BarrierState, context: grpc.ServicerContext
    ) -> peer_pb2.BarrierState:
        self._check(context, request.run_id, request.role)
        t, state = request.round, self.state
        b = request.barrier
        if b == peer_pb2.BARRIER_ABORTED:  # H1 caught this server deviating, at any round
            notice = printable(request.ended_reason, 8000)
            log.error("stopping: %s", peer_aborted(state, t, notice))
            return peer_pb2.BarrierState(run_id=state.run_id, round=t, barrier=b, role=state.role)
        if t != state.round:
            raise FailedPreconditionError(f"round {t}: this server is at round {state.round}")
        if b == peer_pb2.BARRIER_ROUND_OPEN:
            with self._lock:
                if state.phase != pb.ROUND_PHASE_COLLECTING:
                    try:
                        state.open_round(t)
                    except RuntimeError as exc:  # past opening (intake closed, computing)
                        raise FailedPreconditionError(str(exc)) from None
        elif b == peer_pb2.BARRIER_WAITING_FOR_PROVIDERS:
            # H1 is alive, not opening round t yet: nothing changes here, unless H1 ends the
            # run there (too few providers accept the plan).
            if request.ended_reason:
                end_run_for_want_of_providers(state, printable(request.ended_reason, 8000))
        else:  # retired: INTAKE_CLOSED (AgreeProviders), CIRCUIT_READY and MODEL_PUBLISHED
            raise FailedPreconditionError(f"unknown barrier {b}")
        out = peer_pb2.BarrierState(run_id=state.run_id, round=t, barrier=b, role=state.role)
        out.reached_at.GetCurrentTime()
        return out

    def _close_intake(self, t: int) -> None:
        """Round t's intake here, closed once OUR deadline passed or every share is in: never
        a wait for a call back to H1."""
        state = self.state
        with self._lock:
            if state.phase != pb.ROUND_PHASE_COLLECTING:
                return
        state.wait_intake_done(t, threading.Event())
        with self._lock:
            if state.round == t and state.phase == pb.ROUND_PHASE_COLLECTING:
                state.close_intake(t)

    def _check_pool_slice(self, t: int, request: peer_pb2.ReleaseStatement) -> Any:
        """Mode preprocessed: the pool entries H1 names for round t's release, which must be
        this server's next ones (else the round is refused and this server stops); None in
        the other modes."""
        state = self.state
        if state.plan.cfg.mode != "preprocessed":
            return None
        if not request.HasField("pool"):
            raise FailedPreconditionError(f"round {t}: H1 names no noise-pool entries")
        pool_slice = slice_from_message(request.pool)
        try:
            mine = state.pool.position(state.plan.dim)
        except PoolError as exc:
            mine = exc
        if mine != pool_slice:
            msg = (
                f"round {t} refused: H1 names noise-pool block {pool_slice.block_index} "
                f"offset {pool_slice.offset} (id {pool_slice.block_id.hex()[:8]}), this "
                f"server's next entries are {mine}"
            )
            log.error("stopping: %s", msg)
            state.fail(msg)
            raise FailedPreconditionError(msg)
        return pool_slice

    def _start_release(
        self, t: int, entry: int, seed: bytes | None, pool_slice: Any, link: Any
    ) -> None:
        """This server's side of round t's release, in a thread (its ledger entry, ``entry``,
        is on disk: CosignRelease wrote it first)."""
        state = self.state
        self._released.add(t)

        def work() -> None:
            try:
                compute_round(state, link, t, entry, seed, pool_slice)
            except BaseException as exc:  # reported to H1 through CheckModel
                if isinstance(exc, (garbled_core.ChannelError, garbled_core.ProtocolError)):
                    # The link or H1 failed (closed, timed out, spoke something else): one
                    # line, no traceback.
                    log.warning("round %d: circuit cut off: %s", t, exc)
                elif isinstance(exc, PeerDeviatedError):
                    pass  # H1 caught deviating: the abort is recorded, the daemon stops with it
                else:
                    log.exception("round %d: circuit or update failed", t)
                state.fail_compute(exc)

        # The evaluator (the receiving side) runs while CosignRelease answers: H1 starts its
        # side once it has written its own entry.
        self._worker = threading.Thread(target=work, name=f"spgc-h2-round-{t}", daemon=True)
        self._worker.start()

    @abort_on_error
    def SyncPool(
        self, request: peer_pb2.PoolState, context: grpc.ServicerContext
    ) -> peer_pb2.PoolState:
        self._check(context, request.run_id, request.role)
        state = self.state
        if state.pool is None:
            raise FailedPreconditionError(
                "this server has no noise pool (mode is not preprocessed)"
            )
        with self._lock:
            try:
                adopt_peer_pool(state, request)
            except PeerMismatchError as exc:
                state.fail(str(exc))
                raise FailedPreconditionError(str(exc)) from None
            return pool_state_message(state)

    @abort_on_error
    def ProduceNoise(
        self, request: peer_pb2.NoiseBlock, context: grpc.ServicerContext
    ) -> peer_pb2.NoiseBlock:
        self._check(context, request.run_id, request.role)
        state, step = self.state, request.step
        if state.pool is None:
            raise FailedPreconditionError(
                "this server has no noise pool (mode is not preprocessed)"
            )
        out = peer_pb2.NoiseBlock(run_id=state.run_id, role=state.role, step=step)
        if step == peer_pb2.NoiseBlock.STEP_DONE:
            if request.reason:
                log.error("stopping: h1 ended the run: %s", request.reason)
                state.fail(f"h1 ended the run: {request.reason}")
            else:
                log.info("precompute finished: %d unused noise samples", state.pool.available)
                state.finish_precompute()
            return out
        block = request.block
        out.block.CopyFrom(block)
        if step == peer_pb2.NoiseBlock.STEP_START:
            with self._lock:
                if self._noise_job is not None and self._noise_job.thread.is_alive():
                    raise FailedPreconditionError("a noise block is already being produced")
                if (
                    len(block.block_id) != BLOCK_ID_BYTES
                    or not 1 <= block.count <= MAX_BLOCK_SAMPLES
                ):
                    raise FailedPreconditionError(
                        f"a noise block has a {BLOCK_ID_BYTES}-byte id and 1..{MAX_BLOCK_SAMPLES} "
                        "samples"
                    )
                seed = BlockSeed(state, block)
                try:
                    seed.bind(request)  # H1's commitment first, then this server's answered
                except PeerMismatchError as exc:
                    raise FailedPreconditionError(str(exc)) from None
                if seed.proved:
                    out.seed.CopyFrom(seed.message())
                self._noise_job = _NoiseJob(block, self._own_link(), state, seed)
            return out
        if step != peer_pb2.NoiseBlock.STEP_FINISH:
            raise FailedPreconditionError(f"unknown noise-block step {step}")
        job = self._noise_job
        if job is None or job.block != block:
            raise FailedPreconditionError(f"noise block {block.index} was not started")
        job.thread.join(max(1.0, (context.time_remaining() or RPC_SLACK) - 1.0))
        if job.thread.is_alive():
            raise FailedPreconditionError(f"noise block {block.index} is still being produced")
        self._noise_job = None
        if isinstance(job.error, PeerDeviatedError):
            self._refuse_if_aborted()  # H1 hears the abort in this answer: no wait for a call
        if job.error is not None:
            raise FailedPreconditionError(f"noise block {block.index} failed: {job.error}")
        with self._lock:
            state.pool.add_block(
                block.index, bytes(block.block_id), job.shares, job.seed.commitments()
            )
            state.offline_bytes += job.bytes
        return out

    @abort_on_error
    def AgreeProviders(
        self, pages: Iterable[peer_pb2.ProviderSet], context: grpc.ServicerContext
    ) -> Iterator[peer_pb2.ProviderAgreement]:
        """H1's set in pages (spgc.wire.pages), the agreement back in pages. Our verifier
        messages are computed once the first page (with the coin) is in, while H1 computes its
        own and before its lists arrive."""
        stream = iter(pages)
        first = next(stream, None)
        proofs = None if first is None else self._own_proofs_early(first, context)
        request = join_provider_set(itertools.chain([] if first is None else [first], stream))
        answer = self._agree_providers(request, context, proofs)
        return iter(agreement_pages(answer))

    def _own_proofs_early(
        self, first: peer_pb2.ProviderSet, context: grpc.ServicerContext
    ) -> list[bytes] | None:
        """Verified inputs: the intake barrier (our intake closed, before the coin is read),
        then round t's coin from H1's first page and our verifier message for each share we
        hold; None without verified inputs, or for a round that is not ours to agree now
        (:meth:`_agree_providers` refuses it)."""
        self._check(context, first.run_id, first.role)
        state, t = self.state, first.round
        if t == state.round:
            self._close_intake(t)
        if state.plan.norm_proof is None:
            return None
        with self._lock:
            if t != state.round or state.phase != pb.ROUND_PHASE_AGREEING:
                return None
            try:
                return self._own_proofs(t, first.verify_coin)
            except PeerMismatchError as exc:  # a malformed coin: refused, the round untouched
                raise FailedPreconditionError(str(exc)) from None

    def _own_proofs(self, t: int, coin: bytes) -> list[bytes]:
        """Round t's coin from H1's part, then our verifier message for each share we hold
        (none without verified inputs); the caller holds ``_lock``, the intake closed."""
        state = self.state
        if state.plan.norm_proof is not None:
            state.history[t].verify_coin = round_coin(state.run_id, t, coin)
        return own_verifier_messages(state, t, state.history[t].received)

    def _agree_providers(
        self,
        request: peer_pb2.ProviderSet,
        context: grpc.ServicerContext,
        proofs: list[bytes] | None = None,
    ) -> peer_pb2.ProviderAgreement:
        """The agreement on H1's whole set; ``proofs``: our verifier messages, when computed
        already (:meth:`_own_proofs_early`)."""
        self._check(context, request.run_id, request.role)
        state, t = self.state, request.round
        cfg = state.plan.cfg
        if request.digest != provider_set_digest(request.providers):
            raise FailedPreconditionError("provider set digest does not match its list")
        if t == state.round:
            # The intake barrier: wait for OUR deadline (or all providers in) and close our
            # intake, before anything else is read (H1's norm-proof coin included).
            self._close_intake(t)
        release = request.release if request.HasField("release") else None
        link = None if release is None else self._own_link()  # before any entry
        released = None
        with self._lock:
            if t != state.round or state.phase != pb.ROUND_PHASE_AGREEING:
                raise FailedPreconditionError(f"round {t} is not closed at this server")
            # H1's half of the release, checked before the set is taken (P_t does not change it).
            checked = None if release is None else self._check_release(t, release)
            own = state.history[t].received
            own_ids = [state.history[t].vector_ids.get(name, b"") for name in own]
            try:
                if proofs is None:  # the round was not closed yet when the first page came
                    proofs = self._own_proofs(t, request.verify_coin)
                agreed, digest, proceed, mismatched, refused = agreement_with_proofs(
                    state,
                    (own, own_ids, proofs),
                    (
                        list(request.providers),
                        list(request.vector_ids),
                        list(request.norm_verifiers),
                    ),
                )
            except PeerMismatchError as exc:  # a malformed set: refused, the round untouched
                raise FailedPreconditionError(str(exc)) from None
            reason = (
                f"{len(agreed)} provider(s) in both servers < min_providers={cfg.min_providers}"
            )
            state.set_agreed(t, agreed, proceed, reason, mismatched, refused)
            if not proceed:
                log_round(state, state.history[t])  # nothing recorded, H1's statement dropped
            elif release is not None and checked is not None:
                released = self._cosign_and_start(t, release, checked, link)
        callee = peer_pb2.ProviderSet(
            run_id=state.run_id,
            round=t,
            role=state.role,
            providers=own,
            digest=provider_set_digest(own),
            min_providers=cfg.min_providers,
            vector_ids=own_ids,
            norm_verifiers=proofs,
            release=released,
        )
        return peer_pb2.ProviderAgreement(
            callee=callee, agreed=agreed, agreed_digest=digest, proceed=proceed
        )

    @abort_on_error
    def CosignRelease(
        self, request: peer_pb2.ReleaseStatement, context: grpc.ServicerContext
    ) -> peer_pb2.ReleaseStatement:
        """Round t's release, co-signed once P_t is agreed (H1 sent it without its provider
        set: no pool entries were ready then)."""
        self._check(context, request.run_id, request.role)
        state, t = self.state, request.round
        link = self._own_link()  # before the entry: a lost link records nothing
        with self._lock:
            if t != state.round or state.phase != pb.ROUND_PHASE_COMPUTING:
                raise FailedPreconditionError(f"round {t} has no agreed provider set here")
            checked = self._check_release(t, request)
            return self._cosign_and_start(t, request, checked, link)

    def _check_release(
        self, t: int, request: peer_pb2.ReleaseStatement
    ) -> tuple[bytes | None, Any, bytes]:
        """H1's half of round t's co-signed release, checked before anything is written (the
        caller holds the lock): one release per round, its seed commitment (spgc), its pool
        entries (preprocessed: this server's next ones, else it stops) and its statement
        (this server's own, else it stops). Returns (H1's seed commitment, the pool slice,
        this server's signature over the statement)."""
        state = self.state
        if request.round != t:
            raise FailedPreconditionError(f"round {t}: H1's release statement is of another round")
        if len(request.statement) > MAX_STATEMENT_BYTES:
            raise FailedPreconditionError(f"release statements are <= {MAX_STATEMENT_BYTES} B")
        self._refuse_a_second_release(t)
        try:
            theirs = checked_seed_commitment(request, t) if state.plan.cfg.mode == "spgc" else None
        except PeerMismatchError as exc:
            raise FailedPreconditionError(str(exc)) from None
        pool_slice = self._check_pool_slice(t, request)
        statement, signature = state.release_statement(t)
        if request.statement != statement:
            msg = (
                f"round {t}: the release statements differ: h1 {request.statement[:400]!r}, "
                f"h2 {statement[:400]!r}"
            )
            log.error("stopping: %s", msg)
            state.fail(msg)
            raise FailedPreconditionError(msg)
        return theirs, pool_slice, signature

    def _cosign_and_start(
        self,
        t: int,
        request: peer_pb2.ReleaseStatement,
        checked: tuple[bytes | None, Any, bytes],
        link: Any,
    ) -> peer_pb2.ReleaseStatement:
        """Write-ahead: this server's entry of round t's release with H1's signature (fsync),
        then its side of the release, started; returns this server's half for H1 (the caller
        holds the lock; round t's P_t is agreed and ``checked`` is :meth:`_check_release`'s)."""
        state = self.state
        theirs, pool_slice, signature = checked
        try:
            index = state.record_release(t, peer_sig=request.signature)
        except PeerMismatchError as exc:  # H1's signature does not verify
            raise FailedPreconditionError(str(exc)) from None
        answer = peer_pb2.ReleaseStatement(
            run_id=state.run_id,
            round=t,
            role=state.role,
            statement=request.statement,
            signature=signature,
        )
        seed = None
        if theirs is not None:
            seed = os.urandom(32)  # fresh per round, never sent anywhere (its commitment only)
            mine = seed_commitment(state.run_id, t, state.role, seed)
            answer.seed.CopyFrom(seed_commitment_message(state.run_id, t, state.role, mine))
            state.history[t].seed_commitments = {"h1": theirs, "h2": mine}
        self._start_release(t, index, seed, pool_slice, link)
        del seed  # the worker holds the only reference
        return answer

    @abort_on_error
    def CloseLedger(
        self, request: peer_pb2.ReleaseStatement, context: grpc.ServicerContext
    ) -> peer_pb2.ReleaseStatement:
        """The run is over on both servers: co-sign the ledger's closing entry (this server
        writes its own first, with H1's signature)."""
        self._check(context, request.run_id, request.role)
        state = self.state
        if len(request.statement) > MAX_STATEMENT_BYTES:
            raise FailedPreconditionError(f"closing statements are <= {MAX_STATEMENT_BYTES} B")
        with self._lock:
            if not state.finished or state.failure:
                raise FailedPreconditionError("training is not finished here: no closing entry")
            statement, signature = state.close_statement()
            if request.statement != statement:
                raise FailedPreconditionError(
                    f"the closing statements differ: h1 {request.statement[:400]!r}, h2 "
                    f"{statement[:400]!r}"
                )
            try:
                state.record_close(request.signature)
            except PeerMismatchError as exc:  # H1's signature does not verify
                raise FailedPreconditionError(str(exc)) from None
        return peer_pb2.ReleaseStatement(
            run_id=state.run_id,
            round=state.round,
            role=state.role,
            statement=statement,
            signature=signature,
        )

    @abort_on_error
    def CheckModel(
        self, request: peer_pb2.ModelDigest, context: grpc.ServicerContext
    ) -> peer_pb2.ModelDigest:
        self._check(context, request.run_id, request.role)
        state = self.state
        t = request.version - 1
        if t != state.round:
            raise FailedPreconditionError(f"model v{request.version}: at round {state.round}")
        if t not in self._released:
            raise FailedPreconditionError(f"model v{request.version}: round {t} ran no release")
        try:
            sha = state.wait_pending(t, (context.time_remaining() or RPC_SLACK) - 1.0)
        except TimeoutError as exc:
            raise WireError(str(exc), grpc.StatusCode.DEADLINE_EXCEEDED) from None
        except RuntimeError as exc:  # the round's circuit or update failed here
            self._refuse_if_aborted()  # failed because this server caught H1: say so
            raise FailedPreconditionError(str(exc)) from None
        if sha != request.sha256:
            msg = (
                f"model v{request.version} differs between the servers: h1 "
                f"{request.sha256.hex()[:16]} h2 {sha.hex()[:16]}"
            )
            log.error("stopping: %s", msg)
            state.fail(msg)
        else:
            # Both hashes checked here (H1 checks ours in the answer before it publishes):
            # publish, checkpoint, and open the next round, which H1 opens once answered.
            with self._lock:
                if state.pending is None or state.round != t:
                    raise FailedPreconditionError(f"model v{request.version}: not pending here")
                log_round(state, state.publish(t))
                if not state.finished and not state.failure:
                    state.open_round(t + 1)
        return peer_pb2.ModelDigest(
            run_id=state.run_id,
            version=request.version,
            role=state.role,
            num_parameters=state.plan.dim,
            sha256=sha,
        )

    @abort_on_error
    def PairWorkers(
        self, request: peer_pb2.WorkerPairing, context: grpc.ServicerContext
    ) -> peer_pb2.WorkerPairing:
        # Not under self._lock: it waits for this server's workers to start and connect (up to
        # the caller's deadline), and no round call comes before H1 has its answer.
        self._check(context, request.run_id, request.role)
        if self.link_workers is None:
            raise FailedPreconditionError(
                "this server runs the circuit in its own process (workers: 1): it has no "
                "workers to link"
            )
        addresses = parse_worker_addresses(request.addresses, request.workers)
        remaining = context.time_remaining()
        timeout = RPC_SLACK if remaining is None else max(0.0, remaining - 1.0)
        workers = self.link_workers(addresses, request.workers, timeout)
        return peer_pb2.WorkerPairing(
            run_id=self.state.run_id, role=self.state.role, workers=workers
        )


class _NoiseJob:
    """H2's side of producing one noise block, run in a thread while H1 garbles."""

    def __init__(
        self, block: peer_pb2.PoolBlock, link: Any, state: ServerState, seed: BlockSeed
    ) -> None:
        self.block = peer_pb2.PoolBlock()
        self.block.CopyFrom(block)
        self.seed = seed
        self.shares: Any = None
        self.bytes = 0
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(link, state), name=f"spgc-h2-noise-{block.index}", daemon=True
        )
        self.thread.start()

    def _run(self, link: Any, state: ServerState) -> None:
        try:
            self.shares, _ = produce_pool_run(
                "evaluator", state, link, self.block.count, self.seed
            )
        except PeerDeviatedError as exc:  # H1 caught: nothing stored, the run aborted
            self.error = exc
        except garbled_core.ChannelError as exc:  # the link to H1 broke: H1 is gone
            log.warning("noise block %d stopped: the link to h1 broke (%s)", self.block.index, exc)
            self.error = exc
        except BaseException as exc:  # handed to H1 at STEP_FINISH
            log.exception("noise block %d failed", self.block.index)
            self.error = exc

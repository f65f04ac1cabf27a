"""Round coordination. H1 drives every round over the Peer service; H2 follows (servers.peer).

Per round t (SPEC section 3, steps 6-10)::

    H1 open t ---------- RoundBarrier(ROUND_OPEN) ----------> H2 opens t
    H1 deadline/all in - RoundBarrier(INTAKE_CLOSED) -------> H2 waits for ITS deadline/all in
    AgreeProviders (intersection; < min_providers: round skipped, no noise, not accounted)
    CommitSeed (commitments only; each seed = os.urandom(32), never leaves its server)
    RoundBarrier(CIRCUIT_READY) -> both run gc_party.run_aggregate (H1 garbler, H2 evaluator)
    g = Y / s, Adam step, CheckModel (hashes must agree, else both stop loudly)
    RoundBarrier(MODEL_PUBLISHED) -> both publish version t+1 and record the accountant step

Modes (SPEC section 5): ``dng`` runs the same rounds with no garbled circuit and no seed
commitments: at CIRCUIT_READY each server adds its own discrete Gaussian to its share and the two
exchange the noisy shares over the garbled-circuit data link (:func:`dng_exchange`). ``plain``
and ``ldp`` have one server and no peer: :class:`SingleDriver` runs the rounds alone and reads
the providers' clear sum from the intake (:func:`compute_single`).

Mode ``preprocessed`` (servers.noise_pool): the noise comes from each server's pool of noise
shares made ahead by the sampler circuit; H1 keeps the pool topped up while the providers
compute (:class:`NoiseProducer`), names the pool entries of the round at CIRCUIT_READY (H2
refuses other entries), and the round itself is dng's exchange with the pool shares as the
noise: one ring element per coordinate each way, no circuit.

Whether training is over (round budget, or the next step would exceed the privacy budget) is a
deterministic function of the shared configuration, so both servers decide it alike without a
message.
"""

from __future__ import annotations

import logging
import math
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np

from servers.gc_party import SEED_BYTES, run_aggregate, sample_noise_plain
from servers.noise_pool import (
    BLOCK_ID_BYTES,
    PoolBlock,
    PoolError,
    PoolExhaustedError,
    PoolSlice,
    produce_noise_shares,
    reconcile,
)
from servers.state import PeerMismatchError, RoundRecord, ServerState
from spgc.sharing import reconstruct, ring_mask
from spgc.wire import (
    SEED_COMMITMENT_SCHEME,
    canonical_provider_set,
    peer_pb2,
    peer_pb2_grpc,
    provider_set_digest,
    seed_commitment,
)
from spgc.wire import aggregation_pb2 as pb

log = logging.getLogger(__name__)

_GC_ROLE = {pb.SERVER_ROLE_H1: "garbler", pb.SERVER_ROLE_H2: "evaluator"}
RPC_SLACK = 60.0  # seconds on top of the round deadline for a waiting peer call


def agreement(
    own: list[str], other: list[str], min_providers: int
) -> tuple[list[str], bytes, bool]:
    """(P_t sorted, its digest, proceed): the same on both servers from the two sets."""
    agreed = canonical_provider_set(set(own) & set(other))
    return agreed, provider_set_digest(agreed), len(agreed) >= min_providers


def sample_server_noise(n: int, sigma_units: float) -> np.ndarray:
    """n samples of N_Z(0, sigma_units^2) (int64) drawn by this server alone, for dng.

    The garbled circuit's own sampler evaluated in plaintext on two fresh 32-byte seeds from the
    OS CSPRNG (gc_party.sample_noise_plain): the same exact discrete Gaussian (up to the
    sampler's 2^-64 statistical distance) the circuit adds in spgc mode.
    """
    return sample_noise_plain(os.urandom(SEED_BYTES), os.urandom(SEED_BYTES), n, sigma_units)


def dng_exchange(
    role: int, channel: Any, share: np.ndarray, noise: np.ndarray, ring_bits: int
) -> tuple[np.ndarray, dict[str, Any]]:
    """Both servers' side of a dng release; returns (Y, counters) with
    Y = smod((A1 + z1) - (A2 - z2), 2^L) = S + z1 + z2, identical on both servers.

    Each server sends only its noisy share (H1: A1 + z1, H2: A2 - z2, mod 2^L) over the raw data
    link (``channel``: a garbled_core Channel with send/recv). A1 - A2 = S, so what each server
    learns beyond Y is S plus the OTHER server's noise alone: each noise must be full variance
    (SPEC section 5). The plan's ring holds |S| plus the tail of z1 + z2, so nothing wraps.
    H1 sends first and H2 receives first (no deadlock on large vectors).
    """
    mask = ring_mask(ring_bits)
    z = np.asarray(noise, dtype=np.int64).view(np.uint64)
    mine = (share + z if role == pb.SERVER_ROLE_H1 else share - z) & mask
    nbytes = 8 * len(share)
    payload = mine.astype("<u8").tobytes()
    if role == pb.SERVER_ROLE_H1:
        channel.send(payload)
        channel.flush()
        theirs = np.frombuffer(channel.recv(nbytes), dtype="<u8").astype(np.uint64)
        a, b = mine, theirs
    else:
        theirs = np.frombuffer(channel.recv(nbytes), dtype="<u8").astype(np.uint64)
        channel.send(payload)
        channel.flush()
        a, b = theirs, mine
    if np.any(theirs & ~mask):
        raise PeerMismatchError("the other server's noisy share is outside the ring")
    return reconstruct(a, b, ring_bits), {"sent": nbytes, "received": nbytes}


def compute_round(
    state: ServerState, link: Any, t: int, seed: bytes | None, pool_slice: PoolSlice | None = None
) -> bytes:
    """This server's half of the circuit on its restricted sum (dng: noise and exchange;
    preprocessed: the pool's noise shares ``pool_slice`` and the exchange), then the Adam step.

    Returns the SHA-256 of the pending model version t+1.
    """
    plan = state.plan
    total = state.intake.total()
    start = time.perf_counter()
    if plan.cfg.mode == "preprocessed":
        if pool_slice is None or state.pool is None:
            raise RuntimeError(f"round {t}: no noise-pool entries named for a preprocessed round")
        noise = state.pool.take(pool_slice, t)  # the cursor moves on disk before any use
        seconds = {"pool": time.perf_counter() - start}
        start = time.perf_counter()
        y, info = dng_exchange(
            state.role, link.channel, total, noise.view(np.int64), plan.ring_bits
        )
        seconds["exchange"] = time.perf_counter() - start
        del noise
        return state.apply_update(t, y, info, seconds)
    if plan.cfg.mode == "dng":
        noise = sample_server_noise(plan.dim, plan.sigma_units)
        seconds = {"noise": time.perf_counter() - start}
        start = time.perf_counter()
        y, info = dng_exchange(state.role, link.channel, total, noise, plan.ring_bits)
        seconds["exchange"] = time.perf_counter() - start
        del noise  # never needed again
        return state.apply_update(t, y, info, seconds)
    y, info = run_aggregate(
        _GC_ROLE[state.role],
        link,
        total,
        seed,
        plan.sigma_units if plan.cfg.mode == "spgc" else None,
        plan.ring_bits,
        plan.cfg.mode,
    )
    seconds = {"circuit": time.perf_counter() - start}
    return state.apply_update(t, y, info, seconds)


def log_round(state: ServerState, rec: RoundRecord) -> None:
    """The one log line per round; then the checkpoint a restart continues from."""
    try:
        _log_round(state, rec)
    finally:
        state.save_checkpoint()


def _log_round(state: ServerState, rec: RoundRecord) -> None:
    s = rec.seconds
    eps = state.epsilon()
    if rec.phase == pb.ROUND_PHASE_ABORTED:
        log.info(
            "%s round %d skipped: %s (received %d, agreed %d); no noise spent, eps=%s",
            state.plan.cfg.role_name,
            rec.round,
            rec.reason,
            len(rec.received),
            len(rec.agreed),
            _eps(eps),
        )
        return
    metrics = ""
    if state.evaluator is not None:
        rec.test_loss, rec.test_accuracy = state.evaluator(state.params)
        metrics = f"test loss {rec.test_loss:.4f} accuracy {rec.test_accuracy:.4f}, "
    log.info(
        "%s round %d -> model v%d: providers received %d used %d, noise std %.4g units "
        "(total %.4g), "
        "%seps=%s (delta=%g), server-to-server bytes %d, seconds: provider compute %.2f, "
        "intake %.2f, %s%s %.3f, update %.3f",
        state.plan.cfg.role_name,
        rec.round,
        state.version,
        len(rec.received),
        len(rec.agreed),
        state.plan.sigma_units,
        state.plan.total_noise_std_units,
        metrics,
        _eps(eps),
        state.plan.cfg.target_delta,
        rec.gc_bytes,
        s.get("provider", 0.0),
        s.get("intake", 0.0),
        # dng samples its noise, preprocessed reads its pool, before the exchange
        "".join(f"{k} {s[k]:.3f}, " for k in ("noise", "pool", "decode") if k in s),
        "circuit" if "circuit" in s else "exchange",
        s.get("circuit", s.get("exchange", 0.0)),
        s.get("update", 0.0),
    )


def _eps(eps: float) -> str:
    return "inf (no noise)" if math.isinf(eps) else f"{eps:.4f}"


class _RoundLoop:
    """Runs rounds until training is finished or the daemon stops."""

    state: ServerState
    stop: threading.Event

    def run(self) -> None:
        """Rounds until finished or stopped; raises on a disagreement or a broken peer."""
        while not self.stop.is_set() and not self.state.finished:
            self.run_round(self.state.round)

    def run_round(self, t: int) -> None:
        raise NotImplementedError


# ------------------------------------------------------------------------------ noise pool


def pool_state_message(state: ServerState) -> peer_pb2.PoolState:
    """This server's pool as a PoolState message."""
    pool = state.pool
    cursor, blocks = pool.state()
    return peer_pb2.PoolState(
        run_id=state.run_id,
        role=state.role,
        sigma_units=pool.sigma_units,
        ring_bits=pool.ring_bits,
        cursor_block=cursor[0],
        cursor_offset=cursor[1],
        blocks=[
            peer_pb2.PoolBlock(index=b.index, block_id=b.block_id, count=b.count) for b in blocks
        ],
    )


def pool_state_tuple(msg: peer_pb2.PoolState) -> tuple[tuple[int, int], list[PoolBlock]]:
    """(cursor, blocks) of a PoolState message, as :func:`servers.noise_pool.reconcile` takes."""
    blocks = [PoolBlock(b.index, bytes(b.block_id), b.count) for b in msg.blocks]
    return (msg.cursor_block, msg.cursor_offset), blocks


def adopt_peer_pool(
    state: ServerState, theirs: peer_pb2.PoolState
) -> tuple[tuple[int, int], list[PoolBlock]]:
    """Reconcile this server's pool with the other's (PeerMismatchError if they hold another kind
    of noise): keep the blocks both hold and the later cursor. Returns the agreed state, which
    the other server computes alike from the same two states."""
    pool = state.pool
    if theirs.sigma_units != pool.sigma_units or theirs.ring_bits != pool.ring_bits:
        raise PeerMismatchError(
            f"the noise pools differ: this server's has sigma_units={pool.sigma_units:g}, "
            f"L={pool.ring_bits}; the other's sigma_units={theirs.sigma_units:g}, "
            f"L={theirs.ring_bits}"
        )
    before = pool.available
    agreed = reconcile(pool.state(), pool_state_tuple(theirs))
    pool.apply(*agreed)
    log.info(
        "noise pool: %d unused samples held by both servers (%d here before reconciling)",
        pool.available,
        before,
    )
    return agreed


def slice_message(piece: PoolSlice) -> peer_pb2.PoolSlice:
    return peer_pb2.PoolSlice(
        block_index=piece.block_index,
        block_id=piece.block_id,
        offset=piece.offset,
        count=piece.count,
    )


def slice_from_message(msg: peer_pb2.PoolSlice) -> PoolSlice:
    return PoolSlice(msg.block_index, bytes(msg.block_id), msg.offset, msg.count)


class NoiseProducer:
    """H1's side of the noise pool (mode preprocessed): reconcile the two pools, produce blocks
    of noise shares with H2 over the data link, and end H2's `spgc server precompute`."""

    def __init__(
        self, state: ServerState, peer: peer_pb2_grpc.PeerStub, link: Any, stop: threading.Event
    ) -> None:
        self.state = state
        self.pool = state.pool
        self.peer = peer
        self.link = link
        self.stop = stop
        self.samples_made = 0
        self.seconds = 0.0

    @property
    def target(self) -> int:
        """Samples H1 keeps ready: pool_rounds rounds' worth."""
        return self.state.plan.cfg.pool_rounds * self.state.plan.dim

    def sync(self) -> None:
        """Both servers keep the blocks both hold and the later cursor (after a restart)."""
        theirs = self.peer.SyncPool(pool_state_message(self.state), timeout=RPC_SLACK)
        if adopt_peer_pool(self.state, theirs) != pool_state_tuple(theirs):
            raise PeerMismatchError("the other server reconciled the noise pools differently")

    def produce_block(self, count: int) -> None:
        """One block of ``count`` noise samples as shares on both servers."""
        cfg = self.state.plan.cfg
        block = peer_pb2.PoolBlock(
            index=self.pool.next_index, block_id=os.urandom(BLOCK_ID_BYTES), count=count
        )
        msg = peer_pb2.NoiseBlock(
            run_id=self.state.run_id,
            role=pb.SERVER_ROLE_H1,
            step=peer_pb2.NoiseBlock.STEP_START,
            block=block,
        )
        start = time.perf_counter()
        self.peer.ProduceNoise(msg, timeout=RPC_SLACK)
        shares, info = produce_noise_shares(
            "garbler", self.link, count, self.pool.sigma_units, self.pool.ring_bits, os.urandom(32)
        )
        self.state.offline_bytes += info["sent"] + info["received"]
        msg.step = peer_pb2.NoiseBlock.STEP_FINISH
        self.peer.ProduceNoise(msg, timeout=RPC_SLACK + cfg.pool_wait)
        self.pool.add_block(block.index, block.block_id, shares)
        self.samples_made += count
        self.seconds += time.perf_counter() - start

    def fill(
        self,
        target: int,
        until: Callable[[], bool] | None = None,
        deadline: float | None = None,
        progress: bool = False,
    ) -> bool:
        """Produce blocks until ``target`` unused samples are held, ``until()`` is true, the
        monotonic ``deadline`` passed, or the daemon stops; True if the target was reached."""
        cfg = self.state.plan.cfg
        while self.pool.available < target and not self.stop.is_set():
            if (until is not None and until()) or (
                deadline is not None and time.monotonic() > deadline
            ):
                break
            self.produce_block(min(cfg.pool_block, target - self.pool.available))
            if progress:
                log.info(
                    "noise pool: %d / %d samples (%.0f samples/s)",
                    self.pool.available,
                    target,
                    self.samples_made / max(self.seconds, 1e-9),
                )
        return self.pool.available >= target

    def slice_for_round(self, t: int) -> PoolSlice:
        """The next d samples for round t; waits for production up to pool_wait seconds, then
        fails (PoolExhaustedError): a round never goes ahead with less noise."""
        cfg, d = self.state.plan.cfg, self.state.plan.dim
        if self.pool.available < d and cfg.pool_produce:
            log.warning(
                "round %d: the noise pool holds %d of the %d samples needed; producing (up to "
                "%g s)",
                t,
                self.pool.available,
                d,
                cfg.pool_wait,
            )
            self.fill(d, deadline=time.monotonic() + cfg.pool_wait)
        if self.pool.available < d:
            how = (
                f"production did not catch up within pool_wait={cfg.pool_wait:g} s"
                if cfg.pool_produce
                else "pool_produce is false: fill the pool with `spgc server precompute`"
            )
            raise PoolExhaustedError(
                f"round {t}: the noise pool holds {self.pool.available} unused samples but the "
                f"round needs {d}; {how}. No round is released with less noise"
            )
        return self.pool.position(d)

    def end_peer(self, reason: str = "") -> None:
        """Tell H2 the run is over: precompute finished (no reason) or training cannot go on."""
        msg = peer_pb2.NoiseBlock(
            run_id=self.state.run_id,
            role=pb.SERVER_ROLE_H1,
            step=peer_pb2.NoiseBlock.STEP_DONE,
            reason=reason,
        )
        self.peer.ProduceNoise(msg, timeout=RPC_SLACK)


class H1Driver(_RoundLoop):
    """H1's round loop over a Peer stub to H2."""

    def __init__(
        self, state: ServerState, peer: peer_pb2_grpc.PeerStub, link: Any, stop: threading.Event
    ) -> None:
        self.state = state
        self.peer = peer
        self.link = link
        self.stop = stop
        self.producer = (
            NoiseProducer(state, peer, link, stop)
            if state.plan.cfg.mode == "preprocessed"
            else None
        )

    def run(self) -> None:
        """Preprocessed: reconcile the pools and fill them before round 0 (the offline phase),
        then the rounds; a pool failure ends H2's run too."""
        if self.producer is None:
            super().run()
            return
        try:
            self.producer.sync()
            if not self.state.finished and self.state.plan.cfg.pool_produce:
                self.producer.fill(self.producer.target, progress=True)
            super().run()
        except PoolError as exc:
            try:
                self.producer.end_peer(str(exc))
            except grpc.RpcError as rpc_exc:  # H2 gone as well: it stops on its own
                log.warning("could not tell h2 to stop: %s", rpc_exc)
            raise

    def _barrier(
        self, t: int, barrier: int, timeout: float = RPC_SLACK, pool: PoolSlice | None = None
    ) -> None:
        msg = peer_pb2.BarrierState(
            run_id=self.state.run_id, round=t, barrier=barrier, role=pb.SERVER_ROLE_H1
        )
        if pool is not None:
            msg.pool.CopyFrom(slice_message(pool))
        msg.reached_at.GetCurrentTime()
        self.peer.RoundBarrier(msg, timeout=timeout)

    def run_round(self, t: int) -> None:
        state, cfg = self.state, self.state.plan.cfg
        state.open_round(t)
        self._barrier(t, peer_pb2.BARRIER_ROUND_OPEN)
        if self.producer is not None and cfg.pool_produce:
            # The data link is idle while the providers compute: top the pool up meanwhile.
            self.producer.fill(self.producer.target, until=lambda: state.intake_complete(t))
        state.wait_intake_done(t, self.stop)
        if self.stop.is_set():
            return
        received = state.close_intake(t)
        self._barrier(t, peer_pb2.BARRIER_INTAKE_CLOSED, cfg.round_deadline + RPC_SLACK)

        mine = peer_pb2.ProviderSet(
            run_id=state.run_id,
            round=t,
            role=pb.SERVER_ROLE_H1,
            providers=received,
            digest=provider_set_digest(received),
            min_providers=cfg.min_providers,
        )
        answer = self.peer.AgreeProviders(mine, timeout=RPC_SLACK)
        agreed, digest, proceed = agreement(
            received, list(answer.callee.providers), cfg.min_providers
        )
        if digest != answer.agreed_digest or proceed != answer.proceed:
            raise PeerMismatchError(f"round {t}: H2 computed another provider set")
        reason = f"{len(agreed)} provider(s) in both servers < min_providers={cfg.min_providers}"
        state.set_agreed(t, agreed, proceed, reason)
        if not proceed:
            log_round(state, state.history[t])
            return

        seed = os.urandom(32) if cfg.mode == "spgc" else None
        if seed is not None:
            commit = peer_pb2.SeedCommitment(
                run_id=state.run_id,
                round=t,
                role=pb.SERVER_ROLE_H1,
                scheme=SEED_COMMITMENT_SCHEME,
                commitment=seed_commitment(state.run_id, t, pb.SERVER_ROLE_H1, seed),
            )
            theirs = self.peer.CommitSeed(commit, timeout=RPC_SLACK)
            state.history[t].seed_commitments = {"h1": commit.commitment, "h2": theirs.commitment}
        pool_slice = None if self.producer is None else self.producer.slice_for_round(t)
        self._barrier(t, peer_pb2.BARRIER_CIRCUIT_READY, pool=pool_slice)
        try:
            sha = compute_round(state, self.link, t, seed, pool_slice)
        except BaseException as exc:
            state.fail_compute(exc)
            raise
        finally:
            seed = None  # drop our reference: the seed is never needed again
        check = peer_pb2.ModelDigest(
            run_id=state.run_id,
            version=t + 1,
            role=pb.SERVER_ROLE_H1,
            num_parameters=state.plan.dim,
            sha256=sha,
        )
        other = self.peer.CheckModel(check, timeout=RPC_SLACK)
        if other.sha256 != sha or other.version != t + 1:
            raise PeerMismatchError(
                f"model v{t + 1} differs between the servers: h1 {sha.hex()[:16]} "
                f"h2 {other.sha256.hex()[:16]}"
            )
        self._barrier(t, peer_pb2.BARRIER_MODEL_PUBLISHED)
        log_round(state, state.publish(t))


def compute_single(state: ServerState, t: int) -> bytes:
    """One-server modes: the intake's sum mod 2^L of the providers' clear vectors (plain: G_j;
    ldp: G_j + z_j, noised by each provider) read signed, then the Adam step."""
    start = time.perf_counter()
    total = state.intake.total()
    y = reconstruct(total, np.zeros_like(total), state.plan.ring_bits)
    return state.apply_update(t, y, {}, {"decode": time.perf_counter() - start})


class SingleDriver(_RoundLoop):
    """The round loop of a server without a peer (modes plain and ldp): open, collect until
    the deadline or everyone is in, close, use whoever sent (>= min_providers), update."""

    def __init__(self, state: ServerState, stop: threading.Event) -> None:
        self.state = state
        self.stop = stop

    def run_round(self, t: int) -> None:
        state, cfg = self.state, self.state.plan.cfg
        state.open_round(t)
        state.wait_intake_done(t, self.stop)
        if self.stop.is_set():
            return
        received = state.close_intake(t)
        proceed = len(received) >= cfg.min_providers
        reason = f"{len(received)} provider(s) sent a vector < min_providers={cfg.min_providers}"
        state.set_agreed(t, received, proceed, reason)
        if not proceed:
            log_round(state, state.history[t])
            return
        try:
            compute_single(state, t)
        except BaseException as exc:
            state.fail_compute(exc)
            raise
        log_round(state, state.publish(t))


def is_unavailable(exc: BaseException) -> bool:
    """A gRPC error that means "not up yet" (retry the handshake)."""
    return isinstance(exc, grpc.RpcError) and exc.code() in (  # type: ignore[attr-defined]
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
    )

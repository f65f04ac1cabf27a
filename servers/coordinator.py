"""Round coordination. H1 drives every round over the Peer service; H2 follows (servers.peer).

Per round t (SPEC section 3, steps 6-10); each call is a round trip between the servers, so
a steady round makes two besides the release itself (issue 47; tests/servers/test_round_trips.py
counts them)::

    H1 open t ---------- RoundBarrier(ROUND_OPEN) ----------> H2 opens t
                         (round 0, and after a skipped round or a re-pairing only: else H2
                         opened t in the previous round's CheckModel)
    H1 deadline/all in - AgreeProviders ---------------------> H2 waits for ITS deadline/all in,
                         closes its intake; intersection (< min_providers: round skipped, no
                         noise, not accounted). Verified inputs: with H1's norm-proof coin,
                         drawn once its intake closed, and both verifier messages.
                         With the set rides H1's half of the co-signed ledger entry, with the
                         seed commitment (spgc; each seed os.urandom(32), never leaves its
                         server) or the pool entries (preprocessed): H2, the round proceeding,
                         writes its entry, starts its side of the release and answers with
                         its half; H1 writes its entry, then runs its side (H1 garbler / sends
                         first, H2 evaluator / receives first). [CosignRelease: the entry in
                         a call of its own, when the pool was short as the set went out.]
    g = Y / s, Adam step, CheckModel ----------------------> H2 compares the hashes (else both
                         stop loudly), publishes t+1, opens t+1; H1 compares, publishes, opens

Modes (SPEC section 5): ``dng`` runs the same rounds with no garbled circuit and no seed
commitments: once the release is co-signed each server adds its own discrete Gaussian to its
share and the two exchange the noisy shares over the garbled-circuit data link
(:func:`dng_exchange`). ``plain``
and ``ldp`` have one server and no peer: :class:`SingleDriver` runs the rounds alone and reads
the providers' clear sum from the intake (:func:`compute_single`).

Mode ``preprocessed`` (servers.noise_pool): the noise comes from each server's pool of noise
shares made ahead by the sampler circuit; H1 keeps the pool ahead of the rounds from a thread
of its own (:class:`NoiseProducer`; a round waits only when the pool is short), names the pool
entries of the round in CosignRelease (H2 refuses other entries), and the round itself is
dng's exchange with the pool shares as the noise, on its own connection of the data link: one
ring element per coordinate each way, no circuit.

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
from collections.abc import Callable, Sequence
from typing import Any

import grpc
import numpy as np

import garbled_core
from spgc.learning.losses import REGRESSION_METRICS
from spgc.privacy.noise import sample_discrete_gaussian
from spgc.privacy.seed_proof import SeedBinding
from spgc.protocol.sharing import reconstruct, ring_mask
from spgc.servers.deviation import abort_round, peer_notice
from spgc.servers.errors import PeerMismatchError, describe_error
from spgc.servers.faults import arm_cheat, fault_point, swapped_seed, tap_reveal
from spgc.servers.gc_party import run_aggregate
from spgc.servers.noise_floor import GC_ROLE, draw_own_noise, spgc_release, with_own_noise
from spgc.servers.noise_pool import (
    PoolError,
    PoolSlice,
)
from spgc.servers.norm_checks import (
    COIN_BYTES,
    norm_refusals,
    round_coin,
    verifier_message_bytes,
    verifier_messages,
)
from spgc.servers.pool_sync import NoiseProducer, slice_message
from spgc.servers.round_phases import RoundRecord
from spgc.servers.seed_binding import checked_peer_commitment
from spgc.servers.state import RPC_SLACK, ServerState
from spgc.wire import (
    SEED_COMMITMENT_SCHEME,
    canonical_provider_set,
    peer_pb2,
    peer_pb2_grpc,
    provider_set_digest,
    seed_commitment,
)
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.pages import agree_providers

log = logging.getLogger(__name__)


def agreement(
    own: list[str],
    other: list[str],
    min_providers: int,
    own_ids: Sequence[bytes] = (),
    other_ids: Sequence[bytes] = (),
) -> tuple[list[str], bytes, bool, list[str]]:
    """(P_t sorted, its digest, proceed, mismatched): the same on both servers from the two
    sets. ``own_ids``/``other_ids``: each set's ShareHeader.vector_ids in its order (empty: the
    sender has none); ``mismatched``, sorted, are the providers in both sets whose two vector
    ids differ: their halves are of different vectors, so they are not in P_t. A half with an
    id and a half without one differ too (one client sends both halves alike); two halves
    without ids (a client predating the field) are not checked, nor is anything when a set
    comes without ids (a server predating the field)."""
    for names, ids in ((own, own_ids), (other, other_ids)):
        if ids and len(ids) != len(names):
            raise PeerMismatchError(f"{len(ids)} vector ids for {len(names)} providers")
    mine = dict(zip(own, own_ids, strict=False))  # checked above: equal lengths or no ids
    theirs = dict(zip(other, other_ids, strict=False))
    both = set(own) & set(other)
    mismatched = sorted(
        name
        for name in both
        if name in mine and name in theirs and bytes(mine[name]) != bytes(theirs[name])
    )
    agreed = canonical_provider_set(both - set(mismatched))
    return agreed, provider_set_digest(agreed), len(agreed) >= min_providers, mismatched


def own_verifier_messages(state: ServerState, t: int, received: Sequence[str]) -> list[bytes]:
    """Verified inputs: this server's norm-proof verifier message for each received share of
    round t (empty without verified inputs)."""
    norm = state.plan.norm_proof
    if norm is None:
        return []
    coin = state.history[t].verify_coin
    if not coin:
        raise PeerMismatchError(f"round {t}: no norm-proof coin was agreed once its intake closed")
    return verifier_messages(
        state.intake, norm, coin, state.run_id, t, received, state.proof_dots
    )


def agreement_with_proofs(
    state: ServerState,
    own: tuple[list[str], list[bytes], list[bytes]],
    other: tuple[list[str], list[bytes], list[bytes]],
) -> tuple[list[str], bytes, bool, list[str], dict[str, str]]:
    """:func:`agreement` of the two servers' (providers, vector ids, norm-proof messages), less
    the providers whose norm proof the two messages refuse (verified inputs), which are
    returned last with the reason; the same on both servers."""
    (names, ids, proofs), (other_names, other_ids, other_proofs) = own, other
    refused: dict[str, str] = {}
    norm = state.plan.norm_proof
    if norm is not None:
        leader = state.role == pb.SERVER_ROLE_H1
        refused = norm_refusals(norm, names, proofs, other_names, other_proofs, leader)
    keep = [i for i, name in enumerate(names) if name not in refused]
    other_keep = [i for i, name in enumerate(other_names) if name not in refused]
    agreed, digest, proceed, mismatched = agreement(
        [names[i] for i in keep],
        [other_names[i] for i in other_keep],
        state.plan.cfg.min_providers,
        [ids[i] for i in keep] if ids else [],
        [other_ids[i] for i in other_keep] if other_ids else [],
    )
    return agreed, digest, proceed, mismatched, refused


def dng_exchange(
    role: int,
    channel: Any,
    share: np.ndarray,
    noise: np.ndarray,
    ring_bits: int,
    field_modulus: int | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Both servers' side of a dng release; returns (Y, counters) with
    Y = smod((A1 + z1) - (A2 - z2), 2^L) = S + z1 + z2, identical on both servers.

    Each server sends only its noisy share (H1: A1 + z1, H2: A2 - z2, mod 2^L) over the raw data
    link (``channel``: a garbled_core Channel with send/recv). A1 - A2 = S, so what each server
    learns beyond Y is S plus the OTHER server's noise alone: each noise must be full variance
    (SPEC section 5). The plan's ring holds |S| plus the tail of z1 + z2, so nothing wraps.
    H1 sends first and H2 receives first (no deadlock on large vectors). ``field_modulus``
    (verified inputs): field shares, A + B = S mod p, so H2 sends B + z2 and Y is read mod p
    (p > 2^L: nothing wraps either).
    """
    if field_modulus is not None:
        return _dng_field_exchange(role, channel, share, noise, field_modulus)
    mask = ring_mask(ring_bits)
    mine = with_own_noise(role, share, noise, ring_bits)
    theirs = opened_share_exchange(role, channel, mine)
    if np.any(theirs & ~mask):
        raise PeerMismatchError("the other server's noisy share is outside the ring")
    a, b = (mine, theirs) if role == pb.SERVER_ROLE_H1 else (theirs, mine)
    nbytes = 8 * len(share)
    return reconstruct(a, b, ring_bits), {"sent": nbytes, "received": nbytes}


def opened_share_exchange(role: int, channel: Any, mine: np.ndarray) -> np.ndarray:
    """The opening of dng and preprocessed: this server's noisy share out, the other's in.
    Whatever a deviating server sends here only shifts the release (docs/PRIVACY.md, "The
    online opening of mode preprocessed"); the tests stand one in place of this call. H1 sends
    first, H2 receives first (no deadlock on large vectors)."""
    nbytes = 8 * len(mine)
    payload = mine.astype("<u8").tobytes()
    if role == pb.SERVER_ROLE_H1:
        channel.send(payload)
        channel.flush()
        return np.frombuffer(channel.recv(nbytes), dtype="<u8").astype(np.uint64)
    theirs = np.frombuffer(channel.recv(nbytes), dtype="<u8").astype(np.uint64)
    channel.send(payload)
    channel.flush()
    return theirs


def _dng_field_exchange(
    role: int, channel: Any, share: np.ndarray, noise: np.ndarray, p: int
) -> tuple[np.ndarray, dict[str, Any]]:
    mine = with_own_noise(role, share, noise, 0, p)
    theirs = opened_share_exchange(role, channel, mine)
    if theirs.size and int(theirs.max()) >= p:
        raise PeerMismatchError("the other server's noisy share is outside the field")
    y = mine + theirs
    y = np.where(y >= np.uint64(p), y - np.uint64(p), y).astype(np.int64)
    y = np.where(y > p // 2, y - np.int64(p), y)  # the centered representative
    nbytes = 8 * len(share)
    return y, {"sent": nbytes, "received": nbytes}


def compute_round(
    state: ServerState,
    link: Any,
    t: int,
    entry: int,
    seed: bytes | None,
    pool_slice: PoolSlice | None = None,
) -> bytes:
    """This server's half of the circuit on its restricted sum (dng: noise and exchange;
    preprocessed: the pool's noise shares ``pool_slice`` and the exchange), then the Adam step.
    ``entry``: the ledger index of this release, recorded and co-signed by both servers before
    (write-ahead: :meth:`H1Driver.record_cosigned`, the Peer service's AgreeProviders or
    CosignRelease).

    Returns the SHA-256 of the pending model version t+1. When the engine catches the peer
    deviating (garbled_core.PeerDeviated) nothing of the round is released: the abort is
    recorded and PeerDeviatedError raised (servers.deviation).
    """
    fault_point("after-ledger", t)
    arm_cheat(link, t)
    try:
        y, info, seconds = _release(state, link, t, entry, seed, pool_slice)
    except garbled_core.PeerDeviated as exc:
        raise abort_round(state, link, t, exc) from exc
    return _after_reveal(state, t, entry, y, info, seconds, pool_slice)


def _stage_faults(t: int) -> None:
    """After each stage of round t's circuit: the crash and the caught-deviation fault
    points (servers.faults)."""
    fault_point("during-circuit", t)
    fault_point("peer-deviated", t)


def seed_binding(state: ServerState, t: int) -> SeedBinding | None:
    """Round t's seed proofs under security: malicious (spgc.privacy.seed_proof): this
    server's role and the commitment the peer sent with the release; None otherwise."""
    if state.plan.cfg.security != "malicious":
        return None
    peer = pb.SERVER_ROLE_H2 if state.role == pb.SERVER_ROLE_H1 else pb.SERVER_ROLE_H1
    record = state.history.get(t)
    name = "h2" if peer == pb.SERVER_ROLE_H2 else "h1"
    theirs = None if record is None else record.seed_commitments.get(name)
    if theirs is None:  # the co-signed release carries both: no round gets here without them
        raise RuntimeError(f"round {t}: no seed commitment of the peer recorded for its proof")
    return SeedBinding(state.run_id, t, state.role, peer, theirs)


def _release(
    state: ServerState,
    link: Any,
    t: int,
    entry: int,
    seed: bytes | None,
    pool_slice: PoolSlice | None,
) -> tuple[np.ndarray, dict[str, Any], dict[str, float]]:
    """This server's side of round t's release in its mode: (Y, counters, seconds)."""
    plan = state.plan
    total = state.intake.total()
    field_modulus = None if plan.norm_proof is None else plan.norm_proof.p
    start = time.perf_counter()
    if plan.cfg.mode == "preprocessed":
        if pool_slice is None or state.pool is None:
            raise RuntimeError(f"round {t}: no noise-pool entries named for a preprocessed round")
        noise = state.pool.take(pool_slice, t).view(np.int64)  # the cursor moves on disk first
        own = draw_own_noise(plan.share_dim, plan.floor_sigma_units_for(entry))
        if own is not None:  # the noise floor: this server's own noise in its opened share
            noise = noise + own  # the pool share is < 2^62: no overflow
        seconds = {"pool": time.perf_counter() - start}
        start = time.perf_counter()
        # Its own connection: noise production may be running on the lanes meanwhile.
        channel = link.exchange_channel or link.channel
        y, info = dng_exchange(state.role, channel, total, noise, plan.ring_bits, field_modulus)
        seconds["exchange"] = time.perf_counter() - start
        del noise, own
    elif plan.cfg.mode == "dng":
        noise = sample_discrete_gaussian(plan.share_dim, plan.sigma_units_for(entry))
        seconds = {"noise": time.perf_counter() - start}
        start = time.perf_counter()
        y, info = dng_exchange(
            state.role, link.channel, total, noise, plan.ring_bits, field_modulus
        )
        seconds["exchange"] = time.perf_counter() - start
        del noise  # never needed again
    elif plan.cfg.mode == "spgc":
        own = draw_own_noise(plan.share_dim, plan.floor_sigma_units_for(entry))
        y, info = spgc_release(
            state.role,
            link,
            total,
            swapped_seed(seed, t),  # type: ignore[arg-type]  (the seed, unless a test cheats)
            own,
            joint_sigma_units=plan.joint_sigma_units_for(entry),
            ring_bits=plan.ring_bits,
            field_modulus=field_modulus,
            on_stage=lambda: _stage_faults(t),
            circuit=run_aggregate,  # this module's name: the tap on every reveal in the tests
            seed_binding=seed_binding(state, t),
        )
        del own
        seconds = {"circuit": time.perf_counter() - start}
    else:
        y, info = run_aggregate(
            GC_ROLE[state.role],
            link,
            total,
            seed,
            None,
            plan.ring_bits,
            plan.cfg.mode,
            on_stage=lambda: _stage_faults(t),
            field_modulus=field_modulus,
        )
        seconds = {"circuit": time.perf_counter() - start}
    return y, info, seconds


def _after_reveal(
    state: ServerState,
    t: int,
    entry: int | None,
    y: np.ndarray,
    info: dict,
    seconds: dict,
    pool_slice: PoolSlice | None = None,
) -> bytes:
    """What follows every reveal: the released line of its ledger entry, the Adam step."""
    pool = None if pool_slice is None else (pool_slice.block_index, pool_slice.offset)
    tap_reveal(state.plan.cfg.role_name, t, y, pool)
    fault_point("after-reveal", t)
    if entry is not None:
        state.record_released(entry, t, y)
    sha = state.apply_update(t, y, info, seconds, release=entry)
    fault_point("after-update", t)
    return sha


def log_round(state: ServerState, rec: RoundRecord) -> None:
    """The one log line per round; then the checkpoint a restart continues from; then the
    round's observers (metrics)."""
    try:
        _log_round(state, rec)
    finally:
        start = time.perf_counter()
        state.save_checkpoint()
        rec.seconds["checkpoint"] = time.perf_counter() - start
    state.observe_round(rec)


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
        tested = state.evaluator(state.params)
        rec.test_loss, rec.test_accuracy = tested["test_loss"], tested.get("test_accuracy")
        rec.test_metrics = {k: v for k, v in tested.items() if k in REGRESSION_METRICS}
        metrics = _test_line(tested)
    if rec.clip_norm and rec.noisy_count is not None:  # adaptive clipping
        metrics += (
            f"clip {rec.clip_norm:.4g} (noisy unclipped count {rec.noisy_count:.1f}, next "
            f"{state.clip_norm:.4g}), "
        )
    log.info(
        "%s round %d -> model v%d: providers received %d used %d, noise std %.4g units "
        "(total %.4g), "
        "%s%s, server-to-server bytes %d (counted on the link), seconds: intake %.2f, "
        "%s%s %.3f, update %.3f",
        state.plan.cfg.role_name,
        rec.round,
        state.version,
        len(rec.received),
        len(rec.agreed),
        state.plan.sigma_units,
        state.plan.total_noise_std_units,
        metrics,
        _privacy(state),
        rec.gc_bytes,
        s.get("intake", 0.0),
        # dng samples its noise, preprocessed waits for (only when its pool is empty) and reads
        # its pool, before the exchange
        "".join(
            f"{k.replace('_', ' ')} {s[k]:.3f}, "
            for k in ("noise", "noise_wait", "pool", "decode")
            if k in s
        ),
        "circuit" if "circuit" in s else "exchange",
        s.get("circuit", s.get("exchange", 0.0)),
        s.get("update", 0.0),
    )


def _test_line(tested: dict[str, float]) -> str:
    """The round line's test metrics: loss and accuracy, or for regression MSE, MAE and R^2."""
    if "test_r2" in tested:
        return (
            f"test loss {tested['test_loss']:.4f} mse {tested['test_mse']:.4f} "
            f"mae {tested['test_mae']:.4f} r2 {tested['test_r2']:.4f}, "
        )
    return f"test loss {tested['test_loss']:.4f} accuracy {tested['test_accuracy']:.4f}, "


def _privacy(state: ServerState) -> str:
    """What the round line says of privacy: epsilon and delta spent, or that there is none."""
    if not state.differentially_private:
        return f"NOT differentially private (mode {state.plan.cfg.mode} adds no noise)"
    return f"eps={_eps(state.epsilon())} (delta={state.reported_delta():.6g})"


def _eps(eps: float) -> str:
    return "inf (no noise)" if math.isinf(eps) else f"{eps:.4f}"


#: At most this many seconds between H1's calls to H2 while the first round waits for
#: providers (H2 stops after peer_timeout without a call from H1).
WAITING_CALL_INTERVAL = 10.0
#: How often the first-round wait says how many providers are there.
WAITING_LOG_INTERVAL = 15.0


def wait_for_providers(
    state: ServerState, stop: threading.Event, still_waiting: Callable[[], None] | None = None
) -> None:
    """Before the run's first round: until min_providers providers have called this server,
    for at most first_round_wait seconds (then the round opens anyway and, short of shares,
    is skipped). Providers started a little after the servers then miss no round.
    ``still_waiting()`` is called every few seconds meanwhile (H1: tells H2 it is alive).
    Ends at once when the wait is hopeless: every provider of the plan called and too few
    remain less those that declined the plan (ServerState.too_few_accepted)."""
    cfg = state.plan.cfg
    if cfg.first_round_wait <= 0:
        return
    start = told = called = time.monotonic()
    interval = min(WAITING_CALL_INTERVAL, cfg.peer_timeout / 4)
    first = True
    while not stop.is_set():
        if state.too_few_accepted():
            return
        present = state.providers_present()
        if len(present) >= cfg.min_providers:
            if not first:
                log.info(
                    "%s: round 0 opens: %d provider(s) connected (%s)",
                    cfg.role_name,
                    len(present),
                    ", ".join(present),
                )
            return
        now = time.monotonic()
        if now - start >= cfg.first_round_wait:
            log.warning(
                "%s: round 0 opens with %d of min_providers=%d provider(s) connected after "
                "%g s (first_round_wait)%s",
                cfg.role_name,
                len(present),
                cfg.min_providers,
                cfg.first_round_wait,
                f": {', '.join(present)}" if present else "",
            )
            return
        if first or now - told >= WAITING_LOG_INTERVAL:
            log.info(
                "%s: round 0 opens once min_providers=%d providers have connected: %d so far%s; "
                "it opens anyway in %.0f s (first_round_wait)",
                cfg.role_name,
                cfg.min_providers,
                len(present),
                f" ({', '.join(present)})" if present else "",
                cfg.first_round_wait - (now - start),
            )
            told, first = now, False
        if still_waiting is not None and now - called >= interval:
            still_waiting()
            called = now
        with state.cond:
            state.cond.wait(0.5)


def end_run_for_want_of_providers(state: ServerState, reason: str) -> None:
    """The run fails instead of opening its next round, for want of providers that accept the
    plan (``reason``): audited as ``providers_declined``; the daemon then stops, saying why in
    one line, and providers' long polls answer FINISHED with it."""
    state.audit.record("providers_declined", round=state.round, reason=reason)
    state.fail(f"round {state.round} cannot open: {reason}")


class _RoundLoop:
    """Runs rounds until training is finished or the daemon stops."""

    state: ServerState
    stop: threading.Event

    def run(self) -> None:
        """Rounds until finished or stopped; raises on a disagreement or a broken peer. The
        run's first round waits for its providers first (first_round_wait)."""
        while not self.stop.is_set() and not self.state.finished:
            if self.state.round == 0:
                wait_for_providers(self.state, self.stop, self.still_waiting)
                if self.stop.is_set():
                    return
            # Checked at every round: providers that declined while round 0 was open (they
            # said Hello first) end the run at the next one, instead of skipping every round.
            if hopeless := self.state.too_few_accepted():
                self.end_for_want_of_providers(hopeless)
                return
            self.run_round(self.state.round)

    def run_round(self, t: int) -> None:
        raise NotImplementedError

    def still_waiting(self) -> None:
        """Called every few seconds while the first round waits for providers."""

    def end_for_want_of_providers(self, reason: str) -> None:
        """No round can have min_providers providers (``reason`` names those that declined
        the plan and why): the run fails now, audited, instead of waiting out
        first_round_wait and then skipping every round (the daemon logs the failure)."""
        end_run_for_want_of_providers(self.state, reason)


def seed_commitment_message(run_id: str, t: int, role: int, commitment: bytes) -> Any:
    """A server's seed commitment of round t as it rides with its release statement."""
    return peer_pb2.SeedCommitment(
        run_id=run_id, round=t, role=role, scheme=SEED_COMMITMENT_SCHEME, commitment=commitment
    )


def checked_seed_commitment(msg: peer_pb2.ReleaseStatement, t: int) -> bytes:
    """The other server's 32-byte seed commitment of round t from its release statement
    (PeerMismatchError when it is missing, of another round or scheme, or not 32 bytes)."""
    return checked_peer_commitment(
        msg, t, SEED_COMMITMENT_SCHEME, "for this round with the release statement"
    )


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
        # The round H2 opened answering our last CheckModel (no ROUND_OPEN call for it), and
        # the one we opened ourselves as the last round was published.
        self.peer_opened: int | None = None
        self.opened: int | None = None

    def run(self) -> None:
        """The rounds (:meth:`_run_rounds`); when this server caught H2 deviating and aborted
        the run, H2 is told at once (BARRIER_ABORTED with the abort's line) instead of finding
        the link closed and waiting peer_timeout."""
        try:
            self._run_rounds()
        finally:  # raised here (a round's circuit), or the production thread's, which stops
            if self.state.aborted is not None:  # the rounds without raising
                self.tell_peer_of_abort(self.state.aborted)

    def tell_peer_of_abort(self, aborted: str) -> None:
        """Best effort: H2 gone as well stops on its own."""
        try:
            self._barrier(
                self.state.round,
                peer_pb2.BARRIER_ABORTED,
                ended_reason=peer_notice(self.state.plan.cfg.role_name, aborted),
            )
        except grpc.RpcError as exc:
            log.warning("h1: could not tell h2 of the abort: %s", describe_error(exc))

    def _run_rounds(self) -> None:
        """Preprocessed: reconcile the pools and fill them before round 0 (the offline phase),
        then the rounds with production in its own thread beside them; a pool failure ends
        H2's run too."""
        if self.producer is None:
            super().run()
            return
        ended = False
        try:
            self.producer.sync()
            if not self.state.finished and self.state.plan.cfg.pool_produce:
                self.producer.fill(self.producer.training_target, progress=True)
                self.producer.start()
            super().run()
            ended = not self.stop.is_set()
        except PoolError as exc:
            self.producer.halt(interrupt=True)
            try:
                self.producer.end_peer(str(exc))
            except grpc.RpcError as rpc_exc:  # H2 gone as well: it stops on its own
                log.warning("could not tell h2 to stop: %s", rpc_exc)
            raise
        finally:
            # Training over: after the block in progress; a lost pairing or a failure: now.
            self.producer.halt(interrupt=not ended)

    def _barrier(
        self,
        t: int,
        barrier: int,
        timeout: float = RPC_SLACK,
        verify_coin: bytes = b"",
        ended_reason: str = "",
    ) -> peer_pb2.BarrierState:
        msg = peer_pb2.BarrierState(
            run_id=self.state.run_id,
            round=t,
            barrier=barrier,
            role=pb.SERVER_ROLE_H1,
            verify_coin=verify_coin,
            ended_reason=ended_reason,
        )
        msg.reached_at.GetCurrentTime()
        return self.peer.RoundBarrier(msg, timeout=timeout)

    def run_round(self, t: int) -> None:
        state, cfg = self.state, self.state.plan.cfg
        if self.opened != t:  # else opened as round t-1 was published, before its checkpoint
            state.open_round(t)
        norm = state.plan.norm_proof
        if self.peer_opened != t:  # else H2 opened t answering the last round's CheckModel
            self._barrier(t, peer_pb2.BARRIER_ROUND_OPEN)
        self.opened = self.peer_opened = None
        state.wait_intake_done(t, self.stop)
        if self.stop.is_set():
            return
        received = state.close_intake(t)
        coin = b""
        if norm is not None:
            # The norm-proof coin, drawn now that our intake is closed: every prover value it
            # constrains is fixed here (H2's share by its seed's hash; servers.norm_checks).
            coin = os.urandom(COIN_BYTES)
            state.history[t].verify_coin = round_coin(state.run_id, t, coin)

        ids = [state.history[t].vector_ids.get(name, b"") for name in received]
        seed = os.urandom(32) if cfg.mode == "spgc" else None
        # The release statement rides with the set (it does not depend on P_t), with the pool
        # entries when the pool holds them now: a short pool waits only once P_t is agreed.
        pool_slice, release = None, None
        if self.producer is None or state.pool.available >= state.plan.dim:
            pool_slice = None if self.producer is None else self.producer.slice_for_round(t)
            release = self.release_message(t, seed, pool_slice)
        mine = peer_pb2.ProviderSet(
            run_id=state.run_id,
            round=t,
            role=pb.SERVER_ROLE_H1,
            providers=received,
            digest=provider_set_digest(received),
            min_providers=cfg.min_providers,
            vector_ids=ids,
            verify_coin=coin,
            release=release,
        )
        # The intake barrier too: H2 waits for its own intake to close. In pages (any size);
        # the first, with the coin, goes out before our verifier messages are computed, so
        # that H2 computes its own meanwhile.
        wait = cfg.round_deadline + RPC_SLACK
        late = None
        if norm is not None:
            late = (
                lambda: own_verifier_messages(state, t, received),
                verifier_message_bytes(norm),
            )
        answer = agree_providers(self.peer, mine, timeout=wait, late_verifiers=late)
        proofs = list(mine.norm_verifiers)
        agreed, digest, proceed, mismatched, refused = agreement_with_proofs(
            state,
            (received, ids, proofs),
            (
                list(answer.callee.providers),
                list(answer.callee.vector_ids),
                list(answer.callee.norm_verifiers),
            ),
        )
        if digest != answer.agreed_digest or proceed != answer.proceed:
            raise PeerMismatchError(f"round {t}: H2 computed another provider set")
        reason = f"{len(agreed)} provider(s) in both servers < min_providers={cfg.min_providers}"
        state.set_agreed(t, agreed, proceed, reason, mismatched, refused)
        if not proceed:
            log_round(state, state.history[t])
            return  # nothing recorded: H2 dropped our statement with the round

        if release is not None and answer.callee.HasField("release"):
            entry = self.record_cosigned(t, release, answer.callee.release)
        else:  # no pool entries were ready: they come with a call of their own
            if self.producer is not None:
                pool_slice = self.producer.slice_for_round(t)
            release = self.release_message(t, seed, pool_slice)
            answered = self.peer.CosignRelease(release, timeout=RPC_SLACK)
            entry = self.record_cosigned(t, release, answered)
        # H2's side of the release has started; ours starts now that our entry is written.
        try:
            sha = compute_round(state, self.link, t, entry, seed, pool_slice)
        except BaseException as exc:
            state.fail_compute(exc)
            raise
        finally:
            seed = None  # drop our reference: the seed is never needed again
        if self.producer is not None:
            self.producer.round_done()
        check = peer_pb2.ModelDigest(
            run_id=state.run_id,
            version=t + 1,
            role=pb.SERVER_ROLE_H1,
            num_parameters=state.plan.dim,
            sha256=sha,
        )
        # H2 checks our hash against its own, publishes v(t+1) and opens round t+1 when they
        # agree; we check its hash against ours before we publish.
        other = self.peer.CheckModel(check, timeout=RPC_SLACK)
        if other.sha256 != sha or other.version != t + 1:
            raise PeerMismatchError(
                f"model v{t + 1} differs between the servers: h1 {sha.hex()[:16]} "
                f"h2 {other.sha256.hex()[:16]}"
            )
        rec = state.publish(t)
        if not state.finished:
            self.peer_opened = t + 1
            if not self.stop.is_set() and not state.too_few_accepted():
                # Round t+1 opens here too now (H2 has opened it): its providers start while
                # we evaluate and checkpoint v(t+1), which round t+1 does not change.
                state.open_round(t + 1)
                self.opened = t + 1
        log_round(state, rec)

    def still_waiting(self) -> None:
        """H2 stops after peer_timeout without a call from H1: say H1 is alive, before round 0."""
        self._barrier(self.state.round, peer_pb2.BARRIER_WAITING_FOR_PROVIDERS)

    def end_for_want_of_providers(self, reason: str) -> None:
        """H2 ends the run too, with the same reason (best effort: a lost H2 stops anyway)."""
        try:
            self._barrier(
                self.state.round, peer_pb2.BARRIER_WAITING_FOR_PROVIDERS, ended_reason=reason
            )
        except grpc.RpcError as exc:
            log.warning(
                "h1: could not tell %s the run ends: %s",
                self.state.plan.cfg.peer_name,
                describe_error(exc),
            )
        super().end_for_want_of_providers(reason)

    def release_message(
        self, t: int, seed: bytes | None, pool_slice: PoolSlice | None
    ) -> peer_pb2.ReleaseStatement:
        """H1's half of round t's co-signed release (write-ahead): its statement of the release
        and signature, its commitment to ``seed`` (mode spgc) and the pool entries
        ``pool_slice`` (preprocessed). H2 checks them, writes its entry with our signature,
        starts its side of the release and answers with its own (:meth:`record_cosigned`)."""
        state = self.state
        statement, signature = state.release_statement(t)
        msg = peer_pb2.ReleaseStatement(
            run_id=state.run_id,
            round=t,
            role=pb.SERVER_ROLE_H1,
            statement=statement,
            signature=signature,
        )
        if seed is not None:
            mine = seed_commitment(state.run_id, t, pb.SERVER_ROLE_H1, seed)
            msg.seed.CopyFrom(seed_commitment_message(state.run_id, t, pb.SERVER_ROLE_H1, mine))
        if pool_slice is not None:
            msg.pool.CopyFrom(slice_message(pool_slice))
        return msg

    def record_cosigned(
        self, t: int, mine: peer_pb2.ReleaseStatement, answer: peer_pb2.ReleaseStatement
    ) -> int:
        """H2 co-signed ``mine`` (its entry is written and its side of the release started):
        our entry, with H2's signature, written before our side starts (without which H2's
        learns nothing). Returns our ledger index of the entry."""
        state = self.state
        if answer.statement != mine.statement or answer.round != t:
            raise PeerMismatchError(f"round {t}: H2 co-signed another release statement")
        if mine.HasField("seed"):
            theirs = checked_seed_commitment(answer, t)
            state.history[t].seed_commitments = {"h1": mine.seed.commitment, "h2": theirs}
        return state.record_release(t, peer_sig=answer.signature)


def compute_single(state: ServerState, t: int) -> bytes:
    """One-server modes: the intake's sum mod 2^L of the providers' clear vectors (plain: G_j;
    ldp: G_j + z_j, noised by each provider) read signed, then the Adam step."""
    start = time.perf_counter()
    # plain: the release is the clear sum; ldp: its noisy vectors were counted as they came.
    entry = state.record_release(t) if state.plan.cfg.mode != "ldp" else None
    fault_point("after-ledger", t)
    total = state.intake.total()
    y = reconstruct(total, np.zeros_like(total), state.plan.ring_bits)
    return _after_reveal(state, t, entry, y, {}, {"decode": time.perf_counter() - start})


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

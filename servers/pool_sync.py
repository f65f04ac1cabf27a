"""The noise pool between the two servers (mode preprocessed): each pool's state as a peer
message, reconciling the two pools after a restart, and H1's :class:`NoiseProducer`, which makes
blocks of noise shares with H2 over the data link's lanes and keeps the pool ahead of the
rounds from a thread of its own (the rounds' exchange has its own connection), in runs sized
by :class:`RunSizer`."""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
import time
from collections import deque
from typing import Any

import garbled_core
from spgc.common.progress import Progress
from spgc.privacy.noise import SEED_BYTES
from spgc.privacy.seed_proof import SeedBinding
from spgc.protocol.modes import DEFAULT_SECURITY
from spgc.servers.deviation import NOISE_PRODUCTION, abort_round
from spgc.servers.errors import PeerMismatchError
from spgc.servers.faults import fault_point, swapped_seed
from spgc.servers.noise_pool import (
    BLOCK_ID_BYTES,
    PoolBlock,
    PoolExhaustedError,
    PoolSlice,
    produce_noise_shares,
    reconcile,
)
from spgc.servers.seed_binding import checked_peer_commitment
from spgc.servers.state import RPC_SLACK, ServerState
from spgc.settings.backend_choice import (
    CALLS_PER_RUN,
    LinkFigures,
    amortised_run,
    cost_tables,
    production_costs,
)
from spgc.wire import POOL_SEED_COMMITMENT_SCHEME, peer_pb2, peer_pb2_grpc, pool_seed_commitment
from spgc.wire import aggregation_pb2 as pb

log = logging.getLogger(__name__)


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


#: The recent runs and round intervals the estimates are taken from.
RUN_HISTORY = 8
#: Round trips of a production run on a backend that does not count them (gc): about two per
#: sampler stage (the stage's run and its evaluator's OT); the two calls to H2 are
#: spgc.settings.backend_choice.CALLS_PER_RUN.
GC_TRIPS_PER_STAGE = 2


class RunSizer:
    """How big H1's next production run is, and how far ahead of the rounds it keeps the pool.

    A run of n samples is modelled as taking F + c n seconds: F its round trips (counted by the
    engine on gmw, each exchange half a round trip as both send at once; estimated from the
    sampler's stages on gc; plus the two calls to H2) at the round trip measured on the calls
    to H2, c the measured seconds per sample beyond them. A
    run makes at least the n whose F is at most RUN_OVERHEAD_SHARE of its time (capped by
    pool_block), and the pool is kept max(pool_rounds, ceil(run time / round interval) + 1)
    rounds ahead, the round interval measured as rounds take their noise: rounds then consume
    no more than a run refills while it runs. Never more than the rounds left need.
    """

    def __init__(
        self, dim: int, pool_rounds: int, pool_block: int, link: LinkFigures | None = None,
        backend: str = "gc", security: str = DEFAULT_SECURITY,
    ) -> None:  # fmt: skip
        """``link``: the link measured at pairing (backend: auto): until a run is measured,
        runs are sized from it and ``backend``'s production costs at ``security``
        (spgc.settings.backend_choice.cost_tables)."""
        self.dim = dim
        self.pool_rounds = pool_rounds
        self.pool_block = pool_block
        self.rtt: float | None = None  # the quickest call to H2 seen, in seconds
        # (F, c) from the link, before any run is measured
        self._prior = None if link is None else production_costs(backend, link, security)
        cost = cost_tables(security).production.get(backend)
        self._trip_share = 1.0 if cost is None else cost.trip_share
        self.runs: deque[tuple[int, float, float]] = deque(maxlen=RUN_HISTORY)
        self.intervals: deque[float] = deque(maxlen=RUN_HISTORY)
        self._last_round: float | None = None
        # the production thread and the round thread both observe and read
        self._lock = threading.Lock()

    def observe_call(self, seconds: float) -> None:
        """A call to H2 that does no work of note took ``seconds``: a round trip."""
        with self._lock:
            self.rtt = seconds if self.rtt is None else min(self.rtt, seconds)

    def observe_run(self, samples: int, seconds: float, round_trips: int) -> None:
        """A run of ``samples`` took ``seconds`` with ``round_trips`` of its circuit (each
        costing the backend's share of a round trip: gmw's exchanges send both ways at once,
        spgc.settings.backend_choice.GMW_EXCHANGE_SHARE) besides the CALLS_PER_RUN calls."""
        trips = round_trips * self._trip_share + CALLS_PER_RUN
        with self._lock:
            self.runs.append((samples, seconds, trips))

    def observe_round(self, now: float) -> None:
        """A round took its noise at monotonic time ``now``."""
        with self._lock:
            if self._last_round is not None:
                self.intervals.append(now - self._last_round)
            self._last_round = now

    def _interval(self) -> float | None:
        """The median round interval measured, or None before two rounds."""
        with self._lock:
            intervals = list(self.intervals)
        return statistics.median(intervals) if intervals else None

    def _costs(self) -> tuple[float, float] | None:
        """(F, c) of the recent runs (medians), or None before any run."""
        with self._lock:
            runs, rtt = list(self.runs), self.rtt or 0.0
        if not runs:
            return self._prior
        fixed = statistics.median(trips * rtt for _, _, trips in runs)
        per_sample = statistics.median(
            max(0.0, seconds - trips * rtt) / samples for samples, seconds, trips in runs
        )
        return fixed, per_sample

    def efficient_run(self) -> int:
        """The fewest samples whose run spends at most RUN_OVERHEAD_SHARE of its time on its
        round trips (pool_block at most; 0 before any run is measured)."""
        costs = self._costs()
        if costs is None:
            return 0
        return amortised_run(*costs, self.pool_block)

    def run_seconds(self, samples: int) -> float | None:
        """The expected seconds of a run of ``samples`` (None before any run is measured)."""
        costs = self._costs()
        return None if costs is None else costs[0] + costs[1] * samples

    def lead_rounds(self, samples: int, rounds_left: int) -> int:
        """Rounds of noise to keep ready while runs of ``samples`` are made: before any run
        is measured, pool_rounds; once one is but the rounds' pace is not yet (two rounds),
        every round left, so production goes on from round 0 (a run measured before round 0
        may take several rounds beside them, and waiting two rounds to learn their pace made
        a round wait for noise)."""
        seconds, interval = self.run_seconds(samples), self._interval()
        if seconds is None:
            return self.pool_rounds
        if interval is None:
            return max(self.pool_rounds, rounds_left)
        return max(self.pool_rounds, math.ceil(seconds / max(interval, 1e-3)) + 1)

    def next_run(self, available: int, rounds_left: int) -> int:
        """Samples the next run makes, given ``available`` unused ones and the rounds still to
        take noise; 0: none is needed now."""
        want = rounds_left * self.dim
        if available >= want:
            return 0
        efficient = self.efficient_run()
        low = min(want, self.lead_rounds(max(efficient, self.dim), rounds_left) * self.dim)
        if available >= low:
            return 0
        return max(1, min(max(efficient, low - available), self.pool_block, want - available))

    def summary(self) -> str:
        """The estimates, for the log."""
        costs = self._costs()
        if costs is None:
            return "no run measured yet"
        interval = self._interval()
        return (
            f"round trip {1000 * (self.rtt or 0):.1f} ms, run overhead {costs[0]:.2f} s + "
            f"{1e6 * costs[1]:.1f} us per sample"
            + ("" if interval is None else f", a round every {interval:.2f} s")
        )


class BlockSeed:
    """This server's fresh seed for one production run of the pool, and under ``security:
    malicious`` its commitment ("sha256-pool-v1", sent in NoiseBlock.seed) and, once the peer's
    has come, the binding both servers prove in the run (spgc.privacy.seed_proof)."""

    def __init__(self, state: ServerState, block: peer_pb2.PoolBlock) -> None:
        self.state, self.block = state, block
        self.seed = os.urandom(SEED_BYTES)
        self.proved = state.plan.cfg.security == "malicious"
        self.commitment = (
            pool_seed_commitment(
                state.run_id, block.index, bytes(block.block_id), state.role, self.seed
            )
            if self.proved
            else b""
        )
        self.binding: SeedBinding | None = None

    def message(self) -> peer_pb2.SeedCommitment | None:
        """The commitment as it rides in NoiseBlock.seed (None: seeds not proved)."""
        if not self.proved:
            return None
        return peer_pb2.SeedCommitment(
            run_id=self.state.run_id, round=self.block.index, role=self.state.role,
            scheme=POOL_SEED_COMMITMENT_SCHEME, commitment=self.commitment,
        )  # fmt: skip

    def bind(self, msg: peer_pb2.NoiseBlock) -> None:
        """Take the peer's commitment from its NoiseBlock (PeerMismatchError when it is missing
        or not of this block)."""
        if not self.proved:
            return
        peer_role = pb.SERVER_ROLE_H2 if self.state.role == pb.SERVER_ROLE_H1 else pb.SERVER_ROLE_H1
        theirs = checked_peer_commitment(
            msg, self.block.index, POOL_SEED_COMMITMENT_SCHEME,
            "for this block from the other server (security: malicious proves every production "
            "seed)", peer_role,
        )  # fmt: skip
        self.binding = SeedBinding(
            self.state.run_id, self.block.index, self.state.role, peer_role, theirs,
            bytes(self.block.block_id),
        )  # fmt: skip
        log.info(
            "noise block %d: seed commitments h%d %s..., h%d %s...",
            self.block.index, self.state.role, self.commitment.hex()[:16], peer_role,
            theirs.hex()[:16],
        )  # fmt: skip

    def commitments(self) -> dict[str, bytes] | None:
        """Both commitments by role, for the block's commit record (None: seeds not proved)."""
        b = self.binding
        if b is None:
            return None
        return {f"h{b.role}": self.commitment, f"h{b.peer_role}": b.peer_commitment}


def produce_pool_run(
    role: str, state: ServerState, link: Any, count: int, seed: BlockSeed
) -> tuple[Any, Any]:
    """This server's side (``role``) of one production run of ``count`` noise samples for its
    pool on ``link``, from its fresh block ``seed`` (proved against its commitment when the
    seed has a binding): (shares, info) of produce_noise_shares. A deviation its engine or the
    seed proof catches aborts the run (servers.deviation: nothing of the run is stored) and
    raises PeerDeviatedError."""
    pool = state.pool
    if seed.proved and seed.binding is None:
        raise ValueError("security: malicious proves every production seed: bind it first")
    try:
        made = produce_noise_shares(
            role, link, count, pool.sigma_units, pool.ring_bits,
            swapped_seed(seed.seed, state.round),  # the seed, unless a test cheats
            field_modulus=pool.field_modulus, seed_binding=seed.binding,
        )  # fmt: skip
        fault_point("pool-peer-deviated", state.round)
    except garbled_core.PeerDeviated as exc:
        raise abort_round(state, link, state.round, exc, NOISE_PRODUCTION) from exc
    return made


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
    of noise shares with H2 over the data link (before round 0, then in a thread beside the
    rounds: :meth:`start`), hand each round its samples, and end H2's `spgc server
    precompute`. A block that fails is never made again from the same seeds: production
    stops and the run fails at its next round that needs noise."""

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
        cfg = state.plan.cfg
        choice = state.backend_choice  # backend: auto: runs sized from the link until measured
        self.sizer = RunSizer(
            state.plan.dim, cfg.pool_rounds, cfg.pool_block,
            None if choice is None else choice.link, cfg.backend, cfg.security,
        )  # fmt: skip
        self.error: BaseException | None = None  # what stopped the production thread
        self._thread: threading.Thread | None = None
        self._halt = threading.Event()
        self._cond = threading.Condition()  # a block stored, a round served, a halt
        self._served_round = -1  # the last round that took its noise

    @property
    def target(self) -> int:
        """Samples H1 keeps ready: pool_rounds rounds' worth."""
        return self.state.plan.cfg.pool_rounds * self.state.plan.dim

    @property
    def training_target(self) -> int:
        """What a training run fills before round 0: pool_rounds rounds' worth, or pool_block
        samples where that is more (one run, whose round trips cost as much for a few samples
        as for many; production beside the rounds has measured nothing yet to size its
        first run by), but no more than the rounds the run has left (a run of 2 rounds makes
        2 rounds of noise, not 4; a round that fails and runs again is topped up like any
        other)."""
        cfg, d = self.state.plan.cfg, self.state.plan.dim
        left = max(1, cfg.rounds - self.state.round)
        return min(max(cfg.pool_rounds * d, cfg.pool_block), left * d)

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
        seed = BlockSeed(self.state, block)
        if seed.proved:
            msg.seed.CopyFrom(seed.message())
        start = time.perf_counter()
        answer = self.peer.ProduceNoise(msg, timeout=RPC_SLACK)
        self.sizer.observe_call(time.perf_counter() - start)
        seed.bind(answer)
        shares, info = produce_pool_run("garbler", self.state, self.link, count, seed)
        self.state.offline_bytes += info["sent"] + info["received"]
        msg.step = peer_pb2.NoiseBlock.STEP_FINISH
        msg.ClearField("seed")
        self.peer.ProduceNoise(msg, timeout=RPC_SLACK + cfg.pool_wait)
        self.pool.add_block(block.index, block.block_id, shares, seed.commitments())
        seconds = time.perf_counter() - start
        self.samples_made += count
        self.seconds += seconds
        trips = info.get("round_trips", GC_TRIPS_PER_STAGE * info.get("rounds", 1))
        self.sizer.observe_run(count, seconds, trips)
        with self._cond:
            self._cond.notify_all()

    def fill(
        self,
        target: int,
        deadline: float | None = None,
        progress: bool = False,
    ) -> bool:
        """Produce blocks until ``target`` unused samples are held, the monotonic ``deadline``
        passed, or the daemon stops; True if the target was reached."""
        cfg = self.state.plan.cfg
        # On a terminal a progress line; elsewhere the log lines below say the same.
        bar = Progress(target, "samples", desc="noise pool", lines=False) if progress else None
        try:
            while self.pool.available < target and not self.stop.is_set():
                if deadline is not None and time.monotonic() > deadline:
                    break
                # precompute and the fill before round 0: runs as large as pool_block allows
                self.produce_block(min(cfg.pool_block, target - self.pool.available))
                if bar is not None:
                    rate = self.samples_made / max(self.seconds, 1e-9)
                    bar.update(self.pool.available, samples_per_s=f"{rate:.0f}")
                    log.info(
                        "noise pool: %d / %d samples (%.0f samples/s)",
                        self.pool.available, target, rate,
                    )  # fmt: skip
        finally:
            if bar is not None:
                bar.close()
        return self.pool.available >= target

    # ------------------------------------------------------------ beside the rounds

    @property
    def rounds_left(self) -> int:
        """Rounds of this run that have yet to take their noise."""
        cfg, state = self.state.plan.cfg, self.state
        return max(0, cfg.rounds - state.round - (1 if self._served_round >= state.round else 0))

    def start(self) -> None:
        """Production in a thread of its own from now on, sized by :attr:`sizer`."""
        self._thread = threading.Thread(
            target=self._produce_beside_rounds, name="spgc-h1-noise", daemon=True
        )
        self._thread.start()

    def _produce_beside_rounds(self) -> None:
        try:
            while not self._halt.is_set() and not self.stop.is_set():
                count = self.sizer.next_run(self.pool.available, self.rounds_left)
                if count == 0:
                    with self._cond:  # until a round takes noise, or the halt
                        self._cond.wait(1.0)
                    continue
                log.info(
                    "noise pool: producing %d samples beside the rounds (%d held; %s)",
                    count, self.pool.available, self.sizer.summary(),
                )  # fmt: skip
                self.produce_block(count)
        except BaseException as exc:  # the round that next needs noise raises it
            self.error = exc
            if not (self._halt.is_set() or self.stop.is_set()):
                log.error("noise pool: production stopped: %s", exc)
        finally:
            with self._cond:
                self._cond.notify_all()

    def halt(self, interrupt: bool = False) -> None:
        """Stop production and wait for its thread: after the block in progress, or at once
        with ``interrupt`` (the data link's lanes fail now: the pairing is over anyway)."""
        self._halt.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread is None:
            return
        if interrupt:
            for lane in self.link.lanes():
                lane.interrupt()
        self._thread.join()

    def check(self) -> None:
        """Raise what stopped production, if it stopped (a round must not wait for it)."""
        if self.error is not None:
            raise self.error

    def round_done(self) -> None:
        """A round used its noise: production may top the pool up."""
        with self._cond:
            self._cond.notify_all()

    def slice_for_round(self, t: int) -> PoolSlice:
        """The next d samples for round t. With production running beside the rounds, the
        round waits only when the pool holds fewer than d (logged, and timed as the round's
        ``noise_wait``), up to pool_wait seconds; then it fails (PoolExhaustedError): a
        round never goes ahead with less noise."""
        cfg, d = self.state.plan.cfg, self.state.plan.dim
        self.sizer.observe_round(time.monotonic())
        self.check()
        if self.pool.available < d and self._thread is not None:
            self._wait_for_noise(t, d)
        elif self.pool.available < d and cfg.pool_produce:
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
        piece = self.pool.position(d)
        self._served_round = t  # production counts the rounds after this one from now on
        return piece

    def _wait_for_noise(self, t: int, d: int) -> None:
        cfg = self.state.plan.cfg
        log.warning(
            "round %d waits for noise: the pool holds %d of the %d samples it needs; "
            "production is running (%s; waiting up to pool_wait %g s)",
            t, self.pool.available, d, self.sizer.summary(), cfg.pool_wait,
        )  # fmt: skip
        with self._cond:  # the production thread was told: rounds_left counts this round
            self._cond.notify_all()
        start = time.monotonic()
        thread = self._thread
        assert thread is not None
        with self._cond:
            self._cond.wait_for(
                lambda: self.pool.available >= d or not thread.is_alive() or self.stop.is_set(),
                cfg.pool_wait,
            )
        waited = time.monotonic() - start
        with self.state.cond:
            self.state.history[t].seconds["noise_wait"] = waited
        self.check()
        if self.pool.available >= d:
            log.info("round %d: noise ready after waiting %.2f s", t, waited)

    def end_peer(self, reason: str = "") -> None:
        """Tell H2 the run is over: precompute finished (no reason) or training cannot go on."""
        msg = peer_pb2.NoiseBlock(
            run_id=self.state.run_id,
            role=pb.SERVER_ROLE_H1,
            step=peer_pb2.NoiseBlock.STEP_DONE,
            reason=reason,
        )
        self.peer.ProduceNoise(msg, timeout=RPC_SLACK)

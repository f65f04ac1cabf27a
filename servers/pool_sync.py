"""The noise pool between the two servers (mode preprocessed): each pool's state as a peer
message, reconciling the two pools after a restart, and H1's :class:`NoiseProducer`, which makes
blocks of noise shares with H2 over the data link and keeps the pool topped up."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

from spgc.progress import Progress
from spgc.servers.errors import PeerMismatchError
from spgc.servers.noise_pool import (
    BLOCK_ID_BYTES,
    PoolBlock,
    PoolExhaustedError,
    PoolSlice,
    produce_noise_shares,
    reconcile,
)
from spgc.servers.state import RPC_SLACK, ServerState
from spgc.wire import aggregation_pb2 as pb
from spgc.wire import peer_pb2, peer_pb2_grpc

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

    @property
    def training_target(self) -> int:
        """What a training run keeps ready: pool_rounds rounds' worth, but no more than the
        rounds the run has left (a run of 2 rounds makes 2 rounds of noise, not 4; a round
        that fails and runs again is topped up like any other)."""
        cfg = self.state.plan.cfg
        left = max(1, cfg.rounds - self.state.round)
        return min(cfg.pool_rounds, left) * self.state.plan.dim

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
            "garbler", self.link, count, self.pool.sigma_units, self.pool.ring_bits,
            os.urandom(32), field_modulus=self.pool.field_modulus,
        )  # fmt: skip
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
        # On a terminal a progress line; elsewhere the log lines below say the same.
        bar = Progress(target, "samples", desc="noise pool", lines=False) if progress else None
        try:
            while self.pool.available < target and not self.stop.is_set():
                if (until is not None and until()) or (
                    deadline is not None and time.monotonic() > deadline
                ):
                    break
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

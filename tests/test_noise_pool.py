"""Preprocessed noise: shares from the circuit add up to the sampler's noise; the pool on disk
hands every sample out once, across restarts; reconciliation after a crash; exhaustion."""

from __future__ import annotations

import json
import os
import stat

import numpy as np
import pytest
from helpers import Background

from spgc.noise import noise_bound_units, sample_noise_plain
from spgc.servers.gc_party import PartyLink
from spgc.servers.noise_pool import (
    NoisePool,
    PoolBlock,
    PoolError,
    PoolExhaustedError,
    PoolSlice,
    noise_share_circuit,
    produce_noise_shares,
    reconcile,
)


def links(two_party):
    tp = two_party(chunk=512)
    return (
        PartyLink("garbler", tp.garbler_channel, tp.garbler),
        PartyLink("evaluator", tp.evaluator_channel, tp.evaluator),
    )


def produce_both(lg, le, n, sigma, ring_bits, s1, s2):
    side = Background(lambda: produce_noise_shares("garbler", lg, n, sigma, ring_bits, s1))
    u, info_e = produce_noise_shares("evaluator", le, n, sigma, ring_bits, s2)
    neg_r, info_g = side.result()
    return neg_r, u, info_g, info_e


def signed(values: np.ndarray, ring_bits: int) -> np.ndarray:
    v = values.astype(object)
    half, full = 1 << (ring_bits - 1), 1 << ring_bits
    return np.array([x - full if x >= half else x for x in v.tolist()], dtype=object)


@pytest.mark.parametrize(("ring_bits", "sigma"), [(24, 50.0), (40, 65536.0), (64, 3000.0)])
def test_shares_add_up_to_the_plaintext_sampler_noise(two_party, ring_bits, sigma):
    n = 3000
    s1, s2 = os.urandom(32), os.urandom(32)
    neg_r, u, info_g, info_e = produce_both(*links(two_party), n, sigma, ring_bits, s1, s2)
    assert neg_r.dtype == np.uint64 and u.dtype == np.uint64
    mask = (1 << ring_bits) - 1
    total = (neg_r.astype(object) + u.astype(object)) & mask
    z = sample_noise_plain(s1, s2, n, sigma)
    assert signed(np.array(total.tolist(), dtype=np.uint64), ring_bits).tolist() == z.tolist()
    # each share alone looks uniform: H2's u is not the noise itself
    assert np.mean(np.abs(signed(u, ring_bits).astype(float))) > 1000 * sigma
    assert info_g["samples"] == n and info_g["rounds"] >= 1
    # H2 received the share circuit's tables and u's decoding only; bytes counted on both sides
    assert info_g["sent"] == info_e["received"] and info_e["sent"] == info_g["received"]


def test_share_circuit_cost_and_refusal():
    circuit = noise_share_circuit(32, 18)
    assert circuit.and_count == 31  # one L-bit adder
    with pytest.raises(ValueError, match="more than the ring"):
        noise_share_circuit(16, 18)


def test_noise_bound_is_a_hard_bound_on_the_sampler():
    bound = noise_bound_units(50.0)
    z = sample_noise_plain(os.urandom(32), os.urandom(32), 20000, 50.0)
    assert int(np.abs(z).max()) < bound
    assert bound >= 8 * 50  # no sample is cut below several sigma


def fill(pool: NoisePool, sizes, start=0):
    out = []
    for i in range(len(sizes)):
        vals = np.arange(start + sum(sizes[:i]), start + sum(sizes[: i + 1]), dtype=np.uint64)
        out.append(pool.add_block(pool.next_index, bytes([i + 1]) * 16, vals))
    return out


def test_pool_hands_out_each_sample_once_across_restarts(tmp_path):
    pool = NoisePool(tmp_path / "p", "h1", 50.0, 24)
    fill(pool, [5, 7, 4])
    assert pool.available == 16
    first = pool.take(pool.position(6), round_number=0)
    assert first.tolist() == list(range(6))
    # block 0 is used up: deleted
    assert not (tmp_path / "p" / "block-00000000.bin").exists()
    # restart: a new object on the same directory continues after the cursor
    again = NoisePool(tmp_path / "p", "h1", 50.0, 24)
    assert again.available == 10
    second = again.take(again.position(8), round_number=1)
    assert second.tolist() == list(range(6, 14))
    consumed = again.consumed()
    assert [(c["round"], c["block"], c["offset"], c["count"]) for c in consumed] == [
        (0, 0, 0, 5),
        (0, 1, 0, 1),
        (1, 1, 1, 6),
        (1, 2, 0, 2),
    ]
    # no sample twice: the consumed ranges are disjoint
    seen = set()
    for c in consumed:
        rng = {(c["block"], c["offset"] + k) for k in range(c["count"])}
        assert not rng & seen
        seen |= rng
    with pytest.raises(PoolExhaustedError, match="2 unused samples; 3 are needed"):
        again.position(3)


def test_pool_files_are_private_and_bound_to_parameters(tmp_path):
    pool = NoisePool(tmp_path / "p", "h2", 50.0, 24)
    fill(pool, [3])
    assert stat.S_IMODE((tmp_path / "p").stat().st_mode) == 0o700
    for path in (tmp_path / "p").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    with pytest.raises(PoolError, match=r"sigma_units=50\.0.*this run needs sigma_units=60\.0"):
        NoisePool(tmp_path / "p", "h2", 60.0, 24)
    with pytest.raises(PoolError, match="ring_bits"):
        NoisePool(tmp_path / "p", "h2", 50.0, 25)


def test_take_refuses_another_position_and_corruption(tmp_path):
    pool = NoisePool(tmp_path / "p", "h1", 50.0, 24)
    fill(pool, [4, 4])
    wrong = PoolSlice(1, bytes([2]) * 16, 0, 2)
    with pytest.raises(PoolError, match="positions differ"):
        pool.take(wrong, 0)
    assert pool.available == 8  # nothing consumed by a refused take
    data = tmp_path / "p" / "block-00000001.bin"
    data.write_bytes(b"\x01" * 32)
    fresh = NoisePool(tmp_path / "p", "h1", 50.0, 24)
    with pytest.raises(PoolError, match="corrupt"):
        fresh.take(fresh.position(6), 0)


def test_uncommitted_block_is_discarded_on_load(tmp_path):
    pool = NoisePool(tmp_path / "p", "h1", 50.0, 24)
    fill(pool, [4])
    (tmp_path / "p" / "block-00000001.bin").write_bytes(b"\0" * 16)  # crash before its .json
    again = NoisePool(tmp_path / "p", "h1", 50.0, 24)
    assert again.available == 4 and again.next_index == 1
    assert not (tmp_path / "p" / "block-00000001.bin").exists()


def test_reconcile_keeps_common_blocks_and_the_later_cursor():
    a, b, c = (PoolBlock(i, bytes([i]) * 16, 10) for i in range(3))
    orphan = PoolBlock(3, b"\x09" * 16, 10)
    h1 = ((0, 4), [a, b, c, orphan])  # H1 stored block 3, H2 crashed before storing it
    h2 = ((1, 2), [b, c])  # H2 used more before the crash
    assert reconcile(h1, h2) == reconcile(h2, h1) == ((1, 2), [b, c])
    # the cursor's block is gone on one side: the next common block, from its start
    assert reconcile(((1, 5), [c]), ((1, 2), [b, c])) == ((2, 0), [c])
    # nothing in common: empty pools, new blocks after every index either side used
    assert reconcile(((0, 0), [a]), ((0, 0), [orphan])) == ((4, 0), [])


def test_apply_reconciled_state(tmp_path):
    pool = NoisePool(tmp_path / "p", "h1", 50.0, 24)
    blocks = fill(pool, [4, 4, 4])
    pool.apply((1, 3), blocks[1:2])
    assert pool.available == 1
    assert pool.take(pool.position(1), 5).tolist() == [7]
    assert pool.next_index == 3  # block 2 was dropped, but its index is never reused
    assert json.loads((tmp_path / "p" / "cursor.json").read_text()) == {"block": 1, "offset": 4}
    with pytest.raises(PoolError, match="never moves back"):
        pool.apply((0, 0), [])

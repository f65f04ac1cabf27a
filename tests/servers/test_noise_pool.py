"""Preprocessed noise: shares from the circuit add up to the sampler's noise; the pool on disk
hands every sample out once, across restarts; reconciliation after a crash; exhaustion."""

from __future__ import annotations

import hashlib
import json
import os
import stat

import numpy as np
import pytest
from helpers import Background

from spgc.privacy import noise
from spgc.privacy.noise import noise_bound_units, sample_noise_plain
from spgc.servers import gc_party
from spgc.servers.gc_party import PartyLink
from spgc.servers.noise_pool import (
    CHUNK_SAMPLES,
    NoisePool,
    PoolBlock,
    PoolError,
    PoolExhaustedError,
    PoolSlice,
    produce_noise_shares,
    reconcile,
)
from spgc.servers.pool_sync import RunSizer
from spgc.servers.spgc_circuit import noise_share_circuit
from spgc.settings.backend_choice import GMW_EXCHANGE_SHARE


def links(two_party, backend="gc", security="semi-honest"):
    tp = two_party(chunk=512)
    if backend == "gmw":  # GMW parties on the pair's channels, as the data link opens them
        return (
            PartyLink.open("garbler", tp.garbler_channel, backend="gmw", security=security),
            PartyLink.open("evaluator", tp.evaluator_channel, backend="gmw", security=security),
        )
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


@pytest.mark.parametrize(("k", "backend"), [(2, "gc"), (3, "gc"), (3, "gmw")])
def test_a_block_split_over_lanes_is_the_same_block(two_party, monkeypatch, k, backend):
    """The data link's lanes each make a contiguous range of the block (in batches of
    RANGE_BATCH); noise is addressed by sample index, so the shares still add up to the whole
    block's plaintext noise. On gmw the sampler's spare trials are shared within groups of
    SPARE_GROUP samples (made small here), where lanes and batches split: the same block."""
    monkeypatch.setattr(gc_party, "RANGE_BATCH", 150)
    monkeypatch.setattr(gc_party, "SPARE_GROUP", 128)
    monkeypatch.setattr(noise, "SPARE_GROUP", 128)
    n, ring_bits, sigma = 1001, 32, 300.0
    pairs = [links(two_party, backend) for _ in range(k)]
    lg, le = pairs[0]
    lg.extra_lanes = [g for g, _ in pairs[1:]]
    le.extra_lanes = [e for _, e in pairs[1:]]
    s1, s2 = os.urandom(32), os.urandom(32)
    neg_r, u, info_g, info_e = produce_both(lg, le, n, sigma, ring_bits, s1, s2)
    total = (neg_r.astype(object) + u.astype(object)) & ((1 << ring_bits) - 1)
    z = sample_noise_plain(s1, s2, n, sigma, spares_every=noise.SPARES_EVERY[backend])
    assert signed(np.array(total.tolist(), dtype=np.uint64), ring_bits).tolist() == z.tolist()
    assert info_g["lanes"] == info_e["lanes"] == k
    # every lane carried its own range's tables
    for g, _ in pairs:
        assert g.counters()["tables"]["sent"] > 0
    assert info_g["sent"] == info_e["received"]


def test_malicious_production_makes_the_same_block(two_party):
    """security: malicious: the pool's noise made on authenticated GMW (every opening of the
    sampler and the share circuit MAC-checked) adds up to the plaintext sampler's noise."""
    n, ring_bits, sigma = 200, 32, 300.0
    lg, le = links(two_party, "gmw", "malicious")
    assert type(lg.session).__name__ == "AuthGmwParty"
    s1, s2 = os.urandom(32), os.urandom(32)
    neg_r, u, info_g, info_e = produce_both(lg, le, n, sigma, ring_bits, s1, s2)
    total = (neg_r.astype(object) + u.astype(object)) & ((1 << ring_bits) - 1)
    z = sample_noise_plain(s1, s2, n, sigma, spares_every=noise.SPARES_EVERY["gmw"])
    assert signed(np.array(total.tolist(), dtype=np.uint64), ring_bits).tolist() == z.tolist()
    assert info_g["sent"] == info_e["received"]


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


def test_a_pool_used_up_then_refilled_starts_at_the_new_block(tmp_path):
    """Production beside the rounds can find the pool used to the end of its last block
    (deleted): the next block's samples are handed out from its first, none skipped."""
    pool = NoisePool(tmp_path / "p", "h1", 50.0, 24)
    fill(pool, [5])
    assert pool.take(pool.position(5), round_number=0).tolist() == list(range(5))
    assert pool.available == 0 and pool.cursor == (0, 5)
    pool.add_block(1, bytes(16), np.arange(5, 9, dtype=np.uint64))
    assert pool.position(3).offset == 0
    assert pool.take(pool.position(3), round_number=1).tolist() == [5, 6, 7]
    assert [(c["block"], c["offset"], c["count"]) for c in pool.consumed()] == [
        (0, 0, 5),
        (1, 0, 3),
    ]
    # and a take that could not read every sample it names (the cursor left at the end of a
    # deleted block, as before the fix) fails before the cursor moves: never less noise
    pool.add_block(2, bytes(16), np.arange(9, 13, dtype=np.uint64))
    pool.take(pool.position(2), round_number=2)
    pool.cursor = (1, 4)
    with pytest.raises(PoolError, match="could read only 0 of the 2 samples"):
        pool.take(PoolSlice(2, bytes(16), 4, 2), round_number=3)
    assert pool.cursor == (1, 4)


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


# ------------------------------------------------------------------ used samples zeroed on disk

CHUNK = CHUNK_SAMPLES


def samples(path) -> np.ndarray:
    return np.frombuffer(path.read_bytes(), dtype="<u8").astype(np.uint64)


def chunk_sums(path) -> list[bytes]:
    raw = path.read_bytes()
    return [raw[i : i + 32] for i in range(0, len(raw), 32)]


def sha(values: np.ndarray) -> bytes:
    return hashlib.sha256(values.astype("<u8").tobytes()).digest()


def big_pool(tmp_path, sizes=(2500, 1500)):
    """Blocks of several chunks holding 1, 2, 3, ... (no share is zero, so zeros mean erased)."""
    pool = NoisePool(tmp_path / "p", "h1", 50.0, 24)
    fill(pool, list(sizes), start=1)
    return pool, tmp_path / "p"


def test_block_files_hold_per_chunk_hashes(tmp_path):
    pool, d = big_pool(tmp_path)
    meta = json.loads((d / "block-00000000.json").read_text())
    assert meta["chunk_samples"] == CHUNK and meta["count"] == 2500 and "sha256" not in meta
    values = np.arange(1, 2501, dtype=np.uint64)
    assert chunk_sums(d / "block-00000000.sums") == [
        sha(values[0:1024]),
        sha(values[1024:2048]),
        sha(values[2048:2500]),  # the last chunk is shorter
    ]
    assert len(chunk_sums(d / "block-00000001.sums")) == 2
    assert pool.available == 4000


def test_a_blocks_commit_record_keeps_both_seed_commitments(tmp_path):
    """security: malicious: the two proved seed commitments of the run that made a block stay
    in its commit record (for an audit), and the pool reopens with them."""
    pool = NoisePool(tmp_path / "p", "h1", 50.0, 24)
    commitments = {"h1": bytes(range(32)), "h2": bytes(range(32, 64))}
    pool.add_block(0, b"\x07" * 16, np.arange(1, 11, dtype=np.uint64), commitments)
    meta = json.loads((tmp_path / "p" / "block-00000000.json").read_text())
    assert meta["seed_commitments"] == {k: v.hex() for k, v in commitments.items()}
    assert NoisePool(tmp_path / "p", "h1", 50.0, 24).available == 10


def test_take_zeroes_the_used_samples_on_disk(tmp_path):
    pool, d = big_pool(tmp_path)
    original = samples(d / "block-00000000.bin").copy()
    # ends inside chunk 1 of block 0
    got = pool.take(pool.position(1500), 0)
    assert got.tolist() == list(range(1, 1501))
    on_disk = samples(d / "block-00000000.bin")
    assert not on_disk[:1500].any()  # every used sample overwritten
    np.testing.assert_array_equal(on_disk[1500:], original[1500:])  # the rest untouched
    sums = chunk_sums(d / "block-00000000.sums")
    assert sums[0] == bytes(32)  # wholly used: never checked again
    assert sums[1] == sha(on_disk[1024:2048])  # the cursor's chunk: hash of its zeroed prefix
    assert sums[2] == sha(original[2048:])
    # the next take continues with the original values, across the two blocks
    got = pool.take(pool.position(1200), 1)
    assert got.tolist() == list(range(1501, 2701))
    for suffix in ("bin", "sums", "json"):
        assert not (d / f"block-00000000.{suffix}").exists()
    block1 = samples(d / "block-00000001.bin")
    assert not block1[:200].any()
    assert block1[200:].tolist() == list(range(2701, 4001))
    # a take ending exactly on a chunk boundary: no partial chunk, the next one untouched
    got = pool.take(pool.position(CHUNK - 200), 2)
    assert got.tolist() == list(range(2701, 2701 + CHUNK - 200))
    block1 = samples(d / "block-00000001.bin")
    assert not block1[:CHUNK].any()
    assert chunk_sums(d / "block-00000001.sums") == [bytes(32), sha(block1[CHUNK:])]
    assert pool.take(pool.position(pool.available), 3).tolist() == list(range(3525, 4001))
    assert pool.available == 0 and not list(d.glob("block-*"))


def test_reopened_pool_verifies_and_reads_the_rest(tmp_path):
    pool, d = big_pool(tmp_path)
    pool.take(pool.position(1500), 0)
    again = NoisePool(d, "h1", 50.0, 24)
    assert again.available == 2500
    assert again.take(again.position(600), 1).tolist() == list(range(1501, 2101))
    on_disk = samples(d / "block-00000000.bin")
    assert not on_disk[:2100].any() and on_disk[2100:].tolist() == list(range(2101, 2501))
    third = NoisePool(d, "h1", 50.0, 24)
    assert third.take(third.position(1900), 2).tolist() == list(range(2101, 4001))
    assert third.available == 0
    assert [(c["block"], c["offset"], c["count"]) for c in third.consumed()] == [
        (0, 0, 1500),
        (0, 1500, 600),
        (0, 2100, 400),
        (1, 0, 1500),
    ]


@pytest.mark.parametrize("died", ["after the .sums write", "before the .sums write"])
def test_crash_before_zeroing_is_finished_at_load(tmp_path, died):
    pool, d = big_pool(tmp_path)
    bin0, sums0 = d / "block-00000000.bin", d / "block-00000000.sums"
    old_bin, old_sums = bin0.read_bytes(), sums0.read_bytes()
    pool.take(pool.position(1500), 0)
    # the process died with the cursor durable but the used samples still on disk
    with bin0.open("r+b") as f:
        f.write(old_bin[: 8 * 1500])
    if died == "before the .sums write":
        sums0.write_bytes(old_sums)
    assert samples(bin0)[:1500].any()
    again = NoisePool(d, "h1", 50.0, 24)
    on_disk = samples(bin0)
    assert not on_disk[:1500].any()  # finished at load, before any use
    assert on_disk[1500:].tolist() == list(range(1501, 2501))
    sums = chunk_sums(sums0)
    assert sums[0] == bytes(32) and sums[1] == sha(on_disk[1024:2048])
    assert again.available == 2500
    assert again.take(again.position(1100), 1).tolist() == list(range(1501, 2601))


def test_crash_before_a_used_block_is_deleted(tmp_path):
    pool, d = big_pool(tmp_path)
    old = {s: (d / f"block-00000000.{s}").read_bytes() for s in ("bin", "sums", "json")}
    pool.take(pool.position(2600), 0)
    # died after the cursor moved into block 1, before block 0 was deleted
    for suffix, data in old.items():
        (d / f"block-00000000.{suffix}").write_bytes(data)
    (d / "block-00000001.bin").write_bytes(
        np.arange(2501, 4001, dtype=np.uint64).astype("<u8").tobytes()
    )
    again = NoisePool(d, "h1", 50.0, 24)
    assert not list(d.glob("block-00000000.*"))
    assert not samples(d / "block-00000001.bin")[:100].any()
    assert again.take(again.position(1400), 1).tolist() == list(range(2601, 4001))


def test_flipped_byte_in_an_unused_sample_is_caught(tmp_path):
    pool, d = big_pool(tmp_path)
    pool.take(pool.position(1500), 0)
    bin0 = d / "block-00000000.bin"
    good = bin0.read_bytes()
    # (sample, its chunk): after the cursor's chunk, and in it (its used prefix is zeros)
    for sample, chunk in ((2100, 2), (1600, 1)):
        raw = bytearray(good)
        raw[8 * sample + 3] ^= 0x01
        bin0.write_bytes(bytes(raw))
        fresh = NoisePool(d, "h1", 50.0, 24)  # loads: only what it reads is checked
        with pytest.raises(
            PoolError, match=rf"0000\.bin is corrupt \(chunk {chunk} sha256 mismatch"
        ):
            fresh.take(fresh.position(700), 1)
        assert fresh.available == 2500  # nothing consumed by a refused take
    bin0.write_bytes(good)
    fresh = NoisePool(d, "h1", 50.0, 24)
    assert fresh.take(fresh.position(700), 1).tolist() == list(range(1501, 2201))


def test_corrupt_cursor_chunk_at_load_still_erases_the_used_samples(tmp_path):
    pool, d = big_pool(tmp_path)
    bin0 = d / "block-00000000.bin"
    old = bin0.read_bytes()
    pool.take(pool.position(1500), 0)
    raw = bytearray(old)  # the used samples back (a crash) and an unused one damaged
    raw[8 * 1700] ^= 0x01
    bin0.write_bytes(bytes(raw))
    with pytest.raises(PoolError, match=r"corrupt \(chunk 1 sha256 mismatch\)"):
        NoisePool(d, "h1", 50.0, 24)
    assert not samples(bin0)[:1500].any()


def test_apply_zeroes_the_samples_the_cursor_skips(tmp_path):
    pool, d = big_pool(tmp_path, (2500, 1500, 1000))
    blocks = pool.state()[1]
    pool.take(pool.position(100), 0)
    pool.apply((1, 1200), blocks[1:2])  # H2 had used more before a crash
    assert not list(d.glob("block-00000000.*")) and not list(d.glob("block-00000002.*"))
    block1 = samples(d / "block-00000001.bin")
    assert not block1[:1200].any() and block1[1200:].tolist() == list(range(3701, 4001))
    assert pool.take(pool.position(300), 5).tolist() == list(range(3701, 4001))


def test_uncommitted_or_half_deleted_files_are_removed_on_load(tmp_path):
    _, d = big_pool(tmp_path, (3,))
    (d / "block-00000001.sums").write_bytes(b"\1" * 32)  # crash before its .json
    (d / "block-00000002.bin").write_bytes(b"\7" * 16)
    again = NoisePool(d, "h1", 50.0, 24)
    assert sorted(p.name for p in d.glob("block-*")) == [
        "block-00000000.bin",
        "block-00000000.json",
        "block-00000000.sums",
    ]
    assert again.take(again.position(3), 0).tolist() == [1, 2, 3]


def test_a_pool_in_the_old_format_is_refused(tmp_path):
    d = tmp_path / "p"
    NoisePool(d, "h1", 50.0, 24)
    meta = json.loads((d / "pool.json").read_text())
    (d / "pool.json").write_text(json.dumps({**meta, "format": 1}))
    with pytest.raises(PoolError, match=r"file format 1.*remove that directory"):
        NoisePool(d, "h1", 50.0, 24)


def test_run_sizer_amortises_round_trips_and_keeps_a_lead_that_follows_the_rounds():
    # before any run is measured: pool_rounds rounds ahead, whatever is missing of them
    sizer = RunSizer(dim=62, pool_rounds=4, pool_block=131072)
    assert sizer.next_run(available=0, rounds_left=10) == 248
    assert sizer.next_run(available=0, rounds_left=2) == 124  # never more than the run needs
    assert sizer.next_run(available=248, rounds_left=10) == 0
    # gmw at 50 ms: a run is about its 50 round trips (2.6 s of 2.7 s): one run makes the
    # rest of the training's noise instead of 62 samples at a time
    sizer.observe_call(0.05)
    sizer.observe_run(248, 2.7, round_trips=50)
    # 2.6 s fixed is 10% of a run of 2.6 * 9 / (0.1 s / 248) samples
    assert sizer.efficient_run() == pytest.approx(58_032, abs=1)
    assert sizer.next_run(available=186, rounds_left=7) == 434 - 186
    # a run that outlasts rounds: the lead grows to the rounds one run takes, plus one
    sizer = RunSizer(dim=1000, pool_rounds=2, pool_block=10**6)
    sizer.observe_call(0.01)
    sizer.observe_run(10_000, 10.2, round_trips=18)  # 0.2 s fixed, 1 ms a sample
    assert sizer.efficient_run() == pytest.approx(1800, abs=1)
    # a run measured, the rounds' pace not yet: production goes on (every round left ahead)
    assert sizer.lead_rounds(1800, 100) == 100
    assert sizer.next_run(available=50_000, rounds_left=100) == 50_000  # what is missing
    for now in (0.0, 1.0, 2.0):
        sizer.observe_round(now)
    assert sizer.lead_rounds(1800, 100) == 3  # a run of 1800 takes 2.0 s, a round 1.0 s
    assert sizer.next_run(available=2500, rounds_left=100) == sizer.efficient_run()
    assert sizer.next_run(available=3000, rounds_left=100) == 0
    for now in (2.1, 2.2, 2.3, 2.4, 2.5, 2.6, 2.7, 2.8):
        sizer.observe_round(now)
    assert sizer.lead_rounds(1800, 100) == 21


def test_run_sizer_charges_gmws_exchanges_half_a_round_trip():
    # gmw's exchanges send both ways at once (GMW_EXCHANGE_SHARE): 100 of them at 50 ms are
    # 2.5 s, and the two calls to H2 a whole round trip each; gc's stages a whole one.
    gmw = RunSizer(dim=1000, pool_rounds=2, pool_block=10**6, backend="gmw")
    gc = RunSizer(dim=1000, pool_rounds=2, pool_block=10**6, backend="gc")
    for sizer in (gmw, gc):
        sizer.observe_call(0.05)
        sizer.observe_run(10_000, 12.6, round_trips=100)
    assert gmw.run_seconds(0) == pytest.approx((100 * GMW_EXCHANGE_SHARE + 2) * 0.05)
    assert gmw.run_seconds(10_000) == pytest.approx(12.6)
    assert gc.run_seconds(0) == pytest.approx(102 * 0.05)

"""Per-coordinate SPGC circuits and the server party: reconstruction, noise, refusals, bytes."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from helpers import Background

from garbled_core import DEFAULT_CHUNK, and_table_bytes
from garbled_core.discrete_gaussian import build_trial_circuit, derive_params
from spgc.privacy.noise import STREAM_ROUNDS, expand_seed, sample_noise_plain
from spgc.servers import gc_party, spgc_circuit
from spgc.servers.gc_party import PartyLink, aggregate_plain, run_aggregate


def shares_of(sums: list[int], ring_bits: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Additive shares in Z_2^L of signed sums: A1 = G + r, A2 = r (mod 2^L)."""
    rng = np.random.default_rng(seed)
    full = 1 << ring_bits
    r = [int(x) % full for x in rng.integers(0, 1 << 62, len(sums), dtype=np.int64)]
    r = [(x * 4 + int(rng.integers(0, 4))) % full for x in r]
    a1 = np.array([(g + q) % full for g, q in zip(sums, r, strict=True)], dtype=np.uint64)
    return a1, np.array(r, dtype=np.uint64)


def sums_for(ring_bits: int, n_random: int, seed: int) -> list[int]:
    lo, hi = -(1 << (ring_bits - 1)), (1 << (ring_bits - 1)) - 1
    edges = [lo, lo + 1, -1, 0, 1, hi - 1, hi]
    rng = np.random.default_rng(seed)
    rand = [lo + int(x) % (hi - lo + 1) for x in rng.integers(0, 1 << 62, n_random, dtype=np.int64)]
    return edges + rand


def both(two_party, chunk=512):
    tp = two_party(chunk=chunk)
    return (
        tp,
        PartyLink("garbler", tp.garbler_channel, tp.garbler),
        PartyLink("evaluator", tp.evaluator_channel, tp.evaluator),
    )


def run_both(lg, le, a1, a2, s1, s2, sigma, ring_bits, mode, **kw):
    side = Background(lambda: run_aggregate("garbler", lg, a1, s1, sigma, ring_bits, mode, **kw))
    ye, ce = run_aggregate("evaluator", le, a2, s2, sigma, ring_bits, mode, **kw)
    yg, cg = side.result()
    return yg, ye, cg, ce


@pytest.mark.parametrize("ring_bits", [2, 16, 32, 64])
def test_only_mpc_returns_exactly_s(two_party, ring_bits):
    sums = sums_for(ring_bits, 500, ring_bits)
    a1, a2 = shares_of(sums, ring_bits, ring_bits + 1)
    _, lg, le = both(two_party)
    yg, ye, cg, _ = run_both(lg, le, a1, a2, None, None, None, ring_bits, "only-mpc")
    assert ye.dtype == np.int64
    assert ye.tolist() == sums
    assert yg.tolist() == sums
    circuit = spgc_circuit.reconstruct_circuit(ring_bits)
    # one run of 500 instances (one chunk): the default scheme's table bytes exactly
    assert cg["phases"]["tables"]["sent"] == circuit.and_count * and_table_bytes(
        "threehalves", len(sums)
    )
    assert aggregate_plain(a1, a2, ring_bits, "only-mpc").tolist() == sums


@pytest.mark.parametrize(("ring_bits", "sigma"), [(16, 1000.0), (32, 65536.0), (64, 50.0)])
def test_spgc_returns_s_plus_the_plaintext_sampler_noise(two_party, ring_bits, sigma):
    sums = sums_for(ring_bits, 1500, ring_bits * 3)
    a1, a2 = shares_of(sums, ring_bits, ring_bits * 5)
    s1, s2 = os.urandom(32), os.urandom(32)
    _, lg, le = both(two_party)
    yg, ye, cg, ce = run_both(lg, le, a1, a2, s1, s2, sigma, ring_bits, "spgc")
    params = derive_params(sigma)
    width = max(ring_bits, params.noise_bits) + 1
    assert ye.dtype == (np.int64 if width <= 64 else object)
    assert yg.tolist() == ye.tolist()
    z = sample_noise_plain(s1, s2, len(sums), sigma)
    assert [int(y) - s for y, s in zip(ye.tolist(), sums, strict=True)] == z.tolist()
    assert np.abs(z).max() <= params.noise_bound
    assert 0.5 * sigma < np.std(z) < 1.5 * sigma
    # 24.625 bytes per AND gate (three-halves: 3 half-blocks and 5 bits, a gate's bits rounded
    # up to a byte per chunk): every round's trials plus one reconstruction per coordinate
    trial = build_trial_circuit(params)
    add = spgc_circuit.noisy_sum_circuit(ring_bits, params.noise_bits, width)
    and_instances = cg["trials"] * trial.and_count + len(sums) * add.and_count
    got = cg["phases"]["tables"]["sent"]
    assert got == ce["phases"]["tables"]["received"]
    # a gate's control bits are rounded up to a byte once per chunk of the engine's size
    chunks = cg["trials"] / DEFAULT_CHUNK + cg["rounds"]
    padding = trial.and_count * chunks + add.and_count * (len(sums) / DEFAULT_CHUNK + 1)
    assert 24.625 * and_instances <= got < 24.625 * and_instances + padding
    assert cg["trials"] == ce["trials"] >= len(sums)
    assert cg["rounds"] >= 2  # some coordinates needed a retry round
    ref = aggregate_plain(a1, a2, ring_bits, "spgc", seed1=s1, seed2=s2, sigma_units=sigma)
    assert [int(v) for v in ref] == [int(v) for v in ye]
    # a round seed is never used twice: refused before anything is sent
    sent = lg.channel.bytes_sent
    with pytest.raises(ValueError, match="used before"):
        run_aggregate("garbler", lg, a1, s1, sigma, ring_bits, "spgc")
    assert lg.channel.bytes_sent == sent


def test_noise_reproducible_from_both_seeds_only():
    s1, s2 = hashlib.sha256(b"a").digest(), hashlib.sha256(b"b").digest()
    z = sample_noise_plain(s1, s2, 2000, 1000.0)
    assert np.array_equal(z, sample_noise_plain(s1, s2, 2000, 1000.0))
    other = sample_noise_plain(s1, hashlib.sha256(b"c").digest(), 2000, 1000.0)
    assert np.mean(z == other) < 0.01


def _chacha_reference(key: bytes, counter: int, nonce: bytes, rounds: int) -> bytes:
    """ChaCha's block function written out from RFC 8439 2.3 (``rounds`` rounds)."""
    mask = 0xFFFFFFFF

    def words(raw: bytes) -> list[int]:
        return [int.from_bytes(raw[i : i + 4], "little") for i in range(0, len(raw), 4)]

    state = [0x61707865, 0x3320646E, 0x79622D32, 0x6B206574, *words(key), counter, *words(nonce)]
    x = list(state)

    def quarter(a: int, b: int, c: int, d: int) -> None:
        for p, q, r, shift in ((a, b, d, 16), (c, d, b, 12), (a, b, d, 8), (c, d, b, 7)):
            x[p] = (x[p] + x[q]) & mask
            v = x[r] ^ x[p]
            x[r] = ((v << shift) | (v >> (32 - shift))) & mask

    for _ in range(rounds // 2):
        for column in ((0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)):
            quarter(*column)
        for diagonal in ((0, 5, 10, 15), (1, 6, 11, 12), (2, 7, 8, 13), (3, 4, 9, 14)):
            quarter(*diagonal)
    return b"".join(((v + w) & mask).to_bytes(4, "little") for v, w in zip(x, state, strict=True))


def test_seed_expansion_layout():
    seed = bytes(range(32))
    ports = expand_seed(seed, 3, (64, 5), 10, "g")
    assert sorted(ports) == ["g0", "g1"]
    assert int(ports["g1"].max()) < 32
    again = expand_seed(seed, 3, (64, 5, 64), 10, "g")  # more ports: a longer, same-prefix stream
    assert np.array_equal(again["g0"], ports["g0"])
    assert not np.array_equal(expand_seed(seed, 4, (64,), 10, "g")["g0"], ports["g0"])
    # ChaCha8 keyed by the seed, nonce "SPGc" || stage || coordinate's low 32 bits, counter
    # (coordinate >> 32) << 16 | block, all little endian; word k of a coordinate's stream is
    # 64-bit word k % 8 of block k // 8. The reference: RFC 8439's block function in Python,
    # checked at its 20 rounds against the cryptography package's ChaCha20.
    def block(stage: int, coord: int, index: int, rounds: int = STREAM_ROUNDS) -> bytes:
        counter = (coord >> 32) << 16 | index
        nonce = b"SPGc" + stage.to_bytes(4, "little") + (coord & 0xFFFFFFFF).to_bytes(4, "little")
        return _chacha_reference(seed, counter, nonce, rounds)

    counter20 = ((7 >> 32) << 16).to_bytes(4, "little")
    nonce7 = b"SPGc" + (3).to_bytes(4, "little") + (7).to_bytes(4, "little")
    rfc = Cipher(algorithms.ChaCha20(seed, counter20 + nonce7), None).encryptor()
    assert block(3, 7, 0, rounds=20) == rfc.update(bytes(64))
    assert STREAM_ROUNDS == 8  # the stream's rounds, as its docs say

    assert int(ports["g0"][7]) == int.from_bytes(block(3, 7, 0)[:8], "little")
    assert int(ports["g1"][7]) == int.from_bytes(block(3, 7, 0)[8:16], "little") & 31
    # 5 trials of coordinates 5 and 9: instance 5 is coordinate 9's trial 0, instance 9 its
    # trial 4, whose port 1 is word 4 * 2 + 1 = 9: block 1, word 1
    five = expand_seed(seed, 3, (64, 5), np.array([5, 9]), "g", trials=5)
    assert len(five["g0"]) == 10
    assert int(five["g0"][5]) == int(ports["g0"][9])
    assert int(five["g1"][9]) == int.from_bytes(block(3, 9, 1)[8:16], "little") & 31
    far = (1 << 40) + 3  # a coordinate past 2^32: its high bits go into the counter
    assert int(expand_seed(seed, 0, (64,), np.array([far]), "g")["g0"][0]) == int.from_bytes(
        block(0, far, 0)[:8], "little"
    )


def test_noise_depends_only_on_the_seeds_and_the_coordinate():
    """A batch split into ranges (lanes, worker pairs) gets exactly the same noise."""
    s1, s2 = hashlib.sha256(b"x").digest(), hashlib.sha256(b"y").digest()
    whole = sample_noise_plain(s1, s2, 900, 1000.0)
    parts = [
        sample_noise_plain(s1, s2, 300, 1000.0, first_coordinate=0),
        sample_noise_plain(s1, s2, 250, 1000.0, first_coordinate=300),
        sample_noise_plain(s1, s2, 350, 1000.0, first_coordinate=550),
    ]
    assert np.array_equal(whole, np.concatenate(parts))


def test_refusals_name_the_limit(two_party):
    a = np.zeros(4, dtype=np.uint64)
    with pytest.raises(ValueError, match=r"ring_bits=1 is outside the supported ring sizes 2..64"):
        run_aggregate("garbler", None, a, bytes(32), 10.0, 1, "spgc")
    with pytest.raises(ValueError, match=r"ring_bits=65"):
        spgc_circuit.reconstruct_circuit(65)
    with pytest.raises(ValueError, match=r"outside the ring Z_2\^8"):
        run_aggregate("garbler", None, np.array([256], dtype=np.uint64), bytes(32), 10.0, 8)
    with pytest.raises(ValueError, match="32 bytes"):
        sample_noise_plain(bytes(31), bytes(32), 1, 10.0)
    with pytest.raises(ValueError, match="mode must be one of"):
        run_aggregate("garbler", None, a, bytes(32), 10.0, 8, "ldp")
    with pytest.raises(ValueError, match="role must be one of"):
        run_aggregate("h1", None, a, bytes(32), 10.0, 8)
    with pytest.raises(ValueError, match=r"above the sampler's limit of 2\^40"):
        sample_noise_plain(bytes(32), bytes(32), 1, 1e13)
    noise_bits = derive_params(65536.0).noise_bits
    want = rf"output_bits=20 cannot hold S \+ z.*at least {noise_bits + 1} bits"
    with pytest.raises(ValueError, match=want):
        spgc_circuit.output_width(16, noise_bits, 20)
    # the refusal comes before any byte is sent
    tp = two_party()
    link = PartyLink("garbler", tp.garbler_channel, tp.garbler)
    with pytest.raises(ValueError, match="output_bits=20"):
        run_aggregate("garbler", link, a, bytes(32), 65536.0, 16, output_bits=20)
    assert tp.garbler_channel.bytes_sent == 0


def test_wide_output_decoding():
    width = 70
    vals = [-(1 << 69), (1 << 69) - 1, -1, 0, 12345]
    lo = np.array([v % (1 << 70) & ((1 << 64) - 1) for v in vals], dtype=np.uint64)
    hi = np.array([(v % (1 << 70)) >> 64 for v in vals], dtype=np.uint64)
    out = spgc_circuit.decode_signed({"y_lo": lo, "y_hi": hi}, width)
    assert out.dtype == object and out.tolist() == vals
    assert spgc_circuit.output_ports(70) == [("y_lo", 64), ("y_hi", 6)]


def test_table_sampler_baseline(two_party):
    lam, ring_bits, sigma = 8, 32, 1e4
    circuit = spgc_circuit.table_noisy_sum_circuit(ring_bits, sigma, lam)
    table = spgc_circuit.table_sampler_values(sigma, lam)
    assert len(np.unique(table)) <= 1 << lam  # the support that makes it non-DP
    add = spgc_circuit.noisy_sum_circuit(ring_bits, 2)  # a reference sub + add of the same widths
    assert circuit.and_count > (1 << lam) - lam - 1
    assert circuit.and_count <= (1 << lam) - lam - 1 + add.and_count + 64
    sums = sums_for(ring_bits, 300, 9)
    a1, a2 = shares_of(sums, ring_bits, 10)
    rng = np.random.default_rng(4)
    ig = rng.integers(0, 1 << lam, len(sums), dtype=np.uint64)
    ie = rng.integers(0, 1 << lam, len(sums), dtype=np.uint64)
    out_g, out_e = two_party().run(circuit, {"a1": a1, "idx_g": ig}, {"a2": a2, "idx_e": ie})
    width = sum(w for _, _, w in circuit.outputs)
    y = spgc_circuit.decode_signed(out_e, width)
    assert np.array_equal(spgc_circuit.decode_signed(out_g, width), y)
    assert (y - np.array(sums)).tolist() == table[(ig ^ ie).astype(np.int64)].tolist()
    assert "NOT differentially private" in spgc_circuit.TABLE_SAMPLER_LABEL


def test_seed_journal_refuses_a_seed_of_an_earlier_process(tmp_path, monkeypatch):
    journal = tmp_path / "used-seeds"
    monkeypatch.setattr(gc_party, "_used_seeds", set())
    try:
        gc_party.set_seed_journal(journal)
        seed = os.urandom(32)
        gc_party.claim_seed(seed)
        assert journal.stat().st_size == 32 and (journal.stat().st_mode & 0o777) == 0o600
        monkeypatch.setattr(gc_party, "_used_seeds", set())  # a new process: memory is empty
        gc_party.set_seed_journal(journal)
        with pytest.raises(ValueError, match="used before"):
            gc_party.claim_seed(seed)
        gc_party.claim_seed(os.urandom(32))
        assert journal.stat().st_size == 64
    finally:
        gc_party.set_seed_journal(None)


@pytest.mark.parametrize("mode", ["spgc", "only-mpc"])
def test_lanes_release_the_same_vector_as_one_link(two_party, mode):
    """K = 1, 2, 3 lanes (each its own connection and session pair, on its own range of
    coordinates): the output is the sums plus the plaintext noise of the whole batch for the
    seeds (so bit-identical for any K; a seed cannot be used twice, so each K draws its own);
    bytes add up over the lanes."""
    sums = sums_for(16, 300, 7)
    a1, a2 = shares_of(sums, 16, 8)
    sigma = 1000.0 if mode == "spgc" else None
    outputs = []
    for lanes in (1, 2, 3):
        pairs = [both(two_party)[1:] for _ in range(lanes)]
        lg, le = [p[0] for p in pairs], [p[1] for p in pairs]
        s1 = hashlib.sha256(b"lanes-1-%d" % lanes).digest() if mode == "spgc" else None
        s2 = hashlib.sha256(b"lanes-2-%d" % lanes).digest() if mode == "spgc" else None
        yg, ye, cg, ce = run_both(lg, le, a1, a2, s1, s2, sigma, 16, mode)
        assert yg.tolist() == ye.tolist()
        assert cg["lanes"] == ce["lanes"] == lanes
        # fresh links: the call's bytes are everything each lane's channel sent
        assert cg["sent"] == sum(v["sent"] for ln in lg for v in ln.channel.counters().values())
        if mode == "spgc":
            z = sample_noise_plain(s1, s2, len(sums), sigma)
            assert [int(y) - s for y, s in zip(ye.tolist(), sums, strict=True)] == z.tolist()
        else:
            assert ye.tolist() == sums
        outputs.append(ye.tolist())
    if mode == "only-mpc":
        assert outputs[0] == outputs[1] == outputs[2]


@pytest.mark.parametrize("mode", ["spgc", "only-mpc"])
def test_a_lane_runs_its_range_in_batches_with_the_same_result(two_party, monkeypatch, mode):
    """A lane's range larger than RANGE_BATCH runs batch after batch (bounded memory on a
    worker); coordinates address their own noise, so the release is the whole batch's."""
    monkeypatch.setattr(gc_party, "RANGE_BATCH", 64)
    assert gc_party.range_batches(150) == [(0, 64), (64, 128), (128, 150)]
    sums = sums_for(16, 150, 11)
    a1, a2 = shares_of(sums, 16, 12)
    _, lg, le = both(two_party)
    s1 = hashlib.sha256(b"batches-1-" + mode.encode()).digest() if mode == "spgc" else None
    s2 = hashlib.sha256(b"batches-2-" + mode.encode()).digest() if mode == "spgc" else None
    sigma = 1000.0 if mode == "spgc" else None
    yg, ye, cg, _ = run_both(lg, le, a1, a2, s1, s2, sigma, 16, mode)
    assert yg.tolist() == ye.tolist()
    if mode == "spgc":
        z = sample_noise_plain(s1, s2, len(sums), sigma)
        assert [int(y) - s for y, s in zip(ye.tolist(), sums, strict=True)] == z.tolist()
        assert cg["trials"] >= 150 and len(cg["trials_per_round"]) == cg["rounds"]
    else:
        assert ye.tolist() == sums

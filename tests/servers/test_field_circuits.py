"""Reconstruction mod p in the round's circuits (issue 35): the servers' sums of verified field
shares (spgc.protocol.norm_proof) go into the circuits built with ``field=True`` as L low bits and a
flag each, and come out as the same S (only-mpc) or S + z (spgc) as the ring's circuits
reveal, on gc and on gmw, for a few AND gates more per coordinate."""

from __future__ import annotations

import os

import numpy as np
import pytest
from helpers import Background
from test_spgc_circuit import sums_for

from garbled_core.discrete_gaussian import derive_params
from spgc.privacy.noise import SPARES_EVERY, sample_noise_plain
from spgc.protocol.norm_proof import NormProofParams
from spgc.servers import spgc_circuit as sc
from spgc.servers.gc_party import PartyLink, aggregate_plain, run_aggregate
from spgc.servers.noise_pool import produce_noise_shares


def field_shares(sums: list[int], p: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A + B = S mod p, B uniform but for a few edge values (0.., p-1..)."""
    rng = np.random.default_rng(seed)
    b = [int(v) % p for v in rng.integers(0, 1 << 62, len(sums), dtype=np.int64)]
    for i in range(min(8, len(sums))):
        b[i] = i if i % 2 else p - 1 - i
    a = [(s - v) % p for s, v in zip(sums, b, strict=True)]
    return np.array(a, dtype=np.uint64), np.array(b, dtype=np.uint64)


def modulus(ring_bits: int) -> int:
    bound = max(1, (1 << (ring_bits - 1)) >> 12)  # a provider holds a small part of the ring
    return NormProofParams.for_plan(dim=4, bound=bound, ring_bits=ring_bits).p


@pytest.mark.parametrize("ring_bits", [2, 9, 21, 32])
@pytest.mark.parametrize("arithmetic", ["ripple", "depth"])
def test_field_circuits_reveal_what_the_ring_circuits_do(ring_bits: int, arithmetic: str) -> None:
    p = modulus(ring_bits)
    # The field circuits need |S| <= 2^(L-1) - 1 (the plan's ring guarantees it).
    sums = [s for s in sums_for(ring_bits, 600, ring_bits) if s != -(1 << (ring_bits - 1))]
    a, b = field_shares(sums, p, ring_bits)
    a1, k1 = sc.field_circuit_inputs(a, p, ring_bits, leader=True)
    a2, k2 = sc.field_circuit_inputs(b, p, ring_bits, leader=False)
    ports = {"a1": a1, "k1": k1, "a2": a2, "k2": k2}
    n = len(sums)
    recon = sc.reconstruct_circuit(ring_bits, arithmetic=arithmetic, field=True)
    assert sc.decode_signed({"y": recon.evaluate(ports, n)["s"]}, ring_bits).tolist() == sums
    noise_bits = 12
    z = np.random.default_rng(1).integers(-(1 << (noise_bits - 1)), 1 << (noise_bits - 1), n)
    carried = z.astype(np.int64).view(np.uint64) & np.uint64((1 << noise_bits) - 1)
    add = sc.noisy_sum_circuit(ring_bits, noise_bits, arithmetic=arithmetic, field=True)
    out = add.evaluate({**ports, "z": carried}, n)
    width = sc.output_width(ring_bits, noise_bits)
    assert sc.decode_signed(out, width).tolist() == (np.array(sums) + z).tolist()
    ring = sc.noisy_sum_circuit(ring_bits, noise_bits, arithmetic=arithmetic)
    if arithmetic == "ripple":
        # L ANDs for the low bits' sum and carry (the ring's subtraction: L - 1), two ORs and
        # the adder's carry-out.
        assert add.and_count - ring.and_count <= 4


def test_field_circuit_inputs_refuse_a_wrong_field() -> None:
    with pytest.raises(ValueError, match="must be 1 mod 2"):
        sc.field_circuit_inputs(np.zeros(3, dtype=np.uint64), 101, 4, leader=True)
    p = modulus(8)
    with pytest.raises(ValueError, match="outside the field"):
        sc.field_circuit_inputs(np.array([p], dtype=np.uint64), p, 8, leader=False)


@pytest.mark.parametrize("backend", ["gc", "gmw"])
def test_a_round_on_field_shares_equals_the_plaintext_reference(two_party, backend: str) -> None:
    ring_bits, sigma = 21, 800.0
    p = modulus(ring_bits)
    sums = [s for s in sums_for(ring_bits, 300, 5) if s != -(1 << (ring_bits - 1))]
    a, b = field_shares(sums, p, 6)
    tp = two_party()
    lg = PartyLink.open("garbler", tp.garbler_channel, backend=backend)
    le = PartyLink.open("evaluator", tp.evaluator_channel, backend=backend)

    def run(mode: str, s1: bytes | None, s2: bytes | None, sig: float | None):
        side = Background(
            lambda: run_aggregate("garbler", lg, a, s1, sig, ring_bits, mode, field_modulus=p)
        )
        ye, _ = run_aggregate("evaluator", le, b, s2, sig, ring_bits, mode, field_modulus=p)
        yg, _ = side.result(timeout=300)
        assert yg.tolist() == ye.tolist()
        return ye

    assert run("only-mpc", None, None, None).tolist() == sums
    s1, s2 = os.urandom(32), os.urandom(32)
    y = run("spgc", s1, s2, sigma)
    ref = aggregate_plain(
        a, b, ring_bits, "spgc", seed1=s1, seed2=s2, sigma_units=sigma, backend=backend,
        field_modulus=p,
    )  # fmt: skip
    assert [int(v) for v in y] == [int(v) for v in ref]
    noise = [int(v) - s for v, s in zip(y.tolist(), sums, strict=True)]
    assert max(abs(v) for v in noise) < 1 << derive_params(sigma).noise_bits
    assert aggregate_plain(a, b, ring_bits, "only-mpc", field_modulus=p).tolist() == sums


@pytest.mark.parametrize("arithmetic", ["ripple", "depth"])
def test_the_noise_share_circuit_in_the_field_adds_z_to_a_uniform_mask_mod_p(
    arithmetic: str,
) -> None:
    ring_bits, noise_bits = 21, 18
    p = modulus(ring_bits)
    rng = np.random.default_rng(4)
    n = 3000
    z = rng.integers(-(1 << (noise_bits - 1)), 1 << (noise_bits - 1), n)
    z[:4] = [-(1 << (noise_bits - 1)), (1 << (noise_bits - 1)) - 1, 0, -1]
    r = np.array([int(v) % p for v in rng.integers(0, 1 << 62, n, dtype=np.int64)], np.uint64)
    r[4:8] = [0, 1, p - 1, p - 2]  # w < 0, w >= p and the edges between
    carried = z.astype(np.int64).view(np.uint64) & np.uint64((1 << noise_bits) - 1)
    circuit = sc.noise_share_circuit(ring_bits, noise_bits, arithmetic=arithmetic, field_modulus=p)
    u = circuit.evaluate({"z": carried, "r": r}, n)["u"]
    assert [int(v) for v in u] == [(int(a) + int(b)) % p for a, b in zip(z, r, strict=True)]
    if arithmetic == "ripple":  # offline: about 3 bit_length(p) AND gates a sample
        assert circuit.and_count <= 3 * p.bit_length() + 6


@pytest.mark.parametrize("backend", ["gc", "gmw"])
def test_a_noise_pool_block_in_the_field_adds_up_to_the_plaintext_noise(
    two_party, backend: str
) -> None:
    ring_bits, sigma, n = 21, 300.0, 600
    p = modulus(ring_bits)
    tp = two_party()
    lg = PartyLink.open("garbler", tp.garbler_channel, backend=backend)
    le = PartyLink.open("evaluator", tp.evaluator_channel, backend=backend)
    s1, s2 = os.urandom(32), os.urandom(32)
    side = Background(
        lambda: produce_noise_shares("garbler", lg, n, sigma, ring_bits, s1, field_modulus=p)
    )
    u, _ = produce_noise_shares("evaluator", le, n, sigma, ring_bits, s2, field_modulus=p)
    neg_r, _ = side.result(timeout=300)
    assert int(u.max()) < p and int(neg_r.max()) < p
    total = [(int(a) + int(b)) % p for a, b in zip(neg_r, u, strict=True)]
    centered = [v - p if v > p // 2 else v for v in total]
    z = sample_noise_plain(s1, s2, n, sigma, spares_every=SPARES_EVERY[backend])
    assert centered == z.tolist()

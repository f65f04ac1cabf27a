"""The providers' norm proofs (spgc.norm_proof, issue 35): the field kernels against plain
Python integers, honest vectors accepted and their shares summing to the vector, and every
way a dishonest provider running our own prover (prove_unchecked) can cheat refused, each for
its own reason. Also a tutorial: prove -> leader_query / helper_query -> decide.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from garbled_core import field_expand, field_matvec, field_mul, field_ntt, wraparound_dots
from spgc.norm_proof import (
    DEFAULT_REPETITIONS,
    NormProofParams,
    choose_field,
    decide,
    encoded_input,
    helper_query,
    leader_query,
    prove,
    prove_unchecked,
    wrapping_vector,
)

P61 = (1 << 61) - 1  # a prime; the kernels need no special form


def _aes_stream(seed: bytes, blocks: int) -> bytes:
    enc = Cipher(algorithms.AES(seed), modes.ECB()).encryptor()
    return b"".join(enc.update(i.to_bytes(16, "little")) for i in range(blocks))


def test_field_kernels_match_python_integers() -> None:
    rng = np.random.default_rng(7)
    field = choose_field(1 << 40, 10)
    p = field.p
    assert (p - 1) % (1 << 10) == 0 and p >= 1 << 40
    n = 16
    w = field.root_of_unity(n)
    assert pow(w, n, p) == 1 and pow(w, n // 2, p) == p - 1
    x = rng.integers(0, p, size=(3, n), dtype=np.uint64)
    got = field_ntt(x, p, w)
    for r in range(3):
        want = [sum(int(x[r, j]) * pow(w, j * k, p) for j in range(n)) % p for k in range(n)]
        assert [int(v) for v in got[r]] == want
    m = rng.integers(0, p, size=(4, 9), dtype=np.uint64)
    v = rng.integers(0, p, size=9, dtype=np.uint64)
    want = [sum(int(m[i, j]) * int(v[j]) for j in range(9)) % p for i in range(4)]
    assert [int(t) for t in field_matvec(m, v, p)] == want
    assert [int(t) for t in field_mul(v, v[:1], p)] == [int(t) * int(v[0]) % p for t in v]
    with pytest.raises(ValueError, match="field modulus"):
        field_mul(np.array([p], dtype=np.uint64), v[:1], p)


def test_pseudorandom_vectors_follow_the_documented_aes_ctr_stream() -> None:
    # An independent client draws the same z's and helper shares from the docs' description:
    # AES-128(seed, counter as 16 little-endian bytes), two bits at a time (low bits of each
    # byte first): 00 -> -1, 11 -> +1, else 0; field elements: 64-bit little-endian words masked
    # to bit_length(p) bits, those >= p skipped.
    seed = bytes(range(16))
    stream = _aes_stream(seed, 300)
    x = np.random.default_rng(3).integers(0, 1 << 40, size=1000, dtype=np.uint64)
    z = []
    for j in range(3000):
        two = (stream[j // 4] >> (2 * (j % 4))) & 3
        z.append(-1 if two == 0 else 1 if two == 3 else 0)
    dots = wraparound_dots(x, seed, 3, P61)
    for k in range(3):
        assert int(dots[k]) == sum(z[k * 1000 + i] * int(x[i]) for i in range(1000)) % P61
    words = [int.from_bytes(stream[8 * i : 8 * i + 8], "little") & P61 for i in range(80)]
    assert [int(v) for v in field_expand(seed, 30, P61)] == [w for w in words if w < P61][:30]


def _params(dim: int = 40, bound: int = 1 << 12, ring_bits: int = 20, reps: int = 16):
    return NormProofParams.for_plan(dim, bound, ring_bits, repetitions=reps)


def _vector(params: NormProofParams, fraction: float, seed: int = 0) -> np.ndarray:
    g = np.random.default_rng(seed).normal(size=params.dim)
    return np.trunc(g / np.linalg.norm(g) * params.bound * fraction).astype(np.int64)


def _verdict(params: NormProofParams, shares) -> str | None:
    leader, helper = shares
    coin = os.urandom(32)  # the servers' joint coin, drawn after the shares are in
    return decide(params, leader_query(params, leader, coin), helper_query(params, helper, coin))


def test_parameters_meet_the_soundness_target_and_the_field_conditions() -> None:
    params = NormProofParams.for_plan(dim=1_000_000, bound=64 * 65539, ring_bits=30)
    assert params.repetitions == DEFAULT_REPETITIONS
    assert params.soundness_error <= 2.0**-40
    p, h = params.p, 1 << (params.window_bits - 1)
    assert p >= 81 * h * h and p > 1 << params.ring_bits and p < 1 << 62
    assert (p - 1) % (1 << params.ring_bits) == 0  # p = 1 mod 2^L (the circuit's carry-in)
    assert params.bound**2 < 1 << params.norm_bits
    # O(sqrt d) proof and verifier message.
    assert params.proof_len < 5_000 and params.verifier_len < 2_500
    with pytest.raises(ValueError, match="too large for a verified field"):
        NormProofParams.for_plan(dim=10, bound=1 << 28, ring_bits=40)


@pytest.mark.parametrize("fraction", [0.0, 0.5, 1.0])
def test_honest_vectors_are_accepted_and_the_shares_sum_to_them(fraction: float) -> None:
    params = _params()
    x = _vector(params, fraction)
    leader, helper = prove(x, params)
    assert _verdict(params, (leader, helper)) is None
    h_inputs, _ = helper.expand(params)
    total = (leader.inputs[: params.dim].astype(object) + h_inputs[: params.dim]) % params.p
    centered = [int(v) - params.p if v > params.p // 2 else int(v) for v in total]
    assert centered == x.tolist()


def test_a_vector_exactly_on_the_bound_is_accepted_and_one_unit_over_is_refused() -> None:
    params = _params(dim=1, bound=1000)
    assert _verdict(params, prove(np.array([1000]), params)) is None
    assert _verdict(params, prove(np.array([-1000]), params)) is None
    assert _verdict(params, prove_unchecked(np.array([1001]), params)) is not None
    with pytest.raises(ValueError, match="exceeds the norm bound"):
        prove(np.array([1001]), params)


def _refusals(params: NormProofParams, x: np.ndarray, edit=None, tries: int = 3) -> set[str]:
    reasons = {_verdict(params, prove_unchecked(x, params, edit)) for _ in range(tries)}
    assert None not in reasons, "a vector over the bound was accepted"
    return reasons


def test_scaled_vectors_are_refused() -> None:
    params = _params()
    for scale in (1.01, 2.0, 1000.0):
        x = _vector(params, scale, seed=1)
        assert _refusals(params, x)


def test_one_huge_coordinate_is_refused() -> None:
    params = _params()
    for value in (params.bound + 1, params.p // 3, -(params.p // 2)):
        x = np.zeros(params.dim, dtype=np.int64)
        x[5] = value
        assert _refusals(params, x)


@pytest.mark.parametrize("spread", [0, 56])
def test_a_vector_whose_squared_norm_wraps_the_field_is_refused_by_the_wraparound_checks(
    spread: int,
) -> None:
    params = _params(dim=64)
    x = wrapping_vector(params, spread)
    xo = x.astype(object)
    assert params.p <= int(np.dot(xo, xo)) <= params.p + params.bound**2  # wraps to <= B^2
    assert _refusals(params, x) == {"the norm bound or a wraparound check does not hold"}


def test_one_wraparound_check_passes_a_wrapping_vector_at_most_half_the_time() -> None:
    # PINE's bound (p >= 81 H^2): a wrapping vector passes one repetition with probability at
    # most 1/2; everything else about the vector is consistent, so the repetitions are all
    # that stands between it and the sum.
    params = _params(dim=64, reps=1)
    x = wrapping_vector(params, 56)
    verdicts = [_verdict(params, prove_unchecked(x, params)) for _ in range(120)]
    assert set(verdicts) <= {None, "the norm bound or a wraparound check does not hold"}
    assert sum(v is None for v in verdicts) <= 72  # 1/2 + four standard deviations of 120 coins


def test_a_proof_for_another_vector_is_refused() -> None:
    params = _params()
    x_bad = _vector(params, 3.0, seed=2)
    x_good = _vector(params, 0.9, seed=3)

    def good_encoding(w: np.ndarray, joint: bytes) -> np.ndarray:
        # The bits and the proof describe x_good (under this very joint randomness); the
        # shares carry x_bad.
        return encoded_input(params, x_good, joint)

    assert _refusals(params, x_bad, good_encoding) == {
        "the proof polynomial does not match the wires"
    }


def test_values_that_are_not_bits_are_refused() -> None:
    params = _params()
    x = _vector(params, 0.5, seed=4)

    def two(w: np.ndarray, joint: bytes) -> np.ndarray:
        w[params.dim] = 2  # V0's lowest "bit"
        return w

    def minus_one(w: np.ndarray, joint: bytes) -> np.ndarray:
        w[-1] = params.p - 1
        return w

    for edit in (two, minus_one):
        assert _refusals(params, x, edit) != set()


def test_tampered_shares_proofs_and_joint_parts_are_refused() -> None:
    params = _params()
    x = _vector(params, 0.7, seed=5)
    leader, helper = prove(x, params)
    coin = os.urandom(32)
    h_msg = helper_query(params, helper, coin)

    def verdict(leader_share) -> str | None:
        return decide(params, leader_query(params, leader_share, coin), h_msg)

    assert verdict(leader) is None
    proof = leader.proof.copy()
    proof[-1] = (int(proof[-1]) + 1) % params.p
    assert verdict(dataclasses.replace(leader, proof=proof)) == (
        "the proof polynomial does not match the wires"
    )
    bits = leader.inputs.copy()
    bits[params.dim + 3] = (int(bits[params.dim + 3]) + 1) % params.p
    assert verdict(dataclasses.replace(leader, inputs=bits)) is not None
    xs = leader.inputs.copy()
    xs[0] = (int(xs[0]) + 1) % params.p  # changes the share the joint randomness hashed
    assert verdict(dataclasses.replace(leader, inputs=xs)) == (
        "the joint randomness parts do not match the shares"
    )
    assert verdict(dataclasses.replace(leader, helper_part=os.urandom(32))) == (
        "the joint randomness parts do not match the shares"
    )
    short = dataclasses.replace(leader, inputs=leader.inputs[:-1])
    with pytest.raises(ValueError, match="wrong length"):
        leader_query(params, short, coin)


def test_the_servers_coin_changes_the_query_and_both_must_use_the_same() -> None:
    params = _params()
    leader, helper = prove(_vector(params, 0.8, seed=6), params)
    a = leader_query(params, leader, b"a" * 32)
    b = helper_query(params, helper, b"b" * 32)
    assert decide(params, a, b) is not None
    assert decide(params, a, helper_query(params, helper, b"a" * 32)) is None

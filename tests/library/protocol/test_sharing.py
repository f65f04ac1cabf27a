"""Additive sharing in Z_{2^L}: round trips, uniform shares, aggregation, limits."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest
from scipy.stats import chisquare

from spgc.protocol import sharing
from spgc.protocol.sharing import (
    aggregate_shares,
    check_fits,
    max_abs_sum_units,
    noise_tail_bound_units,
    reconstruct,
    ring_bits_for,
    share,
    validate_share,
)

RINGS = [2, 16, 32, 63, 64]


def _extremes(bits: int) -> np.ndarray:
    half = 1 << (bits - 1)
    return np.array([-half, half - 1, 0, -1, 1, -half + 1], dtype=np.int64)


def _random_in_ring(rng: np.random.Generator, bits: int, n: int) -> np.ndarray:
    half = 1 << (bits - 1)
    return rng.integers(-half, half, size=n, dtype=np.int64, endpoint=False)


@pytest.mark.parametrize("bits", RINGS)
def test_round_trip_extremes_and_random(bits):
    rng = np.random.default_rng(bits)
    values = np.concatenate([_extremes(bits), _random_in_ring(rng, bits, 5000)])
    a1, a2 = share(values, bits)
    assert a1.dtype == np.uint64 and a2.dtype == np.uint64
    if bits < 64:
        assert int(a1.max()) < 1 << bits and int(a2.max()) < 1 << bits
    back = reconstruct(a1, a2, bits)
    assert back.dtype == np.int64
    np.testing.assert_array_equal(back, values)


def test_round_trip_keeps_shape():
    v = np.arange(-6, 6, dtype=np.int64).reshape(3, 4)
    a1, a2 = share(v, 8)
    np.testing.assert_array_equal(reconstruct(a1, a2, 8), v)
    z1, z2 = share(np.int64(-5), 8)
    assert int(reconstruct(z1, z2, 8)) == -5


def test_mask_comes_from_os_urandom(monkeypatch):
    # The mask must be os.urandom's bytes (masked to L bits), not any numpy generator.
    fixed = bytes(range(8)) * 4
    monkeypatch.setattr(sharing.os, "urandom", lambda n: fixed[:n])
    a1, a2 = share(np.array([1, -1, 0, 7], dtype=np.int64), 16)
    expect_r = np.frombuffer(fixed, dtype=np.uint64) & np.uint64(0xFFFF)
    np.testing.assert_array_equal(a2, expect_r)
    np.testing.assert_array_equal(reconstruct(a1, a2, 16), [1, -1, 0, 7])


@pytest.mark.parametrize("bits", [2, 16, 64])
def test_each_share_looks_uniform(bits):
    # Share the same extreme value many times; the top bits of each share must be uniform.
    n = 16_000
    top = min(bits, 4)
    value = np.full(n, (1 << (bits - 1)) - 1, dtype=np.int64)
    a1, a2 = share(value, bits)
    for s in (a1, a2):
        buckets = (s >> np.uint64(bits - top)).astype(np.int64)
        counts = np.bincount(buckets, minlength=1 << top)
        assert chisquare(counts).pvalue > 1e-6


def test_shares_of_different_values_do_not_differ_in_distribution():
    # A single share is independent of the value: compare top-nibble histograms of a1 for two
    # very different values (two-sample chi-square via the pooled expected counts).
    n = 16_000
    h = []
    for val in (-(2**31), 2**31 - 1):
        a1, _ = share(np.full(n, val, dtype=np.int64), 32)
        h.append(np.bincount((a1 >> np.uint64(28)).astype(np.int64), minlength=16))
    pooled = (h[0] + h[1]) / 2
    stat = float((((h[0] - pooled) ** 2 + (h[1] - pooled) ** 2) / pooled).sum())
    assert stat < 60  # chi-square with 15 dof: p < 1e-6 beyond ~50-60


@pytest.mark.parametrize("bits", [16, 64])
def test_aggregate_many_shares_equals_sum_mod_ring(bits):
    rng = np.random.default_rng(11)
    d, k = 257, 40
    half = 1 << (bits - 1)
    # Values small enough that the true total of k providers fits the signed range.
    per = half // k
    values = [rng.integers(-per, per, size=d, dtype=np.int64) for _ in range(k)]
    acc1 = np.zeros(d, dtype=np.uint64)
    acc2 = np.zeros(d, dtype=np.uint64)
    for v in values:
        s1, s2 = share(v, bits)
        aggregate_shares(acc1, s1, bits)
        aggregate_shares(acc2, s2, bits)
    exact = np.sum(np.array(values, dtype=object), axis=0)  # Python ints: no wrap
    np.testing.assert_array_equal(reconstruct(acc1, acc2, bits), exact.astype(np.int64))
    if bits < 64:
        assert int(acc1.max()) < 1 << bits


def test_aggregate_wraps_modulo_ring_when_total_overflows():
    bits = 8
    acc1 = np.zeros(1, dtype=np.uint64)
    acc2 = np.zeros(1, dtype=np.uint64)
    for _ in range(3):
        s1, s2 = share(np.array([100], dtype=np.int64), bits)
        aggregate_shares(acc1, s1, bits)
        aggregate_shares(acc2, s2, bits)
    # 300 mod 256 = 44: the ring silently wraps, which is why ring_bits_for exists.
    assert int(reconstruct(acc1, acc2, bits)[0]) == 44


def test_aggregate_in_place_and_validation():
    acc = np.full(4, 2**16 - 1, dtype=np.uint64)
    buf = acc
    aggregate_shares(acc, np.array([1, 2, 0, 2**16 - 1], dtype=np.uint64), 16)
    assert acc is buf
    np.testing.assert_array_equal(acc, [0, 1, 2**16 - 1, 2**16 - 2])
    with pytest.raises(ValueError, match="shape"):
        aggregate_shares(acc, np.zeros(3, dtype=np.uint64), 16)
    with pytest.raises(ValueError, match="uint64"):
        aggregate_shares(acc, np.zeros(4, dtype=np.int64), 16)
    with pytest.raises(ValueError, match="2\\^16"):
        validate_share(np.array([0, 2**16], dtype=np.uint64), 2, 16)
    with pytest.raises(ValueError, match="shape"):
        validate_share(np.zeros(3, dtype=np.uint64), 2, 16)
    validate_share(np.array([0, 2**64 - 1], dtype=np.uint64), 2, 64)


@pytest.mark.parametrize("bits", [2, 16, 63])
def test_overflow_detection_names_limit(bits):
    half = 1 << (bits - 1)
    for bad in (half, -half - 1):
        with pytest.raises(ValueError, match=f"2\\^{bits - 1}"):
            share(np.array([0, bad], dtype=np.int64), bits)
        with pytest.raises(ValueError, match=f"Z_2\\^{bits}"):
            check_fits(np.array([bad], dtype=np.int64), bits)
    check_fits(_extremes(bits), bits)


def test_ring_bits_validation():
    for bad in (0, 1, 65, 128):
        with pytest.raises(ValueError, match=r"2\.\.64"):
            share(np.zeros(2, dtype=np.int64), bad)
    with pytest.raises(ValueError, match="int64"):
        share(np.array([2**63], dtype=np.uint64), 64)


def test_ring_bits_for_edges():
    assert ring_bits_for(0) == 2
    assert ring_bits_for(1) == 2  # [-2, 1]
    assert ring_bits_for(2) == 3
    assert ring_bits_for(2**15 - 1) == 16
    assert ring_bits_for(2**15) == 17
    assert ring_bits_for(2**63 - 1) == 64
    with pytest.raises(ValueError, match="64-bit limit"):
        ring_bits_for(2**63)
    # Noise tail: sigma sqrt(2 ln(2 d / 2^-64)) added to |S|.
    t = noise_tail_bound_units(1000.0, 10**6)
    assert t == math.ceil(1000.0 * math.sqrt(2 * (math.log(2e6) + 64 * math.log(2))))
    assert noise_tail_bound_units(0.0, 10**6) == 0
    assert ring_bits_for(2**20, noise_std_units=1000.0, dim=10**6) == (2**20 + t).bit_length() + 1
    with pytest.raises(ValueError, match="64-bit limit"):
        ring_bits_for(2**62, noise_std_units=2.0**60, dim=10)


def test_max_abs_sum_units_and_ring_choice():
    # 3 providers, batches of 1000, B = 65538 (s = 2^16, C = 1, d = 2000).
    s = max_abs_sum_units(1000, 65538, providers=3)
    assert s == 3 * 1000 * 65538
    assert max_abs_sum_units([1000, 1000, 1000], 65538) == s
    assert max_abs_sum_units([10, 20], 7) == 210
    bits = ring_bits_for(s)
    assert bits == 29  # 196,614,000 < 2^28
    v = np.array([s, -s], dtype=np.int64)
    np.testing.assert_array_equal(reconstruct(*share(v, bits), bits), v)
    with pytest.raises(ValueError):
        max_abs_sum_units([1, 2], 5, providers=3)


def test_os_urandom_is_the_only_source():
    # Guard against a regression to numpy's global generator: its state must not move.
    state = np.random.get_state()[1].copy()
    share(np.zeros(1000, dtype=np.int64), 32)
    np.testing.assert_array_equal(np.random.get_state()[1], state)
    assert sharing.os is os

"""Fixed-point encoding: unbiased rounding, the hard L2 bound, fallback, sums and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spgc.protocol.encoding import (
    FixedPointConfig,
    clip_rows,
    decode,
    default_rounding_rng,
    encode_batch,
    encode_rows,
    l2_bound_units,
    stochastic_round,
)


def _rows_at_norm(rng: np.random.Generator, m: int, d: int, norm: float) -> np.ndarray:
    x = rng.standard_normal((m, d))
    return x * (norm / np.linalg.norm(x, axis=1))[:, None]


def _sq(v: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", v, v)


def test_stochastic_round_unbiased_and_neighbours():
    rng = np.random.default_rng(1)
    x = np.array([0.3, -0.3, 2.75, -7.5, 5.0, 1e-3, -123456.9])
    n = 40_000
    draws = stochastic_round(np.broadcast_to(x, (n, x.size)), rng)
    assert draws.dtype == np.int64
    # Only floor or ceil ever appear.
    assert np.all((draws == np.floor(x)) | (draws == np.ceil(x)))
    # Mean within 5 standard errors (sd of a Bernoulli <= 1/2).
    assert np.all(np.abs(draws.mean(axis=0) - x) <= 5 * 0.5 / math.sqrt(n))
    assert np.all(draws[:, 4] == 5)  # integers are exact


def test_conditional_rounding_is_unbiased():
    # The same clipped row encoded many times: the mean of the integer rows is s*x.
    rng = np.random.default_rng(8)
    cfg = FixedPointConfig(scale=7.0, clip_norm=1.0, dim=40)
    x = _rows_at_norm(rng, 1, 40, 1.0)
    n = 20_000
    rows, _ = encode_rows(np.repeat(x, n, axis=0), cfg, rng)
    assert np.all(np.abs(rows.mean(axis=0) - 7.0 * x[0]) <= 5 * 0.5 / math.sqrt(n) + 1e-3)


def test_stochastic_round_rejects_nonfinite_and_huge():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="finite"):
        stochastic_round(np.array([1.0, np.nan]), rng)
    with pytest.raises(ValueError, match="2\\^53"):
        stochastic_round(np.array([2.0**53]), rng)


def test_bound_formula_and_realistic_numbers():
    c = 2.0**16
    for d, expected in ((2_000, 65538), (100_000, 65539)):
        cfg = FixedPointConfig(scale=2.0**16, clip_norm=1.0, dim=d)
        assert cfg.l2_bound_units == expected
        real = c * c + d / 4 + math.sqrt(2 * math.log(1e3)) * (c + math.sqrt(d) / 2)
        assert (expected - 1) ** 2 < real <= expected**2
        assert cfg.inflation == expected / c
    # The deterministic bound c + sqrt(d) caps B when the Hoeffding term would be larger.
    assert l2_bound_units(0.0, 100, 1e-300) == 10
    # Far below naive sum rounding for large d and small scales.
    cfg = FixedPointConfig(scale=256.0, clip_norm=1.0, dim=100_000)
    assert cfg.l2_bound_units < 256 + math.sqrt(100_000)


def test_l2_bound_holds_for_adversarial_inputs():
    rng = np.random.default_rng(2)
    cfg = FixedPointConfig(scale=10.0, clip_norm=1.0, dim=400)
    b2 = cfg.l2_bound_units**2
    # Exactly at norm C, random directions; and every coordinate at fraction 1/2, which
    # maximises the rounding variance sum p(1-p) = d/4.
    half = np.full((1, 400), 0.5 / 10.0)
    half *= 1.0 / np.linalg.norm(half)  # norm exactly C, coordinates 0.5 units
    adversarial = np.vstack(
        [
            _rows_at_norm(rng, 200, 400, 1.0),
            np.repeat(half, 50, axis=0),
            np.eye(400)[:20],  # all mass on one coordinate
            np.zeros((5, 400)),
        ]
    )
    rows, _ = encode_rows(adversarial, cfg, rng)
    assert np.all(_sq(rows) <= b2)
    # float32 input is accepted and bounded too.
    rows32, _ = encode_rows(adversarial.astype(np.float32), cfg, rng)
    assert np.all(_sq(rows32) <= b2)


def test_l2_bound_huge_dimension():
    rng = np.random.default_rng(3)
    d = 1_000_000
    cfg = FixedPointConfig(scale=4.0, clip_norm=1.0, dim=d)  # sqrt(d) = 250x s*C
    x = _rows_at_norm(rng, 3, d, 1.0)
    rows, _ = encode_rows(x, cfg, rng)
    assert np.all(_sq(rows) <= cfg.l2_bound_units**2)
    assert cfg.l2_bound_units < 4 + math.sqrt(d)


def test_fallback_forced_keeps_bound_and_is_toward_zero():
    rng = np.random.default_rng(4)
    cfg = FixedPointConfig(scale=100.0, clip_norm=1.0, dim=64)
    x = _rows_at_norm(rng, 30, 64, 1.0)
    rows, fallbacks = encode_rows(x, cfg, rng, max_attempts=0)
    assert fallbacks == 30
    assert np.all(_sq(rows) <= cfg.l2_bound_units**2)
    np.testing.assert_array_equal(rows, np.trunc(x * 100.0).astype(np.int64))


def test_fallback_triggered_naturally_with_tight_bound():
    # Every coordinate at +-1/2 unit: ||y||^2 = d/4 = c^2 and ||x~||^2 = Binomial(d, 1/2).
    # With beta ~ 1 and d = 2*16^2 - 2, B = 16: the mean d/2 = 255 sits just under B^2 = 256,
    # so about 43% of draws are rejected and, with 2 attempts, ~18% of rows fall back.
    rng = np.random.default_rng(5)
    d = 510
    scale = 0.5 * math.sqrt(d)
    cfg = FixedPointConfig(scale=scale, clip_norm=1.0, dim=d, failure_prob=0.999999, max_attempts=2)
    assert cfg.l2_bound_units == 16
    x = rng.choice([-0.5, 0.5], size=(400, d)) / scale
    rows, fallbacks = encode_rows(x, cfg, rng)
    assert 20 < fallbacks < 150
    assert np.all(_sq(rows) <= 16**2)


def test_batch_sum_equals_sum_of_rows_and_decode_error():
    d, m = 300, 500
    cfg = FixedPointConfig(scale=2.0**12, clip_norm=1.0, dim=d)
    x = clip_rows(np.random.default_rng(6).standard_normal((m, d)), 1.0)
    rows, _ = encode_rows(x, cfg, np.random.default_rng(99))
    total = encode_batch(x, cfg, np.random.default_rng(99))
    assert total.dtype == np.int64 and total.shape == (d,)
    np.testing.assert_array_equal(total, rows.sum(axis=0))
    # Per example each coordinate moves by < 1 unit; the batch error is a sum of m independent
    # zero-mean terms bounded by 1 unit (accepted draws), so 6 sqrt(m) units bound it easily.
    err = np.abs(decode(total, cfg.scale) - x.sum(axis=0)) * cfg.scale
    assert err.max() < 6 * math.sqrt(m)
    # Per row: |error| < 1 unit per coordinate.
    assert np.all(np.abs(rows - x * cfg.scale) < 1.0)


def test_exact_fixed_point_inputs_encode_exactly_in_chunks():
    # Rows already on the grid round to themselves; d large enough to force several chunks.
    d, m = 40_000, 60
    rng = np.random.default_rng(7)
    cfg = FixedPointConfig(scale=1024.0, clip_norm=1.0, dim=d)
    grid = np.zeros((m, d))
    idx = rng.integers(0, d, size=(m, 10))
    np.put_along_axis(grid, idx, rng.integers(-300, 300, size=(m, 10)) / 1024.0, axis=1)
    grid = clip_rows(grid, 1.0)
    on_grid = np.all(grid * 1024.0 == np.round(grid * 1024.0), axis=1)
    total = encode_batch(grid[on_grid], cfg, rng)
    np.testing.assert_array_equal(total, np.round(grid[on_grid] * 1024.0).sum(axis=0))


def test_clip_rows():
    x = np.array([[3.0, 4.0], [0.3, 0.4], [0.0, 0.0]])
    c = clip_rows(x, 1.0)
    np.testing.assert_allclose(np.linalg.norm(c, axis=1), [1.0, 0.5, 0.0])
    np.testing.assert_array_equal(c[1], x[1])  # inside the ball: untouched


def test_errors_name_limits():
    rng = default_rounding_rng()
    cfg = FixedPointConfig(scale=2.0**20, clip_norm=1.0, dim=10)
    x = np.zeros((100, 10))
    with pytest.raises(ValueError, match="2\\^15-1"):
        encode_batch(x, cfg, rng, ring_bits=16)
    with pytest.raises(ValueError, match="clip"):
        encode_batch(np.full((2, 10), 1.0), cfg, rng)  # norm sqrt(10) > C
    with pytest.raises(ValueError, match="shape"):
        encode_batch(np.zeros((2, 11)), cfg, rng)
    with pytest.raises(ValueError, match="2\\^53"):
        FixedPointConfig(scale=2.0**60, clip_norm=1.0, dim=10)
    with pytest.raises(ValueError, match="int64"):
        FixedPointConfig(scale=2.0**40, clip_norm=1.0, dim=10)
    big = FixedPointConfig(scale=2.0**30, clip_norm=1.0, dim=2)
    assert np.all(encode_batch(np.zeros((0, 2)), big, rng) == 0)
    # A huge batch (a zero-stride view, no memory) is refused before any work.
    with pytest.raises(ValueError, match="int64 limit"):
        encode_batch(np.lib.stride_tricks.as_strided(np.zeros(2), (2**34, 2), (0, 8)), big, rng)

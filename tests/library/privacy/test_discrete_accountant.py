"""The "rdp_discrete" accountant: Zhu-Wang's general Poisson-subsampling bound on the discrete
Gaussian's RDP curve, checked against the exact Renyi divergences of the mechanism itself."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy.special import logsumexp

from spgc.privacy.accounting import (
    DISCRETE_RDP_ORDERS,
    calibrate_noise_multiplier,
    discrete_gaussian_subsampled_rdp,
    epsilon_for,
)


def _log_discrete_gaussian(points: np.ndarray, centre: np.ndarray, sigma: float) -> np.ndarray:
    """log N_Z(centre, sigma^2) on integer points (rows), normalised over the same grid."""
    log_w = -np.sum((points - centre) ** 2, axis=1) / (2 * sigma * sigma)
    return log_w - logsumexp(-np.sum(points**2, axis=1) / (2 * sigma * sigma))


def _exact_subsampled_rdp(sigma: float, shift: tuple[int, ...], q: float, orders) -> np.ndarray:
    """The Renyi divergences of one Poisson-subsampled release of discrete Gaussian noise on an
    integer sum, the example's contribution ``shift``: P = (1-q) N_Z(0) + q N_Z(shift) against
    Q = N_Z(0), both directions (add and remove), the larger, summed over a grid wide enough
    that the rest is below float precision."""
    half = int(40 * sigma) + 2 * max(abs(v) for v in shift) + 2
    axis = np.arange(-half, half + 1, dtype=float)
    points = np.array(list(itertools.product(axis, repeat=len(shift))))
    log_q = _log_discrete_gaussian(points, np.zeros(len(shift)), sigma)
    log_shifted = _log_discrete_gaussian(points, np.array(shift, dtype=float), sigma)
    if q == 1:
        log_p = log_shifted
    else:
        log_p = np.logaddexp(math.log1p(-q) + log_q, math.log(q) + log_shifted)
    out = []
    for a in orders:
        forward = logsumexp(a * log_p + (1 - a) * log_q) / (a - 1)
        backward = logsumexp(a * log_q + (1 - a) * log_p) / (a - 1)
        out.append(max(forward, backward))
    return np.array(out)


@pytest.mark.parametrize(
    ("sigma", "shift"),
    [(0.6, (1,)), (1.0, (1,)), (2.5, (2,)), (1.0, (1, 1)), (1.5, (2, 1))],
)
@pytest.mark.parametrize("q", [0.05, 0.3, 0.9])
def test_bounds_the_exact_divergence_of_the_mechanism(sigma, shift, q):
    # One and two coordinates, shifts along and across the axes: the discrete Gaussian is not
    # rotation invariant, so a bound that holds only along an axis would show here.
    orders = np.arange(2, 25 if len(shift) == 1 else 13).astype(float)
    multiplier = sigma / math.hypot(*shift)  # std / L2 sensitivity
    exact = _exact_subsampled_rdp(sigma, shift, q, orders)
    bound = discrete_gaussian_subsampled_rdp(multiplier, q, orders)
    assert np.all(bound >= exact - 1e-9), np.max(exact - bound)
    assert np.all(exact > 0)


def test_without_subsampling_the_curve_is_the_discrete_gaussians_own():
    orders = np.arange(2, 30).astype(float)
    exact = _exact_subsampled_rdp(1.3, (2,), 1.0, orders)
    bound = discrete_gaussian_subsampled_rdp(1.3 / 2, 1.0, orders)
    assert np.array_equal(bound, orders / (2 * (1.3 / 2) ** 2))
    assert np.all(bound >= exact - 1e-9)
    # Integer shifts: the bound alpha Delta^2 / (2 sigma^2) is nearly tight already at sigma 1.3.
    assert np.all(exact >= 0.99 * bound)


@pytest.mark.parametrize(("multiplier", "q"), [(0.8, 0.02), (0.8, 0.4), (2.0, 0.02), (2.0, 0.4)])
def test_matches_the_theorem_summed_directly(multiplier, q):
    # Zhu and Wang 2019, Theorem 6, term by term in plain floats (the module works in logs).
    def eps(alpha: int) -> float:
        return alpha / (2 * multiplier**2)

    orders = [2, 3, 5, 8, 13]
    bounds = discrete_gaussian_subsampled_rdp(multiplier, q, np.array(orders, float))
    for a, got in zip(orders, bounds, strict=True):
        total = (1 - q) ** (a - 1) * (a * q - q + 1)
        total += math.comb(a, 2) * q**2 * (1 - q) ** (a - 2) * math.exp(eps(2))
        total += 3 * sum(
            math.comb(a, k) * (1 - q) ** (a - k) * q**k * math.exp((k - 1) * eps(k))
            for k in range(3, a + 1)
        )
        assert got == pytest.approx(min(math.log(total) / (a - 1), eps(a)), rel=1e-10)


@pytest.mark.parametrize(
    ("q", "multiplier", "steps", "delta"),
    [
        (1 / 13, 0.7808, 4, 1e-5),
        (0.01, 1.1, 1000, 1e-5),
        (0.05, 2.0, 500, 1e-5),
        (0.2, 5.0, 50, 1e-6),
    ],
)
def test_looser_than_the_continuous_accountant_never_tighter(q, multiplier, steps, delta):
    proved = epsilon_for(multiplier, delta, q, steps, "rdp_discrete")
    assumed = epsilon_for(multiplier, delta, q, steps, "rdp")
    assert assumed <= proved


def test_fixed_batches_are_accounted_as_by_rdp():
    # No amplification: one replace-one release per epoch, whose curve is exact for the discrete
    # Gaussian; only the orders differ (integers here, dp-accounting's add fractional ones).
    kw = {"sampling": "fixed", "sample_size": 10, "population": 100}
    proved = epsilon_for(1.5, 1e-5, None, 40, "rdp_discrete", **kw)
    assumed = epsilon_for(1.5, 1e-5, None, 40, "rdp", **kw)
    assert proved == pytest.approx(assumed, rel=0.02)


def test_calibration_meets_the_target_by_the_smallest_margin():
    target = 4.0
    m = calibrate_noise_multiplier(target, 1e-5, 1 / 13, 4, "rdp_discrete", rel_tol=1e-4)
    assert epsilon_for(m, 1e-5, 1 / 13, 4, "rdp_discrete") <= target
    assert epsilon_for(m * (1 - 2e-4), 1e-5, 1 / 13, 4, "rdp_discrete") > target
    assert m > calibrate_noise_multiplier(target, 1e-5, 1 / 13, 4, "rdp")


def test_refuses_what_the_theorem_does_not_cover():
    with pytest.raises(ValueError, match="integers >= 2"):
        discrete_gaussian_subsampled_rdp(1.0, 0.1, np.array([1.5, 2.0]))
    with pytest.raises(ValueError, match="sampling_rate"):
        discrete_gaussian_subsampled_rdp(1.0, 0.0)
    assert DISCRETE_RDP_ORDERS.min() == 2 and DISCRETE_RDP_ORDERS.max() == 1024

"""Privacy accounting and calibration against dp-accounting and the closed forms."""

from __future__ import annotations

import logging
import math

import dp_accounting
import pytest
from scipy.stats import binom

from spgc.privacy.accounting import (
    BATCH_OVERFLOW_LOG2,
    PrivacyAccountant,
    analytic_gaussian_delta,
    analytic_gaussian_noise_multiplier,
    calibrate_noise_multiplier,
    classic_noise_multiplier,
    epsilon_for,
    noise_multiplier_for,
    per_step_epsilon,
    poisson_overflow_log2,
    smallest_batch_cap,
    units_noise_multiplier,
)

COARSE = 1e-3  # PLD grid for fast tests; pessimistic, so still an upper bound


def test_anchor_rdp_and_pld():
    # ANCHORS.md: q=0.01, sigma=1.1, T=1000, delta=1e-5 -> 1.712 (RDP), 1.515 (PLD).
    rdp = PrivacyAccountant(1.1, 1e-5, 0.01, method="rdp")
    pld = PrivacyAccountant(1.1, 1e-5, 0.01, method="pld")
    for acc in (rdp, pld):
        assert acc.steps == 0 and acc.epsilon() == 0.0
        acc.step(999)
        acc.step()
        assert acc.steps == 1000
    assert rdp.epsilon() == pytest.approx(1.712, abs=0.01)
    assert pld.epsilon() == pytest.approx(1.515, abs=0.01)


def test_epsilon_after_is_what_if_and_monotone():
    acc = PrivacyAccountant(1.1, 1e-5, 0.01)
    acc.step(10)
    eps = [acc.epsilon_after(t) for t in (0, 1, 10, 100, 1000)]
    assert eps == sorted(eps) and eps[0] == 0.0
    assert acc.epsilon() == eps[2]
    assert acc.steps == 10  # what-if does not record steps


def test_more_noise_less_epsilon_and_units():
    a = epsilon_for(1.0, 1e-5, 0.01, 500)
    b = epsilon_for(2.0, 1e-5, 0.01, 500)
    assert b < a
    # Rounding inflation B > s*C lowers the effective multiplier and raises epsilon.
    s, c_units, b_units = 1.1, 65536.0, 65539
    nm = units_noise_multiplier(s * c_units, b_units)
    assert nm < s
    assert epsilon_for(nm, 1e-5, 0.01, 1000) > epsilon_for(s, 1e-5, 0.01, 1000)
    with pytest.raises(ValueError):
        units_noise_multiplier(1.0, 0.0)


@pytest.mark.parametrize("target", [0.5, 2.0, 8.0])
def test_calibration_round_trip_rdp(target):
    sigma = calibrate_noise_multiplier(target, 1e-5, 0.01, 1000, "rdp")
    eps = epsilon_for(sigma, 1e-5, 0.01, 1000, "rdp")
    assert eps <= target
    assert eps == pytest.approx(target, rel=2e-3)
    # Slightly less noise would break the target: the calibration is tight.
    assert epsilon_for(sigma * 0.99, 1e-5, 0.01, 1000, "rdp") > target


def test_calibration_round_trip_pld():
    kw = {"value_discretization_interval": COARSE}
    sigma = calibrate_noise_multiplier(1.0, 1e-5, 0.02, 500, "pld", **kw)
    eps = epsilon_for(sigma, 1e-5, 0.02, 500, "pld", **kw)
    assert eps <= 1.0
    assert eps == pytest.approx(1.0, rel=5e-3)
    # PLD is tighter than RDP, so it needs less noise for the same target.
    assert sigma < calibrate_noise_multiplier(1.0, 1e-5, 0.02, 500, "rdp")


def test_classic_formula_and_validity():
    assert classic_noise_multiplier(0.5, 1e-5) == pytest.approx(
        math.sqrt(2 * math.log(1.25e5)) / 0.5, rel=1e-15
    )
    # The paper's delta=1e-3, eps=0.1: sqrt(2 ln 1250)/0.1.
    assert classic_noise_multiplier(0.1, 1e-3) == pytest.approx(37.7648, abs=1e-3)
    with pytest.raises(ValueError, match="epsilon < 1"):
        classic_noise_multiplier(2.0, 1e-3)
    assert classic_noise_multiplier(8.0, 1e-3, allow_invalid=True) == pytest.approx(
        math.sqrt(2 * math.log(1250)) / 8
    )
    with pytest.raises(ValueError, match="epsilon < 1"):
        noise_multiplier_for("classic", 1.0, 1e-3)


@pytest.mark.parametrize("eps", [0.01, 0.1, 0.5, 0.99])
def test_analytic_smaller_than_classic_below_one(eps):
    analytic = analytic_gaussian_noise_multiplier(eps, 1e-5)
    assert analytic < classic_noise_multiplier(eps, 1e-5)
    assert analytic_gaussian_delta(analytic, eps) <= 1e-5
    assert analytic_gaussian_delta(analytic * (1 - 1e-6), eps) > 1e-5


@pytest.mark.parametrize("eps", [1.0, 2.0, 8.0, 20.0])
def test_analytic_valid_for_large_epsilon(eps):
    delta = 1e-3
    sigma = analytic_gaussian_noise_multiplier(eps, delta)
    # Exact: delta(sigma) meets the target and matches dp-accounting's own calibration.
    assert analytic_gaussian_delta(sigma, eps) <= delta
    assert sigma == pytest.approx(dp_accounting.get_sigma_gaussian(eps, delta), rel=1e-6)
    # Its epsilon, read back from the same sigma, is the target.
    assert per_step_epsilon(sigma, delta) == pytest.approx(eps, rel=1e-6)


def test_classic_is_not_private_at_large_epsilon():
    # Why classic is refused for eps >= 1: at the paper's eps=8, delta=1e-3 its sigma is too
    # small, and the release is only (8, 1.3e-3)-DP.
    sigma = classic_noise_multiplier(8.0, 1e-3, allow_invalid=True)
    assert sigma < analytic_gaussian_noise_multiplier(8.0, 1e-3)
    assert analytic_gaussian_delta(sigma, 8.0) > 1.2e-3


def test_per_step_epsilon_matches_dp_accounting():
    for sigma in (0.7, 1.1, 5.0, 40.0):
        assert per_step_epsilon(sigma, 1e-5) == pytest.approx(
            dp_accounting.get_epsilon_gaussian(sigma, 1e-5), rel=1e-6
        )
    assert per_step_epsilon(1e6, 0.5) == 0.0


def test_steps_within_monotone_and_tight():
    acc = PrivacyAccountant(1.1, 1e-5, 0.01)
    budgets = [0.5, 1.0, 2.0, 4.0]
    counts = [acc.steps_within(b) for b in budgets]
    assert counts == sorted(counts) and counts[0] < counts[-1]
    for b, t in zip(budgets, counts, strict=True):
        assert acc.epsilon_after(t) <= b < acc.epsilon_after(t + 1)
    assert acc.steps_within(1e-9) == 0
    acc.step(counts[1])
    assert acc.remaining_steps(1.0) == 0
    assert acc.remaining_steps(2.0) == counts[2] - counts[1]
    assert acc.steps_within(1e9, max_steps=5000) == 5000


def test_steps_within_pld():
    acc = PrivacyAccountant(1.1, 1e-5, 0.01, method="pld", value_discretization_interval=COARSE)
    t = acc.steps_within(1.0)
    assert acc.epsilon_after(t) <= 1.0 < acc.epsilon_after(t + 1)


def test_fixed_batches_use_replace_one_with_double_sensitivity():
    # Full batch (sample = population): replace-one changes the sum by up to 2B, so it is a
    # Gaussian with half the multiplier under add/remove accounting of a full batch.
    fixed = PrivacyAccountant(1.1, 1e-5, sampling="fixed", sample_size=50, population=50)
    assert fixed.sampling_rate == 1.0
    assert fixed.epsilon_after(10) == pytest.approx(epsilon_for(0.55, 1e-5, 1.0, 10), rel=1e-9)
    # Shuffled fixed batches get no amplification (Chua et al. 2024): an epoch (100 batches of
    # 100 of 10,000) is ONE replace-one Gaussian per example, whatever its number of steps; a
    # begun epoch counts whole; epochs compose.
    sub = PrivacyAccountant(1.1, 1e-5, sampling="fixed", sample_size=100, population=10_000)
    one_epoch = epsilon_for(0.55, 1e-5, 1.0, 1)
    assert sub.epsilon_after(1) == pytest.approx(one_epoch, rel=1e-9)
    assert sub.epsilon_after(100) == pytest.approx(one_epoch, rel=1e-9)
    assert sub.epsilon_after(101) == pytest.approx(epsilon_for(0.55, 1e-5, 1.0, 2), rel=1e-9)
    assert sub.epsilon_after(100) > epsilon_for(1.1, 1e-5, 0.01, 100)
    assert sub.adjacency == "replace one example"
    assert PrivacyAccountant(1.1, 1e-5, 0.01).adjacency == "add/remove one example"
    fixed_kw = {"sampling": "fixed", "sample_size": 100, "population": 10_000}
    sigma = calibrate_noise_multiplier(8.0, 1e-5, None, 100, rel_tol=1e-2, **fixed_kw)
    eps = epsilon_for(sigma, 1e-5, None, 100, **fixed_kw)
    assert eps <= 8.0
    assert eps == pytest.approx(8.0, rel=3e-2)


@pytest.mark.parametrize("q", [0.01, 10 / 130, 0.5, 1.0])
@pytest.mark.parametrize("sigma", [0.6, 1.2, 5.0])
def test_rdp_epsilon_is_dp_accountings_own_composition(q, sigma):
    # epsilon_after keeps one step's RDP curve and multiplies it by the step count: the same
    # floats dp-accounting computes when it composes the steps itself (servers ask for a new
    # step count every round; the series is computed once).
    acc = PrivacyAccountant(sigma, 1e-5, q)
    for steps in (1, 2, 7, 100, 5000):
        own = dp_accounting.rdp.RdpAccountant()
        step = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma))
        own.compose(dp_accounting.SelfComposedDpEvent(step, steps))
        assert acc.epsilon_after(steps) == own.get_epsilon(1e-5)
    fixed = PrivacyAccountant(sigma, 1e-5, sampling="fixed", sample_size=10, population=1000)
    for steps in (1, 100, 101, 950):
        own = dp_accounting.rdp.RdpAccountant(
            neighboring_relation=dp_accounting.NeighboringRelation.REPLACE_ONE
        )
        epochs = -(-steps // 100)
        own.compose(
            dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(sigma / 2), epochs)
        )
        assert fixed.epsilon_after(steps) == own.get_epsilon(1e-5)


def test_invalid_configurations():
    with pytest.raises(ValueError, match="RDP accountant only"):
        PrivacyAccountant(1.1, 1e-5, method="pld", sampling="fixed", sample_size=1, population=2)
    with pytest.raises(ValueError, match="sample_size"):
        PrivacyAccountant(1.1, 1e-5, sampling="fixed")
    with pytest.raises(ValueError, match="sampling_rate"):
        PrivacyAccountant(1.1, 1e-5, 0.0)
    with pytest.raises(ValueError, match="delta"):
        PrivacyAccountant(1.1, 1.5, 0.1)
    with pytest.raises(ValueError, match="method"):
        PrivacyAccountant(1.1, 1e-5, 0.1, method="prv")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="calibration"):
        noise_multiplier_for("magic", 1.0, 1e-5)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        PrivacyAccountant(1.1, 1e-5, 0.1).step(-1)


def test_dispatch():
    assert noise_multiplier_for("analytic", 2.0, 1e-5) == analytic_gaussian_noise_multiplier(
        2.0, 1e-5
    )
    s = noise_multiplier_for("accountant", 3.0, 1e-5, sampling_rate=0.01, steps=200)
    assert epsilon_for(s, 1e-5, 0.01, 200) <= 3.0


@pytest.mark.parametrize("n, q", [(130, 0.01), (390, 1 / 13), (5000, 0.02), (60000, 0.5)])
def test_poisson_overflow_bound_holds_and_the_cap_is_the_smallest(n: int, q: float) -> None:
    """The Chernoff bound is above the exact binomial tail, and the suggested cap is the
    first one it puts under 2^-64 (a capped batch over it sits its round out)."""
    for cap in (int(n * q), int(n * q) + 10, 2 * int(n * q) + 20):
        exact = binom.sf(cap, n, q)
        assert exact == 0.0 or math.log2(exact) <= poisson_overflow_log2(n, q, cap) + 1e-9
    cap = smallest_batch_cap(n, q)
    assert poisson_overflow_log2(n, q, cap) <= BATCH_OVERFLOW_LOG2
    assert poisson_overflow_log2(n, q, cap - 1) > BATCH_OVERFLOW_LOG2
    assert math.log2(binom.sf(cap, n, q) or 2.0**-1000) <= BATCH_OVERFLOW_LOG2
    assert poisson_overflow_log2(n, q, n) == -math.inf  # no batch is larger than the data


def test_dp_accountings_notes_on_excluded_orders_are_dropped_and_nothing_else(
    caplog, monkeypatch
) -> None:
    absl = logging.getLogger("absl")

    def notes_of_one_answer() -> list[str]:
        # q = 0.1, z = 1.29 (examples/standardize's training): dp-accounting leaves orders out.
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="absl"):
            assert PrivacyAccountant(1.293954, 1e-5, 0.1).epsilon_after(60) > 0
        return [r.getMessage() for r in caplog.records if "Excluding this order" in r.getMessage()]

    assert notes_of_one_answer() == []
    with caplog.at_level(logging.WARNING, logger="absl"):
        absl.warning("something else absl says")
    assert [r.getMessage() for r in caplog.records] == ["something else absl says"]
    monkeypatch.setattr(absl, "filters", [])  # without the filter dp-accounting does say them
    assert notes_of_one_answer()

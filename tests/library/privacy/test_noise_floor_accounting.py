"""The noise floor's accounting (spgc.privacy.noise_floor): the three figures against closed
forms, and the split bound against exact Renyi divergences of sums of discrete Gaussians."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp

from spgc.privacy.accounting import PrivacyAccountant
from spgc.privacy.noise_floor import (
    FIGURES,
    floor_accountants,
    floor_epsilons,
    floor_multipliers,
    split_shift_cost,
)


def test_no_floor_is_todays_plan():
    m = floor_multipliers(1.3, 0.0, 4096.0, 62)
    assert (m.everyone, m.curious_server, m.deviating_server) == (1.3, 1.3, 0.0)


@pytest.mark.parametrize("f", [0.1, 0.25, 0.5, 0.9])
@pytest.mark.parametrize(("bound", "d"), [(100.0, 62), (4096.0, 28_938), (30.0, 1_000_000)])
def test_the_three_figures_against_their_closed_forms(f, bound, d):
    z = 1.1
    m = floor_multipliers(z, f, bound, d)
    k = min(d, math.floor(bound**2))  # non-zero entries of an integer shift of norm <= B
    # One curious server: J ~ (1 - f) sigma^2 and the other's N ~ f sigma^2. The rounding error
    # r of the split costs ||r||^2 (1 / (1 - f) + 1 / f) / sigma^2 with ||r||^2 <= k / 4 and
    # ||r||^2 <= min(f, 1 - f)^2 B^2.
    r2 = min(k / 4, min(f, 1 - f) ** 2 * bound**2)
    assert m.curious_server == pytest.approx(z / math.sqrt(1 + r2 / (f * (1 - f) * bound**2)))
    # Everyone: J + N_1 + N_2, (1 + f) sigma^2, split N_1 | J | N_2 by cumulative rounding.
    per = 1 / (4 * f) + 1 / (1 - f) + 1 / (4 * f)
    three = z / math.sqrt(1 / (1 + f) + k * per / bound**2)
    assert m.everyone == pytest.approx(max(three, m.curious_server))
    # One server that deviates: the other's f sigma^2 alone, a single discrete Gaussian.
    assert m.deviating_server == pytest.approx(math.sqrt(f) * z)
    tol = 1 + 1e-12
    assert m.deviating_server <= m.curious_server * tol and m.curious_server <= z * tol
    assert m.curious_server <= m.everyone * tol <= z * math.sqrt(1 + f) * tol**2


def test_fixed_batches_bound_shifts_of_twice_the_sensitivity():
    # The accountant halves what it is given (replace-one, 2B): the figure is 2 / sqrt(cost(2B)).
    z, f, bound, d = 1.0, 0.25, 10.0, 1_000
    m = floor_multipliers(z, f, bound, d, sampling="fixed")
    sigma2 = (z * bound) ** 2
    cost = split_shift_cost([(1 - f) * sigma2, f * sigma2], 2 * bound, d)
    assert m.curious_server == pytest.approx(2 / math.sqrt(cost))
    assert m.curious_server <= floor_multipliers(z, f, bound, d).curious_server * (1 + 1e-12)


def _discrete_gaussian(sigma2: float, support: np.ndarray) -> np.ndarray:
    p = np.exp(-(support**2) / (2 * sigma2))
    return p / p.sum()


def _renyi(p: np.ndarray, q: np.ndarray, alpha: float) -> float:
    keep = (p > 0) & (q > 0)  # (a truncated tail only lowers the exact figure)
    terms = alpha * np.log(p[keep]) + (1 - alpha) * np.log(q[keep])
    return float(logsumexp(terms) / (alpha - 1))


@pytest.mark.parametrize(("s1", "s2"), [(0.75, 0.25), (3.0, 1.0), (1.5, 2.5), (0.3, 0.2)])
@pytest.mark.parametrize("shift", [1, 2, 3])
def test_the_split_bound_holds_for_exact_sums_of_discrete_gaussians(s1, s2, shift):
    """One coordinate: the exact D_alpha of N_Z(s1^2) + N_Z(s2^2) shifted by an integer stays
    under alpha cost / 2, also where it is far from the sum's Gaussian (small variances)."""
    support = np.arange(-200, 201, dtype=float)
    a = _discrete_gaussian(s1**2, support)
    b = _discrete_gaussian(s2**2, support)
    total = np.convolve(a, b)  # the sum's pmf on -400..400
    shifted = np.roll(total, shift)  # (the pmf underflows to 0 long before the ends)
    cost = split_shift_cost([s1**2, s2**2], float(shift), 1)
    for alpha in (1.5, 2.0, 4.0, 8.0, 16.0):
        exact = max(_renyi(shifted, total, alpha), _renyi(total, shifted, alpha))
        assert exact <= alpha * cost / 2 * (1 + 1e-9), (alpha, exact, alpha * cost / 2)


def test_three_part_bound_holds_exactly_too():
    support = np.arange(-200, 201, dtype=float)
    parts = [_discrete_gaussian(v, support) for v in (0.5, 1.5, 0.5)]
    total = np.convolve(np.convolve(parts[0], parts[1]), parts[2])
    for shift in (1, 2, 3):
        cost = split_shift_cost([0.5, 1.5, 0.5], float(shift), 1)
        shifted = np.roll(total, shift)
        for alpha in (2.0, 8.0):
            assert _renyi(shifted, total, alpha) <= alpha * cost / 2 * (1 + 1e-9)


def test_the_accountants_compose_each_figure():
    kw = {"method": "rdp", "sampling": {"sampling_rate": 0.05, "sampling": "poisson"}}
    accs = floor_accountants(1.2, 1e-5, noise_floor=0.25, sensitivity_units=4096.0,
                             coordinates=62, **kw)  # fmt: skip
    m = floor_multipliers(1.2, 0.25, 4096.0, 62)
    eps = {name: accs[name].epsilon_after(100) for name in FIGURES}  # type: ignore[union-attr]
    for name in FIGURES:
        direct = PrivacyAccountant(m.as_dict()[name], 1e-5, 0.05).epsilon_after(100)
        assert eps[name] == pytest.approx(direct)
    assert eps["everyone"] < eps["curious_server"] < eps["deviating_server"]
    assert floor_accountants(1.2, 1e-5, noise_floor=0.0, sensitivity_units=4096.0,
                             coordinates=62, **kw)["deviating_server"] is None  # fmt: skip
    header = {
        "noise_multiplier": 1.2, "delta": 1e-5, "accountant": "rdp",
        "sampling": kw["sampling"], "sensitivity_units": 4096.0,
        "noise_floor": {"fraction": 0.25, "coordinates": 62},
    }  # fmt: skip
    assert floor_epsilons(header, 100) == pytest.approx(eps)
    assert floor_epsilons({**header, "noise_floor": None}, 100) is None


@pytest.mark.parametrize("bad", [-0.1, 1.0, 1.5])
def test_a_floor_outside_zero_one_is_refused(bad):
    with pytest.raises(ValueError, match="noise_floor must be in"):
        floor_multipliers(1.0, bad, 10.0, 10)


def test_the_floors_ratio_does_not_depend_on_the_multiplier():
    """What lets a noise schedule's phases, and the calibration, scale by one factor."""
    for figure in FIGURES:
        ratios = {
            round(getattr(floor_multipliers(z, 0.25, 1026.0, 62), figure) / z, 12)
            for z in (0.3, 0.8, 1.7, 12.0)
        }
        assert len(ratios) == 1, (figure, ratios)


def test_a_schedules_phases_are_each_scaled_by_the_floor():
    schedule = [[0, 1.2, 0.05], [10, 0.9, 0.1]]
    sampling = {"sampling_rate": 0.05, "sampling": "poisson", "unit": "provider",
                "schedule": schedule}  # fmt: skip
    accs = floor_accountants(1.2, 1e-5, method="rdp", sampling=sampling, noise_floor=0.25,
                             sensitivity_units=1026.0, coordinates=62)  # fmt: skip
    factor = floor_multipliers(1.0, 0.25, 1026.0, 62).deviating_server  # sqrt(f)
    phases = [[0, 1.2 * factor, 0.05], [10, 0.9 * factor, 0.1]]
    direct = PrivacyAccountant(1.2 * factor, 1e-5, 0.05, unit="provider", schedule=phases)
    deviating = accs["deviating_server"]
    assert deviating is not None
    assert deviating.epsilon_after(20) == pytest.approx(direct.epsilon_after(20))

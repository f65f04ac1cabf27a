"""Private feature statistics (issue 48 part 2): the release vector, its sensitivity, the
estimates from its noisy sum, the accountant's composition with training, the scale warning."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld, rdp

from spgc.privacy.accounting import (
    PrivacyAccountant,
    analytic_gaussian_noise_multiplier,
    calibrate_noise_multiplier,
    epsilon_for,
)
from spgc.privacy.feature_stats import (
    MAX_FEATURES,
    FeatureRanges,
    Standardization,
    StatsRelease,
    StatsThenStepsAccountant,
    contribution_units,
    estimate,
    release_dim,
    scale_warning,
    sensitivity_units,
)
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.transport import DEFAULT_MAX_MESSAGE_BYTES

RANGES = FeatureRanges.from_pairs([[18, 90], [50, 400], [0, 1]])


def _clinical(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)  # test data only; never shares or noise
    return np.column_stack(
        [rng.normal(55, 12, n), rng.normal(180, 40, n), rng.integers(0, 2, n)]
    ).astype(np.float64)


def test_one_example_stays_within_the_sensitivity_whatever_its_values():
    extreme = np.array([[-1e9, 1e9, 1.0], [90, 400, 1], [89.99999, 399.9999, 0.99999]])
    bound = sensitivity_units(RANGES.features)
    assert bound == pytest.approx((1 << 16) * math.sqrt(7))
    for row in extreme:
        v = contribution_units(row[None, :], RANGES).astype(np.float64)
        assert np.linalg.norm(v) <= bound
    # The worst example reaches the bound exactly: it is not loose.
    top = contribution_units(np.array([[90.0, 400.0, 1.0]]), RANGES).astype(np.float64)
    assert np.linalg.norm(top) == pytest.approx(bound)


def test_providers_vectors_add_up_to_the_pooled_data():
    x = _clinical(300, 1)
    parts = [contribution_units(p, RANGES) for p in np.array_split(x, 3)]
    assert np.array_equal(sum(parts), contribution_units(x, RANGES))
    assert len(parts[0]) == release_dim(3)


def test_estimates_without_noise_are_the_clipped_data_statistics():
    x = _clinical(500, 2)
    stats = estimate(contribution_units(x, RANGES).astype(np.float64), RANGES)
    clipped = np.clip(x, RANGES.lo, RANGES.hi)
    np.testing.assert_allclose(stats.mean, clipped.mean(axis=0), rtol=1e-4)
    np.testing.assert_allclose(stats.std, clipped.std(axis=0), rtol=1e-3)
    assert stats.count == 500
    z = stats.apply(x)
    np.testing.assert_allclose(z.mean(axis=0), 0, atol=1e-3)


def test_a_release_at_epsilon_one_with_noise_at_three_sigma_gives_usable_statistics():
    x = _clinical(30_000, 3)
    z = analytic_gaussian_noise_multiplier(1.0, 1e-5)
    sigma = z * sensitivity_units(RANGES.features)
    # Deterministic noise at 3 sigma on every coordinate, signs alternating: the statistics
    # must survive noise far beyond what the release draws typically.
    noise = 3 * sigma * np.where(np.arange(release_dim(3)) % 2 == 0, 1.0, -1.0)
    stats = estimate(contribution_units(x, RANGES) + noise, RANGES)
    clipped = np.clip(x, RANGES.lo, RANGES.hi)
    np.testing.assert_allclose(stats.mean, clipped.mean(axis=0), rtol=0.02)
    np.testing.assert_allclose(stats.std, clipped.std(axis=0), rtol=0.1)
    assert stats.floored == ()


def test_a_tiny_noisy_count_is_refused_and_a_negative_variance_floored():
    noisy = np.zeros(release_dim(3))
    noisy[-1] = 3 * (1 << 16)
    with pytest.raises(ValueError, match=r"noisy example count is 3\.0, below 10"):
        estimate(noisy, RANGES)
    noisy[-1] = 100 * (1 << 16)
    noisy[:3] = 50 * (1 << 16)  # means at mid-range, sums of squares 0: variance negative
    stats = estimate(noisy, RANGES)
    assert stats.floored == (0, 1, 2)
    np.testing.assert_allclose(stats.std, RANGES.width * 0.01)
    assert np.all(np.isfinite(stats.apply(_clinical(5, 4))))


def test_statistics_round_trip_as_stored_with_the_model():
    stats = Standardization(np.array([1.0, 2.0]), np.array([3.0, 4.0]), 99.0)
    again = Standardization.from_dict(stats.to_dict())
    assert np.array_equal(again.mean, stats.mean) and np.array_equal(again.std, stats.std)
    with pytest.raises(ValueError, match="std > 0"):
        Standardization.from_dict({"feature_mean": [0.0], "feature_std": [0.0]})


def test_more_features_than_one_message_carries_are_refused_in_one_line():
    """The ranges and the released statistics travel to each provider in one ServerInfo: at
    MAX_FEATURES it stays within the message limit with room to spare; one more feature is
    refused when the plan is read, naming the limit, never a failure at a provider's call."""
    n = MAX_FEATURES
    info = pb.ServerInfo(
        config=pb.TrainingConfig(feature_lo=[-1.5] * n, feature_hi=[2.5] * n),
        round=pb.RoundInfo(feature_mean=[0.25] * n, feature_std=[0.75] * n),
    )
    assert info.ByteSize() < 0.6 * DEFAULT_MAX_MESSAGE_BYTES
    assert FeatureRanges.from_pairs([[0, 1]] * n).features == n
    with pytest.raises(ValueError, match=r"standardize with 16,385 features: at most 16,384"):
        FeatureRanges.from_pairs([[0, 1]] * (n + 1))
    with pytest.raises(ValueError, match=r"standardize with 16,385 features"):  # a test set's
        FeatureRanges(np.zeros(n + 1), np.ones(n + 1))


def test_bad_ranges_name_the_pair():
    with pytest.raises(ValueError, match=r"feature_ranges\[1\] must be finite with lo < hi"):
        FeatureRanges.from_pairs([[0, 1], [5, 5]])
    with pytest.raises(ValueError, match="ranges for 3 features"):
        RANGES.unit_values(np.zeros((4, 2)))


@pytest.mark.parametrize("method", ["rdp", "pld"])
def test_the_accountant_composes_the_statistics_release_with_the_steps(method):
    grid = {"value_discretization_interval": 1e-2}  # coarse (pessimistic) PLD: a fast test
    with_stats = PrivacyAccountant(1.0, 1e-5, 0.05, method=method, unsampled=[5.0], **grid)
    ref = rdp.RdpAccountant() if method == "rdp" else pld.PLDAccountant(**grid)
    ref.compose(dp_accounting.PoissonSampledDpEvent(0.05, dp_accounting.GaussianDpEvent(1.0)), 5)
    ref.compose(dp_accounting.GaussianDpEvent(5.0))
    assert with_stats.epsilon_after(5) == pytest.approx(ref.get_epsilon(1e-5), rel=1e-9)
    without = PrivacyAccountant(1.0, 1e-5, 0.05, method=method, **grid)
    assert with_stats.epsilon_after(5) > without.epsilon_after(5)
    # Before any training step the statistics release alone is spent.
    assert with_stats.epsilon_after(0) > 0 == without.epsilon_after(0)


def test_calibration_leaves_room_for_the_statistics_release():
    """calibration: accountant fits the training's noise so that the whole run, the release
    made once included, meets the target; a release that alone spends it is refused."""
    alone = calibrate_noise_multiplier(4.0, 1e-5, 0.05, 60)
    z = calibrate_noise_multiplier(4.0, 1e-5, 0.05, 60, unsampled=[2.0])
    assert z > alone
    both = PrivacyAccountant(z, 1e-5, 0.05, unsampled=[2.0])
    assert 4.0 * (1 - 1e-3) <= both.epsilon_after(60) <= 4.0
    assert epsilon_for(z, 1e-5, 0.05, 60, unsampled=[2.0]) == both.epsilon_after(60)
    with pytest.raises(ValueError, match=r"noise multipliers 0\.5\) spend epsilon .* alone, not"):
        calibrate_noise_multiplier(4.0, 1e-5, 0.05, 60, unsampled=[0.5])


def test_the_discrete_accountant_adds_the_discrete_gaussians_curve():
    plain = PrivacyAccountant(1.0, 1e-5, 0.05, method="rdp_discrete")
    both = PrivacyAccountant(1.0, 1e-5, 0.05, method="rdp_discrete", unsampled=[5.0])
    assert both.epsilon_after(40) > plain.epsilon_after(40)
    with pytest.raises(ValueError, match="unsampled release's noise multiplier"):
        PrivacyAccountant(1.0, 1e-5, 0.05, unsampled=[0.0])


def test_the_scale_warning_names_the_wide_columns_and_spares_standardised_data():
    x = _clinical(200, 5)
    x[:, 2] = x[:, 2] * 0.01  # a column 0.005 wide against lab values 40 wide
    text = scale_warning(x, ("age", "ldl", "flag"))
    assert text is not None and "ldl (std" in text and "against flag (std" in text
    assert "age (std" in text  # 12 / 0.005: also more than 100x
    assert scale_warning((x - x.mean(0)) / x.std(0), ("age", "ldl", "flag")) is None
    assert scale_warning(np.zeros((10, 3))) is None  # constant columns have no scale
    many = np.column_stack([x[:, 1]] * 20 + [x[:, 2]])  # 20 wide columns, one narrow
    text = scale_warning(many)
    assert text is not None and "column 7 (std" in text and "and 12 more against column 20" in text


def test_the_release_fits_a_rounds_vector_bound_and_its_noise_scales_with_its_sensitivity():
    bound = 400 * 1_000_003.0  # a round's vector: max_batch_size x one example's bound
    release = StatsRelease.fit(RANGES, 2.5, bound, max_rows=1500)
    root = math.sqrt(release_dim(3))
    assert release.max_rows * release.scale * root <= bound  # every provider's vector fits
    assert (release.max_rows) * (release.scale + 1) * root > bound  # and the scale is the largest
    assert release.sensitivity_units == pytest.approx(release.scale * root)
    assert release.sigma_units == pytest.approx(2.5 * release.scale * root)
    # The worst provider (max_rows rows at the top of every range) reaches the bound it fits.
    worst = np.tile([[90.0, 400.0, 1.0]], (1500, 1))
    v = release.contribution(worst).astype(np.float64)
    assert np.linalg.norm(v) == pytest.approx(release.vector_norm_bound_units)
    assert np.linalg.norm(v) <= bound


def test_the_release_is_padded_to_a_rounds_length_and_its_estimate_ignores_the_padding():
    release = StatsRelease.fit(RANGES, 1.0, 1e12, max_rows=1000)
    x = _clinical(600, 5)
    padded = release.contribution(x, length=20)
    assert padded.shape == (20,) and not padded[release_dim(3) :].any()
    noisy = padded.astype(np.float64)
    noisy[release_dim(3) :] = 1e9  # a round's noise on the padding: never read
    stats = release.estimate(noisy)
    clipped = np.clip(x, RANGES.lo, RANGES.hi)
    assert np.allclose(stats.mean, clipped.mean(axis=0), rtol=1e-4)
    assert np.allclose(stats.std, clipped.std(axis=0), rtol=1e-3)


def test_the_release_refuses_what_would_break_its_bound():
    release = StatsRelease.fit(RANGES, 1.0, 1e9, max_rows=10)
    with pytest.raises(ValueError, match=r"11 rows: .* at most 10 rows"):
        release.contribution(_clinical(11, 6))
    with pytest.raises(ValueError, match="cannot hold the 7 statistics"):
        release.contribution(_clinical(3, 6), length=6)
    with pytest.raises(ValueError, match="do not fit a round's vector bound"):
        StatsRelease.fit(RANGES, 1.0, 500.0, max_rows=10)
    with pytest.raises(ValueError, match="noise multiplier must be > 0"):
        StatsRelease.fit(RANGES, 0.0, 1e9, max_rows=10)


def test_the_runs_accountant_counts_the_statistics_as_its_first_release():
    both = StatsThenStepsAccountant(
        1.2, 1e-5, sampling_rate=0.05, method="rdp", sampling="poisson", unsampled=[4.0]
    )
    plain = PrivacyAccountant(
        1.2, 1e-5, sampling_rate=0.05, method="rdp", sampling="poisson", unsampled=[4.0]
    )
    assert both.epsilon_after(0) == 0.0  # nothing released yet
    assert both.epsilon_after(1) == pytest.approx(plain.epsilon_after(0))  # the statistics
    assert both.epsilon_after(11) == pytest.approx(plain.epsilon_after(10))  # and 10 steps
    both.step(3)
    assert both.epsilon() == pytest.approx(plain.epsilon_after(2))

"""Private feature statistics (issue 48 part 2): per-feature means and deviations for
standardising every provider's features, from one differentially private release.

Features on their natural scales (age in years, lab values in the hundreds) leave DP-SGD's
clipped gradients dominated by the widest column; no provider can standardise alone without
its data being pooled. Instead every provider contributes, per feature j, the sums of its
examples' values and squared values, and its row count; one noisy release of the total gives
means and deviations anyone may apply.

The release's vector (length 2F + 1 for F features). Each value is first clipped to the range
the plan declares for its feature, [lo_j, hi_j], and mapped onto [0, 1]:
u_j = (clip(v_j) - lo_j) / (hi_j - lo_j). One example contributes (u_1..u_F, u_1^2..u_F^2, 1)
times the fixed-point ``scale`` s, each coordinate rounded to the nearest integer: every
coordinate lies in [0, s] whatever the rounding, so one example's vector has L2 norm at most
``s sqrt(2F + 1)`` units, the release's add/remove-one sensitivity (no rounding inflation).
Mapping onto [0, 1] first is why: released on the natural scale, a feature of range 500 would
put 500^4 into the squared sensitivity and drown the count and every other feature in noise.
Replace-one changes no count and moves each u and u^2 by at most 1, so the same bound holds
for fixed batches.

The noise is a discrete Gaussian of std ``noise_multiplier x sensitivity`` on the integer sum,
released once without sampling; :class:`spgc.privacy.accounting.PrivacyAccountant` composes it with
the training's releases (its ``unsampled`` releases). The means and deviations then follow
from the noisy sums (:func:`estimate`), guarded against a tiny or negative noisy count and a
negative noisy variance.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from spgc.privacy.accounting import PrivacyAccountant

__all__ = [
    "DEFAULT_SCALE",
    "MAX_FEATURES",
    "MAX_SCALE_RATIO",
    "FeatureRanges",
    "Standardization",
    "StatsRelease",
    "StatsThenStepsAccountant",
    "contribution_units",
    "estimate",
    "release_dim",
    "scale_warning",
    "sensitivity_units",
]

#: Fixed-point units per unit of a value mapped onto [0, 1]: 2^16 keeps the rounding error
#: (half a unit per example) far below any noise the release carries.
DEFAULT_SCALE = 1 << 16

#: The most features a plan may standardize: their ranges (the plan) and released statistics
#: (each round's info) travel as four 8-byte numbers a feature in one message to a provider
#: (ServerInfo), which must stay within gRPC's message limit (spgc.wire.transport: 1 MiB and
#: 64 KiB): 16,384 features take 512 KiB of it, leaving room for the rest of the plan.
MAX_FEATURES = 16_384

#: Columns whose scales differ by more than this factor get a warning without standardize.
MAX_SCALE_RATIO = 100.0

# A feature's deviation is never taken below this fraction of its declared range: the noisy
# variance can be tiny or negative (few examples, or a near-constant feature), and dividing by
# it would blow the feature, and the noise in its mean, up instead of standardising it.
_MIN_STD_FRACTION = 0.01

# The scale warning names at most this many wide columns.
_NAMED_COLUMNS = 8


@dataclass(frozen=True)
class FeatureRanges:
    """The range [lo_j, hi_j] the plan declares for each feature (values are clipped to it)."""

    lo: np.ndarray
    hi: np.ndarray

    def __post_init__(self) -> None:
        if len(self.lo) > MAX_FEATURES:  # declared, or a test set's columns
            raise ValueError(
                f"standardize with {len(self.lo):,} features: at most {MAX_FEATURES:,} are "
                "supported (the ranges and the released statistics travel in one message to "
                "each provider); standardize the columns before the run instead"
            )

    @classmethod
    def from_pairs(
        cls, pairs: Sequence[Sequence[float]], what: str = "feature_ranges"
    ) -> FeatureRanges:
        """From ``[[lo, hi], ...]``; ValueError naming ``what`` and the pair for a bad one."""
        lo, hi = [], []
        for j, pair in enumerate(pairs):
            if len(pair) != 2:
                raise ValueError(f"{what}[{j}] must be [lo, hi], got {list(pair)!r}")
            a, b = float(pair[0]), float(pair[1])
            if not (math.isfinite(a) and math.isfinite(b) and a < b):
                raise ValueError(f"{what}[{j}] must be finite with lo < hi, got [{a:g}, {b:g}]")
            lo.append(a)
            hi.append(b)
        if not lo:
            raise ValueError(f"{what} must name at least one feature's [lo, hi]")
        return cls(np.asarray(lo, dtype=np.float64), np.asarray(hi, dtype=np.float64))

    @property
    def features(self) -> int:
        """F, the number of features."""
        return len(self.lo)

    @property
    def width(self) -> np.ndarray:
        """hi - lo per feature."""
        return self.hi - self.lo

    def unit_values(self, x: np.ndarray) -> np.ndarray:
        """``x`` (n, F) clipped to the ranges and mapped onto [0, 1]; ValueError when ``x``
        does not have F feature columns."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != self.features:
            raise ValueError(
                f"the data has shape {x.shape}: the plan declares ranges for {self.features} "
                "features, one column each"
            )
        return (np.clip(x, self.lo, self.hi) - self.lo) / self.width


def release_dim(features: int) -> int:
    """The release vector's length: F sums, F sums of squares, the count."""
    return 2 * features + 1


def sensitivity_units(features: int, scale: int = DEFAULT_SCALE) -> float:
    """L2 norm bound of one example's vector in units: s sqrt(2F + 1)."""
    return scale * math.sqrt(release_dim(features))


def contribution_units(
    x: np.ndarray, ranges: FeatureRanges, scale: int = DEFAULT_SCALE
) -> np.ndarray:
    """One provider's release vector (int64, length 2F + 1): per example each coordinate
    rounded to units within [0, scale], then summed over the examples (module docstring)."""
    u = ranges.unit_values(x)
    per_example = np.concatenate(
        [np.rint(scale * u), np.rint(scale * u * u), np.full((len(u), 1), float(scale))], axis=1
    )
    return per_example.sum(axis=0).astype(np.int64)


@dataclass(frozen=True)
class Standardization:
    """The released per-feature means and deviations; features are standardised as
    (x - mean) / std."""

    mean: np.ndarray
    std: np.ndarray
    count: float  # the noisy count of examples the statistics come from
    floored: tuple[int, ...] = ()  # features whose deviation was raised to the floor

    def apply(self, x: np.ndarray) -> np.ndarray:
        """``x`` (n, F) standardised, as float32 (what the models take)."""
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != len(self.mean):
            raise ValueError(
                f"the data has shape {x.shape}: the statistics are for {len(self.mean)} "
                "features, one column each"
            )
        return ((x - self.mean) / self.std).astype(np.float32)

    def to_dict(self) -> dict[str, object]:
        """As stored with the model (lists of floats; JSON-ready)."""
        return {
            "feature_mean": [float(v) for v in self.mean],
            "feature_std": [float(v) for v in self.std],
            "examples": float(self.count),
        }

    @classmethod
    def from_dict(cls, data: dict[str, object]) -> Standardization:
        """The inverse of :meth:`to_dict`."""
        mean = np.asarray(data["feature_mean"], dtype=np.float64)
        std = np.asarray(data["feature_std"], dtype=np.float64)
        if mean.shape != std.shape or mean.ndim != 1 or np.any(std <= 0):
            raise ValueError("feature_mean and feature_std must be equal-length, std > 0")
        return cls(mean, std, float(data.get("examples", 0.0)))  # type: ignore[arg-type]


def estimate(
    noisy_units: np.ndarray,
    ranges: FeatureRanges,
    scale: int = DEFAULT_SCALE,
    *,
    min_count: float = 10.0,
) -> Standardization:
    """Means and deviations from the released noisy sum (length 2F + 1, units). ValueError
    when the noisy count is below ``min_count`` (the noise would dominate every mean). The
    means are kept within the declared ranges and each deviation at least 1/100 of its
    range (a negative noisy variance included)."""
    y = np.asarray(noisy_units, dtype=np.float64) / scale
    f = ranges.features
    if y.shape != (release_dim(f),):
        raise ValueError(f"the release has {y.shape} values; {release_dim(f)} expected")
    count = float(y[-1])
    if not count >= min_count:
        raise ValueError(
            f"the feature statistics' noisy example count is {count:.1f}, below {min_count:g}: "
            "too few examples for means and deviations; lower the release's noise or add data"
        )
    mean_u = np.clip(y[:f] / count, 0.0, 1.0)
    var_u = y[f : 2 * f] / count - mean_u**2
    floor = _MIN_STD_FRACTION**2
    floored = tuple(int(j) for j in np.flatnonzero(var_u < floor))
    std_u = np.sqrt(np.maximum(var_u, floor))
    return Standardization(ranges.lo + ranges.width * mean_u, ranges.width * std_u, count, floored)


def scale_warning(
    x: np.ndarray, names: Sequence[str] = (), ratio: float = MAX_SCALE_RATIO
) -> str | None:
    """A warning naming the columns when the feature columns' scales (their standard
    deviations; constant columns left out) differ by more than ``ratio``; None otherwise, or
    for data that are not one row of features per example."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] < 2 or len(x) < 2:
        return None
    std = x.std(axis=0)
    varying = np.flatnonzero(std > 0)
    if len(varying) < 2:
        return None
    smallest = varying[np.argmin(std[varying])]
    wide = [int(j) for j in varying if std[j] > ratio * std[smallest]]
    if not wide:
        return None
    label = list(names) if len(names) == x.shape[1] else [f"column {j}" for j in range(x.shape[1])]

    def col(j: int) -> str:
        return f"{label[j]} (std {std[j]:.3g})"

    named = ", ".join(col(j) for j in wide[:_NAMED_COLUMNS])
    if len(wide) > _NAMED_COLUMNS:  # a wide table (pixels, say) must not flood the log
        named += f" and {len(wide) - _NAMED_COLUMNS} more"
    return (
        f"feature scales differ by more than {ratio:g}x: {named} "
        f"against {col(int(smallest))}: DP training clips every example's gradient to one norm, "
        "so the widest columns dominate it; standardise or rescale the features"
    )


@dataclass(frozen=True)
class StatsRelease:
    """The release's parameters fitted to a round's vector, so that it can travel as one:
    every provider's vector of (at most ``max_rows`` examples) sums lies within
    ``vector_bound_units``, the L2 bound a round's share vector is held to (the ring is sized
    for it; with verified inputs, the norm proof's bound), whatever its data.

    The fixed-point ``scale`` is the largest with ``max_rows x scale x sqrt(2F + 1)`` within that
    bound; one example's vector is at most ``sensitivity_units`` = ``scale x sqrt(2F + 1)``
    (add/remove-one, module docstring), and the release's discrete Gaussian has std
    ``noise_multiplier x sensitivity_units``. The noise relative to the count,
    ``noise_multiplier x sqrt(2F + 1) / n``, does not depend on the scale: the bound only sets
    how fine the rounding is.
    """

    ranges: FeatureRanges
    noise_multiplier: float
    max_rows: int
    scale: int

    #: Below this many units per unit value the rounding (at most half a unit per example
    #: and coordinate, of either sign: it mostly cancels in the sums) would no longer be
    #: small against the values' spread within their ranges.
    MIN_SCALE = 32

    @classmethod
    def fit(
        cls,
        ranges: FeatureRanges,
        noise_multiplier: float,
        vector_bound_units: float,
        max_rows: int,
    ) -> StatsRelease:
        """The largest scale that fits; ValueError (naming what to change) when even
        :attr:`MIN_SCALE` does not, or for a bad argument."""
        if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
            raise ValueError(f"the release's noise multiplier must be > 0, got {noise_multiplier}")
        if max_rows < 1:
            raise ValueError(f"max_rows must be at least 1, got {max_rows}")
        root = math.sqrt(release_dim(ranges.features))
        scale = math.floor(vector_bound_units / (max_rows * root))
        while scale > 0 and max_rows * scale * root > vector_bound_units:  # float rounding
            scale -= 1
        if scale < cls.MIN_SCALE:
            raise ValueError(
                f"the feature statistics of up to {max_rows} rows per provider do not fit a "
                f"round's vector bound of {vector_bound_units:.6g} units at a scale of "
                f"{cls.MIN_SCALE} or more: lower the rows per provider the release is sized "
                "for, or raise scale or max_batch_size"
            )
        return cls(ranges, float(noise_multiplier), int(max_rows), int(scale))

    @property
    def dim(self) -> int:
        """The release vector's length, 2F + 1."""
        return release_dim(self.ranges.features)

    @property
    def sensitivity_units(self) -> float:
        """One example's L2 bound in units (the release's add/remove-one sensitivity)."""
        return sensitivity_units(self.ranges.features, self.scale)

    @property
    def sigma_units(self) -> float:
        """The std of the release's discrete Gaussian, in units."""
        return self.noise_multiplier * self.sensitivity_units

    @property
    def vector_norm_bound_units(self) -> float:
        """The L2 bound of one provider's vector (``max_rows`` examples)."""
        return self.max_rows * self.sensitivity_units

    def contribution(self, x: np.ndarray, length: int | None = None) -> np.ndarray:
        """One provider's vector (int64) for its feature rows ``x``, zero-padded to ``length``
        (a round's vector length; default :attr:`dim`). ValueError for more than ``max_rows``
        rows (the bound would not hold) or a ``length`` below :attr:`dim`."""
        n = len(x)
        if n > self.max_rows:
            raise ValueError(
                f"the data has {n} rows: the feature statistics' release is sized for at most "
                f"{self.max_rows} rows per provider"
            )
        length = self.dim if length is None else length
        if length < self.dim:
            raise ValueError(f"a vector of {length} values cannot hold the {self.dim} statistics")
        out = np.zeros(length, dtype=np.int64)
        out[: self.dim] = contribution_units(x, self.ranges, self.scale)
        return out

    def estimate(self, noisy_units: np.ndarray, *, min_count: float = 10.0) -> Standardization:
        """The means and deviations from the released noisy sum (its first :attr:`dim`
        values; a round's padding after them is ignored)."""
        y = np.asarray(noisy_units)[: self.dim]
        return estimate(y, self.ranges, self.scale, min_count=min_count)


class StatsThenStepsAccountant(PrivacyAccountant):
    """A run's accountant counted in releases when release 0 is the feature statistics'
    (``standardize: true``): ``epsilon_after(n)`` is 0 before any release and, for n >= 1,
    the statistics' release (its ``unsampled`` noise multiplier) composed with n - 1 steps;
    ``step()`` counts every release, the statistics' included. Construct it with
    ``unsampled=[the release's noise multiplier]``."""

    def epsilon_after(self, steps: int) -> float:
        """Epsilon after ``steps`` releases in total (the first the statistics')."""
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        return 0.0 if steps == 0 else super().epsilon_after(steps - 1)

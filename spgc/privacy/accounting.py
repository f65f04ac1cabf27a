"""Privacy accounting and noise calibration (dp-accounting: RDP or PLD, with subsampling).

Units. Every noise multiplier here is ``noise std / sensitivity`` measured in the same units.
In SPGC both are fixed-point units: the noise is N_Z(0, sigma_units^2) on the integer sum and the
add/remove-one sensitivity is ``B = FixedPointConfig.l2_bound_units`` (the L2 bound enforced on
every encoded example, which includes the rounding inflation over ``s*C``). So pass
``noise_multiplier = sigma_units / B`` (``units_noise_multiplier``); with the spec's noise std
``s*sigma*C`` that is ``sigma / inflation``. Equivalently, to keep a calibrated multiplier
``sigma``, draw noise of std ``sigma * B`` units.

Neighbouring relation. ``sampling="poisson"`` (default, what providers do by default) accounts
add/remove-one-example DP with a ``PoissonSampledDpEvent`` of rate q. ``sampling="fixed"`` (the
paper's fixed-size shuffled batches) gets NO amplification by sampling: shuffling is not
sampling without replacement (Chua et al. 2024, "How Private are DP-SGD Implementations?").
Each example is in at most one release per epoch of ``population // sample_size`` batches
(providers draw batch r mod E of epoch r // E for the run's release r), so an epoch is one
Gaussian release per example under replace-one adjacency, whose sensitivity for a
sum of examples of norm <= B is 2B: the Gaussian event gets ``noise_multiplier / 2`` (inputs
stay relative to B), composed over the epochs begun (a partial epoch counts as a whole one).
Replace-one is the adjacency every report names for fixed batches. RDP only (PLD refused, as
before, to keep one tested path). With several providers, an example is sampled at its own
provider's rate: pass the largest rate over providers (worst case).

Discrete noise. SPGC adds discrete Gaussian noise N_Z(0, sigma^2) to integer sums. Its Renyi
divergence for an integer shift is at most the continuous Gaussian's, alpha Delta^2 / (2 sigma^2)
(its moment generating function is at most the continuous one's, Canonne-Kamath-Steinke 2020),
and divergences add over independent coordinates: one release, and fixed batches (no
amplification), are accounted exactly as proved. Poisson subsampling is where "rdp" and "pld"
assume: their amplification formulas are the continuous Gaussian's, standard practice for the
discrete one but not a theorem. ``method="rdp_discrete"`` assumes nothing: Zhu and Wang's
general bound for Poisson subsampling (ICML 2019, Theorem 6), which holds for any mechanism
given its RDP at integer orders, applied to the discrete Gaussian's curve, and never above that
curve (subsampling cannot hurt: Renyi divergence is jointly quasi-convex). It is looser: a
larger epsilon for the same noise, or more noise for the same target.

Capped Poisson batches. A provider whose Poisson batch is larger than the ring is sized for
(``max_batch_size``) sits the round out, an outcome the subsampled Gaussian does not model.
``poisson_overflow_log2`` bounds its probability (Chernoff); providers join only where it is at
most 2^``BATCH_OVERFLOW_LOG2`` per round, and the reported delta counts it per release, like the
sampler's statistical distance.

Calibration. ``classic_noise_multiplier`` is the paper's ``sqrt(2 ln(1.25/delta))/epsilon``
(Dwork-Roth Thm A.1), valid only for epsilon < 1: it raises ValueError for epsilon >= 1 unless
``allow_invalid=True`` (paper reproduction only; the guarantee does not hold there).
``analytic_gaussian_noise_multiplier`` is Balle-Wang 2018's exact per-release calibration, valid
for every epsilon. ``calibrate_noise_multiplier`` calibrates the whole training with the
accountant (the default for training).
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

import dp_accounting
import numpy as np
from dp_accounting import pld, rdp
from scipy.optimize import brentq
from scipy.special import gammaln, log_ndtr, logsumexp

from garbled_core.discrete_gaussian import DEFAULT_DISTANCE_LOG2

__all__ = [
    "ACCOUNTANTS",
    "BATCH_OVERFLOW_LOG2",
    "DISCRETE_RDP_ORDERS",
    "PrivacyAccountant",
    "analytic_gaussian_delta",
    "analytic_gaussian_noise_multiplier",
    "batches_per_epoch",
    "calibrate_noise_multiplier",
    "capped_poisson",
    "classic_noise_multiplier",
    "discrete_gaussian_subsampled_rdp",
    "epsilon_for",
    "noise_multiplier_for",
    "per_step_epsilon",
    "poisson_overflow_log2",
    "quiet_dp_accounting",
    "reported_delta",
    "smallest_batch_cap",
    "units_noise_multiplier",
]

Method = Literal["rdp", "pld", "rdp_discrete"]
# The accountants a run may name (config, `spgc account`, the wire's TrainingConfig.accountant).
ACCOUNTANTS: tuple[str, ...] = ("rdp", "pld", "rdp_discrete")
Sampling = Literal["poisson", "fixed"]
#: What one sampled, clipped contribution is: one training example (DP-SGD, per-example
#: gradients) or one provider's whole data (DP-FedAvg: its clipped model delta). The arithmetic
#: is the same (a Poisson-sampled Gaussian of multiplier noise std / bound); the guarantee's
#: neighbouring relation, and so every report, names the unit.
Unit = Literal["example", "provider"]
UNITS: tuple[str, ...] = ("example", "provider")
Calibration = Literal["classic", "analytic", "accountant"]



class _ExcludedOrderNotes(logging.Filter):
    """dp-accounting logs, through absl, a WARNING for each RDP order it leaves out of an answer
    (its series did not converge there; the epsilon, a minimum over the other orders, stays an
    upper bound): dozens of lines per answer on the stderr of a program that calls us (the
    Python API, examples/standardize) and has not silenced absl as the daemons do. Only those
    notes are dropped; absl's other records pass, and no logger's level is changed."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Excluding this order" not in record.getMessage()


if not any(isinstance(f, _ExcludedOrderNotes) for f in logging.getLogger("absl").filters):
    logging.getLogger("absl").addFilter(_ExcludedOrderNotes())

# dp-accounting's own default PLD grid; coarser grids are faster and still pessimistic.
DEFAULT_PLD_DISCRETIZATION = 1e-4


# The most a round's Poisson batch may exceed max_batch_size by chance (log2 of the
# probability): where a provider's data could do it more often, the provider does not join.
BATCH_OVERFLOW_LOG2 = -64


def poisson_overflow_log2(n: int, q: float, cap: int) -> float:
    """log2 of an upper bound on P[Binomial(n, q) > cap], the chance that a Poisson batch of
    ``n`` examples at rate ``q`` is larger than ``cap``: the Chernoff bound
    exp(-n KL((cap+1)/n || q)); -inf when it cannot happen."""
    k = cap + 1
    if k > n or q <= 0.0:
        return -math.inf
    a = k / n
    if q >= 1.0 or a <= q:
        return 0.0
    kl = a * math.log(a / q) + ((1.0 - a) * math.log((1.0 - a) / (1.0 - q)) if a < 1.0 else 0.0)
    return -n * kl / math.log(2.0)


def capped_poisson(sampling: dict[str, object], max_batch_size: int) -> bool:
    """Whether a run's releases carry the capped-batch term of :func:`reported_delta`: Poisson
    sampling (``sampling`` as the accountant takes it) with a max_batch_size cap."""
    return sampling.get("sampling", "poisson") == "poisson" and int(max_batch_size) > 0


def reported_delta(
    delta: float, epsilon: float, noise_samples: int, capped_releases: int = 0
) -> float:
    """The delta of the guarantee, the one formula the servers, ``spgc account`` and providers'
    budget files use: the accountant's ``delta`` plus what no accountant models, each counted
    as (1 + e^epsilon) times its probability (an event of probability p moves delta by at most
    that much at ``epsilon``): the sampler's statistical distance, 2^DEFAULT_DISTANCE_LOG2 per
    noise sample (docs/NOISE_SAMPLER.md), and, for each of ``capped_releases`` releases of a
    Poisson run with a max_batch_size cap, the chance 2^BATCH_OVERFLOW_LOG2 that a provider's
    batch was over the cap and sat the round out."""
    unmodelled = noise_samples * 2.0**DEFAULT_DISTANCE_LOG2
    unmodelled += capped_releases * 2.0**BATCH_OVERFLOW_LOG2
    return float(delta) + (1.0 + math.exp(min(float(epsilon), 700.0))) * unmodelled


def smallest_batch_cap(n: int, q: float, log2_bound: float = BATCH_OVERFLOW_LOG2) -> int:
    """The smallest cap a Poisson batch of ``n`` examples at rate ``q`` exceeds with
    probability at most 2^``log2_bound`` (by :func:`poisson_overflow_log2`)."""
    lo, hi = 0, max(n, 0)  # the bound is -inf at cap = n
    while lo < hi:
        mid = (lo + hi) // 2
        if poisson_overflow_log2(n, q, mid) <= log2_bound:
            hi = mid
        else:
            lo = mid + 1
    return lo


def batches_per_epoch(population: int, sample_size: int) -> int:
    """Fixed batches: the batches of one epoch, in which each example is in at most one (a
    provider uses batch r mod E of epoch r // E's permutation for the run's release r)."""
    return max(1, population // sample_size)


# Orders of the "rdp_discrete" curve. Zhu-Wang's bound is for integer orders; up to 1,024 as
# dp-accounting's own orders go (large orders serve small epsilons).
DISCRETE_RDP_ORDERS = np.concatenate(
    [np.arange(2, 257), [288, 320, 384, 448, 512, 640, 768, 896, 1024]]
).astype(float)


def discrete_gaussian_subsampled_rdp(
    noise_multiplier: float, sampling_rate: float, orders: np.ndarray = DISCRETE_RDP_ORDERS
) -> np.ndarray:
    """Upper bounds on the RDP, at integer ``orders``, of one Poisson-subsampled release of
    discrete Gaussian noise (std / add-remove L2 sensitivity = ``noise_multiplier``).

    The base curve eps(a) = a / (2 m^2) holds for the discrete Gaussian (module docstring). Zhu
    and Wang 2019, Theorem 6, for rate q and integer a >= 2 bounds the subsampled curve by
    log[(1-q)^(a-1) (a q - q + 1) + C(a,2) q^2 (1-q)^(a-2) e^eps(2)
        + 3 sum_{l=3..a} C(a,l) (1-q)^(a-l) q^l e^((l-1) eps(l))] / (a - 1),
    computed in log space; the result is never above eps(a) itself."""
    m = float(noise_multiplier)
    q = float(sampling_rate)
    if not (m > 0 and math.isfinite(m)):
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier}")
    if not 0 < q <= 1:
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    a_all = np.asarray(orders, dtype=float)
    if np.any(a_all < 2) or np.any(a_all != np.round(a_all)):
        raise ValueError("the orders must be integers >= 2")
    base = a_all / (2.0 * m * m)
    if q == 1.0:
        return base
    log_q, log_1q = math.log(q), math.log1p(-q)
    bound = np.empty_like(base)
    for i, a in enumerate(a_all):
        ls = np.arange(3.0, a + 1.0)
        log_binom = gammaln(a + 1) - gammaln(ls + 1) - gammaln(a - ls + 1)
        terms = [
            (a - 1) * log_1q + math.log1p((a - 1) * q),  # (1-q)^(a-1) (aq - q + 1)
            math.log(a * (a - 1) / 2) + 2 * log_q + (a - 2) * log_1q + 2.0 / (2 * m * m),
        ]
        rest = math.log(3.0) + log_binom + (a - ls) * log_1q + ls * log_q
        rest += (ls - 1) * ls / (2 * m * m)
        bound[i] = logsumexp(np.concatenate([terms, rest])) / (a - 1)
    return np.minimum(bound, base)


def units_noise_multiplier(noise_std_units: float, sensitivity_units: float) -> float:
    """noise std / sensitivity, both in fixed-point units (sensitivity = B from encoding)."""
    if not (sensitivity_units > 0 and math.isfinite(sensitivity_units)):
        raise ValueError(f"sensitivity_units must be finite and > 0, got {sensitivity_units}")
    if not (noise_std_units >= 0 and math.isfinite(noise_std_units)):
        raise ValueError(f"noise_std_units must be finite and >= 0, got {noise_std_units}")
    return noise_std_units / sensitivity_units


def _check_delta(delta: float) -> None:
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")


def _check_epsilon(epsilon: float) -> None:
    if not (epsilon > 0 and math.isfinite(epsilon)):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")


def adjacency_of(sampling: str, unit: str = "example") -> str:
    """The neighbouring relation a guarantee is stated for (every report names it): add/remove
    one example or one provider with Poisson sampling, replace one example with fixed
    batches."""
    if sampling == "fixed":
        return "replace one example"
    return f"add/remove one {unit}"


def check_schedule(schedule: Sequence[Sequence[float]]) -> tuple[tuple[int, float, float], ...]:
    """A noise schedule as (first step, noise multiplier, Poisson rate) phases: the first
    from step 0, then strictly increasing; ValueError naming the phase otherwise."""
    phases = []
    for i, phase in enumerate(schedule):
        try:
            start, z, q = phase
            start, z, q = int(start), float(z), float(q)
        except (TypeError, ValueError):
            raise ValueError(
                f"schedule phase {i}: expected (first step, z, q), got {phase!r}"
            ) from None
        if not (math.isfinite(z) and z > 0) or not 0 < q <= 1:
            raise ValueError(
                f"schedule phase {i}: the noise multiplier must be > 0 and the rate in (0, 1], "
                f"got {z!r}, {q!r}"
            )
        if (i == 0 and start != 0) or (i and start <= phases[-1][0]):
            raise ValueError(
                f"schedule phase {i}: phases start at step 0 and then strictly later, got "
                f"{start}"
            )
        phases.append((start, z, q))
    if not phases:
        raise ValueError("a schedule needs at least one phase")
    return tuple(phases)


def phase_at(schedule: Sequence[tuple[int, float, float]], step: int) -> tuple[int, float, float]:
    """The schedule's phase of step ``step`` (0-based): the last one starting at or before."""
    current = schedule[0]
    for phase in schedule:
        if phase[0] <= step:
            current = phase
    return current


def schedule_counts(schedule: Sequence[tuple[int, float, float]], steps: int) -> list[int]:
    """How many of the first ``steps`` steps fall in each phase."""
    counts = []
    for i, (start, _, _) in enumerate(schedule):
        end = schedule[i + 1][0] if i + 1 < len(schedule) else math.inf
        counts.append(int(max(0, min(steps, end) - start)))
    return counts


class _EventSpec:
    """How one training step is described to dp-accounting (shared by accountant/calibration)."""

    def __init__(
        self,
        *,
        sampling_rate: float | None,
        method: str,
        sampling: str,
        sample_size: int | None,
        population: int | None,
        value_discretization_interval: float,
        unit: str = "example",
    ) -> None:
        if method not in ACCOUNTANTS:
            raise ValueError(f"method must be one of {', '.join(ACCOUNTANTS)}, got {method!r}")
        if sampling not in ("poisson", "fixed"):
            raise ValueError(f"sampling must be 'poisson' or 'fixed', got {sampling!r}")
        if not value_discretization_interval > 0:
            raise ValueError("value_discretization_interval must be > 0")
        if unit not in UNITS:
            raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
        if unit == "provider" and sampling != "poisson":
            raise ValueError("provider-level accounting samples providers by Poisson coins only")
        self.method = method
        self.sampling = sampling
        self.unit = unit
        self.value_discretization_interval = value_discretization_interval
        # RDP: the RDP curve of one base event (a step, or an epoch of fixed batches) per noise
        # multiplier; composing n of them is n times it (module docstring of dp-accounting's
        # RdpAccountant), so a new step count costs one compute_epsilon, not the series again.
        self._rdp_one: dict[float, tuple[np.ndarray, np.ndarray]] = {}
        if sampling == "poisson":
            if sampling_rate is None or not 0 < sampling_rate <= 1:
                raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
            self.sampling_rate = float(sampling_rate)
            self.sample_size = self.population = None
        else:
            if method == "pld":
                raise ValueError(
                    "fixed-size batches (sampling without replacement) are supported by the "
                    "RDP accountant only; use method='rdp' or Poisson sampling"
                )
            if sample_size is None or population is None:
                raise ValueError("sampling='fixed' needs sample_size and population")
            if not 0 < sample_size <= population:
                raise ValueError(
                    f"need 0 < sample_size <= population, got {sample_size}, {population}"
                )
            rate = sample_size / population
            if sampling_rate is not None and not math.isclose(sampling_rate, rate):
                raise ValueError(
                    f"sampling_rate {sampling_rate} differs from sample_size/population {rate}"
                )
            self.sampling_rate = rate
            self.sample_size, self.population = int(sample_size), int(population)

    def step_event(self, noise_multiplier: float) -> dp_accounting.DpEvent:
        """The DpEvent of one Poisson-sampled step (std / add-remove sensitivity)."""
        return dp_accounting.PoissonSampledDpEvent(
            self.sampling_rate, dp_accounting.GaussianDpEvent(noise_multiplier)
        )

    def fresh_accountant(self) -> dp_accounting.PrivacyAccountant:
        """An empty dp-accounting accountant with the right neighbouring relation."""
        relation = (
            dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE
            if self.sampling == "poisson"
            else dp_accounting.NeighboringRelation.REPLACE_ONE
        )
        if self.method == "rdp":
            return rdp.RdpAccountant(neighboring_relation=relation)
        return pld.PLDAccountant(
            neighboring_relation=relation,
            value_discretization_interval=self.value_discretization_interval,
        )

    @property
    def adjacency(self) -> str:
        """The neighbouring relation the guarantee is stated for."""
        return adjacency_of(self.sampling, self.unit)

    def _base_event(self, noise_multiplier: float, steps: int) -> tuple[dp_accounting.DpEvent, int]:
        """(the event composed, how many times) for ``steps`` steps."""
        if self.sampling == "poisson":
            return self.step_event(noise_multiplier), steps
        assert self.population is not None and self.sample_size is not None
        per_epoch = batches_per_epoch(self.population, self.sample_size)
        epochs = -(-steps // per_epoch)  # ceil: a begun epoch counts whole
        return dp_accounting.GaussianDpEvent(noise_multiplier / 2), epochs

    def run_event(self, noise_multiplier: float, steps: int) -> dp_accounting.DpEvent:
        """The DpEvent of ``steps`` steps: Poisson-subsampled Gaussians, or (fixed, shuffled
        batches) one replace-one Gaussian per epoch begun, with no amplification."""
        return dp_accounting.SelfComposedDpEvent(*self._base_event(noise_multiplier, steps))

    def epsilon(self, noise_multiplier: float, steps: int, delta: float) -> float:
        """Epsilon after ``steps`` steps at ``delta``."""
        if steps <= 0:
            return 0.0
        if noise_multiplier <= 0:
            return math.inf
        if self.method == "rdp_discrete":
            orders, curve = self._discrete_curve(noise_multiplier)
            count = self._base_event(noise_multiplier, steps)[1]
            return float(rdp.compute_epsilon(orders, count * curve, delta)[0])
        if self.method == "rdp":
            count = self._base_event(noise_multiplier, steps)[1]
            orders, curve = self.rdp_curve(noise_multiplier)
            return float(rdp.compute_epsilon(orders, count * curve, delta)[0])
        acc = self.fresh_accountant()
        acc.compose(self.run_event(noise_multiplier, steps))
        return float(acc.get_epsilon(delta))

    def rdp_curve(self, noise_multiplier: float) -> tuple[np.ndarray, np.ndarray]:
        """(orders, the RDP curve of one base event) for "rdp" and "rdp_discrete": composing
        n base events is n times the curve."""
        if self.method == "rdp_discrete":
            return self._discrete_curve(noise_multiplier)
        if noise_multiplier not in self._rdp_one:
            acc = self.fresh_accountant()
            acc.compose(self._base_event(noise_multiplier, 1)[0])  # its curve at the orders
            # dp-accounting (pinned, 0.6.0) keeps the curve in _rdp; composing `count`
            # copies adds count * curve, exactly what epsilon() computes.
            self._rdp_one[noise_multiplier] = (acc._orders.copy(), acc._rdp.copy())
        return self._rdp_one[noise_multiplier]

    def _discrete_curve(self, noise_multiplier: float) -> tuple[np.ndarray, np.ndarray]:
        """ "rdp_discrete": (orders, the RDP curve of one base event). Poisson: Zhu-Wang's bound;
        fixed batches: an epoch's replace-one release, the discrete Gaussian's own curve at
        noise_multiplier / 2 (sensitivity 2B), as the "rdp" accountant has it."""
        if noise_multiplier not in self._rdp_one:
            orders = DISCRETE_RDP_ORDERS
            if self.sampling == "poisson":
                curve = discrete_gaussian_subsampled_rdp(noise_multiplier, self.sampling_rate)
            else:
                curve = discrete_gaussian_subsampled_rdp(noise_multiplier / 2, 1.0)
            self._rdp_one[noise_multiplier] = (orders, curve)
        return self._rdp_one[noise_multiplier]


class PrivacyAccountant:
    """Tracks the privacy spent by a training run and answers what-if questions.

    ``noise_multiplier`` = noise std / sensitivity in units (module docstring);
    ``sampling_rate`` = q for Poisson sampling (for ``sampling="fixed"`` give ``sample_size``
    and ``population`` instead); ``method`` = "rdp", "pld" or "rdp_discrete".
    """

    def __init__(
        self,
        noise_multiplier: float,
        delta: float,
        sampling_rate: float | None = None,
        *,
        method: Method = "rdp",
        sampling: Sampling = "poisson",
        sample_size: int | None = None,
        population: int | None = None,
        value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
        unit: Unit = "example",
        schedule: Sequence[Sequence[float]] | None = None,
        unsampled: Sequence[float] = (),
    ) -> None:
        if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
            raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier}")
        _check_delta(delta)
        for z in unsampled:
            if not (z > 0 and math.isfinite(z)):
                raise ValueError(f"an unsampled release's noise multiplier must be > 0, got {z}")
        # Releases made once over every example, without sampling (the feature statistics,
        # spgc.privacy.feature_stats): a Gaussian each of noise std / add-remove sensitivity z,
        # whose
        # bound also holds for replace-one (see there), composed with the steps.
        self.unsampled = tuple(float(z) for z in unsampled)
        self.noise_multiplier = float(noise_multiplier)
        # Phases (first step, noise multiplier, Poisson rate): Geyer et al.'s adjustment of
        # the noise and the providers per round, composed step by step.
        self.schedule = check_schedule(schedule) if schedule else None
        self._phase_specs: dict[float, _EventSpec] = {}
        self.delta = float(delta)
        self._spec = _EventSpec(
            sampling_rate=sampling_rate,
            method=method,
            sampling=sampling,
            sample_size=sample_size,
            population=population,
            value_discretization_interval=value_discretization_interval,
            unit=unit,
        )
        self._steps = 0
        # Composition is deterministic in the step count, so answers are cached by it.
        self._cache: dict[int, float] = {}

    @property
    def method(self) -> str:
        """ "rdp", "pld" or "rdp_discrete"."""
        return self._spec.method

    @property
    def sampling(self) -> str:
        """ "poisson" or "fixed"."""
        return self._spec.sampling

    @property
    def sampling_rate(self) -> float:
        """q (for fixed batches, sample_size / population)."""
        return self._spec.sampling_rate

    @property
    def adjacency(self) -> str:
        """The neighbouring relation of the guarantee (every report names it)."""
        return self._spec.adjacency

    @property
    def steps(self) -> int:
        """Steps recorded so far."""
        return self._steps

    def step(self, n: int = 1) -> None:
        """Record ``n`` more released steps."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        self._steps += int(n)

    def epsilon_after(self, steps: int) -> float:
        """Epsilon (at this accountant's delta) after ``steps`` steps in total."""
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps}")
        if steps not in self._cache:
            if self.unsampled:
                value = self._epsilon_with_unsampled(steps)
            elif self.schedule is None:
                value = self._spec.epsilon(self.noise_multiplier, steps, self.delta)
            else:
                value = self._scheduled_epsilon(steps)
            self._cache[steps] = value
        return self._cache[steps]

    def _epsilon_with_unsampled(self, steps: int) -> float:
        """Epsilon after ``steps`` steps and every unsampled release (RDP curves added, the
        Gaussian's a / (2 z^2), the discrete one's too; or PLD events composed)."""
        if self.schedule is None:
            parts = [(self._spec, self.noise_multiplier, steps)] if steps > 0 else []
        else:
            parts = self._schedule_parts(steps)
        if self._spec.method == "pld":
            acc = self._spec.fresh_accountant()
            for spec, z, count in parts:  # Poisson: PLD refuses fixed batches
                acc.compose(spec.step_event(z), count)
            for z in self.unsampled:
                acc.compose(dp_accounting.GaussianDpEvent(z))
            return float(acc.get_epsilon(self.delta))
        orders, total = self._spec.rdp_curve(self.noise_multiplier)
        total = np.zeros_like(total)
        for spec, z, count in parts:
            curve = spec.rdp_curve(z)[1]
            total = total + spec._base_event(z, count)[1] * curve
        for z in self.unsampled:
            total = total + orders / (2.0 * z * z)
        return float(rdp.compute_epsilon(orders, total, self.delta)[0])

    def _schedule_parts(self, steps: int) -> list[tuple[_EventSpec, float, int]]:
        """(the phase's event spec, its z, its step count) for the phases ``steps`` reach."""
        assert self.schedule is not None
        parts = []
        for (z, q), count in zip(
            ((z, q) for _, z, q in self.schedule), schedule_counts(self.schedule, steps),
            strict=True,
        ):  # fmt: skip
            if count:
                spec = self._phase_specs.get(q)
                if spec is None:
                    spec = self._phase_specs[q] = _EventSpec(
                        sampling_rate=q, method=self._spec.method, sampling="poisson",
                        sample_size=None, population=None, unit=self._spec.unit,
                        value_discretization_interval=self._spec.value_discretization_interval,
                    )  # fmt: skip
                parts.append((spec, z, count))
        return parts

    def _scheduled_epsilon(self, steps: int) -> float:
        """Epsilon after ``steps`` steps of the schedule: each phase's steps composed with
        their own noise multiplier and rate (RDP curves added, or PLD events composed)."""
        parts = self._schedule_parts(steps)
        if not parts:
            return 0.0
        if self._spec.method == "pld":
            acc = parts[0][0].fresh_accountant()
            for spec, z, count in parts:
                acc.compose(spec.step_event(z), count)
            return float(acc.get_epsilon(self.delta))
        total = None
        orders = None
        for spec, z, count in parts:
            orders, curve = spec.rdp_curve(z)
            total = count * curve if total is None else total + count * curve
        return float(rdp.compute_epsilon(orders, total, self.delta)[0])

    def noise_multiplier_at(self, step: int) -> float:
        """The noise multiplier of step ``step`` (0-based)."""
        if self.schedule is None:
            return self.noise_multiplier
        return phase_at(self.schedule, step)[1]

    def epsilon(self) -> float:
        """Epsilon spent by all steps recorded so far."""
        return self.epsilon_after(self._steps)

    def steps_within(self, budget_epsilon: float, max_steps: int = 10**9) -> int:
        """Largest total step count T (<= ``max_steps``) with epsilon_after(T) <= budget."""
        if not budget_epsilon >= 0:
            raise ValueError(f"budget_epsilon must be >= 0, got {budget_epsilon}")
        if self.epsilon_after(1) > budget_epsilon:
            return 0
        # Epsilon grows with T: double to bracket, then bisect (about 2 log2 T evaluations).
        lo, hi = 1, 2
        while hi <= max_steps and self.epsilon_after(hi) <= budget_epsilon:
            lo, hi = hi, hi * 2
        if hi > max_steps:
            if self.epsilon_after(max_steps) <= budget_epsilon:
                return max_steps
            hi = max_steps
        while hi - lo > 1:  # invariant: eps(lo) <= budget < eps(hi)
            mid = (lo + hi) // 2
            if self.epsilon_after(mid) <= budget_epsilon:
                lo = mid
            else:
                hi = mid
        return lo

    def remaining_steps(self, budget_epsilon: float) -> int:
        """How many more steps fit in the budget (0 once it would be exceeded)."""
        return max(0, self.steps_within(budget_epsilon) - self._steps)


def epsilon_for(
    noise_multiplier: float,
    delta: float,
    sampling_rate: float | None,
    steps: int,
    method: Method = "rdp",
    sampling: Sampling = "poisson",
    *,
    sample_size: int | None = None,
    population: int | None = None,
    value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
    unit: Unit = "example",
    unsampled: Sequence[float] = (),
) -> float:
    """Epsilon of a whole training (for ``spgc account``), with the once-only ``unsampled``
    releases (PrivacyAccountant) composed."""
    acc = PrivacyAccountant(
        noise_multiplier,
        delta,
        sampling_rate,
        method=method,
        sampling=sampling,
        sample_size=sample_size,
        population=population,
        value_discretization_interval=value_discretization_interval,
        unit=unit,
        unsampled=unsampled,
    )
    return acc.epsilon_after(steps)


# calibrate_noise_multiplier with method "pld": a first search at a 10x coarser discretization
# (to 0.1%), then the bracket for the requested one within a few percent of it.
_PLD_COARSENING = 10.0
_PLD_COARSE_LIMIT = 1e-2
_PLD_COARSE_TOL = 1e-3


def _bracket_near(
    guess: float, too_small: Callable[[float], bool], step: float = 0.01
) -> tuple[float, float]:
    """[lo, hi] around ``guess`` with too_small(lo) and not too_small(hi), widening the step
    by factors of 2 (the first probes are 1% away)."""
    lo = hi = guess
    while too_small(hi):
        lo, hi = hi, hi * (1 + step)
        step *= 2
        if hi > 1e6:
            raise ValueError("the target epsilon needs noise multiplier > 1e6")
    while not too_small(lo):
        lo, hi = lo * max(1 - step, 0.5), lo
        step *= 2
        if lo < 1e-4:
            break
    return lo, hi


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sampling_rate: float | None,
    steps: int,
    method: Method = "rdp",
    sampling: Sampling = "poisson",
    *,
    sample_size: int | None = None,
    population: int | None = None,
    value_discretization_interval: float = DEFAULT_PLD_DISCRETIZATION,
    rel_tol: float = 1e-4,
    unit: Unit = "example",
    unsampled: Sequence[float] = (),
) -> float:
    """Smallest noise multiplier (within ``rel_tol``) whose training epsilon is <= the target,
    the once-only ``unsampled`` releases (PrivacyAccountant) composed with the steps.

    Brent's method (scipy's brentq) on a bracket found here ("rdp_discrete": bisection); the
    result is never below the true minimum by more than the tolerance and always meets the
    target under the same accountant (it is a multiplier whose epsilon was computed).
    ValueError when the unsampled releases alone spend the target.
    """
    _check_epsilon(target_epsilon)
    _check_delta(delta)
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    options: dict[str, Any] = {
        "sampling_rate": sampling_rate,
        "method": method,
        "sampling": sampling,
        "sample_size": sample_size,
        "population": population,
        "value_discretization_interval": value_discretization_interval,
        "unit": unit,
    }
    spec = _EventSpec(**options)
    if unsampled:
        alone = PrivacyAccountant(1.0, delta, **options, unsampled=unsampled).epsilon_after(0)
        if alone >= target_epsilon:
            raise ValueError(
                f"the releases made once (noise multipliers {', '.join(map(str, unsampled))}) "
                f"spend epsilon {alone:.4g} alone, not below target epsilon {target_epsilon:g}: "
                "give them more noise or raise the target"
            )

    seen: dict[float, float] = {}

    def eps(sigma: float) -> float:
        if sigma not in seen:
            if unsampled:
                acc = PrivacyAccountant(sigma, delta, **options, unsampled=unsampled)
                seen[sigma] = acc.epsilon_after(steps)
            else:
                seen[sigma] = spec.epsilon(sigma, steps, delta)
        return seen[sigma]

    # Bracket [lo, hi] with eps(lo) > target >= eps(hi): near a coarser PLD's answer (each
    # fine PLD evaluation takes seconds at small multipliers, a coarse one a tenth of that),
    # else by factors of 2 from 1.
    lo, hi = 1.0, 1.0
    if method == "pld" and value_discretization_interval < _PLD_COARSE_LIMIT:
        coarse = calibrate_noise_multiplier(
            target_epsilon, delta, sampling_rate, steps, method, sampling,
            sample_size=sample_size, population=population,
            value_discretization_interval=value_discretization_interval * _PLD_COARSENING,
            rel_tol=_PLD_COARSE_TOL, unit=unit, unsampled=unsampled,
        )  # fmt: skip
        lo, hi = _bracket_near(coarse, lambda sigma: eps(sigma) > target_epsilon)
        if eps(lo) <= target_epsilon:
            return hi  # tiny multipliers: numerically meaningless to go further
    elif eps(1.0) > target_epsilon:
        while eps(hi) > target_epsilon:
            lo, hi = hi, hi * 2
            if hi > 1e6:
                raise ValueError(f"target epsilon {target_epsilon} needs noise multiplier > 1e6")
    else:
        while eps(lo) <= target_epsilon:
            lo, hi = lo / 2, lo
            if lo < 1e-4:
                return hi  # tiny multipliers: numerically meaningless to go further
    if method == "rdp_discrete":
        while hi - lo > rel_tol * lo:  # invariant: eps(lo) > target >= eps(hi)
            mid = (lo + hi) / 2
            if eps(mid) <= target_epsilon:
                hi = mid
            else:
                lo = mid
        return hi
    # Brent's method on the cached curve (the bracket's ends are not evaluated again), then
    # the smallest multiplier evaluated that meets the target: an end of Brent's last bracket,
    # within the tolerance of the root and never below it.
    brentq(lambda sigma: eps(sigma) - target_epsilon, lo, hi, xtol=rel_tol * lo)
    return min(sigma for sigma, e in seen.items() if e <= target_epsilon)


def classic_noise_multiplier(epsilon: float, delta: float, *, allow_invalid: bool = False) -> float:
    """The paper's sqrt(2 ln(1.25/delta)) / epsilon, per release.

    Dwork-Roth Thm A.1 proves it only for epsilon < 1; for epsilon >= 1 it raises ValueError
    unless ``allow_invalid`` (for reproducing the paper, whose eps 2 and 8 are outside it).
    """
    _check_epsilon(epsilon)
    _check_delta(delta)
    if epsilon >= 1 and not allow_invalid:
        raise ValueError(
            f"classic calibration sqrt(2 ln(1.25/delta))/epsilon is only valid for epsilon < 1, "
            f"got epsilon={epsilon}; use the analytic Gaussian or accountant calibration "
            "(allow_invalid=True only to reproduce the paper)"
        )
    return math.sqrt(2.0 * math.log(1.25 / delta)) / epsilon


def analytic_gaussian_delta(noise_multiplier: float, epsilon: float) -> float:
    """Exact delta(epsilon) of one Gaussian release with std/sensitivity = ``noise_multiplier``.

    Balle-Wang 2018, Thm 8: Phi(1/(2s) - eps*s) - e^eps * Phi(-1/(2s) - eps*s).
    """
    s = float(noise_multiplier)
    if s <= 0:
        return 1.0
    a = 0.5 / s - epsilon * s
    b = -0.5 / s - epsilon * s
    log_pa = float(log_ndtr(a))
    # Factor out Phi(a) so the difference of two tiny terms keeps its relative precision.
    ratio_log = epsilon + float(log_ndtr(b)) - log_pa
    return max(0.0, -math.expm1(ratio_log) * math.exp(log_pa))


def analytic_gaussian_noise_multiplier(epsilon: float, delta: float) -> float:
    """Smallest std/sensitivity with one Gaussian release (epsilon, delta)-DP (Balle-Wang 2018).

    Valid for all epsilon > 0; found by bisection on log sigma (delta decreases in sigma); the
    returned value satisfies the bound (upper end of the final bracket).
    """
    _check_epsilon(epsilon)
    _check_delta(delta)
    lo, hi = 1e-3, 1.0
    while analytic_gaussian_delta(hi, epsilon) > delta:
        lo, hi = hi, hi * 2
    while analytic_gaussian_delta(lo, epsilon) <= delta:
        lo, hi = lo / 2, lo
    for _ in range(200):
        if hi / lo - 1 < 1e-12:
            break
        mid = math.sqrt(lo * hi)
        if analytic_gaussian_delta(mid, epsilon) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def per_step_epsilon(noise_multiplier: float, delta: float) -> float:
    """Smallest epsilon with one unsampled Gaussian release (epsilon, delta)-DP (Balle-Wang).

    No subsampling amplification: this is what one aggregate reveals even if the sampling is
    not trusted, the figure a provider compares with its minimum-privacy requirement.
    """
    _check_delta(delta)
    if not (noise_multiplier > 0 and math.isfinite(noise_multiplier)):
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier}")
    if analytic_gaussian_delta(noise_multiplier, 0.0) <= delta:
        return 0.0
    lo, hi = 0.0, 1.0
    while analytic_gaussian_delta(noise_multiplier, hi) > delta:
        lo, hi = hi, hi * 2
    for _ in range(200):
        if hi - lo <= 1e-12 * max(1.0, hi):
            break
        mid = (lo + hi) / 2
        if analytic_gaussian_delta(noise_multiplier, mid) <= delta:
            hi = mid
        else:
            lo = mid
    return hi


def noise_multiplier_for(
    calibration: Calibration,
    epsilon: float,
    delta: float,
    *,
    sampling_rate: float | None = None,
    steps: int | None = None,
    method: Method = "rdp",
    sampling: Sampling = "poisson",
    sample_size: int | None = None,
    population: int | None = None,
    allow_invalid: bool = False,
    unit: Unit = "example",
) -> float:
    """Dispatch for ``--calibration``: "classic" and "analytic" read epsilon per release (the
    paper's convention), "accountant" reads it as the whole training's budget."""
    if calibration == "classic":
        return classic_noise_multiplier(epsilon, delta, allow_invalid=allow_invalid)
    if calibration == "analytic":
        return analytic_gaussian_noise_multiplier(epsilon, delta)
    if calibration == "accountant":
        if steps is None:
            raise ValueError("accountant calibration needs steps")
        return calibrate_noise_multiplier(
            epsilon,
            delta,
            sampling_rate,
            steps,
            method,
            sampling,
            sample_size=sample_size,
            population=population,
            unit=unit,
        )
    raise ValueError(
        f"calibration must be 'classic', 'analytic' or 'accountant', got {calibration!r}"
    )


@contextlib.contextmanager
def quiet_dp_accounting() -> Iterator[None]:
    """dp-accounting logs (through absl) each RDP order it excludes, dozens of lines per
    answer; the epsilon stays an upper bound. Quiet for one command's stderr contract."""
    absl = logging.getLogger("absl")
    level = absl.level
    absl.setLevel(logging.ERROR)
    try:
        yield
    finally:
        absl.setLevel(level)

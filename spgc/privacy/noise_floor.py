"""The noise floor (issue 46, item 4): what a sum of independent discrete Gaussians guarantees.

With ``noise_floor: f`` (modes spgc and preprocessed) the noise on a release is three
independent discrete Gaussians per coordinate: the joint noise J ~ N_Z((1 - f) sigma^2), made by
the two servers together (the round circuit, the preprocessed pool), and each server's own
N_i ~ N_Z(f sigma^2), added to what it puts into the opening. Who faces what:

- everyone who sees the release: J + N_1 + N_2, variance (1 + f) sigma^2;
- one curious server (it follows the protocol; it knows its own N_i): J + N_other, sigma^2;
- one server that deviates (it may strip J): N_other alone, f sigma^2.

A sum of discrete Gaussians is not a discrete Gaussian, so the integer-shift RDP bound alpha
Delta^2 / (2 sigma^2) (Canonne-Kamath-Steinke 2020) does not apply to it as such. The bound here
needs no approximation (docs/PRIVACY.md, "The noise floor", derives it): for independent
X_j ~ N_Z(s_j^2) (per coordinate) and an integer shift D, split D = sum_j D_j into integer
vectors; the sum is a function of the tuple, so by data processing

    D_alpha(sum X_j + D || sum X_j) <= D_alpha((X_j + D_j)_j || (X_j)_j)
                                    <= (alpha / 2) sum_j ||D_j||^2 / s_j^2.

With S = sum s_j^2, w_j = s_j^2 / S and D_j = w_j D + r_j (sum_j r_j = 0) the cross terms cancel:
sum_j ||D_j||^2 / s_j^2 = ||D||^2 / S + sum_j ||r_j||^2 / s_j^2. The D_j are cumulative roundings
(C_j = round((w_1 + ... + w_j) D), D_j = C_j - C_{j-1}), so r_j = e_j - e_{j-1} with |e_j| <= 1/2
and e_0 = e_k = 0, and r_j = 0 wherever D is 0; an integer D of L2 norm at most B has at most
min(d, B^2) non-zero entries. For two parts also |r_1| <= min(w_1, w_2) |D_i| per coordinate, so
||r_1||^2 <= min(w_1, w_2)^2 B^2. Hence D_alpha <= alpha cost / 2 for every such shift, which is
the Gaussian curve of the effective noise multiplier 1 / sqrt(cost) (relative to B): the existing
accountant composes it as it does the plan's multiplier today (every method, each with its own
caveats; ``rdp_discrete`` needs only this curve).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from spgc.privacy.accounting import PrivacyAccountant

__all__ = [
    "FIGURES",
    "FloorMultipliers",
    "floor_accountants",
    "floor_epsilons",
    "floor_multipliers",
    "split_shift_cost",
]

#: The three figures' names, in the order every report gives them.
FIGURES: tuple[str, ...] = ("everyone", "curious_server", "deviating_server")


def split_shift_cost(variances: Sequence[float], shift_bound: float, coordinates: int) -> float:
    """An upper bound on 2 D_alpha / alpha for the sum of independent discrete Gaussians of
    ``variances`` (per coordinate, in units^2) shifted by any integer vector of L2 norm at most
    ``shift_bound`` over ``coordinates`` coordinates (module docstring): ||D||^2 / S plus the
    rounding error's cost."""
    s2 = [float(v) for v in variances]
    if not s2 or any(not (v > 0 and math.isfinite(v)) for v in s2):
        raise ValueError(f"every variance must be finite and > 0, got {variances}")
    if not (shift_bound > 0 and math.isfinite(shift_bound)):
        raise ValueError(f"shift_bound must be finite and > 0, got {shift_bound}")
    if coordinates < 1:
        raise ValueError(f"coordinates must be >= 1, got {coordinates}")
    total = sum(s2)
    b2 = float(shift_bound) ** 2
    if len(s2) == 1:
        return b2 / total
    nonzero = min(int(coordinates), math.floor(b2))  # each non-zero integer entry costs >= 1
    # Cumulative rounding: |e_j| <= 1/2 inside, e_0 = e_k = 0, so |r_j| <= h_(j-1) + h_j.
    half = [0.0] + [0.5] * (len(s2) - 1) + [0.0]
    per_coordinate = sum((half[j] + half[j + 1]) ** 2 / v for j, v in enumerate(s2))
    rounding = nonzero * per_coordinate
    if len(s2) == 2:  # r_2 = -r_1 and |r_1| <= min(w_1, w_2) |D_i| too
        smaller = min(s2) / total
        rounding = min(rounding, smaller**2 * b2 * (1.0 / s2[0] + 1.0 / s2[1]))
    return b2 / total + rounding


@dataclass(frozen=True)
class FloorMultipliers:
    """Effective noise multipliers (relative to the sensitivity, as the accountant takes them)
    of one release against each adversary; ``deviating_server`` 0: no noise is left to it."""

    everyone: float
    curious_server: float
    deviating_server: float

    def as_dict(self) -> dict[str, float]:
        return {name: getattr(self, name) for name in FIGURES}


def floor_multipliers(
    noise_multiplier: float,
    noise_floor: float,
    sensitivity_units: float,
    coordinates: int,
    *,
    sampling: str = "poisson",
) -> FloorMultipliers:
    """The three effective multipliers of a plan of ``noise_multiplier`` z (sigma = z B) with
    ``noise_floor`` f, B = ``sensitivity_units``, d = ``coordinates`` (the released vector's
    length). Fixed batches (replace-one, shifts up to 2B; the accountant halves what it is
    given) are bounded at 2B and scaled back. f = 0 is today's plan: z, z, and nothing against a
    server that deviates."""
    z, f = float(noise_multiplier), float(noise_floor)
    if not (z > 0 and math.isfinite(z)):
        raise ValueError(f"noise_multiplier must be finite and > 0, got {noise_multiplier}")
    if not 0.0 <= f < 1.0:
        raise ValueError(f"noise_floor must be in [0, 1), got {noise_floor}")
    if f == 0.0:
        return FloorMultipliers(z, z, 0.0)
    scale = 2.0 if sampling == "fixed" else 1.0
    bound = scale * float(sensitivity_units)
    sigma2 = (z * float(sensitivity_units)) ** 2
    joint, own = (1.0 - f) * sigma2, f * sigma2

    def multiplier(variances: Sequence[float]) -> float:
        return scale / math.sqrt(split_shift_cost(variances, bound, coordinates))

    curious = multiplier([joint, own])
    # Everyone faces J + N_1 + N_2; leaving N_2 out is data processing (it only adds noise), so
    # the curious figure bounds this one too. The larger part sits in the middle of the split.
    everyone = max(curious, multiplier([own, joint, own]))
    return FloorMultipliers(everyone, curious, math.sqrt(f) * z)


def scaled_sampling(sampling: Mapping[str, Any], factor: float) -> dict[str, Any]:
    """The accountant's sampling arguments with a noise schedule's multipliers times ``factor``
    (the floor's ratio holds phase by phase: it does not depend on sigma)."""
    out = dict(sampling)
    if out.get("schedule"):
        out["schedule"] = [[start, z * factor, q] for start, z, q in out["schedule"]]
    return out


def floor_accountants(
    noise_multiplier: float,
    delta: float,
    *,
    method: str,
    sampling: Mapping[str, Any],
    noise_floor: float,
    sensitivity_units: float,
    coordinates: int,
) -> dict[str, PrivacyAccountant | None]:
    """One accountant per figure (:data:`FIGURES`; None: nothing left to account, an infinite
    epsilon), each composing the plan's releases with its effective multiplier."""
    multipliers = floor_multipliers(
        noise_multiplier,
        noise_floor,
        sensitivity_units,
        coordinates,
        sampling=str(sampling.get("sampling", "poisson")),
    )
    out: dict[str, PrivacyAccountant | None] = {}
    for name, m in multipliers.as_dict().items():
        if m <= 0:
            out[name] = None
            continue
        out[name] = PrivacyAccountant(
            m, delta, method=method, **scaled_sampling(sampling, m / noise_multiplier)
        )
    return out


def floor_epsilons(header: Mapping[str, Any], steps: int) -> dict[str, float | None] | None:
    """With a noise floor, epsilon after ``steps`` releases against each figure (:data:`FIGURES`;
    None: infinite) under a ledger header's plan (spgc.privacy.ledger: ``noise_multiplier``,
    ``delta``, ``accountant``, ``sampling``, ``sensitivity_units``, ``noise_floor``); None
    without a noise floor."""
    floor = header.get("noise_floor")
    if floor is None:
        return None
    accountants = floor_accountants(
        float(header["noise_multiplier"]),
        float(header["delta"]),
        method=str(header.get("accountant", "rdp")),
        sampling=dict(header.get("sampling") or {}),
        noise_floor=float(floor["fraction"]),
        sensitivity_units=float(header["sensitivity_units"]),
        coordinates=int(floor["coordinates"]),
    )
    out: dict[str, float | None] = {}
    for name in FIGURES:
        acc = accountants[name]
        eps = math.inf if acc is None else acc.epsilon_after(steps)
        out[name] = None if math.isinf(eps) else eps
    return out

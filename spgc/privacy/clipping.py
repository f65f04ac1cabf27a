"""Adaptive clipping (Andrew, Thakkar, McMahan and Ramaswamy, "Differentially Private Learning
with Adaptive Clipping", NeurIPS 2021), on the secure sum.

The clip norm ``C`` follows a target quantile ``gamma`` of the examples' gradient norms: each
round every example adds one bit, ``b = 1[||g|| <= C]``, to a count that is noised and released
with the gradient sum, and the servers move ``C`` geometrically towards the quantile::

    C_{r+1} = C_r * exp(-eta * (b_r - gamma)),   b_r = noisy count / expected examples.

How it rides on the fixed-point shares (why nothing else changes). Every example's row is
``[clip(g, C_r) * C0 / C_r,  kappa * b]``: the gradient clipped to this round's ``C_r`` and
rescaled to the first round's ``C0``, then one more coordinate, ``kappa`` per unclipped example.
Every row has L2 norm at most ``sqrt(C0^2 + kappa^2)`` whatever ``C_r`` is, so the encoder,
its bound ``B`` in units, the ring, the circuit's one noise std ``sigma`` and the accountant's
noise multiplier ``z = sigma / B`` are those of a fixed run with clip norm ``sqrt(C0^2 +
kappa^2)`` and ``d + 1`` coordinates: the pair (update, count) is ONE Gaussian mechanism of
multiplier ``z``, accounted as such every round (as TFF does). Decoded, the update carries noise
``z_update * C_r`` with ``z_update = sigma / (s C0)`` and the count noise ``sigma_count = sigma
/ (s kappa)`` examples, and ``z_update^-2 + sigma_count^-2 = (s sqrt(C0^2 + kappa^2) / sigma)^2
>= z^-2`` (the rounding's inflation ``B / (s sqrt(C0^2 + kappa^2)) >= 1`` only helps): the
paper's ``z_update = (z^-2 - sigma_count^-2)^(-1/2)``, here with the count's sensitivity 1
(the bit is 0 or 1, not centred: the number of examples of a Poisson batch is not public).

``kappa`` is chosen so that the count gets the configured noise: ``kappa = C0 z_update /
sigma_count``; it needs ``sigma_count > z``. The paper's defaults: ``gamma = 0.5``, ``eta =
0.2``, ``sigma_count`` = the expected examples per round / 20 (here at least ``2 z``: the
paper's rounds hold hundreds of clients, ours may hold 30 examples), ``C0 = 0.1``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from spgc.wire import aggregation_pb2 as pb

__all__ = [
    "CLIP_RANGE",
    "AdaptiveClip",
    "DecayClip",
    "adaptive_clip_of",
    "clip_and_rescale",
    "decay_clip_of",
    "round_clip_norm",
]

#: How far C may move from C0 (both ways): keeps C0 / C a sane float factor over any run.
CLIP_RANGE = 1e6


@dataclass(frozen=True)
class AdaptiveClip:
    """One run's adaptive clipping: the rule's parameters and the count coordinate's size."""

    initial_norm: float  # C0 (the plan's clip_norm)
    target_quantile: float  # gamma
    learning_rate: float  # eta
    expected_batch: float  # examples expected per round over all providers (b's denominator)
    count_clip: float  # kappa: the count coordinate of an unclipped example, in gradient units

    def __post_init__(self) -> None:
        for name in ("initial_norm", "learning_rate", "expected_batch", "count_clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"adaptive clipping: {name} must be > 0, got {value}")
        if not 0 < self.target_quantile < 1:
            raise ValueError(
                f"adaptive clipping: target_quantile must be in (0, 1), got {self.target_quantile}"
            )

    @classmethod
    def design(
        cls,
        *,
        initial_norm: float,
        target_quantile: float,
        learning_rate: float,
        expected_batch: float,
        noise_multiplier: float,
        count_noise: float = 0.0,
    ) -> AdaptiveClip:
        """The count coordinate for a run of noise multiplier ``z``: ``count_noise`` examples of
        std on the count (0: the paper's ``expected_batch / 20``, but at least ``2 z``, so that
        the update's multiplier is at most 1.155 z on small batches). ValueError when the
        count's noise is not above ``z`` (the update's multiplier would have to be infinite)."""
        if not (math.isfinite(expected_batch) and expected_batch > 0):
            raise ValueError(
                f"adaptive clipping needs the examples expected per round (> 0), got "
                f"{expected_batch}"
            )
        z = noise_multiplier
        if not (math.isfinite(z) and z > 0):
            raise ValueError(f"adaptive clipping needs a noise multiplier > 0, got {z}")
        sigma_count = count_noise if count_noise > 0 else max(expected_batch / 20, 2 * z)
        if sigma_count <= z:
            raise ValueError(
                f"adaptive clipping: the count's noise ({sigma_count:.4g} examples) must exceed "
                f"the noise multiplier {z:.4g}; raise clip_count_noise (0 picks one)"
            )
        z_update = 1.0 / math.sqrt(z**-2 - sigma_count**-2)
        return cls(
            initial_norm=initial_norm,
            target_quantile=target_quantile,
            learning_rate=learning_rate,
            expected_batch=expected_batch,
            count_clip=initial_norm * z_update / sigma_count,
        )

    @property
    def row_norm(self) -> float:
        """The L2 bound of every row, ``sqrt(C0^2 + kappa^2)``: the encoder's clip norm."""
        return math.hypot(self.initial_norm, self.count_clip)

    def update_noise_multiplier(self, sigma_units: float, scale: float) -> float:
        """z_update: the update's noise std in units of the round's clip norm."""
        return sigma_units / (scale * self.initial_norm)

    def count_noise_std(self, sigma_units: float, scale: float) -> float:
        """sigma_count: the released count's noise std, in examples."""
        return sigma_units / (scale * self.count_clip)

    def check_clip_norm(self, clip_norm: float) -> None:
        """ValueError unless ``clip_norm`` is one the rule can reach from C0."""
        lo, hi = self.initial_norm / CLIP_RANGE, self.initial_norm * CLIP_RANGE
        if not (math.isfinite(clip_norm) and lo <= clip_norm <= hi):
            raise ValueError(
                f"round clip norm {clip_norm!r} is outside [{lo:.3g}, {hi:.3g}] (C0 / 1e6 to "
                "C0 * 1e6)"
            )

    def rows(self, grads: np.ndarray, clip_norm: float) -> np.ndarray:
        """The rows a provider encodes for per-example gradients ``grads`` (m, d) in a round of
        clip norm ``clip_norm``: (m, d + 1) float64, each of L2 norm <= :attr:`row_norm`."""
        self.check_clip_norm(clip_norm)
        g = np.asarray(grads, dtype=np.float64)
        if g.ndim != 2:
            raise ValueError(f"expected an (m, d) array, got shape {g.shape}")
        out = np.empty((g.shape[0], g.shape[1] + 1), dtype=np.float64)
        unclipped = clip_and_rescale(g, clip_norm, self.initial_norm, out=out[:, :-1])
        out[:, -1] = np.where(unclipped, self.count_clip, 0.0)
        return out

    def split_release(
        self, released_units: np.ndarray, scale: float, clip_norm: float
    ) -> tuple[np.ndarray, float]:
        """The released noisy sum (d + 1 values, in units) as (the round's gradient sum in
        gradient units, d values; the noisy count of unclipped examples)."""
        y = np.asarray(released_units, dtype=np.float64)
        gradient = y[:-1] / scale * (clip_norm / self.initial_norm)
        return gradient, float(y[-1]) / (scale * self.count_clip)

    def next_clip_norm(self, clip_norm: float, noisy_count: float) -> float:
        """C_{r+1} from C_r and the round's noisy count (kept within C0 / 1e6 .. C0 * 1e6)."""
        unclipped_share = noisy_count / self.expected_batch
        step = -self.learning_rate * (unclipped_share - self.target_quantile)
        # A count far off (noise on a tiny batch) must not overflow exp: the range caps C anyway.
        new = clip_norm * math.exp(max(-50.0, min(50.0, step)))
        lo, hi = self.initial_norm / CLIP_RANGE, self.initial_norm * CLIP_RANGE
        return min(hi, max(lo, new))


def clip_and_rescale(
    grads: np.ndarray, clip_norm: float, initial_norm: float, out: np.ndarray | None = None
) -> np.ndarray:
    """Rows of ``grads`` (m, d) clipped to this round's ``clip_norm`` and multiplied by
    ``initial_norm / clip_norm`` into ``out`` (a new array when None): every row's norm stays
    <= ``initial_norm``, so the encoder's bound in units is the first round's whatever the
    round's C. Returns which rows were not clipped (norm <= C)."""
    g = np.asarray(grads, dtype=np.float64)
    if g.ndim != 2:
        raise ValueError(f"expected an (m, d) array, got shape {g.shape}")
    norms = np.sqrt(np.einsum("ij,ij->i", g, g))
    unclipped = norms <= clip_norm
    factors = np.ones_like(norms)
    factors[~unclipped] = clip_norm / norms[~unclipped]
    factors *= initial_norm / clip_norm
    if out is None:
        out = np.empty_like(g)
    np.multiply(g, factors[:, None], out=out)
    return unclipped


@dataclass(frozen=True)
class DecayClip:
    """clip: decay: the clip norm of round r is ``C_r = max(floor, C0 x rate^r)`` (Maeda et
    al.'s decay schedules, from a clip large early to a smaller one later). Rows are clipped to
    C_r and rescaled to C0 (:func:`clip_and_rescale`), so the encoder's bound, the noise in
    units and the accounting are those of a fixed run with clip norm C0; the released sum is
    scaled back by ``C_r / C0``, and its noise with it (the noise relative to the clip stays
    the same)."""

    initial_norm: float  # C0 (the plan's clip_norm)
    rate: float  # the factor per round, in (0, 1]
    floor: float = 0.0  # the smallest C (0: none), at most C0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.initial_norm) and self.initial_norm > 0):
            raise ValueError(f"decaying clip: clip_norm must be > 0, got {self.initial_norm}")
        if not (math.isfinite(self.rate) and 0 < self.rate <= 1):
            raise ValueError(f"decaying clip: clip_decay must be in (0, 1], got {self.rate}")
        if not (math.isfinite(self.floor) and 0 <= self.floor <= self.initial_norm):
            raise ValueError(
                f"decaying clip: clip_min must be in [0, clip_norm {self.initial_norm:g}], got "
                f"{self.floor}"
            )

    def norm_at(self, round_number: int) -> float:
        """C_r: ``round_number`` multiplications by the rate, each correctly rounded (no
        libm pow, whose last bit may differ between machines: both servers and every
        provider must get the same double), then the floor; at least C0 / CLIP_RANGE."""
        if round_number < 0:
            raise ValueError(f"round must be >= 0, got {round_number}")
        c, lowest = self.initial_norm, max(self.floor, self.initial_norm / CLIP_RANGE)
        for _ in range(round_number):
            c *= self.rate
            if c <= lowest:
                return lowest
        return max(c, lowest)

    def rows(self, grads: np.ndarray, clip_norm: float) -> np.ndarray:
        """The rows a provider encodes in a round of clip norm ``clip_norm``."""
        out = np.empty_like(np.asarray(grads, dtype=np.float64))
        clip_and_rescale(grads, clip_norm, self.initial_norm, out=out)
        return out

    def decode(self, released_units: np.ndarray, scale: float, clip_norm: float) -> np.ndarray:
        """The round's released sum in gradient units (its rows were rescaled to C0)."""
        y = np.asarray(released_units, dtype=np.float64)
        return y / scale * (clip_norm / self.initial_norm)

    def check_round(self, round_number: int, announced: float) -> None:
        """ValueError unless ``announced`` is this rule's C for ``round_number``."""
        want = self.norm_at(round_number)
        if announced != want:
            raise ValueError(
                f"the servers announce clip norm {announced!r} for round {round_number}; the "
                f"decay rule gives {want!r}"
            )


def decay_clip_of(tc: Any) -> DecayClip | None:
    """A TrainingConfig's decaying clip (None unless clip_rule is CLIP_RULE_DECAY); ValueError
    in one line when its fields are malformed."""
    if tc.clip_rule != pb.CLIP_RULE_DECAY:
        return None
    try:
        return DecayClip(tc.clip_norm, tc.clip_decay, tc.clip_min)
    except ValueError as exc:
        raise ValueError(f"the servers' decaying clip is malformed: {exc}") from None


def adaptive_clip_of(tc: Any) -> AdaptiveClip | None:
    """A TrainingConfig's adaptive clipping (None with a fixed clip norm), checked as a provider
    needs it: ValueError in one line when a field is missing or the announced noises do not
    follow from the announced noise std (a server cannot claim a count noise it does not add)."""
    if tc.clip_rule in (pb.CLIP_RULE_FIXED, pb.CLIP_RULE_DECAY):
        return None
    if tc.clip_rule != pb.CLIP_RULE_ADAPTIVE:
        raise ValueError(f"clip_rule {tc.clip_rule} is not one this provider knows")
    try:
        clip = AdaptiveClip(
            initial_norm=tc.clip_norm,
            target_quantile=tc.clip_target_quantile,
            learning_rate=tc.clip_learning_rate,
            expected_batch=tc.expected_batch_size,
            count_clip=tc.count_clip,
        )
    except ValueError as exc:
        raise ValueError(f"the servers' adaptive clipping is malformed: {exc}") from None
    for name, announced, derived in (
        ("update_noise_multiplier", tc.update_noise_multiplier,
         clip.update_noise_multiplier(tc.noise_std_units, tc.scale)),
        ("count_noise_std", tc.count_noise_std,
         clip.count_noise_std(tc.noise_std_units, tc.scale)),
    ):  # fmt: skip
        if not math.isclose(announced, derived, rel_tol=1e-9):
            raise ValueError(
                f"the servers announce {name} {announced:.6g}, but their noise std and "
                f"adaptive clipping give {derived:.6g}"
            )
    return clip


def round_clip_norm(clip: AdaptiveClip, announced: Sequence[float]) -> float:
    """The round's clip norm from each server's RoundInfo.clip_norm: they must agree and be
    one the rule can reach (ValueError in one line otherwise)."""
    values = set(announced)
    if len(values) != 1:
        shown = ", ".join(f"{v:.6g}" for v in announced)
        raise ValueError(f"the servers announce different clip norms for the round: {shown}")
    (value,) = values
    clip.check_clip_norm(value)
    return value

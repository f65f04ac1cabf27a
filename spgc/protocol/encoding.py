"""Fixed-point encoding of clipped per-example gradients with a guaranteed L2 bound in units.

Why per example: rounding the batch *sum* once lets two neighbouring batches differ by up to
``s*C + sqrt(d)`` units (every coordinate's rounding may flip), which for ``d = 1e5`` is many
times ``s*C``. Instead each clipped example ``x`` (``||x||_2 <= C``) is scaled to ``y = s*x`` and
rounded in the integer domain with *conditional randomized rounding* (Kairouz-Liu-Steinke 2021,
"The Distributed Discrete Gaussian Mechanism", section 4): unbiased stochastic rounding of every
coordinate, re-drawn until the integer vector's L2 norm is at most ``B``. The add/remove-one
sensitivity of the provider's sum ``G`` in units is then exactly ``B`` (not ``s*C``), and
``B / (s*C)`` is the inflation that the run reports and the accountant uses.

Derivation of B (KLS21 Lemma, re-derived here). Write ``c = s*C``, ``p_i = y_i - floor(y_i)``,
``x~_i = floor(y_i) + Bernoulli(p_i) = y_i + e_i`` with ``e_i in {-p_i, 1-p_i}``, ``E e_i = 0``::

    ||x~||^2 = ||y||^2 + sum_i p_i (1 - p_i) + Z,   Z = sum_i (2 floor(y_i) + 1) e_i

because ``2 y_i e_i + e_i^2 - E e_i^2 = (2 floor(y_i) + 1) e_i`` for both values of ``e_i``.
``sum_i p_i (1-p_i) <= d/4``. ``Z`` is a sum of independent zero-mean terms, the i-th in an
interval of length ``|2 floor(y_i) + 1| <= 2|y_i| + 1``, so Hoeffding gives
``P[Z >= t] <= exp(-2 t^2 / sum_i (2|y_i|+1)^2)`` and ``sqrt(sum (2|y_i|+1)^2) <= 2c + sqrt(d)``.
Setting the right side to ``beta`` (the failure probability per attempt)::

    P[ ||x~||^2 > c^2 + d/4 + sqrt(2 ln(1/beta)) * (c + sqrt(d)/2) ] <= beta.

Also ``|e_i| < 1`` gives the deterministic ``||x~|| <= c + sqrt(d)``. Hence::

    B = ceil( sqrt( min( c^2 + d/4 + sqrt(2 ln(1/beta)) (c + sqrt(d)/2),  (c + sqrt(d))^2 ) ) )

Each attempt is accepted with probability >= 1 - beta (in practice far more: Hoeffding is
loose), the attempts are capped, and a row still over the bound falls back to a deterministic
projection (round toward zero, which never increases any coordinate's magnitude, so its norm is
at most ``||y|| <= c < B``). The bound therefore ALWAYS holds; it is checked exactly in int64.

Bias: conditioning on acceptance (event A, P[A] >= 1 - beta) shifts each coordinate's mean by
``|E[e_i 1_{not A}]| / P[A] <= beta / (1 - beta)`` units, and the fallback (probability
<= beta^max_attempts) by < 1 unit; with the default beta = 1e-3 the rounding is unbiased to
within 0.001 unit per coordinate in the worst case, and in practice rejections are rare.

Numbers for ``s = 2^16, C = 1`` (``c = 65536``), ``beta = 1e-3``:
``d = 2,000`` gives ``B = 65538`` (inflation 1.00003); ``d = 100,000`` gives ``B = 65539``
(inflation 1.00005), where rounding the sum once would give ``c + sqrt(d) = 65852.2`` (1.0048).
Small scales inflate more: ``s = 2^8, d = 100,000`` gives ``B = 304`` (1.19) against 572 (2.2).

Randomness: rounding uses a numpy ``Generator`` seeded from the OS CSPRNG. That is acceptable
because the rounding coins need not be secret: privacy rests on the hard bound ``B`` and on the
central noise, never on the rounding, and the rounded values themselves are secret-shared.
Unbiasedness only needs a good statistical generator (PCG64).
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "FixedPointConfig",
    "clip_rows",
    "decode",
    "default_rounding_rng",
    "encode_batch",
    "encode_rows",
    "l2_bound_units",
    "stochastic_round",
]

# float64 represents every integer exactly only up to 2^53: scaled values beyond that cannot be
# rounded meaningfully.
FLOAT_EXACT_LIMIT = 2**53
INT64_MAX = 2**63 - 1
# Rows are encoded in chunks of about this many coordinates to bound temporaries (~8 MiB each).
_CHUNK_ELEMS = 1 << 20
# A row whose norm exceeds C by more than this relative slack was not clipped at all; smaller
# excesses are float rounding from clipping (float32 rows from torch err by ~1e-7) and are
# projected back onto the ball.
_NORM_SLACK = {np.dtype(np.float64): 1e-9, np.dtype(np.float32): 1e-5}


def l2_bound_units(scaled_norm: float, dim: int, failure_prob: float) -> int:
    """B: integer L2 bound for conditional rounding of a vector of L2 norm <= ``scaled_norm``.

    Rounding succeeds with probability >= 1 - ``failure_prob`` per attempt (module docstring).
    """
    if not (math.isfinite(scaled_norm) and scaled_norm >= 0):
        raise ValueError(f"scaled_norm must be finite and >= 0, got {scaled_norm}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    if not 0.0 < failure_prob < 1.0:
        raise ValueError(f"failure_prob must be in (0, 1), got {failure_prob}")
    c, rd = float(scaled_norm), math.sqrt(dim)
    probabilistic = c * c + dim / 4.0 + math.sqrt(2.0 * math.log(1.0 / failure_prob)) * (c + rd / 2)
    deterministic = (c + rd) ** 2
    bound = math.ceil(math.sqrt(min(probabilistic, deterministic)))
    # math.sqrt/ceil on floats: make sure B^2 really covers the real-valued bound.
    while bound * bound < min(probabilistic, deterministic):
        bound += 1
    return bound


@dataclass(frozen=True)
class FixedPointConfig:
    """Fixed-point parameters: ``scale`` s (units per gradient unit), ``clip_norm`` C, ``dim`` d.

    ``failure_prob`` is the per-attempt probability bound beta for conditional rounding and
    ``max_attempts`` the number of stochastic draws before the deterministic fallback.
    """

    scale: float
    clip_norm: float
    dim: int
    failure_prob: float = 1e-3
    max_attempts: int = 8
    l2_bound_units: int = field(init=False)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be finite and > 0, got {self.scale}")
        if not (math.isfinite(self.clip_norm) and self.clip_norm > 0):
            raise ValueError(f"clip_norm must be finite and > 0, got {self.clip_norm}")
        if self.max_attempts < 0:
            raise ValueError(f"max_attempts must be >= 0, got {self.max_attempts}")
        c = self.scale * self.clip_norm
        if c + 1 >= FLOAT_EXACT_LIMIT:
            raise ValueError(
                f"scale*clip_norm = {c:g} units exceeds the float64 exact-integer limit 2^53"
            )
        # Squared norms are checked exactly in int64; the worst unrejected draw has norm
        # c + sqrt(d), so its square must stay below 2^63.
        worst = math.ceil(c + math.sqrt(self.dim)) + 1
        if worst * worst > INT64_MAX:
            raise ValueError(
                f"(scale*clip_norm + sqrt(dim))^2 = {worst * worst:.3g} exceeds the int64 limit "
                "2^63-1 needed for exact norm checks; lower the scale"
            )
        object.__setattr__(self, "l2_bound_units", l2_bound_units(c, self.dim, self.failure_prob))

    @property
    def scaled_clip_norm(self) -> float:
        """s*C, the ideal sensitivity in units."""
        return self.scale * self.clip_norm

    @property
    def inflation(self) -> float:
        """B / (s*C): how much rounding inflates the sensitivity (reported by the run)."""
        return self.l2_bound_units / self.scaled_clip_norm

    def max_abs_sum_units(self, batch_size: int) -> int:
        """Bound on any coordinate of a sum of ``batch_size`` encoded examples (|x_i| <= B)."""
        return int(batch_size) * self.l2_bound_units


def default_rounding_rng() -> np.random.Generator:
    """A PCG64 generator seeded with 128 bits from the OS CSPRNG (rounding need not be secret)."""
    return np.random.default_rng(secrets.randbits(128))


def _check_finite_exact(y: np.ndarray) -> None:
    if y.size == 0:
        return
    if not np.all(np.isfinite(y)):
        raise ValueError("values must be finite (found NaN or inf)")
    peak = float(np.max(np.abs(y)))
    if peak + 1 >= FLOAT_EXACT_LIMIT:
        raise ValueError(f"|value| = {peak:g} exceeds the float64 exact-integer limit 2^53")


def stochastic_round(x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Unbiased randomized rounding to int64: floor(x) + Bernoulli(x - floor(x))."""
    y = np.asarray(x, dtype=np.float64)
    _check_finite_exact(y)
    lo = np.floor(y)
    up = rng.random(y.shape) < (y - lo)
    return lo.astype(np.int64) + up


def clip_rows(x: np.ndarray, clip_norm: float) -> np.ndarray:
    """Scale each row of ``x`` (m, d) to L2 norm <= ``clip_norm``; returns float64."""
    if not (math.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be finite and > 0, got {clip_norm}")
    a = np.array(x, dtype=np.float64, ndmin=2, copy=True)
    if not np.all(np.isfinite(a)):
        raise ValueError("values must be finite (found NaN or inf)")
    norms = np.linalg.norm(a, axis=1)
    # Rows already inside the ball are left untouched (factor exactly 1).
    factor = np.minimum(1.0, clip_norm / np.maximum(norms, np.finfo(np.float64).tiny))
    a *= factor[:, None]
    return a


def _sq_norms(v: np.ndarray) -> np.ndarray:
    """Exact squared L2 norms of int64 rows (bounded by the config's int64 check)."""
    return np.einsum("ij,ij->i", v, v)


def _round_toward_zero_within(y: np.ndarray, bound: int) -> np.ndarray:
    """Deterministic fallback: integer rows with squared norm <= bound^2.

    Truncation never increases a coordinate's magnitude, so rows of norm <= bound stay within
    it; rows over it (only through float slack) are first scaled down. A final exact loop takes
    one unit off the largest coordinate until the bound holds, so it holds whatever floats do.
    """
    norms = np.linalg.norm(y, axis=1)
    factor = np.minimum(1.0, bound / np.maximum(norms, np.finfo(np.float64).tiny))
    out = np.trunc(y * factor[:, None]).astype(np.int64)
    limit = bound * bound
    for i in np.flatnonzero(_sq_norms(out) > limit):  # practically never runs
        row = out[i]
        while int(np.dot(row, row)) > limit:
            j = int(np.argmax(np.abs(row)))
            row[j] -= np.sign(row[j])
    return out


def _encode_chunk(
    y: np.ndarray, bound: int, rng: np.random.Generator, max_attempts: int
) -> tuple[np.ndarray, int]:
    """Conditional randomized rounding of scaled rows ``y``; returns (rows, fallback count)."""
    limit = bound * bound
    lo = np.floor(y)
    frac = y - lo
    base = lo.astype(np.int64)
    out = np.empty(y.shape, dtype=np.int64)
    pending = np.arange(y.shape[0])
    for _ in range(max_attempts):
        if pending.size == 0:
            break
        draw = base[pending] + (rng.random((pending.size, y.shape[1])) < frac[pending])
        ok = _sq_norms(draw) <= limit
        out[pending[ok]] = draw[ok]
        pending = pending[~ok]
    if pending.size:
        out[pending] = _round_toward_zero_within(y[pending], bound)
    return out, int(pending.size)


def _scaled_rows(clipped: np.ndarray, cfg: FixedPointConfig) -> np.ndarray:
    a = np.asarray(clipped)
    if a.ndim != 2 or a.shape[1] != cfg.dim:
        raise ValueError(f"expected an array of shape (m, {cfg.dim}), got {a.shape}")
    if a.dtype not in (np.float32, np.float64):
        raise ValueError(f"expected float32 or float64 rows, got {a.dtype}")
    return a


def encode_rows(
    clipped: np.ndarray,
    cfg: FixedPointConfig,
    rng: np.random.Generator,
    *,
    max_attempts: int | None = None,
) -> tuple[np.ndarray, int]:
    """Encode each row separately: (int64 (m, d) rows each of L2 norm <= B, number of fallbacks).

    Meant for tests and small batches; ``encode_batch`` returns only the sum and keeps memory
    bounded.
    """
    rows = np.empty((np.asarray(clipped).shape[0], cfg.dim), dtype=np.int64)
    fallbacks = 0
    for start, enc, fb in _iter_encoded(clipped, cfg, rng, max_attempts):
        rows[start : start + enc.shape[0]] = enc
        fallbacks += fb
    return rows, fallbacks


def _iter_encoded(
    clipped: np.ndarray,
    cfg: FixedPointConfig,
    rng: np.random.Generator,
    max_attempts: int | None,
) -> Iterator[tuple[int, np.ndarray, int]]:
    """Yield (first row index, encoded int64 rows, fallback count) chunk by chunk."""
    a = _scaled_rows(clipped, cfg)
    attempts = cfg.max_attempts if max_attempts is None else int(max_attempts)
    if attempts < 0:
        raise ValueError(f"max_attempts must be >= 0, got {attempts}")
    c = cfg.scaled_clip_norm
    step = max(1, _CHUNK_ELEMS // cfg.dim)
    for start in range(0, a.shape[0], step):
        y = a[start : start + step].astype(np.float64) * cfg.scale
        if not np.all(np.isfinite(y)):
            raise ValueError("values must be finite (found NaN or inf)")
        norms = np.linalg.norm(y, axis=1)
        if np.any(norms > c * (1 + _NORM_SLACK[a.dtype])):
            worst = float(norms.max()) / cfg.scale
            raise ValueError(
                f"a row has L2 norm {worst:.6g} > clip_norm {cfg.clip_norm}; clip rows first "
                "(clip_rows)"
            )
        # Float slack from clipping: project onto the ball so the Hoeffding bound applies.
        over = norms > c
        if np.any(over):
            y[over] *= (c / norms[over])[:, None]
        enc, fallbacks = _encode_chunk(y, cfg.l2_bound_units, rng, attempts)
        yield start, enc, fallbacks


def encode_batch(
    clipped: np.ndarray,
    cfg: FixedPointConfig,
    rng: np.random.Generator,
    *,
    ring_bits: int | None = None,
    max_attempts: int | None = None,
) -> np.ndarray:
    """G: int64 (d,) sum of the conditionally rounded examples ``round(s * x_j)``.

    ``clipped`` is (m, d) float32/float64 with each row of L2 norm <= C. Every encoded row has
    L2 norm <= ``cfg.l2_bound_units`` (B), so the sum's add/remove sensitivity is B units.
    Raises ValueError naming the limit when m*B cannot fit int64 or, if ``ring_bits`` is given,
    the signed range of Z_{2^ring_bits}.
    """
    m = int(np.asarray(clipped).shape[0]) if np.ndim(clipped) == 2 else 0
    worst = cfg.max_abs_sum_units(m)
    if worst > INT64_MAX:
        raise ValueError(
            f"batch of {m} examples with bound B={cfg.l2_bound_units} units may reach "
            f"{worst} > int64 limit 2^63-1"
        )
    if ring_bits is not None:
        if not 2 <= ring_bits <= 64:
            raise ValueError(f"ring_bits must be in 2..64, got {ring_bits}")
        if worst > 2 ** (ring_bits - 1) - 1:
            raise ValueError(
                f"batch of {m} examples with bound B={cfg.l2_bound_units} units may reach "
                f"|G_i| = {worst} > 2^{ring_bits - 1}-1, the signed limit of Z_2^{ring_bits}"
            )
    total = np.zeros(cfg.dim, dtype=np.int64)
    for _, enc, _ in _iter_encoded(clipped, cfg, rng, max_attempts):
        total += enc.sum(axis=0)
    return total


def decode(values_int: np.ndarray, scale: float) -> np.ndarray:
    """Back to gradient units: ``values / scale`` as float64.

    Integers beyond 2^53 lose their last bits in float64; a noisy sum never gets near that.
    """
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be finite and > 0, got {scale}")
    return np.asarray(values_int).astype(np.float64) / scale

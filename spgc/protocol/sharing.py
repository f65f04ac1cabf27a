"""Additive secret sharing in Z_{2^L} (SPEC step 5) with signed ("smod") decoding.

A provider splits its integer gradient sum G into ``<G>_1 = G + r`` and ``<G>_2 = r`` (mod 2^L)
with ``r`` uniform over Z_{2^L} from the OS CSPRNG; either share alone is uniform and says
nothing about G. Servers add shares mod 2^L; ``(A1 - A2) mod 2^L`` read in
``[-2^(L-1), 2^(L-1))`` is the signed total, correct whenever the true total lies in that range.

All ring arithmetic is numpy uint64 wrap-around followed by masking to L bits: never ``%`` on
signed values and never float64 (inexact above 2^53). ``r`` comes from ``os.urandom`` and never
from numpy's generators, whose state can be recovered from their outputs.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence

import numpy as np

__all__ = [
    "aggregate_shares",
    "check_fits",
    "max_abs_sum_units",
    "noise_tail_bound_units",
    "random_ring_elements",
    "reconstruct",
    "ring_bits_for",
    "ring_mask",
    "share",
    "validate_share",
]

MIN_RING_BITS = 2
MAX_RING_BITS = 64


def _check_ring_bits(ring_bits: int) -> int:
    if isinstance(ring_bits, bool) or not isinstance(ring_bits, (int, np.integer)):
        raise ValueError(f"ring_bits must be an integer in 2..64, got {ring_bits!r}")
    if not MIN_RING_BITS <= int(ring_bits) <= MAX_RING_BITS:
        raise ValueError(f"ring_bits must be in 2..64, got {ring_bits}")
    return int(ring_bits)


def ring_mask(ring_bits: int) -> np.uint64:
    """2^L - 1 as a numpy uint64 (all ones for L = 64)."""
    bits = _check_ring_bits(ring_bits)
    return np.uint64((1 << bits) - 1)


def signed_range(ring_bits: int) -> tuple[int, int]:
    """(min, max) of the signed representatives of Z_{2^L}: (-2^(L-1), 2^(L-1) - 1)."""
    bits = _check_ring_bits(ring_bits)
    half = 1 << (bits - 1)
    return -half, half - 1


def check_fits(values: np.ndarray, ring_bits: int) -> None:
    """Raise ValueError naming the limit if any value is outside [-2^(L-1), 2^(L-1) - 1]."""
    lo, hi = signed_range(ring_bits)
    v = np.asarray(values)
    if v.dtype.kind not in "iu":
        raise ValueError(f"expected integer values, got dtype {v.dtype}")
    if v.size == 0:
        return
    vmin, vmax = int(v.min()), int(v.max())
    if vmin < lo or vmax > hi:
        bad = vmin if vmin < lo else vmax
        raise ValueError(
            f"value {bad} does not fit the signed range of Z_2^{ring_bits}: "
            f"[-2^{ring_bits - 1}, 2^{ring_bits - 1}-1] = [{lo}, {hi}]; "
            "increase ring_bits (at most 64) or lower the scale"
        )


def random_ring_elements(n: int, ring_bits: int) -> np.ndarray:
    """``n`` independent uniform elements of Z_{2^L} as uint64, from ``os.urandom``."""
    mask = ring_mask(ring_bits)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    # Masking the low L bits of uniform 64-bit words keeps them exactly uniform over Z_{2^L}.
    r = np.frombuffer(os.urandom(8 * n), dtype=np.uint64).copy()
    np.bitwise_and(r, mask, out=r)
    return r


def _as_ring(values: np.ndarray, ring_bits: int) -> np.ndarray:
    """Signed int64 values -> their residues mod 2^L as uint64 (two's complement, masked)."""
    v = np.asarray(values, dtype=np.int64)
    # view, not astype: reinterpretation is the two's-complement residue mod 2^64 by definition.
    u = v.view(np.uint64).copy()
    np.bitwise_and(u, ring_mask(ring_bits), out=u)
    return u


def share(values: np.ndarray, ring_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """Split int64 ``values`` into (``<G>_1 = G + r``, ``<G>_2 = r``) mod 2^L, both uint64.

    Raises ValueError naming the limit if a value is outside the signed range of Z_{2^L}.
    """
    v = np.asarray(values)
    if v.dtype.kind not in "iu":
        raise ValueError(f"expected integer values, got dtype {v.dtype}")
    if v.dtype == np.uint64 and v.size and int(v.max()) > np.iinfo(np.int64).max:
        raise ValueError("values exceed the int64 limit 2^63-1")
    check_fits(v, ring_bits)
    g = _as_ring(v, ring_bits)
    r = random_ring_elements(g.size, ring_bits).reshape(g.shape)
    a1 = g  # reuse the buffer: a1 = g + r mod 2^L
    np.add(a1, r, out=a1)
    np.bitwise_and(a1, ring_mask(ring_bits), out=a1)
    return a1, r


def reconstruct(a1: np.ndarray, a2: np.ndarray, ring_bits: int) -> np.ndarray:
    """``(a1 - a2) mod 2^L`` read as signed int64 in [-2^(L-1), 2^(L-1)) ("smod")."""
    bits = _check_ring_bits(ring_bits)
    x, y = np.asarray(a1), np.asarray(a2)
    if x.dtype != np.uint64 or y.dtype != np.uint64:
        raise ValueError(f"shares must be uint64, got {x.dtype} and {y.dtype}")
    if x.shape != y.shape:
        raise ValueError(f"share shapes differ: {x.shape} vs {y.shape}")
    d = np.empty(x.shape, dtype=np.uint64)
    np.subtract(x, y, out=d)  # wraps mod 2^64, which reduces correctly mod 2^L after masking
    np.bitwise_and(d, ring_mask(bits), out=d)
    # Sign-extend bit L-1: (d XOR h) - h, in wrapping uint64, equals d - 2^L when d >= h.
    h = np.uint64(1 << (bits - 1))
    np.bitwise_xor(d, h, out=d)
    np.subtract(d, h, out=d)
    return d.view(np.int64)


def validate_share(share_vec: np.ndarray, dim: int, ring_bits: int) -> np.ndarray:
    """Check a received share (uint64, shape (dim,), values < 2^L); return it as uint64.

    Servers call this on every incoming share so a malformed one is rejected, not summed.
    """
    mask = ring_mask(ring_bits)
    s = np.asarray(share_vec)
    if s.dtype != np.uint64:
        raise ValueError(f"share must be uint64, got {s.dtype}")
    if s.shape != (dim,):
        raise ValueError(f"share must have shape ({dim},), got {s.shape}")
    if ring_bits < MAX_RING_BITS and s.size and int(s.max()) > int(mask):
        raise ValueError(f"share has values >= 2^{ring_bits}, outside Z_2^{ring_bits}")
    return s


def aggregate_shares(acc: np.ndarray, share_vec: np.ndarray, ring_bits: int) -> None:
    """``acc += share_vec`` mod 2^L, in place (uint64 wrap-around, then mask; no temporaries)."""
    mask = ring_mask(ring_bits)
    if not isinstance(acc, np.ndarray) or acc.dtype != np.uint64:
        raise ValueError("accumulator must be a numpy uint64 array")
    s = np.asarray(share_vec)
    if s.dtype != np.uint64:
        raise ValueError(f"share must be uint64, got {s.dtype}")
    if s.shape != acc.shape:
        raise ValueError(f"share shape {s.shape} differs from accumulator shape {acc.shape}")
    np.add(acc, s, out=acc)
    np.bitwise_and(acc, mask, out=acc)


def max_abs_sum_units(
    batch_sizes: Sequence[int] | int, per_example_bound: int, providers: int | None = None
) -> int:
    """Bound on any coordinate |S_i| of the total over providers.

    Each encoded example has L2 norm <= B, hence every coordinate |x_i| <= B, so
    ``|S_i| <= B * sum_j m_j``. ``batch_sizes`` lists each provider's largest possible batch
    (an int with ``providers`` = k means k equal providers). Under Poisson sampling a batch is
    random and only bounded by the provider's dataset size: pass that (or an enforced cap).
    """
    if per_example_bound < 0:
        raise ValueError(f"per_example_bound must be >= 0, got {per_example_bound}")
    if isinstance(batch_sizes, (int, np.integer)):
        k = 1 if providers is None else int(providers)
        if k < 0 or batch_sizes < 0:
            raise ValueError("providers and batch sizes must be >= 0")
        total = k * int(batch_sizes)
    else:
        if providers is not None and providers != len(batch_sizes):
            raise ValueError(f"{len(batch_sizes)} batch sizes given for {providers} providers")
        if any(int(m) < 0 for m in batch_sizes):
            raise ValueError("batch sizes must be >= 0")
        total = sum(int(m) for m in batch_sizes)
    return total * int(per_example_bound)


def noise_tail_bound_units(noise_std_units: float, dim: int, tail_prob: float = 2.0**-64) -> int:
    """t with P[max_i |z_i| > t] <= tail_prob for ``dim`` discrete Gaussians N_Z(0, sigma^2).

    The discrete Gaussian is sub-Gaussian with parameter sigma (Canonne-Kamath-Steinke 2020),
    so ``P[|z| > t] <= 2 exp(-t^2 / (2 sigma^2))``; a union bound over ``dim`` coordinates gives
    ``t = sigma * sqrt(2 ln(2 dim / tail_prob))``.
    """
    if noise_std_units < 0 or not math.isfinite(noise_std_units):
        raise ValueError(f"noise_std_units must be finite and >= 0, got {noise_std_units}")
    if noise_std_units == 0:
        return 0
    if dim < 1 or not 0 < tail_prob < 1:
        raise ValueError("dim must be >= 1 and tail_prob in (0, 1)")
    return math.ceil(noise_std_units * math.sqrt(2.0 * math.log(2.0 * dim / tail_prob)))


def ring_bits_for(
    max_abs_sum_units: int,
    *,
    noise_std_units: float = 0.0,
    dim: int = 1,
    tail_prob: float = 2.0**-64,
) -> int:
    """Smallest L in 2..64 such that every |S| <= ``max_abs_sum_units`` (plus, if
    ``noise_std_units`` > 0, the noise tail over ``dim`` coordinates with probability
    >= 1 - ``tail_prob``) fits the signed range [-2^(L-1), 2^(L-1) - 1].

    The noise term matters when noise lives in the ring (``preprocessed`` mode); the circuit
    itself adds noise wide enough never to wrap. Raises ValueError naming the 64-bit limit when
    no ring fits.
    """
    if max_abs_sum_units < 0:
        raise ValueError(f"max_abs_sum_units must be >= 0, got {max_abs_sum_units}")
    need = int(max_abs_sum_units) + noise_tail_bound_units(noise_std_units, dim, tail_prob)
    # |v| <= 2^(L-1) - 1  <=>  need + 1 <= 2^(L-1)  <=>  L >= bit_length(need) + 1
    bits = max(MIN_RING_BITS, need.bit_length() + 1)
    if bits > MAX_RING_BITS:
        raise ValueError(
            f"|S| + noise tail = {need} needs {bits} ring bits, over the 64-bit limit "
            f"(max |S| = 2^63-1 = {2**63 - 1}); lower the scale, batch size or providers"
        )
    return bits

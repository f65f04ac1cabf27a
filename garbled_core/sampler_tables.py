"""The discrete Gaussian sampler's tables and parameters as data: the alias and coin tables,
the randomized rounding, :class:`SamplerParams`, and the retry schedule's expected trials.

What :mod:`garbled_core.sampler_params` computes and :mod:`garbled_core.sampler_circuit` builds
from (neither imports the other's module for these types, so the three have no cycle).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import Context, Decimal, localcontext
from typing import Any

from garbled_core.circuit import MAX_PORT_WIDTH

__all__ = [
    "DEFAULT_SCHEDULE",
    "MAX_ROUNDS",
    "AliasTable",
    "CoinTable",
    "Rounding",
    "SamplerParams",
    "expected_trials",
    "schedule_at",
]

DIGITS = 90  # decimal digits for every table computation (about 299 bits)

DEFAULT_SCHEDULE: tuple[int, ...] = (1, 1, 2, 4, 8, 16, 32, 64)
"""Trials per still-unsampled coordinate in retry round 0, 1, ... (the last entry repeats)."""

MAX_ROUNDS = 48
"""Retry rounds before a batch gives up (probability below 2^-1000 for any parameters here)."""


def _ctx() -> Any:
    return localcontext(Context(prec=DIGITS))


def _log2(x: Decimal) -> float:
    if x <= 0:
        return -math.inf
    with _ctx():
        return float(x.ln() / Decimal(2).ln())


@dataclass(frozen=True)
class AliasTable:
    """Walker alias table over codes (s | M << 1): column u gives ``primary[u]`` when
    R < ``threshold[u]`` (R uniform on l bits), else ``alias[u]``."""

    index_bits: int
    threshold: tuple[int, ...]
    primary: tuple[int, ...]
    alias: tuple[int, ...]
    weights: tuple[int, ...]
    """Exact probability of each code times 2^(index_bits + coin_bits) (codes 0..len-1)."""


@dataclass(frozen=True)
class CoinTable:
    """Chunk coin: bits [offset, offset + size) of v select the threshold T'; the coin is
    1 iff R <= T' (probability (T' + 1) / 2^l ~ exp(-gamma * chunk * 2^offset))."""

    offset: int
    size: int
    threshold: tuple[int, ...]
    max_error: Decimal
    """max over the table of |(T'+1) / 2^l - exp(-gamma * chunk * 2^offset)|."""
    index_count: int
    """The chunk is always below this (2^size, or less for the top chunk): only the monomials
    below it are built."""


@dataclass(frozen=True)
class Rounding:
    """Randomized rounding of the low ``bits`` bits y of v (section 4 of docs/NOISE_SAMPLER.md).

    A count J in 1..max_count is drawn by the small alias table ``count`` (code c = J - 1, an
    exact, rounded, zero-truncated Poisson(mu) law, mu = gamma 2^bits) and J uniforms U_j of
    ``bits`` bits; the carry ``OR_{j<=J} [y + U_j >= 2^bits]`` is added to v >> bits. Then
    P(carry | y) = 1 - sum_j P(J=j) (1 - y/2^bits)^j, and with the ideal law the acceptance
    factor (1 - P(carry)) + P(carry) exp(-mu) is exactly exp(-gamma y)."""

    bits: int
    max_count: int
    count: AliasTable
    coin_bits: int  # precision of the count alias coin
    mu: Decimal
    max_error: Decimal
    """max over y of |P(carry | y) - ideal| times (1 - exp(-mu)): the acceptance error."""


@dataclass(frozen=True)
class SamplerParams:
    """Everything the trial circuit and the error bound depend on (all public)."""

    sigma_units: float
    target_log2: float
    bucket_bits: int  # e: bucket width 2^e
    coin_bits: int  # l: precision of every coin
    grid_count: int  # M takes values 0 .. grid_count - 1 on each side
    magnitude_bits: int  # width of M
    sign_coin: bool  # s is a fair random bit and the alias draws M alone (every e > 0)
    alias: AliasTable
    coins: tuple[CoinTable, ...]
    v_bits: int
    rounding: Rounding | None
    w_bits: int  # width of w = (v >> k) + carry, the value the chunk coins read
    noise_bits: int
    noise_bound: int  # |z| <= noise_bound for every output
    acceptance: float  # probability that one trial is accepted (lower bound)
    sd_alias: Decimal  # SD of the implemented bucket distribution from the exact one
    sd_coins: Decimal  # sum of the coin tables' max errors
    sd_round: Decimal  # acceptance error of the randomized rounding (0 without)
    tail_mass: Decimal  # exact bucket mass beyond grid_count (included in sd_alias)
    distance_bound: Decimal  # per-sample statistical distance bound

    # -- derived --------------------------------------------------------------------------

    @property
    def distance_log2(self) -> float:
        """log2 of the per-sample statistical-distance bound."""
        return _log2(self.distance_bound)

    @property
    def code_bits(self) -> int:
        """Width of an alias code: M, or s | M << 1 without the sign coin."""
        return self.magnitude_bits + (0 if self.sign_coin else 1)

    @property
    def random_bits(self) -> int:
        """Random bits one trial reads (from each party: the circuit XORs the two)."""
        bits = self.alias.index_bits + self.coin_bits * (1 + len(self.coins)) + self.bucket_bits
        bits += int(self.sign_coin)
        if self.rounding is not None:
            rr = self.rounding
            bits += rr.count.index_bits + rr.coin_bits + rr.max_count * rr.bits
        return bits

    @property
    def port_widths(self) -> tuple[int, ...]:
        """Widths of the random-input ports g0.. (garbler) and e0.. (evaluator)."""
        total = self.random_bits
        full, rest = divmod(total, MAX_PORT_WIDTH)
        return (MAX_PORT_WIDTH,) * full + ((rest,) if rest else ())

    def expected_trials(self, schedule: Sequence[int] = DEFAULT_SCHEDULE) -> float:
        """Expected trials per sample under the adaptive retry schedule."""
        return expected_trials(self.acceptance, schedule)


def schedule_at(schedule: Sequence[int], round_index: int) -> int:
    """Trials per pending coordinate in retry round ``round_index``."""
    if not schedule or any(int(t) < 1 for t in schedule):
        raise ValueError("a retry schedule needs at least one entry, each >= 1")
    return int(schedule[min(round_index, len(schedule) - 1)])


def expected_trials(p_accept: float, schedule: Sequence[int] = DEFAULT_SCHEDULE) -> float:
    """E[trials run per coordinate] when round r runs schedule[r] trials for each coordinate
    that has no accepted trial yet (all of a round's trials are paid for)."""
    if not 0 < p_accept <= 1:
        raise ValueError(f"acceptance probability must be in (0, 1], got {p_accept}")
    total, pending = 0.0, 1.0
    for r in range(MAX_ROUNDS):
        n = schedule_at(schedule, r)
        total += pending * n
        pending *= (1.0 - p_accept) ** n
        if pending < 1e-30:
            break
    return total

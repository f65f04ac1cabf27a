"""Discrete Gaussian sampler circuit N_Z(0, sigma^2) and the derivation of its parameters.

The method (derivation, error budget and privacy argument in docs/NOISE_SAMPLER.md):

One *trial* draws a candidate x and an accept bit. The integers are cut into buckets of
``2**e`` consecutive values: bucket (s=0, M) is ``[2^e M, 2^e M + 2^e)`` and bucket (s=1, M) is
``[-(2^e M + 2^e), -(2^e M + 1)]``, for M = 0, 1, ...; in bucket (s, M), |x| = 2^e M + F with
F = D + s in [0, 2^e], D the uniform offset.

1. M is drawn with probability proportional to rho(2^e M) by Walker's alias method: a uniform
   a-bit column index u and one l-bit coin against the column's public threshold (a public-table
   lookup costs 2^a - a - 1 AND gates for all monomials of u; the coin is an l-bit comparison).
   The sign s is a fair random bit (both buckets (0, M) and (1, M) weigh rho(2^e M), so it is
   independent of M). For e = 0 the alias draws the code s | M << 1 itself, with weight rho(x).
2. The offset D is e uniform bits; x is (D xor s, M xor s, s) in two's complement: no gates.
3. The trial is accepted with probability rho(x) / rho(2^e M) = exp(-v / (2 sigma^2)) where
   v = x^2 - (2^e M)^2 = F (2^(e+1) M + F) is an exact integer (an increment, partial products
   and a carry-save column compression).
4. Randomized rounding of the low k bits y of v: a carry c with P(c | y) = (1 - q^y) / (1 - q^N)
   (q = exp(-1 / (2 sigma^2)), N = 2^k) is added to v >> k, giving w; then
   E_c[exp(-gamma 2^k w)] = exp(-gamma v) exactly. The carry is the OR of J comparisons
   y + U_j >= N with J drawn from a small alias table (a rounded zero-truncated Poisson law):
   about J k + l' AND gates replace the chunk coins of k bits.
5. exp(-gamma 2^k w) = prod_t exp(-gamma 2^(k + o_t) w_t) over c-bit chunks w_t of w, so the
   accept bit is the AND of one coin per chunk, each an l-bit comparison with a public table
   indexed by the chunk (the top chunk, whose value stays below a known bound, builds only the
   monomials below it).

Accepted candidates are distributed as rho restricted to the support, up to the rounding of the
public tables, the count law and the truncated tail of the bucket distribution;
:func:`derive_params` computes those errors exactly (decimal arithmetic at 90 digits) and picks
the smallest l that meets the target, the rounding width k, and the bucket width that minimises
the expected AND gates per sample.

All the randomness a trial reads is one bit string, the XOR of a garbler port and an evaluator
port per 64-bit word (each party expands its own seed outside the circuit).
"""

from __future__ import annotations

import functools
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Context, Decimal, localcontext
from typing import Any

from garbled_core.circuit import MAX_PORT_WIDTH, Bits, CircuitBuilder

__all__ = [
    "DEFAULT_DISTANCE_LOG2",
    "DEFAULT_SCHEDULE",
    "MAX_NOISE_BITS",
    "MAX_SIGMA_UNITS",
    "MIN_SIGMA_UNITS",
    "AliasTable",
    "CoinTable",
    "Rounding",
    "SamplerParams",
    "build_trial_circuit",
    "derive_params",
    "exact_pmf",
    "expected_trials",
    "monomials",
    "schedule_at",
    "table_lookup",
    "theta",
    "trial_layout",
]

DEFAULT_DISTANCE_LOG2 = -64.0
"""Default bound on the statistical distance of one sample from N_Z(0, sigma^2), as log2."""

MIN_SIGMA_UNITS = 0.5
MAX_SIGMA_UNITS = float(2**40)
MAX_NOISE_BITS = 62
"""Widest noise the sampler emits (two's complement); wider would not fit one 64-bit port."""

DEFAULT_SCHEDULE: tuple[int, ...] = (1, 1, 2, 4, 8, 16, 32, 64)
"""Trials per still-unsampled coordinate in retry round 0, 1, ... (the last entry repeats)."""

MAX_ROUNDS = 48
"""Retry rounds before a batch gives up (probability below 2^-1000 for any parameters here)."""

_DIGITS = 90  # decimal digits for every table computation (about 299 bits)
_TAIL_MARGIN_LOG2 = 12  # the cut-off tail of the bucket distribution gets target - 12
_MAX_ALIAS_BITS = 12  # largest alias table accepted with an explicit bucket_bits
_SEARCH_ALIAS_BITS = 10  # largest alias table the automatic search tries
_MAX_CHUNK = 7
_MAX_TOP_CHUNK = 9
_MAX_ROUND_COUNT = 8
_ROUND_MARGIN_LOG2 = 3  # the randomized rounding gets at most target - 3


# ---------------------------------------------------------------------------- exact arithmetic


def _ctx() -> Any:
    return localcontext(Context(prec=_DIGITS))


@functools.lru_cache(maxsize=1)
def _pi() -> Decimal:
    """pi to _DIGITS digits by Machin's formula (16 atan 1/5 - 4 atan 1/239)."""
    with localcontext(Context(prec=_DIGITS + 10)):
        eps = Decimal(10) ** -(_DIGITS + 8)

        def atan_inv(k: int) -> Decimal:
            x = Decimal(1) / k
            x2 = x * x
            power, total, n, sign = x, x, 1, 1
            while True:
                power *= x2
                n += 2
                sign = -sign
                term = power / n
                if term < eps:
                    return total
                total += sign * term

        value = 16 * atan_inv(5) - 4 * atan_inv(239)
    with _ctx():
        return +value


def _sigma_decimal(sigma_units: float) -> Decimal:
    return Decimal(float(sigma_units))  # exact: a float is a dyadic rational


def _rho(x: int, two_sigma2: Decimal) -> Decimal:
    """exp(-x^2 / (2 sigma^2)) to _DIGITS digits."""
    with _ctx():
        return (-(Decimal(x * x) / two_sigma2)).exp()


def theta(sigma_units: float) -> Decimal:
    """sum over all integers x of exp(-x^2 / (2 sigma^2)), to about 80 digits.

    Direct summation for sigma < 2; for sigma >= 2 the Poisson-summation form
    sqrt(2 pi) sigma (1 + 2 sum_k exp(-2 pi^2 sigma^2 k^2)), whose k >= 3 terms are below
    exp(-700).
    """
    sigma = _sigma_decimal(sigma_units)
    with _ctx():
        two_sigma2 = 2 * sigma * sigma
        if sigma < 2:
            total = Decimal(1)
            x = 1
            while True:
                term = _rho(x, two_sigma2)
                total += 2 * term
                if term < Decimal(10) ** -(_DIGITS + 5):
                    return total
                x += 1
        pi = _pi()
        q = 2 * pi * pi * sigma * sigma
        corr = sum((-(q * k * k)).exp() for k in (1, 2))
        return (2 * pi).sqrt() * sigma * (1 + 2 * corr)


def exact_pmf(sigma_units: float, xs: Sequence[int]) -> list[Decimal]:
    """P(x) of N_Z(0, sigma^2) for each x, to about 80 significant digits."""
    sigma = _sigma_decimal(sigma_units)
    th = theta(sigma_units)
    with _ctx():
        two_sigma2 = 2 * sigma * sigma
        return [_rho(int(x), two_sigma2) / th for x in xs]


def _log2(x: Decimal) -> float:
    if x <= 0:
        return -math.inf
    with _ctx():
        return float(x.ln() / Decimal(2).ln())


# ---------------------------------------------------------------------------- tables


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

    def and_gates_per_trial(self) -> int:
        """AND gates of one trial (from the compiled circuit)."""
        return int(build_trial_circuit(self).and_count)

    def summary(self, schedule: Sequence[int] = DEFAULT_SCHEDULE) -> dict[str, Any]:
        """JSON-friendly description (the benchmark and the docs print this)."""
        ands = self.and_gates_per_trial()
        trials = self.expected_trials(schedule)
        return {
            "sigma_units": self.sigma_units,
            "bucket_bits": self.bucket_bits,
            "coin_bits": self.coin_bits,
            "alias_bits": self.alias.index_bits,
            "grid_count": self.grid_count,
            "v_bits": self.v_bits,
            "chunks": [c.size for c in self.coins],
            "round_bits": 0 if self.rounding is None else self.rounding.bits,
            "round_count": 0 if self.rounding is None else self.rounding.max_count,
            "noise_bits": self.noise_bits,
            "noise_bound": self.noise_bound,
            "acceptance": self.acceptance,
            "trials_per_sample": trials,
            "and_gates_per_trial": ands,
            "and_gates_per_sample": ands * trials,
            "random_bits_per_trial": self.random_bits,
            "random_bits_per_sample": self.random_bits * trials,
            "statistical_distance_log2": self.distance_log2,
            "target_log2": self.target_log2,
        }


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


def _alias(
    weights: Sequence[Decimal], index_bits: int, coin_bits: int
) -> tuple[AliasTable, Decimal]:
    """Alias table for the distribution proportional to ``weights`` (codes 0..len-1), with
    every probability a multiple of 2^-(index_bits + coin_bits) (largest-remainder rounding).
    Returns the table and its SD from the normalised ``weights``."""
    n = 1 << index_bits
    cap = 1 << coin_bits
    m = len(weights)
    if m > n:
        raise ValueError(f"{m} values do not fit an alias table of {n} columns")
    with _ctx():
        total = sum(weights)
        scaled = [w / total * (n * cap) for w in weights]
        ints = [int(x.to_integral_value(rounding=ROUND_FLOOR)) for x in scaled]
        deficit = n * cap - sum(ints)
        order = sorted(range(m), key=lambda i: scaled[i] - ints[i], reverse=True)
        for i in order[:deficit]:
            ints[i] += 1
        sd = sum(abs(Decimal(ints[i]) - scaled[i]) for i in range(m)) / (2 * n * cap)
    work = ints + [0] * (n - m)  # padding codes never come out (their weight is 0)
    small = [i for i in range(n) if work[i] < cap]
    large = [i for i in range(n) if work[i] >= cap]
    threshold, primary, alias = [0] * n, [0] * n, [0] * n
    col = 0
    rem = list(work)
    while small and large:
        lo, hi = small.pop(), large.pop()
        threshold[col], primary[col], alias[col] = rem[lo], lo, hi
        rem[hi] -= cap - rem[lo]
        (small if rem[hi] < cap else large).append(hi)
        col += 1
    for i in small + large:  # exactly full columns (integer weights sum to n * cap)
        assert rem[i] == cap, "alias construction lost probability mass"
        threshold[col], primary[col], alias[col] = 0, i, i
        col += 1
    assert col == n
    for c in range(n):  # a padding code (weight 0) as primary: make the column all alias
        if primary[c] >= m:
            threshold[c], primary[c] = 0, alias[c]
    table = AliasTable(index_bits, tuple(threshold), tuple(primary), tuple(alias), tuple(ints))
    return table, sd


def _mono_cost(size: int, count: int) -> int:
    """AND gates for the monomials a table on ``size`` index bits needs when the index is always
    below ``count``: only monomials m < count (the set [0, count) is closed under taking bit
    subsets, so their ANF coefficients and values there involve no others), each one AND."""
    count = min(count, 1 << size)
    return sum(1 for m in range(1, count) if m & (m - 1))


def _chunk_sizes(w_bits: int, coin_bits: int, w_max: int) -> tuple[list[int], int]:
    """Chunk sizes (low to high) covering w_bits bits at the least AND gates, and that cost.

    Chunk cost: l for the comparison plus its monomials (2^c - c - 1; for the top chunk only the
    monomials below its largest value w_max >> offset, see :func:`_mono_cost`)."""
    cost = [0] + [1 << 60] * w_bits
    choice = [0] * (w_bits + 1)
    for k in range(1, w_bits + 1):
        for c in range(1, min(_MAX_CHUNK, k) + 1):
            cand = cost[k - c] + coin_bits + (1 << c) - c - 1
            if cand < cost[k]:
                cost[k], choice[k] = cand, c
    best: tuple[int, int] | None = None
    for top in range(1, min(_MAX_TOP_CHUNK, w_bits) + 1):
        rest = w_bits - top
        cand = cost[rest] + coin_bits + _mono_cost(top, (w_max >> rest) + 1)
        if best is None or cand < best[0]:
            best = (cand, top)
    if best is None:
        return [], 0
    sizes = []
    k = w_bits - best[1]
    while k:
        sizes.append(choice[k])
        k -= choice[k]
    return [*sorted(sizes, reverse=True), best[1]], best[0]


def _count_law(mu: Decimal, max_count: int) -> tuple[list[Decimal], Decimal]:
    """P(J = j) for j = 1..max_count of the zero-truncated Poisson(mu) law, and the mass of
    J > max_count: mu^j / (j! (e^mu - 1))."""
    with _ctx():
        norm = mu.exp() - 1
        probs = []
        term = Decimal(1)
        for j in range(1, max_count + 1):
            term = term * mu / j
            probs.append(term / norm)
        return probs, max(Decimal(0), 1 - sum(probs))


def _rounding(two_sigma2: Decimal, bits: int, budget: Decimal) -> Rounding | None:
    """The cheapest count law for rounding at ``bits`` whose acceptance error is <= budget."""
    with _ctx():
        mu = Decimal(1 << bits) / two_sigma2
        damp = 1 - (-mu).exp()
    for max_count in range(1, _MAX_ROUND_COUNT + 1):
        probs, tail = _count_law(mu, max_count)
        with _ctx():
            if tail * damp > budget / 2:
                continue
        if max_count == 1:  # J = 1 always: no table, no coin
            with _ctx():
                err = tail * damp
            if err > budget:
                continue
            table = AliasTable(0, (0,), (0,), (0,), (1,))
            return Rounding(bits, 1, table, 0, mu, err)
        index_bits = max(1, (max_count - 1).bit_length())
        for coin_bits in range(4, 200):
            table, sd = _alias(probs, index_bits, coin_bits)
            with _ctx():
                # TV(implemented, ideal) <= TV(rounded, normalised) + mass cut off
                err = (sd + tail) * damp
            if err <= budget:
                return Rounding(bits, max_count, table, coin_bits, mu, err)
        return None  # pragma: no cover - the loop always meets the budget
    return None


def _rounding_cost(rr: Rounding) -> int:
    """AND gates of the rounding (estimate): J carries of ``bits`` bits, the count table and
    coin, the nested OR/AND of the carries, and about 2 for the carry's extra bit in column k
    of v's compression (it ripples only through columns of odd height)."""
    a = rr.count.index_bits
    j = rr.max_count
    table = (1 << a) - a - 1 + rr.coin_bits + (j - 1) if j > 1 else 0
    return j * rr.bits + table + 2 * (j - 1) + 2


def _acceptance_plan(
    two_sigma2: Decimal, v_max: int, coin_bits: int, budget: Decimal
) -> tuple[Rounding | None, int, list[int]]:
    """(rounding or None, w_bits, chunk sizes) with the least estimated AND gates."""
    v_bits = v_max.bit_length()
    sizes, best_cost = _chunk_sizes(v_bits, coin_bits, v_max)
    best: tuple[Rounding | None, int, list[int]] = (None, v_bits, sizes)
    for k in range(1, v_bits):
        rr = _rounding(two_sigma2, k, budget)
        if rr is None:
            continue
        w_max = (v_max >> k) + 1
        w_bits = w_max.bit_length()
        sizes_k, chunk_cost = _chunk_sizes(w_bits, coin_bits, w_max)
        total = chunk_cost + _rounding_cost(rr)
        if total < best_cost:
            best_cost, best = total, (rr, w_bits, sizes_k)
    return best


def _coin_table(
    offset: int, size: int, two_sigma2: Decimal, coin_bits: int, index_count: int
) -> CoinTable:
    cap = 1 << coin_bits
    thresholds = []
    worst = Decimal(0)
    with _ctx():
        for val in range(1 << size):
            exact = (-(Decimal(val << offset) / two_sigma2)).exp()
            t = int((exact * cap).to_integral_value(rounding=ROUND_HALF_EVEN))
            t = min(max(t, 1), cap)  # T' = t - 1 must be a valid l-bit value
            worst = max(worst, abs(Decimal(t) / cap - exact))
            thresholds.append(t - 1)
    return CoinTable(offset, size, tuple(thresholds), worst, min(index_count, 1 << size))


def _grid(
    sigma: Decimal, e: int, rel_tail: Decimal, sign_coin: bool = False
) -> tuple[list[Decimal], int, Decimal, Decimal]:
    """Bucket weights rho(2^e M + s) for codes s | M << 1, M < count, with the cut-off tail;
    with ``sign_coin``, weights rho(2^e M) for codes M (the sign is a fair coin, and both buckets
    (0, M) and (1, M) get weight rho(2^e M)).

    Returns (weights, count, tail_upper_bound, included_sum) (one side with ``sign_coin``). The
    tail bound uses the ratio rho(P + 2^e) / rho(P) <= r for every P >= 2^e * count."""
    with _ctx():
        two_sigma2 = 2 * sigma * sigma
        weights: list[Decimal] = []
        count = 0
        while True:
            base = count << e
            weights.append(_rho(base, two_sigma2))
            if not sign_coin:
                weights.append(_rho(base + 1, two_sigma2))
            count += 1
            nxt = count << e
            first = _rho(nxt, two_sigma2)
            ratio = (-(Decimal((2 * nxt + (1 << e)) << e) / two_sigma2)).exp()
            tail = (1 if sign_coin else 2) * first / (1 - ratio)
            included = sum(weights)
            if count >= 2 and tail <= rel_tail * included:
                return weights, count, tail, included


def _params_for(
    sigma_units: float,
    target_log2: float,
    e: int,
    coin_bits: int,
    round_bits: int | None = None,
) -> SamplerParams:
    sigma = _sigma_decimal(sigma_units)
    with _ctx():
        two_sigma2 = 2 * sigma * sigma
        rel_tail = Decimal(2) ** math.floor(target_log2 - _TAIL_MARGIN_LOG2)
    sign_coin = e > 0
    weights, count, tail, included = _grid(sigma, e, rel_tail, sign_coin)
    index_bits = max(1, (len(weights) - 1).bit_length())
    alias, sd_rounding = _alias(weights, index_bits, coin_bits)
    with _ctx():
        tail_mass = tail / (included + tail)  # upper bound on the exact cut-off mass
        sd_alias = sd_rounding + tail_mass
    magnitude_bits = max(1, (count - 1).bit_length())
    rounding: Rounding | None = None
    sd_round = Decimal(0)
    if e == 0:
        v_bits, w_bits, coins = 0, 0, ()
        sd_coins = Decimal(0)
        acceptance = 1.0
        bound = sd_alias
    else:
        # largest x^2 - (2^e M)^2: s = 1, E = 2^e - 1, M = count - 1 (|x| = 2^e count)
        v_max = (count << e) ** 2 - ((count - 1) << e) ** 2
        v_bits = v_max.bit_length()
        with _ctx():
            budget = Decimal(2) ** math.floor(target_log2 - _ROUND_MARGIN_LOG2)
        if round_bits is None:
            rounding, w_bits, sizes = _acceptance_plan(two_sigma2, v_max, coin_bits, budget)
        elif round_bits == 0:
            rounding, w_bits = None, v_bits
            sizes = _chunk_sizes(v_bits, coin_bits, v_max)[0]
        else:
            rounding = _rounding(two_sigma2, round_bits, budget)
            if rounding is None:
                raise ValueError(f"no randomized rounding at {round_bits} bits meets the target")
            w_max = (v_max >> round_bits) + 1
            w_bits = w_max.bit_length()
            sizes = _chunk_sizes(w_bits, coin_bits, w_max)[0]
        base = 0 if rounding is None else rounding.bits
        w_max = v_max if rounding is None else (v_max >> base) + 1
        coins_list = []
        offset = 0
        for t, size in enumerate(sizes):
            index_count = (w_max >> offset) + 1 if t == len(sizes) - 1 else 1 << size
            coins_list.append(_coin_table(base + offset, size, two_sigma2, coin_bits, index_count))
            offset += size
        coins = tuple(coins_list)
        with _ctx():
            sd_coins = sum((c.max_error for c in coins), Decimal(0))
            if rounding is not None:
                sd_round = rounding.max_error
            acc = theta(sigma_units) / ((1 << e) * 2 * (included + tail))
            # SD(first accepted, target) <= (||q~ - q||_1 + max|A~ - A|) / P(accept)
            bound = (2 * sd_alias + sd_coins + sd_round) / acc
            acceptance = float(acc) * (1 - 1e-15)
    noise_bits = e + magnitude_bits + 1
    return SamplerParams(
        sigma_units=float(sigma_units),
        target_log2=float(target_log2),
        bucket_bits=e,
        coin_bits=coin_bits,
        grid_count=count,
        magnitude_bits=magnitude_bits,
        sign_coin=sign_coin,
        alias=alias,
        coins=coins,
        v_bits=v_bits,
        rounding=rounding,
        w_bits=w_bits,
        noise_bits=noise_bits,
        noise_bound=count << e,
        acceptance=acceptance,
        sd_alias=sd_alias,
        sd_coins=sd_coins,
        sd_round=sd_round,
        tail_mass=tail_mass,
        distance_bound=bound,
    )


def _params_meeting_target(sigma_units: float, target_log2: float, e: int) -> SamplerParams:
    coin_bits = max(8, math.ceil(-target_log2) - 3)
    while True:
        params = _params_for(sigma_units, target_log2, e, coin_bits)
        if params.distance_log2 <= target_log2:
            return params
        coin_bits += 1
        if coin_bits > 4 * max(64, math.ceil(-target_log2)):  # pragma: no cover - cannot happen
            raise RuntimeError("coin precision does not converge")


def _check_sigma(sigma_units: float) -> float:
    try:
        sigma = float(sigma_units)
    except (TypeError, ValueError):
        raise TypeError(f"sigma_units must be a number, got {sigma_units!r}") from None
    if not math.isfinite(sigma):
        raise ValueError(f"sigma_units must be finite, got {sigma_units!r}")
    if sigma < MIN_SIGMA_UNITS:
        raise ValueError(
            f"sigma_units={sigma:g} is below the sampler's limit of {MIN_SIGMA_UNITS:g} units "
            "(use a finer fixed-point scale)"
        )
    if sigma > MAX_SIGMA_UNITS:
        raise ValueError(
            f"sigma_units={sigma:g} is above the sampler's limit of 2^40 = {MAX_SIGMA_UNITS:.6g} "
            f"units: its noise would not fit the {MAX_NOISE_BITS}-bit noise output"
        )
    return sigma


def _check_target(distance_log2: float) -> float:
    target = float(distance_log2)
    if not math.isfinite(target) or not -256 <= target <= -8:
        raise ValueError(
            f"distance_log2={distance_log2!r} must be in [-256, -8] "
            f"(default {DEFAULT_DISTANCE_LOG2:g})"
        )
    return target


def _estimated_values(sigma: float, e: int) -> int:
    """About how many buckets (s, M) carry mass above 2^-80: 2 * 11.5 sigma / 2^e."""
    return 2 * (math.ceil(11.5 * sigma / (1 << e)) + 2)


def _bucket_candidates(sigma: float) -> list[int]:
    """Bucket widths worth trying: alias tables of 2^4..2^_SEARCH_ALIAS_BITS columns (smaller
    ones leave the acceptance below 0.7, larger ones cost more gates than they save), or no
    rejection at all (e = 0) when the whole distribution fits such a table."""
    top = max(0, math.floor(math.log2(sigma)) + 1)
    out = []
    for e in range(top + 1):
        values = _estimated_values(sigma, e)
        if values > (1 << _SEARCH_ALIAS_BITS):
            continue
        if e > 0 and values <= (1 << 3):
            break
        out.append(e)
    return out or [top]


@functools.lru_cache(maxsize=64)
def _derive(sigma: float, target: float, bucket_bits: int | None) -> SamplerParams:
    if bucket_bits is not None:
        return _params_meeting_target(sigma, target, bucket_bits)
    best: tuple[float, SamplerParams] | None = None
    for e in _bucket_candidates(sigma):
        params = _params_meeting_target(sigma, target, e)
        cost = params.and_gates_per_trial() * params.expected_trials()
        if best is None or cost < best[0]:
            best = (cost, params)
    assert best is not None
    return best[1]


def derive_params(
    sigma_units: float,
    distance_log2: float = DEFAULT_DISTANCE_LOG2,
    *,
    bucket_bits: int | None = None,
) -> SamplerParams:
    """Sampler parameters for N_Z(0, sigma_units^2) within 2^distance_log2 per sample.

    Picks the coin precision l as the smallest that meets the target (the bound is computed
    from the actual rounded tables), and, unless ``bucket_bits`` is given, the bucket width
    2^e with the fewest expected AND gates per sample (counted on the compiled circuits).
    Raises ValueError naming the limit when sigma or the target are out of range.
    """
    sigma = _check_sigma(sigma_units)
    target = _check_target(distance_log2)
    if bucket_bits is not None:
        if not isinstance(bucket_bits, int) or isinstance(bucket_bits, bool) or bucket_bits < 0:
            raise ValueError(f"bucket_bits must be a non-negative int, got {bucket_bits!r}")
        if _estimated_values(sigma, bucket_bits) > (1 << _MAX_ALIAS_BITS):
            raise ValueError(
                f"bucket_bits={bucket_bits} leaves about {21 * sigma / (1 << bucket_bits):.0f} "
                f"buckets for sigma_units={sigma:g}, above the alias-table limit of "
                f"{1 << _MAX_ALIAS_BITS} columns"
            )
    params = _derive(sigma, target, bucket_bits)
    if params.noise_bits > MAX_NOISE_BITS:  # pragma: no cover - excluded by MAX_SIGMA_UNITS
        raise ValueError(
            f"sigma_units={sigma:g} needs {params.noise_bits}-bit noise, above the limit of "
            f"{MAX_NOISE_BITS} bits"
        )
    return params


# ---------------------------------------------------------------------------- circuit


def monomials(
    b: CircuitBuilder, bits: Sequence[Bits], count: int | None = None
) -> list[Bits | None]:
    """Products of every subset of ``bits`` (index = subset mask; None = the empty product, 1):
    2^c - c - 1 AND gates. With ``count``, only the masks below it (an index that is always
    below ``count`` needs no others: see :func:`table_lookup`)."""
    full = 1 << len(bits)
    size = full if count is None else min(count, full)
    monos: list[Bits | None] = [None] * size
    for mask in range(1, size):
        top = mask.bit_length() - 1
        rest = mask ^ (1 << top)
        if rest == 0:
            monos[mask] = bits[top]
        else:
            prev = monos[rest]
            assert prev is not None
            monos[mask] = b.and_(prev, bits[top])
    return monos


def table_lookup(
    b: CircuitBuilder, monos: list[Bits | None], table: Sequence[int], width: int
) -> Bits:
    """table[index] as ``width`` bits, by the algebraic normal form of each output bit over the
    index monomials: XORs only (free).

    ``monos`` may hold only the masks below some count (``monomials(..., count)``): the result
    is then right for every index below that count. The set [0, count) contains every bit subset
    of its members, so the ANF coefficient of a mask m < count depends only on table entries
    below count and the value at an index p < count only on coefficients of masks m <= p."""
    anf = list(table)
    size = len(anf)
    step = 1
    while step < size:
        for mask in range(size):
            if mask & step:
                anf[mask] ^= anf[mask ^ step]
        step <<= 1
    out = []
    for j in range(width):
        terms = [monos[m] for m in range(1, min(size, len(monos))) if (anf[m] >> j) & 1]
        bit = b.xor_reduce(b.concat(*terms)) if terms else b.const(0, 1)  # type: ignore[arg-type]
        if anf[0] >> j & 1:
            bit = b.not_(bit)
        out.append(bit)
    return b.concat(*out)


def _weighted_sum(
    b: CircuitBuilder,
    columns: list[list[Bits]],
    width: int,
    inject: tuple[int, Any] | None = None,
) -> Bits:
    """Sum of bits with weights 2^k (column k) mod 2^width: full adders while a column has
    three bits, a half adder at two (1 AND each; carries out of the top column are dropped).

    ``inject = (j, fn)``: once columns below j are summed, fn(those j result bits) gives one
    more bit for column j (the rounding carry: cheaper there than an increment afterwards)."""
    out: list[Bits] = []
    for k in range(width):
        if inject is not None and k == inject[0]:
            columns[k].append(inject[1](b.concat(*out)))
        col = deque(columns[k])
        while len(col) >= 2:
            x, y = col.popleft(), col.popleft()
            z = col.popleft() if col else None
            if k + 1 < width:
                s, c = b.add_with_carry(x, y, z)
                columns[k + 1].append(c)
            else:
                s = b.xor(x, y) if z is None else b.xor(b.xor(x, y), z)
            col.append(s)
        out.append(col[0] if col else b.const(0, 1))
    return b.concat(*out)


def _excess_v(
    b: CircuitBuilder,
    e_bits: Bits,
    m_bits: Bits,
    s: Bits,
    e: int,
    width: int,
    sign_coin: bool = False,
) -> Bits:
    """v = E^2 + 2 s E + 2^(e+1) E M = E (2P + E) = |x|^2 - P^2, P = 2^e M + s; with
    ``sign_coin`` (``e_bits`` = D, |x| = 2^e M + D + s) v = |x|^2 - (2^e M)^2."""
    return _weighted_sum(b, _excess_columns(b, e_bits, m_bits, s, e, width, sign_coin), width)


def _excess_columns(
    b: CircuitBuilder,
    e_bits: Bits,
    m_bits: Bits,
    s: Bits,
    e: int,
    width: int,
    sign_coin: bool,
) -> list[list[Bits]]:
    """The partial products of :func:`_excess_v` by column (weight 2^column).

    With ``sign_coin`` ``e_bits`` is the uniform offset D and |x| = 2^e M + F, F = D + s in
    [0, 2^e]: v = F (2^(e+1) M + F) (e ANDs for the increment; F_e = 1 only when F = 2^e, so
    the products F_e F_i, i < e, are 0 and left out)."""
    cols: list[list[Bits]] = [[] for _ in range(width)]

    def put(k: int, bit: Bits) -> None:
        if k < width:
            cols[k].append(bit)

    if sign_coin:
        f_bits, carry = [], s
        for i in range(len(e_bits)):  # F = D + s: a half adder per bit
            f_bits.append(b.xor(e_bits[i], carry))
            carry = b.and_(e_bits[i], carry)
        top = len(f_bits)
        put(2 * top, carry)
        for k in range(len(m_bits)):
            put(top + k + e + 1, b.and_(carry, m_bits[k]))
        for i in range(top):
            put(2 * i, f_bits[i])
            for k in range(i + 1, top):
                if i + k + 1 < width:
                    put(i + k + 1, b.and_(f_bits[i], f_bits[k]))
            for k in range(len(m_bits)):
                if i + k + e + 1 < width:
                    put(i + k + e + 1, b.and_(f_bits[i], m_bits[k]))
        return cols
    n = len(e_bits)
    for i in range(n):
        put(2 * i, e_bits[i])
        put(i + 1, b.and_(s, e_bits[i]))
        for k in range(i + 1, n):
            if i + k + 1 < width:
                put(i + k + 1, b.and_(e_bits[i], e_bits[k]))
        for k in range(len(m_bits)):
            if i + k + e + 1 < width:
                put(i + k + e + 1, b.and_(e_bits[i], m_bits[k]))
    return cols


def _count_indicators(table: AliasTable, codes: Sequence[int], max_count: int) -> list[int]:
    """For each column's code c (J = c + 1): bit j - 2 set iff J >= j, for j = 2..max_count."""
    return [sum(1 << (j - 2) for j in range(2, max_count + 1) if c + 1 >= j) for c in codes]


def _round_carry(b: CircuitBuilder, params: SamplerParams, y: Bits, field: Any) -> Bits:
    """The carry of :class:`Rounding` for y = v mod 2^k."""
    rr = params.rounding
    assert rr is not None
    carries = [b.lt_unsigned(b.not_(field(f"r_round{j}")), y) for j in range(rr.max_count)]
    carry = carries[-1]
    if rr.max_count > 1:
        table = rr.count
        monos = monomials(b, list(field("u_count")))
        thr = table_lookup(b, monos, table.threshold, rr.coin_bits)
        width = rr.max_count - 1
        prim = table_lookup(b, monos, _count_indicators(table, table.primary, rr.max_count), width)
        alt = table_lookup(b, monos, _count_indicators(table, table.alias, rr.max_count), width)
        at_least = b.mux(b.lt_unsigned(field("r_count"), thr), prim, alt)  # bit j-2: J >= j
        for j in range(rr.max_count - 1, 0, -1):  # carry_j-1 or (J >= j+1 and (...))
            carry = b.or_(carries[j - 1], b.and_(at_least[j - 1], carry))
    return carry


def _repeat(b: CircuitBuilder, bit: Bits, width: int) -> Bits:
    return b.concat(*([bit] * width))


def trial_layout(params: SamplerParams) -> dict[str, tuple[int, int]]:
    """Where each random field sits in a trial's random bit string: name -> (start, width)."""
    layout: dict[str, tuple[int, int]] = {}
    pos = 0
    fields = [
        ("u", params.alias.index_bits),
        ("r_alias", params.coin_bits),
        ("d", params.bucket_bits),
    ]
    if params.sign_coin:
        fields.append(("s", 1))
    fields += [(f"r_coin{t}", params.coin_bits) for t in range(len(params.coins))]
    rr = params.rounding
    if rr is not None:
        if rr.max_count > 1:
            fields += [("u_count", rr.count.index_bits), ("r_count", rr.coin_bits)]
        fields += [(f"r_round{j}", rr.bits) for j in range(rr.max_count)]
    for name, width in fields:
        layout[name] = (pos, width)
        pos += width
    assert pos == params.random_bits
    return layout


def build_trial_description(params: SamplerParams, *, z_reveal: str = "keep") -> Any:
    """The trial circuit's description (see :func:`build_trial_circuit`)."""
    b = CircuitBuilder(f"dgauss-trial-s{params.sigma_units:.17g}-e{params.bucket_bits}")
    words = []
    for i, w in enumerate(params.port_widths):
        g = b.input(f"g{i}", "garbler", w)
        ev = b.input(f"e{i}", "evaluator", w)
        words.append(b.xor(g, ev))  # r = r1 xor r2, free
    r = b.concat(*words)
    layout = trial_layout(params)

    def field(name: str) -> Bits:
        start, width = layout[name]
        return r[start : start + width]

    # 1. bucket (s, M) by the alias method
    alias = params.alias
    monos = monomials(b, list(field("u")))
    threshold = table_lookup(b, monos, alias.threshold, params.coin_bits)
    primary = table_lookup(b, monos, alias.primary, params.code_bits)
    other = table_lookup(b, monos, alias.alias, params.code_bits)
    take_primary = b.lt_unsigned(field("r_alias"), threshold)
    code = b.mux(take_primary, primary, other)
    s, m = (field("s"), code) if params.sign_coin else (code[0], code[1:])

    # 2. candidate in two's complement: x = (D, M xor s, s) (|x| = 2^e M + s + (D xor s));
    # with the sign coin x = (D xor s, M xor s, s) (|x| = 2^e M + s + D)
    e = params.bucket_bits
    m_signed = b.xor(m, _repeat(b, s, len(m)))
    d_signed = b.xor(field("d"), _repeat(b, s, e)) if e else None
    low = d_signed if params.sign_coin else field("d") if e else None
    z = b.concat(low, m_signed, s) if low is not None else b.concat(m_signed, s)

    # 3. accept with probability exp(-v / (2 sigma^2)), v = |x|^2 - anchor^2
    if e:
        e_bits = field("d") if params.sign_coin else d_signed
        if params.rounding is None:
            base = 0
            w = _excess_v(b, e_bits, m, s, e, params.v_bits, params.sign_coin)
        else:  # w = (v >> k) + carry: the carry joins column k of v's compression
            base = params.rounding.bits
            width = base + params.w_bits
            cols = _excess_columns(b, e_bits, m, s, e, width, params.sign_coin)
            inject = (base, lambda y: _round_carry(b, params, y, field))
            w = _weighted_sum(b, cols, width, inject)[base:]
        coins = []
        for t, table in enumerate(params.coins):
            lo = table.offset - base
            monos_t = monomials(b, list(w[lo : lo + table.size]), table.index_count)
            t_bits = table_lookup(b, monos_t, table.threshold, params.coin_bits)
            coins.append(b.le_unsigned(field(f"r_coin{t}"), t_bits))
        accept = b.and_reduce(b.concat(*coins))
    else:
        accept = b.const(1, 1)
    b.output("accept", accept, reveal="both")
    b.output("z", z, reveal=z_reveal)
    return b.description()


@functools.lru_cache(maxsize=32)
def _build_cached(params: SamplerParams, z_reveal: str) -> Any:
    return build_trial_description(params, z_reveal=z_reveal).build()


def build_trial_circuit(params: SamplerParams, *, z_reveal: str = "keep") -> Any:
    """Compiled trial circuit.

    Inputs: ports ``g0..`` (garbler) and ``e0..`` (evaluator) of widths ``params.port_widths``,
    one trial's random bits each (the circuit XORs them). Outputs: ``accept`` (1 bit, revealed
    to both) and ``z`` (``params.noise_bits``-bit two's-complement candidate, kept as labels by
    default; ``z_reveal="both"`` for tests and plaintext audits).
    """
    return _build_cached(params, z_reveal)


def and_breakdown(params: SamplerParams) -> dict[str, int]:
    """AND gates of one trial by part (each part compiled on its own)."""
    layout = trial_layout(params)
    out: dict[str, int] = {}
    b = CircuitBuilder()
    u = b.input("u", "garbler", max(1, layout["u"][1]))
    monos = monomials(b, list(u))
    out["alias_monomials"] = b.and_count
    thr = table_lookup(b, monos, params.alias.threshold, params.coin_bits)
    r0 = b.concat(
        b.input("r_lo", "evaluator", min(params.coin_bits, MAX_PORT_WIDTH)),
        *(
            [b.input("r_hi", "evaluator", params.coin_bits - MAX_PORT_WIDTH)]
            if params.coin_bits > MAX_PORT_WIDTH
            else []
        ),
    )
    before = b.and_count
    take = b.lt_unsigned(r0, thr)
    out["alias_coin"] = b.and_count - before
    before = b.and_count
    prim = table_lookup(b, monos, params.alias.primary, params.code_bits)
    other = table_lookup(b, monos, params.alias.alias, params.code_bits)
    b.mux(take, prim, other)
    out["alias_select"] = b.and_count - before
    if params.bucket_bits:
        b2 = CircuitBuilder()
        e_bits = b2.input("E", "garbler", params.bucket_bits)
        m_bits = b2.input("M", "garbler", params.magnitude_bits)
        s = b2.input("s", "garbler", 1)
        b2.output(
            "v",
            _excess_v(b2, e_bits, m_bits, s, params.bucket_bits, params.v_bits, params.sign_coin),
        )
        out["excess_v"] = b2.description().and_count
        rr = params.rounding
        if rr is not None:
            b3 = CircuitBuilder()
            names = ["u_count", "r_count"] + [f"r_round{j}" for j in range(rr.max_count)]
            ports = {}
            for name in names:
                if name in layout:  # split into 64-bit ports, as the trial circuit's words
                    width = layout[name][1]
                    parts = [
                        b3.input(f"{name}_{i}", "garbler", min(MAX_PORT_WIDTH, width - i))
                        for i in range(0, width, MAX_PORT_WIDTH)
                    ]
                    ports[name] = b3.concat(*parts)
            y = b3.input("y", "evaluator", rr.bits)
            b3.output("carry", _round_carry(b3, params, y, lambda name: ports[name]))
            out["rounding_carry"] = b3.description().and_count
        out["chunk_coins"] = sum(
            params.coin_bits + _mono_cost(c.size, c.index_count) for c in params.coins
        )
        out["accept_and"] = len(params.coins) - 1
    return out


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m garbled_core.discrete_gaussian [SIGMA ...]``: derived parameters as a table."""
    import sys

    sigmas = [float(a) for a in (sys.argv[1:] if argv is None else argv)] or [
        2.0,
        100.0,
        4800.0,
        1e4,
        65536.0,
        1e6,
        1e7,
        1e8,
    ]
    print(
        "| sigma_u | e | l | a | M count | v bits | k, J | chunks | P_acc | AND/trial "
        "| AND/sample | rand bits/trial (each party) | noise bits | SD bound |"
    )
    print("|" + "---|" * 14)
    parts = []
    for sigma in sigmas:
        p = derive_params(sigma)
        d = p.summary()
        print(
            f"| {sigma:g} | {p.bucket_bits} | {p.coin_bits} | {p.alias.index_bits} | "
            f"{p.grid_count} | {p.v_bits} | {d['round_bits']}, {d['round_count']} | "
            f"{'+'.join(map(str, d['chunks'])) or '-'} | {p.acceptance:.4f} | "
            f"{d['and_gates_per_trial']} | {d['and_gates_per_sample']:.1f} | {p.random_bits} | "
            f"{p.noise_bits} | 2^{p.distance_log2:.2f} |"
        )
        parts.append((sigma, and_breakdown(p)))
    print()
    for sigma, part in parts:
        print(f"sigma_u={sigma:g}: AND gates per trial by part: {part}")
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())

"""Parameters of the discrete Gaussian sampler: exact decimal arithmetic, the alias and coin
tables, the randomized rounding, the error bound and the search of :func:`derive_params`.

The method is described in :mod:`garbled_core.discrete_gaussian` (which re-exports every public
name here) and docs/NOISE_SAMPLER.md; the trial circuit is in :mod:`garbled_core.sampler_circuit`.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Sequence
from decimal import ROUND_FLOOR, ROUND_HALF_EVEN, Context, Decimal, localcontext

from garbled_core.sampler_circuit import _mono_cost, and_gates_per_trial
from garbled_core.sampler_tables import (
    DEFAULT_SCHEDULE,
    DIGITS,
    MAX_ROUNDS,
    AliasTable,
    CoinTable,
    Rounding,
    SamplerParams,
    _ctx,
    expected_trials,
    schedule_at,
)

__all__ = [
    "DEFAULT_DISTANCE_LOG2",
    "DEFAULT_SCHEDULE",
    "MAX_NOISE_BITS",
    "MAX_ROUNDS",
    "MAX_SIGMA_UNITS",
    "MIN_SIGMA_UNITS",
    "AliasTable",
    "CoinTable",
    "Rounding",
    "SamplerParams",
    "derive_params",
    "exact_pmf",
    "expected_trials",
    "schedule_at",
    "theta",
]

DEFAULT_DISTANCE_LOG2 = -64.0
"""Default bound on the statistical distance of one sample from N_Z(0, sigma^2), as log2."""

MIN_SIGMA_UNITS = 0.5
MAX_SIGMA_UNITS = float(2**40)
MAX_NOISE_BITS = 62
"""Widest noise the sampler emits (two's complement); wider would not fit one 64-bit port."""

_TAIL_MARGIN_LOG2 = 12  # the cut-off tail of the bucket distribution gets target - 12
_MAX_ALIAS_BITS = 12  # largest alias table accepted with an explicit bucket_bits
_SEARCH_ALIAS_BITS = 10  # largest alias table the automatic search tries
_MAX_CHUNK = 7
# One search at a time: a server warms the cache in the background at start-up (seconds of
# work); a round that asks meanwhile waits for that result instead of searching again.
_DERIVE_LOCK = threading.Lock()
_MAX_TOP_CHUNK = 9
_MAX_ROUND_COUNT = 8
_ROUND_MARGIN_LOG2 = 3  # the randomized rounding gets at most target - 3


# ---------------------------------------------------------------------------- exact arithmetic


@functools.lru_cache(maxsize=1)
def _pi() -> Decimal:
    """pi to DIGITS digits by Machin's formula (16 atan 1/5 - 4 atan 1/239)."""
    with localcontext(Context(prec=DIGITS + 10)):
        eps = Decimal(10) ** -(DIGITS + 8)

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


@functools.lru_cache(maxsize=4096)  # the search asks for the same few hundred x many times
def _rho(x: int, two_sigma2: Decimal) -> Decimal:
    """exp(-x^2 / (2 sigma^2)) to DIGITS digits."""
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
                if term < Decimal(10) ** -(DIGITS + 5):
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


# ---------------------------------------------------------------------------- tables


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


# One sigma's search asks for the same few (bits, budget) roundings hundreds of times (568
# calls, 22 distinct, for sigma 472.6): remembered, derive_params takes a third of the time.
@functools.lru_cache(maxsize=1024)
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
        cost = and_gates_per_trial(params) * params.expected_trials()
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
    with _DERIVE_LOCK:
        params = _derive(sigma, target, bucket_bits)
    if params.noise_bits > MAX_NOISE_BITS:  # pragma: no cover - excluded by MAX_SIGMA_UNITS
        raise ValueError(
            f"sigma_units={sigma:g} needs {params.noise_bits}-bit noise, above the limit of "
            f"{MAX_NOISE_BITS} bits"
        )
    return params

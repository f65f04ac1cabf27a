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

import sys
from collections.abc import Sequence
from typing import Any

from garbled_core.sampler_circuit import (
    MAX_TRIAL_DEPTH,
    MIN_TRIAL_DEPTH,
    SPECULATE_LAYER_COST,
    TRIAL_LAYER_COSTS,
    UNBOUNDED_TRIAL_DEPTH,
    and_breakdown,
    and_gates_per_trial,
    build_trial_circuit,
    build_trial_description,
    monomials,
    sampler_summary,
    table_lookup,
    trial_layout,
)
from garbled_core.sampler_circuit import (
    _excess_columns as _excess_columns,
)
from garbled_core.sampler_circuit import (
    _excess_v as _excess_v,
)
from garbled_core.sampler_circuit import (
    _mono_cost as _mono_cost,
)
from garbled_core.sampler_circuit import (
    _round_carry as _round_carry,
)
from garbled_core.sampler_circuit import (
    _weighted_sum as _weighted_sum,
)
from garbled_core.sampler_params import (
    DEFAULT_DISTANCE_LOG2,
    DEFAULT_SCHEDULE,
    MAX_NOISE_BITS,
    MAX_ROUNDS,
    MAX_SIGMA_UNITS,
    MIN_SIGMA_UNITS,
    AliasTable,
    CoinTable,
    Rounding,
    SamplerParams,
    derive_params,
    exact_pmf,
    expected_trials,
    schedule_at,
    theta,
)
from garbled_core.sampler_params import (
    _alias as _alias,
)
from garbled_core.sampler_params import (
    _params_for as _params_for,
)
from garbled_core.sampler_tables import (
    _ctx as _ctx,
)
from garbled_core.sampler_tables import (
    _log2 as _log2,
)

__all__ = [
    "DEFAULT_DISTANCE_LOG2",
    "DEFAULT_SCHEDULE",
    "MAX_NOISE_BITS",
    "MAX_ROUNDS",
    "MAX_SIGMA_UNITS",
    "MAX_TRIAL_DEPTH",
    "MIN_SIGMA_UNITS",
    "MIN_TRIAL_DEPTH",
    "SPECULATE_LAYER_COST",
    "TRIAL_LAYER_COSTS",
    "UNBOUNDED_TRIAL_DEPTH",
    "AliasTable",
    "CoinTable",
    "Rounding",
    "SamplerParams",
    "and_breakdown",
    "and_gates_per_trial",
    "build_trial_circuit",
    "build_trial_description",
    "depth_rows",
    "derive_params",
    "exact_pmf",
    "expected_trials",
    "monomials",
    "sampler_summary",
    "schedule_at",
    "table_lookup",
    "theta",
    "trial_layout",
]


def depth_rows(sigmas: Sequence[float]) -> list[dict[str, Any]]:
    """Per sigma (units): the trial circuit's AND count and AND-depth with ripple arithmetic
    (the garbled circuit) and with ``arithmetic="depth"`` (for an interactive backend)."""
    rows = []
    for sigma in sigmas:
        p = derive_params(sigma)
        ripple = build_trial_description(p)
        depth = build_trial_description(p, arithmetic="depth")
        rows.append(
            {
                "sigma_units": float(sigma),
                "bucket_bits": p.bucket_bits,
                "noise_bits": p.noise_bits,
                "ripple_and": ripple.and_count,
                "ripple_depth": ripple.and_depth(),
                "depth_and": depth.and_count,
                "depth_depth": depth.and_depth(),
                "and_ratio": depth.and_count / ripple.and_count,
            }
        )
    return rows


def _depth_main(args: Sequence[str]) -> int:
    sigmas = [float(a) for a in args] or [16.0, 484.3335, 7749.336, 387466.8, 2.0**24]
    print(
        f"| sigma_u | e | noise bits | ripple AND | ripple depth | depth AND | depth depth "
        f"(target {MAX_TRIAL_DEPTH}) | AND ratio |"
    )
    print("|" + "---|" * 8)
    for r in depth_rows(sigmas):
        print(
            f"| {r['sigma_units']:g} | {r['bucket_bits']} | {r['noise_bits']} | "
            f"{r['ripple_and']} | {r['ripple_depth']} | {r['depth_and']} | {r['depth_depth']} | "
            f"{r['and_ratio']:.3f} |",
            flush=True,
        )
    return 0


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m garbled_core.discrete_gaussian [SIGMA ...]``: derived parameters as a table;
    ``... --depth [SIGMA ...]``: the trial circuit's AND count and depth, ripple against depth."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--depth"]:
        return _depth_main(args[1:])
    sigmas = [float(a) for a in args] or [
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
        d = sampler_summary(p)
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

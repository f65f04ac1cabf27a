"""`spgc bench proof`: a provider's norm proof (spgc.protocol.norm_proof) at one size.

Makes and checks real proofs of a random vector on the bound and prints: the field, the proof's
and the verifier message's lengths, the soundness error, the provider's seconds to share and
prove, each server's seconds to compute its verifier message, the bytes between the servers
per provider, and a provider's upload with verification against the same vector's two ring
shares without it (SHARE_ENCODING_PACKED: ceil(L/8) bytes per value to each server). The
adaptive forger (spgc.app.cheating_provers, kind ``solve``: 1,000 times the bound, appended
values solved for the weights it can know) must be refused: the run says so (exit 1
otherwise).

Defaults: d = 1,000,000 coordinates, each provider's vector within 64 examples of norm 65,539
units (scale 2^16, C = 1: spgc.protocol.encoding's B), and the ring of 100 such providers.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from spgc.app.cheating_provers import cheat
from spgc.protocol.norm_proof import (
    DEFAULT_REPETITIONS,
    GRINDING_BITS,
    NormProofParams,
    decide,
    helper_query,
    leader_query,
    proof_context,
    prove,
    share_dots,
)
from spgc.protocol.sharing import ring_bits_for

DEFAULT_DIM = 1_000_000
DEFAULT_BOUND = 64 * 65_539
DEFAULT_PROVIDERS = 100


def _median_seconds(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, last = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        last = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), last


def _vector(dim: int, norm: float, seed: int) -> np.ndarray:
    g = np.random.default_rng(seed).normal(size=dim)
    return np.trunc(g / np.linalg.norm(g) * norm).astype(np.int64)


def measure(dim: int, bound: int, ring_bits: int, repetitions: int, repeat: int) -> dict[str, Any]:
    """One size: the figures :func:`run` prints."""
    params = NormProofParams.for_plan(dim, bound, ring_bits, repetitions)
    x = _vector(dim, bound * 0.999, 1)
    context = proof_context("bench", 0, "p1")
    prove_s, (leader, helper) = _median_seconds(lambda: prove(x, params, context), repeat)
    coin = os.urandom(32)
    leader_s, a = _median_seconds(lambda: leader_query(params, leader, context, coin), repeat)
    helper_s, b = _median_seconds(lambda: helper_query(params, helper, context, coin), repeat)
    # As the servers run it: the wraparound dots as the share arrives, the rest at the
    # agreement, once the coin is drawn (servers.norm_checks.PreparedDots).
    arrival, late = {}, {}
    for name, share, query in (("H1", leader, leader_query), ("H2", helper, helper_query)):
        arrival[name], (joint_x, dots) = _median_seconds(
            lambda share=share: share_dots(params, share, context), repeat
        )
        late[name], message = _median_seconds(
            lambda share=share, query=query, j=joint_x, v=dots: query(
                params, share, context, coin, lambda key, j=j, v=v: v if key == j else None
            ),
            repeat,
        )
        ref = a if name == "H1" else b
        if (message.values.tobytes(), message.joint_seed) != (ref.values.tobytes(), ref.joint_seed):
            raise AssertionError("dots prepared on arrival changed a verifier message")
    honest = decide(params, a, b)
    bad_leader, bad_helper = cheat("solve", x, params, context)
    poison = decide(
        params,
        leader_query(params, bad_leader, context, coin),
        helper_query(params, bad_helper, context, coin),
    )
    ring_bytes = 2 * dim * ((ring_bits + 7) // 8)
    # The leader's share in full with its 32-byte blind and H2's 32-byte part; the helper's
    # as a 32-byte seed with H1's two 32-byte parts.
    verified = (params.n_inputs + params.proof_len) * params.element_bytes + 5 * 32
    # each way, per provider: the values, J2 and the three joint randomness parts
    between = params.verifier_len * 8 + 32 + 3 * 32
    return {
        "dim": dim,
        "bound_units": bound,
        "ring_bits": ring_bits,
        "repetitions": repetitions,
        "field_bits": params.p.bit_length(),
        "field_modulus": params.p,
        "element_bytes": params.element_bytes,
        "appended_bits": params.n_bits,
        "proof_elements": params.proof_len,
        "verifier_elements": params.verifier_len,
        "quadratic_combinations": params.combinations,
        "grinding_bits": GRINDING_BITS,
        "soundness_error": params.soundness_error,
        "soundness_log2": float(np.log2(params.soundness_error)),
        "soundness_terms_log2": {
            name: float(np.log2(v)) for name, v in params.soundness_terms.items()
        },
        "prove_seconds": prove_s,
        "leader_query_seconds": leader_s,
        "helper_query_seconds": helper_s,
        "query_seconds_at_arrival": arrival,
        "query_seconds_at_agreement": late,
        "honest_accepted": honest is None,
        "honest_refusal": honest,
        "poison_refused": poison is not None,
        "poison_refusal": poison,
        "upload_bytes_unverified": ring_bytes,
        "upload_bytes_verified": verified,
        "upload_ratio": verified / ring_bytes,
        "server_bytes_each_way_per_provider": between,
    }


def format_report(r: dict[str, Any]) -> str:
    return "\n".join(
        [
            f"norm proof, d = {r['dim']:,}, B = {r['bound_units']:,} units, L = {r['ring_bits']}, "
            f"{r['repetitions']} wraparound checks",
            f"  field: {r['field_bits']}-bit p = {r['field_modulus']} "
            f"({r['element_bytes']} bytes a value)",
            f"  appended bits {r['appended_bits']:,}, proof {r['proof_elements']:,} values, "
            f"verifier message {r['verifier_elements']:,} values",
            f"  soundness error per proof {r['soundness_error']:.3g} "
            f"(2^{r['soundness_log2']:.1f}) against a prover trying 2^{r['grinding_bits']} "
            f"hashes; {r['quadratic_combinations']} quadratic combinations",
            f"  provider: share and prove {r['prove_seconds']:.3f} s; servers: verifier "
            f"message {r['leader_query_seconds']:.3f} s (H1), {r['helper_query_seconds']:.3f} s "
            "(H2)",
            "  of which at the agreement, the wraparound dots made as the share arrived: "
            + ", ".join(
                f"{r['query_seconds_at_agreement'][k]:.3f} s ({k}; "
                f"{r['query_seconds_at_arrival'][k]:.3f} s at arrival)"
                for k in ("H1", "H2")
            ),
            f"  upload {r['upload_bytes_verified']:,} B verified against "
            f"{r['upload_bytes_unverified']:,} B of ring shares: x{r['upload_ratio']:.4f}",
            f"  between the servers: {r['server_bytes_each_way_per_provider']:,} B each way "
            "per provider",
            f"  honest vector accepted: {r['honest_accepted']}; the adaptive forger (1,000x the "
            f"bound) refused: {r['poison_refused']} ({r['poison_refusal']})",
        ]
    )


def run(
    dim: int = DEFAULT_DIM,
    bound: int = DEFAULT_BOUND,
    ring_bits: int | None = None,
    repetitions: int = DEFAULT_REPETITIONS,
    repeat: int = 3,
    as_json: bool = False,
) -> int:
    """Run the benchmark; the report goes to stdout (stderr with ``as_json``, the JSON object
    to stdout). Returns 0, or 1 if an honest proof was refused or the poisoned one accepted."""
    if ring_bits is None:
        ring_bits = ring_bits_for(DEFAULT_PROVIDERS * bound)
    try:
        report = measure(dim, bound, ring_bits, repetitions, repeat)
    except ValueError as exc:
        print(f"spgc bench proof: {exc}", file=sys.stderr)
        return 2
    print(format_report(report), file=sys.stderr if as_json else sys.stdout)
    if as_json:
        print(json.dumps(report, indent=2))
    return 0 if report["honest_accepted"] and report["poison_refused"] else 1


def _positive(text: str) -> int:
    try:
        value = int(text.replace(",", "").replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Options of `spgc bench proof` (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(prog="spgc bench proof", description=__doc__)
    p.add_argument("--dim", type=_positive, default=DEFAULT_DIM, help="coordinates d")
    p.add_argument(
        "--bound",
        type=_positive,
        default=DEFAULT_BOUND,
        help=f"the L2 bound B in units (default {DEFAULT_BOUND:,}: 64 examples at scale 2^16)",
    )
    p.add_argument(
        "--ring-bits",
        type=_positive,
        default=None,
        help=f"L (default: the ring of {DEFAULT_PROVIDERS} providers at the bound)",
    )
    p.add_argument(
        "--repetitions",
        type=_positive,
        default=DEFAULT_REPETITIONS,
        help="wraparound checks (each halves a cheat's chances)",
    )
    p.add_argument("--repeat", type=_positive, default=3, help="runs per timing (the median)")
    p.add_argument(
        "--json", action="store_true", help="print a JSON object on stdout (the report: stderr)"
    )
    return p


def run_from_args(args: argparse.Namespace) -> int:
    """Runs with the options :func:`build_parser` parsed (`spgc bench proof` and ``main``)."""
    return run(
        args.dim, args.bound, args.ring_bits, args.repetitions, args.repeat, as_json=args.json
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m spgc.app.bench_proof [options]``."""
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""Per-coordinate SPGC circuits: reconstruct the sum and add the noise, or reconstruct only.

Inputs per coordinate: A1 (garbler, H1) and A2 (evaluator, H2), the two servers' sums of shares in
Z_{2^L}. S = (A1 - A2) mod 2^L read as a signed L-bit value (the paper's smod). With verified
inputs (spgc.protocol.norm_proof) the sums are field shares, S = A + B mod p, and the circuits built
with ``field=True`` reconstruct it from L low bits and one flag bit per server
(:func:`field_circuit_inputs`) for three or four AND gates per coordinate more than the
ring's. The noise z comes
from the sampler's accepted trial as a carried (kept) input, so nobody sees it; Y = S + z is
computed in max(L, noise width) + 1 bits, which cannot wrap, and revealed to both servers.
The preprocessed mode's share circuit turns the same kept noise into additive shares instead.

Also here: the paper's table sampler (a lambda-bit index, r1 xor r2, into a public table of
2^lambda rounded normal quantiles), as a labelled baseline for communication benchmarks only.
It is NOT differentially private once the noise range exceeds 2^lambda points (SPEC.md section 4).
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable
from statistics import NormalDist
from typing import Any

import numpy as np

from garbled_core.circuit import MAX_PORT_WIDTH, Bits, CircuitBuilder, CircuitDescription
from garbled_core.depth_search import describe_within_depth
from garbled_core.discrete_gaussian import MAX_TRIAL_DEPTH, monomials, table_lookup
from garbled_core.sampler_circuit import describe_trial_with
from garbled_core.sampler_tables import SamplerParams

__all__ = [
    "MAX_RING_BITS",
    "MAX_ROUND_DEPTH",
    "MIN_RING_BITS",
    "NOISY_SUM_MAX_DEPTH",
    "TABLE_SAMPLER_LABEL",
    "check_ring_bits",
    "decode_signed",
    "depth_rows",
    "field_circuit_inputs",
    "fused_trial_circuit",
    "fused_trial_description",
    "noise_share_circuit",
    "noisy_sum_circuit",
    "noisy_sum_description",
    "output_ports",
    "output_width",
    "reconstruct_circuit",
    "reconstruct_description",
    "table_noisy_sum_circuit",
    "table_sampler_circuit",
    "table_sampler_values",
]

MIN_RING_BITS = 2
MAX_RING_BITS = 64
TABLE_SAMPLER_LABEL = "table sampler (paper baseline, NOT differentially private)"
MAX_ROUND_DEPTH = 48
"""AND-depth the reconstruction and noise-share circuits keep within with ``arithmetic="depth"``
(issue 34: GMW pays a round trip per AND layer). The sampler's trial has its own bound,
:data:`garbled_core.sampler_circuit.MAX_TRIAL_DEPTH`, which the fused trial run of mode spgc
keeps too."""
#: The noisy sum's AND-depth bound with ``arithmetic="depth"``: as shallow as the gadgets go
#: (no layer cost fits 1, so the largest is taken), 11 to 18 layers instead of about L, for 30
#: to 150 more AND gates per coordinate (a trial has 500 to 1,800): with the sampler's spare
#: trials a gmw round is one trial circuit and one noisy sum, so these layers are a fifth of it.
NOISY_SUM_MAX_DEPTH = 1


def check_ring_bits(ring_bits: int) -> int:
    """Validate L (the share ring Z_{2^L}); ValueError naming the limit otherwise."""
    if not isinstance(ring_bits, (int, np.integer)) or isinstance(ring_bits, bool):
        raise TypeError(f"ring_bits must be an int, got {type(ring_bits).__name__}")
    if not MIN_RING_BITS <= int(ring_bits) <= MAX_RING_BITS:
        raise ValueError(
            f"ring_bits={ring_bits} is outside the supported ring sizes "
            f"{MIN_RING_BITS}..{MAX_RING_BITS} (shares are numpy uint64)"
        )
    return int(ring_bits)


def output_width(ring_bits: int, noise_bits: int, output_bits: int | None = None) -> int:
    """Width of Y = S + z that cannot wrap: max(L, noise_bits) + 1, or ``output_bits`` if it is
    at least that (ValueError naming the limit otherwise)."""
    ring_bits = check_ring_bits(ring_bits)
    need = max(ring_bits, noise_bits) + 1
    if output_bits is None:
        return need
    if output_bits < need:
        raise ValueError(
            f"output_bits={output_bits} cannot hold S + z without wrapping: S needs "
            f"{ring_bits} bits (ring_bits) and the noise {noise_bits} bits, so Y needs at least "
            f"{need} bits"
        )
    if output_bits > 2 * MAX_PORT_WIDTH:
        raise ValueError(f"output_bits={output_bits} is above the limit of {2 * MAX_PORT_WIDTH}")
    return int(output_bits)


def output_ports(width: int) -> list[tuple[str, int]]:
    """Names and widths of the output ports carrying a ``width``-bit Y (64 bits per port)."""
    if width <= MAX_PORT_WIDTH:
        return [("y", width)]
    return [("y_lo", MAX_PORT_WIDTH), ("y_hi", width - MAX_PORT_WIDTH)]


def decode_signed(outputs: dict[str, np.ndarray], width: int) -> np.ndarray:
    """Y from the revealed port(s): int64 when ``width`` <= 64, else an object array of ints."""
    if width <= MAX_PORT_WIDTH:
        raw = np.asarray(outputs["y"], dtype=np.uint64)
        if width == MAX_PORT_WIDTH:
            return raw.view(np.int64).copy()
        vals = raw.astype(np.int64)
        return np.where(vals >= (1 << (width - 1)), vals - (1 << width), vals)
    lo = np.asarray(outputs["y_lo"], dtype=np.uint64)
    hi = np.asarray(outputs["y_hi"], dtype=np.uint64)
    out = np.empty(len(lo), dtype=object)
    half, full = 1 << (width - 1), 1 << width
    for i, (a, b) in enumerate(zip(lo.tolist(), hi.tolist(), strict=True)):
        v = a | (b << MAX_PORT_WIDTH)
        out[i] = v - full if v >= half else v
    return out


def _signed_difference(b: CircuitBuilder, ring_bits: int) -> Bits:
    a1 = b.input("a1", owner="garbler", width=ring_bits)
    a2 = b.input("a2", owner="evaluator", width=ring_bits)
    return b.sub(a1, a2)  # L-1 ANDs; the bits of (A1 - A2) mod 2^L, read as signed


def _reveal_wide(b: CircuitBuilder, y: Bits) -> None:
    width = len(y)
    for (name, w), start in zip(output_ports(width), (0, MAX_PORT_WIDTH), strict=False):
        b.output(name, y[start : start + w], reveal="both")


def _describe(
    name: str,
    arithmetic: str,
    make: Callable[[CircuitBuilder], None],
    max_depth: int = MAX_ROUND_DEPTH,
) -> CircuitDescription:
    """The description ``make`` builds. ``"ripple"``: the garbled circuits, names and digests as
    ever. ``"depth"`` (for an interactive backend, named with a ``-depth`` tail): about the
    fewest AND gates within ``max_depth`` layers (ripple wherever that is shallow enough; see
    :func:`garbled_core.depth_search.describe_within_depth`). A round runs the trial circuits, then
    the noisy sum: a smaller ``max_depth`` here saves round trips for a few more AND gates."""
    if arithmetic == "ripple":
        b = CircuitBuilder(name)
        make(b)
        return b.description()
    if arithmetic != "depth":
        raise ValueError(f"arithmetic must be 'ripple' or 'depth', got {arithmetic!r}")
    return describe_within_depth(f"{name}-depth", make, max_depth)


@functools.lru_cache(maxsize=64)
def reconstruct_description(
    ring_bits: int,
    *,
    arithmetic: str = "ripple",
    max_depth: int = MAX_ROUND_DEPTH,
    field: bool = False,
) -> CircuitDescription:
    """Description of :func:`reconstruct_circuit`."""
    ring_bits = check_ring_bits(ring_bits)

    def make(b: CircuitBuilder) -> None:
        if field:
            v, not_k = _field_sum(b, ring_bits)
            s, _ = b.add_with_carry(v, 0, carry_in=not_k)  # an increment by NOT k
        else:
            s = _signed_difference(b, ring_bits)
        b.output("s", s, reveal="both")

    name = f"spgc-only-mpc{'-field' if field else ''}-L{ring_bits}"
    return _describe(name, arithmetic, make, max_depth)


@functools.lru_cache(maxsize=64)
def reconstruct_circuit(
    ring_bits: int,
    *,
    arithmetic: str = "ripple",
    max_depth: int = MAX_ROUND_DEPTH,
    field: bool = False,
) -> Any:
    """Only-MPC (the paper's baseline): reveals S = smod(A1 - A2, 2^L) as port ``s``.
    ``arithmetic="depth"``: at most ``max_depth`` AND layers (see :func:`_describe`).
    ``field``: from field shares (:func:`field_circuit_inputs`; 2L + 1 AND gates)."""
    return reconstruct_description(
        ring_bits, arithmetic=arithmetic, max_depth=max_depth, field=field
    ).build()


@functools.lru_cache(maxsize=64)
def noisy_sum_description(
    ring_bits: int,
    noise_bits: int,
    output_bits: int | None = None,
    *,
    arithmetic: str = "ripple",
    max_depth: int = NOISY_SUM_MAX_DEPTH,
    field: bool = False,
) -> CircuitDescription:
    """Description of :func:`noisy_sum_circuit`."""
    width = output_width(ring_bits, noise_bits, output_bits)

    def make(b: CircuitBuilder) -> None:
        if field:
            v, not_k = _field_sum(b, ring_bits)
        else:
            v, not_k = _signed_difference(b, ring_bits), 0
        z = b.input("z", owner="carried", width=noise_bits)
        # width-1 ANDs, no wrap; with field shares S + z = v + z + NOT k over the integers
        # (v + NOT k stays in the signed range: see field_circuit_inputs), a carry-in.
        if field:
            y, _ = b.add_with_carry(
                b.sign_extend(v, width), b.sign_extend(z, width), carry_in=not_k
            )
        else:
            y = b.add(b.sign_extend(v, width), b.sign_extend(z, width))
        _reveal_wide(b, y)

    name = f"spgc-noisy-sum{'-field' if field else ''}-L{ring_bits}-z{noise_bits}-y{width}"
    return _describe(name, arithmetic, make, max_depth)


@functools.lru_cache(maxsize=64)
def noisy_sum_circuit(
    ring_bits: int,
    noise_bits: int,
    output_bits: int | None = None,
    *,
    arithmetic: str = "ripple",
    max_depth: int = NOISY_SUM_MAX_DEPTH,
    field: bool = False,
) -> Any:
    """SPGC: Y = smod(A1 - A2, 2^L) + z, z carried (port ``z``, ``noise_bits`` two's complement),
    revealed in :func:`output_width` bits (ports from :func:`output_ports`).
    ``arithmetic="depth"``: at most ``max_depth`` AND layers where the gadgets allow, else as
    few as they make (see :func:`_describe`; the default: the fewest). ``field``: S from the
    servers' field shares (:func:`field_circuit_inputs`: ports a1, k1 of H1, a2, k2 of H2),
    for three AND gates more (ripple)."""
    desc = noisy_sum_description(
        ring_bits, noise_bits, output_bits, arithmetic=arithmetic, max_depth=max_depth,
        field=field,
    )  # fmt: skip
    return desc.build()


# ------------------------------------------------------------------ field shares (verified inputs)
#
# The servers hold A and B in F_p with A + B = S mod p, p = 1 mod 2^L and p > 2^L (the field of
# spgc.protocol.norm_proof), |S| <= 2^(L-1) - 1. H1 first adds 2^(L-1) - 1 to A (mod p): then A + B
# =
# u + k p over the integers with u = S + 2^(L-1) - 1 in [0, 2^L) and k in {0, 1}, and
# k = 1 exactly when A + B >= 2^L (u < 2^L <= p), which is: A >= 2^L, or B >= 2^L, or the low
# L bits of A and B carry out. Each server knows its own "A >= 2^L" (the flag bit), so the
# circuit needs only the low bits' sum with its carry (L ANDs) and two ORs. Since p = 1 mod
# 2^L, u = A_lo + B_lo - k (mod 2^L), and S = u - 2^(L-1) + 1 is (A_lo + B_lo with its top bit
# flipped) + (1 - k): a carry-in of NOT k to the adder that follows, free of AND gates. Against
# the ring's circuits: L ANDs instead of L - 1, two ORs, and the adder's carry-out: three or
# four more per coordinate.


def field_circuit_inputs(
    total: np.ndarray, modulus: int, ring_bits: int, leader: bool
) -> tuple[np.ndarray, np.ndarray]:
    """(low L bits, flag) of one server's field sum for the circuits' ``field=True`` builds: H1
    (``leader``) adds 2^(L-1) - 1 mod p first. ValueError if p is not 1 mod 2^L or the sum
    holds a value outside the field."""
    ring_bits = check_ring_bits(ring_bits)
    if modulus <= 1 << ring_bits or (modulus - 1) % (1 << ring_bits) or modulus >= 1 << 62:
        raise ValueError(f"modulus {modulus} must be 1 mod 2^{ring_bits}, above it and < 2^62")
    t = np.asarray(total, dtype=np.uint64)
    if t.size and int(t.max()) >= modulus:
        raise ValueError("a field sum holds a value outside the field")
    if leader:
        t = t + np.uint64((1 << (ring_bits - 1)) - 1)  # < 2^63: no wrap in uint64
        t = np.where(t >= np.uint64(modulus), t - np.uint64(modulus), t)
    low = t & np.uint64((1 << ring_bits) - 1)
    flag = (t >> np.uint64(ring_bits) != 0).astype(np.uint64)
    return low, flag


def _field_sum(b: CircuitBuilder, ring_bits: int) -> tuple[Bits, Bits]:
    """(v, NOT k): S = v + (NOT k) mod 2^L as a signed L-bit value, v + (NOT k) never wrapping
    the signed range (see above)."""
    a1 = b.input("a1", owner="garbler", width=ring_bits)
    k1 = b.input("k1", owner="garbler", width=1)
    a2 = b.input("a2", owner="evaluator", width=ring_bits)
    k2 = b.input("k2", owner="evaluator", width=1)
    low, carry = b.add_with_carry(a1, a2)  # L ANDs
    k = b.or_(b.or_(k1, k2), carry)  # 2 ANDs
    v = b.xor(low, 1 << (ring_bits - 1))  # free: the top bit flipped
    return v, b.not_(k)


@functools.lru_cache(maxsize=32)
def fused_trial_description(
    params: SamplerParams,
    ring_bits: int,
    width: int,
    *,
    field: bool = False,
    max_depth: int = MAX_TRIAL_DEPTH,
    bound: bool = False,
) -> CircuitDescription:
    """A gmw round of mode spgc beside the sampler's trial (issue 47: the reconstruction and the
    noisy sum fused into the trial run). Per instance, besides the trial's ``accept`` (both) and
    kept ``z``, the evaluator learns u_s = S + rs and u_z = z + rz mod 2^width (S = smod(A1 - A2,
    2^L) from ports a1 / a2, or from field shares with k1 / k2 as in :func:`noisy_sum_circuit`;
    rs and rz the garbler's fresh masks, ports ``rs`` and ``rz``). Both adders run beside the
    acceptance test (z is ready after 12 or 13 of its 28 to 32 layers), so they add no layer:
    Y = (u_s + u_z) - (rs + rz) of a coordinate and its accepted trial is then opened in one
    exchange (servers.gc_party). Depth-aware arithmetic (gmw's) only; ``width`` at most 64.
    ``max_depth``: the AND layers to keep within (see
    :func:`garbled_core.sampler_circuit.describe_trial_with`: fewer layers, more bytes).
    ``bound``: the trial's random ports are carried, the servers' proved seed streams
    (security: malicious, spgc.privacy.seed_proof)."""
    ring_bits = check_ring_bits(ring_bits)
    if not 2 <= width <= MAX_PORT_WIDTH:
        raise ValueError(f"width must be in 2..{MAX_PORT_WIDTH}, got {width}")

    def extra(b: CircuitBuilder, z: Bits) -> None:
        if field:
            v, not_k = _field_sum(b, ring_bits)
            rs = b.input("rs", owner="garbler", width=width)
            u_s, _ = b.add_with_carry(b.sign_extend(v, width), rs, carry_in=not_k)
        else:
            v = _signed_difference(b, ring_bits)
            rs = b.input("rs", owner="garbler", width=width)
            u_s = b.add(b.sign_extend(v, width), rs)
        rz = b.input("rz", owner="garbler", width=width)
        b.output("u_s", u_s, reveal="evaluator")
        b.output("u_z", b.add(b.sign_extend(z, width), rz), reveal="evaluator")

    name = (
        f"dgauss-trial-s{params.sigma_units:.17g}-e{params.bucket_bits}-spgc"
        f"{'-field' if field else ''}-L{ring_bits}-y{width}-depth"
        f"{'' if max_depth == MAX_TRIAL_DEPTH else f'{max_depth}'}{'-bound' if bound else ''}"
    )
    return describe_trial_with(params, name, extra, max_depth, bound=bound)


@functools.lru_cache(maxsize=32)
def fused_trial_circuit(
    params: SamplerParams,
    ring_bits: int,
    width: int,
    *,
    field: bool = False,
    max_depth: int = MAX_TRIAL_DEPTH,
    bound: bool = False,
) -> Any:
    """Compiled :func:`fused_trial_description`."""
    return fused_trial_description(
        params, ring_bits, width, field=field, max_depth=max_depth, bound=bound
    ).build()


# ------------------------------------------------------------------ the paper's table sampler


@functools.lru_cache(maxsize=32)
def noise_share_circuit(
    ring_bits: int,
    noise_bits: int,
    *,
    arithmetic: str = "ripple",
    max_depth: int = MAX_ROUND_DEPTH,
    field_modulus: int | None = None,
) -> Any:
    """u = (z + r) mod 2^L, revealed to the evaluator only: z carried (port ``z``, the sampler's
    kept noise, ``noise_bits`` two's complement), r the garbler's mask (port ``r``, L bits).
    L - 1 AND gates. ``field_modulus`` p (verified inputs, whose sums are shares mod p): u =
    (z + r) mod p with r uniform in [0, p) (port ``r``, bit_length(p) bits), about 3
    bit_length(p) AND gates: w = r + z, then w + p if w < 0, w - p if w >= p."""
    ring_bits = check_ring_bits(ring_bits)
    if not 2 <= noise_bits <= ring_bits:
        raise ValueError(
            f"the sampler's noise needs {noise_bits} bits, more than the ring's L={ring_bits}: "
            f"S + z would not fit; the plan must size the ring for the noise"
        )

    def make(b: CircuitBuilder) -> None:
        z = b.input("z", owner="carried", width=noise_bits)
        if field_modulus is None:
            r = b.input("r", owner="garbler", width=ring_bits)
            b.output("u", b.add(b.sign_extend(z, ring_bits), r), reveal="evaluator")
            return
        m = field_modulus.bit_length()
        r = b.input("r", owner="garbler", width=m)
        wide = m + 2  # w in (-2^(noise_bits-1), p + 2^(noise_bits-1)): signed, m + 2 bits
        w = b.add(b.sign_extend(z, wide), b.concat(r, b.const(0, 2)))
        below = w[wide - 1]  # w < 0
        above = b.not_(b.sub(w, field_modulus)[wide - 1])  # w - p >= 0
        # w < 0 and w >= p exclude each other: the correction is +p, -p or 0, bit by bit an
        # AND of one of the two flags with a constant (free).
        fix = b.xor(
            b.and_(b.concat(*[below] * wide), field_modulus % (1 << wide)),
            b.and_(b.concat(*[above] * wide), -field_modulus % (1 << wide)),
        )
        b.output("u", b.truncate(b.add(w, fix), m), reveal="evaluator")

    field = "" if field_modulus is None else f"-p{field_modulus}"
    name = f"spgc-noise-share-L{ring_bits}-z{noise_bits}{field}"
    return _describe(name, arithmetic, make, max_depth).build()


@functools.lru_cache(maxsize=16)
def _table_values(sigma_units: float, lam: int) -> tuple[int, ...]:
    dist = NormalDist(0.0, float(sigma_units))
    n = 1 << lam
    return tuple(round(dist.inv_cdf((i + 0.5) / n)) for i in range(n))


def table_sampler_values(sigma_units: float, lam: int) -> np.ndarray:
    """The public table: 2^lambda normal quantiles sigma * Phi^-1((i + 1/2) / 2^lambda), rounded.

    Its support has at most 2^lambda points, so it is not differentially private once the
    noise range exceeds that (a neighbouring sum moves outputs onto points of probability 0).
    """
    if not isinstance(lam, int) or not 1 <= lam <= 20:
        raise ValueError(f"lambda={lam!r} must be an int in 1..20 (the table has 2^lambda entries)")
    if not (math.isfinite(sigma_units) and sigma_units > 0):
        raise ValueError(f"sigma_units must be positive, got {sigma_units!r}")
    return np.array(_table_values(float(sigma_units), lam), dtype=np.int64)


def _table_noise(b: CircuitBuilder, sigma_units: float, lam: int) -> Bits:
    table = table_sampler_values(sigma_units, lam)
    noise_bits = max(2, int(np.abs(table).max()).bit_length() + 1)
    idx = b.xor(b.input("idx_g", "garbler", lam), b.input("idx_e", "evaluator", lam))
    mask = (1 << noise_bits) - 1
    return table_lookup(b, monomials(b, list(idx)), [int(v) & mask for v in table], noise_bits)


@functools.lru_cache(maxsize=8)
def table_sampler_circuit(sigma_units: float, lam: int = 16) -> Any:
    """Baseline, NOT differentially private: the noise T[i1 xor i2] alone (output ``z``, kept),
    for measuring the paper's sampler next to ours; 2^lambda - lambda - 1 AND gates."""
    b = CircuitBuilder(f"spgc-table-sampler-lam{lam}")
    b.output("z", _table_noise(b, sigma_units, lam), reveal="keep")
    return b.build()


@functools.lru_cache(maxsize=8)
def table_noisy_sum_circuit(
    ring_bits: int, sigma_units: float, lam: int = 16, output_bits: int | None = None
) -> Any:
    """Baseline, NOT differentially private: Y = smod(A1 - A2) + T[i1 xor i2], with i1 (port
    ``idx_g``, garbler) and i2 (``idx_e``, evaluator) lambda random bits each and T the public
    table of :func:`table_sampler_values`. Costs 2^lambda - lambda - 1 AND gates for the lookup."""
    b = CircuitBuilder(f"spgc-table-baseline-L{ring_bits}-lam{lam}")
    s = _signed_difference(b, ring_bits)
    z = _table_noise(b, sigma_units, lam)
    width = output_width(ring_bits, len(z), output_bits)
    y = b.add(b.sign_extend(s, width), b.sign_extend(z, width))
    _reveal_wide(b, y)
    return b.build()


def depth_rows(ring_bits: int, noise_bits: list[int]) -> list[dict[str, Any]]:
    """AND count and AND-depth of the round's reconstruction and noisy-sum circuits, ripple
    (garbled) against ``arithmetic="depth"``."""
    rows = []
    described: list[tuple[str, int, Callable[[str], CircuitDescription]]] = [
        ("reconstruct", 0, lambda a: reconstruct_description(ring_bits, arithmetic=a))
    ]
    for nb in noise_bits:
        described.append(
            ("noisy sum", nb, lambda a, nb=nb: noisy_sum_description(ring_bits, nb, arithmetic=a))
        )
    for name, nb, describe in described:
        ripple, depth = describe("ripple"), describe("depth")
        rows.append(
            {
                "circuit": name,
                "ring_bits": ring_bits,
                "noise_bits": nb,
                "ripple_and": ripple.and_count,
                "ripple_depth": ripple.and_depth(),
                "depth_and": depth.and_count,
                "depth_depth": depth.and_depth(),
            }
        )
    return rows


def _main(argv: list[str]) -> int:
    """``python -m spgc.servers.spgc_circuit RING_BITS [NOISE_BITS ...]``: the depth table."""
    if not argv:
        print("usage: python -m spgc.servers.spgc_circuit RING_BITS [NOISE_BITS ...]")
        return 2
    print("| circuit | L | noise bits | ripple AND | ripple depth | depth AND | depth depth |")
    print("|" + "---|" * 7)
    for r in depth_rows(int(argv[0]), [int(a) for a in argv[1:]]):
        print(
            f"| {r['circuit']} | {r['ring_bits']} | {r['noise_bits'] or '-'} | {r['ripple_and']} | "
            f"{r['ripple_depth']} | {r['depth_and']} | {r['depth_depth']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))

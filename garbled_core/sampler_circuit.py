"""The discrete Gaussian sampler's trial circuit (one description for every backend).

What a trial computes is described in :mod:`garbled_core.discrete_gaussian` and
docs/NOISE_SAMPLER.md; its parameters come from :mod:`garbled_core.sampler_params` (their types:
:mod:`garbled_core.sampler_tables`).
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from garbled_core.circuit import MAX_PORT_WIDTH, Bits, CircuitBuilder, CircuitDescription
from garbled_core.depth_search import DEPTH_SEARCH_LAYER_COSTS, describe_within_depth
from garbled_core.sampler_tables import DEFAULT_SCHEDULE, AliasTable, SamplerParams

MAX_TRIAL_DEPTH = 28
"""AND layers the ``arithmetic="depth"`` trial circuit keeps within where it can (issue 47: a
gmw round of mode spgc is the trial's layers and two round trips more, at most 30); where no
layer cost fits, the shallowest circuit found (30 to 32 layers at the plans' sigmas)."""
MIN_TRIAL_DEPTH = 20
"""The smallest bound a plan may ask for (below the trial's shallowest, the shallowest is run)."""
UNBOUNDED_TRIAL_DEPTH = 10_000
"""A bound no trial reaches: the fewest AND gates (about 150 layers), what authenticated GMW
(``security: malicious``) runs, each of its AND gates costing about 60 bytes."""
TRIAL_LAYER_COSTS = (*DEPTH_SEARCH_LAYER_COSTS, 48, 96, 1000)
"""Layer costs the trial's depth search tries: the engine's, then costs at which every gadget
takes its shallowest form (a layer is a round trip of the whole run, worth hundreds of ANDs)."""
SPECULATE_LAYER_COST = 6
SLACK_LAYER_COST = 3
"""The layer cost of the gadgets off the speculative trial's critical path (the rounding carry,
and the gates :func:`describe_trial_with` adds): they finish before the chunk coins at this
cost, and a larger one would only add AND gates."""
"""From this layer cost up, the ``arithmetic="depth"`` trial computes its acceptance test
speculatively (:func:`_speculative_accept`): fewer layers for more AND gates."""

__all__ = [
    "MAX_TRIAL_DEPTH",
    "MIN_TRIAL_DEPTH",
    "SLACK_LAYER_COST",
    "SPECULATE_LAYER_COST",
    "TRIAL_LAYER_COSTS",
    "UNBOUNDED_TRIAL_DEPTH",
    "and_breakdown",
    "and_gates_per_trial",
    "build_trial_circuit",
    "build_trial_description",
    "describe_trial_with",
    "monomials",
    "sampler_summary",
    "table_lookup",
    "trial_layout",
]


def _mono_cost(size: int, count: int) -> int:
    """AND gates for the monomials a table on ``size`` index bits needs when the index is always
    below ``count``: only monomials m < count (the set [0, count) is closed under taking bit
    subsets, so their ANF coefficients and values there involve no others), each one AND."""
    count = min(count, 1 << size)
    return sum(1 for m in range(1, count) if m & (m - 1))


def monomials(
    b: CircuitBuilder, bits: Sequence[Bits], count: int | None = None
) -> list[Bits | None]:
    """Products of every subset of ``bits`` (index = subset mask; None = the empty product, 1):
    2^c - c - 1 AND gates. With ``count``, only the masks below it (an index that is always
    below ``count`` needs no others: see :func:`table_lookup`)."""
    full = 1 << len(bits)
    size = full if count is None else min(count, full)
    monos: list[Bits | None] = [None] * size
    balanced = b.arithmetic == "depth"
    for mask in range(1, size):
        top = mask.bit_length() - 1
        rest = mask ^ (1 << top)
        if rest == 0:
            monos[mask] = bits[top]
            continue
        high = 1 << top
        if balanced:  # the two parts ready earliest (same AND count, one AND a mask)
            best = None
            part = (mask - 1) & mask
            while part:
                if part < mask ^ part:  # each split once
                    ready = max(b.depth(monos[part]), b.depth(monos[mask ^ part]))  # type: ignore[arg-type]
                    if best is None or ready < best[0]:
                        best = (ready, part)
                part = (part - 1) & mask
            assert best is not None
            rest, high = best[1], mask ^ best[1]
        low_part, high_part = monos[rest], monos[high]
        assert low_part is not None and high_part is not None
        monos[mask] = b.and_(low_part, high_part)
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
    if b.arithmetic == "depth":
        return _weighted_sum_by_depth(b, columns, width, inject)
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


def _dadda_rows(b: CircuitBuilder, columns: list[list[Bits]], width: int) -> tuple[Bits, Bits]:
    """Two rows whose sum mod 2^width is the weighted sum of ``columns``: Dadda's reduction
    (stages bring every column down to 13, 9, 6, 4, 3, then 2 bits, counting the carries each
    stage brings in, with full and half adders on the earliest-ready bits)."""
    cols = [list(col) for col in columns]
    top = width - 1
    if len(cols[top]) > 1:  # carries out of the top column are dropped: parity only
        cols[top] = [b.xor_reduce(b.concat(*cols[top]))]
    targets = [2]  # Dadda's stage heights 2, 3, 4, 6, 9, 13, ...
    while targets[-1] < max(map(len, cols)):
        targets.append(targets[-1] * 3 // 2)
    stages = list(reversed(targets[:-1]))
    while stages:
        target = stages.pop(0)
        nxt: list[list[Bits]] = [[] for _ in range(width)]
        for k in range(top):
            col = sorted(cols[k], key=b.depth)  # earliest-ready first
            while len(col) >= 2 and len(col) + len(nxt[k]) > target:
                if len(col) + len(nxt[k]) - target >= 2 and len(col) >= 3:
                    total, carry = b.add_with_carry(col[0], col[1], col[2])
                    col = col[3:]
                else:
                    total, carry = b.add_with_carry(col[0], col[1])
                    col = col[2:]
                nxt[k].append(total)
                nxt[k + 1].append(carry)
            nxt[k] += col
        top_bits = cols[top] + nxt[top]  # free: only the parity of the top column matters
        nxt[top] = [b.xor_reduce(b.concat(*top_bits))] if len(top_bits) > 1 else top_bits
        cols = nxt
        if not stages and max(map(len, cols)) > 2:  # pragma: no cover - Dadda's heights suffice
            stages.append(2)
    zero = b.const(0, 1)
    first = b.concat(*(col[0] if col else zero for col in cols))
    second = b.concat(*(col[1] if len(col) > 1 else zero for col in cols))
    return first, second


def _weighted_sum_by_depth(
    b: CircuitBuilder,
    columns: list[list[Bits]],
    width: int,
    inject: tuple[int, Any] | None,
) -> Bits:
    """:func:`_weighted_sum` with few AND layers: :func:`_dadda_rows`, then the two rows are
    added by the builder's depth-aware adder. With ``inject = (j, fn)`` the low j bits
    y and their carry c1 come first, then the rounding carry c2 = fn(y); the high part is
    (A_hi + B_hi + c1) + c2, so only an increment waits for c2."""
    first, second = _dadda_rows(b, columns, width)
    if inject is None:
        return b.add(first, second)
    j, carry_of = inject
    low, low_carry = b.add_with_carry(first[:j], second[:j])
    round_carry = carry_of(low)
    high = b.add_with_carry(first[j:], second[j:], low_carry)[0]
    high = b.add_with_carry(high, b.const(0, len(high)), round_carry)[0]
    return b.concat(low, high)


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
        if b.arithmetic == "depth":  # F = D + s by the builder's depth-aware increment
            f_sum, carry = b.add_with_carry(e_bits, b.const(0, len(e_bits)), s)
            f_bits = list(f_sum)
        else:
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
    rounds = [field(f"r_round{j}") for j in range(rr.max_count)]
    if b.arithmetic == "depth" and rr.max_count > 1:  # carries past the first: below
        carries = [b.lt_unsigned(b.not_(rounds[0]), y)]
    else:
        carries = [b.lt_unsigned(b.not_(r_j), y) for r_j in rounds]
    carry = carries[-1]
    if rr.max_count > 1:
        table = rr.count
        monos = monomials(b, list(field("u_count")))
        thr = table_lookup(b, monos, table.threshold, rr.coin_bits)
        width = rr.max_count - 1
        prim = table_lookup(b, monos, _count_indicators(table, table.primary, rr.max_count), width)
        alt = table_lookup(b, monos, _count_indicators(table, table.alias, rr.max_count), width)
        at_least = b.mux(b.lt_unsigned(field("r_count"), thr), prim, alt)  # bit j-2: J >= j
        if b.arithmetic == "depth":
            # at_least is monotone (J >= j+1 implies J >= j), so the nested form below equals
            # OR_j (carry_j and J >= j+1), as a tree; en & [a < y] = en ^ (en & [y <= a]), the
            # early enable joining the comparison's last level
            terms = [carries[0]] + [
                b.xor(at_least[j - 1], b.and_le_unsigned(at_least[j - 1], y, b.not_(r_j)))
                for j, r_j in enumerate(rounds[1:], start=1)
            ]
            return b.or_reduce(b.concat(*terms))
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


def build_trial_description(
    params: SamplerParams,
    *,
    z_reveal: str = "keep",
    arithmetic: str = "ripple",
    layer_cost: float | None = None,
    bound: bool = False,
) -> CircuitDescription:
    """The trial circuit's description (see :func:`build_trial_circuit`).

    ``arithmetic="depth"``: the same outputs for the same inputs with at most
    :data:`MAX_TRIAL_DEPTH` AND layers where the parameters allow, else as few as it gets
    (monomials from their earliest-ready parts, depth-aware comparisons and additions, a
    compression tree, and from :data:`SPECULATE_LAYER_COST` up the speculative acceptance test;
    the builder's layer cost is the smallest that fits, so the AND count stays low; a given
    ``layer_cost`` is used as it is). Named with a ``-depth`` tail."""
    name = f"dgauss-trial-s{params.sigma_units:.17g}-e{params.bucket_bits}"
    tail = "-bound" if bound else ""  # the random ports carried: proved seed streams

    def make(b: CircuitBuilder) -> None:
        _build_trial(b, params, z_reveal, bound=bound)

    if arithmetic == "ripple":  # the garbled circuit: its gates, name and digest as ever
        b = CircuitBuilder(name + tail)
        make(b)
        return b.description()
    if arithmetic != "depth":
        raise ValueError(f"arithmetic must be 'ripple' or 'depth', got {arithmetic!r}")
    if layer_cost is not None:
        b = CircuitBuilder(f"{name}-depth{tail}", "depth", layer_cost)
        make(b)
        return b.description()
    return _describe_shallow(f"{name}-depth{tail}", make)


def describe_trial_with(
    params: SamplerParams,
    name: str,
    extra: Callable[[CircuitBuilder, Bits], None],
    max_depth: int = MAX_TRIAL_DEPTH,
    *,
    bound: bool = False,
) -> CircuitDescription:
    """The depth-aware trial circuit (``z`` kept) with more gates beside it: ``extra(b, z)``
    declares its own ports and outputs on the builder, ``z`` the trial's candidate noise bits.
    Within ``max_depth`` layers where it fits (else as shallow as it gets), the fewest AND
    gates that do; ``name`` names it. A larger ``max_depth`` is cheaper in AND gates (bytes
    and CPU), a smaller one in round trips: 28 (the default) costs about 1.5x the bytes of 48
    (docs/GMW.md, "A shallower trial"). ``bound``: the random ports are carried (each
    server's proved seed stream, spgc.privacy.seed_proof) instead of the servers' inputs."""

    def make(b: CircuitBuilder) -> None:
        z = _build_trial(b, params, "keep", bound=bound)
        saved, b.layer_cost = b.layer_cost, min(b.layer_cost, SLACK_LAYER_COST)
        extra(b, z)  # z is ready long before the acceptance test: cheaper gadgets
        b.layer_cost = saved

    return _describe_shallow(name, make, max_depth)


def _describe_shallow(
    name: str, make: Callable[[CircuitBuilder], None], max_depth: int = MAX_TRIAL_DEPTH
) -> CircuitDescription:
    """The cheapest description within ``max_depth`` layers, or, where no layer cost fits,
    the cheapest one as shallow as the shallowest found (not the costliest of them)."""
    desc = describe_within_depth(name, make, max_depth, TRIAL_LAYER_COSTS, slack=True)
    if desc.and_depth() > max_depth:
        desc = describe_within_depth(name, make, desc.and_depth(), TRIAL_LAYER_COSTS, slack=True)
    return desc


def _speculates(b: CircuitBuilder) -> bool:
    """Whether the trial is built with :func:`_speculative_accept` (depth-aware arithmetic
    at a layer cost of at least :data:`SPECULATE_LAYER_COST`)."""
    return b.arithmetic == "depth" and b.layer_cost >= SPECULATE_LAYER_COST


def _speculative_accept(
    b: CircuitBuilder,
    params: SamplerParams,
    field: Callable[[str], Bits],
    take_primary: Bits,
    primary: Bits,
    other: Bits,
) -> Bits:
    """The accept bit of :func:`_build_trial`, the same function, in fewer AND layers for more
    AND gates (the interactive backend's trial):

    - v's partial products are compressed to two rows for both alias codes (primary and alias)
      while the alias coin is compared, and the coin then picks one pair of rows (a mux);
    - w = (v >> k) + c2 is never formed: with h = v >> k every chunk coin is compared for the
      chunk of h and of h + 1 (the same monomials, the table shifted by one; the chunk of h + 1
      is the chunk of h plus one exactly when every bit of h below it is 1), and the rounding
      carry c2, computed beside them, picks one of each pair."""
    e = params.bucket_bits
    rr = params.rounding
    base = 0 if rr is None else rr.bits
    width = params.v_bits if rr is None else base + params.w_bits
    row_pairs = []
    for code in (primary, other):
        s, m = (field("s"), code) if params.sign_coin else (code[0], code[1:])
        e_bits = field("d") if params.sign_coin else b.xor(field("d"), _repeat(b, s, e))
        cols = _excess_columns(b, e_bits, m, s, e, width, params.sign_coin)
        row_pairs.append(_dadda_rows(b, cols, width))
    first = b.mux(take_primary, row_pairs[0][0], row_pairs[1][0])
    second = b.mux(take_primary, row_pairs[0][1], row_pairs[1][1])
    total = b.add(first, second)  # v mod 2^width
    h = total[base:]
    round_carry = None
    if rr is not None:  # off the critical path: cheaper gadgets
        saved, b.layer_cost = b.layer_cost, min(b.layer_cost, SLACK_LAYER_COST)
        round_carry = _round_carry(b, params, total[:base], field)
        b.layer_cost = saved
    plain: list[tuple[Bits, Bits]] = []  # per chunk (R_t, T_t[chunk of h])
    bumped: list[Bits] = []  # per chunk T_t[chunk of h + 1]
    bumps: list[Bits] = []  # per chunk: c2 AND every bit of h below it is 1
    ones_below = b.const(1, 1)
    done = 0
    for t, table in enumerate(params.coins):
        lo = table.offset - base
        if lo > done:
            ones_below = b.and_(ones_below, b.and_reduce(h[done:lo]))
        size = table.size
        monos = monomials(b, list(h[lo : lo + size]), table.index_count)
        r = field(f"r_coin{t}")
        plain.append((r, table_lookup(b, monos, table.threshold, params.coin_bits)))
        done = lo + size
        if round_carry is not None:
            # the chunk of w = h + c2 is this chunk of h plus c2 AND (every bit of h below it
            # is 1), mod 2^size (the top chunk of w never passes its table: w <= w_max)
            shifted = [table.threshold[(i + 1) % (1 << size)] for i in range(1 << size)]
            bumped.append(table_lookup(b, monos, shifted, params.coin_bits))
            bumps.append(b.and_(round_carry, ones_below))
            if t + 1 < len(params.coins):
                assert table.index_count == 1 << size, "only the top chunk has a short table"
                full = monos[(1 << size) - 1]
                assert full is not None
                ones_below = b.and_(ones_below, full)
    if round_carry is None:
        return b.and_reduce(b.concat(*(b.le_unsigned(r, t) for r, t in plain)))
    # The bumps are 1 for the chunks below some m and 0 from m up (ones_below only falls), so
    # accept = XOR over m of [that m] AND the coins of h + 1 below m and of h from m up: the
    # indicator (bump_(m-1) XOR bump_m, free) joins the first coin's last level, and only the
    # AND of the chunks' coins follows the comparisons.
    count = len(plain)
    edges = [b.const(1, 1), *bumps, b.const(0, 1)]
    terms = []
    for m in range(count + 1):
        pick = [bumped[t] if t < m else plain[t][1] for t in range(count)]
        first = b.and_le_unsigned(b.xor(edges[m], edges[m + 1]), plain[0][0], pick[0])
        rest = [b.le_unsigned(plain[t][0], pick[t]) for t in range(1, count)]
        terms.append(b.and_reduce(b.concat(first, *rest)))
    return b.xor_reduce(b.concat(*terms))


def _build_trial(
    b: CircuitBuilder, params: SamplerParams, z_reveal: str, *, bound: bool = False
) -> Bits:
    """Declares the trial circuit's ports and gates on ``b``; returns the candidate z.
    ``bound``: the random ports g*, e* are carried inputs instead of the servers' own."""
    words = []
    for i, w in enumerate(params.port_widths):
        g = b.input(f"g{i}", "carried" if bound else "garbler", w)
        ev = b.input(f"e{i}", "carried" if bound else "evaluator", w)
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
    if e and _speculates(b):
        accept = _speculative_accept(b, params, field, take_primary, primary, other)
    elif e:
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
    return z


@functools.lru_cache(maxsize=32)
def _build_cached(params: SamplerParams, z_reveal: str, arithmetic: str, bound: bool) -> Any:
    return build_trial_description(
        params, z_reveal=z_reveal, arithmetic=arithmetic, bound=bound
    ).build()


def build_trial_circuit(
    params: SamplerParams,
    *,
    z_reveal: str = "keep",
    arithmetic: str = "ripple",
    bound: bool = False,
) -> Any:
    """Compiled trial circuit.

    Inputs: ports ``g0..`` (garbler) and ``e0..`` (evaluator) of widths ``params.port_widths``,
    one trial's random bits each (the circuit XORs them). Outputs: ``accept`` (1 bit, revealed
    to both) and ``z`` (``params.noise_bits``-bit two's-complement candidate, kept as labels by
    default; ``z_reveal="both"`` for tests and plaintext audits). ``bound``: the ports are
    carried inputs instead (each server's proved seed stream, spgc.privacy.seed_proof).
    """
    return _build_cached(params, z_reveal, arithmetic, bound)


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


def and_gates_per_trial(params: SamplerParams) -> int:
    """AND gates of one trial (from the compiled circuit)."""
    return int(build_trial_circuit(params).and_count)


def sampler_summary(
    params: SamplerParams, schedule: Sequence[int] = DEFAULT_SCHEDULE
) -> dict[str, Any]:
    """JSON-friendly description of ``params`` with its circuit's AND gates (the benchmark
    and the docs print this)."""
    ands = and_gates_per_trial(params)
    trials = params.expected_trials(schedule)
    return {
        "sigma_units": params.sigma_units,
        "bucket_bits": params.bucket_bits,
        "coin_bits": params.coin_bits,
        "alias_bits": params.alias.index_bits,
        "grid_count": params.grid_count,
        "v_bits": params.v_bits,
        "chunks": [c.size for c in params.coins],
        "round_bits": 0 if params.rounding is None else params.rounding.bits,
        "round_count": 0 if params.rounding is None else params.rounding.max_count,
        "noise_bits": params.noise_bits,
        "noise_bound": params.noise_bound,
        "acceptance": params.acceptance,
        "trials_per_sample": trials,
        "and_gates_per_trial": ands,
        "and_gates_per_sample": ands * trials,
        "random_bits_per_trial": params.random_bits,
        "random_bits_per_sample": params.random_bits * trials,
        "statistical_distance_log2": params.distance_log2,
        "target_log2": params.target_log2,
    }

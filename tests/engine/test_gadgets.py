"""Integer gadgets against Python integer arithmetic, with their documented AND counts.

Every circuit runs through the pure-Python oracle and, when ``garbled_core._core`` imports,
through the C++ plaintext evaluator as well (see ``run`` in test_circuit_builder.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from garbled_core.circuit import Bits, CircuitBuilder, mul_const_and_count

try:  # default (prepend) import mode puts tests/ on sys.path
    from test_circuit_builder import run
except ImportError:  # tests/ made a package
    from tests.test_circuit_builder import run

U64 = np.uint64
WIDTHS = [1, 3, 8, 32, 64]
N_RANDOM = 300


def mask(w: int) -> int:
    return (1 << w) - 1


def signed(v: int, w: int) -> int:
    return v - ((v >> (w - 1)) & 1) * (1 << w)


def edge_values(w: int) -> list[int]:
    half = 1 << (w - 1)
    cands = {0, 1, 2, 3, mask(w), mask(w) - 1, half, half - 1, half + 1}
    return sorted(v & mask(w) for v in cands)


def random_values(rng: np.random.Generator, w: int, n: int) -> list[int]:
    raw = rng.integers(0, np.iinfo(np.uint64).max, n, dtype=U64, endpoint=True)
    return (raw & U64(mask(w))).tolist()


def operand_pairs(w: int, seed: int = 0) -> tuple[list[int], list[int]]:
    """All pairs of edge values, random pairs, and near-equal pairs (for eq / comparisons)."""
    rng = np.random.default_rng(seed + w)
    edges = edge_values(w)
    xs, ys = [list(t) for t in zip(*itertools.product(edges, edges), strict=True)]
    xs += random_values(rng, w, N_RANDOM)
    ys += random_values(rng, w, N_RANDOM)
    near = random_values(rng, w, 60)
    deltas = rng.integers(-1, 2, 60).tolist()
    xs += near
    ys += [(v + d) & mask(w) for v, d in zip(near, deltas, strict=True)]
    return xs, ys


def unary_values(w: int, seed: int = 0) -> list[int]:
    rng = np.random.default_rng(seed + 1000 + w)
    # Sparse and dense random values too, so popcount / is_zero see more than ~w/2 bits set.
    a, b, c = (random_values(rng, w, 50) for _ in range(3))
    sparse = [p & q & r for p, q, r in zip(a, b, c, strict=True)]
    dense = [p | q | r for p, q, r in zip(a, b, c, strict=True)]
    return edge_values(w) + random_values(rng, w, N_RANDOM) + sparse + dense


def arr(values: list[int]) -> np.ndarray:
    return np.array(values, dtype=U64)


def check(
    build: Callable[..., Bits | tuple[Bits, ...]],
    expected: Callable[..., int | tuple[int, ...]],
    widths: list[int],
    operands: list[list[int]],
    and_count: int | None,
    *,
    at_most: bool = False,
) -> None:
    """Build one circuit over inputs of the given widths, compare every output and the AND count."""
    b = CircuitBuilder("gadget")
    owners = ["garbler", "evaluator", "carried"]
    ins = [b.input(f"in{i}", owners[i % 3], w) for i, w in enumerate(widths)]
    result = build(b, *ins)
    outs = result if isinstance(result, tuple) else (result,)
    for i, o in enumerate(outs):
        b.output(f"out{i}", o)
    got = run(b, {f"in{i}": arr(v) for i, v in enumerate(operands)})
    for k, args in enumerate(zip(*operands, strict=True)):
        exp = expected(*args)
        exp = exp if isinstance(exp, tuple) else (exp,)
        for i, (o, e) in enumerate(zip(outs, exp, strict=True)):
            assert int(got[f"out{i}"][k]) == e & mask(len(o)), f"output {i} for operands {args}"
    if and_count is not None:
        actual = b.description().and_count
        if at_most:
            assert actual <= and_count
        else:
            assert actual == and_count


# ---------------------------------------------------------------------------- binary gadgets

# name -> (builder call, Python result for unsigned operands x, y at width w, AND count)
BINARY: dict[str, tuple[Callable, Callable, Callable[[int], int]]] = {
    "xor": (lambda b, x, y: b.xor(x, y), lambda x, y, w: x ^ y, lambda w: 0),
    "and_": (lambda b, x, y: b.and_(x, y), lambda x, y, w: x & y, lambda w: w),
    "or_": (lambda b, x, y: b.or_(x, y), lambda x, y, w: x | y, lambda w: w),
    "add": (lambda b, x, y: b.add(x, y), lambda x, y, w: x + y, lambda w: w - 1),
    "sub": (lambda b, x, y: b.sub(x, y), lambda x, y, w: x - y, lambda w: w - 1),
    "mul": (lambda b, x, y: b.mul(x, y), lambda x, y, w: x * y, lambda w: w * w - w + 1),
    "lt_unsigned": (lambda b, x, y: b.lt_unsigned(x, y), lambda x, y, w: x < y, lambda w: w),
    "le_unsigned": (lambda b, x, y: b.le_unsigned(x, y), lambda x, y, w: x <= y, lambda w: w),
    "gt_unsigned": (lambda b, x, y: b.gt_unsigned(x, y), lambda x, y, w: x > y, lambda w: w),
    "ge_unsigned": (lambda b, x, y: b.ge_unsigned(x, y), lambda x, y, w: x >= y, lambda w: w),
    "lt_signed": (
        lambda b, x, y: b.lt_signed(x, y),
        lambda x, y, w: signed(x, w) < signed(y, w),
        lambda w: w,
    ),
    "le_signed": (
        lambda b, x, y: b.le_signed(x, y),
        lambda x, y, w: signed(x, w) <= signed(y, w),
        lambda w: w,
    ),
    "gt_signed": (
        lambda b, x, y: b.gt_signed(x, y),
        lambda x, y, w: signed(x, w) > signed(y, w),
        lambda w: w,
    ),
    "ge_signed": (
        lambda b, x, y: b.ge_signed(x, y),
        lambda x, y, w: signed(x, w) >= signed(y, w),
        lambda w: w,
    ),
    "eq": (lambda b, x, y: b.eq(x, y), lambda x, y, w: x == y, lambda w: w - 1),
    "ne": (lambda b, x, y: b.ne(x, y), lambda x, y, w: x != y, lambda w: w - 1),
    "min_signed": (
        lambda b, x, y: b.min_signed(x, y),
        lambda x, y, w: min(signed(x, w), signed(y, w)),
        lambda w: 2 * w,
    ),
    "max_signed": (
        lambda b, x, y: b.max_signed(x, y),
        lambda x, y, w: max(signed(x, w), signed(y, w)),
        lambda w: 2 * w,
    ),
    "min_unsigned": (
        lambda b, x, y: b.min_unsigned(x, y),
        lambda x, y, w: min(x, y),
        lambda w: 2 * w,
    ),
    "max_unsigned": (
        lambda b, x, y: b.max_unsigned(x, y),
        lambda x, y, w: max(x, y),
        lambda w: 2 * w,
    ),
}


@pytest.mark.parametrize("w", WIDTHS)
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_gadget(name, w):
    build, expected, count = BINARY[name]
    xs, ys = operand_pairs(w)
    check(build, lambda x, y: int(expected(x, y, w)), [w, w], [xs, ys], count(w))


@pytest.mark.parametrize("w", [8, 32])
@pytest.mark.parametrize("name", list(BINARY))
def test_binary_gadget_with_constant_operand(name, w):
    """An int operand is a constant: same results, never more ANDs than the generic formula."""
    build, expected, count = BINARY[name]
    xs, _ = operand_pairs(w)
    for c in [0, 1, mask(w), 1 << (w - 1), 0x5A & mask(w)]:
        check(
            lambda b, x, c=c: build(b, x, c),
            lambda x, c=c: int(expected(x, c, w)),
            [w],
            [xs],
            count(w),
            at_most=True,
        )
        check(
            lambda b, y, c=c: build(b, c, y),
            lambda y, c=c: int(expected(c, y, w)),
            [w],
            [xs],
            count(w),
            at_most=True,
        )


@pytest.mark.parametrize("w", WIDTHS)
def test_add_with_carry(w):
    xs, ys = operand_pairs(w)
    cin = [(x ^ y) & 1 for x, y in zip(xs, ys, strict=True)]
    check(
        lambda b, x, y: b.add_with_carry(x, y),
        lambda x, y: (x + y, (x + y) >> w),
        [w, w],
        [xs, ys],
        w,
    )
    check(
        lambda b, x, y, c: b.add_with_carry(x, y, c),
        lambda x, y, c: (x + y + c, (x + y + c) >> w),
        [w, w, 1],
        [xs, ys, cin],
        w,
    )


@pytest.mark.parametrize("w", WIDTHS)
def test_sub_with_borrow(w):
    xs, ys = operand_pairs(w)
    bin_ = [((x >> 1) ^ y) & 1 for x, y in zip(xs, ys, strict=True)]
    check(
        lambda b, x, y: b.sub_with_borrow(x, y),
        lambda x, y: (x - y, int(x < y)),
        [w, w],
        [xs, ys],
        w,
    )
    check(
        lambda b, x, y, c: b.sub_with_borrow(x, y, c),
        lambda x, y, c: (x - y - c, int(x < y + c)),
        [w, w, 1],
        [xs, ys, bin_],
        w,
    )


@pytest.mark.parametrize("w", WIDTHS)
def test_mux(w):
    xs, ys = operand_pairs(w)
    sel = [(x + y) & 1 for x, y in zip(xs, ys, strict=True)]
    check(
        lambda b, s, x, y: b.mux(s, x, y),
        lambda s, x, y: x if s else y,
        [1, w, w],
        [sel, xs, ys],
        w,
    )


@pytest.mark.parametrize("w", WIDTHS)
def test_cond_neg(w):
    xs, ys = operand_pairs(w)
    sel = [y & 1 for y in ys]
    check(lambda b, x, s: b.cond_neg(x, s), lambda x, s: -x if s else x, [w, 1], [xs, sel], w - 1)


# ---------------------------------------------------------------------------- unary gadgets

UNARY: dict[str, tuple[Callable, Callable, Callable[[int], int]]] = {
    "not_": (lambda b, x: b.not_(x), lambda x, w: ~x, lambda w: 0),
    "neg": (lambda b, x: b.neg(x), lambda x, w: -x, lambda w: max(w - 2, 0)),
    "abs_signed": (lambda b, x: b.abs_signed(x), lambda x, w: abs(signed(x, w)), lambda w: w - 1),
    "is_zero": (lambda b, x: b.is_zero(x), lambda x, w: x == 0, lambda w: w - 1),
    "is_negative": (lambda b, x: b.is_negative(x), lambda x, w: signed(x, w) < 0, lambda w: 0),
    "popcount": (
        lambda b, x: b.popcount(x),
        lambda x, w: bin(x).count("1"),
        lambda w: w - bin(w).count("1"),
    ),
    "xor_reduce": (lambda b, x: b.xor_reduce(x), lambda x, w: bin(x).count("1") & 1, lambda w: 0),
    "or_reduce": (lambda b, x: b.or_reduce(x), lambda x, w: x != 0, lambda w: w - 1),
    "and_reduce": (lambda b, x: b.and_reduce(x), lambda x, w: x == mask(w), lambda w: w - 1),
}


@pytest.mark.parametrize("w", WIDTHS)
@pytest.mark.parametrize("name", list(UNARY))
def test_unary_gadget(name, w):
    build, expected, count = UNARY[name]
    check(build, lambda x: int(expected(x, w)), [w], [unary_values(w)], count(w))


@pytest.mark.parametrize("w", range(1, 65))
def test_popcount_width_and_count(w):
    b = CircuitBuilder()
    x = b.input("x", "garbler", w)
    p = b.popcount(x)
    assert len(p) == w.bit_length()
    b.output("p", p)
    assert b.description().and_count == w - bin(w).count("1")
    vals = [mask(w), 0, 1 << (w - 1), *random_values(np.random.default_rng(w), w, 20)]
    got = run(b, {"x": arr(vals)})["p"].tolist()
    assert got == [bin(v).count("1") for v in vals]


# ---------------------------------------------------------------------------- wiring gadgets


def rotl(x: int, r: int, w: int) -> int:
    return (x << r) | (x >> (w - r))


@pytest.mark.parametrize("w", WIDTHS)
def test_shifts_and_rotations(w):
    xs = unary_values(w)
    for k in sorted({0, 1, w // 2, w - 1, w, w + 3}):
        check(lambda b, x, k=k: b.shl(x, k), lambda x, k=k: x << k, [w], [xs], 0)
        check(lambda b, x, k=k: b.shr_logical(x, k), lambda x, k=k: x >> k, [w], [xs], 0)
        check(lambda b, x, k=k: b.shr_arith(x, k), lambda x, k=k: signed(x, w) >> k, [w], [xs], 0)
        left, right = k % w, (w - k % w) % w
        check(lambda b, x, k=k: b.rotl(x, k), lambda x, r=left: rotl(x, r, w), [w], [xs], 0)
        check(lambda b, x, k=k: b.rotr(x, k), lambda x, r=right: rotl(x, r, w), [w], [xs], 0)


@pytest.mark.parametrize("w", WIDTHS)
def test_extend_truncate_resize(w):
    xs = unary_values(w)
    wider = min(w + 7, 64)
    check(lambda b, x: b.zero_extend(x, wider), lambda x: x, [w], [xs], 0)
    check(lambda b, x: b.sign_extend(x, wider), lambda x: signed(x, w), [w], [xs], 0)
    check(lambda b, x: b.resize(x, wider, signed=True), lambda x: signed(x, w), [w], [xs], 0)
    check(lambda b, x: b.resize(x, wider, signed=False), lambda x: x, [w], [xs], 0)
    narrow = max(w // 2, 1)
    check(lambda b, x: b.truncate(x, narrow), lambda x: x, [w], [xs], 0)
    check(lambda b, x: b.resize(x, narrow, signed=True), lambda x: x, [w], [xs], 0)


def test_extend_truncate_reject_wrong_direction():
    b = CircuitBuilder()
    x = b.input("x", "garbler", 8)
    with pytest.raises(ValueError):
        b.zero_extend(x, 7)
    with pytest.raises(ValueError):
        b.sign_extend(x, 7)
    with pytest.raises(ValueError):
        b.truncate(x, 9)
    with pytest.raises(ValueError):
        b.shl(x, -1)


# ---------------------------------------------------------------------------- constants


def trailing_zeros(c: int) -> int:
    return (c & -c).bit_length() - 1


@pytest.mark.parametrize("w", WIDTHS)
def test_add_sub_const(w):
    xs = unary_values(w)
    for c in sorted({0, 1, 2, 3, 12, -1, -2, 1 << (w - 1), mask(w), 0x2C0 & mask(w)}):
        for op, rhs in (("add_const", c), ("sub_const", -c)):
            cm = rhs % (1 << w)
            ands = 0 if cm == 0 else max(w - 2 - trailing_zeros(cm), 0)
            check(
                lambda b, x, op=op, c=c: getattr(b, op)(x, c),
                lambda x, rhs=rhs: x + rhs,
                [w],
                [xs],
                ands,
            )


MUL_CONSTANTS = [0, 1, 2, 3, 5, 7, 8, 10, 15, 255, -1, -3, 1000003, 0x5555, 0xF0F0F0F1]
MUL_CONSTANTS += [-(2**40) - 7, 12345678901234567]


@pytest.mark.parametrize("w", WIDTHS)
def test_mul_const(w):
    xs = unary_values(w)
    for c in MUL_CONSTANTS:
        check(
            lambda b, x, c=c: b.mul_const(x, c),
            lambda x, c=c: x * c,
            [w],
            [xs],
            mul_const_and_count(c, w),
        )


def test_mul_const_counts():
    # Documented examples: powers of two are free, 3x = 2x + x and 7x = 8x - x cost w-2,
    # and the count never exceeds plain shift-and-add over the set bits of c.
    for w in (8, 32, 64):
        assert mul_const_and_count(1 << 5, w) == 0
        assert mul_const_and_count(3, w) == w - 2
        assert mul_const_and_count(7, w) == w - 2
        assert mul_const_and_count(-1, w) == w - 2
        assert mul_const_and_count(5, w) == w - 3
        assert mul_const_and_count(0, w) == 0
        for c in [*MUL_CONSTANTS, 0x7FFF_FFFF]:
            cm = c % (1 << w)
            bits = [j for j in range(w) if (cm >> j) & 1]
            naive = sum(w - 1 - j for j in bits[1:])
            assert mul_const_and_count(c, w) <= naive


@pytest.mark.parametrize(("w", "width"), [(8, 20), (8, 64), (32, 64), (1, 10), (64, 16)])
@pytest.mark.parametrize("is_signed", [True, False])
def test_mul_const_resizing(w, width, is_signed):
    xs = unary_values(w)
    for c in [3, -5, 1000003]:
        check(
            lambda b, x, c=c: b.mul_const(x, c, width, signed=is_signed),
            lambda x, c=c: (signed(x, w) if is_signed else x) * c,
            [w],
            [xs],
            mul_const_and_count(c, width),
            at_most=True,  # extension bits are constants or repeats, folding can only save
        )


def test_wide_intermediates():
    """Internal values may exceed 64 bits: (x * c) >> 40 computed at 100 bits."""
    c = 987654321987
    xs = unary_values(64)
    check(
        lambda b, x: b.truncate(b.shr_arith(b.mul_const(x, c, 100), 40), 60),
        lambda x: (signed(x, 64) * c) >> 40,
        [64],
        [xs],
        None,
    )


def test_builder_gadgets_compose():
    """A small clamp-and-accumulate pipeline, end to end."""
    w = 32
    xs, ys = operand_pairs(w, seed=5)

    def build(b: CircuitBuilder, x: Bits, y: Bits) -> tuple[Bits, Bits]:
        total = b.add(b.sign_extend(x, 40), b.sign_extend(y, 40))
        clamped = b.max_signed(b.min_signed(total, (1 << 31) - 1), -(1 << 31))
        return b.truncate(clamped, 32), b.popcount(b.xor(x, y))

    def expected(x: int, y: int) -> tuple[int, int]:
        total = signed(x, w) + signed(y, w)
        return max(min(total, (1 << 31) - 1), -(1 << 31)), bin(x ^ y).count("1")

    check(build, expected, [w, w], [xs, ys], None)

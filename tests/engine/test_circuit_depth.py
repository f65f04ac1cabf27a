"""Depth-aware arithmetic (issue 34 item 3): CircuitDescription.and_depth, the
``arithmetic="depth"`` gadgets against the ripple ones, and the round's circuits built with them."""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pytest

from garbled_core import CircuitBuilder
from garbled_core.circuit import (
    OP_AND,
    OP_NOT,
    OP_XOR,
    Bits,
    CircuitDescription,
)
from garbled_core.depth_search import describe_with_slack, describe_within_depth
from garbled_core.discrete_gaussian import (
    MAX_TRIAL_DEPTH,
    SPECULATE_LAYER_COST,
    build_trial_circuit,
    build_trial_description,
    derive_params,
)
from spgc.servers.spgc_circuit import (
    MAX_ROUND_DEPTH,
    fused_trial_description,
    noisy_sum_circuit,
    noisy_sum_description,
    reconstruct_description,
)

U64 = np.uint64
Gadget = Callable[[CircuitBuilder, Bits, Bits, Bits], Bits]

GADGETS: dict[str, Gadget] = {
    "add": lambda b, x, y, c: b.add(x, y),
    "sub": lambda b, x, y, c: b.sub(x, y),
    "add_with_carry": lambda b, x, y, c: b.concat(*b.add_with_carry(x, y, c)),
    "sub_with_borrow": lambda b, x, y, c: b.concat(*b.sub_with_borrow(x, y, c)),
    "neg": lambda b, x, y, c: b.neg(x),
    "cond_neg": lambda b, x, y, c: b.cond_neg(x, c),
    "abs_signed": lambda b, x, y, c: b.abs_signed(x),
    "add_const": lambda b, x, y, c: b.add_const(x, 0b1011000101),
    "mul": lambda b, x, y, c: b.mul(x, y),
    "mul_const": lambda b, x, y, c: b.mul_const(x, -13),
    "popcount": lambda b, x, y, c: b.popcount(x),
    "lt_unsigned": lambda b, x, y, c: b.lt_unsigned(x, y),
    "le_unsigned": lambda b, x, y, c: b.le_unsigned(x, y),
    "gt_unsigned": lambda b, x, y, c: b.gt_unsigned(x, y),
    "ge_unsigned": lambda b, x, y, c: b.ge_unsigned(x, y),
    "lt_signed": lambda b, x, y, c: b.lt_signed(x, y),
    "le_signed": lambda b, x, y, c: b.le_signed(x, y),
    "gt_signed": lambda b, x, y, c: b.gt_signed(x, y),
    "ge_signed": lambda b, x, y, c: b.ge_signed(x, y),
    "lt_const": lambda b, x, y, c: b.lt_unsigned(x, 0b100101),
    "min_signed": lambda b, x, y, c: b.min_signed(x, y),
    "max_unsigned": lambda b, x, y, c: b.max_unsigned(x, y),
    "eq": lambda b, x, y, c: b.eq(x, y),
    "is_zero": lambda b, x, y, c: b.is_zero(x),
    "or_reduce": lambda b, x, y, c: b.or_reduce(x),
    "and_reduce": lambda b, x, y, c: b.and_reduce(x),
}


def gadget_description(name: str, width: int, arithmetic: str) -> CircuitDescription:
    b = CircuitBuilder(f"{name}-{width}", arithmetic)
    x = b.input("x", "garbler", width)
    y = b.input("y", "evaluator", width)
    c = b.input("c", "evaluator", 1)
    out = GADGETS[name](b, x, y, c)
    b.output("o", out[:64])
    if len(out) > 64:
        b.output("o_hi", out[64:])
    return b.description()


def operands(width: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Every pair (and carry) for width <= 6, else random and edge values."""
    mask = (1 << width) - 1
    if width <= 6:
        pairs = list(itertools.product(range(1 << width), repeat=2))
        xs = [p[0] for p in pairs] * 2
        ys = [p[1] for p in pairs] * 2
        cs = [0] * len(pairs) + [1] * len(pairs)
    else:
        edges = [0, 1, mask, mask - 1, 1 << (width - 1), (1 << (width - 1)) - 1]
        xs = [a for a in edges for _ in edges] + [
            int(rng.bit_generator.random_raw()) for _ in range(600)
        ]
        ys = [a for _ in edges for a in edges] + [
            int(rng.bit_generator.random_raw()) for _ in range(600)
        ]
        ys[-100:] = xs[-100:]  # equal operands
        cs = [int(v) for v in rng.integers(0, 2, len(xs))]
    return {
        "x": np.array([v & mask for v in xs], dtype=U64),
        "y": np.array([v & mask for v in ys], dtype=U64),
        "c": np.array(cs, dtype=U64),
    }


# ---------------------------------------------------------------------------- and_depth


def test_and_depth_hand_built() -> None:
    # wires: 1 = a, 2 = b; 3 = a & b; 4 = 3 ^ a; 5 = 4 & b; 6 = ~5; 7 = a ^ b
    gates = np.array(
        [
            [OP_AND, 1, 2, 3],
            [OP_XOR, 3, 1, 4],
            [OP_AND, 4, 2, 5],
            [OP_NOT, 5, 0, 6],
            [OP_XOR, 1, 2, 7],
        ],
        dtype=np.int64,
    )
    desc = CircuitDescription(
        num_wires=8,
        inputs=[("a", "garbler", 1), ("b", "evaluator", 1)],
        gates=gates,
        outputs=[("o", "both", [6]), ("p", "both", [4, 7]), ("q", "both", [7, 1])],
    )
    assert desc.and_depth() == 2
    assert desc.output_depths() == {"o": 2, "p": 1, "q": 0}
    assert desc.wire_depths().tolist() == [0, 0, 0, 1, 1, 2, 2, 0]
    empty = CircuitDescription(1, [], np.zeros((0, 4), dtype=np.int64), [], "")
    assert empty.and_depth() == 0


def test_and_depth_chains_and_trees() -> None:
    b = CircuitBuilder()
    x = b.input("x", "garbler", 16)
    acc = x[0]
    for i in range(1, 16):
        acc = b.and_(acc, x[i])
    b.output("chain", acc)
    b.output("tree", b.or_reduce(x))
    b.output("free", b.xor_reduce(x))
    desc = b.description()
    assert desc.output_depths() == {"chain": 15, "tree": 4, "free": 0}
    assert desc.and_depth() == 15
    assert b.depth(acc) == 15


def test_ripple_is_the_default_and_unchanged() -> None:
    for name in ("add", "lt_signed", "mul_const", "popcount"):
        default = CircuitBuilder(f"{name}-12")
        x = default.input("x", "garbler", 12)
        y = default.input("y", "evaluator", 12)
        c = default.input("c", "evaluator", 1)
        out = GADGETS[name](default, x, y, c)
        default.output("o", out)
        desc = default.description()
        ripple = gadget_description(name, 12, "ripple")
        assert np.array_equal(desc.gates, ripple.gates)
        assert desc.and_depth() == ripple.and_depth()
    assert gadget_description("add", 16, "ripple").and_count == 15  # w - 1, as documented
    assert gadget_description("lt_unsigned", 16, "ripple").and_count == 16


def test_builder_options_validated() -> None:
    with pytest.raises(ValueError, match="arithmetic"):
        CircuitBuilder("x", "fast")
    with pytest.raises(ValueError, match="layer_cost"):
        CircuitBuilder("x", "depth", -1)
    with pytest.raises(ValueError, match="arithmetic"):
        build_trial_description(derive_params(2.0), arithmetic="gmw")


# ---------------------------------------------------------------------------- gadgets


@pytest.mark.parametrize("width", [1, 2, 3, 5, 6, 9, 16, 33, 64])
def test_depth_gadgets_equal_ripple(width: int) -> None:
    rng = np.random.default_rng(width)
    inputs = operands(width, rng)
    for name in GADGETS:
        if name in ("add_with_carry", "sub_with_borrow") and width == 64:
            continue  # 65-bit outputs: covered at the other widths
        if name == "mul" and width > 16:
            continue  # schoolbook, quadratic: nothing depth-specific past 16 bits
        ripple = gadget_description(name, width, "ripple")
        depth = gadget_description(name, width, "depth")
        got = depth.build().evaluate(inputs)
        want = ripple.build().evaluate(inputs)
        for port in want:
            assert np.array_equal(got[port], want[port]), (name, width, port)
        assert depth.and_depth() <= ripple.and_depth(), (name, width)


@pytest.mark.parametrize("width", [16, 33, 64])
def test_depth_gadgets_are_shallow(width: int) -> None:
    """The documented trade: comparisons about 2x the ANDs at about 2 log2 w layers,
    additions about 3x at about sqrt(2w) layers (default layer cost)."""
    log_w = (width - 1).bit_length()
    for name in ("lt_unsigned", "lt_signed", "ge_unsigned"):
        ripple = gadget_description(name, width, "ripple")
        depth = gadget_description(name, width, "depth")
        assert depth.and_depth() <= 2 * log_w, name
        assert depth.and_count <= 3 * ripple.and_count, name
    for name in ("add", "sub", "add_with_carry"):
        ripple = gadget_description(name, width, "ripple")
        depth = gadget_description(name, width, "depth")
        assert depth.and_depth() <= int((2 * width) ** 0.5) + 2, name
        assert depth.and_count <= 3 * ripple.and_count, name
    for name in ("eq", "or_reduce", "popcount"):  # trees in both families
        assert gadget_description(name, width, "depth").and_depth() <= log_w + 1


def test_layer_cost_trades_gates_for_layers() -> None:
    counts = []
    for layer_cost in (0.25, 2, 8, 32):
        b = CircuitBuilder("lt", "depth", layer_cost)
        x = b.input("x", "garbler", 64)
        y = b.input("y", "evaluator", 64)
        b.output("o", b.lt_unsigned(x, y))
        desc = b.description()
        counts.append((desc.and_count, desc.and_depth()))
    assert counts[0] == (64, 64)  # ripple when layers are cheap
    for (ands_lo, depth_lo), (ands_hi, depth_hi) in itertools.pairwise(counts):
        assert ands_lo <= ands_hi and depth_lo >= depth_hi


def test_describe_within_depth_picks_the_cheapest_that_fits() -> None:
    def make(b: CircuitBuilder) -> None:
        x = b.input("x", "garbler", 40)
        y = b.input("y", "evaluator", 40)
        b.output("o", b.add(x, y))

    loose = describe_within_depth("a", make, 64)
    assert (loose.and_count, loose.and_depth()) == (39, 39)  # ripple fits
    tight = describe_within_depth("a", make, 16)
    assert tight.and_depth() <= 16 and tight.and_count > 39
    impossible = describe_within_depth("a", make, 1)
    assert impossible.and_depth() > 1  # the shallowest tried


# ---------------------------------------------------------------------------- round circuits


def random_ports(widths: dict[str, int], n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    out = {}
    for name, width in widths.items():
        v = rng.integers(0, 2**63, n, dtype=U64) * U64(2) + rng.integers(0, 2, n, dtype=U64)
        out[name] = v if width == 64 else v & U64((1 << width) - 1)
    return out


# no rejection (e = 0), no rounding (16), cancer's sigma at epsilon 8 (bench comm) and a large
# one with the widest rounding, at the bucket widths derive_params picks (given, to skip its search)
@pytest.mark.parametrize(
    ("sigma", "bucket_bits"),
    [(2.0, 0), (16.0, 2), (484.33350006352276, 7), (2.0**20, 17)],
)
def test_trial_circuit_depth_mode(sigma: float, bucket_bits: int) -> None:
    params = derive_params(sigma, bucket_bits=bucket_bits)
    ripple = build_trial_description(params)
    depth = build_trial_description(params, arithmetic="depth")
    assert depth.and_depth() <= MAX_TRIAL_DEPTH < ripple.and_depth()
    # layers bought with AND gates (garbling keeps the ripple circuit): 1.3x to 2.4x here
    # (163/124, 588/339, 1408/592, 2460/1152 printed by and_count of the two descriptions)
    assert depth.and_count <= 2.5 * ripple.and_count
    assert ripple.and_count == build_trial_circuit(params).and_count  # the garbled one
    assert depth.name == ripple.name + "-depth"
    widths = {}
    for i, w in enumerate(params.port_widths):
        widths[f"g{i}"] = w
        widths[f"e{i}"] = w
    inputs = random_ports(widths, 3000, np.random.default_rng(int(sigma)))
    want = build_trial_circuit(params, z_reveal="both").evaluate(inputs)
    got = build_trial_circuit(params, z_reveal="both", arithmetic="depth").evaluate(inputs)
    assert set(got) == {"accept", "z"}
    for port in want:
        assert np.array_equal(got[port], want[port]), port
    if params.bucket_bits:
        assert 0.5 < float(np.mean(want["accept"])) < 1.0  # both branches exercised


@pytest.mark.parametrize(
    ("sigma", "bucket_bits"), [(16.0, 2), (100.0, None), (484.33350006352276, 7), (1e8, None)]
)
def test_trial_at_every_layer_cost_is_the_garbled_one(
    sigma: float, bucket_bits: int | None
) -> None:
    """Below and above SPECULATE_LAYER_COST (plain and speculative acceptance test, with and
    without the rounding): the same outputs as the ripple circuit for 4,000 random trials."""
    params = derive_params(sigma, bucket_bits=bucket_bits)
    widths = {}
    for i, w in enumerate(params.port_widths):
        widths[f"g{i}"] = w
        widths[f"e{i}"] = w
    inputs = random_ports(widths, 4000, np.random.default_rng(int(sigma) + 7))
    want = build_trial_circuit(params, z_reveal="both").evaluate(inputs)
    depths = []
    for cost in (1, SPECULATE_LAYER_COST, 1000):
        desc = build_trial_description(params, z_reveal="both", arithmetic="depth", layer_cost=cost)
        got = desc.build().evaluate(inputs)
        for port in want:
            assert np.array_equal(got[port], want[port]), (cost, port)
        depths.append(desc.and_depth())
    assert depths[0] > depths[1] >= depths[2]  # speculation saves layers


@pytest.mark.parametrize(("ring_bits", "noise_bits"), [(16, 14), (16, 23), (64, 23)])
def test_noisy_sum_depth_mode(ring_bits: int, noise_bits: int) -> None:
    ripple = noisy_sum_description(ring_bits, noise_bits)
    depth = noisy_sum_description(ring_bits, noise_bits, arithmetic="depth")
    # The gmw round's noisy sum is as shallow as the gadgets go (NOISY_SUM_MAX_DEPTH): fewer
    # layers than ripple's at a few more AND gates; within 48 it would be ripple's itself.
    assert depth.and_depth() < ripple.and_depth() and depth.and_depth() <= 24
    assert ripple.and_count < depth.and_count <= 3 * ripple.and_count
    within = noisy_sum_description(
        ring_bits, noise_bits, arithmetic="depth", max_depth=MAX_ROUND_DEPTH
    )
    assert within.and_depth() <= MAX_ROUND_DEPTH
    if ripple.and_depth() <= MAX_ROUND_DEPTH:  # used only where it pays
        assert within.and_count == ripple.and_count
    widths = {"a1": ring_bits, "a2": ring_bits, "z": noise_bits}
    inputs = random_ports(widths, 2000, np.random.default_rng(ring_bits + noise_bits))
    want = noisy_sum_circuit(ring_bits, noise_bits).evaluate(inputs)
    got = noisy_sum_circuit(ring_bits, noise_bits, arithmetic="depth").evaluate(inputs)
    for port in want:
        assert np.array_equal(got[port], want[port]), port
    recon = reconstruct_description(ring_bits, arithmetic="depth")
    assert recon.and_depth() <= MAX_ROUND_DEPTH
    rec_inputs = {k: inputs[k] for k in ("a1", "a2")}
    want_s = reconstruct_description(ring_bits).build().evaluate(rec_inputs)["s"]
    assert np.array_equal(recon.build().evaluate(rec_inputs)["s"], want_s)


def test_noisy_sum_within_a_smaller_depth() -> None:
    """A round runs the trial circuits, then the noisy sum: fewer layers there for more ANDs."""
    ripple = noisy_sum_description(16, 23)
    shallow = noisy_sum_description(16, 23, arithmetic="depth", max_depth=12)
    assert shallow.and_depth() <= 12 < ripple.and_depth()
    assert shallow.and_count <= 3 * ripple.and_count
    inputs = random_ports({"a1": 16, "a2": 16, "z": 23}, 2000, np.random.default_rng(3))
    want = noisy_sum_circuit(16, 23).evaluate(inputs)
    got = noisy_sum_circuit(16, 23, arithmetic="depth", max_depth=12).evaluate(inputs)
    assert np.array_equal(got["y"], want["y"])


@pytest.mark.parametrize("width", [1, 2, 3, 5, 23, 33, 64])
@pytest.mark.parametrize(("arithmetic", "cost"), [("ripple", 8), ("depth", 3), ("depth", 1000)])
def test_and_le_unsigned(width: int, arithmetic: str, cost: float) -> None:
    """enable AND (x <= y) against numpy, with x == y, x == y +- 1 and the extremes mixed in."""
    b = CircuitBuilder("le", arithmetic, cost)
    x = b.input("x", "garbler", width)
    y = b.input("y", "evaluator", width)
    en = b.input("en", "garbler", 1)
    b.output("o", b.and_le_unsigned(en, x, y))
    rng = np.random.default_rng(width)
    ports = random_ports({"x": width, "y": width, "en": 1}, 2000, rng)
    mask = U64((1 << width) - 1)
    ports["y"][:500] = ports["x"][:500]
    ports["y"][500:700] = (ports["x"][500:700] + U64(1)) & mask
    ports["y"][700:900] = (ports["x"][700:900] - U64(1)) & mask
    ports["x"][900:950] = mask
    ports["y"][950:1000] = U64(0)
    got = b.build().evaluate(ports)["o"]
    want = (ports["en"] & (ports["x"] <= ports["y"])).astype(U64)
    assert np.array_equal(got, want)


def test_sparse_comparison_depth() -> None:
    """65-bit coins: the sparse borrow tree is 7 levels (a balanced tree needs 8), and an enable
    ready with the operands adds none."""
    b = CircuitBuilder("le", "depth", 1000)
    x = b.concat(b.input("x0", "garbler", 64), b.input("x1", "garbler", 1))
    y = b.concat(b.input("y0", "evaluator", 64), b.input("y1", "evaluator", 1))
    en = b.input("en", "garbler", 1)
    b.output("plain", b.le_unsigned(x, y))
    b.output("enabled", b.and_le_unsigned(en, x, y))
    assert b.description().output_depths() == {"plain": 7, "enabled": 7}


def test_describe_with_slack_keeps_the_depth_for_fewer_ands() -> None:
    """A comparison beside a deeper chain of additions: on its slack it takes a cheaper
    structure; the depth stays and the outputs are the same."""

    def make(b: CircuitBuilder) -> None:
        x = b.input("x", "garbler", 48)
        y = b.input("y", "evaluator", 48)
        acc = x
        for _ in range(4):
            acc = b.add(acc, y)
        b.output("sum", acc)
        b.output("lt", b.lt_unsigned(x, y))

    plain = CircuitBuilder("s", "depth", 1000)
    make(plain)
    want_desc = plain.description()
    got_desc = describe_with_slack("s", make, 1000)
    assert got_desc.and_depth() <= want_desc.and_depth()
    assert got_desc.and_count < want_desc.and_count
    ports = random_ports({"x": 48, "y": 48}, 1000, np.random.default_rng(3))
    want = want_desc.build().evaluate(ports)
    got = got_desc.build().evaluate(ports)
    for port in want:
        assert np.array_equal(got[port], want[port]), port


def test_fused_trial_depth_is_a_choice() -> None:
    """The gmw round's trial run within MAX_TRIAL_DEPTH by default; a deeper bound is cheaper
    and computes the same outputs."""
    params = derive_params(484.33350006352276, bucket_bits=7)
    width = params.noise_bits + 3
    shallow = fused_trial_description(params, 16, width)
    deep = fused_trial_description(params, 16, width, max_depth=48)
    assert shallow.and_depth() <= MAX_TRIAL_DEPTH < deep.and_depth() <= 48
    assert deep.and_count < 0.8 * shallow.and_count
    assert deep.name == shallow.name + "48"
    widths = {name: w for name, _, w in shallow.inputs}
    ports = random_ports(widths, 2000, np.random.default_rng(11))
    want = shallow.build().evaluate(ports)
    got = deep.build().evaluate(ports)
    for port in want:
        assert np.array_equal(got[port], want[port]), port


@pytest.mark.parametrize("width", [5, 17, 38, 64])
def test_prefix_adder_at_a_high_layer_cost(width: int) -> None:
    """At a layer cost where the Sklansky adder wins: sum and carry out against Python ints,
    depth 1 + ceil(log2 w) at most."""
    b = CircuitBuilder("a", "depth", 1000)
    x = b.input("x", "garbler", width)
    y = b.input("y", "evaluator", width)
    c = b.input("c", "garbler", 1)
    total, carry = b.add_with_carry(x, y, c)
    b.output("s", total)
    b.output("co", carry)
    desc = b.description()
    assert desc.and_depth() <= 1 + (width - 1).bit_length()
    ports = random_ports({"x": width, "y": width, "c": 1}, 2000, np.random.default_rng(width))
    ports["y"][:200] = ~ports["x"][:200] & U64((1 << width) - 1)  # long carry chains
    out = desc.build().evaluate(ports)
    triples = zip(ports["x"], ports["y"], ports["c"], strict=True)
    sums = [int(p) + int(q) + int(r) for p, q, r in triples]
    assert [int(v) for v in out["s"]] == [t % (1 << width) for t in sums]
    assert [int(v) for v in out["co"]] == [t >> width for t in sums]

"""Circuit builder: the wire-numbering contract, constant folding, validation, random circuits.

Holds the pure-Python test oracle (``reference_eval``) and ``run``, which evaluates a builder's
circuit with the oracle and, when the C++ module imports, with ``_core.Circuit.evaluate`` too,
asserting they agree. tests/engine/test_gadgets.py reuses both.
"""

from __future__ import annotations

import numpy as np
import pytest

from garbled_core.circuit import (
    MAX_PORT_WIDTH,
    OP_AND,
    OP_NOT,
    OP_XOR,
    OWNERS,
    REVEALS,
    Bits,
    CircuitBuilder,
    CircuitDescription,
)

try:
    from garbled_core import _core
except ImportError:  # the C++ engine is not built: the oracle alone is checked
    _core = None

U64 = np.uint64


# ---------------------------------------------------------------------------- oracle


def _pack(bits: np.ndarray) -> int:
    """Bool array over instances -> Python int whose bit i is instance i (bit-slicing)."""
    return int.from_bytes(np.packbits(bits.astype(np.uint8), bitorder="little").tobytes(), "little")


def _unpack(value: int, n: int) -> np.ndarray:
    raw = np.frombuffer(value.to_bytes((n + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n]


def _canonical(gates: np.ndarray) -> list[tuple[int, ...]]:
    """Gate rows with XOR/AND operands sorted (they commute, the order is not contractual)."""
    return [
        (op, a, b, out) if op == OP_NOT else (op, min(a, b), max(a, b), out)
        for op, a, b, out in gates.tolist()
    ]


def check_contract(desc: CircuitDescription) -> None:
    """Assert every rule of the C++ description contract, including no constant into an AND."""
    assert isinstance(desc.gates, np.ndarray)
    assert desc.gates.dtype == np.int64
    assert desc.gates.ndim == 2 and desc.gates.shape[1] == 4
    assert desc.gates.flags.c_contiguous
    names = [p[0] for p in desc.inputs]
    assert len(set(names)) == len(names)
    out_names = [p[0] for p in desc.outputs]
    assert len(set(out_names)) == len(out_names)
    for _, owner, width in desc.inputs:
        assert owner in OWNERS
        assert 1 <= width <= MAX_PORT_WIDTH
    first_gate_wire = 1 + sum(p[2] for p in desc.inputs)
    assert desc.num_wires == first_gate_wire + len(desc.gates)
    constant = np.zeros(desc.num_wires, dtype=bool)  # wires whose value is a compile-time const
    constant[0] = True
    for k, (op, a, b, out) in enumerate(desc.gates.tolist()):
        assert out == first_gate_wire + k, "gate outputs must be numbered consecutively"
        assert op in (OP_XOR, OP_AND, OP_NOT)
        assert 0 <= a < out
        if op == OP_NOT:
            assert b == 0
            constant[out] = constant[a]
        else:
            assert 0 <= b < out
            if op == OP_AND:
                assert not constant[a] and not constant[b], f"AND gate {k} reads a constant"
            constant[out] = constant[a] and constant[b]
    for _, reveal, wires in desc.outputs:
        assert reveal in REVEALS
        assert 1 <= len(wires) <= MAX_PORT_WIDTH
        assert all(isinstance(w, int) and 0 <= w < desc.num_wires for w in wires)


def reference_eval(
    desc: CircuitDescription, inputs: dict[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Test oracle: walk the gate list, every wire a Python int holding one bit per instance."""
    n = len(next(iter(inputs.values()))) if inputs else 1
    full = (1 << n) - 1
    wires = [0] * desc.num_wires
    w = 1
    for name, _, width in desc.inputs:
        values = np.asarray(inputs[name], dtype=U64)
        assert values.shape == (n,)
        for i in range(width):
            wires[w] = _pack((values >> U64(i)) & U64(1))
            w += 1
    for op, a, b, out in desc.gates.tolist():
        if op == OP_XOR:
            wires[out] = wires[a] ^ wires[b]
        elif op == OP_AND:
            wires[out] = wires[a] & wires[b]
        else:
            wires[out] = wires[a] ^ full
    result = {}
    for name, _, port_wires in desc.outputs:
        acc = np.zeros(n, dtype=U64)
        for i, wire in enumerate(port_wires):
            acc |= _unpack(wires[wire], n).astype(U64) << U64(i)
        result[name] = acc
    return result


def run(b: CircuitBuilder, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Evaluate with the oracle and, when built, the C++ engine; assert they agree."""
    desc = b.description()
    check_contract(desc)
    inputs = {k: np.asarray(v, dtype=U64) for k, v in inputs.items()}
    got = reference_eval(desc, inputs)
    if _core is not None:
        circ = desc.build()
        assert (circ.and_count, circ.xor_count, circ.not_count) == (
            desc.and_count,
            desc.xor_count,
            desc.not_count,
        )
        assert circ.num_wires == desc.num_wires
        native = circ.evaluate(inputs)
        assert set(native) == set(got)
        for name, values in got.items():
            np.testing.assert_array_equal(np.asarray(native[name], dtype=U64), values, err_msg=name)
    return got


# ---------------------------------------------------------------------------- oracle sanity


def test_oracle_evaluates_hand_written_description():
    # Hand-numbered: a = wire 1, b = wires 2..3; gates define 4, 5, 6.
    desc = CircuitDescription(
        num_wires=7,
        inputs=[("a", "garbler", 1), ("b", "evaluator", 2)],
        gates=np.array([[OP_AND, 1, 2, 4], [OP_XOR, 4, 3, 5], [OP_NOT, 0, 0, 6]], dtype=np.int64),
        outputs=[("y", "both", [5, 6, 0, 1])],
    )
    check_contract(desc)
    a = np.array([0, 1, 1, 1], dtype=U64)
    bb = np.array([3, 3, 1, 2], dtype=U64)
    y = reference_eval(desc, {"a": a, "b": bb})["y"]
    expected = [
        ((ai & bi & 1) ^ (bi >> 1)) | (1 << 1) | (ai << 3) for ai, bi in zip(a, bb, strict=True)
    ]
    assert y.tolist() == expected


# ---------------------------------------------------------------------------- numbering


def test_wire_numbering_inputs_then_gates():
    b = CircuitBuilder("num")
    x = b.input("x", "garbler", 3)
    y = b.input("y", "evaluator", 2)
    k = b.input("k", "carried", 1)
    t = b.and_(x[0], y[0])
    u = b.xor(t, k)
    b.output("u", u.concat(x, y, k))
    desc = b.description()
    check_contract(desc)
    assert desc.inputs == [("x", "garbler", 3), ("y", "evaluator", 2), ("k", "carried", 1)]
    assert _canonical(desc.gates) == [(OP_AND, 1, 4, 7), (OP_XOR, 6, 7, 8)]
    assert desc.num_wires == 9
    assert desc.outputs == [("u", "both", [8, 1, 2, 3, 4, 5, 6])]
    assert desc.name == "num"


def test_inputs_declared_after_gates_are_renumbered():
    b = CircuitBuilder()
    x = b.input("x", "garbler", 2)
    t = b.and_(x[0], x[1])
    y = b.input("y", "evaluator", 1)
    b.output("o", b.xor(t, y))
    desc = b.description()
    check_contract(desc)
    # y is wire 3 even though it was declared after the AND.
    assert _canonical(desc.gates) == [(OP_AND, 1, 2, 4), (OP_XOR, 3, 4, 5)]
    x_vals = np.array([0, 1, 2, 3], dtype=U64)
    y_vals = np.array([1, 0, 1, 1], dtype=U64)
    out = run(b, {"x": x_vals, "y": y_vals})["o"]
    assert out.tolist() == [int(v == 3) ^ int(w) for v, w in zip(x_vals, y_vals, strict=True)]


def test_outputs_may_read_inputs_and_constants():
    b = CircuitBuilder()
    x = b.input("x", "garbler", 4)
    b.output("x", x, reveal="garbler")
    b.output("zero", b.const(0, 3), reveal="evaluator")
    b.output("mixed", b.const(0b101, 3).concat(x[2:]), reveal="shares")
    desc = b.description()
    check_contract(desc)
    assert desc.outputs[0] == ("x", "garbler", [1, 2, 3, 4])
    assert desc.outputs[1] == ("zero", "evaluator", [0, 0, 0])
    # Constant 1 is a single NOT of wire 0 at the end.
    assert desc.gates.tolist() == [[OP_NOT, 0, 0, 5]]
    assert desc.outputs[2] == ("mixed", "shares", [5, 0, 5, 3, 4])
    vals = np.arange(16, dtype=U64)
    out = run(b, {"x": vals})
    assert out["x"].tolist() == vals.tolist()
    assert out["zero"].tolist() == [0] * 16
    assert out["mixed"].tolist() == [0b101 | ((v >> 2) << 3) for v in range(16)]


def test_empty_circuit_description_shape():
    b = CircuitBuilder()
    b.input("x", "garbler", 1)
    desc = b.description()
    assert desc.gates.shape == (0, 4)
    assert desc.gates.dtype == np.int64
    assert desc.num_wires == 2
    assert desc.as_args() == (2, [("x", "garbler", 1)], desc.gates, [], "")


def test_description_types_and_counts():
    b = CircuitBuilder("types")
    x = b.input("x", "garbler", 8)
    y = b.input("y", "evaluator", 8)
    b.output("s", b.add(x, y))
    b.output("n", b.not_(x))
    desc = b.description()
    check_contract(desc)
    assert desc.and_count == 7
    assert desc.not_count == 8
    assert desc.and_count + desc.xor_count + desc.not_count == len(desc.gates)
    assert (b.and_count, b.xor_count, b.not_count) == (
        desc.and_count,
        desc.xor_count,
        desc.not_count,
    )
    for _, _, wires in desc.outputs:
        assert all(type(w) is int for w in wires)


def test_dead_gates_are_pruned():
    b = CircuitBuilder()
    x = b.input("x", "garbler", 8)
    y = b.input("y", "evaluator", 8)
    b.mul(x, y)  # never output
    kept = b.and_(x[0], y[0])
    b.output("o", kept)
    desc = b.description()
    check_contract(desc)
    assert b.and_count > 1
    assert desc.and_count == 1
    assert len(desc.gates) == 1


# ---------------------------------------------------------------------------- folding


def test_constant_folding_rules():
    b = CircuitBuilder()
    x = b.input("x", "garbler", 1)
    zero, one = b.const(0, 1), b.const(1, 1)
    assert b.and_(x, zero).refs == zero.refs
    assert b.and_(x, one).refs == x.refs
    assert b.xor(x, zero).refs == x.refs
    assert b.xor(x, x).refs == zero.refs
    assert b.and_(x, x).refs == x.refs
    assert b.or_(x, x).refs == x.refs
    assert b.or_(x, one).refs == one.refs
    assert b.not_(zero).refs == one.refs
    nx = b.xor(x, one)
    assert b.not_(x).refs == nx.refs  # XOR with 1 is the (shared) NOT gate
    assert b.not_(nx).refs == x.refs  # double negation folds
    assert b.and_(x, nx).refs == zero.refs
    assert b.xor(x, nx).refs == one.refs
    assert b.or_(x, nx).refs == one.refs
    assert b.and_count == 0
    assert b.not_count == 1


def test_structural_hashing_shares_gates():
    b = CircuitBuilder()
    x = b.input("x", "garbler", 2)
    p = b.and_(x[0], x[1])
    q = b.and_(x[1], x[0])
    assert p.refs == q.refs
    y = b.input("y", "garbler", 2)
    # ~a ^ b and a ^ ~b are both NOT(a ^ b): one XOR gate.
    r = b.xor(b.not_(x[0]), y[0])
    s = b.xor(x[0], b.not_(y[0]))
    assert r.refs == s.refs
    assert b.xor(b.not_(x[0]), b.not_(y[0])).refs == b.xor(x[0], y[0]).refs
    assert b.and_count == 1
    assert b.xor_count == 1


def test_all_constant_circuit_has_no_and():
    b = CircuitBuilder()
    b.input("unused", "garbler", 4)
    c1, c2 = b.const(-5, 16), b.const(1234, 16)
    values = {
        "add": (b.add(c1, c2), (-5 + 1234) % 2**16),
        "sub": (b.sub(c1, c2), (-5 - 1234) % 2**16),
        "mul": (b.mul(c1, c2), (-5 * 1234) % 2**16),
        "lt": (b.lt_signed(c1, c2), 1),
        "eq": (b.eq(c1, c1), 1),
        "mux": (b.mux(b.const(1, 1), c1, c2), (-5) % 2**16),
        "pop": (b.popcount(c2), bin(1234).count("1")),
        "neg": (b.neg(c2), -1234 % 2**16),
        "mulc": (b.mul_const(c1, 77), (-5 * 77) % 2**16),
        "abs": (b.abs_signed(c1), 5),
    }
    for name, (bits, expected) in values.items():
        assert bits.const_value() == expected, name
        b.output(name, bits)
    assert b.and_count == 0
    desc = b.description()
    check_contract(desc)
    assert desc.and_count == 0
    assert desc.xor_count == 0
    assert desc.not_count <= 1  # at most the shared NOT(0) for constant-1 output bits
    out = run(b, {"unused": np.zeros(3, dtype=U64)})
    for name, (_, expected) in values.items():
        assert out[name].tolist() == [expected] * 3, name


def test_gadgets_with_constant_operands_never_feed_constants_to_and():
    rng = np.random.default_rng(7)
    b = CircuitBuilder()
    x = b.input("x", "garbler", 16)
    outs = []
    for c in [0, 1, 2, 0x8000, 0xFFFF, 0x1234, 0x00F0]:
        outs += [
            b.add(x, c),
            b.sub(x, c),
            b.sub(c, x),
            b.mul(x, c),
            b.mux(x[3], x, c),
            b.concat(b.lt_unsigned(x, c), b.lt_signed(c, x), b.eq(x, c), b.ge_signed(x, c)),
        ]
    for i, o in enumerate(outs):
        b.output(f"o{i}", o)
    desc = b.description()
    check_contract(desc)  # asserts that no AND reads a constant wire
    vals = rng.integers(0, 2**16, 200, dtype=U64)
    run(b, {"x": vals})


# ---------------------------------------------------------------------------- validation


def test_duplicate_names_rejected():
    b = CircuitBuilder()
    x = b.input("a", "garbler", 4)
    with pytest.raises(ValueError, match="duplicate"):
        b.input("a", "evaluator", 4)
    b.output("y", x)
    with pytest.raises(ValueError, match="duplicate"):
        b.output("y", x)
    # An output may share a name with an input (state kept for a later circuit).
    b.output("a", x, reveal="keep")


@pytest.mark.parametrize("width", [0, -1, MAX_PORT_WIDTH + 1, 1000])
def test_input_width_limits(width):
    b = CircuitBuilder()
    with pytest.raises(ValueError):
        b.input("x", "garbler", width)


def test_width_must_be_int():
    b = CircuitBuilder()
    with pytest.raises(TypeError):
        b.input("x", "garbler", 8.0)
    with pytest.raises(TypeError):
        b.input("x", "garbler", True)


def test_output_width_limits():
    b = CircuitBuilder()
    x = b.input("x", "garbler", 64)
    b.output("ok64", x)
    with pytest.raises(ValueError):
        b.output("wide", x.concat(x[:1]))
    with pytest.raises(ValueError):
        b.output("empty", x[:0])


def test_bad_owner_reveal_and_names():
    b = CircuitBuilder()
    with pytest.raises(ValueError):
        b.input("x", "server", 8)
    with pytest.raises(ValueError):
        b.input("", "garbler", 8)
    x = b.input("x", "garbler", 8)
    with pytest.raises(ValueError):
        b.output("y", x, reveal="public")
    with pytest.raises(TypeError):
        b.output("y", [1, 2, 3])


@pytest.mark.parametrize(
    "op", ["xor", "and_", "or_", "add", "sub", "mul", "lt_unsigned", "lt_signed", "eq"]
)
def test_mismatched_widths_rejected(op):
    b = CircuitBuilder()
    x = b.input("x", "garbler", 8)
    y = b.input("y", "evaluator", 7)
    with pytest.raises(ValueError, match="width"):
        getattr(b, op)(x, y)


def test_mux_selector_must_be_one_bit():
    b = CircuitBuilder()
    x = b.input("x", "garbler", 8)
    with pytest.raises(ValueError):
        b.mux(x[:2], x, x)


def test_bits_from_another_builder_rejected():
    b1, b2 = CircuitBuilder(), CircuitBuilder()
    x = b1.input("x", "garbler", 4)
    y = b2.input("y", "garbler", 4)
    with pytest.raises(ValueError):
        b1.xor(x, y)
    with pytest.raises(ValueError):
        b2.output("x", x)
    with pytest.raises(ValueError):
        x.concat(y)


def test_bits_sequence_behaviour():
    b = CircuitBuilder()
    x = b.input("x", "garbler", 8)
    assert len(x) == x.width == 8
    assert isinstance(x[0], Bits) and len(x[0]) == 1
    assert x[-1].refs == (x.refs[7],)
    assert x[2:5].refs == x.refs[2:5]
    assert [bit.refs[0] for bit in x] == list(x.refs)
    assert x[:3].concat(x[3:]).refs == x.refs
    assert b.concat(x[4:], x[:4]).refs == x.refs[4:] + x.refs[:4]
    assert not x.is_const and x.const_value() is None
    c = b.const(-2, 4)
    assert c.is_const and c.const_value() == 14
    with pytest.raises(TypeError):
        _ = x + x  # arithmetic goes through the builder, never operators


# ---------------------------------------------------------------------------- random soup


@pytest.mark.parametrize("seed", range(6))
def test_random_gate_soup_matches_direct_computation(seed):
    rng = np.random.default_rng(seed)
    n = 257
    b = CircuitBuilder(f"soup{seed}")
    inputs, pool, truth = {}, [], []
    for p, owner in enumerate(OWNERS):
        width = int(rng.integers(1, 12))
        port = b.input(f"in{p}", owner, width)
        vals = rng.integers(0, 2**width, n, dtype=U64)
        inputs[f"in{p}"] = vals
        for i in range(width):
            pool.append(port[i])
            truth.append(((vals >> U64(i)) & U64(1)).astype(bool))
    for c in (0, 1):  # constants take part, so folding is exercised
        pool.append(b.const(c, 1))
        truth.append(np.full(n, bool(c)))
    for _ in range(400):
        kind = rng.integers(0, 5)
        i, j, k = (int(v) for v in rng.integers(0, len(pool), 3))
        if kind == 0:
            pool.append(b.xor(pool[i], pool[j]))
            truth.append(truth[i] ^ truth[j])
        elif kind == 1:
            pool.append(b.and_(pool[i], pool[j]))
            truth.append(truth[i] & truth[j])
        elif kind == 2:
            pool.append(b.not_(pool[i]))
            truth.append(~truth[i])
        elif kind == 3:
            pool.append(b.or_(pool[i], pool[j]))
            truth.append(truth[i] | truth[j])
        else:
            pool.append(b.mux(pool[k], pool[i], pool[j]))
            truth.append(np.where(truth[k], truth[i], truth[j]))
    expected = {}
    for o in range(8):
        picks = [int(v) for v in rng.integers(0, len(pool), int(rng.integers(1, 65)))]
        b.output(f"out{o}", b.concat(*(pool[p] for p in picks)), reveal=REVEALS[o % 5])
        acc = np.zeros(n, dtype=U64)
        for bit, p in enumerate(picks):
            acc |= truth[p].astype(U64) << U64(bit)
        expected[f"out{o}"] = acc
    got = run(b, inputs)
    for name, values in expected.items():
        np.testing.assert_array_equal(got[name], values, err_msg=name)


# ---------------------------------------------------------------------------- native engine


def test_native_circuit_agrees_with_description():
    if _core is None:
        pytest.skip("garbled_core._core is not built")
    b = CircuitBuilder("native")
    x = b.input("x", "garbler", 32)
    y = b.input("y", "evaluator", 32)
    b.output("s", b.add(x, y), reveal="both")
    b.output("lt", b.lt_signed(x, y), reveal="shares")
    circ = b.build()
    desc = b.description()
    # 31 + 32, less the x0 & y0 that the adder's first carry and the first borrow share.
    assert circ.and_count == desc.and_count == 31 + 32 - 1
    assert circ.num_wires == desc.num_wires
    assert isinstance(circ.hash, str) and int(circ.hash, 16) >= 0
    assert b.build().hash == circ.hash  # deterministic: both servers build the same circuit
    other = CircuitBuilder("native")
    x2 = other.input("x", "garbler", 32)
    y2 = other.input("y", "evaluator", 32)
    other.output("s", other.sub(x2, y2), reveal="both")
    other.output("lt", other.lt_signed(x2, y2), reveal="shares")
    assert other.build().hash != circ.hash


# ---------------------------------------------------------------------------- speed


def test_building_a_large_circuit():
    # (how fast it builds is for benchmarks, not a timed test on a shared machine)
    b = CircuitBuilder("big")
    x = b.input("x", "garbler", 32)
    y = b.input("y", "evaluator", 32)
    acc = x
    for i in range(600):  # ~130k gates, above the noise sampler's size
        acc = b.xor(b.add(acc, y), b.rotl(x, i))
    b.output("o", acc)
    desc = b.description()
    assert len(desc.gates) > 100_000
    assert desc.and_count == 600 * 31

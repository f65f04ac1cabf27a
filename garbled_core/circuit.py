"""Boolean circuit builder with integer gadgets for the garbled-circuit engine.

One circuit description is run three ways (plaintext evaluation, garbler, evaluator), as in
swanky's fancy-garbling. The builder hands that description to the C++ constructor
``garbled_core._core.Circuit``; its wire-numbering contract is:

- wire 0 is the constant 0;
- input port bits are wires 1.., consecutively in port order, LSB first;
- gate k (rows ``(op, a, b, out)``, op 0 = XOR, 1 = AND, 2 = NOT) defines wire
  ``1 + total_input_bits + k``; gates are topologically ordered;
- no AND gate ever reads a constant (the builder folds constants away).

Integers are little-endian ``Bits`` (LSB first), two's complement, and arithmetic wraps
modulo ``2**width`` unless a docstring says otherwise. Only AND gates cost anything when
garbled (free-XOR, half-gates), so every gadget states its AND count for independent,
non-constant operands; constant operands and repeated wires can only lower it.
"""

from __future__ import annotations

import functools
import json
import os
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from garbled_core import _core
from garbled_core.depth_arith import _F, _T, DepthArithmetic

__all__ = [
    "ARITHMETICS",
    "DEFAULT_LAYER_COST",
    "MAX_PORT_WIDTH",
    "OP_AND",
    "OP_NOT",
    "OP_XOR",
    "OWNERS",
    "REVEALS",
    "Bits",
    "CircuitBuilder",
    "CircuitDescription",
    "Operand",
    "mul_const_and_count",
]

OP_XOR, OP_AND, OP_NOT = 0, 1, 2
OWNERS = ("garbler", "evaluator", "carried")
REVEALS = ("both", "garbler", "evaluator", "shares", "keep")
MAX_PORT_WIDTH = 64
ARITHMETICS = ("ripple", "depth")
"""Gadget families: ``ripple`` (fewest AND gates) and ``depth`` (fewer AND layers)."""
DEFAULT_LAYER_COST = 8
"""With ``arithmetic="depth"``, one AND layer is worth this many AND gates when a gadget picks
its structure (the least ANDs + layer_cost * depth)."""

# Internal references: 0 and 1 are the constants (_F, _T, defined in garbled_core.depth_arith),
# every other ref is a node (an input bit or a gate output). Final wire ids are assigned only in
# description(), so inputs may be declared after gates and gates that reach no output can be
# dropped.


class Bits:
    """Immutable vector of wire references, LSB first, owned by one builder."""

    __slots__ = ("_owner", "_refs")

    def __init__(self, refs: Iterable[int], owner: CircuitBuilder) -> None:
        self._refs = tuple(refs)
        self._owner = owner

    def __len__(self) -> int:
        return len(self._refs)

    @property
    def width(self) -> int:
        """Number of bits."""
        return len(self._refs)

    @property
    def refs(self) -> tuple[int, ...]:
        """Builder-internal references (0/1 are constants); not final wire ids."""
        return self._refs

    def __getitem__(self, key: int | slice) -> Bits:
        if isinstance(key, slice):
            return Bits(self._refs[key], self._owner)
        return Bits((self._refs[key],), self._owner)

    def __iter__(self) -> Iterator[Bits]:
        return (Bits((r,), self._owner) for r in self._refs)

    def concat(self, *higher: Bits) -> Bits:
        """Return self with ``higher`` parts appended above it (self stays the low bits)."""
        refs = list(self._refs)
        for part in higher:
            if not isinstance(part, Bits) or part._owner is not self._owner:
                raise ValueError("can only concatenate Bits of the same builder")
            refs.extend(part._refs)
        return Bits(refs, self._owner)

    @property
    def is_const(self) -> bool:
        """True if every bit is a compile-time constant."""
        return all(r < 2 for r in self._refs)

    def const_value(self) -> int | None:
        """The unsigned value if every bit is constant, else None."""
        if not self.is_const:
            return None
        return sum(r << i for i, r in enumerate(self._refs))

    def __repr__(self) -> str:
        return f"Bits(width={len(self._refs)}, refs={self._refs!r})"


Operand = Bits | int


@dataclass(frozen=True, eq=False)  # eq would compare the gate arrays elementwise
class CircuitDescription:
    """The raw arguments of ``_core.Circuit``, in constructor order."""

    num_wires: int
    inputs: list[tuple[str, str, int]]
    gates: np.ndarray
    outputs: list[tuple[str, str, list[int]]]
    name: str = ""

    def as_args(self) -> tuple[int, list[tuple[str, str, int]], np.ndarray, list[Any], str]:
        """Positional arguments for ``_core.Circuit``."""
        return (self.num_wires, self.inputs, self.gates, self.outputs, self.name)

    def _count(self, op: int) -> int:
        return int(np.count_nonzero(self.gates[:, 0] == op))

    @property
    def and_count(self) -> int:
        """Number of AND gates."""
        return self._count(OP_AND)

    @property
    def xor_count(self) -> int:
        """Number of XOR gates."""
        return self._count(OP_XOR)

    @property
    def not_count(self) -> int:
        """Number of NOT gates."""
        return self._count(OP_NOT)

    def wire_depths(self) -> np.ndarray:
        """AND-depth of every wire: inputs and wire 0 are 0, an AND gate adds 1, XOR/NOT add 0."""
        depth = np.zeros(self.num_wires, dtype=np.int64)
        for op, a, b, out in self.gates.tolist():
            if op == OP_AND:
                depth[out] = max(depth[a], depth[b]) + 1
            elif op == OP_XOR:
                depth[out] = max(depth[a], depth[b])
            else:
                depth[out] = depth[a]
        return depth

    def output_depths(self) -> dict[str, int]:
        """AND-depth of each output port (its deepest bit)."""
        depth = self.wire_depths()
        return {name: int(max(depth[w] for w in wires)) for name, _, wires in self.outputs}

    def and_depth(self) -> int:
        """Longest path from an input to an output counted in AND gates (XOR and NOT are free):
        the number of AND layers an interactive backend (GMW) needs. One pass over the gates."""
        return max(self.output_depths().values(), default=0)

    def build(self) -> Any:
        """Compile with the C++ engine (imported lazily so the builder works without it)."""

        return _core.Circuit(*self.as_args())

    def save(self, path: str | os.PathLike[str]) -> None:
        """Writes the description to an ``.npz`` file (gates as an array, ports as JSON)."""
        ports = {
            "name": self.name,
            "num_wires": self.num_wires,
            "inputs": self.inputs,
            "outputs": [[n, r, [int(w) for w in ws]] for n, r, ws in self.outputs],
        }
        with Path(path).open("wb") as f:
            np.savez_compressed(f, gates=self.gates, ports=np.array(json.dumps(ports)))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> CircuitDescription:
        """Reads a description written by :meth:`save` (no pickled objects are loaded)."""
        with np.load(path, allow_pickle=False) as data:
            ports = json.loads(str(data["ports"]))
            gates = np.ascontiguousarray(data["gates"], dtype=np.int64)
        if gates.ndim != 2 or (gates.size and gates.shape[1] != 4):
            raise ValueError(f"{path}: gates must have shape (G, 4), not {gates.shape}")
        return cls(
            num_wires=int(ports["num_wires"]),
            inputs=[(str(n), str(o), int(w)) for n, o, w in ports["inputs"]],
            gates=gates,
            outputs=[(str(n), str(r), [int(w) for w in ws]) for n, r, ws in ports["outputs"]],
            name=str(ports["name"]),
        )


def _check_width(width: object, what: str, lo: int = 1, hi: int | None = None) -> int:
    if not isinstance(width, int) or isinstance(width, bool):
        raise TypeError(f"{what} must be an int, got {type(width).__name__}")
    if width < lo or (hi is not None and width > hi):
        bound = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{what} is {width}, must be {bound}")
    return width


def _naf(c: int) -> list[tuple[int, int]]:
    """Non-adjacent form of c >= 0 as (position, digit in {-1, +1})."""
    digits = []
    j = 0
    while c:
        if c & 1:
            d = 2 - (c & 3)  # +1 if c = 1 mod 4, -1 if c = 3 mod 4
            digits.append((j, d))
            c -= d
        c >>= 1
        j += 1
    return digits


@functools.lru_cache(maxsize=4096)
def _mul_plan(c: int, width: int) -> tuple[tuple[tuple[int, int], ...], int]:
    """Cheaper of the binary and NAF digit sets of c mod 2**width, with its AND count.

    Counts are measured on a scratch circuit rather than predicted: structural hashing shares
    carries between the shifted additions, which a closed formula would miss.
    """
    c %= 1 << width
    binary = tuple((j, 1) for j in range(width) if (c >> j) & 1)
    naf = tuple((j, d) for j, d in _naf(c) if j < width)  # digits at j >= width vanish
    best: tuple[tuple[tuple[int, int], ...], int] | None = None
    for digits in (naf, binary):
        scratch = CircuitBuilder()
        xr: list[int] = []  # width fresh input bits, in ports of at most 64
        while len(xr) < width:
            port = f"x{len(xr)}"
            xr += scratch.input(port, "garbler", min(width - len(xr), MAX_PORT_WIDTH)).refs
        refs = scratch._mul_digits(xr, digits, width)
        ands = scratch._live_and_count(refs)
        if best is None or ands < best[1]:
            best = (digits, ands)
    assert best is not None
    return best


def mul_const_and_count(c: int, width: int) -> int:
    """AND gates used by ``CircuitBuilder.mul_const(x, c, width)`` when len(x) >= width."""
    _check_width(width, "width")
    return _mul_plan(c % (1 << width), width)[1]


class CircuitBuilder(DepthArithmetic):
    """Builds one circuit: declare inputs, combine Bits with gadgets, declare outputs.

    ``and_count``/``xor_count``/``not_count`` count gates created so far; the description
    keeps only gates that reach an output, so its counts can be lower.

    ``arithmetic`` picks the adders, subtractors and comparators: ``"ripple"`` (the default,
    fewest AND gates: what garbling pays for) or ``"depth"`` (variable-block carry-increment
    adders and carry-skip comparators sized from the operands' arrival depths, and
    arrival-ordered reduction trees: fewer AND layers, which an interactive backend such as GMW
    pays a round trip each, for about 2x (comparisons) to 3x (additions) the AND gates).
    Bitwise gadgets, muxes and the constant folding are the same in both.
    """

    def __init__(
        self, name: str = "", arithmetic: str = "ripple", layer_cost: float = DEFAULT_LAYER_COST
    ) -> None:
        if arithmetic not in ARITHMETICS:
            raise ValueError(f"arithmetic must be one of {ARITHMETICS}, got {arithmetic!r}")
        self.name = name
        self.arithmetic = arithmetic
        if not isinstance(layer_cost, (int, float)) or not 0 <= layer_cost < float("inf"):
            raise ValueError(f"layer_cost must be a finite number >= 0, got {layer_cost!r}")
        self.layer_cost = layer_cost
        self._by_depth = arithmetic == "depth"
        self._depth: list[int] = [0, 0]  # AND-depth of every node (constants and inputs: 0)
        self.and_count = 0
        self.xor_count = 0
        self.not_count = 0
        self._n_nodes = 2  # nodes 0 and 1 are the constants
        self._g_op: list[int] = []
        self._g_a: list[int] = []
        self._g_b: list[int] = []
        self._g_out: list[int] = []
        # Structural hashing: identical gates are built once.
        self._xor_cache: dict[tuple[int, int], int] = {}
        self._and_cache: dict[tuple[int, int], int] = {}
        # node <-> its complement, both ways, so NOT(NOT x) = x and x ^ ~x folds.
        self._neg: dict[int, int] = {}
        self._not_inner: dict[int, int] = {}  # NOT-gate output -> its input
        self._inputs: list[tuple[str, str, tuple[int, ...]]] = []
        self._outputs: list[tuple[str, str, tuple[int, ...]]] = []
        # describe_with_slack: each structure-picking gadget's outputs, and its deadline
        self._gadget_outputs: list[tuple[int, ...]] = []
        self._deadlines: list[int] | None = None
        self._deadline_now: int | None = None

    # ----------------------------------------------------------------- bit-level core

    def _gate(self, op: int, a: int, b: int) -> int:
        node = self._n_nodes
        self._n_nodes += 1
        self._g_op.append(op)
        self._g_a.append(a)
        self._g_b.append(b)
        self._g_out.append(node)
        d = self._depth
        d.append(max(d[a], d[b]) + 1 if op == OP_AND else max(d[a], d[b]))
        return node

    def _not(self, a: int) -> int:
        if a < 2:
            return 1 - a
        node = self._neg.get(a)
        if node is None:
            node = self._gate(OP_NOT, a, 0)
            self._neg[a] = node
            self._neg[node] = a
            self._not_inner[node] = a
            self.not_count += 1
        return node

    def _xor(self, a: int, b: int) -> int:
        if a == b:
            return _F
        if a < 2:
            return b if a == _F else self._not(b)
        if b < 2:
            return a if b == _F else self._not(a)
        # Pull NOTs out (~a ^ b = ~(a ^ b)) so XORs of complements share one gate.
        inner_a = self._not_inner.get(a)
        inner_b = self._not_inner.get(b)
        if inner_a is not None or inner_b is not None:
            flip = (inner_a is not None) != (inner_b is not None)
            r = self._xor(a if inner_a is None else inner_a, b if inner_b is None else inner_b)
            return self._not(r) if flip else r
        if self._neg.get(a) == b:
            return _T
        key = (a, b) if a < b else (b, a)
        node = self._xor_cache.get(key)
        if node is None:
            node = self._gate(OP_XOR, key[0], key[1])
            self._xor_cache[key] = node
            self.xor_count += 1
        return node

    def _and(self, a: int, b: int) -> int:
        if a == b:
            return a
        if a < 2:
            return b if a == _T else _F
        if b < 2:
            return a if b == _T else _F
        if self._neg.get(a) == b:
            return _F
        key = (a, b) if a < b else (b, a)
        node = self._and_cache.get(key)
        if node is None:
            node = self._gate(OP_AND, key[0], key[1])
            self._and_cache[key] = node
            self.and_count += 1
        return node

    def _or(self, a: int, b: int) -> int:
        # a | b = a ^ b ^ (a & b): one AND, no NOTs.
        return self._xor(self._xor(a, b), self._and(a, b))

    def _maj(self, a: int, b: int, c: int) -> int:
        """Carry of a full adder, 1 AND."""
        for k, u, v in ((a, b, c), (b, a, c), (c, a, b)):
            if k == _F:
                return self._and(u, v)
            if k == _T:
                return self._or(u, v)
        return self._xor(c, self._and(self._xor(a, c), self._xor(b, c)))

    def _borrow(self, a: int, y: int, b: int) -> int:
        """Borrow out of a - y - b, i.e. maj(~a, y, b), 1 AND."""
        if a < 2:
            return self._or(y, b) if a == _F else self._and(y, b)
        if y < 2:  # y=0: ~a & b = b ^ (a & b); y=1: ~a | b = ~(a ^ (a & b))
            ab = self._and(a, b)
            return self._xor(b, ab) if y == _F else self._not(self._xor(a, ab))
        if b < 2:  # b=0: ~a & y = y ^ (a & y); b=1: ~a | y = ~(a ^ (a & y))
            ay = self._and(a, y)
            return self._xor(y, ay) if b == _F else self._not(self._xor(a, ay))
        return self._xor(y, self._and(self._xor(a, b), self._xor(y, b)))

    def _or_tree(self, refs: Sequence[int]) -> int:
        """OR of all refs, len-1 ANDs, balanced (depth log2 len; with ``arithmetic="depth"``
        the two earliest-ready operands are joined first, so late inputs wait less)."""
        level = list(refs)
        if not level:
            return _F
        if self._by_depth:
            return self._earliest_first(level, self._or)
        while len(level) > 1:
            nxt = [self._or(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
            if len(level) % 2:
                nxt.append(level[-1])
            level = nxt
        return level[0]

    # ------------------------------------------------------------------ operands

    def _bits(self, refs: Iterable[int]) -> Bits:
        return Bits(refs, self)

    def _refs(self, x: Operand, width: int | None = None) -> tuple[int, ...]:
        if isinstance(x, Bits):
            if x._owner is not self:
                raise ValueError("Bits belong to another CircuitBuilder")
            if width is not None and len(x) != width:
                raise ValueError(f"width mismatch: {len(x)} != {width}")
            return x._refs
        if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
            if width is None:
                raise TypeError("an int operand needs a Bits operand to take its width from")
            v = int(x) % (1 << width)  # two's complement for negative constants
            return tuple((v >> i) & 1 for i in range(width))
        raise TypeError(f"expected Bits or int, got {type(x).__name__}")

    def _pair(self, x: Operand, y: Operand) -> tuple[tuple[int, ...], tuple[int, ...]]:
        if isinstance(x, Bits):
            xr = self._refs(x)
            return xr, self._refs(y, len(xr))
        yr = self._refs(y)
        return self._refs(x, len(yr)), yr

    def _bit(self, s: Operand) -> int:
        refs = self._refs(s, 1)
        if len(refs) != 1:
            raise ValueError(f"expected a 1-bit selector, got width {len(refs)}")
        return refs[0]

    # ------------------------------------------------------------------ ports

    def input(self, name: str, owner: str, width: int) -> Bits:
        """Declare an input port of ``width`` (1..64) bits owned by garbler/evaluator/carried."""
        if not isinstance(name, str) or not name:
            raise ValueError("port name must be a non-empty string")
        if any(p[0] == name for p in self._inputs):
            raise ValueError(f"duplicate input port name {name!r}")
        if owner not in OWNERS:
            raise ValueError(f"owner must be one of {OWNERS}, got {owner!r}")
        _check_width(width, f"input {name!r} width", 1, MAX_PORT_WIDTH)
        start = self._n_nodes
        self._n_nodes += width
        self._depth.extend([0] * width)
        refs = tuple(range(start, start + width))
        self._inputs.append((name, owner, refs))
        return self._bits(refs)

    def output(self, name: str, bits: Bits, reveal: str = "both") -> None:
        """Declare an output port (1..64 bits, LSB first) revealed as ``reveal``."""
        if not isinstance(name, str) or not name:
            raise ValueError("port name must be a non-empty string")
        if any(p[0] == name for p in self._outputs):
            raise ValueError(f"duplicate output port name {name!r}")
        if reveal not in REVEALS:
            raise ValueError(f"reveal must be one of {REVEALS}, got {reveal!r}")
        if not isinstance(bits, Bits):
            raise TypeError(f"output {name!r} needs Bits, got {type(bits).__name__}")
        refs = self._refs(bits)
        _check_width(len(refs), f"output {name!r} width", 1, MAX_PORT_WIDTH)
        self._outputs.append((name, reveal, refs))

    def const(self, value: int, width: int) -> Bits:
        """Constant ``value mod 2**width`` (negative values in two's complement); no gates."""
        _check_width(width, "width", 0)
        return self._bits(self._refs(value, width))

    def concat(self, *parts: Bits) -> Bits:
        """Concatenate, first part lowest."""
        refs: list[int] = []
        for p in parts:
            refs.extend(self._refs(p))
        return self._bits(refs)

    def depth(self, x: Bits) -> int:
        """AND-depth of the deepest bit of x so far (0 for inputs and constants)."""
        return max((self._depth[r] for r in self._refs(x)), default=0)

    # ------------------------------------------------------------------ description

    def description(self) -> CircuitDescription:
        """Number the wires per the C++ contract, keeping only gates that reach an output."""
        live = bytearray(self._n_nodes)
        for _, _, refs in self._outputs:
            for r in refs:
                live[r] = 1
        g_op, g_a, g_b, g_out = self._g_op, self._g_a, self._g_b, self._g_out
        for k in range(len(g_op) - 1, -1, -1):  # gates are topological, so one reverse pass
            if live[g_out[k]]:
                live[g_a[k]] = 1
                if g_op[k] != OP_NOT:
                    live[g_b[k]] = 1

        wire = np.zeros(len(live), dtype=np.int64)
        next_wire = 1
        inputs: list[tuple[str, str, int]] = []
        for name, owner, refs in self._inputs:
            wire[list(refs)] = np.arange(next_wire, next_wire + len(refs))
            next_wire += len(refs)
            inputs.append((name, owner, len(refs)))

        out = np.asarray(g_out, dtype=np.int64)
        keep = np.frombuffer(bytes(live), dtype=np.uint8)[out] != 0
        out = out[keep]
        op = np.asarray(g_op, dtype=np.int64)[keep]
        a = np.asarray(g_a, dtype=np.int64)[keep]
        b = np.asarray(g_b, dtype=np.int64)[keep]
        wire[out] = np.arange(next_wire, next_wire + len(out))
        gates = np.stack([op, wire[a], wire[b], wire[out]], axis=1).reshape(-1, 4)
        num_wires = next_wire + len(out)

        if live[_T]:
            # Constant 1 appears only at outputs (gates never read constants): NOT of wire 0.
            wire[_T] = num_wires
            gates = np.concatenate([gates, np.array([[OP_NOT, 0, 0, num_wires]], dtype=np.int64)])
            num_wires += 1
        wire[_F] = 0

        outputs = [(name, rev, wire[list(refs)].tolist()) for name, rev, refs in self._outputs]
        return CircuitDescription(
            num_wires=int(num_wires),
            inputs=inputs,
            gates=np.ascontiguousarray(gates, dtype=np.int64),
            outputs=outputs,
            name=self.name,
        )

    def build(self) -> Any:
        """Compile the description into a ``garbled_core._core.Circuit``."""
        return self.description().build()

    # ------------------------------------------------------------------ bitwise

    def xor(self, x: Operand, y: Operand) -> Bits:
        """Bitwise XOR, free."""
        xr, yr = self._pair(x, y)
        return self._bits(map(self._xor, xr, yr))

    def and_(self, x: Operand, y: Operand) -> Bits:
        """Bitwise AND, w ANDs, depth 1."""
        xr, yr = self._pair(x, y)
        return self._bits(map(self._and, xr, yr))

    def or_(self, x: Operand, y: Operand) -> Bits:
        """Bitwise OR, w ANDs, depth 1."""
        xr, yr = self._pair(x, y)
        return self._bits(map(self._or, xr, yr))

    def not_(self, x: Bits) -> Bits:
        """Bitwise NOT, free."""
        return self._bits(map(self._not, self._refs(x)))

    def xor_reduce(self, x: Bits) -> Bits:
        """Parity of x (1 bit), free."""
        acc = _F
        for r in self._refs(x):
            acc = self._xor(acc, r)
        return self._bits((acc,))

    def or_reduce(self, x: Bits) -> Bits:
        """OR of all bits (1 bit), w-1 ANDs, depth ceil(log2 w) (balanced tree)."""
        return self._bits((self._or_tree(self._refs(x)),))

    def and_reduce(self, x: Bits) -> Bits:
        """AND of all bits (1 bit), w-1 ANDs, depth ceil(log2 w) (balanced tree)."""
        inv = [self._not(r) for r in self._refs(x)]
        return self._bits((self._not(self._or_tree(inv)),))

    def mux(self, sel: Operand, x: Operand, y: Operand) -> Bits:
        """``sel ? x : y`` for a 1-bit sel, w ANDs, depth 1 (y ^ (sel & (x ^ y)))."""
        s = self._bit(sel)
        xr, yr = self._pair(x, y)
        return self._bits(
            self._xor(q, self._and(s, self._xor(p, q))) for p, q in zip(xr, yr, strict=True)
        )

    # ------------------------------------------------------------------ arithmetic

    def _add_refs(
        self, xr: Sequence[int], yr: Sequence[int], carry: int, want_carry: bool
    ) -> tuple[list[int], int]:
        if self._by_depth:
            return self._add_fast(xr, yr, carry, want_carry)
        return self._add_refs_ripple(xr, yr, carry, want_carry)

    def _add_refs_ripple(
        self, xr: Sequence[int], yr: Sequence[int], carry: int, want_carry: bool
    ) -> tuple[list[int], int]:
        out = []
        last = len(xr) - 1
        for i, (p, q) in enumerate(zip(xr, yr, strict=True)):
            out.append(self._xor(self._xor(p, q), carry))
            if i < last or want_carry:
                carry = self._maj(p, q, carry)
        return out, carry

    def _sub_refs(
        self, xr: Sequence[int], yr: Sequence[int], borrow: int, want_diff: bool, want_borrow: bool
    ) -> tuple[list[int], int]:
        if self._by_depth:
            if not want_diff:
                return [], self._borrow_out_fast(xr, yr, borrow)
            # x - y - b = x + ~y + ~b; the borrow out is the complement of the carry out
            diff, carry = self._add_fast(
                xr, [self._not(q) for q in yr], self._not(borrow), want_borrow
            )
            return diff, self._not(carry)
        out = []
        last = len(xr) - 1
        for i, (p, q) in enumerate(zip(xr, yr, strict=True)):
            if want_diff:
                out.append(self._xor(self._xor(p, q), borrow))
            if i < last or want_borrow:
                borrow = self._borrow(p, q, borrow)
        return out, borrow

    def add(self, x: Operand, y: Operand) -> Bits:
        """x + y mod 2**w: ripple carry, w-1 ANDs at depth w-1; ``arithmetic="depth"``: a
        carry-increment chain, at most 3w ANDs at depth about sqrt(2w) (16 bits: 37 at 6)."""
        xr, yr = self._pair(x, y)
        return self._bits(self._add_refs(xr, yr, _F, False)[0])

    def add_with_carry(
        self, x: Operand, y: Operand, carry_in: Operand | None = None
    ) -> tuple[Bits, Bits]:
        """(x + y + carry_in mod 2**w, carry out), w ANDs at depth w; ``arithmetic="depth"``: as
        :meth:`add`."""
        xr, yr = self._pair(x, y)
        c = _F if carry_in is None else self._bit(carry_in)
        s, c = self._add_refs(xr, yr, c, True)
        return self._bits(s), self._bits((c,))

    def sub(self, x: Operand, y: Operand) -> Bits:
        """x - y mod 2**w: ripple borrow, w-1 ANDs at depth w-1; ``arithmetic="depth"``: as
        x + ~y + 1 by the carry-increment chain of :meth:`add`."""
        xr, yr = self._pair(x, y)
        return self._bits(self._sub_refs(xr, yr, _F, True, False)[0])

    def sub_with_borrow(
        self, x: Operand, y: Operand, borrow_in: Operand | None = None
    ) -> tuple[Bits, Bits]:
        """(x - y - borrow_in mod 2**w, borrow out = unsigned x < y + borrow_in), w ANDs at depth w;
        ``arithmetic="depth"``: as :meth:`sub`."""
        xr, yr = self._pair(x, y)
        b = _F if borrow_in is None else self._bit(borrow_in)
        d, b = self._sub_refs(xr, yr, b, True, True)
        return self._bits(d), self._bits((b,))

    def neg(self, x: Bits) -> Bits:
        """-x mod 2**w, max(w-2, 0) ANDs at that depth (borrow chain of 0 - x is an OR chain);
        ``arithmetic="depth"``: about 2w ANDs at depth about sqrt(2w)."""
        xr = self._refs(x)
        return self._bits(self._sub_refs((_F,) * len(xr), xr, _F, True, False)[0])

    def add_const(self, x: Bits, c: int) -> Bits:
        """x + c mod 2**w: max(w-2-t, 0) ANDs, t = trailing zeros of c mod 2**w (0 if c = 0),
        at that depth (ripple); ``arithmetic="depth"``: as :meth:`add`."""
        return self.add(x, c)

    def sub_const(self, x: Bits, c: int) -> Bits:
        """x - c mod 2**w, as add_const(x, -c)."""
        return self.add(x, -c)

    def cond_neg(self, x: Bits, sel: Operand) -> Bits:
        """``sel ? -x : x`` as (x ^ sel) + sel, w-1 ANDs at depth w-1; ``arithmetic="depth"``: an
        increment by the carry-increment chain, about 2w ANDs at depth about sqrt(2w)."""
        s = self._bit(sel)
        xr = self._refs(x)
        if self._by_depth:
            flipped = [self._xor(r, s) for r in xr]
            return self._bits(self._add_fast(flipped, [_F] * len(xr), s, False)[0])
        carry = s
        out = []
        for i, r in enumerate(xr):
            t = self._xor(r, s)
            out.append(self._xor(t, carry))
            if i < len(xr) - 1:
                carry = self._and(t, carry)
        return self._bits(out)

    def abs_signed(self, x: Bits) -> Bits:
        """|x| for signed x, as :meth:`cond_neg`; the minimum value maps to itself (wraps)."""
        return self.cond_neg(x, x[-1])

    def mul(self, x: Operand, y: Operand) -> Bits:
        """x * y mod 2**w (same for signed and unsigned), schoolbook, w*w - w + 1 ANDs (w >= 1),
        depth about 2w (rows accumulated by :meth:`add`, so more gates with ``"depth"``)."""
        xr, yr = self._pair(x, y)
        w = len(xr)
        acc: list[int] = [_F] * w
        for j, q in enumerate(yr):
            row = [_F] * j + [self._and(p, q) for p in xr[: w - j]]
            acc = row if j == 0 else self._add_refs(acc, row, _F, False)[0]
        return self._bits(acc)

    def _mul_digits(
        self, xr: Sequence[int], digits: Sequence[tuple[int, int]], width: int
    ) -> list[int]:
        """Sum of d * (x << j) mod 2**width, highest digit first.

        Highest first so that a subtracted term lies below the accumulator's lowest
        non-constant bit, where its borrow chain starts one bit late.
        """
        acc: list[int] | None = None  # None while the accumulator is the constant 0
        for j, d in sorted(digits, reverse=True):
            term = [_F] * j + list(xr[: width - j])
            if acc is None and d > 0:
                acc = term
            elif d > 0:
                acc = self._add_refs(acc, term, _F, False)[0]  # type: ignore[arg-type]
            else:
                base = [_F] * width if acc is None else acc
                acc = self._sub_refs(base, term, _F, True, False)[0]
        return [_F] * width if acc is None else acc

    def _live_and_count(self, refs: Sequence[int]) -> int:
        """AND gates that ``refs`` depend on."""
        seen: set[int] = set()
        stack = [r for r in refs if r >= 2]
        gate_of = {n: k for k, n in enumerate(self._g_out)}
        ands = 0
        while stack:
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            k = gate_of.get(n)
            if k is None:
                continue  # input bit
            op = self._g_op[k]
            ands += op == OP_AND
            stack.append(self._g_a[k])
            if op != OP_NOT:
                stack.append(self._g_b[k])
        return ands

    def mul_const(self, x: Bits, c: int, width: int | None = None, *, signed: bool = True) -> Bits:
        """x * c mod 2**width by shifts and adds/subtracts over the binary or NAF digits of c.

        x is first sign- (``signed``) or zero-extended, or truncated, to ``width``
        (default len(x)). AND count: ``mul_const_and_count(c, width)`` when len(x) >= width
        (e.g. 0 for c = 2**k, width-2 for c = 3, 7 or -1), at most that otherwise; never more
        than shift-and-add, sum of (width-1-j) over the set bits j of c but the lowest.
        """
        width = len(self._refs(x)) if width is None else _check_width(width, "width")
        xr = self._refs(self.resize(x, width, signed=signed))
        digits, _ = _mul_plan(int(c) % (1 << width), width)
        return self._bits(self._mul_digits(xr, digits, width))

    def popcount(self, x: Bits) -> Bits:
        """Number of set bits, width w.bit_length(); w - popcount(w) ANDs (optimal).

        Carry-save counting: per weight column, full adders (1 AND) while >= 3 bits, a half
        adder (1 AND) at 2 bits; each carry goes to the next column. Depth at most about 2 log2 w
        (64 bits: 6; ``arithmetic="depth"``: the earliest-ready bits first, same gates).
        """
        xr = self._refs(x)
        out_width = len(xr).bit_length()
        cols: list[deque[int]] = [deque(xr)]
        out: list[int] = []
        k = 0
        while k < len(cols):
            col = cols[k]
            while len(col) >= 2:
                if self._by_depth:  # the earliest-ready bits first (same gate count)
                    col = deque(sorted(col, key=self._depth.__getitem__))
                if k + 1 == len(cols):
                    cols.append(deque())
                if len(col) >= 3:
                    p, q, r = col.popleft(), col.popleft(), col.popleft()
                    col.append(self._xor(self._xor(p, q), r))
                    cols[k + 1].append(self._maj(p, q, r))
                else:
                    p, q = col.popleft(), col.popleft()
                    col.append(self._xor(p, q))
                    cols[k + 1].append(self._and(p, q))
            out.append(col[0] if col else _F)
            k += 1
        out = (out + [_F] * out_width)[:out_width]
        return self._bits(out)

    # ------------------------------------------------------------------ comparisons

    def lt_unsigned(self, x: Operand, y: Operand) -> Bits:
        """Unsigned x < y (borrow out of x - y): w ANDs at depth w (ripple); ``arithmetic=
        "depth"``: a carry-skip chain or prefix tree, at most 3w ANDs (64 bits: 135 at depth 8)."""
        xr, yr = self._pair(x, y)
        return self._bits((self._sub_refs(xr, yr, _F, False, True)[1],))

    def lt_signed(self, x: Operand, y: Operand) -> Bits:
        """Signed x < y, w ANDs at depth w; ``arithmetic="depth"``: as :meth:`lt_unsigned`."""
        xr, yr = self._pair(x, y)
        if not xr:
            return self._bits((_F,))
        _, b = self._sub_refs(xr[:-1], yr[:-1], _F, False, True)
        # Borrow with both sign bits flipped (signed -> unsigned order), simplified so no NOTs:
        # x_s ^ ((x_s ^ b) & (y_s ^ b)).
        xs, ys = xr[-1], yr[-1]
        return self._bits((self._xor(xs, self._and(self._xor(xs, b), self._xor(ys, b))),))

    def le_unsigned(self, x: Operand, y: Operand) -> Bits:
        """Unsigned x <= y, as :meth:`lt_unsigned`."""
        return self.not_(self.lt_unsigned(y, x))

    def and_le_unsigned(self, enable: Operand, x: Operand, y: Operand) -> Bits:
        """``enable`` AND unsigned x <= y: :meth:`le_unsigned` and one AND; with
        ``arithmetic="depth"`` the enable joins the comparison's last level where its tree is
        sparse (no layer more: en & (x <= y) = en ^ (en & [y < x]))."""
        en = self._bit(enable)
        if not self._by_depth:
            return self.and_(enable, self.le_unsigned(x, y))
        xr, yr = self._pair(x, y)
        return self._bits((self._xor(en, self._borrow_out_fast(yr, xr, _F, en)),))

    def gt_unsigned(self, x: Operand, y: Operand) -> Bits:
        """Unsigned x > y, as :meth:`lt_unsigned`."""
        return self.lt_unsigned(y, x)

    def ge_unsigned(self, x: Operand, y: Operand) -> Bits:
        """Unsigned x >= y, as :meth:`lt_unsigned`."""
        return self.not_(self.lt_unsigned(x, y))

    def le_signed(self, x: Operand, y: Operand) -> Bits:
        """Signed x <= y, as :meth:`lt_signed`."""
        return self.not_(self.lt_signed(y, x))

    def gt_signed(self, x: Operand, y: Operand) -> Bits:
        """Signed x > y, as :meth:`lt_signed`."""
        return self.lt_signed(y, x)

    def ge_signed(self, x: Operand, y: Operand) -> Bits:
        """Signed x >= y, as :meth:`lt_signed`."""
        return self.not_(self.lt_signed(x, y))

    def eq(self, x: Operand, y: Operand) -> Bits:
        """x == y, w-1 ANDs at depth ceil(log2 w) (OR tree over x ^ y, negated)."""
        xr, yr = self._pair(x, y)
        return self._bits((self._not(self._or_tree(list(map(self._xor, xr, yr)))),))

    def ne(self, x: Operand, y: Operand) -> Bits:
        """x != y, w-1 ANDs at depth ceil(log2 w)."""
        return self.not_(self.eq(x, y))

    def is_zero(self, x: Bits) -> Bits:
        """x == 0, w-1 ANDs at depth ceil(log2 w)."""
        return self._bits((self._not(self._or_tree(self._refs(x))),))

    def is_negative(self, x: Bits) -> Bits:
        """Sign bit of x, free."""
        xr = self._refs(x)
        if not xr:
            raise ValueError("is_negative of an empty Bits")
        return self._bits(xr[-1:])

    def min_signed(self, x: Operand, y: Operand) -> Bits:
        """Signed minimum: :meth:`lt_signed` and a mux (w ANDs, one more layer)."""
        return self.mux(self.lt_signed(x, y), x, y)

    def max_signed(self, x: Operand, y: Operand) -> Bits:
        """Signed maximum: :meth:`lt_signed` and a mux (w ANDs, one more layer)."""
        return self.mux(self.lt_signed(x, y), y, x)

    def min_unsigned(self, x: Operand, y: Operand) -> Bits:
        """Unsigned minimum: :meth:`lt_unsigned` and a mux (w ANDs, one more layer)."""
        return self.mux(self.lt_unsigned(x, y), x, y)

    def max_unsigned(self, x: Operand, y: Operand) -> Bits:
        """Unsigned maximum: :meth:`lt_unsigned` and a mux (w ANDs, one more layer)."""
        return self.mux(self.lt_unsigned(x, y), y, x)

    # ------------------------------------------------------------------ wiring (free)

    def shl(self, x: Bits, k: int) -> Bits:
        """x << k mod 2**w, free."""
        xr = self._refs(x)
        k = min(_check_width(k, "shift", 0), len(xr))
        return self._bits((_F,) * k + xr[: len(xr) - k])

    def shr_logical(self, x: Bits, k: int) -> Bits:
        """Unsigned x >> k, free."""
        xr = self._refs(x)
        k = min(_check_width(k, "shift", 0), len(xr))
        return self._bits(xr[k:] + (_F,) * k)

    def shr_arith(self, x: Bits, k: int) -> Bits:
        """Signed x >> k (floor division by 2**k), free."""
        xr = self._refs(x)
        if not xr:
            return self._bits(())
        k = min(_check_width(k, "shift", 0), len(xr))
        return self._bits(xr[k:] + (xr[-1],) * k)

    def rotl(self, x: Bits, k: int) -> Bits:
        """Rotate left by k, free."""
        xr = self._refs(x)
        if not xr:
            return self._bits(())
        k %= len(xr)
        return self._bits(xr[len(xr) - k :] + xr[: len(xr) - k])

    def rotr(self, x: Bits, k: int) -> Bits:
        """Rotate right by k, free."""
        return self.rotl(x, -k)

    def zero_extend(self, x: Bits, width: int) -> Bits:
        """Zero-extend to width >= len(x), free."""
        xr = self._refs(x)
        _check_width(width, "width", len(xr))
        return self._bits(xr + (_F,) * (width - len(xr)))

    def sign_extend(self, x: Bits, width: int) -> Bits:
        """Sign-extend to width >= len(x) (len(x) >= 1), free."""
        xr = self._refs(x)
        if not xr:
            raise ValueError("sign_extend of an empty Bits")
        _check_width(width, "width", len(xr))
        return self._bits(xr + (xr[-1],) * (width - len(xr)))

    def truncate(self, x: Bits, width: int) -> Bits:
        """Low ``width`` bits (width <= len(x)), free."""
        xr = self._refs(x)
        _check_width(width, "width", 0, len(xr))
        return self._bits(xr[:width])

    def resize(self, x: Bits, width: int, *, signed: bool) -> Bits:
        """Extend (sign or zero) or truncate to ``width``, free."""
        if width <= len(x):
            return self.truncate(x, width)
        return self.sign_extend(x, width) if signed else self.zero_extend(x, width)

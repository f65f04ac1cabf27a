"""Depth-aware arithmetic for :class:`garbled_core.circuit.CircuitBuilder` (``arithmetic="depth"``).

An interactive backend (GMW) pays one round trip per layer of AND gates, garbling pays per AND
gate. These gadgets trade AND gates for layers, choosing each structure from the AND-depths at
which its operand bits are ready (the builder tracks every node's depth), by the least
``ANDs + layer_cost * depth``:

- adders: carry-increment chains (a ripple block, then blocks that ripple from carry 0 and keep
  the prefix-ANDs of their propagate bits, ready when the running carry reaches them);
- borrows and comparisons: carry-skip chains (block borrow and block equality, joined by
  B = G ^ (E & B_in)) or balanced block trees (parallel prefix over blocks);
- reductions (OR/AND of many bits) joining the two earliest-ready operands first.

Generate and propagate terms joined by XOR instead of OR wherever they are exclusive, so a
join costs one AND.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

__all__ = ["DepthArithmetic"]

_F, _T = 0, 1  # the builder's constant references (see garbled_core.circuit)


class DepthArithmetic:
    """Mixin of :class:`~garbled_core.circuit.CircuitBuilder`: the ``arithmetic="depth"``
    gadgets over builder references (ints; 0 and 1 are the constants)."""

    if TYPE_CHECKING:
        _depth: list[int]
        layer_cost: float
        _deadlines: list[int] | None
        _deadline_now: int | None
        _gadget_outputs: list[tuple[int, ...]]

        def _not(self, a: int) -> int: ...
        def _xor(self, a: int, b: int) -> int: ...
        def _and(self, a: int, b: int) -> int: ...
        def _maj(self, a: int, b: int, c: int) -> int: ...
        def _borrow(self, a: int, y: int, b: int) -> int: ...
        def _add_refs_ripple(
            self, xr: Sequence[int], yr: Sequence[int], carry: int, want_carry: bool
        ) -> tuple[list[int], int]: ...

    def _earliest_first(self, refs: Sequence[int], join: Any) -> int:
        """Reduce refs with an associative, commutative 1-AND ``join``, always joining the two
        operands that are ready earliest (Huffman order on AND-depth): len-1 ANDs, depth at most
        ceil(log2 len) above the latest input, less when inputs arrive at different depths."""
        heap = [(self._depth[r], k, r) for k, r in enumerate(refs)]
        heapq.heapify(heap)
        tie = len(heap)
        while len(heap) > 1:
            _, _, a = heapq.heappop(heap)
            _, _, c = heapq.heappop(heap)
            r = join(a, c)
            heapq.heappush(heap, (self._depth[r], tie, r))
            tie += 1
        return heap[0][2]

    def _and_tree(self, refs: Sequence[int]) -> int:
        """AND of all refs, len-1 ANDs, earliest-ready operands first."""
        return self._earliest_first(refs, self._and) if refs else _T

    def _ready(self, *refs: int) -> int:
        return max(self._depth[r] for r in refs)

    def _block_plan(self, arrive: Sequence[int], start: int, first: int) -> list[int]:
        """Block sizes (LSB first) of a carry-skip/carry-increment chain over bits with ready
        depths ``arrive``: a ripple block of ``first`` bits from a carry ready at ``start``,
        then blocks as large as can be ready (ripple from carry 0, one level a bit, estimated)
        when the running carry reaches them."""
        n = len(arrive)
        sizes = [first]
        t = start
        for i in range(first):
            t = max(t, arrive[i]) + 1
        pos = first
        while pos < n:
            size, ready = 0, 0
            while pos + size < n:
                cand = max(ready, arrive[pos + size]) + 1
                if size and cand > t:
                    break
                ready, size = cand, size + 1
            sizes.append(size)
            t = max(t, ready) + 1
            pos += size
        return sizes

    def _chain_depth(self, arrive: Sequence[int], start: int, sizes: Sequence[int]) -> int:
        t = start
        for i in range(sizes[0]):
            t = max(t, arrive[i]) + 1
        pos = sizes[0]
        for size in sizes[1:]:
            ready = 0
            for i in range(pos, pos + size):
                ready = max(ready, arrive[i]) + 1
            t = max(t, ready) + 1
            pos += size
        return t

    def _pick(self, options: Sequence[tuple[int, int, Any]]) -> Any:
        """The plan of the least ``ands + layer_cost * depth`` (estimates), then least depth;
        under a deadline (:func:`garbled_core.depth_search.describe_with_slack`) the fewest ANDs
        ready by it, else the shallowest."""
        deadline = self._deadline_now
        if deadline is not None:
            ready = [o for o in options if o[0] <= deadline]
            if ready:
                return min(ready, key=lambda o: (o[1], o[0]))[2]
            return min(options, key=lambda o: (o[0], o[1]))[2]
        return min(options, key=lambda o: (o[1] + self.layer_cost * o[0], o[0]))[2]

    def _gadget(self, build: Any) -> Any:
        """Runs one structure-picking gadget under its deadline (if any) and records its
        outputs (for the deadlines of a second build)."""
        index = len(self._gadget_outputs)
        deadlines = self._deadlines
        self._deadline_now = (
            deadlines[index] if deadlines is not None and index < len(deadlines) else None
        )
        out = build()
        self._deadline_now = None
        refs = (out,) if isinstance(out, int) else (*out[0], out[1])
        self._gadget_outputs.append(tuple(refs))
        return out

    def _tree_estimate(self, arrive: Sequence[int], start: int, size: int) -> tuple[int, int]:
        """(depth, ANDs) of :meth:`_borrow_tree` with blocks of ``size`` bits."""
        groups: list[tuple[int, int | None]] = []
        ands = 0
        for lo in range(0, len(arrive), size):
            bits = arrive[lo : lo + size]
            t = start if lo == 0 else 0
            for r in bits:
                t = max(t, r) + 1
            ands += len(bits)
            if lo == 0:
                groups.append((t, None))
            else:
                ands += len(bits) - 1
                groups.append((t, max(bits) + (len(bits) - 1).bit_length()))
        while len(groups) > 1:
            nxt = []
            for i in range(0, len(groups) - 1, 2):
                (g_lo, e_lo), (g_hi, e_hi) = groups[i], groups[i + 1]
                assert e_hi is not None
                ands += 1 if e_lo is None else 2
                e_up = None if e_lo is None else max(e_hi, e_lo) + 1
                nxt.append((max(g_hi, e_hi, g_lo) + 1, e_up))
            if len(groups) % 2:
                nxt.append(groups[-1])
            groups = nxt
        return groups[0][0], ands

    def _borrow_out_fast(
        self, xr: Sequence[int], yr: Sequence[int], borrow: int, enable: int = _T
    ) -> int:
        """See :meth:`_borrow_out_picked`."""
        return int(self._gadget(lambda: self._borrow_out_picked(xr, yr, borrow, enable)))

    def _borrow_out_picked(
        self, xr: Sequence[int], yr: Sequence[int], borrow: int, enable: int = _T
    ) -> int:
        """Borrow out of x - y - borrow (unsigned x < y + borrow), the cheapest (ANDs +
        ``layer_cost`` x depth) of two families built on block borrows G (ripple from borrow 0,
        1 AND a bit) and block equalities E (AND trees, b-1 ANDs), joined by
        B = G_hi ^ (E_hi & B_lo) (the terms are exclusive):

        - carry-skip chain: a ripple block, then blocks ready when the running borrow reaches
          them, 2b ANDs a block (1 for a 1-bit block): at most 2w ANDs, depth about sqrt(2w);
        - block tree: blocks of b bits joined by a balanced tree (2 ANDs a node, 1 on the lowest
          path): about 3w ANDs and depth 1 + log2 w at b = 1, down to w ANDs and depth w at
          b = w (the ripple borrow).

        Returns ``enable`` AND the borrow: in the sparse tree ``enable`` joins its last level
        (en & G = (en & G_hi) ^ ((en & E_hi) & G_lo)), no layer more; else one AND after it.
        """
        n = len(xr)
        if n == 0:
            return self._and(enable, borrow)
        arrive = [self._ready(p, q) for p, q in zip(xr, yr, strict=True)]
        start = self._depth[borrow]
        options: list[tuple[int, int, Any]] = []
        for first in range(1, n + 1):
            sizes = self._block_plan(arrive, start, first)
            ands = first + sum(1 if size == 1 else 2 * size for size in sizes[1:])
            options.append((self._chain_depth(arrive, start, sizes), ands, ("chain", sizes)))
        for size in range(1, n):
            depth, ands = self._tree_estimate(arrive, start, size)
            options.append((depth, ands, ("tree", size)))
        if n > 2:
            g_at = [a + 1 for a in arrive]
            g_at[0] = max(g_at[0], start + 1)
            e_at = list(arrive)
            est = _TimedOps()
            depth = est.sparse_borrow(list(zip(g_at, e_at, strict=True)))[0]
            options.append((depth, est.ands, ("sparse", None)))
        kind, plan = self._pick(options)
        if kind == "sparse":
            leaves = [(self._borrow(xr[0], yr[0], borrow), _T)] + [
                (self._borrow(xr[i], yr[i], _F), self._not(self._xor(xr[i], yr[i])))
                for i in range(1, n)
            ]
            return _GateOps(self).sparse_borrow(leaves, enable)[0]
        if kind == "tree":
            return self._and(enable, self._borrow_tree(xr, yr, borrow, plan))
        pos = 0
        for k, size in enumerate(plan):
            bits = range(pos, pos + size)
            if k == 0 or size == 1:
                for i in bits:
                    borrow = self._borrow(xr[i], yr[i], borrow)
            else:
                g = _F
                for i in bits:
                    g = self._borrow(xr[i], yr[i], g)
                equal = self._and_tree([self._not(self._xor(xr[i], yr[i])) for i in bits])
                borrow = self._xor(g, self._and(equal, borrow))
            pos += size
        return self._and(enable, borrow)

    def _borrow_tree(self, xr: Sequence[int], yr: Sequence[int], borrow: int, size: int) -> int:
        n = len(xr)
        groups: list[tuple[int, int | None]] = []  # (borrow out, equality) from the LSB up
        for lo in range(0, n, size):
            bits = range(lo, min(lo + size, n))
            g = borrow if lo == 0 else _F
            for i in bits:
                g = self._borrow(xr[i], yr[i], g)
            equal = None
            if lo:
                equal = self._and_tree([self._not(self._xor(xr[i], yr[i])) for i in bits])
            groups.append((g, equal))
        while len(groups) > 1:
            nxt: list[tuple[int, int | None]] = []
            for i in range(0, len(groups) - 1, 2):
                (g_lo, e_lo), (g_hi, e_hi) = groups[i], groups[i + 1]
                assert e_hi is not None
                e = None if e_lo is None else self._and(e_hi, e_lo)
                nxt.append((self._xor(g_hi, self._and(e_hi, g_lo)), e))
            if len(groups) % 2:
                nxt.append(groups[-1])
            groups = nxt
        return groups[0][0]

    def _add_fast(
        self, xr: Sequence[int], yr: Sequence[int], carry: int, want_carry: bool
    ) -> tuple[list[int], int]:
        """See :meth:`_add_picked`."""
        out: tuple[list[int], int] = self._gadget(
            lambda: self._add_picked(xr, yr, carry, want_carry)
        )
        return out

    def _add_picked(
        self, xr: Sequence[int], yr: Sequence[int], carry: int, want_carry: bool
    ) -> tuple[list[int], int]:
        """x + y + carry as a carry-increment chain: a ripple block, then blocks that ripple
        from carry 0 and keep the prefix-ANDs of their propagate bits, all ready when the
        running carry arrives; then c_i = c0_i ^ (P_i & c_in) (1 AND a bit, exclusive terms).
        A block of b >= 2 bits costs 3b - 1 ANDs, the ripple block 1 a bit (3w ANDs at most,
        depth about sqrt(2w) levels above the operands)."""
        n = len(xr)
        if n == 0:
            return [], carry
        arrive = [self._ready(p, q) for p, q in zip(xr, yr, strict=True)]
        start = self._depth[carry]
        options = []
        for first in range(1, n + 1):
            sizes = self._block_plan(arrive, start, first)
            ands = first + sum(1 if size == 1 else 3 * size - 1 for size in sizes[1:])
            options.append((self._chain_depth(arrive, start, sizes), ands, sizes))
        prefix = self._prefix_estimate(arrive, start)
        options.append((prefix[0], prefix[1], None))
        sizes = self._pick(options)
        if sizes is None:
            return self._add_prefix(xr, yr, carry, want_carry)
        out: list[int] = []
        pos = 0
        for k, size in enumerate(sizes):
            last_block = pos + size == n
            if k == 0 or size == 1:
                part, carry = self._add_refs_ripple(
                    xr[pos : pos + size], yr[pos : pos + size], carry, want_carry or not last_block
                )
                out += part
            else:
                prop = [self._xor(xr[i], yr[i]) for i in range(pos, pos + size)]
                c0 = [_F]
                for j, i in enumerate(range(pos, pos + size)):
                    if j < size - 1 or want_carry or not last_block:
                        c0.append(self._maj(xr[i], yr[i], c0[-1]))
                run = prop[0]
                for j in range(size):
                    if j:
                        c_j = self._xor(c0[j], self._and(run, carry))
                        out.append(self._xor(prop[j], c_j))
                        if j < size - 1 or want_carry or not last_block:
                            run = self._and(run, prop[j])
                    else:
                        out.append(self._xor(prop[0], carry))
                if want_carry or not last_block:
                    carry = self._xor(c0[size], self._and(run, carry))
            pos += size
        return out, carry

    @staticmethod
    def _sklansky_pairs(n: int) -> list[list[tuple[int, int]]]:
        """Sklansky's parallel prefix over n positions: per level, (i, j) = "fold the prefix
        ending at j into position i" (ceil(log2 n) levels)."""
        levels = []
        span = 1
        while span < n:
            levels.append([(i, (i // span) * span - 1) for i in range(n) if (i // span) % 2 == 1])
            span *= 2
        return levels

    def _prefix_estimate(self, arrive: Sequence[int], start: int) -> tuple[int, int]:
        """(depth, ANDs) of :meth:`_add_prefix` on operands ready at ``arrive`` (estimates)."""
        n = len(arrive)
        g = [a + 1 for a in arrive]
        g[0] = max(g[0], start + 1)
        p = list(arrive)
        ands = n
        for level in self._sklansky_pairs(n):
            for i, j in level:
                g[i] = max(g[i], p[i], g[j]) + 1
                p[i] = max(p[i], p[j]) + 1
                ands += 2
        return max(max(g), start), ands

    def _add_prefix(
        self, xr: Sequence[int], yr: Sequence[int], carry: int, want_carry: bool
    ) -> tuple[list[int], int]:
        """x + y + carry by Sklansky's parallel prefix: generate g_i (the carry-in folded into
        bit 0) and propagate p_i, then ceil(log2 w) levels of G = G_hi ^ (P_hi & G_lo) (exclusive
        terms), P = P_hi & P_lo: depth 1 + ceil(log2 w) above the operands, about
        w + w log2 w ANDs (propagate products no carry reads are dropped with the dead gates)."""
        n = len(xr)
        prop = [self._xor(p, q) for p, q in zip(xr, yr, strict=True)]
        gen = [self._and(p, q) for p, q in zip(xr, yr, strict=True)]
        gen[0] = self._maj(xr[0], yr[0], carry)
        run = list(prop)
        for level in self._sklansky_pairs(n):
            for i, j in level:
                gen[i] = self._xor(gen[i], self._and(run[i], gen[j]))
                run[i] = self._and(run[i], run[j])
        out = [self._xor(prop[0], carry)] + [self._xor(prop[i], gen[i - 1]) for i in range(1, n)]
        return out, gen[n - 1] if want_carry else _F


class _PrefixOps:
    """The sparse borrow tree over (G, E) pairs, on gates (:class:`_GateOps`) or on ready
    depths (:class:`_TimedOps`, the estimate): the same construction both ways."""

    def join(self, hi: tuple[Any, Any], lo: tuple[Any, Any]) -> tuple[Any, Any]:
        raise NotImplementedError

    def balanced(self, leaves: Sequence[tuple[Any, Any]]) -> tuple[Any, Any]:
        """Halves joined by G = G_hi ^ (E_hi & G_lo), E = E_hi & E_lo: G ceil(log2 n) + 1 and
        E ceil(log2 n) levels above the leaves."""
        if len(leaves) == 1:
            return leaves[0]
        half = 1 << ((len(leaves) - 1).bit_length() - 1)
        return self.join(self.balanced(leaves[half:]), self.balanced(leaves[:half]))

    def sparse_borrow(
        self, leaves: Sequence[tuple[Any, Any]], enable: Any = None
    ) -> tuple[Any, Any]:
        """Leaves LSB first, (g_i, e_i) with e one level before g. With k the least such that
        n <= 2^k - 1, the top 2^(k-1) leaves form a balanced block (G at level k, E at k-1)
        joined above the rest built the same way within k - 1: G at level k, one less than a
        balanced tree's ceil(log2 n) + 1 whenever n is 2^j + 1 .. 2^(j+1) - 1 (65 bits: 7).
        With ``enable`` (gates only), G is ANDed with it inside the last join."""
        n = len(leaves)
        k = n.bit_length()  # 2^(k-1) <= n <= 2^k - 1
        top = 1 << (k - 1)
        if enable is not None:
            return self.enabled_sparse(leaves, enable), None
        if n <= top:
            return self.balanced(leaves)
        return self.join(self.balanced(leaves[n - top :]), self.sparse_borrow(leaves[: n - top]))

    def enabled_sparse(self, leaves: Sequence[tuple[Any, Any]], enable: Any) -> Any:
        raise NotImplementedError


class _GateOps(_PrefixOps):
    def __init__(self, builder: DepthArithmetic) -> None:
        self.b = builder

    def join(self, hi: tuple[Any, Any], lo: tuple[Any, Any]) -> tuple[Any, Any]:
        b = self.b
        return b._xor(hi[0], b._and(hi[1], lo[0])), b._and(hi[1], lo[1])

    def enabled_sparse(self, leaves: Sequence[tuple[Any, Any]], enable: Any) -> Any:
        """enable & G of :meth:`sparse_borrow` (see :meth:`enabled_balanced`)."""
        n = len(leaves)
        top = 1 << (n.bit_length() - 1)
        if n <= top:
            return self.enabled_balanced(leaves, enable)
        hi = leaves[n - top :]
        g_lo = self.sparse_borrow(leaves[: n - top])[0]
        head = self.enabled_balanced(hi, enable)
        return self.b._xor(head, self.b._and_tree([enable, self.balanced(hi)[1], g_lo]))

    def enabled_balanced(self, leaves: Sequence[tuple[Any, Any]], enable: Any) -> Any:
        """enable & G of :meth:`balanced`, the enable pushed down the top spine:
        en & G = (en & G_hi) ^ (en & E_hi & G_lo), the three-way AND earliest-ready first, so
        a late enable costs at most a layer more than itself, about 2 log2 n ANDs more."""
        if len(leaves) == 1:
            return self.b._and(enable, leaves[0][0])
        half = 1 << ((len(leaves) - 1).bit_length() - 1)
        e_hi = self.balanced(leaves[half:])[1]
        g_lo = self.balanced(leaves[:half])[0]
        top = self.enabled_balanced(leaves[half:], enable)
        return self.b._xor(top, self.b._and_tree([enable, e_hi, g_lo]))


class _TimedOps(_PrefixOps):
    def __init__(self) -> None:
        self.ands = 0

    def join(self, hi: tuple[Any, Any], lo: tuple[Any, Any]) -> tuple[Any, Any]:
        self.ands += 2  # G's and E's (an E no join reads is dropped: see sparse_borrow)
        return max(hi[0], max(hi[1], lo[0]) + 1), max(hi[1], lo[1]) + 1

    def sparse_borrow(
        self, leaves: Sequence[tuple[Any, Any]], enable: Any = None
    ) -> tuple[Any, Any]:
        self.ands += len(leaves)  # the leaves' g
        joins_before = self.ands
        out = super().sparse_borrow(leaves, enable)
        # the joins of the chain of blocks (not inside a balanced block) need no E
        chain = max(0, len(leaves).bit_length() - 1) if len(leaves) > 2 else 0
        self.ands = max(joins_before, self.ands - chain)
        return out

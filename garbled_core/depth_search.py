"""Searching a circuit's structure for its AND-depth (for GMW, which pays a round trip per AND
layer): :func:`describe_within_depth` builds at increasing layer costs until the circuit fits a
depth, :func:`describe_with_slack` rebuilds each gadget at its fewest-AND structure that is
still ready by its deadline. Both drive :class:`garbled_core.circuit.CircuitBuilder` (its
``arithmetic="depth"`` gadgets) and read its gate rows."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from garbled_core.circuit import OP_AND, OP_NOT, CircuitBuilder, CircuitDescription

__all__ = ["DEPTH_SEARCH_LAYER_COSTS", "describe_with_slack", "describe_within_depth"]

DEPTH_SEARCH_LAYER_COSTS = (0.25, 0.5, 0.75, 1, 1.5, 2, 3, 4, 6, 8, 12, 16, 24)
"""Layer costs :func:`describe_within_depth` searches, cheapest circuits first."""


def describe_with_slack(
    name: str,
    make: Callable[[CircuitBuilder], None],
    layer_cost: float,
    max_depth: int | None = None,
) -> CircuitDescription:
    """``make`` on a depth-aware builder at ``layer_cost``, then again with every adder and
    comparison taking its fewest-AND structure ready by the time it is needed for the circuit
    to stay within ``max_depth`` (default: the first build's depth) AND layers: its slack, from
    a backward pass over the first build's gates. Fewer AND gates where gadgets sat off the
    critical path; the structures' depths are estimates, so if the rebuild is too deep it is
    tried once more with every deadline a layer earlier, and the first build is kept if that
    fails too (or is no cheaper)."""
    first = CircuitBuilder(name, "depth", layer_cost)
    make(first)
    desc = first.description()
    target = max(desc.and_depth(), desc.and_depth() if max_depth is None else max_depth)
    required = [1 << 30] * first._n_nodes  # latest depth each node may be ready at
    for _, _, refs in first._outputs:
        for r in refs:
            required[r] = target
    g_op, g_a, g_b, g_out = first._g_op, first._g_a, first._g_b, first._g_out
    for k in range(len(g_op) - 1, -1, -1):
        need = required[g_out[k]] - (g_op[k] == OP_AND)
        required[g_a[k]] = min(required[g_a[k]], need)
        if g_op[k] != OP_NOT:
            required[g_b[k]] = min(required[g_b[k]], need)
    deadlines = [min((required[r] for r in refs if r >= 2), default=1 << 30)
                 for refs in first._gadget_outputs]  # fmt: skip
    for margin in (0, 1):
        second = CircuitBuilder(name, "depth", layer_cost)
        second._deadlines = [d - margin for d in deadlines]
        make(second)
        refined = second.description()
        if refined.and_depth() <= target:
            return refined if refined.and_count < desc.and_count else desc
    return desc


def describe_within_depth(
    name: str,
    make: Callable[[CircuitBuilder], None],
    max_depth: int,
    layer_costs: Sequence[float] = DEPTH_SEARCH_LAYER_COSTS,
    *,
    slack: bool = False,
) -> CircuitDescription:
    """The description ``make`` builds on a ``CircuitBuilder(name, "depth", layer_cost)`` with
    the smallest of the ascending ``layer_costs`` whose AND-depth is at most ``max_depth``
    (binary search: depth falls as the layer cost rises): about the fewest AND gates within
    that depth, depth-aware gadgets only where the depth needs them. If none fits, the one at
    the largest layer cost. ``slack``: each build refined by :func:`describe_with_slack`."""
    if not layer_costs:
        raise ValueError("no layer costs to try")
    built: dict[int, CircuitDescription] = {}

    def at(k: int) -> CircuitDescription:
        if k not in built:
            if slack:
                built[k] = describe_with_slack(name, make, layer_costs[k], max_depth)
            else:
                b = CircuitBuilder(name, "depth", layer_costs[k])
                make(b)
                built[k] = b.description()
        return built[k]

    lo, hi = 0, len(layer_costs) - 1
    if at(hi).and_depth() > max_depth:
        return at(hi)
    while lo < hi:  # invariant: at(hi) fits
        mid = (lo + hi) // 2
        if at(mid).and_depth() <= max_depth:
            hi = mid
        else:
            lo = mid + 1
    return at(hi)

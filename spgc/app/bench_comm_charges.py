"""What a measured run of `spgc bench comm` sent between the two servers, and what it is charged
(one job: the bench measures, this counts): the engine's phase counters grouped for the table,
and on gmw the costs paid a batch at a time charged per use instead of counted as they fell
(silent OT's LPN iterations per random OT; authenticated GMW's stock of triples per triple)."""

from __future__ import annotations

import math
from typing import Any

from garbled_core.ot_measure import silent_ot_params
from spgc.servers.gc_party import counter_delta

__all__ = [
    "CHARGED_PHASES",
    "GROUP_ORDER",
    "PHASE_GROUPS",
    "amortised_ot",
    "both_counters",
    "charged_triples",
    "gmw_usage",
    "sent_by_phase",
    "triple_usage",
]

# The engine's phase names (garbled_core Channel.counters) as reported here. "setup" during a
# run is the 80-byte run header each party sends; the session's own setup (hello, base OTs) is
# measured once and reported apart.
PHASE_GROUPS = {
    "ot_extension": "ot_extension",
    "tables": "tables",
    "outputs": "outputs",
    "inputs": "inputs",
    "setup": "run_headers",
    "base_ot": "base_ot",
}
GROUP_ORDER = ("ot_extension", "tables", "outputs", "run_headers", "inputs", "base_ot", "opened")


def both_counters(links: tuple[Any, Any]) -> list[dict[str, dict[str, int]]]:
    return [link.counters() for link in links]


def sent_by_phase(before: list[Any], after: list[Any]) -> dict[str, int]:
    """Bytes sent by both parties between two counter snapshots, per phase group."""

    out: dict[str, int] = {}
    for b, a in zip(before, after, strict=True):
        for phase, v in counter_delta(b, a)["phases"].items():
            group = PHASE_GROUPS.get(phase, phase)
            out[group] = out.get(group, 0) + v["sent"]
    return {k: v for k, v in out.items() if v}


def gmw_usage(links: tuple[Any, Any]) -> tuple[int, int, int]:
    """(random OTs each way, AND-layer exchanges) H1's GMW party has used so far ((0, 0) for
    gc), and the round trips H1's channel has counted (receives after a send)."""
    session = links[0].session
    return (
        int(getattr(session, "ots_used", 0)),
        int(getattr(session, "layers_used", 0)),
        int(links[0].channel.round_trips),
    )


#: gmw: the phase groups whose bytes a run is charged (amortised_ot) instead of counted.
CHARGED_PHASES = ("ot_extension",)


def amortised_ot(phases: dict[str, int], ots: int) -> dict[str, int]:
    """gmw's OT phase at its steady-state cost: silent OT sends one message of a whole LPN
    iteration (about 10 million OTs) at once, so a run's measured OT bytes are either 0 (the OTs
    were buffered) or a whole iteration. The triples took ``ots`` random OTs each way (one per
    AND group and instance), so the run's share is 2 x ots x the silent set's bits per OT
    after setup."""
    bits_per_ot = float(silent_ot_params()["bits_per_ot"])
    out = dict(phases)
    out["ot_extension"] = math.ceil(2 * ots * bits_per_ot / 8)
    return {k: v for k, v in out.items() if v}


def triple_usage(links: tuple[Any, Any]) -> tuple[int, int, int, int]:
    """Authenticated GMW (security: malicious), H1's party so far: (triples used, triples
    made, the bytes of their own messages both ways, the COTs each way they took); zeros on
    other sessions."""
    session = links[0].session
    if not getattr(session, "triples_made", 0):
        return (0, 0, 0, 0)
    names = ("triples_used", "triples_made", "triple_bytes", "triple_cots")
    return tuple(int(getattr(session, name)) for name in names)  # type: ignore[return-value]


def charged_triples(
    phases: dict[str, int],
    ots: int,
    before: tuple[int, int, int, int],
    after: tuple[int, int, int, int],
) -> tuple[dict[str, int], int]:
    """Authenticated GMW makes its triples a batch at a time into a stock that later runs use
    (garbled_core.AuthGmwParty): a run is charged the triples it used at the stock's average
    cost (bytes of their messages and COTs per triple, over every batch made so far) instead of
    what it happened to make itself."""
    used, made, made_bytes, made_cots = after
    if not made:
        return phases, ots
    run_used = used - before[0]
    run_bytes, run_cots = made_bytes - before[2], made_cots - before[3]
    out = dict(phases)
    out["tables"] = out.get("tables", 0) - run_bytes + math.ceil(run_used * made_bytes / made)
    return out, ots - run_cots + math.ceil(run_used * made_cots / made)

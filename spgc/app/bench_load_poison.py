"""What `spgc bench load --poison` reports of its poisoning providers (the last ``providers -
honest`` of the run, spgc.app.bench_load_actors.PoisonProvider): their attempts and
acceptances, in all and per cheating prover, from H1's round records; the refusals both
servers audited; the honest provider-rounds the run missed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from spgc.app.cheating_provers import CHEATS, cheat_kind

__all__ = ["audited_refusals", "honest_missed", "poison_figures"]


def audited_refusals(path: Path) -> int:
    """How many norm_proof_refused lines a server's audit log holds (each one also counted by
    spgc_shares_refused_total{reason="norm"}: servers.metrics.ServerMetrics.on_audit)."""
    if not path.exists():
        return 0
    lines = path.read_text().splitlines()
    return sum(json.loads(line).get("event") == "norm_proof_refused" for line in lines if line)


def honest_missed(honest: int, history: dict[int, dict[str, Any]], rounds: range) -> int:
    """Honest provider-rounds not in the sum: every honest provider in a round not published,
    and in a published one those its record leaves out (left_out names each, and why)."""
    names = [f"p{i + 1}" for i in range(honest)]
    missed = 0
    for t in rounds:
        rec = history.get(t, {})
        left_out = rec.get("left_out", {}) if rec.get("published") else dict.fromkeys(names)
        missed += sum(1 for name in names if name in left_out)
    return missed


def poison_figures(
    honest: int, providers: int, history: dict[int, dict[str, Any]], rounds: range
) -> dict[str, Any]:
    """The poisoners' shares in ``rounds`` (every round of the run), from H1's round records,
    in all and per cheat (spgc.app.cheating_provers: the kind each poisoner used in each
    round); and the honest provider-rounds missed in them."""
    poisoners = [f"p{i + 1}" for i in range(honest, providers)]
    attempts = accepted = refused = 0
    kinds: dict[str, dict[str, Any]] = {
        kind: {"attempts": 0, "accepted": 0, "refused": 0, "reasons": {}} for kind in CHEATS
    }
    for t in rounds:
        rec = history.get(t)
        if rec is None or not rec.get("published"):
            continue
        left_out = rec.get("left_out", {})
        for position, name in enumerate(poisoners):
            why = left_out.get(name)
            if why is not None and why.startswith("no share reached"):
                continue
            tally = kinds[cheat_kind(position, t, len(poisoners))]
            attempts += 1
            tally["attempts"] += 1
            if why is None:
                accepted += 1
                tally["accepted"] += 1
            elif why.startswith("its norm proof was refused"):
                refused += 1
                tally["refused"] += 1
                reason = why.removeprefix("its norm proof was refused: ")
                tally["reasons"][reason] = tally["reasons"].get(reason, 0) + 1
    return {
        "poison": providers - honest,
        "poison_attempts": attempts,
        "poison_accepted": accepted,
        "poison_refused": refused,
        "poison_kinds": kinds,
        "missed_providers": honest_missed(honest, history, rounds),
    }

"""Fault injection for crash tests (off unless its environment variables are set).

``SPGC_FAULT_INJECT=POINT:ROUND`` makes this server kill itself with SIGKILL (no clean-up, no
flush: what a power cut or an OOM kill leaves) when it reaches POINT of round ROUND:

- ``during-intake``: the round is collecting and this server just accepted its first share;
- ``after-ledger``: the release's ledger entry is on disk, nothing revealed yet;
- ``during-circuit``: the garbled circuit is part done (after its first stage: some of the
  noisy sum may be revealed already, under the ledger entry written before it);
- ``after-reveal``: the noisy sum is revealed to this server, the model not updated;
- ``after-update``: the next model is computed, not yet published or checkpointed;
- ``during-checkpoint``: the checkpoint's arrays are written, its commit record is not.

``SPGC_FAULT_INJECT=peer-deviated:ROUND`` instead makes this server's engine report the peer
caught deviating (``garbled_core.PeerDeviated``, what a failed check of the authenticated
engine raises: ``security: malicious``) in the middle of round ROUND's circuit, after its
first stage: the abort path, without a cheating peer (docs/MALICIOUS.md, "What must hold" 3).

``SPGC_FAULT_INJECT=cheat-opening:ROUND`` makes this server a real cheater under ``security:
malicious``: from round ROUND on, its authenticated engine flips the first bit it opens in each
run (the engine's test hook, ``AuthSession._deviate_for_test``: a constant added to an opened
value, its MAC left as it was), and the OTHER server's engine must catch it with its MAC check.
``SPGC_FAULT_INJECT=cheat-row:ROUND`` (H1 on backend gc under ``security: malicious``): from
round ROUND on, its authenticated garbling flips the output of the first AND gate instance in
each run's tables (``flip_row``: all four rows, their MACs left as they were), which H2's engine
must catch when it decrypts the row. ``SPGC_FAULT_INJECT=cheat-seed:ROUND`` (under ``security:
malicious``): from round ROUND on, this server enters and proves a fresh seed, not the one
whose commitment it sent (``swapped_seed``): in mode spgc a round's, sent with the release; in
mode preprocessed that of each production run made while the run is at that round or later
(the fill before round 0 is at round 0), sent with the block. The other server's check of the
seed proof must catch it (spgc.privacy.seed_proof).

``SPGC_REVEAL_TAP=FILE`` appends one JSON line per reveal to FILE (``server``, ``round``,
``sha256`` of the released values, and in mode preprocessed ``pool``: where the release's
noise shares start in the pool), written before anything else is done with the values:
what a crash test compares with the ledger (entries >= reveals). Both only read the process's
own environment; neither changes what a healthy run computes or sends.
"""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import garbled_core
from spgc.privacy.ledger_format import released_digest

__all__ = [
    "CHEAT_POINTS",
    "DEVIATION_POINTS",
    "FAULT_POINTS",
    "arm_cheat",
    "check_cheat_fits",
    "fault_point",
    "planned_fault",
    "swapped_seed",
    "tap_reveal",
]

FAULT_POINTS = (
    "during-intake",
    "after-ledger",
    "during-circuit",
    "after-reveal",
    "after-update",
    "during-checkpoint",
)
#: Points where the engine raises garbled_core.PeerDeviated instead (no SIGKILL): in the round's
#: circuit, or in a noise-pool production run made while the run is at that round (mode
#: preprocessed; the fill before round 0 is at round 0).
DEVIATION_POINTS = ("peer-deviated", "pool-peer-deviated")
#: Points where this server's own engine starts to cheat (a real deviation the peer catches).
CHEAT_POINTS = ("cheat-opening", "cheat-row", "cheat-seed")
#: What the injected PeerDeviated says (the abort entry's check).
INJECTED_CHECK = "fault injection: the peer's opened values fail their MAC check"
_FAULT_ENV = "SPGC_FAULT_INJECT"
_TAP_ENV = "SPGC_REVEAL_TAP"


def planned_fault() -> tuple[str, int] | None:
    """(point, round) named by ``SPGC_FAULT_INJECT``, None if unset; ValueError if malformed."""
    value = os.environ.get(_FAULT_ENV, "")
    if not value:
        return None
    point, _, number = value.partition(":")
    points = (*FAULT_POINTS, *DEVIATION_POINTS, *CHEAT_POINTS)
    if point not in points or not number.isdigit():
        raise ValueError(
            f"{_FAULT_ENV}={value!r}: expected POINT:ROUND with POINT one of {', '.join(points)}"
        )
    return point, int(number)


def check_cheat_fits(point: str, backend: str, security: str, role: int) -> None:
    """ValueError, at the start, when a :data:`CHEAT_POINTS` point cannot happen on this server:
    both cheat in an authenticated engine (``security: malicious``), and ``cheat-row`` flips
    a garbled table, which only H1 on backend gc sends (else the test would pass unchallenged)."""
    if point not in CHEAT_POINTS:
        return
    if security != "malicious":
        raise ValueError(
            f"{_FAULT_ENV}={point}: a cheat in the authenticated engine needs security: "
            f"malicious (this server's is {security})"
        )
    if point == "cheat-row" and (backend != "gc" or role != 1):
        raise ValueError(
            f"{_FAULT_ENV}={point}: only H1 on backend gc sends garbled tables (this server is "
            f"H{role} on backend {backend}); use cheat-opening"
        )


def fault_point(point: str, round_number: int) -> None:
    """SIGKILL this process if ``SPGC_FAULT_INJECT`` names this point of this round (a
    :data:`DEVIATION_POINTS` point: raise garbled_core.PeerDeviated instead)."""
    if os.environ.get(_FAULT_ENV) and planned_fault() == (point, round_number):
        if point in DEVIATION_POINTS:
            raise garbled_core.PeerDeviated(INJECTED_CHECK)
        os.kill(os.getpid(), signal.SIGKILL)


def arm_cheat(link: Any, round_number: int) -> None:
    """From the round ``SPGC_FAULT_INJECT=cheat-opening:ROUND`` (or ``cheat-row:ROUND``) names:
    make each authenticated engine session of this server's data link (``link.lanes()``) flip
    the first bit it opens in a run (or, garbling, the first gate instance of its tables)."""
    if not os.environ.get(_FAULT_ENV) or link is None:
        return
    planned = planned_fault()
    if planned is None or planned[0] not in CHEAT_POINTS or round_number < planned[1]:
        return
    if planned[0] == "cheat-seed":
        return  # swapped_seed's
    for session in (getattr(lane, "session", None) for lane in link.lanes()):
        if isinstance(session, garbled_core.AuthSession):
            kind = "flip_row" if planned[0] == "cheat-row" else "flip_opening"
            session._deviate_for_test(kind, 0)


def swapped_seed(seed: bytes | None, round_number: int) -> bytes | None:
    """The seed this server enters in round ``round_number`` (or in a production run made
    while the run is at that round): ``seed``, or a fresh one from the round
    ``SPGC_FAULT_INJECT=cheat-seed:ROUND`` names on (the commitment it sent is of ``seed``)."""
    if seed is None or not os.environ.get(_FAULT_ENV):
        return seed
    planned = planned_fault()
    if planned is None or planned[0] != "cheat-seed" or round_number < planned[1]:
        return seed
    return os.urandom(len(seed))


def tap_reveal(
    server: str, round_number: int, values: Any, pool: tuple[int, int] | None = None
) -> None:
    """Log one reveal to ``SPGC_REVEAL_TAP`` (if set); ``pool``: mode preprocessed, where the
    noise shares of the release started in the pool (block index, offset)."""
    path = os.environ.get(_TAP_ENV)
    if not path:
        return
    line: dict[str, Any] = {
        "server": server,
        "round": round_number,
        "sha256": released_digest(values),
    }
    if pool is not None:
        line["pool"] = list(pool)
    with Path(path).open("a") as f:
        f.write(json.dumps(line) + "\n")

"""Two ledgers held against each other, and a ledger against the model it must cover: the
checks ``spgc account`` and ``spgc export`` run on ledgers :func:`spgc.privacy.ledger.verify_ledger`
verified one by one (docs/PRIVACY.md, "The ledger format")."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from spgc.privacy.ledger_format import (
    PLAN_KEYS,
    ROLES,
    STATEMENT_KEYS,
    LedgerError,
    statement_bytes,
)
from spgc.privacy.ledger_verify import LedgerReport

__all__ = ["check_covers", "compare_ledgers"]


def _shared(entry: Mapping[str, Any]) -> dict[str, Any]:
    return {k: entry.get(k) for k in STATEMENT_KEYS}


def compare_ledgers(first: list[bytes], second: list[bytes]) -> None:
    """Check the two servers' ledgers of one run against each other (each already verified
    alone: :func:`verify_ledger`): one h1 and one h2, each naming the other's key, the same
    plan field by field, and the same releases, in order, field by field. Every release is
    recorded by both before it runs (H2 first), so H2's ledger may hold one release more, as
    its last release entry: written just before a crash or a lost answer. Anything else (H1's
    holding one more included) means a server dropped or changed entries of its ledger and
    re-signed the chain. LedgerError naming the first difference."""
    ledgers, closes = [], []
    for lines in (first, second):
        entries = [json.loads(line) for line in lines]
        ledgers.append((entries[0], [e for e in entries[1:] if e.get("kind") == "release"]))
        closes.append(next((e for e in entries if e.get("kind") == "close"), None))
    roles = [str(header.get("server")) for header, _ in ledgers]
    if sorted(roles) != list(ROLES):
        raise LedgerError(
            f"the ledgers are of servers {roles[0]!r} and {roles[1]!r}: give h1's and h2's"
        )
    by_role = dict(zip(roles, ledgers, strict=True))
    (h1, r1), (h2, r2) = by_role["h1"], by_role["h2"]
    if h1.get("peer_public_key") is None or h2.get("peer_public_key") is None:
        raise LedgerError("a one-server ledger has no peer's ledger to compare with")
    for key in PLAN_KEYS:
        if h1.get(key) != h2.get(key):
            raise LedgerError(
                f"the headers differ in {key}: h1 {h1.get(key)!r}, h2 {h2.get(key)!r}"
            )
    if h1["peer_public_key"] != h2["public_key"] or h2["peer_public_key"] != h1["public_key"]:
        raise LedgerError("the ledgers do not name each other's signing keys: not one pair")
    counts = f"h1 {len(r1)}, h2 {len(r2)} release entries"
    for index, (a, b) in enumerate(zip(r1, r2, strict=False)):
        sa, sb = _shared(a), _shared(b)
        if sa != sb:
            key = next(k for k in STATEMENT_KEYS if sa[k] != sb[k])
            raise LedgerError(
                f"release entry {index} differs in {key}: h1 {sa[key]!r}, h2 {sb[key]!r} "
                f"({counts}): both servers sign the same statement for every release"
            )
    if len(r1) > len(r2):
        raise LedgerError(
            f"h1's ledger holds a release that h2's lacks ({counts}): h2 records every "
            "release before h1, so h2's ledger dropped an entry"
        )
    if len(r2) > len(r1) + 1:
        raise LedgerError(
            f"h2's ledger holds {len(r2) - len(r1)} releases that h1's lacks ({counts}): only "
            "its last release, recorded just before a crash, may be missing from h1's"
        )
    # A closing entry is written once both hold every release (H2's first): the other
    # ledger holds the same releases, and a second closing entry the same statement.
    closed = [c for c in closes if c is not None]
    if closed and len(r1) != len(r2):
        raise LedgerError(f"one ledger is closed but the two hold different releases ({counts})")
    if len(closed) == 2 and statement_bytes(closed[0]) != statement_bytes(closed[1]):
        raise LedgerError("the two ledgers' closing entries differ")


def check_covers(report: LedgerReport, run_id: str, releases: int, chain: str) -> None:
    """A released model (or export) of run ``run_id`` names the ledger head it depends on:
    ``releases`` release entries with head ``chain``. LedgerError unless the verified ledger
    (``report``) is of that run and holds those entries: a ledger cut before them, or another
    run's, does not cover the model."""
    if report.run_id != run_id:
        raise LedgerError(f"the ledger is of run {report.run_id}, the model of run {run_id}")
    if releases > report.steps:
        raise LedgerError(
            f"the model depends on {releases} release(s), the ledger holds only "
            f"{report.steps}: the ledger was cut"
        )
    if report.heads[releases] != chain:
        raise LedgerError(
            f"the ledger's head after {releases} release(s) is not the one the model names "
            f"({chain[:16]}...): not the ledger this model was released from"
        )

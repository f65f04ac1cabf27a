"""Refusals are logged once per window per identity AND reason (issue 33, item 5): an operator
sees every new reason, while a caller repeating one, or inventing new ones, cannot flood the log."""

from __future__ import annotations

import json
from pathlib import Path

from spgc.servers.audit import REASONS_PER_KEY, AuditLog, reason_kind


def _written(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_a_new_reason_from_the_same_identity_is_written(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl", "h1")
    audit._repeats.window = 3600.0  # nothing leaves the window during the test
    decline = "plan_declined"
    assert audit.record(decline, repeat_key="p1", identity="p1", reason="no data file x.csv")
    assert not audit.record(decline, repeat_key="p1", identity="p1", reason="no data file x.csv")
    # Before: held back, as the same identity within 10 s. Its reason differs: written.
    assert audit.record(decline, repeat_key="p1", identity="p1", reason="epsilon 8 > 4")
    # Numbers alone do not make a new reason (a far round per call must not flood the log).
    assert not audit.record(decline, repeat_key="p1", identity="p1", reason="epsilon 9 > 4")
    audit.close()
    assert [e["reason"] for e in _written(tmp_path / "audit.jsonl")] == [
        "no data file x.csv",
        "epsilon 8 > 4",
    ]


def test_inventing_reasons_cannot_flood_the_log(tmp_path: Path) -> None:
    audit = AuditLog(tmp_path / "audit.jsonl", "h1")
    audit._repeats.window = 3600.0
    seen: list[str] = []
    audit.add_listener(lambda event, entry: seen.append(event))
    written = sum(
        audit.record("refused", repeat_key="x9 Hello", identity="x9", reason=f"word{chr(97 + i)}")
        for i in range(26)
    )
    audit.close()
    assert written == REASONS_PER_KEY + 1  # the first kinds, then one shared key
    assert len(seen) == 26  # the metrics still count every one


def test_reason_kind() -> None:
    assert reason_kind("round 12: deadline 3.5 s  passed") == "round #: deadline # s passed"

"""The ledger's ``abort`` entry and its ``security`` plan field (issue 46 item 2; docs/MALICIOUS.md,
"What must hold" 3): a server that caught its peer deviating ends its ledger with an entry
signed by it alone, which the verifier accepts as the last line and nothing after."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_ledger import HEADER, SAMPLES, _accountant, _build, _record, _resign

from spgc.privacy.ledger import Ledger
from spgc.privacy.ledger_format import LedgerError, abort_line
from spgc.privacy.ledger_verify import verify_ledger

CHECK = "the peer's opened values fail their MAC check (authenticated opening)"
DIGEST = hashlib.sha256(b"what the peer sent").hexdigest()


def aborted_ledger(path: Path, key: Ed25519PrivateKey, header: dict | None = None) -> Ledger:
    """Rounds 0-2 released, round 3's release entry written, then its circuit caught the peer
    deviating: the abort entry, and no released line for round 3."""
    ledger = _build(path, key, rounds=3, header=header)
    _record(ledger, 3, SAMPLES, _accountant().epsilon_after(4))
    ledger.record_abort(3, CHECK, "transcript", DIGEST)
    return ledger


def entries(ledger: Ledger) -> list[dict]:
    return [json.loads(line) for line in ledger.lines]


def test_an_aborted_ledger_verifies_and_counts_every_release(tmp_path):
    key = Ed25519PrivateKey.generate()
    ledger = aborted_ledger(tmp_path / "l.jsonl", key)
    last = entries(ledger)[-1]
    assert last["kind"] == "abort" and "peer_sig" not in last  # signed by this server alone
    report = verify_ledger(tmp_path / "l.jsonl")
    assert report.abort is not None
    assert {k: report.abort[k] for k in ("round", "check", "evidence", "evidence_digest")} == {
        "round": 3, "check": CHECK, "evidence": "transcript", "evidence_digest": DIGEST
    }  # fmt: skip
    # The aborted round's entry (written before its circuit ran) stays counted, unreleased.
    assert (report.steps, report.released) == (4, 3)
    assert report.epsilon == pytest.approx(_accountant().epsilon_after(4))
    assert not report.closed and report.security == "semi-honest"
    assert report.as_dict()["abort"] == report.abort
    assert abort_line(report.abort) == (
        f"aborted at round 3: the peer deviated (check: {CHECK}, evidence digest {DIGEST}, "
        "of the transcript)"
    )


def test_nothing_follows_the_abort(tmp_path):
    key = Ed25519PrivateKey.generate()
    path = tmp_path / "l.jsonl"
    ledger = aborted_ledger(path, key)
    with pytest.raises(LedgerError, match="round 4: this run was aborted: no release"):
        ledger.statement(4, SAMPLES, 1.0, 1.0)
    with pytest.raises(LedgerError, match=r"aborted .*: no closing entry"):
        ledger.record_close(b"")
    # A restarted server does not continue it: the run ended there.
    with pytest.raises(LedgerError, match=r"aborted at round 3 .*start a new run"):
        Ledger.open(path, key, HEADER)
    # A line appended after it (re-signed with the server's own key) is refused.
    released = {"kind": "released", "index": 3, "round": 3, "vector_sha256": DIGEST}
    with pytest.raises(LedgerError, match="line 10: follows the abort entry"):
        verify_ledger(_resign([*entries(ledger), released], key))


def test_an_abort_entry_must_be_well_formed(tmp_path):
    key = Ed25519PrivateKey.generate()
    ledger = aborted_ledger(tmp_path / "l.jsonl", key)
    with pytest.raises(LedgerError, match="evidence is one of"):
        Ledger.open(tmp_path / "other.jsonl", key, HEADER).record_abort(0, CHECK, "x", DIGEST)
    lines = entries(ledger)
    for change, message in (
        ({"evidence_digest": "00"}, "evidence_digest its SHA-256"),
        ({"evidence": "hearsay"}, "evidence must be one of transcript, message"),
        ({"check": ""}, "check must be its message"),
        ({"round": 2}, r"round 2 must be an integer >= 0, not before the last release's \(3\)"),
    ):
        with pytest.raises(LedgerError, match=message):
            verify_ledger(_resign([*lines[:-1], {**lines[-1], **change}], key))
    # Its own signature holds it: another check put in by anyone without the key is refused.
    forged = {**lines[-1], "check": "nothing happened"}
    raw = [*ledger.lines[:-1], json.dumps(forged).encode()]
    with pytest.raises(LedgerError, match="line 9: bad signature"):
        verify_ledger(raw)


def test_a_one_server_ledger_has_no_peer_to_abort_on(tmp_path):
    key = Ed25519PrivateKey.generate()
    one = {**HEADER, "mode": "plain", "peer": None, "peer_public_key": None}
    ledger = Ledger.open(tmp_path / "l.jsonl", key, one)
    ledger.record_abort(0, CHECK, "message", DIGEST)
    with pytest.raises(LedgerError, match="line 2: an abort entry in a one-server ledger"):
        verify_ledger(list(ledger.lines))


def test_the_security_level_is_co_signed_and_checked(tmp_path):
    key = Ed25519PrivateKey.generate()
    malicious = {**HEADER, "backend": "gmw", "security": "malicious"}
    ledger = _build(tmp_path / "m.jsonl", key, rounds=2, header=malicious)
    assert verify_ledger(list(ledger.lines)).security == "malicious"
    # Dropped from the header (re-signed with the server's own key): the peer's signatures on
    # the release entries no longer match.
    lines = entries(ledger)
    del lines[0]["security"]
    with pytest.raises(LedgerError, match="line 2: security differs from the header's"):
        verify_ledger(_resign(lines, key))
    # Both backends have a malicious variant of mode spgc: a gc header verifies too.
    garbled = Ledger.open(None, key, {**HEADER, "security": "malicious"})
    assert verify_ledger(list(garbled.lines)).security == "malicious"
    for header, message in (
        ({**HEADER, "mode": "dng", "security": "malicious"}, "line 1: security: malicious "
         "needs backend: gmw and mode: spgc .*mode dng has no malicious variant yet"),
        ({**HEADER, "security": "paranoid"}, "line 1: security 'paranoid' is not one of "
         "semi-honest, malicious"),
    ):  # fmt: skip
        built = Ledger.open(None, key, header)
        with pytest.raises(LedgerError, match=message):
            verify_ledger(list(built.lines))

"""`spgc account --ledger` on the security level and an aborted run (issue 46 item 2): the
level is printed, a ledger that ends in this server's abort entry is complete and says so in
one line, and one cut short without it is still incomplete."""

from __future__ import annotations

import json

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_ledger import HEADER, SAMPLES, _accountant, _build, _record, _run, _write
from test_ledger import parser as parser  # the module's fixture
from test_ledger_abort import CHECK, DIGEST, aborted_ledger


def test_an_aborted_run_is_shown_and_complete(tmp_path, parser, capsys):
    path = tmp_path / "h1.jsonl"
    aborted_ledger(path, Ed25519PrivateKey.generate())
    code, out, err = _run(parser, capsys, "--ledger", path)
    assert code == 0, err
    assert "mode spgc, backend gc, security semi-honest" in out
    assert (
        f"  aborted at round 3: the peer deviated (check: {CHECK}, evidence digest {DIGEST}, "
        "of the transcript); signed by h1 alone"
    ) in out.splitlines()
    assert "releases counted: 4 (release entries, every one counted), 3 with a released" in out
    assert "complete: it ends in h1's abort entry (round 3): h1 co-signs no release" in out
    code, out, _ = _run(parser, capsys, "--ledger", path, "--json")
    answer = json.loads(out)
    assert code == 0 and answer["complete"] and answer["security"] == "semi-honest"
    assert answer["abort"]["round"] == 3 and answer["abort"]["evidence_digest"] == DIGEST


def test_a_ledger_cut_short_without_the_abort_is_still_incomplete(tmp_path, parser, capsys):
    path = tmp_path / "h1.jsonl"
    ledger = aborted_ledger(path, Ed25519PrivateKey.generate())
    _write(path, ledger.lines[:-1])  # the abort entry cut off: later releases may follow
    code, out, err = _run(parser, capsys, "--ledger", path)
    assert code == 3 and "aborted" not in out
    assert "later releases cannot be ruled out" in err


def test_a_malicious_plan_is_printed(tmp_path, parser, capsys):
    path = tmp_path / "h1.jsonl"
    ledger = _build(path, Ed25519PrivateKey.generate(), rounds=2,
                    header={**HEADER, "backend": "gmw", "security": "malicious"})  # fmt: skip
    _record(ledger, 2, SAMPLES, _accountant().epsilon_after(3))
    code, out, _ = _run(parser, capsys, "--ledger", path)
    assert code == 3  # neither closed nor aborted
    assert "mode spgc, backend gmw, security malicious" in out

"""The privacy ledger (spgc.privacy.ledger) and `spgc account --ledger` (issue 13, item 7)."""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import math
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers import run_in_process

from spgc.app import account_cmd
from spgc.privacy.accounting import PrivacyAccountant
from spgc.privacy.ledger import Ledger
from spgc.privacy.ledger_format import (
    LedgerError,
    canonical,
    chain_after,
    load_signing_key,
    plan_digest,
    public_key_hex,
    statement_bytes,
)
from spgc.privacy.ledger_verify import LedgerReport, LedgerVerifier, verify_ledger

# The other server, whose key co-signs every release entry of a two-server run.
PEER = Ed25519PrivateKey.generate()
HEADER: dict[str, Any] = {
    "run_id": "run-1",
    "server": "h1",
    "peer": "h2",
    "peer_public_key": public_key_hex(PEER),
    "mode": "spgc",
    "plan_sha256": "ab" * 32,
    "noise_multiplier": 1.1,
    "sampling": {"sampling_rate": 0.01, "sampling": "poisson"},
    "accountant": "rdp",
    "delta": 1e-5,
    "sensitivity_units": 1024.0,
    "max_batch_size": 0,
    "clip": {"rule": "fixed", "clip_norm": 1.0},
    "backend": "gc",
    "verify_inputs": "none",
}
CLIP = 1.0  # the fixed clip norm of every release in these ledgers
ROUNDS = 5
SAMPLES = 1000  # noise samples per release in these ledgers


def _accountant() -> PrivacyAccountant:
    return PrivacyAccountant(1.1, 1e-5, sampling_rate=0.01, method="rdp", sampling="poisson")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _record(ledger: Ledger, t: int, samples: int, epsilon: float, peer=PEER) -> int:
    """A release entry co-signed by ``peer`` (what CosignRelease gives the server)."""
    statement, _ = ledger.statement(t, samples, CLIP, epsilon)
    return ledger.record_release(t, samples, epsilon, peer.sign(statement), clip_norm=CLIP)


def _close(ledger: Ledger, peer=PEER) -> None:
    """The run's co-signed closing entry (what CloseLedger gives the server)."""
    statement, _ = ledger.close_statement()
    ledger.record_close(peer.sign(statement))


def _build(
    path: Path,
    key: Ed25519PrivateKey,
    rounds: int = ROUNDS,
    header: dict | None = None,
    *,
    close: bool = False,
) -> Ledger:
    """An honest ledger: one release and one released line per round (``close``: then the
    run's closing entry)."""
    ledger = Ledger.open(path, key, header or HEADER)
    acc = _accountant()
    start = ledger.releases
    for i in range(start, start + rounds):
        index = _record(ledger, i, SAMPLES, acc.epsilon_after(i + 1))
        ledger.record_released(index, i, _sha(f"y{i}"))
    if close:
        _close(ledger)
    return ledger


def _lines(path: Path) -> list[bytes]:
    return path.read_bytes().splitlines()


def _write(path: Path, lines: list[bytes]) -> None:
    path.write_bytes(b"".join(line + b"\n" for line in lines))


def _resign(
    entries: list[dict[str, Any]], key: Ed25519PrivateKey, peer: Any = None
) -> list[bytes]:
    """Entries chained and signed again with ``key`` (what a forger with a key can do);
    ``peer``: the co-signed entries re-chained and co-signed again with that key too (both
    servers' keys: what re-accounting must still catch)."""
    if peer is not None:
        _cosign_again(entries, peer)
    out: list[bytes] = []
    for entry in entries:
        entry = {k: v for k, v in entry.items() if k != "sig"}
        if entry.get("kind") == "header":
            entry["public_key"] = public_key_hex(key)
        entry["prev"] = hashlib.sha256(out[-1]).hexdigest() if out else None
        entry["sig"] = key.sign(canonical(entry)).hex()
        out.append(canonical(entry))
    return out


def _entries(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in _lines(path)]


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def ledger_path(tmp_path: Path, key: Ed25519PrivateKey) -> Path:
    path = tmp_path / "ledger.jsonl"
    _build(path, key)
    return path


@pytest.fixture
def closed_path(tmp_path: Path, key: Ed25519PrivateKey) -> Path:
    """The ledger of a finished run: ROUNDS releases, then the co-signed closing entry."""
    path = tmp_path / "ledger.jsonl"
    _build(path, key, close=True)
    return path


# ---------------------------------------------------------------------------- the library


def test_honest_ledger_verifies(ledger_path, key):
    report = verify_ledger(ledger_path)
    assert isinstance(report, LedgerReport)
    assert (report.run_id, report.server, report.public_key) == ("run-1", "h1", public_key_hex(key))
    assert (report.steps, report.released) == (ROUNDS, ROUNDS)
    expected = _accountant().epsilon_after(ROUNDS)
    assert abs(report.epsilon - expected) < 1e-9
    assert report.epsilon_recorded == expected
    assert report.delta == 1e-5
    assert report.noise_samples == ROUNDS * SAMPLES
    assert report.signatures_valid is True
    # Pinning the right key passes too; the lines can also be given as a list.
    both = {"h1": public_key_hex(key), "h2": public_key_hex(PEER)}
    assert verify_ledger(_lines(ledger_path), expected_keys=both).steps == ROUNDS
    assert report.peer_public_key == public_key_hex(PEER) and report.cosigned is True
    # Every line: canonical JSON, chained, with the header first.
    entries = _entries(ledger_path)
    assert [e["kind"] for e in entries] == ["header"] + ["release", "released"] * ROUNDS
    assert entries[0]["prev"] is None and entries[0]["public_key"] == public_key_hex(key)
    for raw, entry in zip(_lines(ledger_path), entries, strict=True):
        assert canonical(entry) == raw


def test_file_mode_is_0600(ledger_path):
    assert stat.S_IMODE(ledger_path.stat().st_mode) == 0o600


def test_reopening_continues_the_same_run(ledger_path, key):
    ledger = _build(ledger_path, key, rounds=3)  # Ledger.open on the existing file
    assert ledger.releases == ROUNDS + 3
    entries = _entries(ledger_path)
    assert sum(e["kind"] == "header" for e in entries) == 1
    assert [e["index"] for e in entries if e["kind"] == "release"] == list(range(ROUNDS + 3))
    report = verify_ledger(ledger_path)
    assert report.steps == ROUNDS + 3
    assert abs(report.epsilon - _accountant().epsilon_after(ROUNDS + 3)) < 1e-9
    assert not list(ledger_path.parent.glob("ledger.jsonl.*"))


def test_reopening_with_another_key_is_refused(ledger_path):
    with pytest.raises(LedgerError, match="another signing key"):
        Ledger.open(ledger_path, Ed25519PrivateKey.generate(), HEADER)


def test_a_damaged_ledger_is_never_extended(ledger_path, key):
    lines = _lines(ledger_path)
    del lines[2]
    _write(ledger_path, lines)
    with pytest.raises(LedgerError, match=rf"^{ledger_path}: line 3: .*; not extending it"):
        Ledger.open(ledger_path, key, HEADER)


def test_another_run_moves_the_old_file_aside(ledger_path, key):
    old = ledger_path.read_bytes()
    ledger = Ledger.open(ledger_path, key, {**HEADER, "run_id": "run-2"})
    assert ledger.releases == 0
    aside = ledger_path.with_name("ledger.jsonl.run-1")
    assert aside.read_bytes() == old
    assert verify_ledger(aside).steps == ROUNDS
    report = verify_ledger(ledger_path)
    assert (report.run_id, report.steps) == ("run-2", 0)
    # A third run never overwrites what was kept aside, and an odd run id stays one file name.
    _build(ledger_path, key, rounds=1, header={**HEADER, "run_id": "run-2"})
    Ledger.open(ledger_path, key, {**HEADER, "run_id": "../run-3"})
    Ledger.open(ledger_path, key, {**HEADER, "run_id": "run-1"})
    Ledger.open(ledger_path, key, {**HEADER, "run_id": "run-4"})
    names = sorted(p.name for p in ledger_path.parent.iterdir())
    assert names == [
        "ledger.jsonl",
        "ledger.jsonl..._run-3",
        "ledger.jsonl.run-1",
        "ledger.jsonl.run-1.1",
        "ledger.jsonl.run-2",
    ]
    assert aside.read_bytes() == old
    assert verify_ledger(ledger_path.with_name("ledger.jsonl.run-2")).steps == 1


def test_a_short_write_fails_the_entry_and_leaves_the_file_whole(ledger_path, key, monkeypatch):
    """A disk that fills up mid-entry: os.write writes part of the line, then nothing. The
    entry must fail (the release does not go ahead) with the file as it was, not torn."""
    before = ledger_path.read_bytes()
    ledger = Ledger.open(ledger_path, key, HEADER)
    real_write = os.write
    calls = []

    def short_write(fd: int, data: bytes) -> int:
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, data[:10])  # part of the line
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", short_write)
    with pytest.raises(OSError):
        _record(ledger, ROUNDS, SAMPLES, 1.0)
    monkeypatch.undo()
    assert ledger_path.read_bytes() == before and len(calls) == 2
    assert verify_ledger(ledger_path).steps == ROUNDS


def test_in_memory_ledger(key):
    ledger = Ledger.open(None, key, HEADER)
    index = _record(ledger, 0, 7, _accountant().epsilon_after(1))
    ledger.record_released(index, 0, _sha("y"))
    report = verify_ledger(ledger.lines)
    assert (report.steps, report.released, report.noise_samples) == (1, 1, 7)


def test_tampered_number_names_its_line(ledger_path):
    lines = _lines(ledger_path)
    entry = json.loads(lines[3])  # the second release
    assert entry["kind"] == "release"
    entry["noise_samples"] -= 1
    lines[3] = canonical(entry)  # still valid, canonical JSON; the signature no longer fits
    _write(ledger_path, lines)
    with pytest.raises(LedgerError, match=r"^line 4: bad signature"):
        verify_ledger(ledger_path)


def test_a_ledger_fed_a_few_lines_at_a_time_verifies_as_the_whole(ledger_path):
    """LedgerVerifier (what a provider runs on ledgers fetched a round at a time) checks each
    line once as it comes: fed in pieces, its report after every piece is verify_ledger's of
    the lines so far, and at the end the whole ledger's. A line that fails is named by its
    number in the ledger, and the verifier refuses every call after it."""
    lines = _lines(ledger_path)
    verifier = LedgerVerifier()
    with pytest.raises(LedgerError, match="the ledger is empty"):
        verifier.report()
    for at in range(0, len(lines), 3):
        verifier.feed(lines[at : at + 3])
        assert verifier.lines == min(at + 3, len(lines))
        assert verifier.report() == verify_ledger(lines[: at + 3])
    assert verifier.report() == verify_ledger(ledger_path)

    entry = json.loads(lines[5])
    entry["noise_samples"] -= 1
    tampered = [*lines[:5], canonical(entry), *lines[6:]]
    verifier = LedgerVerifier()
    verifier.feed(tampered[:4])
    with pytest.raises(LedgerError, match=r"^line 6: bad signature"):
        verifier.feed(tampered[4:])
    for call in (lambda: verifier.feed([]), verifier.report):
        with pytest.raises(LedgerError, match=r"^line 6: bad signature"):
            call()


def test_deleted_line_breaks_the_chain_at_the_next(ledger_path):
    lines = _lines(ledger_path)
    del lines[3]
    _write(ledger_path, lines)
    with pytest.raises(LedgerError, match=r"^line 4: broken chain"):
        verify_ledger(ledger_path)


def test_truncated_ledger_still_counts_what_is_left(ledger_path):
    # Dropping the tail keeps a valid chain: what a crash leaves. It counts fewer releases,
    # which is why the release entry is written (and fsynced) before the release.
    lines = _lines(ledger_path)[:4]
    assert verify_ledger(lines).steps == 2


def test_a_cut_ledger_that_was_continued_fails(ledger_path, key):
    # A server that went on from a cut-off ledger records its true count in the next entry:
    # more than the entries left in the file re-account to.
    _write(ledger_path, _lines(ledger_path)[:-2])  # the last release and released lines
    ledger = Ledger.open(ledger_path, key, HEADER)  # a valid prefix: it continues
    assert ledger.releases == ROUNDS - 1
    _record(ledger, ROUNDS, SAMPLES, _accountant().epsilon_after(ROUNDS + 1))
    with pytest.raises(LedgerError, match=r"recorded epsilon .* re-account to only .* missing"):
        verify_ledger(ledger_path)


def _cosign_again(entries: list[dict[str, Any]], peer: Any) -> None:
    """Every co-signed entry re-chained from the header and co-signed by ``peer``."""
    head = plan_digest(entries[0])
    for entry in entries[1:]:
        if entry["kind"] in ("release", "close"):
            entry["signers"] = {
                entries[0]["server"]: entries[0]["public_key"],
                entries[0]["peer"]: entries[0]["peer_public_key"],
            }
            entry["chain"] = head
            entry["peer_sig"] = peer.sign(statement_bytes(entry)).hex()
            if entry["kind"] == "release":
                head = chain_after(entry)


def _forge_pair_keys(entries: list[dict[str, Any]], own: Any, peer: Any) -> list[bytes]:
    """A whole ledger made again by a forger holding two keys of its own: every release
    statement names them and is co-signed by ``peer``."""
    keys = {"public_key": public_key_hex(own), "peer_public_key": public_key_hex(peer)}
    out = [{**entries[0], **keys}] + [dict(e) for e in entries[1:]]
    return _resign(out, own, peer)


def test_resigned_ledger_fails_once_the_key_is_pinned(ledger_path, key):
    other, other_peer = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    # Another key alone: the release entries still name the real keys, co-signed by PEER.
    with pytest.raises(LedgerError, match=r"^line 2: signers differ from the header's keys"):
        verify_ledger(_resign(_entries(ledger_path), other))
    forged = _forge_pair_keys(_entries(ledger_path), other, other_peer)
    report = verify_ledger(forged)  # consistent on its own ...
    assert report.public_key == public_key_hex(other) and report.steps == ROUNDS
    pinned = {"h1": public_key_hex(key), "h2": public_key_hex(PEER)}
    with pytest.raises(LedgerError, match=r"^line 1: this server's public_key is not the key "):
        verify_ledger(forged, expected_keys=pinned)


def test_under_reported_epsilon(ledger_path, key):
    entries = _entries(ledger_path)
    for entry in entries:  # servers that sign a smaller count all along
        if entry["kind"] == "release":
            entry["epsilon_after"] *= 0.9
    lines = _resign(entries, key, PEER)
    last_release = max(i for i, e in enumerate(entries, 1) if e["kind"] == "release")
    with pytest.raises(LedgerError, match=rf"^line {last_release}: .*re-account to epsilon"):
        verify_ledger(lines)


def test_decreasing_epsilon_is_refused(ledger_path, key):
    entries = _entries(ledger_path)
    entries[3]["epsilon_after"] = entries[1]["epsilon_after"] / 2
    with pytest.raises(LedgerError, match=r"^line 4: epsilon_after .* below the previous"):
        verify_ledger(_resign(entries, key, PEER))


def test_release_that_differs_from_the_header(ledger_path, key):
    entries = _entries(ledger_path)
    entries[5]["noise_multiplier"] = 2.2  # line 6, the third release
    with pytest.raises(LedgerError, match=r"^line 6: noise_multiplier differs"):
        verify_ledger(_resign(entries, key))


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"index": 7}, "released index 7 has no release entry"),
        ({"round": 99}, "round 99, but release 0 was for round 0"),
    ],
)
def test_released_line_must_match_its_release(ledger_path, key, change, message):
    entries = _entries(ledger_path)
    entries[2].update(change)  # line 3, the first released line
    with pytest.raises(LedgerError, match=rf"^line 3: {message}"):
        verify_ledger(_resign(entries, key))


def test_non_canonical_line(ledger_path):
    lines = _lines(ledger_path)
    lines[-1] = json.dumps(json.loads(lines[-1])).encode()  # spaces: same object, other bytes
    _write(ledger_path, lines)
    with pytest.raises(LedgerError, match=rf"^line {len(lines)}: not in canonical form"):
        verify_ledger(ledger_path)


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([], "the ledger is empty"),
        ([b"{not json"], "line 1: not JSON"),
        ([b"[1, 2]"], "line 1: not a JSON object"),
        ([b'{"kind":"release","prev":null}'], "line 1: not a ledger header"),
    ],
)
def test_not_a_ledger(lines, message):
    with pytest.raises(LedgerError, match=message):
        verify_ledger(lines)


def test_no_noise_ledger_has_no_epsilon(tmp_path, key):
    path = tmp_path / "ledger.jsonl"
    ledger = Ledger.open(path, key, {**HEADER, "mode": "only-mpc", "noise_multiplier": 0.0})
    for t in range(3):
        ledger.record_released(_record(ledger, t, 0, math.inf), t, _sha(f"y{t}"))
    report = verify_ledger(path)
    assert (report.steps, report.released, report.noise_samples) == (3, 3, 0)
    assert report.epsilon is None and report.epsilon_recorded is None and report.delta is None


def test_a_release_needs_the_peer_signature(tmp_path, key):
    ledger = Ledger.open(tmp_path / "ledger.jsonl", key, HEADER)
    with pytest.raises(LedgerError, match="no valid signature of the peer server 'h2'"):
        ledger.record_release(0, SAMPLES, 1.0, clip_norm=CLIP)
    statement, mine = ledger.statement(0, SAMPLES, CLIP, 1.0)
    with pytest.raises(LedgerError, match="no valid signature of the peer"):
        # Its own signature is not the peer's.
        ledger.record_release(0, SAMPLES, 1.0, mine, clip_norm=CLIP)
    wrong, _ = ledger.statement(0, SAMPLES + 1, CLIP, 1.0)  # the peer signed another count
    with pytest.raises(LedgerError, match="no valid signature of the peer"):
        ledger.record_release(0, SAMPLES, 1.0, PEER.sign(wrong), clip_norm=CLIP)
    assert ledger.releases == 0  # nothing was written
    assert ledger.record_release(0, SAMPLES, 1.0, PEER.sign(statement), clip_norm=CLIP) == 0
    # The statement: the shared fields only, the same bytes on both servers.
    # Every field re-accounting reads (the index and running epsilon too), both servers' keys
    # by role, and the head before it (the plan's digest for the first).
    assert json.loads(statement) == {
        "kind": "release",
        "format": 4,
        "run_id": "run-1",
        "round": 0,
        "mode": "spgc",
        "plan_sha256": HEADER["plan_sha256"],
        "noise_multiplier": 1.1,
        "sampling": HEADER["sampling"],
        "accountant": "rdp",
        "delta": 1e-5,
        "sensitivity_units": 1024.0,
        "max_batch_size": 0,
        "clip": {"rule": "fixed", "clip_norm": 1.0},
        "backend": "gc",
        "verify_inputs": "none",
        "signers": {"h1": public_key_hex(key), "h2": public_key_hex(PEER)},
        "noise_samples": SAMPLES,
        "clip_norm": CLIP,
        "index": 0,
        "epsilon_after": 1.0,
        "chain": plan_digest(ledger.header),
    }
    h2_header = {**HEADER, "server": "h2", "peer": "h1", "peer_public_key": public_key_hex(key)}
    peer_view = Ledger.open(None, PEER, h2_header)
    assert peer_view.statement(0, SAMPLES, CLIP, 1.0)[0] == statement


def test_a_server_alone_cannot_change_a_cosigned_entry(ledger_path, key):
    """Holding its own key, a server re-signs its lines, but the peer's signature over the
    changed release no longer fits: caught, naming the line."""
    entries = _entries(ledger_path)
    entries[3]["noise_samples"] = 1  # line 4, the second release
    with pytest.raises(LedgerError, match=r"^line 4: bad or missing signature of the peer"):
        verify_ledger(_resign(entries, key))
    entries = _entries(ledger_path)
    del entries[5]["peer_sig"]
    with pytest.raises(LedgerError, match=r"^line 6: bad or missing signature of the peer"):
        verify_ledger(_resign(entries, key))
    # Dropping the peer key from the header of a two-server mode is refused as well.
    entries = _entries(ledger_path)
    entries[0]["peer_public_key"] = None
    with pytest.raises(LedgerError, match=r"^line 1: mode 'spgc' has two servers"):
        verify_ledger(_resign(entries, key))


def test_a_one_server_ledger_has_no_peer(tmp_path, key):
    header = {**HEADER, "mode": "ldp", "peer": None, "peer_public_key": None}
    ledger = Ledger.open(tmp_path / "ledger.jsonl", key, header)
    ledger.record_release(0, 10, _accountant().epsilon_after(1), clip_norm=CLIP)
    with pytest.raises(LedgerError, match="takes no peer signature"):
        ledger.record_release(1, 10, 1.0, b"x" * 64, clip_norm=CLIP)
    report = verify_ledger(ledger.lines)
    assert report.steps == 1 and report.cosigned is False and report.peer_public_key is None


def test_reopening_with_another_peer_key_is_refused(ledger_path, key):
    other = {**HEADER, "peer_public_key": public_key_hex(Ed25519PrivateKey.generate())}
    with pytest.raises(LedgerError, match="another signing key for the peer server 'h2'"):
        Ledger.open(ledger_path, key, other)


def test_load_signing_key(tmp_path, key):
    pem = tmp_path / "k.pem"
    pem.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    assert public_key_hex(load_signing_key(pem)) == public_key_hex(key)
    assert public_key_hex(key) == public_key_hex(key.public_key())
    with pytest.raises(ValueError, match="ledger signing key"):
        load_signing_key(tmp_path / "missing.pem")


# ---------------------------------------------------------------------------- spgc account


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="spgc")
    account_cmd.add_parser(p.add_subparsers(dest="command", required=True))
    return p


def _run(parser: argparse.ArgumentParser, capsys, *argv: str) -> tuple[int, str, str]:
    code = account_cmd.run(parser.parse_args(["account", *map(str, argv)]))
    out, err = capsys.readouterr()
    return code, out, err


def _pem(path: Path, key: Ed25519PrivateKey, private: bool) -> Path:
    if private:
        data = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    else:
        data = key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    path.write_bytes(data)
    return path


def test_cli_json(parser, capsys, closed_path, key):
    code, out, err = _run(parser, capsys, "--ledger", closed_path, "--json")
    assert (code, err) == (0, "")
    got = json.loads(out)
    assert {"steps", "epsilon", "delta", "signatures_valid"} <= set(got)
    assert (got["steps"], got["released"], got["noise_samples"]) == (ROUNDS, ROUNDS, 5 * SAMPLES)
    assert abs(got["epsilon"] - _accountant().epsilon_after(ROUNDS)) < 1e-9
    assert got["delta"] == 1e-5 and got["signatures_valid"] is True
    assert got["public_key"] == public_key_hex(key)
    assert got["differentially_private"] is True and got["keys_pinned"] is False
    assert "the peer server's on every release entry" in got["signatures_checked"]
    assert got["cosigned"] is True and got["peer_public_key"] == public_key_hex(PEER)
    # The delta the servers report: the accountant's plus the sampler's distance.
    sampler = (1 + math.exp(got["epsilon"])) * ROUNDS * SAMPLES * 2.0**-64
    assert got["delta_unmodelled"] == pytest.approx(sampler, rel=1e-12)
    assert got["delta_reported"] == pytest.approx(1e-5 + sampler, rel=1e-12)


def test_cli_human(parser, capsys, closed_path):
    code, out, err = _run(parser, capsys, "--ledger", closed_path)
    assert (code, err) == (0, "")
    assert out.startswith(f"ledger {closed_path}: verified\n")
    assert "run run-1, server h1, mode spgc" in out
    assert f"releases counted: {ROUNDS} " in out
    assert "re-accounted from the entries (RDP, noise multiplier 1.1)" in out
    assert "= 1e-05 (accountant) + " in out and "(sampler: (1 + e^epsilon) x their" in out
    assert "this ledger alone cannot establish:" in out and "who signed it" in out
    assert "complete: it is closed: a co-signed closing entry says no release follows" in out
    assert f"noise samples: {ROUNDS * SAMPLES}" in out
    assert "signatures valid (this server's key" in out
    assert "every release co-signed by the peer server's key" in out


@pytest.mark.parametrize("private", [False, True])
def test_cli_pinned_keys(parser, capsys, tmp_path, closed_path, key, private):
    other = _pem(tmp_path / "other.pem", Ed25519PrivateKey.generate(), private)
    mine = _pem(tmp_path / "mine.pem", key, private)
    peer = _pem(tmp_path / "peer.pem", PEER, private)
    argv = ("--ledger", closed_path, "--keys", f"h2={peer}", f"h1={mine}", "--json")
    code, out, err = _run(parser, capsys, *argv)
    assert (code, err) == (0, "")
    got = json.loads(out)
    assert got["keys_pinned"] is True
    assert not any("who signed" in what for what in got["cannot_establish_alone"])
    assert "PRIVATE" not in out  # the key file's contents are never printed

    code, out, err = _run(parser, capsys, "--ledger", closed_path, "--keys", f"h1={other}",
                          f"h2={peer}")  # fmt: skip
    assert (code, out) == (1, "")
    assert err == (
        f"spgc account: ledger {closed_path}: line 1: this server's public_key is not the key "
        "pinned for h1 (--keys)\n"
    )
    # Only this server's key pinned: the peer's key in the header is not trusted.
    code, out, err = _run(parser, capsys, "--ledger", closed_path, "--keys", f"h1={mine}")
    assert (code, out) == (1, "")
    assert "line 1: no key pinned for h2 (--keys h2=PEM)" in err
    # Both real keys, in the wrong roles: refused (a set of keys pins nothing).
    code, out, err = _run(parser, capsys, "--ledger", closed_path, "--keys", f"h1={peer}",
                          f"h2={mine}")  # fmt: skip
    assert code == 1 and "not the key pinned for h1" in err


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["PEM"], "--keys PEM: name each key's role: --keys h1=H1_KEY.pem h2=H2_KEY.pem"),
        (["h3=x.pem"], "--keys h3=x.pem: the role must be h1 or h2, got 'h3'"),
        (["h1=MINE", "h1=MINE"], "--keys: h1 is given twice"),
        (
            ["h1=MINE", "h2=MINE"],
            "--keys: h1 and h2 are pinned to the same key; each server has its own",
        ),
    ],
)
def test_cli_keys_name_their_roles(parser, capsys, tmp_path, ledger_path, key, keys, message):
    """The positional form (a set of keys) is refused with one line showing the new form."""
    mine = _pem(tmp_path / "mine.pem", key, False)
    argv = [k.replace("MINE", str(mine)) for k in keys]
    code, out, err = _run(parser, capsys, "--ledger", ledger_path, "--keys", *argv)
    assert (code, out) == (2, "")
    assert err == f"spgc account: error: {message}\n"


def test_cli_broken_ledger_exits_1_naming_the_line(parser, capsys, ledger_path):
    lines = _lines(ledger_path)
    del lines[5]
    _write(ledger_path, lines)
    code, out, err = _run(parser, capsys, "--ledger", ledger_path, "--json")
    assert (code, out) == (1, "")
    assert err.startswith(f"spgc account: ledger {ledger_path}: line 6: broken chain")
    assert err.count("\n") == 1


def test_cli_no_noise(parser, capsys, tmp_path, key):
    path = tmp_path / "ledger.jsonl"
    header = {**HEADER, "mode": "plain", "noise_multiplier": 0.0, "peer": None,
              "peer_public_key": None}  # fmt: skip
    ledger = Ledger.open(path, key, header)
    ledger.record_release(0, 0, math.inf, clip_norm=CLIP)
    ledger.record_close()  # one server: its own signature only
    code, out, _ = _run(parser, capsys, "--ledger", path)
    assert code == 0 and "NOT differentially private: mode plain adds no noise" in out
    code, out, _ = _run(parser, capsys, "--ledger", path, "--json")
    got = json.loads(out)
    assert code == 0 and got["steps"] == 1 and got["differentially_private"] is False
    assert got["epsilon"] is None and got["delta"] is None and got["delta_reported"] is None


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "10"], "--steps cannot be given with --ledger"),
        (
            ["--sampling-rate", "0.1", "--delta", "1e-5", "--accountant", "pld"],
            "--sampling-rate, --delta, --accountant cannot be given with --ledger",
        ),
        (["--keys", "h1=missing.pem"], "--keys missing.pem: No such file or directory"),
    ],
)
def test_cli_usage_errors_exit_2(parser, capsys, ledger_path, argv, message):
    code, out, err = _run(parser, capsys, "--ledger", ledger_path, *argv)
    assert (code, out) == (2, "")
    assert err.startswith(f"spgc account: error: {message}") and err.count("\n") == 1


def test_cli_unreadable_file_exits_2(parser, capsys, tmp_path):
    missing = tmp_path / "nothing.jsonl"
    code, out, err = _run(parser, capsys, "--ledger", missing)
    assert (code, out) == (2, "")
    assert err == f"spgc account: error: --ledger {missing}: No such file or directory\n"
    code, _, err = _run(parser, capsys, "--ledger", tmp_path)  # a directory
    assert code == 2 and err.startswith("spgc account: error: --ledger ")


def test_cli_bad_key_file_exits_2(parser, capsys, tmp_path, ledger_path):
    bad = tmp_path / "bad.pem"
    bad.write_text("not a key\n")
    code, _, err = _run(parser, capsys, "--ledger", ledger_path, "--keys", f"h1={bad}")
    assert (
        code == 2
        and err == f"spgc account: error: --keys {bad}: not a PEM key without a password\n"
    )


def test_cli_keys_without_ledger(parser, capsys, tmp_path):
    code, _, err = _run(
        parser, capsys, "--sigma", "1.1", "--sampling-rate", "0.01", "--steps", "10",
        "--delta", "1e-5", "--keys", f"h1={tmp_path / 'k.pem'}",
    )  # fmt: skip
    assert code == 2 and err == "spgc account: error: --keys goes with --ledger\n"


def test_cli_ledger_excludes_sigma(parser, capsys, ledger_path):
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["account", "--ledger", str(ledger_path), "--sigma", "1.1"])
    assert exc.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_console_script(closed_path):
    spgc = Path(sys.executable).parent / "spgc"
    done = subprocess.run(
        [str(spgc), "account", "--ledger", str(closed_path), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert got["steps"] == ROUNDS and got["signatures_valid"] is True
    assert abs(got["epsilon"] - _accountant().epsilon_after(ROUNDS)) < 1e-9

    lines = _lines(closed_path)
    entry = json.loads(lines[1])
    entry["round"] = 42
    lines[1] = canonical(entry)
    _write(closed_path, lines)
    # (in this process: the console script's start-up ran above)
    bad = run_in_process("account", "--ledger", str(closed_path))
    assert (bad.returncode, bad.stdout) == (1, "")
    assert bad.stderr == f"spgc account: ledger {closed_path}: line 2: bad signature\n"

    missing = run_in_process("account", "--ledger", str(closed_path.with_name("none.jsonl")))
    assert missing.returncode == 2 and "No such file or directory" in missing.stderr


def test_cli_under_count_exits_1(parser, capsys, ledger_path, key):
    entries = _entries(ledger_path)
    entries[-2]["epsilon_after"] = entries[-4]["epsilon_after"]  # the last release: one short
    _write(ledger_path, _resign(entries, key, PEER))
    code, out, err = _run(parser, capsys, "--ledger", ledger_path, "--json")
    assert (code, out) == (1, "")
    assert err.startswith(f"spgc account: ledger {ledger_path}: line {len(entries) - 1}: the ")
    assert "re-account to epsilon" in err and err.count("\n") == 1


def test_console_script_stderr_stays_empty(tmp_path, key):
    # At these values dp-accounting logs excluded RDP orders; the command keeps stderr clean.
    path = tmp_path / "ledger.jsonl"
    header = {**HEADER, "noise_multiplier": 0.76, "sampling": {"sampling_rate": 0.077}}
    ledger = Ledger.open(path, key, header)
    acc = PrivacyAccountant(0.76, 1e-5, sampling_rate=0.077)
    for t in range(3):
        _record(ledger, t, 62, acc.epsilon_after(t + 1))
    _close(ledger)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "spgc"), "account", "--ledger", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, ""), done.stderr
    assert "releases counted: 3 " in done.stdout


def test_a_write_torn_by_a_crash_is_cut_off(ledger_path, key):
    """A last line without its newline never finished (its fsync never returned, so its
    release never happened): verification leaves it out, reopening cuts it off and keeps it."""
    intact = ledger_path.read_bytes()
    torn = b'{"index":5,"kind":"release","mode":"sp'
    ledger_path.write_bytes(intact + torn)
    assert verify_ledger(ledger_path).steps == ROUNDS
    ledger = _build(ledger_path, key, rounds=1)
    assert ledger.releases == ROUNDS + 1
    assert ledger_path.read_bytes().startswith(intact)
    assert ledger_path.with_name("ledger.jsonl.torn").read_bytes() == torn + b"\n"
    assert verify_ledger(ledger_path).steps == ROUNDS + 1


def _pair(
    tmp_path: Path, key: Ed25519PrivateKey, rounds: tuple[int, int], *, close: bool = True
) -> tuple[Path, Path]:
    """Both servers' ledgers of one run: h1 signed by ``key``, h2 by PEER, each release
    co-signed by the other; ``rounds``: how many releases each holds (the same rounds);
    closed (co-signed closing entries) when they hold the same and ``close``."""
    h2_header = {**HEADER, "server": "h2", "peer": "h1", "peer_public_key": public_key_hex(key)}
    paths = (tmp_path / "h1.jsonl", tmp_path / "h2.jsonl")
    for path, own, other, header, count in (
        (paths[0], key, PEER, HEADER, rounds[0]),
        (paths[1], PEER, key, h2_header, rounds[1]),
    ):
        ledger = Ledger.open(path, own, header)
        acc = _accountant()
        for i in range(count):
            _record(ledger, i, SAMPLES, acc.epsilon_after(i + 1), peer=other)
        if close and rounds[0] == rounds[1]:  # a finished run: both hold every release
            _close(ledger, peer=other)
    return paths


@pytest.mark.parametrize(
    ("rounds", "code", "said"),
    [
        ((5, 5), 0, "the two ledgers agree (5 and 5 release entries, the same plan and"),
        # A crash between the two entries: agreed, but the run was not closed.
        ((4, 5), 3, "the run counted 5 release(s)"),
        ((3, 5), 1, "h2's ledger holds 2 releases that h1's lacks (h1 3, h2 5 release"),
        # H2 records first: h1's holding one more means h2 dropped it (and re-signed).
        ((5, 4), 1, "h1's ledger holds a release that h2's lacks (h1 5, h2 4 release entries)"),
    ],
)
def test_cli_checks_both_servers_ledgers_against_each_other(
    parser, capsys, tmp_path, key, rounds, code, said
):
    h1, h2 = _pair(tmp_path, key, rounds)
    got, out, err = _run(parser, capsys, "--ledger", h1, h2)
    assert got == code and said in (out + err)
    if code == 0:
        got, out, _ = _run(parser, capsys, "--ledger", h1, h2, "--json")
        both = json.loads(out)
        assert both["consistent"] and both["steps"] == max(rounds)
        assert both["epsilon"] == pytest.approx(_accountant().epsilon_after(max(rounds)))


def test_cli_refuses_two_ledgers_that_are_not_one_pair(parser, capsys, tmp_path, key):
    h1, _ = _pair(tmp_path, key, (2, 2))
    stranger = tmp_path / "other" / "h2.jsonl"
    stranger.parent.mkdir()
    _pair(stranger.parent, Ed25519PrivateKey.generate(), (2, 2))
    code, _, err = _run(parser, capsys, "--ledger", h1, stranger)
    assert code == 1 and "do not name each other's signing keys" in err
    code, _, err = _run(parser, capsys, "--ledger", h1, h1, h1)
    assert code == 2 and "one file, or the two servers' ledgers" in err


def test_a_ledger_is_re_accounted_with_the_accountant_its_header_names(
    parser, capsys, tmp_path, key
):
    # rdp_discrete gives a larger epsilon for the same releases: entries that claim the rdp
    # figures under a header naming rdp_discrete under-count, and the check says so.
    header = {**HEADER, "accountant": "rdp_discrete"}
    proved = PrivacyAccountant(1.1, 1e-5, sampling_rate=0.01, method="rdp_discrete")
    honest, short = tmp_path / "honest.jsonl", tmp_path / "short.jsonl"
    for path, acc in ((honest, proved), (short, _accountant())):
        ledger = Ledger.open(path, key, header)
        for t in range(ROUNDS):
            index = _record(ledger, t, SAMPLES, acc.epsilon_after(t + 1))
            ledger.record_released(index, t, _sha(f"y{t}"))
        _close(ledger)
    code, out, err = _run(parser, capsys, "--ledger", honest, "--json")
    assert (code, err) == (0, "")
    got = json.loads(out)
    assert got["epsilon"] == pytest.approx(proved.epsilon_after(ROUNDS), rel=1e-12)
    assert got["epsilon"] > _accountant().epsilon_after(ROUNDS)
    code, out, err = _run(parser, capsys, "--ledger", short, "--json")
    assert (code, out) == (1, "") and "re-account to epsilon" in err


# ------------------------------------------------ the feature statistics' release (issue 48)

STATS_PLAN = {"noise_multiplier": 3.2, "sensitivity_units": 4096.0, "features": 8}


def _stats_ledger(path: Path, key: Ed25519PrivateKey, *, recorded_with_stats: bool = True):
    """A run with standardize: the feature statistics' release (index 0), then ROUNDS steps;
    each entry's epsilon_after counted with the release composed (unless told otherwise)."""
    ledger = Ledger.open(path, key, {**HEADER, "feature_stats": STATS_PLAN})
    with_stats = PrivacyAccountant(
        1.1, 1e-5, sampling_rate=0.01, method="rdp", sampling="poisson", unsampled=[3.2]
    )
    counted = with_stats if recorded_with_stats else _accountant()
    statement, _ = ledger.statement(0, SAMPLES, CLIP, counted.epsilon_after(0), "feature_stats")
    index = ledger.record_release(
        0, SAMPLES, counted.epsilon_after(0), PEER.sign(statement), clip_norm=CLIP,
        release="feature_stats",
    )  # fmt: skip
    ledger.record_released(index, 0, _sha("stats"))
    for i in range(1, ROUNDS + 1):
        index = _record(ledger, i, SAMPLES, counted.epsilon_after(i))
        ledger.record_released(index, i, _sha(f"y{i}"))
    _close(ledger)
    return with_stats


def test_the_feature_statistics_release_is_counted_and_re_accounted(
    parser, capsys, ledger_path, key
):
    path = ledger_path.with_name("stats.jsonl")
    with_stats = _stats_ledger(path, key)
    report = verify_ledger(path)
    assert (report.steps, report.feature_stats_releases) == (ROUNDS + 1, 1)
    assert report.epsilon == pytest.approx(with_stats.epsilon_after(ROUNDS), abs=1e-9)
    assert report.epsilon > _accountant().epsilon_after(ROUNDS)  # the release costs something
    assert report.clip_norms == [CLIP] * ROUNDS  # the steps' clip norms only
    code, out, _ = _run(parser, capsys, "--ledger", path, "--json")
    got = json.loads(out)
    assert code == 0 and got["feature_stats_releases"] == 1
    assert got["feature_stats"] == STATS_PLAN
    assert got["epsilon"] == pytest.approx(with_stats.epsilon_after(ROUNDS), abs=1e-9)
    code, out, _ = _run(parser, capsys, "--ledger", path)
    assert code == 0 and "includes the feature statistics' release" in out
    # A ledger without the release re-accounts as before: the header gains no key.
    assert "feature_stats" not in json.loads(_lines(ledger_path)[0])
    assert verify_ledger(ledger_path).feature_stats_releases == 0


def test_a_server_that_leaves_the_statistics_out_of_its_count_is_caught(ledger_path, key):
    path = ledger_path.with_name("stats.jsonl")
    _stats_ledger(path, key, recorded_with_stats=False)
    with pytest.raises(LedgerError, match=r"re-account to epsilon .* above the recorded"):
        verify_ledger(path)


def test_the_statistics_release_is_the_first_and_of_a_plan_that_names_it(tmp_path, key):
    late = Ledger.open(tmp_path / "late.jsonl", key, {**HEADER, "feature_stats": STATS_PLAN})
    _record(late, 0, SAMPLES, 0.1)
    statement, _ = late.statement(1, SAMPLES, CLIP, 1.0, "feature_stats")
    late.record_release(1, SAMPLES, 1.0, PEER.sign(statement), clip_norm=CLIP,
                        release="feature_stats")  # fmt: skip
    with pytest.raises(LedgerError, match=r"line 3: .* once, before the first step"):
        verify_ledger(tmp_path / "late.jsonl")
    unplanned = Ledger.open(tmp_path / "unplanned.jsonl", key, HEADER)
    statement, _ = unplanned.statement(0, SAMPLES, CLIP, 1.0, "feature_stats")
    unplanned.record_release(0, SAMPLES, 1.0, PEER.sign(statement), clip_norm=CLIP,
                             release="feature_stats")  # fmt: skip
    with pytest.raises(LedgerError, match=r"line 2: .* the header's plan has none"):
        verify_ledger(tmp_path / "unplanned.jsonl")
    bad = Ledger.open(tmp_path / "bad.jsonl", key, {**HEADER, "feature_stats": {"features": 2}})
    with pytest.raises(LedgerError, match="line 1: feature_stats must be"):
        verify_ledger(bad.lines)


def test_the_statistics_plan_is_co_signed(ledger_path, key):
    path = ledger_path.with_name("stats.jsonl")
    _stats_ledger(path, key)
    entries = [json.loads(line) for line in _lines(path)]
    for entry in entries:
        if "feature_stats" in entry:  # a server that claims cheaper statistics
            entry["feature_stats"] = {**STATS_PLAN, "noise_multiplier": 30.0}
    _write(path, _resign(entries, key))
    # The first co-signed statement names the plan's digest, the statistics' plan in it.
    with pytest.raises(LedgerError, match="line 2: chain does not name the co-signed entry"):
        verify_ledger(path)

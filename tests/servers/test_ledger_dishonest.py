"""A dishonest server with its own real signing key cannot fool `spgc account` (issue 32).

Each test is one hole an audit found on the ledger as it was: a header re-signed with the
server's own key (delta, accountant), the two-ledger figure taken from the first file, keys
pinned as a set rather than per role, a header naming its own key as the peer's, h2's extra
release accepted anywhere, and a delta that left out the capped-Poisson term.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from test_ledger import (
    HEADER,
    PEER,
    ROUNDS,
    SAMPLES,
    _accountant,
    _entries,
    _forge_pair_keys,
    _pair,
    _pem,
    _record,
    _resign,
    _run,
    _write,
)
from test_ledger import parser as parser  # the module's fixture

from spgc.privacy.accounting import reported_delta
from spgc.privacy.ledger import Ledger
from spgc.privacy.ledger_format import LedgerError, canonical, public_key_hex
from spgc.privacy.ledger_pair import compare_ledgers
from spgc.privacy.ledger_verify import verify_ledger
from spgc.servers.intake import ShareIntake
from spgc.servers.state import ServerState
from spgc.settings.config import ServerConfig
from spgc.settings.plan import make_plan
from spgc.wire import aggregation_pb2 as pb


@pytest.fixture
def key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


@pytest.fixture
def pair(tmp_path: Path, key: Ed25519PrivateKey) -> tuple[Path, Path]:
    """h1's ledger (signed by ``key``) and h2's (signed by PEER), 5 releases each."""
    return _pair(tmp_path, key, (ROUNDS, ROUNDS))


@pytest.fixture
def role_keys(tmp_path: Path, key: Ed25519PrivateKey) -> list[str]:
    """``--keys h1=PEM h2=PEM`` for the pair's two real keys (public PEM files)."""
    h1, h2 = _pem(tmp_path / "h1.pub", key, False), _pem(tmp_path / "h2.pub", PEER, False)
    return [f"h1={h1}", f"h2={h2}"]


def _resigned_header(path: Path, key: Ed25519PrivateKey, **changes: Any) -> None:
    """What the audit did: change the header's fields and re-sign the whole file with the
    server's own real key (the release entries, co-signed by the peer, left as they were)."""
    entries = _entries(path)
    entries[0].update(changes)
    _write(path, _resign(entries, key))


@pytest.mark.parametrize("change", [{"delta": 0.5}, {"accountant": "pld"}])
@pytest.mark.parametrize("order", ["h1 h2", "h2 h1"])
def test_a_header_re_signed_with_the_servers_own_key_is_caught(
    parser, capsys, pair, key, role_keys, change, order
):
    """Before: "the two ledgers agree ... epsilon 0" (delta 0.5), or 3.23 for a run that spent
    4.0 (accountant pld), exit 0. The statement both servers sign now holds every field that
    re-accounting reads, and each release entry must repeat its header's."""
    h1, h2 = pair
    _resigned_header(h1, key, **change)
    files = [h1, h2] if order == "h1 h2" else [h2, h1]
    code, out, err = _run(parser, capsys, "--ledger", *files, "--keys", *role_keys)
    field = next(iter(change))
    assert (code, out) == (1, "")
    assert err == f"spgc account: ledger {h1}: line 2: {field} differs from the header's\n"


@pytest.mark.parametrize("change", [{"delta": 0.5}, {"accountant": "pld"}])
def test_changing_the_release_entries_too_breaks_the_peers_signature(pair, key, change):
    h1, _ = pair
    entries = _entries(h1)
    for entry in entries:
        if entry["kind"] in ("header", "release"):
            entry.update(change)
    with pytest.raises(LedgerError, match=r"^line 2: chain does not name the co-signed entry"):
        verify_ledger(_resign(entries, key))


def test_compare_ledgers_names_the_first_field_that_differs(tmp_path, key):
    """Two ledgers, each consistent and co-signed, that disagree on the plan: refused field
    by field (before, only run id and plan hash were compared)."""
    h2_header = {**HEADER, "server": "h2", "peer": "h1", "peer_public_key": public_key_hex(key)}
    lines = []
    for sub, own, other, header in (
        ("a", key, PEER, {**HEADER, "delta": 1e-6}),
        ("b", PEER, key, h2_header),
    ):
        ledger = Ledger.open(tmp_path / f"{sub}.jsonl", own, header)
        _record(ledger, 0, SAMPLES, 1.0, peer=other)
        lines.append(ledger.lines)
    with pytest.raises(LedgerError, match=r"^the headers differ in delta: h1 1e-06, h2 1e-05$"):
        compare_ledgers(*lines)
    # Release entries are compared field by field too, naming the entry and the field.
    a, b = (Ledger.open(tmp_path / f"{s}2.jsonl", k, h) for s, k, h in
            (("a", key, HEADER), ("b", PEER, h2_header)))  # fmt: skip
    _record(a, 0, SAMPLES, 1.0)
    _record(b, 0, SAMPLES + 1, 1.0, peer=key)
    with pytest.raises(LedgerError, match=r"^release entry 0 differs in noise_samples: h1 1000,"):
        compare_ledgers(a.lines, b.lines)


@pytest.mark.parametrize("order", ["h1 h2", "h2 h1"])
def test_the_figure_for_a_run_is_the_worse_of_the_two_ledgers(
    parser, capsys, tmp_path, key, role_keys, order
):
    """h2 holds one release more (a crash between the two entries): whatever the order of
    the files, the run's figure is h2's (before: the first file's)."""
    h1, h2 = _pair(tmp_path, key, (ROUNDS - 1, ROUNDS))
    files = [h1, h2] if order == "h1 h2" else [h2, h1]
    code, out, err = _run(parser, capsys, "--ledger", *files, "--keys", *role_keys, "--json")
    assert code == 3 and "later releases cannot be ruled out" in err  # not closed
    both = json.loads(out)
    expected = _accountant().epsilon_after(ROUNDS)
    assert both["steps"] == ROUNDS and both["epsilon"] == pytest.approx(expected, rel=1e-12)
    assert both["delta_reported"] == max(a["delta_reported"] for a in both["ledgers"])
    assert both["keys_pinned"] is True
    # The keys are pinned, the two agree; what is left is that the run was not closed.
    for a in both["ledgers"]:
        (left,) = a["cannot_establish_alone"]
        assert left.startswith("that no release followed its last entry")


def test_one_ledger_says_what_it_cannot_establish_alone(parser, capsys, tmp_path, key, role_keys):
    h1, _ = _pair(tmp_path, key, (ROUNDS, ROUNDS), close=False)  # a run not closed (yet)
    code, out, _ = _run(parser, capsys, "--ledger", h1, "--keys", *role_keys, "--json")
    assert code == 3
    alone = json.loads(out)["cannot_establish_alone"]
    assert len(alone) == 1 and "that no release followed its last entry" in alone[0]
    code, out, _ = _run(parser, capsys, "--ledger", h1)
    assert code == 3 and "this ledger alone cannot establish:" in out
    assert "without --keys h1=PEM h2=PEM any key pair could have made this ledger" in out


def test_a_header_naming_its_own_key_as_the_peers_is_refused(parser, capsys, pair, key, role_keys):
    """Before: a ledger whose header named its own key as the peer's, co-signed by itself,
    passed a single-file check with both real keys pinned (as a set)."""
    h1, _ = pair
    _write(h1, _forge_pair_keys(_entries(h1), key, key))
    code, out, err = _run(parser, capsys, "--ledger", h1, "--keys", *role_keys)
    assert (code, out) == (1, "")
    assert "line 1: the header names this server's own key as the peer server's" in err
    with pytest.raises(LedgerError, match="the peer server's ledger key is this server's own"):
        Ledger.open(None, key, {**HEADER, "peer_public_key": public_key_hex(key)})


def test_keys_are_pinned_per_role(parser, capsys, pair, role_keys):
    """h2's ledger checked with the two real keys in swapped roles is refused."""
    _, h2 = pair
    swapped = [f"h1={role_keys[1].split('=', 1)[1]}", f"h2={role_keys[0].split('=', 1)[1]}"]
    assert _run(parser, capsys, "--ledger", h2, "--keys", *role_keys)[0] == 0
    code, _, err = _run(parser, capsys, "--ledger", h2, "--keys", *swapped)
    assert code == 1 and "this server's public_key is not the key pinned for h2" in err


def _drop_release(path: Path, key: Ed25519PrivateKey, index: int) -> None:
    """h1 drops release ``index`` from its ledger, renumbers the rest, fixes its own counts
    and re-signs its chain with its own key."""
    entries = [e for e in _entries(path) if not (e["kind"] == "release" and e["index"] == index)]
    acc, n = _accountant(), 0
    for entry in entries:
        if entry["kind"] == "release":
            entry["index"], entry["epsilon_after"] = n, acc.epsilon_after(n + 1)
            n += 1
    _write(path, _resign(entries, key))


def test_h2s_one_extra_release_only_as_its_last(parser, capsys, tmp_path, key, role_keys):
    """h2 may hold one release more than h1, written just before a crash: only as its last
    release entry; the pair then verifies, but is not closed (exit 3)."""
    h1, h2 = _pair(tmp_path, key, (ROUNDS, ROUNDS), close=False)
    _drop_release(h1, key, ROUNDS - 1)
    assert verify_ledger(h1).steps == ROUNDS - 1  # a prefix: it verifies alone
    code, out, err = _run(parser, capsys, "--ledger", h1, h2, "--keys", *role_keys)
    assert code == 3 and f"the run counted {ROUNDS} release(s)" in out
    assert "later releases cannot be ruled out" in err


@pytest.mark.parametrize("dropped", [2, 0])
def test_one_ledger_cannot_drop_a_middle_release(parser, capsys, pair, key, role_keys, dropped):
    """Issue 45, hole 2. Before: h1 dropped a middle release, renumbered and re-signed its
    file (index and epsilon_after were not co-signed): exit 0, epsilon 3.83. Each co-signed
    statement now names the head before it, and its index and running epsilon: caught at the
    entry after the gap, alone or in a pair."""
    h1, h2 = pair
    _drop_release(h1, key, dropped)
    line = 2 + dropped  # the release that followed the dropped one (no released lines)
    with pytest.raises(LedgerError, match=rf"^line {line}: (chain does not name|bad or missing)"):
        verify_ledger(h1)
    code, out, err = _run(parser, capsys, "--ledger", h1, h2, "--keys", *role_keys)
    assert (code, out) == (1, "") and f"line {line}: " in err


def test_a_format_1_ledger_is_refused(pair, key):
    h1, _ = pair
    entries = _entries(h1)
    entries[0]["format"] = 1
    with pytest.raises(LedgerError, match=r"^line 1: ledger format 1 \(written before delta and"):
        verify_ledger(_resign(entries, key))


def test_spgc_account_reports_the_servers_delta(tmp_path):
    """One delta formula: a Poisson run capped by max_batch_size adds 2^-64 per release to
    delta; the servers counted it and `spgc account` left it out (before)."""
    cfg = ServerConfig(role=1, mode="ldp", insecure=True, providers=["p1"], dataset="cancer",
                       max_batch_size=40, rounds=50, min_providers=1, target_epsilon=10.0,
                       noise_multiplier=1.0)  # fmt: skip
    plan = make_plan(cfg)
    state = ServerState(plan, pb.SERVER_ROLE_H1, ShareIntake(plan.dim, plan.ring_bits, tmp_path))
    state.run_id, state.config = "capped", plan.training_config("capped")
    for t in range(3):
        state.record_release(t, providers=1)
    assert state.ledger is not None
    report = verify_ledger(state.ledger.lines)
    assert report.delta_reported == state.reported_delta()
    samples = 3 * plan.noise_samples_per_step(1)
    uncapped = reported_delta(cfg.target_delta, report.epsilon, samples)
    assert report.delta_reported == reported_delta(cfg.target_delta, report.epsilon, samples, 3)
    assert report.delta_reported > uncapped
    assert json.loads(state.ledger.lines[0])["max_batch_size"] == 40


# ------------------------------------------------------------------ issue 45: what was released


def _model_report(path: Path, run_id: str, releases: int, chain: str) -> Path:
    """A released model's privacy report naming the ledger head it depends on."""
    path.write_text(json.dumps({"run_id": run_id, "ledger_head": {"releases": releases,
                                                                   "chain": chain}}))  # fmt: skip
    return path


def _cut(path: Path, releases: int) -> None:
    """The ledger as it was after ``releases`` release entries (a prefix: still valid)."""
    lines, kept, seen = _entries(path), [], 0
    for entry in lines:
        if entry["kind"] == "release":
            seen += 1
        if seen > releases or entry["kind"] == "close":
            break
        kept.append(entry)
    _write(path, [canonical(e) for e in kept])


@pytest.mark.parametrize("left", [0, ROUNDS - 2])
def test_a_truncated_pair_is_not_complete(parser, capsys, tmp_path, pair, role_keys, left):
    """Issue 45, hole 1. Before: both ledgers cut after the header printed "the two ledgers
    agree" with epsilon 0, exit 0; cut by two releases, 3.63 for a run that spent 4.0. A
    finished run is closed by a co-signed entry; a pair without one exits 3, and a pair that
    does not hold the head of the model it must cover fails."""
    h1, h2 = pair
    full = verify_ledger(h1)
    assert full.closed and full.steps == ROUNDS
    model = _model_report(tmp_path / "model.json", "run-1", ROUNDS, full.head)
    argv = ("--ledger", h1, h2, "--keys", *role_keys)
    code, out, err = _run(parser, capsys, *argv, "--model", model, "--json")
    assert (code, err) == (0, "") and json.loads(out)["complete"] is True
    for path in (h1, h2):
        _cut(path, left)
    code, out, err = _run(parser, capsys, *argv, "--json")
    assert code == 3 and json.loads(out)["complete"] is False
    for a in json.loads(out)["ledgers"]:  # before: [] with both keys pinned
        assert a["cannot_establish_alone"][0].startswith("that no release followed")
    assert err == (
        "spgc account: later releases cannot be ruled out: the ledgers hold no closing entry; "
        "give --model FILE (the latest model or export of the run) to check that they cover it "
        "(exit 3)\n"
    )
    code, out, err = _run(parser, capsys, *argv, "--model", model)
    assert (code, out) == (1, "")
    assert f"the model depends on {ROUNDS} release(s), the ledger holds only {left}" in err


def test_a_model_released_before_the_last_release_is_covered(parser, capsys, tmp_path, pair):
    """A model published after 2 releases is covered by the whole pair (its head is there);
    a head that is not the ledgers' after 2 releases is refused."""
    h1, h2 = pair
    heads = verify_ledger(h1).heads
    model = _model_report(tmp_path / "v2.json", "run-1", 2, heads[2])
    code, out, _ = _run(parser, capsys, "--ledger", h1, h2, "--model", model, "--json")
    assert code == 0 and json.loads(out)["steps"] == ROUNDS
    wrong = _model_report(tmp_path / "w.json", "run-1", 2, heads[3])
    code, _, err = _run(parser, capsys, "--ledger", h1, h2, "--model", wrong)
    assert code == 1 and "head after 2 release(s) is not the one the model names" in err


def test_an_older_runs_pair_does_not_cover_a_newer_model(parser, capsys, tmp_path, pair):
    """Issue 45, hole 1. Before: the pair of an older run kept in the same state_dir, signed
    with the same keys, passed (exit 0, epsilon 1.0)."""
    h1, h2 = pair  # run-1, closed
    newer = _model_report(tmp_path / "model.json", "run-2", 7, "ab" * 32)
    code, out, err = _run(parser, capsys, "--ledger", h1, h2, "--model", newer)
    assert (code, out) == (1, "")
    assert err == f"spgc account: ledger {h1}: the ledger is of run run-1, the model of run run-2\n"
    code, _, err = _run(parser, capsys, "--ledger", h1, h2, "--run-id", "run-2")
    assert code == 1 and "the ledger is of run run-1, not of --run-id run-2" in err
    assert _run(parser, capsys, "--ledger", h1, h2, "--run-id", "run-1")[0] == 0


@pytest.mark.parametrize(("field", "value"), [("backend", "gmw"), ("verify_inputs", "l2")])
def test_every_plan_field_of_the_header_is_cosigned(parser, capsys, pair, key, role_keys,
                                                      field, value):  # fmt: skip
    """Issue 45, hole 3. Before: h1 flipped verify_inputs and backend in its header and
    re-signed it: exit 0, the two ledgers reporting l2/gc and none/gmw."""
    h1, h2 = pair
    _resigned_header(h1, key, **{field: value})
    code, out, err = _run(parser, capsys, "--ledger", h1, h2, "--keys", *role_keys)
    assert (code, out) == (1, "")
    assert err == f"spgc account: ledger {h1}: line 2: {field} differs from the header's\n"


def test_a_closed_ledger_takes_no_release(tmp_path, key):
    ledger = Ledger.open(tmp_path / "l.jsonl", key, HEADER)
    _record(ledger, 0, SAMPLES, 1.0)
    statement, _ = ledger.close_statement()
    ledger.record_close(PEER.sign(statement))
    with pytest.raises(LedgerError, match="round 1: this run's ledger is closed"):
        ledger.statement(1, SAMPLES, 1.0, 2.0)
    entries = [json.loads(line) for line in ledger.lines]
    lines = _resign([*entries, dict(entries[1])], key)  # a release after the closing entry
    with pytest.raises(LedgerError, match=r"^line 4: follows the closing entry \(line 3\)"):
        verify_ledger(lines)


def test_the_header_names_the_batch_cap_verify_inputs_sets(tmp_path):
    """Issue 45, hole 3. Before: with verify_inputs the plan capped batches (TrainingConfig
    max_batch_size), but the header said max_batch_size 0, so the capped-batch term of the
    reported delta was left out. The header names the cap the providers apply."""
    cfg = ServerConfig(role=1, mode="spgc", insecure=True, providers=["p1", "p2", "p3"],
                       dataset="cancer", rounds=50, min_providers=1, target_epsilon=10.0,
                       noise_multiplier=1.0, verify_inputs="l2")  # fmt: skip
    plan = make_plan(cfg)
    assert cfg.max_batch_size == 0 and plan.max_batch_size > 0
    state = ServerState(plan, pb.SERVER_ROLE_H1, ShareIntake(plan.dim, plan.ring_bits, tmp_path))
    state.run_id, state.config = "capped", plan.training_config("capped")
    state.set_peer_ledger_key(PEER.public_key().public_bytes_raw())
    state.open_ledger()
    assert state.ledger is not None
    header = json.loads(state.ledger.lines[0])
    assert header["max_batch_size"] == plan.max_batch_size
    assert (header["backend"], header["verify_inputs"]) == ("gc", "l2")
    state.releases = 2  # as after two releases: each counts its capped-batch term
    samples = state.noise_samples()
    assert state.reported_delta() == reported_delta(cfg.target_delta, state.epsilon(), samples, 2)

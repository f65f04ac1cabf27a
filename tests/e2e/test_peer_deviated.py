"""The abort path through the daemons (issue 46 item 2; docs/MALICIOUS.md, "What must hold" 3).

``SPGC_FAULT_INJECT=peer-deviated:1`` makes one server's engine report the peer caught
deviating (garbled_core.PeerDeviated) in the middle of round 1's circuit (servers.faults), as
the authenticated engine does when a check fails. That server stops the run: it releases
nothing of round 1 (no reveal, no released line, no model v2), keeps the evidence and ends its
ledger with an abort entry signed by it alone; round 0 and round 1's release entry (written
before its circuit) stay counted, and ``spgc account`` shows the abort. The daemons run as
separate processes, as an operator runs them; the other server, which did nothing wrong here,
is stopped at the end. And a malicious run in which no one deviates trains to its end, in mode
spgc and in mode preprocessed; and a real cheater (``cheat-opening``: H1's engine adds a
constant to an opened value) is caught by H2's engine itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_crash_faults import _events, _start_all, _stop, _wait

from spgc.app.demo import DemoOptions, write_configs
from spgc.learning.export import read_report
from spgc.privacy.ledger_format import abort_line
from spgc.privacy.ledger_verify import verify_ledger
from spgc.servers.faults import INJECTED_CHECK

ROUND = 1


def _configs(
    tmp_path: Path, backend: str, security: str, mode: str = "spgc"
) -> tuple[list[Path], list[Path]]:
    work = tmp_path / "work"
    work.mkdir()
    opts = DemoOptions(
        dataset="cancer",
        providers=2,
        rounds=3,
        mode=mode,
        backend=backend,
        epsilon=8.0,
        state_dir=tmp_path / "state",
        # round_deadline: a round closes once both shares are in; the deadline only has to
        # outlast the providers' start-up on a loaded machine (test_crash_faults).
        server_overrides={"security": security, "round_deadline": 45.0, "evaluate": False},
    )
    return write_configs(opts, work)


def _account(*ledgers: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(Path(sys.executable).parent / "spgc"), "account", "--ledger", *map(str, ledgers)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("backend", "mode"),
    [("gmw", "spgc"), ("gmw", "preprocessed"), ("gc", "spgc"), ("gc", "preprocessed")],
)
def test_a_malicious_run_trains_to_its_end(tmp_path: Path, backend: str, mode: str) -> None:
    """Authenticated GMW or authenticated garbling for every round of a run (no one deviates;
    in mode preprocessed, for the pool's production): it finishes, and the plan's level is in
    both summaries, both co-signed ledgers (closed) and the models."""
    server_cfgs, provider_cfgs = _configs(tmp_path, backend, "malicious", mode)
    work, state = tmp_path / "work", tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if k != "SPGC_FAULT_INJECT"}
    logs = [work / f"{c.stem}.log" for c in server_cfgs + provider_cfgs]
    servers = _start_all("spgc.servers", server_cfgs, env, {})
    providers = list(_start_all("spgc.providers", provider_cfgs, env, {}).values())
    try:
        for name, proc in servers.items():
            assert _wait(proc, 240, name, logs) == 0, (work / f"{name}.log").read_text()[-3000:]
    finally:
        _stop([*servers.values(), *providers])
    for name in ("h1", "h2"):
        summary = json.loads((work / f"{name}-summary.json").read_text())
        assert summary["finished"] and summary["security"] == "malicious"
        assert summary["model_version"] == 3 and "abort" not in summary
        report = verify_ledger(state / name / "ledger.jsonl")
        assert report.security == "malicious" and report.closed and report.abort is None
        assert read_report(state / name / "model.safetensors")["security"] == "malicious"
    done = _account(state / "h1" / "ledger.jsonl", state / "h2" / "ledger.jsonl")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(f"mode {mode}, backend {backend}, security malicious") == 2
    if mode == "preprocessed":  # every production seed committed (and proved) on both sides
        for name in ("h1", "h2"):
            assert "noise block 0: seed commitments h" in (work / f"{name}.log").read_text()


@pytest.mark.parametrize(
    ("catcher", "backend", "security", "evidence"),
    [
        # the engine's digest of everything the peer sent in the run is the evidence
        ("h1", "gmw", "malicious", "transcript"),
        ("h2", "gmw", "malicious", "transcript"),
        # a semi-honest engine keeps no digest: the SHA-256 of the check's message
        ("h2", "gc", "semi-honest", "message"),
    ],
)
def test_a_server_that_catches_its_peer_stops_and_records_the_abort(
    tmp_path: Path, catcher: str, backend: str, security: str, evidence: str
) -> None:
    server_cfgs, provider_cfgs = _configs(tmp_path, backend, security)
    work, state = tmp_path / "work", tmp_path / "state"
    tap = tmp_path / "reveals.jsonl"
    env = {**os.environ, "SPGC_REVEAL_TAP": str(tap)}
    env.pop("SPGC_FAULT_INJECT", None)
    logs = [work / f"{c.stem}.log" for c in server_cfgs + provider_cfgs]
    fault = {catcher: {"SPGC_FAULT_INJECT": f"peer-deviated:{ROUND}"}}
    servers = _start_all("spgc.servers", server_cfgs, env, fault)
    providers = list(_start_all("spgc.providers", provider_cfgs, env, {}).values())
    other = "h2" if catcher == "h1" else "h1"
    try:
        assert _wait(servers[catcher], 240, catcher, logs) == 1  # failed, not killed
        # The other server hears why at once (H1 tells H2; H2 answers H1's next call with
        # it), not after its peer_timeout (1200 s here), and stops too.
        assert _wait(servers[other], 90, other, logs) == 1
    finally:
        _stop([*servers.values(), *providers])  # the providers

    summary = json.loads((work / f"{catcher}-summary.json").read_text())
    report = verify_ledger(state / catcher / "ledger.jsonl")
    assert report.abort is not None
    abort = {k: report.abort[k] for k in ("round", "check", "evidence", "evidence_digest")}
    assert abort["round"] == ROUND and abort["check"] == INJECTED_CHECK
    assert abort["evidence"] == evidence and len(abort["evidence_digest"]) == 64
    assert summary["failure"] == abort_line(abort) and not summary["finished"]
    assert {k: summary["abort"][k] for k in abort} == abort
    assert summary["security"] == security and summary["backend"] == backend
    # Round 0 released and counted; round 1's entry counted, nothing of it released.
    assert (report.steps, report.released) == (ROUND + 1, ROUND)
    assert summary["releases"] == report.steps and summary["model_version"] == ROUND
    assert summary["epsilon"] == pytest.approx(report.epsilon, rel=1e-9)
    lines = [json.loads(x) for x in (state / catcher / "ledger.jsonl").read_text().splitlines()]
    assert [e["round"] for e in lines if e["kind"] == "released"] == [0]
    assert lines[-1]["kind"] == "abort" and "peer_sig" not in lines[-1]
    reveals = [json.loads(x) for x in tap.read_text().splitlines()]
    assert (catcher, ROUND) not in {(r["server"], r["round"]) for r in reveals}
    assert (catcher, 0) in {(r["server"], r["round"]) for r in reveals}
    # Neither server published round 1's model (publishing needs both servers' hashes).
    told = json.loads((work / f"{other}-summary.json").read_text())
    assert told["model_version"] == ROUND and not told["finished"]
    heard = f"{catcher} aborted the run: its engine caught this server deviating: "
    assert heard + abort_line(abort) in told["failure"]
    events = [e for e in _events(state / catcher / "audit.jsonl") if e["event"] == "peer_deviated"]
    assert [(e["round"], e["evidence_digest"]) for e in events] == [
        (ROUND, abort["evidence_digest"])
    ]

    done = _account(state / catcher / "ledger.jsonl")
    assert done.returncode == 0, done.stderr
    assert f"  {abort_line(abort)}; signed by {catcher} alone" in done.stdout.splitlines()
    assert f"security {security}" in done.stdout


@pytest.mark.parametrize("catcher", ["h1", "h2"])
def test_a_deviation_caught_in_noise_production_aborts_the_run(
    tmp_path: Path, catcher: str
) -> None:
    """Mode preprocessed: the pool's production runs on authenticated GMW too, and a deviation
    caught there (``pool-peer-deviated:0``: the catcher's engine reports the peer in the fill
    before round 0) aborts the run as a round's would: the catcher stops, its caught run stores
    no noise, nothing is released, and its ledger ends with the abort naming noise production,
    which ``spgc account`` shows."""
    server_cfgs, provider_cfgs = _configs(tmp_path, "gmw", "malicious", "preprocessed")
    work, state = tmp_path / "work", tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if k != "SPGC_FAULT_INJECT"}
    logs = [work / f"{c.stem}.log" for c in server_cfgs + provider_cfgs]
    fault = {catcher: {"SPGC_FAULT_INJECT": "pool-peer-deviated:0"}}
    servers = _start_all("spgc.servers", server_cfgs, env, fault)
    providers = list(_start_all("spgc.providers", provider_cfgs, env, {}).values())
    try:
        assert _wait(servers[catcher], 240, catcher, logs) == 1  # failed, not killed
    finally:
        _stop([*servers.values(), *providers])
    report = verify_ledger(state / catcher / "ledger.jsonl")
    assert report.abort is not None and report.abort["round"] == 0
    assert report.abort["check"] == f"noise production: {INJECTED_CHECK}"
    assert report.abort["evidence"] == "transcript"
    assert (report.steps, report.released) == (0, 0)
    summary = json.loads((work / f"{catcher}-summary.json").read_text())
    assert summary["model_version"] == 0 and not summary["finished"]
    assert summary["failure"].startswith("aborted at round 0: the peer deviated")
    done = _account(state / catcher / "ledger.jsonl")
    assert done.returncode == 0, done.stderr
    assert "aborted at round 0: the peer deviated (check: noise production: " in done.stdout


def _run_with_h1_cheating(
    tmp_path: Path, backend: str, mode: str, fault: str
) -> tuple[Path, Path]:
    """A malicious run whose H1 cheats at ``fault`` (SPGC_FAULT_INJECT): H2 must catch it and
    stop, and H1, told, stop too. Returns (work, state) directories."""
    server_cfgs, provider_cfgs = _configs(tmp_path, backend, "malicious", mode)
    work, state = tmp_path / "work", tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if k != "SPGC_FAULT_INJECT"}
    logs = [work / f"{c.stem}.log" for c in server_cfgs + provider_cfgs]
    servers = _start_all("spgc.servers", server_cfgs, env, {"h1": {"SPGC_FAULT_INJECT": fault}})
    providers = list(_start_all("spgc.providers", provider_cfgs, env, {}).values())
    try:
        assert _wait(servers["h2"], 240, "h2", logs) == 1
        assert _wait(servers["h1"], 90, "h1", logs) == 1  # told at its next call
    finally:
        _stop([*servers.values(), *providers])
    return work, state


@pytest.mark.parametrize("backend", ["gmw", "gc"])
def test_a_server_that_proves_another_seed_in_noise_production_is_caught(
    tmp_path: Path, backend: str
) -> None:
    """Mode preprocessed under security: malicious proves every production seed too:
    ``cheat-seed:0`` makes H1 enter, and prove, a fresh seed in the fill before round 0 instead
    of the one whose "sha256-pool-v1" commitment it sent with the block. H2's check of the seed
    proof catches it before the run's first trial: it stores no noise, releases nothing, and
    its ledger ends with the abort naming noise production and the commitment check."""
    work, state = _run_with_h1_cheating(tmp_path, backend, "preprocessed", "cheat-seed:0")
    report = verify_ledger(state / "h2" / "ledger.jsonl")
    assert report.abort is not None and report.abort["round"] == 0
    assert report.abort["check"].startswith("noise production: noise block 0: ")
    assert "not its committed seed" in report.abort["check"]
    assert report.abort["evidence"] == "transcript"
    assert (report.steps, report.released) == (0, 0)
    assert not list((state / "h2").glob("**/block-*.json"))  # no noise of the run stored
    summary = json.loads((work / "h2-summary.json").read_text())
    assert summary["model_version"] == 0 and not summary["finished"]
    # H1 heard why in the answer to its block's end: H2 did not wait for another call
    failure = json.loads((work / "h1-summary.json").read_text())["failure"]
    # as H2 said it, not as a refusal to pair (which a differing configuration gets)
    assert failure.startswith("h2 aborted the run: its engine caught this server deviating")
    assert "did not call again" not in (work / "h2.log").read_text()


@pytest.mark.parametrize(
    ("backend", "point", "check"),
    [
        ("gmw", "cheat-opening", "MACs do not hold"),
        # authenticated garbling: the garbler flips a gate's output in its table
        ("gc", "cheat-row", "garbled row"),
        # either backend: H1 enters and proves another seed than the one it committed
        ("gmw", "cheat-seed", "not its committed seed"),
        ("gc", "cheat-seed", "not its committed seed"),
    ],
)
def test_a_real_cheater_is_caught_by_the_other_servers_engine(
    tmp_path: Path, backend: str, point: str, check: str
) -> None:
    """No injected exception this time: ``cheat-opening:1`` makes H1's authenticated GMW add a
    constant to the first value it opens in each run of round 1 (its MAC left as it was), and
    ``cheat-row:1`` makes H1's authenticated garbling flip the output of the first gate
    instance of each run's tables; H2's engine catches it with its MAC check before anything
    of the round is released, keeps the transcript's digest and ends its ledger with the
    abort. ``cheat-seed:1`` makes H1 enter, and prove, a fresh seed in round 1 instead of the
    one it committed to: H2's check of the seed proof catches it before the round's run."""
    work, state = _run_with_h1_cheating(tmp_path, backend, "spgc", f"{point}:{ROUND}")
    failure = json.loads((work / "h1-summary.json").read_text())["failure"]
    heard = "h2 aborted the run: its engine caught this server deviating: aborted at round 1"
    assert failure.startswith(heard), failure  # H2's notice as it is, not "refused to pair"
    report = verify_ledger(state / "h2" / "ledger.jsonl")
    assert report.abort is not None and report.abort["round"] == ROUND
    assert check in report.abort["check"]  # the engine's own check, not injected
    assert report.abort["evidence"] == "transcript" and len(report.abort["evidence_digest"]) == 64
    assert (report.steps, report.released) == (ROUND + 1, ROUND)
    summary = json.loads((work / "h2-summary.json").read_text())
    assert summary["model_version"] == ROUND and not summary["finished"]
    assert json.loads((work / "h1-summary.json").read_text())["model_version"] == ROUND

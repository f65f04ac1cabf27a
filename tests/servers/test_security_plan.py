"""``security`` in the plan (issue 46 item 2): announced in the TrainingConfig, co-signed in the
ledger header, in the summary and the model's privacy report; two servers that set different
levels refuse to pair naming both; the link opens the engine's authenticated GMW party under
``malicious``; and a round whose engine catches the peer deviating releases nothing and ends
the run with the abort in this server's ledger (servers.deviation)."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_gmw_round import run_both
from test_ledger import PEER
from test_server_daemon import bind_pair
from test_server_daemon import pki as pki  # the module's fixture
from test_spgc_circuit import shares_of, sums_for

import garbled_core
from spgc.privacy.ledger_format import abort_line
from spgc.privacy.ledger_verify import verify_ledger
from spgc.providers.errors import ProviderRefusal
from spgc.providers.plan_checks import check_privacy, describe_plan
from spgc.servers import coordinator, sessions
from spgc.servers.deviation import is_peer_notice, peer_notice
from spgc.servers.errors import PeerDeviatedError
from spgc.servers.gc_party import PartyLink, aggregate_plain
from spgc.servers.intake import ShareIntake
from spgc.servers.peer import config_differences
from spgc.servers.round_phases import RoundRecord
from spgc.servers.state import ServerState
from spgc.settings.config import ServerConfig
from spgc.settings.plan import make_plan
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import PEER_PROTOCOL_VERSION
from spgc.wire import aggregation_pb2 as pb

MALICIOUS = {"backend": "gmw", "security": "malicious"}
CHECK = "the peer's opened values fail their MAC check (authenticated opening)"


def config(**kw: Any) -> ServerConfig:
    base = {"role": 1, "mode": "spgc", "insecure": True, "providers": ["p1", "p2", "p3"],
            "dataset": "cancer", "rounds": 20, "min_providers": 1, "target_epsilon": 4.0,
            "sampling_rate": 0.05, "verify_inputs": "none", "backend": "gmw"}  # fmt: skip
    return ServerConfig(**{**base, **kw})


def test_the_plan_announces_malicious_and_leaves_semi_honest_as_before():
    malicious = make_plan(config(security="malicious")).training_config("r")
    semi = make_plan(config()).training_config("r")
    assert malicious.security == "malicious"
    # semi-honest: the field unset, so the plan's bytes (and plan_sha256) are as before it
    announced = pb.TrainingConfig.FromString(semi.SerializeToString())
    assert "security" not in [f.name for f, _ in announced.ListFields()]
    assert config_differences(malicious, semi) == ["security (h1 'malicious', h2 'semi-honest')"]


def _state(tmp_path: Path, **kw: Any) -> ServerState:
    plan = make_plan(config(**kw))
    state = ServerState(plan, pb.SERVER_ROLE_H1, ShareIntake(plan.dim, plan.ring_bits, tmp_path))
    state.run_id, state.config = "security", plan.training_config("security")
    state.set_peer_ledger_key(PEER.public_key().public_bytes_raw())
    state.open_ledger()
    return state


@pytest.mark.parametrize("security", ["semi-honest", "malicious"])
def test_the_ledger_header_summary_and_model_report_carry_it(tmp_path, security):
    state = _state(tmp_path, security=security)
    assert state.ledger is not None
    header = json.loads(state.ledger.lines[0])
    # co-signed with the plan when malicious; a semi-honest header as before the field
    assert header.get("security", "semi-honest") == security
    assert ("security" in header) == (security == "malicious")
    assert verify_ledger(list(state.ledger.lines)).security == security
    assert state.summary()["security"] == security
    assert state.model_report()["security"] == security
    assert "abort" not in state.summary()


def test_servers_with_different_levels_refuse_to_pair(pki: Path, tmp_path: Path) -> None:
    """H1 malicious, H2 semi-honest, both on gmw: the Handshake names both values, nothing
    runs (the data link, and with it the engine, is never opened)."""
    d1, d2 = bind_pair(pki, tmp_path, **MALICIOUS)
    d2.cfg.security = "semi-honest"
    d2.plan = make_plan(d2.cfg)  # H2's plan as a daemon started from its own file would have
    d2.state.plan = d2.plan
    try:
        d2.start()
        d1.start()
        assert d1.wait(30) and d2.wait(30)
        named = "security (h1 'malicious', h2 'semi-honest')"
        assert "the other server refused to pair" in str(d1.error)
        assert named in str(d1.error) and named in str(d2.state.failure)
        assert d1.state.releases == d2.state.releases == 0
    finally:
        d1.stop()
        d2.stop()


def test_servers_of_different_peer_protocol_versions_refuse_to_pair(
    pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An H1 of the servers' protocol version 1 (before AgreeProviders streamed pages and the
    seeds were ChaCha8, proved under malicious) is refused at the Handshake, both versions
    named, before any round: an old and a new release would otherwise fail at their first
    round, or replay each other's noise wrongly in an audit."""
    d1, d2 = bind_pair(pki, tmp_path)
    monkeypatch.setattr(sessions, "PEER_PROTOCOL_VERSION", 1)  # what H1 sends
    try:
        d2.start()
        d1.start()
        assert d1.wait(30)
        said = f"the servers' protocol version 1, this server {PEER_PROTOCOL_VERSION}"
        assert said in str(d1.error) and "run the same spgc release on both" in str(d1.error)
        assert d1.state.releases == d2.state.releases == 0
    finally:
        d1.stop()
        d2.stop()


class _Party:
    """Stands in for an engine party: records how it was made."""

    def __init__(self, channel: Any, role: str, **kw: Any) -> None:
        self.made = (channel, role, kw)


class _GarbleParty(_Party):
    pass


def test_the_link_opens_the_authenticated_party_under_malicious(monkeypatch):
    monkeypatch.setattr(garbled_core, "AuthGmwParty", _Party, raising=False)
    monkeypatch.setattr(garbled_core, "AuthGarbleParty", _GarbleParty, raising=False)
    monkeypatch.setattr(garbled_core, "GmwParty", _Party)
    channel = object()
    link = PartyLink.open("evaluator", channel, backend="gmw", security="malicious")
    assert isinstance(link.session, _Party) and link.session.made == (channel, "evaluator", {})
    semi = PartyLink.open("garbler", channel, backend="gmw")
    assert semi.session.made == (channel, "garbler", {"ot": "silent"})
    garbled = PartyLink.open("garbler", channel, backend="gc", security="malicious")
    assert isinstance(garbled.session, _GarbleParty) and garbled.backend == "gc"
    assert garbled.session.made == (channel, "garbler", {})
    with pytest.raises(ValueError, match="security must be one of"):
        PartyLink.open("garbler", channel, backend="gc", security="paranoid")
    # the evidence: the session's digest of what the peer sent, when it keeps one
    assert semi.evidence_digest() is None
    link.session.evidence_digest = "ab" * 32
    assert link.evidence_digest() == "ab" * 32


@pytest.mark.parametrize(("backend", "party"), [("gmw", "AuthGmwParty"), ("gc", "AuthGarbleParty")])
def test_a_malicious_round_releases_what_the_plaintext_reference_does(two_party, backend, party):
    """The engine's authenticated GMW under a round's circuits (the fused trial run and its
    exchange), and its authenticated garbling under gc's (the sampler's trial runs and the
    noisy sum): S and S + z bit for bit as the semi-honest reference of the backend, and each
    side keeps a digest of what the peer sent."""
    ring_bits, sigma = 16, 1000.0
    sums = sums_for(ring_bits, 24, 7)
    a1, a2 = shares_of(sums, ring_bits, 8)
    tp = two_party()
    lg = PartyLink.open("garbler", tp.garbler_channel, backend=backend, security="malicious")
    le = PartyLink.open("evaluator", tp.evaluator_channel, backend=backend, security="malicious")
    assert type(lg.session).__name__ == type(le.session).__name__ == party
    yg, ye, _, _ = run_both(lg, le, a1, a2, None, None, None, ring_bits, "only-mpc")
    assert ye.tolist() == yg.tolist() == sums
    s1, s2 = os.urandom(32), os.urandom(32)
    yg, ye, _, _ = run_both(lg, le, a1, a2, s1, s2, sigma, ring_bits, "spgc")
    ref = aggregate_plain(
        a1, a2, ring_bits, "spgc", seed1=s1, seed2=s2, sigma_units=sigma, backend=backend,
        security="malicious",
    )  # fmt: skip
    assert [int(v) for v in yg] == [int(v) for v in ye] == [int(v) for v in ref]
    digests = (lg.evidence_digest(), le.evidence_digest())
    assert all(isinstance(d, str) and len(d) == 64 for d in digests)
    assert digests[0] != digests[1]  # each of what the other sent


class _Link:
    """A link whose engine kept (or not) a digest of what the peer sent."""

    def __init__(self, digest: str | None) -> None:
        self.digest = digest

    def evidence_digest(self) -> str | None:
        return self.digest


@pytest.mark.parametrize("digest", ["cd" * 32, None])
def test_a_caught_deviation_releases_nothing_and_records_the_abort(tmp_path, monkeypatch, digest):
    state = _state(tmp_path, security="malicious")
    assert state.ledger is not None and state.accountant is not None
    samples = state.plan.noise_samples_per_step(2)
    epsilon = state.accountant.epsilon_after(1)
    statement, _ = state.ledger.statement(0, samples, state.plan.cfg.clip_norm, epsilon)
    entry = state.record_release(0, providers=2, peer_sig=PEER.sign(statement))
    state.intake.open_round(0)
    state.intake.close_round()  # no shares: the sum is zeros
    state.history[0] = RoundRecord(0, pb.ROUND_PHASE_COMPUTING)
    state.history[0].seed_commitments = {"h1": b"\x02" * 32, "h2": b"\x03" * 32}  # the release's

    def caught(*args: Any, **kw: Any) -> Any:
        raise garbled_core.PeerDeviated(CHECK)

    monkeypatch.setattr(coordinator, "run_aggregate", caught)  # the round's circuit
    with pytest.raises(PeerDeviatedError) as raised:
        coordinator.compute_round(state, _Link(digest), 0, entry, b"\x01" * 32)
    evidence = "transcript" if digest else "message"
    want = digest or hashlib.sha256(CHECK.encode()).hexdigest()
    abort = {"round": 0, "check": CHECK, "evidence": evidence, "evidence_digest": want}
    assert str(raised.value) == state.failure == abort_line(abort)
    assert state.finished and state.pending is None and state.version == 0
    report = verify_ledger(list(state.ledger.lines))
    assert (report.steps, report.released) == (1, 0)  # counted, nothing released
    assert {k: report.abort[k] for k in abort} == abort  # type: ignore[index]
    assert {k: state.summary()["abort"][k] for k in abort} == abort
    assert np.all(state.params == state.plan.initial_params)


def test_a_provider_sees_the_level_and_may_require_malicious():
    """The provider's plan line names the level, and ``min_security: malicious`` refuses a
    semi-honest plan in one line (the noise is what protects it, and only a malicious plan keeps
    it against one deviating server)."""
    malicious = make_plan(config(**MALICIOUS)).training_config("r")
    semi = make_plan(config(backend="gmw")).training_config("r")
    assert "secure against one that deviates (security malicious)" in describe_plan(malicious)
    assert "(security semi-honest)" in describe_plan(semi)
    base = {"name": "p1", "insecure": True, "h1_address": "127.0.0.1:1",
            "h2_address": "127.0.0.1:2", "allow_no_privacy": True}  # fmt: skip
    wants = ProviderConfig(**base, min_security="malicious")
    with pytest.raises(ProviderRefusal, match="security semi-honest, below this provider's"):
        check_privacy(semi, wants)
    check_privacy(malicious, wants)
    check_privacy(semi, ProviderConfig(**base))  # the default takes either


def test_an_abort_notice_is_told_apart_from_a_refusal_to_pair():
    """H1 that re-pairs after H2 aborted the run on its messages fails with H2's notice as it
    is; any other refusal of the Handshake reads as one."""
    notice = peer_notice("h2", "aborted at round 3: the peer deviated (check: ...)")
    assert is_peer_notice(notice)
    assert not is_peer_notice("training configurations differ in: security")
    assert not is_peer_notice(f"training configurations differ in: {notice}")

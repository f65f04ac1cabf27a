"""Every release is in the ledger, and counted, before it happens (issue 13, write-ahead).

A tap on the release itself (the garbled circuit's run_aggregate) logs every reveal; after a
failure past the reveal, and after a restart from the checkpoint before it, both servers'
ledgers and accountants count at least the reveals.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import grpc
import numpy as np
import pytest
from test_modes import start_single, wait_single_collecting
from test_server_daemon import (
    PROVIDERS,
    Provider,
    _cfg,
    bind_pair,
    start_pair,
    wait_round_done,
)
from test_server_daemon import pki as pki  # the module's fixture: certificates for h1, h2, p1..p3
from test_user_plans import provider_config

from spgc.privacy.ledger_format import read_ledger_lines
from spgc.privacy.ledger_pair import compare_ledgers
from spgc.privacy.ledger_verify import verify_ledger
from spgc.providers.client import ProviderClient, ProviderRefusal
from spgc.servers import aggregator, coordinator
from spgc.servers.checkpoint import CheckpointError, config_digest
from spgc.servers.daemon import ServerDaemon
from spgc.servers.intake import ShareIntake
from spgc.servers.state import BudgetExceededError, ServerState
from spgc.settings.config import ServerConfig
from spgc.settings.plan import make_plan
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.identity import new_submission_id
from spgc.wire.messages import share_messages
from spgc.wire.pages import agree_providers

NOISY = {"mode": "spgc", "noise_multiplier": 2.0, "rounds": 3, "target_epsilon": 50.0}


@pytest.fixture
def reveals(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """(role, round) of every reveal the circuit makes, in order."""
    seen: list[tuple[int, int]] = []
    real = coordinator.run_aggregate

    def tap(role, link, total, seed, sigma, ring_bits, mode, **kw):
        y, info = real(role, link, total, seed, sigma, ring_bits, mode, **kw)
        seen.append((1 if role == "garbler" else 2, -1))
        return y, info

    monkeypatch.setattr(coordinator, "run_aggregate", tap)
    return seen


def submit_round(providers: list[Provider], t: int, value: int = 10) -> None:
    cfg = providers[0].wait_collecting(t)
    for i, p in enumerate(providers):
        p.submit_both(cfg, t, np.full(cfg.num_parameters, value * (i + 1), dtype=np.int64))


def run_rounds(
    pki: Path, daemons: tuple[ServerDaemon, ServerDaemon], count: int, first: int = 0
) -> None:
    """p1..p3 take part in rounds first..first+count-1 of the started pair; then everything
    stops."""
    providers = [Provider(pki, n, daemons) for n in PROVIDERS]
    try:
        for t in range(first, first + count):
            submit_round(providers, t)
            wait_round_done(daemons, t)
    finally:
        for p in providers:
            p.close()
        for d in daemons:
            d.stop()


def test_a_failure_after_the_reveal_is_counted_and_a_restart_continues(
    pki: Path, tmp_path: Path, reveals: list[tuple[int, int]]
) -> None:
    d1, d2 = start_pair(pki, tmp_path, **NOISY)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        submit_round(providers, 0)
        wait_round_done((d1, d2), 0)
        # Round 1: H2's update silently diverges, so the servers stop AFTER the circuit
        # revealed the noisy sum and BEFORE anything is published or checkpointed.
        d2.state.optimizer.lr *= 2
        submit_round(providers, 1)
        assert d1.wait(60) and d2.wait(60)
        assert "differs between the servers" in str(d1.error)
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()
    assert len(reveals) == 4  # two rounds, two parties each
    for daemon in (d1, d2):
        assert daemon.state.steps == 1  # one model published
        assert daemon.state.releases == 2  # ... but two noisy releases, both counted
        assert daemon.state.accountant.steps == 2
    for sub in ("s1", "s2"):
        report = verify_ledger(tmp_path / sub / "ledger.jsonl")
        assert report.steps == 2 >= len(reveals) // 2
        assert report.released == 2

    # Restart from the checkpoint of round 0: the ledger's second release is counted again
    # (it happened), the round runs again as a NEW release with fresh noise.
    a, b = bind_pair(pki, tmp_path, **NOISY)
    assert a.state.round == 1 and a.state.steps == 1
    assert a.state.releases == 2 and b.state.releases == 2
    assert a.state.accountant.steps == 2
    providers = [Provider(pki, n, (a, b)) for n in PROVIDERS]
    try:
        b.start()
        a.start()
        submit_round(providers, 1)
        wait_round_done((a, b), 1)
    finally:
        for p in providers:
            p.close()
        a.stop()
        b.stop()
    for daemon, sub in ((a, "s1"), (b, "s2")):
        report = verify_ledger(tmp_path / sub / "ledger.jsonl")
        assert report.steps == 3 == daemon.state.releases  # 3 releases, 2 models published
        assert daemon.state.steps == 2
        assert report.epsilon == pytest.approx(daemon.state.epsilon(), rel=1e-9)
    assert len(reveals) == 6


def test_a_cut_or_lost_ledger_stops_the_restart(pki: Path, tmp_path: Path) -> None:
    """The checkpoint counts the releases made: a restart whose ledger holds fewer (its last
    entries cut, the file deleted or emptied) does not start, and a ledger whose checkpoint was
    lost is not silently followed by a new run with a fresh budget."""
    run_rounds(pki, start_pair(pki, tmp_path, **NOISY), 2)
    ledger = tmp_path / "s2" / "ledger.jsonl"
    whole = ledger.read_bytes()
    lines = whole.splitlines(keepends=True)
    assert sum(b'"kind":"release"' in x for x in lines) == 2
    cut = b"".join(x for x in lines if b'"index":1' not in x)  # the last release and released
    def restart_h2(**changes: object) -> ServerDaemon:
        return ServerDaemon(_cfg(pki, 2, tmp_path / "s2", **{**NOISY, **changes}))

    for damaged in (cut, b""):
        ledger.write_bytes(damaged)
        with pytest.raises(CheckpointError, match=r"checkpoint counts 2 release.*truncated"):
            restart_h2()
    ledger.unlink()
    with pytest.raises(CheckpointError, match="holds 0 release entries"):
        restart_h2()
    ledger.write_bytes(whole)
    # The checkpoint lost, the ledger kept: no silent new run (resume: false starts one).
    for name in ("checkpoint.json", "checkpoint.prev.json"):
        (tmp_path / "s2" / name).unlink(missing_ok=True)
    with pytest.raises(CheckpointError, match="no checkpoint, but its ledger records 2 rel"):
        restart_h2()
    fresh = restart_h2(resume=False)
    assert fresh.state.round == 0 and fresh.state.releases == 0
    fresh.intake.close()


def pairing_errors(pki: Path, tmp_path: Path) -> list[str]:
    """Start the pair on tmp_path's state_dirs; both must stop: their errors."""
    h1, h2 = start_pair(pki, tmp_path, **NOISY)
    try:
        assert h1.wait(30) and h2.wait(30)
    finally:
        h1.stop()
        h2.stop()
    return [str(h1.error), str(h2.error)]


def test_a_state_dir_restored_from_a_backup_is_refused_at_the_handshake(
    pki: Path, tmp_path: Path
) -> None:
    """H2's state_dir restored from a backup one round old: its checkpoint and its ledger agree,
    but H1's ledger (which H2 co-signed) holds a release more. The servers compare the counts
    at the Handshake and refuse to pair, naming both, instead of going on with H2's count low."""
    run_rounds(pki, start_pair(pki, tmp_path, **NOISY), 1)
    backup = tmp_path / "s2-backup"
    shutil.copytree(tmp_path / "s2", backup)
    run_rounds(pki, start_pair(pki, tmp_path, **NOISY), 1, first=1)  # resumed at round 1
    assert verify_ledger(tmp_path / "s1" / "ledger.jsonl").steps == 2
    shutil.rmtree(tmp_path / "s2")
    shutil.copytree(backup, tmp_path / "s2")  # the restore
    for error in pairing_errors(pki, tmp_path):
        assert "ledgers count different releases of the run: h1 2, h2 1" in error


def test_a_ledger_that_cannot_be_continued_is_refused_at_the_handshake(
    pki: Path, tmp_path: Path
) -> None:
    """H2's signing key replaced (its key file lost: a new one is made): its ledger of the run
    cannot be continued. Both servers stop at the pairing naming it, not at the next release
    (where H2 answered with a traceback and went on running)."""
    run_rounds(pki, start_pair(pki, tmp_path, **NOISY), 1)
    (tmp_path / "s2" / "ledger-signing.key").unlink()
    for error in pairing_errors(pki, tmp_path):
        assert "written with another signing key" in error


def test_a_release_h2_recorded_alone_is_recorded_by_h1_at_the_next_handshake(
    pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """H2 records each release before H1: H1 failing in between (a crash, a lost answer)
    leaves H2's ledger one release ahead. At the next Handshake H2 sends that release's
    statement with its signature and H1 records it, so both ledgers hold the same releases and
    both stopping rules agree; the run then finishes on both."""
    d1, d2 = start_pair(pki, tmp_path, **NOISY)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        submit_round(providers, 0)
        wait_round_done((d1, d2), 0)

        def crash(*args: object, **kwargs: object) -> int:
            raise RuntimeError("h1 crashed after h2 recorded the release")

        monkeypatch.setattr(d1.state, "record_release", crash)
        submit_round(providers, 1)
        assert d1.wait(60) and "crashed" in str(d1.error)
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()
    counts = [verify_ledger(tmp_path / s / "ledger.jsonl").steps for s in ("s1", "s2")]
    assert counts == [1, 2]
    caplog.set_level(logging.WARNING)
    a, b = start_pair(pki, tmp_path, **NOISY)  # the restart
    watcher = Provider(pki, "p1", (a, b))
    try:
        watcher.wait_collecting(1)  # paired: round 1 runs again
    finally:
        watcher.close()
        a.stop()
        b.stop()
    assert "recorded the release of round 1 that the other server had recorded alone" in (
        caplog.text
    )
    lines = [read_ledger_lines(tmp_path / s / "ledger.jsonl") for s in ("s1", "s2")]
    assert [verify_ledger(x).steps for x in lines] == [2, 2]
    compare_ledgers(*lines)


def test_ledger_entry_is_on_disk_before_the_reveal(
    pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """At the moment of each reveal, this round's release entry is already in the file."""
    seen: list[int] = []
    real = coordinator.run_aggregate
    servers: dict[int, object] = {}

    def tap(role, link, total, seed, sigma, ring_bits, mode, **kw):
        daemon = servers[1 if role == "garbler" else 2]
        path = daemon.cfg.state_dir / "ledger.jsonl"  # type: ignore[attr-defined]
        seen.append(verify_ledger(path).steps)
        return real(role, link, total, seed, sigma, ring_bits, mode, **kw)

    monkeypatch.setattr(coordinator, "run_aggregate", tap)
    d1, d2 = start_pair(pki, tmp_path, **{**NOISY, "rounds": 2})
    servers.update({1: d1, 2: d2})
    run_rounds(pki, (d1, d2), 2)
    assert sorted(seen) == [1, 1, 2, 2]  # the k-th reveal found k entries already written


def test_a_provider_leaves_once_the_ledger_would_pass_its_limit(pki: Path, tmp_path: Path) -> None:
    """Providers verify the servers' ledgers (FetchLedger) before each round and stop once one
    more release would spend more than their own max_total_epsilon."""
    d1, d2 = start_pair(pki, tmp_path, **NOISY, min_providers=1)
    try:
        acc = d1.plan.new_accountant()
        assert acc is not None
        limit = (acc.epsilon_after(1) + acc.epsilon_after(2)) / 2  # one release fits, two do not
        cfg = provider_config(pki, d1, d2, 0, max_total_epsilon=60.0)
        with ProviderClient(cfg) as client:
            client.connect()  # the plan (target 50) is within 60: accepted
            client.cfg = client.cfg.model_copy(update={"max_total_epsilon": limit})
            assert client.run_round() is not None  # nothing released yet: takes part
            wait_round_done((d1, d2), 0)
            report = verify_ledger(d1.state.ledger_lines())
            assert report.steps == 1
            assert report.epsilon == pytest.approx(acc.epsilon_after(1), rel=1e-9)
            with pytest.raises(ProviderRefusal, match=r"counts 1 release.*one more would spend"):
                client.run_round()
            client.cfg = client.cfg.model_copy(update={"max_total_epsilon": 60.0})
            assert client.check_ledger().steps == 1  # within the limit: the report
    finally:
        d1.stop()
        d2.stop()


def test_a_provider_reads_the_ledger_a_page_at_a_time_and_then_only_new_lines(
    pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """FetchLedger answers a page (a long run's ledger does not fit one message): here a line
    a page. The provider asks again until it holds every line, keeps them, and later asks
    only for the new ones; a server whose ledger then holds fewer lines than it showed is
    refused."""
    asked: list[int] = []
    real_page = aggregator.ledger_page

    def one_line_pages(lines, from_line, page_bytes=None):
        asked.append(from_line)
        return real_page(lines, from_line, page_bytes=1)

    monkeypatch.setattr(aggregator, "ledger_page", one_line_pages)
    d1, d2 = start_pair(pki, tmp_path, **NOISY, min_providers=1)
    try:
        cfg = provider_config(pki, d1, d2, 0, max_total_epsilon=60.0)
        with ProviderClient(cfg) as client:
            client.connect()
            for t in range(2):
                assert client.run_round() is not None
                wait_round_done((d1, d2), t)
            asked.clear()
            report = client.check_ledger()
            assert report is not None and report.steps == 2
            total = len(d1.state.ledger_lines())
            assert total >= 5  # header and two releases' entries
            # the rounds' own checks held the first lines: only the later ones are asked for,
            # a line a call, up to the last
            assert asked and 0 not in asked and max(asked) == total - 1, asked
            held = {name: len(lines) for (name, _), lines in client._ledgers.items()}
            assert held == {"h1": total, "h2": len(d2.state.ledger_lines())}
            asked.clear()
            assert client.check_ledger().steps == 2  # nothing new: one call a server
            assert asked == [total, len(d2.state.ledger_lines())]
            lines = d1.state.ledger_lines()
            monkeypatch.setattr(d1.state, "ledger_lines", lambda: lines[:-1])
            with pytest.raises(ProviderRefusal, match="it showed more lines before"):
                client.check_ledger()
    finally:
        d1.stop()
        d2.stop()


def test_ldp_counts_every_noisy_vector_it_receives(pki: Path, tmp_path: Path) -> None:
    """ldp: the round's release is counted once a vector is admitted, before its payload is
    read: a vector that is then refused (here, cut short), in a round that is then skipped
    for too few providers, is still counted; a round in which nothing arrives is not."""
    d1 = start_single(
        pki, tmp_path, mode="ldp", rounds=2, min_providers=3, round_deadline=2.0,
        target_epsilon=50.0,
    )  # fmt: skip
    p = Provider(pki, PROVIDERS[0], (d1,))
    try:
        cfg = wait_single_collecting(p, 0)
        vec = np.zeros(cfg.num_parameters, dtype=np.uint64)
        msgs = list(
            share_messages(
                vec,
                run_id=cfg.run_id,
                round_number=0,
                server_role=pb.SERVER_ROLE_SINGLE,
                ring_bits=cfg.ring_bits,
                submission_id=new_submission_id(),
                chunk_bytes=256,
            )
        )
        assert len(msgs) > 2
        with pytest.raises(grpc.RpcError):
            p.stubs[1].SubmitShare(iter(msgs[:-1]), timeout=10)  # the last chunk never comes
        assert d1.wait(30)
        # Nothing trained is a failure the operator sees (exit 1), naming why.
        assert "without one model update: no round had the shares of min_providers" in str(
            d1.error
        )
    finally:
        p.close()
        d1.stop()
    rounds = d1.state.summary()
    assert d1.state.steps == 0  # no model published: both rounds were skipped
    assert d1.state.releases == 1  # ... but round 0's noisy vector reached the server
    report = verify_ledger(tmp_path / "s1" / "ledger.jsonl")
    assert (report.steps, report.released, report.cosigned) == (1, 0, False)
    assert report.epsilon == pytest.approx(d1.state.epsilon(), rel=1e-9) and report.epsilon > 0
    assert rounds["epsilon"] == pytest.approx(report.epsilon, rel=1e-9)


def test_h2_runs_one_release_per_round(
    pki: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An H1 that, once round 0's release is under way, asks H2 for another co-signed ledger
    entry (which would start another release on the same sum), with its seed commitment or
    another, alone or with another provider set, is refused each time, as are the retired
    CIRCUIT_READY and MODEL_PUBLISHED barriers; each ledger holds one release per round."""
    from spgc.wire import peer_pb2, provider_set_digest, seed_commitment

    answers: list[str] = []
    real = coordinator.H1Driver.record_cosigned

    def record(self, t, mine, answer):  # type: ignore[no-untyped-def]
        entry = real(self, t, mine, answer)  # H2 wrote its entry and started its side
        if answers:
            return entry
        run, h1 = self.state.run_id, pb.SERVER_ROLE_H1

        def again(commitment: bytes) -> peer_pb2.ReleaseStatement:
            msg = peer_pb2.ReleaseStatement()
            msg.CopyFrom(mine)
            msg.seed.CopyFrom(coordinator.seed_commitment_message(run, t, h1, commitment))
            return msg

        other = seed_commitment(run, t, h1, b"s" * 32)
        with_set = peer_pb2.ProviderSet(
            run_id=run, round=t, role=h1, providers=[], digest=provider_set_digest([]),
            min_providers=self.state.plan.cfg.min_providers, release=again(other),
        )  # fmt: skip
        calls = [
            lambda: self.peer.CosignRelease(again(mine.seed.commitment), timeout=10),
            lambda: self.peer.CosignRelease(again(other), timeout=10),
            lambda: agree_providers(self.peer, with_set, timeout=10),
            lambda: self._barrier(t, peer_pb2.BARRIER_CIRCUIT_READY),
            lambda: self._barrier(t, peer_pb2.BARRIER_MODEL_PUBLISHED),
        ]
        for call in calls:
            try:
                call()
                answers.append("accepted")
            except grpc.RpcError as exc:
                answers.append(f"{exc.code().name}: {exc.details()}")
        return entry

    monkeypatch.setattr(coordinator.H1Driver, "record_cosigned", record)
    daemons = start_pair(pki, tmp_path, **{**NOISY, "rounds": 2})
    run_rounds(pki, daemons, 2)
    assert answers == [
        "FAILED_PRECONDITION: round 0: its release already ran",
        "FAILED_PRECONDITION: round 0: its release already ran",
        "FAILED_PRECONDITION: round 0 is not closed at this server",
        f"FAILED_PRECONDITION: unknown barrier {peer_pb2.BARRIER_CIRCUIT_READY}",
        f"FAILED_PRECONDITION: unknown barrier {peer_pb2.BARRIER_MODEL_PUBLISHED}",
    ]
    for sub in ("s1", "s2"):
        assert verify_ledger(tmp_path / sub / "ledger.jsonl").steps == 2


def test_no_release_is_recorded_past_the_budget(tmp_path: Path) -> None:
    """The round loop opens no round whose release would pass target_epsilon; the state
    refuses such a release itself too (before its ledger entry), whatever opened the round."""
    cfg = ServerConfig(role=1, mode="ldp", insecure=True, providers=["p1"], dataset="cancer",
                       max_batch_size=40, rounds=10_000, min_providers=1, target_epsilon=1.0,
                       noise_multiplier=1.0)  # fmt: skip
    plan = make_plan(cfg)
    state = ServerState(plan, pb.SERVER_ROLE_H1, ShareIntake(plan.dim, plan.ring_bits, tmp_path))
    state.run_id, state.config = "budget", plan.training_config("budget")
    assert state.accountant is not None
    allowed = state.accountant.steps_within(cfg.target_epsilon)
    assert 1 < allowed < cfg.rounds
    for t in range(allowed):
        state.record_release(t, providers=1)
    with pytest.raises(BudgetExceededError, match=f"round {allowed}: its release would bring"):
        state.record_release(allowed, providers=1)
    assert state.releases == allowed and state.epsilon() <= cfg.target_epsilon
    assert state.ledger is not None and len(state.ledger.lines) == allowed + 1  # header + entries


def test_the_plan_digest_leaves_out_how_shares_may_travel() -> None:
    # A run begun by a version that accepted fewer share encodings resumes under this one.
    plan = pb.TrainingConfig(run_id="r", num_parameters=62, ring_bits=16)
    offered = pb.TrainingConfig()
    offered.CopyFrom(plan)
    offered.share_encodings.extend([pb.SHARE_ENCODING_UINT64, pb.SHARE_ENCODING_PACKED])
    assert config_digest(offered) == config_digest(plan)
    other = pb.TrainingConfig()
    other.CopyFrom(plan)
    other.ring_bits = 17  # the plan itself: a different digest
    assert config_digest(other) != config_digest(plan)

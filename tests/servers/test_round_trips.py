"""The control calls H1 makes to H2 in a round (issue 47): each is a round trip between the two
organisations, so a fused step that comes apart again shows here as one call more. Before
issue 47 a steady round made seven (mode preprocessed) or eight (spgc): ROUND_OPEN,
INTAKE_CLOSED, AgreeProviders, CommitSeed (spgc), CosignRelease, CIRCUIT_READY, CheckModel,
MODEL_PUBLISHED; with verified inputs INTAKE_CLOSED stayed until the norm-proof coin became H1's
alone (servers.norm_checks), so such a round makes two calls too."""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_server_daemon import PROVIDERS, Provider, start_pair, wait_round_done

from spgc.protocol.certs import make_dev_pki
from spgc.protocol.norm_proof import proof_context, prove, share_dots
from spgc.providers.plan_checks import norm_proof_params
from spgc.servers import coordinator
from spgc.wire import aggregation_pb2 as pb
from spgc.wire import pages as wire_pages
from spgc.wire import peer_pb2
from spgc.wire.identity import new_submission_id
from spgc.wire.messages import share_messages

ROUNDS = 4


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    make_dev_pki(root / "good", ["h1", "h2", *PROVIDERS])
    return root


#: A round in which H1 sends its provider set without the release statement, as it does when
#: the noise pool is short then: the release is co-signed in a call of its own.
UNFUSED_ROUND = 2


def _without_release(pages: Any) -> Any:
    """The pages as they come (the later ones are made once the first is out), the first
    without its release statement."""
    for k, page in enumerate(pages):
        if k == 0:
            page = peer_pb2.ProviderSet.FromString(page.SerializeToString())
            page.ClearField("release")
        yield page


class CountingPeer:
    """H1's Peer stub, recording (round H1 is at, call) for every control call it makes;
    ``unfused``: in round UNFUSED_ROUND the release statement is taken off the provider set
    (H2 then co-signs nothing with it, and H1 calls CosignRelease)."""

    def __init__(self, stub: Any, state: Any, calls: dict[int, list[str]], unfused: bool) -> None:
        self._stub, self._state, self._calls, self._unfused = stub, state, calls, unfused

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)

        def call(request: Any, *args: Any, **kwargs: Any) -> Any:
            what = name
            if name == "RoundBarrier":
                what = peer_pb2.Barrier.Name(request.barrier)
            t = self._state.round
            if name == "AgreeProviders" and self._unfused and t == UNFUSED_ROUND:
                request = _without_release(request)  # the set's pages: it is on the first
            self._calls[t].append(what)
            return method(request, *args, **kwargs)

        return call


def counted(monkeypatch: pytest.MonkeyPatch, unfused: bool) -> dict[int, list[str]]:
    """Round -> H1's round-loop calls to H2 in it (noise production's calls, from a thread of
    their own beside the rounds, are not counted: the producer holds the plain stub)."""
    made: dict[int, list[str]] = defaultdict(list)
    real = coordinator.H1Driver.__init__

    def counting(self: coordinator.H1Driver, state: Any, peer: Any, *args: Any) -> None:
        real(self, state, peer, *args)
        self.peer = CountingPeer(peer, state, made, unfused)

    monkeypatch.setattr(coordinator.H1Driver, "__init__", counting)
    return made


# The steady round: the provider set (which waits for H2's own intake to close, and carries
# the co-signed ledger entry with the seed commitments or the pool entries: H2 writes its entry
# and starts its side of the release in it), then the model check (H2 publishes and opens the
# next round in it). Round 0 opens with its own call; the last round opens no next one.
STEADY = ["AgreeProviders", "CheckModel"]


def submit_proved(provider: Provider, cfg: Any, t: int, values: np.ndarray) -> None:
    """Verified inputs: H1 gets its field share with its share of the norm proof, H2 the seed
    its share expands from (as providers.training.make_vectors sends them)."""
    params = norm_proof_params(cfg, cfg.num_parameters)
    assert params is not None
    leader, helper = prove(values, params, proof_context(cfg.run_id, t, provider.name))
    parts = {
        1: (np.concatenate([leader.inputs, leader.proof]), leader.blind, leader.helper_part, b""),
        2: (np.zeros(0, np.uint64), b"", helper.leader_parts, helper.seed),
    }
    vector_id = new_submission_id()
    for role, (vec, blind, joint, seed) in parts.items():
        messages = share_messages(
            vec,
            run_id=cfg.run_id,
            round_number=t,
            server_role=role,
            ring_bits=cfg.ring_bits,
            submission_id=new_submission_id(),
            vector_id=vector_id,
            encoding=pb.SHARE_ENCODING_FIELD,
            field_modulus=params.p,
            norm_blind=blind,
            norm_joint_part=joint,
            norm_seed=seed,
        )
        provider.stubs[role].SubmitShare(messages, timeout=10)


PREPROCESSED = {"mode": "preprocessed", "pool_rounds": ROUNDS, "pool_block": 100}


@pytest.mark.parametrize(
    ("plan", "unfused"),
    [
        (PREPROCESSED, False),
        ({"mode": "spgc"}, False),
        (PREPROCESSED, True),
        ({**PREPROCESSED, "verify_inputs": "l2"}, False),
        ({**PREPROCESSED, "verify_inputs": "l2", "page_bytes": 64}, False),
    ],
    ids=[
        "preprocessed",
        "spgc",
        "preprocessed-release-apart",
        "preprocessed-verified-inputs",
        "verified-inputs-sets-in-pages",
    ],
)
def test_a_steady_round_makes_two_control_calls(
    pki: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    plan: dict[str, Any],
    unfused: bool,
) -> None:
    calls = counted(monkeypatch, unfused)
    plan = dict(plan)
    page_counts: list[int] = []
    if page_bytes := plan.pop("page_bytes", None):
        # Pages so small that every provider's verifier message takes one (as a thousand
        # providers' sets take many at the real size): still one call a round.
        real_pages = wire_pages.provider_set_pages

        def counted_pages(message: Any, size: int | None = None) -> Any:
            out = real_pages(message, size)
            page_counts.append(len(out))
            return out

        monkeypatch.setattr(wire_pages, "PAGE_BYTES", page_bytes)
        monkeypatch.setattr(wire_pages, "provider_set_pages", counted_pages)
    d1, d2 = start_pair(pki, tmp_path, rounds=ROUNDS, noise_multiplier=1.0, **plan)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        for t in range(ROUNDS):
            cfg = providers[0].wait_collecting(t)
            for i, p in enumerate(providers):
                values = np.full(cfg.num_parameters, i, dtype=np.int64)
                if plan.get("verify_inputs") == "l2":
                    submit_proved(p, cfg, t, values)
                else:
                    p.submit_both(cfg, t, values)
            wait_round_done((d1, d2), t, timeout=60)
        assert d1.wait(30) and d2.wait(30)
        assert d1.error is None and d2.error is None
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()
    assert d1.state.steps == d2.state.steps == ROUNDS
    rounds = {t: calls[t] for t in range(ROUNDS)}
    assert rounds[0] == ["BARRIER_ROUND_OPEN", *STEADY]
    for t in range(1, ROUNDS):
        want = STEADY
        if unfused and t == UNFUSED_ROUND:
            want = ["AgreeProviders", "CosignRelease", "CheckModel"]
        assert rounds[t] == want, (t, rounds[t])
    for d in (d1, d2):  # one co-signed release a round either way
        assert d.state.releases == ROUNDS
    if page_bytes:  # both sets, every round, the first page then one a provider
        assert len(page_counts) == 2 * ROUNDS and min(page_counts) == 1 + len(PROVIDERS) > 2
    if plan["mode"] == "spgc":  # the commitments travelled with the statements
        for t in range(ROUNDS):
            assert d1.state.history[t].seed_commitments == d2.state.history[t].seed_commitments
            assert len(d1.state.history[t].seed_commitments["h2"]) == 32


def test_each_servers_intake_prepares_the_proofs_wraparound_dots_as_shares_arrive(
    pki: Path, tmp_path: Path
) -> None:
    """Verified inputs: while the round's intake is open, each server has the wraparound dots
    of every share it accepted (servers.norm_checks.PreparedDots), the same as computed from
    the share; the round then agrees and publishes as before."""
    # A deadline far off: the intake stays open until the last provider's share is in.
    d1, d2 = start_pair(pki, tmp_path, rounds=1, noise_multiplier=1.0, **PREPROCESSED,
                        verify_inputs="l2", round_deadline=120.0)  # fmt: skip
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        early = providers[:-1]  # the last one holds the intake open
        for i, p in enumerate(early):
            submit_proved(p, cfg, 0, np.full(cfg.num_parameters, i, dtype=np.int64))
        for d in (d1, d2):
            # the intake's own thread computes them; bounded wait, not a fixed sleep
            end = time.monotonic() + 30
            while len(d.state.proof_dots) < len(early) and time.monotonic() < end:
                time.sleep(0.02)
            assert d.state.phase == pb.ROUND_PHASE_COLLECTING
            assert len(d.state.proof_dots) == len(early)
            params = d.state.plan.norm_proof
            for p in early:
                share = d.state.intake.proof_share(p.name)
                joint_x, dots = share_dots(params, share, proof_context(cfg.run_id, 0, p.name))
                assert np.array_equal(d.state.proof_dots.get(joint_x), dots)
        submit_proved(providers[-1], cfg, 0, np.full(cfg.num_parameters, 2, dtype=np.int64))
        wait_round_done((d1, d2), 0, timeout=60)
        assert d1.wait(30) and d2.wait(30)
        assert d1.error is None and d2.error is None
        assert d1.state.history[0].agreed == d2.state.history[0].agreed == PROVIDERS
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()

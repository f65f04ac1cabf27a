"""The control calls H1 makes to H2 in a round (issue 47): each is a round trip between the two
organisations, so a fused step that comes apart again shows here as one call more. Before
issue 47 a steady round made seven (mode preprocessed) or eight (spgc): ROUND_OPEN,
INTAKE_CLOSED, AgreeProviders, CommitSeed (spgc), CosignRelease, CIRCUIT_READY, CheckModel,
MODEL_PUBLISHED."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_server_daemon import PROVIDERS, Provider, start_pair, wait_round_done

from spgc.protocol.certs import make_dev_pki
from spgc.servers import coordinator
from spgc.wire import peer_pb2

ROUNDS = 4


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    make_dev_pki(root / "good", ["h1", "h2", *PROVIDERS])
    return root


#: A round in which H1 sends its provider set without the release statement, as it does when
#: the noise pool is short then: the release is co-signed in a call of its own.
UNFUSED_ROUND = 2


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
                request = peer_pb2.ProviderSet.FromString(request.SerializeToString())
                request.ClearField("release")
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


@pytest.mark.parametrize(
    ("plan", "unfused"),
    [
        ({"mode": "preprocessed", "pool_rounds": ROUNDS, "pool_block": 100}, False),
        ({"mode": "spgc"}, False),
        ({"mode": "preprocessed", "pool_rounds": ROUNDS, "pool_block": 100}, True),
    ],
    ids=["preprocessed", "spgc", "preprocessed-release-apart"],
)
def test_a_steady_round_makes_two_control_calls(
    pki: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    plan: dict[str, Any],
    unfused: bool,
) -> None:
    calls = counted(monkeypatch, unfused)
    d1, d2 = start_pair(pki, tmp_path, rounds=ROUNDS, noise_multiplier=1.0, **plan)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        for t in range(ROUNDS):
            cfg = providers[0].wait_collecting(t)
            for i, p in enumerate(providers):
                p.submit_both(cfg, t, np.full(cfg.num_parameters, i, dtype=np.int64))
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
    if plan["mode"] == "spgc":  # the commitments travelled with the statements
        for t in range(ROUNDS):
            assert d1.state.history[t].seed_commitments == d2.state.history[t].seed_commitments
            assert len(d1.state.history[t].seed_commitments["h2"]) == 32

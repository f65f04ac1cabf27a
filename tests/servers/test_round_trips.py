"""The control calls H1 makes to H2 in a round (issue 47): each is a round trip between the two
organisations, so a fused step that comes apart again shows here as one call more."""

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


class CountingPeer:
    """H1's Peer stub, recording (round H1 is at, call) for every control call it makes."""

    def __init__(self, stub: Any, state: Any, calls: dict[int, list[str]]) -> None:
        self._stub, self._state, self._calls = stub, state, calls

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._stub, name)

        def call(request: Any, *args: Any, **kwargs: Any) -> Any:
            what = name
            if name == "RoundBarrier":
                what = peer_pb2.Barrier.Name(request.barrier)
            self._calls[self._state.round].append(what)
            return method(request, *args, **kwargs)

        return call


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> dict[int, list[str]]:
    """Round -> H1's round-loop calls to H2 in it (noise production's calls, from a thread of
    their own beside the rounds, are not counted: the producer holds the plain stub)."""
    made: dict[int, list[str]] = defaultdict(list)
    real = coordinator.H1Driver.__init__

    def counting(self: coordinator.H1Driver, state: Any, peer: Any, *args: Any) -> None:
        real(self, state, peer, *args)
        self.peer = CountingPeer(peer, state, made)

    monkeypatch.setattr(coordinator.H1Driver, "__init__", counting)
    return made


# The steady round: the provider set (which waits for H2's own intake to close), the co-signed
# ledger entry (which carries the seed commitments or the pool entries and starts the release
# at H2), the model check (H2 publishes and opens the next round in it). Round 0 opens with its
# own call; the last round opens no next one.
STEADY = ["AgreeProviders", "CosignRelease", "CheckModel"]


@pytest.mark.parametrize(
    "plan",
    [
        {"mode": "preprocessed", "pool_rounds": ROUNDS, "pool_block": 100},
        {"mode": "spgc"},
    ],
    ids=["preprocessed", "spgc"],
)
def test_a_steady_round_makes_three_control_calls(
    pki: Path, tmp_path: Path, calls: dict[int, list[str]], plan: dict[str, Any]
) -> None:
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
        assert rounds[t] == STEADY, (t, rounds[t])

"""PairWorkers, the control call that links the servers' circuit workers (workers > 1): H1 names
where its workers listen, H2's worker i dials H1's worker i. These tests drive H2's handler
directly; tests/servers/test_ray_workers.py runs the whole pairing between two daemons on Ray."""

from __future__ import annotations

import re
import threading
import time
from types import SimpleNamespace
from typing import Any

import grpc
import pytest

from spgc.servers.peer import PeerServicer, parse_worker_addresses
from spgc.wire import aggregation_pb2 as pb
from spgc.wire import peer_pb2
from spgc.wire.errors import InvalidArgumentError, WireError

RUN = "run-pair-workers"


class _Context:
    """Just enough of grpc.ServicerContext: an insecure caller, a deadline, abort."""

    def __init__(self, remaining: float = 5.0) -> None:
        self.remaining = remaining
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def time_remaining(self) -> float:
        return self.remaining

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise RuntimeError("aborted")


def _h2(link_workers: Any = None, paired: bool = True) -> PeerServicer:
    state = SimpleNamespace(
        role=pb.SERVER_ROLE_H2, ready=True, run_id=RUN, last_peer_call=0.0, aborted=None
    )
    servicer = PeerServicer(
        state,  # type: ignore[arg-type]
        "h1",
        True,
        get_link=lambda timeout: None,
        on_handshake=lambda run_id: None,
        align=lambda info: None,
        link_workers=link_workers,
    )
    servicer.paired = paired
    return servicer


def _request(addresses: list[str], workers: int | None = None, **kw: Any) -> Any:
    fields = {"run_id": RUN, "role": pb.SERVER_ROLE_H1, "workers": len(addresses)}
    fields.update(kw)
    if workers is not None:
        fields["workers"] = workers
    return peer_pb2.WorkerPairing(addresses=addresses, **fields)


def _refusal(servicer: PeerServicer, request: Any) -> tuple[grpc.StatusCode, str]:
    context = _Context()
    with pytest.raises(RuntimeError, match="aborted"):
        servicer.PairWorkers(request, context)
    assert context.aborted is not None
    return context.aborted


def test_addresses_are_host_port_pairs_one_per_worker() -> None:
    got = parse_worker_addresses(["10.0.0.5:41000", "worker-1.h1.example:7", "[::1]:65535"], 3)
    assert got == [("10.0.0.5", 41000), ("worker-1.h1.example", 7), ("::1", 65535)]
    bad = [
        (["10.0.0.5:41000"], 2, "names 1 worker address(es) for 2 workers"),
        (["10.0.0.5"], 1, "addresses[0]='10.0.0.5' is not host:port"),
        ([":41000"], 1, "is not host:port"),
        (["h:0"], 1, "is not host:port"),
        (["h:65536"], 1, "is not host:port"),
        (["h:-1"], 1, "is not host:port"),
        (["h:\u0663"], 1, "is not host:port"),  # a digit, but not an ASCII one
        (["h:80", "h:port"], 2, "addresses[1]='h:port'"),
        (["h" * 300 + ":80"], 1, "at most 300 bytes"),
    ]
    for addresses, workers, words in bad:
        with pytest.raises(InvalidArgumentError, match=re.escape(words)):
            parse_worker_addresses(addresses, workers)


def test_h2_links_its_workers_to_the_named_addresses_and_answers_its_count() -> None:
    calls = []

    def link_workers(addresses: list[tuple[str, int]], workers: int, timeout: float) -> int:
        calls.append((addresses, workers, timeout))
        return workers

    servicer = _h2(link_workers)
    answer = servicer.PairWorkers(_request(["127.0.0.1:5001", "127.0.0.1:5002"]), _Context(9.0))
    assert answer.workers == 2 and answer.role == pb.SERVER_ROLE_H2 and answer.run_id == RUN
    assert not answer.addresses
    # the caller's deadline bounds the wait, less a second to answer in
    assert calls == [([("127.0.0.1", 5001), ("127.0.0.1", 5002)], 2, 8.0)]


def test_pair_workers_refusals() -> None:
    called = []

    def link_workers(addresses: list[tuple[str, int]], workers: int, timeout: float) -> int:
        called.append(workers)
        return workers

    code, words = _refusal(_h2(None), _request(["127.0.0.1:5001", "127.0.0.1:5002"]))
    assert code == grpc.StatusCode.FAILED_PRECONDITION and "workers: 1" in words
    servicer = _h2(link_workers)
    code, words = _refusal(servicer, _request(["127.0.0.1:5001"], workers=2))
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "1 worker address(es) for 2" in words
    code, _ = _refusal(servicer, _request(["127.0.0.1:5001"], run_id="another-run"))
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    code, _ = _refusal(servicer, _request(["127.0.0.1:5001"], role=pb.SERVER_ROLE_H2))
    assert code == grpc.StatusCode.PERMISSION_DENIED
    code, _ = _refusal(_h2(link_workers, paired=False), _request(["127.0.0.1:5001"]))
    assert code == grpc.StatusCode.UNAVAILABLE  # a restarted H2: H1 pairs again first
    assert called == []  # nothing refused reached the workers


def test_a_failed_link_is_the_callers_status() -> None:
    def link_workers(addresses: list[tuple[str, int]], workers: int, timeout: float) -> int:
        raise WireError("h2's workers did not start within 8 s", grpc.StatusCode.DEADLINE_EXCEEDED)

    code, words = _refusal(_h2(link_workers), _request(["127.0.0.1:5001"]))
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED and "did not start" in words


class _EndsOnFirstWait(threading.Event):
    """An Event whose first wait() calls ``end`` first (then waits as any Event does)."""

    def __init__(self, end: Any) -> None:
        super().__init__()
        self.end, self.waits = end, 0

    def wait(self, timeout: float | None = None) -> bool:
        self.waits += 1
        if self.waits == 1:
            self.end()
        return super().wait(timeout)


def test_h2_refuses_at_once_when_the_pairing_ends_while_its_workers_start(tmp_path) -> None:
    """H2's handler waits for its own workers of the current pairing; a new Handshake (H1
    restarted) or an unpairing meanwhile answers UNAVAILABLE at once, so that H1 pairs again
    instead of waiting out its deadline; counts that differ are refused before any wait."""
    from test_server_daemon import PROVIDERS, bind_pair

    from spgc.protocol.certs import make_dev_pki
    from spgc.wire.errors import FailedPreconditionError, NotPairedError

    pki = tmp_path / "pki"
    make_dev_pki(pki / "good", ["h1", "h2", *PROVIDERS])
    d1, d2 = bind_pair(pki, tmp_path, mode="spgc", workers=2)
    try:
        h2 = d2.peer_servicer
        assert h2.link_workers is not None and d1.peer_servicer.link_workers is not None
        addresses = [("127.0.0.1", 5001), ("127.0.0.1", 5002)]
        with pytest.raises(FailedPreconditionError, match="workers differ: 3 at h1, 2 here"):
            h2.link_workers(addresses, 3, 5.0)
        h2.paired = True
        with pytest.raises(WireError, match=r"did not start within 0\.5 s") as info:
            h2.link_workers(addresses, 2, 0.5)
        assert info.value.code == grpc.StatusCode.DEADLINE_EXCEEDED
        for end_pairing in (lambda: setattr(h2, "epoch", h2.epoch + 1), h2.unpair):
            h2.paired = True
            # The pairing ends while the handler waits for H2's workers: from inside that wait
            # (not after a fixed delay, which could also end it before the handler began)
            ends = _EndsOnFirstWait(end_pairing)
            d2._workers_started = ends
            started = time.monotonic()
            with pytest.raises(NotPairedError, match="lost the pairing"):
                h2.link_workers(addresses, 2, 30.0)
            assert ends.waits >= 1 and not ends.is_set()
            assert time.monotonic() - started < 5
    finally:
        d1.stop()
        d2.stop()


def test_workers_without_ray_is_refused_at_start(tmp_path, monkeypatch) -> None:
    """workers > 1 on a machine without the Ray extra: the daemon refuses to start and says
    how to install it, instead of failing only once paired with the other server."""
    from test_server_daemon import PROVIDERS, _cfg

    import spgc.servers.daemon as daemon_module
    from spgc.protocol.certs import make_dev_pki

    make_dev_pki(tmp_path / "pki" / "good", ["h1", "h2", *PROVIDERS])
    monkeypatch.setattr(daemon_module, "ray_available", lambda: False)
    cfg = _cfg(tmp_path / "pki", 1, tmp_path / "s1", mode="spgc", workers=2)
    how = r"pip install '\.\[ray\]' in the checkout \(or set workers: 1\)"
    with pytest.raises(ValueError, match=how):
        daemon_module.ServerDaemon(cfg)

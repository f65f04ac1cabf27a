"""Provider traffic under limits (servers.limits) and the servers' own control port (issue 14).

A certificate of the deployment CA that is not a provider of the run is refused before any
message is read; one provider cannot hold more than its share of calls; a silent upload is cut;
and the server-to-server Peer service is not on the providers' port at all.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import numpy as np
import pytest
from helpers import wait_until
from test_server_daemon import (
    PROVIDERS,
    Provider,
    assert_round_used,
    bind_pair,
    start_pair,
    wait_round_done,
)
from test_server_daemon import pki as pki  # the module's fixture: h1, h2, p1..p3 and x9

from spgc.protocol.sharing import share
from spgc.servers.audit import AuditLog
from spgc.wire import aggregation_pb2 as pb
from spgc.wire import peer_pb2, peer_pb2_grpc
from spgc.wire.errors import is_size_refusal
from spgc.wire.identity import new_submission_id
from spgc.wire.messages import share_messages
from spgc.wire.pages import MAX_PAGES
from spgc.wire.tls import TlsFiles
from spgc.wire.transport import make_channel


def _audit(state_dir: Path) -> list[dict]:
    path = state_dir / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _silent(release: threading.Event) -> Iterator[pb.ShareChunk]:
    """A request stream that sends nothing until ``release`` is set."""
    release.wait(30)
    return
    yield  # a generator


def test_a_non_provider_is_refused_before_any_message(pki: Path, tmp_path: Path) -> None:
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", rounds=1, metrics_port=0)
    release = threading.Event()
    intruder = Provider(pki, "x9", (d1, d2))  # a certificate of the CA, not in `providers`
    try:
        started = time.monotonic()
        for role in (1, 2):
            with pytest.raises(grpc.RpcError) as info:
                intruder.stubs[role].SubmitShare(_silent(release), timeout=20)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "'x9' is not a provider of this run" in info.value.details()
        # Refused at once: the handler never waited for the first message.
        assert time.monotonic() - started < 10
        for _ in range(30):  # a flood of refused calls is counted, not written line by line
            with pytest.raises(grpc.RpcError) as info:
                intruder.hello(1)
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert d1.metrics is not None
        refusals = d1.metrics.registry.get_sample_value(
            "spgc_requests_refused_total", {"reason": "PERMISSION_DENIED"}
        )
    finally:
        release.set()
        intruder.close()
        d1.stop()
        d2.stop()
    # The audit log names every refusal: who, which call, why.
    events = _audit(tmp_path / "s1")
    refused = [e for e in events if e["event"] == "refused"]
    assert {(e["identity"], e["method"], e["code"]) for e in refused} == {
        ("x9", "SubmitShare", "PERMISSION_DENIED"),
        ("x9", "Hello", "PERMISSION_DENIED"),
    }
    assert events[0]["event"] == "start" and events[-1]["event"] == "stop"
    assert all(e["server"] == "h1" and e["time"].endswith("Z") for e in events)
    assert refusals == 31  # ... while the metrics count every one


def test_malformed_requests_are_audited_and_counted(pki: Path, tmp_path: Path) -> None:
    """A request that does not parse is refused before its handler; like every refusal it is
    in the audit log under the caller's certificate name (repeats once per window) and in the
    metrics, one count per call."""
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", rounds=1, metrics_port=0)
    p1 = Provider(pki, "p1", (d1, d2))
    garbage = p1.channels[0].unary_unary(
        "/spgc.v1.Aggregator/Hello", request_serializer=None, response_deserializer=None
    )
    try:
        for _ in range(20):
            with pytest.raises(grpc.RpcError) as info:
                garbage(b"\xff\xff\xff", timeout=10)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert d1.metrics is not None
        counted = d1.metrics.registry.get_sample_value(
            "spgc_requests_refused_total", {"reason": "INVALID_ARGUMENT"}
        )
    finally:
        p1.close()
        d1.stop()
        d2.stop()
    assert counted == 20
    refused = [e for e in _audit(tmp_path / "s1") if e["event"] == "refused"]
    assert [(e["identity"], e["method"], e["code"]) for e in refused] == [
        ("p1", "Hello", "INVALID_ARGUMENT")
    ]
    assert "malformed Hello message" in refused[0]["reason"]


def test_a_repeated_refusal_is_written_once_per_window_with_the_count_left_out(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The repeat window's clock is the test's: the window passes when the test says so (a
    # short window and a fixed sleep raced both ways: a slow machine let repeats through).
    import spgc.common.logs

    now = [1000.0]
    clock = SimpleNamespace(monotonic=lambda: now[0], gmtime=time.gmtime, strftime=time.strftime)
    monkeypatch.setattr(spgc.common.logs, "time", clock)
    seen: list[str] = []
    audit = AuditLog(tmp_path / "audit.jsonl", "h1")
    audit.add_listener(lambda event, entry: seen.append(event))
    window = audit._repeats.window
    written = [audit.record("refused", repeat_key="x9 Hello", identity="x9") for _ in range(5)]
    assert written == [True, False, False, False, False]
    assert audit.record("refused", repeat_key="x9 SubmitShare", identity="x9")  # another kind
    now[0] += window - 1.0
    assert not audit.record("refused", repeat_key="x9 Hello", identity="x9")  # still within
    now[0] += 1.0
    assert audit.record("refused", repeat_key="x9 Hello", identity="x9")
    audit.close()
    lines = _audit(tmp_path)
    assert [e.get("repeats") for e in lines] == [None, None, 5]
    assert len(seen) == 8  # listeners (the metrics) see every event


def test_one_provider_cannot_hold_the_server(pki: Path, tmp_path: Path) -> None:
    """At most provider_max_streams calls in flight per identity; a silent upload is cut after
    provider_idle seconds; the other providers' round goes on meanwhile."""
    d1, d2 = start_pair(
        pki, tmp_path, mode="only-mpc", rounds=1, provider_max_streams=2, provider_idle=2.0,
        round_deadline=20.0,
    )  # fmt: skip
    release = threading.Event()
    hog = Provider(pki, "p1", (d1, d2))
    others = [Provider(pki, n, (d1, d2)) for n in PROVIDERS[1:]]
    try:

        def paired() -> bool:  # before, every call is UNAVAILABLE, the uploads too
            try:
                hog.hello(1)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    return False
                raise
            return True

        wait_until(paired, "the servers to pair")
        held = [hog.stubs[1].SubmitShare.future(_silent(release), timeout=20) for _ in range(2)]
        refused: list[grpc.RpcError] = []

        def third_call_refused() -> bool:  # once both uploads are in flight at the server
            try:
                hog.hello(1)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:
                    return False  # the servers are still pairing: not the limit yet
                refused.append(exc)
                return True
            return False

        wait_until(third_call_refused, "p1's third call to be refused")
        with pytest.raises(grpc.RpcError) as info:
            raise refused[0]
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "more than 2 calls at once from 'p1'" in info.value.details()
        assert not is_size_refusal(info.value)  # a limit on calls: worth a later retry
        # The silent uploads are cancelled by the server within provider_idle (+ 1 s check).
        for call in held:
            with pytest.raises(grpc.RpcError) as info:
                call.result(timeout=10)
            assert info.value.code() == grpc.StatusCode.CANCELLED
        assert hog.hello(1).provider_id == "p1"  # its calls are free again
        # Meanwhile the others' round completes (min_providers 2).
        cfg = others[0].wait_collecting(0)
        for i, p in enumerate(others):
            p.submit_both(cfg, 0, np.full(cfg.num_parameters, i + 1, dtype=np.int64))
        wait_round_done((d1, d2), 0)
    finally:
        release.set()
        for p in (hog, *others):
            p.close()
        d1.stop()
        d2.stop()


def test_a_stalled_upload_can_be_started_again(pki: Path, tmp_path: Path) -> None:
    """A provider whose upload stalls (its connection lost, say) submits again at once: the new
    submission counts, the stalled stream is refused with ABORTED if it goes on, and the round
    holds the provider's share exactly once."""
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", rounds=1, round_deadline=6.0)
    p1, p2 = (Provider(pki, n, (d1, d2)) for n in PROVIDERS[:2])
    go_on = threading.Event()
    try:
        cfg = p1.wait_collecting(0)
        values = np.arange(cfg.num_parameters, dtype=np.int64) - 20
        a1, a2 = share(values, cfg.ring_bits)
        msgs = list(share_messages(
            a1, run_id=cfg.run_id, round_number=0, server_role=pb.SERVER_ROLE_H1,
            ring_bits=cfg.ring_bits, submission_id=new_submission_id(), chunk_bytes=256,
        ))  # fmt: skip
        assert len(msgs) >= 3  # a header and at least two chunks

        def stalling() -> Iterator[pb.ShareChunk]:
            yield from msgs[:2]
            go_on.wait(30)
            yield from msgs[2:]

        stalled = p1.stubs[1].SubmitShare.future(stalling(), timeout=30)
        wait_until(
            lambda: (d1.state.intake.values_in_flight("p1") or 0) > 0,
            "the stalled upload's header and first chunk at h1",
        )
        p1.submit(1, cfg, 0, a1)  # not ALREADY_EXISTS: nothing of p1's is counted yet
        p1.submit(2, cfg, 0, a2)
        go_on.set()
        with pytest.raises(grpc.RpcError) as info:
            stalled.result(timeout=10)
        assert info.value.code() == grpc.StatusCode.ABORTED
        assert "began a newer submission" in info.value.details()
        other = np.full(cfg.num_parameters, 3, dtype=np.int64)
        p2.submit_both(cfg, 0, other)
        wait_round_done((d1, d2), 0)
        assert_round_used((d1, d2), 0, ["p1", "p2"], values + other, (["p1", "p2"],) * 2)
    finally:
        go_on.set()
        p1.close()
        p2.close()
        d1.stop()
        d2.stop()


def test_the_peer_service_has_its_own_port(pki: Path, tmp_path: Path) -> None:
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", rounds=1)
    p = Provider(pki, "p1", (d1, d2))
    try:
        assert d2.peer_port not in (0, d2.port)
        # The providers' port does not serve the Peer service at all.
        stub = peer_pb2_grpc.PeerStub(p.channels[1])
        with pytest.raises(grpc.RpcError) as info:
            stub.RoundBarrier(peer_pb2.BarrierState(run_id="x", round=0), timeout=10)
        assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED
        # On the peer port a provider's certificate is refused before its request is read
        # (pages over MAX_PAGES is out of bounds: that would be INVALID_ARGUMENT), and audited.
        tls = TlsFiles.from_dir(pki / "good", "p1")
        peer_port = make_channel(f"127.0.0.1:{d2.peer_port}", tls, server_name="h2")
        try:
            ask = peer_pb2.ProviderSet(run_id=d2.state.run_id, round=0, pages=MAX_PAGES + 1)
            with pytest.raises(grpc.RpcError) as info:
                list(peer_pb2_grpc.PeerStub(peer_port).AgreeProviders(iter([ask]), timeout=10))
            assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "'p1' is not the peer server 'h1'" in info.value.details()
        finally:
            peer_port.close()
    finally:
        p.close()
        d1.stop()
        d2.stop()
    refused = [e for e in _audit(tmp_path / "s2") if e["event"] == "refused"]
    assert [(e["identity"], e["method"], e["code"]) for e in refused] == [
        ("p1", "AgreeProviders", "PERMISSION_DENIED")
    ]


def test_junk_on_the_circuit_port_does_not_stop_h1(
    pki: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Connections to H1's garbled-circuit port before H2's (junk bytes, a silent one) are
    refused and logged; H1 keeps waiting for H2 and the round runs."""
    d1, d2 = bind_pair(pki, tmp_path, mode="only-mpc", rounds=1)
    junk = socket.create_connection(("127.0.0.1", d1.gc_port))
    silent = socket.create_connection(("127.0.0.1", d1.gc_port))
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        with caplog.at_level("WARNING", logger="spgc.servers.data_link"):
            junk.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" * 10)
            d1.start()
            time.sleep(1.0)
            d2.start()
            cfg = providers[0].wait_collecting(0)
            for i, p in enumerate(providers):
                p.submit_both(cfg, 0, np.full(cfg.num_parameters, i + 1, dtype=np.int64))
            wait_round_done((d1, d2), 0)
        assert d1.error is None and d2.error is None
        refused = [r.getMessage() for r in caplog.records if "circuit port: refused" in r.message]
        assert any("TLS handshake failed" in m for m in refused), refused
        audited = [e for e in _audit(tmp_path / "s1") if e["event"] == "circuit_refused"]
        assert any("TLS handshake failed" in e["reason"] for e in audited), audited
        assert all(e["identity"].startswith("127.0.0.1:") for e in audited)
    finally:
        junk.close()
        silent.close()
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()

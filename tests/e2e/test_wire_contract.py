"""The wire contract (proto/spgc/v1): malformed requests, protocol versions, the sharing rule and
ring, and the bounds of every number either side reads from the other."""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor_pb2, timestamp_pb2
from helpers import proto_descriptors_with_comments, wait_until

from spgc.protocol.certs import make_dev_pki
from spgc.protocol.sharing import reconstruct, share
from spgc.providers.client import ProviderRefusal, check_wire_contract
from spgc.servers.aggregator import ENDED_EARLY, AggregatorServicer
from spgc.servers.intake import ShareIntake
from spgc.servers.state import ServerState
from spgc.settings.config import ServerConfig
from spgc.settings.plan import make_plan
from spgc.wire import (
    PROTOCOL_VERSION,
    aggregation_pb2,
    aggregation_pb2_grpc,
    peer_pb2,
    peer_pb2_grpc,
)
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.bounds import FIELD_BOUNDS, MAX_COUNTER, check_bounds, numeric_fields
from spgc.wire.errors import (
    FailedPreconditionError,
    InvalidArgumentError,
    ResourceExhaustedError,
    abort_on_error,
    is_size_refusal,
)
from spgc.wire.identity import new_submission_id
from spgc.wire.messages import (
    INLINE_MODEL_BYTES,
    check_protocol_version,
    inline_model,
    iter_share_payload,
    read_inline_model,
    read_model_stream,
    read_share_header,
    share_messages,
)
from spgc.wire.transport import (
    LoopThread,
    add_servicer,
    make_aio_server,
    make_channel,
    make_server,
)

AGGREGATOR = aggregation_pb2.DESCRIPTOR.services_by_name["Aggregator"]
PEER = peer_pb2.DESCRIPTOR.services_by_name["Peer"]
GARBAGE = b"\xff" * 16  # not a protobuf message of any type
BAD_UTF8_HELLO = b"\x1a\x02\xff\xfe"  # HelloRequest.provider_id with invalid UTF-8
TIMEOUT = 10
RUN = "run-contract"
INF, NAN = math.inf, math.nan


def _no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    for record in caplog.records:
        assert record.exc_info is None, record.getMessage()
        text = record.getMessage()
        assert "Traceback" not in text and "Exception deserializing" not in text, text


def _refusal_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]


# ----------------------------------------------------------------------------- a trivial server


class Recorder(aggregation_pb2_grpc.AggregatorServicer):
    """Records what reached it; no abort_on_error, to show the transport refuses by itself."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def Hello(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.append("Hello")
        return pb.ServerInfo(protocol_version=PROTOCOL_VERSION, provider_id=request.provider_id)

    def RoundStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.append("RoundStatus")
        return pb.RoundInfo(round=request.round)

    def FetchModel(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        self.calls.append("FetchModel")
        yield pb.ModelChunk(chunk=pb.VectorChunk(index=0, data=b"\0" * 8))

    def SubmitShare(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        self.calls.append("SubmitShare")
        count = sum(1 for _ in request_iterator)
        return pb.SubmitReceipt(num_elements=count)


class Checking(Recorder):
    """Reads share streams the way the real servicer does, behind abort_on_error."""

    @abort_on_error
    def SubmitShare(self, request_iterator: Iterator[Any], context: grpc.ServicerContext) -> Any:
        self.calls.append("SubmitShare")
        header = read_share_header(request_iterator)
        data = b"".join(iter_share_payload(request_iterator, header))
        return pb.SubmitReceipt(num_elements=len(data) // 8)


class PeerRecorder(peer_pb2_grpc.PeerServicer):
    def __init__(self) -> None:
        self.calls: list[str] = []

    def Handshake(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.calls.append("Handshake")
        return peer_pb2.PeerHello(protocol_version=PROTOCOL_VERSION)


class Served:
    """A started plaintext server on 127.0.0.1 with servicers registered through add_servicer
    (exactly as make_server's adders: functools.partial). ``aio``: an asyncio server (on a
    LoopThread, as the daemon serves providers), for coroutine servicers."""

    def __init__(self, *pairs: tuple[object, Any], generated: Any = None, aio: bool = False):
        adders = [functools.partial(add_servicer, servicer=s, service=d) for s, d in pairs]
        if generated is not None:
            adders = [generated]
        self.io: LoopThread | None = None
        if aio:
            self.io = LoopThread("test-io")

            async def serve() -> tuple[Any, int]:
                server, port = make_aio_server("127.0.0.1:0", adders, None, insecure=True)
                await server.start()
                return server, port

            self.server, port = self.io.run(serve())
        else:
            self.server, port = make_server(
                "127.0.0.1:0", adders, None, insecure=True, max_workers=4
            )
            self.server.start()
        self.port = port
        self.channel = make_channel(f"127.0.0.1:{port}", None, insecure=True)

    def raw_unary(self, method: str, body: bytes, service: str = "spgc.v1.Aggregator") -> Any:
        return self.channel.unary_unary(f"/{service}/{method}")(body, timeout=TIMEOUT)

    def raw_unary_stream(self, method: str, body: bytes) -> list[Any]:
        return list(self.channel.unary_stream(f"/spgc.v1.Aggregator/{method}")(body, timeout=10))

    def raw_stream_unary(self, method: str, bodies: list[bytes]) -> Any:
        call = self.channel.stream_unary(f"/spgc.v1.Aggregator/{method}")
        return call(iter(bodies), timeout=TIMEOUT)

    def close(self) -> None:
        self.channel.close()
        if self.io is not None:
            self.io.run(self.server.stop(None))
            self.io.close()
        else:
            self.server.stop(None).wait()


@pytest.fixture
def recorder() -> Iterator[tuple[Served, Recorder]]:
    servicer = Recorder()
    served = Served((servicer, AGGREGATOR))
    yield served, servicer
    served.close()


def _refused(call: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as e:
        call()
    return e.value


# ----------------------------------------------------------------------------- malformed bytes


def test_generated_registration_answers_garbage_with_internal_and_a_traceback(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The problem add_servicer solves (and proof that this file's log check sees it)."""
    caplog.set_level(logging.DEBUG)
    servicer = Recorder()
    adder = functools.partial(aggregation_pb2_grpc.add_AggregatorServicer_to_server, servicer)
    served = Served(generated=adder)
    try:
        err = _refused(lambda: served.raw_unary("Hello", GARBAGE))
    finally:
        served.close()
    assert err.code() == grpc.StatusCode.INTERNAL
    with pytest.raises(AssertionError):
        _no_tracebacks(caplog)


@pytest.mark.parametrize(
    ("method", "body"),
    [("Hello", GARBAGE), ("Hello", BAD_UTF8_HELLO), ("RoundStatus", GARBAGE)],
)
def test_garbage_unary_request_is_invalid_argument(
    recorder: tuple[Served, Recorder],
    caplog: pytest.LogCaptureFixture,
    method: str,
    body: bytes,
) -> None:
    caplog.set_level(logging.DEBUG)
    served, servicer = recorder
    err = _refused(lambda: served.raw_unary(method, body))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.details().startswith(f"malformed {method} message: ")
    assert servicer.calls == []  # the servicer never saw it
    _no_tracebacks(caplog)
    (line,) = _refusal_lines(caplog)
    assert "\n" not in line and f"spgc.v1.Aggregator.{method}" in line


def test_garbage_server_streaming_request_is_invalid_argument(
    recorder: tuple[Served, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    served, servicer = recorder
    err = _refused(lambda: served.raw_unary_stream("FetchModel", GARBAGE))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed FetchModel message" in err.details()
    assert servicer.calls == []
    _no_tracebacks(caplog)


@pytest.mark.parametrize("servicer_class", [Recorder, Checking])
def test_garbage_in_a_share_stream_is_invalid_argument(
    caplog: pytest.LogCaptureFixture, servicer_class: type[Recorder]
) -> None:
    caplog.set_level(logging.DEBUG)
    servicer = servicer_class()
    served = Served((servicer, AGGREGATOR))
    vec = np.arange(4, dtype=np.uint64)
    good = [
        m.SerializeToString()
        for m in share_messages(
            vec, run_id=RUN, round_number=0, server_role=1, ring_bits=8, submission_id=b"s"
        )
    ]
    try:
        assert served.raw_stream_unary("SubmitShare", good)  # a good stream goes through
        first = _refused(lambda: served.raw_stream_unary("SubmitShare", [GARBAGE]))
        later = _refused(lambda: served.raw_stream_unary("SubmitShare", [good[0], GARBAGE]))
    finally:
        served.close()
    for err, index in ((first, 0), (later, 1)):
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.details().startswith(f"malformed SubmitShare message {index}: "), err.details()
    _no_tracebacks(caplog)
    assert len(_refusal_lines(caplog)) == 2


def test_add_servicer_serves_the_peer_service_too(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    peer = PeerRecorder()
    served = Served((peer, PEER), (Recorder(), AGGREGATOR))
    try:
        err = _refused(lambda: served.raw_unary("Handshake", GARBAGE, "spgc.v1.Peer"))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "malformed Handshake message" in err.details()
        # Numbers inside nested messages are bounded too.
        bad = peer_pb2.PeerHello(protocol_version=1, config=_config(ring_bits=65))
        err = _refused(
            lambda: served.raw_unary("Handshake", bad.SerializeToString(), "spgc.v1.Peer")
        )
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "PeerHello.config.ring_bits=65 is out of bounds: must be 2..64" in err.details()
        good = peer_pb2.PeerHello(protocol_version=1)
        stub = peer_pb2_grpc.PeerStub(served.channel)
        assert stub.Handshake(good, timeout=TIMEOUT).protocol_version == PROTOCOL_VERSION
    finally:
        served.close()
    assert peer.calls == ["Handshake"]
    _no_tracebacks(caplog)


def test_out_of_bounds_requests_are_refused_before_the_servicer(
    recorder: tuple[Served, Recorder], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    served, servicer = recorder
    stub = aggregation_pb2_grpc.AggregatorStub(served.channel)
    for request, words in [
        (pb.RoundStatusRequest(wait_seconds=NAN), "RoundStatusRequest.wait_seconds=nan"),
        (pb.RoundStatusRequest(wait_seconds=-1), "wait_seconds=-1.0"),
        (pb.RoundStatusRequest(round=MAX_COUNTER + 1), "RoundStatusRequest.round="),
        (pb.RoundStatusRequest(after_round=2**64 - 1), "after_round="),
    ]:
        err = _refused(lambda r=request: stub.RoundStatus(r, timeout=TIMEOUT))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in err.details(), err.details()
    header = pb.ShareHeader(
        run_id=RUN, round=0, num_elements=1, ring_bits=8, chunk_bytes=2 << 20, chunk_count=1
    )
    err = _refused(lambda: stub.SubmitShare(iter([pb.ShareChunk(header=header)]), timeout=10))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # a size above its limit
    assert "ShareChunk.header.chunk_bytes=2097152 exceeds the limit" in err.details()
    assert is_size_refusal(err)  # a client does not retry it (a limit on calls it would)
    assert servicer.calls == ["SubmitShare"]  # the stream's first message fails in its loop
    assert stub.RoundStatus(pb.RoundStatusRequest(round=MAX_COUNTER), timeout=TIMEOUT).round
    _no_tracebacks(caplog)


# ----------------------------------------------------------------------------- the real servicer


@pytest.fixture
def aggregator(tmp_path: Path) -> Iterator[tuple[Served, ServerState]]:
    """The real AggregatorServicer on a real ServerState (H1, round 0 open), plaintext."""
    cfg = ServerConfig(
        role=1,
        insecure=True,
        providers=["p1", "p2"],
        dataset="cancer",
        max_batch_size=64,
        rounds=2,
        scale=1024.0,
        min_providers=1,
        verify_inputs="none",  # ring shares, hand-made (verified inputs: test_verified_inputs)
    )
    plan = make_plan(cfg)
    intake = ShareIntake(
        plan.dim, plan.ring_bits, spill_root=tmp_path, allowed_providers=cfg.providers
    )
    state = ServerState(plan, pb.SERVER_ROLE_H1, intake)
    state.run_id = RUN
    state.config = plan.training_config(RUN)
    state.open_round(0)
    servicer = AggregatorServicer(state, "h1", insecure=True)
    served = Served((servicer, AGGREGATOR), aio=True)
    yield served, state
    served.close()
    servicer.close()
    state.close()


def _stub(served: Served) -> Any:
    return aggregation_pb2_grpc.AggregatorStub(served.channel)


def test_hello_refuses_other_protocol_versions(
    aggregator: tuple[Served, ServerState], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    served, _ = aggregator
    stub = _stub(served)
    err = _refused(lambda: stub.Hello(pb.HelloRequest(protocol_version=2, provider_id="p1")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "protocol version 2" in err.details() and f"protocol version {PROTOCOL_VERSION}" in (
        err.details()
    )
    err = _refused(lambda: stub.Hello(pb.HelloRequest(provider_id="p1")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "client sent no protocol_version" in err.details()
    assert f"protocol version {PROTOCOL_VERSION}" in err.details()
    info = stub.Hello(pb.HelloRequest(protocol_version=PROTOCOL_VERSION, provider_id="p1"))
    assert info.protocol_version == PROTOCOL_VERSION and info.provider_id == "p1"
    # The server announces the sharing rule and ring the provider must follow (this fixture's
    # plan turns verified inputs off: ring shares).
    assert info.config.sharing_rule == pb.SHARING_RULE_DIFFERENCE_MOD_2L
    assert info.config.verify_inputs == "none" and info.config.norm_field_modulus == 0
    assert 2 <= info.config.ring_bits <= 64
    check_wire_contract(info.config)
    _no_tracebacks(caplog)


def test_version_is_checked_before_the_handshake_is_complete(
    aggregator: tuple[Served, ServerState],
) -> None:
    """A provider of another version learns it at once, not after retrying UNAVAILABLE."""
    served, state = aggregator
    state.config = None  # not ready
    stub = _stub(served)
    err = _refused(lambda: stub.Hello(pb.HelloRequest(protocol_version=3, provider_id="p1")))
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    err = _refused(lambda: stub.Hello(pb.HelloRequest(protocol_version=1, provider_id="p1")))
    assert err.code() == grpc.StatusCode.UNAVAILABLE


def test_real_servicer_refuses_garbage_and_keeps_the_round(
    aggregator: tuple[Served, ServerState], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    served, state = aggregator
    t, d, bits = 0, state.plan.dim, state.plan.ring_bits
    for method in ("Hello", "RoundStatus", "DeclinePlan", "FetchLedger"):
        err = _refused(lambda m=method: served.raw_unary(m, GARBAGE))
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, method
        assert f"malformed {method} message" in err.details()
    err = _refused(lambda: served.raw_unary_stream("FetchModel", GARBAGE))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    s1, _ = share(np.arange(d, dtype=np.int64) - d // 2, bits)

    def msgs(**kw: Any) -> list[bytes]:
        args = {
            "run_id": RUN,
            "round_number": t,
            "server_role": pb.SERVER_ROLE_H1,
            "ring_bits": bits,
            "submission_id": new_submission_id(),
            "provider_id": "p1",
            "chunk_bytes": 64,
        }
        args.update(kw)
        return [m.SerializeToString() for m in share_messages(s1, **args)]

    good = msgs()
    err = _refused(lambda: served.raw_stream_unary("SubmitShare", [*good[:3], GARBAGE]))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "malformed SubmitShare message 3" in err.details()
    assert "p1" not in state.accepted.get(t, set())  # a refused stream never joins the sum
    err = _refused(lambda: served.raw_stream_unary("SubmitShare", msgs(server_role=2)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "SERVER_ROLE_H2" in err.details() and "SERVER_ROLE_H1" in err.details()
    # The same provider's good share is accepted afterwards.
    receipt = pb.SubmitReceipt.FromString(served.raw_stream_unary("SubmitShare", msgs()))
    assert receipt.num_elements == d and "p1" in state.accepted[t]
    stream = _stub(served).FetchModel(pb.ModelRequest(provider_id="p1"), timeout=TIMEOUT)
    header, params = read_model_stream(stream)
    assert header.num_parameters == d and len(params) == d
    _no_tracebacks(caplog)


def test_a_share_stream_ended_by_grpc_or_the_client_is_logged_as_such(
    aggregator: tuple[Served, ServerState], caplog: pytest.LogCaptureFixture
) -> None:
    """A message above gRPC's size limit, or a client's cancel, ends the request stream the
    servicer reads as if the provider had closed it: the refusal says that it may be either
    (gRPC tells the servicer nothing), not only that the provider stopped sending."""
    caplog.set_level(logging.INFO)
    served, state = aggregator
    refusals: list[dict[str, Any]] = []
    state.audit.add_listener(lambda event, entry: refusals.append(entry))
    d, bits = state.plan.dim, state.plan.ring_bits
    s1, _ = share(np.arange(d, dtype=np.int64), bits)
    header, *chunks = [
        m.SerializeToString()
        for m in share_messages(
            s1, run_id=RUN, round_number=0, server_role=pb.SERVER_ROLE_H1, ring_bits=bits,
            submission_id=new_submission_id(), provider_id="p1", chunk_bytes=64,
        )
    ]  # fmt: skip
    huge = pb.ShareChunk(chunk=pb.VectorChunk(index=0, data=bytes(2 << 20))).SerializeToString()
    unlimited = grpc.insecure_channel(
        f"127.0.0.1:{served.port}", options=[("grpc.max_send_message_length", -1)]
    )
    submit = unlimited.stream_unary("/spgc.v1.Aggregator/SubmitShare")
    try:
        err = _refused(lambda: submit(iter([header, huge]), timeout=TIMEOUT))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        release = threading.Event()

        def stalled() -> Iterator[bytes]:
            yield header
            yield chunks[0]
            release.wait(TIMEOUT)

        call = submit.future(stalled(), timeout=TIMEOUT)
        wait_until(  # its first chunk is in: the refusal counts it
            lambda: (state.intake.values_in_flight("p1") or 0) > 0, "p1's first chunk"
        )
        call.cancel()
        release.set()
        deadline = time.monotonic() + 5
        while len(refusals) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        unlimited.close()
    assert [r["reason"] for r in refusals] == [
        f"stream ended after 0 of 8 chunk(s) (0 of 496 bytes): {ENDED_EARLY}",
        f"stream ended after 1 of 8 chunk(s) (64 of 496 bytes): {ENDED_EARLY}",
    ]
    # One log line: the second refusal of its kind by p1 within 10 s is only counted.
    (line,) = _refusal_lines(caplog)
    assert "sent a message above the size limit" in line
    assert "p1" not in state.accepted.get(0, set())
    _no_tracebacks(caplog)


def test_refusals_naming_far_rounds_share_one_log_line(
    aggregator: tuple[Served, ServerState], caplog: pytest.LogCaptureFixture
) -> None:
    """The round in a refused header is the caller's pick: refusals for rounds far from the
    current one share one repeat key, so a registered provider cannot write a log and an
    audit line per call by naming a new round each time (one line per 10 s, counted)."""
    caplog.set_level(logging.INFO)
    served, state = aggregator
    refusals: list[dict[str, Any]] = []
    state.audit.add_listener(lambda event, entry: refusals.append(entry))
    vec = np.zeros(state.plan.dim, dtype=np.uint64)
    for t in (*range(10**9, 10**9 + 20), 1):  # round 0 is open
        messages = share_messages(
            vec, run_id=RUN, round_number=t, server_role=pb.SERVER_ROLE_H1,
            ring_bits=state.plan.ring_bits, submission_id=new_submission_id(),
            provider_id="p1", chunk_bytes=64,
        )  # fmt: skip
        err = _refused(lambda m=messages: _stub(served).SubmitShare(iter(m), timeout=TIMEOUT))
        assert err.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert len(refusals) == 20 + 1  # every refusal is counted (metrics)
    lines = _refusal_lines(caplog)
    assert len(lines) == 2, lines  # the first far round, and round 1 (near: its own key)
    assert "for round 1000000000:" in lines[0] and "for round 1:" in lines[1]


def test_round_status_carries_a_small_model_when_asked(
    aggregator: tuple[Served, ServerState],
) -> None:
    served, state = aggregator
    stub = _stub(served)
    plain = stub.RoundStatus(pb.RoundStatusRequest(provider_id="p1"), timeout=TIMEOUT)
    assert plain.phase == pb.ROUND_PHASE_COLLECTING and plain.model_parameters == b""
    info = stub.RoundStatus(
        pb.RoundStatusRequest(provider_id="p1", include_model=True), timeout=TIMEOUT
    )
    _, params, sha = state.model(info.model_version)
    assert info.model_sha256 == sha
    assert np.array_equal(read_inline_model(info.model_parameters, len(params), sha), params)
    with pytest.raises(InvalidArgumentError, match="SHA-256"):
        read_inline_model(info.model_parameters, len(params), bytes(32))
    assert inline_model(np.zeros(INLINE_MODEL_BYTES // 8 + 1)) is None  # larger: FetchModel


def test_real_servicer_bounds_without_add_servicer(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The handlers check the bounds themselves too (servers registered the generated way)."""

    class Context:
        def auth_context(self) -> dict:
            return {}

        def time_remaining(self) -> float:
            return 10.0

        def peer(self) -> str:
            return "ipv4:127.0.0.1:1"

        async def abort(self, code: grpc.StatusCode, details: str) -> None:
            raise AssertionError((code, details))

    async def drained(stream: Any) -> list[Any]:
        return [item async for item in stream]

    async def messages(*items: Any) -> Any:
        for item in items:
            yield item

    cfg = ServerConfig(role=1, insecure=True, providers=["p1"], dataset="cancer",
                       max_batch_size=40, rounds=1, min_providers=1,
                       verify_inputs="none")  # fmt: skip
    plan = make_plan(cfg)
    state = ServerState(plan, pb.SERVER_ROLE_H1, ShareIntake(plan.dim, plan.ring_bits, tmp_path))
    state.run_id, state.config = RUN, plan.training_config(RUN)
    servicer = AggregatorServicer(state, "h1", insecure=True)
    try:
        status = pb.RoundStatusRequest(wait_seconds=INF, provider_id="p1")
        with pytest.raises(AssertionError, match=r"RoundStatusRequest\.wait_seconds=inf"):
            asyncio.run(servicer.RoundStatus(status, Context()))
        ledger = pb.LedgerRequest(from_line=2**64 - 1, provider_id="p1")
        with pytest.raises(AssertionError, match=r"LedgerRequest\.from_line="):
            asyncio.run(servicer.FetchLedger(ledger, Context()))
        model = pb.ModelRequest(version=2**63, provider_id="p1")
        with pytest.raises(AssertionError, match=r"ModelRequest\.version="):
            asyncio.run(drained(servicer.FetchModel(model, Context())))
        header = pb.ShareHeader(round=2**63, ring_bits=plan.ring_bits, num_elements=plan.dim)
        with pytest.raises(AssertionError, match=r"ShareHeader\.round="):
            stream = messages(pb.ShareChunk(header=header))
            asyncio.run(servicer.SubmitShare(stream, Context()))
        # A wrong run is FAILED_PRECONDITION (the contract), for every call that names one.
        wrong = grpc.StatusCode.FAILED_PRECONDITION, "run 'nope' is not this server's run"
        other_run = pb.LedgerRequest(run_id="nope", provider_id="p1")
        with pytest.raises(AssertionError) as info:
            asyncio.run(servicer.FetchLedger(other_run, Context()))
        assert info.value.args[0] == wrong
        decline = pb.DeclineRequest(run_id="nope", reason="x", provider_id="p1")
        with pytest.raises(AssertionError) as info:
            asyncio.run(servicer.DeclinePlan(decline, Context()))
        assert info.value.args[0] == wrong
        # What a provider writes reaches the log as one line, terminal escapes escaped.
        hostile = pb.DeclineRequest(run_id=RUN, reason="a\n\x1b[31mFAKE\r" * 300, provider_id="p1")
        with caplog.at_level(logging.WARNING):
            asyncio.run(servicer.DeclinePlan(hostile, Context()))
        line = caplog.records[-1].getMessage()
        assert "\x1b" not in line and "\r" not in line and "\n" not in line
        assert "a \\x1b[31mFAKE" in line and line.endswith("...")
    finally:
        state.close()
        servicer.close()


# ----------------------------------------------------------------------------- protocol version


def test_check_protocol_version() -> None:
    check_protocol_version(1, 1)
    with pytest.raises(FailedPreconditionError, match=r"speaks protocol version 2.*version 1"):
        check_protocol_version(2, 1)
    with pytest.raises(FailedPreconditionError, match=r"peer sent no protocol_version.*1"):
        check_protocol_version(0, 1, "peer")


# ----------------------------------------------------------------------------- provider side


def _config(**changes: Any) -> Any:
    fields: dict[str, Any] = {
        "run_id": RUN,
        "mode": pb.MODE_SPGC,
        "num_parameters": 62,
        "ring_bits": 48,
        "scale": 2.0**16,
        "clip_norm": 1.0,
        "l2_bound_units": 2.0**16,
        "rounding": pb.ROUNDING_CONDITIONAL_STOCHASTIC,
        "sampling": pb.BATCH_SAMPLING_POISSON,
        "sampling_rate": 0.1,
        "noise_multiplier": 1.0,
        "noise_std_units": 2.0**16,
        "step_epsilon": 4.0,
        "step_delta": 1e-5,
        "target_epsilon": 8.0,
        "target_delta": 1e-5,
        "min_providers": 1,
        "sharing_rule": pb.SHARING_RULE_DIFFERENCE_MOD_2L,
    }
    fields.update(changes)
    return pb.TrainingConfig(**fields)


def test_provider_accepts_the_difference_rule() -> None:
    check_wire_contract(_config())
    check_wire_contract(_config(sharing_rule=pb.SHARING_RULE_UNSPECIFIED))  # pre-field servers
    check_wire_contract(_config(ring_bits=2))
    check_wire_contract(_config(ring_bits=64))
    # No-noise modes announce an infinite per-step epsilon.
    check_wire_contract(_config(noise_multiplier=0, noise_std_units=0, step_epsilon=INF))


@pytest.mark.parametrize(
    ("changes", "words"),
    [
        ({"sharing_rule": 7}, "TrainingConfig.sharing_rule=7 (unknown)"),
        ({"ring_bits": 65}, "TrainingConfig.ring_bits=65"),
        ({"ring_bits": 1}, "TrainingConfig.ring_bits=1"),
        ({"ring_bits": 0}, "TrainingConfig.ring_bits=0"),
        ({"num_parameters": 0}, "TrainingConfig.num_parameters=0"),
        ({"num_parameters": 2**31}, "TrainingConfig.num_parameters=2147483648"),
        ({"scale": NAN}, "TrainingConfig.scale=nan"),
        ({"scale": 0.0}, "TrainingConfig.scale=0.0"),
        ({"clip_norm": INF}, "TrainingConfig.clip_norm=inf"),
        ({"l2_bound_units": -1.0}, "TrainingConfig.l2_bound_units=-1.0"),
        ({"sampling_rate": 1.5}, "TrainingConfig.sampling_rate=1.5"),
        ({"noise_multiplier": NAN}, "TrainingConfig.noise_multiplier=nan"),
        ({"noise_std_units": INF}, "TrainingConfig.noise_std_units=inf"),
        ({"step_epsilon": -1.0}, "TrainingConfig.step_epsilon=-1.0"),
        ({"step_delta": 1.0}, "TrainingConfig.step_delta=1.0"),
        ({"target_epsilon": NAN}, "TrainingConfig.target_epsilon=nan"),
        ({"target_delta": -0.5}, "TrainingConfig.target_delta=-0.5"),
        ({"max_rounds": 2**64 - 1}, "TrainingConfig.max_rounds="),
        ({"min_providers": 0}, "TrainingConfig.min_providers=0"),
    ],
)
def test_provider_refuses_configs_outside_the_contract(changes: dict, words: str) -> None:
    with pytest.raises(ProviderRefusal) as e:
        check_wire_contract(_config(**changes))
    assert words in str(e.value), str(e.value)


def test_sharing_rule_is_the_libraries_rule() -> None:
    """G = s1 - s2 mod 2^L, s1 to H1: what spgc.protocol.sharing.share produces."""
    g = np.array([-5, 0, 7, -(2**46)], dtype=np.int64)
    s1, s2 = share(g, 48)
    mask = np.uint64((1 << 48) - 1)
    assert np.array_equal((s1 - s2) & mask, g.view(np.uint64) & mask)
    assert np.array_equal(reconstruct(s1, s2, 48), g)


@pytest.fixture(scope="module")
def provider_pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("contract-pki")
    make_dev_pki(base, ["h1", "h2", "p1"])
    return base


def _connect(pki: Path, config: Any, aggregator_class: Any = None) -> str:
    """connect() of a provider to two fake servers announcing ``config``; its refusal."""
    from test_provider_client import MODEL, FakeAggregator, FakeServer, provider_config

    cls = aggregator_class or FakeAggregator
    h1 = FakeServer(pki, cls(pb.SERVER_ROLE_H1, "h1", config, MODEL))
    h2 = FakeServer(pki, cls(pb.SERVER_ROLE_H2, "h2", config, MODEL))
    try:
        from spgc.providers.client import ProviderClient

        client = ProviderClient(provider_config(pki, [h1, h2]))
        with client, pytest.raises(ProviderRefusal) as e:
            client.connect()
        return str(e.value)
    finally:
        h1.stop()
        h2.stop()


def test_provider_client_refuses_an_unknown_sharing_rule(provider_pki: Path) -> None:
    from test_provider_client import training_config

    message = _connect(provider_pki, training_config(sharing_rule=7))
    assert "sharing_rule=7" in message and "SHARING_RULE_DIFFERENCE_MOD_2L" in message
    message = _connect(provider_pki, training_config(sharing_rule=pb.SHARING_RULE_SUM_MOD_P))
    assert "field shares announced without verified inputs" in message
    message = _connect(provider_pki, training_config(ring_bits=65))
    assert "TrainingConfig.ring_bits=65" in message


def test_provider_client_refuses_an_out_of_bounds_round(provider_pki: Path) -> None:
    from test_provider_client import FakeAggregator, training_config

    class Broken(FakeAggregator):
        def _round_info(self, who: str) -> Any:
            info = super()._round_info(who)
            info.epsilon_spent = NAN
            return info

    message = _connect(provider_pki, training_config(), Broken)
    assert "h1 sent a ServerInfo.round out of the protocol's bounds" in message
    assert "ServerInfo.round.epsilon_spent=nan" in message


def test_bounds_of_answers_the_provider_reads() -> None:
    for message, words in [
        (pb.WireLimits(max_chunk_bytes=2 << 20), "WireLimits.max_chunk_bytes=2097152"),
        (pb.WireLimits(preferred_chunk_bytes=(1 << 20) + 8), "preferred_chunk_bytes"),
        (pb.RoundInfo(round=2**63), "RoundInfo.round=9223372036854775808"),
        (pb.RoundInfo(model_version=2**64 - 1), "RoundInfo.model_version="),
        (pb.RoundInfo(epsilon_spent=-1.0), "RoundInfo.epsilon_spent=-1.0"),
        (pb.RoundInfo(deadline=timestamp_pb2.Timestamp(seconds=-1)), "deadline.seconds=-1"),
        (pb.RoundInfo(deadline=timestamp_pb2.Timestamp(nanos=-5)), "deadline.nanos=-5"),
        (pb.LedgerReply(total_lines=2**63), "LedgerReply.total_lines="),
        (pb.ModelHeader(version=2**63, num_parameters=1, chunk_bytes=8), "ModelHeader.version"),
        (pb.ModelHeader(num_parameters=0, chunk_bytes=8), "ModelHeader.num_parameters=0"),
        (pb.ModelHeader(num_parameters=1, chunk_bytes=0), "ModelHeader.chunk_bytes=0"),
    ]:
        with pytest.raises(InvalidArgumentError) as e:
            check_bounds(message)
        assert words in e.value.message, e.value.message
    check_bounds(pb.RoundInfo(epsilon_spent=INF))  # a noise-free step was released
    check_bounds(pb.WireLimits())  # 0: unset


def test_model_stream_header_is_bounded_before_use() -> None:
    header = pb.ModelHeader(
        version=2**64 - 1, num_parameters=1, chunk_bytes=8, chunk_count=1, sha256=b"\0" * 32
    )
    with pytest.raises(InvalidArgumentError, match=r"ModelHeader\.version=18446744073709551615"):
        read_model_stream(iter([pb.ModelChunk(header=header)]))
    header = pb.ModelHeader(num_parameters=2**40, chunk_bytes=8, sha256=b"\0" * 32)
    with pytest.raises(ResourceExhaustedError, match=r"ModelHeader\.num_parameters"):
        read_model_stream(iter([pb.ModelChunk(header=header)]))


def test_share_header_is_bounded_before_use() -> None:
    base = {"run_id": RUN, "num_elements": 1, "ring_bits": 8, "chunk_bytes": 8, "chunk_count": 1,
            "submission_id": b"x", "sha256": b"\0" * 32}  # fmt: skip
    for changes, error, words in [
        ({"round": 2**63}, InvalidArgumentError, "ShareHeader.round="),
        ({"ring_bits": 1}, InvalidArgumentError, "ShareHeader.ring_bits=1"),
        ({"ring_bits": 65}, InvalidArgumentError, "ShareHeader.ring_bits=65"),
        ({"num_elements": 2**31}, ResourceExhaustedError, "ShareHeader.num_elements="),
        ({"chunk_bytes": 4 << 20}, ResourceExhaustedError, "ShareHeader.chunk_bytes="),
    ]:
        header = pb.ShareHeader(**{**base, **changes})
        with pytest.raises(error, match=re.escape(words)):
            read_share_header(iter([pb.ShareChunk(header=header)]))
    with pytest.raises(ValueError, match=r"ring_bits=1 is not in 2\.\.64"):
        next(share_messages(np.zeros(1, np.uint64), run_id=RUN, round_number=0, server_role=1,
                            ring_bits=1, submission_id=b"x"))  # fmt: skip


# ----------------------------------------------------------------------------- the table itself


def _all_messages() -> list[Any]:
    out: list[Any] = []

    def walk(descriptors: Any) -> None:
        for d in descriptors:
            out.append(d)
            walk(d.nested_types)

    for module in (aggregation_pb2, peer_pb2):
        walk(module.DESCRIPTOR.message_types_by_name.values())
    out.append(timestamp_pb2.Timestamp.DESCRIPTOR)
    return out


def test_every_numeric_field_has_a_declared_bound() -> None:
    fields = {f.full_name for d in _all_messages() for f in numeric_fields(d)}
    missing = sorted(fields - FIELD_BOUNDS.keys())
    stale = sorted(FIELD_BOUNDS.keys() - fields)
    assert not missing, f"numeric fields without a bound in spgc.wire.bounds: {missing}"
    assert not stale, f"bounds of fields that do not exist: {stale}"


_BOUND_WORDS = re.compile(
    r"at most|at least|\d\.\.|<=|>=|< 1|> 0|finite|exactly|must equal|the one asked|"
    r"TrainingConfig\.\w+ \(|nanos in|echo|any value|informational|ignore|compares|refuses",
    re.IGNORECASE,
)


def test_every_numeric_field_states_its_bound_in_the_proto(tmp_path: Path) -> None:
    """The .proto comment of each numeric field says its bound (or who checks it)."""
    fds = proto_descriptors_with_comments(tmp_path)
    unstated: list[str] = []
    numeric = {
        descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE,
        descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
        descriptor_pb2.FieldDescriptorProto.TYPE_UINT32,
        descriptor_pb2.FieldDescriptorProto.TYPE_UINT64,
        descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
        descriptor_pb2.FieldDescriptorProto.TYPE_INT64,
    }
    for f in fds.file:
        comments = {
            tuple(loc.path): loc.leading_comments + loc.trailing_comments
            for loc in f.source_code_info.location
        }

        def walk(
            messages: Any, prefix: tuple[int, ...], scope: str, comments: dict = comments
        ) -> None:
            for i, m in enumerate(messages):
                for j, fld in enumerate(m.field):
                    if fld.type not in numeric:
                        continue
                    text = " ".join(comments.get((*prefix, i, 2, j), "").split())
                    if not _BOUND_WORDS.search(text):
                        unstated.append(f"{scope}{m.name}.{fld.name}: {text!r}")
                walk(m.nested_type, (*prefix, i, 3), f"{scope}{m.name}.")

        if f.package == "spgc.v1":
            walk(f.message_type, (4,), f"{f.package}.")
    assert not unstated, "numeric fields whose comment states no bound:\n" + "\n".join(unstated)

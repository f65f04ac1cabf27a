"""spgc.wire: mutual TLS, identities, plaintext refusal, chunked vectors over gRPC."""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from spgc.protocol.certs import make_dev_pki
from spgc.wire import AGGREGATOR_SERVICE, aggregation_pb2, aggregation_pb2_grpc, vector_sha256
from spgc.wire.chunks import (
    MAX_CHUNK_BYTES,
    ChunkReassembler,
    ChunkValidator,
    iter_vector_chunks,
    pack_elements,
    packed_width,
)
from spgc.wire.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    ResourceExhaustedError,
    WireError,
    abort_on_error,
    status_code_of,
)
from spgc.wire.identity import caller_identity, new_submission_id, peer_identity
from spgc.wire.messages import (
    ACCEPTED_SHARE_ENCODINGS,
    iter_share_payload,
    model_messages,
    read_model_stream,
    read_share_header,
    read_share_stream,
    share_encoding_for,
    share_messages,
)
from spgc.wire.tls import TlsFiles
from spgc.wire.transport import (
    DEFAULT_MAX_MESSAGE_BYTES,
    LoopThread,
    add_health,
    make_channel,
    make_server,
)

RUN = "run-test"
ROUND = 5
D = 2_000_000
RING = 40
TIMEOUT = 20


# ----------------------------------------------------------------------------- toy server


class ToyAggregator(aggregation_pb2_grpc.AggregatorServicer):
    """Just enough of an Aggregator to exercise the helpers: one open round, no real sum."""

    def __init__(self, insecure: bool, dim: int = D) -> None:
        self.insecure = insecure
        self.dim = dim
        self.lock = threading.Lock()
        self.shares: dict[tuple[str, int], np.ndarray] = {}
        self.model = np.linspace(-1.0, 1.0, 300_001)

    @abort_on_error
    def Hello(self, request: Any, context: grpc.ServicerContext) -> Any:
        who = caller_identity(context, request.provider_id, insecure=self.insecure)
        return aggregation_pb2.ServerInfo(
            protocol_version=1,
            role=aggregation_pb2.SERVER_ROLE_H1,
            provider_id=who,
            config=aggregation_pb2.TrainingConfig(
                run_id=RUN, num_parameters=self.dim, ring_bits=RING
            ),
            round=aggregation_pb2.RoundInfo(round=ROUND, model_version=ROUND),
        )

    @abort_on_error
    def FetchModel(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        if request.HasField("version") and request.version != ROUND:
            raise FailedPreconditionError(f"version {request.version} is not served")
        yield from model_messages(self.model, run_id=RUN, version=ROUND, chunk_bytes=1 << 16)

    @abort_on_error
    def SubmitShare(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:
        header = read_share_header(request_iterator, num_elements=self.dim, ring_bits=RING)
        who = caller_identity(context, header.provider_id, insecure=self.insecure)
        if header.run_id != RUN:
            raise FailedPreconditionError(f"share for run {header.run_id!r}, this is {RUN!r}")
        if header.round != ROUND:
            raise FailedPreconditionError(
                f"round {header.round} is not open; the current round is {ROUND}"
            )
        with self.lock:
            if (who, header.round) in self.shares:
                raise AlreadyExistsError(f"{who!r} already sent a share for round {ROUND}")
        vec = np.empty(header.num_elements, dtype=np.uint64)
        pos = 0
        for data in iter_share_payload(request_iterator, header):
            part = np.frombuffer(data, dtype="<u8")
            vec[pos : pos + len(part)] = part
            pos += len(part)
        with self.lock:
            self.shares[(who, header.round)] = vec
        return aggregation_pb2.SubmitReceipt(
            run_id=RUN,
            round=header.round,
            submission_id=header.submission_id,
            provider_id=who,
            num_elements=header.num_elements,
            sha256=header.sha256,  # as the servers do: the payload was checked against it
        )


class Served:
    """A started toy server; ``stub(name)`` makes a client with that party's certificate."""

    def __init__(self, pki: Path, insecure: bool = False, dim: int = D, cert: str = "h1") -> None:
        self.pki = pki
        self.servicer = ToyAggregator(insecure, dim)
        tls = None if insecure else TlsFiles.from_dir(pki, cert)
        adder = functools.partial(
            aggregation_pb2_grpc.add_AggregatorServicer_to_server, self.servicer
        )
        self.server, self.port = make_server("127.0.0.1:0", [adder], tls, insecure=insecure)
        self.health = add_health(self.server, [AGGREGATOR_SERVICE])
        self.server.start()
        self.channels: list[grpc.Channel] = []

    def channel(self, tls: TlsFiles | None, **kw: Any) -> grpc.Channel:
        ch = make_channel(f"127.0.0.1:{self.port}", tls, insecure=tls is None, **kw)
        self.channels.append(ch)
        return ch

    def stub(self, name: str | None = "p1", pki: Path | None = None, **kw: Any) -> Any:
        tls = None if name is None else TlsFiles.from_dir(pki or self.pki, name)
        return aggregation_pb2_grpc.AggregatorStub(self.channel(tls, **kw))

    def close(self) -> None:
        for ch in self.channels:
            ch.close()
        self.server.stop(None).wait()


@pytest.fixture(scope="module")
def pkis(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("grpc-pki")
    make_dev_pki(base / "good", ["h1"], providers=["p1", "p2"])
    make_dev_pki(base / "other", ["h1", "p1"])  # same names, another CA
    return base / "good", base / "other"


@pytest.fixture(scope="module")
def served(pkis: tuple[Path, Path]) -> Iterator[Served]:
    s = Served(pkis[0])
    yield s
    s.close()


def _code(excinfo: pytest.ExceptionInfo) -> grpc.StatusCode:
    return excinfo.value.code()


def _share(n: int = D, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)  # test data only; shares in the product use a CSPRNG
    return rng.integers(0, 1 << RING, size=n, dtype=np.uint64)


def _submit(stub: Any, vec: np.ndarray, **kw: Any) -> Any:
    args: dict[str, Any] = {
        "run_id": RUN,
        "round_number": ROUND,
        "server_role": aggregation_pb2.SERVER_ROLE_H1,
        "ring_bits": RING,
        "submission_id": new_submission_id(),
    }
    args.update(kw)
    return stub.SubmitShare(share_messages(vec, **args), timeout=TIMEOUT)


def _raw_stream(header: Any, chunks: list[tuple[int, bytes]]) -> Iterator[Any]:
    if header is not None:
        yield aggregation_pb2.ShareChunk(header=header)
    for index, data in chunks:
        yield aggregation_pb2.ShareChunk(chunk=aggregation_pb2.VectorChunk(index=index, data=data))


def _header(vec: np.ndarray, chunk_bytes: int = MAX_CHUNK_BYTES, **kw: Any) -> Any:
    fields: dict[str, Any] = {
        "run_id": RUN,
        "round": ROUND,
        "server_role": aggregation_pb2.SERVER_ROLE_H1,
        "num_elements": len(vec),
        "ring_bits": RING,
        "chunk_bytes": chunk_bytes,
        "chunk_count": -(-vec.nbytes // chunk_bytes),
        "submission_id": new_submission_id(),
        "sha256": vector_sha256(vec),
    }
    fields.update(kw)
    return aggregation_pb2.ShareHeader(**fields)


# ----------------------------------------------------------------------------- TLS and identity


def test_peer_identity_is_the_client_certificate(served: Served) -> None:
    assert (
        served.stub("p1").Hello(aggregation_pb2.HelloRequest(), timeout=TIMEOUT).provider_id == "p1"
    )
    assert (
        served.stub("p2").Hello(aggregation_pb2.HelloRequest(), timeout=TIMEOUT).provider_id == "p2"
    )


def test_payload_cannot_claim_another_identity(served: Served) -> None:
    stub = served.stub("p1")
    with pytest.raises(grpc.RpcError) as e:
        stub.Hello(aggregation_pb2.HelloRequest(provider_id="p2"), timeout=TIMEOUT)
    assert _code(e) == grpc.StatusCode.PERMISSION_DENIED
    assert "'p2'" in e.value.details() and "'p1'" in e.value.details()


def test_certificate_from_another_ca_is_refused(served: Served, pkis: tuple[Path, Path]) -> None:
    stub = served.stub("p1", pki=pkis[1])  # same name "p1", foreign CA
    with pytest.raises(grpc.RpcError) as e:
        stub.Hello(aggregation_pb2.HelloRequest(), timeout=TIMEOUT)
    assert _code(e) == grpc.StatusCode.UNAVAILABLE


def test_client_without_certificate_is_refused(served: Served, pkis: tuple[Path, Path]) -> None:
    ca = (pkis[0] / "ca.pem").read_bytes()
    ch = grpc.secure_channel(f"127.0.0.1:{served.port}", grpc.ssl_channel_credentials(ca))
    served.channels.append(ch)
    with pytest.raises(grpc.RpcError) as e:
        aggregation_pb2_grpc.AggregatorStub(ch).Hello(
            aggregation_pb2.HelloRequest(), timeout=TIMEOUT
        )
    assert _code(e) == grpc.StatusCode.UNAVAILABLE


def test_server_name_is_verified(served: Served) -> None:
    ok = served.stub("p1", server_name="h1")
    assert ok.Hello(aggregation_pb2.HelloRequest(), timeout=TIMEOUT).provider_id == "p1"
    wrong = served.stub("p1", server_name="h2")  # the server holds h1's certificate
    with pytest.raises(grpc.RpcError) as e:
        wrong.Hello(aggregation_pb2.HelloRequest(), timeout=TIMEOUT)
    assert _code(e) == grpc.StatusCode.UNAVAILABLE


def test_provider_certificate_cannot_serve(pkis: tuple[Path, Path]) -> None:
    """A provider's development certificate authenticates clients only: a server holding it
    (a provider posing as a server at an address its certificate names) is refused."""
    posing = Served(pkis[0], cert="p2")
    try:
        with pytest.raises(grpc.RpcError) as e:
            posing.stub("p1").Hello(aggregation_pb2.HelloRequest(), timeout=TIMEOUT)
        assert _code(e) == grpc.StatusCode.UNAVAILABLE
    finally:
        posing.close()


def test_plaintext_client_cannot_talk_to_tls_server(served: Served) -> None:
    with pytest.raises(grpc.RpcError) as e:
        served.stub(None).Hello(aggregation_pb2.HelloRequest(provider_id="p1"), timeout=TIMEOUT)
    assert _code(e) == grpc.StatusCode.UNAVAILABLE


def test_plaintext_refused_without_insecure(pkis: tuple[Path, Path]) -> None:
    with pytest.raises(ValueError, match="insecure=True"):
        make_server("127.0.0.1:0", [], None)
    with pytest.raises(ValueError, match="insecure=True"):
        make_channel("127.0.0.1:1", None)
    tls = TlsFiles.from_dir(pkis[0], "h1")
    with pytest.raises(ValueError, match="both"):
        make_server("127.0.0.1:0", [], tls, insecure=True)
    with pytest.raises(FileNotFoundError, match="nobody"):
        make_server("127.0.0.1:0", [], TlsFiles.from_dir(pkis[0], "nobody"))


def test_insecure_is_explicit_and_takes_the_claimed_identity(pkis: tuple[Path, Path]) -> None:
    s = Served(pkis[0], insecure=True, dim=1000)
    try:
        stub = s.stub(None)
        info = stub.Hello(aggregation_pb2.HelloRequest(provider_id="p7"), timeout=TIMEOUT)
        assert info.provider_id == "p7"
        with pytest.raises(grpc.RpcError) as e:
            stub.Hello(aggregation_pb2.HelloRequest(), timeout=TIMEOUT)
        assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
        receipt = _submit(stub, _share(1000), provider_id="p7")
        assert receipt.provider_id == "p7"
    finally:
        s.close()


def test_health(served: Served) -> None:
    stub = health_pb2_grpc.HealthStub(served.channel(TlsFiles.from_dir(served.pki, "p1")))
    for name in ("", AGGREGATOR_SERVICE):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=TIMEOUT)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


class _FakeContext:
    def __init__(self, auth: dict[str, list[bytes]]) -> None:
        self._auth = auth
        self.aborted: tuple[grpc.StatusCode, str] | None = None

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise RuntimeError("aborted")


def _fake(auth: dict[str, list[bytes]]) -> Any:
    return _FakeContext(auth)


def test_peer_identity_rules() -> None:
    ssl = {"transport_security_type": [b"ssl"]}
    ctx: Any = _FakeContext({**ssl, "x509_common_name": [b"p3"]})
    assert peer_identity(ctx) == "p3"
    san = [b"localhost", b"127.0.0.1", b"p4"]
    ctx = _FakeContext({**ssl, "x509_subject_alternative_name": san})
    assert peer_identity(ctx) == "p4"  # no CN: the one SAN DNS name besides localhost
    ctx = _FakeContext({**ssl, "x509_subject_alternative_name": [b"a", b"b"]})
    assert peer_identity(ctx) is None  # ambiguous
    ctx = _FakeContext({"transport_security_type": [b"insecure"], "x509_common_name": [b"p3"]})
    assert peer_identity(ctx) is None
    with pytest.raises(WireError) as e:
        caller_identity(_fake({}), "", insecure=False)
    assert e.value.code == grpc.StatusCode.UNAUTHENTICATED
    with pytest.raises(WireError) as e:
        caller_identity(_fake({**ssl, "x509_common_name": [b"p9"]}), insecure=False, allowed={"p1"})
    assert e.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_abort_on_error_maps_foreign_refusals() -> None:
    class Refused(Exception):  # like servers.intake.SubmissionRejected: code is a status name
        def __init__(self) -> None:
            super().__init__("nope")
            self.code = "ALREADY_EXISTS"
            self.message = "already sent"

    class Servicer:
        @abort_on_error
        def unary(self, request: Any, context: Any) -> Any:
            raise Refused()

        @abort_on_error
        def streaming(self, request: Any, context: Any) -> Iterator[int]:
            yield 1
            raise ResourceExhaustedError("too big")

        @abort_on_error
        def bug(self, request: Any, context: Any) -> Any:
            raise KeyError("bug")

    ctx = _FakeContext({})
    with pytest.raises(RuntimeError, match="aborted"):
        Servicer().unary(None, ctx)
    assert ctx.aborted == (grpc.StatusCode.ALREADY_EXISTS, "already sent")
    ctx = _FakeContext({})
    with pytest.raises(RuntimeError, match="aborted"):
        list(Servicer().streaming(None, ctx))
    assert ctx.aborted == (grpc.StatusCode.RESOURCE_EXHAUSTED, "too big")
    with pytest.raises(KeyError):
        Servicer().bug(None, _FakeContext({}))
    assert status_code_of(KeyError()) is None


# ----------------------------------------------------------------------------- shares over gRPC


def test_share_of_2m_elements_over_mutual_tls(served: Served) -> None:
    vec = _share()
    receipt = _submit(served.stub("p1"), vec, round_number=ROUND)
    assert receipt.provider_id == "p1" and receipt.num_elements == D
    assert receipt.sha256 == vector_sha256(vec)
    np.testing.assert_array_equal(served.servicer.shares[("p1", ROUND)], vec)
    with pytest.raises(grpc.RpcError) as e:  # second share for the round
        _submit(served.stub("p1"), vec)
    assert _code(e) == grpc.StatusCode.ALREADY_EXISTS


def test_share_of_10m_elements_over_grpc(pkis: tuple[Path, Path]) -> None:
    """A 10M-parameter share (80 MB) over loopback mutual TLS; prints the throughput."""
    n = 10_000_000
    s = Served(pkis[0], dim=n)
    try:
        vec = np.arange(n, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15) >> np.uint64(64 - RING)
        stub = s.stub("p1")
        t0 = time.perf_counter()
        receipt = _submit(stub, vec)
        elapsed = time.perf_counter() - t0
        assert receipt.sha256 == vector_sha256(vec)
        np.testing.assert_array_equal(s.servicer.shares[("p1", ROUND)], vec)
        rate = vec.nbytes / elapsed / 1e6
        print(f"10M-element share over gRPC+TLS: {elapsed:.2f} s, {rate:.0f} MB/s")
    finally:
        s.close()


@pytest.mark.parametrize(
    ("kw", "code", "words"),
    [
        ({"round_number": ROUND - 1}, grpc.StatusCode.FAILED_PRECONDITION, "round 4 is not open"),
        ({"round_number": ROUND + 1}, grpc.StatusCode.FAILED_PRECONDITION, "round 6"),
        ({"run_id": "old-run"}, grpc.StatusCode.FAILED_PRECONDITION, "old-run"),
        ({"ring_bits": RING + 1}, grpc.StatusCode.INVALID_ARGUMENT, "Z_2^41"),
    ],
)
def test_share_header_refusals(served: Served, kw: dict, code: grpc.StatusCode, words: str) -> None:
    with pytest.raises(grpc.RpcError) as e:
        _submit(served.stub("p2"), _share(), **kw)
    assert _code(e) == code
    assert words in e.value.details()


def test_share_of_wrong_length_refused(served: Served) -> None:
    with pytest.raises(grpc.RpcError) as e:
        _submit(served.stub("p2"), _share(D - 1))
    assert _code(e) == grpc.StatusCode.INVALID_ARGUMENT
    assert "1,999,999 values" in e.value.details()


def _send_raw(served: Served, messages: Iterator[Any], **kw: Any) -> grpc.RpcError:
    stub = served.stub("p2", **kw)
    with pytest.raises(grpc.RpcError) as e:
        stub.SubmitShare(messages, timeout=TIMEOUT)
    return e.value


def test_malformed_share_streams_refused(served: Served) -> None:
    vec = _share()
    chunks = list(enumerate(iter_vector_chunks(vec, MAX_CHUNK_BYTES)))
    h = _header(vec)
    cases = [
        (_raw_stream(None, chunks), "first message"),
        (_raw_stream(h, [chunks[1], chunks[0], *chunks[2:]]), "out of order"),
        (_raw_stream(h, chunks[:-1]), "ended after"),
        (_raw_stream(h, [*chunks, (len(chunks), b"\0" * 8)]), "extra chunk"),
        (_raw_stream(h, [(0, chunks[0][1][:-8]), *chunks[1:]]), "expected 1,048,576"),
        (_raw_stream(_header(vec, sha256=b"\1" * 32), chunks), "SHA-256"),
        (_raw_stream(_header(vec, chunk_count=3), chunks), "chunk_count=3"),
        (_raw_stream(_header(vec, submission_id=b""), chunks), "submission_id"),
    ]
    for messages, words in cases:
        err = _send_raw(served, messages)
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT, words
        assert words in err.details(), (words, err.details())
    assert ("p2", ROUND) not in served.servicer.shares


def test_oversized_messages_refused(served: Served) -> None:
    vec = _share()
    # A header announcing 2 MiB chunks: refused before any payload is read.
    err = _send_raw(served, _raw_stream(_header(vec, chunk_bytes=2 * MAX_CHUNK_BYTES), []))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "chunk_bytes" in err.details()
    # A message above the gRPC limit: gRPC itself refuses it.
    big = vec[: 2 * MAX_CHUNK_BYTES // 8].tobytes()
    msgs = _raw_stream(_header(vec), [(0, big)])
    err = _send_raw(served, msgs, max_message_bytes=4 * DEFAULT_MAX_MESSAGE_BYTES)
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


def test_fetch_model(served: Served) -> None:
    stub = served.stub("p1")
    header, params = read_model_stream(
        stub.FetchModel(aggregation_pb2.ModelRequest(), timeout=TIMEOUT), version=ROUND
    )
    np.testing.assert_array_equal(params, served.servicer.model)
    assert header.sha256 == hashlib.sha256(served.servicer.model.astype("<f8").tobytes()).digest()
    assert header.chunk_count == -(-served.servicer.model.nbytes // (1 << 16))
    with pytest.raises(grpc.RpcError) as e:
        list(stub.FetchModel(aggregation_pb2.ModelRequest(version=2), timeout=TIMEOUT))
    assert _code(e) == grpc.StatusCode.FAILED_PRECONDITION


# ----------------------------------------------------------------------------- chunk helpers


def _reassemble(vec: np.ndarray, chunk_bytes: int, **kw: Any) -> np.ndarray:
    r = ChunkReassembler(len(vec), chunk_bytes, dtype=vec.dtype, **kw)
    for i, data in enumerate(iter_vector_chunks(vec, chunk_bytes)):
        r.add(i, data)
    return r.finish()


def test_chunk_round_trip_10m() -> None:
    vec = np.arange(10_000_000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    t0 = time.perf_counter()
    out = _reassemble(vec, MAX_CHUNK_BYTES, sha256=vector_sha256(vec))
    elapsed = time.perf_counter() - t0
    np.testing.assert_array_equal(out, vec)
    assert out.dtype == np.uint64
    print(f"10M uint64 chunk+reassemble: {elapsed:.2f} s ({vec.nbytes / elapsed / 1e6:.0f} MB/s)")


def test_float_round_trip_and_odd_sizes() -> None:
    vec = np.linspace(0, 1, 1001)
    np.testing.assert_array_equal(_reassemble(vec, 64), vec)
    np.testing.assert_array_equal(_reassemble(vec[:1], 8), vec[:1])
    big_endian = vec.astype(">f8")
    assert vector_sha256(big_endian) == vector_sha256(vec)
    assert [len(c) for c in iter_vector_chunks(vec, 4000)] == [4000, 4000, 8]


def test_reassembler_rejections() -> None:
    vec = np.arange(100, dtype=np.uint64)
    chunks = list(iter_vector_chunks(vec, 256))  # 4 chunks: 256, 256, 256, 32 bytes
    r = ChunkReassembler(100, 256)
    with pytest.raises(InvalidArgumentError, match="out of order"):
        r.add(1, chunks[1])
    with pytest.raises(InvalidArgumentError, match="has 248 bytes; expected 256"):
        r.add(0, chunks[0][:-8])
    r = ChunkReassembler(100, 256)
    for i in range(3):
        r.add(i, chunks[i])
    with pytest.raises(InvalidArgumentError, match="has 40 bytes; expected 32"):
        r.add(3, chunks[3] + bytes(8))
    with pytest.raises(InvalidArgumentError, match="extra chunk 4"):
        r.add(4, chunks[3])
    with pytest.raises(InvalidArgumentError, match="after 3 of 4"):
        r.finish()
    r.add(3, chunks[3])
    np.testing.assert_array_equal(r.finish(), vec)
    with pytest.raises(InvalidArgumentError, match="after the end"):
        r.add(4, chunks[3])


def test_validator_limits_and_layout() -> None:
    with pytest.raises(ResourceExhaustedError, match="exceeds the limit"):
        ChunkValidator(10, 2 * MAX_CHUNK_BYTES)
    with pytest.raises(ResourceExhaustedError, match="vector of"):
        ChunkValidator(10**9, MAX_CHUNK_BYTES, max_total_bytes=80_000_000)
    with pytest.raises(InvalidArgumentError, match="multiple of 8"):
        ChunkValidator(10, 12)
    with pytest.raises(InvalidArgumentError, match="at least 1"):
        ChunkValidator(0, 8)
    with pytest.raises(InvalidArgumentError, match="chunk_count=2"):
        ChunkValidator(100, 256, 2)
    v = ChunkValidator(4, 8, max_chunk_bytes=16)
    with pytest.raises(ResourceExhaustedError, match="exceeds the limit"):
        v.check(0, bytes(32))
    v = ChunkValidator(4, 32, ring_bits=8)
    with pytest.raises(InvalidArgumentError, match="element 2 = 256 is outside Z_2\\^8"):
        v.check(0, np.array([1, 255, 256, 0], dtype="<u8").tobytes())
    v = ChunkValidator(1, 8, sha256=b"\0" * 32)
    v.check(0, bytes(8))
    with pytest.raises(InvalidArgumentError, match="SHA-256"):
        v.finish()
    with pytest.raises(ValueError, match="chunk_bytes"):
        list(iter_vector_chunks(np.zeros(3), 12))


def test_read_share_stream_checks_header_before_payload() -> None:
    vec = _share(1000)
    consumed: list[int] = []

    def payload() -> Iterator[Any]:
        yield aggregation_pb2.ShareChunk(header=_header(vec, chunk_bytes=800))
        for i, data in enumerate(iter_vector_chunks(vec, 800)):
            consumed.append(i)
            yield aggregation_pb2.ShareChunk(chunk=aggregation_pb2.VectorChunk(index=i, data=data))

    def refuse(header: Any) -> None:
        raise FailedPreconditionError("replay")

    with pytest.raises(FailedPreconditionError):
        read_share_stream(payload(), check_header=refuse)
    assert consumed == []
    header, out = read_share_stream(payload(), num_elements=1000, ring_bits=RING)
    np.testing.assert_array_equal(out, vec)
    assert header.chunk_count == 10
    with pytest.raises(ValueError, match="outside"):
        next(
            share_messages(
                vec, run_id=RUN, round_number=0, server_role=1, ring_bits=8, submission_id=b"x"
            )
        )


def test_share_messages_reject_reserved_headers() -> None:
    vec = _share(10)
    twice = [aggregation_pb2.ShareChunk(header=_header(vec))] * 2
    header = read_share_header(iter(twice))
    with pytest.raises(InvalidArgumentError, match="second"):
        list(iter_share_payload(iter(twice[1:]), header))
    with pytest.raises(InvalidArgumentError, match="empty stream"):
        read_share_header(iter([]))


def test_the_aio_pollers_shutdown_race_is_not_printed_as_a_traceback(caplog) -> None:
    """grpc.aio's poller may run once more on a descriptor its stopped server closed: that
    EBADF is dropped; any other loop error is still reported."""

    def failing(message: str, errno_value: int, where: str) -> OSError:
        try:  # raised from a "file" of that name, as the poller's Cython source is
            exec(compile(f"raise OSError({errno_value}, {message!r})", where, "exec"))
        except OSError as exc:
            return exc
        raise AssertionError("not raised")

    thread = LoopThread("test-loop")
    try:
        handler = thread.loop.get_exception_handler()
        assert handler is not None
        with caplog.at_level(logging.ERROR, logger="asyncio"):
            race = failing("Bad file descriptor", 9, "completion_queue.pyx.pxi")
            handler(thread.loop, {"message": "callback", "exception": race})
            assert not caplog.records
            other = failing("Bad file descriptor", 9, "elsewhere.py")
            handler(thread.loop, {"message": "callback", "exception": other})
            assert len(caplog.records) == 1
    finally:
        thread.close()


# ----------------------------------------------------------------------------- packed shares


@pytest.mark.parametrize("ring_bits", [2, 8, 9, 16, 20, 33, 63, 64])
def test_packed_shares_send_ceil_l_over_8_bytes_per_element(ring_bits: int) -> None:
    n = 10_007
    rng = np.random.default_rng(ring_bits)  # test data only
    vec = rng.integers(0, 1 << min(ring_bits, 63), size=n, dtype=np.uint64)
    if ring_bits == 64:
        vec[0] = np.uint64(2**64 - 1)  # every bit of the widest element
    width = packed_width(ring_bits)
    stream = list(
        share_messages(
            vec, run_id=RUN, round_number=0, server_role=1, ring_bits=ring_bits,
            submission_id=b"x", chunk_bytes=4096,
            encoding=aggregation_pb2.SHARE_ENCODING_PACKED,
        )
    )  # fmt: skip
    header = stream[0].header
    sent = b"".join(m.chunk.data for m in stream[1:])
    assert header.encoding == aggregation_pb2.SHARE_ENCODING_PACKED
    assert len(sent) == width * n and header.chunk_bytes % width == 0
    assert header.sha256 == hashlib.sha256(sent).digest()
    # the low `width` bytes of each little-endian uint64, in order
    expected = vec.astype("<u8").view(np.uint8).reshape(n, 8)[:, :width].tobytes()
    assert sent == expected
    _, back = read_share_stream(iter(stream), num_elements=n, ring_bits=ring_bits)
    np.testing.assert_array_equal(back, vec)
    # what a server's intake reads: uint64 values, whatever was sent
    wide = b"".join(iter_share_payload(iter(stream[1:]), header))
    np.testing.assert_array_equal(np.frombuffer(wide, dtype="<u8"), vec)


def test_packed_share_over_mutual_tls(served: Served) -> None:
    vec = _share()  # RING = 40: 5 bytes per element, 10 MB against 16 MB
    # p2: p1's share for the round is in already (the module's server)
    receipt = _submit(served.stub("p2"), vec, encoding=aggregation_pb2.SHARE_ENCODING_PACKED)
    np.testing.assert_array_equal(served.servicer.shares[("p2", ROUND)], vec)
    assert receipt.sha256 == vector_sha256(pack_elements(vec, 5))


def test_packed_share_refusals() -> None:
    ring_bits, n = 20, 100  # 3 bytes per element, the top 4 bits of the third must be 0
    vec = np.arange(n, dtype=np.uint64)
    packed = bytearray(pack_elements(vec, 3).tobytes())
    packed[7 * 3 + 2] |= 0x10  # element 7 gets bit 20
    header = _header(
        vec, chunk_bytes=300, ring_bits=ring_bits, chunk_count=1,
        sha256=hashlib.sha256(bytes(packed)).digest(),
        encoding=aggregation_pb2.SHARE_ENCODING_PACKED,
    )  # fmt: skip
    with pytest.raises(InvalidArgumentError, match=r"element 7 = 1048583 is outside Z_2\^20"):
        read_share_stream(_raw_stream(header, [(0, bytes(packed))]))
    with pytest.raises(InvalidArgumentError, match="not a positive multiple of 3"):
        read_share_header(iter([aggregation_pb2.ShareChunk(header=_header(
            vec, chunk_bytes=256, ring_bits=ring_bits, chunk_count=2,
            encoding=aggregation_pb2.SHARE_ENCODING_PACKED,
        ))]))  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="unknown share encoding 9"):
        read_share_header(iter([aggregation_pb2.ShareChunk(header=_header(vec, encoding=9))]))
    with pytest.raises(ValueError, match="chunk_bytes=1001 must be a positive multiple of 8"):
        next(share_messages(vec, run_id=RUN, round_number=0, server_role=1, ring_bits=20,
                            submission_id=b"x", chunk_bytes=1001))  # fmt: skip
    with pytest.raises(ValueError, match="unknown share encoding 9"):
        next(share_messages(vec, run_id=RUN, round_number=0, server_role=1, ring_bits=20,
                            submission_id=b"x", encoding=9))  # fmt: skip


def test_packed_only_to_a_server_that_lists_it() -> None:
    old = aggregation_pb2.TrainingConfig()  # a server that predates share_encodings
    assert share_encoding_for(old) == aggregation_pb2.SHARE_ENCODING_UINT64
    new = aggregation_pb2.TrainingConfig(share_encodings=ACCEPTED_SHARE_ENCODINGS)
    assert share_encoding_for(new) == aggregation_pb2.SHARE_ENCODING_PACKED

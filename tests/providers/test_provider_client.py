"""providers: the provider client against a pair of fake Aggregator servers over mutual TLS."""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import torch

from spgc.common.csprng import SecureRandom
from spgc.learning.data import load_dataset, poisson_batch
from spgc.learning.gradients import clip_per_example, per_example_gradients
from spgc.learning.models import build_model, flatten_params, load_flat_params
from spgc.privacy.accounting import smallest_batch_cap
from spgc.protocol.certs import make_dev_pki
from spgc.protocol.encoding import FixedPointConfig, encode_rows
from spgc.protocol.sharing import reconstruct, ring_mask
from spgc.providers.__main__ import main
from spgc.providers.client import (
    ProviderClient,
    ProviderRefusal,
    RoundFailed,
    check_privacy,
    local_noise,
)
from spgc.settings.config import ConfigError
from spgc.settings.config_files import load_provider_config
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import aggregation_pb2 as pb
from spgc.wire import aggregation_pb2_grpc, vector_sha256
from spgc.wire.chunks import MAX_CHUNK_BYTES
from spgc.wire.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    abort_on_error,
    wrong_run,
)
from spgc.wire.identity import caller_identity
from spgc.wire.messages import (
    inline_model,
    iter_share_payload,
    model_messages,
    read_share_header,
)
from spgc.wire.tls import TlsFiles
from spgc.wire.transport import DEFAULT_MAX_MESSAGE_BYTES, make_server

RUN = "run-provider-test"
ROUND = 3
RING = 48
SCALE = 2.0**16
CLIP = 1.0
Q = 0.1
D = 62
FP = FixedPointConfig(scale=SCALE, clip_norm=CLIP, dim=D)
SAMPLING_KEY = bytes(range(32))  # the provider's sampling key: reproducible batches
ROUNDING_SEED = 22


def training_config(**changes: Any) -> Any:
    fields: dict[str, Any] = {
        "run_id": RUN,
        "mode": pb.MODE_SPGC,
        "dataset": "cancer",
        "model": "cancer",
        "num_parameters": D,
        "ring_bits": RING,
        "scale": SCALE,
        "clip_norm": CLIP,
        "l2_bound_units": float(FP.l2_bound_units),
        "rounding": pb.ROUNDING_CONDITIONAL_STOCHASTIC,
        "sampling": pb.BATCH_SAMPLING_POISSON,
        "sampling_rate": Q,
        "noise_multiplier": 1.0,
        "noise_std_units": 1.0 * FP.l2_bound_units,
        "step_epsilon": 4.38,
        "step_delta": 1e-5,
        "target_epsilon": 8.0,
        "target_delta": 1e-5,
        "calibration": pb.CALIBRATION_ACCOUNTANT,
        "accountant": "rdp",
        "min_providers": 1,
    }
    fields.update(changes)
    return pb.TrainingConfig(**fields)


class _Unavailable(Exception):
    """Mapped to UNAVAILABLE by abort_on_error (a server going away mid-submission)."""

    code = grpc.StatusCode.UNAVAILABLE


class FakeAggregator(aggregation_pb2_grpc.AggregatorServicer):
    """One open round; records every submission it sees (accepted or not)."""

    def __init__(self, role: int, name: str, config: Any, model: np.ndarray) -> None:
        self.role = role
        self.name = name
        self.config = config
        self.model = np.asarray(model, dtype=np.float64)
        self.round = ROUND
        self.phase = pb.ROUND_PHASE_COLLECTING
        self.lock = threading.Lock()
        self.accepted: dict[tuple[str, int], tuple[Any, np.ndarray]] = {}
        self.attempts: list[tuple[Any, np.ndarray]] = []  # every complete stream received
        self.seen_ids: set[bytes] = set()
        self.fail_before_accept = 0  # abort UNAVAILABLE before taking the share
        self.fail_after_accept = 0  # take the share, then abort UNAVAILABLE (lost receipt)
        self.finish_after_share = False
        self.inline_model: bytes | None = None  # RoundInfo.model_parameters when asked for
        self.fetches = 0
        self.refuse_hello = False  # PERMISSION_DENIED, as for a provider no longer registered
        self.after_accept: Any = None  # called (no arguments) after a share is accepted
        self.failure = ""  # RoundInfo.failure: the run stopped on an error
        self.deadline = 0.0  # RoundInfo.deadline (seconds since the epoch; 0: none announced)
        self.left_out = ""  # RoundInfo.caller_left_out: why the servers did not use the share
        self.epsilon = 0.0  # RoundInfo.epsilon_spent
        self.ledger_head: tuple[int, bytes] | None = None  # RoundInfo.ledger_head(_releases)
        # FetchLedger: the from_line of each call, and (tests) an answer of the test's choosing
        self.ledger_asked: list[int] = []
        self.ledger_reply: Callable[[int], Any] | None = None
        self.declined: list[tuple[str, str]] = []  # DeclinePlan: (run_id, reason)

    def _round_info(self, who: str) -> Any:
        info = pb.RoundInfo(
            round=self.round,
            model_version=self.round,
            model_sha256=vector_sha256(self.model),
            phase=self.phase,
            caller_share_accepted=(who, self.round) in self.accepted,
            shares_accepted=len(self.accepted),
            latest_model_version=self.round,
            failure=self.failure,
            caller_left_out=self.left_out if self.phase != pb.ROUND_PHASE_COLLECTING else "",
            epsilon_spent=self.epsilon,
        )
        if self.deadline:
            info.deadline.FromNanoseconds(int(self.deadline * 1e9))
        if self.ledger_head is not None:
            info.ledger_head_releases, info.ledger_head = self.ledger_head
        return info

    @abort_on_error
    def Hello(self, request: Any, context: grpc.ServicerContext) -> Any:
        who = caller_identity(context, request.provider_id, insecure=False)
        if self.refuse_hello:
            context.abort(grpc.StatusCode.PERMISSION_DENIED, f"{who!r} is not a provider")
        return pb.ServerInfo(
            protocol_version=1,
            software_version="fake",
            role=self.role,
            server_name=self.name,
            provider_id=who,
            config=self.config,
            round=self._round_info(who),
            limits=pb.WireLimits(
                max_message_bytes=DEFAULT_MAX_MESSAGE_BYTES,
                max_chunk_bytes=MAX_CHUNK_BYTES,
                preferred_chunk_bytes=128,  # several chunks even for d = 62
            ),
        )

    @abort_on_error
    def FetchModel(self, request: Any, context: grpc.ServicerContext) -> Iterator[Any]:
        caller_identity(context, insecure=False)
        self.fetches += 1
        if request.HasField("version") and request.version != self.round:
            raise FailedPreconditionError(f"version {request.version} is not served")
        yield from model_messages(
            self.model, run_id=self.config.run_id, version=self.round, chunk_bytes=256
        )

    @abort_on_error
    def SubmitShare(self, request_iterator: Any, context: grpc.ServicerContext) -> Any:
        header = read_share_header(
            request_iterator, num_elements=self.config.num_parameters, ring_bits=RING
        )
        who = caller_identity(context, header.provider_id, insecure=False)
        if header.run_id != self.config.run_id:
            raise wrong_run(header.run_id)
        if header.round != self.round or self.phase != pb.ROUND_PHASE_COLLECTING:
            raise FailedPreconditionError(f"round {header.round} is not open")
        if header.server_role != self.role:
            raise InvalidArgumentError("share meant for another server")
        with self.lock:
            if header.submission_id in self.seen_ids:
                raise AlreadyExistsError("submission id used before")
            self.seen_ids.add(header.submission_id)
            if (who, header.round) in self.accepted:
                raise AlreadyExistsError(f"{who} already sent a share for round {header.round}")
        vec = np.frombuffer(b"".join(iter_share_payload(request_iterator, header)), dtype="<u8")
        vec = vec.astype(np.uint64)
        with self.lock:
            self.attempts.append((header, vec))
            if self.fail_before_accept:
                self.fail_before_accept -= 1
                raise _Unavailable("server restarting")
            self.accepted[(who, header.round)] = (header, vec)
            if self.finish_after_share:
                self.phase = pb.ROUND_PHASE_FINISHED
            if self.fail_after_accept:
                self.fail_after_accept -= 1
                raise _Unavailable("connection lost after accepting")
        if self.after_accept is not None:
            self.after_accept()
        return pb.SubmitReceipt(
            run_id=self.config.run_id,
            round=header.round,
            submission_id=header.submission_id,
            provider_id=who,
            num_elements=header.num_elements,
            sha256=vector_sha256(vec),
        )

    @abort_on_error
    def RoundStatus(self, request: Any, context: grpc.ServicerContext) -> Any:
        who = caller_identity(context, insecure=False)
        info = self._round_info(who)
        if request.include_model and self.inline_model is not None:
            info.model_parameters = self.inline_model
        return info


    @abort_on_error
    def FetchLedger(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.ledger_asked.append(request.from_line)
        if self.ledger_reply is not None:  # a server that lies about its ledger
            return self.ledger_reply(request.from_line)
        return pb.LedgerReply(total_lines=0)  # no release recorded yet

    @abort_on_error
    def DeclinePlan(self, request: Any, context: grpc.ServicerContext) -> Any:
        self.declined.append((request.run_id, request.reason))
        return pb.DeclineReply()


class FakeServer:
    """A started FakeAggregator on 127.0.0.1 with its certificate."""

    def __init__(self, pki: Path, servicer: FakeAggregator) -> None:
        self.servicer = servicer
        adder = functools.partial(aggregation_pb2_grpc.add_AggregatorServicer_to_server, servicer)
        tls = TlsFiles.from_dir(pki, servicer.name)
        self.server, self.port = make_server("127.0.0.1:0", [adder], tls, max_workers=4)
        self.server.start()
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(None).wait()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = tmp_path_factory.mktemp("provider-pki")
    make_dev_pki(base, ["h1", "h2", "p1"])
    return base


@pytest.fixture(scope="module")
def cancer() -> tuple[np.ndarray, np.ndarray]:
    ds = load_dataset("cancer")
    return ds.x_train, ds.y_train


MODEL = flatten_params(build_model("cancer", seed=5))


@pytest.fixture
def servers(pki: Path) -> Iterator[Any]:
    started: list[FakeServer] = []

    def make(
        config1: Any = None,
        config2: Any = None,
        model2: np.ndarray | None = None,
        single: bool = False,
    ) -> list[FakeServer]:
        c1 = config1 if config1 is not None else training_config()
        if single:
            s = FakeServer(pki, FakeAggregator(pb.SERVER_ROLE_SINGLE, "h1", c1, MODEL))
            started.append(s)
            return [s]
        c2 = config2 if config2 is not None else c1
        h1 = FakeServer(pki, FakeAggregator(pb.SERVER_ROLE_H1, "h1", c1, MODEL))
        h2 = FakeServer(
            pki, FakeAggregator(pb.SERVER_ROLE_H2, "h2", c2, MODEL if model2 is None else model2)
        )
        started.extend([h1, h2])
        return [h1, h2]

    yield make
    for s in started:
        s.stop()


def provider_config(pki: Path, servers: list[FakeServer], **changes: Any) -> ProviderConfig:
    values: dict[str, Any] = {
        "name": "p1",
        "h1_address": servers[0].address,
        "h1_name": "h1",
        "h2_address": servers[1].address if len(servers) > 1 else "",
        "h2_name": "h2",
        "tls_cert": pki / "p1.pem",
        "tls_key": pki / "p1.key",
        "tls_ca": pki / "ca.pem",
        "dataset": "cancer",
        "max_step_epsilon": 10.0,
        "step_delta": 1e-5,
        "retries": 4,
        "backoff_initial": 0.01,
        "backoff_max": 0.05,
        "poll_interval": 0.01,
        "rpc_timeout": 20.0,
        "wait_timeout": 10.0,
    }
    values.update(changes)
    return ProviderConfig(**values)


def client_for(cfg: ProviderConfig, data: Any = None) -> ProviderClient:
    return ProviderClient(
        cfg,
        data=data,
        sampling_rng=SecureRandom(SAMPLING_KEY),
        rounding_rng=np.random.default_rng(ROUNDING_SEED),
    )


def expected_rows(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(batch, encoded rows) the provider must have computed, recomputed independently."""
    model = build_model("cancer")
    load_flat_params(model, MODEL)
    batch = poisson_batch(len(x), Q, SecureRandom(SAMPLING_KEY))
    grads = per_example_gradients(model, x[batch], y[batch])
    clipped = clip_per_example(grads, CLIP)
    rows, _ = encode_rows(clipped, FP, np.random.default_rng(ROUNDING_SEED))
    return batch, rows


# ----------------------------------------------------------------------------- end to end


def test_one_round_end_to_end(
    pki: Path, servers: Any, cancer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    h1, h2 = servers()
    cfg = provider_config(pki, [h1, h2])  # loads its own part of the cancer dataset
    caplog.set_level(logging.INFO)
    with client_for(cfg) as client:
        report = client.run_round()
    # the operator sees where the gradients are computed (device: auto, no GPU here)
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert any(f"gradients on {want}," in r.getMessage() for r in caplog.records)
    assert report is not None and report.accepted
    assert report.round == ROUND and report.model_version == ROUND

    ((hdr1, s1),) = h1.servicer.accepted.values()
    ((hdr2, s2),) = h2.servicer.accepted.values()
    assert list(h1.servicer.accepted) == [("p1", ROUND)]  # counted under the certificate name
    for hdr, role in ((hdr1, pb.SERVER_ROLE_H1), (hdr2, pb.SERVER_ROLE_H2)):
        assert hdr.round == ROUND and hdr.run_id == RUN and hdr.server_role == role
        assert hdr.ring_bits == RING and hdr.num_elements == D
        assert hdr.chunk_count > 1  # the servers' preferred chunk size was used
    assert int(s1.max()) <= int(ring_mask(RING)) and int(s2.max()) <= int(ring_mask(RING))
    assert not np.array_equal(s1, s2)
    # Both halves name one vector (the servers leave out a provider whose halves differ).
    assert len(hdr1.vector_id) == 16 and hdr1.vector_id == hdr2.vector_id

    x, y = cancer
    batch, rows = expected_rows(x, y)
    assert report.batch_size == len(batch) > 0
    # Every encoded example is within the announced L2 bound, in integers.
    assert np.all(np.einsum("ij,ij->i", rows, rows) <= FP.l2_bound_units**2)
    assert np.array_equal(reconstruct(s1, s2, RING), rows.sum(axis=0))


def test_a_small_model_inline_in_the_round_info_needs_no_download(
    pki: Path, servers: Any, cancer: Any
) -> None:
    """The model-source server sends a small model with its long-poll answer (include_model);
    it is checked against both servers' hashes like a download, and FetchModel is not called."""
    h1, h2 = servers()
    for s in (h1, h2):
        s.servicer.inline_model = inline_model(MODEL)
    cfg = provider_config(pki, [h1, h2])
    with client_for(cfg, data=cancer) as client:
        report = client.run_round()
    assert report is not None and report.accepted
    assert h1.servicer.fetches == 0 and h2.servicer.fetches == 0
    ((_, s1),) = h1.servicer.accepted.values()
    ((_, s2),) = h2.servicer.accepted.values()
    x, y = cancer
    _, rows = expected_rows(x, y)
    assert np.array_equal(reconstruct(s1, s2, RING), rows.sum(axis=0))  # trained on MODEL


def test_an_inline_model_that_does_not_match_its_hash_is_refused(
    pki: Path, servers: Any, cancer: Any
) -> None:
    h1, h2 = servers()
    tampered = bytearray(inline_model(MODEL) or b"")
    tampered[0] ^= 1
    for s in (h1, h2):
        s.servicer.inline_model = bytes(tampered)
    cfg = provider_config(pki, [h1, h2])
    with (
        client_for(cfg, data=cancer) as client,
        pytest.raises(ProviderRefusal, match=r"sent a malformed model: .*SHA-256"),
    ):
        client.run_round()
    assert not h1.servicer.attempts and not h2.servicer.attempts


def test_plain_mode_sends_the_clear_sum(pki: Path, servers: Any, cancer: Any) -> None:
    (h,) = servers(
        config1=training_config(mode=pb.MODE_PLAIN, noise_multiplier=0, noise_std_units=0),
        single=True,
    )
    cfg = provider_config(pki, [h], max_step_epsilon=None, allow_no_privacy=True)
    with client_for(cfg, data=cancer) as client:
        report = client.run_round()
    assert report is not None and report.accepted
    ((hdr, vec),) = h.servicer.accepted.values()
    assert hdr.server_role == pb.SERVER_ROLE_SINGLE
    _, rows = expected_rows(*cancer)
    total = rows.sum(axis=0)
    assert np.array_equal(vec, total.view(np.uint64) & ring_mask(RING))


def test_run_stops_when_training_finishes(pki: Path, servers: Any, cancer: Any) -> None:
    h1, h2 = servers()
    h1.servicer.finish_after_share = True
    cfg = provider_config(pki, [h1, h2])
    seen: list[Any] = []
    with client_for(cfg, data=cancer) as client:
        reports = client.run(on_round=seen.append)  # the provider's progress line hook
    assert [r.round for r in reports] == [ROUND]
    assert seen == reports and seen[0].epsilon_spent == 0.0


def test_a_share_the_servers_left_out_is_said_not_counted(
    pki: Path, servers: Any, cancer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """Both servers took the share, but the agreement left it out (RoundInfo.caller_left_out):
    the provider says so once the round is over."""
    h1, h2 = servers()
    h1.servicer.finish_after_share = True
    h1.servicer.left_out = "its share reached this server but not the other"
    cfg = provider_config(pki, [h1, h2])
    with caplog.at_level(logging.WARNING), client_for(cfg, data=cancer) as client:
        (report,) = client.run()
    assert report.accepted and report.left_out == h1.servicer.left_out
    assert f"round {ROUND}: our share is not in the sum: its share reached" in caplog.text


def test_a_count_of_releases_that_goes_back_is_refused(
    pki: Path, servers: Any, cancer: Any
) -> None:
    """A server's epsilon spent never goes down within a run; lower than it said before, its
    state went back (a restored backup) and releases would go uncounted: the provider leaves.
    The two servers may differ (H2 records each release first)."""
    h1, h2 = servers()
    h1.servicer.epsilon, h2.servicer.epsilon = 2.0, 2.5
    cfg = provider_config(pki, [h1, h2], wait_timeout=5)
    with client_for(cfg, data=cancer) as client:
        client.run_round()
        for h in (h1, h2):
            h.servicer.round += 1
        h2.servicer.epsilon = 2.2  # still above H1's: but below what H2 itself said
        went_back = r"h2 says epsilon 2\.2 is spent, but it said 2\.5"
        with pytest.raises(ProviderRefusal, match=went_back):
            client.run_round()


# ----------------------------------------------------------------------------- refusals


def test_refuses_different_training_configs(pki: Path, servers: Any, cancer: Any) -> None:
    h1, h2 = servers(config2=training_config(noise_multiplier=0.5))
    with (
        client_for(provider_config(pki, [h1, h2]), data=cancer) as client,
        pytest.raises(ProviderRefusal, match=r"different training configurations.*noise_mult"),
    ):
        client.run_round()
    assert not h1.servicer.attempts and not h2.servicer.attempts


def test_refuses_weaker_privacy_than_minimum(pki: Path, servers: Any, cancer: Any) -> None:
    h1, h2 = servers()
    for changes, match in (
        ({"max_step_epsilon": 1.0}, "weaker than this provider's minimum epsilon"),
        ({"max_step_epsilon": None, "min_noise_multiplier": 2.0}, "below this provider's min"),
    ):
        cfg = provider_config(pki, [h1, h2], **changes)
        with client_for(cfg, data=cancer) as client, pytest.raises(ProviderRefusal, match=match):
            client.run_round()
    assert not h1.servicer.attempts and not h2.servicer.attempts


def test_refuses_a_batch_cap_its_poisson_batches_could_pass(
    pki: Path, servers: Any, cancer: Any
) -> None:
    """A Poisson batch over max_batch_size would sit its round out (not in the accounting):
    a provider joins only where that has probability <= 2^-64 per round, else it names the cap
    its data needs."""
    n = len(cancer[0])
    need = smallest_batch_cap(n, Q)
    h1, h2 = servers(config1=training_config(max_batch_size=need - 1))
    cfg = provider_config(pki, [h1, h2])
    match = f"max_batch_size must be at least {need} for this provider's data"
    with client_for(cfg, data=cancer) as client, pytest.raises(ProviderRefusal, match=match):
        client.run_round()
    assert not h1.servicer.attempts and not h2.servicer.attempts
    h1, h2 = servers(config1=training_config(max_batch_size=need))
    with client_for(provider_config(pki, [h1, h2]), data=cancer) as client:
        assert client.run_round() is not None


def test_refuses_no_noise_when_a_minimum_is_set() -> None:
    tc = training_config(mode=pb.MODE_ONLY_MPC)
    cfg = ProviderConfig(name="p1", h1_address="x:1", insecure=True, max_step_epsilon=5.0)
    with pytest.raises(ProviderRefusal, match="no noise"):
        check_privacy(tc, cfg)
    # Rounding inflation counts: std / B, not the nominal multiplier alone.
    tc = training_config(noise_multiplier=2.0, noise_std_units=2.0 * SCALE * CLIP)
    cfg = ProviderConfig(name="p1", h1_address="x:1", insecure=True, min_noise_multiplier=2.0)
    with pytest.raises(ProviderRefusal, match="below"):
        check_privacy(tc, cfg)


def test_refuses_l2_bound_mismatch(pki: Path, servers: Any, cancer: Any) -> None:
    tc = training_config(l2_bound_units=SCALE * CLIP)  # the server forgot the inflation
    h1, h2 = servers(config1=tc)
    cfg = provider_config(pki, [h1, h2])
    with client_for(cfg, data=cancer) as client, pytest.raises(ProviderRefusal, match="l2_bound"):
        client.run_round()


def test_refuses_different_model_hashes(pki: Path, servers: Any, cancer: Any) -> None:
    other = MODEL.copy()
    other[0] += 1e-9
    h1, h2 = servers(model2=other)
    cfg = provider_config(pki, [h1, h2])
    with (
        client_for(cfg, data=cancer) as client,
        pytest.raises(ProviderRefusal, match=r"serve different models"),
    ):
        client.run_round()
    assert not h1.servicer.attempts and not h2.servicer.attempts


@pytest.mark.parametrize(("h2_releases", "refused"), [(3, True), (4, False)])
def test_refuses_different_ledger_heads(
    pki: Path, servers: Any, cancer: Any, h2_releases: int, refused: bool
) -> None:
    """Each server names the co-signed ledger head of its latest model (issue 45): after the
    same releases, two heads mean two records of one run. Different counts are a moment
    between the two servers' publications: nothing to refuse."""
    h1, h2 = servers()
    h1.servicer.ledger_head = (3, b"\x01" * 32)
    h2.servicer.ledger_head = (h2_releases, b"\x02" * 32)
    with client_for(provider_config(pki, [h1, h2]), data=cancer) as client:
        if refused:
            with pytest.raises(ProviderRefusal, match=r"different co-signed ledger heads after 3"):
                client.run_round()
            assert not h1.servicer.attempts and not h2.servicer.attempts
        else:
            assert client.run_round() is not None


# ----------------------------------------------------------------------------- retries


def test_retry_after_unavailable_resends_the_same_share(
    pki: Path, servers: Any, cancer: Any
) -> None:
    h1, h2 = servers()
    h1.servicer.fail_before_accept = 1
    cfg = provider_config(pki, [h1, h2])
    with client_for(cfg, data=cancer) as client:
        report = client.run_round()
    assert report is not None and report.accepted
    r1 = next(r for r in report.results if r.server == "h1")
    assert r1.attempts == 2 and r1.how == "receipt"
    assert len(h1.servicer.accepted) == 1 and len(h2.servicer.accepted) == 1
    (first_hdr, first), (second_hdr, second) = h1.servicer.attempts
    assert first_hdr.submission_id != second_hdr.submission_id  # a fresh id per attempt
    assert np.array_equal(first, second)  # ... but never another share vector
    ((_, s2),) = h2.servicer.accepted.values()
    _, rows = expected_rows(*cancer)
    assert np.array_equal(reconstruct(second, s2, RING), rows.sum(axis=0))


class _RpcUnavailable(grpc.RpcError):
    """What a gRPC stub raises while the server is not up."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "not up yet"


def test_hello_waits_for_a_server_still_starting(pki: Path) -> None:
    """Hello retries until connect_timeout (a server still deriving its plan), where other calls
    give up after `retries` attempts."""
    cfg = ProviderConfig(
        name="p1",
        h1_address="127.0.0.1:1",
        insecure=True,
        retries=2,
        backoff_initial=0.01,
        backoff_max=0.01,
        connect_timeout=30.0,
        allow_no_privacy=True,
    )
    client = ProviderClient(cfg)
    client._sleep = lambda _s: None  # type: ignore[method-assign]
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 6:
            raise _RpcUnavailable()
        return "up"

    assert client._call_with_retry(flaky, "Hello", deadline=time.monotonic() + 30) == "up"
    calls.clear()
    # An unreachable server is not a refusal of the plan (exit 3) but an error (exit 1).
    with pytest.raises(ConnectionError, match="failed after 2 attempts: UNAVAILABLE"):
        client._call_with_retry(flaky, "SubmitShare")
    calls.clear()
    with pytest.raises(ConnectionError, match="UNAVAILABLE"):
        client._call_with_retry(flaky, "Hello", deadline=time.monotonic() - 1)
    assert len(calls) == 1
    calls.clear()
    with pytest.raises(RoundFailed, match="failed after 2 attempts"):  # a round's call
        client._call_with_retry(flaky, "FetchModel", RoundFailed)


def test_a_clock_ahead_of_the_servers_still_takes_part(
    pki: Path, servers: Any, cancer: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """The servers still collect a round whose deadline, by this machine's clock, passed two
    minutes ago: the clock is ahead. The provider takes part (the servers judge lateness) and
    says what to check, once; a deadline just past is a round about to close: it sits it out."""
    h1, h2 = servers()
    for server in (h1, h2):
        server.servicer.deadline = time.time() - 120
    cfg = provider_config(pki, [h1, h2], wait_timeout=1.0)
    with client_for(cfg, data=cancer) as client:
        report = client.run_round()
    assert report is not None and report.accepted
    said = [r.getMessage() for r in caplog.records if "clock" in r.getMessage()]
    assert len(said) == 1 and "ahead" in said[0], said
    h1, h2 = servers()
    for server in (h1, h2):
        server.servicer.deadline = time.time() - 1
    cfg = provider_config(pki, [h1, h2], wait_timeout=1.0)
    with client_for(cfg, data=cancer) as client, pytest.raises(TimeoutError):
        client.run_round()
    assert not h1.servicer.attempts and not h2.servicer.attempts


@pytest.mark.parametrize(
    ("reply", "said"),
    [
        # says it holds 5 lines, sends none of the ones asked for: the provider would spin
        (lambda start: pb.LedgerReply(total_lines=5), "holds 5 line(s), but it sent none"),
        # sends more lines than it says it holds
        (
            lambda start: pb.LedgerReply(lines=[b"{}"] * 3, total_lines=2),
            "sent 3 ledger line(s) from line 0 but LedgerReply.total_lines=2",
        ),
    ],
)
def test_a_server_that_lies_about_its_ledger_pages_is_refused(
    pki: Path, servers: Any, cancer: Any, reply: Any, said: str
) -> None:
    """FetchLedger answers a page at a time (the client asks from the first line it lacks):
    a server whose pages do not add up to the total it names is refused, never looped on."""
    h1, h2 = servers()
    h1.servicer.ledger_reply = reply
    cfg = provider_config(pki, [h1, h2], max_total_epsilon=100.0)
    with (
        client_for(cfg, data=cancer) as client,
        pytest.raises(ProviderRefusal, match=re.escape(said)),
    ):
        client.run_round()
    assert h1.servicer.ledger_asked == [0] and not h1.servicer.attempts


def test_a_ledger_that_shrinks_below_what_it_showed_is_refused(
    pki: Path, servers: Any, cancer: Any
) -> None:
    """The lines a server showed are kept and the next call asks only from the first new
    line; a server that then holds fewer lines (a ledger cut short) is refused."""
    h1, h2 = servers()
    shown = {"total": 0}
    h1.servicer.ledger_reply = lambda start: pb.LedgerReply(total_lines=shown["total"])
    cfg = provider_config(pki, [h1, h2], max_total_epsilon=100.0)
    with client_for(cfg, data=cancer) as client:
        client.connect()
        assert client.check_ledger() is None  # nothing released yet
        client._ledgers[("h1", client.training.run_id)] = [b"a", b"b"]  # as if shown before
        with pytest.raises(ProviderRefusal, match="it showed more lines before"):
            client.check_ledger()
    assert h1.servicer.ledger_asked == [0, 2]


def test_a_first_step_above_the_providers_limit_is_refused(
    pki: Path, servers: Any, cancer: Any
) -> None:
    """Servers announce a target within max_total_epsilon, but their noise spends more than
    that limit in the very first step: the provider leaves before sending anything."""
    claimed = training_config(target_epsilon=0.5)  # noise multiplier 1, q 0.1: 2.13 a step
    h1, h2 = servers(claimed, claimed)
    cfg = provider_config(pki, [h1, h2], max_total_epsilon=1.0)
    with client_for(cfg, data=cancer) as client, pytest.raises(ProviderRefusal) as refusal:
        client.run_round()
    assert "0 release(s); one more would spend 2.13" in str(refusal.value)
    assert not h1.servicer.attempts and not h2.servicer.attempts
    # Both servers are told why it leaves (DeclinePlan): they count it out of the rounds.
    for server in (h1, h2):
        assert server.servicer.declined == [(claimed.run_id, str(refusal.value))]


@pytest.mark.parametrize(
    ("change", "said"),
    [({"h1_name": "h9"}, "does not carry the name"), ({"tls_ca": "other"}, "not signed by")],
)
def test_a_server_certificate_this_provider_refuses_stops_it_at_once(
    pki: Path, servers: Any, cancer: Any, tmp_path: Path, change: dict, said: str
) -> None:
    """Another name than h1_name, or another CA: a configuration error named at once, not an
    outage retried for connect_timeout."""
    if "tls_ca" in change:
        make_dev_pki(tmp_path, ["x"])
        change = {"tls_ca": tmp_path / "ca.pem"}
    h1, h2 = servers()
    cfg = provider_config(pki, [h1, h2], connect_timeout=120.0, **change)
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=said), client_for(cfg, data=cancer) as client:
        client.connect()
    assert time.monotonic() - started < 30


def test_lost_receipt_is_not_resent(pki: Path, servers: Any, cancer: Any) -> None:
    h1, h2 = servers()
    h2.servicer.fail_after_accept = 1
    cfg = provider_config(pki, [h1, h2])
    with client_for(cfg, data=cancer) as client:
        report = client.run_round()
    assert report is not None and report.accepted
    r2 = next(r for r in report.results if r.server == "h2")
    assert r2.how == "status" and r2.attempts == 1
    assert len(h2.servicer.attempts) == 1 and len(h2.servicer.accepted) == 1


def test_does_not_resubmit_a_round_it_took_part_in(pki: Path, servers: Any, cancer: Any) -> None:
    h1, h2 = servers()
    cfg = provider_config(pki, [h1, h2], wait_timeout=0.2)
    with client_for(cfg, data=cancer) as client:
        assert client.run_round() is not None
        with pytest.raises(TimeoutError):
            client.run_round()  # round 3 still open, but already done: no second share
    assert len(h1.servicer.attempts) == 1 and len(h2.servicer.attempts) == 1


def test_a_share_a_server_missed_is_sent_again_unchanged(
    pki: Path, servers: Any, cancer: Any
) -> None:
    """H2 was down for every attempt (retries exhausted: the round failed there). While the
    round still collects and H1 holds our share, the client sends H2 exactly its share again,
    never another vector."""
    h1, h2 = servers()
    h2.servicer.fail_before_accept = 4  # = retries
    cfg = provider_config(pki, [h1, h2], wait_timeout=0.5)
    with client_for(cfg, data=cancer) as client:
        with pytest.raises(RoundFailed, match="h2") as failed:
            client.run_round()
        assert failed.value.resending  # H1 holds its half: logged as pending, not as lost
        assert not h2.servicer.accepted
        (report,) = client.reports
        assert not report.accepted  # one of two servers is not "every server"
        h1.servicer.phase = pb.ROUND_PHASE_AGREEING  # H1 had every share it waited for
        with pytest.raises(TimeoutError):  # no new round: but the share got through meanwhile
            client.run_round()
        assert report.accepted and [r.server for r in report.results] == ["h1", "h2"]
    assert len(h1.servicer.attempts) == 1 and len(h2.servicer.accepted) == 1
    sent = [vec for _, vec in h2.servicer.attempts]
    assert len(sent) == 5 and all(np.array_equal(v, sent[0]) for v in sent)
    ids = {hdr.vector_id for hdr, _ in h1.servicer.attempts + h2.servicer.attempts}
    assert len(ids) == 1  # the resent half still names the vector H1 holds the other half of
    ((_, s1),) = h1.servicer.accepted.values()
    _, rows = expected_rows(*cancer)
    assert np.array_equal(reconstruct(s1, sent[0], RING), rows.sum(axis=0))


def test_a_round_both_servers_dropped_runs_again_with_a_fresh_vector(
    pki: Path, servers: Any, cancer: Any
) -> None:
    """Both servers dropped our shares of the round (they lost each other and went back to
    their checkpoint) and collect it again: the client takes part again, with a new sharing."""
    h1, h2 = servers()
    cfg = provider_config(pki, [h1, h2], wait_timeout=2.0)
    with client_for(cfg, data=cancer) as client:
        assert client.run_round() is not None
        for server in (h1, h2):
            server.servicer.accepted.clear()
        again = client.run_round()
    assert again is not None and again.round == ROUND and again.accepted
    (ha1, a1), (hb1, b1) = h1.servicer.attempts
    (ha2, a2), (hb2, b2) = h2.servicer.attempts
    assert not np.array_equal(a1, b1) and not np.array_equal(a2, b2)
    assert ha1.vector_id == ha2.vector_id != hb1.vector_id == hb2.vector_id  # a new vector


# ----------------------------------------------------------------------------- config, noise


def test_config_from_yaml_with_nested_keys_and_overrides(pki: Path, tmp_path: Path) -> None:
    text = f"""
name: p1
h1: {{address: "127.0.0.1:5001", name: h1}}
h2: {{address: "127.0.0.1:5002", name: h2}}
tls: {{cert: {pki / "p1.pem"}, key: {pki / "p1.key"}, ca: {pki / "ca.pem"}}}
provider: {{index: 1, count: 3}}
max_step_epsilon: 2.5
"""
    path = tmp_path / "provider.yaml"
    path.write_text(text)
    cfg = load_provider_config(path, ["provider_index=2", "retries=7"])
    assert cfg.h2_address == "127.0.0.1:5002" and cfg.provider_index == 2
    assert cfg.provider_count == 3 and cfg.retries == 7 and cfg.max_step_epsilon == 2.5
    assert cfg.tls is not None and cfg.tls.key == pki / "p1.key"

    path.write_text("name: p1\nh1_address: a:1\ninsecure: true\n")
    with pytest.raises(ConfigError, match="no minimum privacy"):
        load_provider_config(path)
    path.write_text("name: p1\nh1_address: a:1\nmax_step_eps: 1\n")
    with pytest.raises(ConfigError, match="unknown key"):
        load_provider_config(path)
    path.write_text("name: p1\nh1_address: a:1\nmax_step_epsilon: 1\n")
    with pytest.raises(ConfigError, match="tls_cert is required"):
        load_provider_config(path)


def test_local_noise_moments_and_freshness() -> None:
    sigma = 7.3
    z = local_noise(sigma, 200_000, seed=bytes(range(32)))
    assert z.dtype == np.int64
    assert abs(z.mean()) < 0.1
    assert abs(z.std() / sigma - 1) < 0.01
    assert np.array_equal(z, local_noise(sigma, 200_000, seed=bytes(range(32))))
    assert not np.array_equal(local_noise(sigma, 50), local_noise(sigma, 50))


def test_ldp_mode_adds_local_discrete_gaussian_noise(pki: Path, servers: Any, cancer: Any) -> None:
    std = 3.0 * FP.l2_bound_units
    (h,) = servers(
        config1=training_config(mode=pb.MODE_LDP, noise_multiplier=3.0, noise_std_units=std),
        single=True,
    )
    cfg = provider_config(pki, [h])
    client = ProviderClient(
        cfg,
        data=cancer,
        sampling_rng=SecureRandom(SAMPLING_KEY),
        rounding_rng=np.random.default_rng(ROUNDING_SEED),
        noise_seed=b"n" * 32,
    )
    with client:
        assert client.run_round() is not None
    ((_, vec),) = h.servicer.accepted.values()
    _, rows = expected_rows(*cancer)
    noisy = rows.sum(axis=0) + local_noise(std, D, seed=b"n" * 32)
    assert np.array_equal(vec, noisy.view(np.uint64) & ring_mask(RING))
    assert client.noise_seed is None  # used once: a later round draws fresh noise


def test_fixed_batches_option(pki: Path, servers: Any, cancer: Any) -> None:
    # max_batch_size: the servers sized the ring for batches of 32; this one is at the limit
    tc = training_config(
        sampling=pb.BATCH_SAMPLING_SHUFFLE, batch_size=32, max_batch_size=32, batches_per_epoch=4
    )
    h1, h2 = servers(config1=tc)
    with client_for(provider_config(pki, [h1, h2]), data=cancer) as client:
        report = client.run_round()
    assert report is not None and report.batch_size == 32 and report.accepted


def _fixed_batch_client(pki: Path, cancer: Any, per_epoch: int = 4) -> ProviderClient:
    """A provider holding the cancer data under a fixed-batch plan (no servers needed to
    draw batches)."""
    client = client_for(provider_config(pki, [FakeServerAddress()]), data=cancer)
    client._x, client._y = cancer
    client.training = training_config(
        sampling=pb.BATCH_SAMPLING_SHUFFLE, batch_size=10, batches_per_epoch=per_epoch
    )
    return client


class FakeServerAddress:
    address = "127.0.0.1:1"


def test_fixed_batches_follow_the_release_count(pki: Path, cancer: Any) -> None:
    """Batch r mod E of epoch r // E's permutation for the run's release r: a round without a
    release (r unchanged) draws the same batch again, so an example is in at most one release
    per epoch whatever rounds were skipped (the accountant counts ceil(releases / E) epochs)."""
    client = _fixed_batch_client(pki, cancer)
    draws = [(r, client._fixed_batch(r)) for r in (0, 0, 1, 2, 2, 2, 3, 4, 5)]
    by_release: dict[int, np.ndarray] = {}
    for r, batch in draws:
        assert len(batch) == 10
        if r in by_release:
            assert np.array_equal(by_release[r], batch)  # no release in between: same batch
        by_release[r] = batch
    epoch0 = np.concatenate([by_release[r] for r in range(4)])
    assert len(set(epoch0.tolist())) == 40  # one epoch: no example twice
    assert not np.array_equal(by_release[4], by_release[0])  # epoch 1: a new permutation


def test_fixed_batches_a_provider_started_mid_epoch_joins_at_the_next(
    pki: Path, cancer: Any
) -> None:
    """A (re)started provider cannot know which examples its earlier process put in this
    epoch's releases: it sits out until the next epoch begins."""
    client = _fixed_batch_client(pki, cancer)
    for r in (2, 3):
        with pytest.raises(RoundFailed, match="joins at release 4, the next epoch"):
            client._fixed_batch(r)
    assert len(client._fixed_batch(4)) == 10
    assert len(_fixed_batch_client(pki, cancer)._fixed_batch(8)) == 10  # at a boundary: at once


def test_fixed_batches_need_both_servers_to_count_the_same_releases(
    pki: Path, cancer: Any
) -> None:
    client = _fixed_batch_client(pki, cancer)
    client._round_infos = [pb.RoundInfo(releases_counted=3), pb.RoundInfo(releases_counted=4)]
    with pytest.raises(RoundFailed, match=r"count different releases \(\[3, 4\]\)"):
        client.draw_batch()
    client._round_infos = [pb.RoundInfo(releases_counted=0), pb.RoundInfo(releases_counted=0)]
    assert len(client.draw_batch()) == 10


def test_fixed_batches_refuse_data_too_small_for_an_epoch(
    pki: Path, servers: Any, cancer: Any
) -> None:
    """E batches of b per epoch need E * b examples: with fewer, an example would be in more
    releases than the accountant counts."""
    tc = training_config(sampling=pb.BATCH_SAMPLING_SHUFFLE, batch_size=32, batches_per_epoch=20)
    h1, h2 = servers(config1=tc)
    match = "an epoch of 20 batches of 32 needs 640 examples, this provider holds"
    with client_for(provider_config(pki, [h1, h2]), data=cancer) as client, pytest.raises(
        ProviderRefusal, match=match
    ):
        client.run_round()


def test_a_batch_larger_than_the_ring_is_sized_for_sits_the_round_out(
    pki: Path, servers: Any, cancer: Any
) -> None:
    """The servers size the ring for batches of max_batch_size: a provider whose batch is
    larger sends nothing (the sum of all shares could wrap) rather than a share."""
    tc = training_config(
        sampling=pb.BATCH_SAMPLING_SHUFFLE, batch_size=32, max_batch_size=31, batches_per_epoch=4
    )
    h1, h2 = servers(config1=tc)
    refused = pytest.raises(RoundFailed, match="larger than the 31 the servers sized the ring")
    with client_for(provider_config(pki, [h1, h2]), data=cancer) as client, refused:
        client.run_round()
    assert not h1.servicer.accepted and not h2.servicer.accepted  # (32 fits: the test above)


def test_a_new_run_of_the_servers_is_joined_from_its_first_round(
    pki: Path, servers: Any, cancer: Any
) -> None:
    """The servers lost their state and started another run (new run id, round 0): the
    provider notices the rounds going back, reads the new plan (Hello) and takes part in the
    new run, instead of sending shares of the old run that are refused forever."""
    h1, h2 = servers()
    new = training_config(run_id="run-2")

    def start_a_new_run() -> None:  # once both servers hold the first round's shares
        if len(h1.servicer.accepted) == len(h2.servicer.accepted) == 1:
            for s in (h1, h2):
                s.servicer.config, s.servicer.round = new, 0
                s.servicer.finish_after_share = True

    h1.servicer.after_accept = h2.servicer.after_accept = start_a_new_run
    with client_for(provider_config(pki, [h1, h2]), data=cancer) as client:
        reports = client.run()
    assert [r.round for r in reports] == [ROUND, 0] and all(r.accepted for r in reports)
    for s in (h1, h2):
        assert s.servicer.accepted[("p1", 0)][0].run_id == "run-2"
        assert s.servicer.accepted[("p1", ROUND)][0].run_id == RUN


def test_main_exit_codes(
    pki: Path, servers: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    h1, h2 = servers()
    h1.servicer.finish_after_share = True
    path = tmp_path / "provider.yaml"
    path.write_text(
        f"name: p1\nh1_address: '{h1.address}'\nh2_address: '{h2.address}'\ntls_dir_unused: 1\n"
    )
    assert main(["--config", str(path)]) == 2  # unknown key
    path.write_text(
        f"name: p1\nh1_address: '{h1.address}'\nh2_address: '{h2.address}'\n"
        f"tls: {{cert: {pki / 'p1.pem'}, key: {pki / 'p1.key'}, ca: {pki / 'ca.pem'}}}\n"
        "max_step_epsilon: 10\nbackoff_initial: 0.01\npoll_interval: 0.01\nwait_timeout: 10\n"
    )
    assert main(["--config", str(path), "--set", "max_step_epsilon=0.5"]) == 3  # refusal
    assert main(["--config", str(path)]) == 0  # one round, then training finished
    assert len(h1.servicer.accepted) == 1 and len(h2.servicer.accepted) == 1
    h1.servicer.failure = "model v1 differs between the servers"  # the run stopped: exit 1
    capsys.readouterr()
    assert main(["--config", str(path)]) == 1
    assert "h1 stopped the run: model v1 differs between the servers" in capsys.readouterr().err
    h1.servicer.failure = ""
    h2.servicer.refuse_hello = True  # no longer a registered provider: one line, exit 3
    capsys.readouterr()
    assert main(["--config", str(path)]) == 3
    err = capsys.readouterr().err  # main() logs to stderr (setup_logging)
    assert "Hello to h2 at 127.0.0.1:" in err and "Traceback" not in err
    assert "failed: PERMISSION_DENIED: 'p1' is not a provider" in err

"""Both server daemons in-process (threads) on 127.0.0.1, three providers as a minimal client."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import socket
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from helpers import wait_until

from spgc.learning.gradients import per_example_gradients
from spgc.learning.models import resolve_model, trainable_mask
from spgc.privacy.ledger_verify import verify_ledger
from spgc.protocol.certs import make_dev_pki
from spgc.protocol.sharing import share
from spgc.servers.checkpoint import CheckpointError, history_file_name
from spgc.servers.daemon import (
    FINISHED_GRACE,
    MAX_LOSSES_WITHOUT_PROGRESS,
    PeerLost,
    ServerDaemon,
)
from spgc.settings.config import ServerConfig, TlsPaths
from spgc.settings.config_files import load_server_config
from spgc.wire import aggregation_pb2 as pb
from spgc.wire import aggregation_pb2_grpc, vector_sha256
from spgc.wire.identity import new_submission_id
from spgc.wire.messages import read_model_stream, share_messages
from spgc.wire.tls import TlsFiles
from spgc.wire.transport import make_channel

PROVIDERS = ["p1", "p2", "p3"]
ROLES = {1: pb.SERVER_ROLE_H1, 2: pb.SERVER_ROLE_H2}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    root = tmp_path_factory.mktemp("pki")
    make_dev_pki(root / "good", ["h1", "h2", *PROVIDERS, "x9"])
    make_dev_pki(root / "other", ["p1"])
    return root


def _cfg(pki: Path, role: int, state: Path, **kw) -> ServerConfig:
    name = f"h{role}"
    d = pki / "good"
    base = {
        "role": role,
        "listen": "127.0.0.1:0",
        "peer_listen": "127.0.0.1:0",
        "peer_address": "127.0.0.1:1",
        "peer_name": f"h{3 - role}",
        "gc_address": "127.0.0.1:0",
        "tls": TlsPaths(cert=d / f"{name}.pem", key=d / f"{name}.key", ca=d / "ca.pem"),
        "providers": list(PROVIDERS),
        "dataset": "cancer",
        "min_providers": 2,
        "round_deadline": 3.0,
        "scale": 1024.0,
        "rounds": 2,
        "state_dir": state,
        "connect_timeout": 20.0,
        "max_batch_size": 64,
        # These tests' Provider shares in the ring (docs/CLIENTS.md 4.1); verified inputs, the
        # default in spgc and dng, are tested in test_verified_inputs.py.
        "verify_inputs": "none",
    }
    base.update(kw)
    return ServerConfig(**base)


def bind_pair(pki: Path, tmp: Path, precompute: int | None = None, **kw):
    """H1 and H2 on state directories tmp/s1 and tmp/s2 (kept: a restart reuses them), bound
    and pointed at each other, not started."""
    for sub in ("s1", "s2"):
        (tmp / sub).mkdir(exist_ok=True)
    d1 = ServerDaemon(_cfg(pki, 1, tmp / "s1", **kw), precompute).bind()
    d2 = ServerDaemon(_cfg(pki, 2, tmp / "s2", **kw), precompute).bind()
    d1.cfg.peer_address = f"127.0.0.1:{d2.peer_port}"
    d2.cfg.gc_address = f"127.0.0.1:{d1.gc_port}"
    return d1, d2


def start_pair(pki: Path, tmp: Path, **kw) -> tuple[ServerDaemon, ServerDaemon]:
    d1, d2 = bind_pair(pki, tmp, **kw)
    d2.start()
    d1.start()
    return d1, d2


class Provider:
    """Fetch, share, submit: the least a provider does."""

    def __init__(self, pki: Path, name: str, daemons, ca_dir: str = "good") -> None:
        tls = TlsFiles.from_dir(pki / ca_dir, name)
        self.name = name
        self.stubs = {}
        self.channels = []
        for d in daemons:
            ch = make_channel(f"127.0.0.1:{d.port}", tls, server_name=d.cfg.role_name)
            self.channels.append(ch)
            self.stubs[d.cfg.role] = aggregation_pb2_grpc.AggregatorStub(ch)

    def hello(self, role: int) -> pb.ServerInfo:
        return self.stubs[role].Hello(pb.HelloRequest(protocol_version=1), timeout=10)

    def wait_collecting(self, t: int, timeout: float = 30) -> pb.TrainingConfig:
        end = time.time() + timeout
        while time.time() < end:
            try:
                infos = [self.hello(r) for r in (1, 2)]
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
            else:
                if all(
                    i.round.round == t and i.round.phase == pb.ROUND_PHASE_COLLECTING for i in infos
                ):
                    assert infos[0].config == infos[1].config
                    return infos[0].config
            time.sleep(0.05)
        raise AssertionError(f"round {t} never opened at both servers")

    def fetch(
        self, role: int, part: int = pb.MODEL_PART_TRAINABLE
    ) -> tuple[pb.ModelHeader, np.ndarray]:
        request = pb.ModelRequest(part=part)
        return read_model_stream(self.stubs[role].FetchModel(request, timeout=10))

    def submit(
        self, role, cfg, t, vec, *, sid=None, rnd=None, vector_id=b"", model_version=None,
        encoding=pb.SHARE_ENCODING_UINT64,
    ):  # fmt: skip
        msgs = share_messages(
            vec,
            run_id=cfg.run_id,
            round_number=t if rnd is None else rnd,
            server_role=ROLES[role],
            ring_bits=cfg.ring_bits,
            submission_id=sid or new_submission_id(),
            chunk_bytes=256,
            vector_id=vector_id,
            model_version=model_version,
            encoding=encoding,
        )
        return self.stubs[role].SubmitShare(msgs, timeout=10)

    def submit_both(self, cfg, t, values, roles=(1, 2), encoding=pb.SHARE_ENCODING_UINT64):
        a1, a2 = share(values, cfg.ring_bits)
        vector_id = new_submission_id()
        for role, part in ((1, a1), (2, a2)):
            if role in roles:
                self.submit(role, cfg, t, part, vector_id=vector_id, encoding=encoding)

    def close(self):
        for ch in self.channels:
            ch.close()


def wait_round_done(daemons, t: int, timeout: float = 40) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if all(d.state.round > t for d in daemons):
            return
        for d in daemons:
            assert d.error is None, d.error
        time.sleep(0.05)
    raise AssertionError(f"round {t} did not complete")


def assert_round_used(daemons, t: int, agreed, total, received) -> None:
    """Round t on both servers: the agreed providers, their exact sum, and who each received."""
    for dm, got in zip(daemons, received, strict=True):
        rec = dm.state.history[t]
        assert rec.agreed == agreed and rec.received == got
        np.testing.assert_array_equal(np.asarray(rec.noisy_sum_units, dtype=np.int64), total)


def _error(fn) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as info:
        fn()
    return info.value


def _code(fn) -> grpc.StatusCode:
    return _error(fn).code()


def test_only_mpc_exact_sum_dropouts_and_bad_submissions(pki, tmp_path, caplog):
    caplog.set_level(logging.INFO)
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc")
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        d = cfg.num_parameters
        assert d == 62
        rng = np.random.default_rng(1)
        vecs = [rng.integers(-5000, 5000, d, dtype=np.int64) for _ in PROVIDERS]
        for p, v in zip(providers, vecs, strict=True):
            h1, m1 = p.fetch(1)
            h2, _ = p.fetch(2)
            assert h1.sha256 == h2.sha256 and h1.version == 0
            p.submit_both(cfg, 0, v)
        wait_round_done((d1, d2), 0)
        for dm in (d1, d2):
            rec = dm.state.history[0]
            assert rec.agreed == PROVIDERS
            np.testing.assert_array_equal(
                np.asarray(rec.noisy_sum_units, dtype=np.int64), sum(vecs)
            )
            np.testing.assert_array_equal(rec.gradient, sum(vecs) / 1024.0)
        assert d1.state.history[0].model_sha256 == d2.state.history[0].model_sha256
        h1, m1 = providers[0].fetch(1)
        assert h1.version == 1 and h1.sha256 == vector_sha256(m1)
        assert not np.array_equal(m1, d1.plan.initial_params)

        # Round 1: p3's share reaches H1 only; bad submissions are refused, round goes on.
        cfg = providers[0].wait_collecting(1)
        p1, p2, p3 = providers
        p1.submit_both(cfg, 1, vecs[0])
        assert _code(lambda: p1.submit_both(cfg, 1, vecs[0])) == grpc.StatusCode.ALREADY_EXISTS
        short = np.zeros(d - 1, dtype=np.uint64)
        assert _code(lambda: p2.submit(1, cfg, 1, short)) == grpc.StatusCode.INVALID_ARGUMENT
        zero = np.zeros(d, dtype=np.uint64)
        assert _code(lambda: p2.submit(1, cfg, 1, zero, rnd=0)) == (
            grpc.StatusCode.FAILED_PRECONDITION
        )
        assert _code(lambda: p2.submit(1, cfg, 1, zero, rnd=5)) == (
            grpc.StatusCode.FAILED_PRECONDITION
        )
        # A share computed on the previous model (a stale client) is refused, naming both.
        stale = _error(lambda: p2.submit(1, cfg, 1, zero, model_version=0))
        assert stale.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "computed on model v0; round 1 trains model v1" in stale.details()
        a1, a2 = share(vecs[1], cfg.ring_bits)  # with the model version it was computed on
        p2.submit(1, cfg, 1, a1, model_version=1)
        p2.submit(2, cfg, 1, a2, model_version=1)
        p3.submit_both(cfg, 1, vecs[2], roles=(1,))
        # Unregistered name with a valid certificate; a certificate of another CA.
        x9 = Provider(pki, "x9", (d1,))
        assert _code(lambda: x9.hello(1)) == grpc.StatusCode.PERMISSION_DENIED
        x9.close()
        # p1's certificate, claiming p2 (issue 45, hole 6): refused, logged and audited.
        claim = pb.HelloRequest(protocol_version=1, provider_id="p2")
        assert _code(lambda: p1.stubs[1].Hello(claim, timeout=10)) == (
            grpc.StatusCode.PERMISSION_DENIED
        )
        stranger = Provider(pki, "p1", (d1,), ca_dir="other")
        assert _code(lambda: stranger.hello(1)) == grpc.StatusCode.UNAVAILABLE
        stranger.close()
        wait_round_done((d1, d2), 1)
        # p3 is left out: its share reached H1 only.
        assert_round_used((d1, d2), 1, ["p1", "p2"], vecs[0] + vecs[1], (PROVIDERS, ["p1", "p2"]))
        assert d1.wait(10) and d2.wait(10)
        assert d1.error is None and d2.error is None
        assert d1.state.version == d2.state.version == 2
        info = providers[0].hello(2)
        assert info.round.phase == pb.ROUND_PHASE_FINISHED
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()
    for sub in ("s1", "s2"):  # spill files gone; checkpoint, ledger and exported models stay
        left = sorted(p.name for p in (tmp_path / sub).iterdir())
        expected = ["checkpoint-00000001.npz", "checkpoint-00000002.npz", "checkpoint.json"]
        expected += ["checkpoint.prev.json", "ledger-signing.key"]
        expected.insert(0, "audit.jsonl")
        expected += ["ledger.jsonl", "model.json", "model.safetensors", "models"]
        # and the run's history, one file appended a round at a time (servers.checkpoint)
        assert [n for n in left if n.startswith("history-")] == [
            history_file_name(d1.state.run_id if sub == "s1" else d2.state.run_id)
        ]
        assert [n for n in left if not n.startswith("history-")] == expected, left
        # only-mpc: two releases of the noise-free sum, in the ledger, with no epsilon
        report = verify_ledger(tmp_path / sub / "ledger.jsonl")
        assert (report.steps, report.released, report.epsilon) == (2, 2, None)
        # The finished run is closed (co-signed), and each model names the head it follows.
        assert report.closed
        for name, releases in (("model.json", 2), ("models/v00001.json", 1)):
            head = json.loads((tmp_path / sub / name).read_text())["ledger_head"]
            assert head == {"releases": releases, "chain": report.heads[releases]}
    # Every refused share left a trail on H1: who, which round, which code.
    audit = [json.loads(x) for x in (tmp_path / "s1" / "audit.jsonl").read_text().splitlines()]
    refused = {
        (e["identity"], e.get("round"), e["code"]) for e in audit if e["event"] == "share_refused"
    }
    assert refused == {
        ("p1", 1, "ALREADY_EXISTS"),
        ("p2", 1, "INVALID_ARGUMENT"),  # refused for its header's length, round 1 named
        ("p2", 0, "FAILED_PRECONDITION"),
        ("p2", 5, "FAILED_PRECONDITION"),
        ("p2", 1, "FAILED_PRECONDITION"),  # computed on a stale model
    }, refused
    claims = [(e["identity"], e["claimed"], e["peer"].rsplit(":", 1)[0]) for e in audit
              if e["event"] == "identity_refused"]  # fmt: skip
    assert claims == [("p1", "p2", "ipv4:127.0.0.1")], claims
    assert "refused a call from ipv4:127.0.0.1:" in caplog.text
    assert "(certificate p1) claiming to be 'p2'" in caplog.text
    # ... and a line in the server's log, naming who, the round and why.
    assert "refused a share from p2 for round 5: FAILED_PRECONDITION: round 5 is not open" in (
        caplog.text
    )
    assert "round 1: provider p3 left out: its share reached this server but not" in caplog.text
    # H1's start line names the backend; the round line says its bytes were counted.
    assert "h1 serving on port" in caplog.text
    assert ", backend gc)" in caplog.text.split("h1 serving on port", 1)[1].splitlines()[0]
    assert re.search(r"h1 round 0 -> .* server-to-server bytes \d+ \(counted on the link\)",
                     caplog.text)  # fmt: skip


def test_halves_of_two_vectors_leave_the_provider_out(pki, tmp_path):
    """p3 runs twice at once (or restarted mid-round): H1 holds the first half of one vector,
    H2 the second half of another. Their difference is a random vector, so the servers leave
    p3 out (ShareHeader.vector_id) and the round's sum stays exact; the summary and audit log
    say why. Where a provider sends no vector id, nothing is checked."""
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", rounds=2)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        rng = np.random.default_rng(2)
        vecs = [rng.integers(-5000, 5000, cfg.num_parameters, dtype=np.int64) for _ in range(4)]
        p1, p2, p3 = providers
        p1.submit_both(cfg, 0, vecs[0])
        p2.submit_both(cfg, 0, vecs[1])
        first, _ = share(vecs[2], cfg.ring_bits)
        _, second = share(vecs[3], cfg.ring_bits)
        p3.submit(1, cfg, 0, first, vector_id=b"A" * 16)
        p3.submit(2, cfg, 0, second, vector_id=b"B" * 16)
        wait_round_done((d1, d2), 0)
        assert_round_used((d1, d2), 0, ["p1", "p2"], vecs[0] + vecs[1], (PROVIDERS, PROVIDERS))
        for dm in (d1, d2):
            why = dm.state.history[0].left_out["p3"]
            assert "halves of different vectors" in why
            assert dm.state.summary()["history"][0]["left_out"] == {"p3": why}
        for role in (1, 2):  # each provider can learn whether its share is in the sum
            status = p3.stubs[role].RoundStatus(pb.RoundStatusRequest(round=0), timeout=5)
            assert status.caller_share_accepted  # this server took it ...
            assert "halves of different vectors" in status.caller_left_out  # ... but unused
            status = p1.stubs[role].RoundStatus(pb.RoundStatusRequest(round=0), timeout=5)
            assert status.caller_share_accepted and status.caller_left_out == ""

        # Round 1: shares without vector ids (a client predating the field) are not checked;
        # a vector id in one half only does not match the other half's none.
        cfg = providers[0].wait_collecting(1)
        for p, v in zip(providers, vecs, strict=False):
            a1, a2 = share(v, cfg.ring_bits)
            p.submit(1, cfg, 1, a1, vector_id=b"C" * 16 if p is p3 else b"")
            p.submit(2, cfg, 1, a2)
        wait_round_done((d1, d2), 1)
        assert_round_used((d1, d2), 1, ["p1", "p2"], vecs[0] + vecs[1], (PROVIDERS, PROVIDERS))
        assert d1.wait(10) and d2.wait(10) and d1.error is None and d2.error is None
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()
    for sub in ("s1", "s2"):
        audit = [json.loads(x) for x in (tmp_path / sub / "audit.jsonl").read_text().splitlines()]
        dropped = [e for e in audit if e["event"] == "provider_dropped"]
        assert [(e["identity"], e["round"]) for e in dropped] == [("p3", 0), ("p3", 1)]
        assert all("halves of different vectors" in e["reason"] for e in dropped)


def test_a_provider_cut_off_mid_upload_is_left_out_and_the_round_completes(pki, tmp_path):
    """p3 sends H1 its whole share but its upload to H2 breaks off after one chunk (the client
    cancels, as a dropped connection does): both servers leave p3 out of the round, which
    completes with p1 and p2; the refusals are in the audit log."""
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", rounds=1)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        rng = np.random.default_rng(2)
        vecs = [rng.integers(-5000, 5000, cfg.num_parameters, dtype=np.int64) for _ in PROVIDERS]
        p1, p2, p3 = providers
        p1.submit_both(cfg, 0, vecs[0])
        a1, a2 = share(vecs[2], cfg.ring_bits)
        p3.submit(1, cfg, 0, a1)
        msgs = share_messages(
            a2,
            run_id=cfg.run_id,
            round_number=0,
            server_role=ROLES[2],
            ring_bits=cfg.ring_bits,
            submission_id=new_submission_id(),
            chunk_bytes=64,
        )
        hold = threading.Event()

        def cut_short():
            yield next(msgs)  # the header
            yield next(msgs)  # one chunk of the payload
            hold.wait(30)  # then nothing more: the connection drops

        upload = p3.stubs[2].SubmitShare.future(cut_short(), timeout=30)
        wait_until(  # cut off mid-upload: once its first chunk is in at h2, not after 0.5 s
            lambda: (d2.state.intake.values_in_flight("p3") or 0) > 0, "p3's first chunk at h2"
        )
        upload.cancel()
        hold.set()
        p2.submit_both(cfg, 0, vecs[1])
        assert d1.wait(30) and d2.wait(30)
        assert d1.error is None and d2.error is None
        assert_round_used((d1, d2), 0, ["p1", "p2"], vecs[0] + vecs[1], (PROVIDERS, ["p1", "p2"]))
        assert d1.state.history[0].model_sha256 == d2.state.history[0].model_sha256
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()
    audit = [json.loads(x) for x in (tmp_path / "s1" / "audit.jsonl").read_text().splitlines()]
    dropped = [e for e in audit if e["event"] == "provider_dropped"]
    assert [(e["identity"], e["round"]) for e in dropped] == [("p3", 0)]


def test_spgc_round_advances_model_and_skips_small_round(pki, tmp_path):
    d1, d2 = start_pair(
        pki, tmp_path, mode="spgc", rounds=2, target_epsilon=8.0, round_deadline=2.0
    )
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        assert cfg.noise_std_units > 0 and cfg.mode == pb.MODE_SPGC
        vecs = [np.full(cfg.num_parameters, 100 * (i + 1), dtype=np.int64) for i in range(3)]
        for p, v in zip(providers, vecs, strict=True):
            p.submit_both(cfg, 0, v)
        wait_round_done((d1, d2), 0, timeout=50)
        r1, r2 = d1.state.history[0], d2.state.history[0]
        assert r1.model_sha256 == r2.model_sha256
        np.testing.assert_array_equal(
            np.asarray(r1.noisy_sum_units, dtype=np.int64),
            np.asarray(r2.noisy_sum_units, dtype=np.int64),
        )
        assert not np.array_equal(np.asarray(r1.noisy_sum_units, dtype=np.int64), sum(vecs))
        assert set(r1.seed_commitments) == {"h1", "h2"}
        assert d1.state.epsilon() > 0
        # Round 1: one provider only (< min_providers): skipped, not accounted.
        eps = d1.state.epsilon()
        cfg = providers[0].wait_collecting(1)
        providers[0].submit_both(cfg, 1, vecs[0])
        assert d1.wait(20) and d2.wait(20)
        assert d1.error is None and d2.error is None
        for dm in (d1, d2):
            assert dm.state.history[1].phase == pb.ROUND_PHASE_ABORTED
            assert dm.state.version == 1 and dm.state.steps == 1
        assert d1.state.epsilon() == eps
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_model_hash_mismatch_stops_both_servers(pki, tmp_path):
    """If the two servers' updates ever differ, neither publishes and both stop loudly."""
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", rounds=3)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        d2.state.optimizer.lr *= 2  # a silent divergence (a bug, a corrupted state...)
        vecs = [np.full(cfg.num_parameters, 10 * (i + 1), dtype=np.int64) for i in range(3)]
        for p, v in zip(providers, vecs, strict=True):
            p.submit_both(cfg, 0, v)
        assert d1.wait(30) and d2.wait(30)
        assert "model v1 differs between the servers" in str(d1.error)
        assert "model v1 differs between the servers" in str(d2.error)
        for dm in (d1, d2):
            assert dm.state.version == 0 and dm.state.steps == 0  # nothing published
        for role in (1, 2):  # providers hear that the run stopped on an error, and why
            info = providers[0].stubs[role].RoundStatus(pb.RoundStatusRequest(), timeout=10)
            assert info.phase == pb.ROUND_PHASE_FINISHED
            assert "differs between the servers" in info.failure
        header, _ = providers[0].fetch(1)
        assert header.version == 0
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_resume_needs_both_checkpoints(pki, tmp_path):
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", rounds=3)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        for t in (0, 1):
            cfg = providers[0].wait_collecting(t)
            vecs = [np.full(cfg.num_parameters, 10 * (i + 1), dtype=np.int64) for i in range(3)]
            for p, v in zip(providers, vecs, strict=True):
                p.submit_both(cfg, t, v)
            wait_round_done((d1, d2), t)
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()
    for name in ("checkpoint.json", "checkpoint.prev.json"):  # H2 lost its checkpoints ...
        (tmp_path / "s2" / name).unlink()
    with pytest.raises(CheckpointError, match="has no checkpoint, but its ledger records 2 rel"):
        ServerDaemon(_cfg(pki, 2, tmp_path / "s2", mode="only-mpc", rounds=3))
    (tmp_path / "s2" / "ledger.jsonl").unlink()  # ... and its ledger: it starts afresh
    a, b = bind_pair(pki, tmp_path, mode="only-mpc", rounds=3)
    assert a.state.round == 2 and b.state.round == 0
    try:
        b.start()
        a.start()
        assert a.wait(30) and b.wait(30)
        for daemon in (a, b):  # H2's ledger counts none of the run's releases: refused
            assert "count different releases of the run: h1 2, h2 0" in str(daemon.error)
    finally:
        a.stop()
        b.stop()


def test_config_yaml_and_overrides(tmp_path):
    f = tmp_path / "server.yaml"
    f.write_text("role: 2\ninsecure: true\nproviders: [a, b]\nrounds: 3\nmode: only-mpc\n")
    cfg = load_server_config(f, ["rounds=7", "lr=0.5", "providers=a,b,c"], listen="x:1")
    assert (cfg.role, cfg.rounds, cfg.lr, cfg.providers, cfg.listen) == (
        2,
        7,
        0.5,
        ["a", "b", "c"],
        "x:1",
    )
    with pytest.raises(ValueError, match="rounds"):
        load_server_config(f, ["rounds=0"])
    with pytest.raises(ValueError, match="unknown"):
        load_server_config(f, ["bogus=1"])
    with pytest.raises(ValueError, match="insecure"):
        load_server_config(f, ["insecure=false"])


def test_h2_stops_when_h1_disappears(pki, tmp_path):
    """H2 never hangs: it notices H1 is gone, waits peer_timeout seconds for it to come
    back, then stops with an error naming the wait."""
    d1, d2 = start_pair(pki, tmp_path, peer_timeout=4.0, round_deadline=1.0, rounds=50)
    try:
        deadline = time.monotonic() + 20
        while not d2.state.ready and time.monotonic() < deadline:
            time.sleep(0.1)
        assert d2.state.ready
        d1.stop()  # H1 vanishes between calls
        provider = Provider(pki, "p1", (d1, d2))
        try:  # H2 notices (its probe of H1's pairing) and tells providers it waits for H1
            phase = None
            end = time.monotonic() + 10
            while phase != pb.ROUND_PHASE_WAITING_FOR_PEER and time.monotonic() < end:
                phase = provider.hello(2).round.phase
                time.sleep(0.1)
            assert phase == pb.ROUND_PHASE_WAITING_FOR_PEER
        finally:
            provider.close()
        assert d2.wait(timeout=20), "H2 hung after H1 disappeared"
        assert isinstance(d2.error, TimeoutError)
        assert "no handshake from h1" in str(d2.error)
        audit = (tmp_path / "s2" / "audit.jsonl").read_text().splitlines()
        assert "peer_lost" in [json.loads(line)["event"] for line in audit]
    finally:
        d1.stop()
        d2.stop()


def test_a_finished_server_lingers_until_its_providers_were_told(pki, tmp_path):
    """After the last round a server keeps answering (linger) until every provider that
    called it was answered ROUND_PHASE_FINISHED: one still computing then learns the end
    instead of finding no server; at most the linger's timeout."""
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", rounds=1)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS[:2]]
    try:
        cfg = providers[0].wait_collecting(0)
        providers[1].hello(1)
        for i, p in enumerate(providers):
            p.submit_both(cfg, 0, np.full(cfg.num_parameters, i + 1, dtype=np.int64))
        assert d1.wait(30) and d1.error is None and d1.state.finished
        ended: list[float] = []

        def linger() -> None:
            d1.linger(timeout=20.0)
            ended.append(time.monotonic())

        lingered = threading.Thread(target=linger)
        lingered.start()
        assert providers[0].hello(1).round.phase == pb.ROUND_PHASE_FINISHED
        time.sleep(1.0)
        assert lingered.is_alive()  # p2 has not been told yet
        assert providers[1].hello(1).round.phase == pb.ROUND_PHASE_FINISHED
        # Everyone was told; for FINISHED_GRACE s more a provider can ask how its last
        # round ended (here: its share is in the sum).
        last = providers[1].stubs[1].RoundStatus(pb.RoundStatusRequest(round=0), timeout=5)
        assert last.phase == pb.ROUND_PHASE_PUBLISHED and last.caller_left_out == ""
        lingered.join(10)
        assert not lingered.is_alive()
        # measured from when the server told p2 (its own clock), not from a fixed sleep of
        # the test's that a slow machine stretches past the grace
        told = d1.state.last_told_finished
        assert FINISHED_GRACE <= ended[0] - told < FINISHED_GRACE + 2
        start = time.monotonic()
        d1.linger(timeout=30.0)  # nobody left to tell: at once, not after the timeout
        assert time.monotonic() - start < 10
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_h1_alone_tells_providers_it_is_not_paired_yet(pki, tmp_path):
    """Until H2 agreed to the run, H1 announces none: Hello is UNAVAILABLE, as at H2."""
    d1, d2 = bind_pair(pki, tmp_path)
    d1.start()
    provider = Provider(pki, "p1", (d1, d2))
    try:
        time.sleep(1.0)  # H1 is calling H2's Handshake meanwhile
        with pytest.raises(grpc.RpcError) as early:
            provider.hello(1)
        assert early.value.code() == grpc.StatusCode.UNAVAILABLE
        assert "handshake" in early.value.details()
        d2.start()
        provider.wait_collecting(0)  # paired: both answer
    finally:
        provider.close()
        d1.stop()
        d2.stop()


def test_the_first_round_waits_for_min_providers_and_keeps_h2_waiting(pki, tmp_path):
    """first_round_wait: round 0 opens only once min_providers providers have called H1, and
    H2 (peer_timeout 2 s) stays paired through a longer wait (H1 calls it meanwhile)."""
    d1, d2 = start_pair(
        pki, tmp_path, mode="only-mpc", first_round_wait=60.0, peer_timeout=2.0, round_deadline=1.5,
        rounds=1,
    )
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS[:2]]
    try:
        end = time.monotonic() + 20
        while not d1.state.ready and time.monotonic() < end:
            time.sleep(0.1)
        info = None
        end = time.monotonic() + 5  # longer than H2's peer_timeout
        while time.monotonic() < end:
            try:
                info = providers[0].hello(1).round
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNAVAILABLE  # not paired yet
            time.sleep(0.2)
        assert info is not None and info.phase == pb.ROUND_PHASE_UNSPECIFIED  # not open
        assert d2.error is None and not d2.wait(0)  # H2 still there, waiting with H1
        audit = (tmp_path / "s2" / "audit.jsonl").read_text().splitlines()
        assert "peer_lost" not in [json.loads(line)["event"] for line in audit]
        assert d1.state.providers_present() == ["p1"]
        cfg = providers[1].wait_collecting(0, timeout=10)  # the second provider: it opens
        for i, p in enumerate(providers):
            p.submit_both(cfg, 0, np.full(cfg.num_parameters, i + 1, dtype=np.int64))
        assert d1.wait(30) and d2.wait(30)
        assert d1.error is None and d2.error is None
        assert d1.state.steps == 1  # round 0 ran with both providers
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_the_first_round_opens_anyway_after_first_round_wait(pki, tmp_path):
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", first_round_wait=1.5, rounds=1)
    provider = Provider(pki, "p1", (d1, d2))
    try:
        provider.wait_collecting(0, timeout=20)  # one provider only: opens after 1.5 s
        assert d1.wait(30) and d1.error is not None  # the one round was skipped
        assert "no round had the shares of min_providers" in str(d1.error)
    finally:
        provider.close()
        d1.stop()
        d2.stop()


def test_providers_that_decline_end_the_first_round_wait_at_both_servers(pki, tmp_path):
    """first_round_wait 60 s, min_providers 2: p2 and p3 decline the plan (DeclinePlan, as a
    provider whose budget is spent does), then p1 calls. Every provider has called and one
    remains: both servers end the run at once, naming each decliner and its reason, audited."""
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", first_round_wait=60.0, rounds=1)
    providers = {n: Provider(pki, n, (d1, d2)) for n in PROVIDERS}
    reasons = {"p2": "this data set has spent epsilon 8: 16 > max_total_epsilon 10",
               "p3": "accepts only the modes dng"}  # fmt: skip
    try:
        wait_until(lambda: d1.state.ready and d2.state.ready, "the servers to pair")
        for name in ("p2", "p3", "p1"):  # never two providers present: round 0 stays shut
            run_id = providers[name].hello(1).config.run_id
            providers[name].hello(2)
            if name in reasons:
                request = pb.DeclineRequest(run_id=run_id, reason=reasons[name])
                for role in (1, 2):
                    providers[name].stubs[role].DeclinePlan(request, timeout=10)
        assert d1.wait(20) and d2.wait(20)  # not the 60 s of first_round_wait
        said = (
            "round 0 cannot open: 2 of the plan's 3 providers declined it, leaving 1 (p1) < "
            f"min_providers=2: p2: {reasons['p2']}; p3: {reasons['p3']}"
        )
        assert str(d1.error) == said and str(d2.error) == said
        for state_dir in ("s1", "s2"):
            audit = [json.loads(line) for line in (tmp_path / state_dir / "audit.jsonl").open()]
            (ended,) = [e for e in audit if e["event"] == "providers_declined"]
            assert ended["reason"] in said
    finally:
        for p in providers.values():
            p.close()
        d1.stop()
        d2.stop()


def test_h2_answers_the_last_round_before_it_stops(pki, tmp_path, monkeypatch):
    """H2 logs, evaluates and checkpoints the last round after it is finished; stopping H2 as
    soon as it is done must not cut H1's CheckModel call short (H2 publishes in it)."""
    from spgc.servers import peer

    real = peer.log_round

    def slow_log_round(state, rec):
        time.sleep(2.0)  # a big model's test evaluation and checkpoint
        real(state, rec)

    monkeypatch.setattr(peer, "log_round", slow_log_round)
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", rounds=1)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        for i, p in enumerate(providers):
            p.submit_both(cfg, 0, np.full(cfg.num_parameters, i, dtype=np.int64))
        assert d2.wait(30)
        d2.stop()  # what `spgc server` does the moment the daemon is done
        assert d1.wait(30)
        assert d1.error is None and d2.error is None
        assert d1.state.steps == d2.state.steps == 1
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_round_status_long_poll_answers_when_the_next_round_opens(pki, tmp_path):
    d1, d2 = start_pair(pki, tmp_path, mode="only-mpc", rounds=2)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        req = pb.RoundStatusRequest(wait_seconds=20, after_round=0)
        start = time.monotonic()
        waiting = threading.Thread(
            target=lambda: answers.append(providers[0].stubs[1].RoundStatus(req, timeout=30))
        )
        answers: list[pb.RoundInfo] = []
        waiting.start()
        time.sleep(0.5)
        assert not answers  # held: round 0 is still the one collecting
        for i, p in enumerate(providers):
            p.submit_both(cfg, 0, np.full(cfg.num_parameters, i, dtype=np.int64))
        waiting.join(25)
        assert answers and answers[0].round == 1
        assert answers[0].phase == pb.ROUND_PHASE_COLLECTING
        assert time.monotonic() - start < 15
        # without wait_seconds the answer is immediate (what older providers do)
        now = providers[0].stubs[1].RoundStatus(pb.RoundStatusRequest(), timeout=5)
        assert now.round == 1
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_a_round_over_three_data_link_lanes(pki, tmp_path):
    """gc_lanes = 3: three connections between the servers, the round's coordinates split
    over them; both servers release the same noisy sum."""
    d1, d2 = start_pair(pki, tmp_path, mode="spgc", rounds=1, target_epsilon=8.0, gc_lanes=3)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        vecs = [np.full(cfg.num_parameters, 50 * (i + 1), dtype=np.int64) for i in range(3)]
        for p, v in zip(providers, vecs, strict=True):
            p.submit_both(cfg, 0, v)
        wait_round_done((d1, d2), 0, timeout=50)
        r1, r2 = d1.state.history[0], d2.state.history[0]
        assert r1.model_sha256 == r2.model_sha256
        np.testing.assert_array_equal(
            np.asarray(r1.noisy_sum_units, dtype=np.int64),
            np.asarray(r2.noisy_sum_units, dtype=np.int64),
        )
        assert len(d1._gc_channels) == len(d2._gc_channels) == 3
        for dm in (d1, d2):  # every lane carried part of the round
            assert all(ch.counters()["tables"]["sent" if dm is d1 else "received"] > 0
                       for ch in dm._gc_channels)  # fmt: skip
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_different_lane_counts_stop_both_servers_with_a_clear_error(pki, tmp_path):
    d1, d2 = bind_pair(pki, tmp_path, mode="spgc", rounds=1, target_epsilon=8.0, gc_lanes=2)
    d2.cfg.gc_lanes = 1
    d2.start()
    d1.start()
    try:
        assert d1.wait(40) and d2.wait(40)
        for dm in (d1, d2):
            assert "gc_lanes differ" in str(dm.error)
    finally:
        d1.stop()
        d2.stop()


def test_gc_address_at_a_grpc_port_names_the_likely_cause(pki, tmp_path, caplog):
    """H2 dialing H1's providers' port (also TLS with H1's certificate) as its data link: both
    servers stop after connect_timeout saying which setting to check, and H2 says so while
    it still retries."""
    d1, d2 = bind_pair(pki, tmp_path, mode="spgc", rounds=1, connect_timeout=4.0)
    d2.cfg.gc_address = f"127.0.0.1:{d1.port}"
    d2.start()
    d1.start()
    try:
        assert d1.wait(40) and d2.wait(40)
        assert "h2 never dialed it" in str(d1.error)
        assert "no data link to h1 at gc_address" in str(d2.error)
        said = [r.getMessage() for r in caplog.records if "not open yet" in r.getMessage()]
        assert any("gc_address must be H1's gc_address" in m for m in said), said
    finally:
        d1.stop()
        d2.stop()


def test_a_peer_lost_again_and_again_without_progress_stops_the_server(pki, tmp_path):
    """A peer that pairs but never lets a round finish (frozen in a call, failing each time)
    is waited for MAX_LOSSES_WITHOUT_PROGRESS times; then H1 stops instead of running the
    round (and spending a release) once more."""
    d1, d2 = bind_pair(pki, tmp_path)
    attempts = []

    def lost_every_time(session, deadline):
        attempts.append(d1.state.round)
        raise PeerLost("h2 stopped answering")

    d1._run_h1 = lost_every_time
    d1._reset_for_peer = lambda reason: None
    try:
        with pytest.raises(RuntimeError, match="lost h2 4 times in a row without a model update"):
            d1._run_paired()
        assert len(attempts) == MAX_LOSSES_WITHOUT_PROGRESS + 1
    finally:
        d1.stop()
        d2.stop()


@pytest.mark.parametrize("key", ["listen", "peer_listen", "gc_address"])
def test_a_port_in_use_is_named_by_its_key(pki, tmp_path, key):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        daemon = ServerDaemon(_cfg(pki, 1, tmp_path, **{key: address}))
        with pytest.raises(OSError, match=f"^{key}: "):
            daemon.bind()
        daemon.stop()


def test_servers_with_their_own_certificate_names(tmp_path):
    """Certificates need not be named h1/h2: each server announces the name in its own
    certificate (ServerInfo.server_name), the one a provider's h1_name/h2_name expects."""
    names = ("agg-a", "agg-b")
    make_dev_pki(tmp_path / "pki", [*names, "p1"])
    d = tmp_path / "pki"
    daemons = []
    for role, (own, other) in ((1, names), (2, names[::-1])):
        tls = TlsPaths(cert=d / f"{own}.pem", key=d / f"{own}.key", ca=d / "ca.pem")
        (tmp_path / own).mkdir()
        cfg = _cfg(d.parent, role, tmp_path / own, tls=tls, peer_name=other)
        daemons.append(ServerDaemon(cfg).bind())
    d1, d2 = daemons
    d1.cfg.peer_address = f"127.0.0.1:{d2.peer_port}"
    d2.cfg.gc_address = f"127.0.0.1:{d1.gc_port}"
    d2.start()
    d1.start()
    tls = TlsFiles.from_dir(d, "p1")
    try:
        for daemon, name in zip(daemons, names, strict=True):
            channel = make_channel(f"127.0.0.1:{daemon.port}", tls, server_name=name)
            end = time.monotonic() + 30
            try:
                while True:  # UNAVAILABLE until the servers' handshake is done
                    try:
                        info = aggregation_pb2_grpc.AggregatorStub(channel).Hello(
                            pb.HelloRequest(protocol_version=1), timeout=10
                        )
                        break
                    except grpc.RpcError as exc:
                        if "handshake" not in (exc.details() or "") or time.monotonic() > end:
                            raise
                        time.sleep(0.1)
            finally:
                channel.close()
            assert info.server_name == name and info.provider_id == "p1"
    finally:
        d1.stop()
        d2.stop()


def test_a_frozen_layer_never_moves(pki, tmp_path):
    """A user's model with a frozen layer (requires_grad=False): only the 11 trained
    coordinates travel (the plan, the shares, the model vector and its hash); the servers
    serve the 12 frozen ones once, hash-checked; their update leaves the layer as it was and
    the other layers train."""
    factory = tmp_path / "frozen.py"
    factory.write_text(
        "from torch import nn\n\n\ndef frozen_first():\n"
        "    m = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))\n"
        "    m[0].weight.requires_grad_(False)\n    return m\n"
    )
    model = resolve_model(f"{factory}:frozen_first", seed=0)
    frozen = ~trainable_mask(model)
    assert frozen.tolist() == [True] * 12 + [False] * 11
    grads = per_example_gradients(model, np.ones((3, 4), np.float32), np.array([0, 1, 1]))
    assert grads.shape == (3, 11) and grads.any()  # the trained coordinates only

    d1, d2 = start_pair(
        pki, tmp_path, mode="only-mpc", rounds=1, dataset="", model=f"{factory}:frozen_first"
    )
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        start = d1.state.params.copy()
        cfg = providers[0].wait_collecting(0)
        assert (cfg.num_parameters, cfg.model_parameters) == (11, 23)
        assert [(r.start, r.length) for r in cfg.trainable] == [(12, 11)]
        frozen_part = providers[0].fetch(1, pb.MODEL_PART_FROZEN)[1]
        assert np.array_equal(frozen_part, start[:12])
        assert hashlib.sha256(frozen_part.astype("<f8").tobytes()).digest() == cfg.frozen_sha256
        header, trained = providers[0].fetch(2)
        assert header.sha256 == providers[0].hello(2).round.model_sha256
        assert np.array_equal(trained, start[12:])
        for p in providers:
            p.submit_both(cfg, 0, np.full(11, 500, dtype=np.int64))
        wait_round_done((d1, d2), 0)
        for d in (d1, d2):
            after = d.state.params
            assert np.array_equal(after[frozen], start[frozen])
            assert not np.any(after[~frozen] == start[~frozen])
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()

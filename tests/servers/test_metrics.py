"""Both servers with metrics ports: /readyz before and after pairing, two rounds, a scrape of
/metrics parsed with prometheus-client's own parser."""

from __future__ import annotations

import urllib.error
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_server_daemon import PROVIDERS, Provider, bind_pair, wait_round_done

from spgc import __version__
from spgc.protocol.certs import make_dev_pki
from spgc.servers.metrics import SHARE_ENCODINGS, ServerMetrics
from spgc.servers.state import RoundRecord
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.chunks import packed_width
from spgc.wire.tls import TlsFiles
from spgc.wire.transport import make_channel


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    make_dev_pki(root / "good", ["h1", "h2", *PROVIDERS, "x9"])
    return root


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    status, text = _get(port, "/metrics")
    assert status == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def _aggregator_health(pki: Path, daemon) -> int:
    tls = TlsFiles.from_dir(pki / "good", "p1")
    channel = make_channel(f"127.0.0.1:{daemon.port}", tls, server_name=daemon.cfg.role_name)
    try:
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service="spgc.v1.Aggregator")
        return stub.Check(request, timeout=10).status
    finally:
        channel.close()


def test_metrics_readiness_and_counters_over_two_rounds(pki: Path, tmp_path: Path) -> None:
    d1, d2 = bind_pair(
        pki, tmp_path, mode="spgc", rounds=2, target_epsilon=8.0, round_deadline=2.0,
        metrics_port=0, tensorboard_dir=tmp_path / "tb",
    )  # fmt: skip
    providers: list[Provider] = []
    try:
        for d in (d1, d2):
            assert d.metrics_port > 0
            assert _get(d.metrics_port, "/healthz") == (200, "ok\n")
            status, body = _get(d.metrics_port, "/readyz")
            assert status == 503 and "not agreed on the plan" in body
        d2.start()
        d1.start()
        providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
        cfg = providers[0].wait_collecting(0)
        for d in (d1, d2):
            assert _get(d.metrics_port, "/readyz") == (200, "ready\n")
            assert _aggregator_health(pki, d) == health_pb2.HealthCheckResponse.SERVING
        stranger = Provider(pki, "x9", (d1,))
        with pytest.raises(grpc.RpcError) as refused:
            stranger.hello(1)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        stranger.close()

        vec = np.arange(cfg.num_parameters, dtype=np.int64)
        for p in providers:
            p.submit_both(cfg, 0, vec)
        wait_round_done((d1, d2), 0, timeout=50)
        cfg = providers[0].wait_collecting(1)
        providers[0].submit_both(cfg, 1, vec)
        providers[1].submit_both(cfg, 1, vec, encoding=pb.SHARE_ENCODING_PACKED)
        providers[2].submit_both(cfg, 1, vec, roles=(1,))  # H2 never gets it: dropped
        assert d1.wait(40) and d2.wait(40)
        assert d1.error is None and d2.error is None

        for d in (d1, d2):
            m = _scrape(d.metrics_port)
            assert m[("spgc_rounds_completed_total", ())] == 2
            for phase in ("intake", "agree", "circuit", "update", "checkpoint"):
                assert m[("spgc_round_duration_seconds_count", (("phase", phase),))] == 2
            assert m[("spgc_providers_in_round", ())] == 2
            assert m[("spgc_peer_bytes_total", (("direction", "sent"),))] > 0
            assert m[("spgc_peer_bytes_total", (("direction", "received"),))] > 0
            assert 0 < m[("spgc_epsilon_spent", ())] <= m[("spgc_epsilon_budget", ())] == 8.0
            assert m[("process_cpu_seconds_total", ())] > 0
            assert m[("spgc_ready", ())] == 0  # training is over
            assert m[("spgc_rounds_skipped_total", ())] == 0
            assert m[("spgc_round", ())] == 2 and m[("spgc_rounds_planned", ())] == 2
            assert m[("spgc_releases_counted", ())] == 2  # the ledger's count
            role = (("mode", "spgc"), ("role", d.cfg.role_name), ("version", __version__))
            assert m[("spgc_info", role)] == 1
            status, body = _get(d.metrics_port, "/readyz")
            assert status == 503 and "training is finished" in body
        m1, m2 = _scrape(d1.metrics_port), _scrape(d2.metrics_port)
        assert m1[("spgc_providers_dropped_total", ())] == 1  # p3's share reached H1 only
        assert m2[("spgc_providers_dropped_total", ())] == 0
        assert m1[("spgc_requests_refused_total", (("reason", "PERMISSION_DENIED"),))] == 1
        # Shares in: H1 got 5 as uint64 (p3's dropped one too) and 1 packed, H2 4 and 1.
        width = packed_width(cfg.ring_bits)
        for m, uint64_shares in ((m1, 5), (m2, 4)):
            counts = {
                e: m[("spgc_shares_accepted_total", (("encoding", e),))] for e in SHARE_ENCODINGS
            }
            assert counts == {"uint64": uint64_shares, "packed": 1, "field": 0, "seed": 0}
            assert m[("spgc_share_bytes_received_total", (("encoding", "uint64"),))] == (
                uint64_shares * 8 * cfg.num_parameters
            )
            assert m[("spgc_share_bytes_received_total", (("encoding", "packed"),))] == (
                width * cfg.num_parameters
            )
        assert m1[("spgc_epsilon_spent", ())] == pytest.approx(d1.state.epsilon())

        # The same rounds as TensorBoard curves, one run per server.
        for d in (d1, d2):
            (run,) = (tmp_path / "tb" / d.cfg.role_name).iterdir()  # one run: its own dir
            assert run.name == f"run-{d.state.run_id}"
            curves = EventAccumulator(str(run))
            curves.Reload()
            scalars = {tag: curves.Scalars(tag) for tag in curves.Tags()["scalars"]}
            assert [e.step for e in scalars["privacy/epsilon_spent"]] == [0, 1]
            assert scalars["privacy/epsilon_spent"][-1].value == pytest.approx(d.state.epsilon())
            assert [e.value for e in scalars["providers/in_round"]] == [3, 2]
            assert scalars["test/accuracy"][-1].value == pytest.approx(
                d.state.history[1].test_accuracy
            )
            for phase in ("intake", "agree", "circuit", "update", "checkpoint"):
                assert len(scalars[f"round_seconds/{phase}"]) == 2
            assert all(e.value > 0 for e in scalars["peer_bytes/sent"])
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_skipped_rounds_and_declined_plans_are_counted() -> None:
    metrics = ServerMetrics(epsilon=lambda: None, epsilon_budget=None)
    metrics.observe_round(RoundRecord(0, pb.ROUND_PHASE_ABORTED, reason="too few providers"))
    metrics.on_audit("plan_declined", {"identity": "p1", "reason": "epsilon too high"})
    metrics.on_audit("refused", {"code": "PERMISSION_DENIED"})
    text = generate_latest(metrics.registry).decode()
    values = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert values[("spgc_rounds_skipped_total", ())] == 1
    assert values[("spgc_rounds_completed_total", ())] == 0
    assert values[("spgc_plans_declined_total", ())] == 1
    assert values[("spgc_requests_refused_total", (("reason", "PERMISSION_DENIED"),))] == 1

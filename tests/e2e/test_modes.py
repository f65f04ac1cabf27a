"""Modes plain, ldp (one server) and dng (two servers, no circuit) with in-process daemons."""

from __future__ import annotations

import math
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_server_daemon import PROVIDERS, Provider, _cfg, start_pair, wait_round_done

from spgc.privacy.ledger_verify import verify_ledger
from spgc.protocol.certs import make_dev_pki
from spgc.protocol.sharing import ring_mask
from spgc.providers.client import ProviderClient
from spgc.servers.coordinator import dng_exchange
from spgc.servers.daemon import ServerDaemon
from spgc.settings.plan import make_plan
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.identity import new_submission_id
from spgc.wire.messages import share_messages


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pki")
    make_dev_pki(root / "good", ["h1", "h2", *PROVIDERS])
    return root


def start_single(pki: Path, tmp: Path, **kw: object) -> ServerDaemon:
    (tmp / "s1").mkdir()
    return ServerDaemon(_cfg(pki, 1, tmp / "s1", **kw)).start()


def wait_single_collecting(p: Provider, t: int, timeout: float = 20) -> pb.TrainingConfig:
    end = time.time() + timeout
    while time.time() < end:
        info = p.hello(1)
        assert info.role == pb.SERVER_ROLE_SINGLE
        if info.round.round == t and info.round.phase == pb.ROUND_PHASE_COLLECTING:
            return info.config
        time.sleep(0.05)
    raise AssertionError(f"round {t} never opened")


def submit_clear(p: Provider, cfg: pb.TrainingConfig, t: int, values: np.ndarray) -> None:
    vec = values.astype(np.int64).view(np.uint64) & ring_mask(cfg.ring_bits)
    msgs = share_messages(
        vec,
        run_id=cfg.run_id,
        round_number=t,
        server_role=pb.SERVER_ROLE_SINGLE,
        ring_bits=cfg.ring_bits,
        submission_id=new_submission_id(),
        chunk_bytes=256,
    )
    p.stubs[1].SubmitShare(msgs, timeout=10)


def test_single_server_modes_refuse_role_two(pki: Path, tmp_path: Path) -> None:
    for mode in ("plain", "ldp"):
        with pytest.raises(ValueError, match="ONE server"):
            _cfg(pki, 2, tmp_path, mode=mode)


def test_plain_gradient_is_the_exact_sum(pki: Path, tmp_path: Path) -> None:
    d1 = start_single(pki, tmp_path, mode="plain", rounds=1)
    providers = [Provider(pki, n, (d1,)) for n in PROVIDERS]
    try:
        cfg = wait_single_collecting(providers[0], 0)
        assert cfg.mode == pb.MODE_PLAIN and cfg.noise_std_units == 0
        rng = np.random.default_rng(3)
        vecs = [rng.integers(-5000, 5000, cfg.num_parameters, dtype=np.int64) for _ in PROVIDERS]
        for p, v in zip(providers, vecs, strict=True):
            submit_clear(p, cfg, 0, v)
        assert d1.wait(20) and d1.error is None
        rec = d1.state.history[0]
        assert rec.agreed == PROVIDERS
        np.testing.assert_array_equal(np.asarray(rec.noisy_sum_units), sum(vecs))
        np.testing.assert_array_equal(rec.gradient, sum(vecs) / 1024.0)
        summary = d1.state.summary()
        assert summary["epsilon"] is None and summary["steps"] == 1  # no privacy
    finally:
        for p in providers:
            p.close()
        d1.stop()


def test_ldp_round_with_real_providers_has_finite_epsilon(pki: Path, tmp_path: Path) -> None:
    d1 = start_single(
        pki,
        tmp_path,
        mode="ldp",
        rounds=1,
        target_epsilon=8.0,
        max_batch_size=0,
        round_deadline=20.0,
    )
    clients = real_clients(pki, d1)
    try:
        threads = [threading.Thread(target=c.run_round) for c in clients]
        for c in clients:
            tc = c.connect()
        assert tc.mode == pb.MODE_LDP and tc.noise_std_units > 0
        assert tc.noise_multiplier == d1.plan.noise_multiplier > 0
        for th in threads:
            th.start()
        for th in threads:
            th.join(60)
        assert d1.wait(20) and d1.error is None
        assert d1.state.history[0].agreed == PROVIDERS
        # Nothing on the wire reveals a provider's batch size: no compute time in the round.
        assert "provider" not in d1.state.history[0].seconds
        eps = d1.state.epsilon()
        assert 0 < eps <= 8.0 and math.isfinite(eps)
        assert d1.state.summary()["epsilon"] == eps
        # The run is over: its ledger is closed (one server: its own signature alone).
        report = verify_ledger(tmp_path / "s1" / "ledger.jsonl")
        assert report.closed and report.steps == 1
    finally:
        for c in clients:
            c.close()
        d1.stop()


def test_dng_noise_spread_and_servers_agree(pki: Path, tmp_path: Path) -> None:
    d1, d2 = start_pair(pki, tmp_path, mode="dng", rounds=1, noise_multiplier=2.0)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        assert cfg.mode == pb.MODE_DNG and cfg.noise_std_units == d1.plan.sigma_units > 0
        vecs = [np.full(cfg.num_parameters, 100 * (i + 1), dtype=np.int64) for i in range(3)]
        for p, v in zip(providers, vecs, strict=True):
            p.submit_both(cfg, 0, v)
        wait_round_done((d1, d2), 0)
        r1, r2 = d1.state.history[0], d2.state.history[0]
        np.testing.assert_array_equal(r1.noisy_sum_units, r2.noisy_sum_units)
        assert r1.model_sha256 == r2.model_sha256
        assert d1.wait(10) and d2.wait(10) and d1.error is None and d2.error is None
        noise = np.asarray(r1.noisy_sum_units, dtype=np.float64) - sum(vecs)
        want = math.sqrt(2) * d1.plan.sigma_units
        assert 0.6 * want < noise.std() < 1.4 * want  # d = 62 coordinates: loose
        assert abs(noise.mean()) < 4 * want / math.sqrt(len(noise))
        assert math.isfinite(d1.state.epsilon()) and d1.state.epsilon() > 0
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


class _Pipe:
    """One end of an in-memory duplex byte pipe (send/flush/recv like garbled_core.Channel)."""

    def __init__(self, inbox: list[bytes], outbox: list[bytes], cond: threading.Condition):
        self.inbox, self.outbox, self.cond = inbox, outbox, cond

    def send(self, data: bytes) -> None:
        with self.cond:
            self.outbox.append(bytes(data))
            self.cond.notify_all()

    def flush(self) -> None:
        pass

    def recv(self, n: int) -> bytes:
        with self.cond:
            while sum(map(len, self.inbox)) < n:
                self.cond.wait(5)
            data = b"".join(self.inbox)
            self.inbox[:] = [data[n:]] if len(data) > n else []
            return data[:n]


def test_dng_exchange_is_exact_and_ring_holds_the_noise(pki: Path, tmp_path: Path) -> None:
    ring = 20
    s = np.array([-1000, 0, 5, 999], dtype=np.int64)
    r = np.random.default_rng(0).integers(0, 1 << ring, len(s), dtype=np.uint64)
    a1 = (s.view(np.uint64) + r) & ring_mask(ring)
    z1, z2 = np.array([1, -2, 3, -4]), np.array([-7, 8, 0, 100])
    cond = threading.Condition()
    q12: list[bytes] = []
    q21: list[bytes] = []
    out: dict[int, np.ndarray] = {}

    def h2() -> None:
        out[2] = dng_exchange(2, _Pipe(q12, q21, cond), r, z2, ring)[0]

    th = threading.Thread(target=h2)
    th.start()
    out[1] = dng_exchange(1, _Pipe(q21, q12, cond), a1, z1, ring)[0]
    th.join(10)
    np.testing.assert_array_equal(out[1], s + z1 + z2)
    np.testing.assert_array_equal(out[2], out[1])
    # The ring includes the tail of both servers' noises (sqrt(2) sigma).
    cfg = _cfg(pki, 1, tmp_path, mode="dng", noise_multiplier=50.0)
    spgc = _cfg(pki, 1, tmp_path, mode="spgc", noise_multiplier=50.0)
    assert make_plan(cfg).ring_bits > make_plan(spgc).ring_bits


def real_clients(pki: Path, d1: ServerDaemon) -> list[ProviderClient]:
    d = pki / "good"
    return [
        ProviderClient(
            ProviderConfig(
                name=name,
                h1_address=f"127.0.0.1:{d1.port}",
                tls_cert=d / f"{name}.pem",
                tls_key=d / f"{name}.key",
                tls_ca=d / "ca.pem",
                provider_index=i,
                provider_count=len(PROVIDERS),
                min_noise_multiplier=0.3,
                poll_interval=0.05,
                wait_timeout=30.0,
            )
        )
        for i, name in enumerate(PROVIDERS)
    ]


@pytest.mark.parametrize(
    ("accountant", "batch_size"),
    [("pld", 0), ("rdp", 5), ("rdp_discrete", 0)],
    ids=["pld-poisson", "rdp-fixed", "rdp_discrete-poisson"],
)
def test_accountants_and_fixed_batches_through_the_daemon(
    pki: Path, tmp_path: Path, accountant: str, batch_size: int
) -> None:
    from spgc.learning.data import load_dataset
    from spgc.privacy.accounting import PrivacyAccountant

    d1 = start_single(
        pki,
        tmp_path,
        mode="ldp",
        rounds=2,
        target_epsilon=8.0,
        max_batch_size=0,
        round_deadline=20.0,
        accountant=accountant,
        batch_size=batch_size,
        sampling_rate=0.05,
    )
    clients = real_clients(pki, d1)
    try:
        for c in clients:
            tc = c.connect()
        if batch_size:
            assert tc.sampling == pb.BATCH_SAMPLING_SHUFFLE and tc.batch_size == batch_size
            per_epoch = load_dataset("cancer").n_train // len(PROVIDERS) // batch_size
            assert tc.batches_per_epoch == per_epoch  # batch r mod E of epoch r // E
        else:
            assert tc.sampling == pb.BATCH_SAMPLING_POISSON and tc.sampling_rate == 0.05
        assert tc.accountant == accountant
        for _ in range(2):
            threads = [threading.Thread(target=c.run_round) for c in clients]
            for th in threads:
                th.start()
            for th in threads:
                th.join(60)
        assert d1.wait(20) and d1.error is None and d1.state.steps == 2
        # the server offers packed shares: ceil(L / 8) bytes per element, not 8
        assert pb.SHARE_ENCODING_PACKED in tc.share_encodings
        width = -(-tc.ring_bits // 8)
        sent = {r.bytes_sent for c in clients for rep in c.reports for r in rep.results}
        assert width < 8 and sent == {width * tc.num_parameters}
        assert d1.state.round_info(None, "p1").releases_counted == 2
        if batch_size:
            assert all(r.batch_size == batch_size for c in clients for r in c.reports)
            n_local = load_dataset("cancer").n_train // len(PROVIDERS)
            ref = PrivacyAccountant(
                d1.plan.noise_multiplier,
                1e-5,
                method="rdp",
                sampling="fixed",
                sample_size=batch_size,
                population=n_local,
            )
        else:
            ref = PrivacyAccountant(d1.plan.noise_multiplier, 1e-5, 0.05, method=accountant)
        ref.step(2)
        assert d1.state.epsilon() == pytest.approx(ref.epsilon())
        assert d1.state.summary()["epsilon"] == pytest.approx(ref.epsilon())
    finally:
        for c in clients:
            c.close()
        d1.stop()


def test_fixed_batches_refuse_pld(pki: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="RDP only"):
        _cfg(pki, 1, tmp_path, mode="ldp", accountant="pld", batch_size=5)


def test_a_batch_cap_poisson_batches_could_pass_is_refused(pki: Path, tmp_path: Path) -> None:
    """A bundled data set is split evenly, so the servers know what each provider holds: a
    max_batch_size that a Poisson batch could pass (the round would be sat out, outside the
    accounting) is a configuration error naming the smallest cap that is not."""
    with pytest.raises(ValueError, match=r"set max_batch_size >= 22, or 0"):
        make_plan(_cfg(pki, 1, tmp_path, max_batch_size=21, sampling_rate=0.01))
    assert make_plan(_cfg(pki, 1, tmp_path, max_batch_size=22, sampling_rate=0.01))

"""Mode preprocessed end to end with in-process daemons: the opened value is S + z with z the
plaintext sampler's noise for the seeds the pool was made with; entries are used once, also
across a restart; an empty pool fails the round with a clear error, never less noise."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from test_server_daemon import PROVIDERS, Provider, start_pair, wait_round_done

from servers import coordinator, noise_pool, peer
from servers.gc_party import sample_noise_plain


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from spgc.certs import make_dev_pki

    root = tmp_path_factory.mktemp("pki")
    make_dev_pki(root / "good", ["h1", "h2", *PROVIDERS])
    return root


@pytest.fixture
def seeds(monkeypatch: pytest.MonkeyPatch) -> dict[str, list[tuple[bytes, int]]]:
    """Records the sampler seed and size of every block each server produces."""
    made: dict[str, list[tuple[bytes, int]]] = {"garbler": [], "evaluator": []}
    real = noise_pool.produce_noise_shares

    def recording(role, link, n, sigma, ring_bits, seed, **kw):
        made[role].append((seed, n))
        return real(role, link, n, sigma, ring_bits, seed, **kw)

    monkeypatch.setattr(coordinator, "produce_noise_shares", recording)
    monkeypatch.setattr(peer, "produce_noise_shares", recording)
    return made


def pool_noise(made: dict[str, list[tuple[bytes, int]]], sigma: float) -> np.ndarray:
    """The noise of every produced sample, in pool order, from the two servers' seeds."""
    parts = []
    for (s1, n1), (s2, n2) in zip(made["garbler"], made["evaluator"], strict=True):
        assert n1 == n2
        parts.append(sample_noise_plain(s1, s2, n1, sigma))
    return np.concatenate(parts)


def run_rounds(daemons, providers, first: int, count: int, values) -> None:
    for t in range(first, first + count):
        cfg = providers[0].wait_collecting(t)
        for p, v in zip(providers, values, strict=True):
            p.submit_both(cfg, t, v)
        wait_round_done(daemons, t, timeout=60)


def test_opened_value_is_s_plus_the_pooled_noise(pki, tmp_path, seeds):
    d1, d2 = start_pair(
        pki,
        tmp_path,
        mode="preprocessed",
        rounds=3,
        noise_multiplier=1.0,
        pool_rounds=2,
        pool_block=100,
    )
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        d, sigma = cfg.num_parameters, d1.plan.sigma_units
        rng = np.random.default_rng(5)
        values = [rng.integers(-3000, 3000, d, dtype=np.int64) for _ in PROVIDERS]
        run_rounds((d1, d2), providers, 0, 3, values)
        assert d1.wait(20) and d2.wait(20) and d1.error is None and d2.error is None
        z = pool_noise(seeds, sigma)
        s = sum(values)
        for t in range(3):
            y = np.asarray(d1.state.history[t].noisy_sum_units, dtype=np.int64)
            np.testing.assert_array_equal(y, d2.state.history[t].noisy_sum_units)
            np.testing.assert_array_equal(y - s, z[t * d : (t + 1) * d])
            assert d1.state.history[t].gc_bytes == 16 * d  # 8 bytes each way per coordinate
        # both servers consumed the same entries, each once
        c1, c2 = d1.state.pool.consumed(), d2.state.pool.consumed()
        assert c1 == c2 and sum(c["count"] for c in c1) == 3 * d
        assert d1.state.summary()["noise_std_total_units"] == sigma
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_empty_pool_without_production_fails_clearly(pki, tmp_path):
    d1, d2 = start_pair(
        pki,
        tmp_path,
        mode="preprocessed",
        rounds=3,
        noise_multiplier=1.0,
        pool_rounds=1,
        pool_produce=False,
    )
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        values = [np.full(cfg.num_parameters, 7, dtype=np.int64) for _ in PROVIDERS]
        run_rounds((d1, d2), providers, 0, 1, values)  # the initial fill holds one round
        cfg = providers[0].wait_collecting(1)
        for p, v in zip(providers, values, strict=True):
            p.submit_both(cfg, 1, v)
        assert d1.wait(30) and d2.wait(30)
        assert "noise pool holds 0 unused samples" in str(d1.error)
        assert "spgc server precompute" in str(d1.error)
        assert "h1 ended the run" in str(d2.error)
        assert 1 not in d1.state.history or d1.state.history[1].noisy_sum_units is None
        assert d1.state.steps == 1  # round 1 released nothing
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()

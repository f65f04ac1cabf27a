"""Mode preprocessed end to end with in-process daemons: the opened value is S + z with z the
plaintext sampler's noise for the seeds the pool was made with; entries are used once, also
across a restart; an empty pool fails the round with a clear error, never less noise."""

from __future__ import annotations

import logging
import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from test_server_daemon import PROVIDERS, Provider, _cfg, bind_pair, start_pair, wait_round_done

from spgc.privacy.noise import sample_noise_plain
from spgc.protocol.sharing import ring_mask
from spgc.servers import noise_pool, pool_sync


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from spgc.protocol.certs import make_dev_pki

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

    monkeypatch.setattr(pool_sync, "produce_noise_shares", recording)  # both servers' runs
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


def test_a_run_keeps_no_more_noise_ready_than_it_has_rounds_left(pki, tmp_path, seeds):
    """pool_rounds 4 in a run of 2 rounds: the servers make 2 rounds of noise, not 4 (the
    offline phase of a short run, the demo's included, takes half the time), and use it all."""
    d1, d2 = start_pair(
        pki, tmp_path, mode="preprocessed", rounds=2, noise_multiplier=1.0, pool_rounds=4,
        pool_block=100,
    )  # fmt: skip
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        d = cfg.num_parameters
        values = [np.full(d, 11, dtype=np.int64) for _ in PROVIDERS]
        run_rounds((d1, d2), providers, 0, 2, values)
        assert d1.wait(20) and d2.wait(20) and d1.error is None and d2.error is None
        assert sum(n for _, n in seeds["garbler"]) == 2 * d
        assert d1.state.pool.available == d2.state.pool.available == 0
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
        cfg = providers[0].wait_collecting(0)  # nothing precomputed, nothing produced
        values = [np.full(cfg.num_parameters, 7, dtype=np.int64) for _ in PROVIDERS]
        for p, v in zip(providers, values, strict=True):
            p.submit_both(cfg, 0, v)
        assert d1.wait(30) and d2.wait(30)
        assert "noise pool holds 0 unused samples" in str(d1.error)
        assert "spgc server precompute" in str(d1.error)
        assert "h1 ended the run" in str(d2.error)
        assert d1.state.history[0].noisy_sum_units is None  # nothing released
        assert d1.state.steps == 0 and d2.state.steps == 0
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


@pytest.fixture
def stored(monkeypatch: pytest.MonkeyPatch) -> dict[tuple[str, int], np.ndarray]:
    """Records every block each server's pool stores: (role, index) -> its shares."""
    blocks: dict[tuple[str, int], np.ndarray] = {}
    real = noise_pool.NoisePool.add_block

    def recording(self, index, block_id, shares, *rest):
        blocks[(self.role, index)] = np.array(shares, dtype=np.uint64)
        return real(self, index, block_id, shares, *rest)

    monkeypatch.setattr(noise_pool.NoisePool, "add_block", recording)
    return blocks


def test_restart_mid_training_never_reuses_a_pool_entry(pki, tmp_path, stored):
    kw = {"mode": "preprocessed", "rounds": 4, "noise_multiplier": 1.0}
    kw.update(pool_rounds=3, pool_block=150)
    d1, d2 = start_pair(pki, tmp_path, **kw)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        d, sigma = cfg.num_parameters, d1.plan.sigma_units
        rng = np.random.default_rng(9)
        values = [rng.integers(-3000, 3000, d, dtype=np.int64) for _ in PROVIDERS]
        run_rounds((d1, d2), providers, 0, 2, values)
        providers[0].wait_collecting(2)
        run_id, model = d1.state.run_id, d1.state.model(None)[2]
    finally:
        for p in providers:
            p.close()
        d1.stop()  # the "crash": round 2 was collecting
        d2.stop()
    # H2 used 5 more samples than H1 before the crash (e.g. it died mid-exchange)
    from spgc.servers.noise_pool import NoisePool

    h2_pool = NoisePool(tmp_path / "s2" / "noise-pool", "h2", sigma, d1.plan.ring_bits)
    h2_pool.take(h2_pool.position(5), 99)
    del h2_pool

    d1, d2 = start_pair(pki, tmp_path, **kw)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        assert d1.state.run_id == run_id and d1.state.round == 2 and d1.state.steps == 2
        assert d1.state.model(None)[2] == model
        run_rounds((d1, d2), providers, 2, 2, values)
        assert d1.wait(20) and d2.wait(20) and d1.error is None and d2.error is None
        assert d1.state.steps == 4 and sorted(d1.state.history) == [0, 1, 2, 3]
        # every entry either server consumed was consumed once, across both runs
        for pool in (d1.state.pool, d2.state.pool):
            seen: set[tuple[int, int]] = set()
            for c in pool.consumed():
                entries = {(c["block"], c["offset"] + k) for k in range(c["count"])}
                assert not entries & seen, c
                seen |= entries

        def entries(log):
            return {(c["block"], c["offset"] + k) for c in log for k in range(c["count"])}

        h1_log, h2_log = d1.state.pool.consumed(), d2.state.pool.consumed()
        extra = [c for c in h2_log if c["round"] == 99]
        assert [c["count"] for c in extra] == [5]
        assert not entries(extra) & entries(h1_log)  # wasted by the crash, never used by H1
        assert [c for c in h2_log if c["round"] != 99] == h1_log
        # the rounds after the restart open S + z, z = the sum of the two servers' pool shares
        ring = d1.plan.ring_bits
        s = sum(values)
        for t in (2, 3):
            runs = [c for c in d1.state.pool.consumed() if c["round"] == t]
            parts = []
            for c in runs:
                both = [
                    stored[(r, c["block"])][c["offset"] : c["offset"] + c["count"]]
                    for r in ("h1", "h2")
                ]
                parts.append(((both[0] + both[1]) & ring_mask(ring)).astype(object))
            z = np.concatenate(parts)
            z = np.array(
                [v - (1 << ring) if v >= 1 << (ring - 1) else v for v in z], dtype=np.int64
            )
            y = np.asarray(d1.state.history[t].noisy_sum_units, dtype=np.int64)
            np.testing.assert_array_equal(y - s, z)
            assert np.abs(z).max() < 8 * sigma
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_precompute_fills_the_pool_then_training_uses_it(pki, tmp_path):
    from spgc.servers.daemon import ServerDaemon

    kw = {"mode": "preprocessed", "rounds": 2, "noise_multiplier": 1.0, "pool_block": 40}
    a, b = bind_pair(pki, tmp_path, precompute=130, **kw)
    try:
        b.start()
        a.start()
        assert a.wait(60) and b.wait(60) and a.error is None and b.error is None
        assert a.state.pool.available == b.state.pool.available == 130
        assert [blk.count for blk in a.state.pool.blocks] == [40, 40, 40, 10]
        assert a.state.steps == 0 and not a.state.history  # no training
    finally:
        a.stop()
        b.stop()
    with pytest.raises(ValueError, match="not preprocessed"):
        ServerDaemon(_cfg(pki, 1, tmp_path / "s1", mode="spgc"), precompute=10)
    # training without production takes the precomputed noise: 2 rounds of d = 62 samples
    d1, d2 = start_pair(pki, tmp_path, pool_produce=False, pool_rounds=1, **kw)
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        values = [np.full(cfg.num_parameters, 3, dtype=np.int64) for _ in PROVIDERS]
        run_rounds((d1, d2), providers, 0, 2, values)
        assert d1.wait(20) and d1.error is None and d2.error is None
        assert d1.state.pool.available == 130 - 2 * cfg.num_parameters
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_precompute_stopped_says_how_much_of_the_pool_is_ready(pki, tmp_path, caplog):
    kw = {"mode": "preprocessed", "rounds": 2, "noise_multiplier": 1.0, "pool_block": 200}
    a, b = bind_pair(pki, tmp_path, precompute=10_000_000, **kw)
    try:
        b.start()
        a.start()
        deadline = time.monotonic() + 60
        while a.state.pool.available < 400 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert a.state.pool.available >= 400
        with caplog.at_level(logging.INFO):
            a.stop()  # what Ctrl-C does
            assert a.wait(30) and a.error is None
        ready = a.state.pool.available
        said = [r.getMessage() for r in caplog.records if "precompute stopped" in r.getMessage()]
        assert len(said) == 1 and re.fullmatch(
            rf"h1: precompute stopped: {ready:,} of 10,000,000 noise samples ready in \S+ "
            rf"\(made [0-9,]+ now\); run it again to go on from there",
            said[0],
        ), said
    finally:
        a.stop()
        b.stop()


def test_a_round_waits_for_noise_only_when_the_pool_is_empty(pki, tmp_path, monkeypatch):
    """Production runs beside the rounds: round 0 takes the noise made before it without
    waiting; the run that refills the pool is held back here until round 1 says it waits for
    noise (the pool holds none), and round 1 then goes ahead with the new block, its wait timed."""
    real = pool_sync.produce_noise_shares
    release = threading.Event()
    sizes: list[int] = []

    def held_after_the_first(role, link, n, sigma, ring_bits, seed, **kw):
        if role != "garbler":  # H2's side of each run waits for H1's in the engine
            return real(role, link, n, sigma, ring_bits, seed, **kw)
        sizes.append(n)
        if len(sizes) > 1:  # the fill before round 0 is not held
            assert release.wait(30)
        return real(role, link, n, sigma, ring_bits, seed, **kw)

    class WaitSaid(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "round 1 waits for noise: the pool holds 0 of the" in record.getMessage():
                release.set()

    handler = WaitSaid()
    logging.getLogger(pool_sync.__name__).addHandler(handler)
    monkeypatch.setattr(pool_sync, "produce_noise_shares", held_after_the_first)
    d1, d2 = start_pair(
        pki, tmp_path, mode="preprocessed", rounds=2, noise_multiplier=1.0, pool_rounds=1,
        pool_block=62,  # d: the fill before round 0 makes one round of noise
    )  # fmt: skip
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        d = cfg.num_parameters
        values = [np.full(d, 5, dtype=np.int64) for _ in PROVIDERS]
        run_rounds((d1, d2), providers, 0, 2, values)
        assert d1.wait(20) and d2.wait(20) and d1.error is None and d2.error is None
        assert release.is_set() and sizes == [d, d]
        assert "noise_wait" not in d1.state.history[0].seconds
        assert d1.state.history[1].seconds["noise_wait"] > 0
        c1, c2 = d1.state.pool.consumed(), d2.state.pool.consumed()
        assert c1 == c2 and sum(c["count"] for c in c1) == 2 * d
    finally:
        logging.getLogger(pool_sync.__name__).removeHandler(handler)
        release.set()
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()

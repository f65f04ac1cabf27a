"""noise_floor through the daemons (issue 46 item 4). Mode preprocessed: the pool is made at the
joint noise's (1 - f) sigma^2, each server adds its own fresh draw at the opening, and the
release is S + the pool's noise + both draws; the summary carries the three figures. Mode
spgc: the round circuit's noise at (1 - f) sigma^2 plus both servers' own draws."""

from __future__ import annotations

import math

import numpy as np
from test_preprocessed import pki as pki  # the module's fixtures
from test_preprocessed import pool_noise, run_rounds
from test_preprocessed import seeds as seeds
from test_server_daemon import PROVIDERS, Provider, start_pair

from spgc.privacy.noise import sample_noise_plain
from spgc.servers import coordinator


def test_the_release_is_s_plus_the_pool_noise_plus_each_servers_own(
    pki, tmp_path, seeds, monkeypatch
):
    draws: list[np.ndarray] = []
    real = coordinator.draw_own_noise

    def recording(n, sigma):
        out = real(n, sigma)
        draws.append(out)
        return out

    monkeypatch.setattr(coordinator, "draw_own_noise", recording)
    d1, d2 = start_pair(
        pki, tmp_path, mode="preprocessed", rounds=2, noise_multiplier=1.0, pool_rounds=2,
        pool_block=100, noise_floor=0.25,
    )  # fmt: skip
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        assert cfg.noise_floor == 0.25
        d, sigma = cfg.num_parameters, d1.plan.sigma_units
        assert d1.state.pool.sigma_units == sigma * math.sqrt(0.75)
        rng = np.random.default_rng(8)
        values = [rng.integers(-3000, 3000, d, dtype=np.int64) for _ in PROVIDERS]
        run_rounds((d1, d2), providers, 0, 2, values)
        assert d1.wait(20) and d2.wait(20) and d1.error is None and d2.error is None
        z = pool_noise(seeds, sigma * math.sqrt(0.75))
        s = sum(values)
        assert len(draws) == 4  # each server, each release: a fresh draw
        assert not any(np.array_equal(a, b) for i, a in enumerate(draws) for b in draws[:i])
        for t in range(2):
            y = np.asarray(d1.state.history[t].noisy_sum_units, dtype=np.int64)
            np.testing.assert_array_equal(y, d2.state.history[t].noisy_sum_units)
            own = draws[2 * t] + draws[2 * t + 1]  # the two servers' draws of release t
            np.testing.assert_array_equal(y - s - z[t * d : (t + 1) * d], own)
        summary = d1.state.summary()
        assert summary["noise_std_total_units"] == sigma * math.sqrt(1.25)
        figures = summary["noise_floor"]
        assert figures["fraction"] == 0.25
        eps = figures["epsilon"]
        assert (
            eps["everyone"] < eps["curious_server"] == summary["epsilon"] < eps["deviating_server"]
        )
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()


def test_spgc_rounds_release_s_plus_the_joint_noise_plus_each_servers_own(
    pki, tmp_path, monkeypatch
):
    """Mode spgc through the daemons: the round circuit's noise from both round seeds at
    sqrt(1 - f) sigma, plus the two servers' own draws, added to their circuit inputs."""
    draws: list[np.ndarray] = []
    round_seeds: list[tuple[str, bytes, float]] = []
    real_draw, real_circuit = coordinator.draw_own_noise, coordinator.run_aggregate

    def recording_draw(n, sigma):
        out = real_draw(n, sigma)
        draws.append(out)
        return out

    def recording_circuit(role, link, shares, seed, sigma_units, *args, **kw):
        round_seeds.append((role, seed, sigma_units))
        return real_circuit(role, link, shares, seed, sigma_units, *args, **kw)

    monkeypatch.setattr(coordinator, "draw_own_noise", recording_draw)
    monkeypatch.setattr(coordinator, "run_aggregate", recording_circuit)
    d1, d2 = start_pair(
        pki, tmp_path, mode="spgc", rounds=2, noise_multiplier=1.0, noise_floor=0.25
    )
    providers = [Provider(pki, n, (d1, d2)) for n in PROVIDERS]
    try:
        cfg = providers[0].wait_collecting(0)
        d, sigma = cfg.num_parameters, d1.plan.sigma_units
        rng = np.random.default_rng(9)
        values = [rng.integers(-3000, 3000, d, dtype=np.int64) for _ in PROVIDERS]
        run_rounds((d1, d2), providers, 0, 2, values)
        assert d1.wait(20) and d2.wait(20) and d1.error is None and d2.error is None
        s = sum(values)
        assert len(draws) == 4 and len(round_seeds) == 4
        for t in range(2):
            pair = {role: seed for role, seed, _ in round_seeds[2 * t : 2 * t + 2]}
            assert {sig for _, _, sig in round_seeds} == {sigma * math.sqrt(0.75)}
            joint = sample_noise_plain(pair["garbler"], pair["evaluator"], d,
                                       sigma * math.sqrt(0.75))  # fmt: skip
            y = np.asarray(d1.state.history[t].noisy_sum_units, dtype=np.int64)
            np.testing.assert_array_equal(y, d2.state.history[t].noisy_sum_units)
            np.testing.assert_array_equal(y - s - joint, draws[2 * t] + draws[2 * t + 1])
    finally:
        for p in providers:
            p.close()
        d1.stop()
        d2.stop()

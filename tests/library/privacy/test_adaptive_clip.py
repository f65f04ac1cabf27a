"""Adaptive clipping (spgc.privacy.clipping, issue 33 item 4): the rows' bound whatever the round's
C,
the pair of noises the accountant's one multiplier stands for, the rule's move, and the plan,
the ledger and the verifier that carry it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from spgc.learning.data import load_dataset
from spgc.privacy.clipping import CLIP_RANGE, AdaptiveClip, adaptive_clip_of, round_clip_norm
from spgc.privacy.ledger_format import LedgerError
from spgc.privacy.ledger_verify import _check_clip
from spgc.protocol.encoding import FixedPointConfig, encode_batch
from spgc.settings.config import ConfigError, ServerConfig
from spgc.settings.plan import make_plan


def _clip(z: float = 1.1, expected: float = 100.0, **kw) -> AdaptiveClip:
    return AdaptiveClip.design(
        initial_norm=kw.pop("initial_norm", 0.1),
        target_quantile=0.5,
        learning_rate=0.2,
        expected_batch=expected,
        noise_multiplier=z,
        **kw,
    )


def test_the_pair_of_noises_is_the_accounted_gaussian() -> None:
    """z_update^-2 + sigma_count^-2 = z^-2 at the design (the paper's z_update formula, with
    the count's sensitivity 1), and the count gets expected / 20 by default."""
    a = _clip(z=1.1, expected=100.0)
    scale, sigma_units = 1024.0, 1.1 * 1024.0 * a.row_norm  # z times the rows' bound in units
    z_update = a.update_noise_multiplier(sigma_units, scale)
    sigma_count = a.count_noise_std(sigma_units, scale)
    assert sigma_count == pytest.approx(100.0 / 20)
    assert z_update**-2 + sigma_count**-2 == pytest.approx(1.1**-2)
    assert z_update == pytest.approx(1 / math.sqrt(1.1**-2 - 5.0**-2))
    assert _clip(count_noise=8.0).count_noise_std(sigma_units, scale) != pytest.approx(5.0)


def test_a_count_noise_not_above_the_multiplier_is_refused() -> None:
    with pytest.raises(ValueError, match=r"count's noise \(1 examples\) must exceed the noise"):
        _clip(z=1.5, count_noise=1.0)
    assert _clip(z=1.5, expected=20.0).count_clip > 0  # the default: 2 z, not 20 / 20
    with pytest.raises(ValueError, match="noise multiplier > 0"):
        _clip(z=0.0)


def test_rows_are_bounded_by_the_row_norm_whatever_the_round_clip() -> None:
    rng = np.random.default_rng(1)
    a = _clip()
    grads = rng.normal(size=(64, 30)) * rng.uniform(0.001, 3.0, size=(64, 1))
    for c in (0.01, 0.1, 0.7, 5.0):
        rows = a.rows(grads, c)
        assert rows.shape == (64, 31)
        assert np.all(np.linalg.norm(rows, axis=1) <= a.row_norm * (1 + 1e-12))
        unclipped = np.linalg.norm(grads, axis=1) <= c
        assert np.array_equal(rows[:, -1] > 0, unclipped)
        # An unclipped row is its gradient rescaled to C0; a clipped one has norm C0.
        np.testing.assert_allclose(rows[unclipped, :-1], grads[unclipped] * (0.1 / c))
        np.testing.assert_allclose(np.linalg.norm(rows[~unclipped, :-1], axis=1), 0.1)
    with pytest.raises(ValueError, match="outside"):
        a.rows(grads, 0.1 * CLIP_RANGE * 10)


def test_encoded_rows_decode_to_the_clipped_sum_and_the_count() -> None:
    """Through the real encoder (the plan's bound in units) and back with split_release."""
    rng = np.random.default_rng(2)
    a = _clip()
    grads = rng.normal(size=(200, 12)) * 0.05
    c = 0.06
    fp = FixedPointConfig(scale=2.0**20, clip_norm=a.row_norm, dim=13)
    total = encode_batch(a.rows(grads, c), fp, np.random.default_rng(3))
    gradient, count = a.split_release(total, fp.scale, c)
    norms = np.linalg.norm(grads, axis=1)
    clipped = grads * np.minimum(1.0, c / norms)[:, None]
    np.testing.assert_allclose(gradient, clipped.sum(axis=0), atol=1e-4)
    assert count == pytest.approx(int(np.sum(norms <= c)), abs=0.01)


def test_the_rule_moves_towards_the_quantile() -> None:
    a = _clip(expected=100.0)
    assert a.next_clip_norm(1.0, 50.0) == pytest.approx(1.0)  # at the quantile: stays
    assert a.next_clip_norm(1.0, 90.0) == pytest.approx(math.exp(-0.2 * 0.4))  # too many: down
    assert a.next_clip_norm(1.0, 0.0) == pytest.approx(math.exp(0.2 * 0.5))  # too few: up
    assert a.next_clip_norm(0.1, -1e300) == pytest.approx(0.1 * CLIP_RANGE)  # capped
    # C follows the quantile of norms drawn around 2.0 from C0 = 0.1.
    norms = np.abs(np.random.default_rng(4).normal(2.0, 0.5, size=100_000))
    c = 0.1
    for _ in range(60):
        c = a.next_clip_norm(c, float(np.mean(norms <= c)) * 100.0)
    assert c == pytest.approx(float(np.median(norms)), rel=0.05)


def _cfg(**kw) -> ServerConfig:
    return ServerConfig(
        role=1, insecure=True, providers=["p1", "p2", "p3"], dataset="cancer", **kw
    )


def test_the_plan_sizes_shares_for_the_count_and_announces_the_rule() -> None:
    fixed = make_plan(_cfg(clip_norm=0.1, sampling_rate=0.2))
    plan = make_plan(_cfg(clip="adaptive", clip_norm=0.1, sampling_rate=0.2))
    assert (plan.dim, plan.share_dim) == (fixed.dim, fixed.dim + 1)
    assert plan.noise_multiplier == fixed.noise_multiplier  # the same accounting
    tc = plan.training_config("run")
    assert tc.clip_rule == 1 and tc.num_parameters == plan.dim
    expected = 0.2 * load_dataset("cancer").n_train
    assert tc.expected_batch_size == pytest.approx(expected)
    # The design's count noise, inflated only by the rounding's B / (s sqrt(C0^2 + kappa^2))
    # (C0 = 0.1 at scale 1024 is about 100 units: a few percent).
    design = max(expected / 20, 2 * tc.noise_multiplier)
    assert design <= tc.count_noise_std <= design * 1.05
    pair = (tc.update_noise_multiplier**-2 + tc.count_noise_std**-2) ** -0.5
    assert pair >= tc.noise_multiplier  # the rounding's inflation only helps
    bound = plan.fixed_point.l2_bound_units
    assert tc.l2_bound_units == bound >= 1024 * plan.adaptive_clip.row_norm
    assert fixed.training_config("run").clip_rule == 0


def test_bad_adaptive_configurations_are_one_line() -> None:
    with pytest.raises((ConfigError, ValueError), match="clip: adaptive needs the noise added"):
        _cfg(clip="adaptive", mode="dng")
    with pytest.raises(ValueError, match="count's noise"):
        make_plan(_cfg(clip="adaptive", clip_count_noise=0.5, sampling_rate=0.2))


def test_the_verifier_checks_the_pair_against_the_accounted_multiplier() -> None:
    good = {
        "rule": "adaptive",
        "initial_norm": 0.1,
        "target_quantile": 0.5,
        "learning_rate": 0.2,
        "update_noise_multiplier": 1.2,
        "count_noise_std": 5.0,
    }
    pair = (1.2**-2 + 5.0**-2) ** -0.5
    _check_clip(good, pair)
    with pytest.raises(LedgerError, match="below the noise_multiplier"):
        _check_clip(good, pair * 1.01)  # a header claiming less noise than its pair gives
    with pytest.raises(LedgerError, match=r"clip\.count_noise_std"):
        _check_clip({**good, "count_noise_std": 0}, 1.0)
    with pytest.raises(LedgerError, match="clip must be"):
        _check_clip({"rule": "whatever"}, 1.0)
    _check_clip({"rule": "fixed", "clip_norm": 1.0}, 1.0)


def test_a_provider_reads_and_checks_the_announced_rule() -> None:
    plan = make_plan(_cfg(clip="adaptive", clip_norm=0.1, sampling_rate=0.2))
    tc = plan.training_config("run")
    clip = adaptive_clip_of(tc)
    assert clip == plan.adaptive_clip
    assert adaptive_clip_of(make_plan(_cfg()).training_config("run")) is None
    forged = type(tc)()
    forged.CopyFrom(tc)
    forged.count_noise_std *= 4  # a server claiming more noise on the count than it adds
    with pytest.raises(ValueError, match="announce count_noise_std"):
        adaptive_clip_of(forged)
    forged.CopyFrom(tc)
    forged.count_clip = 0.0
    with pytest.raises(ValueError, match="malformed: adaptive clipping: count_clip"):
        adaptive_clip_of(forged)
    assert round_clip_norm(clip, [0.2, 0.2]) == 0.2
    with pytest.raises(ValueError, match="different clip norms"):
        round_clip_norm(clip, [0.2, 0.3])
    with pytest.raises(ValueError, match="outside"):
        round_clip_norm(clip, [0.0, 0.0])

"""Clip schedules (issue 36 item 3): a decaying clip norm in every mode, adaptive clipping in
ldp, what the ledger checks, and the experiment's comparison options."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from helpers import loopback_server_config, run_in_process

from spgc.app.experiment import (
    ExperimentError,
    Run,
    plan_runs,
    plot,
    read_csv,
    run_options,
    table,
    write_csv,
)
from spgc.privacy.accounting import PrivacyAccountant, quiet_dp_accounting
from spgc.privacy.clipping import DecayClip, adaptive_clip_of, decay_clip_of
from spgc.privacy.ledger import Ledger
from spgc.privacy.ledger_format import LedgerError
from spgc.privacy.ledger_verify import verify_ledger
from spgc.providers.errors import ProviderRefusal
from spgc.providers.plan_checks import check_training_config
from spgc.settings.config import ConfigError
from spgc.settings.plan import make_plan
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import aggregation_pb2 as pb


def test_the_decay_rule_is_a_product_of_rounded_multiplications_down_to_its_floor():
    rule = DecayClip(1.0, 0.9, 0.5)
    assert rule.norm_at(0) == 1.0
    c = 1.0
    for r in range(1, 7):
        c *= 0.9
        assert rule.norm_at(r) == max(c, 0.5)  # bit for bit, no pow
    assert rule.norm_at(1000) == 0.5
    assert DecayClip(1.0, 1.0).norm_at(50) == 1.0  # rate 1: a fixed clip
    for bad, message in (
        ((1.0, 0.0, 0.0), "clip_decay must be in"),
        ((1.0, 1.5, 0.0), "clip_decay must be in"),
        ((1.0, 0.9, 2.0), "clip_min must be in"),
        ((0.0, 0.9, 0.0), "clip_norm must be > 0"),
    ):
        with pytest.raises(ValueError, match=message):
            DecayClip(*bad)
    with pytest.raises(ValueError, match="the decay rule gives"):
        rule.check_round(3, 0.73)


def test_decayed_rows_keep_the_first_rounds_bound_and_decode_back():
    rule = DecayClip(2.0, 0.5)
    grads = np.array([[3.0, 4.0], [0.1, 0.0]])  # norms 5 and 0.1
    c = rule.norm_at(2)  # 0.5
    rows = rule.rows(grads, c)
    norms = np.linalg.norm(rows, axis=1)
    assert norms[0] == pytest.approx(2.0)  # clipped to 0.5, rescaled by 2 / 0.5
    assert norms[1] == pytest.approx(0.4)  # not clipped, rescaled
    decoded = rule.decode(rows.sum(axis=0) * 1024.0, 1024.0, c)
    want = grads[0] * (0.5 / 5.0) + grads[1]
    assert np.allclose(decoded, want)


def test_plan_announces_the_decay_and_providers_read_it_back():
    cfg = loopback_server_config(clip="decay", clip_decay=0.95, clip_min=0.2, verify_inputs="none")
    with quiet_dp_accounting():
        plan = make_plan(cfg)
    tc = plan.training_config("r")
    assert tc.clip_rule == pb.CLIP_RULE_DECAY and tc.clip_decay == 0.95 and tc.clip_min == 0.2
    assert plan.clip_moves and plan.decay_clip == DecayClip(1.0, 0.95, 0.2)
    assert decay_clip_of(tc) == plan.decay_clip and adaptive_clip_of(tc) is None
    # The encoding is a fixed run's: C0 and d coordinates.
    fixed = make_plan(loopback_server_config(verify_inputs="none"))
    assert plan.fixed_point.l2_bound_units == fixed.fixed_point.l2_bound_units
    assert plan.share_dim == fixed.share_dim
    tc.clip_decay = 0.0
    with pytest.raises(ProviderRefusal, match="decaying clip is malformed"):
        provider = ProviderConfig(
            name="p1", insecure=True, h1={"address": "127.0.0.1:1"}, allow_no_privacy=True
        )
        check_training_config(tc, provider, 200)


def test_bad_decay_configurations_are_one_line():
    with pytest.raises((ConfigError, ValueError), match="clip_min 2 is above clip_norm 1"):
        loopback_server_config(clip="decay", clip_min=2.0)
    with pytest.raises((ConfigError, ValueError), match="clip_decay"):
        loopback_server_config(clip="decay", clip_decay=1.5)


def test_adaptive_clipping_runs_in_ldp_with_the_count_in_each_providers_noise():
    cfg = loopback_server_config(mode="ldp", clip="adaptive", clip_norm=0.1, role=1)
    with quiet_dp_accounting():
        plan = make_plan(cfg)
    assert plan.adaptive_clip is not None and plan.share_dim == plan.dim + 1
    # Each provider noises every coordinate of its vector, the count included.
    assert plan.noise_samples_per_step(providers_used=2) == 2 * plan.share_dim


def _decay_ledger(path: Path, clip_norms: list[float]) -> Path:
    key = Ed25519PrivateKey.generate()
    header = {
        "run_id": "run-1", "server": "h1", "peer": None, "peer_public_key": None,
        "mode": "ldp", "plan_sha256": "ab" * 32, "noise_multiplier": 1.1,
        "sampling": {"sampling_rate": 0.01, "sampling": "poisson"}, "accountant": "rdp",
        "delta": 1e-5, "sensitivity_units": 1024.0, "max_batch_size": 0,
        "clip": {"rule": "decay", "initial_norm": 1.0, "rate": 0.5, "floor": 0.0},
        "backend": "gc", "verify_inputs": "none",
    }  # fmt: skip
    acc = PrivacyAccountant(1.1, 1e-5, sampling_rate=0.01)
    ledger = Ledger.open(path, key, header)
    with quiet_dp_accounting():
        for t, c in enumerate(clip_norms):
            ledger.record_release(t, 10, acc.epsilon_after(t + 1), clip_norm=c)
    return path


def test_the_ledger_checks_every_release_against_the_decay_rule(tmp_path):
    good = _decay_ledger(tmp_path / "good.jsonl", [1.0, 0.5, 0.25])
    with quiet_dp_accounting():
        report = verify_ledger(good)
    assert report.clip_norms == [1.0, 0.5, 0.25] and report.clip["rule"] == "decay"
    bad = _decay_ledger(tmp_path / "bad.jsonl", [1.0, 0.5, 0.5])  # round 2 kept 0.5
    with pytest.raises(LedgerError, match=r"not the decay rule's 0\.25 for round 2"):
        verify_ledger(bad)
    human = run_in_process("account", "--ledger", str(good))
    assert "clip decaying from 1 by 0.5 a round" in human.stdout


def test_experiment_compares_clip_schedules(tmp_path):
    runs = plan_runs(["mnist"], ["ldp"], [8.0], ["fixed", "decay", "adaptive"])
    assert [r.clip_schedule for r in runs] == ["fixed", "decay", "adaptive"]
    assert runs[1].label == "ldp eps=8 clip decay"
    opts = run_options(runs[1], 1, True, None, {"clip_norm": 0.5, "clip_decay": 0.9})
    assert opts.server_overrides["clip"] == "decay"
    assert opts.server_overrides["clip_decay"] == 0.9
    with pytest.raises(ExperimentError, match="clip schedule adaptive runs in modes"):
        plan_runs(["cancer"], ["dng"], [8.0], ["adaptive"])
    with pytest.raises(ExperimentError, match="unknown clip schedule 'cosine'"):
        plan_runs(["cancer"], ["ldp"], [8.0], ["cosine"])
    done = run_in_process(
        "experiment", "--clip-schedule", "cosine", "--out", str(tmp_path / "x.csv")
    )
    assert done.returncode == 2 and "unknown clip schedule" in done.stderr
    assert Run("cancer", "ldp", 8.0).label == "ldp eps=8"  # fixed: as before


def test_the_table_and_the_plot_tell_clip_schedules_and_norms_apart(tmp_path):
    base = {"dataset": "mnist", "mode": "ldp", "step_epsilon": 8.0, "epoch": 1,
            "test_accuracy": 0.9, "epsilon_total": 9.0, "computation_s": 1.0,
            "communication_s": 1.0, "gc_bytes": 0, "run_wall_s": 1.0}  # fmt: skip
    rows = [
        {**base, "clip_schedule": "fixed", "clip_norm": 1.0},
        {**base, "clip_schedule": "fixed", "clip_norm": 0.1, "test_accuracy": 0.8},
        {**base, "clip_schedule": "decay", "clip_norm": 1.0, "test_accuracy": 0.7},
    ]
    text = table(rows).splitlines()
    assert len(text) == 4 and "fixed 0.1" in text[2] and "decay 1" in text[3]
    write_csv(tmp_path / "r.csv", rows)
    back = read_csv(tmp_path / "r.csv")
    assert [(r["clip_schedule"], r["clip_norm"]) for r in back] == [
        ("fixed", 1.0), ("fixed", 0.1), ("decay", 1.0),
    ]  # fmt: skip
    plot(back, tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000

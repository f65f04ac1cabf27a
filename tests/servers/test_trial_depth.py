"""``trial_depth`` (issue 47): the plan's bound on the AND layers of mode spgc's trial run on
gmw, each a round trip between the servers. Fewer layers, fewer round trips, more bytes: the
operator of a slow link picks; both servers must agree (it is part of the plan), and the round
computes the same noise whatever the bound (the circuits compute the same function)."""

from __future__ import annotations

import os
from typing import Any

import pytest
from test_gmw_round import run_both
from test_spgc_circuit import shares_of, sums_for

from spgc.privacy.noise import SPARES_EVERY, sample_noise_plain
from spgc.servers.gc_party import PartyLink
from spgc.servers.peer import config_differences
from spgc.settings.config import ConfigError, ServerConfig
from spgc.settings.plan import make_plan
from spgc.wire import aggregation_pb2 as pb


def config(**kw: Any) -> ServerConfig:
    base = {"role": 1, "mode": "spgc", "insecure": True, "providers": ["p1", "p2", "p3"],
            "dataset": "cancer", "rounds": 20, "min_providers": 1, "target_epsilon": 4.0,
            "sampling_rate": 0.05, "verify_inputs": "none", "backend": "gmw"}  # fmt: skip
    return ServerConfig(**{**base, **kw})


def test_the_plan_carries_it_and_a_mismatch_is_named():
    deep = make_plan(config(trial_depth=48)).training_config("r")
    default = make_plan(config()).training_config("r")
    assert deep.trial_depth == 48
    # not set: the field unset, so the plan's bytes (and plan_sha256) are as before it
    announced = pb.TrainingConfig.FromString(default.SerializeToString())
    assert "trial_depth" not in [f.name for f, _ in announced.ListFields()]
    assert config_differences(deep, default) == ["trial_depth (h1 48, h2 0)"]


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"backend": "gc"}, "trial_depth: 48 with backend gc and mode spgc: it bounds"),
        ({"mode": "preprocessed", "pool_dir": "pool"}, "with backend gmw and mode preprocessed"),
    ],
)
def test_it_is_refused_where_it_bounds_nothing(kw, message):
    with pytest.raises(ConfigError, match=message):
        config(trial_depth=48, **kw)
    with pytest.raises(ConfigError, match="trial_depth"):
        config(trial_depth=5)  # below the trial's shallowest


def test_the_round_follows_the_bound_and_computes_the_same_noise(two_party):
    ring_bits, sigma = 16, 1000.0
    sums = sums_for(ring_bits, 60, 3)
    a1, a2 = shares_of(sums, ring_bits, 4)
    gates = {}
    for depth in (None, 48):
        seeds = os.urandom(32), os.urandom(32)  # a round seed is never used twice
        z = sample_noise_plain(*seeds, len(sums), sigma, spares_every=SPARES_EVERY["gmw"])
        tp = two_party()
        lg = PartyLink.open("garbler", tp.garbler_channel, backend="gmw", trial_depth=depth)
        le = PartyLink.open("evaluator", tp.evaluator_channel, backend="gmw", trial_depth=depth)
        assert lg.trial_depth == (depth or 28) and lg.lanes()[0].trial_depth == lg.trial_depth
        yg, ye, cg, _ = run_both(lg, le, a1, a2, *seeds, sigma, ring_bits, "spgc")
        assert yg.tolist() == ye.tolist()
        assert [int(y) - s for y, s in zip(ye.tolist(), sums, strict=True)] == z.tolist()
        assert le.session.last_layers <= lg.trial_depth
        gates[depth] = cg["and_gates"] / cg["trials"]
    assert gates[48] < 0.8 * gates[None]  # deeper: fewer AND gates a trial

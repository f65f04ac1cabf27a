"""noise_floor in the plan (issue 46 item 4): the config key and its refusals, the plan's
noises, ring and calibration, the peer and a provider that disagree, and the co-signed ledger
and the summary that carry the three figures."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_ledger import PEER, _record, _resign, _run
from test_ledger import parser as parser  # the module's fixture

from spgc.privacy.ledger_format import LedgerError
from spgc.privacy.ledger_verify import verify_ledger
from spgc.privacy.noise_floor import floor_epsilons
from spgc.providers.errors import ProviderRefusal
from spgc.providers.plan_checks import check_privacy, effective_noise_multiplier
from spgc.servers.intake import ShareIntake
from spgc.servers.peer import config_differences
from spgc.servers.state import ServerState
from spgc.settings.config import ConfigError, ServerConfig
from spgc.settings.plan import make_plan
from spgc.wire import aggregation_pb2 as pb


def config(**kw) -> ServerConfig:
    base = {"role": 1, "mode": "spgc", "insecure": True, "providers": ["p1", "p2", "p3"],
            "dataset": "cancer", "rounds": 20, "min_providers": 1, "target_epsilon": 4.0,
            "sampling_rate": 0.05, "verify_inputs": "none"}  # fmt: skip
    return ServerConfig(**{**base, **kw})


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2.0])
def test_a_floor_outside_zero_one_is_refused(bad):
    with pytest.raises(ConfigError, match=r"^ServerConfig: noise_floor: Input should be"):
        config(noise_floor=bad)


@pytest.mark.parametrize("mode", ["dng", "only-mpc", "plain", "ldp"])
def test_a_floor_in_a_mode_without_joint_noise_is_refused(mode):
    extra = {"verify_inputs": "none"} if mode != "dng" else {}
    with pytest.raises(ConfigError, match=f"noise_floor: 0.25 with mode {mode}: a noise floor"):
        config(mode=mode, noise_floor=0.25, **extra)


def test_a_floor_with_standardize_is_refused():
    """The feature statistics' release is not accounted with a floor yet (issue 48 part 2)."""
    with pytest.raises(ConfigError, match=r"noise_floor: 0\.25 with standardize: true"):
        config(noise_floor=0.25, standardize=True)


@pytest.mark.parametrize("mode", ["spgc", "preprocessed"])
def test_the_plans_noises_ring_and_count(mode, tmp_path):
    extra = {"pool_dir": tmp_path / "pool"} if mode == "preprocessed" else {}
    plain = make_plan(config(mode=mode, noise_multiplier=1.0, **extra))
    floor = make_plan(config(mode=mode, noise_multiplier=1.0, noise_floor=0.25, **extra))
    sigma = floor.sigma_units
    assert sigma == plain.sigma_units  # an explicit multiplier is the plan's sigma
    assert floor.joint_sigma_units_for(0) == pytest.approx(sigma * math.sqrt(0.75))
    assert floor.floor_sigma_units_for(0) == pytest.approx(sigma * 0.5)
    assert plain.floor_sigma_units_for(0) == 0.0 and plain.joint_sigma_units_for(0) == sigma
    # everyone who sees the release faces sqrt(1.25) sigma: 11.8% more noise std
    assert floor.total_noise_std_units / plain.total_noise_std_units == pytest.approx(1.118034)
    assert floor.noise_samples_per_step(3) == 3 * plain.noise_samples_per_step(3)
    assert floor.ring_bits >= plain.ring_bits  # |S| + |N_1| + |N_2| fits
    assert floor.training_config("r").noise_floor == 0.25
    # no floor: the TrainingConfig's bytes as before the field existed (proto3 leaves 0 out)
    announced = pb.TrainingConfig.FromString(plain.training_config("r").SerializeToString())
    assert "noise_floor" not in [f.name for f, _ in announced.ListFields()]


def test_calibration_holds_the_target_against_one_curious_server():
    plain = make_plan(config())
    floor = make_plan(config(noise_floor=0.25))
    assert floor.noise_multiplier > plain.noise_multiplier  # the split bound's small price
    acc = floor.new_accountant()
    assert acc is not None
    curious = floor.floor_multipliers().curious_server
    assert acc.noise_multiplier == pytest.approx(curious)
    assert curious == pytest.approx(plain.noise_multiplier, rel=1e-9)
    assert acc.epsilon_after(20) <= 4.0 * (1 + 1e-9)


def test_the_peer_and_a_provider_refuse_another_floor():
    a = make_plan(config(noise_floor=0.25)).training_config("r")
    b = make_plan(config(noise_floor=0.5)).training_config("r")
    assert [d for d in config_differences(a, b) if d.startswith("noise_floor")] == [
        "noise_floor (h1 0.25, h2 0.5)"
    ]
    wants = SimpleNamespace(max_step_epsilon=None, min_noise_multiplier=None, step_delta=1e-5,
                            min_noise_floor=0.5, min_security="semi-honest")  # fmt: skip
    with pytest.raises(ProviderRefusal, match=r"noise_floor 0\.25, below this provider"):
        check_privacy(a, wants)  # type: ignore[arg-type]
    check_privacy(b, wants)  # type: ignore[arg-type]
    # a provider accounts what one curious server does not know: the split bound's multiplier
    assert effective_noise_multiplier(a) < a.noise_multiplier


def _state(tmp_path: Path, **kw) -> ServerState:
    plan = make_plan(config(**kw))
    state = ServerState(plan, pb.SERVER_ROLE_H1, ShareIntake(plan.dim, plan.ring_bits, tmp_path))
    state.run_id, state.config = "floor", plan.training_config("floor")
    state.set_peer_ledger_key(PEER.public_key().public_bytes_raw())
    state.open_ledger()
    return state


def test_the_ledger_and_the_summary_carry_the_three_figures(tmp_path, parser, capsys):
    state = _state(tmp_path, noise_floor=0.25)
    ledger = state.ledger
    assert ledger is not None
    header = json.loads(ledger.lines[0])
    assert header["noise_floor"] == {"fraction": 0.25, "coordinates": state.plan.share_dim}
    acc = state.accountant
    assert acc is not None
    for t in range(3):
        acc.step()
        _record(ledger, t, state.plan.noise_samples_per_step(3), acc.epsilon())
    path = tmp_path / "h1.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in ledger.lines))
    report = verify_ledger(path)
    figures = floor_epsilons(header, 3)
    assert figures is not None and report.noise_floor is not None
    assert report.noise_floor["epsilon"] == figures
    assert report.epsilon == pytest.approx(figures["curious_server"])
    assert figures["everyone"] < figures["curious_server"] < figures["deviating_server"]
    summary = state.summary()["noise_floor"]
    assert summary["epsilon"] == pytest.approx(figures)
    code, out, _ = _run(parser, capsys, "--ledger", path)
    assert code == 3  # verified, not closed
    assert "noise floor 0.25: epsilon against everyone who sees the release" in out
    assert "one server that deviates" in out
    # The floor is co-signed: a header re-signed with the server's own real key without it
    # (claiming the plain plan's figure) no longer matches the releases the peer signed.
    entries = [json.loads(line) for line in ledger.lines]
    del entries[0]["noise_floor"]
    with pytest.raises(LedgerError, match="line 2: noise_floor differs from the header's"):
        verify_ledger(_resign(entries, ledger.key))


def test_no_floor_writes_the_header_as_before(tmp_path):
    state = _state(tmp_path)
    assert state.ledger is not None
    assert "noise_floor" not in json.loads(state.ledger.lines[0])
    assert "noise_floor" not in state.summary()
    assert verify_ledger(list(state.ledger.lines)).noise_floor is None

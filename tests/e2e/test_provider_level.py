"""Provider-level DP (DP-FedAvg, issue 36): the plan, the accountant's unit, the provider's coin
and local training, the servers' step, and the in-process simulation at a small size."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import loopback_server_config, run_in_process
from torch import nn

from spgc.app.simulate import SimulationError, SimulationOptions, run_simulation
from spgc.common.csprng import SecureRandom
from spgc.learning.data import load_dataset, split_among_providers
from spgc.learning.local_training import LocalTraining, clipped_delta, selected_this_round
from spgc.learning.models import flatten_params
from spgc.learning.optim import Adam, SgdStep, mean_delta_direction, mean_gradient, server_optimizer
from spgc.learning.trainable import TrainableCoordinates, set_trainable_mask
from spgc.privacy.accounting import PrivacyAccountant, adjacency_of, quiet_dp_accounting
from spgc.protocol.encoding import default_rounding_rng
from spgc.providers.errors import ProviderRefusal
from spgc.providers.plan_checks import (
    accountant_sampling,
    build_provider_model,
    check_adjacency,
    check_training_config,
    effective_noise_multiplier,
    round_sampling_rate,
    trained_coordinates,
)
from spgc.providers.training import Training
from spgc.servers.peer import config_differences
from spgc.settings.config import ConfigError
from spgc.settings.config_files import load_server_config
from spgc.settings.plan import make_plan
from spgc.settings.provider_config import ProviderConfig


def provider_cfg(**changes: object):
    base: dict[str, object] = {
        "adjacency": "provider",
        "providers": [f"p{i}" for i in range(20)],
        "sampling_rate": 0.5,
        "rounds": 5,
        "target_epsilon": 4.0,
        "verify_inputs": "none",
    }
    return loopback_server_config(**{**base, **changes})


def test_the_accountant_names_its_unit_and_the_arithmetic_is_the_same():
    with quiet_dp_accounting():
        example = PrivacyAccountant(1.1, 1e-5, 0.1)
        provider = PrivacyAccountant(1.1, 1e-5, 0.1, unit="provider")
        assert provider.epsilon_after(50) == example.epsilon_after(50)
    assert example.adjacency == "add/remove one example"
    assert provider.adjacency == "add/remove one provider"
    assert adjacency_of("fixed") == "replace one example"
    with pytest.raises(ValueError, match="unit must be one of example, provider"):
        PrivacyAccountant(1.1, 1e-5, 0.1, unit="household")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="Poisson coins only"):
        PrivacyAccountant(1.1, 1e-5, None, sampling="fixed", sample_size=2, population=10,
                          unit="provider")  # fmt: skip


def test_plan_samples_providers_and_announces_the_local_training():
    with quiet_dp_accounting():
        plan = make_plan(provider_cfg(local_epochs=2, local_batch_size=7, local_lr=0.2))
    assert plan.max_batch_size == 1  # one clipped delta per provider
    assert plan.sampling == {"sampling_rate": 0.5, "sampling": "poisson", "unit": "provider"}
    assert plan.expected_providers == 10.0
    assert plan.cfg.lr == 1.0  # FedAvg's server step when lr is not given
    tc = plan.training_config("r")
    assert tc.server_optimizer == "sgd" and tc.learning_rate == 1.0
    assert (tc.adjacency, tc.local_epochs, tc.local_batch_size, tc.local_optimizer) == (
        "provider", 2, 7, "sgd",
    )  # fmt: skip
    assert tc.local_learning_rate == 0.2 and tc.max_batch_size == 1
    assert accountant_sampling(tc) == plan.sampling
    assert check_adjacency(tc) is True
    with quiet_dp_accounting():
        assert plan.new_accountant().adjacency == "add/remove one provider"
    # Example adjacency announces none of it, as before the fields existed.
    with quiet_dp_accounting():
        ex = make_plan(loopback_server_config(verify_inputs="none")).training_config("r")
    assert ex.adjacency == "" and ex.local_epochs == 0 and check_adjacency(ex) is False
    assert ex.server_optimizer == "adam"


def test_the_servers_update_rule_is_in_the_plan_and_compared_at_the_handshake():
    """server_optimizer: adam or sgd for either adjacency (provider-level adam: FedAdam); both
    servers must name the same, as every plan key."""
    sgd = loopback_server_config(verify_inputs="none", server_optimizer="sgd", lr=0.5)
    step = server_optimizer(3, sgd.lr, sgd.server_optimizer)
    assert isinstance(step, SgdStep)
    # DP-SGD's step: parameters minus lr times the noisy mean gradient, exactly.
    assert step.step(np.array([1.0, 2.0, 3.0]), np.array([2.0, -4.0, 0.5])).tolist() == [
        0.0, 4.0, 2.75,
    ]  # fmt: skip
    assert isinstance(
        server_optimizer(3, 1.0, provider_cfg(server_optimizer="adam").server_optimizer), Adam
    )
    with quiet_dp_accounting():
        sgd_plan = make_plan(sgd)
        a = sgd_plan.training_config("r")
        b = make_plan(loopback_server_config(verify_inputs="none", lr=0.5)).training_config("r")
    assert config_differences(a, b) == ["server_optimizer (h1 'sgd', h2 'adam')"]
    # SGD steps on the mean over the examples a round is expected to hold (Adam's step does
    # not change with the gradient's scale, SGD's would): q x the data set's examples.
    assert sgd_plan.expected_examples == pytest.approx(
        sgd.sampling_rate * load_dataset(sgd.dataset).n_train
    )
    assert mean_gradient(np.array([30.0, -6.0]), 3.0).tolist() == [10.0, -2.0]
    with pytest.raises(ConfigError, match="server_optimizer: sgd with providers' own data"):
        loopback_server_config(
            server_optimizer="sgd", dataset="", model="cancer", max_batch_size=64
        )
    with pytest.raises(ConfigError, match="server_optimizer"):
        loopback_server_config(server_optimizer="rmsprop")
    with pytest.raises(ValueError, match="server optimizer must be one of"):
        server_optimizer(3, 1.0, "provider")


def test_a_noise_that_swamps_the_expected_providers_is_refused_naming_the_figures():
    # 3 providers at q 0.1: 0.3 expected a round, far below any useful noise multiplier.
    cfg = provider_cfg(providers=["p1", "p2", "p3"], sampling_rate=0.1, min_providers=1)
    with (
        pytest.raises(ValueError, match=r"more than clip_norm x the 0\.3 providers"),
        quiet_dp_accounting(),
    ):
        make_plan(cfg)
    # An explicit multiplier just below the expected count passes.
    with quiet_dp_accounting():
        make_plan(provider_cfg(noise_multiplier=9.0, target_epsilon=1e6))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"batch_size": 5}, "batch_size .fixed batches of examples. does not apply"),
        ({"max_batch_size": 8}, "max_batch_size 8 does not apply"),
        ({"adjacency": "household"}, "adjacency"),
        ({"local_optimizer": "lbfgs"}, "local_optimizer"),
        ({"local_epochs": 0}, "local_epochs"),
    ],
)
def test_bad_provider_level_settings_are_refused_in_one_line(changes, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        provider_cfg(**changes)


def test_an_explicit_server_lr_is_kept():
    assert provider_cfg(lr=0.5).lr == 0.5


def test_providers_refuse_a_provider_level_plan_they_cannot_follow():
    with quiet_dp_accounting():
        good = make_plan(provider_cfg()).training_config("r")
    for field, value, message in (
        ("adjacency", "household", "knows example and provider"),
        ("max_batch_size", 4, "max_batch_size 4"),
        ("local_epochs", 0, "without its local training"),
        ("local_optimizer", "lbfgs", "local_optimizer 'lbfgs'"),
    ):
        tc = type(good)()
        tc.CopyFrom(good)
        setattr(tc, field, value)
        with pytest.raises(ProviderRefusal, match=message):
            check_adjacency(tc)


def test_the_coin_takes_part_at_its_rate():
    rng = SecureRandom()
    draws = sum(selected_this_round(rng, 0.3) for _ in range(20_000))
    # Binomial(20000, 0.3): std 64.8; 6 std either side.
    assert abs(draws - 6000) < 390
    assert not any(selected_this_round(rng, 1e-9) for _ in range(1000))


def _tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 3))


def test_local_training_moves_the_model_and_the_delta_is_clipped():
    model = _tiny_model()
    coords = TrainableCoordinates.of_model(model)
    x = np.random.default_rng(1).normal(size=(40, 4)).astype(np.float32)
    y = np.arange(40) % 3
    training = LocalTraining(epochs=3, batch_size=8, lr=0.5)
    before = coords.trainable_part(
        np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    )
    row = clipped_delta(model, x, y, coords, training, 0.05, SecureRandom())
    assert row.shape == (1, coords.count)
    assert np.linalg.norm(row) == pytest.approx(0.05, rel=1e-9)  # a large step: clipped
    after = np.concatenate([p.detach().numpy().ravel() for p in model.parameters()])
    assert not np.allclose(after, before)
    # No data: no step, a zero row (what an unselected provider encodes).
    model = _tiny_model()
    empty = clipped_delta(model, x[:0], y[:0], coords, training, 1.0, SecureRandom())
    assert not empty.any()
    with pytest.raises(ValueError, match="local optimizer"):
        LocalTraining(1, 1, 0.1, "lbfgs")


class LeftOutProvider(Training):
    """A provider's Training part on the plan's first round, without servers (what
    ProviderClient.connect sets, from the same functions)."""

    def __init__(self, hide_participation: bool) -> None:
        with quiet_dp_accounting():
            self.training = make_plan(provider_cfg(dataset="cancer")).training_config("r")
        self.cfg = ProviderConfig(
            name="p0", h1_address="127.0.0.1:1", insecure=True, allow_no_privacy=True,
            dataset="cancer", provider_count=20, hide_participation=hide_participation,
        )  # fmt: skip
        self.rounding_rng = default_rounding_rng()
        self.sampling_rng = SecureRandom()
        self.noise_seed, self.budget, self._round_infos = None, None, []
        ds = load_dataset("cancer")
        self._x, self._y = split_among_providers(ds.x_train, ds.y_train, 20, 0)
        self.fixed_point = check_training_config(self.training, self.cfg, len(self._x))
        self._model = build_provider_model(self.training, self.cfg)
        self._trained, self._frozen = trained_coordinates(self.training), None
        self.trained_on: list[int] = []

    def local_delta(self, idx: np.ndarray) -> np.ndarray:
        self.trained_on.append(len(idx))
        return super().local_delta(idx)


@pytest.mark.parametrize("hide", [True, False])
def test_a_left_out_provider_shares_zeros_after_the_same_work_when_it_hides(hide):
    """Left out by its coin, a provider shares zeros; with hide_participation (the default) it
    first trains on all its data as a selected one would, so its shares leave no sooner."""
    provider = LeftOutProvider(hide)
    params = flatten_params(provider._model)
    total, _, _ = provider.encode(params, np.zeros(0, dtype=np.int64))
    assert not total.any()  # the decoy's delta is never shared
    assert provider.trained_on == ([len(provider._x)] if hide else [])
    # Selected: the same work, and this time its clipped delta is what it shares.
    total, _, _ = provider.encode(params, np.arange(len(provider._x)))
    assert total.any() and provider.trained_on[-1] == len(provider._x)


def test_the_servers_step_is_plus_the_mean_delta_over_the_expected_providers():
    step = server_optimizer(3, 1.0, provider_cfg().server_optimizer)  # sgd by default here
    assert isinstance(step, SgdStep)
    params = np.array([1.0, 2.0, 3.0])
    sum_of_deltas = np.array([4.0, -8.0, 0.0])  # over 4 expected providers
    new = step.step(params, mean_delta_direction(sum_of_deltas, 4.0))
    assert new.tolist() == [2.0, 0.0, 3.0]
    state = step.state_dict()
    again = SgdStep(3, 1.0)
    again.load_state_dict(state)
    assert again.t == 1
    with pytest.raises(ValueError, match="expected providers must be > 0"):
        mean_delta_direction(sum_of_deltas, 0.0)


def test_simulation_trains_cancer_with_many_providers_and_accounts_per_provider():
    rows: list[dict] = []
    summary = run_simulation(
        SimulationOptions(dataset="cancer", providers=40, rounds=6, sampling_rate=0.5,
                          epsilon=8.0, delta=1e-3, eval_every=3),
        rows_out=rows,
    )  # fmt: skip
    assert summary["adjacency"] == "add/remove one provider"
    assert summary["rounds"] == 6 and [r["round"] for r in rows] == [2, 5]
    assert 0 < summary["epsilon"] <= 8.0
    assert summary["expected_providers_per_round"] == 20.0
    assert 10 <= summary["mean_providers_per_round"] <= 30
    assert summary["test_accuracy"] >= 0.85  # cancer after 6 FedAvg rounds (about 0.9 here)
    with pytest.raises(SimulationError, match="mode 'dng'"):
        SimulationOptions(mode="dng").server_config()


def test_experiment_provider_level_refuses_bad_input_in_one_line(tmp_path):
    done = run_in_process(
        "experiment", "--adjacency", "provider", "--datasets", "cancer", "--providers", "1",
        "--out", str(tmp_path / "x.csv"),
    )  # fmt: skip
    assert done.returncode == 2
    assert "--providers must be in 2..100000" in done.stderr
    assert "Traceback" not in done.stderr
    done = run_in_process(
        "experiment", "--adjacency", "provider", "--epochs", "3", "--out", str(tmp_path / "x.csv")
    )
    assert done.returncode == 2 and "--epochs: not with --adjacency provider" in done.stderr


def test_local_training_leaves_the_elements_outside_a_trainable_mask_where_they_were():
    model = _tiny_model()
    mask = torch.zeros(3, 4, dtype=torch.bool)
    mask[0, :2] = True
    set_trainable_mask(model, "0.weight", mask)
    coords = TrainableCoordinates.of_model(model)
    assert coords.count == 2 + 3  # two weights and the bias
    before = model[0].weight.detach().clone()
    x = np.random.default_rng(2).normal(size=(30, 4)).astype(np.float32)
    y = np.arange(30) % 3
    row = clipped_delta(model, x, y, coords, LocalTraining(2, 5, 0.3, "adam"), 10.0,
                        SecureRandom())  # fmt: skip
    after = model[0].weight.detach()
    assert torch.equal(after[~mask], before[~mask])
    assert not torch.equal(after[mask], before[mask])
    assert row.shape == (1, 5) and np.abs(row[0, :2]).min() > 0


SCHEDULE = [
    {"from_release": 0, "noise_multiplier": 1.2, "sampling_rate": 0.3},
    {"from_release": 3, "noise_multiplier": 0.9, "sampling_rate": 0.5},
]


def test_a_noise_schedule_is_accounted_release_by_release():
    with quiet_dp_accounting():
        one = PrivacyAccountant(1.1, 1e-5, 0.1, unit="provider")
        same = PrivacyAccountant(1.1, 1e-5, 0.1, unit="provider", schedule=[(0, 1.1, 0.1)])
        split = PrivacyAccountant(1.1, 1e-5, 0.1, schedule=[(0, 1.1, 0.1), (5, 1.1, 0.1)])
        assert same.epsilon_after(12) == one.epsilon_after(12)
        assert split.epsilon_after(12) == pytest.approx(one.epsilon_after(12), rel=1e-12)
        phased = PrivacyAccountant(1.2, 1e-5, 0.3, schedule=[(0, 1.2, 0.3), (3, 0.9, 0.5)])
        first = PrivacyAccountant(1.2, 1e-5, 0.3)
        assert phased.epsilon_after(3) == pytest.approx(first.epsilon_after(3), rel=1e-12)
        assert phased.epsilon_after(6) > first.epsilon_after(6)  # less noise, more providers
        pld = PrivacyAccountant(
            1.1, 1e-5, 0.1, method="pld", schedule=[(0, 1.1, 0.1), (5, 1.1, 0.1)]
        )
        plain = PrivacyAccountant(1.1, 1e-5, 0.1, method="pld")
        assert pld.epsilon_after(12) == pytest.approx(plain.epsilon_after(12), rel=1e-6)
    assert phased.noise_multiplier_at(2) == 1.2 and phased.noise_multiplier_at(3) == 0.9
    for bad, message in (
        ([(1, 1.0, 0.1)], "start at step 0"),
        ([(0, 1.0, 0.1), (0, 1.0, 0.2)], "strictly later"),
        ([(0, 0.0, 0.1)], "noise multiplier must be > 0"),
        ([(0, 1.0, 1.5)], "rate in"),
    ):
        with pytest.raises(ValueError, match=message):
            PrivacyAccountant(1.0, 1e-5, 0.1, schedule=bad)


def test_the_plan_announces_the_schedule_and_sizes_each_release():
    cfg = provider_cfg(noise_schedule=SCHEDULE, mode="dng")
    with quiet_dp_accounting():
        plan = make_plan(cfg)
    tc = plan.training_config("r")
    assert [(p.from_release, p.noise_multiplier, p.sampling_rate) for p in tc.noise_schedule] == [
        (0, 1.2, 0.3), (3, 0.9, 0.5),
    ]  # fmt: skip
    bound = plan.fixed_point.l2_bound_units
    assert plan.noise_multiplier == 1.2 and plan.sigma_units_for(4) == 0.9 * bound
    assert plan.expected_providers_for(0) == 6.0 and plan.expected_providers_for(3) == 10.0
    assert plan.sampling["schedule"] == [[0, 1.2, 0.3], [3, 0.9, 0.5]]
    with quiet_dp_accounting():
        acc = plan.new_accountant()
        want = PrivacyAccountant(1.2, 1e-5, 0.3, schedule=[(0, 1.2, 0.3), (3, 0.9, 0.5)])
        assert acc.epsilon_after(5) == want.epsilon_after(5)
    # What a provider reads: each release's rate, and the weakest phase for its own checks
    # and its budget file (an upper bound on the servers' account).
    assert [round_sampling_rate(tc, r) for r in (0, 2, 3, 9)] == [0.3, 0.3, 0.5, 0.5]
    assert effective_noise_multiplier(tc) == pytest.approx(0.9)
    assert accountant_sampling(tc)["sampling_rate"] == 0.5


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"adjacency": "example"}, "noise_schedule needs adjacency: provider"),
        ({"mode": "ldp", "role": 1}, "noise_schedule with mode ldp"),
        ({"noise_multiplier": 1.0}, "leave noise_multiplier 0"),
        ({"noise_schedule": [SCHEDULE[1]]}, "start at step 0"),
    ],
)
def test_bad_noise_schedules_are_refused_in_one_line(changes, message):
    with pytest.raises((ConfigError, ValueError), match=message):
        provider_cfg(**{"noise_schedule": SCHEDULE, **changes})


def test_a_noise_schedule_may_be_written_short(tmp_path):
    """ "R:Z:Q,..." (what --noise-schedule takes) is the same schedule, in a file or by --set."""
    assert provider_cfg(noise_schedule="0:1.2:0.3, 3:0.9:0.5").noise_schedule == (
        provider_cfg(noise_schedule=SCHEDULE).noise_schedule
    )
    path = tmp_path / "h1.yaml"
    path.write_text(
        "insecure: true\nadjacency: provider\nsampling_rate: 0.5\nrounds: 5\n"
        "providers: [p0, p1, p2, p3, p4, p5, p6, p7, p8, p9, p10, p11, p12, p13, p14, p15, p16, "
        "p17, p18, p19]\n"
    )
    loaded = load_server_config(path, ["noise_schedule=0:1.2:0.3,3:0.9:0.5"])
    assert loaded.schedule_phases() == [(0, 1.2, 0.3), (3, 0.9, 0.5)]
    with pytest.raises(ConfigError, match=r"'3:0\.9' is not RELEASE:NOISE_MULTIPLIER:RATE"):
        load_server_config(path, ["noise_schedule=0:1.2:0.3,3:0.9"])


def test_simulation_follows_a_noise_schedule():
    rows: list[dict] = []
    summary = run_simulation(
        SimulationOptions(dataset="cancer", providers=20, rounds=5, epsilon=50.0,
                          noise_schedule="0:1.2:0.3,3:0.9:0.5", eval_every=5),
        rows_out=rows,
    )  # fmt: skip
    with quiet_dp_accounting():
        want = PrivacyAccountant(1.2, 1e-3, 0.3, schedule=[(0, 1.2, 0.3), (3, 0.9, 0.5)])
        assert summary["epsilon"] == pytest.approx(want.epsilon_after(5), rel=1e-12)
    assert rows[-1]["noise_multiplier"] == 0.9
    with pytest.raises(SimulationError, match="not RELEASE:NOISE_MULTIPLIER:RATE"):
        SimulationOptions(noise_schedule="0:1.0").server_config()

"""standardize: true end to end (issue 48 part 2): the servers release the feature statistics
as the run's round 0 (shares, norm proofs, the circuit's discrete Gaussian), counted in both
ledgers and the providers' budgets before anything uses them; every provider and the test set
standardise with them; the exported model applies them to raw features."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO_ROOT
from test_server_daemon import PROVIDERS, bind_pair, start_pair
from test_server_daemon import pki as pki  # the module's fixture: certificates for h1, h2, p1..p3
from test_user_plans import provider_config

from spgc.learning.export import StandardizedInputs, load_model, read_report
from spgc.learning.models import resolve_model
from spgc.privacy.ledger_verify import verify_ledger
from spgc.providers.client import ProviderClient, ProviderRefusal
from spgc.providers.plan_checks import check_standardize
from spgc.servers.intake import ShareIntake
from spgc.servers.state import ServerState
from spgc.settings.config import ServerConfig
from spgc.settings.plan import make_plan
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import aggregation_pb2 as pb

MODEL = f"{REPO_ROOT / 'examples' / 'standardize' / 'model.py'}:linear"  # 8 features in
RANGES = [[0.0, 100.0], [0.0, 1.0], [10.0, 60.0], [50.0, 250.0],
          [0.0, 400.0], [0.0, 500.0], [0.0, 3.0], [0.0, 800.0]]  # fmt: skip
MEANS = np.array([50.0, 0.5, 30.0, 130.0, 120.0, 100.0, 1.0, 150.0])
STDS = np.array([15.0, 0.5, 5.0, 20.0, 35.0, 30.0, 0.25, 60.0])
ROWS = 300


def _write(path: Path, rng: np.random.Generator, n: int) -> np.ndarray:
    x = rng.normal(MEANS, STDS, (n, len(MEANS)))
    x[:, 1] = rng.integers(0, 2, n)
    y = ((x - MEANS) / STDS) @ np.linspace(0.5, -0.3, len(MEANS))
    header = ",".join([f"f{j}" for j in range(len(MEANS))] + ["y"])
    np.savetxt(path, np.column_stack([x, y]), delimiter=",", header=header, comments="")
    return x


RUN = {
    "dataset": "",
    "model": MODEL,
    "task": "regression",
    "max_batch_size": 200,
    "sampling_rate": 0.2,
    "lr": 0.05,
    "target_epsilon": 8.0,
    "round_deadline": 30.0,
    "rounds": 2,
    "verify_inputs": "l2",
    "standardize": True,
    "feature_ranges": RANGES,
    "standardize_epsilon": 1.0,
    "standardize_max_rows": ROWS,
}


@pytest.mark.parametrize("mode", ["spgc", "dng"])  # the circuit's noise, each server's
def test_the_servers_release_the_statistics_first_and_everyone_uses_them(
    pki: Path, tmp_path: Path, mode: str
) -> None:
    rng = np.random.default_rng(3)  # test data only; shares and noise come from the CSPRNG
    raw = {name: _write(tmp_path / f"{name}.csv", rng, ROWS) for name in PROVIDERS}
    test_x = _write(tmp_path / "test.csv", rng, 200)
    d1, d2 = start_pair(pki, tmp_path, **RUN, test_data=str(tmp_path / "test.csv"),
                        test_data_label="y", mode=mode)  # fmt: skip
    clients = [ProviderClient(_provider(pki, d1, d2, tmp_path, i)) for i in range(3)]
    try:
        errors = _run(clients)
        assert not errors, errors
        assert d1.wait(60) and d2.wait(60)
        summary = d1.state.summary()
        assert summary["failure"] is None and summary["steps"] == 2  # and the statistics
        released = d1.state.standardization
        assert released is not None
        # Both servers and every provider hold the same released statistics, near the data's.
        assert d2.state.standardization.to_dict() == released.to_dict()
        pooled = np.clip(np.concatenate(list(raw.values())), *np.array(RANGES).T)
        # The release's noise on a mean is about z sqrt(2F + 1) sqrt(2) / n of its range:
        # six times that is never exceeded in practice (a chance below 1e-8 per feature).
        stats = d1.plan.feature_stats
        width = np.ptp(np.array(RANGES), axis=1)
        noise = stats.noise_multiplier * np.sqrt(stats.dim * 2) / len(pooled) * width
        assert np.all(np.abs(released.mean - pooled.mean(axis=0)) <= 6 * noise)
        for client, name in zip(clients, PROVIDERS, strict=True):
            assert client.standardization.to_dict() == {**released.to_dict(), "examples": 0.0}
            # It trains on them (its CSV read as float32: to float32 precision).
            assert np.allclose(client._x, released.apply(raw[name]), rtol=1e-5, atol=1e-4)
        assert d1.state.evaluator._standardization is released  # so is the test set
        _check_counted(tmp_path, d1)
        # The exported model carries the statistics and its loader applies them.
        path = tmp_path / "s1" / "model.safetensors"
        assert read_report(path)["feature_standardization"] == released.to_dict()
        model = load_model(path, resolve_model(MODEL))
        assert isinstance(model, StandardizedInputs)
        inner = resolve_model(MODEL)
        inner.load_state_dict(model.model.state_dict())
        raw_in = torch.as_tensor(test_x, dtype=torch.float32)
        by_hand = torch.as_tensor(released.apply(test_x))
        with torch.no_grad():
            assert torch.allclose(model(raw_in), inner(by_hand), atol=1e-5)
    finally:
        for c in clients:
            c.close()
        d1.stop()
        d2.stop()
    # A restart from the checkpoint holds the released statistics (and evaluates with them).
    a, b = bind_pair(pki, tmp_path, **RUN, test_data=str(tmp_path / "test.csv"),
                     test_data_label="y", mode=mode)  # fmt: skip
    try:
        for daemon in (a, b):
            assert daemon.state.standardization.to_dict() == released.to_dict()
            assert daemon.state.evaluator._standardization.to_dict() == released.to_dict()
            assert (daemon.state.releases, daemon.state.steps) == (3, 2)
    finally:
        a.stop()
        b.stop()


def _provider(pki: Path, d1, d2, tmp_path: Path, index: int, standardize: bool = True):
    """Provider ``index`` on its own CSV file, budget file in its own folder."""
    name = PROVIDERS[index]
    return provider_config(
        pki, d1, d2, index, model=MODEL, data=str(tmp_path / f"{name}.csv"), data_label="y",
        provider_count=1, provider_index=0, standardize=standardize, state_dir=tmp_path / name,
        task="regression",
    )  # fmt: skip


def _run(clients: list[ProviderClient]) -> list[BaseException]:
    errors: list[BaseException] = []

    def go(c: ProviderClient) -> None:
        try:
            c.run()
        except BaseException as exc:  # handed to the test
            errors.append(exc)

    threads = [threading.Thread(target=go, args=(c,)) for c in clients]
    for th in threads:
        th.start()
    for th in threads:
        th.join(240)
    return errors


def _check_counted(tmp_path: Path, d1) -> None:
    """Release 0 is the statistics', in both ledgers before its released line, re-accounted
    with the steps; each provider's budget holds round 0 under the plan with the release."""
    for server in ("s1", "s2"):
        ledger = tmp_path / server / "ledger.jsonl"
        report = verify_ledger(ledger)
        assert (report.steps, report.feature_stats_releases) == (3, 1)
        assert report.epsilon == pytest.approx(d1.state.epsilon(), rel=1e-9)
        entries = [json.loads(line) for line in ledger.read_text().splitlines()]
        kinds = [(e["kind"], e.get("release"), e.get("index")) for e in entries]
        first = kinds.index(("release", "feature_stats", 0))
        assert first < kinds.index(("released", None, 0))  # written ahead of the reveal
        assert all(k[1] is None for k in kinds[first + 1 :])  # once
    plan = make_plan(d1.cfg)
    assert d1.state.epsilon() == pytest.approx(plan.new_accountant().epsilon_after(3))
    for name in PROVIDERS:
        budget = next((tmp_path / name).rglob("*.json"))
        runs = json.loads(budget.read_text())["runs"]
        (entry,) = runs.values()
        assert entry["plan"]["stats_noise_multiplier"] == pytest.approx(
            plan.feature_stats.noise_multiplier
        )
        assert 0 in entry["rounds_submitted"]


def test_standardize_on_one_side_only_is_refused_naming_the_key(pki: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(4)
    for name in [*PROVIDERS, "test"]:
        _write(tmp_path / f"{name}.csv", rng, 50)
    test = {"test_data": str(tmp_path / "test.csv"), "test_data_label": "y"}
    d1, d2 = start_pair(pki, tmp_path, **{**RUN, "rounds": 1, **test})
    try:
        config = _provider(pki, d1, d2, tmp_path, 0, standardize=False)
        with (
            ProviderClient(config) as client,
            pytest.raises(
                ProviderRefusal, match=r"releases the feature statistics first .* set standardize"
            ),
        ):
            client.connect()
    finally:
        d1.stop()
        d2.stop()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"feature_ranges": None}, "standardize: true needs feature_ranges"),
        ({"mode": "preprocessed"}, "in modes spgc, dng"),
        ({"clip": "decay", "clip_decay": 0.9}, "needs clip: fixed"),
        ({"feature_ranges": "test_data", "test_data": "none"}, "needs the servers' own test"),
    ],
)
def test_standardize_configuration_errors_name_the_key(changes, message) -> None:
    values = {"insecure": True, "providers": ["p1", "p2"], **RUN, **changes}
    with pytest.raises(ValueError, match=message):
        ServerConfig(**values)


def test_ranges_the_release_cannot_fit_are_one_clear_line() -> None:
    cfg = ServerConfig(insecure=True, providers=["p1", "p2"], **{**RUN, "feature_ranges": [[0, 1]]})
    with pytest.raises(ValueError, match=r"^standardize: "):
        make_plan(cfg.model_copy(update={"standardize_max_rows": 10**9}))


def test_a_provider_holds_the_statistics_release_to_its_own_minimum_privacy(tmp_path: Path) -> None:
    cfg = ServerConfig(insecure=True, providers=["p1", "p2"], **RUN)
    announced = make_plan(cfg).training_config("run")  # z about 3.73 for epsilon 1
    base = {"name": "p1", "h1_address": "127.0.0.1:1", "insecure": True, "standardize": True}
    check_standardize(announced, ProviderConfig(**base, min_noise_multiplier=3.0))
    with pytest.raises(ProviderRefusal, match=r"release has noise multiplier 3\.7.* minimum 5"):
        check_standardize(announced, ProviderConfig(**base, min_noise_multiplier=5.0))
    with pytest.raises(ProviderRefusal, match=r"release is \(.*\)-DP .* minimum epsilon 0\.5"):
        check_standardize(announced, ProviderConfig(**base, max_step_epsilon=0.5))
    without = ServerConfig(insecure=True, providers=["p1", "p2"], **{**RUN, "standardize": False})
    with pytest.raises(ProviderRefusal, match="the servers' plan releases no feature statistics"):
        check_standardize(
            make_plan(without).training_config("run"),
            ProviderConfig(**base, min_noise_multiplier=0.5),
        )


def test_feature_ranges_from_the_servers_test_set(tmp_path: Path) -> None:
    x = _write(tmp_path / "test.csv", np.random.default_rng(5), 40)
    x[:, 1] = 0.0  # a constant column gets a unit-wide range around its value
    header = ",".join([f"f{j}" for j in range(x.shape[1])] + ["y"])
    np.savetxt(tmp_path / "test.csv", np.column_stack([x, np.zeros(40)]), delimiter=",",
               header=header, comments="")  # fmt: skip
    cfg = ServerConfig(
        insecure=True, providers=["p1", "p2"],
        **{**RUN, "feature_ranges": "test_data", "test_data": str(tmp_path / "test.csv"),
           "test_data_label": "y"},
    )  # fmt: skip
    ranges = make_plan(cfg).feature_stats.ranges
    expected_lo, expected_hi = x.min(axis=0), x.max(axis=0)
    expected_lo[1], expected_hi[1] = -0.5, 0.5
    assert np.allclose(ranges.lo, expected_lo, rtol=1e-6)
    assert np.allclose(ranges.hi, expected_hi, rtol=1e-6)


def test_a_statistics_release_counted_but_lost_ends_the_run_in_one_line(tmp_path: Path) -> None:
    cfg = ServerConfig(insecure=True, providers=["p1", "p2"], **{**RUN, "test_data": ""})
    plan = make_plan(cfg)
    state = ServerState(
        plan, pb.SERVER_ROLE_H1, ShareIntake(plan.share_dim, plan.ring_bits, tmp_path)
    )
    y = np.zeros(plan.share_dim)
    with pytest.raises(RuntimeError, match=r"release 0\) was counted but its result was lost"):
        state.apply_update(1, y, {}, {}, release=1)

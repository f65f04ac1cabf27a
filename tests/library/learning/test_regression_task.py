"""Regression and other losses (issue 33 item 3): the plan's task and loss, per-example
gradients of the loss, float targets, the regression test metrics, diabetes-regression."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from spgc.learning.data import dataset_task, load_dataset, load_user_data
from spgc.learning.gradients import check_model_on_data, clipped_gradient_sum, per_example_gradients
from spgc.learning.losses import task_loss_problem
from spgc.learning.models import PARAMETER_COUNTS, build_model
from spgc.learning.optim import evaluate_metrics, evaluate_regression
from spgc.providers.errors import ProviderRefusal
from spgc.providers.plan_checks import plan_task_loss
from spgc.servers.peer import config_differences
from spgc.settings.config import ServerConfig
from spgc.settings.plan import make_plan
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import aggregation_pb2 as pb

SPGC = str(Path(sys.executable).parent / "spgc")


def _regressor(outputs: int = 1) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, outputs))


def _autograd_rows(model: nn.Module, x: np.ndarray, y: np.ndarray, loss_fn) -> np.ndarray:
    """Each example's gradient by plain autograd, one example at a time."""
    rows = []
    for i in range(len(x)):
        model.zero_grad()
        out = model(torch.as_tensor(x[i : i + 1]))
        loss_fn(out, torch.as_tensor(y[i : i + 1])).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double().numpy())
    return np.stack(rows)


def test_per_example_mse_gradients_equal_autograd_per_example():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(9, 4)).astype(np.float32)
    y = rng.normal(size=9).astype(np.float32)
    model = _regressor()
    got = per_example_gradients(model, x, y, task="regression")
    want = _autograd_rows(model, x, y, lambda out, t: ((out.squeeze(-1) - t) ** 2).mean())
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # Several outputs: a row of targets per example, the mean over the outputs.
    model2 = _regressor(outputs=3)
    y2 = rng.normal(size=(9, 3)).astype(np.float32)
    got2 = per_example_gradients(model2, x, y2, task="regression", loss="mse")
    want2 = _autograd_rows(model2, x, y2, lambda out, t: ((out - t) ** 2).mean())
    np.testing.assert_allclose(got2, want2, rtol=1e-5, atol=1e-6)
    # The clipped sum takes the loss too.
    total = clipped_gradient_sum(model, x, y, 1e6, task="regression")
    np.testing.assert_allclose(total, want.sum(axis=0), rtol=1e-5, atol=1e-5)


def test_a_users_loss_function_is_differentiated_per_example(tmp_path, monkeypatch):
    (tmp_path / "my_losses.py").write_text(
        "def huber(outputs, targets):\n"
        "    import torch.nn.functional as F\n"
        "    return F.huber_loss(outputs.squeeze(-1), targets, delta=0.5)\n"
    )
    monkeypatch.chdir(tmp_path)
    rng = np.random.default_rng(2)
    x = rng.normal(size=(5, 4)).astype(np.float32)
    y = (3 * rng.normal(size=5)).astype(np.float32)
    model = _regressor()
    got = per_example_gradients(model, x, y, task="regression", loss="my_losses:huber")
    want = _autograd_rows(
        model,
        x,
        y,
        lambda out, t: torch.nn.functional.huber_loss(out.squeeze(-1), t, delta=0.5),
    )
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_evaluate_regression_matches_numpy():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(57, 4)).astype(np.float32)
    y = rng.normal(size=57).astype(np.float32)
    model = _regressor()
    with torch.no_grad():
        pred = model(torch.as_tensor(x)).squeeze(-1).double().numpy()
    err = pred - y.astype(np.float64)
    r2 = 1 - np.sum(err**2) / np.sum((y - y.mean()) ** 2)
    # batch_size 10: the batches' sums add up to the whole set's
    got = evaluate_regression(model, x, y, batch_size=10)
    assert got["test_mse"] == pytest.approx(np.mean(err**2), rel=1e-6)
    assert got["test_mae"] == pytest.approx(np.mean(np.abs(err)), rel=1e-6)
    assert got["test_r2"] == pytest.approx(r2, rel=1e-6)
    assert got["test_loss"] == got["test_mse"]
    assert evaluate_metrics(model, x, y, task="regression") == pytest.approx(got)
    # A model predicting the mean of the targets has R^2 0.
    const = nn.Linear(4, 1)
    with torch.no_grad():
        const.weight.zero_()
        const.bias.fill_(float(y.astype(np.float64).mean()))
    assert evaluate_regression(const, x, y)["test_r2"] == pytest.approx(0.0, abs=1e-6)
    # Classification still gives loss and accuracy.
    clf = build_model("cancer")
    ds = load_dataset("cancer")
    assert set(evaluate_metrics(clf, ds.x_test, ds.y_test)) == {"test_loss", "test_accuracy"}


def _server(**kw) -> ServerConfig:
    return ServerConfig(insecure=True, providers=["p1"], min_providers=1, **kw)


def test_config_task_and_loss_validation():
    assert (_server().task, _server().loss_name) == ("classification", "cross_entropy")
    reg = _server(dataset="diabetes-regression")
    assert (reg.task, reg.loss_name) == ("regression", "mse")  # the data set's task
    assert _server(task="regression", dataset="", model="m:f", max_batch_size=8).loss_name == "mse"
    for kw, words in (
        ({"task": "regression", "loss": "cross_entropy", "dataset": "", "model": "m:f",
          "max_batch_size": 8}, "loss cross_entropy is for task classification, not regression"),
        ({"loss": "mse"}, "loss mse is for task regression, not classification"),
        ({"loss": "hinge"}, "loss must be one of cross_entropy, mse or package.module:function"),
        ({"dataset": "diabetes-regression", "task": "classification"},
         "dataset diabetes-regression is a regression data set, but task is classification"),
        ({"task": "ordinal"}, "task"),
    ):  # fmt: skip
        # pydantic's ValidationError, or the one-line ConfigError: both ValueErrors
        with pytest.raises(ValueError, match=words):
            _server(**kw)
    assert task_loss_problem("regression", "my.module:loss") is None


def test_plan_announces_task_and_loss_and_servers_compare_them():
    cfg = _server(dataset="diabetes-regression")
    plan = make_plan(cfg)
    assert plan.dim == PARAMETER_COUNTS["diabetes-regression"] == 11
    tc = plan.training_config("run")
    assert (tc.task, tc.loss) == ("regression", "mse")
    other = pb_copy(tc)
    other.loss = "my.module:huber"
    assert config_differences(tc, other) == ["loss (h1 'mse', h2 'my.module:huber')"]


def test_task_and_loss_field_numbers_are_pinned():
    fields = pb.TrainingConfig.DESCRIPTOR.fields_by_name
    assert (fields["task"].number, fields["loss"].number) == (33, 34)


def pb_copy(msg):
    out = type(msg)()
    out.CopyFrom(msg)
    return out


def _provider(**kw) -> ProviderConfig:
    return ProviderConfig(
        name="p1", h1_address="127.0.0.1:1", insecure=True, allow_no_privacy=True, **kw
    )


def test_provider_takes_task_and_loss_from_the_plan():
    cfg = _provider()
    old = SimpleNamespace(task="", loss="")  # a server that predates the fields
    assert plan_task_loss(old, cfg) == ("classification", "cross_entropy")
    assert plan_task_loss(SimpleNamespace(task="regression", loss="mse"), cfg) == (
        "regression",
        "mse",
    )
    with pytest.raises(ProviderRefusal, match="loss mse is for task regression"):
        plan_task_loss(SimpleNamespace(task="classification", loss="mse"), cfg)
    with pytest.raises(ProviderRefusal, match="set loss: to the same reference"):
        plan_task_loss(SimpleNamespace(task="regression", loss="os:system"), cfg)
    regression = SimpleNamespace(task="regression", loss="")
    with pytest.raises(ProviderRefusal, match="servers train a regression task; this provider"):
        plan_task_loss(regression, _provider(task="classification"))
    assert plan_task_loss(regression, _provider(task="regression")) == ("regression", "mse")
    mine = _provider(loss="my_losses:huber")
    assert plan_task_loss(SimpleNamespace(task="regression", loss="my_losses:huber"), mine) == (
        "regression",
        "my_losses:huber",
    )


def test_float_labels_for_regression(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,label\n1,2,0.5\n3,4,-1.25\n5,6,2\n")
    ds = load_user_data(path, task="regression")
    assert ds.y_train.dtype == np.float32 and ds.y_train.tolist() == [0.5, -1.25, 2.0]
    assert ds.n_classes == 1
    with pytest.raises(ValueError, match=r"non-integers \(example 0: 0\.5\).*task: regression"):
        load_user_data(path)
    path.write_text("a,label\n1,nan\n")
    # named by the file's line and column and by the example (docs/CONFIG.md "Data files")
    with pytest.raises(ValueError, match=r"line 2, column 'label' \(example 0, its label.*NaN"):
        load_user_data(path, task="regression")
    model = nn.Sequential(nn.Linear(2, 1))
    x = np.ones((3, 2), dtype=np.float32)
    check_model_on_data(model, x, np.zeros(3, np.float32), "d", task="regression")
    with pytest.raises(ValueError, match="2 target\\(s\\) per example, but the model has 1"):
        check_model_on_data(model, x, np.zeros((3, 2), np.float32), "d", task="regression")


def test_diabetes_regression_data_set_is_deterministic_and_standardised():
    a, b = load_dataset("diabetes-regression"), load_dataset("diabetes-regression")
    assert dataset_task("diabetes-regression") == "regression"
    assert (a.n_train, a.n_test, a.input_shape) == (300, 142, (10,))
    np.testing.assert_array_equal(a.test_index, b.test_index)
    np.testing.assert_array_equal(a.y_train, b.y_train)
    assert abs(float(a.y_train.mean())) < 1e-5 and abs(float(a.y_train.std()) - 1) < 1e-5
    assert not set(a.train_index.tolist()) & set(a.test_index.tolist())
    model = build_model("diabetes-regression")
    check_model_on_data(model, a.x_train, a.y_train, "diabetes", task="regression")


def test_demo_trains_diabetes_regression_and_reports_r2(tmp_path):
    done = subprocess.run(
        # plain: one server and no circuit, so that it runs in about a minute
        [SPGC, "demo", "--json", "--dataset", "diabetes-regression", "--rounds", "5", "--insecure",
         "--mode", "plain", "--timeout", "240", "--state-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert (summary["task"], summary["loss"]) == ("regression", "mse")
    assert summary["test_accuracy"] is None
    assert summary["test_mse"] == summary["test_loss"] > 0 and summary["test_mae"] > 0
    assert summary["test_r2"] > 0, summary["history"]
    assert all("test_r2" in r for r in summary["history"] if r["published"])
    assert " r2 " in done.stderr  # the round lines
    report = json.loads((tmp_path / "h1" / "model.json").read_text())  # the model report
    assert (report["task"], report["loss"]) == ("regression", "mse")
    assert report["test_metrics"]["test_r2"] == summary["test_r2"]


def test_regression_metrics_reach_prometheus_and_the_round_summary():
    from prometheus_client import generate_latest

    from spgc.servers.metrics import ServerMetrics
    from spgc.servers.round_phases import RoundRecord, round_summary

    metrics = ServerMetrics(epsilon=lambda: None, epsilon_budget=None)
    rec = RoundRecord(0, pb.ROUND_PHASE_PUBLISHED, test_loss=0.5)
    rec.test_metrics = {"test_mse": 0.5, "test_mae": 0.25, "test_r2": 0.75}
    metrics.observe_round(rec)
    text = generate_latest(metrics.registry).decode()
    for line in ("spgc_test_mse 0.5", "spgc_test_mae 0.25", "spgc_test_r2 0.75"):
        assert line in text.splitlines()
    assert "spgc_test_accuracy NaN" in text.splitlines()
    summary = round_summary(rec)
    assert (summary["test_r2"], summary["test_accuracy"]) == (0.75, None)

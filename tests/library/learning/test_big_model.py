"""The 10M-parameter model (mnist-wide): its size, the `model` server key that selects it, its
validation, and the automatic gradient-chunk cap that keeps a provider's memory bounded.

No test trains it (about 1 s per example per provider); the end-to-end run is a manual check.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from spgc.app.demo import MODEL_DEFAULTS, DemoError, DemoOptions, write_configs
from spgc.learning.gradients import CHUNK_BUDGET_BYTES, bounded_chunk, clipped_gradient_sum
from spgc.learning.models import (
    MODEL_INPUT_SHAPES,
    MODEL_NAMES,
    PARAMETER_COUNTS,
    build_model,
    parameter_count,
)
from spgc.providers.plan_checks import _model_key
from spgc.servers.evaluation import model_for
from spgc.settings.config import ConfigError, ServerConfig
from spgc.settings.config_files import load_server_config
from spgc.settings.plan import make_plan

WIDE_D = 10_000_315  # 784*12,579 + 12,579 + 12,579*10 + 10


def _cfg(**kw: object) -> ServerConfig:
    base: dict[str, object] = {
        "role": 1,
        "insecure": True,
        "providers": ["p1", "p2", "p3"],
        "dataset": "mnist",
        "mode": "only-mpc",  # no noise calibration: the plan needs no data
        "max_batch_size": 64,
    }
    base.update(kw)
    return ServerConfig(**base)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def wide() -> nn.Module:
    return build_model("mnist-wide", seed=0)


def test_mnist_wide_has_over_ten_million_parameters(wide: nn.Module) -> None:
    assert "mnist-wide" in MODEL_NAMES
    assert parameter_count(wide) == PARAMETER_COUNTS["mnist-wide"] == WIDE_D >= 10_000_000
    assert MODEL_INPUT_SHAPES["mnist-wide"] == MODEL_INPUT_SHAPES["mnist"]
    widths = [(m.in_features, m.out_features) for m in wide.modules() if isinstance(m, nn.Linear)]
    assert widths == [(784, 12_579), (12_579, 10)]
    assert wide(torch.zeros(2, 1, 28, 28)).shape == (2, 10)


def test_config_key_builds_and_announces_the_model() -> None:
    plan = make_plan(_cfg(model="mnist-wide"))
    assert plan.dim == WIDE_D
    tc = plan.training_config("run")
    assert (tc.dataset, tc.model, tc.num_parameters) == ("mnist", "mnist-wide", WIDE_D)
    assert _model_key(tc.model, tc.dataset) == "mnist-wide"  # the provider builds the same
    assert model_for("mnist", WIDE_D) == "mnist-wide"  # and the servers evaluate it
    # Without the key: the dataset's own model, announced under the dataset's name.
    default = make_plan(_cfg()).training_config("run")
    assert (default.model, default.num_parameters) == ("mnist", 28_938)
    assert model_for("mnist", 28_938) == "mnist"


def test_config_refuses_unknown_model_and_wrong_input_shape(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"model must be one of .*mnist-wide.*'resnet'"):
        _cfg(model="resnet")
    with pytest.raises(ValueError, match=r"model mnist-wide reads inputs of shape \(1, 28, 28\)"):
        _cfg(model="mnist-wide", dataset="cancer")
    with pytest.raises(ValueError, match="model cancer reads inputs of shape"):
        _cfg(model="cancer")
    f = tmp_path / "server.yaml"
    f.write_text("role: 1\ninsecure: true\nproviders: [a, b]\ndataset: mnist\n")
    assert load_server_config(f, ["model=mnist-wide"]).model_name == "mnist-wide"
    with pytest.raises(ConfigError, match="model must be one of"):
        load_server_config(f, ["model=mnist-tall"])


def test_gradient_chunk_is_capped_for_big_models() -> None:
    assert bounded_chunk(256, 28_938) == 256  # the paper's models keep the configured chunk
    assert bounded_chunk(256, 62) == 256
    assert bounded_chunk(256, WIDE_D) == 1  # 256 rows would be 20 GB of float64
    assert bounded_chunk(256, 1_000_000) == CHUNK_BUDGET_BYTES // 8_000_000 == 16
    for d in (1, 1_000, 100_000, 3_000_000, WIDE_D, 10**9):
        c = bounded_chunk(256, d)
        assert 1 <= c <= 256 and (c == 1 or c * d * 8 <= CHUNK_BUDGET_BYTES)
    assert bounded_chunk(4, 10, budget_bytes=160) == 2
    with pytest.raises(ValueError):
        bounded_chunk(0, 10)


def test_clipped_sum_with_capped_chunk_is_the_same_sum() -> None:
    # A tiny budget forces chunks of 1 row; the sum is the same up to float rounding.
    model = build_model("diabetes", seed=1)
    x = torch.randn(9, 8)
    y = torch.randint(0, 2, (9,))
    full = clipped_gradient_sum(model, x, y, 0.5, chunk_size=256)
    one = clipped_gradient_sum(model, x, y, 0.5, chunk_size=1)
    assert full.shape == one.shape == (642,)
    assert abs(full - one).max() < 1e-5


def test_demo_passes_the_model_to_the_servers(tmp_path: Path) -> None:
    import yaml

    opts = DemoOptions(dataset="mnist", model="mnist-wide", mode="dng", insecure=True)
    servers, _ = write_configs(opts, tmp_path)
    for path in servers:
        cfg = yaml.safe_load(path.read_text())
        assert cfg["model"] == "mnist-wide"
        assert cfg["sampling_rate"] == MODEL_DEFAULTS["mnist-wide"]["sampling_rate"]
        assert cfg["peer_timeout"] > cfg["round_deadline"]
    with pytest.raises(DemoError, match="does not read cancer"):
        write_configs(DemoOptions(dataset="cancer", model="mnist-wide"), tmp_path / "x")


def test_demo_takes_a_users_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`spgc demo --model file.py:factory`: checked on the dataset's examples before anything
    starts; both servers and every provider get the same factory (the file made absolute)."""
    import yaml

    (tmp_path / "mine.py").write_text(
        "import torch.nn as nn\n\n"
        "def small():\n    return nn.Sequential(nn.Linear(30, 4), nn.ReLU(), nn.Linear(4, 2))\n\n"
        "def wrong_width():\n    return nn.Linear(8, 2)\n"
    )
    monkeypatch.chdir(tmp_path)
    servers, providers = write_configs(
        DemoOptions(dataset="cancer", model="mine.py:small", insecure=True), tmp_path / "w"
    )
    want = f"{tmp_path / 'mine.py'}:small"
    assert {yaml.safe_load(p.read_text())["model"] for p in servers + providers} == {want}
    for ref, message in (
        ("mine.py:wrong_width", "the model cannot read the cancer data"),
        ("mine.py:missing", "has no attribute 'missing'"),
    ):
        with pytest.raises(DemoError, match=rf"^--model {ref}: .*{message}"):
            write_configs(DemoOptions(dataset="cancer", model=ref), tmp_path / "x")

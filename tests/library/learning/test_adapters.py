"""Adapters (issue 33 item 2): LoRA of our own (examples/finetune/model.py) and from peft.

Per-example gradients through the adapters equal a loop of single-example autograd gradients;
only the adapters and the head travel (their coordinates); a pretrained backbone's state, saved
under the plain model's names, loads into the wrapped model as its ``initial_model``, and a
state that fits neither way is refused in one line; a small run of `spgc demo` trains a model
with adapters through the real daemons and moves nothing frozen.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO_ROOT
from safetensors.torch import load_file, save_file
from torch import nn

from spgc.learning.adapters import backbone_name
from spgc.learning.gradients import per_example_gradients
from spgc.learning.models import (
    check_per_example_compatible,
    flatten_params,
    load_initial_state,
    model_fingerprint,
    resolve_model,
    trainable_count,
)
from spgc.learning.trainable import TrainableCoordinates

FINETUNE = REPO_ROOT / "examples" / "finetune"
MODEL_PY = FINETUNE / "model.py"
SPGC = str(Path(sys.executable).parent / "spgc")


def example(name: str, seed: int = 0) -> nn.Module:
    return resolve_model(f"{MODEL_PY}:{name}", seed=seed)


def the_example_module():
    """examples/finetune/model.py as a module (for its classes)."""
    return sys.modules[type(example("full")).__module__]


def moved_adapters(model: nn.Module, seed: int = 1) -> nn.Module:
    """LoRA's B starts at zero, which would leave A without a gradient: give every adapter
    weight random values, as after some training."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return model


def loop_gradients(model: nn.Module, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """One autograd call per example, over the trained parameters in named_parameters order."""
    params = [p for p in model.parameters() if p.requires_grad]
    rows = []
    for xi, yi in zip(x, y, strict=True):
        out = model(torch.as_tensor(xi).unsqueeze(0))
        loss = nn.functional.cross_entropy(out, torch.as_tensor(yi).reshape(1))
        grads = torch.autograd.grad(loss, params)
        rows.append(torch.cat([g.reshape(-1) for g in grads]).double().numpy())
    return np.stack(rows)


def digits(n: int = 24) -> tuple[np.ndarray, np.ndarray]:
    x_train, y_train, _, _ = the_example_module().private_data()
    return x_train[:n], y_train[:n]


def peft_model(dropout: float = 0.0) -> nn.Module:
    peft = pytest.importorskip("peft")
    mod = the_example_module()
    torch.manual_seed(0)
    config = peft.LoraConfig(
        r=mod.RANK,
        lora_alpha=mod.ALPHA,
        target_modules=list(mod.ADAPTED),
        lora_dropout=dropout,
    )
    model = peft.get_peft_model(mod.Classifier(), config)
    model.base_model.model.head.requires_grad_(True)
    return model


# ---------------------------------------------------------------------------------------------
# per-example gradients through the adapters
# ---------------------------------------------------------------------------------------------


def test_own_lora_gradients_equal_a_loop_over_examples():
    model = moved_adapters(example("factory"))
    x, y = digits()
    got = per_example_gradients(model, x, y, chunk_size=7)  # several chunks
    assert got.shape == (len(x), trainable_count(model)) == (24, 2181)
    np.testing.assert_allclose(got, loop_gradients(model, x, y), rtol=1e-4, atol=1e-6)
    assert np.abs(got).sum() > 0


def test_peft_lora_gradients_equal_a_loop_over_examples():
    model = moved_adapters(peft_model())
    x, y = digits()
    got = per_example_gradients(model, x, y, chunk_size=10)
    # The same adapters and head as the example's own: the same number of coordinates.
    assert got.shape == (len(x), 2181)
    np.testing.assert_allclose(got, loop_gradients(model, x, y), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("kind", ["own", "peft"])
def test_dropout_inside_lora_draws_a_mask_per_example(kind: str):
    if kind == "own":
        mod = the_example_module()
        torch.manual_seed(0)
        model = mod.with_adapters(mod.Classifier(), dropout=0.5)
    else:
        model = peft_model(dropout=0.5)
    model = moved_adapters(model)
    x, y = digits(1)
    x16, y16 = np.repeat(x, 16, axis=0), np.repeat(y, 16)
    model.train()
    torch.manual_seed(3)
    rows = per_example_gradients(model, x16, y16)
    assert np.isfinite(rows).all()
    # The same example 16 times: each copy gets its own dropout mask, so the rows differ ...
    assert len({r.tobytes() for r in rows}) > 1
    # ... and in eval mode (no dropout) they are all the loop's single gradient.
    model.eval()
    rows = per_example_gradients(model, x16, y16)
    np.testing.assert_allclose(rows, np.repeat(loop_gradients(model, x, y), 16, axis=0),
                               rtol=1e-4, atol=1e-6)  # fmt: skip


# ---------------------------------------------------------------------------------------------
# what travels
# ---------------------------------------------------------------------------------------------


def test_only_the_adapters_and_the_head_travel():
    adapters, full = example("factory"), example("full")
    layout = TrainableCoordinates.of_model(adapters)
    # LoRA rank 8 on the first layer (64 -> 128), the head 128x5+5
    assert layout.count == trainable_count(adapters) == 1536 + 645
    assert layout.total == 25_477 + 1536 and layout.frozen_count == 24_832  # the backbone
    assert TrainableCoordinates.of_model(full).count == trainable_count(full) == 25_477
    assert layout.count < full_count_tenth(full)
    trained = {n for n, p in adapters.named_parameters() if p.requires_grad}
    assert all("lora_" in n or n.startswith("head.") for n in trained)
    check_per_example_compatible(adapters)
    assert model_fingerprint(adapters) != model_fingerprint(full)


def full_count_tenth(full: nn.Module) -> float:
    return trainable_count(full) / 10


def test_peft_trains_the_same_coordinates():
    model = peft_model()
    assert trainable_count(model) == trainable_count(example("factory")) == 2181
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert all("lora_" in n or ".head." in n for n in trained)


# ---------------------------------------------------------------------------------------------
# initial_model: a pretrained backbone into the wrapped model
# ---------------------------------------------------------------------------------------------


def saved_backbone(tmp_path: Path, seed: int = 5) -> tuple[nn.Module, Path]:
    """A 'pretrained' classifier (other weights than seed 0's) and its state without the head,
    under the plain classifier's names, as pretrain.py saves it."""
    pretrained = example("full", seed=seed)
    state = {k: v for k, v in pretrained.state_dict().items() if k.startswith("backbone.")}
    path = tmp_path / "backbone.safetensors"
    save_file(state, str(path))
    return pretrained, path


def test_backbone_names():
    assert backbone_name("backbone.1.base_layer.weight") == "backbone.1.weight"
    assert backbone_name("base_model.model.backbone.3.base_layer.bias") == "backbone.3.bias"
    assert backbone_name("base_model.model.head.modules_to_save.default.weight") == "head.weight"
    assert backbone_name("base_model.model.head.original_module.bias") == "head.bias"
    assert backbone_name("backbone.1.lora_A") == "backbone.1.lora_A"
    assert backbone_name("head.weight") == "head.weight"


def test_a_backbone_loads_into_the_own_adapters_model(tmp_path: Path):
    pretrained, path = saved_backbone(tmp_path)
    model = example("factory")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    load_initial_state(model, path)
    state = model.state_dict()
    pretrained_state = pretrained.state_dict()
    for p in ("weight", "bias"):
        # The adapted layer's base_layer and the plain frozen layer both take the backbone.
        assert torch.equal(state[f"backbone.1.base_layer.{p}"], pretrained_state[f"backbone.1.{p}"])
        assert torch.equal(state[f"backbone.3.{p}"], pretrained_state[f"backbone.3.{p}"])
    # The adapter keeps the factory's start: B at zero, so the backbone's function.
    assert torch.equal(state["backbone.1.lora_A"], before["backbone.1.lora_A"])
    assert not state["backbone.1.lora_B"].any()
    assert torch.equal(state["head.weight"], before["head.weight"])
    # The wrapped model computes the pretrained backbone's features.
    x = torch.as_tensor(digits(8)[0])
    with torch.no_grad():
        assert torch.allclose(model.backbone(x), pretrained.backbone(x), atol=1e-6)
    # Its own export (every key) still loads exactly, as before.
    save_file(model.state_dict(), str(tmp_path / "export.safetensors"))
    again = example("factory", seed=9)
    load_initial_state(again, tmp_path / "export.safetensors")
    assert np.array_equal(flatten_params(again), flatten_params(model))


def test_a_backbone_loads_into_the_peft_model(tmp_path: Path):
    pretrained, path = saved_backbone(tmp_path)
    model = peft_model()
    load_initial_state(model, path)
    state = model.state_dict()
    assert torch.equal(state["base_model.model.backbone.1.base_layer.weight"],
                       pretrained.state_dict()["backbone.1.weight"])  # fmt: skip
    assert torch.equal(state["base_model.model.backbone.3.weight"],
                       pretrained.state_dict()["backbone.3.weight"])  # fmt: skip
    x = torch.as_tensor(digits(8)[0])
    with torch.no_grad():
        assert torch.allclose(
            model.base_model.model.backbone(x), pretrained.backbone(x), atol=1e-6
        )


def test_peft_modules_to_save_take_the_backbones_head(tmp_path: Path):
    peft = pytest.importorskip("peft")
    mod = the_example_module()
    config = peft.LoraConfig(r=2, target_modules=["backbone.1"], modules_to_save=["head"])
    model = peft.get_peft_model(mod.Classifier(), config)
    pretrained = example("full", seed=5)
    # A classifier pretrained for the same classes: its head too.
    path = tmp_path / "classifier.safetensors"
    save_file(pretrained.state_dict(), str(path))
    load_initial_state(model, path)
    state = model.state_dict()
    for copy in ("original_module", "modules_to_save.default"):
        key = f"base_model.model.head.{copy}.weight"
        assert torch.equal(state[key], pretrained.state_dict()["head.weight"])


def test_states_that_fit_neither_way_are_refused_in_one_line(tmp_path: Path):
    _, path = saved_backbone(tmp_path)
    good = load_file(str(path))
    model = example("factory")
    before = flatten_params(model)

    def refusal(state: dict[str, torch.Tensor]) -> str:
        file = tmp_path / "bad.safetensors"
        save_file(state, str(file))
        with pytest.raises(ValueError) as info:
            load_initial_state(model, file)
        message = str(info.value)
        assert "\n" not in message
        return message

    renamed = {k.replace("backbone.", "encoder."): v for k, v in good.items()}
    message = refusal(renamed)
    assert "does not fit the model" in message and "nor is it a backbone" in message
    assert "4 of its 4 keys name no layer of the model (encoder." in message

    shape = dict(good, **{"backbone.1.weight": torch.zeros(4, 64)})
    message = refusal(shape)
    assert "wrong shapes backbone.1.weight (4, 64) (model backbone.1.base_layer.weight" in message

    partial = {k: v for k, v in good.items() if not k.startswith("backbone.1.")}
    message = refusal(partial)
    assert "no value to the frozen parameter(s) backbone.1.base_layer.weight" in message
    assert np.array_equal(flatten_params(model), before)  # nothing half-loaded


# ---------------------------------------------------------------------------------------------
# through the daemons
# ---------------------------------------------------------------------------------------------

CANCER_LORA = f'''
import sys
from torch import nn
sys.path.insert(0, {str(FINETUNE)!r})
from model import LoRALinear


def lora() -> nn.Module:
    """cancer's 30 features: Linear(30, 64) frozen with LoRA rank 2, ReLU, a head of 2."""
    return nn.Sequential(LoRALinear(nn.Linear(30, 64), rank=2), nn.ReLU(), nn.Linear(64, 2))
'''


def test_demo_trains_the_adapters_and_moves_nothing_frozen(tmp_path: Path):
    factory = tmp_path / "cancer_lora.py"
    factory.write_text(CANCER_LORA)
    ref = f"{factory}:lora"
    model = resolve_model(ref)
    coordinates = trainable_count(model)
    assert coordinates == (30 + 64) * 2 + 64 * 2 + 2  # 318 of 2,428
    done = subprocess.run(
        [SPGC, "demo", "--json", "--insecure", "--rounds", "2", "--model", ref,
         "--state-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["rounds"] == 2 and summary["failure"] is None
    assert summary["noise_samples"] == 2 * coordinates  # only the trained coordinates noised
    exported = load_file(str(tmp_path / "run" / "h1" / "model.safetensors"))
    start = model.state_dict()
    for key in ("0.base_layer.weight", "0.base_layer.bias"):
        assert torch.equal(exported[key], start[key])  # frozen: never moved
    assert not torch.equal(exported["2.weight"], start["2.weight"])  # the head trained
    assert exported["0.lora_B"].any()  # the adapters trained (B left zero)

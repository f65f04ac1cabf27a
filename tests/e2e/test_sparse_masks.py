"""Sparse trainable masks (issue 36 item 4): a factory marks the elements of a parameter that
train (spgc.learning.trainable.set_trainable_mask); only those travel, and the others never move."""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO_ROOT
from safetensors.torch import save_file
from test_server_daemon import pki as pki  # the module's fixture: certificates for h1, h2, p1..p3
from test_server_daemon import start_pair
from test_user_plans import provider_config, run_providers
from torch import nn

from spgc.learning.gradients import clipped_gradient_sum, per_example_gradients
from spgc.learning.models import (
    check_per_example_compatible,
    flatten_params,
    model_fingerprint,
    resolve_model,
    trainable_count,
    trainable_mask,
    trained_elements,
)
from spgc.learning.trainable import (
    MAX_RANGES_WIRE_BYTES,
    TrainableCoordinates,
    TrainableLayoutError,
    set_trainable_mask,
)
from spgc.servers.peer import config_differences
from spgc.settings.config import ServerConfig
from spgc.settings.plan import build_run_model
from spgc.wire import aggregation_pb2 as pb

FINETUNE = REPO_ROOT / "examples" / "finetune"

# Linear(4, 3) weight: rows 0 and 2 partly trained; Linear(3, 2) bias: its second element.
FIRST_MASK = torch.tensor(
    [[False, True, True, False], [False, False, False, False], [True, False, False, True]]
)
BIAS_MASK = torch.tensor([False, True])


def small_model() -> nn.Sequential:
    """12 + 3 + 6 + 2 parameters; the first bias frozen whole."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.Tanh(), nn.Linear(3, 2))
    model[0].bias.requires_grad_(False)
    return model


def masked_model() -> nn.Sequential:
    model = small_model()
    set_trainable_mask(model, "0.weight", FIRST_MASK)
    set_trainable_mask(model[2], "bias", BIAS_MASK.numpy())  # an array does too
    return model


def test_masks_make_the_trainable_coordinates() -> None:
    model = masked_model()
    # Flat order: 0.weight (0..11), 0.bias (12..14, frozen), 2.weight (15..20), 2.bias (21, 22).
    expected = np.r_[FIRST_MASK.reshape(-1).numpy(), [False] * 3, [True] * 6, BIAS_MASK.numpy()]
    assert np.array_equal(trainable_mask(model), expected)
    layout = TrainableCoordinates.of_model(model)
    assert layout.ranges == ((1, 2), (8, 1), (11, 1), (15, 6), (22, 1))
    assert layout.count == trainable_count(model) == 11 and layout.total == 23
    assert layout.wire_ranges() == list(layout.ranges)
    # The masks belong to the model as its factory built it, copies included.
    assert np.array_equal(trainable_mask(copy.deepcopy(model)), expected)
    assert np.array_equal(trainable_mask(model.to(torch.float64)), expected)
    # Not part of the state: initial_model files and exports are the plain model's.
    assert set(model.state_dict()) == set(small_model().state_dict())


def test_the_fingerprint_names_the_masks() -> None:
    plain = small_model()
    other = masked_model()
    set_trainable_mask(other, "0.weight", ~FIRST_MASK)
    fingerprints = {model_fingerprint(m) for m in (plain, masked_model(), other)}
    assert len(fingerprints) == 3
    # An all-True mask trains every element: the same model as no mask.
    everything = small_model()
    set_trainable_mask(everything, "2.weight", torch.ones(2, 3, dtype=torch.bool))
    assert model_fingerprint(everything) == model_fingerprint(plain)
    # Dropping a mask gives the plain model back.
    dropped = masked_model()
    set_trainable_mask(dropped, "0.weight", None)
    set_trainable_mask(dropped, "2.bias", None)
    assert model_fingerprint(dropped) == model_fingerprint(plain)


def test_gradient_columns_are_the_masked_elements_of_the_full_gradients() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(7, 4)).astype(np.float32)
    y = rng.integers(0, 2, size=7)
    masked, plain = masked_model(), small_model()
    got = per_example_gradients(masked, x, y, chunk_size=3)
    full = per_example_gradients(plain, x, y, chunk_size=3)
    # plain's columns are its requires_grad coordinates; masked's a subset of them, in order.
    columns = np.searchsorted(
        TrainableCoordinates.of_model(plain).index, TrainableCoordinates.of_model(masked).index
    )
    assert got.shape == (7, 11) and got.any(axis=0).all()
    assert np.array_equal(got, full[:, columns])
    clipped = clipped_gradient_sum(masked, x, y, clip_norm=0.5, chunk_size=3)
    assert clipped.shape == (11,)


@pytest.mark.parametrize(
    ("name", "mask", "message"),
    [
        ("0.wieght", FIRST_MASK, "has no parameter '0.wieght' (its parameters: 0.weight, "),
        ("0.weight", FIRST_MASK.int(), "must be a bool tensor or array"),
        ("0.weight", FIRST_MASK.tolist(), "must be a bool tensor or array"),
        ("0.weight", FIRST_MASK[:2], "has shape (2, 4), the parameter (3, 4)"),
        ("0.bias", torch.ones(3, dtype=torch.bool), "'0.bias' is frozen (requires_grad=False)"),
    ],
)
def test_bad_masks_are_refused_naming_the_parameter(name: str, mask, message: str) -> None:
    with pytest.raises(ValueError, match="set_trainable_mask: ") as caught:
        set_trainable_mask(small_model(), name, mask)
    assert message in str(caught.value)


def test_a_mask_that_no_longer_fits_is_refused_when_the_model_is_checked() -> None:
    model = masked_model()
    model[0].weight.requires_grad_(False)  # after the mask: a frozen parameter trains nothing
    with pytest.raises(ValueError, match=r"'0\.weight' has a trainable mask but requires_grad"):
        check_per_example_compatible(model)
    nothing = small_model()
    for name, p in nothing.named_parameters():
        if p.requires_grad:
            set_trainable_mask(nothing, name, torch.zeros_like(p, dtype=torch.bool))
    with pytest.raises(ValueError, match="the trainable masks leave no element of the model"):
        check_per_example_compatible(nothing)


FACTORY = """\
import torch
from torch import nn

from spgc.learning.trainable import set_trainable_mask


def masked():
    model = nn.Sequential(nn.Linear(30, 8), nn.Tanh(), nn.Linear(8, 2))
    model[0].bias.requires_grad_(False)
    # Every third element of the first weight, and the head's first row.
    set_trainable_mask(model, "0.weight", torch.arange(240).reshape(8, 30) % 3 == 0)
    rows = torch.zeros(2, 8, dtype=torch.bool)
    rows[0] = True
    set_trainable_mask(model, "2.weight", rows)
    return model


def wrong_shape():
    model = nn.Sequential(nn.Linear(30, 2))
    set_trainable_mask(model[0], "weight", torch.ones(30, 2, dtype=torch.bool))
    return model
"""


def test_a_factory_with_a_bad_mask_is_refused_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "masks.py").write_text(FACTORY)
    ref = f"{tmp_path / 'masks.py'}:wrong_shape"
    cfg = ServerConfig(
        insecure=True, providers=["p1", "p2"], dataset="", model=ref, max_batch_size=10
    )
    with pytest.raises(ValueError) as caught:
        build_run_model(cfg)
    message = str(caught.value)
    assert "wrong_shape" in message and "has shape (30, 2), the parameter (2, 30)" in message
    assert "\n" not in message


def test_ranges_past_one_message_are_refused_naming_the_limit() -> None:
    # wire_bytes bounds the encoded field (exact but for a range at 0, 2 bytes fewer).
    rng = np.random.default_rng(1)
    for total in (50, 5_000, 300_000):
        layout = TrainableCoordinates.from_mask(rng.random(total) < 0.3)
        encoded = pb.TrainingConfig(
            trainable=[pb.CoordinateRange(start=a, length=n) for a, n in layout.wire_ranges()]
        ).ByteSize()
        assert encoded <= layout.wire_bytes() <= encoded + 2
    # Every other coordinate: one range each. 2 x 60,000 coordinates fit, 2 x 120,000 not.
    fits = TrainableCoordinates.from_mask(np.arange(120_000) % 2 == 0)
    fits.check_wire_size()
    assert fits.wire_bytes() <= MAX_RANGES_WIRE_BYTES
    scattered = TrainableCoordinates.from_mask(np.arange(240_000) % 2 == 0)
    with pytest.raises(TrainableLayoutError) as caught:
        scattered.check_wire_size()
    message = str(caught.value)
    assert "120,000 separate ranges" in message and f"{MAX_RANGES_WIRE_BYTES:,}" in message
    assert "train contiguous blocks" in message
    # A model whose mask makes them is refused when its coordinates are taken.
    model = nn.Linear(240_000, 1, bias=False)
    set_trainable_mask(model, "weight", torch.arange(240_000).reshape(1, -1) % 2 == 0)
    with pytest.raises(TrainableLayoutError, match="120,000 separate ranges"):
        TrainableCoordinates.of_model(model)


def test_two_plans_whose_masks_differ_are_named_in_a_short_line() -> None:
    """The handshake names where two servers' trainable ranges part, not all of them (a sparse
    mask may have 100,000 ranges: one log line each would bury the cause)."""
    ranges = [pb.CoordinateRange(start=10 * i, length=3) for i in range(50_000)]
    h1, h2 = pb.TrainingConfig(trainable=ranges), pb.TrainingConfig(trainable=ranges)
    h2.trainable[7].length = 4
    del h2.trainable[-1]
    (diff,) = config_differences(h1, h2)
    assert diff == (
        "model (which parameters are frozen) (h1 50000 items, h2 49999; they first differ at "
        "item 7: "
        "h1 [(start 70, length 3), (start 80, length 3), (start 90, length 3)], "
        "h2 [(start 70, length 4), (start 80, length 3), (start 90, length 3)])"
    )
    # One list a prefix of the other: they part where the shorter one ends.
    del h2.trainable[40_000:]
    h2.trainable[7].length = 3
    (diff,) = config_differences(h1, h2)
    assert "h2 40000; they first differ at item 40000: h1 [(start 400000, length 3)," in diff
    assert diff.endswith("h2 [])")
    # Short lists are shown whole.
    short = pb.TrainingConfig(trainable=ranges[:2])
    assert config_differences(short, pb.TrainingConfig(trainable=ranges[:1])) == [
        "model (which parameters are frozen) (h1 [(start 0, length 3), (start 10, length 3)], "
        "h2 [(start 0, length 3)])"
    ]


def test_masked_elements_never_move_through_the_daemons(pki: Path, tmp_path: Path) -> None:
    """Providers (the real client: gradient columns, clipping, encoding, shares) and both
    servers train the masked model: the plan carries its ranges, the frozen part is served once,
    and after the updates the frozen elements are where they started while trained ones moved."""
    (tmp_path / "masks.py").write_text(FACTORY)
    ref = f"{tmp_path / 'masks.py'}:masked"
    model = resolve_model(ref)
    trained = TrainableCoordinates.of_model(model)
    assert (trained.count, trained.total) == (80 + 8 + 2, 240 + 8 + 16 + 2)
    run = {"model": ref, "rounds": 2, "round_deadline": 30.0, "target_epsilon": 8.0}
    d1, d2 = start_pair(pki, tmp_path, **run)
    try:
        announced = d1.plan.training_config("run")
        assert [(r.start, r.length) for r in announced.trainable] == list(trained.ranges)
        assert announced.model_fingerprint == model_fingerprint(model)
        start = d1.state.params.copy()
        assert np.array_equal(start, flatten_params(model))
        results = run_providers([provider_config(pki, d1, d2, i, model=ref) for i in range(3)])
        assert all(isinstance(r, list) and r for r in results), results
        assert d1.wait(60) and d2.wait(60)
        assert d1.state.summary()["steps"] == 2
        frozen = trained.frozen_index()
        for d in (d1, d2):
            after = d.state.params
            assert np.array_equal(after[frozen], start[frozen])
            moved = np.count_nonzero(after[trained.index] != start[trained.index])
            assert moved > trained.count / 2
    finally:
        d1.stop()
        d2.stop()


def test_the_finetune_examples_sparse_lowrank_factory(tmp_path: Path) -> None:
    """examples/finetune/model.py:sparse_lowrank: LoRA rank 4 and S trained at the 5% largest
    |W0| of the backbone file beside it (here a random one), and the head: 1,823 of 34,437."""
    shutil.copy(FINETUNE / "model.py", tmp_path / "model.py")
    ref = f"{tmp_path / 'model.py'}:sparse_lowrank"
    with pytest.raises(ValueError, match=r"backbone\.safetensors is missing: run pretrain\.py"):
        resolve_model(ref)
    fingerprints = set()
    for seed in (0, 1):
        w0 = torch.randn(128, 64, generator=torch.Generator().manual_seed(seed))
        save_file({"backbone.1.weight": w0}, str(tmp_path / "backbone.safetensors"))
        model = resolve_model(ref)
        layout = TrainableCoordinates.of_model(model)
        assert (layout.count, layout.total) == (1823, 34437)
        masked = {name: index for name, _, index in trained_elements(model) if index is not None}
        assert list(masked) == ["backbone.1.sparse"]
        largest = torch.argsort(w0.abs().reshape(-1), descending=True)[:410]
        assert set(masked["backbone.1.sparse"].tolist()) == set(largest.tolist())
        fingerprints.add(model_fingerprint(model))
    assert len(fingerprints) == 2  # another backbone, another mask: providers would be refused

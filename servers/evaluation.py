"""Held-out test metrics of the published model (what the round log and the demo report)."""

from __future__ import annotations

import threading

import numpy as np

from spgc.data import load_dataset
from spgc.models import MODEL_INPUT_SHAPES, PARAMETER_COUNTS, build_model, load_flat_params
from spgc.optim import evaluate


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


class TestSetEvaluator:
    """Loss and accuracy of a flat parameter vector on the dataset's held-out test split.

    The dataset and model are loaded on first use, so a daemon that never evaluates pays
    nothing. ``model`` names the model trained; empty: the one of ``dataset``'s models whose
    parameter count is the vector's length (see :func:`model_for`).
    """

    __test__ = False  # not a pytest class, despite the name

    def __init__(self, dataset: str, model: str = "") -> None:
        self.dataset = dataset
        self.model = model
        self._lock = threading.Lock()
        self._data = None
        self._model = None

    def __call__(self, params: np.ndarray) -> tuple[float, float]:
        with self._lock:
            if self._data is None:
                self._data = load_dataset(self.dataset)
                name = self.model or model_for(self.dataset, len(params))
                self._model = build_model(name)
            load_flat_params(self._model, params)
            loss, accuracy = evaluate(self._model, self._data.x_test, self._data.y_test)
            return float(loss), float(accuracy)

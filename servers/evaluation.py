"""Held-out test metrics of the published model (what the round log and the demo report)."""

from __future__ import annotations

import threading

import numpy as np

from spgc.data import load_dataset
from spgc.models import build_model, load_flat_params
from spgc.optim import evaluate


class TestSetEvaluator:
    """Loss and accuracy of a flat parameter vector on the dataset's held-out test split.

    The dataset and model are loaded on first use, so a daemon that never evaluates pays
    nothing.
    """

    __test__ = False  # not a pytest class, despite the name

    def __init__(self, dataset: str) -> None:
        self.dataset = dataset
        self._lock = threading.Lock()
        self._data = None
        self._model = None

    def __call__(self, params: np.ndarray) -> tuple[float, float]:
        with self._lock:
            if self._data is None:
                self._data = load_dataset(self.dataset)
                self._model = build_model(self.dataset)
            load_flat_params(self._model, params)
            loss, accuracy = evaluate(self._model, self._data.x_test, self._data.y_test)
            return float(loss), float(accuracy)

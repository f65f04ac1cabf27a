"""A model and data set of your own, trained with spgc: a small CNN on scikit-learn's 8x8 digits.

The provider config points at the two functions below, e.g.

    model: "examples/custom-model/model.py:build_model"
    data: "examples/custom-model/model.py:load_digits_data"

and the servers take the same model reference. What spgc needs from them:

- ``build_model()`` takes no arguments and returns a ``torch.nn.Module`` mapping a batch of
  inputs to class logits. spgc seeds torch before calling it, so every party builds the same
  initial weights. Normalise with GroupNorm or LayerNorm, not BatchNorm: per-example gradients
  (needed for differential privacy) are undefined when a layer mixes the examples of a batch.
- ``load_digits_data()`` takes no arguments and returns ``(x_train, y_train, x_test, y_test)``:
  float32 inputs of shape (n, ...) and int64 labels 0..C-1. ``(x, y)`` without a test split,
  or a ``torch.utils.data.Dataset``, are fine too.
"""

from __future__ import annotations

import numpy as np
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn


def build_model() -> nn.Module:
    """(n, 1, 8, 8) images -> (n, 10) logits; 3,834 parameters."""
    return nn.Sequential(
        nn.Conv2d(1, 8, kernel_size=3, padding=1),  # 8 x 8x8
        nn.GroupNorm(2, 8),  # per-example normalisation (BatchNorm would be refused)
        nn.ReLU(),
        nn.Conv2d(8, 16, kernel_size=3, stride=2, padding=1),  # 16 x 4x4
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(16 * 4 * 4, 10),
    )


def load_digits_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 handwritten digits (shipped with it, no download): pixels scaled to
    [0, 1] as (n, 1, 8, 8) float32, labels 0..9 as int64, a fixed stratified 80/20 split."""
    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, stratify=y, random_state=0
    )
    return x_train, y_train, x_test, y_test

"""The model and the data, shared by the ClientApp, the ServerApp and the SPGC servers (which
name the model as ``spgcflower.task:build_model`` and their test set as
``spgcflower.task:load_digits_data``): scikit-learn's digits (shipped with it, no download)."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn


def build_model() -> nn.Module:
    """A small MLP for 8x8 digits (2,410 parameters, no buffers)."""
    return nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 10))


def load_digits_data() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): the digits split 80/20, features scaled to [0, 1]."""
    digits = load_digits()
    x = (digits.data / 16.0).astype(np.float32)
    y = digits.target.astype(np.int64)
    x_train, x_test, y_train, y_test = train_test_split(
        x, y, test_size=0.2, random_state=0, stratify=y
    )
    return x_train, y_train, x_test, y_test


def partition(partition_id: int, num_partitions: int) -> tuple[np.ndarray, np.ndarray]:
    """This node's part of the training split (every num_partitions-th example)."""
    x, y, _, _ = load_digits_data()
    return x[partition_id::num_partitions], y[partition_id::num_partitions]


def train(model: nn.Module, x: np.ndarray, y: np.ndarray, epochs: int, lr: float) -> float:
    """Local SGD in minibatches of 32; returns the last epoch's mean loss."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    generator = torch.Generator().manual_seed(len(x))
    total = 0.0
    for _ in range(epochs):
        order = torch.randperm(len(x), generator=generator)
        total = 0.0
        for start in range(0, len(x), 32):
            idx = order[start : start + 32]
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(idx)
    return total / max(1, len(x))


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray) -> float:
    with torch.no_grad():
        return float((model(torch.as_tensor(x)).argmax(dim=1).numpy() == y).mean())

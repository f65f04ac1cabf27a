"""Provider-level DP's local work (DP-FedAvg: Geyer, Klein and Nabi 2017; McMahan et al.
2018): a provider selected for a round trains the round's model on all its data and sends its
model delta, clipped to C, as the one row it encodes.

The unit of privacy is then the provider: one clipped delta per provider, so the sum's
sensitivity is C whatever the provider's data, and the accountant's Poisson rate is each
provider's chance to take part (``sampling_rate``), drawn from its own CSPRNG coin. A provider
whose coin says no encodes no row (a vector of zeros, shared like any other), so neither server
learns who took part. The daemons (``providers/training.py``) and the in-process simulation
(``spgc experiment --adjacency provider``) both call :func:`selected_this_round` and
:func:`clipped_delta`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from spgc.common.csprng import SecureRandom
from spgc.learning.gradients import clip_per_example
from spgc.learning.losses import label_dtype, loss_function, resolved_loss
from spgc.learning.models import flatten_params, model_input, trained_elements
from spgc.learning.trainable import TrainableCoordinates

__all__ = [
    "LOCAL_OPTIMIZERS",
    "LocalTraining",
    "clipped_delta",
    "model_delta",
    "selected_this_round",
]

#: The local optimisers a plan may name (TrainingConfig.local_optimizer).
LOCAL_OPTIMIZERS: tuple[str, ...] = ("sgd", "adam")


@dataclass(frozen=True)
class LocalTraining:
    """How a selected provider trains the round's model (the plan's local_* fields)."""

    epochs: int
    batch_size: int
    lr: float
    optimizer: str = "sgd"

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError(
                f"local training needs epochs >= 1, batch_size >= 1 and lr > 0, got "
                f"{self.epochs}, {self.batch_size}, {self.lr}"
            )
        if self.optimizer not in LOCAL_OPTIMIZERS:
            raise ValueError(
                f"local optimizer must be one of {', '.join(LOCAL_OPTIMIZERS)}, got "
                f"{self.optimizer!r}"
            )

    @classmethod
    def of_plan(cls, tc: Any) -> LocalTraining:
        """From a TrainingConfig with adjacency "provider"."""
        return cls(
            int(tc.local_epochs), int(tc.local_batch_size), float(tc.local_learning_rate),
            str(tc.local_optimizer or "sgd"),
        )  # fmt: skip

    def make_optimizer(self, params: list[nn.Parameter]) -> torch.optim.Optimizer:
        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=self.lr)
        return torch.optim.SGD(params, lr=self.lr)


def _outside(p: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """The flat positions of ``p`` that a trainable mask leaves out (the complement of
    ``index``)."""
    keep = torch.ones(p.numel(), dtype=torch.bool, device=p.device)
    keep[index] = False
    return keep


def selected_this_round(rng: SecureRandom, rate: float) -> bool:
    """The provider's own coin: True with probability ``rate`` (its CSPRNG; never shown)."""
    return bool(rng.bernoulli(1, rate)[0])


def clipped_delta(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    coordinates: TrainableCoordinates,
    training: LocalTraining,
    clip_norm: float,
    rng: SecureRandom,
    *,
    task: str = "classification",
    loss: str = "",
) -> np.ndarray:
    """:func:`model_delta` clipped to ``clip_norm``: the (1, d) float64 row a selected
    provider encodes with a fixed clip norm."""
    row = model_delta(model, x, y, coordinates, training, rng, task=task, loss=loss)
    return clip_per_example(row, clip_norm)


def model_delta(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    coordinates: TrainableCoordinates,
    training: LocalTraining,
    rng: SecureRandom,
    *,
    task: str = "classification",
    loss: str = "",
) -> np.ndarray:
    """Train ``model`` (holding the round's parameters) on all of (x, y) and return its delta
    over the trained coordinates, unclipped: a (1, d) float64 row. The model is left trained;
    the caller loads the next round's parameters into it. Minibatches follow a permutation
    from ``rng`` each epoch."""
    n = len(x)
    start = coordinates.trainable_part(flatten_params(model))
    if n:
        loss_fn = loss_function(resolved_loss(task, loss))
        elements = trained_elements(model)
        # A trainable mask (spgc.learning.trainable.set_trainable_mask): the elements outside it
        # keep
        # their value locally too, as they do at the servers (their gradients are zeroed).
        masked = [(p, _outside(p, index)) for _, p, index in elements if index is not None]
        opt = training.make_optimizer([p for _, p, _ in elements])
        xt = model_input(model, x)
        first = next(model.parameters())
        yt = torch.as_tensor(np.asarray(y)).to(device=first.device, dtype=label_dtype(task))
        was_training = model.training
        model.train()
        try:
            for _ in range(training.epochs):
                order = torch.as_tensor(rng.permutation(n), device=xt.device)
                for b in range(0, n, training.batch_size):
                    idx = order[b : b + training.batch_size]
                    opt.zero_grad(set_to_none=True)
                    loss_fn(model(xt[idx]), yt[idx]).backward()
                    for p, outside in masked:
                        if p.grad is not None:
                            p.grad.view(-1)[outside] = 0
                    opt.step()
        finally:
            model.train(was_training)
    delta = coordinates.trainable_part(flatten_params(model)) - start
    return delta[None, :]

"""The training task and its loss: what the providers' per-example gradients differentiate and
what the servers' test metrics measure (issue 33 item 3).

A run has a ``task`` and a ``loss``, both in the servers' plan
(``spgc.settings.config.ServerConfig``,
``TrainingConfig.task`` / ``.loss``); providers take them from the plan:

- ``classification``: labels are class indices 0..C-1 (int64), the model outputs C logits per
  example; the default loss is ``cross_entropy``; the test metrics are loss and accuracy.
- ``regression``: labels are real targets (float32, one per example, or a row per example for
  a model with several outputs); the default loss is ``mse`` (mean squared error over the
  outputs); the test metrics are MSE, MAE and R^2 (and the loss).

``loss`` is ``cross_entropy``, ``mse`` or a user's ``package.module:function`` (or
``file.py:function``): ``function(outputs, targets)`` returns the MEAN loss over the batch as a
scalar tensor, like ``torch.nn.functional.cross_entropy``; per-example gradients call it on
batches of one example.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from spgc.learning.models import resolve_callable

TASKS: tuple[str, ...] = ("classification", "regression")
BUILTIN_LOSSES: tuple[str, ...] = ("cross_entropy", "mse")
DEFAULT_LOSS: dict[str, str] = {"classification": "cross_entropy", "regression": "mse"}
# The task each built-in loss is for (a user's function may serve either).
_LOSS_TASK: dict[str, str] = {"cross_entropy": "classification", "mse": "regression"}
#: The test metrics of a regression run, beside ``test_loss`` (round lines, summary, metrics).
REGRESSION_METRICS: tuple[str, ...] = ("test_mse", "test_mae", "test_r2")

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def resolved_loss(task: str, loss: str) -> str:
    """The loss a run uses: ``loss``, or the task's default when it is empty."""
    return loss.strip() or DEFAULT_LOSS[task]


def task_loss_problem(task: str, loss: str) -> str | None:
    """Why ``task`` and ``loss`` do not go together (one line), or None when they do."""
    if task not in TASKS:
        return f"task must be one of {', '.join(TASKS)}, got {task!r}"
    name = resolved_loss(task, loss)
    if ":" in name:
        return None  # the user's function: either task
    if name not in BUILTIN_LOSSES:
        return (
            f"loss must be one of {', '.join(BUILTIN_LOSSES)} or package.module:function, "
            f"got {loss!r}"
        )
    if _LOSS_TASK[name] != task:
        return (
            f"loss {name} is for task {_LOSS_TASK[name]}, not {task}: use loss "
            f"{DEFAULT_LOSS[task]} (or leave loss empty) or your own package.module:function"
        )
    return None


def _mse(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean squared error; a model with one output per example may be given (n,) targets."""
    return F.mse_loss(_match(outputs, targets), targets)


def _match(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``outputs`` shaped as ``targets`` when they differ only by a trailing axis of size 1."""
    if outputs.ndim == targets.ndim + 1 and outputs.shape[-1] == 1:
        return outputs.squeeze(-1)
    return outputs


def loss_function(loss: str) -> LossFn:
    """The function (outputs, targets) -> mean loss for a resolved loss name or reference."""
    name = loss.strip()
    if name == "cross_entropy":
        return F.cross_entropy
    if name == "mse":
        return _mse
    if ":" not in name:
        raise ValueError(f"loss must be one of {', '.join(BUILTIN_LOSSES)} or module:function")
    fn = resolve_callable(name, "loss")
    return fn  # type: ignore[no-any-return]


def label_dtype(task: str) -> torch.dtype:
    """The dtype labels travel to the loss in: class indices or real targets."""
    return torch.float32 if task == "regression" else torch.int64


def outputs_like_targets(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """A regression model's outputs in the targets' shape (for the test metrics)."""
    return _match(outputs, targets)

"""The servers' model update (Adam on a flat float64 vector) and test-set evaluation.

Both servers apply the same update to the same noisy gradient and then compare model hashes
(SPEC section 3 step 9), so the update must be bit-identical on two machines. We do not use
``torch.optim.Adam`` for that: its result depends on the torch version, on which fused /
foreach / vectorised kernel is dispatched for the CPU at hand (AVX2 vs AVX-512 code paths may
contract multiply-adds differently), and it keeps float32 state for float32 models.

:class:`Adam` instead uses only numpy float64 element-wise ``+ - * / sqrt``, each correctly
rounded by IEEE 754 and evaluated one ufunc at a time (numpy never fuses them into FMAs), in a
fixed order. The bias corrections ``beta**t`` are kept as running products (one correctly
rounded multiplication per step) instead of ``pow``, whose last bit can differ between libm
implementations. Identical inputs therefore give identical bits on any IEEE-754 machine.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from spgc.learning.losses import loss_function, outputs_like_targets, resolved_loss
from spgc.learning.models import model_input


def checked_step_inputs(
    params: np.ndarray, grad: np.ndarray, dim: int
) -> tuple[np.ndarray, np.ndarray]:
    """(params, grad) as float64, after refusing wrong shapes and non-finite gradients, before
    an optimiser touches its state: a bad round cannot put the two servers out of step."""
    p = np.asarray(params, dtype=np.float64)
    g = np.asarray(grad, dtype=np.float64)
    if p.shape != (dim,) or g.shape != (dim,):
        raise ValueError(f"expected params and grad of shape ({dim},), got {p.shape} and {g.shape}")
    if not np.isfinite(g).all():
        raise ValueError("gradient contains NaN or infinity")
    return p, g


class Adam:
    """Adam (Kingma and Ba 2015) on a flat float64 parameter vector, deterministic bit for bit.

    ``step(params, grad)`` returns the new parameters and advances the state (first moment
    ``m``, second moment ``v``, step count ``t``)::

        t += 1
        m = beta1 * m + (1 - beta1) * g
        v = beta2 * v + (1 - beta2) * (g * g)
        m_hat = m / (1 - beta1**t);  v_hat = v / (1 - beta2**t)
        params = params - lr * m_hat / (sqrt(v_hat) + eps)
    """

    def __init__(
        self,
        dim: int,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        """State for a ``dim``-parameter model; hyper-parameters as in ``torch.optim.Adam``."""
        if dim < 0:
            raise ValueError(f"dim must be >= 0, got {dim}")
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"learning rate must be positive, got {lr}")
        beta1, beta2 = (float(b) for b in betas)
        if not (0.0 <= beta1 < 1.0 and 0.0 <= beta2 < 1.0):
            raise ValueError(f"betas must be in [0, 1), got {betas}")
        if not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be positive, got {eps}")
        self.dim = int(dim)
        self.lr = float(lr)
        self.beta1, self.beta2 = beta1, beta2
        self.eps = float(eps)
        self.m = np.zeros(self.dim, dtype=np.float64)
        self.v = np.zeros(self.dim, dtype=np.float64)
        self.t = 0
        # beta**t as running products: exact-rounding multiplications, no libm pow.
        self._beta1_pow = 1.0
        self._beta2_pow = 1.0

    def step(self, params: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """One Adam step: returns new float64 parameters (``params`` is not modified).

        Refuses wrong shapes and non-finite gradients before touching the state, so a bad
        round cannot leave the two servers' optimisers out of step.
        """
        p, g = checked_step_inputs(params, grad, self.dim)
        self.t += 1
        self._beta1_pow *= self.beta1
        self._beta2_pow *= self.beta2
        self.m = self.beta1 * self.m + (1.0 - self.beta1) * g
        self.v = self.beta2 * self.v + (1.0 - self.beta2) * (g * g)
        m_hat = self.m / (1.0 - self._beta1_pow)
        v_hat = self.v / (1.0 - self._beta2_pow)
        return p - (self.lr * m_hat) / (np.sqrt(v_hat) + self.eps)

    def state_dict(self) -> dict[str, Any]:
        """A copy of the full state (for checkpoints; restores bit-exactly)."""
        return {
            "dim": self.dim,
            "lr": self.lr,
            "betas": (self.beta1, self.beta2),
            "eps": self.eps,
            "t": self.t,
            "m": self.m.copy(),
            "v": self.v.copy(),
            "beta_pows": (self._beta1_pow, self._beta2_pow),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state produced by :meth:`state_dict`."""
        m = np.asarray(state["m"], dtype=np.float64)
        v = np.asarray(state["v"], dtype=np.float64)
        if m.shape != (self.dim,) or v.shape != (self.dim,) or int(state["dim"]) != self.dim:
            raise ValueError("optimizer state does not match this optimizer's dimension")
        self.lr = float(state["lr"])
        self.beta1, self.beta2 = (float(b) for b in state["betas"])
        self.eps = float(state["eps"])
        self.t = int(state["t"])
        self.m, self.v = m.copy(), v.copy()
        self._beta1_pow, self._beta2_pow = (float(b) for b in state["beta_pows"])

    def state_hash(self) -> str:
        """SHA-256 of the state, so two servers can check their optimisers agree."""
        h = hashlib.sha256(b"spgc-adam-v1\x00")
        scalars = (self.lr, self.beta1, self.beta2, self.eps, self._beta1_pow, self._beta2_pow)
        h.update(np.array(scalars, dtype="<f8").tobytes())
        h.update(np.array([self.dim, self.t], dtype="<u8").tobytes())
        h.update(np.ascontiguousarray(self.m, dtype="<f8").tobytes())
        h.update(np.ascontiguousarray(self.v, dtype="<f8").tobytes())
        return h.hexdigest()


class SgdStep:
    """The servers' plain step, ``params - lr * grad`` (server_optimizer "sgd"): with
    provider-level DP (DP-FedAvg) the servers pass ``grad = -`` the noisy mean of the
    providers' deltas (lr 1: FedAvg's model + mean delta); with example-level DP the noisy
    mean gradient (DP-SGD's step). One correctly rounded multiply and subtract per
    coordinate: bit-identical on both servers. Its state (the step count) checkpoints in
    Adam's layout, with empty moments, so one checkpoint format serves both."""

    def __init__(self, dim: int, lr: float = 1.0) -> None:
        if dim < 0:
            raise ValueError(f"dim must be >= 0, got {dim}")
        if not (math.isfinite(lr) and lr > 0):
            raise ValueError(f"learning rate must be positive, got {lr}")
        self.dim, self.lr, self.t = int(dim), float(lr), 0

    def step(self, params: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """New float64 parameters; refuses wrong shapes and non-finite values (as Adam)."""
        p, g = checked_step_inputs(params, grad, self.dim)
        self.t += 1
        return p - self.lr * g

    def state_dict(self) -> dict[str, Any]:
        empty = np.zeros(0, dtype=np.float64)
        return {"dim": self.dim, "lr": self.lr, "t": self.t, "m": empty, "v": empty,
                "beta_pows": (1.0, 1.0)}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["dim"]) != self.dim:
            raise ValueError("optimizer state does not match this optimizer's dimension")
        self.lr, self.t = float(state["lr"]), int(state["t"])


def mean_delta_direction(delta_sum: np.ndarray, expected_providers: float) -> np.ndarray:
    """adjacency provider: the noisy sum of clipped deltas as the step's direction: minus
    their mean over the EXPECTED providers (DP-FedAvg's fixed denominator; the realised count
    is secret, and dividing by it would spend privacy)."""
    if not (math.isfinite(expected_providers) and expected_providers > 0):
        raise ValueError(f"expected providers must be > 0, got {expected_providers}")
    return -np.asarray(delta_sum, dtype=np.float64) / float(expected_providers)


def mean_gradient(gradient_sum: np.ndarray, expected_examples: float) -> np.ndarray:
    """server_optimizer sgd, adjacency example: the noisy sum of clipped gradients over the
    EXPECTED examples of a round (DP-SGD's fixed denominator: the realised batch size is
    secret). Adam needs no mean: its step does not change when the gradient is scaled."""
    if not (math.isfinite(expected_examples) and expected_examples > 0):
        raise ValueError(f"expected examples must be > 0, got {expected_examples}")
    return np.asarray(gradient_sum, dtype=np.float64) / float(expected_examples)


#: The servers' update rules (ServerConfig.server_optimizer, TrainingConfig.server_optimizer).
SERVER_OPTIMIZERS: tuple[str, ...] = ("adam", "sgd")


def server_optimizer(dim: int, lr: float, name: str) -> Adam | SgdStep:
    """The servers' update rule ``name``: "adam" on the noisy gradient (with adjacency provider
    on minus the noisy mean delta: FedAdam), or "sgd", ``params - lr * grad`` (DP-SGD's step;
    with adjacency provider FedAvg's step on the noisy mean delta)."""
    if name not in SERVER_OPTIMIZERS:
        raise ValueError(f"server optimizer must be one of {SERVER_OPTIMIZERS}, got {name!r}")
    return SgdStep(dim, lr) if name == "sgd" else Adam(dim, lr=lr)


def _test_tensors(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    batch_size: int,
    dtype: torch.dtype,
) -> tuple[torch.Tensor, torch.Tensor, int]:
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    xt = model_input(model, x)
    yt = torch.as_tensor(y if isinstance(y, torch.Tensor) else np.asarray(y))
    yt = yt.to(device=xt.device, dtype=dtype)
    n = int(xt.shape[0])
    if n == 0 or n != int(yt.shape[0]):
        raise ValueError(f"need a non-empty x and y of equal length, got {n} and {yt.shape[0]}")
    return xt, yt, n


def _eval_batches(
    model: nn.Module, xt: torch.Tensor, yt: torch.Tensor, batch_size: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """(outputs, targets) batch by batch, the model in eval mode under ``torch.no_grad``
    (bounded memory for the 10k MNIST test set); its mode is restored at the end, or when the
    caller stops early or raises (the generator is closed)."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            for start in range(0, int(xt.shape[0]), batch_size):
                yield model(xt[start : start + batch_size]), yt[start : start + batch_size]
    finally:
        model.train(was_training)


def evaluate(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    batch_size: int = 1000,
    loss: str = "cross_entropy",
) -> tuple[float, float]:
    """Mean loss (cross-entropy, or the run's classification ``loss``) and accuracy of
    ``model`` on ``(x, y)``, in batches of ``batch_size`` under ``torch.no_grad`` (bounded
    memory for the 10k MNIST test set). Regression: :func:`evaluate_regression`."""
    xt, yt, n = _test_tensors(model, x, y, batch_size, torch.int64)
    loss_fn = loss_function(loss)
    loss_sum, correct = 0.0, 0
    for logits, target in _eval_batches(model, xt, yt, batch_size):
        if loss == "cross_entropy":
            loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
        else:  # a mean over the batch: weighted by its size
            loss_sum += float(loss_fn(logits, target)) * int(target.shape[0])
        correct += int((logits.argmax(dim=1) == target).sum())
    return loss_sum / n, correct / n


def evaluate_regression(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    batch_size: int = 1000,
    loss: str = "mse",
) -> dict[str, float]:
    """Test metrics of a regression model on ``(x, y)``: ``test_mse`` (mean over examples and
    outputs of the squared error), ``test_mae`` (of the absolute error), ``test_r2`` (1 - the
    squared errors' sum / the targets' sum of squares about their mean, averaged over the
    outputs as scikit-learn's r2_score; 0 for a model that always predicts the test mean, below
    0 for a worse one) and ``test_loss`` (the run's ``loss``, the MSE for mse). Errors are
    accumulated in float64, in batches under ``torch.no_grad``."""
    xt, yt, n = _test_tensors(model, x, y, batch_size, torch.float32)
    loss_fn = loss_function(loss)
    preds, loss_sum = [], 0.0
    for raw, target in _eval_batches(model, xt, yt, batch_size):
        out = outputs_like_targets(raw, target)
        if out.shape != target.shape:
            raise ValueError(
                f"the model's outputs have shape {tuple(out.shape)}, the targets "
                f"{tuple(target.shape)}"
            )
        if loss != "mse":
            loss_sum += float(loss_fn(out, target)) * int(target.shape[0])
        preds.append(out.to(torch.float64).cpu().numpy())
    pred = np.concatenate(preds).reshape(n, -1)
    true = yt.to(torch.float64).cpu().numpy().reshape(n, -1)
    err = pred - true
    mse = float(np.mean(err * err))
    ss_res = np.sum(err * err, axis=0)
    ss_tot = np.sum((true - true.mean(axis=0)) ** 2, axis=0)
    # A constant target column: R^2 is 1 for an exact fit, 0 otherwise (scikit-learn's rule).
    r2 = np.where(ss_tot > 0, 1.0 - ss_res / np.where(ss_tot > 0, ss_tot, 1.0), 0.0)
    r2 = np.where((ss_tot == 0) & (ss_res == 0), 1.0, r2)
    return {
        "test_loss": mse if loss == "mse" else loss_sum / n,
        "test_mse": mse,
        "test_mae": float(np.mean(np.abs(err))),
        "test_r2": float(np.mean(r2)),
    }


def evaluate_metrics(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    task: str = "classification",
    loss: str = "",
) -> dict[str, float]:
    """The run's test metrics by task: ``test_loss`` and ``test_accuracy`` (classification), or
    ``test_loss``, ``test_mse``, ``test_mae`` and ``test_r2`` (regression)."""
    name = resolved_loss(task, loss)
    if task == "regression":
        return evaluate_regression(model, x, y, loss=name)
    test_loss, accuracy = evaluate(model, x, y, loss=name)
    return {"test_loss": test_loss, "test_accuracy": accuracy}


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
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from spgc.models import model_input


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
        p = np.asarray(params, dtype=np.float64)
        g = np.asarray(grad, dtype=np.float64)
        if p.shape != (self.dim,) or g.shape != (self.dim,):
            raise ValueError(
                f"expected params and grad of shape ({self.dim},), got {p.shape} and {g.shape}"
            )
        if not np.isfinite(g).all():
            raise ValueError("gradient contains NaN or infinity")
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


def evaluate(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    batch_size: int = 1000,
) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy of ``model`` on ``(x, y)``, in batches of
    ``batch_size`` under ``torch.no_grad`` (bounded memory for the 10k MNIST test set)."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    xt = model_input(model, x)
    yt = torch.as_tensor(y if isinstance(y, torch.Tensor) else np.asarray(y))
    yt = yt.to(device=xt.device, dtype=torch.int64)
    n = int(xt.shape[0])
    if n == 0 or n != int(yt.shape[0]):
        raise ValueError(f"need a non-empty x and y of equal length, got {n} and {yt.shape[0]}")
    was_training = model.training
    model.eval()
    loss_sum, correct = 0.0, 0
    try:
        with torch.no_grad():
            for start in range(0, n, batch_size):
                logits = model(xt[start : start + batch_size])
                target = yt[start : start + batch_size]
                loss_sum += float(F.cross_entropy(logits, target, reduction="sum"))
                correct += int((logits.argmax(dim=1) == target).sum())
    finally:
        model.train(was_training)
    return loss_sum / n, correct / n

"""Per-example gradients (vectorised with torch.func), L2 clipping and the clipped sum.

This is the provider's side of SPEC section 3 step 3: per-example gradients of the run's loss
(cross-entropy by default; :mod:`spgc.learning.losses`: mse for regression, or the user's), each
clipped
to L2 norm <= C, summed over the batch. The gradients are
computed with ``vmap(grad(loss))`` over the batch dimension (one batched computation, not a
Python loop over examples); the loop in :func:`per_example_gradients` runs over CHUNKS of
examples only, to bound memory (an (m, d) float64 matrix for m = 3,000 and the 28,938-parameter
MNIST CNN is 0.7 GB).

Columns are the trained coordinates (``requires_grad``, less the elements a trainable mask
leaves out; :mod:`spgc.learning.trainable`) in the order of
:func:`spgc.learning.models.flatten_params`: a frozen
parameter gets no gradient, a masked parameter's frozen elements no column, and neither travels.
Clipping is done in float64 numpy; the float64 result can exceed C by a rounding error
(relative ~1e-16), so code that needs an exact bound must enforce it after fixed-point encoding,
on the integers (SPEC section 4).

Models: :func:`per_example_gradients` first calls
:func:`spgc.learning.models.check_per_example_compatible`, which refuses layers that mix the
examples of a
batch (BatchNorm in training mode, ...) with a message naming the layer. Random layers (dropout in
training mode) draw independently for each example (``vmap(randomness="different")``), as a loop
over the examples would.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from spgc.common.logs import first_line
from spgc.learning.losses import label_dtype, loss_function, resolved_loss
from spgc.learning.models import (
    check_per_example_compatible,
    eval_forward,
    model_input,
    trainable_count,
    trained_elements,
)

# Default number of examples per vmap call: bounds the transient memory of torch.func
# (activations and gradients of a chunk) without costing measurable speed.
DEFAULT_CHUNK = 256

# Largest float64 per-example gradient matrix (chunk x d x 8 bytes) one chunk may make. A
# chunk's transient working set is a few times this (the float32 torch.func output and its
# concatenation, the float64 copy, the clipped copy, the encoder's temporaries: about 60 bytes
# per entry in all), so 128 MiB keeps a provider's gradient step near 1 GB. The paper's models
# are unaffected (mnist: 579 rows fit, above DEFAULT_CHUNK); a 10M-parameter model gets 1 row.
CHUNK_BUDGET_BYTES = 128 * 2**20


def bounded_chunk(requested: int, dim: int, budget_bytes: int = CHUNK_BUDGET_BYTES) -> int:
    """``requested`` examples per chunk, lowered so that chunk x dim x 8 bytes stays within
    ``budget_bytes`` (at least 1): without it, 256 examples of a 10M-parameter model would be a
    20 GB matrix per provider."""
    if requested < 1 or dim < 0 or budget_bytes < 1:
        raise ValueError(f"need requested >= 1, dim >= 0, budget_bytes >= 1, got {requested}")
    return max(1, min(requested, budget_bytes // max(1, 8 * dim)))


def _as_tensors(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    task: str = "classification",
) -> tuple[torch.Tensor, torch.Tensor]:
    first = next(model.parameters())
    # The examples go where the model is (a GPU when the provider has one).
    xt = model_input(model, x)
    yt = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y)
    # Class indices (int64) or, for regression, real targets (float32).
    yt = yt.to(device=first.device, dtype=label_dtype(task))
    if xt.shape[0] != yt.shape[0]:
        raise ValueError(f"x has {xt.shape[0]} examples but y has {yt.shape[0]}")
    if task != "regression" and yt.ndim != 1:
        raise ValueError(f"y must be a vector of class labels, got shape {tuple(yt.shape)}")
    if task == "regression" and yt.ndim not in (1, 2):
        raise ValueError(f"y must hold one target (or a row) per example, got {tuple(yt.shape)}")
    return xt, yt


def _per_example_grad_fn(
    model: nn.Module, loss: str = "cross_entropy"
) -> Callable[..., dict[str, torch.Tensor]]:
    """vmap(grad(loss)) for ``model``: maps (trained params, constants (frozen params and
    buffers), x[m], y[m]) to a dict of per-example gradients with a leading batch dimension m.
    ``loss``: a resolved loss name or reference (:func:`spgc.learning.losses.loss_function`)."""
    loss_fn = loss_function(loss)

    def loss_one(
        params: dict[str, torch.Tensor],
        constants: dict[str, torch.Tensor],
        xi: torch.Tensor,
        yi: torch.Tensor,
    ) -> torch.Tensor:
        # A batch of one inside vmap: the model's layers expect a batch dimension. Only the
        # trained parameters are differentiated; frozen ones and buffers are constants.
        outputs = functional_call(model, (params, constants), (xi.unsqueeze(0),))
        return loss_fn(outputs, yi.unsqueeze(0))

    # randomness="different": each example draws its own dropout mask, as in a loop over the
    # examples; a model without random layers is unaffected.
    return vmap(grad(loss_one), in_dims=(None, None, 0, 0), randomness="different")


def _refuse_changed_buffers(
    model: nn.Module,
    buffers: dict[str, torch.Tensor],
    versions: dict[str, int],
    cause: BaseException | None,
) -> None:
    """Raise ``ValueError`` naming the first buffer the forward pass modified in place (a
    running statistic, a counter): such state would be updated from the batch, not per example.
    Tensor version counters tell, whether or not the forward pass then failed."""
    for name, b in buffers.items():
        if b._version != versions[name]:
            owner, _, _ = name.rpartition(".")
            layer = type(model.get_submodule(owner)).__name__
            raise ValueError(
                f"layer {owner or '<model>'} ({layer}) updates its buffer {name!r} during the "
                "forward pass, which per-example gradients cannot do (the update would mix the "
                "examples of a batch); make it a constant or drop it"
            ) from cause


def per_example_gradients(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    task: str = "classification",
    loss: str = "",
) -> np.ndarray:
    """Gradient of the loss of each example (``loss``, empty: the ``task``'s default,
    cross-entropy or mse; :mod:`spgc.learning.losses`): an ``(m, d)`` float64 array, row i
    for example i, one column per trained coordinate (``requires_grad``, within its trainable
    mask if it has one) in :func:`spgc.learning.models.flatten_params` order; frozen parameters and
    the
    elements a mask leaves out have no column (they never travel, :mod:`spgc.learning.trainable`).

    Computed in the model's dtype (float32 by default) and upcast; ``m = 0`` gives ``(0, d)``.
    Values are reproducible for a given chunk size; another chunk size can change them by
    rounding (the BLAS kernels block differently), which is harmless: only the servers' update
    must be bit-exact, and it is computed from the revealed noisy sum.

    Raises ``ValueError`` naming the layer for a model that
    :func:`spgc.learning.models.check_per_example_compatible` refuses, before any work, and also
    when
    torch.func fails on the model in a way that layer check did not foresee (e.g. a custom layer
    that updates a buffer in place during the forward pass).
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    check_per_example_compatible(model)
    xt, yt = _as_tensors(model, x, y, task)
    m, d = int(xt.shape[0]), trainable_count(model)
    out = np.empty((m, d), dtype=np.float64)
    if m == 0:
        return out
    trained = trained_elements(model)
    params = {name: p.detach() for name, p, _ in trained}
    frozen = {name: p.detach() for name, p in model.named_parameters() if not p.requires_grad}
    buffers = {name: b.detach() for name, b in model.named_buffers()}
    constants = {**frozen, **buffers}
    fn = _per_example_grad_fn(model, resolved_loss(task, loss))
    for start in range(0, m, chunk_size):
        stop = min(start + chunk_size, m)
        versions = {name: b._version for name, b in buffers.items()}
        try:
            grads = fn(params, constants, xt[start:stop], yt[start:stop])
        except RuntimeError as exc:
            _refuse_changed_buffers(model, buffers, versions, exc)
            if "vmap" not in str(exc) and "batched" not in str(exc).lower():
                raise
            raise ValueError(
                "per-example gradients (torch.func vmap) cannot handle this model: layers must "
                f"treat each example on its own ({exc})"
            ) from exc
        _refuse_changed_buffers(model, buffers, versions, None)
        # A masked parameter's gradient is computed whole (torch.func differentiates whole
        # tensors) and its trained elements' columns kept.
        columns = [
            grads[name].reshape(stop - start, -1)
            if index is None
            else grads[name].reshape(stop - start, -1)[:, index]
            for name, _, index in trained
        ]
        flat = torch.cat(columns, dim=1)
        # Back on the CPU before encoding: the shares are the same whatever the device.
        out[start:stop] = flat.to(torch.float64).cpu().numpy()
    return out


def check_model_on_data(
    model: nn.Module,
    x: np.ndarray,
    y: np.ndarray,
    what: str = "the data",
    *,
    task: str = "classification",
    loss: str = "",
) -> None:
    """Before any round needs it: every label against the model's number of outputs (class
    labels for classification, finite targets of the outputs' shape for regression), one
    example through the model and its per-example gradient under the run's ``loss``, then
    every example through the model. ValueError in one line naming the problem (what the model
    raised, without its traceback)."""
    if len(x) == 0:
        return
    try:
        logits = eval_forward(model, model_input(model, x[:1]))
    except Exception as exc:  # whatever the user's model raises on this input
        raise ValueError(
            f"the model cannot read {what}: an example of shape {tuple(np.shape(x)[1:])} "
            f"fails: {first_line(exc)}"
        ) from None
    if task == "regression":
        _check_regression_targets(logits, y, what)
    else:
        _check_class_labels(logits, y, what)
    try:
        per_example_gradients(model, x[:1], y[:1], task=task, loss=loss)
    except ValueError:
        raise
    except Exception as exc:
        raise ValueError(
            f"per-example gradients fail on an example of {what}: {first_line(exc)}"
        ) from None
    _check_every_example(model, x, what)


def _check_class_labels(logits: torch.Tensor, y: np.ndarray, what: str) -> None:
    if logits.ndim != 2 or logits.shape[0] != 1:
        raise ValueError(
            f"the model's output for one example of {what} has shape {tuple(logits.shape)}; "
            "the cross-entropy loss needs (1, classes)"
        )
    classes, top = int(logits.shape[1]), int(np.max(y))
    if top >= classes:
        raise ValueError(
            f"{what} has class labels up to {top}, but the model has {classes} outputs "
            f"(classes 0..{classes - 1})"
        )


def _check_regression_targets(outputs: torch.Tensor, y: np.ndarray, what: str) -> None:
    """Regression: finite targets, one per output (a vector for a model with one output)."""
    yy = np.asarray(y)
    if not np.issubdtype(yy.dtype, np.number) or not np.isfinite(yy).all():
        raise ValueError(f"{what} must hold finite numeric regression targets")
    if outputs.ndim != 2 or outputs.shape[0] != 1:
        raise ValueError(
            f"the model's output for one example of {what} has shape {tuple(outputs.shape)}; "
            "a regression model needs (1, outputs)"
        )
    k = int(outputs.shape[1])
    per_example = 1 if yy.ndim == 1 else int(np.prod(yy.shape[1:]))
    if yy.ndim > 2 or per_example != k:
        raise ValueError(
            f"{what} has {per_example} target(s) per example, but the model has {k} output(s)"
        )


#: Examples per forward pass when every example of a data set is tried once.
CHECK_CHUNK = 256


def _check_every_example(model: nn.Module, x: np.ndarray, what: str) -> None:
    """Every example through the model once (no gradients): one the model fails on (a token id
    past an embedding, say) is found now, naming it, not in some later round."""
    for start in range(0, len(x), CHECK_CHUNK):
        chunk = x[start : start + CHECK_CHUNK]
        if _runs(model, chunk):
            continue
        for i in range(len(chunk)):  # find the example: one at a time, this chunk only
            try:
                eval_forward(model, model_input(model, chunk[i : i + 1]))
            except Exception as exc:
                raise ValueError(
                    f"the model fails on example {start + i} of {what} (counted from 0): "
                    f"{first_line(exc)}"
                ) from None


def _runs(model: nn.Module, x: np.ndarray) -> bool:
    try:
        eval_forward(model, model_input(model, x))
    except Exception:  # whatever the user's model raises; the caller names the example
        return False
    return True


def clip_per_example(grads: np.ndarray, clip_norm: float) -> np.ndarray:
    """Scale each row g of ``grads`` by ``min(1, C / ||g||_2)`` (a new float64 array).

    Rows with norm <= C are returned unchanged (bit for bit); zero rows stay zero.
    """
    if not (np.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm}")
    g = np.asarray(grads, dtype=np.float64)
    if g.ndim != 2:
        raise ValueError(f"expected an (m, d) array, got shape {g.shape}")
    norms = np.sqrt(np.einsum("ij,ij->i", g, g))
    # Only rows above the bound are scaled, so small gradients are untouched exactly (a factor
    # computed as C/||g|| >= 1 would be 1 anyway, but this avoids dividing by zero norms).
    over = norms > clip_norm
    factors = np.ones_like(norms)
    factors[over] = clip_norm / norms[over]
    return g * factors[:, None]


def clipped_gradient_sum(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    clip_norm: float,
    *,
    chunk_size: int = DEFAULT_CHUNK,
    task: str = "classification",
    loss: str = "",
) -> np.ndarray:
    """Sum over the batch of the per-example gradients, each clipped to L2 norm <= ``clip_norm``:
    a float64 vector of length d (the trained coordinates). Works chunk by chunk, so memory is
    O(chunk_size * d) whatever the batch size (chunk_size is capped by :func:`bounded_chunk`);
    an empty batch gives the zero vector."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if not (np.isfinite(clip_norm) and clip_norm > 0):
        raise ValueError(f"clip_norm must be a positive finite number, got {clip_norm}")
    check_per_example_compatible(model)
    xt, yt = _as_tensors(model, x, y, task)
    d = trainable_count(model)
    chunk_size = bounded_chunk(chunk_size, d)
    total = np.zeros(d, dtype=np.float64)
    for start in range(0, int(xt.shape[0]), chunk_size):
        stop = start + chunk_size
        g = per_example_gradients(
            model, xt[start:stop], yt[start:stop], chunk_size=chunk_size, task=task, loss=loss
        )
        total += clip_per_example(g, clip_norm).sum(axis=0)
    return total

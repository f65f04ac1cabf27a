"""The paper's three models (SPGC section 5.2.4), seeded initialisation and flat-vector helpers.

Architectures (d = number of parameters):

- ``mnist`` (d = 28,938): conv 5x5, 16 filters, stride 2, padding 2 -> ReLU -> conv 5x5,
  32 filters, stride 2, padding 2 -> ReLU -> flatten -> dense 10. The paper (after Chase et al.)
  gives kernel sizes, filter counts, strides and ReLU, and mentions padding for the first layer
  only; we pad both with 2, which is TensorFlow's "SAME" output size (28 -> 14 -> 7), so the dense
  layer sees 32*7*7 = 1,568 inputs. (TF pads SAME asymmetrically for even inputs; PyTorch pads
  symmetrically; the output sizes and parameter counts are the same.)
- ``cancer`` (d = 62): one dense layer from the 30 standardised features to 2 logits, i.e.
  multinomial logistic regression. The paper's TAPAS version had 90 binarised inputs (d = 182);
  see :mod:`spgc.data`.
- ``diabetes`` (d = 642): dense 8-20-20-2 (XONN). The paper's hidden units use sign
  activations, whose gradient is zero almost everywhere, so plain backpropagation cannot train
  them (XONN trains with a straight-through estimator). We use ``tanh``, the smooth function
  with the same range and sign, as the differentiable stand-in.
- ``mnist-wide`` (d = 10,000,315): not from the paper; an MLP 784 -> 12,579 (ReLU) -> 10 for the
  mnist data, i.e. 784*12,579 + 12,579 + 12,579*10 + 10 parameters, the narrowest such MLP
  with d >= 10,000,000. It exists to exercise the system at a 10M-parameter scale (chunked
  model fetch and share submission, server memory, per-example gradient memory).

Initialisation: PyTorch's default distribution for Linear/Conv2d (weights and biases uniform in
+-1/sqrt(fan_in), which is kaiming_uniform with a = sqrt(5)), but drawn from a
``torch.Generator`` seeded explicitly, in module order, so a given (torch version, seed) gives the
same model everywhere, and building a model does not consume the global torch RNG.

Flat vectors: the servers hold the model as one float64 numpy vector (parameters in
``model.parameters()`` order, each flattened row-major). :func:`model_hash` is the SHA-256 both
servers compare. The float64 vector is canonical: loading it into a float32 model rounds each
value to nearest (deterministic), so re-flattening a loaded model need not give back the vector.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import torch
from torch import nn

MODEL_NAMES: tuple[str, ...] = ("cancer", "diabetes", "mnist", "mnist-wide")

# Input shape each model expects (per example), matching spgc.data.Dataset.input_shape.
MODEL_INPUT_SHAPES: dict[str, tuple[int, ...]] = {
    "mnist": (1, 28, 28),
    "cancer": (30,),
    "diabetes": (8,),
    "mnist-wide": (1, 28, 28),
}

# Hidden width of mnist-wide: the smallest H with 795*H + 10 >= 10,000,000.
WIDE_HIDDEN = 12_579

# Parameter counts, pinned so that a changed architecture is noticed (tests check them).
PARAMETER_COUNTS: dict[str, int] = {
    "mnist": 28_938,
    "cancer": 62,
    "diabetes": 642,
    "mnist-wide": 10_000_315,
}

_HASH_DOMAIN = b"spgc-model-v1\x00"


def _mnist_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(1, 16, kernel_size=5, stride=2, padding=2),
        nn.ReLU(),
        nn.Conv2d(16, 32, kernel_size=5, stride=2, padding=2),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(32 * 7 * 7, 10),
    )


def _cancer_logreg() -> nn.Module:
    return nn.Sequential(nn.Linear(30, 2))


def _diabetes_mlp() -> nn.Module:
    return nn.Sequential(
        nn.Linear(8, 20),
        nn.Tanh(),  # stand-in for XONN's sign activation (differentiable)
        nn.Linear(20, 20),
        nn.Tanh(),
        nn.Linear(20, 2),
    )


def _mnist_wide_mlp() -> nn.Module:
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(28 * 28, WIDE_HIDDEN),
        nn.ReLU(),
        nn.Linear(WIDE_HIDDEN, 10),
    )


_BUILDERS = {
    "mnist": _mnist_cnn,
    "cancer": _cancer_logreg,
    "diabetes": _diabetes_mlp,
    "mnist-wide": _mnist_wide_mlp,
}


@torch.no_grad()
def init_parameters(model: nn.Module, seed: int) -> nn.Module:
    """(Re)initialise every Linear/Conv2d of ``model`` in place from ``seed``: weights and biases
    uniform in +-1/sqrt(fan_in), drawn in module order from a dedicated ``torch.Generator``."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(seed))
    for module in model.modules():
        if isinstance(module, nn.Linear | nn.Conv2d):
            fan_in = module.weight[0].numel()
            bound = 1.0 / float(np.sqrt(fan_in))
            module.weight.uniform_(-bound, bound, generator=gen)
            if module.bias is not None:
                module.bias.uniform_(-bound, bound, generator=gen)
        elif any(True for _ in module.parameters(recurse=False)):
            raise TypeError(f"no seeded initialisation defined for {type(module).__name__}")
    return model


def build_model(dataset_name: str, seed: int = 0, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The model named ``dataset_name``: a dataset's paper model ("cancer", "diabetes",
    "mnist") or another registered one ("mnist-wide"), initialised deterministically from
    ``seed``. Input: a batch of shape ``(n, *MODEL_INPUT_SHAPES[name])``;
    output: ``(n, n_classes)`` logits."""
    key = dataset_name.strip().lower()
    if key not in _BUILDERS:
        raise ValueError(f"unknown model {dataset_name!r}; choose one of {', '.join(MODEL_NAMES)}")
    # Build on the meta device so the default (global-RNG) initialisation does not run, then
    # allocate real storage and fill it from our own generator.
    with torch.device("meta"):
        model = _BUILDERS[key]()
    model = model.to_empty(device="cpu").to(dtype)
    return init_parameters(model, seed)


def parameter_count(model: nn.Module) -> int:
    """Number of trainable scalars d (the length of the flat vector)."""
    return sum(p.numel() for p in model.parameters())


def flatten_params(model: nn.Module) -> np.ndarray:
    """All parameters as one float64 vector, in ``model.parameters()`` order (exact upcast)."""
    params = list(model.parameters())
    if not params:
        return np.zeros(0, dtype=np.float64)
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1).to(torch.float64) for p in params])
    return flat.cpu().numpy().copy()


def load_flat_params(model: nn.Module, vec: np.ndarray) -> None:
    """Copy a flat vector (as from :func:`flatten_params`) into ``model``'s parameters, in place.

    Values are rounded to the parameters' dtype (round to nearest). Refuses a vector of the
    wrong length or with NaN/inf, which would otherwise corrupt the model silently.
    """
    arr = np.asarray(vec)
    d = parameter_count(model)
    if arr.ndim != 1 or arr.shape[0] != d:
        raise ValueError(f"expected a flat vector of {d} parameters, got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(f"expected a floating-point vector, got dtype {arr.dtype}")
    if not np.isfinite(arr).all():
        raise ValueError("parameter vector contains NaN or infinity")
    src = torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float64))
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            n = p.numel()
            p.copy_(src[offset : offset + n].view(p.shape))
            offset += n


def model_hash(vec: np.ndarray) -> str:
    """SHA-256 (hex) identifying a flat parameter vector; the servers compare these.

    Hashed bytes: the domain tag ``b"spgc-model-v1\\0"``, the number of dimensions and each
    dimension as little-endian uint64, then the values as little-endian IEEE float64 in C order.
    Float inputs are upcast to float64 (exact); other dtypes are refused, since e.g. int64 does
    not convert to float64 exactly.
    """
    arr = np.asarray(vec)
    if not np.issubdtype(arr.dtype, np.floating):
        raise TypeError(f"model_hash needs a floating-point array, got dtype {arr.dtype}")
    canon = np.ascontiguousarray(arr, dtype="<f8")
    h = hashlib.sha256(_HASH_DOMAIN)
    h.update(struct.pack(f"<Q{canon.ndim}Q", canon.ndim, *canon.shape))
    h.update(canon.tobytes(order="C"))
    return h.hexdigest()

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
  see :mod:`spgc.learning.data`.
- ``diabetes`` (d = 642): dense 8-20-20-2 (XONN). The paper's hidden units use sign
  activations, whose gradient is zero almost everywhere, so plain backpropagation cannot train
  them (XONN trains with a straight-through estimator). We use ``tanh``, the smooth function
  with the same range and sign, as the differentiable stand-in.
- ``diabetes-regression`` (d = 11): not from the paper; linear regression from the 10
  standardised features of scikit-learn's diabetes data to one output, the standardised
  target (task regression, loss mse; :mod:`spgc.learning.losses`).
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

Users' own models (issue 12): :func:`resolve_model` takes a built-in name or a reference
``"package.module:factory"`` / ``"path/to/file.py:factory"`` to a function that returns an
``nn.Module``; :func:`check_per_example_compatible` refuses layers that per-example gradients
cannot handle (BatchNorm in training mode, ...); :func:`model_fingerprint` identifies the
architecture (parameter names and shapes) so servers and providers can check they built the
same one; :func:`load_initial_state` loads an initial ``.safetensors`` state.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import json
import os
import struct
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.modules.instancenorm import _InstanceNorm
from torch.nn.modules.lazy import LazyModuleMixin

from spgc.common.logs import listed
from spgc.learning.adapters import backbone_state

MODEL_NAMES: tuple[str, ...] = ("cancer", "diabetes", "mnist", "mnist-wide", "diabetes-regression")

# Input shape each model expects (per example), matching spgc.learning.data.Dataset.input_shape.
MODEL_INPUT_SHAPES: dict[str, tuple[int, ...]] = {
    "mnist": (1, 28, 28),
    "cancer": (30,),
    "diabetes": (8,),
    "mnist-wide": (1, 28, 28),
    "diabetes-regression": (10,),
}

# Hidden width of mnist-wide: the smallest H with 795*H + 10 >= 10,000,000.
WIDE_HIDDEN = 12_579

# Parameter counts, pinned so that a changed architecture is noticed (tests check them).
PARAMETER_COUNTS: dict[str, int] = {
    "mnist": 28_938,
    "cancer": 62,
    "diabetes": 642,
    "mnist-wide": 10_000_315,
    "diabetes-regression": 11,
}

_HASH_DOMAIN = b"spgc-model-v1\x00"
_FINGERPRINT_DOMAIN = b"spgc-architecture-v1\x00"


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


def _diabetes_linear() -> nn.Module:
    return nn.Sequential(nn.Linear(10, 1))


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
    "diabetes-regression": _diabetes_linear,
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
    """Number of scalars in all parameters, frozen ones included (the flat vector's length)."""
    return sum(p.numel() for p in model.parameters())


def trainable_count(model: nn.Module) -> int:
    """Number of trained scalars d (``requires_grad``, less the elements a trainable mask leaves
    out): what travels (spgc.learning.trainable)."""
    return sum(p.numel() if idx is None else len(idx) for _, p, idx in trained_elements(model))


#: The attribute of a module that holds the trainable masks of its own parameters, set by
#: :func:`spgc.learning.trainable.set_trainable_mask`: ``{local parameter name: bool tensor}``. On
#: the
#: module, not on the parameter: ``copy.deepcopy`` and ``nn.Module.to`` keep a module's
#: attributes but make new parameters without theirs; and not a buffer, so the state_dict
#: (initial_model, export) is the plain model's.
TRAINABLE_MASKS_ATTRIBUTE = "_spgc_trainable_masks"


def _masks_by_parameter(model: nn.Module) -> dict[int, tuple[str, torch.Tensor]]:
    """The trainable masks set anywhere in ``model``, by ``id`` of their parameter (a
    parameter shared between modules is found whichever module holds the mask), each with the
    parameter's name for messages. ValueError, naming the parameter, for a mask that no longer
    fits: its parameter gone, frozen (``requires_grad=False``) or of another shape."""
    found: dict[int, tuple[str, torch.Tensor]] = {}
    for owner, module in model.named_modules():
        for local, mask in module.__dict__.get(TRAINABLE_MASKS_ATTRIBUTE, {}).items():
            name = f"{owner}.{local}" if owner else local
            param = module._parameters.get(local)
            if param is None:
                raise ValueError(f"a trainable mask is set on {name!r}, which is no parameter")
            if not param.requires_grad:
                raise ValueError(
                    f"parameter {name!r} has a trainable mask but requires_grad=False: a frozen "
                    "parameter trains none of its elements; set requires_grad=True to train "
                    "the masked elements, or drop the mask"
                )
            if tuple(mask.shape) != tuple(param.shape):
                raise ValueError(
                    f"the trainable mask of parameter {name!r} has shape {tuple(mask.shape)}, "
                    f"the parameter {tuple(param.shape)}"
                )
            if id(param) in found and not torch.equal(found[id(param)][1], mask):
                raise ValueError(
                    f"parameters {found[id(param)][0]!r} and {name!r} are one shared parameter "
                    "with two different trainable masks"
                )
            found.setdefault(id(param), (name, mask))
    return found


def trained_elements(model: nn.Module) -> list[tuple[str, nn.Parameter, torch.Tensor | None]]:
    """The parameters that train (``requires_grad``), in ``named_parameters()`` order, each
    with the flat (row-major) positions of its trained elements as an int64 tensor on the
    parameter's device, increasing, or None when all of them train (no trainable mask, or one
    that is all True). The order of :func:`flatten_params` and :func:`trainable_mask`: the
    columns of :func:`spgc.learning.gradients.per_example_gradients`. ValueError for a mask that
    does
    not fit its parameter (:func:`_masks_by_parameter`)."""
    masks = _masks_by_parameter(model)
    out: list[tuple[str, nn.Parameter, torch.Tensor | None]] = []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        mask = masks.get(id(p), (name, None))[1]
        if mask is None or bool(mask.all()):
            out.append((name, p, None))
        else:
            index = torch.from_numpy(np.flatnonzero(mask.reshape(-1).numpy()))
            out.append((name, p, index.to(p.device)))
    return out


_TAKES_INTEGERS: weakref.WeakKeyDictionary[nn.Module, bool] = weakref.WeakKeyDictionary()


def model_input(model: nn.Module, x: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``x`` as ``model``'s input, on its device: floats in the model's dtype; integers (token
    ids for an ``nn.Embedding``) as int64 when the model takes integers, else as floats (pixel
    values stored as uint8, say). Which one is found once per model, on one example."""
    first = next(model.parameters(), None)
    if first is None:
        raise ValueError("the model has no parameters to train")
    xt = torch.as_tensor(x if isinstance(x, torch.Tensor) else np.asarray(x))
    if not xt.is_floating_point() and xt.shape[0] > 0:
        takes = _TAKES_INTEGERS.get(model)
        if takes is None:
            takes = _TAKES_INTEGERS[model] = _runs_on(model, xt[:1].to(first.device, torch.int64))
        if takes:
            return xt.to(first.device, torch.int64)
    return xt.to(device=first.device, dtype=first.dtype)


def _runs_on(model: nn.Module, x: torch.Tensor) -> bool:
    try:
        eval_forward(model, x)
        return True
    except Exception:  # any refusal of integer input: floats it is
        return False


def eval_forward(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """``model(x)`` in eval mode without gradients; the model's mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return model(x)
    finally:
        model.train(was_training)


def trainable_mask(model: nn.Module) -> np.ndarray:
    """Bool (D,), in :func:`flatten_params` order: False for the scalars of a parameter with
    ``requires_grad=False`` (a frozen layer) and for the elements its trainable mask leaves out
    (:func:`spgc.learning.trainable.set_trainable_mask`). Frozen scalars stay in the whole flat
    vector,
    but never travel in a model or share vector and are never updated (spgc.learning.trainable)."""
    trained = {id(p): idx for _, p, idx in trained_elements(model)}
    parts = []
    for p in model.parameters():
        part = np.full(p.numel(), id(p) in trained and trained[id(p)] is None, dtype=bool)
        if trained.get(id(p)) is not None:
            part[trained[id(p)].cpu().numpy()] = True
        parts.append(part)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=bool)


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


# --------------------------------------------------------------------------------------------
# Users' own models
# --------------------------------------------------------------------------------------------


def _load_file_module(path: Path, ref: str) -> ModuleType:
    """Execute the Python file ``path`` as a module (registered in ``sys.modules`` under a name
    derived from its absolute path, so dataclasses and pickling inside it work)."""
    if not path.is_file():
        where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
        raise ValueError(f"{ref!r}: no such file {str(path)!r}{where}")
    resolved = path.resolve()
    digest = hashlib.sha256(str(resolved).encode()).hexdigest()[:12]
    name = f"spgc_user_{digest}_{resolved.stem.replace('-', '_')}"
    spec = importlib.util.spec_from_file_location(name, resolved)
    if spec is None or spec.loader is None:
        raise ValueError(f"{ref!r}: cannot load {str(path)!r} as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[name]
        raise ValueError(
            f"{ref!r}: running {str(path)!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    return module


def _import_from_path_or_cwd(target: str) -> ModuleType:
    """``import target``; a package missing from sys.path is also looked for in the current
    directory, as ``python -m`` would (a console script's sys.path lacks it)."""
    try:
        return importlib.import_module(target)
    except ModuleNotFoundError as exc:
        top = target.split(".")[0]
        cwd = str(Path.cwd())
        if exc.name != top or cwd in sys.path or not (
            Path(cwd, top).is_dir() or Path(cwd, f"{top}.py").is_file()
        ):
            raise
        sys.path.append(cwd)  # appended: never shadows an installed module
        return importlib.import_module(target)


def resolve_callable(ref: str, what: str = "factory") -> Callable[..., object]:
    """The function named by ``"package.module:name"`` or ``"path/to/file.py:name"``.

    A module reference is imported with :func:`importlib.import_module` (from sys.path, else from
    the current directory); a ``.py`` path (relative to the current directory unless absolute)
    is executed as a module of its own. Raises
    ``ValueError`` naming ``ref`` and the reason when the module cannot be imported, has no such
    attribute, or the attribute is not callable (``what`` names the role in the messages).
    """
    if not isinstance(ref, str) or ":" not in ref:
        raise ValueError(
            f"{ref!r} is not a reference to a {what}: expected 'package.module:{what}' "
            f"or 'path/to/file.py:{what}'"
        )
    target, _, attr = ref.strip().rpartition(":")
    if not target or not attr.isidentifier():
        raise ValueError(
            f"{ref!r} is not a reference to a {what}: expected 'package.module:{what}' "
            f"or 'path/to/file.py:{what}'"
        )
    if target.endswith(".py"):
        module = _load_file_module(Path(target).expanduser(), ref)
    else:
        try:
            module = _import_from_path_or_cwd(target)
        except ImportError as exc:
            raise ValueError(
                f"{ref!r}: cannot import {target!r}: {exc} (searched sys.path and the current "
                f"directory {Path.cwd()}; set PYTHONPATH to the directory holding the package)"
            ) from None
        except Exception as exc:
            raise ValueError(
                f"{ref!r}: importing {target!r} failed: {type(exc).__name__}: {exc}"
            ) from exc
    if not hasattr(module, attr):
        raise ValueError(f"{ref!r}: {target!r} has no attribute {attr!r}")
    func = getattr(module, attr)
    if not callable(func):
        raise ValueError(f"{ref!r}: {attr!r} is a {type(func).__name__}, not a callable {what}")
    return func


def resolve_model(ref: str, seed: int = 0) -> nn.Module:
    """The model named by ``ref``: a built-in name (:data:`MODEL_NAMES`, built by
    :func:`build_model`) or a factory reference ``"package.module:factory"`` /
    ``"path/to/file.py:factory"``, called with no arguments.

    The factory runs with torch's global RNG seeded from ``seed`` (inside
    :func:`torch.random.fork_rng`, so the caller's RNG state is left as it was): both servers and
    every provider get identical initial weights from the same ``(ref, seed)`` and torch version.
    Raises ``ValueError`` naming ``ref`` when the factory cannot be found or run, or returns
    something other than an ``nn.Module``.
    """
    if isinstance(ref, str) and ref.strip().lower() in _BUILDERS:
        return build_model(ref, seed=seed)
    if not isinstance(ref, str) or ":" not in ref:
        raise ValueError(
            f"unknown model {ref!r}; choose one of {', '.join(MODEL_NAMES)}, or give a factory "
            "as 'package.module:factory' or 'path/to/file.py:factory'"
        )
    factory = resolve_callable(ref, "factory")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(seed))
        try:
            model = factory()
        except Exception as exc:
            raise ValueError(f"model factory {ref!r} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(model, nn.Module):
        raise ValueError(
            f"model factory {ref!r} must return a torch.nn.Module, got {type(model).__name__}"
        )
    return model


def check_per_example_compatible(model: nn.Module) -> None:
    """Refuse a model whose per-example gradients :mod:`spgc.learning.gradients` cannot compute.

    Raises ``ValueError`` naming the first offending layer (its name in ``named_modules()`` and
    its class) for: BatchNorm of any kind (SyncBatchNorm included) in training mode, or in eval
    mode without running statistics (it then normalises with the batch's statistics, which mixes
    the examples of a batch); InstanceNorm with ``track_running_stats=True`` in training mode
    (it updates its buffers during the forward pass); lazy layers not yet initialised. Also
    refuses a model without parameters, or with every parameter frozen. GroupNorm and
    LayerNorm are per-example and fine.
    """
    if not isinstance(model, nn.Module):
        raise ValueError(f"expected a torch.nn.Module, got {type(model).__name__}")
    advice = "use GroupNorm or LayerNorm instead, which normalise each example on its own"
    for name, module in model.named_modules():
        where = f"{name or '<model>'} ({type(module).__name__})"
        if isinstance(module, _BatchNorm) and (
            module.training or not module.track_running_stats or module.running_mean is None
        ):
            raise ValueError(
                f"layer {where} is not supported: batch normalisation mixes the examples of a "
                f"batch, so per-example gradients (and their clipping) are undefined; {advice}"
            )
        if isinstance(module, _InstanceNorm) and module.track_running_stats and module.training:
            raise ValueError(
                f"layer {where} is not supported: with track_running_stats=True it updates its "
                "running statistics from each batch during the forward pass; set "
                f"track_running_stats=False, or {advice}"
            )
        if isinstance(module, LazyModuleMixin) and module.has_uninitialized_params():
            raise ValueError(
                f"layer {where} is not supported: its parameters are not initialised yet; use "
                "the non-lazy layer with explicit sizes"
            )
    if not any(True for _ in model.parameters()):
        raise ValueError("the model has no parameters to train")
    if not any(p.requires_grad for p in model.parameters()):
        raise ValueError(
            "every parameter of the model is frozen (requires_grad=False): there is nothing "
            "to train, and each round would spend privacy for nothing"
        )
    if trainable_count(model) == 0:  # also checks each trainable mask against its parameter
        raise ValueError(
            "the trainable masks leave no element of the model to train: there is nothing "
            "to train, and each round would spend privacy for nothing"
        )


def check_buffers_match(model: nn.Module, as_built: nn.Module, how: str) -> None:
    """Refuse a run model whose buffers (BatchNorm statistics, registered tensors) differ from
    ``as_built``'s, the same factory as every provider and evaluator builds it (seed 0, no
    initial state). Only parameters travel between the parties, so each builds its buffers
    itself; a buffer that depends on ``how`` (model_seed, initial_model) would differ between
    the model trained, the providers' and the exported one. ValueError naming the buffers."""
    built = dict(as_built.named_buffers())
    differ = [
        name
        for name, buf in model.named_buffers()
        if name not in built
        or built[name].shape != buf.shape
        or not torch.equal(built[name].to(buf.dtype), buf)
    ]
    if differ:
        raise ValueError(
            f"buffer(s) {listed(differ)} differ from those the factory builds without {how}: "
            "only parameters travel between servers and providers, and each party builds its "
            "buffers itself from the factory, so they must not depend on it; make them a "
            "fixed part of the factory, or parameters with requires_grad=False (which travel)"
        )


def model_fingerprint(model: nn.Module) -> str:
    """A short hex digest (16 characters of SHA-256) of the model's architecture: its parameter
    names and shapes in ``named_parameters()`` order, which are frozen and which elements the
    trainable masks leave out, not their values or dtype. Two models with the same fingerprint
    have flat vectors (:func:`flatten_params`) of the same layout, and train the same
    coordinates."""
    trained = {id(p): idx for _, p, idx in trained_elements(model)}
    layout = []
    for name, p in model.named_parameters():
        entry: list[object] = [name, list(p.shape)]
        if id(p) not in trained:
            entry.append("frozen")
        elif (index := trained[id(p)]) is not None:
            # A masked parameter: which elements train (a model without masks keeps the
            # fingerprint it had before masks existed).
            positions = np.ascontiguousarray(index.cpu().numpy(), dtype="<i8").tobytes()
            entry += ["masked", hashlib.sha256(positions).hexdigest()]
        layout.append(entry)
    h = hashlib.sha256(_FINGERPRINT_DOMAIN)
    h.update(json.dumps(layout, separators=(",", ":")).encode())
    return h.hexdigest()[:16]


def load_initial_state(model: nn.Module, path: str | os.PathLike[str]) -> None:
    """Load a ``.safetensors`` state (as saved from ``model.state_dict()``) into ``model``, in
    place; values are converted to the model's dtypes.

    Raises ``ValueError`` when the file is missing or unreadable, when its keys differ from the
    model's ``state_dict()`` keys (listing the missing and the unexpected ones) and the state
    is not a backbone of the model either (a pretrained backbone that the model wraps with
    adapters or a new head, :mod:`spgc.learning.adapters`), when a tensor's shape differs, or when a
    floating-point tensor holds NaN or infinity.
    """
    file = Path(path)
    if not file.is_file():
        raise ValueError(f"initial state {str(file)!r}: no such file")
    try:
        state = load_file(str(file))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ValueError(
            f"initial state {str(file)!r}: not a readable safetensors file: {exc}"
        ) from None
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    unexpected = [k for k in state if k not in expected]
    problems = []
    if missing:
        problems.append(f"missing keys {listed(missing)}")
    if unexpected:
        problems.append(f"unexpected keys {listed(unexpected)}")
    # A pretrained backbone of a model that wraps it (adapters: spgc.learning.adapters)?
    if problems:
        try:
            state = backbone_state(model, state)
            problems = []
        except ValueError as exc:
            problems.append(f"nor is it a backbone of the model: {exc}")
    shapes = [
        f"{k} {tuple(state[k].shape)} (model {tuple(v.shape)})"
        for k, v in expected.items()
        if k in state and tuple(state[k].shape) != tuple(v.shape)
    ]
    if shapes:
        problems.append(f"wrong shapes {listed(shapes)}")
    if problems:
        raise ValueError(
            f"initial state {str(file)!r} does not fit the model: {'; '.join(problems)}"
        )
    bad = [k for k, t in state.items() if t.is_floating_point() and not torch.isfinite(t).all()]
    if bad:
        raise ValueError(f"initial state {str(file)!r}: NaN or infinity in {listed(bad)}")
    with torch.no_grad():
        model.load_state_dict(state, strict=True)

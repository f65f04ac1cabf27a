"""Which coordinates of a model's flat vector are trained, and so travel (issue 33).

A parameter with ``requires_grad=False`` is frozen: it keeps its initial value for the whole
run. A model factory may also train only some elements of a parameter (low-rank factors with a
sparse mask, issue 36): :func:`set_trainable_mask` marks them, and the elements it leaves out
are frozen like a frozen parameter's. Only the trainable coordinates are clipped, encoded,
shared, summed, noised, released and accounted; the model vector served each round (and its
SHA-256) holds them alone, and the frozen coordinates are fetched once per run and checked
against ``frozen_sha256``. A model with nothing frozen has one range covering everything, and
every vector is the whole model, as before. The wire form is ``TrainingConfig.trainable``
(ranges, at most :data:`MAX_RANGES_WIRE_BYTES` of them) with ``model_parameters`` and
``frozen_sha256``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from spgc.learning.models import TRAINABLE_MASKS_ATTRIBUTE, trainable_mask
from spgc.wire.transport import DEFAULT_MAX_MESSAGE_BYTES

__all__ = [
    "MAX_RANGES_WIRE_BYTES",
    "TrainableCoordinates",
    "TrainableLayoutError",
    "set_trainable_mask",
]

#: The most bytes the trainable ranges may take in TrainingConfig (field ``trainable``): the
#: plan travels in one gRPC message (HelloResponse to providers, HandshakeRequest between the
#: servers) of at most DEFAULT_MAX_MESSAGE_BYTES (1 MiB + 64 KiB); the other 64 KiB are left
#: for the rest of that message. About 100,000 ranges (10 bytes each) fit.
MAX_RANGES_WIRE_BYTES = DEFAULT_MAX_MESSAGE_BYTES - (64 << 10)


def set_trainable_mask(
    module: nn.Module, name: str, mask: torch.Tensor | np.ndarray | None
) -> None:
    """Train only the elements of parameter ``name`` of ``module`` (dotted: ``"layer.weight"``)
    where the bool ``mask``, of the parameter's shape, is True; ``None`` drops a mask set
    before. The other elements are frozen: they keep their initial value for the whole run and
    never travel (no gradient column, no share coordinate, no update). Call it in the model
    factory, on the model it returns (every server and provider builds the model from the
    factory, so they all train the same elements; the mask is part of the model fingerprint).

    ValueError with a message naming the parameter when it does not exist, is frozen
    (``requires_grad=False``: a mask marks elements of a trained parameter), or the mask is
    not bool or not of its shape. A model whose masks leave nothing to train is refused when
    the run starts (:func:`spgc.learning.models.check_per_example_compatible`)."""
    owner_name, _, local = name.rpartition(".")
    try:
        owner = module.get_submodule(owner_name)
    except AttributeError:
        owner = None
    param = owner._parameters.get(local) if owner is not None else None
    if param is None:
        known = ", ".join(n for n, _ in module.named_parameters()) or "none"
        raise ValueError(
            f"set_trainable_mask: {type(module).__name__} has no parameter {name!r} "
            f"(its parameters: {known})"
        )
    masks = owner.__dict__.setdefault(TRAINABLE_MASKS_ATTRIBUTE, {})
    if mask is None:
        masks.pop(local, None)
        return
    if not param.requires_grad:
        raise ValueError(
            f"set_trainable_mask: parameter {name!r} is frozen (requires_grad=False); a "
            "trainable mask marks the elements of a trained parameter that train: set "
            "requires_grad=True first, or leave the parameter frozen without a mask"
        )
    is_bool_tensor = isinstance(mask, torch.Tensor) and mask.dtype == torch.bool
    if not (is_bool_tensor or (isinstance(mask, np.ndarray) and mask.dtype == np.bool_)):
        kind = mask.dtype if isinstance(mask, torch.Tensor | np.ndarray) else type(mask).__name__
        raise ValueError(
            f"set_trainable_mask: the mask of parameter {name!r} must be a bool tensor or "
            f"array (True where an element trains), not {kind}"
        )
    if tuple(mask.shape) != tuple(param.shape):
        raise ValueError(
            f"set_trainable_mask: the mask of parameter {name!r} has shape "
            f"{tuple(mask.shape)}, the parameter {tuple(param.shape)}"
        )
    masks[local] = torch.as_tensor(mask).detach().to("cpu", copy=True)


class TrainableLayoutError(ValueError):
    """A trainable layout that is not a valid set of ranges of the model's vector."""


@dataclass(frozen=True)
class TrainableCoordinates:
    """The trainable coordinates of a flat vector of ``total`` values, as sorted disjoint
    ``(start, length)`` ranges."""

    total: int
    ranges: tuple[tuple[int, int], ...]
    _index: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        end = 0
        for start, length in self.ranges:
            if start < end or length < 1 or start + length > self.total:
                raise TrainableLayoutError(
                    f"trainable ranges must be increasing, disjoint, non-empty and within the "
                    f"model's {self.total} parameters; got ({start}, {length}) after {end}"
                )
            end = start + length
        # Every range's positions at once (a sparse mask makes many short ranges): position
        # k of the index lies in range r at start_r + (k - offset_r).
        starts, lengths = np.array(self.ranges, dtype=np.int64).reshape(-1, 2).T
        offsets = np.cumsum(lengths) - lengths
        index = np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))
        object.__setattr__(self, "_index", index)

    @classmethod
    def of_model(cls, model: nn.Module) -> TrainableCoordinates:
        """The coordinates of ``model``'s parameters with ``requires_grad`` set, within their
        trainable masks (:func:`set_trainable_mask`). TrainableLayoutError when they make more
        ranges than TrainingConfig can carry (:meth:`check_wire_size`)."""
        layout = cls.from_mask(trainable_mask(model))
        layout.check_wire_size()
        return layout

    @classmethod
    def from_mask(cls, mask: np.ndarray) -> TrainableCoordinates:
        """From a boolean vector, True where a coordinate is trained."""
        mask = np.asarray(mask, dtype=bool)
        edges = np.flatnonzero(np.diff(np.concatenate([[False], mask, [False]]).astype(np.int8)))
        starts, stops = edges[0::2], edges[1::2]
        ranges = tuple((int(a), int(b - a)) for a, b in zip(starts, stops, strict=True))
        return cls(len(mask), ranges)

    @classmethod
    def everything(cls, total: int) -> TrainableCoordinates:
        return cls(total, ((0, total),) if total else ())

    @classmethod
    def from_wire(
        cls, count: int, total: int, ranges: Iterable[tuple[int, int]]
    ) -> TrainableCoordinates:
        """From TrainingConfig's ``num_parameters``, ``model_parameters`` (0: nothing frozen)
        and ``trainable`` ranges (empty: all); TrainableLayoutError when they disagree."""
        ranges = tuple((int(s), int(n)) for s, n in ranges)
        if not ranges:
            if total not in (0, count):
                raise TrainableLayoutError(
                    f"model_parameters {total} differs from num_parameters {count} but no "
                    "trainable ranges are given"
                )
            return cls.everything(count)
        layout = cls(total, ranges)
        if layout.count != count:
            raise TrainableLayoutError(
                f"the trainable ranges cover {layout.count} coordinates, num_parameters is {count}"
            )
        return layout

    @property
    def count(self) -> int:
        """How many coordinates are trained: the length of every model and share vector."""
        return len(self._index)

    @property
    def frozen_count(self) -> int:
        return self.total - self.count

    @property
    def anything_frozen(self) -> bool:
        return self.count < self.total

    @property
    def index(self) -> np.ndarray:
        """The trained coordinates' positions in the whole vector (int64, increasing)."""
        return self._index

    def frozen_index(self) -> np.ndarray:
        mask = np.ones(self.total, dtype=bool)
        mask[self._index] = False
        return np.flatnonzero(mask)

    def wire_ranges(self) -> list[tuple[int, int]]:
        """What TrainingConfig.trainable carries: the ranges, or none when nothing is frozen."""
        return list(self.ranges) if self.anything_frozen else []

    def wire_bytes(self) -> int:
        """At most the bytes :meth:`wire_ranges` take in a TrainingConfig message: per range,
        the field's 2-byte tag, its length byte and the two varint fields with their tags (a
        start of 0 is not encoded at all: 2 bytes fewer)."""
        if not self.anything_frozen:
            return 0
        values = np.asarray(self.ranges, dtype=np.uint64).reshape(-1)
        varint_bytes = np.ones(len(values), dtype=np.int64)
        for shift in range(7, 64, 7):
            varint_bytes += values >= (np.uint64(1) << np.uint64(shift))
        return 3 * len(self.ranges) + int(varint_bytes.sum()) + len(values)

    def check_wire_size(self) -> None:
        """TrainableLayoutError, naming the figures, when the ranges take more than
        :data:`MAX_RANGES_WIRE_BYTES` in TrainingConfig: scattered trainable elements make one
        range each."""
        size = self.wire_bytes()
        if size > MAX_RANGES_WIRE_BYTES:
            raise TrainableLayoutError(
                f"the trainable coordinates form {len(self.ranges):,} separate ranges, which "
                f"take {size:,} bytes in the plan (TrainingConfig.trainable); at most "
                f"{MAX_RANGES_WIRE_BYTES:,} fit in one message (about 100,000 ranges): train "
                "contiguous blocks (whole rows of a weight, say) rather than scattered "
                "elements, or fewer of them"
            )

    def trainable_part(self, whole: np.ndarray) -> np.ndarray:
        """The model vector of ``whole``: its trained coordinates, in order (a copy)."""
        return np.asarray(whole)[self._index]

    def frozen_part(self, whole: np.ndarray) -> np.ndarray:
        return np.asarray(whole)[self.frozen_index()]

    def assemble(self, trainable: np.ndarray, frozen: np.ndarray) -> np.ndarray:
        """The whole vector from its two parts (float64)."""
        if len(trainable) != self.count or len(frozen) != self.frozen_count:
            raise TrainableLayoutError(
                f"expected {self.count} trainable and {self.frozen_count} frozen values, got "
                f"{len(trainable)} and {len(frozen)}"
            )
        whole = np.empty(self.total, dtype=np.float64)
        whole[self._index] = trainable
        whole[self.frozen_index()] = frozen
        return whole

    def expand(self, trainable: np.ndarray) -> np.ndarray:
        """A whole-model vector with ``trainable`` at the trained coordinates and 0 elsewhere
        (a released update: a frozen parameter never moves)."""
        out = np.zeros(self.total, dtype=np.float64)
        out[self._index] = trainable
        return out

    def frozen_sha256(self, whole: np.ndarray) -> bytes:
        """SHA-256 of the frozen coordinates' little-endian float64 bytes (b"" when none)."""
        if not self.anything_frozen:
            return b""
        data = np.ascontiguousarray(self.frozen_part(whole), dtype="<f8").tobytes()
        return hashlib.sha256(data).digest()

    def describe(self) -> str:
        """One line for logs: "d of D parameters trained (F frozen)"."""
        if not self.anything_frozen:
            return f"all {self.total:,} parameters trained"
        return f"{self.count:,} of {self.total:,} parameters trained ({self.frozen_count:,} frozen)"

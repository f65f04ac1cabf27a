"""A Flower ArrayRecord as SPGC's flat float64 vector and back.

The order is the record's key order, each array flattened in C order: the order of
``model.parameters()`` (spgc.learning.models.flatten_params) when the record is a model's parameters
(``ArrayRecord(model.state_dict())`` of a model without buffers). The sizes must match the
servers' plan: :func:`check_dimension` says so in one line when they do not.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

__all__ = ["DimensionMismatch", "check_dimension", "flat_vector", "record_like"]


class DimensionMismatch(ValueError):
    """The Flower app's arrays and the SPGC servers' model have different sizes."""


def flat_vector(record: ArrayRecord) -> np.ndarray:
    """Every array of ``record``, in key order, as one float64 vector."""
    parts = [np.asarray(a, dtype=np.float64).reshape(-1) for a in record.to_numpy_ndarrays()]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)


def record_like(template: ArrayRecord, flat: np.ndarray) -> ArrayRecord:
    """``flat`` cut into arrays of ``template``'s keys, shapes and dtypes."""
    arrays = template.to_numpy_ndarrays()
    check_dimension(template, int(np.asarray(flat).size), "the vector")
    out: dict[str, Array] = {}
    start = 0
    for key, a in zip(template.keys(), arrays, strict=True):
        stop = start + a.size
        out[key] = Array(np.asarray(flat[start:stop]).reshape(a.shape).astype(a.dtype))
        start = stop
    return ArrayRecord(out)


def check_dimension(record: ArrayRecord, num_parameters: int, what: str) -> None:
    """DimensionMismatch (one line) unless ``record`` holds ``num_parameters`` values."""
    size = sum(int(a.size) for a in record.to_numpy_ndarrays())
    if size != num_parameters:
        raise DimensionMismatch(
            f"the Flower app's arrays hold {size:,} values but {what} has {num_parameters:,}: "
            "the SPGC servers' model must be the Flower app's model (its parameters only, no "
            "buffers, in the same order)"
        )

"""Correlated OT on its own, for measurement (`spgc bench ot`, `spgc bench comm`): the silent OT
(Ferret) and SoftSpoken extensions run between two parties over a Channel, outside any session.

Silent OT's sender holds Delta and gets q_i; the receiver gets random choice bits b_i and
t_i = q_i ^ b_i Delta (docs/GMW.md, "Silent OT"). These functions return the outputs so that
a caller can check the correlation, and byte counts and timings of each side.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from garbled_core import _core

__all__ = ["cot_receive", "cot_send", "silent_cot_receive", "silent_cot_send", "silent_ot_params"]


def silent_ot_params(test_only: bool = False) -> dict[str, Any]:
    """Ferret's parameter sets (``test_only``: the INSECURE small set the tests use): sizes of
    the setup and main iterations, the sender's bytes per iteration, ``bits_per_ot`` after setup
    and ``usable_per_iteration``."""
    return dict(_core._silent_ot_params(test_only))


def silent_cot_send(channel: Any, m: int | list[int]) -> tuple[np.ndarray, np.ndarray, dict]:
    """Silent COT sender (Ferret's set): setup, then ``m`` OTs (or a list of extend sizes).
    Returns (Delta as 1 x 16 bytes, q as m x 16 bytes, this side's byte counts and seconds)."""
    return _core._silent_cot_send(channel, m, False, True)


def silent_cot_receive(channel: Any, m: int | list[int]) -> tuple[np.ndarray, np.ndarray, dict]:
    """Silent COT receiver: (choice bits packed LSB first, t as m x 16 bytes, this side's byte
    counts and seconds)."""
    return _core._silent_cot_recv(channel, m, False, True)


def cot_send(channel: Any, m: int, ot_k: int) -> tuple[np.ndarray, np.ndarray]:
    """SoftSpoken (``ot_k`` >= 1) or IKNP (0) COT sender for ``m`` OTs: (Delta, q)."""
    return _core._cot_send(channel, m, ot_k)


def cot_receive(channel: Any, choices: np.ndarray, ot_k: int) -> np.ndarray:
    """The matching receiver with packed ``choices`` (8 OTs a byte): its labels t."""
    return _core._cot_recv(channel, choices, ot_k)

"""ldp mode: a provider's own noise, and the noisy vector of its latest round.

:func:`local_noise` draws N_Z(0, sigma^2) with the servers' exact sampler, in plaintext on the
provider's own randomness. :class:`LastNoisyVector` keeps the noisy vector the provider sent
for a round, so that a round sent again (the server dropped it and runs it again) gets the SAME
vector: sending it twice reveals nothing more, where a second draw would be a second noisy view
of the same gradient. Every vector drawn is counted in the data set's budget file before it is
drawn (providers/data_budget.py), a second one for a round included (after a restart).
"""

from __future__ import annotations

import hashlib
import math
import os

import numpy as np

from spgc.privacy.noise import sample_noise_plain

__all__ = ["LastNoisyVector", "local_noise"]


def local_noise(sigma_units: float, size: int, seed: bytes | None = None) -> np.ndarray:
    """``size`` samples of N_Z(0, sigma_units^2) as int64, for ldp mode: the servers' exact
    sampler (statistical distance <= 2^-64 per sample, docs/NOISE_SAMPLER.md) evaluated in
    plaintext on this provider's own randomness. ``seed``: 32 bytes for reproducible tests;
    by default fresh from the OS CSPRNG (the noise must stay secret)."""
    if not (sigma_units > 0 and math.isfinite(sigma_units)):
        raise ValueError(f"sigma must be finite and > 0, got {sigma_units}")
    seed = os.urandom(32) if seed is None else seed
    # The sampler XORs two independent streams; both derive from this provider's one seed.
    s1 = hashlib.sha256(b"spgc-ldp-1" + seed).digest()
    s2 = hashlib.sha256(b"spgc-ldp-2" + seed).digest()
    return sample_noise_plain(s1, s2, size, sigma_units)


class LastNoisyVector:
    """The noisy vector (and its batch size) sent for the latest (run, round), in memory."""

    def __init__(self) -> None:
        self._kept: tuple[tuple[str, int], np.ndarray, int] | None = None

    def get(self, run_id: str, round_number: int) -> tuple[np.ndarray, int] | None:
        """The vector kept for this round (None: none, or another round's)."""
        if self._kept is None or self._kept[0] != (run_id, round_number):
            return None
        return self._kept[1], self._kept[2]

    def keep(self, run_id: str, round_number: int, vector: np.ndarray, batch_size: int) -> None:
        """Keep this round's vector (an earlier round's is dropped: never sent again)."""
        self._kept = ((run_id, round_number), vector, batch_size)

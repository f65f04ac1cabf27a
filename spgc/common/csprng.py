"""A cryptographically secure random generator for the choices that must stay secret.

The privacy amplification by subsampling that the accountant relies on (each example joins a
batch independently with probability q, and nobody but the provider learns which did) only
holds when nobody can predict or bias the selection. numpy's generators (PCG64, MT19937) are
statistical generators: a few outputs reveal their state and therefore every later draw. So
batch selection draws from :class:`SecureRandom`, an AES-256 keystream in counter mode keyed
from ``os.urandom(32)``:

- the keystream of AES-256-CTR under a uniformly random key is computationally
  indistinguishable from uniform bytes (AES as a pseudo-random permutation; the PRP/PRF switch
  costs (blocks)^2 / 2^129, nothing for any realistic amount of output);
- a ``seed`` (a 32-byte key) makes the stream reproducible, for tests and debugging only: whoever
  knows the key knows every batch.

A copy of a generator would replay its stream, so instances refuse to be pickled or copied;
a forked process still inherits the parent's state: create a fresh one in the child.
"""

from __future__ import annotations

import math
import os
import threading
from fractions import Fraction
from typing import Any

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

KEY_BYTES = 32  # AES-256
_TWO_64 = 1 << 64


class SecureRandom:
    """Random draws from the AES-256-CTR keystream of a 32-byte key.

    ``seed``: the key, exactly 32 bytes, for reproducible runs (tests); default a fresh key from
    ``os.urandom(32)``. The counter block starts at zero; the key is never reused by this class
    across instances unless the caller passes the same ``seed``. Draws are serialised by a lock,
    so one instance may be shared between threads (the stream order then depends on scheduling).
    """

    __slots__ = ("_encryptor", "_lock", "seeded")

    def __init__(self, seed: bytes | None = None) -> None:
        if seed is None:
            key = os.urandom(KEY_BYTES)
        else:
            if not isinstance(seed, bytes | bytearray | memoryview):
                raise TypeError(
                    f"SecureRandom seed must be {KEY_BYTES} bytes (an AES-256 key), "
                    f"got {type(seed).__name__}"
                )
            key = bytes(seed)
            if len(key) != KEY_BYTES:
                raise ValueError(
                    f"SecureRandom seed must be exactly {KEY_BYTES} bytes (an AES-256 key), "
                    f"got {len(key)}"
                )
        self.seeded = seed is not None
        self._encryptor = Cipher(algorithms.AES(key), modes.CTR(bytes(16))).encryptor()
        self._lock = threading.Lock()

    def __repr__(self) -> str:  # never show the key
        return f"SecureRandom(AES-256-CTR, {'seeded' if self.seeded else 'os.urandom key'})"

    def __reduce__(self) -> Any:
        # A pickled copy would replay the same stream (and carry the key): refuse.
        raise TypeError("SecureRandom cannot be pickled: a copy would replay the same stream")

    # ------------------------------------------------------------------------- raw output

    def random_bytes(self, n: int) -> bytes:
        """The next ``n`` bytes of the keystream."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        with self._lock:
            return self._encryptor.update(bytes(n))

    def uint64(self, n: int) -> np.ndarray:
        """``n`` independent uniform 64-bit unsigned integers (uint64)."""
        return np.frombuffer(self.random_bytes(8 * n), dtype="<u8").astype(np.uint64)

    # ------------------------------------------------------------------------- distributions

    def uniform(self, n: int) -> np.ndarray:
        """``n`` float64 values uniform on the grid ``k / 2^53``, ``k`` in ``[0, 2^53)``: in
        ``[0, 1)``, 53 random bits each (every float64 of that grid equally likely)."""
        return (self.uint64(n) >> np.uint64(11)).astype(np.float64) * (2.0**-53)

    def bernoulli(self, n: int, p: float) -> np.ndarray:
        """``n`` independent booleans, each True with probability ``p`` in ``[0, 1]``.

        Each draw compares a uniform 64-bit integer ``u`` with the threshold
        ``t = floor(p * 2^64)`` (computed exactly from the float64 ``p``) and is True when
        ``u < t``, so ``P(True) = t / 2^64`` and ``p - 2^-64 < P(True) <= p``. The probability is
        exactly ``p`` whenever ``p * 2^64`` is an integer, which holds for every float64
        ``p >= 2^-12`` (and for ``p = 0``). ``p = 1`` is every draw True.
        """
        if not 0.0 <= p <= 1.0:  # also refuses NaN
            raise ValueError(f"probability must be in [0, 1], got {p}")
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        threshold = math.floor(Fraction(p) * _TWO_64)
        if threshold >= _TWO_64:  # p == 1: t would be 2^64, which uint64 cannot hold
            return np.ones(n, dtype=bool)
        return self.uint64(n) < np.uint64(threshold)

    def below(self, bounds: int | np.ndarray) -> np.ndarray:
        """Independent integers uniform on ``[0, b)`` for each ``b`` in ``bounds`` (each
        ``1 <= b <= 2^64 - 1``); returns uint64 with ``bounds``' shape (a 0-d array for an int).

        Exactly uniform: a 64-bit draw ``u`` is rejected (and redrawn) when it falls in the last
        ``2^64 mod b`` values, so ``u mod b`` has no modulo bias.
        """
        if isinstance(bounds, int) and not 1 <= bounds < _TWO_64:
            raise ValueError(f"bound must be in [1, 2^64), got {bounds}")
        b = np.asarray(bounds)
        if b.dtype.kind not in "iu":
            raise TypeError(f"bounds must be integers, got {b.dtype}")
        if b.size and b.min() < 1:
            raise ValueError(f"bounds must be >= 1, got {b.min()}")
        b = b.astype(np.uint64)
        # 2^64 mod b, in uint64 arithmetic: (2^64 - b) mod b. Accept u when u <= ~rem, i.e.
        # u < 2^64 - rem, the largest multiple of b that fits.
        limit = ~((~b + np.uint64(1)) % b)
        flat_limit, flat_b = limit.reshape(-1), b.reshape(-1)
        out = self.uint64(flat_b.size)
        bad = np.flatnonzero(out > flat_limit)
        while bad.size:  # probability < b / 2^64 per draw: practically never taken
            out[bad] = self.uint64(bad.size)
            bad = bad[out[bad] > flat_limit[bad]]
        return (out % flat_b).reshape(b.shape)

    def permutation(self, n: int) -> np.ndarray:
        """A uniformly random permutation of ``range(n)`` (int64): Fisher-Yates with unbiased
        integers from :meth:`below`, so every one of the ``n!`` orders is equally likely (up to
        the keystream's indistinguishability from uniform)."""
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        perm = list(range(n))
        if n > 1:
            # Position i (from n-1 down to 1) swaps with j uniform in [0, i].
            js = self.below(np.arange(n, 1, -1, dtype=np.uint64)).tolist()
            for i, j in zip(range(n - 1, 0, -1), js, strict=True):
                perm[i], perm[j] = perm[j], perm[i]
        return np.asarray(perm, dtype=np.int64)


def as_secure_rng(rng: object, what: str = "batch sampling") -> SecureRandom:
    """``rng`` itself when it is a :class:`SecureRandom`, a fresh one (key from ``os.urandom``)
    when it is None; anything else, numpy generators in particular, raises ``TypeError``."""
    if rng is None:
        return SecureRandom()
    if isinstance(rng, SecureRandom):
        return rng
    if isinstance(rng, np.random.Generator | np.random.RandomState):
        raise TypeError(
            f"{what} needs a cryptographically secure generator, got numpy's "
            f"{type(rng).__name__}: its state (and so every selection) can be recovered from "
            "a few outputs, which voids the privacy amplification by subsampling. Pass "
            "spgc.common.csprng.SecureRandom() (or SecureRandom(seed=<32 bytes>) for a "
            "reproducible test), or None for a fresh one"
        )
    raise TypeError(
        f"{what} needs a spgc.common.csprng.SecureRandom or None, got {type(rng).__name__}"
    )

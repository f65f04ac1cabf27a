"""The canonical digests of the wire protocol (proto/spgc/v1): vectors, provider sets, seeds.

Both servers and the providers must compute these identically, so they are defined once here.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

import numpy as np

#: Scheme name carried in SeedCommitment.scheme for :func:`seed_commitment`.
SEED_COMMITMENT_SCHEME = "sha256-v1"

#: Shortest seed :func:`seed_commitment` accepts (the commitment hides the seed only because
#: the seed has this much entropy).
MIN_SEED_BYTES = 32

_SEED_DOMAIN = b"spgc.v1.seed-commitment\x00"

#: Scheme name carried in SeedCommitment.scheme for :func:`pool_seed_commitment`.
POOL_SEED_COMMITMENT_SCHEME = "sha256-pool-v1"

_POOL_SEED_DOMAIN = b"spgc.v1.pool-seed-commitment\x00"

#: Bytes of a noise-pool block's id (H1's random id, PoolBlock.block_id).
POOL_BLOCK_ID_BYTES = 16


def vector_sha256(vec: np.ndarray) -> bytes:
    """SHA-256 of a 1-D vector's little-endian bytes (ModelHeader.sha256, ShareHeader.sha256).

    ``vec`` must be uint64 (shares), uint8 (a packed share's bytes) or float64 (models); other
    dtypes raise ValueError so that a float32 model is never hashed in a form the other side
    does not use.
    """
    arr = np.asarray(vec)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D vector, got shape {arr.shape}")
    if arr.dtype != np.uint8 and (arr.dtype.kind not in "uf" or arr.dtype.itemsize != 8):
        raise ValueError(f"expected uint64, uint8 or float64 values, got {arr.dtype}")
    le = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
    return hashlib.sha256(np.ascontiguousarray(le).data).digest()


def canonical_provider_set(providers: Iterable[str]) -> list[str]:
    """Sorted (by UTF-8 bytes), duplicate-free list: the order ProviderSet.providers uses."""
    unique = set(providers)
    for name in unique:
        if not name or "\x00" in name:
            raise ValueError(f"invalid provider identity {name!r}")
    return sorted(unique, key=lambda s: s.encode("utf-8"))


def provider_set_digest(providers: Iterable[str]) -> bytes:
    """SHA-256 over each identity's UTF-8 bytes plus one 0x00, in canonical order.

    Order and duplicates of the input do not matter.
    """
    h = hashlib.sha256()
    for name in canonical_provider_set(providers):
        h.update(name.encode("utf-8") + b"\x00")
    return h.digest()


def seed_commitment_prefix(run_id: str, round_number: int, role: int) -> bytes:
    """The bytes a "sha256-v1" seed commitment hashes before the seed (:func:`seed_commitment`):
    "spgc.v1.seed-commitment" 0x00 || run_id 0x00 || round as 8 bytes big-endian || role."""
    if not 0 <= round_number < 1 << 64:
        raise ValueError(f"round {round_number} does not fit in 64 bits")
    if not 0 <= role < 256:
        raise ValueError(f"role {role} does not fit in one byte")
    if "\x00" in run_id:
        raise ValueError("run_id must not contain NUL")
    return _SEED_DOMAIN + run_id.encode("utf-8") + b"\x00" + struct.pack(">QB", round_number, role)


def pool_seed_commitment_prefix(
    run_id: str, block_index: int, block_id: bytes, role: int
) -> bytes:
    """The bytes a "sha256-pool-v1" commitment hashes before the seed of one production run of
    mode preprocessed's noise pool (:func:`pool_seed_commitment`): "spgc.v1.pool-seed-commitment"
    0x00 || run_id 0x00 || block index as 8 bytes big-endian || role || the block's 16-byte id.
    Its own domain: a pool seed's commitment never reads as a round's."""
    if len(block_id) != POOL_BLOCK_ID_BYTES:
        raise ValueError(f"a pool block's id has {POOL_BLOCK_ID_BYTES} bytes, got {len(block_id)}")
    tail = seed_commitment_prefix(run_id, block_index, role)[len(_SEED_DOMAIN) :]
    return _POOL_SEED_DOMAIN + tail + bytes(block_id)


def pool_seed_commitment(
    run_id: str, block_index: int, block_id: bytes, role: int, seed: bytes
) -> bytes:
    """The "sha256-pool-v1" commitment of a server's seed for one noise-pool block
    (NoiseBlock.seed): SHA-256 of :func:`pool_seed_commitment_prefix` || seed, the seed as
    :func:`seed_commitment` takes it."""
    if len(seed) < MIN_SEED_BYTES:
        raise ValueError(f"seed must be at least {MIN_SEED_BYTES} bytes, got {len(seed)}")
    prefix = pool_seed_commitment_prefix(run_id, block_index, block_id, role)
    return hashlib.sha256(prefix + bytes(seed)).digest()


def seed_commitment(run_id: str, round_number: int, role: int, seed: bytes) -> bytes:
    """The "sha256-v1" commitment of a server's round seed (SeedCommitment.commitment).

    SHA-256("spgc.v1.seed-commitment" 0x00 || run_id 0x00 || round as 8 bytes big-endian ||
    role as 1 byte || seed). ``role`` is a ServerRole value. The seed must be at least
    :data:`MIN_SEED_BYTES` bytes from a CSPRNG: the commitment is hiding only because of that
    entropy. Only the commitment goes to the other server; the seed never does (under
    ``security: malicious`` each server proves in zero knowledge that its noise inputs expand
    the seed it committed to: :mod:`spgc.privacy.seed_proof`).
    """
    if len(seed) < MIN_SEED_BYTES:
        raise ValueError(f"seed must be at least {MIN_SEED_BYTES} bytes, got {len(seed)}")
    return hashlib.sha256(seed_commitment_prefix(run_id, round_number, role) + bytes(seed)).digest()

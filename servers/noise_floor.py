"""Each server's own noise (``noise_floor: f``, issue 46 item 4; docs/PRIVACY.md, "The noise
floor").

With a noise floor, the noise the two servers make jointly (mode spgc: the round circuit's
sampler; mode preprocessed: the pool) has variance (1 - f) sigma^2, and each server adds its own
fresh discrete Gaussian of variance f sigma^2 per coordinate to what it puts into the opening,
before anything is opened: in spgc to its input share of the round circuit, in preprocessed to
the share it sends. The circuit reads smod(A1 - A2, 2^L) (or A + B mod p with verified inputs),
so H1 adds its noise and H2 subtracts its own in the ring, and both add in the field: the
release is S + J + N_1 + N_2 either way. A server's own noise is drawn per release from the OS
CSPRNG (:func:`spgc.privacy.noise.sample_discrete_gaussian`: two fresh 32-byte seeds, never
reused) and never leaves it except inside that share.

A garbler that deviates can garble any circuit on the two inputs, the joint noise left out,
but H2's input already carries N_2, which H1 does not know: what it learns is S + N_2 at best.
The circuit runs in one call after the own noise is in (:func:`spgc_release`'s ``circuit``, by
default :data:`joint_noise_circuit`), the point where the tests put such a cheating garbler
(tests/servers/test_noise_floor_release.py, tests/e2e/test_noise_floor_daemons.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from spgc.privacy.noise import sample_discrete_gaussian
from spgc.privacy.seed_proof import SeedBinding
from spgc.protocol.sharing import ring_mask
from spgc.servers.gc_party import run_aggregate
from spgc.wire import aggregation_pb2 as pb

__all__ = [
    "GC_ROLE",
    "draw_own_noise",
    "joint_noise_circuit",
    "spgc_release",
    "with_own_noise",
]

GC_ROLE = {pb.SERVER_ROLE_H1: "garbler", pb.SERVER_ROLE_H2: "evaluator"}

#: The call that runs mode spgc's round circuit (the joint noise and the reconstruction):
#: gc_party.run_aggregate. Named so that a test can stand a cheating garbler in its place.
joint_noise_circuit: Callable[..., tuple[np.ndarray, dict[str, Any]]] = run_aggregate


def draw_own_noise(n: int, floor_sigma_units: float) -> np.ndarray | None:
    """This server's own noise for one release: ``n`` fresh samples of N_Z(0, floor_sigma^2)
    (int64) from the OS CSPRNG; None without a noise floor."""
    if floor_sigma_units <= 0:
        return None
    return sample_discrete_gaussian(n, floor_sigma_units)


def with_own_noise(
    role: int,
    share: np.ndarray,
    noise: np.ndarray,
    ring_bits: int,
    field_modulus: int | None = None,
) -> np.ndarray:
    """This server's share with its own ``noise`` added, so that the two shares open to
    S + z1 + z2: in the ring H1's is A1 + z1 and H2's A2 - z2 (mod 2^L; A1 - A2 = S), in the
    field (verified inputs) each adds its own (mod p; A + B = S). uint64."""
    share = np.asarray(share, dtype=np.uint64)
    if field_modulus is not None:
        p = np.uint64(field_modulus)
        z = np.mod(np.asarray(noise, dtype=np.int64), np.int64(field_modulus)).astype(np.uint64)
        out = share + z  # both < p < 2^62
        return np.where(out >= p, out - p, out)
    z = np.asarray(noise, dtype=np.int64).view(np.uint64)
    out = share + z if role == pb.SERVER_ROLE_H1 else share - z
    return out & ring_mask(ring_bits)


def spgc_release(
    role: int,
    link: Any,
    total: np.ndarray,
    seed: bytes,
    own_noise: np.ndarray | None,
    *,
    joint_sigma_units: float,
    ring_bits: int,
    field_modulus: int | None = None,
    on_stage: Callable[[], None] | None = None,
    circuit: Callable[..., tuple[np.ndarray, dict[str, Any]]] | None = None,
    seed_binding: SeedBinding | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """This server's side of an spgc release: its own noise into its input share (when it has
    a noise floor), then the round circuit with the joint noise of std ``joint_sigma_units``
    (``circuit``, run_aggregate's signature; None: :data:`joint_noise_circuit`. The round loop
    passes its own name for it, servers.coordinator.run_aggregate, where tests tap every
    reveal). ``seed_binding``: both servers prove their round seeds (security: malicious).
    Returns (Y, counters)."""
    inputs = total
    if own_noise is not None:
        inputs = with_own_noise(role, total, own_noise, ring_bits, field_modulus)
    run = joint_noise_circuit if circuit is None else circuit
    return run(
        GC_ROLE[role],
        link,
        inputs,
        seed,
        joint_sigma_units,
        ring_bits,
        "spgc",
        on_stage=on_stage,
        field_modulus=field_modulus,
        seed_binding=seed_binding,
    )

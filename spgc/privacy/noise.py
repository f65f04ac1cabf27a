"""Discrete Gaussian noise in plaintext, from the same sampler circuit the servers garble.

The exact discrete Gaussian sampler (statistical distance <= 2^-64 per sample,
docs/NOISE_SAMPLER.md) is one circuit description, :mod:`garbled_core.discrete_gaussian`. The
servers garble it in spgc and preprocessed mode; here the same circuit and the same adaptive
rejection rounds run in plaintext, for the noise a party adds on its own (ldp providers, dng
servers) and for audits and tests.

Randomness: every random bit the sampler reads is r1 xor r2 (the circuit XORs a garbler port
with an evaluator port). Each server expands only its own 32-byte round seed, outside the
circuit, with ChaCha8 (RFC 8439's ChaCha with 8 rounds) keyed by the seed, addressed by where
the bits are used: trial t of coordinate c in stage (retry round) r reads, for its port p of P,
word (t * P + p) of the coordinate's stream: the little-endian 64-bit word (t * P + p) mod 8 of
the block with nonce "SPGc" || r || c mod 2^32 and counter (c >> 32) << 16 | (t * P + p) // 8
(32-bit words, little endian), masked to the port's width (:func:`expand_seed`,
:func:`stream_layout`). So a coordinate's noise depends only on the two seeds and its own index,
never on which other coordinates share its batch: a batch split into ranges (lanes, worker
pairs) releases exactly the same vector. Given both seeds the noise is reproducible
(:func:`sample_noise_plain`); given one, the other is ChaCha8's stream under an unknown key, so
the XOR is uniform to that party. ChaCha rather than AES because a server proves its expansion
in zero knowledge under ``security: malicious`` (:mod:`spgc.privacy.seed_proof`): ChaCha8's
32-bit additions cost about 9 AND gates a stream bit, against about 55 for AES-256.
:func:`sample_discrete_gaussian` draws both seeds from the OS CSPRNG.

Spare trials (``spares_every`` m > 0, the gmw backend's sampling, :data:`SPARES_EVERY`): in the
first stage every m-th coordinate (absolute index c with c mod m = 0) also runs one spare trial,
addressed as stage :data:`SPARE_STAGE`. A coordinate none of whose own trials is accepted takes
an accepted spare of its group (absolute indices c // :data:`SPARE_GROUP` alike, within the
batch): the failed coordinates in ascending order take the accepted spares in ascending order
of their owners. The assignment reads only the (public) accept bits, every accepted trial goes
to at most one coordinate, and trials are independent, so each coordinate still gets an
independent exact sample; the first stage almost always covers the batch, so a round costs one
trial circuit's AND layers instead of one per stage. Ranges split at multiples of SPARE_GROUP
(:func:`spgc.common.lanes.lane_ranges` with ``align``) release the same vector as one batch.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import garbled_core
from garbled_core.discrete_gaussian import (
    DEFAULT_DISTANCE_LOG2,
    DEFAULT_SCHEDULE,
    MAX_ROUNDS,
    SamplerParams,
    build_trial_circuit,
    derive_params,
    schedule_at,
)

__all__ = [
    "SEED_BYTES",
    "SPARES_EVERY",
    "SPARE_GROUP",
    "SPARE_STAGE",
    "STREAM_ROUNDS",
    "RoundResult",
    "SamplerStats",
    "StreamLayout",
    "TrialSegment",
    "check_seed",
    "expand_seed",
    "expand_segments",
    "noise_bound_units",
    "read_stream",
    "sample_discrete_gaussian",
    "sample_noise_plain",
    "sampling_rounds",
    "segment_instances",
    "segments_layout",
    "stream_layout",
]

SEED_BYTES = 32
_STREAM_TAG = int.from_bytes(b"SPGc", "little")  # the first nonce word of every stream block
_BLOCK_WORDS = 8  # 64-bit words in a ChaCha block
#: The seed stream is ChaCha8: the best published attacks on ChaCha reach 7 rounds (none on
#: 8), ChaCha8 is the generator of Go's runtime and math/rand/v2 and of rand_chacha's
#: ChaCha8Rng (Aumasson, "Too Much Crypto", 2019, argues 8 rounds suffice), and a proved round
#: costs about 500 AND gates (ChaCha20, as RFC 8439 has it, would cost 2.3x the proof).
STREAM_ROUNDS = 8
MAX_COORDINATE = 1 << 48  # coordinate indices fit the nonce's 32 bits and the counter's top 16
#: The stage field of spare trials' PRF addresses (real stages count from 0 up to MAX_ROUNDS).
SPARE_STAGE = (1 << 32) - 1
#: Coordinates whose failed first-stage trials share spares (absolute c // SPARE_GROUP).
SPARE_GROUP = 1024
#: Spare trials per backend: every m-th coordinate runs one (0: none). gmw pays a round trip
#: per AND layer, so a second stage would cost another trial circuit's 35 to 46 layers; with
#: acceptance 0.9 or more, one spare per 4 coordinates (25% more trials) covers a group's
#: failures (10% or fewer) except with a small probability, when the usual stages follow. gc
#: pays per AND gate and nothing per stage, so it runs no spares.
SPARES_EVERY: dict[str, int] = {"gc": 0, "gmw": 4}

#: One block of trials in a stage's run: (stage, coordinates (0-based in the batch), trials each).
TrialSegment = tuple[int, np.ndarray, int]


def check_seed(seed: bytes | bytearray | memoryview) -> bytes:
    if not isinstance(seed, (bytes, bytearray, memoryview)):
        raise TypeError(f"the round seed must be bytes, got {type(seed).__name__}")
    seed = bytes(seed)
    if len(seed) != SEED_BYTES:
        raise ValueError(f"the round seed must be {SEED_BYTES} bytes, got {len(seed)}")
    return seed


@dataclass(frozen=True)
class StreamLayout:
    """Where a run's random input ports read a party's seed stream (ChaCha8 under the seed):
    ``counters`` and ``nonces`` name the key-stream blocks it takes, and the 64-bit word of
    port ``k`` at instance ``i`` is word ``word[k][i]`` (0..7) of block ``block[k][i]``."""

    counters: np.ndarray  # (blocks,) uint64: ChaCha's 32-bit block counter
    nonces: np.ndarray  # (blocks, 3) uint64: its three 32-bit nonce words
    block: np.ndarray  # (ports, instances) int64
    word: np.ndarray  # (ports, instances) int64


def stream_layout(
    stage: int, ports: int, coords: int | np.ndarray, trials: int = 1
) -> StreamLayout:
    """The blocks and words ``ports`` random ports of ``trials`` trials of each coordinate in
    ``coords`` (an index array, or n for 0..n-1) read in one stage (the module docstring)."""
    if not 0 <= stage < 1 << 32:
        raise ValueError(f"stage {stage} is outside 0..2^32-1")
    idx = np.arange(coords, dtype=np.int64) if isinstance(coords, int) else np.asarray(coords)
    idx = idx.astype(np.int64, copy=False)
    if len(idx) and (idx.min() < 0 or idx.max() >= MAX_COORDINATE):
        raise ValueError("coordinate indices must be in 0..2^48-1")
    words = trials * ports
    blocks = -(-words // _BLOCK_WORDS)
    if blocks >= 1 << 16:
        raise ValueError(f"{trials} trials x {ports} ports exceed one coordinate's stream")
    n = len(idx)
    b = np.arange(blocks, dtype=np.int64)
    counters = ((idx[:, None] >> 32) << 16 | b[None, :]).reshape(-1).astype(np.uint64)
    nonces = np.empty((n * blocks, 3), dtype=np.uint64)
    nonces[:, 0] = _STREAM_TAG
    nonces[:, 1] = stage
    nonces[:, 2] = np.repeat(idx & 0xFFFFFFFF, blocks).astype(np.uint64)
    # word t * ports + k of coordinate row r (instance r * trials + t): block r * blocks +
    # that // 8, word that % 8. Port by port: (ports, instances) without temporaries of that size.
    first_block = np.repeat(np.arange(n, dtype=np.int64) * blocks, trials)
    position = np.tile(np.arange(trials, dtype=np.int64) * ports, n)  # t * ports per instance
    block = np.empty((ports, n * trials), dtype=np.int64)
    word = np.empty((ports, n * trials), dtype=np.int64)
    for k in range(ports):
        if trials == 1:  # one word a port: constants
            block[k] = first_block + k // _BLOCK_WORDS
            word[k] = k % _BLOCK_WORDS
        else:
            np.add(first_block, (position + k) // _BLOCK_WORDS, out=block[k])
            np.remainder(position + k, _BLOCK_WORDS, out=word[k])
    return StreamLayout(counters, nonces, block, word)


def segments_layout(
    segments: Sequence[TrialSegment], ports: int, first_coordinate: int = 0
) -> StreamLayout:
    """:func:`stream_layout` of a run of several :data:`TrialSegment` blocks, one after the
    other (instances and blocks in segment order); coordinates are 0-based in a batch that
    starts at ``first_coordinate``."""
    parts = [
        stream_layout(stage, ports, np.asarray(coords) + first_coordinate, k)
        for stage, coords, k in segments
    ]
    offsets = np.cumsum([0] + [len(p.counters) for p in parts[:-1]])
    return StreamLayout(
        np.concatenate([p.counters for p in parts]),
        np.concatenate([p.nonces for p in parts]),
        np.concatenate([p.block + o for p, o in zip(parts, offsets, strict=True)], axis=1),
        np.concatenate([p.word for p in parts], axis=1),
    )


def read_stream(
    seed: bytes, layout: StreamLayout, widths: Sequence[int], prefix: str
) -> dict[str, np.ndarray]:
    """This party's random input ports ``{prefix}k`` (uint64 arrays, masked to ``widths``)
    from its seed's stream at ``layout``."""
    seed = check_seed(seed)
    if len(widths) != layout.block.shape[0]:
        raise ValueError(f"{len(widths)} port widths for a layout of {layout.block.shape[0]} ports")
    stream = garbled_core.chacha_blocks(
        seed, layout.counters, layout.nonces, STREAM_ROUNDS
    ).view("<u8")
    out = {}
    for k, w in enumerate(widths):
        col = stream[layout.block[k], layout.word[k]].astype(np.uint64)
        out[f"{prefix}{k}"] = col if w >= 64 else col & np.uint64((1 << w) - 1)
    return out


def expand_seed(
    seed: bytes,
    stage: int,
    widths: Sequence[int],
    coords: int | np.ndarray,
    prefix: str,
    trials: int = 1,
) -> dict[str, np.ndarray]:
    """This party's random input ports for ``trials`` trials of each coordinate in ``coords``
    (an index array, or n for coordinates 0..n-1) in one stage: ``{prefix}k`` -> uint64 array,
    instance ``row * trials + t`` for coordinate ``coords[row]``'s trial t (the module
    docstring has the layout)."""
    return read_stream(seed, stream_layout(stage, len(widths), coords, trials), widths, prefix)


# ------------------------------------------------------------------------------ rounds


@dataclass
class RoundResult:
    """One rejection round's accepted coordinates, their trial indices and kept noise."""

    coords: np.ndarray  # coordinates whose first accepted trial is in this round
    instances: np.ndarray  # uint64: that trial's instance index in the round's run
    noise: Any  # Kept labels (garbled) or the plaintext noise values


@dataclass
class SamplerStats:
    """Rounds and trials one sampling run took."""

    rounds: int = 0
    trials: int = 0
    per_round: list[int] = field(default_factory=list)


def expand_segments(
    seed: bytes,
    segments: Sequence[TrialSegment],
    widths: Sequence[int],
    prefix: str,
    first_coordinate: int = 0,
) -> dict[str, np.ndarray]:
    """This party's random input ports for a run of several :data:`TrialSegment` blocks, one
    after the other (instances in segment order, each as in :func:`expand_seed`); coordinates
    are 0-based in a batch that starts at ``first_coordinate``."""
    layout = segments_layout(segments, len(widths), first_coordinate)
    return read_stream(seed, layout, widths, prefix)


def segment_instances(segments: Sequence[TrialSegment]) -> int:
    """Trial-circuit instances of a run of these segments (each coordinate runs k trials)."""
    return sum(len(coords) * k for _, coords, k in segments)


def _spare_owners(n: int, first_coordinate: int, spares_every: int) -> np.ndarray:
    """Coordinates of the batch (0-based) that run a spare trial: absolute index mod m = 0."""
    if spares_every <= 0:
        return np.zeros(0, dtype=np.int64)
    start = (-first_coordinate) % spares_every
    return np.arange(start, n, spares_every, dtype=np.int64)


def _assign_spares(
    failed: np.ndarray, owners: np.ndarray, accepted: np.ndarray, first_coordinate: int
) -> tuple[np.ndarray, np.ndarray]:
    """Failed coordinates (ascending) matched to accepted spares (``accepted``: per owner) of
    their SPARE_GROUP, in order. Returns (coordinates, index into ``owners``) of the matches."""
    spares = np.flatnonzero(accepted)
    if len(failed) == 0 or len(spares) == 0:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    failed_group = (failed + first_coordinate) // SPARE_GROUP
    spare_group = (owners[spares] + first_coordinate) // SPARE_GROUP
    coords, picks = [], []
    for g in np.unique(failed_group):
        mine = failed[failed_group == g]
        theirs = spares[spare_group == g]
        m = min(len(mine), len(theirs))
        coords.append(mine[:m])
        picks.append(theirs[:m])
    return np.concatenate(coords), np.concatenate(picks)


def sampling_rounds(
    n: int,
    schedule: Sequence[int],
    run_stage: Callable[[list[TrialSegment]], tuple[np.ndarray, Any]],
    stats: SamplerStats,
    *,
    spares_every: int = 0,
    first_coordinate: int = 0,
) -> Iterator[RoundResult]:
    """Drive the adaptive rejection rounds. ``run_stage(segments)`` runs the trials of the
    :data:`TrialSegment` blocks in one run and returns (accept, noise) per instance, in segment
    order: in stage r, ``schedule_at(schedule, r)`` trials of each still-unsampled coordinate,
    coordinate-major, and in stage 0 with ``spares_every`` > 0 one spare trial of each owner
    (module docstring). A coordinate takes its first accepted own trial, else a spare."""
    if spares_every < 0:
        raise ValueError(f"spares_every must be >= 0, got {spares_every}")
    pending = np.arange(n, dtype=np.int64)
    for r in range(MAX_ROUNDS):
        if len(pending) == 0:
            return
        k = schedule_at(schedule, r)
        segments: list[TrialSegment] = [(r, pending, k)]
        owners = _spare_owners(n, first_coordinate, spares_every) if r == 0 else pending[:0]
        if len(owners):
            segments.append((SPARE_STAGE, owners, 1))
        n_inst = len(pending) * k + len(owners)
        accept, noise = run_stage(segments)
        stats.rounds += 1
        stats.trials += n_inst
        stats.per_round.append(n_inst)
        flags = np.asarray(accept).reshape(n_inst) != 0
        acc = flags[: len(pending) * k].reshape(len(pending), k)
        has = acc.any(axis=1)
        rows = np.flatnonzero(has)
        coords = pending[rows]
        inst = rows * k + acc.argmax(axis=1)[rows]
        if len(owners):
            failed = pending[~has]
            taken, picks = _assign_spares(
                failed, owners, flags[len(pending) * k :], first_coordinate
            )
            coords = np.concatenate([coords, taken])
            inst = np.concatenate([inst, len(pending) * k + picks])
            order = np.argsort(coords, kind="stable")
            coords, inst = coords[order], inst[order]
        yield RoundResult(coords, inst.astype(np.uint64), noise)
        pending = np.setdiff1d(pending, coords, assume_unique=True)
    raise RuntimeError(  # probability below 2^-1000: a bug or a broken peer
        f"{len(pending)} coordinates without an accepted trial after {MAX_ROUNDS} rounds"
    )


# ------------------------------------------------------------------------------ plaintext


def sample_noise_plain(
    seed1: bytes,
    seed2: bytes,
    n: int,
    sigma_units: float,
    *,
    distance_log2: float = DEFAULT_DISTANCE_LOG2,
    schedule: Sequence[int] = DEFAULT_SCHEDULE,
    params: SamplerParams | None = None,
    first_coordinate: int = 0,
    spares_every: int = 0,
) -> np.ndarray:
    """The noise coordinates ``first_coordinate`` .. ``first_coordinate + n - 1`` get from
    round seeds s1 (H1) and s2 (H2): the same circuits and rounds, evaluated in plaintext (for
    audits and tests); ``spares_every`` as the backend ran it (:data:`SPARES_EVERY`). int64."""
    if params is None:
        params = derive_params(sigma_units, distance_log2)
    circuit = build_trial_circuit(params)
    seed1, seed2 = check_seed(seed1), check_seed(seed2)

    def run_stage(segments: list[TrialSegment]) -> tuple[np.ndarray, Any]:
        widths = params.port_widths
        inputs = expand_segments(seed1, segments, widths, "g", first_coordinate)
        inputs.update(expand_segments(seed2, segments, widths, "e", first_coordinate))
        out = circuit.evaluate(inputs, segment_instances(segments))
        return out["accept"], out["z"]

    z = np.zeros(n, dtype=np.int64)
    w = params.noise_bits
    rounds = sampling_rounds(
        n, schedule, run_stage, SamplerStats(), spares_every=spares_every,
        first_coordinate=first_coordinate,
    )  # fmt: skip
    for result in rounds:
        raw = result.noise[result.instances.astype(np.int64)].astype(np.int64)
        z[result.coords] = np.where(raw >= 1 << (w - 1), raw - (1 << w), raw)
    return z


def sample_discrete_gaussian(n: int, sigma_units: float) -> np.ndarray:
    """``n`` samples of N_Z(0, sigma_units^2) (int64) drawn by one party alone (a dng server,
    an ldp provider): :func:`sample_noise_plain` on two fresh 32-byte seeds from the OS CSPRNG,
    the same exact discrete Gaussian (up to the sampler's 2^-64 statistical distance) the
    circuit adds in spgc mode."""
    return sample_noise_plain(os.urandom(SEED_BYTES), os.urandom(SEED_BYTES), n, sigma_units)


def noise_bound_units(sigma_units: float, distance_log2: float = DEFAULT_DISTANCE_LOG2) -> int:
    """A hard bound on |z| for the sampler at ``sigma_units``: its noise is a two's-complement
    value of ``noise_bits`` bits. The ring of a preprocessed run must hold |S| plus this (no
    probabilistic tail: S + z never wraps)."""
    return 1 << (derive_params(sigma_units, distance_log2).noise_bits - 1)

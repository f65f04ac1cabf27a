"""A server's round seed, proved in zero knowledge (``security: malicious``, issue 46).

Before a round's circuit each server commits to its fresh 32-byte seed (``SeedCommitment``,
:func:`spgc.wire.seed_commitment`), and its noise inputs are its seed's ChaCha8 stream
(:func:`spgc.privacy.noise.read_stream`). Under ``security: malicious`` both servers prove, on
the authenticated session of the round (``AuthSession.prove``, ``zk_proof.h``), before any
input enters the round's run:

1. the commitment: SHA-256(prefix || seed) is the commitment it sent, the seed a private input
   of the proof, the prefix (run, round, role) public; the seed stays authenticated (kept);
2. the expansion: for every ChaCha8 block the run's inputs read (counter and nonce public),
   the block under the kept seed; its 64-bit words stay authenticated.

The run's random ports are then those authenticated words themselves
(``AuthSession.bind_proved``, carried inputs of the trial circuit): a server cannot enter other
bits than its committed seed's, and one whose proof fails, or whose opened digest is not the
commitment it sent, is caught (:class:`SeedProofError`) before its inputs reach the run.

Cost: about 4,500 AND gates a ChaCha8 block (64 bytes of stream) and 1 to 3 SHA-256
compressions (about 22,500 AND gates each) a round, each proved AND gate one COT and one bit
(docs/MALICIOUS.md, "Inputs bound to commitments").
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

import garbled_core
from garbled_core import Circuit, CircuitBuilder, ProofResult
from garbled_core.crypto_circuits import chacha_block, sha256_midstate, sha256_words
from spgc.privacy.noise import SEED_BYTES, STREAM_ROUNDS, StreamLayout
from spgc.wire.digests import pool_seed_commitment_prefix, seed_commitment_prefix

__all__ = [
    "STREAM_PORTS",
    "SeedBinding",
    "SeedProofError",
    "commitment_circuit",
    "commitment_digest",
    "commitment_statement",
    "expansion_circuit",
    "expansion_statement",
]

SEED_PORTS = SEED_BYTES // 8  # the seed as 64-bit words, little endian
STREAM_PORTS = 8  # a ChaCha block as 64-bit words


class SeedProofError(garbled_core.PeerDeviated):
    """The peer's seed proof opened another commitment than the one it sent: a deviation
    (servers.deviation aborts the run on it as on any the engine catches)."""


@dataclass(frozen=True)
class SeedBinding:
    """What a server needs to prove its seed and check the peer's: the run, the round, both
    ServerRole values and the commitment the peer sent (with the release statement). With
    ``block_id``, the seed of one production run of mode preprocessed's pool instead: ``round``
    is then the block's index, and the commitments are "sha256-pool-v1"
    (:func:`spgc.wire.pool_seed_commitment`, sent in NoiseBlock.seed)."""

    run_id: str
    round: int
    role: int
    peer_role: int
    peer_commitment: bytes
    block_id: bytes | None = None

    def prefix(self, role: int) -> bytes:
        """The public bytes ``role``'s commitment hashes before its seed."""
        if self.block_id is None:
            return seed_commitment_prefix(self.run_id, self.round, role)
        return pool_seed_commitment_prefix(self.run_id, self.round, self.block_id, role)


def _le_bytes(word: Any) -> Any:
    """A big-endian SHA-256 word's bytes in little-endian order."""
    return word[24:32].concat(word[16:24], word[8:16], word[0:8])


def _split_prefix(prefix_bytes: int) -> tuple[int, int]:
    """(bytes of the prefix's whole 64-byte blocks, hashed in the clear into a public midstate;
    the bytes left, public inputs of the circuit)."""
    hashed = prefix_bytes // 64 * 64
    return hashed, prefix_bytes - hashed


@functools.lru_cache(maxsize=8)
def commitment_circuit(prefix_bytes: int) -> Circuit:
    """SHA-256(prefix || seed) for a public prefix of ``prefix_bytes`` bytes and the private seed
    (``seed0``..``seed3``). The prefix's whole 64-byte blocks come as SHA-256's public midstate
    (``h0``..``h3``, two words each, the first in the low half), the rest as ports ``m0``..
    (64-bit little-endian words, the last one shorter): a public block costs no proved gate.
    Outputs ``d0``..``d3`` (the digest's bytes as little-endian words, opened) and ``k0``..``k3``
    (the seed, kept)."""
    hashed, rest = _split_prefix(prefix_bytes)
    b = CircuitBuilder(f"seed-commitment-p{prefix_bytes}")
    seed = [b.input(f"seed{k}", "garbler", 64) for k in range(SEED_PORTS)]
    state = [b.input(f"h{k}", "evaluator", 64) for k in range(4)]
    prefix = [b.input(f"m{k}", "evaluator", 8 * min(8, rest - 8 * k)) for k in range(-(-rest // 8))]
    message = [p[8 * j : 8 * j + 8] for p in prefix for j in range(len(p) // 8)]
    message += [p[8 * j : 8 * j + 8] for p in seed for j in range(8)]
    words = [p[32 * i : 32 * i + 32] for p in state for i in range(2)]
    digest = sha256_words(b, message, words, hashed)
    for k in range(4):
        b.output(f"d{k}", _le_bytes(digest[2 * k]).concat(_le_bytes(digest[2 * k + 1])), "both")
    for k in range(SEED_PORTS):
        b.output(f"k{k}", seed[k], "keep")
    return b.description().build()


@functools.lru_cache(maxsize=1)
def expansion_circuit() -> Circuit:
    """ChaCha8's block (:data:`~spgc.privacy.noise.STREAM_ROUNDS` rounds) under the seed
    (carried ``seed0``..``seed3``, one value for every instance) at a public ``counter`` and
    ``nonce0``..``nonce2``: outputs ``s0``..``s7``, the block's 64-bit words, kept."""
    b = CircuitBuilder(f"seed-expansion-chacha{STREAM_ROUNDS}")
    seed = [b.input(f"seed{k}", "carried", 64) for k in range(SEED_PORTS)]
    counter = b.input("counter", "evaluator", 32)
    nonce = [b.input(f"nonce{k}", "evaluator", 32) for k in range(3)]
    key = [p[32 * i : 32 * i + 32] for p in seed for i in range(2)]
    words = chacha_block(b, key, counter, nonce, STREAM_ROUNDS)
    for k in range(STREAM_PORTS):
        b.output(f"s{k}", words[2 * k].concat(words[2 * k + 1]), "keep")
    return b.description().build()


def commitment_statement(prefix: bytes, seed: bytes | None) -> dict[str, Any]:
    """Step 1 of a server's seed proof, for the commitment's public ``prefix``
    (:meth:`SeedBinding.prefix`): the prover's statement with its ``seed``, or the verifier's
    copy (``seed`` None)."""
    hashed, rest = _split_prefix(len(prefix))
    state = sha256_midstate(prefix[:hashed])
    tail = prefix[hashed:]
    public = [state[2 * k] | state[2 * k + 1] << 32 for k in range(4)]
    public += [int.from_bytes(tail[8 * k : 8 * k + 8], "little") for k in range(-(-rest // 8))]
    if seed is not None and len(seed) != SEED_BYTES:
        raise ValueError(f"a noise seed has {SEED_BYTES} bytes")
    private = (
        [[int.from_bytes(seed[8 * k : 8 * k + 8], "little")] for k in range(SEED_PORTS)]
        if seed is not None
        else [[] for _ in range(SEED_PORTS)]
    )
    return {
        "circuit": commitment_circuit(len(prefix)),
        "n": 1,
        "values": private + [[v] for v in public],
        "broadcast": [False] * (SEED_PORTS + len(public)),
    }


def expansion_statement(commitment: ProofResult, layout: StreamLayout) -> dict[str, Any]:
    """Step 2: the blocks of ``layout`` under the seed that step 1 (``commitment``, this side's
    result of it) kept; the same statement for the prover and the verifier."""
    return {
        "circuit": expansion_circuit(),
        "n": len(layout.counters),
        "values": [[]] * SEED_PORTS + [layout.counters] + [layout.nonces[:, k] for k in range(3)],
        "broadcast": [True] * SEED_PORTS + [False] * 4,
        "carried": [(commitment, 4 + k) for k in range(SEED_PORTS)] + [None] * 4,
    }


def commitment_digest(result: ProofResult) -> bytes:
    """The SHA-256 digest step 1 opened (``result``: either side's)."""
    opened = result.opened
    return b"".join(int(np.asarray(opened[k])[0]).to_bytes(8, "little") for k in range(4))

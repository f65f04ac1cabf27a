"""A server's side of the seed proofs (security: malicious, spgc.privacy.seed_proof), for a
round of mode spgc or a production run of mode preprocessed's pool: the commitment once a
batch, then, for every run of the trial circuit, the blocks its random ports read, whose proved
words become those ports (carried inputs)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from garbled_core import ProofResult
from spgc.privacy.noise import StreamLayout
from spgc.privacy.seed_proof import (
    STREAM_PORTS,
    SeedBinding,
    SeedProofError,
    commitment_digest,
    commitment_statement,
    expansion_statement,
)
from spgc.servers.errors import PeerMismatchError

__all__ = ["bound_random_ports", "checked_peer_commitment", "prove_committed_seed"]

_PREFIX = {"garbler": "g", "evaluator": "e"}  # the trial circuit's random ports of each server


def checked_peer_commitment(
    holder: Any, number: int, scheme: str, where: str, role: int | None = None
) -> bytes:
    """The other server's 32-byte seed commitment in ``holder.seed`` (a ReleaseStatement, or a
    NoiseBlock with ``number`` its block's index), refused with PeerMismatchError when it is
    missing, of another round (block), ``scheme`` or ``role``, or not 32 bytes; ``where`` ends
    the refusal ("for this round with the release statement")."""
    seed = holder.seed
    if (
        not holder.HasField("seed")
        or seed.round != number
        or seed.scheme != scheme
        or (role is not None and seed.role != role)
        or len(seed.commitment) != 32
    ):
        what = "noise block" if role is not None else "round"
        raise PeerMismatchError(
            f"{what} {number}: no {scheme} seed commitment of 32 bytes {where}"
        )
    return bytes(seed.commitment)


def prove_committed_seed(
    session: Any, binding: SeedBinding, seed: bytes
) -> tuple[ProofResult, ProofResult]:
    """Both servers at once: this one proves that SHA-256 of the commitment's prefix and ``seed``
    is the commitment it sent, and checks the peer's proof against the commitment the peer sent
    (:class:`SeedProofError` when it opens another). Returns (own, checked) results, whose kept
    seed the expansions read."""
    mine = commitment_statement(binding.prefix(binding.role), seed)
    theirs = commitment_statement(binding.prefix(binding.peer_role), None)
    own, checked = session.prove(mine, theirs)
    opened = commitment_digest(checked)
    if opened != binding.peer_commitment:
        what = "round" if binding.block_id is None else "noise block"
        raise SeedProofError(
            f"{what} {binding.round}: the peer's seed proof opens commitment {opened.hex()[:16]}..."
            f", not the {binding.peer_commitment.hex()[:16]}... it sent: its noise inputs are not "
            "its committed seed's"
        )
    return own, checked


def bound_random_ports(
    session: Any,
    role: str,
    commitments: tuple[ProofResult, ProofResult],
    layout: StreamLayout,
    widths: Sequence[int],
) -> dict[str, Any]:
    """Both servers at once: each proves the ChaCha8 blocks of ``layout`` under its committed
    seed; returns the trial circuit's random ports of both servers (``g*`` and ``e*``) as
    carried inputs bound to those proved words."""
    own_c, their_c = commitments
    own, theirs = session.prove(
        expansion_statement(own_c, layout), expansion_statement(their_c, layout)
    )
    peer = "evaluator" if role == "garbler" else "garbler"
    carried = {}
    for result, who in ((own, role), (theirs, peer)):
        sources = [(result, s) for s in range(STREAM_PORTS)]
        for k, w in enumerate(widths):
            name = f"{_PREFIX[who]}{k}"
            carried[name] = session.bind_proved(sources, layout.word[k], layout.block[k], w, name)
    return carried

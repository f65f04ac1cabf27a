"""The servers' check of the providers' norm proofs in a round (verified inputs, issue 35;
spgc.protocol.norm_proof, docs/PRIVACY.md "Norm proofs").

Per round, the query coin is drawn after every value it constrains: once its intake is
closed, H1 draws its 32-byte part and sends its commitment (:func:`coin_commitment`) in its
BARRIER_INTAKE_CLOSED request; H2, its own intake closed, answers with its fresh part; H1 opens
its part in its provider set (ProviderSet.verify_coin), which H2 checks against the commitment.
Both query every proof of the round with the SHA-256 of the two parts (:func:`round_coin`):
uniform if either server is honest (H1 committed before it saw H2's part, H2 chose its part
without seeing H1's), and sent to no provider. Each server then computes its verifier message
for every share it holds, for the proof's context (run, round, provider:
spgc.protocol.norm_proof.proof_context), the two exchange them with their provider sets
(ProviderSet.norm_verifiers), and both decide the same refusals from the same two lists
(:func:`norm_refusals`): a provider whose proof the two messages do not accept is left out of
the round like one whose share reached one server only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from spgc.protocol.norm_proof import (
    PART_BYTES,
    HelperShare,
    NormProofParams,
    VerifierMessage,
    decide,
    helper_query,
    leader_query,
    proof_context,
)
from spgc.servers.errors import PeerMismatchError
from spgc.servers.intake import ShareIntake

__all__ = [
    "COIN_BYTES",
    "check_coin_opening",
    "coin_commitment",
    "norm_refusals",
    "round_coin",
    "verifier_messages",
]

COIN_BYTES = 32
_JOINT_BYTES = 32
_PARTS_BYTES = 3 * PART_BYTES


def coin_commitment(run_id: str, round_number: int, part: bytes) -> bytes:
    """H1's commitment to its part of round t's coin (BarrierState.verify_coin)."""
    return hashlib.sha256(
        b"spgc-norm-proof/v2/coin-commitment"
        + hashlib.sha256(run_id.encode()).digest()
        + round_number.to_bytes(8, "little")
        + part
    ).digest()


def check_coin_opening(run_id: str, round_number: int, commitment: bytes, part: bytes) -> None:
    """PeerMismatchError unless ``part`` opens H1's ``commitment`` for this round."""
    if len(part) != COIN_BYTES or coin_commitment(run_id, round_number, part) != commitment:
        raise PeerMismatchError(
            f"round {round_number}: H1's norm-proof coin part does not open its commitment"
        )


def round_coin(h1_part: bytes, h2_part: bytes) -> bytes:
    """The round's query coin from both servers' contributions (PeerMismatchError if either
    is not 32 bytes)."""
    if len(h1_part) != COIN_BYTES or len(h2_part) != COIN_BYTES:
        raise PeerMismatchError("a norm-proof coin part is not 32 bytes")
    return hashlib.sha256(b"spgc-norm-proof/v2/coin" + h1_part + h2_part).digest()


def _to_bytes(message: VerifierMessage) -> bytes:
    return message.values.astype("<u8").tobytes() + message.joint_seed + message.parts


def _from_bytes(params: NormProofParams, data: bytes, leader: bool) -> VerifierMessage:
    size = 8 * params.verifier_len
    if len(data) != size + _JOINT_BYTES + _PARTS_BYTES:
        raise PeerMismatchError(
            f"a norm-proof verifier message of {len(data)} bytes; expected "
            f"{size + _JOINT_BYTES + _PARTS_BYTES}"
        )
    values = np.frombuffer(data[:size], dtype="<u8").astype(np.uint64)
    if values.size and int(values.max()) >= params.p:
        raise PeerMismatchError("a norm-proof verifier message holds a value outside the field")
    joint = data[size : size + _JOINT_BYTES]
    return VerifierMessage(values, joint, leader, data[size + _JOINT_BYTES :])


def verifier_messages(
    intake: ShareIntake,
    params: NormProofParams,
    coin: bytes,
    run_id: str,
    round_number: int,
    providers: Sequence[str],
) -> list[bytes]:
    """This server's verifier message for the held share of each of ``providers`` (round
    ``round_number`` of run ``run_id``, its intake closed), in their order."""
    out = []
    for name in providers:
        share = intake.proof_share(name)
        context = proof_context(run_id, round_number, name)
        if isinstance(share, HelperShare):
            message = helper_query(params, share, context, coin)
        else:
            message = leader_query(params, share, context, coin)
        out.append(_to_bytes(message))
    return out


def norm_refusals(
    params: NormProofParams,
    own: Sequence[str],
    own_messages: Sequence[bytes],
    other: Sequence[str],
    other_messages: Sequence[bytes],
    own_leader: bool,
) -> dict[str, str]:
    """Provider -> why its proof is refused, for the providers in both sets (the same on both
    servers: decide is symmetric in its two messages; ``own_leader``: this server is H1).
    PeerMismatchError for malformed lists."""
    if len(own_messages) != len(own) or len(other_messages) != len(other):
        raise PeerMismatchError(
            f"{len(other_messages)} norm-proof messages for {len(other)} providers"
        )
    theirs = dict(zip(other, other_messages, strict=True))
    refused = {}
    for name, mine in zip(own, own_messages, strict=True):
        if name not in theirs:
            continue
        why = decide(
            params,
            _from_bytes(params, mine, own_leader),
            _from_bytes(params, theirs[name], not own_leader),
        )
        if why is not None:
            refused[name] = why
    return refused

"""The servers' check of the providers' norm proofs in a round (verified inputs, issue 35;
spgc.norm_proof, docs/PRIVACY.md "Norm proofs").

Per round: at BARRIER_ROUND_OPEN each server contributes 32 fresh random bytes
(BarrierState.verify_coin) and both query every proof of the round with the SHA-256 of the two
(:func:`round_coin`): no provider knows it when it shares. Once the intake is closed each server
computes its verifier message for every share it holds (:func:`verifier_messages`), the two
exchange them with their provider sets (ProviderSet.norm_verifiers), and both decide the same
refusals from the same two lists (:func:`norm_refusals`): a provider whose proof the two
messages do not accept is left out of the round like one whose share reached one server only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

from spgc.norm_proof import (
    HelperShare,
    NormProofParams,
    VerifierMessage,
    decide,
    helper_query,
    leader_query,
)
from spgc.servers.errors import PeerMismatchError
from spgc.servers.intake import ShareIntake

__all__ = ["COIN_BYTES", "norm_refusals", "round_coin", "verifier_messages"]

COIN_BYTES = 32
_JOINT_BYTES = 32


def round_coin(h1_part: bytes, h2_part: bytes) -> bytes:
    """The round's query coin from both servers' contributions (PeerMismatchError if either
    is not 32 bytes)."""
    if len(h1_part) != COIN_BYTES or len(h2_part) != COIN_BYTES:
        raise PeerMismatchError("a norm-proof coin part is not 32 bytes")
    return hashlib.sha256(b"spgc-norm-proof/v1/coin" + h1_part + h2_part).digest()


def _to_bytes(message: VerifierMessage) -> bytes:
    return message.values.astype("<u8").tobytes() + message.joint_seed


def _from_bytes(params: NormProofParams, data: bytes) -> VerifierMessage:
    if len(data) != 8 * params.verifier_len + _JOINT_BYTES:
        raise PeerMismatchError(
            f"a norm-proof verifier message of {len(data)} bytes; expected "
            f"{8 * params.verifier_len + _JOINT_BYTES}"
        )
    values = np.frombuffer(data[: 8 * params.verifier_len], dtype="<u8").astype(np.uint64)
    if values.size and int(values.max()) >= params.p:
        raise PeerMismatchError("a norm-proof verifier message holds a value outside the field")
    return VerifierMessage(values, data[8 * params.verifier_len :])


def verifier_messages(
    intake: ShareIntake, params: NormProofParams, coin: bytes, providers: Sequence[str]
) -> list[bytes]:
    """This server's verifier message for the held share of each of ``providers`` (the
    round's intake closed), in their order."""
    out = []
    for name in providers:
        share = intake.proof_share(name)
        if isinstance(share, HelperShare):
            message = helper_query(params, share, coin)
        else:
            message = leader_query(params, share, coin)
        out.append(_to_bytes(message))
    return out


def norm_refusals(
    params: NormProofParams,
    own: Sequence[str],
    own_messages: Sequence[bytes],
    other: Sequence[str],
    other_messages: Sequence[bytes],
) -> dict[str, str]:
    """Provider -> why its proof is refused, for the providers in both sets (the same on both
    servers: decide is symmetric in its two messages). PeerMismatchError for malformed lists."""
    if len(own_messages) != len(own) or len(other_messages) != len(other):
        raise PeerMismatchError(
            f"{len(other_messages)} norm-proof messages for {len(other)} providers"
        )
    theirs = dict(zip(other, other_messages, strict=True))
    refused = {}
    for name, mine in zip(own, own_messages, strict=True):
        if name not in theirs:
            continue
        why = decide(params, _from_bytes(params, mine), _from_bytes(params, theirs[name]))
        if why is not None:
            refused[name] = why
    return refused

"""The servers' check of the providers' norm proofs in a round (verified inputs, issue 35;
spgc.protocol.norm_proof, docs/PRIVACY.md "Norm proofs").

Per round, the query coin is drawn after every value it constrains, in the round's one
AgreeProviders call: once its intake is closed, H1 draws 32 fresh bytes from its CSPRNG and
sends them with its provider set (ProviderSet.verify_coin); H2 closes its own intake before it
reads them. Every prover value the coin constrains is fixed at H1 by then: H1's own share, and
H2's share through the hash of its seed (the helper part) that the provider sent H1 with its
share; a provider that gives H2 another seed after the coin is drawn is refused (its joint
randomness parts differ at the two servers). Both query every proof of the round with
:func:`round_coin`, which no provider ever receives. The coin is H1's alone (issue 47 took out
the round trip in which H2 added a part to H1's committed one): against providers it is as good
as a joint coin, and a server that deviates gains nothing from choosing it, as its own verifier
message already lets it refuse any proof, and accept one whose provider tells it both shares
(H2, answering second, any proof). Each server then computes its verifier
message for every share it holds, for the proof's context (run, round, provider:
spgc.protocol.norm_proof.proof_context), the two exchange them with their provider sets
(ProviderSet.norm_verifiers), and both decide the same refusals from the same two lists
(:func:`norm_refusals`): a provider whose proof the two messages do not accept is left out of
the round like one whose share reached one server only.
"""

from __future__ import annotations

import hashlib
import threading
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
    share_dots,
)
from spgc.servers.errors import PeerMismatchError
from spgc.servers.intake import ShareIntake

__all__ = [
    "COIN_BYTES",
    "PreparedDots",
    "norm_refusals",
    "round_coin",
    "verifier_message_bytes",
    "verifier_messages",
]

COIN_BYTES = 32
_JOINT_BYTES = 32
_PARTS_BYTES = 3 * PART_BYTES


def round_coin(run_id: str, round_number: int, h1_part: bytes) -> bytes:
    """Round t's query coin from the 32 bytes H1 drew once its intake closed (PeerMismatchError
    unless 32 bytes), bound to the run and the round."""
    if len(h1_part) != COIN_BYTES:
        raise PeerMismatchError(
            f"round {round_number}: H1's norm-proof coin is {len(h1_part)} bytes, not {COIN_BYTES}"
        )
    return hashlib.sha256(
        b"spgc-norm-proof/v3/coin"
        + hashlib.sha256(run_id.encode()).digest()
        + round_number.to_bytes(8, "little")
        + h1_part
    ).digest()


def verifier_message_bytes(params: NormProofParams) -> int:
    """The size of one verifier message on the wire (ProviderSet.norm_verifiers)."""
    return 8 * params.verifier_len + _JOINT_BYTES + _PARTS_BYTES


def _to_bytes(message: VerifierMessage) -> bytes:
    return message.values.astype("<u8").tobytes() + message.joint_seed + message.parts


def _from_bytes(params: NormProofParams, data: bytes, leader: bool) -> VerifierMessage:
    size = 8 * params.verifier_len
    if len(data) != verifier_message_bytes(params):
        raise PeerMismatchError(
            f"a norm-proof verifier message of {len(data)} bytes; expected "
            f"{verifier_message_bytes(params)}"
        )
    values = np.frombuffer(data[:size], dtype="<u8").astype(np.uint64)
    if values.size and int(values.max()) >= params.p:
        raise PeerMismatchError("a norm-proof verifier message holds a value outside the field")
    joint = data[size : size + _JOINT_BYTES]
    return VerifierMessage(values, joint, leader, data[size + _JOINT_BYTES :])


class PreparedDots:
    """Each held share's wraparound dots, computed as the share arrives (the server's intake
    calls :meth:`prepare` off its event loop): they depend on no coin, and for a large d they
    are most of a verifier message's work, which the round's agreement then does not wait
    for. Looked up by the proof's J1, which binds the x share: a share that changed finds
    nothing and is computed as before. Only the latest round's are kept."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._round = -1
        self._by_joint: dict[bytes, np.ndarray] = {}

    def prepare(
        self,
        intake: ShareIntake,
        params: NormProofParams,
        run_id: str,
        round_number: int,
        provider: str,
    ) -> None:
        share = intake.proof_share(provider)
        joint_x, dots = share_dots(params, share, proof_context(run_id, round_number, provider))
        with self._lock:
            if round_number < self._round:
                return
            if round_number > self._round:
                self._round, self._by_joint = round_number, {}
            self._by_joint[joint_x] = dots

    def get(self, joint_x: bytes) -> np.ndarray | None:
        with self._lock:
            return self._by_joint.get(joint_x)

    def __len__(self) -> int:
        with self._lock:
            return len(self._by_joint)


def verifier_messages(
    intake: ShareIntake,
    params: NormProofParams,
    coin: bytes,
    run_id: str,
    round_number: int,
    providers: Sequence[str],
    prepared: PreparedDots | None = None,
) -> list[bytes]:
    """This server's verifier message for the held share of each of ``providers`` (round
    ``round_number`` of run ``run_id``, its intake closed), in their order; ``prepared``:
    the shares' wraparound dots computed as they arrived."""
    lookup = None if prepared is None else prepared.get
    out = []
    for name in providers:
        share = intake.proof_share(name)
        context = proof_context(run_id, round_number, name)
        if isinstance(share, HelperShare):
            message = helper_query(params, share, context, coin, lookup)
        else:
            message = leader_query(params, share, context, coin, lookup)
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

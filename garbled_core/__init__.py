"""SPGC's two-party garbled-circuit engine.

One circuit description (built with :class:`garbled_core.circuit.CircuitBuilder`) runs in three
backends: plaintext (``Circuit.evaluate``), the garbler (``Garbler.run``) and the evaluator
(``Evaluator.run``). AND gates by three-halves garbling (the default, 24.625 bytes per AND) or
half-gates (``scheme="halfgates"``, 32 bytes), both with free-XOR; evaluator inputs by SoftSpoken
correlated OT extension (``ot_k``, default ``DEFAULT_OT_K``; IKNP with ``ot_k=0``); instances go
through the engine in chunks of ``DEFAULT_CHUNK`` unless ``chunk=`` says otherwise (both parties
must use the same); the data link is TCP with TLS 1.3 (mutual certificates) unless ``insecure=True``
is passed explicitly. With TLS, ``Listener.accept`` returns only a connection that completed
the handshake (peer certificate from the CA, issued to ``TlsConfig.peer_name`` when set); any
other connection is closed, counted in ``Listener.refused`` and reported to its
``on_refused(peer_address, reason)`` callback, and the listener goes on waiting for the peer
until its timeout.

A fourth backend, :class:`GmwParty` (``role="garbler"`` for H1, ``"evaluator"`` for H2), runs
the same circuits with GMW on XOR shares: Beaver triples from random OT (SoftSpoken ``ot_k``),
one message each way per AND layer; ``run`` takes and returns what ``Garbler.run`` and
``Evaluator.run`` do (its ``Kept`` outputs hold XOR shares and feed only GMW runs).
:class:`AuthGmwParty` is its maliciously secure form (``security: malicious``; auth_gmw.h):
authenticated shares and triples, and a peer that deviates raises :class:`PeerDeviated` before
any output computed from its messages is revealed. :class:`AuthGarbleParty` is the maliciously
secure form of garbling (auth_garble.h: authenticated garbling, Wang-Ranellucci-Katz 2017) on
the same authenticated shares and triples, in a constant number of round trips a run; both
derive from :class:`AuthSession`, which holds what they share.

``chacha_blocks`` is ChaCha's block function (chacha20.h): the servers expand their round
seeds with it, as ChaCha8 (``spgc.privacy.noise.expand_seed``), so that under ``security:
malicious`` each proves its expansion in zero knowledge (``AuthSession.prove``, zk_proof.h,
over the circuits of ``garbled_core.crypto_circuits``).

The prime-field kernels of the providers' norm proofs (``field_ntt``, ``field_matvec``,
``field_mul``, ``field_expand``, ``wraparound_dots``; field.h) work on uint64 values below a
prime p < 2^62; ``spgc.protocol.norm_proof`` builds the proofs on them.
"""

from garbled_core._core import (
    AUTH_TABLE_BYTES,
    DEFAULT_CHUNK,
    DEFAULT_OT_K,
    GARBLING_SCHEMES,
    AuthGarbleParty,
    AuthGmwParty,
    AuthSession,
    Channel,
    ChannelError,
    ChannelTimeoutError,
    Circuit,
    Evaluator,
    Garbler,
    GmwParty,
    Kept,
    KeptSelection,
    Listener,
    PeerClosedError,
    PeerDeviated,
    ProofResult,
    ProtocolError,
    TlsConfig,
    TlsError,
    and_kernel,
    and_table_bytes,
    available_and_kernels,
    chacha_blocks,
    field_expand,
    field_matvec,
    field_mul,
    field_ntt,
    garble_only,
    set_and_kernel,
    wraparound_dots,
)
from garbled_core.circuit import Bits, CircuitBuilder, CircuitDescription

__all__ = [
    "AUTH_TABLE_BYTES",
    "DEFAULT_CHUNK",
    "DEFAULT_OT_K",
    "GARBLING_SCHEMES",
    "AuthGarbleParty",
    "AuthGmwParty",
    "AuthSession",
    "Bits",
    "Channel",
    "ChannelError",
    "ChannelTimeoutError",
    "Circuit",
    "CircuitBuilder",
    "CircuitDescription",
    "Evaluator",
    "Garbler",
    "GmwParty",
    "Kept",
    "KeptSelection",
    "Listener",
    "PeerClosedError",
    "PeerDeviated",
    "ProofResult",
    "ProtocolError",
    "TlsConfig",
    "TlsError",
    "and_kernel",
    "and_table_bytes",
    "available_and_kernels",
    "chacha_blocks",
    "field_expand",
    "field_matvec",
    "field_mul",
    "field_ntt",
    "garble_only",
    "set_and_kernel",
    "wraparound_dots",
]

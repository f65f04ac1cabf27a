"""The range of every number on the wire, and the check both sides run before using one.

:data:`FIELD_BOUNDS` names, for every numeric field of ``spgc.v1`` (and of the
``google.protobuf.Timestamp`` the messages carry), the values a conforming sender puts there;
the ``.proto`` comments say the same in words ("at most ..."). :func:`check_bounds` walks a
message (nested messages, repeated fields and set ``optional``/oneof fields included) and raises
:class:`~spgc.wire.errors.InvalidArgumentError` naming the first field out of bounds
(:class:`~spgc.wire.errors.ResourceExhaustedError` for a size above its limit), e.g.
``TrainingConfig.ring_bits=65 is out of bounds: must be 2..64``.

Servers run it on every request (:func:`spgc.wire.transport.add_servicer` does it as it parses
one; the handlers once more); the provider runs it on every answer (ServerInfo, RoundInfo,
ModelHeader, LedgerReply, SubmitReceipt). Rules that need more than one field (the exact chunk
count, a vector length equal to the model's, the protocol version) stay with the code that
reads the field; those fields are marked :data:`ANY` here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from spgc.common.lanes import MAX_LANES
from spgc.wire.chunks import DEFAULT_MAX_VECTOR_BYTES, MAX_CHUNK_BYTES
from spgc.wire.errors import InvalidArgumentError, ResourceExhaustedError, WireError
from spgc.wire.pages import MAX_PAGES

__all__ = [
    "ANY",
    "COUNTER",
    "FIELD_BOUNDS",
    "MAX_COUNTER",
    "MAX_NUM_PARAMETERS",
    "MAX_RING_BITS",
    "MIN_RING_BITS",
    "Bound",
    "check_bounds",
    "numeric_fields",
]

#: Largest counter (round, model version, ledger line, pool index or offset): 2^63 - 1, so that
#: every counter fits a signed 64-bit integer wherever it is stored (numpy, JSON, the ledger).
MAX_COUNTER = (1 << 63) - 1
#: Ring sizes L of the protocol (TrainingConfig.ring_bits; spgc.protocol.sharing supports 2..64).
MIN_RING_BITS = 2
MAX_RING_BITS = 64
#: Longest vector (TrainingConfig.num_parameters): 2^30 values of 8 bytes, 8 GiB, the largest
#: vector a reader accepts by default (spgc.wire.chunks.DEFAULT_MAX_VECTOR_BYTES).
MAX_NUM_PARAMETERS = DEFAULT_MAX_VECTOR_BYTES // 8
_UINT32_MAX = (1 << 32) - 1
_MAX_TIMESTAMP_SECONDS = 253_402_300_799  # 9999-12-31T23:59:59Z, protobuf's own limit


@dataclass(frozen=True)
class Bound:
    """The accepted values of one numeric field: ``low <= value <= high`` (``<`` where the end
    is open), never NaN, +infinity only with ``infinite``. ``too_big``: the error for a value
    above ``high`` (ResourceExhaustedError for sizes). ``checked=False``: any value (the field
    is checked where it is read, against other fields, or is ignored)."""

    low: float = 0
    high: float = MAX_COUNTER
    low_open: bool = False
    high_open: bool = False
    infinite: bool = False
    too_big: type[WireError] = InvalidArgumentError
    checked: bool = True

    def admits(self, value: float) -> bool:
        """Whether ``value`` is within the bound."""
        if not self.checked:
            return True
        if isinstance(value, float):
            if math.isnan(value):
                return False
            if math.isinf(value):
                return self.infinite and value > 0
        if value < self.low or (self.low_open and value == self.low):
            return False
        return value < self.high if self.high_open else value <= self.high

    def describe(self, is_float: bool) -> str:
        """The bound in words, e.g. "2..64", "at most 2^63 - 1", "finite, > 0"."""
        if not self.checked:
            return "any value"
        if not is_float:
            if self.low == 0 and self.high == MAX_COUNTER:
                return "at most 2^63 - 1"
            if self.high == MAX_COUNTER:
                return f"at least {self.low:,}"
            return f"{self.low:,}..{self.high:,}"
        parts = [] if self.infinite else ["finite"]
        if math.isfinite(self.low):
            parts.append(f"{'>' if self.low_open else '>='} {self.low:g}")
        if math.isfinite(self.high):
            parts.append(f"{'<' if self.high_open else '<='} {self.high:g}")
        return ", ".join(parts) + (" (+infinity allowed)" if self.infinite else "")


#: A uint64 counter: 0..2^63-1.
COUNTER = Bound()
#: Any value (checked elsewhere, informational, or ignored).
ANY = Bound(checked=False)
_UINT32 = Bound(0, _UINT32_MAX)
_POSITIVE = Bound(0.0, math.inf, low_open=True)
_NON_NEGATIVE = Bound(0.0, math.inf)
_NON_NEGATIVE_OR_INF = Bound(0.0, math.inf, infinite=True)
_PROBABILITY = Bound(0.0, 1.0, high_open=True)  # a delta
_RING_BITS = Bound(MIN_RING_BITS, MAX_RING_BITS)
_LENGTH = Bound(1, MAX_NUM_PARAMETERS, too_big=ResourceExhaustedError)
_LENGTH_OR_UNSET = Bound(0, MAX_NUM_PARAMETERS, too_big=ResourceExhaustedError)
_CHUNK_BYTES = Bound(8, MAX_CHUNK_BYTES, too_big=ResourceExhaustedError)
_LIMIT_CHUNK_BYTES = Bound(0, MAX_CHUNK_BYTES)  # 0: unset

#: Bound of every numeric field, by full name. tests/e2e/test_wire_contract.py checks that the table
#: covers every numeric field of the generated messages.
FIELD_BOUNDS: dict[str, Bound] = {
    # --- aggregation.proto
    "spgc.v1.TrainingConfig.num_parameters": _LENGTH,
    "spgc.v1.TrainingConfig.ring_bits": _RING_BITS,
    "spgc.v1.TrainingConfig.scale": _POSITIVE,
    "spgc.v1.TrainingConfig.clip_norm": _POSITIVE,
    "spgc.v1.TrainingConfig.l2_bound_units": _POSITIVE,
    "spgc.v1.TrainingConfig.sampling_rate": Bound(0.0, 1.0, low_open=True),
    "spgc.v1.TrainingConfig.batch_size": Bound(1, _UINT32_MAX),
    "spgc.v1.TrainingConfig.noise_multiplier": _NON_NEGATIVE,
    "spgc.v1.TrainingConfig.noise_std_units": _NON_NEGATIVE,
    "spgc.v1.TrainingConfig.step_epsilon": _NON_NEGATIVE_OR_INF,
    "spgc.v1.TrainingConfig.step_delta": _PROBABILITY,
    "spgc.v1.TrainingConfig.target_epsilon": _NON_NEGATIVE_OR_INF,
    "spgc.v1.TrainingConfig.target_delta": _PROBABILITY,
    "spgc.v1.TrainingConfig.max_rounds": COUNTER,
    "spgc.v1.TrainingConfig.min_providers": Bound(1, _UINT32_MAX),
    "spgc.v1.TrainingConfig.max_batch_size": COUNTER,
    "spgc.v1.TrainingConfig.learning_rate": _NON_NEGATIVE,
    "spgc.v1.TrainingConfig.batches_per_epoch": _UINT32,
    # 0: nothing frozen; the ranges' sum and order are checked where they are read.
    "spgc.v1.TrainingConfig.model_parameters": _LENGTH_OR_UNSET,
    # clip_rule CLIP_RULE_ADAPTIVE (0 otherwise): the provider checks they are > 0 there.
    "spgc.v1.TrainingConfig.clip_target_quantile": _PROBABILITY,
    "spgc.v1.TrainingConfig.clip_learning_rate": _NON_NEGATIVE,
    "spgc.v1.TrainingConfig.count_clip": _NON_NEGATIVE,
    "spgc.v1.TrainingConfig.expected_batch_size": _NON_NEGATIVE,
    "spgc.v1.TrainingConfig.update_noise_multiplier": _NON_NEGATIVE,
    "spgc.v1.TrainingConfig.count_noise_std": _NON_NEGATIVE,
    "spgc.v1.TrainingConfig.norm_field_modulus": Bound(0, (1 << 62) - 1),
    "spgc.v1.TrainingConfig.norm_bound_units": Bound(0, 1 << 62),
    "spgc.v1.TrainingConfig.norm_repetitions": Bound(0, 256),
    "spgc.v1.TrainingConfig.local_epochs": Bound(0, 1000),
    "spgc.v1.TrainingConfig.local_batch_size": _UINT32,
    "spgc.v1.TrainingConfig.local_learning_rate": _NON_NEGATIVE,
    "spgc.v1.TrainingConfig.clip_decay": Bound(0.0, 1.0),
    "spgc.v1.TrainingConfig.clip_min": _NON_NEGATIVE,
    # standardize: the feature statistics' release (checked together by the provider)
    "spgc.v1.TrainingConfig.feature_lo": Bound(-math.inf, math.inf),
    "spgc.v1.TrainingConfig.feature_hi": Bound(-math.inf, math.inf),
    "spgc.v1.TrainingConfig.stats_noise_multiplier": _NON_NEGATIVE,
    "spgc.v1.TrainingConfig.stats_scale": COUNTER,
    "spgc.v1.TrainingConfig.stats_max_rows": COUNTER,
    "spgc.v1.TrainingConfig.noise_floor": _PROBABILITY,  # [0, 1): issue 46's noise floor
    "spgc.v1.TrainingConfig.trial_depth": Bound(0, 10_000),  # the config's bound
    "spgc.v1.NoisePhase.from_release": COUNTER,
    "spgc.v1.NoisePhase.noise_multiplier": _POSITIVE,
    "spgc.v1.NoisePhase.sampling_rate": Bound(0.0, 1.0, low_open=True),
    "spgc.v1.NoisePhase.noise_std_units": _POSITIVE,
    "spgc.v1.CoordinateRange.start": Bound(0, MAX_NUM_PARAMETERS),
    "spgc.v1.CoordinateRange.length": _LENGTH,
    "spgc.v1.RoundInfo.round": COUNTER,
    "spgc.v1.RoundInfo.model_version": COUNTER,
    "spgc.v1.RoundInfo.shares_accepted": ANY,  # informational
    "spgc.v1.RoundInfo.providers_agreed": ANY,  # informational
    "spgc.v1.RoundInfo.epsilon_spent": _NON_NEGATIVE_OR_INF,
    "spgc.v1.RoundInfo.latest_model_version": COUNTER,
    "spgc.v1.RoundInfo.releases_counted": COUNTER,
    "spgc.v1.RoundInfo.ledger_head_releases": COUNTER,
    "spgc.v1.RoundInfo.clip_norm": _NON_NEGATIVE,  # 0: fixed clip norm
    "spgc.v1.RoundInfo.feature_mean": Bound(-math.inf, math.inf),
    "spgc.v1.RoundInfo.feature_std": _POSITIVE,
    "spgc.v1.WireLimits.max_message_bytes": ANY,  # informational
    "spgc.v1.WireLimits.max_chunk_bytes": _LIMIT_CHUNK_BYTES,
    "spgc.v1.WireLimits.preferred_chunk_bytes": _LIMIT_CHUNK_BYTES,
    "spgc.v1.HelloRequest.protocol_version": ANY,  # the server compares: FAILED_PRECONDITION
    "spgc.v1.ServerInfo.protocol_version": ANY,  # the provider compares
    "spgc.v1.ModelRequest.version": COUNTER,
    "spgc.v1.ModelRequest.chunk_bytes": ANY,  # clamped to 8..max_chunk_bytes
    "spgc.v1.ModelHeader.version": COUNTER,
    "spgc.v1.ModelHeader.num_parameters": _LENGTH,
    "spgc.v1.ModelHeader.chunk_bytes": _CHUNK_BYTES,
    "spgc.v1.ModelHeader.chunk_count": ANY,  # must be exactly ceil(d*8/chunk_bytes)
    "spgc.v1.VectorChunk.index": ANY,  # must be the next index (ChunkValidator)
    "spgc.v1.ShareHeader.round": COUNTER,
    "spgc.v1.ShareHeader.num_elements": _LENGTH_OR_UNSET,  # 0 only with a norm_seed
    "spgc.v1.ShareHeader.ring_bits": _RING_BITS,
    "spgc.v1.ShareHeader.chunk_bytes": _CHUNK_BYTES,
    "spgc.v1.ShareHeader.chunk_count": ANY,  # must be exactly ceil(d*8/chunk_bytes)
    "spgc.v1.ShareHeader.compute_seconds": ANY,  # reserved, ignored
    "spgc.v1.SubmitReceipt.round": COUNTER,
    "spgc.v1.SubmitReceipt.num_elements": _LENGTH,
    "spgc.v1.RoundStatusRequest.round": COUNTER,
    "spgc.v1.RoundStatusRequest.wait_seconds": _NON_NEGATIVE,
    "spgc.v1.RoundStatusRequest.after_round": COUNTER,
    "spgc.v1.LedgerRequest.from_line": COUNTER,
    "spgc.v1.LedgerReply.total_lines": COUNTER,
    # --- peer.proto
    "spgc.v1.PeerHello.protocol_version": ANY,  # the callee compares: FAILED_PRECONDITION
    "spgc.v1.PeerHello.ledger_releases": COUNTER,
    "spgc.v1.PeerHello.link_rtt_seconds": Bound(0, 3600),
    "spgc.v1.PeerHello.link_bytes_per_second": _NON_NEGATIVE,
    "spgc.v1.ShareHeader.model_version": COUNTER,
    "spgc.v1.BarrierState.round": COUNTER,
    "spgc.v1.PoolSlice.block_index": COUNTER,
    "spgc.v1.PoolSlice.offset": COUNTER,
    "spgc.v1.PoolSlice.count": COUNTER,
    "spgc.v1.PoolBlock.index": COUNTER,
    "spgc.v1.PoolBlock.count": COUNTER,
    "spgc.v1.PoolState.sigma_units": _NON_NEGATIVE,
    "spgc.v1.PoolState.ring_bits": _RING_BITS,
    "spgc.v1.PoolState.cursor_block": COUNTER,
    "spgc.v1.PoolState.cursor_offset": COUNTER,
    "spgc.v1.ProviderSet.round": COUNTER,
    "spgc.v1.ProviderSet.min_providers": Bound(0, _UINT32_MAX),  # 0 on a later page
    "spgc.v1.ProviderSet.pages": Bound(0, MAX_PAGES),  # the count itself: spgc.wire.pages
    "spgc.v1.ProviderAgreement.pages": Bound(0, MAX_PAGES),
    "spgc.v1.SeedCommitment.round": COUNTER,
    "spgc.v1.ModelDigest.version": COUNTER,
    "spgc.v1.ModelDigest.num_parameters": _LENGTH,
    "spgc.v1.ReleaseStatement.round": COUNTER,
    "spgc.v1.WorkerPairing.workers": Bound(1, MAX_LANES),  # the server key `workers`
    # --- well-known types carried by the messages
    "google.protobuf.Timestamp.seconds": Bound(0, _MAX_TIMESTAMP_SECONDS),
    "google.protobuf.Timestamp.nanos": Bound(0, 999_999_999),
}

_INTEGERS = frozenset(
    {
        FieldDescriptor.CPPTYPE_INT32,
        FieldDescriptor.CPPTYPE_INT64,
        FieldDescriptor.CPPTYPE_UINT32,
        FieldDescriptor.CPPTYPE_UINT64,
    }
)
_FLOATS = frozenset({FieldDescriptor.CPPTYPE_DOUBLE, FieldDescriptor.CPPTYPE_FLOAT})


def numeric_fields(descriptor: Any) -> list[FieldDescriptor]:
    """The numeric (integer and floating-point) fields of a message descriptor."""
    return [f for f in descriptor.fields if f.cpp_type in _INTEGERS | _FLOATS]


def _default_bound(field: FieldDescriptor) -> Bound:
    """For a field missing from the table: a counter for 64-bit integers, finite for floats."""
    if field.cpp_type in _FLOATS:
        return Bound(-math.inf, math.inf)
    if field.cpp_type in (FieldDescriptor.CPPTYPE_UINT64, FieldDescriptor.CPPTYPE_INT64):
        return COUNTER
    return ANY


def _check_value(field: FieldDescriptor, value: float, path: str) -> None:
    bound = FIELD_BOUNDS.get(field.full_name) or _default_bound(field)
    if bound.admits(value):
        return
    is_float = field.cpp_type in _FLOATS
    shown = repr(float(value)) if is_float else str(value)
    must = f"must be {bound.describe(is_float)}"
    if value > bound.high and bound.too_big is not InvalidArgumentError:  # NaN is not above
        # "exceeds the limit": what a client reads to tell a size it must shrink from a limit
        # on calls that a retry gets past (both RESOURCE_EXHAUSTED)
        raise bound.too_big(f"{path}={shown} exceeds the limit: {must}")
    raise InvalidArgumentError(f"{path}={shown} is out of bounds: {must}")


def _walk(message: Message, path: str) -> None:
    for field in message.DESCRIPTOR.fields:
        name = f"{path}.{field.name}"
        if field.cpp_type == FieldDescriptor.CPPTYPE_MESSAGE:
            if field.is_repeated:
                if field.message_type.GetOptions().map_entry:
                    continue  # no maps in spgc.v1
                for i, item in enumerate(getattr(message, field.name)):
                    _walk(item, f"{name}[{i}]")
            elif message.HasField(field.name):
                _walk(getattr(message, field.name), name)
            continue
        if field.cpp_type not in _INTEGERS and field.cpp_type not in _FLOATS:
            continue
        if field.is_repeated:
            for i, value in enumerate(getattr(message, field.name)):
                _check_value(field, value, f"{name}[{i}]")
        elif not field.has_presence or message.HasField(field.name):
            _check_value(field, getattr(message, field.name), name)


def check_bounds(message: Message, name: str | None = None) -> None:
    """Raise a :class:`WireError` for the first numeric field of ``message`` (recursively) out
    of its bound in :data:`FIELD_BOUNDS`; ``name`` prefixes the field names in the message
    (default: the message type's name). Unset ``optional`` and oneof fields are skipped."""
    _walk(message, name or message.DESCRIPTOR.name)

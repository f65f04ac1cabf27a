# Generated from proto/spgc/v1/peer.proto by scripts/gen_proto.py (grpcio-tools 1.81.1). DO NOT EDIT.
# ruff: noqa
# fmt: off
import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from . import aggregation_pb2 as _aggregation_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Barrier(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BARRIER_UNSPECIFIED: _ClassVar[Barrier]
    BARRIER_ROUND_OPEN: _ClassVar[Barrier]
    BARRIER_INTAKE_CLOSED: _ClassVar[Barrier]
    BARRIER_CIRCUIT_READY: _ClassVar[Barrier]
    BARRIER_MODEL_PUBLISHED: _ClassVar[Barrier]
    BARRIER_WAITING_FOR_PROVIDERS: _ClassVar[Barrier]
    BARRIER_ABORTED: _ClassVar[Barrier]
BARRIER_UNSPECIFIED: Barrier
BARRIER_ROUND_OPEN: Barrier
BARRIER_INTAKE_CLOSED: Barrier
BARRIER_CIRCUIT_READY: Barrier
BARRIER_MODEL_PUBLISHED: Barrier
BARRIER_WAITING_FOR_PROVIDERS: Barrier
BARRIER_ABORTED: Barrier

class PeerHello(_message.Message):
    __slots__ = ("protocol_version", "software_version", "role", "config", "round", "ledger_public_key", "ledger_releases", "unmatched_release", "link_probe", "link_rtt_seconds", "link_bytes_per_second")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LEDGER_PUBLIC_KEY_FIELD_NUMBER: _ClassVar[int]
    LEDGER_RELEASES_FIELD_NUMBER: _ClassVar[int]
    UNMATCHED_RELEASE_FIELD_NUMBER: _ClassVar[int]
    LINK_PROBE_FIELD_NUMBER: _ClassVar[int]
    LINK_RTT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    LINK_BYTES_PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    software_version: str
    role: _aggregation_pb2.ServerRole
    config: _aggregation_pb2.TrainingConfig
    round: _aggregation_pb2.RoundInfo
    ledger_public_key: bytes
    ledger_releases: int
    unmatched_release: ReleaseStatement
    link_probe: bool
    link_rtt_seconds: float
    link_bytes_per_second: float
    def __init__(self, protocol_version: _Optional[int] = ..., software_version: _Optional[str] = ..., role: _Optional[_Union[_aggregation_pb2.ServerRole, str]] = ..., config: _Optional[_Union[_aggregation_pb2.TrainingConfig, _Mapping]] = ..., round: _Optional[_Union[_aggregation_pb2.RoundInfo, _Mapping]] = ..., ledger_public_key: _Optional[bytes] = ..., ledger_releases: _Optional[int] = ..., unmatched_release: _Optional[_Union[ReleaseStatement, _Mapping]] = ..., link_probe: _Optional[bool] = ..., link_rtt_seconds: _Optional[float] = ..., link_bytes_per_second: _Optional[float] = ...) -> None: ...

class BarrierState(_message.Message):
    __slots__ = ("run_id", "round", "barrier", "role", "reached_at", "pool", "verify_coin", "ended_reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    BARRIER_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    REACHED_AT_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    VERIFY_COIN_FIELD_NUMBER: _ClassVar[int]
    ENDED_REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round: int
    barrier: Barrier
    role: _aggregation_pb2.ServerRole
    reached_at: _timestamp_pb2.Timestamp
    pool: PoolSlice
    verify_coin: bytes
    ended_reason: str
    def __init__(self, run_id: _Optional[str] = ..., round: _Optional[int] = ..., barrier: _Optional[_Union[Barrier, str]] = ..., role: _Optional[_Union[_aggregation_pb2.ServerRole, str]] = ..., reached_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., pool: _Optional[_Union[PoolSlice, _Mapping]] = ..., verify_coin: _Optional[bytes] = ..., ended_reason: _Optional[str] = ...) -> None: ...

class PoolSlice(_message.Message):
    __slots__ = ("block_index", "block_id", "offset", "count")
    BLOCK_INDEX_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    block_index: int
    block_id: bytes
    offset: int
    count: int
    def __init__(self, block_index: _Optional[int] = ..., block_id: _Optional[bytes] = ..., offset: _Optional[int] = ..., count: _Optional[int] = ...) -> None: ...

class PoolBlock(_message.Message):
    __slots__ = ("index", "block_id", "count")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    BLOCK_ID_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    index: int
    block_id: bytes
    count: int
    def __init__(self, index: _Optional[int] = ..., block_id: _Optional[bytes] = ..., count: _Optional[int] = ...) -> None: ...

class PoolState(_message.Message):
    __slots__ = ("run_id", "role", "sigma_units", "ring_bits", "cursor_block", "cursor_offset", "blocks")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SIGMA_UNITS_FIELD_NUMBER: _ClassVar[int]
    RING_BITS_FIELD_NUMBER: _ClassVar[int]
    CURSOR_BLOCK_FIELD_NUMBER: _ClassVar[int]
    CURSOR_OFFSET_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    role: _aggregation_pb2.ServerRole
    sigma_units: float
    ring_bits: int
    cursor_block: int
    cursor_offset: int
    blocks: _containers.RepeatedCompositeFieldContainer[PoolBlock]
    def __init__(self, run_id: _Optional[str] = ..., role: _Optional[_Union[_aggregation_pb2.ServerRole, str]] = ..., sigma_units: _Optional[float] = ..., ring_bits: _Optional[int] = ..., cursor_block: _Optional[int] = ..., cursor_offset: _Optional[int] = ..., blocks: _Optional[_Iterable[_Union[PoolBlock, _Mapping]]] = ...) -> None: ...

class NoiseBlock(_message.Message):
    __slots__ = ("run_id", "role", "step", "block", "reason", "seed")
    class Step(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        STEP_UNSPECIFIED: _ClassVar[NoiseBlock.Step]
        STEP_START: _ClassVar[NoiseBlock.Step]
        STEP_FINISH: _ClassVar[NoiseBlock.Step]
        STEP_DONE: _ClassVar[NoiseBlock.Step]
    STEP_UNSPECIFIED: NoiseBlock.Step
    STEP_START: NoiseBlock.Step
    STEP_FINISH: NoiseBlock.Step
    STEP_DONE: NoiseBlock.Step
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    BLOCK_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    role: _aggregation_pb2.ServerRole
    step: NoiseBlock.Step
    block: PoolBlock
    reason: str
    seed: SeedCommitment
    def __init__(self, run_id: _Optional[str] = ..., role: _Optional[_Union[_aggregation_pb2.ServerRole, str]] = ..., step: _Optional[_Union[NoiseBlock.Step, str]] = ..., block: _Optional[_Union[PoolBlock, _Mapping]] = ..., reason: _Optional[str] = ..., seed: _Optional[_Union[SeedCommitment, _Mapping]] = ...) -> None: ...

class ProviderSet(_message.Message):
    __slots__ = ("run_id", "round", "role", "providers", "digest", "min_providers", "vector_ids", "norm_verifiers", "verify_coin", "release", "pages")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    MIN_PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    VECTOR_IDS_FIELD_NUMBER: _ClassVar[int]
    NORM_VERIFIERS_FIELD_NUMBER: _ClassVar[int]
    VERIFY_COIN_FIELD_NUMBER: _ClassVar[int]
    RELEASE_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round: int
    role: _aggregation_pb2.ServerRole
    providers: _containers.RepeatedScalarFieldContainer[str]
    digest: bytes
    min_providers: int
    vector_ids: _containers.RepeatedScalarFieldContainer[bytes]
    norm_verifiers: _containers.RepeatedScalarFieldContainer[bytes]
    verify_coin: bytes
    release: ReleaseStatement
    pages: int
    def __init__(self, run_id: _Optional[str] = ..., round: _Optional[int] = ..., role: _Optional[_Union[_aggregation_pb2.ServerRole, str]] = ..., providers: _Optional[_Iterable[str]] = ..., digest: _Optional[bytes] = ..., min_providers: _Optional[int] = ..., vector_ids: _Optional[_Iterable[bytes]] = ..., norm_verifiers: _Optional[_Iterable[bytes]] = ..., verify_coin: _Optional[bytes] = ..., release: _Optional[_Union[ReleaseStatement, _Mapping]] = ..., pages: _Optional[int] = ...) -> None: ...

class ProviderAgreement(_message.Message):
    __slots__ = ("callee", "agreed", "agreed_digest", "proceed", "pages")
    CALLEE_FIELD_NUMBER: _ClassVar[int]
    AGREED_FIELD_NUMBER: _ClassVar[int]
    AGREED_DIGEST_FIELD_NUMBER: _ClassVar[int]
    PROCEED_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    callee: ProviderSet
    agreed: _containers.RepeatedScalarFieldContainer[str]
    agreed_digest: bytes
    proceed: bool
    pages: int
    def __init__(self, callee: _Optional[_Union[ProviderSet, _Mapping]] = ..., agreed: _Optional[_Iterable[str]] = ..., agreed_digest: _Optional[bytes] = ..., proceed: _Optional[bool] = ..., pages: _Optional[int] = ...) -> None: ...

class SeedCommitment(_message.Message):
    __slots__ = ("run_id", "round", "role", "scheme", "commitment")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SCHEME_FIELD_NUMBER: _ClassVar[int]
    COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round: int
    role: _aggregation_pb2.ServerRole
    scheme: str
    commitment: bytes
    def __init__(self, run_id: _Optional[str] = ..., round: _Optional[int] = ..., role: _Optional[_Union[_aggregation_pb2.ServerRole, str]] = ..., scheme: _Optional[str] = ..., commitment: _Optional[bytes] = ...) -> None: ...

class ModelDigest(_message.Message):
    __slots__ = ("run_id", "version", "role", "num_parameters", "sha256")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    role: _aggregation_pb2.ServerRole
    num_parameters: int
    sha256: bytes
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., role: _Optional[_Union[_aggregation_pb2.ServerRole, str]] = ..., num_parameters: _Optional[int] = ..., sha256: _Optional[bytes] = ...) -> None: ...

class ReleaseStatement(_message.Message):
    __slots__ = ("run_id", "round", "role", "statement", "signature", "pool", "seed")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    STATEMENT_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round: int
    role: _aggregation_pb2.ServerRole
    statement: bytes
    signature: bytes
    pool: PoolSlice
    seed: SeedCommitment
    def __init__(self, run_id: _Optional[str] = ..., round: _Optional[int] = ..., role: _Optional[_Union[_aggregation_pb2.ServerRole, str]] = ..., statement: _Optional[bytes] = ..., signature: _Optional[bytes] = ..., pool: _Optional[_Union[PoolSlice, _Mapping]] = ..., seed: _Optional[_Union[SeedCommitment, _Mapping]] = ...) -> None: ...

class WorkerPairing(_message.Message):
    __slots__ = ("run_id", "role", "workers", "addresses")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    WORKERS_FIELD_NUMBER: _ClassVar[int]
    ADDRESSES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    role: _aggregation_pb2.ServerRole
    workers: int
    addresses: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., role: _Optional[_Union[_aggregation_pb2.ServerRole, str]] = ..., workers: _Optional[int] = ..., addresses: _Optional[_Iterable[str]] = ...) -> None: ...

# Generated from proto/spgc/v1/aggregation.proto by scripts/gen_proto.py (grpcio-tools 1.81.1). DO NOT EDIT.
# ruff: noqa
# fmt: off
import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ServerRole(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SERVER_ROLE_UNSPECIFIED: _ClassVar[ServerRole]
    SERVER_ROLE_H1: _ClassVar[ServerRole]
    SERVER_ROLE_H2: _ClassVar[ServerRole]
    SERVER_ROLE_SINGLE: _ClassVar[ServerRole]

class Mode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODE_UNSPECIFIED: _ClassVar[Mode]
    MODE_SPGC: _ClassVar[Mode]
    MODE_ONLY_MPC: _ClassVar[Mode]
    MODE_LDP: _ClassVar[Mode]
    MODE_PLAIN: _ClassVar[Mode]
    MODE_DNG: _ClassVar[Mode]
    MODE_PREPROCESSED: _ClassVar[Mode]

class BatchSampling(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    BATCH_SAMPLING_UNSPECIFIED: _ClassVar[BatchSampling]
    BATCH_SAMPLING_POISSON: _ClassVar[BatchSampling]
    BATCH_SAMPLING_SHUFFLE: _ClassVar[BatchSampling]

class Rounding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUNDING_UNSPECIFIED: _ClassVar[Rounding]
    ROUNDING_CONDITIONAL_STOCHASTIC: _ClassVar[Rounding]
    ROUNDING_STOCHASTIC: _ClassVar[Rounding]
    ROUNDING_NEAREST: _ClassVar[Rounding]

class SharingRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARING_RULE_UNSPECIFIED: _ClassVar[SharingRule]
    SHARING_RULE_DIFFERENCE_MOD_2L: _ClassVar[SharingRule]
    SHARING_RULE_SUM_MOD_P: _ClassVar[SharingRule]

class ShareEncoding(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SHARE_ENCODING_UNSPECIFIED: _ClassVar[ShareEncoding]
    SHARE_ENCODING_UINT64: _ClassVar[ShareEncoding]
    SHARE_ENCODING_PACKED: _ClassVar[ShareEncoding]
    SHARE_ENCODING_FIELD: _ClassVar[ShareEncoding]

class Calibration(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CALIBRATION_UNSPECIFIED: _ClassVar[Calibration]
    CALIBRATION_CLASSIC: _ClassVar[Calibration]
    CALIBRATION_ANALYTIC: _ClassVar[Calibration]
    CALIBRATION_ACCOUNTANT: _ClassVar[Calibration]

class RoundPhase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ROUND_PHASE_UNSPECIFIED: _ClassVar[RoundPhase]
    ROUND_PHASE_COLLECTING: _ClassVar[RoundPhase]
    ROUND_PHASE_AGREEING: _ClassVar[RoundPhase]
    ROUND_PHASE_COMPUTING: _ClassVar[RoundPhase]
    ROUND_PHASE_PUBLISHED: _ClassVar[RoundPhase]
    ROUND_PHASE_ABORTED: _ClassVar[RoundPhase]
    ROUND_PHASE_FINISHED: _ClassVar[RoundPhase]
    ROUND_PHASE_WAITING_FOR_PEER: _ClassVar[RoundPhase]

class ClipRule(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CLIP_RULE_FIXED: _ClassVar[ClipRule]
    CLIP_RULE_ADAPTIVE: _ClassVar[ClipRule]
    CLIP_RULE_DECAY: _ClassVar[ClipRule]

class ModelPart(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    MODEL_PART_TRAINABLE: _ClassVar[ModelPart]
    MODEL_PART_FROZEN: _ClassVar[ModelPart]
SERVER_ROLE_UNSPECIFIED: ServerRole
SERVER_ROLE_H1: ServerRole
SERVER_ROLE_H2: ServerRole
SERVER_ROLE_SINGLE: ServerRole
MODE_UNSPECIFIED: Mode
MODE_SPGC: Mode
MODE_ONLY_MPC: Mode
MODE_LDP: Mode
MODE_PLAIN: Mode
MODE_DNG: Mode
MODE_PREPROCESSED: Mode
BATCH_SAMPLING_UNSPECIFIED: BatchSampling
BATCH_SAMPLING_POISSON: BatchSampling
BATCH_SAMPLING_SHUFFLE: BatchSampling
ROUNDING_UNSPECIFIED: Rounding
ROUNDING_CONDITIONAL_STOCHASTIC: Rounding
ROUNDING_STOCHASTIC: Rounding
ROUNDING_NEAREST: Rounding
SHARING_RULE_UNSPECIFIED: SharingRule
SHARING_RULE_DIFFERENCE_MOD_2L: SharingRule
SHARING_RULE_SUM_MOD_P: SharingRule
SHARE_ENCODING_UNSPECIFIED: ShareEncoding
SHARE_ENCODING_UINT64: ShareEncoding
SHARE_ENCODING_PACKED: ShareEncoding
SHARE_ENCODING_FIELD: ShareEncoding
CALIBRATION_UNSPECIFIED: Calibration
CALIBRATION_CLASSIC: Calibration
CALIBRATION_ANALYTIC: Calibration
CALIBRATION_ACCOUNTANT: Calibration
ROUND_PHASE_UNSPECIFIED: RoundPhase
ROUND_PHASE_COLLECTING: RoundPhase
ROUND_PHASE_AGREEING: RoundPhase
ROUND_PHASE_COMPUTING: RoundPhase
ROUND_PHASE_PUBLISHED: RoundPhase
ROUND_PHASE_ABORTED: RoundPhase
ROUND_PHASE_FINISHED: RoundPhase
ROUND_PHASE_WAITING_FOR_PEER: RoundPhase
CLIP_RULE_FIXED: ClipRule
CLIP_RULE_ADAPTIVE: ClipRule
CLIP_RULE_DECAY: ClipRule
MODEL_PART_TRAINABLE: ModelPart
MODEL_PART_FROZEN: ModelPart

class TrainingConfig(_message.Message):
    __slots__ = ("run_id", "mode", "dataset", "model", "num_parameters", "ring_bits", "scale", "clip_norm", "l2_bound_units", "rounding", "sampling", "sampling_rate", "batch_size", "noise_multiplier", "noise_std_units", "step_epsilon", "step_delta", "target_epsilon", "target_delta", "calibration", "accountant", "max_rounds", "min_providers", "model_fingerprint", "sharing_rule", "max_batch_size", "learning_rate", "batches_per_epoch", "share_encodings", "model_parameters", "trainable", "frozen_sha256", "task", "loss", "clip_rule", "clip_target_quantile", "clip_learning_rate", "count_clip", "expected_batch_size", "update_noise_multiplier", "count_noise_std", "backend", "verify_inputs", "norm_field_modulus", "norm_bound_units", "norm_repetitions", "adjacency", "local_epochs", "local_batch_size", "local_learning_rate", "local_optimizer", "clip_decay", "clip_min", "noise_schedule", "server_optimizer", "noise_floor", "standardize", "feature_lo", "feature_hi", "stats_noise_multiplier", "stats_scale", "stats_max_rows", "security", "trial_depth")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    DATASET_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    RING_BITS_FIELD_NUMBER: _ClassVar[int]
    SCALE_FIELD_NUMBER: _ClassVar[int]
    CLIP_NORM_FIELD_NUMBER: _ClassVar[int]
    L2_BOUND_UNITS_FIELD_NUMBER: _ClassVar[int]
    ROUNDING_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_RATE_FIELD_NUMBER: _ClassVar[int]
    BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    NOISE_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    NOISE_STD_UNITS_FIELD_NUMBER: _ClassVar[int]
    STEP_EPSILON_FIELD_NUMBER: _ClassVar[int]
    STEP_DELTA_FIELD_NUMBER: _ClassVar[int]
    TARGET_EPSILON_FIELD_NUMBER: _ClassVar[int]
    TARGET_DELTA_FIELD_NUMBER: _ClassVar[int]
    CALIBRATION_FIELD_NUMBER: _ClassVar[int]
    ACCOUNTANT_FIELD_NUMBER: _ClassVar[int]
    MAX_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    MIN_PROVIDERS_FIELD_NUMBER: _ClassVar[int]
    MODEL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    SHARING_RULE_FIELD_NUMBER: _ClassVar[int]
    MAX_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    BATCHES_PER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    SHARE_ENCODINGS_FIELD_NUMBER: _ClassVar[int]
    MODEL_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    TRAINABLE_FIELD_NUMBER: _ClassVar[int]
    FROZEN_SHA256_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    LOSS_FIELD_NUMBER: _ClassVar[int]
    CLIP_RULE_FIELD_NUMBER: _ClassVar[int]
    CLIP_TARGET_QUANTILE_FIELD_NUMBER: _ClassVar[int]
    CLIP_LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    COUNT_CLIP_FIELD_NUMBER: _ClassVar[int]
    EXPECTED_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    UPDATE_NOISE_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    COUNT_NOISE_STD_FIELD_NUMBER: _ClassVar[int]
    BACKEND_FIELD_NUMBER: _ClassVar[int]
    VERIFY_INPUTS_FIELD_NUMBER: _ClassVar[int]
    NORM_FIELD_MODULUS_FIELD_NUMBER: _ClassVar[int]
    NORM_BOUND_UNITS_FIELD_NUMBER: _ClassVar[int]
    NORM_REPETITIONS_FIELD_NUMBER: _ClassVar[int]
    ADJACENCY_FIELD_NUMBER: _ClassVar[int]
    LOCAL_EPOCHS_FIELD_NUMBER: _ClassVar[int]
    LOCAL_BATCH_SIZE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_LEARNING_RATE_FIELD_NUMBER: _ClassVar[int]
    LOCAL_OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    CLIP_DECAY_FIELD_NUMBER: _ClassVar[int]
    CLIP_MIN_FIELD_NUMBER: _ClassVar[int]
    NOISE_SCHEDULE_FIELD_NUMBER: _ClassVar[int]
    SERVER_OPTIMIZER_FIELD_NUMBER: _ClassVar[int]
    NOISE_FLOOR_FIELD_NUMBER: _ClassVar[int]
    STANDARDIZE_FIELD_NUMBER: _ClassVar[int]
    FEATURE_LO_FIELD_NUMBER: _ClassVar[int]
    FEATURE_HI_FIELD_NUMBER: _ClassVar[int]
    STATS_NOISE_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    STATS_SCALE_FIELD_NUMBER: _ClassVar[int]
    STATS_MAX_ROWS_FIELD_NUMBER: _ClassVar[int]
    SECURITY_FIELD_NUMBER: _ClassVar[int]
    TRIAL_DEPTH_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    mode: Mode
    dataset: str
    model: str
    num_parameters: int
    ring_bits: int
    scale: float
    clip_norm: float
    l2_bound_units: float
    rounding: Rounding
    sampling: BatchSampling
    sampling_rate: float
    batch_size: int
    noise_multiplier: float
    noise_std_units: float
    step_epsilon: float
    step_delta: float
    target_epsilon: float
    target_delta: float
    calibration: Calibration
    accountant: str
    max_rounds: int
    min_providers: int
    model_fingerprint: str
    sharing_rule: SharingRule
    max_batch_size: int
    learning_rate: float
    batches_per_epoch: int
    share_encodings: _containers.RepeatedScalarFieldContainer[ShareEncoding]
    model_parameters: int
    trainable: _containers.RepeatedCompositeFieldContainer[CoordinateRange]
    frozen_sha256: bytes
    task: str
    loss: str
    clip_rule: ClipRule
    clip_target_quantile: float
    clip_learning_rate: float
    count_clip: float
    expected_batch_size: float
    update_noise_multiplier: float
    count_noise_std: float
    backend: str
    verify_inputs: str
    norm_field_modulus: int
    norm_bound_units: int
    norm_repetitions: int
    adjacency: str
    local_epochs: int
    local_batch_size: int
    local_learning_rate: float
    local_optimizer: str
    clip_decay: float
    clip_min: float
    noise_schedule: _containers.RepeatedCompositeFieldContainer[NoisePhase]
    server_optimizer: str
    noise_floor: float
    standardize: bool
    feature_lo: _containers.RepeatedScalarFieldContainer[float]
    feature_hi: _containers.RepeatedScalarFieldContainer[float]
    stats_noise_multiplier: float
    stats_scale: int
    stats_max_rows: int
    security: str
    trial_depth: int
    def __init__(self, run_id: _Optional[str] = ..., mode: _Optional[_Union[Mode, str]] = ..., dataset: _Optional[str] = ..., model: _Optional[str] = ..., num_parameters: _Optional[int] = ..., ring_bits: _Optional[int] = ..., scale: _Optional[float] = ..., clip_norm: _Optional[float] = ..., l2_bound_units: _Optional[float] = ..., rounding: _Optional[_Union[Rounding, str]] = ..., sampling: _Optional[_Union[BatchSampling, str]] = ..., sampling_rate: _Optional[float] = ..., batch_size: _Optional[int] = ..., noise_multiplier: _Optional[float] = ..., noise_std_units: _Optional[float] = ..., step_epsilon: _Optional[float] = ..., step_delta: _Optional[float] = ..., target_epsilon: _Optional[float] = ..., target_delta: _Optional[float] = ..., calibration: _Optional[_Union[Calibration, str]] = ..., accountant: _Optional[str] = ..., max_rounds: _Optional[int] = ..., min_providers: _Optional[int] = ..., model_fingerprint: _Optional[str] = ..., sharing_rule: _Optional[_Union[SharingRule, str]] = ..., max_batch_size: _Optional[int] = ..., learning_rate: _Optional[float] = ..., batches_per_epoch: _Optional[int] = ..., share_encodings: _Optional[_Iterable[_Union[ShareEncoding, str]]] = ..., model_parameters: _Optional[int] = ..., trainable: _Optional[_Iterable[_Union[CoordinateRange, _Mapping]]] = ..., frozen_sha256: _Optional[bytes] = ..., task: _Optional[str] = ..., loss: _Optional[str] = ..., clip_rule: _Optional[_Union[ClipRule, str]] = ..., clip_target_quantile: _Optional[float] = ..., clip_learning_rate: _Optional[float] = ..., count_clip: _Optional[float] = ..., expected_batch_size: _Optional[float] = ..., update_noise_multiplier: _Optional[float] = ..., count_noise_std: _Optional[float] = ..., backend: _Optional[str] = ..., verify_inputs: _Optional[str] = ..., norm_field_modulus: _Optional[int] = ..., norm_bound_units: _Optional[int] = ..., norm_repetitions: _Optional[int] = ..., adjacency: _Optional[str] = ..., local_epochs: _Optional[int] = ..., local_batch_size: _Optional[int] = ..., local_learning_rate: _Optional[float] = ..., local_optimizer: _Optional[str] = ..., clip_decay: _Optional[float] = ..., clip_min: _Optional[float] = ..., noise_schedule: _Optional[_Iterable[_Union[NoisePhase, _Mapping]]] = ..., server_optimizer: _Optional[str] = ..., noise_floor: _Optional[float] = ..., standardize: _Optional[bool] = ..., feature_lo: _Optional[_Iterable[float]] = ..., feature_hi: _Optional[_Iterable[float]] = ..., stats_noise_multiplier: _Optional[float] = ..., stats_scale: _Optional[int] = ..., stats_max_rows: _Optional[int] = ..., security: _Optional[str] = ..., trial_depth: _Optional[int] = ...) -> None: ...

class NoisePhase(_message.Message):
    __slots__ = ("from_release", "noise_multiplier", "sampling_rate", "noise_std_units")
    FROM_RELEASE_FIELD_NUMBER: _ClassVar[int]
    NOISE_MULTIPLIER_FIELD_NUMBER: _ClassVar[int]
    SAMPLING_RATE_FIELD_NUMBER: _ClassVar[int]
    NOISE_STD_UNITS_FIELD_NUMBER: _ClassVar[int]
    from_release: int
    noise_multiplier: float
    sampling_rate: float
    noise_std_units: float
    def __init__(self, from_release: _Optional[int] = ..., noise_multiplier: _Optional[float] = ..., sampling_rate: _Optional[float] = ..., noise_std_units: _Optional[float] = ...) -> None: ...

class CoordinateRange(_message.Message):
    __slots__ = ("start", "length")
    START_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    start: int
    length: int
    def __init__(self, start: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class RoundInfo(_message.Message):
    __slots__ = ("round", "model_version", "model_sha256", "phase", "deadline", "caller_share_accepted", "shares_accepted", "providers_agreed", "epsilon_spent", "latest_model_version", "model_parameters", "failure", "caller_left_out", "releases_counted", "clip_norm", "ledger_head", "ledger_head_releases", "feature_mean", "feature_std")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_SHA256_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_FIELD_NUMBER: _ClassVar[int]
    CALLER_SHARE_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    SHARES_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    PROVIDERS_AGREED_FIELD_NUMBER: _ClassVar[int]
    EPSILON_SPENT_FIELD_NUMBER: _ClassVar[int]
    LATEST_MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    MODEL_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    FAILURE_FIELD_NUMBER: _ClassVar[int]
    CALLER_LEFT_OUT_FIELD_NUMBER: _ClassVar[int]
    RELEASES_COUNTED_FIELD_NUMBER: _ClassVar[int]
    CLIP_NORM_FIELD_NUMBER: _ClassVar[int]
    LEDGER_HEAD_FIELD_NUMBER: _ClassVar[int]
    LEDGER_HEAD_RELEASES_FIELD_NUMBER: _ClassVar[int]
    FEATURE_MEAN_FIELD_NUMBER: _ClassVar[int]
    FEATURE_STD_FIELD_NUMBER: _ClassVar[int]
    round: int
    model_version: int
    model_sha256: bytes
    phase: RoundPhase
    deadline: _timestamp_pb2.Timestamp
    caller_share_accepted: bool
    shares_accepted: int
    providers_agreed: int
    epsilon_spent: float
    latest_model_version: int
    model_parameters: bytes
    failure: str
    caller_left_out: str
    releases_counted: int
    clip_norm: float
    ledger_head: bytes
    ledger_head_releases: int
    feature_mean: _containers.RepeatedScalarFieldContainer[float]
    feature_std: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, round: _Optional[int] = ..., model_version: _Optional[int] = ..., model_sha256: _Optional[bytes] = ..., phase: _Optional[_Union[RoundPhase, str]] = ..., deadline: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., caller_share_accepted: _Optional[bool] = ..., shares_accepted: _Optional[int] = ..., providers_agreed: _Optional[int] = ..., epsilon_spent: _Optional[float] = ..., latest_model_version: _Optional[int] = ..., model_parameters: _Optional[bytes] = ..., failure: _Optional[str] = ..., caller_left_out: _Optional[str] = ..., releases_counted: _Optional[int] = ..., clip_norm: _Optional[float] = ..., ledger_head: _Optional[bytes] = ..., ledger_head_releases: _Optional[int] = ..., feature_mean: _Optional[_Iterable[float]] = ..., feature_std: _Optional[_Iterable[float]] = ...) -> None: ...

class WireLimits(_message.Message):
    __slots__ = ("max_message_bytes", "max_chunk_bytes", "preferred_chunk_bytes")
    MAX_MESSAGE_BYTES_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    PREFERRED_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    max_message_bytes: int
    max_chunk_bytes: int
    preferred_chunk_bytes: int
    def __init__(self, max_message_bytes: _Optional[int] = ..., max_chunk_bytes: _Optional[int] = ..., preferred_chunk_bytes: _Optional[int] = ...) -> None: ...

class HelloRequest(_message.Message):
    __slots__ = ("protocol_version", "software_version", "provider_id")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    software_version: str
    provider_id: str
    def __init__(self, protocol_version: _Optional[int] = ..., software_version: _Optional[str] = ..., provider_id: _Optional[str] = ...) -> None: ...

class ServerInfo(_message.Message):
    __slots__ = ("protocol_version", "software_version", "role", "server_name", "provider_id", "config", "round", "limits")
    PROTOCOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    SOFTWARE_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SERVER_NAME_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    LIMITS_FIELD_NUMBER: _ClassVar[int]
    protocol_version: int
    software_version: str
    role: ServerRole
    server_name: str
    provider_id: str
    config: TrainingConfig
    round: RoundInfo
    limits: WireLimits
    def __init__(self, protocol_version: _Optional[int] = ..., software_version: _Optional[str] = ..., role: _Optional[_Union[ServerRole, str]] = ..., server_name: _Optional[str] = ..., provider_id: _Optional[str] = ..., config: _Optional[_Union[TrainingConfig, _Mapping]] = ..., round: _Optional[_Union[RoundInfo, _Mapping]] = ..., limits: _Optional[_Union[WireLimits, _Mapping]] = ...) -> None: ...

class ModelRequest(_message.Message):
    __slots__ = ("version", "chunk_bytes", "provider_id", "part")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    version: int
    chunk_bytes: int
    provider_id: str
    part: ModelPart
    def __init__(self, version: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., provider_id: _Optional[str] = ..., part: _Optional[_Union[ModelPart, str]] = ...) -> None: ...

class ModelHeader(_message.Message):
    __slots__ = ("run_id", "version", "num_parameters", "sha256", "chunk_bytes", "chunk_count", "model", "published_at", "part")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    NUM_PARAMETERS_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    MODEL_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_AT_FIELD_NUMBER: _ClassVar[int]
    PART_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    version: int
    num_parameters: int
    sha256: bytes
    chunk_bytes: int
    chunk_count: int
    model: str
    published_at: _timestamp_pb2.Timestamp
    part: ModelPart
    def __init__(self, run_id: _Optional[str] = ..., version: _Optional[int] = ..., num_parameters: _Optional[int] = ..., sha256: _Optional[bytes] = ..., chunk_bytes: _Optional[int] = ..., chunk_count: _Optional[int] = ..., model: _Optional[str] = ..., published_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., part: _Optional[_Union[ModelPart, str]] = ...) -> None: ...

class VectorChunk(_message.Message):
    __slots__ = ("index", "data")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    index: int
    data: bytes
    def __init__(self, index: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class ModelChunk(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: ModelHeader
    chunk: VectorChunk
    def __init__(self, header: _Optional[_Union[ModelHeader, _Mapping]] = ..., chunk: _Optional[_Union[VectorChunk, _Mapping]] = ...) -> None: ...

class ShareHeader(_message.Message):
    __slots__ = ("run_id", "round", "server_role", "num_elements", "ring_bits", "chunk_bytes", "chunk_count", "submission_id", "sha256", "provider_id", "compute_seconds", "vector_id", "model_version", "encoding", "norm_blind", "norm_joint_part", "norm_seed")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SERVER_ROLE_FIELD_NUMBER: _ClassVar[int]
    NUM_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    RING_BITS_FIELD_NUMBER: _ClassVar[int]
    CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    CHUNK_COUNT_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    COMPUTE_SECONDS_FIELD_NUMBER: _ClassVar[int]
    VECTOR_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ENCODING_FIELD_NUMBER: _ClassVar[int]
    NORM_BLIND_FIELD_NUMBER: _ClassVar[int]
    NORM_JOINT_PART_FIELD_NUMBER: _ClassVar[int]
    NORM_SEED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round: int
    server_role: ServerRole
    num_elements: int
    ring_bits: int
    chunk_bytes: int
    chunk_count: int
    submission_id: bytes
    sha256: bytes
    provider_id: str
    compute_seconds: float
    vector_id: bytes
    model_version: int
    encoding: ShareEncoding
    norm_blind: bytes
    norm_joint_part: bytes
    norm_seed: bytes
    def __init__(self, run_id: _Optional[str] = ..., round: _Optional[int] = ..., server_role: _Optional[_Union[ServerRole, str]] = ..., num_elements: _Optional[int] = ..., ring_bits: _Optional[int] = ..., chunk_bytes: _Optional[int] = ..., chunk_count: _Optional[int] = ..., submission_id: _Optional[bytes] = ..., sha256: _Optional[bytes] = ..., provider_id: _Optional[str] = ..., compute_seconds: _Optional[float] = ..., vector_id: _Optional[bytes] = ..., model_version: _Optional[int] = ..., encoding: _Optional[_Union[ShareEncoding, str]] = ..., norm_blind: _Optional[bytes] = ..., norm_joint_part: _Optional[bytes] = ..., norm_seed: _Optional[bytes] = ...) -> None: ...

class ShareChunk(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: ShareHeader
    chunk: VectorChunk
    def __init__(self, header: _Optional[_Union[ShareHeader, _Mapping]] = ..., chunk: _Optional[_Union[VectorChunk, _Mapping]] = ...) -> None: ...

class SubmitReceipt(_message.Message):
    __slots__ = ("run_id", "round", "submission_id", "provider_id", "num_elements", "sha256", "accepted_at")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    SUBMISSION_ID_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    NUM_ELEMENTS_FIELD_NUMBER: _ClassVar[int]
    SHA256_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_AT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round: int
    submission_id: bytes
    provider_id: str
    num_elements: int
    sha256: bytes
    accepted_at: _timestamp_pb2.Timestamp
    def __init__(self, run_id: _Optional[str] = ..., round: _Optional[int] = ..., submission_id: _Optional[bytes] = ..., provider_id: _Optional[str] = ..., num_elements: _Optional[int] = ..., sha256: _Optional[bytes] = ..., accepted_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class RoundStatusRequest(_message.Message):
    __slots__ = ("round", "wait_seconds", "after_round", "provider_id", "include_model")
    ROUND_FIELD_NUMBER: _ClassVar[int]
    WAIT_SECONDS_FIELD_NUMBER: _ClassVar[int]
    AFTER_ROUND_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_MODEL_FIELD_NUMBER: _ClassVar[int]
    round: int
    wait_seconds: float
    after_round: int
    provider_id: str
    include_model: bool
    def __init__(self, round: _Optional[int] = ..., wait_seconds: _Optional[float] = ..., after_round: _Optional[int] = ..., provider_id: _Optional[str] = ..., include_model: _Optional[bool] = ...) -> None: ...

class LedgerRequest(_message.Message):
    __slots__ = ("run_id", "from_line", "provider_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_LINE_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    from_line: int
    provider_id: str
    def __init__(self, run_id: _Optional[str] = ..., from_line: _Optional[int] = ..., provider_id: _Optional[str] = ...) -> None: ...

class LedgerReply(_message.Message):
    __slots__ = ("lines", "total_lines")
    LINES_FIELD_NUMBER: _ClassVar[int]
    TOTAL_LINES_FIELD_NUMBER: _ClassVar[int]
    lines: _containers.RepeatedScalarFieldContainer[bytes]
    total_lines: int
    def __init__(self, lines: _Optional[_Iterable[bytes]] = ..., total_lines: _Optional[int] = ...) -> None: ...

class DeclineRequest(_message.Message):
    __slots__ = ("run_id", "reason", "provider_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    PROVIDER_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    provider_id: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ..., provider_id: _Optional[str] = ...) -> None: ...

class DeclineReply(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

"""The chunked RPC messages: :func:`share_messages` / :func:`read_share_header` /
:func:`iter_share_payload` / :func:`read_share_stream` for SubmitShare, :func:`model_messages` /
:func:`read_model_stream` for FetchModel; :func:`check_protocol_version` for Hello and Handshake.

Every header read here is range-checked (:func:`spgc.wire.bounds.check_bounds`) before any of
its numbers is used."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any

import numpy as np

from spgc.wire._generated import aggregation_pb2
from spgc.wire.bounds import MAX_RING_BITS, MIN_RING_BITS, check_bounds
from spgc.wire.chunks import (
    DEFAULT_CHUNK_BYTES,
    DEFAULT_MAX_VECTOR_BYTES,
    MAX_CHUNK_BYTES,
    ChunkReassembler,
    ChunkValidator,
    check_send_chunk_bytes,
    chunk_count,
    field_width,
    iter_vector_chunks,
    little_endian,
    pack_elements,
    packed_width,
)
from spgc.wire.digests import vector_sha256
from spgc.wire.errors import FailedPreconditionError, InvalidArgumentError, StreamEndedEarly
from spgc.wire.identity import MAX_SUBMISSION_ID_BYTES


def check_protocol_version(theirs: int, ours: int, who: str = "client") -> None:
    """Refuse (FailedPreconditionError, naming both) a peer's protocol version other than
    ``ours``; 0 means the peer sent none (proto3's unset), which is refused too."""
    if theirs == ours:
        return
    if theirs == 0:
        raise FailedPreconditionError(
            f"{who} sent no protocol_version; this server speaks protocol version {ours} "
            f"(spgc.v{ours})"
        )
    raise FailedPreconditionError(
        f"{who} speaks protocol version {theirs} (spgc.v{theirs}); this server speaks "
        f"protocol version {ours} (spgc.v{ours})"
    )


def _chunk_of(msg: Any, what: str) -> tuple[int, bytes]:
    """(index, data) of a chunk message after a header; a second header is refused."""
    kind = msg.WhichOneof("kind")
    if kind == "chunk":
        return msg.chunk.index, msg.chunk.data
    if kind == "header":
        raise InvalidArgumentError(f"a second {what} header in the stream")
    raise InvalidArgumentError(f"empty message in the {what} stream")


def _chunks_of(messages: Iterator[Any], what: str) -> Iterator[tuple[int, bytes]]:
    """(index, data) of the chunk messages after a header."""
    for msg in messages:
        yield _chunk_of(msg, what)


# A share's elements as 8-byte uint64 values: UNSPECIFIED is what clients before the field send.
UINT64_ENCODINGS = (
    aggregation_pb2.SHARE_ENCODING_UNSPECIFIED,
    aggregation_pb2.SHARE_ENCODING_UINT64,
)


# What this version's servers accept (TrainingConfig.share_encodings).
ACCEPTED_SHARE_ENCODINGS = (
    aggregation_pb2.SHARE_ENCODING_UINT64,
    aggregation_pb2.SHARE_ENCODING_PACKED,
)


def share_encoding_for(config: aggregation_pb2.TrainingConfig) -> int:
    """The encoding to send a server that announced ``config``: packed where it accepts it."""
    if aggregation_pb2.SHARE_ENCODING_PACKED in config.share_encodings:
        return aggregation_pb2.SHARE_ENCODING_PACKED
    return aggregation_pb2.SHARE_ENCODING_UINT64


def share_payload(
    vec: np.ndarray, ring_bits: int, encoding: int, field_modulus: int | None = None
) -> tuple[np.ndarray, int]:
    """(the share's elements as sent, bytes per element): the little-endian uint64 values, or
    their low ceil(ring_bits / 8) bytes each (SHARE_ENCODING_PACKED, a flat uint8 array), or
    ceil(bit_length(p) / 8) bytes each (SHARE_ENCODING_FIELD, ``field_modulus`` = p).
    ShareHeader.sha256 is the SHA-256 of the first."""
    arr = little_endian(vec)
    if encoding == aggregation_pb2.SHARE_ENCODING_PACKED:
        width = packed_width(ring_bits)
        return pack_elements(arr, width), width
    if encoding == aggregation_pb2.SHARE_ENCODING_FIELD:
        if field_modulus is None:
            raise ValueError("a field share needs the field's modulus")
        width = field_width(field_modulus)
        return pack_elements(arr, width), width
    if encoding in UINT64_ENCODINGS:
        return arr, 8
    raise ValueError(f"unknown share encoding {encoding}")


def share_messages(
    vec: np.ndarray,
    *,
    run_id: str,
    round_number: int,
    server_role: int,
    ring_bits: int,
    submission_id: bytes,
    provider_id: str = "",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    compute_seconds: float = 0.0,
    vector_id: bytes = b"",
    model_version: int | None = None,
    encoding: int = aggregation_pb2.SHARE_ENCODING_UINT64,
    sha256: bytes | None = None,
    field_modulus: int | None = None,
    norm_blind: bytes = b"",
    norm_joint_part: bytes = b"",
    norm_seed: bytes = b"",
) -> Iterator[aggregation_pb2.ShareChunk]:
    """The SubmitShare request stream for a share vector (uint64, values < 2^ring_bits).

    ``server_role``: the ServerRole the share is for. ``provider_id`` only matters to a server
    running with --insecure. ``vector_id``: the same in both halves of one shared vector (the
    servers leave a provider out whose halves differ). ``model_version``: the version the
    gradient was computed on (the server refuses a share of another). ``encoding``:
    SHARE_ENCODING_PACKED sends ceil(ring_bits / 8) bytes per element, to a server that lists it
    in TrainingConfig.share_encodings (``chunk_bytes`` is then rounded down to a multiple of
    that width). ``sha256``: the hash of :func:`share_payload` when the caller has it already
    (it is recomputed otherwise). Verified inputs (docs/CLIENTS.md): SHARE_ENCODING_FIELD with
    ``field_modulus``, ``norm_blind`` and ``norm_joint_part`` to H1; an empty vector with
    ``norm_seed`` and ``norm_joint_part`` to H2. ValueError for a vector that is not a valid
    share.
    """
    arr = little_endian(vec)
    if arr.dtype.kind != "u" or arr.dtype.itemsize != 8:
        raise ValueError(f"a share is a uint64 vector, not {arr.dtype}")
    if not MIN_RING_BITS <= ring_bits <= MAX_RING_BITS:
        raise ValueError(f"ring_bits={ring_bits} is not in {MIN_RING_BITS}..{MAX_RING_BITS}")
    if encoding == aggregation_pb2.SHARE_ENCODING_FIELD:
        if field_modulus is None or (arr.size and int(arr.max()) >= field_modulus):
            raise ValueError("a field share needs its modulus and values below it")
    elif ring_bits < 64 and (arr >> np.uint64(ring_bits)).any():
        raise ValueError(f"share has values outside Z_2^{ring_bits}")
    if not arr.size and len(norm_seed) != 32:
        raise ValueError("only a verified share to H2 (with its 32-byte seed) may be empty")
    if not 1 <= len(submission_id) <= MAX_SUBMISSION_ID_BYTES:
        raise ValueError(f"submission_id must be 1..{MAX_SUBMISSION_ID_BYTES} bytes")
    if len(vector_id) > MAX_SUBMISSION_ID_BYTES:
        raise ValueError(f"vector_id must be 0..{MAX_SUBMISSION_ID_BYTES} bytes")
    payload, width = share_payload(arr, ring_bits, encoding, field_modulus)
    if width != 8:  # a size that suits uint64 values (the server's) rarely suits 3 or 5 bytes
        chunk_bytes -= chunk_bytes % width
    check_send_chunk_bytes(chunk_bytes, width)
    header = aggregation_pb2.ShareHeader(
        run_id=run_id,
        round=round_number,
        server_role=server_role,
        num_elements=len(arr),
        ring_bits=ring_bits,
        chunk_bytes=chunk_bytes,
        chunk_count=chunk_count(payload.nbytes, chunk_bytes),
        submission_id=submission_id,
        sha256=sha256 if sha256 is not None else vector_sha256(payload),
        provider_id=provider_id,
        compute_seconds=compute_seconds,
        vector_id=vector_id,
        encoding=encoding,
        norm_blind=norm_blind,
        norm_joint_part=norm_joint_part,
        norm_seed=norm_seed,
    )
    if model_version is not None:
        header.model_version = model_version
    yield aggregation_pb2.ShareChunk(header=header)
    for i, data in enumerate(iter_vector_chunks(payload, chunk_bytes)):
        yield aggregation_pb2.ShareChunk(chunk=aggregation_pb2.VectorChunk(index=i, data=data))


def share_element_width(
    header: aggregation_pb2.ShareHeader, field_modulus: int | None = None
) -> int:
    """Bytes per element of the share the header announces (8, packed ceil(L / 8), or a field
    element's ceil(bit_length(p) / 8) in a run with verified inputs, ``field_modulus`` = p);
    InvalidArgumentError for an encoding this version or this run does not know."""
    if header.encoding in UINT64_ENCODINGS:
        return 8
    if header.encoding == aggregation_pb2.SHARE_ENCODING_PACKED:
        return packed_width(header.ring_bits)  # ring_bits is checked against its bounds first
    if header.encoding == aggregation_pb2.SHARE_ENCODING_FIELD:
        if field_modulus is None:
            raise InvalidArgumentError("a field share, in a run without verified inputs")
        return field_width(field_modulus)
    raise InvalidArgumentError(f"unknown share encoding {header.encoding}")


def share_encoding_name(header: aggregation_pb2.ShareHeader) -> str:
    """The encoding the header announces, as metrics and logs name it: ``uint64`` (unset
    included), ``packed``, ``field``, or ``seed`` (a verified share to H2)."""
    if header.norm_seed:
        return "seed"
    if header.encoding == aggregation_pb2.SHARE_ENCODING_FIELD:
        return "field"
    return "packed" if header.encoding == aggregation_pb2.SHARE_ENCODING_PACKED else "uint64"


def _share_validator(
    header: aggregation_pb2.ShareHeader,
    max_chunk_bytes: int,
    max_total_bytes: int,
    reassemble: bool,
    field_modulus: int | None = None,
) -> ChunkValidator:
    cls: Any = ChunkReassembler if reassemble else ChunkValidator
    field = header.encoding == aggregation_pb2.SHARE_ENCODING_FIELD
    return cls(
        header.num_elements,
        header.chunk_bytes,
        header.chunk_count,
        itemsize=share_element_width(header, field_modulus),
        max_chunk_bytes=max_chunk_bytes,
        max_total_bytes=max_total_bytes,
        sha256=header.sha256,
        ring_bits=None if field else header.ring_bits,
        modulus=field_modulus if field else None,
        allow_empty=len(header.norm_seed) == 32,
    )


def read_share_header(
    messages: Iterator[aggregation_pb2.ShareChunk],
    *,
    num_elements: int | None = None,
    ring_bits: int | None = None,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
    field_modulus: int | None = None,
) -> aggregation_pb2.ShareHeader:
    """Read and check the first message of a SubmitShare stream; returns the ShareHeader.

    Checks everything the header alone determines: it is a header; every number within its
    bound (spgc.wire.bounds: round at most 2^63 - 1, ring bits 2..64, ...); ring bits and length
    equal ``ring_bits``/``num_elements`` when given; submission id 1..64 bytes; a 32-byte
    SHA-256; chunk size and count consistent and within the limits. Run, round, role and
    identity are the caller's to check (they need the server's state). Raises a
    :class:`WireError` subclass.
    """
    first = next(messages, None)
    if first is None:
        raise StreamEndedEarly("empty stream: the first message must be a ShareHeader")
    if first.WhichOneof("kind") != "header":
        raise InvalidArgumentError("the first message of a share stream must be a ShareHeader")
    header = first.header
    check_bounds(header)
    if ring_bits is not None and header.ring_bits != ring_bits:
        raise InvalidArgumentError(
            f"share is in Z_2^{header.ring_bits}; this run aggregates in Z_2^{ring_bits}"
        )
    if num_elements is not None and header.num_elements != num_elements:
        raise InvalidArgumentError(
            f"share has {header.num_elements:,} values; the model has {num_elements:,} parameters"
        )
    if not 1 <= len(header.submission_id) <= MAX_SUBMISSION_ID_BYTES:
        raise InvalidArgumentError(
            f"submission_id must be 1..{MAX_SUBMISSION_ID_BYTES} bytes, "
            f"got {len(header.submission_id)}"
        )
    if len(header.vector_id) > MAX_SUBMISSION_ID_BYTES:
        raise InvalidArgumentError(
            f"vector_id must be 0..{MAX_SUBMISSION_ID_BYTES} bytes, got {len(header.vector_id)}"
        )
    if len(header.sha256) != 32:
        raise InvalidArgumentError(f"sha256 must be 32 bytes, got {len(header.sha256)}")
    # Which sizes a server needs is the intake's business (servers.intake): 32 bytes to H1,
    # 64 to H2 for the joint part.
    for name, sizes in (
        ("norm_blind", (0, 32)),
        ("norm_joint_part", (0, 32, 64)),
        ("norm_seed", (0, 32)),
    ):
        if len(getattr(header, name)) not in sizes:
            allowed = " or ".join(f"{n} bytes" if n else "empty" for n in sizes)
            raise InvalidArgumentError(f"{name} must be {allowed}")
    if header.num_elements == 0 and len(header.norm_seed) != 32:
        raise InvalidArgumentError("an empty share without a norm_seed")
    _share_validator(header, max_chunk_bytes, max_total_bytes, False, field_modulus)
    return header


def iter_share_payload(
    messages: Iterator[aggregation_pb2.ShareChunk],
    header: aggregation_pb2.ShareHeader,
    *,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
    field_modulus: int | None = None,
) -> Iterator[bytes]:
    """The validated chunk payloads of a share stream whose header was read already, as
    little-endian uint64 values whatever the encoding (packed elements widened).

    Streams (memory O(chunk)): each chunk is yielded once checked (order, length, ring range);
    after the last one the count and SHA-256 are checked, so a consumer must treat the data as
    valid only once the iterator is exhausted without an exception.
    """
    validator = _share_validator(header, max_chunk_bytes, max_total_bytes, False, field_modulus)
    for index, data in _chunks_of(messages, "share"):
        yield validator.check_as_uint64(index, data)
    validator.finish()


async def aiter_share_payload(
    messages: AsyncIterator[aggregation_pb2.ShareChunk],
    header: aggregation_pb2.ShareHeader,
    *,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
    field_modulus: int | None = None,
) -> AsyncIterator[bytes]:
    """:func:`iter_share_payload` of an asyncio server's request stream."""
    validator = _share_validator(header, max_chunk_bytes, max_total_bytes, False, field_modulus)
    async for msg in messages:
        yield validator.check_as_uint64(*_chunk_of(msg, "share"))
    validator.finish()


def read_share_stream(
    messages: Iterator[aggregation_pb2.ShareChunk],
    *,
    check_header: Callable[[aggregation_pb2.ShareHeader], object] | None = None,
    num_elements: int | None = None,
    ring_bits: int | None = None,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
) -> tuple[aggregation_pb2.ShareHeader, np.ndarray]:
    """Read a whole SubmitShare stream into a uint64 vector; returns (header, vector).

    ``check_header`` runs on the header before any chunk is read (raise a :class:`WireError`
    there to refuse, e.g., a replayed round without receiving its payload).
    """
    header = read_share_header(
        messages,
        num_elements=num_elements,
        ring_bits=ring_bits,
        max_chunk_bytes=max_chunk_bytes,
        max_total_bytes=max_total_bytes,
    )
    if check_header is not None:
        check_header(header)
    assembler = _share_validator(header, max_chunk_bytes, max_total_bytes, reassemble=True)
    assert isinstance(assembler, ChunkReassembler)
    for index, data in _chunks_of(messages, "share"):
        assembler.add(index, data)
    return header, assembler.finish()


def model_messages(
    params: np.ndarray,
    *,
    run_id: str,
    version: int,
    model: str = "",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    sha256: bytes | None = None,
    part: int = aggregation_pb2.MODEL_PART_TRAINABLE,
) -> Iterator[aggregation_pb2.ModelChunk]:
    """The FetchModel response stream for a float64 parameter vector.

    ``sha256``: the vector's hash when the caller has it already (it is recomputed otherwise).
    ``part``: which part of the model ``params`` is (ModelHeader.part).
    """
    arr = little_endian(params)
    if arr.dtype != np.dtype("<f8"):
        raise ValueError(f"model parameters travel as float64, not {arr.dtype}")
    check_send_chunk_bytes(chunk_bytes, 8)
    header = aggregation_pb2.ModelHeader(
        run_id=run_id,
        version=version,
        num_parameters=len(arr),
        sha256=sha256 if sha256 is not None else vector_sha256(arr),
        chunk_bytes=chunk_bytes,
        chunk_count=chunk_count(arr.nbytes, chunk_bytes),
        model=model,
        part=part,
    )
    header.published_at.GetCurrentTime()
    yield aggregation_pb2.ModelChunk(header=header)
    for i, data in enumerate(iter_vector_chunks(arr, chunk_bytes)):
        yield aggregation_pb2.ModelChunk(chunk=aggregation_pb2.VectorChunk(index=i, data=data))


#: Largest model a RoundInfo carries inline (RoundInfo.model_parameters), in bytes.
INLINE_MODEL_BYTES = 65536


def inline_model(params: np.ndarray) -> bytes | None:
    """RoundInfo.model_parameters for a float64 model: its little-endian bytes, or None when
    it is larger than :data:`INLINE_MODEL_BYTES` (providers then use FetchModel)."""
    arr = little_endian(params)
    if arr.dtype != np.dtype("<f8"):
        raise ValueError(f"model parameters travel as float64, not {arr.dtype}")
    return arr.tobytes() if arr.nbytes <= INLINE_MODEL_BYTES else None


def read_inline_model(data: bytes, num_parameters: int, sha256: bytes) -> np.ndarray:
    """The model in a RoundInfo.model_parameters, checked against its length and the SHA-256
    the RoundInfo announces; raises :class:`InvalidArgumentError`."""
    if len(data) != 8 * num_parameters or len(data) > INLINE_MODEL_BYTES:
        raise InvalidArgumentError(
            f"inline model of {len(data):,} bytes for {num_parameters:,} parameters"
        )
    params = np.frombuffer(data, dtype="<f8").astype(np.float64)
    if vector_sha256(params) != sha256:
        raise InvalidArgumentError("the inline model does not match the announced SHA-256")
    return params


def read_model_stream(
    messages: Iterable[aggregation_pb2.ModelChunk],
    *,
    version: int | None = None,
    num_parameters: int | None = None,
    max_chunk_bytes: int = MAX_CHUNK_BYTES,
    max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
) -> tuple[aggregation_pb2.ModelHeader, np.ndarray]:
    """Read a FetchModel stream; returns (header, float64 vector), hash verified.

    Raises a :class:`WireError` subclass for a malformed stream, a number out of bounds
    (spgc.wire.bounds) or a version/length other than the expected one.
    """
    it = iter(messages)
    first = next(it, None)
    if first is None or first.WhichOneof("kind") != "header":
        raise InvalidArgumentError("the first message of a model stream must be a ModelHeader")
    header = first.header
    check_bounds(header)
    if version is not None and header.version != version:
        raise FailedPreconditionError(
            f"server sent model version {header.version}, expected {version}"
        )
    if num_parameters is not None and header.num_parameters != num_parameters:
        raise InvalidArgumentError(
            f"model has {header.num_parameters:,} parameters, expected {num_parameters:,}"
        )
    if len(header.sha256) != 32:
        raise InvalidArgumentError(f"sha256 must be 32 bytes, got {len(header.sha256)}")
    assembler = ChunkReassembler(
        header.num_parameters,
        header.chunk_bytes,
        header.chunk_count,
        dtype=np.float64,
        max_chunk_bytes=max_chunk_bytes,
        max_total_bytes=max_total_bytes,
        sha256=header.sha256,
    )
    for index, data in _chunks_of(it, "model"):
        assembler.add(index, data)
    return header, assembler.finish()

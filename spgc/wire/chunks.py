"""Large vectors as chunk streams: :func:`iter_vector_chunks` cuts a vector into chunks,
:class:`ChunkValidator` checks a chunk stream (order, sizes, count, ring range, SHA-256) without
buffering it, :class:`ChunkReassembler` also rebuilds the vector.

Chunk payloads are at most :data:`MAX_CHUNK_BYTES` (1 MiB; also documented in
proto/spgc/v1/aggregation.proto).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator

import numpy as np

from spgc.wire.errors import InvalidArgumentError, ResourceExhaustedError, StreamEndedEarly

#: Largest chunk payload in bytes (131,072 uint64/float64 values).
MAX_CHUNK_BYTES = 1 << 20
#: The chunk size senders use unless told otherwise.
DEFAULT_CHUNK_BYTES = MAX_CHUNK_BYTES
#: Largest whole vector a reader accepts unless told otherwise (1G values of 8 bytes).
DEFAULT_MAX_VECTOR_BYTES = 8 << 30


def little_endian(vec: np.ndarray) -> np.ndarray:
    arr = np.asarray(vec)
    if arr.ndim != 1:
        raise ValueError(f"expected a 1-D vector, got shape {arr.shape}")
    return np.ascontiguousarray(arr.astype(arr.dtype.newbyteorder("<"), copy=False))


def field_width(modulus: int) -> int:
    """Bytes per element of a field share (SHARE_ENCODING_FIELD): ceil(bit_length(p) / 8)."""
    if not 3 <= modulus < 1 << 62:
        raise ValueError(f"field modulus {modulus} is not in 3..2^62 - 1")
    return (modulus.bit_length() + 7) // 8


def packed_width(ring_bits: int) -> int:
    """Bytes per element of a packed share (SHARE_ENCODING_PACKED): ceil(L / 8)."""
    if not 1 <= ring_bits <= 64:
        raise ValueError(f"ring_bits={ring_bits} is not in 1..64")
    return (ring_bits + 7) // 8


def pack_elements(values: np.ndarray, width: int) -> np.ndarray:
    """The low ``width`` little-endian bytes of each uint64 (as one flat uint8 array)."""
    arr = np.ascontiguousarray(values, dtype="<u8")
    return np.ascontiguousarray(arr.view(np.uint8).reshape(-1, 8)[:, :width]).reshape(-1)


def widen_elements(data: bytes, width: int) -> np.ndarray:
    """The inverse of :func:`pack_elements`: ``width``-byte little-endian elements as uint64."""
    if len(data) % width:
        raise ValueError(f"{len(data)} bytes are not a whole number of {width}-byte elements")
    wide = np.zeros((len(data) // width, 8), dtype=np.uint8)
    wide[:, :width] = np.frombuffer(data, dtype=np.uint8).reshape(-1, width)
    return wide.reshape(-1).view("<u8")


def check_send_chunk_bytes(chunk_bytes: int, itemsize: int) -> None:
    if not 0 < chunk_bytes <= MAX_CHUNK_BYTES or chunk_bytes % itemsize:
        raise ValueError(
            f"chunk_bytes={chunk_bytes} must be a positive multiple of {itemsize} "
            f"of at most {MAX_CHUNK_BYTES}"
        )


def chunk_count(total_bytes: int, chunk_bytes: int) -> int:
    """Number of chunks of ``chunk_bytes`` (the last one shorter) that hold ``total_bytes``."""
    if chunk_bytes <= 0:
        raise ValueError("chunk_bytes must be positive")
    return -(-total_bytes // chunk_bytes)


def iter_vector_chunks(vec: np.ndarray, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[bytes]:
    """The vector's little-endian bytes in chunks of ``chunk_bytes`` (the last one shorter).

    ``chunk_bytes`` must be a multiple of the item size and at most :data:`MAX_CHUNK_BYTES`.
    """
    arr = little_endian(vec)
    check_send_chunk_bytes(chunk_bytes, arr.dtype.itemsize)
    view = memoryview(arr).cast("B")
    for start in range(0, len(view), chunk_bytes):
        yield bytes(view[start : start + chunk_bytes])


class ChunkValidator:
    """Checks one streamed vector chunk by chunk, without keeping it.

    The layout is fixed by the header: ``num_elements`` values of ``itemsize`` bytes, in
    ``chunk_count`` chunks of ``chunk_bytes`` (the last one holds the rest). :meth:`check` each
    chunk as it arrives, then :meth:`finish`. Every violation raises a :class:`WireError`:
    InvalidArgumentError for wrong layout, order, length, range or hash; ResourceExhaustedError
    for a chunk or vector above the limits. Layout errors are raised by the constructor, before
    any payload is read.
    """

    def __init__(
        self,
        num_elements: int,
        chunk_bytes: int,
        chunk_count: int | None = None,
        *,
        itemsize: int = 8,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
        max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
        sha256: bytes | None = None,
        ring_bits: int | None = None,
        modulus: int | None = None,
        allow_empty: bool = False,
    ) -> None:
        if num_elements < (0 if allow_empty else 1):
            raise InvalidArgumentError(f"vector length {num_elements} (must be at least 1)")
        total = num_elements * itemsize
        if total > max_total_bytes:
            raise ResourceExhaustedError(
                f"vector of {num_elements:,} values ({total:,} bytes) exceeds the limit of "
                f"{max_total_bytes:,} bytes"
            )
        if chunk_bytes <= 0 or chunk_bytes % itemsize:
            raise InvalidArgumentError(
                f"chunk_bytes={chunk_bytes} is not a positive multiple of {itemsize}"
            )
        if chunk_bytes > max_chunk_bytes:
            raise ResourceExhaustedError(
                f"chunk_bytes={chunk_bytes:,} exceeds the limit of {max_chunk_bytes:,}"
            )
        expected = -(-total // chunk_bytes)
        if chunk_count is not None and chunk_count != expected:
            raise InvalidArgumentError(
                f"chunk_count={chunk_count} does not match {num_elements:,} values in chunks of "
                f"{chunk_bytes:,} bytes (expected {expected})"
            )
        if sha256 is not None and len(sha256) != 32:
            raise InvalidArgumentError(f"sha256 must be 32 bytes, got {len(sha256)}")
        if ring_bits is not None and not 1 <= ring_bits <= 64:
            raise InvalidArgumentError(f"ring_bits={ring_bits} is not in 1..64")
        self.num_elements = num_elements
        self.itemsize = itemsize
        self.chunk_bytes = chunk_bytes
        self.chunk_count = expected
        self.total_bytes = total
        self.max_chunk_bytes = max_chunk_bytes
        self.ring_bits = ring_bits
        self.modulus = modulus  # field elements (verified inputs): each must be below it
        self._expected_sha256 = sha256
        self._hash = hashlib.sha256()
        self.next_index = 0
        self.received_bytes = 0
        self.finished = False

    def elements(self, data: bytes) -> np.ndarray:
        """A checked chunk's elements as little-endian uint64 (packed ones widened)."""
        if self.itemsize == 8:
            return np.frombuffer(data, dtype="<u8")
        return widen_elements(data, self.itemsize)

    def expected_length(self, index: int) -> int:
        """Payload bytes chunk ``index`` must carry."""
        if index < self.chunk_count - 1:
            return self.chunk_bytes
        return self.total_bytes - self.chunk_bytes * (self.chunk_count - 1)

    def check(self, index: int, data: bytes) -> bytes:
        """Validate the next chunk; returns ``data`` (for streaming it on)."""
        self._check(index, data)
        return data

    def check_as_uint64(self, index: int, data: bytes) -> bytes:
        """Validate the next chunk; returns it as little-endian uint64 values (packed elements
        widened, once: the range check's widening is reused)."""
        values = self._check(index, data)
        if self.itemsize == 8:
            return data
        return (values if values is not None else self.elements(data)).tobytes()

    def _check(self, index: int, data: bytes) -> np.ndarray | None:
        """The checks of :meth:`check`; returns the elements when the range check read them."""
        if self.finished:
            raise InvalidArgumentError("chunk after the end of the stream")
        if index >= self.chunk_count:
            raise InvalidArgumentError(
                f"extra chunk {index}: the header announced {self.chunk_count} chunk(s)"
            )
        if index != self.next_index:
            raise InvalidArgumentError(
                f"chunk {index} out of order: expected chunk {self.next_index}"
            )
        n = len(data)
        if n > self.max_chunk_bytes:
            raise ResourceExhaustedError(
                f"chunk {index} of {n:,} bytes exceeds the limit of {self.max_chunk_bytes:,}"
            )
        want = self.expected_length(index)
        if n != want:
            raise InvalidArgumentError(
                f"chunk {index} has {n:,} bytes; expected {want:,} "
                f"({self.num_elements:,} values in chunks of {self.chunk_bytes:,} bytes)"
            )
        values = None
        if self.ring_bits is not None and self.ring_bits < 64:
            values = self.elements(data)
            high = values >> np.uint64(self.ring_bits)
            if high.any():
                pos = int(np.flatnonzero(high)[0])
                element = index * (self.chunk_bytes // self.itemsize) + pos
                raise InvalidArgumentError(
                    f"element {element:,} = {int(values[pos])} is outside Z_2^{self.ring_bits}"
                )
        if self.modulus is not None:
            values = self.elements(data) if values is None else values
            over = values >= np.uint64(self.modulus)
            if over.any():
                pos = int(np.flatnonzero(over)[0])
                element = index * (self.chunk_bytes // self.itemsize) + pos
                raise InvalidArgumentError(
                    f"element {element:,} = {int(values[pos])} is outside the field "
                    f"(p = {self.modulus})"
                )
        self._hash.update(data)
        self.next_index += 1
        self.received_bytes += n
        return values

    def finish(self) -> bytes:
        """Check that the stream is complete (and the hash, if announced); returns the SHA-256."""
        if self.next_index != self.chunk_count:
            raise StreamEndedEarly(
                f"stream ended after {self.next_index} of {self.chunk_count} chunk(s) "
                f"({self.received_bytes:,} of {self.total_bytes:,} bytes)"
            )
        digest = self._hash.digest()
        if self._expected_sha256 is not None and digest != self._expected_sha256:
            raise InvalidArgumentError("SHA-256 of the received vector does not match the header's")
        self.finished = True
        return digest


class ChunkReassembler(ChunkValidator):
    """A :class:`ChunkValidator` that also rebuilds the vector (``dtype``: uint64 or float64).

    Allocates the whole vector when constructed, i.e. after the layout has been validated
    against the limits. :meth:`finish` returns it in native byte order.
    """

    def __init__(
        self,
        num_elements: int,
        chunk_bytes: int,
        chunk_count: int | None = None,
        *,
        dtype: np.dtype | type = np.uint64,
        itemsize: int = 8,
        max_chunk_bytes: int = MAX_CHUNK_BYTES,
        max_total_bytes: int = DEFAULT_MAX_VECTOR_BYTES,
        sha256: bytes | None = None,
        ring_bits: int | None = None,
        modulus: int | None = None,
        allow_empty: bool = False,
    ) -> None:
        dt = np.dtype(dtype)
        if dt.kind not in "uf" or dt.itemsize != 8:
            raise ValueError(f"dtype must be uint64 or float64, not {dt}")
        if ring_bits is not None and dt.kind != "u":
            raise ValueError("ring_bits applies to uint64 vectors only")
        if itemsize != 8 and dt.kind != "u":
            raise ValueError("packed elements (itemsize < 8) are uint64 shares only")
        super().__init__(
            num_elements,
            chunk_bytes,
            chunk_count,
            itemsize=itemsize,
            max_chunk_bytes=max_chunk_bytes,
            max_total_bytes=max_total_bytes,
            sha256=sha256,
            ring_bits=ring_bits,
            modulus=modulus,
            allow_empty=allow_empty,
        )
        self._array = np.empty(num_elements, dtype=dt.newbyteorder("<"))
        self._bytes = memoryview(self._array).cast("B")

    def add(self, index: int, data: bytes) -> None:
        """Validate the next chunk and store it (packed elements widened to 8 bytes)."""
        wide = self.check_as_uint64(index, data)
        start = index * (self.chunk_bytes // self.itemsize) * 8
        self._bytes[start : start + len(wide)] = wide

    def finish(self) -> np.ndarray:  # type: ignore[override]
        """The complete vector (raises like :meth:`ChunkValidator.finish`)."""
        super().finish()
        self._bytes.release()
        return self._array.astype(self._array.dtype.newbyteorder("="), copy=False)

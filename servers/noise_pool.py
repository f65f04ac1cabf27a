"""Preprocessed noise (mode ``preprocessed``): additive shares of discrete-Gaussian noise made
before the rounds, kept in a pool on each server's disk, every sample used exactly once.

Production of one block of n samples (H1 garbler, H2 evaluator, over the data link): the
sampler's rejection rounds (:func:`servers.gc_party.run_sampler`, fresh 32-byte seeds on both
servers) leave each accepted noise z as kept labels; the share circuit
(:func:`servers.spgc_circuit.noise_share_circuit`) adds H1's mask r (L bits from ``os.urandom``,
a garbler input the evaluator never learns) and reveals u = (z + r) mod 2^L to H2 only. H1
stores -r mod 2^L, H2 stores u, so the two shares add up to z in Z_{2^L} while each alone is
uniform: neither server learns anything about z (the ABY Yao-to-arithmetic step). A block is
split over the data link's lanes, or over the servers' Ray worker pairs (``workers: K``), in
contiguous ranges; noise is addressed by sample index, so the block is the same for any split.

Online, per round: each server adds its next d samples to its sum of shares and the two
exchange one ring element per coordinate (:func:`servers.coordinator.dng_exchange`):
Y = (A1 - r) - (A2 - u) = S + z. No circuit runs in the round.

Storage (:class:`NoisePool`, one directory per server, mode 0700, files 0600)::

    pool.json               file format, parameters the samples were made for (sigma, L, ...)
    block-00000007.bin      n little-endian uint64 shares; used ones overwritten with zeros
    block-00000007.sums     SHA-256 of each chunk of CHUNK_SAMPLES samples, 32 bytes a chunk
    block-00000007.json     {"index", "block_id", "count", "chunk_samples"}: the commit record,
                            with both servers' "seed_commitments" under security: malicious
    cursor.json             {"block", "offset"}: the first unused sample
    consumed.log            one JSON line per consumed run of samples (round, block, offset, count)

A block is written .bin, .sums, then .json (each atomically: temporary file, fsync, rename); a
.bin or .sums without its .json was never committed and is removed at start. A read hashes only
the chunks it touches, once per process.

Every sample is used once and then destroyed, so a later compromise of the disk does not reveal
the noise of released rounds. Taking samples: (1) the cursor is written (fsync, atomic rename)
before any sample it covers is used, so a crash can waste samples but never hand the same ones
out twice, then consumed.log; (2) the chunk now holding the cursor gets, in place in .sums, the
hash of its content with the used prefix zeroed, and chunks wholly used get a zero entry (fsync);
(3) the used samples are overwritten with zeros in place in .bin (fsync). Blocks wholly used are
uncommitted (.json removed), overwritten with zeros and deleted. A crash between these steps
leaves used samples on disk and, for the cursor's chunk, the old or the new hash (one aligned
32-byte write): on start that chunk is accepted with either hash and steps (2) and (3) are
finished before the pool is used, so after any restart no used sample remains. Chunks wholly
before the cursor are never checked; chunks after it must match their hash exactly.

Both servers hold the same blocks (index and H1's random 16-byte id); :meth:`NoisePool.reconcile`
keeps the blocks both hold and moves both cursors to the later one after a restart (the samples
the move skips are destroyed like used ones).
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from garbled_core.discrete_gaussian import DEFAULT_DISTANCE_LOG2, DEFAULT_SCHEDULE, derive_params
from spgc.common.durable import write_atomically
from spgc.common.lanes import lane_ranges, run_lanes
from spgc.privacy.seed_proof import SeedBinding
from spgc.servers.gc_party import claim_seed, merge_part_infos, resolve_lanes
from spgc.servers.spgc_circuit import check_ring_bits, noise_share_circuit
from spgc.wire.digests import POOL_BLOCK_ID_BYTES

__all__ = [
    "BLOCK_ID_BYTES",
    "CHUNK_SAMPLES",
    "NoisePool",
    "PoolBlock",
    "PoolError",
    "PoolExhaustedError",
    "PoolSlice",
    "produce_noise_shares",
    "reconcile",
]

BLOCK_ID_BYTES = POOL_BLOCK_ID_BYTES  # H1's random id of a block
_FORMAT = 2  # 2: per-chunk hashes in .sums, used samples zeroed (1: one hash per block)
MAX_BLOCK_SAMPLES = 1 << 24  # 128 MiB of shares per block file
CHUNK_SAMPLES = 1024  # samples per hashed chunk: a read checks 8 KiB pieces, not the whole block
_DIGEST = 32  # bytes of one chunk's SHA-256 in a .sums file
_ZEROS = bytes(1 << 20)


class PoolError(RuntimeError):
    """The noise pool cannot be used as asked (parameters, positions, files)."""


class PoolExhaustedError(PoolError):
    """Fewer unused samples than a round needs (never answered with less noise)."""


def produce_noise_shares(
    role: str,
    link: Any,
    n: int,
    sigma_units: float,
    ring_bits: int,
    seed: bytes,
    *,
    distance_log2: float = DEFAULT_DISTANCE_LOG2,
    schedule: Sequence[int] = DEFAULT_SCHEDULE,
    field_modulus: int | None = None,
    seed_binding: SeedBinding | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """One server's side of producing ``n`` noise samples as additive shares in Z_{2^L} (with
    ``field_modulus`` p, verified inputs: in F_p, the sums being field shares).

    ``role`` "garbler" (H1) or "evaluator" (H2); ``link`` a :class:`servers.gc_party.PartyLink`
    (its lanes, or its Ray worker pairs when it has them, each make a contiguous range of the
    block: :func:`servers.gc_party.noise_shares_range`), a list of lanes, or a bare channel;
    ``seed`` this server's fresh 32-byte sampler seed (refused if used before). Returns (shares,
    counters): H1's shares are -r mod 2^L, H2's u = z + r mod 2^L, uint64; their sum is the
    noise the plaintext sampler gives for the same two seeds, whatever the number of lanes
    (noise is addressed by sample index). ``seed_binding`` (security: malicious; both servers
    pass one or neither): each lane first proves ``seed`` against this server's commitment and
    checks the peer's (:class:`spgc.privacy.seed_proof.SeedProofError` on a mismatch), and
    every trial reads the two proved seed streams.
    """
    ring_bits = check_ring_bits(ring_bits)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    lanes = resolve_lanes(role, link)
    params = derive_params(sigma_units, distance_log2)
    # Refuses a ring too small, before a byte.
    noise_share_circuit(ring_bits, params.noise_bits, field_modulus=field_modulus)
    start = time.perf_counter()
    claim_seed(seed)  # once for all lanes
    ranges = lane_ranges(n, len(lanes), getattr(lanes[0], "range_align", 1))

    def lane(i: int) -> Any:
        lo, hi = ranges[i]
        return lambda: lanes[i].noise_shares_range(
            role=role, n=hi - lo, first_coordinate=lo, seed=seed, params=params,
            ring_bits=ring_bits, schedule=schedule, field_modulus=field_modulus,
            seed_binding=seed_binding,
        )  # fmt: skip

    parts = run_lanes(
        [lane(i) for i in range(len(lanes))], on_failure=lambda i: lanes[i].interrupt()
    )
    shares = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.uint64)
    info: dict[str, Any] = {"lanes": len(lanes)}
    info.update(merge_part_infos([p[1] for p in parts]))
    info["samples"] = n
    info["seconds"] = time.perf_counter() - start
    return shares, info


# ------------------------------------------------------------------------------ storage


@dataclass(frozen=True)
class PoolBlock:
    """A stored block: position in the pool, H1's random id, sample count."""

    index: int
    block_id: bytes
    count: int


@dataclass(frozen=True)
class PoolSlice:
    """d consecutive samples from (block_index, offset); block_id names the first block."""

    block_index: int
    block_id: bytes
    offset: int
    count: int


def reconcile(
    mine: tuple[tuple[int, int], list[PoolBlock]],
    theirs: tuple[tuple[int, int], list[PoolBlock]],
) -> tuple[tuple[int, int], list[PoolBlock]]:
    """The pool both servers keep after a restart: the later of the two cursors and the blocks
    both hold (same index, id and count) from it on. The same on both sides whatever the order
    of the arguments. Samples before the later cursor may have been used by one side: skipped."""
    cursor = max(mine[0], theirs[0])
    theirs_set = set(theirs[1])
    common = [b for b in mine[1] if b in theirs_set and b.index >= cursor[0]]
    common.sort(key=lambda b: b.index)
    if not common or common[0].index != cursor[0]:
        # The cursor's own block is not held by both: start at the next common block.
        cursor = (common[0].index, 0) if common else (max(cursor[0], _next(mine, theirs)), 0)
    return cursor, common


def _next(*pools: tuple[tuple[int, int], list[PoolBlock]]) -> int:
    return max([c[0] for c, _ in pools] + [b.index + 1 for _, bl in pools for b in bl])


def _digest(raw: bytes) -> bytes:
    return hashlib.sha256(raw).digest()


def _pread(fd: int, size: int, pos: int) -> bytes:
    out = bytearray()
    while len(out) < size:
        got = os.pread(fd, size - len(out), pos + len(out))
        if not got:
            break
        out += got
    return bytes(out)


def _pwrite(fd: int, data: bytes | memoryview, pos: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, pos)
        view, pos = view[n:], pos + n


def _pwrite_zeros(fd: int, pos: int, size: int) -> None:
    while size > 0:
        n = min(size, len(_ZEROS))
        _pwrite(fd, memoryview(_ZEROS)[:n], pos)
        pos, size = pos + n, size - n


def _is_zero(fd: int, pos: int, size: int) -> bool:
    """Whether bytes [pos, pos + size) of the file are all zero (read in 1 MiB pieces)."""
    while size > 0:
        n = min(size, len(_ZEROS))
        if _pread(fd, n, pos) != _ZEROS[:n]:
            return False
        pos, size = pos + n, size - n
    return True


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _shred(path: Path) -> None:
    """Overwrite a file with zeros (fsync), then delete it: a block's samples may have been used."""
    try:
        fd = os.open(path, os.O_WRONLY)
    except FileNotFoundError:
        return
    try:
        _pwrite_zeros(fd, 0, os.fstat(fd).st_size)
        os.fsync(fd)
    finally:
        os.close(fd)
    path.unlink(missing_ok=True)


class NoisePool:
    """One server's pool of noise shares (see the module docstring for the layout).

    Thread-safe: production adds blocks in one thread while a round takes samples in another
    (each public method holds the pool's lock).
    """

    def __init__(
        self,
        directory: Path,
        role: str,
        sigma_units: float,
        ring_bits: int,
        distance_log2: float = DEFAULT_DISTANCE_LOG2,
        field_modulus: int | None = None,
    ) -> None:
        if role not in ("h1", "h2"):
            raise ValueError(f"role must be 'h1' or 'h2', got {role!r}")
        self.dir = Path(directory)
        self.role = role
        self.sigma_units = float(sigma_units)
        self.ring_bits = check_ring_bits(ring_bits)
        # Verified inputs: the shares are mod this prime (spgc.protocol.norm_proof), not mod 2^L.
        self.field_modulus = field_modulus
        self.distance_log2 = float(distance_log2)
        self.noise_bits = derive_params(self.sigma_units, self.distance_log2).noise_bits
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.chmod(0o700)  # the shares are secrets of this server
        self._check_meta()
        self.blocks: list[PoolBlock] = []
        self.cursor = (0, 0)
        self._next_index = 0
        self._verified: dict[int, set[int]] = {}  # block index -> chunks hashed by this process
        self._lock = threading.RLock()
        self._load()

    # ------------------------------------------------------------------ files

    def _meta(self) -> dict[str, Any]:
        return {
            "format": _FORMAT,
            "role": self.role,
            "sigma_units": self.sigma_units,
            "ring_bits": self.ring_bits,
            "distance_log2": self.distance_log2,
            "noise_bits": self.noise_bits,
            # only with verified inputs: a ring pool's meta is what it always was
            **({} if self.field_modulus is None else {"field_modulus": self.field_modulus}),
        }

    def _check_meta(self) -> None:
        path = self.dir / "pool.json"
        want = self._meta()
        if not path.exists():
            write_atomically(path, json.dumps(want, sort_keys=True).encode())
            return
        have = json.loads(path.read_text())
        if have.get("format") != _FORMAT:
            raise PoolError(
                f"the noise pool in {self.dir} has file format {have.get('format')!r}; this "
                f"version reads format {_FORMAT} (per-chunk hashes, used samples zeroed on "
                "disk): remove that directory (its unused samples are lost) and fill the pool "
                "again"
            )
        diff = [k for k in want if have.get(k) != want[k]]
        if diff:
            raise PoolError(
                f"the noise pool in {self.dir} was made for "
                + ", ".join(f"{k}={have.get(k)!r}" for k in diff)
                + "; this run needs "
                + ", ".join(f"{k}={want[k]!r}" for k in diff)
                + ": point pool_dir elsewhere or remove that directory"
            )

    def _bin(self, index: int) -> Path:
        return self.dir / f"block-{index:08d}.bin"

    def _sums(self, index: int) -> Path:
        return self.dir / f"block-{index:08d}.sums"

    def _json(self, index: int) -> Path:
        return self.dir / f"block-{index:08d}.json"

    def _load(self) -> None:
        cursor_path = self.dir / "cursor.json"
        if cursor_path.exists():
            c = json.loads(cursor_path.read_text())
            self.cursor = (int(c["block"]), int(c["offset"]))
        for leftover in self.dir.glob("*.tmp"):
            leftover.unlink()  # a write a crash interrupted: never committed
        blocks = []
        for path in sorted(self.dir.glob("block-*.json")):
            meta = json.loads(path.read_text())
            if meta.get("chunk_samples") != CHUNK_SAMPLES:
                raise PoolError(
                    f"noise pool block {path} has chunk_samples={meta.get('chunk_samples')!r}, "
                    f"this version uses {CHUNK_SAMPLES}: remove the directory {self.dir}"
                )
            block = PoolBlock(
                int(meta["index"]), bytes.fromhex(meta["block_id"]), int(meta["count"])
            )
            data, sums = self._bin(block.index), self._sums(block.index)
            if not data.exists() or data.stat().st_size != 8 * block.count:
                raise PoolError(f"noise pool block {data} is missing or truncated")
            if not sums.exists() or sums.stat().st_size != _DIGEST * _chunks(block.count):
                raise PoolError(f"noise pool block {sums} is missing or truncated")
            blocks.append(block)
        # data whose commit record never landed, or whose deletion a crash interrupted (the
        # .json goes first): may hold used samples, so overwritten before it goes
        for path in self.dir.glob("block-*.bin"):
            if not self._json(int(path.stem.split("-")[1])).exists():
                _shred(path)
        for path in self.dir.glob("block-*.sums"):
            if not self._json(int(path.stem.split("-")[1])).exists():
                path.unlink()
        self.blocks = sorted(blocks, key=lambda b: b.index)
        self._next_index = _next((self.cursor, self.blocks))
        self._drop_used()
        self._finish_scrub()

    def _save_cursor(self) -> None:
        data = json.dumps({"block": self.cursor[0], "offset": self.cursor[1]}).encode()
        write_atomically(self.dir / "cursor.json", data)

    def _delete(self, block: PoolBlock) -> None:
        # Uncommit first (durably): a crash before the data is gone leaves a .bin without its
        # .json, which _load overwrites and deletes.
        self._json(block.index).unlink(missing_ok=True)
        _fsync_dir(self.dir)
        _shred(self._bin(block.index))
        self._sums(block.index).unlink(missing_ok=True)
        self._verified.pop(block.index, None)

    def _drop_used(self) -> None:
        """Delete blocks wholly before the cursor (and an exhausted cursor block)."""
        keep = []
        for b in self.blocks:
            used = b.index < self.cursor[0] or (
                b.index == self.cursor[0] and self.cursor[1] >= b.count
            )
            if used:
                self._delete(b)
            else:
                keep.append(b)
        self.blocks = keep
        if self.blocks and self.cursor < (self.blocks[0].index, 0):
            self.cursor = (self.blocks[0].index, 0)

    def _cursor_block(self) -> PoolBlock | None:
        return next((b for b in self.blocks if b.index == self.cursor[0]), None)

    def _corrupt(self, block: PoolBlock, chunk: int) -> PoolError:
        return PoolError(
            f"noise pool block {self._bin(block.index)} is corrupt (chunk {chunk} sha256 mismatch)"
        )

    def _scrub(self, block: PoolBlock, start: int, end: int) -> None:
        """Overwrite samples [start, end) of ``block`` with zeros: the durable cursor is at
        ``end`` in this kept block, so they were used (or skipped) and must not stay on disk.

        The hash of the chunk holding the cursor is replaced (fsync) BEFORE its data changes:
        a crash in between leaves the new hash over old data, which _load accepts and finishes.
        """
        if end <= start:
            return
        first, last = start // CHUNK_SAMPLES, end // CHUNK_SAMPLES
        cut = end - last * CHUNK_SAMPLES  # used samples of the cursor's chunk
        # the cursor's chunk is zeroed from its start, as its new hash says
        zero_from = min(start, last * CHUNK_SAMPLES) if cut else start
        bad = None
        bin_fd = os.open(self._bin(block.index), os.O_RDWR)
        try:
            sums_fd = os.open(self._sums(block.index), os.O_RDWR)
            try:
                if cut:
                    lo = last * CHUNK_SAMPLES
                    hi = min(block.count, lo + CHUNK_SAMPLES)
                    raw = _pread(bin_fd, 8 * (hi - lo), 8 * lo)
                    new = bytes(8 * cut) + raw[8 * cut :]
                    if new != raw:
                        stored = _pread(sums_fd, _DIGEST, _DIGEST * last)
                        if stored == _digest(raw):
                            _pwrite(sums_fd, _digest(new), _DIGEST * last)
                        elif stored != _digest(new):
                            bad = last  # still destroy the used samples, then refuse
                # wholly used chunks: their hash is never checked again
                _pwrite_zeros(sums_fd, _DIGEST * first, _DIGEST * (last - first))
                os.fsync(sums_fd)
            finally:
                os.close(sums_fd)
            _pwrite_zeros(bin_fd, 8 * zero_from, 8 * (end - zero_from))
            os.fsync(bin_fd)
        finally:
            os.close(bin_fd)
        self._verified.get(block.index, set()).difference_update(range(first, last + 1))
        if bad is not None:
            raise self._corrupt(block, bad)

    def _finish_scrub(self) -> None:
        """At start: destroy what the durable cursor says was used but a crash left on disk
        (samples before the cursor in its block, or their .sums entries)."""
        block, end = self._cursor_block(), self.cursor[1]
        if block is None or end == 0:
            return
        whole = end // CHUNK_SAMPLES
        with self._bin(block.index).open("rb") as data, self._sums(block.index).open("rb") as sums:
            clean = _is_zero(data.fileno(), 0, 8 * end) and _is_zero(
                sums.fileno(), 0, _DIGEST * whole
            )
        if not clean:
            self._scrub(block, 0, end)

    # ------------------------------------------------------------------ queries

    @property
    def available(self) -> int:
        """Unused samples."""
        with self._lock:
            return sum(
                b.count - (self.cursor[1] if b.index == self.cursor[0] else 0) for b in self.blocks
            )

    @property
    def next_index(self) -> int:
        """The index the next produced block gets."""
        return self._next_index

    def state(self) -> tuple[tuple[int, int], list[PoolBlock]]:
        """(cursor, blocks held): what :func:`reconcile` compares."""
        with self._lock:
            return self.cursor, list(self.blocks)

    def position(self, count: int) -> PoolSlice:
        """The slice the next ``count`` samples would be (PoolExhaustedError if too few)."""
        with self._lock:
            if count > self.available:
                raise PoolExhaustedError(
                    f"the noise pool holds {self.available} unused samples; {count} are needed"
                )
            if not self.blocks:
                return PoolSlice(self._next_index, b"", 0, 0)
            first = self.blocks[0]
            return PoolSlice(first.index, first.block_id, self.cursor[1], count)

    # ------------------------------------------------------------------ changes

    def add_block(
        self,
        index: int,
        block_id: bytes,
        shares: np.ndarray,
        seed_commitments: dict[str, bytes] | None = None,
    ) -> PoolBlock:
        """Store a produced block. Its index must come after every block held and the cursor
        (H1 numbers the blocks; after a reconciliation H2 may have skipped an orphan's index).
        ``seed_commitments`` (security: malicious): both servers' proved seed commitments of
        the run, by role ("h1", "h2"), kept in the block's commit record for an audit.
        The files are written without the pool's lock (a round may take samples meanwhile);
        one thread adds blocks."""
        self._check_order(index)
        if len(block_id) != BLOCK_ID_BYTES:
            raise PoolError(f"a block id has {BLOCK_ID_BYTES} bytes, got {len(block_id)}")
        shares = np.ascontiguousarray(shares, dtype=np.uint64)
        if not 1 <= len(shares) <= MAX_BLOCK_SAMPLES:
            raise PoolError(f"a block holds 1..{MAX_BLOCK_SAMPLES} samples, got {len(shares)}")
        data = shares.astype("<u8").tobytes()
        step = 8 * CHUNK_SAMPLES
        sums = b"".join(_digest(data[at : at + step]) for at in range(0, len(data), step))
        write_atomically(self._bin(index), data)
        write_atomically(self._sums(index), sums)
        meta = {
            "index": index,
            "block_id": block_id.hex(),
            "count": len(shares),
            "chunk_samples": CHUNK_SAMPLES,
        }
        if seed_commitments:
            meta["seed_commitments"] = {k: v.hex() for k, v in sorted(seed_commitments.items())}
        write_atomically(self._json(index), json.dumps(meta, sort_keys=True).encode())
        block = PoolBlock(index, bytes(block_id), len(shares))
        with self._lock:
            self._check_order(index)
            self.blocks.append(block)
            self._verified[index] = set(range(_chunks(len(shares))))  # hashed from these bytes
            self._next_index = index + 1
            if self.cursor < (self.blocks[0].index, 0):
                # The pool was used up to the end of its last block (deleted since): the next
                # sample is this block's first. Nothing is skipped, so the durable cursor,
                # which is before it, stays as it is until the next take.
                self.cursor = (self.blocks[0].index, 0)
        return block

    def _check_order(self, index: int) -> None:
        with self._lock:
            last = self.blocks[-1].index if self.blocks else -1
            if index <= last or index < self.cursor[0]:
                raise PoolError(
                    f"block {index} out of order: the pool holds blocks up to {last} and its "
                    f"cursor is in block {self.cursor[0]}"
                )

    def _read(self, block: PoolBlock, start: int, count: int) -> np.ndarray:
        """Samples [start, start + count) of ``block``, after checking the chunks they lie in.
        The cursor's chunk may hold its old hash or the one with its used prefix zeroed."""
        if count <= 0:
            return np.zeros(0, dtype=np.uint64)
        first, last = start // CHUNK_SAMPLES, (start + count - 1) // CHUNK_SAMPLES
        lo = first * CHUNK_SAMPLES
        hi = min(block.count, (last + 1) * CHUNK_SAMPLES)
        with self._bin(block.index).open("rb") as f:
            raw = _pread(f.fileno(), 8 * (hi - lo), 8 * lo)
        verified = self._verified.setdefault(block.index, set())
        todo = [c for c in range(first, last + 1) if c not in verified]
        if todo:
            with self._sums(block.index).open("rb") as f:
                sums = _pread(f.fileno(), _DIGEST * (last + 1 - first), _DIGEST * first)
            for c in todo:
                at = c * CHUNK_SAMPLES
                piece = raw[8 * (at - lo) : 8 * (min(hi, at + CHUNK_SAMPLES) - lo)]
                stored = sums[_DIGEST * (c - first) : _DIGEST * (c + 1 - first)]
                cut = 0
                if block.index == self.cursor[0] and at < self.cursor[1] < at + CHUNK_SAMPLES:
                    cut = self.cursor[1] - at
                ok = stored == _digest(piece) or (
                    cut > 0 and stored == _digest(bytes(8 * cut) + piece[8 * cut :])
                )
                if not ok:
                    raise self._corrupt(block, c)
                verified.add(c)
        values = np.frombuffer(raw, dtype="<u8")[start - lo : start - lo + count]
        return values.astype(np.uint64)

    def _destroy_used(self, since: tuple[int, int]) -> None:
        """Delete the blocks wholly before the cursor and zero the samples of the cursor's block
        between ``since`` (the cursor before the move) and the cursor."""
        self._drop_used()
        block = self._cursor_block()
        if block is not None:
            self._scrub(block, since[1] if since[0] == block.index else 0, self.cursor[1])

    def take(self, piece: PoolSlice, round_number: int) -> np.ndarray:
        """The samples of ``piece`` (which must be :meth:`position` of its count): the cursor
        moves past them on disk BEFORE they are returned, so they are never handed out again,
        and they are overwritten with zeros on disk before this returns."""
        with self._lock:
            return self._take(piece, round_number)

    def _take(self, piece: PoolSlice, round_number: int) -> np.ndarray:
        expected = self.position(piece.count)
        if piece != expected:
            raise PoolError(
                f"noise pool positions differ: asked for block {piece.block_index} offset "
                f"{piece.offset} (id {piece.block_id.hex()[:8]}), this server's next samples are "
                f"block {expected.block_index} offset {expected.offset} "
                f"(id {expected.block_id.hex()[:8]})"
            )
        parts, records = [], []
        need, offset = piece.count, self.cursor[1]
        before = cursor = self.cursor
        for b in self.blocks:
            if need == 0:
                break
            n = min(need, b.count - offset)
            parts.append(self._read(b, offset, n))
            records.append({"round": round_number, "block": b.index, "offset": offset, "count": n})
            need -= n
            cursor = (b.index, offset + n)
            offset = 0
        if need:  # never fewer samples than asked: a round never goes ahead with less noise
            raise PoolError(
                f"the noise pool could read only {piece.count - need} of the {piece.count} "
                f"samples from block {piece.block_index} offset {piece.offset}"
            )
        self.cursor = cursor
        self._save_cursor()  # durable before any sample is used
        with (self.dir / "consumed.log").open("a") as log:
            for rec in records:
                log.write(json.dumps(rec) + "\n")
            log.flush()
            os.fsync(log.fileno())
        self._destroy_used(before)
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)

    def apply(self, cursor: tuple[int, int], blocks: Sequence[PoolBlock]) -> None:
        """Adopt a reconciled state: keep only ``blocks``, move the cursor (persisted); the
        samples it skips (perhaps used by the other side) are destroyed like used ones."""
        with self._lock:
            self._apply(cursor, blocks)

    def _apply(self, cursor: tuple[int, int], blocks: Sequence[PoolBlock]) -> None:
        keep = set(blocks)
        for b in self.blocks:
            if b not in keep:
                self._delete(b)
        self.blocks = [b for b in self.blocks if b in keep]
        if cursor < self.cursor:
            raise PoolError("a reconciled cursor never moves back")
        self._next_index = max(self._next_index, cursor[0], *(b.index + 1 for b in blocks), 0)
        before = self.cursor
        self.cursor = cursor
        self._save_cursor()
        self._destroy_used(before)

    def consumed(self) -> list[dict[str, int]]:
        """Every consumed run of samples so far (round, block, offset, count), oldest first."""
        path = self.dir / "consumed.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _chunks(count: int) -> int:
    """Chunks of a block of ``count`` samples (the last may be shorter)."""
    return -(-count // CHUNK_SAMPLES)

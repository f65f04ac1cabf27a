"""Preprocessed noise (mode ``preprocessed``): additive shares of discrete-Gaussian noise made
before the rounds, kept in a pool on each server's disk, every sample used exactly once.

Production of one block of n samples (H1 garbler, H2 evaluator, over the data link): the
sampler's rejection rounds (:func:`servers.gc_party.run_sampler`, fresh 32-byte seeds on both
servers) leave each accepted noise z as kept labels; :func:`noise_share_circuit` adds H1's mask r
(L bits from ``os.urandom``, a garbler input the evaluator never learns) and reveals
u = (z + r) mod 2^L to H2 only. H1 stores -r mod 2^L, H2 stores u, so the two shares add up to z
in Z_{2^L} while each alone is uniform: neither server learns anything about z (the ABY
Yao-to-arithmetic step).

Online, per round: each server adds its next d samples to its sum of shares and the two
exchange one ring element per coordinate (:func:`servers.coordinator.dng_exchange`):
Y = (A1 - r) - (A2 - u) = S + z. No circuit runs in the round.

Storage (:class:`NoisePool`, one directory per server, mode 0700, files 0600)::

    pool.json               parameters the samples were made for (sigma, L, distance, noise bits)
    block-00000007.bin      n little-endian uint64 shares
    block-00000007.json     {"index", "block_id", "count", "sha256"}: written last (the commit)
    cursor.json             {"block", "offset"}: the first unused sample
    consumed.log            one JSON line per consumed run of samples (round, block, offset, count)

The cursor is written (fsync, atomic rename) before any sample it covers is used, so a crash can
waste samples but never hand the same ones out twice. Fully used blocks are deleted. Both servers
hold the same blocks (index and H1's random 16-byte id); :meth:`NoisePool.reconcile` keeps the
blocks both hold and moves both cursors to the later one after a restart.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from garbled_core.circuit import CircuitBuilder
from garbled_core.discrete_gaussian import DEFAULT_DISTANCE_LOG2, DEFAULT_SCHEDULE, derive_params
from spgc.servers.gc_party import as_party_link, claim_seed, counter_delta, run_sampler
from spgc.servers.private_files import write_private
from spgc.servers.spgc_circuit import check_ring_bits
from spgc.sharing import ring_mask

__all__ = [
    "BLOCK_ID_BYTES",
    "NoisePool",
    "PoolBlock",
    "PoolError",
    "PoolExhaustedError",
    "PoolSlice",
    "noise_share_circuit",
    "produce_noise_shares",
    "reconcile",
]

BLOCK_ID_BYTES = 16
_FORMAT = 1
MAX_BLOCK_SAMPLES = 1 << 24  # 128 MiB of shares per block file


class PoolError(RuntimeError):
    """The noise pool cannot be used as asked (parameters, positions, files)."""


class PoolExhaustedError(PoolError):
    """Fewer unused samples than a round needs (never answered with less noise)."""


# ------------------------------------------------------------------------------ the circuit


@functools.lru_cache(maxsize=32)
def noise_share_circuit(ring_bits: int, noise_bits: int) -> Any:
    """u = (z + r) mod 2^L, revealed to the evaluator only: z carried (port ``z``, the sampler's
    kept noise, ``noise_bits`` two's complement), r the garbler's mask (port ``r``, L bits).
    L - 1 AND gates."""
    ring_bits = check_ring_bits(ring_bits)
    if not 2 <= noise_bits <= ring_bits:
        raise ValueError(
            f"the sampler's noise needs {noise_bits} bits, more than the ring's L={ring_bits}: "
            f"S + z would not fit; the plan must size the ring for the noise"
        )
    b = CircuitBuilder(f"spgc-noise-share-L{ring_bits}-z{noise_bits}")
    z = b.input("z", owner="carried", width=noise_bits)
    r = b.input("r", owner="garbler", width=ring_bits)
    b.output("u", b.add(b.sign_extend(z, ring_bits), r), reveal="evaluator")
    return b.build()


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
) -> tuple[np.ndarray, dict[str, Any]]:
    """One server's side of producing ``n`` noise samples as additive shares in Z_{2^L}.

    ``role`` "garbler" (H1) or "evaluator" (H2); ``link`` a :class:`servers.gc_party.PartyLink`;
    ``seed`` this server's fresh 32-byte sampler seed (refused if used before). Returns (shares,
    counters): H1's shares are -r mod 2^L, H2's u = z + r mod 2^L, uint64; their sum is the
    noise the plaintext sampler gives for the same two seeds.
    """
    ring_bits = check_ring_bits(ring_bits)
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    link = as_party_link(role, link)
    params = derive_params(sigma_units, distance_log2)
    circuit = noise_share_circuit(ring_bits, params.noise_bits)
    mask = ring_mask(ring_bits)
    shares = np.zeros(n, dtype=np.uint64)
    before = link.counters()
    start = time.perf_counter()
    claim_seed(seed)

    def finish(result: Any) -> None:
        m = len(result.coords)
        if m == 0:
            return
        carried = {"z": result.noise.select(result.instances)}
        if link.role == "garbler":
            r = np.frombuffer(os.urandom(8 * m), dtype="<u8").astype(np.uint64) & mask
            link.session.run(circuit, {"r": r}, carried, m)
            shares[result.coords] = (np.uint64(0) - r) & mask  # -r: wraps on purpose
        else:
            out = link.session.run(circuit, {}, carried, m)
            shares[result.coords] = np.asarray(out["u"], dtype=np.uint64) & mask

    if n:
        stats = run_sampler(link.role, link, n, seed, params, schedule, finish)
        info: dict[str, Any] = {"rounds": stats.rounds, "trials": stats.trials}
    else:
        info = {"rounds": 0, "trials": 0}
    info.update(counter_delta(before, link.counters()))
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


class NoisePool:
    """One server's pool of noise shares (see the module docstring for the layout).

    Not thread-safe: the server's round loop (H1) or its peer servicer (H2) owns it.
    """

    def __init__(
        self,
        directory: Path,
        role: str,
        sigma_units: float,
        ring_bits: int,
        distance_log2: float = DEFAULT_DISTANCE_LOG2,
    ) -> None:
        if role not in ("h1", "h2"):
            raise ValueError(f"role must be 'h1' or 'h2', got {role!r}")
        self.dir = Path(directory)
        self.role = role
        self.sigma_units = float(sigma_units)
        self.ring_bits = check_ring_bits(ring_bits)
        self.distance_log2 = float(distance_log2)
        self.noise_bits = derive_params(self.sigma_units, self.distance_log2).noise_bits
        self.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dir.chmod(0o700)  # the shares are secrets of this server
        self._check_meta()
        self.blocks: list[PoolBlock] = []
        self.cursor = (0, 0)
        self._next_index = 0
        self._verified: set[int] = set()
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
        }

    def _check_meta(self) -> None:
        path = self.dir / "pool.json"
        want = self._meta()
        if not path.exists():
            write_private(path, json.dumps(want, sort_keys=True).encode())
            return
        have = json.loads(path.read_text())
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
            block = PoolBlock(
                int(meta["index"]), bytes.fromhex(meta["block_id"]), int(meta["count"])
            )
            data = self._bin(block.index)
            if not data.exists() or data.stat().st_size != 8 * block.count:
                raise PoolError(f"noise pool block {data} is missing or truncated")
            blocks.append(block)
        for path in self.dir.glob("block-*.bin"):  # data whose commit record never landed
            if not self._json(int(path.stem.split("-")[1])).exists():
                path.unlink()
        self.blocks = sorted(blocks, key=lambda b: b.index)
        self._next_index = _next((self.cursor, self.blocks))
        self._drop_used()

    def _save_cursor(self) -> None:
        data = json.dumps({"block": self.cursor[0], "offset": self.cursor[1]}).encode()
        write_private(self.dir / "cursor.json", data)

    def _delete(self, block: PoolBlock) -> None:
        for path in (self._json(block.index), self._bin(block.index)):
            path.unlink(missing_ok=True)
        self._verified.discard(block.index)

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

    # ------------------------------------------------------------------ queries

    @property
    def available(self) -> int:
        """Unused samples."""
        total = 0
        for b in self.blocks:
            total += b.count - (self.cursor[1] if b.index == self.cursor[0] else 0)
        return total

    @property
    def next_index(self) -> int:
        """The index the next produced block gets."""
        return self._next_index

    def state(self) -> tuple[tuple[int, int], list[PoolBlock]]:
        """(cursor, blocks held): what :func:`reconcile` compares."""
        return self.cursor, list(self.blocks)

    def position(self, count: int) -> PoolSlice:
        """The slice the next ``count`` samples would be (PoolExhaustedError if too few)."""
        if count > self.available:
            raise PoolExhaustedError(
                f"the noise pool holds {self.available} unused samples; {count} are needed"
            )
        if not self.blocks:
            return PoolSlice(self._next_index, b"", 0, 0)
        first = self.blocks[0]
        return PoolSlice(first.index, first.block_id, self.cursor[1], count)

    # ------------------------------------------------------------------ changes

    def add_block(self, index: int, block_id: bytes, shares: np.ndarray) -> PoolBlock:
        """Store a produced block. Its index must come after every block held and the cursor
        (H1 numbers the blocks; after a reconciliation H2 may have skipped an orphan's index)."""
        last = self.blocks[-1].index if self.blocks else -1
        if index <= last or index < self.cursor[0]:
            raise PoolError(
                f"block {index} out of order: the pool holds blocks up to {last} and its cursor "
                f"is in block {self.cursor[0]}"
            )
        if len(block_id) != BLOCK_ID_BYTES:
            raise PoolError(f"a block id has {BLOCK_ID_BYTES} bytes, got {len(block_id)}")
        shares = np.ascontiguousarray(shares, dtype=np.uint64)
        if not 1 <= len(shares) <= MAX_BLOCK_SAMPLES:
            raise PoolError(f"a block holds 1..{MAX_BLOCK_SAMPLES} samples, got {len(shares)}")
        data = shares.astype("<u8").tobytes()
        write_private(self._bin(index), data)
        meta = {
            "index": index,
            "block_id": block_id.hex(),
            "count": len(shares),
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        write_private(self._json(index), json.dumps(meta, sort_keys=True).encode())
        block = PoolBlock(index, bytes(block_id), len(shares))
        self.blocks.append(block)
        self._verified.add(index)
        self._next_index = index + 1
        return block

    def _read(self, block: PoolBlock, start: int, count: int) -> np.ndarray:
        path = self._bin(block.index)
        if block.index not in self._verified:
            meta = json.loads(self._json(block.index).read_text())
            if hashlib.sha256(path.read_bytes()).hexdigest() != meta["sha256"]:
                raise PoolError(f"noise pool block {path} is corrupt (sha256 mismatch)")
            self._verified.add(block.index)
        with path.open("rb") as f:
            f.seek(8 * start)
            raw = f.read(8 * count)
        return np.frombuffer(raw, dtype="<u8").astype(np.uint64)

    def take(self, piece: PoolSlice, round_number: int) -> np.ndarray:
        """The samples of ``piece`` (which must be :meth:`position` of its count): the cursor
        moves past them on disk BEFORE they are returned, so they are never handed out again."""
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
        cursor = self.cursor
        for b in self.blocks:
            if need == 0:
                break
            n = min(need, b.count - offset)
            parts.append(self._read(b, offset, n))
            records.append({"round": round_number, "block": b.index, "offset": offset, "count": n})
            need -= n
            cursor = (b.index, offset + n)
            offset = 0
        self.cursor = cursor
        self._save_cursor()  # durable before any sample is used
        with (self.dir / "consumed.log").open("a") as log:
            for rec in records:
                log.write(json.dumps(rec) + "\n")
            log.flush()
            os.fsync(log.fileno())
        self._drop_used()
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.uint64)

    def apply(self, cursor: tuple[int, int], blocks: Sequence[PoolBlock]) -> None:
        """Adopt a reconciled state: keep only ``blocks``, move the cursor (persisted)."""
        keep = set(blocks)
        for b in self.blocks:
            if b not in keep:
                self._delete(b)
        self.blocks = [b for b in self.blocks if b in keep]
        if cursor < self.cursor:
            raise PoolError("a reconciled cursor never moves back")
        self._next_index = max(self._next_index, cursor[0], *(b.index + 1 for b in blocks), 0)
        self.cursor = cursor
        self._save_cursor()
        self._drop_used()

    def consumed(self) -> list[dict[str, int]]:
        """Every consumed run of samples so far (round, block, offset, count), oldest first."""
        path = self.dir / "consumed.log"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

"""Share intake: validate each provider's submission and add it to the round's sum mod 2^L.

A submission is checked before it can touch the sum: the round must be the open one, the
provider known and not yet counted this round, the submission id never seen before (replays),
the length equal to the model's parameter count, every chunk within the size limit and every
value inside the ring. A provider whose upload stalled (a lost connection the server has not
noticed yet) may start again: the newer submission supersedes its unfinished one, which is
refused with ABORTED if it ever goes on. Chunks go to a private spill file as they arrive and
are added to the in-memory sum only when the whole submission has passed, so a bad or broken
stream leaves the round untouched and memory stays O(d) whatever the number of providers. A
small share (at most ``memory_share_bytes``, 64 KiB by default) is held in memory instead, up to
``memory_round_bytes`` (256 MiB) per round, the rest spilled as before: creating a file per
share cost about 0.5 ms of disk wait each on this project's test machine (ext4), on the path
every provider takes.

The spill files serve a second purpose: after the deadline the two servers agree on the
providers whose shares BOTH received (SPEC step 6); a share that reached this server only must
be taken out of the sum again, and subtraction mod 2^L undoes an addition exactly.

With verified inputs (:class:`FieldShares`, spgc.protocol.norm_proof) the sum is mod p: H1 holds
each
provider's field share with its share of the proof (its first d values are the vector's share),
H2 each provider's 32-byte seed, which expands to its share; :meth:`ShareIntake.proof_share`
gives either back for the servers' check, and a share whose proof fails is taken out of the
sum like one the other server lacks.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from spgc.protocol.norm_proof import HelperShare, LeaderShare, NormProofParams
from spgc.protocol.sharing import aggregate_shares, validate_share
from spgc.wire.chunks import MAX_CHUNK_BYTES
from spgc.wire.errors import ANOTHER_VECTOR

# gRPC status names a servicer maps these refusals to.
INVALID_ARGUMENT = "INVALID_ARGUMENT"
FAILED_PRECONDITION = "FAILED_PRECONDITION"
ALREADY_EXISTS = "ALREADY_EXISTS"
PERMISSION_DENIED = "PERMISSION_DENIED"
RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
ABORTED = "ABORTED"

_ADD_PIECE = 1 << 17  # values per read when adding a spill file to the sum (1 MiB)


class SubmissionRejected(Exception):
    """A submission refused with a reason for the provider; `code` is a gRPC status name."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class FieldShares:
    """Verified inputs: shares are elements of F_p with a norm proof (spgc.protocol.norm_proof). H1
    (``leader``) receives n_inputs + proof_len values; H2 none, but a seed."""

    params: NormProofParams
    leader: bool

    @property
    def length(self) -> int:
        return self.params.n_inputs + self.params.proof_len if self.leader else 0


@dataclass(frozen=True)
class _Seed:
    """H2's held share with verified inputs: the seed it expands from."""

    seed: bytes


@dataclass
class _Round:
    number: int
    directory: Path
    total: np.ndarray
    # A file, a small share's bytes, or (H2, verified inputs) the seed the share expands from.
    spilled: dict[str, Path | bytes | _Seed] = field(default_factory=dict)
    # Verified inputs: (norm_blind, norm_joint_part) of each share in the sum.
    proof_fields: dict[str, tuple[bytes, bytes]] = field(default_factory=dict)
    vector_ids: dict[str, bytes] = field(default_factory=dict)  # ShareHeader.vector_id, per share
    in_flight: dict[str, Submission] = field(default_factory=dict)  # the newest per provider
    closed: bool = False
    memory_bytes: int = 0  # shares held in memory (committed or on their way)


class ShareIntake:
    """One server's intake of additive shares, round by round.

    Thread-safe: a gRPC server calls :meth:`receive` (or :meth:`begin`) from several threads
    at once.
    """

    def __init__(
        self,
        dim: int,
        ring_bits: int,
        spill_root: Path | None = None,
        allowed_providers: Iterable[str] | None = None,
        max_chunk_values: int = MAX_CHUNK_BYTES,
        memory_share_bytes: int = 1 << 16,
        memory_round_bytes: int = 256 << 20,
        field_shares: FieldShares | None = None,
    ) -> None:
        if dim < 1:
            raise ValueError(f"dim must be positive, not {dim}")
        if not 1 <= ring_bits <= 64:
            raise ValueError(f"ring_bits must be in 1..64, not {ring_bits}")
        if max_chunk_values < 1:
            raise ValueError("max_chunk_values must be at least 1")
        self.dim = dim
        self.ring_bits = ring_bits
        self.field = field_shares
        # Values a share carries: d, or with verified inputs what FieldShares.length says.
        self.length = dim if field_shares is None else field_shares.length
        # Values, not bytes: chunks arrive here widened to uint64, and a packed wire chunk of
        # MAX_CHUNK_BYTES carries up to MAX_CHUNK_BYTES values (one byte each at L <= 8).
        self.max_chunk_values = max_chunk_values
        self.in_memory = 8 * self.length <= memory_share_bytes  # held in memory, not spilled
        self.memory_round_bytes = memory_round_bytes  # at most this much of a round in memory
        self.allowed = None if allowed_providers is None else frozenset(allowed_providers)
        self._root = Path(tempfile.mkdtemp(prefix="spgc-intake-", dir=spill_root))  # mode 0700
        self._lock = threading.Lock()
        self._round: _Round | None = None
        self._last_closed = -1
        self._seen_ids: set[tuple[str, bytes]] = set()

    # ------------------------------------------------------------------ round life cycle

    def open_round(self, number: int) -> None:
        """Starts accepting shares for round `number` (rounds only move forward)."""
        with self._lock:
            if self._round is not None and not self._round.closed:
                raise RuntimeError(f"round {self._round.number} is still open")
            if number <= self._last_closed:
                raise ValueError(f"round {number} is not after the last closed round")
            directory = self._root / f"round-{number}"
            directory.mkdir(mode=0o700)
            total = np.zeros(self.dim, dtype=np.uint64)
            self._round = _Round(number=number, directory=directory, total=total)

    def values_in_flight(self, provider: str) -> int | None:
        """How many values of ``provider``'s submission under way in the open round have
        arrived (None: none under way): for tests that must wait for an upload to be in."""
        with self._lock:
            rnd = self._round
            submission = None if rnd is None else rnd.in_flight.get(provider)
            return None if submission is None else submission.received

    def close_round(self) -> frozenset[str]:
        """Stops the intake (the deadline passed); returns the providers whose shares are in."""
        with self._lock:
            rnd = self._require_round()
            rnd.closed = True
            self._last_closed = rnd.number
            return frozenset(rnd.spilled)

    def vector_ids(self) -> dict[str, bytes]:
        """ShareHeader.vector_id of each share in the round's sum (b"" where none was sent)."""
        with self._lock:
            rnd = self._require_round()
            return {name: rnd.vector_ids.get(name, b"") for name in rnd.spilled}

    def restrict_to(self, providers: Iterable[str]) -> frozenset[str]:
        """Keeps only `providers` (the set both servers received) in the sum; returns who was
        taken out. Call after :meth:`close_round`."""
        keep = frozenset(providers)
        with self._lock:
            rnd = self._require_round()
            if not rnd.closed:
                raise RuntimeError("restrict_to needs a closed round")
            unknown = keep - rnd.spilled.keys()
            if unknown:
                raise ValueError(f"providers {sorted(unknown)} sent this server no share")
            dropped = frozenset(rnd.spilled) - keep
            for provider in sorted(dropped):
                self._add_file(rnd.total, rnd.spilled.pop(provider), subtract=True)
            return dropped

    def total(self) -> np.ndarray:
        """This server's sum mod 2^L of the shares kept in the closed round."""
        with self._lock:
            rnd = self._require_round()
            if not rnd.closed:
                raise RuntimeError("the sum is final only once the round is closed")
            return rnd.total

    def finish_round(self) -> None:
        """Deletes the round's spill files (after the garbled circuit has used the sum)."""
        with self._lock:
            rnd = self._require_round()
            shutil.rmtree(rnd.directory, ignore_errors=True)
            self._round = None

    def abandon_round(self, next_round: int) -> None:
        """Drops the round in progress, if any, with its shares (the peer server was lost
        mid-round), so that round ``next_round`` (the last common checkpoint's) can open
        again. Submission ids stay spent: a replay is refused after the abandon too."""
        with self._lock:
            rnd, self._round = self._round, None
            if rnd is not None:
                rnd.closed = True
                shutil.rmtree(rnd.directory, ignore_errors=True)
            self._last_closed = next_round - 1

    def close(self) -> None:
        """Deletes every spill file."""
        shutil.rmtree(self._root, ignore_errors=True)

    @property
    def current_round(self) -> int | None:
        rnd = self._round
        return None if rnd is None or rnd.closed else rnd.number

    # ------------------------------------------------------------------ submissions

    def receive(
        self,
        provider: str,
        round_number: int,
        submission_id: bytes,
        length: int,
        ring_bits: int,
        chunks: Iterable[bytes],
        on_admit: Callable[[int], None] | None = None,
        vector_id: bytes = b"",
        proof_fields: tuple[bytes, bytes, bytes] = (b"", b"", b""),
    ) -> None:
        """Takes one provider's whole share (`length` little-endian uint64 values in chunks).
        ``on_admit(round)`` runs once the submission is admitted, before its payload is read
        (ldp: the server counts the noisy vector before it holds any of it).

        Raises SubmissionRejected, leaving the round's sum untouched, for anything wrong.
        """
        submission = self.begin(
            provider, round_number, submission_id, length, ring_bits, vector_id, proof_fields
        )
        try:
            if on_admit is not None:
                on_admit(round_number)
            for chunk in chunks:
                submission.write(chunk)
            submission.commit()
        finally:
            submission.discard()

    def begin(
        self,
        provider: str,
        round_number: int,
        submission_id: bytes,
        length: int,
        ring_bits: int,
        vector_id: bytes = b"",
        proof_fields: tuple[bytes, bytes, bytes] = (b"", b"", b""),
    ) -> Submission:
        """Admit one submission (round, identity, duplicates, replays, length are checked
        before any payload is read); its chunks then go to :meth:`Submission.write`, and
        :meth:`Submission.commit` adds the whole share to the sum. Always call
        :meth:`Submission.discard` at the end (a no-op after a commit). ``proof_fields``:
        ShareHeader's (norm_blind, norm_joint_part, norm_seed). Raises SubmissionRejected."""
        self._check_proof_fields(*proof_fields)
        with self._lock:
            rnd = self._admit(provider, round_number, submission_id, length, ring_bits, vector_id)
            self._seen_ids.add((provider, bytes(submission_id)))
            held = self.in_memory and rnd.memory_bytes + 8 * length <= self.memory_round_bytes
            if held:
                rnd.memory_bytes += 8 * length  # reserved; given back if never committed
            submission = Submission(self, rnd, provider, round_number, length, held)
            submission.vector_id = bytes(vector_id)
            submission.submission_id = bytes(submission_id)
            submission.proof_fields = tuple(bytes(f) for f in proof_fields)  # type: ignore[assignment]
            stalled = rnd.in_flight.get(provider)
            if stalled is not None:
                stalled.superseded = True  # its stream is refused at its next chunk or end
            rnd.in_flight[provider] = submission
        if held:
            return submission
        path = rnd.directory / f"{len(rnd.spilled)}-{os.urandom(8).hex()}.share"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            submission.discard()
            if self._round is rnd:
                raise
            raise SubmissionRejected(
                FAILED_PRECONDITION, f"round {round_number} was abandoned"
            ) from None
        submission.spill_to(path, os.fdopen(fd, "wb"))
        return submission

    def _admit(
        self,
        provider: str,
        round_number: int,
        submission_id: bytes,
        length: int,
        ring_bits: int,
        vector_id: bytes,
    ) -> _Round:
        rnd = self._round
        if self.allowed is not None and provider not in self.allowed:
            raise SubmissionRejected(PERMISSION_DENIED, f"provider {provider!r} is not registered")
        if rnd is None or rnd.closed:
            raise SubmissionRejected(
                FAILED_PRECONDITION, f"share for round {round_number} refused: no round is open"
            )
        if round_number < rnd.number:
            raise SubmissionRejected(
                FAILED_PRECONDITION,
                f"round {round_number} is over; the current round is {rnd.number}",
            )
        if round_number > rnd.number:
            raise SubmissionRejected(
                FAILED_PRECONDITION,
                f"round {round_number} is not open; the current round is {rnd.number}",
            )
        if not submission_id or len(submission_id) > 64:
            raise SubmissionRejected(INVALID_ARGUMENT, "submission id must be 1..64 bytes")
        if (provider, bytes(submission_id)) in self._seen_ids:
            raise SubmissionRejected(ALREADY_EXISTS, "this submission id was used before (replay)")
        if len(vector_id) > 64:
            raise SubmissionRejected(INVALID_ARGUMENT, "vector id must be 0..64 bytes")
        if provider in rnd.spilled:
            held = rnd.vector_ids.get(provider, b"")
            if held and vector_id and held != vector_id:
                # Another vector's share is in (a restarted provider, or two processes with one
                # identity): the servers' agreement leaves the provider out if the halves differ.
                raise SubmissionRejected(
                    ALREADY_EXISTS,
                    f"provider {provider!r} already sent {ANOTHER_VECTOR} for round "
                    f"{rnd.number} (vector id differs); if the other server holds this "
                    "vector's half, the round leaves the provider out",
                )
            raise SubmissionRejected(
                ALREADY_EXISTS, f"provider {provider!r} already sent a share for round {rnd.number}"
            )
        if ring_bits != self.ring_bits:
            raise SubmissionRejected(
                INVALID_ARGUMENT,
                f"share is in Z_2^{ring_bits}; this server aggregates in Z_2^{self.ring_bits}",
            )
        if length != self.length:
            what = (
                "the model's trained parameters, and the unclipped count with adaptive clipping"
                if self.field is None
                else "verified inputs: to H1 the encoded vector and the proof, to H2 none"
            )
            raise SubmissionRejected(
                INVALID_ARGUMENT,
                f"share has {length:,} values; this run's shares have {self.length:,} ({what})",
            )
        return rnd

    def _check_proof_fields(self, blind: bytes, joint_part: bytes, seed: bytes) -> None:
        """The norm proof's header fields this server needs, and no others (SubmissionRejected
        naming the field)."""
        if self.field is None:
            if blind or joint_part or seed:
                raise SubmissionRejected(
                    INVALID_ARGUMENT, "norm proof fields in a run without verified inputs"
                )
            return
        # H1: its blind and H2's part; H2: its seed and H1's two parts (x's, the bits').
        leader = self.field.leader
        sizes = {
            "norm_blind": 32 if leader else 0,
            "norm_joint_part": 32 if leader else 64,
            "norm_seed": 0 if leader else 32,
        }
        values = {"norm_blind": blind, "norm_joint_part": joint_part, "norm_seed": seed}
        for name, value in values.items():
            if len(value) != sizes[name]:
                server = "H1" if leader else "H2"
                state = f"{sizes[name]} bytes" if sizes[name] else "empty"
                raise SubmissionRejected(
                    INVALID_ARGUMENT, f"verified inputs: {name} to {server} must be {state}"
                )

    def proof_share(self, provider: str) -> LeaderShare | HelperShare:
        """The held share of ``provider`` with its norm proof (verified inputs, a closed round):
        H1's values in full, or H2's seed."""
        assert self.field is not None
        with self._lock:
            rnd = self._require_round()
            held = rnd.spilled[provider]
            blind, joint_part = rnd.proof_fields[provider]
        params = self.field.params
        if isinstance(held, _Seed):
            return HelperShare(held.seed, joint_part)
        values = self._held_values(held, self.length)
        return LeaderShare(
            values[: params.n_inputs].copy(), values[params.n_inputs :].copy(), blind, joint_part
        )

    def _held_values(self, held: Path | bytes, count: int) -> np.ndarray:
        """The first ``count`` values of a held share (bytes or spill file) as uint64."""
        if isinstance(held, bytes):
            return np.frombuffer(held, dtype="<u8", count=count).astype(np.uint64)
        with held.open("rb") as f:
            data = f.read(8 * count)
        return np.frombuffer(data, dtype="<u8").astype(np.uint64)

    def _add_file(self, total: np.ndarray, share: Path | bytes | _Seed, subtract: bool) -> None:
        """Add (or subtract) a held share, a spill file or a small share's bytes, to ``total``
        (mod p, its first d values, with verified inputs)."""
        if self.field is not None:
            p = self.field.params.p
            if isinstance(share, _Seed):
                x = HelperShare(share.seed, b"").expand(self.field.params)[0][: self.dim]
            else:
                x = self._held_values(share, self.dim)
            if subtract:
                x = np.where(x == 0, x, np.uint64(p) - x)
            s = total + x  # both < p < 2^62: no wrap
            np.copyto(total, np.where(s >= np.uint64(p), s - np.uint64(p), s))
            return
        assert not isinstance(share, _Seed)
        if isinstance(share, bytes):
            pieces: Iterable[bytes] = (share,)
        else:
            pieces = _file_pieces(share, 8 * _ADD_PIECE)
        offset = 0
        for data in pieces:
            piece = np.frombuffer(data, dtype="<u8").astype(np.uint64)
            if subtract:
                piece = np.negative(piece)  # -x mod 2^64; the ring mask follows
            aggregate_shares(total[offset : offset + len(piece)], piece, self.ring_bits)
            offset += len(piece)

    def _require_round(self) -> _Round:
        if self._round is None:
            raise RuntimeError("no round is open")
        return self._round


def _file_pieces(path: Path, size: int) -> Iterator[bytes]:
    with path.open("rb") as f:
        while data := f.read(size):
            yield data


class Submission:
    """One admitted share on its way in (:meth:`ShareIntake.begin`): chunks are checked and
    kept in memory for a small share (``held``, its bytes reserved in the round's memory
    budget), else spilled as they arrive (memory O(chunk)) to the file :meth:`spill_to` gives;
    :meth:`commit` adds the share to the round's sum once it is complete; :meth:`discard`
    drops whatever was not committed."""

    def __init__(
        self,
        intake: ShareIntake,
        rnd: _Round,
        provider: str,
        round_number: int,
        length: int,
        held: bool,
    ) -> None:
        self.intake, self.rnd, self.provider = intake, rnd, provider
        self.round_number, self.length = round_number, length
        self.path: Path | None = None
        self.file: Any = None
        self.buffer = bytearray() if held else None
        self.received = 0
        self.committed = self.done = False
        self.superseded = False  # the provider began a newer submission for the round
        self.vector_id = b""  # ShareHeader.vector_id
        self.submission_id = b""  # ShareHeader.submission_id: free again unless committed
        self.proof_fields: tuple[bytes, bytes, bytes] = (b"", b"", b"")  # blind, part, seed

    def spill_to(self, path: Path, file: Any) -> None:
        """Chunks go to ``path`` (open as ``file``); call once, before any chunk."""
        self.path, self.file = path, file

    def _check_current(self) -> None:
        if self.superseded:
            raise SubmissionRejected(
                ABORTED,
                f"provider {self.provider!r} began a newer submission for round "
                f"{self.round_number}; this one no longer counts",
            )
        if self.rnd.closed:  # a slow upload is cut at its next chunk, not read to its end
            raise SubmissionRejected(
                FAILED_PRECONDITION,
                f"round {self.round_number} closed before the share was complete",
            )

    def write(self, chunk: bytes) -> None:
        """One chunk of little-endian uint64 values (a packed wire chunk already widened);
        SubmissionRejected for a bad one."""
        self._check_current()
        limit = self.intake.max_chunk_values
        if len(chunk) > 8 * limit:
            raise SubmissionRejected(
                RESOURCE_EXHAUSTED,
                f"chunk of {len(chunk) // 8:,} values exceeds the limit of {limit:,}",
            )
        if len(chunk) % 8:
            raise SubmissionRejected(
                INVALID_ARGUMENT, "chunk length is not a whole number of uint64 values"
            )
        values = np.frombuffer(chunk, dtype="<u8")
        self.received += len(values)
        if self.received > self.length:
            raise SubmissionRejected(
                INVALID_ARGUMENT, f"share has more than the announced {self.length:,} values"
            )
        field_shares = self.intake.field
        if field_shares is not None:
            if len(values) and int(values.max()) >= field_shares.params.p:
                raise SubmissionRejected(INVALID_ARGUMENT, "share has values outside the field")
        else:
            try:
                validate_share(
                    values.astype(np.uint64, copy=False), len(values), self.intake.ring_bits
                )
            except ValueError as exc:
                raise SubmissionRejected(INVALID_ARGUMENT, str(exc)) from exc
        if self.buffer is not None:
            self.buffer += chunk
            return
        try:
            self.file.write(chunk)
        except OSError as exc:
            raise self._abandoned_or(exc) from None

    def commit(self) -> None:
        """The whole share is in: add it to the round's sum (SubmissionRejected when it is
        short, or the round closed or was abandoned meanwhile)."""
        self._check_current()
        if self.received != self.length:
            raise SubmissionRejected(
                INVALID_ARGUMENT, f"share ended after {self.received:,} of {self.length:,} values"
            )
        held: Path | bytes | _Seed
        blind, joint_part, seed = self.proof_fields
        if seed:
            held = _Seed(seed)  # H2 with verified inputs: nothing was spilled
        elif self.buffer is not None:
            held = bytes(self.buffer)
        else:
            assert self.path is not None
            held = self.path
            try:
                self.file.close()
            except OSError as exc:
                raise self._abandoned_or(exc) from None
        intake, rnd = self.intake, self.rnd
        with intake._lock:
            self._check_current()  # again: a newer one may have begun while this was read
            if rnd.closed or intake._round is not rnd:
                raise SubmissionRejected(
                    FAILED_PRECONDITION,
                    f"round {self.round_number} closed before the share was complete",
                )
            intake._add_file(rnd.total, held, subtract=False)
            rnd.spilled[self.provider] = held
            rnd.vector_ids[self.provider] = self.vector_id
            if intake.field is not None:
                rnd.proof_fields[self.provider] = (blind, joint_part)
            self.committed = True

    def discard(self) -> None:
        """End of the submission: an uncommitted share's spill file is deleted."""
        if self.done:
            return
        self.done = True
        if self.file is not None and not self.file.closed:
            with contextlib.suppress(OSError):
                self.file.close()
        if not self.committed and self.path is not None:
            self.path.unlink(missing_ok=True)
        with self.intake._lock:
            if self.rnd.in_flight.get(self.provider) is self:
                del self.rnd.in_flight[self.provider]
            if not self.committed and self.buffer is not None:
                self.rnd.memory_bytes -= 8 * self.length
            if not self.committed:
                # A refused submission counts for nothing: the same id may be sent again (a
                # retry after a bad chunk must not be answered "already exists" as if done).
                self.intake._seen_ids.discard((self.provider, self.submission_id))

    def _abandoned_or(self, exc: OSError) -> Exception:
        """The error to raise for a failed spill write: the round was abandoned under us (its
        directory is gone), or ``exc`` itself."""
        if self.intake._round is self.rnd:
            return exc
        return SubmissionRejected(FAILED_PRECONDITION, f"round {self.round_number} was abandoned")

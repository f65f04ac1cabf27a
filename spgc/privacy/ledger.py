"""The privacy ledger: one signed, hash-chained JSON line per noisy release, written before it.

Each server appends to ``ledger.jsonl`` in its state directory and fsyncs before anything
noisy leaves it (write-ahead), so after any crash the entries on disk are at least the
releases that may have happened; the accountant counts every ``release`` entry, whether its
round then completed, failed or was run again. The file verifies on its own: its first line
(``header``) names the run, the plan, this server's Ed25519 public key and, in the two-server
modes, the other server's; every line carries ``prev``, the SHA-256 of the line before it (the
chain), and ``sig``, the server's signature over the line without ``sig``. Every release entry
of a two-server run also carries ``peer_sig``, the other server's signature over the entry's
shared fields (:func:`release_statement`: the same bytes on both servers), exchanged before the
release (the Peer service's CosignRelease): neither server runs a release the other has not
recorded and signed. A finished run ends with a co-signed ``close`` entry (CloseLedger).
:func:`verify_ledger` checks the chain and both signatures and re-accounts epsilon from the
entries with dp-accounting, independently of the server's count.

Line kinds:

- ``header``: ``run_id``, ``server`` (its role, ``h1`` or ``h2``), ``public_key`` (hex, raw
  Ed25519), ``peer`` and ``peer_public_key`` (the other server; null in the one-server modes),
  the plan: every field re-accounting reads (:data:`PLAN_KEYS`: ``mode``, ``plan_sha256``,
  ``noise_multiplier``, ``sampling``, ``accountant``, ``delta``, ``sensitivity_units``,
  ``max_batch_size``, ``clip``: ``{"rule": "fixed", "clip_norm": C}`` or, with adaptive
  clipping, ``{"rule": "adaptive", "initial_norm", "target_quantile", "learning_rate",
  "update_noise_multiplier", "count_noise_std"}``: the pair of noises that ``noise_multiplier``
  accounts as one Gaussian, checked here to be no smaller than it, spgc.privacy.clipping),
  ``backend``
  and ``verify_inputs``.
- ``release``: written BEFORE a release: the shared fields (:data:`STATEMENT_KEYS`): the
  header's plan fields, ``signers`` (role -> public key, both servers'), ``round``,
  ``noise_samples``, ``clip_norm`` (the round's C), ``index`` (0, 1, ...), ``epsilon_after``
  (the count at the plan's delta, this release included) and ``chain`` (the ledger head before
  it); ``time``; ``peer_sig`` (two-server modes).
  The feature statistics' release (``standardize: true``, spgc.privacy.feature_stats) is a
  release entry too, made once before the first step, with ``release``: ``"feature_stats"``
  in its statement; its header then names that release's plan, ``feature_stats``:
  ``{"noise_multiplier", "sensitivity_units", "features"}`` (co-signed with the plan), and
  re-accounting composes it, unsampled, with the steps.
- ``released``: written after it: ``index`` of its ``release``, ``round``, ``vector_sha256``.
- ``close``: the last line of a finished run (:data:`CLOSE_KEYS`): ``releases`` and ``chain``,
  the head after them: no release follows; ``peer_sig`` (two-server modes).

The ledger head. The co-signed statements chain: the head before the first release is
:func:`plan_digest` of the header (so the header is its preimage), and the head after each
release the SHA-256 of its statement (:func:`chain_after`), which the next statement names.
Every published model names the head it depends on (release count and hash), and
:func:`spgc.privacy.ledger_pair.check_covers` holds a verified ledger to it.

What a dishonest server cannot do. Every field that re-accounting reads is in the statement
both servers sign for every release, and each release entry must repeat its header's fields:
a server that edits its header (a larger delta, another accountant or backend) and re-signs its
file with its own key breaks the peer's signature on every release entry. The statement also
names both servers' keys by role, so a ledger cannot present its own key as the peer's, and the
head before it, so no co-signed entry can be dropped, moved or renumbered. What a ledger that
is not closed cannot show: that no release followed its last entry (a cut-off copy is a valid
prefix); a model's head, or the co-signed closing entry, can.
:func:`spgc.privacy.ledger_pair.compare_ledgers` holds the two servers' ledgers to each other.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from spgc.privacy.accounting import PrivacyAccountant, adjacency_of, capped_poisson, reported_delta
from spgc.privacy.clipping import DecayClip
from spgc.privacy.noise_floor import floor_epsilons
from spgc.protocol.modes import get_mode

__all__ = [
    "CLOSE_KEYS",
    "FEATURE_STATS_RELEASE",
    "FORMAT",
    "LEDGER_FILE",
    "OPTIONAL_PLAN_KEYS",
    "PLAN_KEYS",
    "ROLES",
    "STATEMENT_KEYS",
    "Ledger",
    "LedgerError",
    "LedgerReport",
    "canonical",
    "chain_after",
    "close_statement",
    "load_signing_key",
    "plan_digest",
    "public_key_hex",
    "read_ledger_lines",
    "release_statement",
    "released_digest",
    "statement_bytes",
    "verify_ledger",
    "verify_statement",
]

# 4: every plan field (backend and verify_inputs too), each release's index and running
# epsilon, and the chain of co-signed statements (``chain``), are in the co-signed statement;
# a finished run ends with a co-signed ``close`` entry. Formats 1-3 are refused.
FORMAT = 4
# What the re-accounted epsilon may exceed the recorded one by before it counts as an
# under-report (dp-accounting's own floating-point noise).
EPSILON_TOLERANCE = 1e-6


#: A server's ledger file in its state_dir.
LEDGER_FILE = "ledger.jsonl"


def _write_whole_line(fd: int, data: bytes) -> None:
    """Append ``data`` whole, or raise with the file as it was: os.write may write only part
    (a disk filling up), and a torn entry would be read at the next start as one that was
    never durable, though its release went ahead."""
    start = os.lseek(fd, 0, os.SEEK_END)
    done = 0
    try:
        while done < len(data):
            written = os.write(fd, data[done:])
            if written <= 0:
                raise OSError(errno.ENOSPC, "no room to append the ledger entry")
            done += written
    except OSError:
        with contextlib.suppress(OSError):
            os.ftruncate(fd, start)  # the entry is not there: the caller does not go on
        raise


class LedgerError(ValueError):
    """A ledger that does not verify; the message names the line (1-based)."""


def canonical(entry: Mapping[str, Any]) -> bytes:
    """The bytes a line is, and is signed as (without ``sig``): sorted keys, no spaces."""
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


# What a ledger's header says of the plan: every field that re-accounting reads. Each release
# entry repeats them (checked against the header), and both servers sign them.
PLAN_KEYS = (
    "format",
    "run_id",
    "mode",
    "plan_sha256",
    "noise_multiplier",
    "sampling",
    "accountant",
    "delta",
    "sensitivity_units",
    "max_batch_size",
    "clip",
    "backend",
    "verify_inputs",
)
# Plan fields a header has only when the run uses them (a run without them writes, signs and
# verifies exactly the lines it did before they existed); when present, co-signed like
# PLAN_KEYS. feature_stats: the once-only release of the feature statistics. noise_floor
# (issue 46): {"fraction": f, "coordinates": d}, what the three figures are recomputed from
# (spgc.privacy.noise_floor).
OPTIONAL_PLAN_KEYS = ("feature_stats", "noise_floor")
#: The ``release`` value of the feature statistics' release entry (a step's has none).
FEATURE_STATS_RELEASE = "feature_stats"
# The fields of a release entry both servers sign (the same bytes on both: nothing local).
# ``index`` and ``epsilon_after`` are what re-accounting reads of an entry; ``chain`` is the
# ledger head before it (:func:`plan_digest`, then the hash of each co-signed statement), so
# no co-signed entry can be dropped or moved without breaking the next one's co-signature.
STATEMENT_KEYS = (
    "kind",
    *PLAN_KEYS,
    "signers",
    "round",
    "noise_samples",
    "clip_norm",
    "index",
    "epsilon_after",
    "chain",
)
# The fields of the closing entry both servers sign: no release follows the ``releases``
# entries whose head is ``chain``.
CLOSE_KEYS = ("kind", *PLAN_KEYS, "signers", "releases", "chain")
# The servers' roles; a one-server mode's server is h1.
ROLES = ("h1", "h2")


def signers(header: Mapping[str, Any]) -> dict[str, Any]:
    """Role -> public key (hex) of the servers that sign a run's releases, from a header."""
    out = {str(header.get("server")): header.get("public_key")}
    if header.get("peer_public_key") is not None:
        out[str(header.get("peer"))] = header.get("peer_public_key")
    return out


def _plan_fields(header: Mapping[str, Any]) -> dict[str, Any]:
    out = {k: header.get(k) for k in PLAN_KEYS}
    out.update({k: header[k] for k in OPTIONAL_PLAN_KEYS if k in header})
    out["signers"] = signers(header)
    return out


def plan_digest(header: Mapping[str, Any]) -> str:
    """SHA-256 (hex) of the header's plan (every :data:`PLAN_KEYS` field and both signers):
    the ledger head before the first release, so the first co-signed statement binds the
    header whole."""
    return _sha256(canonical({"kind": "plan", **_plan_fields(header)}))


def release_statement(
    header: Mapping[str, Any],
    round_number: int,
    noise_samples: int,
    clip_norm: float,
    *,
    index: int,
    epsilon_after: float,
    chain: str,
    release: str | None = None,
) -> dict[str, Any]:
    """The shared fields of release ``index`` for ``round_number`` (of clip norm
    ``clip_norm``, running epsilon ``epsilon_after``, inf: null) under ``header``'s plan,
    after the ledger head ``chain``. ``release``: what is released when it is not a step
    (:data:`FEATURE_STATS_RELEASE`)."""
    out: dict[str, Any] = {"kind": "release", "round": int(round_number)}
    if release is not None:
        out["release"] = release
    out.update(_plan_fields(header))
    out["noise_samples"] = int(noise_samples)
    out["clip_norm"] = float(clip_norm)
    out["index"] = int(index)
    out["epsilon_after"] = None if math.isinf(epsilon_after) else float(epsilon_after)
    out["chain"] = chain
    return out


def close_statement(header: Mapping[str, Any], releases: int, chain: str) -> dict[str, Any]:
    """The shared fields of the closing entry: the run ended after ``releases`` releases,
    whose head is ``chain``."""
    return {"kind": "close", **_plan_fields(header), "releases": int(releases), "chain": chain}


def statement_bytes(entry: Mapping[str, Any]) -> bytes:
    """What both servers sign for a release or closing entry: the canonical JSON of its
    shared fields."""
    keys = CLOSE_KEYS if entry.get("kind") == "close" else STATEMENT_KEYS
    shared = {k: entry.get(k) for k in keys}
    shared.update({k: entry[k] for k in (*OPTIONAL_PLAN_KEYS, "release") if k in entry})
    return canonical(shared)


def chain_after(entry: Mapping[str, Any]) -> str:
    """The ledger head after a co-signed entry: the SHA-256 (hex) of its statement."""
    return _sha256(statement_bytes(entry))


def verify_statement(public_key_hex_: str, statement: bytes, signature: bytes) -> bool:
    """Whether ``signature`` is the Ed25519 signature of ``statement`` by that public key."""
    try:
        key = Ed25519PublicKey.from_public_bytes(bytes.fromhex(public_key_hex_))
        key.verify(signature, statement)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


def released_digest(values: Any) -> str:
    """SHA-256 (hex) of released integer values as comma-separated decimal text (they may
    exceed 64 bits): the ``vector_sha256`` of a ``released`` line."""
    text = ",".join(str(int(v)) for v in np.asarray(values).tolist())
    return hashlib.sha256(text.encode()).hexdigest()


def read_ledger_lines(path: Path) -> list[bytes]:
    """The complete lines of a ledger file. A last line without its newline is a write a
    crash interrupted: its fsync never returned, so its release never happened; it is left
    out (and :meth:`Ledger.open` cuts it off the file)."""
    data = Path(path).read_bytes()
    complete = data[: data.rfind(b"\n") + 1]
    return [line for line in complete.splitlines() if line.strip()]


def load_signing_key(path: Path | None) -> Ed25519PrivateKey:
    """An Ed25519 private key from a PEM file (``spgc certs`` makes them); None: a fresh key
    for this process (the ledger's header names its public key either way)."""
    if path is None:
        return Ed25519PrivateKey.generate()
    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ValueError(f"ledger signing key {path}: {exc}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ValueError(f"ledger signing key {path} is not an Ed25519 private key")
    return key


def public_key_hex(key: Ed25519PrivateKey | Ed25519PublicKey) -> str:
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return raw.hex()


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def run_file_name(run_id: str) -> str:
    """A run id made safe for a file name (it comes from a configuration or a peer)."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", run_id)[:100]


def aside_path(path: Path, run_id: str) -> Path:
    """Where an older run's file or directory is kept: ``<path>.<run id>`` (e.g.
    ``ledger.jsonl.<run id>``), never over an earlier one (``.1``, ``.2``, ...)."""
    base = path.with_name(f"{path.name}.{run_file_name(run_id)}")
    target, n = base, 0
    while target.exists():
        n += 1
        target = base.with_name(f"{base.name}.{n}")
    return target


def _cut_torn_tail(path: Path) -> None:
    """Cut an unterminated last line (a write torn by a crash) off the file, keeping its bytes
    in ``<file>.torn`` for an audit."""
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1
    if keep == len(data):
        return
    with path.with_name(path.name + ".torn").open("ab") as f:
        f.write(data[keep:] + b"\n")
    fd = os.open(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, keep)
        os.fsync(fd)
    finally:
        os.close(fd)


@dataclass
class Ledger:
    """One server's ledger file (``path``; None: in memory only, nothing survives the
    process). Opening an existing file continues it (same run) after verifying it."""

    path: Path | None
    key: Ed25519PrivateKey
    header: dict[str, Any]
    lines: list[bytes] = field(default_factory=list)
    _releases: int | None = field(default=None, init=False, repr=False, compare=False)
    _head: str | None = field(default=None, init=False, repr=False, compare=False)
    _closed: bool = field(default=False, init=False, repr=False, compare=False)

    @classmethod
    def open(cls, path: Path | None, key: Ed25519PrivateKey, header: Mapping[str, Any]) -> Ledger:
        """Continue the ledger at ``path`` if it holds this run (its header's run_id and
        plan), else start one with ``header`` (an older run's file is kept aside as
        ``ledger.jsonl.<run_id>``)."""
        fields = {**header, "kind": "header", "format": FORMAT, "public_key": public_key_hex(key)}
        if fields.get("peer_public_key") == fields["public_key"]:
            raise LedgerError("the peer server's ledger key is this server's own")
        ledger = cls(path, key, dict(fields))
        if path is not None and path.exists():
            _cut_torn_tail(path)
            existing = read_ledger_lines(path)
            if existing:
                try:
                    first = json.loads(existing[0])
                except ValueError:
                    first = None
                if not isinstance(first, dict):
                    raise LedgerError(f"{path}: line 1 is not a ledger header; not touching it")
                same = first.get("run_id") == fields.get("run_id") and first.get(
                    "plan_sha256"
                ) == fields.get("plan_sha256")
                if same:
                    try:
                        verify_ledger(existing)  # a damaged ledger is never extended
                    except LedgerError as exc:
                        raise LedgerError(f"{path}: {exc}; not extending it") from None
                    ledger.header = first
                    ledger.lines = existing
                    if first.get("public_key") != fields["public_key"]:
                        raise LedgerError(
                            f"{path}: written with another signing key; configure the same "
                            "ledger_key to continue this run"
                        )
                    if first.get("peer_public_key") != fields.get("peer_public_key"):
                        raise LedgerError(
                            f"{path}: this run's ledger names another signing key for the "
                            f"peer server {first.get('peer')!r} than the one it now presents"
                        )
                    return ledger
                path.replace(aside_path(path, str(first.get("run_id") or "old")))
        ledger._append(dict(fields))
        return ledger

    @property
    def releases(self) -> int:
        """How many release entries the ledger holds (what the accountant counts)."""
        if self._releases is None:  # counted once, then kept up to date by _append
            self._scan()
        assert self._releases is not None
        return self._releases

    @property
    def head(self) -> str:
        """The ledger head: :func:`plan_digest` of the header, then the hash of the last
        co-signed release statement (what the next release statement names as ``chain``)."""
        if self._head is None:
            self._scan()
        assert self._head is not None
        return self._head

    @property
    def closed(self) -> bool:
        """Whether the run's closing entry is written (nothing follows it)."""
        if self._releases is None:
            self._scan()
        return self._closed

    def _scan(self) -> None:
        self._releases, self._head, self._closed = 0, plan_digest(self.header), False
        for line in self.lines[1:]:
            entry = json.loads(line)
            if entry.get("kind") == "release":
                self._releases += 1
                self._head = chain_after(entry)
            elif entry.get("kind") == "close":
                self._closed = True

    def _append(self, entry: dict[str, Any]) -> dict[str, Any]:
        entry["prev"] = _sha256(self.lines[-1]) if self.lines else None
        entry.pop("sig", None)
        entry["sig"] = self.key.sign(canonical(entry)).hex()
        line = canonical(entry)
        if self.path is not None:
            # Durable before the caller goes on: O_APPEND + fsync of the file (and of the
            # directory when the file is new, so the entry survives a crash).
            new = not self.path.exists()
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                _write_whole_line(fd, line + b"\n")
                os.fsync(fd)
            finally:
                os.close(fd)
            if new:
                dfd = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(dfd)
                finally:
                    os.close(dfd)
        if entry.get("kind") == "release":
            self._releases, self._head = self.releases + 1, chain_after(entry)
        elif entry.get("kind") == "close":
            self._closed = True
        self.lines.append(line)
        return entry

    def _release_fields(
        self,
        round_number: int,
        noise_samples: int,
        clip_norm: float,
        epsilon_after: float,
        release: str | None = None,
    ) -> dict[str, Any]:
        if self.closed:
            raise LedgerError(f"round {round_number}: this run's ledger is closed: no release")
        return release_statement(
            self.header,
            round_number,
            noise_samples,
            clip_norm,
            index=self.releases,
            epsilon_after=epsilon_after,
            chain=self.head,
            release=release,
        )

    def statement(
        self,
        round_number: int,
        noise_samples: int,
        clip_norm: float,
        epsilon_after: float,
        release: str | None = None,
    ) -> tuple[bytes, bytes]:
        """(statement, this server's signature over it) for the next release, of
        ``round_number`` (running epsilon ``epsilon_after``; ``release``: see
        :func:`release_statement`): what the peer server checks and co-signs
        (CosignRelease)."""
        data = statement_bytes(
            self._release_fields(round_number, noise_samples, clip_norm, epsilon_after, release)
        )
        return data, self.key.sign(data)

    def _with_peer_sig(self, entry: dict[str, Any], peer_sig: bytes | None, what: str) -> None:
        """Two-server runs (the header names a peer key) need ``peer_sig``, the other
        server's signature over the entry's statement, checked here."""
        peer_key = self.header.get("peer_public_key")
        if peer_key is not None:
            if peer_sig is None or not verify_statement(peer_key, statement_bytes(entry), peer_sig):
                raise LedgerError(
                    f"{what}: no valid signature of the peer server "
                    f"{self.header.get('peer')!r} over the entry"
                )
            entry["peer_sig"] = peer_sig.hex()
        elif peer_sig is not None:
            raise LedgerError("a one-server ledger takes no peer signature")

    def record_release(
        self,
        round_number: int,
        noise_samples: int,
        epsilon_after: float,
        peer_sig: bytes | None = None,
        *,
        clip_norm: float,
        release: str | None = None,
    ) -> int:
        """Write-ahead entry for one release (call it, then release). Returns its index.
        Two-server runs need ``peer_sig`` over :meth:`statement`."""
        entry = self._release_fields(round_number, noise_samples, clip_norm, epsilon_after, release)
        self._with_peer_sig(entry, peer_sig, f"round {round_number}")
        index = entry["index"]
        entry["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._append(entry)
        return index

    def close_statement(self) -> tuple[bytes, bytes]:
        """(statement, this server's signature) of the closing entry at the current head."""
        data = statement_bytes(close_statement(self.header, self.releases, self.head))
        return data, self.key.sign(data)

    def record_close(self, peer_sig: bytes | None = None) -> None:
        """The closing entry (two-server runs: co-signed, ``peer_sig`` over
        :meth:`close_statement`): the run ended, no release follows. Once only."""
        if self.closed:
            return
        entry = close_statement(self.header, self.releases, self.head)
        self._with_peer_sig(entry, peer_sig, "the closing entry")
        entry["time"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self._append(entry)

    def record_released(self, index: int, round_number: int, vector_sha256: str) -> None:
        """What was released for entry ``index`` (the vector's SHA-256)."""
        self._append(
            {
                "kind": "released",
                "index": int(index),
                "round": int(round_number),
                "vector_sha256": vector_sha256,
            }
        )


@dataclass
class LedgerReport:
    """What :func:`verify_ledger` found."""

    run_id: str
    server: str
    public_key: str
    peer_public_key: str | None  # the other server's key (None: a one-server mode)
    steps: int  # release entries: every one counted (the feature statistics' included)
    released: int  # of which a released line followed
    epsilon: float | None  # re-accounted from the entries (None: no noise, not DP)
    epsilon_recorded: float | None  # the last release entry's own count
    delta: float | None  # the accountant's (the header's), None without DP
    noise_samples: int
    # The delta of the guarantee: the accountant's plus the sampler's distance and the capped
    # Poisson batches (spgc.privacy.accounting.reported_delta, as the servers report it).
    delta_reported: float | None = None
    signatures_valid: bool = True
    cosigned: bool = False  # every release entry also carries the peer server's signature
    keys_pinned: bool = False  # both keys matched the expected ones, each in its role
    clip: dict[str, Any] | None = None  # the header's clip rule (fixed or adaptive)
    clip_norms: list[float] | None = None  # each release's clip norm, in order
    # How the servers evaluated the circuits (gc or gmw; bound by plan_sha256), as the header
    # names it ("gc" for a ledger that predates the field).
    backend: str = "gc"
    # l2: the servers checked every provider's norm proof (the header's verify_inputs).
    verify_inputs: str = "none"
    # The guarantee's neighbouring relation (spgc.privacy.accounting.adjacency_of), from the
    # header's
    # sampling: "add/remove one example", "... one provider", "replace one example"; None
    # without DP.
    adjacency: str | None = None
    # The co-signed ledger head after the last release entry (plan_digest with none), and
    # whether a closing entry (co-signed in two-server modes) says no release follows it.
    head: str = ""
    closed: bool = False
    # The head after 0, 1, ..., steps release entries (what a model's head is checked against).
    heads: list[str] = field(default_factory=list, repr=False)
    # Of the release entries, the feature statistics' (standardize: true; 0 or 1).
    feature_stats_releases: int = 0
    # noise_floor (issue 46): {"fraction", "coordinates", "epsilon": {figure: eps or None}};
    # None without one.
    noise_floor: dict[str, Any] | None = None

    def as_dict(self) -> dict[str, Any]:
        # noise_floor only when the plan has one: a ledger without it reports as before.
        return {
            k: v
            for k, v in self.__dict__.items()
            if k != "heads" and not (k == "noise_floor" and v is None)
        }


def _entries(lines: list[bytes]) -> Iterator[tuple[int, bytes, dict[str, Any]]]:
    for number, raw in enumerate(lines, start=1):
        try:
            entry = json.loads(raw)
        except ValueError:
            raise LedgerError(f"line {number}: not JSON") from None
        if not isinstance(entry, dict):
            raise LedgerError(f"line {number}: not a JSON object")
        yield number, raw, entry


def verify_ledger(
    source: Path | str | list[bytes], expected_keys: Mapping[str, str] | None = None
) -> LedgerReport:
    """Check the chain and every signature and re-account epsilon from the release entries.
    LedgerError naming the line on a broken chain, a bad signature, a header whose keys are not
    ``expected_keys`` (role -> hex public key, each pinned to its role: the header's own key to
    its ``server``, its peer's to ``peer``), a recorded epsilon below the re-accounted one (an
    under-count), or above it (release entries missing)."""
    if isinstance(source, list):
        lines = [line for line in source if line.strip()]
    else:
        try:
            lines = read_ledger_lines(Path(source))
        except OSError as exc:
            raise LedgerError(f"cannot read the ledger: {exc}") from None
    if not lines:
        raise LedgerError("the ledger is empty")
    header: dict[str, Any] = {}
    public: Ed25519PublicKey | None = None
    prev: bytes | None = None
    steps = released = samples = stats_releases = 0
    recorded: float | None = None
    recorded_line = 0  # the last release entry's line
    rounds: dict[int, int] = {}  # release index -> its round
    clip_norms: list[float] = []
    seen_released: set[int] = set()
    heads: list[str] = []  # the co-signed head after 0, 1, ... release entries
    closed_line = 0
    for number, raw, entry in _entries(lines):
        want = None if prev is None else _sha256(prev)
        if entry.get("prev") != want:
            raise LedgerError(f"line {number}: broken chain (prev does not hash line {number - 1})")
        if closed_line:
            raise LedgerError(
                f"line {number}: follows the closing entry (line {closed_line}): a closed "
                "run's ledger holds nothing after it"
            )
        if number == 1:
            public = _check_header(entry, expected_keys)
            header = entry
            heads.append(plan_digest(header))
        assert public is not None
        unsigned = {k: v for k, v in entry.items() if k != "sig"}
        try:
            public.verify(bytes.fromhex(str(entry.get("sig", ""))), canonical(unsigned))
        except (InvalidSignature, ValueError):
            raise LedgerError(f"line {number}: bad signature") from None
        if canonical(entry) != raw:
            raise LedgerError(f"line {number}: not in canonical form")
        kind = entry.get("kind")
        if kind == "release":
            if not _is_int(entry.get("index")) or entry["index"] != steps:
                raise LedgerError(f"line {number}: release index {entry.get('index')}, "
                                  f"expected {steps}")  # fmt: skip
            _check_cosigned(number, entry, header, heads[-1])
            count = entry.get("noise_samples")
            if not _is_int(count) or count < 0 or not _is_int(entry.get("round")):
                raise LedgerError(f"line {number}: round and noise_samples must be integers >= 0")
            after = entry.get("epsilon_after")
            if after is not None and not (
                isinstance(after, (int, float)) and not isinstance(after, bool) and after >= 0
            ):
                raise LedgerError(f"line {number}: epsilon_after must be a number >= 0 or null")
            if recorded_line and _above(recorded, after):
                raise LedgerError(
                    f"line {number}: epsilon_after {after} is below the previous entry's {recorded}"
                )
            if _is_feature_stats(number, entry, header, steps):
                stats_releases += 1
            else:
                clip_norms.append(_release_clip_norm(number, entry, header["clip"]))
            rounds[steps] = entry["round"]
            steps += 1
            samples += count
            recorded, recorded_line = after, number
            heads.append(chain_after(entry))
        elif kind == "close":
            _check_cosigned(number, entry, header, heads[-1])
            if entry.get("releases") != steps:
                raise LedgerError(
                    f"line {number}: the closing entry counts {entry.get('releases')!r} "
                    f"releases, the ledger holds {steps}"
                )
            closed_line = number
        elif kind == "released":
            index = entry.get("index")
            if not _is_int(index) or index not in rounds:
                raise LedgerError(f"line {number}: released index {index!r} has no release entry "
                                  "before it")  # fmt: skip
            if index in seen_released:
                raise LedgerError(f"line {number}: a second released line for index {index}")
            if entry.get("round") != rounds[index]:
                raise LedgerError(
                    f"line {number}: round {entry.get('round')!r}, but release {index} was "
                    f"for round {rounds[index]}"
                )
            seen_released.add(index)
            released += 1
        elif number != 1:
            raise LedgerError(f"line {number}: unknown kind {kind!r}")
        prev = raw
    epsilon = _reaccount(header, steps - stats_releases, stats_releases)
    # A recorded null with noise is an infinite epsilon (JSON has no Infinity).
    if epsilon is not None and steps and _above(epsilon, recorded, EPSILON_TOLERANCE):
        raise LedgerError(
            f"line {recorded_line}: the {steps} release entries re-account to epsilon "
            f"{epsilon:.6g}, above the recorded {recorded}"
        )
    if epsilon is not None and steps and _above(recorded, epsilon, EPSILON_TOLERANCE):
        # The server counts every release it made: a recorded figure above what the entries
        # give means release entries are missing (a cut-off ledger that was continued).
        raise LedgerError(
            f"line {recorded_line}: the server recorded epsilon {recorded} after its releases, "
            f"but the {steps} release entries here re-account to only {epsilon:.6g}: entries "
            "are missing"
        )
    delta_reported = None
    if epsilon is not None and math.isfinite(epsilon):
        capped = capped_poisson(header.get("sampling") or {}, header["max_batch_size"])
        delta_reported = reported_delta(
            float(header["delta"]), epsilon, samples, steps if capped else 0
        )
    return LedgerReport(
        run_id=str(header.get("run_id", "")),
        server=str(header.get("server", "")),
        public_key=str(header.get("public_key", "")),
        peer_public_key=header.get("peer_public_key"),
        steps=steps,
        released=released,
        epsilon=epsilon,
        epsilon_recorded=recorded,
        delta=header.get("delta") if epsilon is not None else None,
        noise_samples=samples,
        delta_reported=delta_reported,
        cosigned=header.get("peer_public_key") is not None,
        keys_pinned=expected_keys is not None,
        clip=header.get("clip"),
        clip_norms=clip_norms,
        backend=str(header["backend"]),
        verify_inputs=str(header["verify_inputs"]),
        adjacency=None if epsilon is None else _adjacency(header),
        head=heads[-1],
        closed=bool(closed_line),
        heads=heads,
        feature_stats_releases=stats_releases,
        noise_floor=_floor_report(header, steps),
    )


def _floor_report(header: Mapping[str, Any], steps: int) -> dict[str, Any] | None:
    floor = header.get("noise_floor")
    if floor is None:
        return None
    return {**floor, "epsilon": floor_epsilons(header, steps)}


def _is_feature_stats(
    number: int, entry: Mapping[str, Any], header: Mapping[str, Any], index: int
) -> bool:
    """Whether a release entry is the feature statistics' release: once, as the first
    release, of a plan whose header names it; LedgerError for any other ``release`` value or
    place."""
    what = entry.get("release")
    if what is None:
        return False
    if what != FEATURE_STATS_RELEASE:
        raise LedgerError(f"line {number}: unknown release {what!r}")
    if header.get("feature_stats") is None:
        raise LedgerError(
            f"line {number}: a feature statistics release, but the header's plan has none"
        )
    if index != 0:
        raise LedgerError(
            f"line {number}: the feature statistics are released once, before the first step; "
            f"this is release {index}"
        )
    return True


def _check_cosigned(
    number: int, entry: Mapping[str, Any], header: Mapping[str, Any], head: str
) -> None:
    """A release or closing entry: the header's plan repeated, its keys as signers, the head
    before it as ``chain``, and (two-server modes) the peer's signature over its statement."""
    for key in (*PLAN_KEYS, *OPTIONAL_PLAN_KEYS):
        if entry.get(key) != header.get(key):
            raise LedgerError(f"line {number}: {key} differs from the header's")
    if entry.get("signers") != signers(header):
        raise LedgerError(f"line {number}: signers differ from the header's keys")
    if entry.get("chain") != head:
        raise LedgerError(
            f"line {number}: chain does not name the co-signed entry before it (a release "
            "entry was dropped, moved or changed before this one)"
        )
    peer_hex = header.get("peer_public_key")
    if peer_hex is not None and not verify_statement(
        peer_hex, statement_bytes(entry), _hex_bytes(entry.get("peer_sig"))
    ):
        raise LedgerError(
            f"line {number}: bad or missing signature of the peer server "
            f"{header.get('peer')!r} (peer_sig)"
        )


def _adjacency(header: Mapping[str, Any]) -> str:
    sampling = header.get("sampling") or {}
    return adjacency_of(
        str(sampling.get("sampling", "poisson")), str(sampling.get("unit", "example"))
    )


def _check_header(entry: dict[str, Any], expected_keys: Mapping[str, str] | None) -> Any:
    """Line 1: a header of this format whose roles and keys make sense (and are the pinned
    ones); returns its public key. LedgerError naming what is wrong."""
    if entry.get("kind") != "header":
        raise LedgerError("line 1: not a ledger header")
    if entry.get("format") != FORMAT:
        old = {
            1: " (written before delta and accountant were co-signed)",
            2: " (written before the clip norms were co-signed)",
            3: " (written before backend, verify_inputs, each release's index and epsilon and "
            "the chain of co-signed entries were co-signed, and before closing entries)",
        }.get(entry.get("format"), "")  # type: ignore[arg-type]
        raise LedgerError(
            f"line 1: ledger format {entry.get('format')!r}{old}; this version verifies format "
            f"{FORMAT} only"
        )
    for key in PLAN_KEYS:
        if key not in entry:
            raise LedgerError(f"line 1: the header has no {key}")
    if not _is_int(entry.get("max_batch_size")) or entry["max_batch_size"] < 0:
        raise LedgerError("line 1: max_batch_size must be an integer >= 0")
    for key in ("backend", "verify_inputs"):
        if not isinstance(entry.get(key), str):
            raise LedgerError(f"line 1: {key} must be a string")
    _check_clip(entry["clip"], entry.get("noise_multiplier"))
    if "feature_stats" in entry:
        _check_feature_stats(entry["feature_stats"])
    _check_noise_floor(entry.get("noise_floor"), entry.get("noise_multiplier"))
    if "noise_floor" in entry and "feature_stats" in entry:
        raise LedgerError("line 1: a noise_floor with feature_stats (no server writes both)")
    try:
        public = Ed25519PublicKey.from_public_bytes(bytes.fromhex(entry["public_key"]))
    except (KeyError, TypeError, ValueError):
        raise LedgerError("line 1: no valid public_key") from None
    server, peer = entry.get("server"), entry.get("peer")
    if server not in ROLES:
        raise LedgerError(f"line 1: server {server!r} is not a role ({', '.join(ROLES)})")
    peer_hex = entry.get("peer_public_key")
    two = _servers(entry.get("mode")) == 2
    if two:
        if peer_hex is None:
            raise LedgerError(
                f"line 1: mode {entry.get('mode')!r} has two servers but the header names no "
                "peer_public_key"
            )
        if peer not in ROLES or peer == server:
            raise LedgerError(f"line 1: peer {peer!r} is not the other role than {server!r}")
        try:
            Ed25519PublicKey.from_public_bytes(bytes.fromhex(peer_hex))
        except (TypeError, ValueError):
            raise LedgerError("line 1: peer_public_key is not an Ed25519 key") from None
        if str(peer_hex).lower() == str(entry["public_key"]).lower():
            raise LedgerError(
                "line 1: the header names this server's own key as the peer server's: no "
                "second server co-signed this ledger"
            )
    elif peer_hex is not None:
        raise LedgerError(f"line 1: mode {entry.get('mode')!r} has one server but names a peer")
    if expected_keys is not None:
        pinned = {role: key.lower() for role, key in expected_keys.items()}
        named = {server: entry["public_key"]}
        if two:
            named[peer] = peer_hex
        for role, key in named.items():
            if role not in pinned:
                raise LedgerError(f"line 1: no key pinned for {role} (--keys {role}=PEM)")
            if str(key).lower() != pinned[role]:
                which = "this server's public_key" if role == server else "peer_public_key"
                raise LedgerError(f"line 1: {which} is not the key pinned for {role} (--keys)")
    return public


def _check_feature_stats(plan: Any) -> None:
    """The header's feature_stats: the release's noise multiplier and sensitivity (> 0) and
    its feature count (an integer >= 1)."""
    if not isinstance(plan, dict) or set(plan) != {
        "noise_multiplier",
        "sensitivity_units",
        "features",
    }:
        raise LedgerError(
            "line 1: feature_stats must be {noise_multiplier, sensitivity_units, features}"
        )
    if not (_number(plan["noise_multiplier"]) and plan["noise_multiplier"] > 0):
        raise LedgerError("line 1: feature_stats' noise_multiplier must be a number > 0")
    if not (_number(plan["sensitivity_units"]) and plan["sensitivity_units"] > 0):
        raise LedgerError("line 1: feature_stats' sensitivity_units must be a number > 0")
    if not (_is_int(plan["features"]) and plan["features"] >= 1):
        raise LedgerError("line 1: feature_stats' features must be an integer >= 1")


def _number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and value > 0
    )


def _check_clip(clip: Any, noise_multiplier: Any) -> None:
    """The header's clip rule: fixed with its C, or adaptive with both noises, which together
    must be no weaker than the one Gaussian of ``noise_multiplier`` the entries are accounted
    with (1 / z^2 >= 1 / z_update^2 + 1 / sigma_count^2, spgc.privacy.clipping)."""
    if not isinstance(clip, dict) or clip.get("rule") not in ("fixed", "adaptive", "decay"):
        raise LedgerError("line 1: clip must be {rule: fixed|adaptive|decay, ...}")
    if clip["rule"] == "fixed":
        if not _number(clip.get("clip_norm")):
            raise LedgerError("line 1: clip.clip_norm must be a number > 0")
        return
    if clip["rule"] == "decay":
        _decay_rule(clip)
        return
    keys = ("initial_norm", "learning_rate", "update_noise_multiplier", "count_noise_std")
    for key in (*keys, "target_quantile"):
        if not _number(clip.get(key)):
            raise LedgerError(f"line 1: clip.{key} must be a number > 0")
    if not (isinstance(noise_multiplier, (int, float)) and noise_multiplier > 0):
        raise LedgerError("line 1: adaptive clipping without noise (noise_multiplier 0)")
    pair = (clip["update_noise_multiplier"] ** -2 + clip["count_noise_std"] ** -2) ** -0.5
    if pair < noise_multiplier * (1 - 1e-9):
        raise LedgerError(
            f"line 1: the update's noise multiplier {clip['update_noise_multiplier']:.6g} and "
            f"the count's noise {clip['count_noise_std']:.6g} make a Gaussian of multiplier "
            f"{pair:.6g}, below the noise_multiplier {noise_multiplier:.6g} it is accounted with"
        )


def _check_noise_floor(floor: Any, noise_multiplier: Any) -> None:
    """The header's noise_floor: absent, or {"fraction": f in (0, 1), "coordinates": d >= 1}
    on a plan with noise."""
    if floor is None:
        return
    if not isinstance(floor, dict) or set(floor) != {"fraction", "coordinates"}:
        raise LedgerError('line 1: noise_floor must be {"fraction": f, "coordinates": d}')
    f, d = floor["fraction"], floor["coordinates"]
    if not (_number(f) and 0 < f < 1) or not (_is_int(d) and d >= 1):
        raise LedgerError(f"line 1: noise_floor {floor}: fraction in (0, 1), coordinates >= 1")
    if not (_number(noise_multiplier) and noise_multiplier > 0):
        raise LedgerError("line 1: a noise_floor without noise (noise_multiplier 0)")


def _release_clip_norm(number: int, entry: Mapping[str, Any], clip: Mapping[str, Any]) -> float:
    """A release entry's clip norm: the header's with a fixed rule, any C > 0 with adaptive
    clipping (the accounting does not depend on it: every row is bounded in units)."""
    value = entry.get("clip_norm")
    if not _number(value):
        raise LedgerError(f"line {number}: clip_norm must be a number > 0")
    if clip["rule"] == "fixed" and value != clip["clip_norm"]:
        raise LedgerError(f"line {number}: clip_norm {value} is not the header's fixed clip norm")
    if clip["rule"] == "decay":
        r = entry.get("round")
        if not _is_int(r) or r < 0:
            raise LedgerError(f"line {number}: round must be an integer >= 0")
        want = _decay_rule(clip).norm_at(r)
        if value != want:
            raise LedgerError(
                f"line {number}: clip_norm {value} is not the decay rule's {want} for round "
                f"{entry.get('round')}"
            )
    return float(value)


def _decay_rule(clip: Mapping[str, Any]) -> DecayClip:
    """The header's decay rule; LedgerError when its fields are malformed."""
    try:
        return DecayClip(float(clip["initial_norm"]), float(clip["rate"]), float(clip["floor"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise LedgerError(f"line 1: clip (decay) is malformed: {exc}") from None


def _servers(mode: Any) -> int:
    try:
        return get_mode(str(mode)).servers
    except ValueError:
        raise LedgerError(f"line 1: unknown mode {mode!r}") from None


def _hex_bytes(value: Any) -> bytes:
    try:
        return bytes.fromhex(str(value))
    except ValueError:
        return b""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _above(a: float | None, b: float | None, tolerance: float = 0.0) -> bool:
    """a > b + tolerance, where None stands for an infinite epsilon."""
    if b is None:
        return False
    if a is None:
        return True
    return a > b + tolerance


def _reaccount(header: Mapping[str, Any], steps: int, stats_releases: int = 0) -> float | None:
    """Epsilon after ``steps`` steps under the header's plan and ``stats_releases`` releases
    of the feature statistics, composed unsampled (None without noise)."""
    nm = header.get("noise_multiplier") or 0.0
    try:
        if nm <= 0:
            return None
        if header.get("noise_floor") is not None:  # the plan's figure: one curious server
            epsilon = (floor_epsilons(header, steps) or {}).get("curious_server")
            return math.inf if epsilon is None else epsilon
        sampling = dict(header.get("sampling") or {})
        unsampled = (
            [float(header["feature_stats"]["noise_multiplier"])] * stats_releases
            if stats_releases
            else []
        )
        acc = PrivacyAccountant(
            float(nm),
            float(header["delta"]),
            method=header.get("accountant", "rdp"),
            unsampled=unsampled,
            **sampling,
        )
        epsilon = acc.epsilon_after(steps)
    except (KeyError, TypeError, ValueError) as exc:
        raise LedgerError(f"line 1: the header's plan cannot be re-accounted: {exc}") from None
    return epsilon

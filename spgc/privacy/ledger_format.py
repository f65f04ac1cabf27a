"""The privacy ledger's format (spgc.privacy.ledger has the whole description): the
canonical JSON of an entry, the plan fields, the co-signed statements of a release and of the
close, the chain, the Ed25519 keys, and reading a ledger file."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

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
# (spgc.privacy.noise_floor). security (issue 46): "malicious" (absent: semi-honest).
OPTIONAL_PLAN_KEYS = ("feature_stats", "noise_floor", "security")
# The fields of an ``abort`` entry, signed by its server alone (the peer it caught deviating
# does not co-sign): the round, the engine's check that failed (its message, at most
# MAX_CHECK_CHARS characters), what the evidence digest is of ("transcript": the SHA-256 of
# everything the peer sent in the round's last engine run; "message": of the check's message,
# where the engine keeps no transcript digest) and the digest (64 hex characters).
ABORT_KEYS = ("round", "check", "evidence", "evidence_digest")
EVIDENCE_KINDS = ("transcript", "message")
MAX_CHECK_CHARS = 500
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


def abort_line(abort: Mapping[str, Any]) -> str:
    """An abort entry's fields (:data:`ABORT_KEYS`) in one line, as the server stops with it
    and ``spgc account`` prints it."""
    return (
        f"aborted at round {abort.get('round')}: the peer deviated (check: "
        f"{abort.get('check')}, evidence digest {abort.get('evidence_digest')}, of the "
        f"{abort.get('evidence')})"
    )


def is_sha256_hex(value: Any) -> bool:
    """Whether ``value`` is a SHA-256 written as 64 hex characters."""
    return (
        isinstance(value, str)
        and len(value) == 64
        and all(c in "0123456789abcdefABCDEF" for c in value)
    )


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

"""A server's training state on disk (``state_dir``), so that a restarted daemon continues its run.

Written after every published round, by both servers::

    checkpoint-<round>.npz     params, Adam's m and v (float64)
    history-<run>.jsonl        the run's ended rounds, one JSON line each, appended (the
                               round's providers included: a record that grows with every
                               round is never rewritten whole)
    checkpoint.json            run id, TrainingConfig digest, round, model version and hash,
                               steps (the accountant's), Adam's scalars, how much of the
                               history file it covers (lines, bytes, a SHA-256 chain over
                               them), and the name and SHA-256 of the .npz it goes with
    checkpoint.prev.json       the checkpoint before it (its .npz is kept too)

The JSON is written last (fsync, atomic rename): it is the commit point, so a crash leaves
either the previous checkpoint or the new one, never a mix. History lines past what the
committed JSON covers (a crash after the append, or a step back) are never read, and the next
save cuts them off before it appends. A checkpoint resumes only the same
training configuration; the two servers must resume the same round and model (checked at the
Handshake). H2 checkpoints a round before H1 does, so a crash of H1 in between leaves H2 one
published round ahead: the server ahead then steps back to its previous checkpoint
(:func:`step_back`) when that one is the other's, and the round runs again. Privacy: the
accountant is restored with every release the ledger holds, so the epsilon of a resumed run
counts all of them, the step-back's abandoned round included.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from spgc.common.durable import write_atomically
from spgc.wire import aggregation_pb2 as pb

__all__ = [
    "CheckpointError",
    "config_digest",
    "history_file_name",
    "load_checkpoint",
    "save_checkpoint",
    "step_back",
]

_FORMAT = 1  # the history inline ("history") or in its own file ("history_file"): both read
_NAME = "checkpoint.json"
_PREVIOUS = "checkpoint.prev.json"
_CHAIN_START = "0" * 64


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed (other configuration, damaged files)."""


def config_digest(config: pb.TrainingConfig) -> str:
    """SHA-256 of the TrainingConfig (deterministic serialisation): what must not change.
    The share encodings a server accepts are how shares travel, not the plan: left out, so a
    run keeps its digest (and resumes) across versions that accept more of them."""
    plan = pb.TrainingConfig()
    plan.CopyFrom(config)
    plan.ClearField("share_encodings")
    return hashlib.sha256(plan.SerializeToString(deterministic=True)).hexdigest()


def history_file_name(run_id: str) -> str:
    """The history file of run ``run_id`` (its name from a digest: any run id is safe)."""
    return f"history-{hashlib.sha256(run_id.encode('utf-8')).hexdigest()[:16]}.jsonl"


def _chain(digest: str, line: bytes) -> str:
    return hashlib.sha256(bytes.fromhex(digest) + line).hexdigest()


def _append_history(
    directory: Path, run_id: str, committed: dict[str, Any] | None, new: Sequence[dict[str, Any]]
) -> dict[str, Any]:
    """Append ``new`` rounds to the run's history file after what the ``committed`` record
    (the current checkpoint's, None: none) covers, cutting off lines past it first; fsynced.
    Returns the history fields of the record that will commit them."""
    name = history_file_name(run_id)
    covered = committed if committed and committed.get("history_file") == name else None
    lines, size, chain = (
        (int(covered["history_lines"]), int(covered["history_bytes"]), covered["history_sha256"])
        if covered
        else (0, 0, _CHAIN_START)
    )
    path = directory / name
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        if os.fstat(fd).st_size < size:
            raise CheckpointError(f"history file {path} is shorter than its checkpoint says")
        os.ftruncate(fd, size)  # lines no committed checkpoint covers: never read
        os.lseek(fd, size, os.SEEK_SET)
        for entry in new:
            line = json.dumps(entry, sort_keys=True, separators=(",", ":")).encode() + b"\n"
            view = memoryview(line)
            while view:
                view = view[os.write(fd, view) :]
            lines, size, chain = lines + 1, size + len(line), _chain(chain, line)
        os.fsync(fd)
    finally:
        os.close(fd)
    return {
        "history_file": name,
        "history_lines": lines,
        "history_bytes": size,
        "history_sha256": chain,
    }


def _read_history(directory: Path, record: dict[str, Any]) -> list[dict[str, Any]]:
    """The ended rounds ``record`` covers: inline (older checkpoints) or the first
    history_lines lines of its history file, checked against the SHA-256 chain."""
    if "history_file" not in record:
        return list(record.get("history", []))
    path = directory / str(record["history_file"])
    try:
        with path.open("rb") as f:
            data = f.read(int(record["history_bytes"]))
    except OSError as exc:
        raise CheckpointError(f"checkpoint history {path} is unreadable: {exc}") from None
    lines = data.splitlines(keepends=True)
    chain = _CHAIN_START
    for line in lines:
        chain = _chain(chain, line)
    if (
        len(data) != int(record["history_bytes"])
        or len(lines) != int(record["history_lines"])
        or chain != record["history_sha256"]
    ):
        raise CheckpointError(f"checkpoint history {path} is damaged or cut short")
    try:
        return [json.loads(line) for line in lines]
    except ValueError as exc:
        raise CheckpointError(f"checkpoint history {path} is unreadable: {exc}") from None


def save_checkpoint(
    directory: Path,
    record: dict[str, Any],
    arrays: dict[str, np.ndarray],
    before_commit: Callable[[], None] | None = None,
    new_history: Sequence[dict[str, Any]] = (),
) -> None:
    """Store ``arrays`` (.npz) and ``record`` (JSON, which names the .npz) in ``directory``;
    the checkpoint it replaces becomes the previous one. ``new_history``: the rounds ended
    since the current checkpoint's history (appended to the run's history file; the record
    holds no "history" of its own). ``before_commit`` runs between the arrays and the commit
    record (a crash test's fault point)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    name = f"checkpoint-{int(record['round']):08d}.npz"  # one per round: never overwritten
    current = directory / _NAME
    committed = json.loads(current.read_text()) if current.exists() else None
    previous = committed
    if previous is not None and previous.get("arrays") == name:
        previous = None  # the same round again: the older checkpoint stays the previous one
    if previous is not None:
        write_atomically(directory / _PREVIOUS, current.read_bytes())
    write_atomically(directory / name, data)
    history = _append_history(directory, str(record["run_id"]), committed, new_history)
    if before_commit is not None:
        before_commit()
    record = {
        **record,
        **history,
        "format": _FORMAT,
        "arrays": name,
        "arrays_sha256": hashlib.sha256(data).hexdigest(),
    }
    write_atomically(current, json.dumps(record, indent=1, sort_keys=True).encode())
    keep = {name}
    keep_history = {history["history_file"]}
    if (directory / _PREVIOUS).exists():
        kept = json.loads((directory / _PREVIOUS).read_text())
        keep.add(str(kept.get("arrays")))
        keep_history.add(str(kept.get("history_file")))
    for old in directory.glob("checkpoint-*.npz"):
        if old.name not in keep:
            old.unlink(missing_ok=True)
    for old in directory.glob("history-*.jsonl"):
        if old.name not in keep_history:  # another run's, no checkpoint left to read it
            old.unlink(missing_ok=True)


def step_back(directory: Path) -> None:
    """Make the previous checkpoint the current one (atomic; the newer one is dropped)."""
    previous = directory / _PREVIOUS
    if not previous.exists():
        raise CheckpointError(f"no previous checkpoint in {directory}")
    write_atomically(directory / _NAME, previous.read_bytes())
    previous.unlink()


def load_checkpoint(
    directory: Path, previous: bool = False
) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """(record, arrays) of the last checkpoint in ``directory`` (``previous``: of the one
    before it); None if there is none. The record's "history" is the ended rounds it covers
    (read from the history file, checked)."""
    path = directory / (_PREVIOUS if previous else _NAME)
    if not path.exists():
        return None
    try:
        record = json.loads(path.read_text())
        data = (directory / record["arrays"]).read_bytes()
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"checkpoint in {directory} is unreadable: {exc}") from None
    if record.get("format") != _FORMAT:
        raise CheckpointError(f"checkpoint in {directory} has format {record.get('format')!r}")
    if hashlib.sha256(data).hexdigest() != record["arrays_sha256"]:
        raise CheckpointError(f"checkpoint arrays {record['arrays']} in {directory} are damaged")
    with np.load(io.BytesIO(data), allow_pickle=False) as npz:
        arrays = {k: npz[k] for k in npz.files}
    record["history"] = _read_history(directory, record)
    return record, arrays

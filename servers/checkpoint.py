"""A server's training state on disk (``state_dir``), so that a restarted daemon continues its run.

Written after every published round, by both servers::

    checkpoint-<round>.npz     params, Adam's m and v (float64)
    checkpoint.json            run id, TrainingConfig digest, round, model version and hash,
                               steps (the accountant's), Adam's scalars, the round history,
                               and the name and SHA-256 of the .npz it goes with
    checkpoint.prev.json       the checkpoint before it (its .npz is kept too)

The JSON is written last (fsync, atomic rename): it is the commit point, so a crash leaves
either the previous checkpoint or the new one, never a mix. A checkpoint resumes only the same
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from spgc.common.durable import write_atomically
from spgc.wire import aggregation_pb2 as pb

__all__ = ["CheckpointError", "config_digest", "load_checkpoint", "save_checkpoint", "step_back"]

_FORMAT = 1
_NAME = "checkpoint.json"
_PREVIOUS = "checkpoint.prev.json"


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


def save_checkpoint(
    directory: Path,
    record: dict[str, Any],
    arrays: dict[str, np.ndarray],
    before_commit: Callable[[], None] | None = None,
) -> None:
    """Store ``arrays`` (.npz) and ``record`` (JSON, which names the .npz) in ``directory``;
    the checkpoint it replaces becomes the previous one. ``before_commit`` runs between the
    arrays and the commit record (a crash test's fault point)."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    name = f"checkpoint-{int(record['round']):08d}.npz"  # one per round: never overwritten
    current = directory / _NAME
    previous = json.loads(current.read_text()) if current.exists() else None
    if previous is not None and previous.get("arrays") == name:
        previous = None  # the same round again: the older checkpoint stays the previous one
    if previous is not None:
        write_atomically(directory / _PREVIOUS, current.read_bytes())
    write_atomically(directory / name, data)
    if before_commit is not None:
        before_commit()
    record = {
        **record,
        "format": _FORMAT,
        "arrays": name,
        "arrays_sha256": hashlib.sha256(data).hexdigest(),
    }
    write_atomically(current, json.dumps(record, indent=1, sort_keys=True).encode())
    keep = {name}
    if (directory / _PREVIOUS).exists():
        keep.add(str(json.loads((directory / _PREVIOUS).read_text()).get("arrays")))
    for old in directory.glob("checkpoint-*.npz"):
        if old.name not in keep:
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
    before it); None if there is none."""
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
    return record, arrays

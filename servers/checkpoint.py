"""A server's training state on disk (``state_dir``), so that a restarted daemon continues its run.

Written after every published round, by both servers::

    checkpoint-<version>.npz   params, Adam's m and v (float64)
    checkpoint.json            run id, TrainingConfig digest, round, model version and hash,
                               steps (the accountant's), Adam's scalars, the round history,
                               and the name and SHA-256 of the .npz it goes with

The JSON is written last (fsync, atomic rename): it is the commit point, so a crash leaves
either the previous checkpoint or the new one, never a mix. A checkpoint resumes only the same
training configuration; the two servers must resume the same round and model (checked at the
Handshake). Privacy: the accountant is restored with every step already released, so the
epsilon of a resumed run counts all of them.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np

from spgc.servers.private_files import write_private
from spgc.wire import aggregation_pb2 as pb

__all__ = ["CheckpointError", "config_digest", "load_checkpoint", "save_checkpoint"]

_FORMAT = 1
_NAME = "checkpoint.json"


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed (other configuration, damaged files)."""


def config_digest(config: pb.TrainingConfig) -> str:
    """SHA-256 of the TrainingConfig (deterministic serialisation): what must not change."""
    return hashlib.sha256(config.SerializeToString(deterministic=True)).hexdigest()


def save_checkpoint(directory: Path, record: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
    """Store ``arrays`` (.npz) and ``record`` (JSON, which names the .npz) in ``directory``."""
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    data = buf.getvalue()
    name = f"checkpoint-{int(record['version']):08d}.npz"
    write_private(directory / name, data)
    record = {
        **record,
        "format": _FORMAT,
        "arrays": name,
        "arrays_sha256": hashlib.sha256(data).hexdigest(),
    }
    write_private(directory / _NAME, json.dumps(record, indent=1, sort_keys=True).encode())
    for old in directory.glob("checkpoint-*.npz"):
        if old.name != name:
            old.unlink(missing_ok=True)


def load_checkpoint(directory: Path) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """(record, arrays) of the last checkpoint in ``directory``; None if there is none."""
    path = directory / _NAME
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

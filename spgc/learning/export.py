"""The trained model as a ``.safetensors`` file beside a JSON privacy report (docs/EXPORT.md).

The servers hold the model as one float64 vector; an export loads it into the run's torch module
and writes that module's own state dict, so ``module.load_state_dict(load_file(path))`` works
on the user's copy of the architecture. The report says what guarantee the weights carry: the
mode, whether it is differentially private, epsilon and delta after ``steps`` released steps,
and the noise, sampling and sensitivity they were accounted with. It is written twice: as
``<name>.json`` for people, and in the file's metadata so that the weights never travel without
it. The model is the run's public (DP) output, so the files are world-readable.

A run with ``standardize: true`` trained on features standardised with privately released
means and deviations (spgc.privacy.feature_stats): the report carries them
(``feature_standardization``) and :func:`load_model` puts them in front of the model, so that a
user feeds raw features exactly as the providers held them.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import safetensors
import safetensors.torch
import torch
from torch import nn

from spgc import __version__
from spgc.learning.models import load_flat_params, parameter_count
from spgc.privacy.accounting import adjacency_of
from spgc.privacy.feature_stats import Standardization
from spgc.protocol.modes import DEFAULT_SECURITY, get_mode

__all__ = [
    "StandardizedInputs",
    "load_export",
    "load_model",
    "model_state_tensors",
    "privacy_report",
    "read_report",
    "standardization_of",
    "write_export",
]

SUFFIX = ".safetensors"
REPORT_KEY = "spgc_privacy_report"  # the metadata entry holding the report (compact JSON)
_FORMAT = 1


def model_state_tensors(model: nn.Module, flat: np.ndarray) -> dict[str, torch.Tensor]:
    """Load ``flat`` (float64, ``model.parameters()`` order) into ``model`` and return its
    state dict as contiguous CPU tensors under the module's own names."""
    load_flat_params(model, flat)
    # Cloned: safetensors refuses tensors that share storage (tied weights), and the caller
    # must not see later changes to the module.
    return {
        name: t.detach().to("cpu").contiguous().clone() for name, t in model.state_dict().items()
    }


def _finite_or_none(value: float | None) -> float | None:
    return None if value is None or not math.isfinite(value) else float(value)


def privacy_report(
    *,
    mode: str,
    epsilon: float,
    delta: float,
    steps: int,
    noise_multiplier: float,
    sampling: dict[str, Any],
    clip_norm: float,
    scale: float,
    sensitivity_units: float,
    model: str,
    num_parameters: int,
    version: int,
    rounds: int | None = None,
    run_id: str = "",
    dataset: str = "",
    accountant: str = "",
    model_sha256: str = "",
    releases: int | None = None,
    task: str = "classification",
    loss: str = "cross_entropy",
    test_metrics: dict[str, float | None] | None = None,
    verify_inputs: str = "none",
    security: str = DEFAULT_SECURITY,
    ledger_head: tuple[int, str] | None = None,
    standardization: Standardization | None = None,
) -> dict[str, Any]:
    """The JSON privacy report of one published model, from plain values. ``verify_inputs``:
    whether the servers checked every provider's norm proof (``l2``) or not (``none``).
    ``security``: what the servers' circuits were secure against (``semi-honest`` or
    ``malicious``: spgc.protocol.modes.SECURITY_LEVELS).
    ``ledger_head``: (release entries, co-signed ledger head) the model depends on
    (spgc.privacy.ledger; ``spgc account --ledger ... --model FILE`` holds the ledgers to it).
    ``standardization``: the released feature statistics the model's inputs are standardised
    with (``standardize: true``), None without.

    ``noise_multiplier`` is relative to ``sensitivity_units`` (the L2 bound of one example's
    encoded gradient); ``scale`` maps real values to units. A mode without a DP guarantee gets
    ``epsilon`` and ``delta`` null and a note saying so, whatever was passed. ``task``, ``loss``
    and ``test_metrics`` (the servers' test set: test_loss and test_accuracy, or for regression
    test_loss, test_mse, test_mae and test_r2; None when not evaluated) say what was learnt.
    """
    m = get_mode(mode)
    dp = m.differentially_private
    eps = _finite_or_none(epsilon) if dp else None
    if not dp:
        note = f"not differentially private: mode {mode} ({m.label})"
    elif eps is None:
        note = "not differentially private: a step was released without noise"
    else:
        note = f"({eps:.6g}, {delta:g})-differentially private after {steps} step(s)"
        if standardization is not None:  # released once before the steps, in the same epsilon
            note += " and the feature statistics' release"
    return {
        "format": _FORMAT,
        "spgc_version": __version__,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "run_id": run_id,
        "dataset": dataset,
        "model": model,
        "num_parameters": int(num_parameters),
        "version": int(version),
        "rounds": None if rounds is None else int(rounds),  # rounds ended, skipped ones too
        "model_sha256": model_sha256,
        "mode": mode,
        "differentially_private": dp and eps is not None,
        "note": note,
        "epsilon": eps,
        "delta": float(delta) if eps is not None else None,
        "accountant": accountant if eps is not None else None,
        "steps": int(steps),
        # every release the ledger counted (a release whose round then failed included)
        "releases_counted": int(steps if releases is None else releases),
        "noise_by": m.noise_by,
        "noise_multiplier": float(noise_multiplier),
        "noise_std_units": float(noise_multiplier) * float(sensitivity_units),
        "sampling": dict(sampling),
        # the neighbouring relation of the guarantee (spgc.privacy.accounting: fixed batches
        # replace one)
        "adjacency": (
            None
            if eps is None
            else adjacency_of(
                str(sampling.get("sampling", "poisson")), str(sampling.get("unit", "example"))
            )
        ),
        "clip_norm": float(clip_norm),
        # l2: every share in the sum came with an accepted norm proof (docs/PRIVACY.md).
        "verify_inputs": verify_inputs,
        # semi-honest or malicious: what the servers' circuits were secure against (issue 46)
        "security": security,
        "scale": float(scale),
        "sensitivity_units": float(sensitivity_units),
        "task": task,
        "loss": loss,
        "test_metrics": None if test_metrics is None else dict(test_metrics),
        "ledger_head": (
            None
            if ledger_head is None
            else {"releases": int(ledger_head[0]), "chain": str(ledger_head[1])}
        ),
        # the inputs are standardised as (x - feature_mean) / feature_std before the model
        "feature_standardization": None if standardization is None else standardization.to_dict(),
    }


def _write_atomic(path: Path, data: bytes) -> None:
    """Readers see the old file or the new one, never half of one."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    tmp = Path(name)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), 0o644)  # mkstemp makes 0600; the DP model is public
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_export(
    out: Path, model: nn.Module, flat: np.ndarray, report: dict[str, Any]
) -> tuple[Path, Path]:
    """Write ``out`` (.safetensors, the report in its metadata) and ``out`` with suffix .json
    (the report, indented); returns both paths. ValueError for another suffix."""
    out = Path(out)
    if out.suffix != SUFFIX:
        raise ValueError(f"export file must end in {SUFFIX}: {out}")
    if not out.parent.is_dir():  # else the error names the hidden temporary file
        raise ValueError(f"no directory {out.parent} to write {out.name} in")
    if len(flat) != parameter_count(model):
        raise ValueError(
            f"{len(flat)} parameters do not fit model {report.get('model', '?')} "
            f"({parameter_count(model)} parameters)"
        )
    tensors = model_state_tensors(model, flat)
    metadata = {"format": "pt", REPORT_KEY: json.dumps(report, separators=(",", ":"))}
    _write_atomic(out, safetensors.torch.save(tensors, metadata=metadata))
    report_path = out.with_suffix(".json")
    _write_atomic(report_path, (json.dumps(report, indent=2, sort_keys=True) + "\n").encode())
    return out, report_path


def load_export(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(tensors, report) of an export; the report is the one inside the file."""
    return safetensors.torch.load_file(str(path)), read_report(path)


def read_report(path: Path) -> dict[str, Any]:
    """The privacy report of an export: from a ``.safetensors`` file's metadata (the weights
    are not read), or a ``.json`` report itself. ValueError naming the file otherwise."""
    path = Path(path)
    if path.suffix == SUFFIX:
        with safetensors.safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        if REPORT_KEY not in metadata:
            raise ValueError(f"{path} holds no spgc privacy report")
        text = metadata[REPORT_KEY]
    else:
        text = path.read_text()
    try:
        report = json.loads(text)
    except ValueError:
        raise ValueError(f"{path}: the privacy report is not JSON") from None
    if not isinstance(report, dict):
        raise ValueError(f"{path}: the privacy report is not a JSON object")
    return report


def standardization_of(report: dict[str, Any]) -> Standardization | None:
    """The feature statistics an export's inputs are standardised with; None when the run
    did not standardise. ValueError for a malformed entry."""
    entry = report.get("feature_standardization")
    if entry is None:
        return None
    if not isinstance(entry, dict):
        raise ValueError("the report's feature_standardization is not a JSON object")
    return Standardization.from_dict(entry)


class StandardizedInputs(nn.Module):
    """``model`` behind the standardisation its run trained with: ``forward(x)`` is
    ``model((x - mean) / std)`` on the raw features."""

    def __init__(self, model: nn.Module, standardization: Standardization) -> None:
        super().__init__()
        self.model = model
        self.register_buffer("mean", torch.as_tensor(standardization.mean, dtype=torch.float32))
        self.register_buffer("std", torch.as_tensor(standardization.std, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.mean.shape[0]:
            raise ValueError(
                f"inputs of shape {tuple(x.shape)}: the model was trained on "
                f"{self.mean.shape[0]} standardised features, the last dimension"
            )
        return self.model((x - self.mean) / self.std)


def load_model(path: Path, model: nn.Module) -> nn.Module:
    """``model`` (the user's copy of the run's architecture) with the export's weights; when
    the run standardised its features, wrapped in :class:`StandardizedInputs` so that it
    takes raw features. ValueError naming the file when the weights do not fit."""
    tensors, report = load_export(path)
    try:
        model.load_state_dict(tensors)
    except RuntimeError as err:
        first = str(err).strip().splitlines()[0]
        raise ValueError(f"{path}: the weights do not fit the model given: {first}") from None
    standardization = standardization_of(report)
    return model if standardization is None else StandardizedInputs(model, standardization)

"""`spgc export`: a server's model and privacy report from its state_dir (docs/EXPORT.md).

The latest version comes from the checkpoint (its parameters and its recorded report); an
earlier one from the copy the server kept in state_dir/models/.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import SafetensorError

from spgc.learning.export import load_export, write_export
from spgc.learning.models import flatten_params
from spgc.privacy.accounting import quiet_dp_accounting
from spgc.privacy.ledger_format import LEDGER_FILE, LedgerError
from spgc.privacy.ledger_pair import check_covers
from spgc.privacy.ledger_verify import verify_ledger
from spgc.servers.checkpoint import CheckpointError, load_checkpoint
from spgc.servers.state_checkpoints import MODELS_DIR, run_model
from spgc.wire import vector_sha256

__all__ = ["ExportError", "add_parser", "run"]


class ExportError(ValueError):
    """What the user must fix (no checkpoint, unknown version...): one line, exit code 2."""


def add_parser(subparsers: Any) -> None:
    """Add the ``export`` subcommand to ``spgc``'s subparsers."""
    p = subparsers.add_parser(
        "export",
        help="write a server's model as .safetensors beside its JSON privacy report",
        description="Read the checkpoint in a server's state_dir and write the model "
        "(.safetensors, loadable with load_state_dict into the run's module) and its privacy "
        "report (the same name with .json). See docs/EXPORT.md.",
    )
    p.add_argument("--state-dir", type=Path, required=True, metavar="DIR", help="server state_dir")
    p.add_argument(
        "--out", type=Path, required=True, metavar="FILE.safetensors", help="file to write"
    )
    p.add_argument(
        "--version",
        type=int,
        default=None,
        metavar="N",
        help="model version (default: the latest, the checkpoint's)",
    )


def _checked_against_ledger(
    state_dir: Path, record: dict[str, Any], report: dict[str, Any]
) -> tuple[dict[str, Any], str | None]:
    """The checkpoint's report, held to the ledger beside it: the ledger must verify, and
    every release it holds is counted (a release after the last checkpoint, a run abandoned
    after a reveal, an edited checkpoint). Returns (report, a warning or None)."""
    path = state_dir / LEDGER_FILE
    if not path.is_file():
        return report, f"no privacy ledger in {state_dir}: the report is the checkpoint's own"
    try:
        with quiet_dp_accounting():
            ledger = verify_ledger(path)
    except LedgerError as exc:
        raise ExportError(
            f"the privacy ledger {path} does not verify ({exc}): no report can be vouched for"
        ) from None
    if ledger.run_id != record.get("run_id", ledger.run_id):
        raise ExportError(
            f"the privacy ledger {path} is of run {ledger.run_id}, the checkpoint of run "
            f"{record.get('run_id')}"
        )
    head = report.get("ledger_head")
    if isinstance(head, dict):  # the releases this model depends on must be in the ledger
        try:
            check_covers(ledger, ledger.run_id, int(head["releases"]), str(head["chain"]))
        except (LedgerError, KeyError, TypeError, ValueError) as exc:
            raise ExportError(
                f"the privacy ledger {path} does not hold the head the model names ({exc})"
            ) from None
    report = {**report, "releases_counted": ledger.steps}
    if not report.get("differentially_private") or ledger.epsilon is None:
        return report, None
    if report.get("epsilon") is not None and ledger.epsilon <= report["epsilon"] * (1 + 1e-9):
        return report, None
    warning = (
        f"the ledger counts {ledger.steps} release(s), epsilon {ledger.epsilon:.6g}, more than "
        f"the checkpoint's report ({report.get('epsilon')}): the report gives the ledger's"
    )
    report["epsilon"] = ledger.epsilon
    report["note"] = (
        f"({ledger.epsilon:.6g}, {report['delta']:g})-differentially private after "
        f"{ledger.steps} release(s) counted in the ledger"
    )
    return report, warning


def _export(state_dir: Path, out: Path, version: int | None) -> tuple[Path, Path]:
    if not state_dir.is_dir():
        raise ExportError(f"no state directory {state_dir}")
    loaded = load_checkpoint(state_dir)
    if loaded is None:
        raise ExportError(f"no checkpoint in {state_dir}")
    record, arrays = loaded
    if "report" not in record or "model" not in record:
        raise ExportError(f"the checkpoint in {state_dir} predates exports: it names no model")
    module = run_model(record["model"], int(record.get("model_seed", 0)))
    if version is None or version == record["version"]:
        params = np.asarray(arrays["params"], dtype=np.float64)
        if vector_sha256(params).hex() != record["model_sha256"]:
            raise ExportError(f"the checkpoint model in {state_dir} does not match its hash")
        report, warning = _checked_against_ledger(state_dir, record, record["report"])
        if warning:
            print(f"spgc export: warning: {warning}", file=sys.stderr)
        return write_export(out, module, params, report)
    kept = state_dir / MODELS_DIR / f"v{version:05d}.safetensors"
    if not kept.is_file():
        files = kept.parent.glob("v*.safetensors")
        held = sorted(int(p.stem[1:]) for p in files if p.stem[1:].isdigit())
        which = f"; kept: v{held[0]} to v{held[-1]} (keep_models)" if held else ""
        raise ExportError(
            f"no model version {version} in {state_dir} (latest {record['version']}{which})"
        )
    tensors, report = load_export(kept)
    module.load_state_dict(tensors)  # strict: the kept file must be this run's architecture
    return write_export(out, module, flatten_params(module), report)


def run(args: argparse.Namespace) -> int:
    """Run ``spgc export``; 0, or 2 with one line on stderr."""
    try:
        model, report = _export(args.state_dir, args.out, args.version)
    except (CheckpointError, OSError, ValueError, RuntimeError, SafetensorError) as exc:
        # RuntimeError: load_state_dict's (multi-line) refusal of another architecture.
        print(f"spgc export: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 2
    print(f"model: {model}\nreport: {report}")
    steps = json.loads(Path(report).read_text()).get("steps")
    if steps == 0:
        print(
            "spgc export: warning: this is the initial model: no training step was published",
            file=sys.stderr,
        )
    return 0

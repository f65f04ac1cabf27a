"""A server's state in its checkpoints: written after each round with the model exported beside
it, restored at a restart, at a step back and after a lost peer.

:class:`StateCheckpoints` is a part of :class:`~spgc.servers.state.ServerState`
(servers/state.py sets up the fields it uses and holds the lock, ``cond``); the file format is
servers/checkpoint.py's, and which checkpoint to continue from is the daemon's choice
(servers/resume.py).
"""

from __future__ import annotations

import json
import logging
import math
import shutil
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from spgc.learning.export import privacy_report, write_export
from spgc.learning.losses import REGRESSION_METRICS
from spgc.learning.models import resolve_model
from spgc.privacy.feature_stats import Standardization
from spgc.privacy.ledger_format import aside_path
from spgc.servers.checkpoint import CheckpointError, config_digest, save_checkpoint
from spgc.servers.faults import fault_point
from spgc.servers.round_phases import ENDED_PHASES, RoundRecord, round_summary
from spgc.wire import aggregation_pb2 as pb

log = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"  # in state_dir: the latest published model (+ model.json)
#: In state_dir: v00001.safetensors (+ .json), every version, or the last keep_models of them.
MODELS_DIR = "models"


def prune_models(directory: Path, last_dropped: int) -> None:
    """Delete the kept model versions up to ``last_dropped`` (keep_models), the .json with
    each; a version that is not there is skipped."""
    for path in sorted(directory.glob("v*.safetensors")):
        try:
            version = int(path.stem[1:])
        except ValueError:
            continue
        if version <= last_dropped:
            path.unlink(missing_ok=True)
            path.with_suffix(".json").unlink(missing_ok=True)


def models_fit_disk(state_dir: Path, model_bytes: int, rounds: int) -> str | None:
    """Why keeping every model version of a run (keep_models 0) may fill ``state_dir``'s disk:
    a warning line when rounds + 1 versions of ``model_bytes`` each take more than half of
    the space free now; None when they fit."""
    free = shutil.disk_usage(state_dir).free
    need = (rounds + 1) * model_bytes
    if need <= free // 2:
        return None
    return (
        f"keeping every model version of up to {rounds} rounds takes about {need / 1e9:.1f} GB "
        f"in {state_dir / MODELS_DIR}, {free / 1e9:.1f} GB are free there: set "
        "keep_models (the latest N versions) to bound it"
    )


def run_model(model_name: str, seed: int = 0) -> nn.Module:
    """The torch module a run trains, to export its weights into (the one place it is built)."""
    return resolve_model(model_name, seed=seed)


class StateCheckpoints:
    """Checkpoints of this server's state, and the model exported with each."""

    def model_report(self) -> dict[str, Any]:
        """The privacy report of the current published model (spgc.learning.export)."""
        plan, cfg = self.plan, self.plan.cfg
        with self.cond:
            return privacy_report(
                mode=cfg.mode,
                epsilon=self.epsilon(),
                delta=self.reported_delta() or cfg.target_delta,
                steps=self.steps,
                noise_multiplier=plan.noise_multiplier,
                sampling=plan.sampling,
                clip_norm=cfg.clip_norm,
                scale=cfg.scale,
                sensitivity_units=float(plan.fixed_point.l2_bound_units),
                model=plan.model_name,
                num_parameters=plan.dim,
                version=self.version,
                rounds=self.round,
                run_id=self.run_id,
                dataset=cfg.dataset,
                accountant=cfg.accountant,
                model_sha256=self.models[self.version][1].hex(),
                releases=self.releases,
                task=cfg.task,
                loss=cfg.loss_name,
                test_metrics=self._last_test_metrics(),
                verify_inputs=cfg.verify_inputs,
                security=cfg.security,
                ledger_head=self.published_head(),
                standardization=self.standardization,
            )

    def _last_test_metrics(self) -> dict[str, float | None] | None:
        """The test metrics of the latest published round (None: not evaluated)."""
        published = [r for r in self.history.values() if r.phase == pb.ROUND_PHASE_PUBLISHED]
        if not published or published[-1].test_loss is None:
            return None
        last = published[-1]
        out: dict[str, float | None] = {"test_loss": last.test_loss}
        if last.test_accuracy is not None:
            out["test_accuracy"] = last.test_accuracy
        return {**out, **last.test_metrics}

    def _write_model(self, version: int, params: np.ndarray, report: dict[str, Any]) -> None:
        """state_dir/model.safetensors (+ model.json), the latest model, and the same kept as
        state_dir/models/vNNNNN.safetensors (+ .json)."""
        assert self.checkpoint_dir is not None
        directory = self.checkpoint_dir / MODELS_DIR
        if version == 0:
            self._set_aside_other_runs_models(directory)
        directory.mkdir(exist_ok=True)
        with self._export_lock:  # outside cond: a large model must not stall the servicers
            if self._export_module is None:
                self._export_module = run_model(self.plan.model_name, self.plan.cfg.model_seed)
            kept = directory / f"v{version:05d}.safetensors"
            for path in (kept, self.checkpoint_dir / MODEL_FILE):
                write_export(path, self._export_module, params, report)
            keep = self.plan.cfg.keep_models
            if keep:
                prune_models(directory, version - keep)

    def _set_aside_other_runs_models(self, directory: Path) -> None:
        """A new run in an old state_dir (resume: false): the old run's models go to
        ``models.<its run id>``, so that ``spgc export --version N`` never reads another run's
        model as this one's."""
        reports = sorted(directory.glob("v*.json"))
        if not reports:
            return
        try:
            old = json.loads(reports[-1].read_text()).get("run_id")
        except (OSError, ValueError):
            old = None
        if old == self.run_id:
            return
        target = aside_path(directory, str(old or "old"))
        directory.rename(target)
        log.info("the models of run %s are kept in %s", old, target)

    def save_checkpoint(self) -> None:
        """Write the state a restart continues from, and export the model (no-op without a
        state_dir)."""
        if self.checkpoint_dir is None or self.config is None:
            return

        # Writers in turn; the state's lock only while the record is taken, not while it is
        # written: providers' calls and the intake wait on that lock, and the record (with
        # the run's history) grows with every round.
        with self._checkpoint_lock:
            with self.cond:
                adam = self.optimizer.state_dict()
                report = self.model_report()
                record = {
                    "run_id": self.run_id,
                    "config_sha256": config_digest(self.config),
                    # What `spgc export` needs from a state_dir alone: the module and the report.
                    "model": self.plan.model_name,
                    "model_seed": self.plan.cfg.model_seed,
                    "report": report,
                    "round": self.round,
                    "version": self.version,
                    "steps": self.steps,
                    "releases": self.releases,
                    "noise_samples": self.samples_drawn,
                    "clip_norm": self.clip_norm,
                    # standardize: the released feature statistics (None before their release)
                    "feature_standardization": (
                        None if self.standardization is None else self.standardization.to_dict()
                    ),
                    "model_sha256": self.models[self.version][1].hex(),
                    "adam": {
                        "t": adam["t"],
                        "beta_pows": list(adam["beta_pows"]),
                    },
                }
                # Only the rounds ended since the last save go to the history file (copies:
                # an ended round's record is not changed later, but its lists are written
                # after the lock is released).
                new_history = [
                    {**round_summary(r), "received": list(r.received), "agreed": list(r.agreed)}
                    for r in sorted(self.history.values(), key=lambda r: r.round)
                    if r.phase in ENDED_PHASES and r.round > self.history_saved_through
                ]
                # params are replaced, never mutated; Adam's m and v are copies
                arrays = {"params": self.params, "adam_m": adam["m"], "adam_v": adam["v"]}
                ended = self.round - 1
                snapshot = (self.version, self.params, report)
            save_checkpoint(
                self.checkpoint_dir,
                record,
                arrays,
                before_commit=lambda: fault_point("during-checkpoint", ended),
                new_history=new_history,
            )
            with self.cond:
                self.checkpointed = True
                if new_history:
                    self.history_saved_through = max(
                        self.history_saved_through, new_history[-1]["round"]
                    )
        self._write_model(*snapshot)

    def restore(self, record: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Continue from a checkpoint (its TrainingConfig was checked by the caller)."""

        params = np.asarray(arrays["params"], dtype=np.float64)
        if params.shape != (self.plan.model_dim,):
            raise CheckpointError("checkpoint model does not match its recorded hash or size")
        sha = self.plan.model_sha256(params)
        if sha.hex() != record["model_sha256"]:
            raise CheckpointError("checkpoint model does not match its recorded hash or size")
        with self.cond:
            # Also a step back to the previous checkpoint at the Handshake: start from scratch.
            self.accountant = self.plan.new_accountant()
            self.history = {}
            self.accepted = {}
            self.pending = None
            self.compute_error = None
            self.deadline = 0.0
            self.finished = False
            self.phase = pb.ROUND_PHASE_UNSPECIFIED
            self.run_id = record["run_id"]
            self.checkpointed = True
            self.params = params
            self.version = int(record["version"])
            self.models = {self.version: (params, sha)}
            state = self.optimizer.state_dict()
            state.update(
                t=int(record["adam"]["t"]),
                beta_pows=tuple(record["adam"]["beta_pows"]),
                m=arrays["adam_m"],
                v=arrays["adam_v"],
            )
            self.optimizer.load_state_dict(state)
            self.steps = int(record["steps"])
            self.releases = int(record.get("releases", self.steps))
            self.samples_drawn = int(record.get("noise_samples", 0))
            # The next round's C (adaptive clipping); absent in checkpoints that predate it.
            self.clip_norm = self.pending_clip_norm = float(
                record.get("clip_norm", self.plan.cfg.clip_norm)
            )
            if self.accountant is not None and self.releases:
                self.accountant.step(self.releases)  # every release counts
            stats = record.get("feature_standardization")
            self.standardization = None if stats is None else Standardization.from_dict(stats)
            self.pending_standardization = None
            if self.evaluator is not None:
                self.evaluator.standardize(self.standardization)
            # The ledger may hold releases after this checkpoint (a crash after the entry).
            if self.ledger is not None:
                self._count_ledger(self.ledger.lines)
            else:
                self._count_ledger_on_disk()
            self.round = self.rerun_round = int(record["round"])
            self.intake.abandon_round(self.round)  # nothing held for the rounds run again
            for h in record["history"]:
                rec = RoundRecord(
                    h["round"],
                    pb.ROUND_PHASE_PUBLISHED if h["published"] else pb.ROUND_PHASE_ABORTED,
                    received=list(h["received"]),
                    agreed=list(h["agreed"]),
                    reason=h["reason"],
                    epsilon=math.inf if h["epsilon"] is None else h["epsilon"],
                    test_loss=h["test_loss"],
                    test_accuracy=h["test_accuracy"],
                    test_metrics={k: h[k] for k in REGRESSION_METRICS if h.get(k) is not None},
                    gc_bytes=h["gc_bytes"],
                    seconds=dict(h["seconds"]),
                    left_out=dict(h.get("left_out", {})),  # absent in older checkpoints
                    clip_norm=h.get("clip_norm") or 0.0,
                    noisy_count=h.get("noisy_count"),
                )
                self.history[rec.round] = rec
            # What the checkpoint's history holds: the next save appends after it. An older
            # checkpoint (its history inline) gets all of it written to the file then.
            self.history_saved_through = (
                max(self.history, default=-1) if "history_file" in record else -1
            )
            self.finished = self._should_stop()
            if self.finished:
                self.phase = pb.ROUND_PHASE_FINISHED

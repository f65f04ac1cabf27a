"""Continuing a run from its checkpoints: at the start (``resume``), one published round back
at the Handshake (a crash came between the two servers' checkpoints), and after a lost peer;
and the run's first checkpoint, written before round 0.

:class:`CheckpointResume` is a part of :class:`~spgc.servers.daemon.ServerDaemon`
(servers/daemon.py); the state's own checkpoints are servers/state_checkpoints.py's.
"""

from __future__ import annotations

import logging

from spgc.servers.checkpoint import CheckpointError, config_digest, load_checkpoint, step_back
from spgc.settings.backend_choice import AUTO
from spgc.wire import aggregation_pb2 as pb

log = logging.getLogger(__name__)


class CheckpointResume:
    """Which checkpoint this server continues from, and when."""

    def _resume(self) -> None:
        """Continue the run checkpointed in state_dir, if any (same training configuration)."""
        assert self.cfg.state_dir is not None
        loaded = load_checkpoint(self.cfg.state_dir)
        if loaded is None:
            self.state.refuse_ledger_without_checkpoint()
            return
        record, arrays = loaded
        run_id = record["run_id"]
        if self.cfg.run_id and self.cfg.run_id != run_id:
            raise CheckpointError(
                f"state_dir {self.cfg.state_dir} holds run {run_id}, not the configured run_id "
                f"{self.cfg.run_id}: set resume: false to start over"
            )
        if self.cfg.backend == AUTO:  # the backend this run was fixed with (link_probe.py)
            self._adopt_checkpointed_backend(run_id, record["config_sha256"])
        if config_digest(self.plan.training_config(run_id)) != record["config_sha256"]:
            raise CheckpointError(
                f"state_dir {self.cfg.state_dir} holds a checkpoint of another training "
                f"configuration (run {run_id}): set resume: false to start a new run, or use "
                "another state_dir"
            )
        self.state.restore(record, arrays)
        self.cfg.run_id = run_id  # the Handshake continues this run (H2 must resume it too)
        self.audit.record(
            "resume",
            run_id=run_id,
            round=self.state.round,
            version=self.state.version,
            releases=self.state.releases,
        )
        log.info(
            "%s resuming run %s at round %d (model v%d, %d step(s), eps=%s)%s",
            self.cfg.role_name,
            run_id,
            self.state.round,
            self.state.version,
            self.state.steps,
            f"{self.state.epsilon():.4f}",
            ": already finished" if self.state.finished else "",
        )

    def _align_with_peer(self, other: pb.RoundInfo) -> None:
        """Step back to the previous checkpoint if this server is one published round ahead
        of the other and its previous checkpoint is exactly the other's state (H2 checkpoints
        a round before H1: a crash in between leaves them so). The abandoned round's release
        stays counted (the ledger holds it); the round runs again with fresh noise."""
        directory = self.cfg.state_dir
        _, _, sha = self.state.model(None)
        theirs = (other.round, other.model_version, other.model_sha256.hex())
        if directory is None or theirs == (self.state.round, self.state.version, sha.hex()):
            return
        if other.round >= self.state.round:
            return  # not ahead: the caller reports the mismatch
        try:
            loaded = load_checkpoint(directory, previous=True)
        except CheckpointError as exc:
            log.warning("cannot read the previous checkpoint to step back to: %s", exc)
            return
        if loaded is None:
            return
        record, arrays = loaded
        if record["run_id"] != self.state.run_id or theirs != (
            record["round"],
            record["version"],
            record["model_sha256"],
        ):
            return
        step_back(directory)
        self.state.restore(record, arrays)
        self.audit.record(
            "step_back",
            identity=self.cfg.peer_name,
            round=self.state.round,
            version=self.state.version,
            reason="one published round ahead of the peer (a crash between the checkpoints)",
        )
        log.warning(
            "%s steps back to its previous checkpoint (round %d, model v%d) to match %s: a "
            "crash came between the two servers' checkpoints; the round runs again, and its "
            "earlier release stays counted (eps=%.4f)",
            self.cfg.role_name,
            self.state.round,
            self.state.version,
            self.cfg.peer_name,
            self.state.epsilon(),
        )

    def _checkpoint_the_start(self) -> None:
        """Before the run's first round: a checkpoint of model v0, so that a server lost in
        round 0 (even after a release) has a state to go back to, and a restart of both
        continues the same run rather than starting another."""
        if not self.state.checkpointed and self.precompute is None:
            self.state.save_checkpoint()  # no-op without a state_dir

    def _back_to_last_checkpoint(self, reason: str) -> None:
        """The peer was lost (the caller holds ``_reset_lock``): drop the round in progress and
        go back to this run's last checkpoint; the audit log and the log say where."""
        abandoned = self.state.abandon_for_peer(reason)
        loaded = load_checkpoint(self.cfg.state_dir)
        if loaded is not None and loaded[0]["run_id"] == self.state.run_id:
            self.state.restore(*loaded)
        self.audit.record(
            "peer_lost",
            identity=self.cfg.peer_name,
            round=abandoned,
            reason=reason,
            resume_round=self.state.round,
        )
        log.warning(
            "%s lost %s (%s): %s; back at round %d (model v%d, eps=%.4f), waiting for it",
            self.cfg.role_name,
            self.cfg.peer_name,
            reason,
            "no round was running" if abandoned is None else f"round {abandoned} abandoned",
            self.state.round,
            self.state.version,
            self.state.epsilon(),
        )

"""One server's training state: published models, the open round, the accountant, history.

Shared by the provider-facing servicer, the peer servicer and the round driver; every change
happens under one condition variable so that waiters (CheckModel, intake-done) wake promptly.
:class:`ServerState` is made of parts, one job each: a round's steps
(servers/round_phases.py), the privacy ledger and accountant (servers/ledger_state.py) and its
checkpoints (servers/state_checkpoints.py); this module holds the fields they share and what
providers are shown of them (RoundInfo, long polls, the summary).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from torch import nn

from garbled_core.discrete_gaussian import DEFAULT_DISTANCE_LOG2
from spgc.common.logs import printable
from spgc.learning.losses import REGRESSION_METRICS
from spgc.learning.optim import server_optimizer
from spgc.privacy.feature_stats import Standardization
from spgc.privacy.ledger import Ledger
from spgc.servers.audit import AuditLog
from spgc.servers.errors import BudgetExceededError, PeerMismatchError
from spgc.servers.evaluation import TestSetEvaluator, test_set_loader
from spgc.servers.intake import ShareIntake
from spgc.servers.ledger_state import LedgerState
from spgc.servers.norm_checks import PreparedDots
from spgc.servers.round_phases import ENDED_PHASES, RoundPhases, RoundRecord, round_summary
from spgc.servers.state_checkpoints import StateCheckpoints
from spgc.settings.backend_choice import BackendChoice
from spgc.settings.plan import RunPlan
from spgc.wire import aggregation_pb2 as pb

# The errors and the round record are importable from here too, as before the state was split.
__all__ = [
    "RPC_SLACK",
    "BudgetExceededError",
    "PeerMismatchError",
    "RoundRecord",
    "ServerState",
]

log = logging.getLogger(__name__)

RPC_SLACK = 60.0  # seconds on top of the round deadline for a waiting peer call


class ServerState(RoundPhases, LedgerState, StateCheckpoints):
    """Models, round phase and privacy spent at one server (thread-safe)."""

    def __init__(self, plan: RunPlan, role: int, intake: ShareIntake) -> None:
        self.plan = plan
        self.role = role
        self.intake = intake
        # Verified inputs: each share's wraparound dots, computed as it arrives.
        self.proof_dots = PreparedDots()
        self._checkpoint_lock = threading.Lock()  # one checkpoint written at a time
        lock = threading.RLock()
        self.cond = threading.Condition(lock)
        # Providers' long polls are woken through these callbacks when a round opens or ends,
        # training ends, or the peer comes and goes: not on every accepted share.
        self._round_listeners: list[Callable[[], None]] = []
        self._round_observers: list[Callable[[RoundRecord], None]] = []
        self._share_observers: list[Callable[[str, int], None]] = []
        self._intake_closed = 0.0  # perf_counter when the current round's intake closed
        self.allowed_providers = frozenset(plan.cfg.providers)
        self.run_id = ""
        self.config: pb.TrainingConfig | None = None  # set once the Handshake agreed
        # backend: auto: the choice and the figures it follows from (servers/link_probe.py)
        self.backend_choice: BackendChoice | None = None
        self.params = plan.initial_params.copy()
        self.version = 0
        self.models: dict[int, tuple[np.ndarray, bytes]] = {
            0: (self.params, plan.model_sha256(self.params))
        }
        self.optimizer = server_optimizer(plan.dim, plan.cfg.lr, plan.cfg.server_optimizer)
        test_set = test_set_loader(plan.cfg)
        self.evaluator = (
            TestSetEvaluator(plan.model_name, test_set, plan.cfg.task, plan.cfg.loss_name)
            if plan.cfg.evaluate and test_set is not None
            else None
        )
        self.accountant = plan.new_accountant()
        # standardize: the released feature statistics once round 0's release is published
        # (providers and the test set standardise with them; stored with the model), and the
        # ones computed from a release, not yet published.
        self.standardization: Standardization | None = None
        self.pending_standardization: Standardization | None = None
        self.steps = 0
        self.round = 0
        self.phase = pb.ROUND_PHASE_UNSPECIFIED
        self.deadline = 0.0
        self._opened = 0.0
        self.accepted: dict[int, set[str]] = {}
        self.history: dict[int, RoundRecord] = {}
        self.pending: tuple[np.ndarray, bytes] | None = None  # computed, not yet published
        # The clip norm of the next round to open (clip: adaptive moves it after every
        # published round; fixed: the plan's), and the one computed with ``pending``.
        self.clip_norm = plan.cfg.clip_norm
        self.pending_clip_norm = self.clip_norm
        self.compute_error: BaseException | None = None
        self.failure: str | None = None
        # The abort's line once this server caught the peer deviating (servers.deviation): the
        # peer's calls are answered with it until the daemon stops.
        self.aborted: str | None = None
        self.finished = False
        self.closing = False  # the daemon is stopping: long polls answer at once
        # The peer server was lost: providers are told (ROUND_PHASE_WAITING_FOR_PEER) until
        # the two servers are paired again.
        self.peer_waiting = False
        # The round a restore (restart, step back, re-pairing) continues from: providers may
        # have sent shares for it before, which this server no longer holds.
        self.rerun_round: int | None = None
        self.last_peer_call = time.monotonic()  # H2: when H1 last called (liveness)
        self.pool: Any = None  # mode preprocessed: this server's servers.noise_pool.NoisePool
        self.offline_bytes = 0  # preprocessed: bytes this server moved producing noise shares
        self.checkpoint_dir: Path | None = None  # where save_checkpoint writes (state_dir)
        self.checkpointed = False  # a checkpoint of this run was written or restored
        # The last ended round the checkpoint's history file holds: a save appends the later
        # ones only (servers.checkpoint), so a long run's checkpoint stays O(1) a round.
        self.history_saved_through = -1
        self._export_lock = threading.Lock()  # one export at a time into the cached module
        self._export_module: nn.Module | None = None
        self.declined: dict[str, str] = {}  # provider -> why it refused the plan
        self.callers: set[str] = set()  # providers that called this server (first-round wait)
        self.told_finished: set[str] = set()  # providers answered ROUND_PHASE_FINISHED
        self.last_told_finished = -math.inf  # time.monotonic() when the last one was
        # The write-ahead privacy ledger (spgc.privacy.ledger): opened once the run id is known.
        self.ledger: Ledger | None = None
        self.ledger_path: Path | None = None  # None: in memory only (no state_dir)
        self.ledger_key: Path | None = None  # None: a key kept in state_dir, or a fresh one
        self._signer: Any = None  # the Ed25519 key signing this server's ledger (loaded once)
        # Two-server modes: the peer's ledger public key (hex), from its PeerHello.
        self.peer_ledger_key: str | None = None
        self.audit = AuditLog(None, plan.cfg.role_name)  # the daemon opens the real one
        self.releases = 0  # release entries written: what the accountant counts
        self.samples_drawn = 0  # noise samples of those releases (the sampler's delta)
        self._ldp_counted: set[int] = set()  # ldp rounds whose first noisy vector is counted

    # ------------------------------------------------------------------ queries

    @property
    def ready(self) -> bool:
        return self.config is not None

    def collecting_model_version(self, t: int) -> int | None:
        """The model version round ``t`` trains on while it collects shares (None: t is not
        the round collecting)."""
        with self.cond:
            if t != self.round or self.phase != pb.ROUND_PHASE_COLLECTING:
                return None
            return self.version

    def round_info(self, number: int | None, caller: str | None) -> pb.RoundInfo:
        """The RoundInfo of round ``number`` (None: the current one); KeyError if unknown."""
        with self.cond:
            t = self.round if number is None else number
            if t > self.round or (t < self.round and t not in self.history):
                raise KeyError(t)
            rec = self.history.get(t)
            phase = self.phase if t == self.round else (rec.phase if rec else self.phase)
            if self.finished and t == self.round and phase != pb.ROUND_PHASE_PUBLISHED:
                phase = pb.ROUND_PHASE_FINISHED
            elif self.peer_waiting and t == self.round:
                phase = pb.ROUND_PHASE_WAITING_FOR_PEER
            version = self.version if t == self.round else min(t, self.version)
            accepted = self.accepted.get(t, set())
            info = pb.RoundInfo(
                round=t,
                model_version=version,
                model_sha256=self.models.get(version, (None, b""))[1],
                phase=phase,
                caller_share_accepted=caller in accepted,
                shares_accepted=len(accepted),
                providers_agreed=len(rec.agreed) if rec else 0,
                epsilon_spent=self.epsilon(),
                latest_model_version=self.version,
                releases_counted=self.releases,
            )
            head = self.published_head(open_ledger=False)
            if head is not None:
                info.ledger_head_releases, info.ledger_head = head[0], bytes.fromhex(head[1])
            if t == self.round and self.deadline:
                info.deadline.FromNanoseconds(int(self.deadline * 1e9))
            if self.plan.clip_moves:
                info.clip_norm = rec.clip_norm if rec is not None else self.clip_norm
            if self.standardization is not None:
                info.feature_mean.extend(float(v) for v in self.standardization.mean)
                info.feature_std.extend(float(v) for v in self.standardization.std)
            if phase == pb.ROUND_PHASE_FINISHED and caller and caller not in self.told_finished:
                self.told_finished.add(caller)
                self.last_told_finished = time.monotonic()
                self.cond.notify_all()  # a lingering server may stop
            if phase == pb.ROUND_PHASE_FINISHED and self.failure:
                info.failure = printable(" ".join(self.failure.split()))
            if rec is not None and caller is not None:
                info.caller_left_out = printable(self._left_out(rec, caller))
            return info

    @staticmethod
    def _left_out(rec: RoundRecord, caller: str) -> str:
        """Why ``caller``'s share is not in round ``rec``'s sum ("" if it is, or not agreed
        yet)."""
        if caller in rec.left_out:
            return rec.left_out[caller]
        if caller in rec.agreed and rec.phase == pb.ROUND_PHASE_ABORTED:
            return f"the round was skipped: {rec.reason}"
        return ""

    def add_round_listener(self, listener: Callable[[], None]) -> None:
        """``listener()`` is called (holding the state's lock: it must only schedule work)
        whenever what :meth:`long_poll_over` answers may have changed."""
        with self.cond:
            self._round_listeners.append(listener)

    def add_round_observer(self, observer: Callable[[RoundRecord], None]) -> None:
        """``observer(record)`` runs once per ended round (published or skipped), after its
        log line and checkpoint (metrics, curves)."""
        self._round_observers.append(observer)

    def observe_round(self, rec: RoundRecord) -> None:
        for observer in self._round_observers:
            try:
                observer(rec)
            except Exception as exc:  # a metrics failure must never stop training
                log.warning("round %d observer failed: %s", rec.round, exc)

    def add_share_observer(self, observer: Callable[[str, int], None]) -> None:
        """``observer(encoding, payload_bytes)`` runs once per accepted share (metrics)."""
        self._share_observers.append(observer)

    def long_poll_over(self, after: int | None, caller: str | None = None) -> bool:
        """Whether a provider's long poll answers now: this server collects a round later than
        ``after`` (any round if None), or round ``after`` again without ``caller``'s share (the
        round a restore continues from: run again after a restart or a lost peer), or training
        ends, or the server is stopping."""
        with self.cond:
            if self.finished or self.closing:
                return True
            return (
                self.phase == pb.ROUND_PHASE_COLLECTING
                and not self.peer_waiting
                and (
                    after is None
                    or self.round > after
                    or (
                        self.round == after == self.rerun_round
                        and caller not in self.accepted.get(self.round, ())
                    )
                )
            )

    def close(self) -> None:
        """The daemon is stopping: wake every waiting long poll so its thread ends now."""
        with self.cond:
            self.closing = True
            self._notify_rounds()

    def _notify_rounds(self) -> None:
        """Wake every waiter, the providers' long polls included (the caller holds cond)."""
        self.cond.notify_all()
        for listener in self._round_listeners:
            listener()

    def model(self, version: int | None) -> tuple[int, np.ndarray, bytes]:
        """(version, its whole parameter vector, the SHA-256 of its model vector: the trained
        coordinates, plan.model_vector) of a served version; KeyError if not served."""
        with self.cond:
            v = self.version if version is None else version
            params, sha = self.models[v]
            return v, params, sha

    # ------------------------------------------------------------------ providers present

    def note_caller(self, provider: str) -> None:
        """An authenticated provider called this server (any call)."""
        if provider in self.callers:  # the common case: no lock, no wake-up
            return
        with self.cond:
            self.callers.add(provider)
            self.cond.notify_all()

    def providers_not_told_finished(self) -> list[str]:
        """Providers present (:meth:`providers_present`) not yet answered that training is
        over."""
        with self.cond:
            return [p for p in self.providers_present() if p not in self.told_finished]

    def providers_present(self) -> list[str]:
        """Providers that called this server and did not refuse the plan."""
        with self.cond:
            return sorted(self.callers - set(self.declined))

    def note_declined(self, provider: str, reason: str) -> None:
        """A provider refused the plan (its last reason is kept for the summary)."""
        with self.cond:
            self.declined[provider] = reason
            self.cond.notify_all()  # the first-round wait may end now

    def note_hello(self, provider: str) -> None:
        """A provider said Hello: it tries to join (again, after a restart), so a plan it
        declined before no longer counts it out (the summary keeps a decline until then)."""
        with self.cond:
            if self.declined.pop(provider, None) is not None:
                self.cond.notify_all()

    def declined_text(self) -> str:
        """Each provider that declined the plan and why, in one line ("" when none did)."""
        with self.cond:
            return "; ".join(f"{name}: {why}" for name, why in sorted(self.declined.items()))

    def too_few_accepted(self) -> str | None:
        """Why no round of the run can ever have min_providers providers: every provider of
        the plan called this server and, less those that declined the plan, too few remain.
        None while that is not so (a provider yet to call may still join)."""
        minimum = self.plan.cfg.min_providers
        with self.cond:
            present = self.providers_present()
            if not self.declined or len(present) >= minimum:
                return None
            if not self.allowed_providers <= self.callers:
                return None
            return (
                f"{len(self.declined)} of the plan's {len(self.allowed_providers)} providers "
                f"declined it, leaving {len(present)}"
                + (f" ({', '.join(present)})" if present else "")
                + f" < min_providers={minimum}: {self.declined_text()}"
            )

    def summary(self) -> dict[str, Any]:
        """What the run achieved so far, for the summary file and the demo."""
        with self.cond:
            published = [r for r in self.history.values() if r.phase == pb.ROUND_PHASE_PUBLISHED]
            last = published[-1] if published else None
            eps = self.epsilon()
            return {
                "role": self.plan.cfg.role_name,
                "run_id": self.run_id,
                "dataset": self.plan.cfg.dataset,
                "mode": self.plan.cfg.mode,
                "backend": self.plan.cfg.backend,
                # backend: auto: the link figures, each backend's expected round and why
                **(
                    {"backend_choice": self.backend_choice.summary()}
                    if self.backend_choice is not None
                    else {}
                ),
                "verify_inputs": self.plan.cfg.verify_inputs,
                "security": self.plan.cfg.security,
                # the run stopped on catching the peer deviating (the ledger's abort entry)
                **({"abort": abort} if (abort := self.abort_summary()) else {}),
                "server_optimizer": self.plan.cfg.server_optimizer,
                "rounds": self.round,
                "steps": self.steps,
                "model_version": self.version,
                "model_sha256": self.models[self.version][1].hex(),
                "test_accuracy": None if last is None else last.test_accuracy,
                "test_loss": None if last is None else last.test_loss,
                # regression (spgc.learning.losses): test_mse, test_mae, test_r2 of the last model
                **{
                    k: None if last is None else last.test_metrics.get(k)
                    for k in (REGRESSION_METRICS if self.plan.cfg.task == "regression" else ())
                },
                "task": self.plan.cfg.task,
                "loss": self.plan.cfg.loss_name,
                "differentially_private": self.differentially_private,
                "adjacency": None if self.accountant is None else self.accountant.adjacency,
                "epsilon": None if math.isinf(eps) else eps,
                "delta": self.reported_delta(),
                "delta_accountant": self.plan.cfg.target_delta,
                "noise_samples": self.noise_samples(),
                "releases": self.releases,
                "ledger": None if self.ledger_path is None else str(self.ledger_path),
                "sampler_distance_per_sample": 2.0**DEFAULT_DISTANCE_LOG2,
                "noise_std_units": self.plan.sigma_units,
                "noise_std_total_units": self.plan.total_noise_std_units,
                # issue 46: the three figures (everyone, one curious server, one that deviates)
                **({"noise_floor": floor} if (floor := self.noise_floor_summary()) else {}),
                "gc_bytes": sum(r.gc_bytes for r in self.history.values()),
                "offline_gc_bytes": self.offline_bytes,
                "clip": self.plan.cfg.clip,
                # Each published round's clip norm, in order (adaptive clipping moves it).
                "clip_norms": [r.clip_norm or self.plan.cfg.clip_norm for r in published],
                "history": [
                    round_summary(r) for r in self.history.values() if r.phase in ENDED_PHASES
                ],
                "finished": self.finished,
                "failure": self.failure,
                "declined": dict(self.declined),
            }

    def finish_precompute(self) -> None:
        """`spgc server precompute` is over (H1 said so): stop without training."""
        with self.cond:
            self.finished = True
            self._notify_rounds()

    def fail(self, message: str) -> None:
        with self.cond:
            if self.failure is None:
                self.failure = message
            self.finished = True
            self._notify_rounds()

"""A round's life at one server: open, collect shares, agree on P_t, update, publish (or skip),
and what is recorded of it (:class:`RoundRecord`).

:class:`RoundPhases` is a part of :class:`~spgc.servers.state.ServerState` (servers/state.py
sets up the fields it uses and holds the lock, ``cond``); the round driver
(servers/coordinator.py) and the peer servicer call these steps in the order SPEC section 3
gives.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from spgc.learning.optim import mean_delta_direction, mean_gradient
from spgc.servers.faults import fault_point
from spgc.wire import aggregation_pb2 as pb

log = logging.getLogger(__name__)

_KEEP_VERSIONS = 2  # the current model and the one before (for slow providers)


@dataclass
class RoundRecord:
    """What happened in one round at this server (exposed for tests and logs)."""

    round: int
    phase: int
    received: list[str] = field(default_factory=list)
    agreed: list[str] = field(default_factory=list)
    reason: str = ""
    noisy_sum_units: np.ndarray | None = None  # Y (int64 or object ints)
    gradient: np.ndarray | None = None  # Y / s, what Adam was given
    model_sha256: bytes = b""
    epsilon: float = 0.0
    test_loss: float | None = None
    test_accuracy: float | None = None
    # Regression (spgc.learning.losses): test_mse, test_mae, test_r2 of the published model; empty
    # else.
    test_metrics: dict[str, float] = field(default_factory=dict)
    gc_bytes: int = 0
    peer_bytes: dict[str, int] = field(default_factory=dict)  # the data link: sent, received
    seconds: dict[str, float] = field(default_factory=dict)
    seed_commitments: dict[str, bytes] = field(default_factory=dict)
    vector_ids: dict[str, bytes] = field(default_factory=dict)  # of the received shares
    left_out: dict[str, str] = field(default_factory=dict)  # provider -> why not in P_t
    # clip: adaptive (spgc.privacy.clipping): the round's C_r and its released noisy count of
    # unclipped examples (None until released; 0.0 / None with a fixed clip norm).
    clip_norm: float = 0.0
    noisy_count: float | None = None
    # Verified inputs: the round's norm-proof query coin (servers.norm_checks.round_coin).
    verify_coin: bytes = b""
    # Wall-clock time (time.time()) the round opened here: the interval between rounds.
    opened_at: float = 0.0


ENDED_PHASES = (pb.ROUND_PHASE_PUBLISHED, pb.ROUND_PHASE_ABORTED)  # a round over, either way


def round_summary(rec: RoundRecord) -> dict[str, Any]:
    """One ended round as plain JSON (per-round curves for experiments and audits)."""
    return {
        "round": rec.round,
        "published": rec.phase == pb.ROUND_PHASE_PUBLISHED,
        "reason": rec.reason,
        "providers_received": len(rec.received),
        "providers_used": len(rec.agreed),
        "left_out": dict(sorted(rec.left_out.items())),
        "epsilon": None if math.isinf(rec.epsilon) else rec.epsilon,
        "test_loss": rec.test_loss,
        "test_accuracy": rec.test_accuracy,
        **rec.test_metrics,
        "gc_bytes": rec.gc_bytes,
        "clip_norm": rec.clip_norm or None,
        "noisy_count": rec.noisy_count,
        "seconds": {k: round(v, 6) for k, v in rec.seconds.items()},
        "opened_at": round(rec.opened_at, 6),
    }


class RoundPhases:
    """The steps of a round at this server, each under the state's ``cond``."""

    def open_round(self, t: int) -> None:
        with self.cond:
            if t != self.round or self.phase not in (pb.ROUND_PHASE_UNSPECIFIED,):
                raise RuntimeError(f"cannot open round {t} (at round {self.round}, {self.phase})")
            self.intake.open_round(t)
            self.accepted[t] = set()
            self.history[t] = RoundRecord(t, pb.ROUND_PHASE_COLLECTING, opened_at=time.time())
            if (decay := self.plan.decay_clip) is not None:
                self.clip_norm = decay.norm_at(t)  # the rule's C for this round
            if self.plan.clip_moves:
                self.history[t].clip_norm = self.clip_norm
            self.deadline = time.time() + self.plan.cfg.round_deadline
            self._opened = time.perf_counter()
            self.phase = pb.ROUND_PHASE_COLLECTING
            self._notify_rounds()

    @property
    def counts_on_receipt(self) -> bool:
        """Whether :meth:`note_receiving` records a release (ldp: each vector is noisy)."""
        return self.plan.cfg.mode == "ldp"

    def note_receiving(self, t: int) -> None:
        """A submission for round t was admitted and its payload is about to be read. In ldp
        the payload is a provider's noisy vector: the round's release is counted now, before
        the server holds any of it, whatever the round then does (once per round: each
        provider sends at most one vector per round)."""
        if not self.counts_on_receipt:
            return
        with self.cond:
            if t not in self._ldp_counted:
                self.record_release(t, providers=len(self.plan.cfg.providers))
                self._ldp_counted.add(t)

    def note_accepted(self, t: int, provider: str, encoding: str, payload_bytes: int) -> None:
        """A share (or, in ldp, a noisy vector) of ``provider`` is in round t's sum; it came
        as ``payload_bytes`` bytes of elements in ``encoding`` (the share observers' figures)."""
        with self.cond:
            self.accepted.setdefault(t, set()).add(provider)
            self.cond.notify_all()
        for observer in self._share_observers:
            try:
                observer(encoding, payload_bytes)
            except Exception as exc:  # a metrics failure must never refuse a share
                log.warning("share observer failed: %s", exc)
        fault_point("during-intake", t)

    def intake_complete(self, t: int) -> bool:
        """The deadline passed or the share of every allowed provider is in, but for those
        that declined the plan (none will come: the round need not wait for them)."""
        with self.cond:
            accepted = self.accepted.get(t, frozenset())
            expected = self.allowed_providers - self.declined.keys()
            return self.deadline <= time.time() or expected <= accepted

    def wait_intake_done(self, t: int, stop: threading.Event) -> None:
        """Until :meth:`intake_complete`: the deadline passed, or every share that will come
        is in."""
        with self.cond:
            while not stop.is_set():
                if self.intake_complete(t):
                    return
                self.cond.wait(max(0.01, min(self.deadline - time.time(), 0.2)))

    def close_intake(self, t: int) -> list[str]:
        with self.cond:
            if self.round != t or self.phase != pb.ROUND_PHASE_COLLECTING:
                raise RuntimeError(f"round {t} is not collecting")
            received = sorted(self.intake.close_round())
            self.phase = pb.ROUND_PHASE_AGREEING
            self.history[t].received = received
            self.history[t].vector_ids = self.intake.vector_ids()
            self._intake_closed = time.perf_counter()
            self.history[t].seconds["intake"] = self._intake_closed - self._opened
            return received

    def set_agreed(
        self,
        t: int,
        agreed: list[str],
        proceed: bool,
        reason: str,
        mismatched: Sequence[str] = (),
        refused: dict[str, str] | None = None,
    ) -> None:
        """Round t's P_t. ``mismatched``: providers both servers hold a share of, but of two
        different vectors (ShareHeader.vector_id), left out like one-sided shares. ``refused``:
        providers whose norm proof the two servers did not accept, and why (audited as
        ``norm_proof_refused``: spgc_shares_refused_total{reason="norm"})."""
        refused = refused or {}
        with self.cond:
            rec = self.history[t]
            rec.agreed = list(agreed)
            if self._intake_closed:
                rec.seconds["agree"] = time.perf_counter() - self._intake_closed
            for name in sorted(self.allowed_providers - set(rec.received)):
                declined = self.declined.get(name)
                rec.left_out[name] = (
                    f"it declined the plan: {declined}"
                    if declined is not None
                    else "no share reached this server"
                )
            for name in sorted(set(rec.received) - set(agreed)):
                if name in refused:
                    why = f"its norm proof was refused: {refused[name]}"
                    rec.left_out[name] = why
                    self.audit.record("norm_proof_refused", identity=name, round=t, reason=why)
                    log.warning("round %d: provider %s left out: %s", t, name, why)
                    continue
                why = (
                    "its shares at the two servers are halves of different vectors (restarted "
                    "in the middle of the round, or two processes with one identity?)"
                    if name in mismatched
                    else "its share reached this server but not the other"
                )
                rec.left_out[name] = why
                self.audit.record("provider_dropped", identity=name, round=t, reason=why)
                log.log(
                    logging.WARNING if name in mismatched else logging.INFO,
                    "round %d: provider %s left out: %s",
                    t,
                    name,
                    why,
                )
            if not proceed:
                self.audit.record("round_skipped", round=t, reason=reason)
            if proceed:
                self.intake.restrict_to(agreed)
                self.phase = pb.ROUND_PHASE_COMPUTING
            else:
                rec.reason = reason
                self._end_round(pb.ROUND_PHASE_ABORTED)

    def apply_update(
        self,
        t: int,
        y: np.ndarray,
        info: dict[str, Any],
        seconds: dict,
        release: int | None = None,
    ) -> bytes:
        """g = Y / s, one step of the servers' optimizer (adjacency provider: on the mean delta;
        sgd: on the mean gradient over the expected examples);
        keeps the result pending until both hashes agree. With adaptive clipping, Y's last
        value is the noisy count of unclipped examples (providers' deltas with adjacency
        provider), which moves the clip norm of the next round (spgc.privacy.clipping). ``release``:
        the ledger index of this release (its noise_schedule phase)."""
        start = time.perf_counter()
        stats = self.plan.feature_stats
        if stats is not None and self.standardization is None:
            return self._apply_statistics(t, y, info, seconds, release)
        if stats is not None:  # a step's gradient, zero-padded to the statistics' length
            y = np.asarray(y)[: self.plan.dim]
        # Y holds the trained coordinates only (spgc.learning.trainable): a frozen parameter never
        # moves.
        adaptive, count, next_clip = self.plan.adaptive_clip, None, self.clip_norm
        if (decay := self.plan.decay_clip) is not None:  # rows were rescaled to C0
            gradient = decay.decode(y, self.plan.cfg.scale, self.history[t].clip_norm)
        elif adaptive is None:
            gradient = np.asarray(y, dtype=np.float64) / self.plan.cfg.scale
        else:
            clip_norm = self.history[t].clip_norm
            gradient, count = adaptive.split_release(y, self.plan.cfg.scale, clip_norm)
            next_clip = adaptive.next_clip_norm(clip_norm, count)
        if self.plan.adjacency == "provider":  # the noisy sum of the providers' deltas
            expected = (
                self.plan.expected_providers
                if release is None
                else self.plan.expected_providers_for(release)  # its noise_schedule phase
            )
            gradient = mean_delta_direction(gradient, expected)
        elif self.plan.cfg.server_optimizer == "sgd":  # Adam's step is scale-free, SGD's not
            gradient = mean_gradient(gradient, self.plan.expected_examples)
        trained = self.plan.coordinates
        if trained.anything_frozen:
            new = self.params.copy()
            new[trained.index] = self.optimizer.step(self.params[trained.index], gradient)
        else:
            new = self.optimizer.step(self.params, gradient)
        sha = self.plan.model_sha256(new)
        seconds["update"] = time.perf_counter() - start
        with self.cond:
            rec = self.history[t]
            rec.noisy_sum_units, rec.gradient, rec.noisy_count = y, gradient, count
            rec.peer_bytes = {d: int(info.get(d, 0)) for d in ("sent", "received")}
            rec.gc_bytes = sum(rec.peer_bytes.values())
            rec.seconds.update(seconds)
            rec.model_sha256 = sha
            self.pending = (new, sha)
            self.pending_clip_norm = next_clip
            self.cond.notify_all()
        return sha

    def _apply_statistics(
        self, t: int, y: np.ndarray, info: dict[str, Any], seconds: dict, release: int | None
    ) -> bytes:
        """standardize, round t the feature statistics' release (ledger release 0): the means
        and deviations from the noisy sums, pending with the unchanged model until both
        servers publish (the same Y gives both the same statistics)."""
        stats = self.plan.feature_stats
        assert stats is not None
        if release not in (None, 0):
            # Release 0 (the statistics) was counted, but its result was lost: a failure after
            # its reveal. Never a second one (the ledger allows one, first): the run ends.
            raise RuntimeError(
                f"round {t}: the feature statistics' release (ledger release 0) was counted but "
                "its result was lost (a failure after its reveal); this run cannot standardise "
                "any more: start a new run (resume: false)"
            )
        start = time.perf_counter()
        standardization = stats.estimate(y)  # ValueError: too few examples for statistics
        new = self.params.copy()
        sha = self.plan.model_sha256(new)
        seconds["update"] = time.perf_counter() - start
        with self.cond:
            rec = self.history[t]
            rec.noisy_sum_units = y
            rec.peer_bytes = {d: int(info.get(d, 0)) for d in ("sent", "received")}
            rec.gc_bytes = sum(rec.peer_bytes.values())
            rec.seconds.update(seconds)
            rec.model_sha256 = sha
            self.pending = (new, sha)
            self.pending_clip_norm = self.clip_norm
            self.pending_standardization = standardization
            self.cond.notify_all()
        return sha

    def fail_compute(self, exc: BaseException) -> None:
        with self.cond:
            self.compute_error = exc
            self.cond.notify_all()

    def wait_pending(self, t: int, timeout: float) -> bytes:
        """This server's hash of version t+1 once computed (TimeoutError / the error)."""
        end = time.time() + timeout
        with self.cond:
            while self.pending is None and self.compute_error is None:
                if not self.cond.wait(max(0.0, end - time.time())) and time.time() >= end:
                    raise TimeoutError(f"model version {t + 1} not computed in {timeout:.0f} s")
            if self.compute_error is not None:
                raise RuntimeError(f"round {t} failed: {self.compute_error}")
            assert self.pending is not None
            return self.pending[1]

    def publish(self, t: int) -> RoundRecord:
        """Publish version t+1, record the step with the accountant, end the round."""
        with self.cond:
            assert self.pending is not None
            self.params, sha = self.pending
            self.pending = None
            stats_round = self.pending_standardization is not None
            if stats_round:  # round 0's release: the statistics, not a step
                self.standardization = self.pending_standardization
                self.pending_standardization = None
                if self.evaluator is not None:
                    self.evaluator.standardize(self.standardization)
            self.clip_norm = self.pending_clip_norm  # the next round's C (adaptive clipping)
            self.version += 1
            self.models[self.version] = (self.params, sha)
            self.model_head = self.ledger_head()  # the releases this version depends on
            for old in [v for v in self.models if v <= self.version - _KEEP_VERSIONS]:
                del self.models[old]
            if not stats_round:
                self.steps += 1  # the accountant counted this release before it happened
            self.history[t].epsilon = self.epsilon()
            self._end_round(pb.ROUND_PHASE_PUBLISHED)
            return self.history[t]

    def _end_round(self, phase: int) -> None:
        rec = self.history[self.round]
        rec.phase = phase
        self.intake.finish_round()  # deletes the round's spill files
        self.round += 1
        self.deadline = 0.0
        self.phase = pb.ROUND_PHASE_UNSPECIFIED
        self.compute_error = None
        self.finished = self._should_stop()
        if self.finished:
            self.phase = pb.ROUND_PHASE_FINISHED
        self._notify_rounds()

    def _should_stop(self) -> bool:
        """Deterministic on both servers: the round budget, or the next step would exceed
        the privacy budget."""
        if self.round >= self.plan.cfg.rounds + self.plan.steps_before_training:
            return True
        if self.accountant is None:
            return False
        return self.accountant.epsilon_after(self.releases + 1) > self.plan.cfg.target_epsilon

    # ------------------------------------------------------------------ a lost peer

    def abandon_for_peer(self, reason: str) -> int | None:
        """The peer server was lost: drop the round in progress (its shares and any pending
        model; a release it made stays in the ledger and counted) and tell providers to wait.
        The caller then restores the last checkpoint. Returns the abandoned round, if any."""
        with self.cond:
            active = (
                pb.ROUND_PHASE_COLLECTING,
                pb.ROUND_PHASE_AGREEING,
                pb.ROUND_PHASE_COMPUTING,
            )
            t = self.round if self.phase in active else None
            self.peer_waiting = True
            self.intake.abandon_round(self.round)
            self.accepted.pop(self.round, None)
            self.pending = None
            self.compute_error = None
            self.deadline = 0.0
            if t is not None:
                self.history[t].phase = pb.ROUND_PHASE_ABORTED
                self.history[t].reason = reason
                self.phase = pb.ROUND_PHASE_UNSPECIFIED
            self._notify_rounds()
            return t

    def peer_back(self) -> None:
        """The servers are paired again: rounds may open."""
        with self.cond:
            self.peer_waiting = False
            self._notify_rounds()

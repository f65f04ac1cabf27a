"""One server's training state: published models, the open round, the accountant, history.

Shared by the provider-facing servicer, the peer servicer and the round driver; every change
happens under one condition variable so that waiters (CheckModel, intake-done) wake promptly.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import serialization
from torch import nn

from garbled_core.discrete_gaussian import DEFAULT_DISTANCE_LOG2
from spgc.accounting import capped_poisson, reported_delta
from spgc.export import privacy_report, write_export
from spgc.ledger import (
    Ledger,
    LedgerError,
    aside_path,
    load_signing_key,
    public_key_hex,
    read_ledger_lines,
    released_digest,
    verify_ledger,
)
from spgc.logs import printable
from spgc.models import resolve_model
from spgc.modes import TWO_SERVER_MODES
from spgc.optim import Adam
from spgc.plan import RunPlan
from spgc.servers.audit import AuditLog
from spgc.servers.checkpoint import CheckpointError, config_digest, save_checkpoint
from spgc.servers.evaluation import TestSetEvaluator, test_set_loader
from spgc.servers.faults import fault_point
from spgc.servers.intake import ShareIntake
from spgc.wire import aggregation_pb2 as pb
from spgc.wire import vector_sha256

log = logging.getLogger(__name__)

RPC_SLACK = 60.0  # seconds on top of the round deadline for a waiting peer call
_KEEP_VERSIONS = 2  # the current model and the one before (for slow providers)
MODEL_FILE = "model.safetensors"  # in state_dir: the latest published model (+ model.json)
MODELS_DIR = "models"  # in state_dir: every version, v00001.safetensors (+ .json)


def run_model(model_name: str, seed: int = 0) -> nn.Module:
    """The torch module a run trains, to export its weights into (the one place it is built)."""
    return resolve_model(model_name, seed=seed)


class PeerMismatchError(RuntimeError):
    """The two servers disagree (configuration or model hash): training must stop."""


class BudgetExceededError(PeerMismatchError):
    """A release would take the run past its privacy budget. The round loop never opens such
    a round, so this is a broken invariant: the run stops, as on a mismatch."""


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
    gc_bytes: int = 0
    peer_bytes: dict[str, int] = field(default_factory=dict)  # the data link: sent, received
    seconds: dict[str, float] = field(default_factory=dict)
    seed_commitments: dict[str, bytes] = field(default_factory=dict)
    vector_ids: dict[str, bytes] = field(default_factory=dict)  # of the received shares
    left_out: dict[str, str] = field(default_factory=dict)  # provider -> why not in P_t


_ENDED = (pb.ROUND_PHASE_PUBLISHED, pb.ROUND_PHASE_ABORTED)


def _ledger_releases(lines: list[bytes]) -> tuple[Any, list[dict[str, Any]]]:
    """The run id a ledger's header names (None: no lines) and its release entries."""
    entries = [json.loads(line) for line in lines]
    run = entries[0].get("run_id") if entries else None
    return run, [e for e in entries if e.get("kind") == "release"]


def _round_summary(rec: RoundRecord) -> dict[str, Any]:
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
        "gc_bytes": rec.gc_bytes,
        "seconds": {k: round(v, 6) for k, v in rec.seconds.items()},
    }


def release_counts_problem(h1: int, h2: int) -> str | None:
    """Why two servers whose ledgers count ``h1`` and ``h2`` releases of one run must not pair
    (None: they may). H2 records each release before H1, so H2 may hold one more."""
    if h2 - h1 in (0, 1):
        return None
    return (
        f"the servers' privacy ledgers count different releases of the run: h1 {h1}, h2 {h2} "
        "(each release is recorded by both, so one server's state lost some: a state_dir "
        "restored from a backup, a cut ledger file, a server started afresh?); restore the "
        "newest state_dir of each server, or start a new run on both (resume: false), whose "
        "privacy budget starts again"
    )


class ServerState:
    """Models, round phase and privacy spent at one server (thread-safe)."""

    def __init__(self, plan: RunPlan, role: int, intake: ShareIntake) -> None:
        self.plan = plan
        self.role = role
        self.intake = intake
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
        self.params = plan.initial_params.copy()
        self.version = 0
        self.models: dict[int, tuple[np.ndarray, bytes]] = {
            0: (self.params, vector_sha256(self.params))
        }
        self.adam = Adam(plan.dim, lr=plan.cfg.lr)
        test_set = test_set_loader(plan.cfg)
        self.evaluator = (
            TestSetEvaluator(plan.model_name, test_set)
            if plan.cfg.evaluate and test_set is not None
            else None
        )
        self.accountant = plan.new_accountant()
        self.steps = 0
        self.round = 0
        self.phase = pb.ROUND_PHASE_UNSPECIFIED
        self.deadline = 0.0
        self._opened = 0.0
        self.accepted: dict[int, set[str]] = {}
        self.history: dict[int, RoundRecord] = {}
        self.pending: tuple[np.ndarray, bytes] | None = None  # computed, not yet published
        self.compute_error: BaseException | None = None
        self.failure: str | None = None
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
        self._export_lock = threading.Lock()  # one export at a time into the cached module
        self._export_module: nn.Module | None = None
        self.declined: dict[str, str] = {}  # provider -> why it refused the plan
        self.callers: set[str] = set()  # providers that called this server (first-round wait)
        self.told_finished: set[str] = set()  # providers answered ROUND_PHASE_FINISHED
        self.last_told_finished = -math.inf  # time.monotonic() when the last one was
        # The write-ahead privacy ledger (spgc.ledger): opened once the run id is known.
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

    def epsilon(self) -> float:
        """Privacy spent so far (inf once a noise-free step was released)."""
        if self.accountant is None:
            return math.inf if self.steps else 0.0
        return self.accountant.epsilon()

    @property
    def differentially_private(self) -> bool:
        """Whether the run's releases carry a DP guarantee (not in only-mpc or plain)."""
        return self.accountant is not None

    def noise_samples(self) -> int:
        """Discrete Gaussian samples drawn for the releases so far (every ledger entry)."""
        return self.samples_drawn

    # ------------------------------------------------------------------ ledger (write-ahead)

    def _ledger_header(self) -> dict[str, Any]:
        plan, cfg = self.plan, self.plan.cfg
        two_servers = cfg.mode in TWO_SERVER_MODES
        if two_servers and self.peer_ledger_key is None:
            raise RuntimeError("the peer server's ledger key is not known (no Handshake yet)")
        return {
            "run_id": self.run_id,
            "server": cfg.role_name,
            "peer": ("h2" if self.role == pb.SERVER_ROLE_H1 else "h1") if two_servers else None,
            "peer_public_key": self.peer_ledger_key if two_servers else None,
            "mode": cfg.mode,
            "plan_sha256": config_digest(plan.training_config(self.run_id)),
            "noise_multiplier": plan.noise_multiplier if self.accountant else 0.0,
            "sampling": plan.sampling,
            "accountant": cfg.accountant,
            "delta": cfg.target_delta,
            "sensitivity_units": float(plan.fixed_point.l2_bound_units),
            # A Poisson batch over this cap sits its round out (reported_delta counts it).
            "max_batch_size": (
                int(cfg.max_batch_size) if capped_poisson(plan.sampling, cfg.max_batch_size) else 0
            ),
        }

    def open_ledger(self) -> None:
        """Open (and check) this run's ledger now, once both servers' keys are known (at the
        Handshake): a ledger that cannot be continued stops the pairing, not a release."""
        with self.cond:
            self._open_ledger()

    def _open_ledger(self) -> Ledger:
        """This run's ledger (continued after a restart); the caller holds ``cond``."""
        if self.ledger is None:
            self.ledger = Ledger.open(self.ledger_path, self._signing_key(), self._ledger_header())
            self._count_ledger(self.ledger.lines)
        return self.ledger

    def _count_ledger(self, lines: list[bytes]) -> None:
        """Count every release entry of this run's ledger ``lines`` (a crash may have left
        some after the checkpoint): the accountant and the sampler's delta count them all."""
        run, releases = _ledger_releases(lines)
        if run != self.run_id:
            self._refuse_short_ledger(0)
            return
        self._refuse_short_ledger(len(releases))
        self.samples_drawn = max(self.samples_drawn, sum(int(e["noise_samples"]) for e in releases))
        extra = len(releases) - self.releases
        if extra > 0:
            self.releases += extra
            if self.accountant is not None:
                self.accountant.step(extra)
            log.warning(
                "%s: the ledger holds %d release(s) after the checkpoint; all are counted",
                self.plan.cfg.role_name,
                extra,
            )

    def refuse_ledger_without_checkpoint(self) -> None:
        """At a start with no checkpoint (CheckpointError otherwise). Every run checkpoints its
        start before its first release, so releases in the ledger with no checkpoint beside
        them mean the checkpoint was lost: resuming silently would start a new run with a
        fresh privacy budget on the same data."""
        path = self.ledger_path
        if path is None or not path.exists():
            return
        try:
            run, releases = _ledger_releases(read_ledger_lines(path))
        except (ValueError, AttributeError):  # not JSON objects
            raise CheckpointError(f"{path} is not a ledger (a line is not a JSON object)") from None
        if releases:
            raise CheckpointError(
                f"state_dir {path.parent} has no checkpoint, but its ledger records "
                f"{len(releases)} release(s) of run {run}: the checkpoint was lost. Restore it "
                "to continue that run, or set resume: false to start a NEW run, whose privacy "
                f"budget starts again (that ledger is then kept as ledger.jsonl.{run})"
            )

    def _refuse_short_ledger(self, entries: int) -> None:
        """A ledger holding fewer of this run's releases than the checkpoint counts was cut,
        emptied, deleted or replaced: continuing would extend it and understate epsilon to
        anyone who verifies it. CheckpointError (the daemon does not start)."""
        if self.ledger_path is not None and entries < self.releases:
            raise CheckpointError(
                f"{self.ledger_path} holds {entries} release entr{'y' if entries == 1 else 'ies'}"
                f" of run {self.run_id}, but the checkpoint counts {self.releases} release(s): "
                "the ledger was truncated, deleted or replaced. Restore it from a backup; a "
                "ledger is never continued with fewer releases than were made"
            )

    def _count_ledger_on_disk(self) -> None:
        """At a restart: count the releases of this run's ledger file (verified) without
        opening it for writing (its header needs the peer's key, known at the Handshake)."""
        path = self.ledger_path
        if path is None or not path.exists():
            self._refuse_short_ledger(0)
            return
        lines = read_ledger_lines(path)
        if not lines or json.loads(lines[0]).get("run_id") != self.run_id:
            self._refuse_short_ledger(0)
            return  # another run's ledger: set aside when this run's is opened
        try:
            verify_ledger(lines)  # a damaged ledger stops the restart
        except LedgerError as exc:
            raise LedgerError(f"{path}: {exc}; restore it from a backup") from None
        self._count_ledger(lines)

    def ledger_public_key(self) -> bytes:
        """This server's raw Ed25519 ledger public key (sent in its PeerHello)."""
        with self.cond:
            return bytes.fromhex(public_key_hex(self._signing_key()))

    def set_peer_ledger_key(self, raw: bytes) -> None:
        """The peer's ledger key from its PeerHello; a continued ledger must name the same."""
        if len(raw) != 32:
            raise PeerMismatchError("the peer server sent no valid ledger public key")
        with self.cond:
            if self.ledger is not None and self.ledger.header.get("peer_public_key") != raw.hex():
                raise PeerMismatchError(
                    "the peer server signs with another ledger key than this run's ledger names"
                )
            self.peer_ledger_key = raw.hex()

    def _signing_key(self) -> Any:
        if self._signer is None:
            self._signer = self._load_signing_key()
        return self._signer

    def _load_signing_key(self) -> Any:
        if self.ledger_key is not None:
            return load_signing_key(self.ledger_key)
        if self.ledger_path is None:
            return load_signing_key(None)
        # No configured key: one kept beside the ledger, so a restart continues it.
        path = self.ledger_path.with_name("ledger-signing.key")
        if not path.exists():
            key = load_signing_key(None)
            pem = key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(pem)
                f.flush()
                os.fsync(f.fileno())
        return load_signing_key(path)

    def _release_samples(self, t: int, providers: int | None) -> int:
        used = len(self.history[t].agreed) if providers is None else providers
        return self.plan.noise_samples_per_step(used)

    def release_statement(self, t: int) -> tuple[bytes, bytes]:
        """(statement, this server's signature) of round t's release: what the two servers
        exchange (CosignRelease) before either records and runs it."""
        with self.cond:
            return self._open_ledger().statement(t, self._release_samples(t, None))

    def record_release(
        self, t: int, providers: int | None = None, peer_sig: bytes | None = None
    ) -> int:
        """Write-ahead: the ledger entry (fsynced) and the accountant's count for one release
        of round t, BEFORE anything noisy leaves this server. Two-server modes need the peer's
        signature over :meth:`release_statement`. Returns the entry's index."""
        with self.cond:
            self._refuse_over_budget(t)
            return self._count_release(t, self._release_samples(t, providers), peer_sig)

    def _refuse_over_budget(self, t: int) -> None:
        """Nothing is released past the budget, whatever opened the round (the caller holds
        ``cond``). Not for a release the peer already made (:meth:`record_peer_release`): that
        one is counted whatever it costs."""
        if self.accountant is None:
            return
        after = self.accountant.epsilon_after(self.accountant.steps + 1)
        if after > self.plan.cfg.target_epsilon:
            raise BudgetExceededError(
                f"round {t}: its release would bring epsilon to {after:.4f}, past the budget "
                f"{self.plan.cfg.target_epsilon:g} ({self.releases} release(s) counted): refused"
            )

    def _count_release(self, t: int, samples: int, peer_sig: bytes | None) -> int:
        """The ledger entry, then the count (the caller holds ``cond``)."""
        ledger = self._open_ledger()
        after = (
            self.accountant.epsilon_after(self.accountant.steps + 1)
            if self.accountant is not None
            else math.inf
        )
        try:
            index = ledger.record_release(t, samples, after, peer_sig)
        except LedgerError as exc:
            raise PeerMismatchError(str(exc)) from None
        self.releases += 1
        self.samples_drawn += samples
        if self.accountant is not None:
            self.accountant.step()
        return index

    def last_release_statement(self) -> tuple[int, bytes, bytes] | None:
        """(round, statement, this server's signature) of this run's last release entry (None:
        no release yet): what H2 sends H1 when H1 never recorded it."""
        with self.cond:
            ledger = self._open_ledger()
            _, releases = _ledger_releases(ledger.lines)
            if not releases:
                return None
            last = releases[-1]
            t = int(last["round"])
            statement, signature = ledger.statement(t, int(last["noise_samples"]))
            return t, statement, signature

    def record_peer_release(self, statement: bytes, signature: bytes) -> None:
        """H1 at the Handshake: the release H2 recorded last and this server never did (a
        crash or a lost answer between the two entries), recorded now with H2's signature, so
        both ledgers and both accountants count it. PeerMismatchError unless the statement is
        the one this server would make for that round."""
        try:
            fields = json.loads(statement)
            t, samples = int(fields["round"]), int(fields["noise_samples"])
        except (ValueError, KeyError, TypeError):
            raise PeerMismatchError("the other server sent a malformed release statement") from None
        with self.cond:
            mine, _ = self._open_ledger().statement(t, samples)
            if mine != statement:
                raise PeerMismatchError(
                    f"the release of round {t} that the other server recorded alone is not "
                    "one of this run's plan"
                )
            self._count_release(t, samples, signature)
            self.finished = self._should_stop()  # the count moved: so may the stopping rule
            if self.finished:
                self.phase = pb.ROUND_PHASE_FINISHED
        log.warning(
            "%s: recorded the release of round %d that the other server had recorded alone (a "
            "crash or a lost answer between the two entries): both ledgers count %d",
            self.plan.cfg.role_name,
            t,
            self.releases,
        )

    def _ledger_file_lines(self) -> list[bytes]:
        """This run's ledger as the file holds it, before this process opened it (after a
        restart it opens at the Handshake, or in the one-server modes at the first release);
        [] without one (the caller holds ``cond``)."""
        if self.ledger_path is None or not self.ledger_path.is_file():
            return []
        lines = read_ledger_lines(self.ledger_path)
        try:
            run, _ = _ledger_releases(lines)
        except (ValueError, KeyError, TypeError, AttributeError):
            return []  # damaged: refused with its reasons when the ledger is opened
        return lines if run == self.run_id else []

    def ledger_lines(self) -> list[bytes]:
        """The ledger's lines so far (a restarted server's file before its first new release;
        empty before the first release of the run)."""
        with self.cond:
            if self.ledger is None:
                return self._ledger_file_lines()
            return list(self.ledger.lines)

    def record_released(self, index: int, t: int, y: np.ndarray) -> None:
        """What release ``index`` revealed: the SHA-256 of its values as decimal text (they
        may exceed 64 bits)."""
        digest = released_digest(y)
        with self.cond:
            self._open_ledger().record_released(index, t, digest)

    def reported_delta(self) -> float | None:
        """The delta of the guarantee (spgc.accounting.reported_delta: the accountant's, the
        sampler's statistical distance and the capped Poisson batches). None without DP."""
        if not self.differentially_private:
            return None
        cfg = self.plan.cfg
        capped = self.releases if capped_poisson(self.plan.sampling, cfg.max_batch_size) else 0
        return reported_delta(cfg.target_delta, self.epsilon(), self.noise_samples(), capped)

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
            if t == self.round and self.deadline:
                info.deadline.FromNanoseconds(int(self.deadline * 1e9))
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
        """(version, params, sha256) of a served version; KeyError if not served."""
        with self.cond:
            v = self.version if version is None else version
            params, sha = self.models[v]
            return v, params, sha

    # ------------------------------------------------------------------ round life cycle

    def open_round(self, t: int) -> None:
        with self.cond:
            if t != self.round or self.phase not in (pb.ROUND_PHASE_UNSPECIFIED,):
                raise RuntimeError(f"cannot open round {t} (at round {self.round}, {self.phase})")
            self.intake.open_round(t)
            self.accepted[t] = set()
            self.history[t] = RoundRecord(t, pb.ROUND_PHASE_COLLECTING)
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

    def add_share_observer(self, observer: Callable[[str, int], None]) -> None:
        """``observer(encoding, payload_bytes)`` runs once per accepted share (metrics)."""
        self._share_observers.append(observer)

    def intake_complete(self, t: int) -> bool:
        """The deadline passed or every allowed provider's share is in."""
        with self.cond:
            accepted = self.accepted.get(t, frozenset())
            return self.deadline <= time.time() or self.allowed_providers <= accepted

    def wait_intake_done(self, t: int, stop: threading.Event) -> None:
        """Until the deadline passes or every allowed provider's share is in."""
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
    ) -> None:
        """Round t's P_t. ``mismatched``: providers both servers hold a share of, but of two
        different vectors (ShareHeader.vector_id), left out like one-sided shares."""
        with self.cond:
            rec = self.history[t]
            rec.agreed = list(agreed)
            if self._intake_closed:
                rec.seconds["agree"] = time.perf_counter() - self._intake_closed
            for name in sorted(self.allowed_providers - set(rec.received)):
                rec.left_out[name] = "no share reached this server"
            for name in sorted(set(rec.received) - set(agreed)):
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

    def apply_update(self, t: int, y: np.ndarray, info: dict[str, Any], seconds: dict) -> bytes:
        """g = Y / s, one Adam step; keeps the result pending until both hashes agree."""
        start = time.perf_counter()
        gradient = np.asarray(y, dtype=np.float64) / self.plan.cfg.scale
        if self.plan.frozen is not None:
            gradient[self.plan.frozen] = 0.0  # only noise there: a frozen parameter never moves
        new = self.adam.step(self.params, gradient)
        sha = vector_sha256(new)
        seconds["update"] = time.perf_counter() - start
        with self.cond:
            rec = self.history[t]
            rec.noisy_sum_units, rec.gradient = y, gradient
            rec.peer_bytes = {d: int(info.get(d, 0)) for d in ("sent", "received")}
            rec.gc_bytes = sum(rec.peer_bytes.values())
            rec.seconds.update(seconds)
            rec.model_sha256 = sha
            self.pending = (new, sha)
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
            self.version += 1
            self.models[self.version] = (self.params, sha)
            for old in [v for v in self.models if v <= self.version - _KEEP_VERSIONS]:
                del self.models[old]
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
        if self.round >= self.plan.cfg.rounds:
            return True
        if self.accountant is None:
            return False
        return self.accountant.epsilon_after(self.releases + 1) > self.plan.cfg.target_epsilon

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
                "rounds": self.round,
                "steps": self.steps,
                "model_version": self.version,
                "model_sha256": self.models[self.version][1].hex(),
                "test_accuracy": None if last is None else last.test_accuracy,
                "test_loss": None if last is None else last.test_loss,
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
                "gc_bytes": sum(r.gc_bytes for r in self.history.values()),
                "offline_gc_bytes": self.offline_bytes,
                "history": [_round_summary(r) for r in self.history.values() if r.phase in _ENDED],
                "finished": self.finished,
                "failure": self.failure,
                "declined": dict(self.declined),
            }

    # ------------------------------------------------------------------ checkpoints

    def model_report(self) -> dict[str, Any]:
        """The privacy report of the current published model (spgc.export)."""
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
            )

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

        with self.cond:
            adam = self.adam.state_dict()
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
                "model_sha256": self.models[self.version][1].hex(),
                "adam": {
                    "t": adam["t"],
                    "beta_pows": list(adam["beta_pows"]),
                },
                "history": [
                    {**_round_summary(r), "received": r.received, "agreed": r.agreed}
                    for r in self.history.values()
                    if r.phase in _ENDED
                ],
            }
            arrays = {"params": self.params, "adam_m": adam["m"], "adam_v": adam["v"]}
            ended = self.round - 1
            save_checkpoint(
                self.checkpoint_dir,
                record,
                arrays,
                before_commit=lambda: fault_point("during-checkpoint", ended),
            )
            snapshot = (self.version, self.params, report)  # params are replaced, never mutated
            self.checkpointed = True
        self._write_model(*snapshot)

    def restore(self, record: dict[str, Any], arrays: dict[str, np.ndarray]) -> None:
        """Continue from a checkpoint (its TrainingConfig was checked by the caller)."""

        params = np.asarray(arrays["params"], dtype=np.float64)
        sha = vector_sha256(params)
        if params.shape != (self.plan.dim,) or sha.hex() != record["model_sha256"]:
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
            state = self.adam.state_dict()
            state.update(
                t=int(record["adam"]["t"]),
                beta_pows=tuple(record["adam"]["beta_pows"]),
                m=arrays["adam_m"],
                v=arrays["adam_v"],
            )
            self.adam.load_state_dict(state)
            self.steps = int(record["steps"])
            self.releases = int(record.get("releases", self.steps))
            self.samples_drawn = int(record.get("noise_samples", 0))
            if self.accountant is not None and self.releases:
                self.accountant.step(self.releases)  # every release counts
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
                    gc_bytes=h["gc_bytes"],
                    seconds=dict(h["seconds"]),
                    left_out=dict(h.get("left_out", {})),  # absent in older checkpoints
                )
                self.history[rec.round] = rec
            self.finished = self._should_stop()
            if self.finished:
                self.phase = pb.ROUND_PHASE_FINISHED

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

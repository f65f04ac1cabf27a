"""The write-ahead privacy ledger and the accountant's count, as one server keeps them.

A part of :class:`~spgc.servers.state.ServerState` (servers/state.py sets up the fields it uses
and holds the lock, ``cond``). Each release is appended to the ledger (fsynced; in two-server
modes co-signed by both servers) and counted by the accountant BEFORE anything noisy leaves
the server; a restart counts every release the ledger holds, and a ledger holding fewer than
the checkpoint counts is refused (docs/PRIVACY.md).
"""

from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

import numpy as np
from cryptography.hazmat.primitives import serialization

from spgc.privacy.accounting import capped_poisson, reported_delta
from spgc.privacy.ledger import Ledger
from spgc.privacy.ledger_format import (
    ABORT_KEYS,
    FEATURE_STATS_RELEASE,
    LedgerError,
    load_signing_key,
    public_key_hex,
    read_ledger_lines,
    released_digest,
    statement_bytes,
)
from spgc.privacy.ledger_verify import verify_ledger
from spgc.protocol.modes import DEFAULT_SECURITY, TWO_SERVER_MODES
from spgc.servers.checkpoint import CheckpointError, config_digest
from spgc.servers.errors import BudgetExceededError, PeerMismatchError
from spgc.wire import aggregation_pb2 as pb

log = logging.getLogger(__name__)


def _ledger_releases(lines: list[bytes]) -> tuple[Any, list[dict[str, Any]]]:
    """The run id a ledger's header names (None: no lines) and its release entries."""
    entries = [json.loads(line) for line in lines]
    run = entries[0].get("run_id") if entries else None
    return run, [e for e in entries if e.get("kind") == "release"]


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


class LedgerState:
    """This server's ledger and what the accountant counts of it (thread-safe through the
    state's ``cond``)."""

    # (release entries, co-signed head) when the latest model version was published (set by
    # RoundPhases.publish); None before the first publish of this process.
    model_head: tuple[int, str] | None = None

    # ------------------------------------------------------------------ privacy spent

    def epsilon(self) -> float:
        """Privacy spent so far (inf once a noise-free step was released)."""
        if self.accountant is None:
            return math.inf if self.steps else 0.0
        return self.accountant.epsilon()

    def noise_floor_summary(self) -> dict[str, Any] | None:
        """noise_floor (issue 46): f, each figure's effective noise multiplier and its epsilon
        after the steps counted so far (None: infinite); None without a noise floor."""
        plan = self.plan
        if plan.noise_floor <= 0 or self.accountant is None:
            return None
        steps = self.accountant.steps
        epsilons: dict[str, float | None] = {}
        for name, acc in plan.floor_accountants().items():
            eps = math.inf if acc is None else acc.epsilon_after(steps)
            epsilons[name] = None if math.isinf(eps) else eps
        return {
            "fraction": plan.noise_floor,
            "noise_multipliers": plan.floor_multipliers().as_dict(),
            "epsilon": epsilons,
        }

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
            "max_batch_size": self._applied_batch_cap(),
            "clip": self._clip_rule(),
            "backend": cfg.backend,
            "verify_inputs": cfg.verify_inputs,
            **self._feature_stats_plan(),
            **self._noise_floor_field(),
            # security (issue 46): malicious only; semi-honest leaves the header as before
            **({} if cfg.security == DEFAULT_SECURITY else {"security": cfg.security}),
        }

    def _noise_floor_field(self) -> dict[str, Any]:
        """noise_floor (issue 46) when the plan has one: what the three figures are recomputed
        from; nothing otherwise (the header as before, byte for byte)."""
        if self.plan.noise_floor <= 0 or not self.accountant:
            return {}
        return {
            "noise_floor": {"fraction": self.plan.noise_floor, "coordinates": self.plan.share_dim}
        }

    def _feature_stats_plan(self) -> dict[str, Any]:
        """standardize: the statistics release's plan in the header (what re-accounting
        composes with the steps); nothing without (the header as before)."""
        stats = self.plan.feature_stats
        if stats is None:
            return {}
        return {
            "feature_stats": {
                "noise_multiplier": stats.noise_multiplier,
                "sensitivity_units": stats.sensitivity_units,
                "features": stats.ranges.features,
            }
        }

    def _release_kind(self) -> str | None:
        """What the next release entry releases when it is not a step (the caller holds
        ``cond``): the feature statistics as release 0 with standardize."""
        return FEATURE_STATS_RELEASE if self.plan.is_stats_release(self.releases) else None

    def _applied_batch_cap(self) -> int:
        """The Poisson batch cap providers apply (TrainingConfig.max_batch_size: the
        configured one, or the one verify_inputs sets); 0 without Poisson sampling."""
        plan = self.plan
        return int(plan.max_batch_size) if capped_poisson(plan.sampling, plan.max_batch_size) else 0

    def _clip_rule(self) -> dict[str, Any]:
        """The ledger header's clip: the fixed C, or the adaptive rule with both noises."""
        plan, adaptive = self.plan, self.plan.adaptive_clip
        if (decay := plan.decay_clip) is not None:
            return {
                "rule": "decay",
                "initial_norm": decay.initial_norm,
                "rate": decay.rate,
                "floor": decay.floor,
            }
        if adaptive is None:
            return {"rule": "fixed", "clip_norm": plan.cfg.clip_norm}
        return {
            "rule": "adaptive",
            "initial_norm": adaptive.initial_norm,
            "target_quantile": adaptive.target_quantile,
            "learning_rate": adaptive.learning_rate,
            "update_noise_multiplier": adaptive.update_noise_multiplier(
                plan.sigma_units, plan.cfg.scale
            ),
            "count_noise_std": adaptive.count_noise_std(plan.sigma_units, plan.cfg.scale),
        }

    def _release_clip(self, t: int) -> float:
        """Round t's clip norm (the caller holds ``cond``): the plan's, or with adaptive
        clipping the one round t ran (or, not opened here, will run) with."""
        if (decay := self.plan.decay_clip) is not None:
            return decay.norm_at(t)
        if self.plan.adaptive_clip is None:
            return self.plan.cfg.clip_norm
        rec = self.history.get(t)
        return rec.clip_norm if rec is not None and rec.clip_norm else self.clip_norm

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
            return self._open_ledger().statement(
                t,
                self._release_samples(t, None),
                self._release_clip(t),
                self._epsilon_next(),
                self._release_kind(),
            )

    def _epsilon_next(self) -> float:
        """Epsilon once one more release is counted (inf without noise; the caller holds
        ``cond``): the running epsilon both servers co-sign."""
        if self.accountant is None:
            return math.inf
        return self.accountant.epsilon_after(self.accountant.steps + 1)

    def ledger_head(self) -> tuple[int, str] | None:
        """(release entries, the co-signed ledger head after them): what a published model
        depends on. None while the ledger cannot be opened (two-server modes before the
        Handshake)."""
        with self.cond:
            two_servers = self.plan.cfg.mode in TWO_SERVER_MODES
            if self.ledger is None and two_servers and self.peer_ledger_key is None:
                return None
            ledger = self._open_ledger()
            return ledger.releases, ledger.head

    def published_head(self, *, open_ledger: bool = True) -> tuple[int, str] | None:
        """(release entries, co-signed head) the latest published model depends on: taken at
        its publication; before any in this process (a start, a restart), the ledger's head
        now, which holds every release before that model. ``open_ledger`` False (a provider's
        call): None rather than open the ledger here."""
        with self.cond:
            if self.model_head is not None:
                return self.model_head
            if self.ledger is None and not open_ledger:
                return None
            return self.ledger_head()

    def close_statement(self) -> tuple[bytes, bytes]:
        """(statement, this server's signature) of the closing entry at the ledger's head."""
        with self.cond:
            return self._open_ledger().close_statement()

    def record_close(self, peer_sig: bytes | None = None) -> None:
        """The run is over: the closing entry (two-server modes co-signed by the peer, whose
        signature is over :meth:`close_statement`). PeerMismatchError for a bad signature."""
        with self.cond:
            try:
                self._open_ledger().record_close(peer_sig)
            except LedgerError as exc:
                raise PeerMismatchError(str(exc)) from None
            self.cond.notify_all()  # H2 waits for it before it stops (servers/sessions.py)

    def record_abort(self, t: int, check: str, evidence: str, evidence_digest: str) -> None:
        """This server caught the peer deviating in round t: the ledger's abort entry, signed
        by this server alone (spgc.privacy.ledger.Ledger.record_abort); no release follows."""
        with self.cond:
            self._open_ledger().record_abort(t, check, evidence, evidence_digest)
            self.cond.notify_all()

    def abort_summary(self) -> dict[str, Any] | None:
        """The ledger's abort entry (round, check, evidence, evidence_digest, time), None
        without one."""
        with self.cond:
            abort = None if self.ledger is None else self.ledger.aborted
        return None if abort is None else {k: abort[k] for k in (*ABORT_KEYS, "time")}

    @property
    def ledger_closed(self) -> bool:
        """Whether this run's ledger holds its closing entry."""
        with self.cond:
            return self.ledger is not None and self.ledger.closed

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
        after = self._epsilon_next()
        try:
            index = ledger.record_release(
                t, samples, after, peer_sig, clip_norm=self._release_clip(t),
                release=self._release_kind(),
            )  # fmt: skip
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
            statement = statement_bytes(last)
            return int(last["round"]), statement, self._signing_key().sign(statement)

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
            mine, _ = self._open_ledger().statement(
                t, samples, self._release_clip(t), self._epsilon_next(), self._release_kind()
            )
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
        """The delta of the guarantee (spgc.privacy.accounting.reported_delta: the accountant's, the
        sampler's statistical distance and the capped Poisson batches). None without DP."""
        if not self.differentially_private:
            return None
        capped = self.releases if self._applied_batch_cap() else 0
        return reported_delta(
            self.plan.cfg.target_delta, self.epsilon(), self.noise_samples(), capped
        )

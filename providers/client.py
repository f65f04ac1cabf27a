"""The provider client: SPEC section 3, steps 1-5 (the paper's Algorithm 1), over spgc.v1.

One round t, as :meth:`ProviderClient.run_round` does it:

1. Hello to both servers (once, in :meth:`ProviderClient.connect`): their TrainingConfig must be
   identical, name a sharing rule and ring this provider implements and numbers within the
   protocol's bounds (:func:`check_wire_contract`), describe a model/dataset/encoding this
   provider computes the same way (the announced ``l2_bound_units`` must equal its own), and
   promise at least the provider's configured minimum privacy per step; otherwise
   :class:`ProviderRefusal`. Every later answer (RoundInfo, ModelHeader, LedgerReply) is
   range-checked too (spgc.wire.bounds): a server out of bounds is refused.
2. Wait (RoundStatus long poll, with jittered backoff on errors) until both servers collect the
   same round t. Both announce model version t's SHA-256 in their RoundInfo: they must agree,
   and the model downloaded (FetchModel, from one server, fixed per provider to spread the
   load) must hash to it.
3. Draw the local batch: Poisson sampling at rate q (default) or the paper's fixed batches from
   shuffled passes, as announced (the accountant assumes the announced one).
4. Per-example gradients (torch.func vmap), each clipped to C, fixed-point encoded with
   conditional randomized rounding (every encoded example has L2 norm <= B units), summed: G.
5. Additive shares in Z_{2^L} from the OS CSPRNG: <G>_1 = G + r to H1, <G>_2 = r to H2, streamed
   with SubmitShare, tagged with run and round, a fresh submission id per attempt.

Retries never send a different share vector for the same round: the shares of round t are made
once; a retry resends the same vector with a new submission id, and only after RoundStatus said
the caller's share was not accepted (a lost receipt must not double count; a server refuses a
second share of a provider for a round with ALREADY_EXISTS anyway, which the client reads as
"accepted earlier"). A server that missed its share while the other holds one gets exactly its
share again once it collects the round. Only when BOTH servers dropped the round's shares (they
lost each other and went back to their checkpoint: ROUND_PHASE_WAITING_FOR_PEER, then the round
again) does the provider take part again, with a new vector and a new sharing.

One-server modes: ``plain`` sends G itself (mod 2^L) to the single server; ``ldp`` first adds
discrete Gaussian noise of the announced ``noise_std_units`` locally (see
:func:`local_noise`: the servers' exact sampler run in plaintext). A round sent again gets the
same noisy vector (providers/local_noise.py), and every vector drawn is counted first.

The data set's budget across runs (providers/data_budget.py, spgc/privacy/budget.py): on joining a
run,
before each vector leaves (write-ahead) and after each ledger verified, the provider records
and checks what its data spent, every run together, against ``max_total_epsilon``.

The client is split by job: the checks of the plan (providers/plan_checks.py), data and
batches (providers/batches.py), gradients, encoding and vectors (providers/training.py), the
calls to the servers with their retries (providers/transport.py) and following the servers'
rounds (providers/rounds.py); this module joins, takes part in each round and checks the ledger.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from garbled_core.discrete_gaussian import derive_params
from spgc.common.csprng import SecureRandom, as_secure_rng
from spgc.learning.data import DATA_ERRORS
from spgc.learning.gradients import check_model_on_data
from spgc.privacy.feature_stats import Standardization, StatsRelease
from spgc.privacy.ledger_format import LedgerError
from spgc.privacy.ledger_verify import LedgerReport, LedgerVerifier
from spgc.protocol.encoding import FixedPointConfig, default_rounding_rng
from spgc.providers.batches import Batches
from spgc.providers.data_budget import ProviderBudget
from spgc.providers.errors import (
    ModelFailed,
    ProviderRefusal,
    RoundFailed,
    RunFailed,
    SelfCheckFailed,
)
from spgc.providers.local_noise import LastNoisyVector, local_noise
from spgc.providers.plan_checks import (
    NOISELESS_WIRE,
    ONE_SERVER_WIRE,
    TWO_SERVER_WIRE,
    build_provider_model,
    check_plan,
    check_privacy,
    check_training_config,
    check_wire_contract,
    describe_diff,
    describe_plan,
    effective_noise_multiplier,
    in_bounds,
    norm_proof_params,
    plan_task_loss,
    resolve_device,
    run_plan,
    share_length,
    stats_release,
    trained_coordinates,
)
from spgc.providers.rounds import RoundFollower
from spgc.providers.selfcheck import check_model_and_data
from spgc.providers.training import Training
from spgc.providers.transport import SubmitResult, _Server
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import aggregation_pb2
from spgc.wire.errors import WRONG_RUN
from spgc.wire.identity import new_submission_id

__all__ = [
    "ModelFailed",
    "ProviderClient",
    "ProviderRefusal",
    "RoundFailed",
    "RoundReport",
    "RunFailed",
    "SelfCheckFailed",
    "SubmitResult",
    "check_privacy",
    "check_training_config",
    "check_wire_contract",
    "effective_noise_multiplier",
    "local_noise",
    "resolve_device",
]

log = logging.getLogger("spgc.provider")

pb = aggregation_pb2


@dataclass
class RoundReport:
    """What one round did (also logged as the progress line)."""

    round: int
    model_version: int
    batch_size: int
    compute_seconds: float
    encode_seconds: float
    send_seconds: float
    results: list[SubmitResult] = field(default_factory=list)
    epsilon_spent: float = 0.0  # what the servers had spent when the round opened
    servers: int = 0  # how many servers this provider shares among (0: those in results)
    left_out: str | None = None  # why the servers left this share out of the sum (None: unknown)

    @property
    def accepted(self) -> bool:
        """Whether every server accepted this provider's share (a resend included)."""
        taken = {r.server for r in self.results if r.accepted}
        return bool(taken) and len(taken) >= max(self.servers, len(self.results))


class ProviderClient(RoundFollower, Batches, Training):
    """One provider taking part in a training run (see the module docstring).

    ``sampling_rng`` draws the batches: a :class:`~spgc.common.csprng.SecureRandom` (AES-256-CTR),
    default a fresh key from ``os.urandom`` (numpy generators are refused: the selection must be
    unpredictable); ``rounding_rng`` draws the rounding coins, default a generator seeded from
    the OS CSPRNG. Tests inject seeded ones to recompute G. Shares always
    come from ``os.urandom`` (spgc.protocol.sharing). ``data``: (x, y) of this provider instead of
    its
    part of ``cfg.dataset``. ``sleep``/``clock`` are injectable for tests.
    """

    def __init__(
        self,
        cfg: ProviderConfig,
        *,
        data: tuple[np.ndarray, np.ndarray] | None = None,
        sampling_rng: SecureRandom | None = None,
        rounding_rng: np.random.Generator | None = None,
        noise_seed: bytes | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if cfg.tls is not None:
            cfg.tls.check()  # a bad file named now, not as a TLS failure on every retry
        self.cfg = cfg
        self._data = data
        self.sampling_rng = as_secure_rng(sampling_rng, "the provider's batch sampling")
        self.rounding_rng = rounding_rng or default_rounding_rng()
        # Tests only: the next ldp noise comes from this seed, and the seed is then dropped, so
        # it never serves two rounds (later rounds draw fresh noise, as with None).
        self.noise_seed = noise_seed
        self._sleep = sleep
        self._clock = clock
        self.servers: list[_Server] = []
        self.training: Any = None  # TrainingConfig, once connected
        self.fixed_point: FixedPointConfig | None = None
        self.step_epsilon: float | None = None
        self.last_round: int | None = None
        self._last_delivered = False  # a server accepted a share of ours for last_round
        self._told_waiting = False  # logged that a server waits for its peer
        self._told_clock = False  # logged that this machine's clock seems ahead
        self._epsilon_seen: dict[str, float] = {}  # the most privacy each server said was spent
        self._run_checked_at: int | None = None  # a round behind ours, seen and looked into
        # The shares of last_round when their delivery was troubled (a retry or a failure),
        # kept until every server holds its share or a later round opens: a server that lacks
        # its share while the other holds one (it was down, or dropped it when it lost its
        # peer) gets exactly its share again. Meanwhile the servers are asked without a long
        # poll, so that a server holding our share cannot hold the call while the other lacks.
        # (round, the two shares, their vector id): what a server that lost our share gets.
        self._resend: tuple[int, list[np.ndarray], bytes] | None = None
        self._round_infos: list[Any] = []  # every server's RoundInfo of the round joined
        self._senders: concurrent.futures.ThreadPoolExecutor | None = None  # one per server
        # The server this provider downloads models from (fixed per name: spreads the load).
        self._model_source = 0
        self._model: Any = None
        # The frozen coordinates of the model (fetched once per run, hash-checked) and which
        # coordinates travel (spgc.learning.trainable); None: nothing is frozen.
        self._frozen: np.ndarray | None = None
        self._trained: Any = None
        self._x: np.ndarray | None = None
        self._y: np.ndarray | None = None
        # Fixed batches: (epoch number, that epoch's batches), and the first epoch this
        # process may draw from (see draw_batch).
        self._epoch: tuple[int, list[np.ndarray]] | None = None
        self._first_epoch: int | None = None
        self.reports: list[RoundReport] = []
        # The data set's budget file across runs (set by connect), and the noisy vector of
        # the latest round (ldp: a round sent again gets the same one).
        self.budget: ProviderBudget | None = None
        self._noisy = LastNoisyVector()
        # standardize: the announced feature statistics' release (set by connect), and the
        # released means and deviations once the servers publish them (the data is then
        # standardised with them); None: not (yet).
        self._stats: StatsRelease | None = None
        self.standardization: Standardization | None = None
        self._share_length = 0  # every share vector's length (set by connect)
        # Each server's ledger lines seen so far, by (server, run): a round fetches only the
        # new ones, which must chain to these.
        self._ledgers: dict[tuple[str, str], list[bytes]] = {}
        # (server, run) -> its ledger's verifier and the lines fed to it so far
        self._verifiers: dict[tuple[str, str], tuple[LedgerVerifier, int]] = {}

    def __enter__(self) -> ProviderClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def self_check(self) -> str:
        """Check this provider's own model and data before calling any server (as ``spgc
        config check`` does: providers/selfcheck.py), so that a broken one fails at once, even
        while the servers are down. SelfCheckFailed (a ConfigError) naming the problem; returns
        a note on what was built ("" when the model is the servers' built-in one)."""
        try:
            found = check_model_and_data(self.cfg, self._data)
        except (ValueError, OSError, *DATA_ERRORS) as exc:
            raise SelfCheckFailed(str(exc)) from None
        if found.scale_warning is not None:
            log.warning("%s", found.scale_warning)
        return found.note

    def connect(self) -> Any:
        """Hello to the configured servers and check what they announce; returns the
        TrainingConfig. Raises ProviderRefusal when this provider will not take part."""
        cfg = self.cfg
        self.close()
        self._epsilon_seen = {}  # a run's count starts at its first Hello
        h1 = self._open(pb.SERVER_ROLE_H1, cfg.h1_name, cfg.h1_address)
        self.servers = [h1]
        info1 = self._hello(h1)
        tc = info1.config
        if tc.mode in TWO_SERVER_WIRE:
            if info1.role != pb.SERVER_ROLE_H1:
                raise ProviderRefusal(
                    f"{cfg.h1_name} at {cfg.h1_address} is {pb.ServerRole.Name(info1.role)}, "
                    "expected SERVER_ROLE_H1"
                )
            if not cfg.two_servers:
                raise ProviderRefusal(
                    f"mode {pb.Mode.Name(tc.mode)} needs two servers; configure h2_address"
                )
            h2 = self._open(pb.SERVER_ROLE_H2, cfg.h2_name, cfg.h2_address)
            self.servers.append(h2)
            self._model_source = hashlib.sha256(cfg.name.encode()).digest()[0] % 2
            info2 = self._hello(h2)
            if info2.role != pb.SERVER_ROLE_H2:
                raise ProviderRefusal(
                    f"{cfg.h2_name} at {cfg.h2_address} is {pb.ServerRole.Name(info2.role)}, "
                    "expected SERVER_ROLE_H2"
                )
            a = info1.config.SerializeToString(deterministic=True)
            b = info2.config.SerializeToString(deterministic=True)
            if a != b:
                raise ProviderRefusal(
                    "the two servers announce different training configurations: "
                    + describe_diff(info1.config, info2.config)
                )
        elif tc.mode in ONE_SERVER_WIRE:
            if info1.role != pb.SERVER_ROLE_SINGLE:
                raise ProviderRefusal(
                    f"mode {pb.Mode.Name(tc.mode)} has one server, but {cfg.h1_name} is "
                    f"{pb.ServerRole.Name(info1.role)}"
                )
            h1.role = pb.SERVER_ROLE_SINGLE
            if cfg.two_servers:
                log.warning("mode %s uses one server: h2_address is ignored", pb.Mode.Name(tc.mode))
        else:
            raise ProviderRefusal(f"unsupported mode {pb.Mode.Name(tc.mode)}")
        log.info("the servers' plan: %s", describe_plan(tc))
        try:
            check_wire_contract(tc)
            check_plan(tc, cfg)
            self.step_epsilon = check_privacy(tc, cfg)
            self.task_loss = plan_task_loss(tc, cfg)
            self._x, self._y = self._load_data(tc)
            self.fixed_point = check_training_config(tc, cfg, len(self._x))
            self._share_length = share_length(tc, self.fixed_point.dim)
            self.norm_proof = norm_proof_params(tc, self._share_length)
            self._stats = stats_release(tc)
            if self._stats is not None and self._x[0].size != self._stats.ranges.features:
                raise ProviderRefusal(
                    f"this provider's data has {self._x[0].size} features; the servers' "
                    f"feature_ranges declare {self._stats.ranges.features}"
                )
            device = resolve_device(cfg.device)
            self._model = build_provider_model(tc, cfg).to(device)
            try:  # now, not mid-round: a model that cannot train on this data is declined
                what = f"data {cfg.data!r}" if cfg.data else f"the {tc.dataset} data"
                task, loss = self.task_loss
                check_model_on_data(self._model, self._x, self._y, what, task=task, loss=loss)
            except ValueError as exc:
                raise ProviderRefusal(str(exc)) from None
            self._trained = trained_coordinates(tc)
            self._frozen = self._fetch_frozen(tc) if self._trained.anything_frozen else None
            # Last: the run is recorded in the data set's budget file once it is joined.
            self.budget = ProviderBudget.join(cfg, tc.run_id, run_plan(tc), self._x, self._y)
            if tc.mode == pb.MODE_LDP:
                self.budget.prepare_noise_draw()
        except ProviderRefusal as exc:
            self._decline(tc.run_id, str(exc))
            raise
        if tc.mode == pb.MODE_LDP:
            # The sampler's parameter search takes seconds: in the background now (cached, and
            # the first round's noise waits for it), not in the round nor before joining.
            threading.Thread(
                target=derive_params, args=(tc.noise_std_units,), name="spgc-sampler-params",
                daemon=True,
            ).start()  # fmt: skip
        if self.training is None or self.training.run_id != tc.run_id:
            self._epoch = self._first_epoch = None  # another run: its own epochs
            self.standardization = None  # another run: its own statistics
        self.training = tc
        log.info(
            "joined run %s: mode %s, model %s (d=%d), %d local examples, gradients on %s, "
            "B=%d units (inflation %.5f), per-step epsilon %s at delta %g",
            tc.run_id,
            pb.Mode.Name(tc.mode),
            tc.model,
            tc.num_parameters,
            len(self._x),
            device.type,
            self.fixed_point.l2_bound_units,
            self.fixed_point.inflation,
            "n/a (no noise)" if self.step_epsilon is None else f"{self.step_epsilon:.4g}",
            cfg.step_delta,
        )
        return tc

    def run_round(self) -> RoundReport | None:
        """One round (steps 2-5); None when training is finished. Raises ProviderRefusal
        (stop taking part) or RoundFailed (this round lost, the run goes on)."""
        if self.training is None:
            self.connect()
        info = self.wait_for_round()
        self._learn_outcome()
        if info is None:
            return None
        t, tc = info.round, self.training
        # Round t is attempted once: whatever happens below, no second share vector for it
        # (unless both servers drop what they hold and run it again: see wait_for_round).
        self.last_round = t
        self._last_delivered = False
        if self.cfg.max_total_epsilon is not None:  # a limit of our own to hold the run to
            try:
                self.check_ledger()
            except ProviderRefusal as exc:  # leaving: the servers count us out, knowing why
                self._decline(tc.run_id, str(exc))
                raise
        self._adopt_statistics(info)
        # ldp: a round sent again gets the noisy vector sent before (no second noisy view).
        kept = self._noisy.get(tc.run_id, t) if tc.mode == pb.MODE_LDP else None
        if kept is None and self._stats is not None and self.standardization is None:
            # standardize: this round releases the feature statistics (all our rows, once)
            self.fetch_model(info)  # the round's model, checked as in every round
            total, compute, encode, batch_size = self._statistics_vector()
        elif kept is None:
            params = self.fetch_model(info)
            batch = self.draw_batch()
            total, compute, encode = self.encode(params, batch)
            total = self._padded(total)
            batch_size = len(batch)
            if tc.mode == pb.MODE_LDP:
                self._noisy.keep(tc.run_id, t, total, batch_size)
        else:
            (total, batch_size), compute, encode = kept, 0.0, 0.0
            log.info("round %d: sending the noisy vector drawn for it before", t)
        vectors = self.make_vectors(total)
        vector_id = new_submission_id()  # names this vector in both of its halves
        del total
        assert self.budget is not None  # connect() opened it
        # Write-ahead: the round is in the budget file before any of its vector leaves.
        self.budget.before_submit(t, fresh=kept is None, release_index=self._fixed_release())
        # The shares of round t are fixed from here on: retries resend exactly these.
        t0 = time.perf_counter()
        if self._senders is None:
            self._senders = concurrent.futures.ThreadPoolExecutor(
                len(self.servers), thread_name_prefix="spgc-submit"
            )
        futures = [
            # No compute time on the wire: it would reveal the batch size.
            self._senders.submit(self._submit, s, v, info, vector_id)
            for s, v in zip(self.servers, vectors, strict=True)
        ]
        results, errors = [], []
        for f in futures:
            try:
                results.append(f.result())
            except RoundFailed as exc:
                errors.append(str(exc))
        send = time.perf_counter() - t0
        self._last_delivered = bool(results)
        troubled = bool(errors) or any(r.attempts > 1 for r in results)
        self._resend = (t, vectors, vector_id) if troubled else None
        report = RoundReport(
            t,
            info.model_version,
            batch_size,
            compute,
            encode,
            send,
            results,
            info.epsilon_spent,
            len(self.servers),
        )
        self.reports.append(report)
        log.info(
            "round %d: model v%d, batch %d, compute %.2fs, encode %.2fs, send %.2fs, %s; "
            "epsilon spent so far %.4g",
            t,
            info.model_version,
            batch_size,
            compute,
            encode,
            send,
            "accepted by " + ", ".join(r.server for r in results) if results else "not accepted",
            info.epsilon_spent,
        )
        if errors:
            raise RoundFailed("; ".join(errors), resending=bool(results))
        return report

    def _statistics_vector(self) -> tuple[np.ndarray, float, float, int]:
        """standardize: this provider's vector of the feature statistics' release (its
        rows' clipped sums, sums of squares and count; spgc.privacy.feature_stats), padded to
        the share length; (vector, compute s, encode s, rows)."""
        assert self._stats is not None and self._x is not None
        start = time.perf_counter()
        x = self._x.reshape(len(self._x), -1)
        try:
            total = self._stats.contribution(x, length=self._share_length)
        except ValueError as exc:
            raise ProviderRefusal(f"the feature statistics' release: {exc}") from None
        log.info("round %d: this round releases the feature statistics", self.last_round)
        return total, 0.0, time.perf_counter() - start, len(x)

    def _padded(self, total: np.ndarray) -> np.ndarray:
        """A step's vector, zero-padded to the share length (longer with standardize)."""
        if len(total) >= self._share_length:
            return total
        out = np.zeros(self._share_length, dtype=total.dtype)
        out[: len(total)] = total
        return out

    def _adopt_statistics(self, info: Any) -> None:
        """standardize: once the servers publish the released means and deviations
        (RoundInfo.feature_mean/feature_std), this provider's features are standardised
        with them for the rest of the run."""
        if self._stats is None or self.standardization is not None or not info.feature_mean:
            return
        try:
            released = Standardization.from_dict(
                {"feature_mean": list(info.feature_mean), "feature_std": list(info.feature_std)}
            )
            assert self._x is not None
            shape = self._x.shape
            x = released.apply(self._x.reshape(len(self._x), -1)).reshape(shape)
        except ValueError as exc:
            raise RunFailed(
                f"the servers' released feature statistics are unusable: {exc}"
            ) from None
        self._x = x
        self.standardization = released
        log.info(
            "the servers released the feature statistics: this provider's features are "
            "standardised with their means and deviations from now on"
        )

    def _fetch_ledger(self, server: _Server) -> list[bytes]:
        """Every line of ``server``'s ledger: those fetched before (kept for the run), then
        the new ones, a page a call (each reply holds what fits one message). A ledger that
        holds fewer lines than it showed before is refused: the lines kept are what the new
        ones must chain to."""
        run_id = self.training.run_id
        lines = self._ledgers.setdefault((server.name, run_id), [])
        while True:
            request = pb.LedgerRequest(
                run_id=run_id, provider_id=self.cfg.name, from_line=len(lines)
            )
            reply = self._call_with_retry(
                lambda s=server, r=request: s.stub.FetchLedger(r, timeout=self.cfg.rpc_timeout),
                f"FetchLedger at {server.name}",
                RoundFailed,  # no ledger, no share: this round is sat out
            )
            in_bounds(reply, "LedgerReply", server.name)
            if reply.total_lines < len(lines) + len(reply.lines):
                raise ProviderRefusal(
                    f"{server.name} sent {len(reply.lines)} ledger line(s) from line "
                    f"{len(lines)} but LedgerReply.total_lines={reply.total_lines}"
                    + (" (it showed more lines before)" if reply.total_lines < len(lines) else "")
                )
            lines.extend(reply.lines)
            if len(lines) == reply.total_lines:
                return list(lines)
            if not reply.lines:
                raise ProviderRefusal(
                    f"{server.name}'s ledger holds {reply.total_lines} line(s), but it sent "
                    f"none from line {len(lines)}"
                )

    def check_ledger(self) -> LedgerReport | None:
        """Fetch and verify every server's privacy ledger (chain, signature, re-accounted
        epsilon) and refuse (ProviderRefusal) to take part in another release that would
        spend more than ``max_total_epsilon`` (with what the data set's other runs spent),
        counting every release the servers recorded (failed and re-run rounds included).
        The release entries at rounds this provider submitted to go into its budget file.
        None before the run's first release."""
        tc, report, verified = self.training, None, []
        for server in self.servers:
            lines = self._fetch_ledger(server)
            if not lines:
                continue
            # Each line is checked once: the fetch only ever appends what the server added.
            verifier, fed = self._verifiers.get((server.name, tc.run_id), (LedgerVerifier(), 0))
            try:
                verifier.feed(lines[fed:])
                self._verifiers[(server.name, tc.run_id)] = (verifier, len(lines))
                found = verifier.report()
            except LedgerError as exc:
                msg = f"{server.name}'s privacy ledger does not verify: {exc}"
                raise ProviderRefusal(msg) from None
            if found.run_id != tc.run_id:
                raise ProviderRefusal(f"{server.name}'s ledger is of run {found.run_id}")
            verified.append(verifier.release_rounds)
            if report is None or found.steps > report.steps:
                report = found
        if self.budget is not None:
            self.budget.after_ledgers(verified)
        limit = self.cfg.max_total_epsilon
        if limit is not None and tc.mode not in NOISELESS_WIRE:
            # Before the first release too: one step alone may spend more than the limit.
            steps = 0 if report is None else report.steps
            # The plan's accountant (with standardize: the statistics' release first).
            nxt = run_plan(tc).accountant_for().epsilon_after(steps + 1)
            others, note = (0.0, "") if self.budget is None else self.budget.others_note()
            if nxt + others > limit:
                spent = "" if report is None else f" (epsilon {report.epsilon:.4g})"
                raise ProviderRefusal(
                    f"the servers' ledger counts {steps} release(s){spent}; one more would "
                    f"spend {nxt:.4g}{note} > this provider's max_total_epsilon {limit:g}: "
                    "leaving the run"
                )
        return report

    def run(
        self, on_round: Callable[[RoundReport | None], None] | None = None
    ) -> list[RoundReport]:
        """Take part until training finishes (or ``max_rounds``); returns the reports.

        A failed round is logged and the provider goes on with the next one; a refusal stops.
        ``on_round(report)`` after every round taken part in (None for a failed one): progress.
        The provider's own model and data are checked first (:meth:`self_check`).
        """
        self.self_check()
        self.connect()
        done = 0
        while self.cfg.max_rounds is None or done < self.cfg.max_rounds:
            try:
                report = self.run_round()
            except RoundFailed as exc:
                if exc.resending:
                    log.warning(
                        "round %s: not every server took our share yet (%s): sending it again "
                        "while the round collects",
                        self.last_round,
                        exc,
                    )
                else:
                    log.error("round %s failed: %s", self.last_round, exc)
                if WRONG_RUN in str(exc) and self.training is not None:
                    # The servers started another run (their state was reset): learn its
                    # plan, check it against this provider's limits, and take part from its
                    # first round; this provider's rounds of the old run are over.
                    log.warning(
                        "the servers no longer run %s: connecting again", self.training.run_id
                    )
                    self.training, self.last_round, self._resend = None, None, None
                    self._run_checked_at = None
                done += 1
                if on_round is not None:
                    on_round(None)
                continue
            if report is None:
                log.info("training finished")
                break
            done += 1
            if on_round is not None:
                on_round(report)
        return self.reports

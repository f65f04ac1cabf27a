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

The data set's budget across runs (providers/data_budget.py, spgc/budget.py): on joining a run,
before each vector leaves (write-ahead) and after each ledger verified, the provider records
and checks what its data spent, every run together, against ``max_total_epsilon``.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import logging
import math
import secrets
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import numpy as np
from grpc.experimental import ChannelOptions

from garbled_core.discrete_gaussian import derive_params
from spgc import __version__
from spgc.accounting import (
    PrivacyAccountant,
)
from spgc.config import ProviderConfig
from spgc.csprng import SecureRandom, as_secure_rng
from spgc.data import (
    fixed_batches,
    load_dataset,
    load_user_data,
    poisson_batch,
    provider_part_of,
    split_among_providers,
)
from spgc.encoding import FixedPointConfig, default_rounding_rng, encode_batch, stochastic_round
from spgc.gradients import (
    bounded_chunk,
    check_model_on_data,
    clip_per_example,
    per_example_gradients,
)
from spgc.ledger import LedgerError, LedgerReport, verify_ledger
from spgc.logs import first_line, listed
from spgc.models import flatten_params, load_flat_params
from spgc.providers.data_budget import ProviderBudget
from spgc.providers.errors import ModelFailed, ProviderRefusal, RoundFailed, RunFailed
from spgc.providers.local_noise import LastNoisyVector, local_noise
from spgc.providers.plan_checks import (
    NOISELESS_WIRE,
    ONE_SERVER_WIRE,
    TWO_SERVER_WIRE,
    accountant_sampling,
    build_provider_model,
    check_plan,
    check_privacy,
    check_training_config,
    check_wire_contract,
    describe_diff,
    describe_plan,
    effective_noise_multiplier,
    in_bounds,
    resolve_device,
    run_plan,
    trained_coordinates,
)
from spgc.sharing import check_fits, ring_mask, share
from spgc.wire import PROTOCOL_VERSION, aggregation_pb2, aggregation_pb2_grpc, vector_sha256
from spgc.wire.errors import ANOTHER_VECTOR, WRONG_RUN, WireError, is_size_refusal
from spgc.wire.identity import new_submission_id
from spgc.wire.messages import (
    read_inline_model,
    read_model_stream,
    share_encoding_for,
    share_messages,
    share_payload,
)
from spgc.wire.transport import make_channel

__all__ = [
    "ModelFailed",
    "ProviderClient",
    "ProviderRefusal",
    "RoundFailed",
    "RoundReport",
    "check_privacy",
    "check_training_config",
    "check_wire_contract",
    "effective_noise_multiplier",
    "local_noise",
]

log = logging.getLogger("spgc.provider")

pb = aggregation_pb2

#: Seconds for the one RoundStatus that tells a server we saw training end elsewhere.
FINISHED_CALL_TIMEOUT = 2.0

#: Codes after which the same submission may be tried again (after checking RoundStatus):
#: the server is down or restarting, or it is shedding load (RESOURCE_EXHAUSTED: this
#: identity's calls in flight or call rate are at their limit), or it cut a call that stalled
#: or that it was stopping under (CANCELLED); nothing was admitted.
RETRYABLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.CANCELLED,
    }
)

# Seconds at most between two calls to a server that is not up (starting, or restarting while
# we wait for a round); jittered like every backoff here.
STARTUP_RETRY_MAX = 2.0
#: A round a server still collects although, by our clock, its deadline passed longer ago than
#: this: our clock is ahead of the servers' (their intake closes at their own deadline).
CLOCK_AHEAD_SECONDS = 5.0
_JITTER = secrets.SystemRandom()  # backoff jitter (the OS generator: nothing to seed)


@dataclass
class _Server:
    """One server as the client sees it."""

    role: int
    name: str
    address: str
    channel: grpc.Channel
    stub: Any
    info: Any = None  # ServerInfo from Hello


@dataclass
class SubmitResult:
    """How one server took this provider's share for a round."""

    server: str
    accepted: bool
    attempts: int
    submission_id: bytes
    how: str  # "receipt", "status" (receipt lost, RoundStatus says accepted), "duplicate"
    bytes_sent: int = 0  # the share's payload in one attempt (ShareHeader.encoding's bytes)


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


# ----------------------------------------------------------------------------- the client


class ProviderClient:
    """One provider taking part in a training run (see the module docstring).

    ``sampling_rng`` draws the batches: a :class:`~spgc.csprng.SecureRandom` (AES-256-CTR),
    default a fresh key from ``os.urandom`` (numpy generators are refused: the selection must be
    unpredictable); ``rounding_rng`` draws the rounding coins, default a generator seeded from
    the OS CSPRNG. Tests inject seeded ones to recompute G. Shares always
    come from ``os.urandom`` (spgc.sharing). ``data``: (x, y) of this provider instead of its
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
        # coordinates travel (spgc.trainable); None: nothing is frozen.
        self._frozen: np.ndarray | None = None
        self._trained: Any = None
        self._x: np.ndarray | None = None
        self._y: np.ndarray | None = None
        # Fixed batches: (epoch number, that epoch's batches), and the first epoch this
        # process may draw from (see draw_batch).
        self._epoch: tuple[int, list[np.ndarray]] | None = None
        self._first_epoch: int | None = None
        self.reports: list[RoundReport] = []
        # The data set's budget file across runs (set by connect), the noisy vector of the
        # latest round (ldp: a round sent again gets the same one), and whether the round
        # wait_for_round returned is one the servers run again (our shares were dropped).
        self.budget: ProviderBudget | None = None
        self._noisy = LastNoisyVector()
        self._again = False

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> ProviderClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the channels (and the senders' threads)."""
        if self._senders is not None:
            self._senders.shutdown(wait=True)
            self._senders = None
        for s in self.servers:
            s.channel.close()
        self.servers = []

    def _open(self, role: int, name: str, address: str) -> _Server:
        channel = make_channel(
            address,
            self.cfg.tls,
            insecure=self.cfg.insecure,
            server_name=name,
            # FetchModel's stream is read in the calling thread: no helper thread per download.
            options=[(ChannelOptions.SingleThreadedUnaryStream, 1)],
        )
        return _Server(role, name, address, channel, aggregation_pb2_grpc.AggregatorStub(channel))

    def _decline(self, run_id: str, reason: str) -> None:
        """Tell the servers why this provider does not take part (best effort: the refusal
        stands whether or not they hear it)."""
        request = pb.DeclineRequest(run_id=run_id, reason=reason, provider_id=self.cfg.name)
        for server in self.servers:
            try:
                server.stub.DeclinePlan(request, timeout=min(10.0, self.cfg.rpc_timeout))
            except grpc.RpcError as exc:
                log.debug("%s: DeclinePlan: %s", server.name, exc)

    def _load_data(self, tc: Any) -> tuple[np.ndarray, np.ndarray]:
        if self._data is not None:
            x, y = self._data
        elif self.cfg.data:
            try:
                ds = load_user_data(self.cfg.data, self.cfg.data_label)
            except ValueError as exc:
                raise ProviderRefusal(f"data {self.cfg.data!r}: {exc}") from None
            x, y = ds.x_train, ds.y_train
            if self.cfg.provider_count > 1:  # one loader for all: this provider's part of it
                try:
                    x, y = provider_part_of(
                        x, y, self.cfg.data, self.cfg.provider_count, self.cfg.provider_index
                    )
                except ValueError as exc:
                    raise ProviderRefusal(str(exc)) from None
        else:
            dataset = self.cfg.dataset or tc.dataset
            if not dataset:
                raise ProviderRefusal(
                    "the servers' plan names no built-in data set (each provider brings its "
                    "own): set data: to a loader or a .csv/.npz file"
                )
            kw: dict[str, Any] = {}
            if self.cfg.dataset_path is not None:
                kw["path"] = self.cfg.dataset_path
            if self.cfg.split_seed is not None:
                kw["split_seed"] = self.cfg.split_seed
            ds = load_dataset(dataset, **kw)
            x, y = split_among_providers(
                ds.x_train, ds.y_train, self.cfg.provider_count, self.cfg.provider_index
            )
        return np.asarray(x), np.asarray(y)

    def _hello(self, server: _Server) -> Any:
        request = pb.HelloRequest(
            protocol_version=PROTOCOL_VERSION,
            software_version=f"spgc {__version__}",
            provider_id=self.cfg.name,
        )
        info = self._call_with_retry(
            lambda: server.stub.Hello(request, timeout=self.cfg.rpc_timeout),
            f"Hello to {server.name} at {server.address}",
            deadline=time.monotonic() + self.cfg.connect_timeout,
        )
        if info.protocol_version != PROTOCOL_VERSION:
            raise ProviderRefusal(
                f"{server.name} speaks protocol version {info.protocol_version}, this provider "
                f"{PROTOCOL_VERSION}"
            )
        # The config is checked in connect() (check_wire_contract), where a refusal is declined.
        in_bounds(info.round, "ServerInfo.round", server.name)
        in_bounds(info.limits, "ServerInfo.limits", server.name)
        if info.server_name and info.server_name != server.name:
            raise ProviderRefusal(
                f"the server at {server.address} calls itself {info.server_name!r}, expected "
                f"{server.name!r}"
            )
        if info.provider_id and info.provider_id != self.cfg.name:
            raise ProviderRefusal(
                f"{server.name} knows this provider as {info.provider_id!r}, but name is "
                f"{self.cfg.name!r} (check the certificate)"
            )
        server.info = info
        return info

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
            self._x, self._y = self._load_data(tc)
            self.fixed_point = check_training_config(tc, cfg, len(self._x))
            device = resolve_device(cfg.device)
            self._model = build_provider_model(tc, cfg).to(device)
            try:  # now, not mid-round: a model that cannot train on this data is declined
                what = f"data {cfg.data!r}" if cfg.data else f"the {tc.dataset} data"
                check_model_on_data(self._model, self._x, self._y, what)
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
            derive_params(tc.noise_std_units)  # cached: the round itself should not pay for it
        if self.training is None or self.training.run_id != tc.run_id:
            self._epoch = self._first_epoch = None  # another run: its own epochs
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

    # ------------------------------------------------------------------ RPC helpers

    def _backoffs(self) -> Iterator[float]:
        """Exponential backoff with jitter: each wait is drawn in [delay/2, delay], so that
        providers cut off together (a server restart) do not come back in lockstep."""
        delay = self.cfg.backoff_initial
        while True:
            yield delay * (0.5 + 0.5 * _JITTER.random())
            delay = min(delay * 2, self.cfg.backoff_max)

    def _call_with_retry(
        self,
        call: Callable[[], Any],
        what: str,
        error: type[Exception] = ProviderRefusal,
        deadline: float | None = None,
    ) -> Any:
        """``call()``, retried with backoff on UNAVAILABLE/DEADLINE_EXCEEDED; other gRPC errors
        and exhausted retries raise ``error``. With a monotonic ``deadline`` the call is retried
        until then instead of ``retries`` times (a server that is still starting up)."""
        delays = self._backoffs()
        attempt = 0
        while True:
            attempt += 1
            try:
                return call()
            except grpc.RpcError as exc:
                code = exc.code()
                refused = _server_certificate_refused(exc.details() or "")
                if code == grpc.StatusCode.UNAVAILABLE and refused:
                    # Our check of the server's certificate failed: retrying cannot help.
                    raise ConnectionError(f"{what}: {refused} ({exc.details()})") from None
                exhausted = (
                    attempt >= self.cfg.retries
                    if deadline is None
                    else time.monotonic() >= deadline
                )
                if code in RETRYABLE and exhausted and error is ProviderRefusal:
                    # Not a refusal of the plan: the server could not be reached (exit 1).
                    raise ConnectionError(
                        f"{what} failed after {attempt} attempts: {code.name}: {exc.details()}"
                    ) from None
                if code not in RETRYABLE or exhausted:
                    raise error(
                        f"{what} failed: {code.name}: {exc.details()}"
                        if code not in RETRYABLE
                        else f"{what} failed after {attempt} attempts: {code.name}: {exc.details()}"
                    ) from None
                delay = next(delays)
                if deadline is not None:  # a server starting up: ask again soon
                    delay = min(delay, STARTUP_RETRY_MAX)
                log.warning("%s: %s, retrying in %.1fs", what, code.name, delay)
                self._sleep(delay)

    def _status(
        self,
        server: _Server,
        round_number: int | None = None,
        wait: float = 0.0,
        include_model: bool = False,
    ) -> Any | None:
        """RoundStatus at one server; None on a transient error. ``wait`` > 0: long poll until
        the server collects a round after the last one we took part in (or ``wait`` s).
        ``include_model``: ask for a small model inline (RoundInfo.model_parameters)."""
        if round_number is not None:
            req = pb.RoundStatusRequest(round=round_number, provider_id=self.cfg.name)
        else:
            req = pb.RoundStatusRequest(
                wait_seconds=wait, provider_id=self.cfg.name, include_model=include_model
            )
            if wait > 0 and self.last_round is not None:
                req.after_round = self.last_round
        try:
            info = server.stub.RoundStatus(req, timeout=self.cfg.rpc_timeout)
        except grpc.RpcError as exc:
            # CANCELLED: the server stopped while holding our long poll (a restart, or the
            # end of training); asking again tells which.
            if exc.code() in RETRYABLE:
                log.warning("RoundStatus at %s: %s", server.name, exc.code().name)
                return None
            raise
        in_bounds(info, "RoundInfo", server.name)
        return info

    # ------------------------------------------------------------------ steps

    def wait_for_round(self) -> Any | None:
        """Poll until every server collects the same new round; returns its RoundInfo (from
        H1), or None when training is finished. TimeoutError after ``wait_timeout``."""
        start = self._clock()
        delays = self._backoffs()
        while True:
            wait = self.cfg.long_poll
            if self._resend is not None and self._resend[0] == self.last_round:
                wait = 0.0  # see _resend: look at every server now
            if self.cfg.wait_timeout is not None:  # never hold past our own deadline
                wait = min(wait, max(0.0, self.cfg.wait_timeout - (self._clock() - start)))
            infos = []
            for index, server in enumerate(self.servers):
                # The server we take the model from sends a small one with its answer.
                info = self._status(server, wait=wait, include_model=index == self._model_source)
                # One server says training is over: the other hears that we know (it waits
                # for its providers to learn it before it exits), briefly: it may be gone.
                if info is not None and info.phase == pb.ROUND_PHASE_FINISHED:
                    self._ask_the_others_briefly(index)
                    if info.failure:
                        raise RunFailed(f"{server.name} stopped the run: {info.failure}")
                    return None
                infos.append(info)
            if all(i is not None for i in infos):
                delays = self._backoffs()  # healthy again
                first = infos[0]
                same = all(
                    i.round == first.round and i.model_version == first.model_version for i in infos
                )
                collecting = all(i.phase == pb.ROUND_PHASE_COLLECTING for i in infos)
                new = self.last_round is None or first.round > self.last_round
                if not new and first.round < self.last_round:
                    self._check_still_the_run(first.round)
                self._check_privacy_count(infos)
                if self._resend is not None and self._resend[0] < first.round:
                    self._resend = None  # a later round: the old shares are never sent again
                if (
                    not new
                    and same
                    and collecting
                    and self._last_delivered
                    and not any(i.caller_share_accepted for i in infos)
                ):
                    # Our shares for this round were dropped: the servers lost each other and
                    # went back to their last common checkpoint. The round runs again as a new
                    # release; we take part with a fresh vector (neither server holds the old).
                    log.info("round %d runs again (servers re-paired): taking part", first.round)
                    new = self._again = True
                waiting = [
                    s.name
                    for s, i in zip(self.servers, infos, strict=True)
                    if i.phase == pb.ROUND_PHASE_WAITING_FOR_PEER
                ]
                if waiting and not self._told_waiting:
                    log.warning("%s: waiting for the other server to come back", ", ".join(waiting))
                self._told_waiting = bool(waiting)
                held = [i.caller_share_accepted for i in infos]
                if all(held) and self._resend is not None and self._resend[0] == first.round:
                    self._resend = None  # both hold our shares: back to long polls
                # The server that lacks our share must still collect; the other may be past
                # its intake already (it had every share it waited for).
                lacking = [i for i in infos if not i.caller_share_accepted]
                if (
                    not new
                    and same
                    and any(held)
                    and lacking
                    and all(i.phase == pb.ROUND_PHASE_COLLECTING for i in lacking)
                    and self._resend is not None
                    and self._resend[0] == first.round
                    and not _deadline_passed(lacking[0])
                ):
                    self._resend_missing(infos, lacking[0])
                if same and collecting and new:
                    if all(i.caller_share_accepted for i in infos):
                        log.info("round %d: share already accepted (earlier run)", first.round)
                        self.last_round = first.round
                    elif any(i.caller_share_accepted for i in infos):
                        log.warning(
                            "round %d: only one server holds a share from us (earlier run); "
                            "the shares are lost, sitting this round out",
                            first.round,
                        )
                        self.last_round = first.round
                    elif not _deadline_passed(first):
                        late = _seconds_past_deadline(first)
                        if late > CLOCK_AHEAD_SECONDS and not self._told_clock:
                            log.warning(
                                "round %d: the servers still collect shares, but by this "
                                "machine's clock its deadline passed %.0f s ago: is the clock "
                                "ahead? (taking part; synchronise it, e.g. with NTP)",
                                first.round,
                                late,
                            )
                            self._told_clock = True
                        self._round_infos = infos
                        return first
                delay = self.cfg.poll_interval
            else:  # a server is down or restarting: ask again soon (it answers once back)
                delay = max(self.cfg.poll_interval, min(next(delays), STARTUP_RETRY_MAX))
            if self.cfg.wait_timeout is not None and self._clock() - start > self.cfg.wait_timeout:
                raise TimeoutError(
                    f"no round opened on every server within {self.cfg.wait_timeout:g}s"
                )
            self._sleep(delay)

    def _ask_the_others_briefly(self, answered: int) -> None:
        """A RoundStatus to every server but ``answered``, errors ignored: a server that
        finished stops once each provider that called it has seen the end."""
        for index, server in enumerate(self.servers):
            if index == answered:
                continue
            req = pb.RoundStatusRequest(provider_id=self.cfg.name)
            with contextlib.suppress(grpc.RpcError):
                server.stub.RoundStatus(req, timeout=FINISHED_CALL_TIMEOUT)

    def _check_privacy_count(self, infos: list[Any]) -> None:
        """The privacy spent (RoundInfo.epsilon_spent) of one run never goes down: a release
        is counted for good, a round that failed included. Lower than before means a server's
        state went back to an earlier point (a state_dir restored from a backup): releases it
        made would be made again and not counted. ProviderRefusal then."""
        for server, info in zip(self.servers, infos, strict=True):
            spent = self._epsilon_seen.get(server.name, 0.0)
            now = info.epsilon_spent
            if not math.isnan(now) and now < spent * (1 - 1e-9):
                raise ProviderRefusal(
                    f"{server.name} says epsilon {now:.6g} is spent, but it said {spent:.6g} "
                    "before: its count of releases went back (its state restored from a "
                    "backup?); releases made since would go uncounted, so not taking part"
                )
            if now > spent:
                self._epsilon_seen[server.name] = now

    def _check_still_the_run(self, seen_round: int) -> None:
        """The servers are at a round before ours: a step back, or another run (their state
        was reset). Asked once per such round; RoundFailed naming WRONG_RUN for another run
        (:meth:`run` then connects again)."""
        if self._run_checked_at == seen_round or self.training is None:
            return
        self._run_checked_at = seen_round
        current = self._hello(self.servers[0]).config.run_id
        if current != self.training.run_id:
            raise RoundFailed(
                f"run {self.training.run_id!r} {WRONG_RUN} any more: the servers run {current!r}"
            )

    def _learn_outcome(self) -> None:
        """Whether the servers used our last share (RoundInfo.caller_left_out, asked of the
        first server once the round is over): a left-out share is said, not taken for
        counted. A server that no longer knows the round (restarted) tells nothing."""
        last = self.reports[-1] if self.reports else None
        if last is None or last.left_out is not None or not last.results:
            return
        try:
            info = self._status(self.servers[0], last.round)
        except grpc.RpcError:  # NOT_FOUND: the server restarted and no longer knows the round
            return
        if info is None or info.phase in (
            pb.ROUND_PHASE_COLLECTING,
            pb.ROUND_PHASE_AGREEING,
            pb.ROUND_PHASE_WAITING_FOR_PEER,
        ):
            return
        last.left_out = info.caller_left_out
        if last.left_out:
            log.warning("round %d: our share is not in the sum: %s", last.round, last.left_out)

    def _resend_missing(self, infos: list[Any], info: Any) -> None:
        """Round ``info.round`` still collects and a server lacks our share (it was down when
        we sent it, or restarted): send it exactly the share it was meant to get. Each server
        only ever sees its own share of the vector, whichever time it arrives."""
        assert self._resend is not None
        _, vectors, vector_id = self._resend
        for server, status, vec in zip(self.servers, infos, vectors, strict=True):
            if status.caller_share_accepted:
                continue
            try:
                result = self._submit(server, vec, info, vector_id)
            except RoundFailed as exc:
                log.warning("round %d: resending to %s failed: %s", info.round, server.name, exc)
                return
            for report in self.reports:
                if report.round == info.round:
                    report.results.append(result)
            log.info("round %d: %s now holds our share (sent again)", info.round, server.name)
        self._resend = None

    def fetch_model(self, info: Any) -> np.ndarray:
        """Model version ``info.model_version``, downloaded from one server and checked against
        the hash EVERY server announced for the round (their RoundInfo): differing hashes are
        refused. One download, not one per server: each server's word on the model is its
        hash. Which server serves it is fixed per provider (spreads the load)."""
        tc = self.training
        announced = [
            (s.name, bytes(i.model_sha256))
            for s, i in zip(self.servers, self._round_infos or [info], strict=False)
        ]
        if len({h for _, h in announced}) != 1:
            detail = ", ".join(f"{n}: {h.hex()[:16]}" for n, h in announced)
            raise ProviderRefusal(
                f"the servers serve different models for version {info.model_version} ({detail})"
            )
        s = self.servers[self._model_source]
        want = announced[0][1]
        source_info = self._round_infos[self._model_source] if self._round_infos else info
        inline = bytes(source_info.model_parameters)
        if inline:  # a small model came with the round's RoundInfo: no FetchModel call
            try:
                return read_inline_model(inline, tc.num_parameters, want)
            except WireError as exc:
                raise ProviderRefusal(f"{s.name} sent a malformed model: {exc}") from None
        request = pb.ModelRequest(
            version=info.model_version, chunk_bytes=self.cfg.chunk_bytes, provider_id=self.cfg.name
        )

        def fetch() -> tuple[Any, np.ndarray]:
            return read_model_stream(
                s.stub.FetchModel(request, timeout=self.cfg.rpc_timeout),
                version=info.model_version,
                num_parameters=tc.num_parameters,
            )

        try:
            header, params = self._call_with_retry(
                fetch, f"FetchModel v{info.model_version} from {s.name}", RoundFailed
            )
        except WireError as exc:
            raise ProviderRefusal(f"{s.name} sent a malformed model: {exc}") from None
        if header.run_id and header.run_id != tc.run_id:
            raise ProviderRefusal(f"{s.name} sent a model of run {header.run_id!r}")
        digest = bytes(header.sha256)  # read_model_stream checked the values against it
        if want and digest != want:
            raise ProviderRefusal(
                f"the servers serve different models for version {info.model_version}: "
                f"{s.name} sent {digest.hex()[:16]}, the round announces {want.hex()[:16]}"
            )
        return params

    def draw_batch(self) -> np.ndarray:
        """Indices of this round's local batch, as the announced sampling says."""
        assert self._x is not None
        tc, n = self.training, len(self._x)
        if tc.sampling == pb.BATCH_SAMPLING_POISSON:
            return poisson_batch(n, tc.sampling_rate, self.sampling_rng)
        return self._fixed_batch(self._release_index())

    def _fixed_release(self) -> int | None:
        """Fixed batches: the release number this round's release takes (None: Poisson)."""
        if self.training.sampling == pb.BATCH_SAMPLING_POISSON:
            return None
        return self._release_index()

    def _release_index(self) -> int:
        """The run's release number this round's release would take (both servers must say
        the same: RoundInfo.releases_counted); RoundFailed when they do not."""
        counts = {i.releases_counted for i in self._round_infos}
        if len(counts) != 1:
            raise RoundFailed(
                f"the servers count different releases ({sorted(counts)}): a fixed batch is "
                "drawn by the release number, sitting this round out"
            )
        return counts.pop()

    def _fixed_batch(self, r: int) -> np.ndarray:
        """Batch r mod E of the permutation drawn for epoch r // E (E = batches_per_epoch), so
        an example is in at most one release per epoch, as the accountant counts: a round with
        no release leaves r as it was and its batch is used again. A process started in the
        middle of an epoch joins at the next one: it cannot know which examples a previous run
        of this provider put in the releases of this epoch."""
        assert self._x is not None and self.training is not None
        per_epoch = self.training.batches_per_epoch
        epoch, position = divmod(r, per_epoch)
        if self._first_epoch is None:
            self._first_epoch = epoch if position == 0 else epoch + 1
            if position:
                log.info(
                    "fixed batches: joining at the next epoch (release %d); this epoch's "
                    "earlier batches may hold examples a previous start of this provider used",
                    self._first_epoch * per_epoch,
                )
        if epoch < self._first_epoch:
            raise RoundFailed(
                f"fixed batches: this provider joins at release {self._first_epoch * per_epoch}, "
                f"the next epoch (release {r} now): sitting this round out"
            )
        if self._epoch is None or self._epoch[0] != epoch:
            batches = list(fixed_batches(len(self._x), self.training.batch_size, self.sampling_rng))
            self._epoch = (epoch, batches)
        return self._epoch[1][position]

    def encode(self, params: np.ndarray, batch: np.ndarray) -> tuple[np.ndarray, float, float]:
        """G (int64, d): the encoded clipped gradient sum; returns (G, compute s, encode s)."""
        assert self.fixed_point is not None
        tc, fp = self.training, self.fixed_point
        self.load_params(params)
        if 0 < tc.max_batch_size < len(batch):
            raise RoundFailed(
                f"a batch of {len(batch)} examples is larger than the {tc.max_batch_size} the "
                "servers sized the ring for (their max_batch_size): this round is sat out, "
                "as the sum of all shares could wrap around"
            )
        limit = 2 ** (tc.ring_bits - 1) - 1
        if fp.max_abs_sum_units(len(batch)) > limit:
            raise RoundFailed(
                f"a batch of {len(batch)} examples with B={fp.l2_bound_units} units may reach "
                f"{fp.max_abs_sum_units(len(batch))} > 2^{tc.ring_bits - 1}-1, the signed limit "
                f"of Z_2^{tc.ring_bits}"
            )
        total = np.zeros(tc.num_parameters, dtype=np.int64)
        real_sum = np.zeros(tc.num_parameters, dtype=np.float64)
        compute = encode = 0.0
        # gradient_chunk examples at a time, fewer for a big model (bounded memory).
        step = bounded_chunk(self.cfg.gradient_chunk, tc.num_parameters)
        for start in range(0, len(batch), step):
            t0 = time.perf_counter()
            clipped = self.clipped_gradients(batch[start : start + step])
            t1 = time.perf_counter()
            if tc.rounding == pb.ROUNDING_CONDITIONAL_STOCHASTIC:
                total += encode_batch(clipped, fp, self.rounding_rng, ring_bits=tc.ring_bits)
            else:
                real_sum += clipped.sum(axis=0)
            t2 = time.perf_counter()
            compute += t1 - t0
            encode += t2 - t1
        t0 = time.perf_counter()
        if tc.rounding == pb.ROUNDING_STOCHASTIC:
            total = stochastic_round(real_sum * tc.scale, self.rounding_rng)
        elif tc.rounding == pb.ROUNDING_NEAREST:
            total = np.rint(real_sum * tc.scale).astype(np.int64)
        if tc.mode == pb.MODE_LDP:
            assert self.budget is not None  # connect() opened it
            self.budget.before_noise_draw(self._fixed_release())  # counted before it is drawn
            seed, self.noise_seed = self.noise_seed, None  # a seed is never used twice
            total = total + local_noise(tc.noise_std_units, tc.num_parameters, seed)
        check_fits(total, tc.ring_bits)
        encode += time.perf_counter() - t0
        return total, compute, encode

    def load_params(self, params: np.ndarray) -> None:
        """Put the round's model vector (its trained coordinates) into the local model; the
        frozen ones are those fetched once for the run."""
        if self._frozen is not None:
            params = self._trained.assemble(params, self._frozen)
        load_flat_params(self._model, params)

    def _fetch_frozen(self, tc: Any) -> np.ndarray:
        """The model's frozen coordinates, once per run (FetchModel, MODEL_PART_FROZEN), checked
        against the frozen_sha256 both servers announced; loaded into the local model."""
        s = self.servers[self._model_source]
        request = pb.ModelRequest(
            part=pb.MODEL_PART_FROZEN, chunk_bytes=self.cfg.chunk_bytes, provider_id=self.cfg.name
        )

        def fetch() -> tuple[Any, np.ndarray]:
            return read_model_stream(
                s.stub.FetchModel(request, timeout=self.cfg.rpc_timeout),
                num_parameters=self._trained.frozen_count,
            )

        try:
            header, frozen = self._call_with_retry(
                fetch, f"FetchModel (frozen part) from {s.name}", ProviderRefusal
            )
        except WireError as exc:
            raise ProviderRefusal(f"{s.name} sent a malformed frozen part: {exc}") from None
        if bytes(header.sha256) != bytes(tc.frozen_sha256):
            raise ProviderRefusal(
                f"{s.name} sent frozen parameters whose SHA-256 {bytes(header.sha256).hex()[:16]}"
                f" is not the announced {bytes(tc.frozen_sha256).hex()[:16]}"
            )
        trained = self._trained.trainable_part(flatten_params(self._model))
        load_flat_params(self._model, self._trained.assemble(trained, frozen))
        return frozen

    def clipped_gradients(self, idx: np.ndarray) -> np.ndarray:
        """The per-example gradients of local examples ``idx``, each clipped to C (float64,
        len(idx) x d): what :meth:`encode` encodes."""
        assert self._x is not None and self._y is not None
        try:
            grads = per_example_gradients(
                self._model, self._x[idx], self._y[idx], chunk_size=len(idx)
            )
        except Exception as exc:  # whatever the user's model raises
            raise ModelFailed(
                f"the model failed computing the gradients of local examples "
                f"{listed(idx.tolist(), 8)}: {type(exc).__name__}: {first_line(exc)}"
            ) from None
        return clip_per_example(grads, self.training.clip_norm)

    def make_vectors(self, total: np.ndarray) -> list[np.ndarray]:
        """One uint64 vector per server: the two shares, or G mod 2^L for one server."""
        bits = self.training.ring_bits
        if len(self.servers) == 2:
            a1, a2 = share(total, bits)
            return [a1, a2]
        check_fits(total, bits)
        clear = np.asarray(total, dtype=np.int64).view(np.uint64) & ring_mask(bits)
        return [clear]

    def _submit(
        self, server: _Server, vec: np.ndarray, info: Any, vector_id: bytes
    ) -> SubmitResult:
        """Deliver ``vec`` for round ``info.round`` to one server; never another vector.
        ``vector_id``: the same for both halves of one vector (ShareHeader.vector_id)."""
        tc, t = self.training, info.round
        encoding = share_encoding_for(tc)  # packed where the server accepts it
        payload = share_payload(vec, tc.ring_bits, encoding)[0]
        digest, payload_bytes = vector_sha256(payload), payload.nbytes
        delays = self._backoffs()
        sid = b""
        for attempt in range(1, self.cfg.retries + 1):
            sid = new_submission_id()
            messages = share_messages(
                vec,
                run_id=tc.run_id,
                round_number=t,
                server_role=server.role,
                ring_bits=tc.ring_bits,
                submission_id=sid,
                provider_id=self.cfg.name,
                chunk_bytes=self._chunk_bytes(server),
                vector_id=vector_id,
                model_version=info.model_version,
                encoding=encoding,
                sha256=digest,  # hashed once for every attempt and the receipt's check
            )
            try:
                receipt = server.stub.SubmitShare(messages, timeout=self.cfg.rpc_timeout)
            except grpc.RpcError as exc:
                code = exc.code()
                if code == grpc.StatusCode.ALREADY_EXISTS:
                    # Fresh ids are never reused: a share of ours for round t is already in
                    # (of another vector if we restarted mid-round: the round then leaves us
                    # out, as the servers' details say).
                    other = ANOTHER_VECTOR in (exc.details() or "")
                    log.log(
                        logging.WARNING if other else logging.INFO,
                        "%s: round %d share already accepted (%s)",
                        server.name,
                        t,
                        exc.details(),
                    )
                    return SubmitResult(server.name, True, attempt, sid, "duplicate", payload_bytes)
                if code not in RETRYABLE or is_size_refusal(exc):
                    raise RoundFailed(
                        f"{server.name} refused the share for round {t}: {code.name}: "
                        f"{exc.details()}"
                    ) from None
                log.warning(
                    "%s: SubmitShare round %d attempt %d: %s", server.name, t, attempt, code.name
                )
                if attempt == self.cfg.retries:
                    break
                self._sleep(next(delays))
                try:
                    status = self._status(server, t)
                except grpc.RpcError as status_exc:  # e.g. NOT_FOUND: the round is not known
                    raise RoundFailed(
                        f"{server.name}: RoundStatus for round {t}: {status_exc.code().name}: "
                        f"{status_exc.details()}"
                    ) from None
                if status is not None and status.caller_share_accepted:
                    log.info("%s: round %d share was accepted (receipt lost)", server.name, t)
                    return SubmitResult(server.name, True, attempt, sid, "status", payload_bytes)
                if status is not None and status.phase != pb.ROUND_PHASE_COLLECTING:
                    raise RoundFailed(
                        f"{server.name}: round {t} closed ({pb.RoundPhase.Name(status.phase)}) "
                        "before the share got through"
                    ) from None
                if _deadline_passed(info):
                    raise RoundFailed(f"{server.name}: round {t} deadline passed") from None
                continue
            if receipt.round != t or bytes(receipt.submission_id) != sid:
                raise RoundFailed(f"{server.name} sent a receipt for another submission")
            if bytes(receipt.sha256) != digest:
                raise RoundFailed(f"{server.name} received a share with another SHA-256")
            return SubmitResult(server.name, True, attempt, sid, "receipt", payload_bytes)
        raise RoundFailed(
            f"{server.name}: share for round {t} not delivered after {self.cfg.retries} attempts"
        )

    def _chunk_bytes(self, server: _Server) -> int:
        limits = server.info.limits if server.info is not None else None
        want = self.cfg.chunk_bytes or (limits.preferred_chunk_bytes if limits else 0)
        if limits and limits.max_chunk_bytes:
            want = min(want or limits.max_chunk_bytes, limits.max_chunk_bytes)
        want = want or (1 << 20)
        return max(8, want - want % 8)

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
        again, self._again = self._again, False
        if self.cfg.max_total_epsilon is not None:  # a limit of our own to hold the run to
            self.check_ledger()
        # ldp: a round sent again gets the noisy vector sent before (no second noisy view).
        kept = self._noisy.get(tc.run_id, t) if tc.mode == pb.MODE_LDP else None
        if kept is None:
            params = self.fetch_model(info)
            batch = self.draw_batch()
            total, compute, encode = self.encode(params, batch)
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
        self.budget.before_submit(
            t, fresh=kept is None, again=again, release_index=self._fixed_release()
        )
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

    def check_ledger(self) -> LedgerReport | None:
        """Fetch and verify every server's privacy ledger (chain, signature, re-accounted
        epsilon) and refuse (ProviderRefusal) to take part in another release that would
        spend more than ``max_total_epsilon`` (with what the data set's other runs spent),
        counting every release the servers recorded (failed and re-run rounds included).
        The release entries at rounds this provider submitted to go into its budget file.
        None before the run's first release."""
        tc, report, verified = self.training, None, []
        for server in self.servers:
            request = pb.LedgerRequest(run_id=tc.run_id, provider_id=self.cfg.name)
            reply = self._call_with_retry(
                lambda s=server, r=request: s.stub.FetchLedger(r, timeout=self.cfg.rpc_timeout),
                f"FetchLedger at {server.name}",
                RoundFailed,  # no ledger, no share: this round is sat out
            )
            in_bounds(reply, "LedgerReply", server.name)
            if reply.total_lines < len(reply.lines):
                raise ProviderRefusal(
                    f"{server.name} sent {len(reply.lines)} ledger line(s) but "
                    f"LedgerReply.total_lines={reply.total_lines}"
                )
            if not reply.lines:
                continue
            try:
                found = verify_ledger(list(reply.lines))
            except LedgerError as exc:
                msg = f"{server.name}'s privacy ledger does not verify: {exc}"
                raise ProviderRefusal(msg) from None
            if found.run_id != tc.run_id:
                raise ProviderRefusal(f"{server.name}'s ledger is of run {found.run_id}")
            verified.append(list(reply.lines))
            if report is None or found.steps > report.steps:
                report = found
        if self.budget is not None:
            self.budget.after_ledgers(verified)
        limit = self.cfg.max_total_epsilon
        if limit is not None and tc.mode not in NOISELESS_WIRE:
            # Before the first release too: one step alone may spend more than the limit.
            steps = 0 if report is None else report.steps
            nxt = PrivacyAccountant(
                effective_noise_multiplier(tc), tc.target_delta, method=tc.accountant,
                **accountant_sampling(tc),
            ).epsilon_after(steps + 1)  # fmt: skip
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
        """
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


def _server_certificate_refused(details: str) -> str:
    """Why this client refused the server's TLS certificate, from gRPC's error text ("" when it
    did not): a wrong name or another CA is a configuration error, not an outage."""
    if "Hostname Verification Check failed" in details:
        return (
            "the server's certificate does not carry the name this provider expects (h1_name "
            "/ h2_name), or the address is another server's"
        )
    if "CERTIFICATE_VERIFY_FAILED" in details:
        return "the server's certificate is not signed by this provider's tls_ca"
    return ""


def _seconds_past_deadline(info: Any) -> float:
    """How long ago, by this machine's clock, the round's announced deadline passed (negative:
    still ahead; -inf: none announced)."""
    if not info.HasField("deadline") or info.deadline.seconds == 0:
        return -math.inf
    return time.time() - (info.deadline.seconds + info.deadline.nanos * 1e-9)


def _deadline_passed(info: Any) -> bool:
    """The round's deadline passed by this machine's clock, by at most CLOCK_AHEAD_SECONDS.
    Further past, while a server still collects, means our clock is ahead of the servers'; the
    server's own deadline is what counts then (it refuses a late share itself)."""
    return 0 < _seconds_past_deadline(info) <= CLOCK_AHEAD_SECONDS

"""The server daemon: wires config, intake, services, the GC link and the round driver.

Life cycle: :meth:`ServerDaemon.bind` (ports, so tests can use port 0), :meth:`start`
(threads), :meth:`wait`, :meth:`stop` (servers, channels, spill files). H1 listens for the
garbled-circuit link and drives the rounds; H2 dials the link after the Handshake.

Modes (SPEC section 5): in ``plain`` and ``ldp`` the daemon is the ONLY server (role 1, served
to providers as SERVER_ROLE_SINGLE): no Peer service, no peer, no garbled-circuit link; it runs
the rounds alone (coordinator.SingleDriver). In ``dng`` both servers run as in ``spgc``, but the
data link carries the two noisy shares instead of a garbled circuit (no engine session).

:class:`ServerDaemon` sets up every field and runs the services; its parts, one job each, are
the pairing with the other server and pairing again after a loss (servers/pairing.py), what H1
and H2 each do while paired (servers/sessions.py), the data link (servers/data_link.py), the
circuit workers' pairing (servers/worker_pairing.py) and continuing from checkpoints
(servers/resume.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import grpc
from grpc_health.v1 import health_pb2

import garbled_core
from garbled_core.discrete_gaussian import derive_params
from spgc import __version__
from spgc.common.memory import peak_rss_mb
from spgc.privacy.ledger_format import LEDGER_FILE
from spgc.protocol.modes import DEFAULT_SECURITY, MODES
from spgc.servers.aggregator import AggregatorServicer
from spgc.servers.audit import AuditLog, host_of
from spgc.servers.coordinator import SingleDriver
from spgc.servers.curves import TrainingCurves
from spgc.servers.data_link import DataLink
from spgc.servers.errors import PeerLost, PeerMismatchError, describe_error, peer_gone
from spgc.servers.faults import (
    CHEAT_POINTS,
    DEVIATION_POINTS,
    check_cheat_fits,
    planned_fault,
)
from spgc.servers.gc_party import PartyLink, set_seed_journal
from spgc.servers.intake import FieldShares, ShareIntake
from spgc.servers.limits import PeerGate, ProviderGate, ProviderLimits
from spgc.servers.link_probe import BackendSelection
from spgc.servers.metrics import MetricsServer, ServerMetrics
from spgc.servers.noise_pool import NoisePool
from spgc.servers.pairing import MAX_LOSSES_WITHOUT_PROGRESS, PeerPairing
from spgc.servers.peer import PeerServicer
from spgc.servers.ray_workers import ray_available
from spgc.servers.resume import CheckpointResume
from spgc.servers.sessions import PairedSessions
from spgc.servers.state import ServerState
from spgc.servers.state_checkpoints import models_fit_disk
from spgc.servers.worker_pairing import WorkerPairing
from spgc.settings.backend_choice import BackendChoice
from spgc.settings.config import ServerConfig
from spgc.settings.plan import make_plan
from spgc.wire import aggregation_pb2, peer_pb2
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.identity import certificate_identity
from spgc.wire.tls import TlsFiles
from spgc.wire.transport import (
    LoopThread,
    add_aio_health,
    add_health,
    add_servicer,
    make_aio_server,
    make_server,
    split_host_port,
)

# Importable from here as before the daemon was split (tests use them).
__all__ = [
    "FINISHED_GRACE",
    "FINISHED_LINGER",
    "MAX_LOSSES_WITHOUT_PROGRESS",
    "PeerLost",
    "ServerDaemon",
]

# Who samples discrete Gaussian noise on the servers (spgc.protocol.modes.Mode.noise_by): the
# circuit
# (spgc; preprocessed's pool), each server alone (dng).
SERVER_NOISE = ("circuit", "each server")

log = logging.getLogger(__name__)

# Registered with raw-bytes parsing: a malformed or out-of-range request is INVALID_ARGUMENT.
AGGREGATOR_SERVICE = aggregation_pb2.DESCRIPTOR.services_by_name["Aggregator"]
PEER_SERVICE = peer_pb2.DESCRIPTOR.services_by_name["Peer"]

#: Seconds a server whose training is over keeps answering providers not yet told so.
FINISHED_LINGER = 10.0
#: Seconds a server that aborted the run (it caught the peer deviating) keeps answering, for
#: the peer to hear why at its next call and the providers to be told the run ended.
ABORT_LINGER = 30.0
#: Seconds it still answers after telling the last of them: one just told asks next how its
#: last round ended (RoundStatus(round=t).caller_left_out, docs/CLIENTS.md section 1.3).
FINISHED_GRACE = 1.0


@contextlib.contextmanager
def _naming_key(key: str) -> Iterator[None]:
    """A port that cannot be bound, said with the configuration key that names it."""
    try:
        yield
    except OSError as exc:
        raise OSError(f"{key}: {exc}") from exc


class ServerDaemon(
    PeerPairing, PairedSessions, DataLink, WorkerPairing, CheckpointResume, BackendSelection
):
    """One SPGC server (H1 or H2)."""

    def __init__(self, cfg: ServerConfig, precompute: int | None = None) -> None:
        """``precompute``: instead of training, fill the noise pool (mode preprocessed) until it
        holds that many unused samples (0: pool_rounds rounds' worth), then stop (H1 tells H2)."""
        self.cfg = cfg
        self.precompute = precompute
        fault = planned_fault()  # a malformed SPGC_FAULT_INJECT stops the start (ValueError)
        if fault is not None:
            check_cheat_fits(fault[0], cfg.backend, cfg.security, cfg.role)
            what = (
                "the peer caught deviating"
                if fault[0] in DEVIATION_POINTS
                else "this server cheating"
                if fault[0] in CHEAT_POINTS
                else "SIGKILL"
            )
            log.warning("fault injection armed: %s at %s of round %d", what, *fault)
        self.plan = make_plan(cfg)
        # backend: auto: fixed at the first pairing (servers/link_probe.py), then the run's.
        self._requested_backend = cfg.backend
        self._backend_choice: BackendChoice | None = None
        if precompute is not None and cfg.mode != "preprocessed":
            raise ValueError(f"precompute fills a noise pool: mode is {cfg.mode}, not preprocessed")
        if cfg.workers > 1 and not ray_available():  # say so now, not after pairing
            raise ValueError(
                f"workers: {cfg.workers} runs the circuit on Ray worker pairs, and Ray is not "
                "installed: pip install '.[ray]' in the checkout (or set workers: 1)"
            )
        if cfg.state_dir is not None:
            # Private: checkpoints, the seed journal and spilled shares live here.
            try:
                cfg.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            except OSError as e:
                raise ValueError(f"state_dir: cannot create {cfg.state_dir}: {e.strerror}") from e
            for stale in cfg.state_dir.glob("spgc-intake-*"):  # shares a crash left behind
                shutil.rmtree(stale, ignore_errors=True)
            if cfg.keep_models == 0:  # every version kept: say so now if they will not fit
                # a version: float32 parameters, and its report twice (file metadata, .json)
                why = models_fit_disk(cfg.state_dir, 4 * self.plan.model_dim + 4096, cfg.rounds)
                if why:
                    log.warning("%s: %s", cfg.role_name, why)
        norm = self.plan.norm_proof
        self.intake = ShareIntake(
            self.plan.share_dim,
            self.plan.ring_bits,
            spill_root=cfg.state_dir,
            allowed_providers=cfg.providers,
            field_shares=None if norm is None else FieldShares(norm, leader=cfg.role == 1),
        )
        role = pb.SERVER_ROLE_SINGLE if cfg.single_server else cfg.role
        self.state = ServerState(self.plan, role, self.intake)
        self.state.ledger_key = cfg.ledger_key
        if cfg.test_data and self.state.evaluator is not None:
            self.state.evaluator.check(f"test_data {cfg.test_data!r}")
        if cfg.state_dir is not None:
            set_seed_journal(cfg.state_dir / "used-seeds")  # never a seed of an earlier process
            self.state.checkpoint_dir = cfg.state_dir
            self.state.ledger_path = cfg.state_dir / LEDGER_FILE
        self.state.ledger_public_key()  # a bad ledger_key fails here, before any port opens
        audit_path = cfg.audit_log
        if audit_path is None and cfg.state_dir is not None:
            audit_path = cfg.state_dir / "audit.jsonl"
        self.audit = self.state.audit = AuditLog(audit_path, cfg.role_name)
        if cfg.state_dir is not None and cfg.resume and precompute is None:
            self._resume()
        if cfg.mode == "preprocessed":
            assert cfg.pool_path is not None  # validated
            self.state.pool = NoisePool(
                cfg.pool_path,
                cfg.role_name,
                self.plan.joint_sigma_units_for(0),  # (1 - f) sigma^2 with a noise floor
                self.plan.ring_bits,
                field_modulus=None if norm is None else norm.p,
            )
        self.tls = None if cfg.tls is None else TlsFiles(cfg.tls.cert, cfg.tls.key, cfg.tls.ca)
        if self.tls is not None:
            self.tls.check()  # gRPC would only say "cannot bind", or fail each handshake
        self.stop_event = threading.Event()
        self.done = threading.Event()
        self.error: BaseException | None = None
        self._link: PartyLink | None = None
        self._link_ready = threading.Event()
        self._gc_channels: list[Any] = []  # the data link: one connection per lane
        self._workers: list[Any] = []  # workers > 1: this server's Ray actors
        # H2, workers > 1: H1's PairWorkers call links the workers this server started for the
        # current pairing (generation: which start they belong to, so that a call still
        # running for an earlier pairing reports nothing to the new one).
        self._workers_lock = threading.Lock()
        self._workers_generation = 0
        self._workers_started = threading.Event()
        self._workers_linked = threading.Event()
        self._workers_link_error: str | None = None
        self._workers_linking = False  # a PairWorkers call took this pairing's workers
        self._listener: Any = None
        self._peer_channel: grpc.Channel | None = None
        # Pairing with the other server (two-server modes): a lost peer is waited for and the
        # two continue from their last common checkpoint (see _run_paired).
        self._session = threading.Event()  # set: this pairing is over (peer lost or stop)
        self._reset_lock = threading.Lock()
        self._round_state_live = False  # rounds ran since the last checkpoint restore
        self.peer_health: Any = None
        self._session_paired = False  # the current session got as far as a data link
        self._dialed_epoch = 0  # H2: the pairing (PeerServicer.epoch) its data link was dialed for
        self._lost_reason = "the peer was lost"
        self._probe_channel: grpc.Channel | None = None  # H2: to H1's peer port (probes)
        self._threads: list[threading.Thread] = []
        self.server: grpc.aio.Server | None = None  # the providers' gRPC server (port)
        self._io: LoopThread | None = None  # the event loop the providers' server runs on
        self.health: Any = None  # the providers' server's gRPC health service
        self._ready_status: bool | None = None  # what spgc.v1.Aggregator's health says
        self.metrics: ServerMetrics | None = None
        self.curves: TrainingCurves | None = None
        self.metrics_server: MetricsServer | None = None
        self.metrics_port = 0
        self.port = 0
        self.peer_server: grpc.Server | None = None  # the other server's (peer_port)
        self.peer_port = 0
        self.gc_port = 0

    # ------------------------------------------------------------------ setup

    def _adopt_run(self, run_id: str) -> None:
        """Fix the run id and the TrainingConfig announced to providers."""
        self.state.run_id = run_id
        self.state.config = self.plan.training_config(run_id)

    def _call_refused(self, who: str, method: str, code: str, reason: str) -> None:
        if self.audit.record(
            "refused", repeat_key=f"{host_of(who)} {method} {code}", identity=who,
            method=method, code=code, reason=reason,
        ):  # fmt: skip
            log.warning("refused %s from %s: %s", method, who, reason)

    def _own_name(self) -> str:
        """The name the providers know this server by (ServerInfo.server_name): its
        certificate's, which need not be h1/h2; the role's without TLS."""
        if self.tls is None:
            return self.cfg.role_name
        try:
            name = certificate_identity(self.tls.cert)
        except (OSError, ValueError) as exc:
            raise ValueError(f"tls.cert: cannot read {self.tls.cert}: {exc}") from None
        return name or self.cfg.role_name

    def bind(self) -> ServerDaemon:
        """Bind the gRPC port (and, on H1, the GC listener); sets ``port``/``gc_port``."""
        insecure = self.cfg.insecure
        self.aggregator = AggregatorServicer(self.state, self._own_name(), insecure)
        self.peer_servicer = PeerServicer(
            self.state,
            self.cfg.peer_name,
            insecure,
            self._get_link,
            self._adopt_run,
            self._align_with_peer,
            on_repair=self._repair_on_handshake,
            on_paired=self._paired,
            link_workers=self._link_workers if self.cfg.workers > 1 else None,
            on_link_probe=self._answer_link_probe,
            check_backend=self._check_backend_choice,
        )
        cfg = self.cfg
        self.gate = ProviderGate(
            ProviderLimits(
                max_streams=cfg.provider_max_streams,
                rate=cfg.provider_rate,
                burst=max(1, int(2 * cfg.provider_rate)),
                idle_seconds=cfg.provider_idle,
                stream_seconds=cfg.provider_stream_timeout,
            ),
            frozenset(cfg.providers),
            insecure,
            on_refused=self._call_refused,
        )
        # The providers' server: asyncio, one event loop thread for every provider call (a
        # long poll is a coroutine, not a thread). Calls beyond the bound are refused, not
        # queued: room for every provider's long poll, upload and model download.
        self._io = LoopThread("spgc-providers-io")

        async def providers_server() -> tuple[grpc.aio.Server, int, Any]:
            server, port = make_aio_server(
                cfg.listen,
                [
                    partial(
                        add_servicer,
                        servicer=self.aggregator,
                        service=AGGREGATOR_SERVICE,
                        on_refused=self._call_refused,
                    )
                ],
                self.tls,
                insecure,
                maximum_concurrent_rpcs=min(16384, 64 + 4 * len(cfg.providers)),
                interceptors=[self.gate],
            )
            return server, port, await add_aio_health(server)

        with _naming_key("listen"):
            self.server, self.port, self.health = self._io.run(providers_server())
        self.state.add_round_listener(self._update_readiness)
        self._update_readiness()
        if not cfg.single_server:
            # The other server's control calls: a gRPC server and port of their own.
            with _naming_key("peer_listen"):
                self.peer_server, self.peer_port = make_server(
                    cfg.peer_listen,
                    [
                        partial(
                            add_servicer,
                            servicer=self.peer_servicer,
                            service=PEER_SERVICE,
                            on_refused=self._call_refused,
                        )
                    ],
                    self.tls,
                    insecure,
                    interceptors=[PeerGate(cfg.peer_name, insecure, on_refused=self._call_refused)],
                )
            self.peer_health = add_health(self.peer_server)
            self._set_paired_health(False)
        if self.cfg.role == 1 and not self.cfg.single_server:
            with _naming_key("gc_address"):
                self._listener = garbled_core.Listener(*split_host_port(self.cfg.gc_address))
            self.gc_port = self._listener.port
        if cfg.metrics_port is not None:
            self._start_metrics()
        if cfg.tensorboard_dir is not None:
            # A run per server (h1, h2): side by side in TensorBoard when the directories meet.
            self.curves = TrainingCurves(
                cfg.tensorboard_dir / cfg.role_name, self.state.epsilon, lambda: self.state.run_id
            )
            self.state.add_round_observer(self.curves.observe_round)
        return self

    def _start_metrics(self) -> None:
        """Prometheus /metrics, /healthz and /readyz on metrics_port (servers/metrics.py)."""
        cfg, state = self.cfg, self.state
        pool = state.pool
        self.metrics = ServerMetrics(
            epsilon=state.epsilon,
            epsilon_budget=cfg.target_epsilon if state.differentially_private else None,
            pool_samples=None if pool is None else (lambda: pool.available),
            readiness=self.readiness_problem,
            progress=lambda: (state.round, state.releases),
            rounds_planned=cfg.rounds,
            identity={"role": cfg.role_name, "mode": cfg.mode, "version": __version__},
        )
        state.add_round_observer(self.metrics.observe_round)
        state.add_share_observer(self.metrics.share_accepted)
        self.audit.add_listener(self.metrics.on_audit)
        self.metrics_server = MetricsServer(
            self.metrics, self.readiness_problem, cfg.metrics_host, cfg.metrics_port or 0
        )
        self.metrics_port = self.metrics_server.port

    def readiness_problem(self) -> str | None:
        """None when this server can run a round (/readyz, and the providers' gRPC health
        service spgc.v1.Aggregator); else why not."""
        if self.stop_event.is_set():
            return "the server is stopping"
        if self.state.finished:
            return "training is finished"
        if not self.state.ready:
            return "the servers have not agreed on the plan yet (no Handshake)"
        if not self.cfg.single_server and (
            not self._session_paired or self.state.peer_waiting or self._session.is_set()
        ):
            # _session is set the moment the probe finds the peer gone, while the driver may
            # still be held in a call to it (a frozen peer) until that call's deadline.
            return "the other server is not connected"
        return None

    def _update_readiness(self) -> None:
        """Mirror readiness_problem into the providers' gRPC health service (any thread)."""
        if self._io is None or self.health is None:
            return
        serving = self.readiness_problem() is None
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else (health_pb2.HealthCheckResponse.NOT_SERVING)
        )
        if serving == self._ready_status:
            return
        self._ready_status = serving
        if self._io.loop.is_closed():  # stopping
            return
        asyncio.run_coroutine_threadsafe(
            self.health.set(AGGREGATOR_SERVICE.full_name, status), self._io.loop
        )

    def start(self) -> ServerDaemon:
        """Start serving and the background work (H1: handshake + rounds; H2: GC link)."""
        if self.server is None:
            self.bind()
        assert self.server is not None
        self._io.run(self.server.start())
        if self.peer_server is not None:
            self.peer_server.start()
        target = self._run_single if self.cfg.single_server else self._run_paired
        thread = threading.Thread(
            target=self._guard, args=(target,), name="spgc-daemon", daemon=True
        )
        self._threads.append(thread)
        self.audit.record(
            "start", run_id=self.state.run_id or None, round=self.state.round,
            resumed=bool(self.state.steps or self.state.releases),
        )  # fmt: skip
        thread.start()
        if MODES[self.cfg.mode].noise_by in SERVER_NOISE and self.plan.sigma_units > 0:
            # The sampler's parameter search takes seconds; done now, it overlaps the wait for
            # the peer and the providers instead of delaying the first round's noise.
            threading.Thread(
                target=derive_params, args=(self.plan.joint_sigma_units_for(0),),
                name="spgc-sampler-params",
                daemon=True,
            ).start()  # fmt: skip
        if self.metrics_server is not None:
            log.info(
                "%s metrics on http://%s:%d/metrics (/healthz, /readyz)",
                self.cfg.role_name, self.cfg.metrics_host, self.metrics_port,
            )  # fmt: skip
        log.info(
            "%s serving on port %d (mode %s, d=%d, L=%d, sigma_units=%.4g%s%s)",
            self.cfg.role_name,
            self.port,
            self.cfg.mode,
            self.plan.dim,
            self.plan.ring_bits,
            self.plan.sigma_units,
            # (after d: spgc bench load reads "(mode M, d=D,")
            f", backend {self.cfg.backend}" if MODES[self.cfg.mode].servers == 2 else "",
            f", security {self.cfg.security}" if self.cfg.security != DEFAULT_SECURITY else "",
        )
        return self

    def _nothing_trained(self) -> str | None:
        """Why a run that ended without a single model update failed (None: it did not)."""
        state = self.state
        if self.precompute is not None or state.steps or not state.round or not state.finished:
            return None
        declined = state.declined_text()
        why = f"; declined: {declined}" if declined else ""
        return (
            f"training ended after {state.round} round(s) without one model update: no round "
            f"had the shares of min_providers ({self.cfg.min_providers}) providers{why}"
        )

    def _guard(self, target: Any) -> None:
        try:
            target()
            if not self.stop_event.is_set() and (why := self._nothing_trained()):
                raise RuntimeError(why)
        except BaseException as exc:
            if not self.stop_event.is_set():
                self.error = exc
                log.error("%s stopping: %s", self.cfg.role_name, describe_error(exc))
                self.state.fail(describe_error(exc))  # long polls answer FINISHED with why
                if peer_gone(exc):
                    self.audit.record("peer_lost", identity=self.cfg.peer_name, reason=str(exc))
        finally:
            self._write_summary()
            self.audit.record(
                "stop",
                round=self.state.round,
                finished=self.state.finished and self.error is None,
                failure=None if self.error is None else str(self.error),
            )
            self.done.set()

    def _write_summary(self) -> None:
        if self.cfg.summary_path is None:
            return
        summary = self.state.summary()
        if self.error is not None:
            summary["failure"] = summary["failure"] or str(self.error)
        summary["finished"] = summary["finished"] and summary["failure"] is None
        summary["peak_rss_mb"] = round(peak_rss_mb(), 1)  # spgc bench load reads it
        tmp = self.cfg.summary_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True))
        tmp.replace(self.cfg.summary_path)  # readers never see half a file

    # ------------------------------------------------------------------ one server

    def _run_single(self) -> None:
        """plain / ldp: this server alone fixes the run and drives every round."""
        self._adopt_run(self.cfg.run_id or os.urandom(16).hex())
        self._checkpoint_the_start()
        SingleDriver(self.state, self.stop_event).run()
        if self.state.failure:
            raise PeerMismatchError(self.state.failure)
        if self.state.finished and not self.stop_event.is_set():
            self.state.record_close()  # no release follows (one server: its own signature)
        log.info(
            "%s (single server, mode %s): training %s after %d round(s), %d step(s)",
            self.cfg.role_name,
            self.cfg.mode,
            "stopped" if self.stop_event.is_set() else "finished",
            self.state.round,
            self.state.steps,
        )

    # ------------------------------------------------------------------ shutdown

    def wait(self, timeout: float | None = None) -> bool:
        """True once the background work ended (finished, failed or stopped)."""
        return self.done.wait(timeout)

    def linger(self, timeout: float = FINISHED_LINGER) -> None:
        """Training is over: keep answering until every provider that called this server was
        told so (a RoundInfo with ROUND_PHASE_FINISHED) and then FINISHED_GRACE s more, for at
        most ``timeout`` s. One that was computing or polling slowly then learns the end
        instead of finding no server, and one just told can still ask how its last round
        ended."""
        end = time.monotonic() + timeout
        waiting: list[str] = []
        with self.state.cond:
            while not self.stop_event.is_set():
                waiting = self.state.providers_not_told_finished()
                now = time.monotonic()
                if not waiting:
                    end = min(end, self.state.last_told_finished + FINISHED_GRACE)
                left = end - now
                if left <= 0:
                    break
                self.state.cond.wait(min(left, 0.5))
        if waiting:
            log.info(
                "%s: stopping; not told that training is over: %s",
                self.cfg.role_name,
                ", ".join(waiting),
            )

    def linger_after_abort(self, timeout: float = ABORT_LINGER) -> None:
        """This server aborted the run: keep answering until the peer has heard why (H2: H1's
        next call, its Handshake to re-pair included, is refused with the abort; H1 tells H2
        itself) and the providers that called were told the run ended, for at most
        ``timeout`` s."""
        end = time.monotonic() + timeout
        if self.cfg.role == 2 and not self.peer_servicer.abort_told.wait(timeout):
            log.info("h2: stopping; h1 did not call again to hear of the abort")
        self.linger(max(0.0, end - time.monotonic()))

    def stop(self, grace: float = 1.0) -> None:
        """Stop serving, close the links and delete the spill files (idempotent)."""
        self.stop_event.set()
        self._session.set()
        self.state.close()
        for channel in self._gc_channels:
            # A round or noise block may be running on the link in another thread: make its
            # I/O fail now; the channel is closed below, once those threads are done with it.
            channel.interrupt()
        self._stop_workers()  # a round running on them fails now
        if self.server is not None:
            self._io.run(self.health.enter_graceful_shutdown())
            self._io.run(self.server.stop(grace), timeout=grace + 5)
            self.server = None
        if self._io is not None:
            self._io.close()
            self.aggregator.close()
        if self.metrics_server is not None:
            self.metrics_server.close()
            self.metrics_server = None
        if self.curves is not None:
            self.curves.close()
            self.curves = None
        if self.peer_server is not None:
            self.peer_server.stop(grace).wait(grace + 1)
        for thread in [*self._threads, *self.peer_servicer.link_users()]:
            thread.join(5)
        closers = (*self._gc_channels, self._listener, self._peer_channel, self._probe_channel)
        for closer in closers:
            if closer is not None:
                try:
                    closer.close()
                except Exception as exc:  # already closed: nothing left to release
                    log.debug("close: %s", exc)
        self.intake.close()
        if self.cfg.state_dir is not None:
            set_seed_journal(None)

"""The server daemon: wires config, intake, services, the GC link and the round driver.

Life cycle: :meth:`ServerDaemon.bind` (ports, so tests can use port 0), :meth:`start`
(threads), :meth:`wait`, :meth:`stop` (servers, channels, spill files). H1 listens for the
garbled-circuit link and drives the rounds; H2 dials the link after the Handshake.

Modes (SPEC section 5): in ``plain`` and ``ldp`` the daemon is the ONLY server (role 1, served
to providers as SERVER_ROLE_SINGLE): no Peer service, no peer, no garbled-circuit link; it runs
the rounds alone (coordinator.SingleDriver). In ``dng`` both servers run as in ``spgc``, but the
data link carries the two noisy shares instead of a garbled circuit (no engine session).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import struct
import threading
import time
from collections.abc import Iterator
from functools import partial
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

import garbled_core
from spgc import __version__
from spgc.config import ServerConfig
from spgc.ledger import LEDGER_FILE, LedgerError
from spgc.plan import make_plan
from spgc.progress import terminal_logging
from spgc.servers.aggregator import AggregatorServicer
from spgc.servers.audit import AuditLog, host_of
from spgc.servers.checkpoint import (
    CheckpointError,
    config_digest,
    load_checkpoint,
    step_back,
)
from spgc.servers.coordinator import H1Driver, SingleDriver
from spgc.servers.curves import TrainingCurves
from spgc.servers.errors import PeerLost, PeerMismatchError, describe_error, peer_gone
from spgc.servers.faults import planned_fault
from spgc.servers.gc_party import PartyLink, set_seed_journal
from spgc.servers.intake import ShareIntake
from spgc.servers.ledger_state import release_counts_problem
from spgc.servers.limits import PeerGate, ProviderGate, ProviderLimits
from spgc.servers.metrics import MetricsServer, ServerMetrics
from spgc.servers.noise_pool import NoisePool
from spgc.servers.peer import PeerServicer, config_differences
from spgc.servers.pool_sync import NoiseProducer
from spgc.servers.ray_workers import (
    RayLane,
    WorkerTls,
    kill_worker,
    ray_available,
    ray_get,
    start_workers,
)
from spgc.servers.state import RPC_SLACK, ServerState
from spgc.wire import PROTOCOL_VERSION, aggregation_pb2, peer_pb2, peer_pb2_grpc
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.errors import FailedPreconditionError, NotPairedError, WireError, is_unavailable
from spgc.wire.identity import certificate_identity
from spgc.wire.tls import TlsFiles
from spgc.wire.transport import (
    LoopThread,
    add_aio_health,
    add_health,
    add_servicer,
    join_host_port,
    make_aio_server,
    make_channel,
    make_server,
    split_host_port,
)

log = logging.getLogger(__name__)

# Registered with raw-bytes parsing: a malformed or out-of-range request is INVALID_ARGUMENT.
AGGREGATOR_SERVICE = aggregation_pb2.DESCRIPTOR.services_by_name["Aggregator"]
PEER_SERVICE = peer_pb2.DESCRIPTOR.services_by_name["Peer"]
GC_HANDSHAKE_TIMEOUT = 10.0  # seconds a connection to the circuit port has to authenticate
# Each server's peer port answers this health service name SERVING only while it is paired with
# the other server: a restarted server says NOT_SERVING (or nothing) until the next Handshake.
PAIRED_HEALTH_SERVICE = "spgc.v1.Peer"
PROBE_INTERVAL = 1.0  # seconds between two probes of the peer's pairing
PROBE_FAILURES = 3  # unanswered probes in a row that mean the peer is gone


#: Seconds the data link waits for the other server's next bytes (either end) before it gives
#: the link up as lost.
GC_IO_TIMEOUT = 10.0

#: Times in a row the peer may be lost (and the round run again after a re-pairing) without a
#: model update in between; one more stops the server.
MAX_LOSSES_WITHOUT_PROGRESS = 3

#: Seconds a server whose training is over keeps answering providers not yet told so.
FINISHED_LINGER = 10.0
#: Seconds it still answers after telling the last of them: one just told asks next how its
#: last round ended (RoundStatus(round=t).caller_left_out, docs/CLIENTS.md section 1.3).
FINISHED_GRACE = 3.0


def _agree_on_lanes(channel: Any, lanes: int, workers: int, peer_name: str) -> None:
    """Both ends of the data link state their gc_lanes and workers on its first connection: a
    difference stops both with a clear error instead of one side waiting for connections that
    never come."""
    channel.send(struct.pack("<II", lanes, workers))
    channel.flush()
    their_lanes, their_workers = struct.unpack("<II", channel.recv(8))
    if their_lanes != lanes:
        raise PeerMismatchError(
            f"gc_lanes differ: {lanes} here, {their_lanes} at {peer_name} (both servers must "
            "set the same number of data-link lanes)"
        )
    if their_workers != workers:
        raise PeerMismatchError(
            f"workers differ: {workers} here, {their_workers} at {peer_name} (both servers must "
            "set the same number of circuit workers)"
        )


@contextlib.contextmanager
def _naming_key(key: str) -> Iterator[None]:
    """A port that cannot be bound, said with the configuration key that names it."""
    try:
        yield
    except OSError as exc:
        raise OSError(f"{key}: {exc}") from exc


def _gc_address_hint(exc: BaseException) -> str:
    """Why a TLS-level failure at gc_address is likely a wrong port: H1's gRPC ports (listen,
    peer_listen) also speak TLS with H1's certificate, then drop a client that is not gRPC."""
    if "could not connect" in str(exc):
        return " (is H1 running, and is this H1's gc_address?)"
    if "TLS" in str(exc):
        return (
            " (gc_address must be H1's gc_address, not its listen or peer_listen port, "
            "and each server's tls.ca must hold the CA of the other's certificate)"
        )
    return ""


class ServerDaemon:
    """One SPGC server (H1 or H2)."""

    def __init__(self, cfg: ServerConfig, precompute: int | None = None) -> None:
        """``precompute``: instead of training, fill the noise pool (mode preprocessed) until it
        holds that many unused samples (0: pool_rounds rounds' worth), then stop (H1 tells H2)."""
        self.cfg = cfg
        self.precompute = precompute
        fault = planned_fault()  # a malformed SPGC_FAULT_INJECT stops the start (ValueError)
        if fault is not None:
            log.warning("fault injection armed: SIGKILL at %s of round %d", *fault)
        self.plan = make_plan(cfg)
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
        self.intake = ShareIntake(
            self.plan.dim,
            self.plan.ring_bits,
            spill_root=cfg.state_dir,
            allowed_providers=cfg.providers,
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
                cfg.pool_path, cfg.role_name, self.plan.sigma_units, self.plan.ring_bits
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

    def _gc_tls(self) -> dict[str, Any]:

        if self.tls is None:
            return {"insecure": True}
        # Providers hold certificates from the same CA: only the peer server's name may
        # open the garbled-circuit link.
        tls = garbled_core.TlsConfig(
            str(self.tls.cert), str(self.tls.key), str(self.tls.ca), peer_name=self.cfg.peer_name
        )
        return {"tls": tls}

    def _adopt_run(self, run_id: str) -> None:
        """Fix the run id and the TrainingConfig announced to providers."""
        self.state.run_id = run_id
        self.state.config = self.plan.training_config(run_id)

    def _gc_refused(self, address: str, reason: str) -> None:
        if self.audit.record(
            "circuit_refused", repeat_key=host_of(address), identity=address, reason=reason
        ):
            log.warning("circuit port: refused a connection from %s: %s", address, reason)

    def _call_refused(self, who: str, method: str, code: str, reason: str) -> None:
        if self.audit.record(
            "refused", repeat_key=f"{host_of(who)} {method} {code}", identity=who,
            method=method, code=code, reason=reason,
        ):  # fmt: skip
            log.warning("refused %s from %s: %s", method, who, reason)

    def _get_link(self, timeout: float) -> PartyLink:
        if not self._link_ready.wait(timeout) or self._link is None:
            raise RuntimeError("the garbled-circuit link to the other server is not up")
        return self._link

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
        status = health_pb2.HealthCheckResponse.SERVING if serving else (
            health_pb2.HealthCheckResponse.NOT_SERVING
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
        if self.metrics_server is not None:
            log.info(
                "%s metrics on http://%s:%d/metrics (/healthz, /readyz)",
                self.cfg.role_name, self.cfg.metrics_host, self.metrics_port,
            )  # fmt: skip
        log.info(
            "%s serving on port %d (mode %s, d=%d, L=%d, sigma_units=%.4g)",
            self.cfg.role_name,
            self.port,
            self.cfg.mode,
            self.plan.dim,
            self.plan.ring_bits,
            self.plan.sigma_units,
        )
        return self

    def _handshake_refusal(self, exc: grpc.RpcError) -> str:
        """What an operator reads when peer_address answers the Handshake with an error: the
        usual causes are a wrong address or certificate name."""
        where = f"the Handshake to {self.cfg.peer_address} ({self.cfg.peer_name}) failed"
        hint = {
            grpc.StatusCode.UNIMPLEMENTED: "that address serves no Peer service: peer_address "
            "must be the other server's peer_listen, not its listen (providers') port",
            grpc.StatusCode.PERMISSION_DENIED: "the other server does not accept this server's "
            "certificate as its peer: check its peer_name and this server's tls.cert",
            grpc.StatusCode.UNAUTHENTICATED: "the other server found no identity in this "
            "server's certificate",
        }.get(exc.code())  # type: ignore[attr-defined]
        return f"{where}: {describe_error(exc)}" + (f" ({hint})" if hint else "")

    def _nothing_trained(self) -> str | None:
        """Why a run that ended without a single model update failed (None: it did not)."""
        state = self.state
        if self.precompute is not None or state.steps or not state.round or not state.finished:
            return None
        with state.cond:
            declined = dict(state.declined)
        why = (
            "; declined: " + "; ".join(f"{name}: {reason}" for name, reason in declined.items())
            if declined
            else ""
        )
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
        tmp = self.cfg.summary_path.with_suffix(".tmp")
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=True))
        tmp.replace(self.cfg.summary_path)  # readers never see half a file

    def _open_link(self, role: str, stub: peer_pb2_grpc.PeerStub | None = None) -> PartyLink:
        """The data link to the other server: an engine session on it, except in dng, which
        only exchanges the two noisy shares over the raw channel (no garbled circuit).
        ``stub``: H1's control channel to H2, which pairs the workers when workers > 1."""
        if self.cfg.mode == "dng":
            return PartyLink(role, self._gc_channels[0], None)
        lanes = [
            PartyLink.open(role, ch, scheme=self.cfg.garbling_scheme, ot_k=self.cfg.ot_k)
            for ch in self._gc_channels
        ]
        lanes[0].extra_lanes = lanes[1:]  # rounds run on every lane; a noise block on lane 0
        if self.cfg.workers > 1:
            lanes[0].remote_lanes = self._pair_workers(role, stub)
        return lanes[0]

    def _pair_workers(self, role: str, stub: peer_pb2_grpc.PeerStub | None) -> list[Any]:
        """workers > 1: this server's Ray workers, each paired with the other server's worker of
        the same index over its own TLS link. H1's workers listen and H1 names their addresses
        to H2 in a PairWorkers call on the control channel; H2's workers dial them while H2
        answers it (_link_workers). Rounds then run on them (servers.ray_workers)."""
        generation = self._stop_workers()
        tls = (
            WorkerTls(insecure=True)
            if self.tls is None
            else WorkerTls(
                str(self.tls.cert), str(self.tls.key), str(self.tls.ca), self.cfg.peer_name
            )
        )
        actors = start_workers(
            role,
            self.cfg.workers,
            tls,
            self.cfg.garbling_scheme,
            self.cfg.ot_k,
            self.cfg.ray_address,
            self.cfg.connect_timeout,
        )
        timeout = self.cfg.connect_timeout
        with self._workers_lock:
            if generation != self._workers_generation:  # reset meanwhile: a new pairing
                for actor in actors:
                    kill_worker(actor)
                raise PeerLost("re-paired while starting the circuit workers")
            self._workers = actors
            self._workers_started.set()
        if role == "garbler":
            assert stub is not None
            host, _ = split_host_port(self.cfg.gc_address)
            listening = ray_get([a.listen.remote(host) for a in actors])
            accepted = [a.accept.remote(timeout) for a in actors]
            request = peer_pb2.WorkerPairing(
                run_id=self.state.run_id,
                role=self.cfg.role,
                workers=len(actors),
                addresses=[join_host_port(h, int(p)) for h, p in listening],
            )
            try:
                answer = stub.PairWorkers(request, timeout=timeout + RPC_SLACK)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.UNAVAILABLE:  # it restarted or re-paired
                    raise PeerLost(f"pairing the circuit workers: {describe_error(exc)}") from None
                raise PeerMismatchError(
                    f"{self.cfg.peer_name} could not link its circuit workers to ours: "
                    f"{describe_error(exc)}"
                ) from None
            if answer.workers != len(actors):
                raise PeerMismatchError(
                    f"workers differ: {len(actors)} here, {answer.workers} at {self.cfg.peer_name}"
                )
            ray_get(accepted)
        else:
            self._wait_for_worker_links(generation, timeout + RPC_SLACK)
        log.info("%s: %d circuit worker pair(s) linked", self.cfg.role_name, len(actors))
        return [RayLane(a) for a in actors]

    def _wait_for_worker_links(self, generation: int, timeout: float) -> None:
        """H2: until H1's PairWorkers call has linked the workers of this ``generation``."""
        deadline = time.monotonic() + timeout
        while not self._workers_linked.wait(0.2):
            if self.stop_event.is_set() or self._session.is_set():
                raise PeerLost("the pairing ended while the circuit workers were linking")
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{self.cfg.peer_name} did not name its circuit workers within {timeout:g} s"
                )
        with self._workers_lock:
            if generation != self._workers_generation:
                raise PeerLost("re-paired while the circuit workers were linking")
            if self._workers_link_error is not None:
                raise PeerMismatchError(self._workers_link_error)

    def _link_workers(self, addresses: list[tuple[str, int]], workers: int, timeout: float) -> int:
        """H2's side of PairWorkers (the Peer servicer calls it): once this server's workers of
        the current pairing are up, worker i dials H1's worker i at ``addresses[i]``. Returns
        the number of workers linked; a refusal is the caller's gRPC status: UNAVAILABLE when
        the pairing ends meanwhile (H1 pairs again), FAILED_PRECONDITION when a worker cannot
        connect (ports, firewall, certificates: retrying would not help)."""
        if workers != self.cfg.workers:
            raise FailedPreconditionError(
                f"workers differ: {workers} at {self.cfg.peer_name}, {self.cfg.workers} here"
            )
        epoch = self.peer_servicer.epoch
        deadline = time.monotonic() + timeout
        while not self._workers_started.wait(0.2):
            if (
                self.stop_event.is_set()
                or not self.peer_servicer.paired
                or self.peer_servicer.epoch != epoch
            ):
                raise NotPairedError(
                    f"{self.cfg.role_name} lost the pairing while its circuit workers started"
                )
            if time.monotonic() > deadline:
                raise WireError(
                    f"{self.cfg.role_name}'s circuit workers did not start within {timeout:g} s",
                    grpc.StatusCode.DEADLINE_EXCEEDED,
                )
        with self._workers_lock:
            if self._workers_linking:  # a second call for the same workers: keep the first's
                raise FailedPreconditionError(
                    f"{self.cfg.role_name}'s circuit workers are already linked (or linking) "
                    "for this pairing"
                )
            self._workers_linking = True
            generation, actors = self._workers_generation, list(self._workers)
        error = None
        try:
            ray_get(
                [
                    a.connect.remote(host, port, timeout)
                    for a, (host, port) in zip(actors, addresses, strict=True)
                ]
            )
        except Exception as exc:  # a worker could not connect, or died
            # Ray's error carries the worker's traceback; its last line is the cause.
            cause = (str(exc).strip().splitlines() or [type(exc).__name__])[-1]
            error = (
                f"{self.cfg.role_name}'s circuit workers could not connect to "
                f"{self.cfg.peer_name}'s at {', '.join(f'{h}:{p}' for h, p in addresses)}: "
                f"{cause}"
            )
        with self._workers_lock:
            current = generation == self._workers_generation
            if current:
                self._workers_link_error = error
                self._workers_linked.set()
        if not current:  # reset meanwhile: those workers were stopped
            raise NotPairedError(f"{self.cfg.role_name} lost the pairing while linking workers")
        if error is not None:
            raise FailedPreconditionError(error)
        return len(actors)

    def _stop_workers(self) -> int:
        """Stop this server's workers; returns the new generation (workers started from here
        on belong to it, until the next stop)."""
        with self._workers_lock:
            self._workers_generation += 1
            self._workers_started.clear()
            self._workers_linked.clear()
            self._workers_link_error = None
            self._workers_linking = False
            actors, self._workers = self._workers, []
            generation = self._workers_generation
        for actor in actors:
            kill_worker(actor)
        return generation

    # ------------------------------------------------------------------ one server

    def _run_single(self) -> None:
        """plain / ldp: this server alone fixes the run and drives every round."""
        self._adopt_run(self.cfg.run_id or os.urandom(16).hex())
        self._checkpoint_the_start()
        SingleDriver(self.state, self.stop_event).run()
        if self.state.failure:
            raise PeerMismatchError(self.state.failure)
        log.info(
            "%s (single server, mode %s): training %s after %d round(s), %d step(s)",
            self.cfg.role_name,
            self.cfg.mode,
            "stopped" if self.stop_event.is_set() else "finished",
            self.state.round,
            self.state.steps,
        )

    # ------------------------------------------------------------------ H1

    def _handshake(self, stub: peer_pb2_grpc.PeerStub, deadline: float) -> None:
        run_id = self.state.run_id or self.cfg.run_id or os.urandom(16).hex()
        # Announced to providers (Hello) only once H2 agreed to it: until then they are told
        # UNAVAILABLE, as by H2, and never learn of a run that may not take place.
        config = self.plan.training_config(run_id)
        hello = peer_pb2.PeerHello(
            protocol_version=PROTOCOL_VERSION,
            software_version=f"spgc {__version__}",
            role=self.cfg.role,
            config=config,
            round=self.state.round_info(None, None),
            ledger_public_key=self.state.ledger_public_key(),
            ledger_releases=self.state.releases,
        )
        while True:
            try:
                answer = stub.Handshake(hello, timeout=10)
                break
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:  # H2 compared and refused
                    msg = f"the other server refused to pair: {exc.details()}"
                    raise PeerMismatchError(msg) from None
                if not is_unavailable(exc) or self.stop_event.is_set():
                    raise PeerMismatchError(self._handshake_refusal(exc)) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.cfg.peer_name} did not answer the Handshake at "
                        f"{self.cfg.peer_address}: {describe_error(exc)}"
                    ) from None
                time.sleep(0.2)
        diff = config_differences(config, answer.config)
        if diff:
            raise PeerMismatchError("training configurations differ in: " + ", ".join(diff))
        self._adopt_run(run_id)
        self.state.set_peer_ledger_key(answer.ledger_public_key)
        self._align_with_peer(answer.round)
        _, _, sha = self.state.model(None)
        mine = (self.state.round, self.state.version, sha)
        other = answer.round
        if mine != (other.round, other.model_version, other.model_sha256):
            raise PeerMismatchError(
                f"h1 is at round {mine[0]} (model v{mine[1]} {sha.hex()[:12]}), h2 at round "
                f"{other.round} (model v{other.model_version} {other.model_sha256.hex()[:12]}): "
                "both servers must resume the same checkpoint (or both start a new run with "
                "resume: false, whose privacy budget starts again)"
            )
        problem = release_counts_problem(hello.ledger_releases, answer.ledger_releases)
        if problem:
            raise PeerMismatchError(problem)
        try:
            self.state.open_ledger()  # checked now: another key, a damaged file
        except (LedgerError, CheckpointError) as exc:
            raise PeerMismatchError(str(exc)) from None
        if answer.ledger_releases == hello.ledger_releases + 1:
            # H2 recorded a release this server never did (H2 records first): count it too.
            if not answer.HasField("unmatched_release"):
                raise PeerMismatchError(
                    f"{self.cfg.peer_name} counts one release more and did not send it"
                )
            missing = answer.unmatched_release
            self.state.record_peer_release(missing.statement, missing.signature)

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

    # ------------------------------------------------------------------ pairing

    def _run_paired(self) -> None:
        """H1 or H2 of a two-server mode: pair with the other server and run the rounds. When
        the peer is lost (it stopped, restarted or stopped answering) this server drops the
        round in progress, goes back to its last checkpoint, tells providers it waits for its
        peer, and pairs again as soon as the peer is back (for up to ``peer_timeout`` s): the
        two continue from their last common checkpoint (a server one round ahead steps back at
        the Handshake). A release of the abandoned round stays in the ledger, counted; its
        round runs again with fresh seeds and noise."""
        deadline = time.monotonic() + self.cfg.connect_timeout
        losses, progress = 0, -1  # peer losses in a row without a model update in between
        while True:
            self._session = session = threading.Event()
            self._session_paired = False
            self._update_readiness()
            try:
                if self.cfg.role == 1:
                    self._run_h1(session, deadline)
                else:
                    self._run_h2(session, deadline)
                return
            except BaseException as exc:
                if self.stop_event.is_set() or not self._may_rejoin(exc):
                    raise
                reason = describe_error(exc)
                losses = losses + 1 if self.state.steps == progress else 1
                progress = self.state.steps
                if losses > MAX_LOSSES_WITHOUT_PROGRESS:
                    # A peer that pairs but never finishes a round (frozen in a call, failing
                    # each time) would otherwise have every attempt spend a release.
                    raise RuntimeError(
                        f"lost {self.cfg.peer_name} {losses} times in a row without a model "
                        f"update (last: {reason}): stopping rather than run round "
                        f"{self.state.round} again"
                    ) from exc
                if self.cfg.role == 1:  # H2 resets in the Handshake or on its probe's word
                    self._reset_for_peer(reason)
                deadline = time.monotonic() + self.cfg.peer_timeout
                log.warning(
                    "%s: waiting up to %g s (peer_timeout) for %s to come back",
                    self.cfg.role_name,
                    self.cfg.peer_timeout,
                    self.cfg.peer_name,
                )

    def _may_rejoin(self, exc: BaseException) -> bool:
        """Whether to wait for the peer after ``exc`` instead of stopping: the peer was lost
        after this session paired and linked (or was seen to restart), and a checkpoint gives
        both a common state to go back to."""
        return (
            (self._session_paired or isinstance(exc, PeerLost))
            and peer_gone(exc)
            and self.cfg.state_dir is not None
            and self.precompute is None
            and self.state.failure is None
            and not self.state.finished
        )

    def _set_paired_health(self, paired: bool) -> None:
        from_status = health_pb2.HealthCheckResponse
        self.peer_health.set(
            PAIRED_HEALTH_SERVICE, from_status.SERVING if paired else from_status.NOT_SERVING
        )
        self._update_readiness()

    def _checkpoint_the_start(self) -> None:
        """Before the run's first round: a checkpoint of model v0, so that a server lost in
        round 0 (even after a release) has a state to go back to, and a restart of both
        continues the same run rather than starting another."""
        if not self.state.checkpointed and self.precompute is None:
            self.state.save_checkpoint()  # no-op without a state_dir

    def _paired(self) -> None:
        """A Handshake agreed: rounds may run again."""
        self._round_state_live = True
        self.state.peer_back()
        self._set_paired_health(True)

    def _reset_for_peer(self, reason: str, session: threading.Event | None = None) -> bool:
        """The peer is lost: close the data link, drop the round in progress and go back to
        the last checkpoint; providers are told to wait. Idempotent; ``session``: only if it is
        still the current pairing. False when this server cannot continue with a restarted
        peer (no state_dir): it stops."""
        with self._reset_lock:
            if session is not None and session is not self._session:
                return True
            if self.state.finished:  # training is over: the peer simply stopped first
                self._session.set()
                return True
            self._session.set()
            self._set_paired_health(False)
            self._link_ready.clear()
            channels, self._gc_channels = self._gc_channels, []
            for channel in channels:
                channel.interrupt()  # a circuit or noise block running on it fails now
            self._stop_workers()
            for thread in self.peer_servicer.link_users():
                thread.join(30)
            self.peer_servicer.unpair()
            for channel in channels:
                try:
                    channel.close()
                except Exception as exc:  # already broken: nothing left to release
                    log.debug("close: %s", exc)
            self._link = None
            if not self._round_state_live:
                return True
            self._round_state_live = False
            if self.cfg.state_dir is None or self.precompute is not None:
                self.state.fail(f"lost {self.cfg.peer_name} ({reason}); no state_dir to resume")
                return False
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
            return True

    def _repair_on_handshake(self, reason: str) -> None:
        """H2: a Handshake while paired (H1 restarted before this server noticed)."""
        if not self._reset_for_peer(reason):
            raise FailedPreconditionError(
                f"{self.cfg.role_name} cannot continue with a restarted {self.cfg.peer_name}: "
                "it has no state_dir to go back to"
            )

    def _watch_peer(self, session: threading.Event) -> None:
        """Probe the peer's pairing every PROBE_INTERVAL s while ``session`` lasts: an answer
        other than SERVING (it restarted) or PROBE_FAILURES unanswered probes in a row end the
        pairing. Only after one SERVING answer: a wrong peer_address never ends it."""
        if self.cfg.role == 1:
            channel = self._peer_channel
        else:
            if self._probe_channel is None:
                self._probe_channel = make_channel(
                    self.cfg.peer_address, self.tls, self.cfg.insecure,
                    server_name=self.cfg.peer_name,
                )  # fmt: skip
            channel = self._probe_channel
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=PAIRED_HEALTH_SERVICE)
        seen, failures, warned = False, 0, False
        while not session.wait(PROBE_INTERVAL):
            try:
                status = stub.Check(request, timeout=2.0).status
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.NOT_FOUND:
                    status = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN
                else:
                    failures += 1
                    if seen and failures >= PROBE_FAILURES:
                        self._lose_peer(session, f"{self.cfg.peer_name} stopped answering")
                        return
                    if not seen and failures == 10 and not warned:
                        warned = True
                        log.warning(
                            "cannot probe %s at %s (peer_address): a lost peer is noticed "
                            "only after peer_timeout (%s)",
                            self.cfg.peer_name,
                            self.cfg.peer_address,
                            exc.code().name,
                        )
                    continue
            failures = 0
            if status == health_pb2.HealthCheckResponse.SERVING:
                seen = True
            elif seen:
                self._lose_peer(
                    session,
                    f"{self.cfg.peer_name} is no longer paired (it restarted, or dropped the "
                    "pairing after a failure on its side, such as a lost circuit worker)",
                )
                return

    def _lose_peer(self, session: threading.Event, reason: str) -> None:
        if self.state.finished:
            return  # the peer stopped after the last round, as it should
        log.warning("%s: %s", self.cfg.role_name, reason)
        if self.cfg.role == 2:
            self._reset_for_peer(reason, session)
            return
        with self._reset_lock:  # H1: its driver thread resets (see _run_paired)
            if session is self._session:
                self._lost_reason = reason
                session.set()
                for channel in self._gc_channels:
                    channel.interrupt()
        self._update_readiness()

    def _start_watch(self, session: threading.Event) -> None:
        thread = threading.Thread(
            target=self._watch_peer, args=(session,), name="spgc-peer-probe", daemon=True
        )
        thread.start()

    # ------------------------------------------------------------------ H1

    def _run_h1(self, session: threading.Event, deadline: float) -> None:
        if self._peer_channel is None:
            self._peer_channel = make_channel(
                self.cfg.peer_address, self.tls, self.cfg.insecure, server_name=self.cfg.peer_name
            )
        stub = peer_pb2_grpc.PeerStub(self._peer_channel)
        self._handshake(stub, deadline)
        self._paired()
        self._checkpoint_the_start()  # before the link, hence before round 0 opens
        if self._listener is None:  # closed after the last link was taken
            host, _ = split_host_port(self.cfg.gc_address)
            self._listener = garbled_core.Listener(host, self.gc_port)
        # Only the peer's authenticated TLS connection is taken: anything else on the circuit
        # port (a scan, junk, another certificate, silence) is closed and logged, and the
        # listener keeps waiting for the real peer.
        channels = []
        try:
            for _ in range(self.cfg.gc_lanes):
                channels.append(
                    self._listener.accept(
                        timeout=max(1.0, deadline - time.monotonic()),
                        handshake_timeout=GC_HANDSHAKE_TIMEOUT,
                        on_refused=self._gc_refused,
                        **self._gc_tls(),
                    )
                )
                if len(channels) == 1:
                    _agree_on_lanes(
                        channels[0], self.cfg.gc_lanes, self.cfg.workers, self.cfg.peer_name
                    )
        except BaseException as exc:
            for channel in channels:
                channel.close()
            if isinstance(exc, TimeoutError) and "0 connections refused" in str(exc):
                raise TimeoutError(
                    f"{exc}: {self.cfg.peer_name} never dialed it (is {self.cfg.peer_name}'s "
                    f"gc_address this server's gc_address, {self.cfg.gc_address}?)"
                ) from exc
            raise
        self._listener.close()
        self._listener = None
        for channel in channels:
            # The accept's timeout became the link's I/O timeout: what was left of the connect
            # window. The same as H2's side instead, whenever H2 happened to dial.
            channel.timeout = GC_IO_TIMEOUT
        with self._reset_lock:
            self._gc_channels = channels
            if session.is_set():
                raise PeerLost(self._lost_reason)
        self._link = self._open_link("garbler", stub)
        self._link_ready.set()
        # Paired and linked: a loss from here on is waited for. (One before the link is up is
        # not: a data link that never connects must end the run, not repeat it forever.)
        self._session_paired = True
        self._update_readiness()
        if self.precompute is not None:
            self._precompute(stub)
            return
        self._start_watch(session)
        H1Driver(self.state, stub, self._link, session).run()
        if self.state.failure:
            raise PeerMismatchError(self.state.failure)
        if session.is_set() and not self.stop_event.is_set():
            raise PeerLost(self._lost_reason)
        log.info(
            "h1: training %s after %d round(s), %d step(s)",
            "stopped" if self.stop_event.is_set() else "finished",
            self.state.round,
            self.state.steps,
        )

    def _precompute(self, stub: peer_pb2_grpc.PeerStub) -> None:
        """`spgc server precompute` on H1: reconcile, fill the pool, end H2's run."""
        producer = NoiseProducer(self.state, stub, self._link, self.stop_event)
        producer.sync()
        target = self.precompute or producer.target
        started = time.perf_counter()
        try:
            with terminal_logging():  # log lines above the progress line
                reached = producer.fill(target, progress=True)
        except Exception:
            if not self.stop_event.is_set():
                raise
            reached = False  # stopping interrupts the link under a block being made
        if not reached:  # the blocks made are kept: both servers reconcile them on a rerun
            ready = (
                f"{self.state.pool.available:,} of {target:,} noise samples ready in "
                f"{self.cfg.pool_path} (made {producer.samples_made:,} now); run it again to go "
                "on from there"
            )
            if self.stop_event.is_set():  # Ctrl-C, SIGTERM: no failure, but say where it is
                log.info("h1: precompute stopped: %s", ready)
                return
            raise RuntimeError(f"precompute stopped before the pool was full: {ready}")
        producer.end_peer()
        self.state.finish_precompute()
        seconds = time.perf_counter() - started
        log.info(
            "h1: precompute done: %d unused noise samples in %s; made %d in %.1f s "
            "(%.0f samples/s)",
            self.state.pool.available,
            self.cfg.pool_path,
            producer.samples_made,
            seconds,
            producer.samples_made / max(seconds, 1e-9),
        )

    # ------------------------------------------------------------------ H2

    def _run_h2(self, session: threading.Event, deadline: float) -> None:
        # H1's Handshake fixes the run first; after a loss, a NEW one (the flag may still say
        # paired while the reset runs): a link dialed for the old pairing could be taken by
        # a restarted H1 as its new one, then dropped here, leaving H1 with a dead link.
        while not self.peer_servicer.paired or self.peer_servicer.epoch == self._dialed_epoch:
            if self.state.failure:
                raise PeerMismatchError(self.state.failure)
            if self.stop_event.wait(0.1):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"no handshake from {self.cfg.peer_name}")
        epoch = self._dialed_epoch = self.peer_servicer.epoch
        self._checkpoint_the_start()  # before the link: H1 opens no round without it
        host, port = split_host_port(self.cfg.gc_address)
        channels: list[Any] = []
        told = ("", 0.0)  # the last failure logged, and when
        try:
            while len(channels) < self.cfg.gc_lanes:
                try:
                    channels.append(
                        garbled_core.Channel.connect(
                            host, port, timeout=GC_IO_TIMEOUT, **self._gc_tls()
                        )
                    )
                except (OSError, RuntimeError) as exc:
                    if time.monotonic() > deadline or self.stop_event.is_set():
                        raise RuntimeError(
                            f"no data link to {self.cfg.peer_name} at gc_address "
                            f"{self.cfg.gc_address}: {exc}{_gc_address_hint(exc)}"
                        ) from exc
                    if session.is_set() or epoch != self.peer_servicer.epoch:
                        # H1 paired again meanwhile: dial its new listener, with a new deadline.
                        raise PeerLost("re-paired while dialing the data link") from None
                    if str(exc) != told[0] or time.monotonic() - told[1] > 10:
                        log.warning(
                            "%s: data link to %s at %s not open yet: %s%s",
                            self.cfg.role_name,
                            self.cfg.peer_name,
                            self.cfg.gc_address,
                            exc,
                            _gc_address_hint(exc),
                        )
                        told = (str(exc), time.monotonic())
                    time.sleep(0.2)
                    continue
                if len(channels) == 1:
                    _agree_on_lanes(
                        channels[0], self.cfg.gc_lanes, self.cfg.workers, self.cfg.peer_name
                    )
        except BaseException:
            for channel in channels:
                channel.close()
            raise
        with self._reset_lock:
            if session.is_set() or epoch != self.peer_servicer.epoch:
                for channel in channels:
                    channel.close()
                raise PeerLost("re-paired while dialing the data link")
            self._gc_channels = channels
        self._link = self._open_link("evaluator")
        self._link_ready.set()
        self._session_paired = True  # see _run_h1
        self._update_readiness()
        self._start_watch(session)
        self.state.last_peer_call = time.monotonic()
        silence = ""
        with self.state.cond:  # follow until training is over (rounds run in peer calls)
            while not self.state.finished and not self.stop_event.is_set():
                self.state.cond.wait(0.5)
                if session.is_set() or epoch != self.peer_servicer.epoch:
                    raise PeerLost(f"{self.cfg.peer_name} lost")
                if any(t.is_alive() for t in self.peer_servicer.link_users()):
                    # A circuit or noise block is running: the GC link has its own timeout.
                    # Once it is over (done or failed), H1's silence counts again.
                    self.state.last_peer_call = time.monotonic()
                silent = time.monotonic() - self.state.last_peer_call
                if silent > self.cfg.peer_timeout:
                    silence = (
                        f"no call from {self.cfg.peer_name} for {silent:.0f} s (peer_timeout "
                        f"{self.cfg.peer_timeout:g} s): it stopped or is unreachable"
                    )
                    break
        if silence:
            self._reset_for_peer(silence, session)
            raise PeerLost(silence)
        self.peer_servicer.wait_idle()
        if self.state.failure:
            raise PeerMismatchError(self.state.failure)
        log.info(
            "h2: training %s after %d round(s), %d step(s)",
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

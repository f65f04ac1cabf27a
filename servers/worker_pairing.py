"""Pairing the circuit workers (``workers`` > 1, docs/SCALE.md): each server starts its Ray
workers for a pairing, and worker i of H1 is linked to worker i of H2 over a TLS link of its
own; H1 names its workers' addresses to H2 in a PairWorkers call.

:class:`WorkerPairing` is a part of :class:`~spgc.servers.daemon.ServerDaemon`
(servers/daemon.py sets up the fields it uses: ``_workers``, ``_workers_lock``,
``_workers_generation`` and the events that say how far the current pairing's workers got).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import grpc

from spgc.servers.errors import PeerLost, PeerMismatchError, describe_error
from spgc.servers.ray_workers import RayLane, WorkerTls, kill_worker, ray_get, start_workers
from spgc.servers.state import RPC_SLACK
from spgc.wire import peer_pb2, peer_pb2_grpc
from spgc.wire.errors import FailedPreconditionError, NotPairedError, WireError
from spgc.wire.transport import join_host_port, split_host_port

log = logging.getLogger(__name__)


class WorkerPairing:
    """This server's circuit workers of the current pairing, linked to the other server's."""

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
            self.cfg.backend,
            self.cfg.trial_depth,
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
        return [RayLane(a, self.cfg.backend) for a in actors]

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

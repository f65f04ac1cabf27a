"""Pairing with the other server, and pairing again after losing it (two-server modes).

A server notices a lost or restarted peer by probing its health service (``spgc.v1.Peer`` is
SERVING only while paired) or by a failed call; it then closes the data link, drops the round
in progress, goes back to its last checkpoint and waits for the peer (``peer_timeout``).
:class:`PeerPairing` is a part of :class:`~spgc.servers.daemon.ServerDaemon`
(servers/daemon.py sets up the fields it uses); what H1 and H2 each do while paired is
servers/sessions.py's.
"""

from __future__ import annotations

import logging
import threading
import time

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from spgc.servers.errors import PeerLost, describe_error, peer_gone
from spgc.wire.errors import FailedPreconditionError
from spgc.wire.transport import make_channel

log = logging.getLogger(__name__)

# Each server's peer port answers this health service name SERVING only while it is paired with
# the other server: a restarted server says NOT_SERVING (or nothing) until the next Handshake.
PAIRED_HEALTH_SERVICE = "spgc.v1.Peer"
PROBE_INTERVAL = 1.0  # seconds between two probes of the peer's pairing
PROBE_FAILURES = 3  # unanswered probes in a row that mean the peer is gone

#: Times in a row the peer may be lost (and the round run again after a re-pairing) without a
#: model update in between; one more stops the server.
MAX_LOSSES_WITHOUT_PROGRESS = 3


class PeerPairing:
    """The pairing loop: pair, notice a lost peer, reset, pair again."""

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
            self._back_to_last_checkpoint(reason)
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

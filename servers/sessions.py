"""What H1 and H2 each do in one pairing: H1 calls the Handshake, accepts the data link and
drives the rounds (or fills the noise pool, ``spgc server precompute``); H2 waits for the
Handshake, dials the data link and follows the rounds, which run in H1's calls to it
(servers/peer.py).

:class:`PairedSessions` is a part of :class:`~spgc.servers.daemon.ServerDaemon`
(servers/daemon.py sets up the fields it uses); servers/pairing.py runs a session and starts
another after a lost peer.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from functools import partial

import grpc

from spgc import __version__
from spgc.common.progress import terminal_logging
from spgc.privacy.ledger_format import LedgerError
from spgc.servers.checkpoint import CheckpointError
from spgc.servers.coordinator import H1Driver
from spgc.servers.deviation import is_peer_notice
from spgc.servers.errors import PeerLost, PeerMismatchError, describe_error
from spgc.servers.ledger_state import release_counts_problem
from spgc.servers.peer import config_differences
from spgc.servers.pool_sync import NoiseProducer
from spgc.servers.state import RPC_SLACK
from spgc.wire import PEER_PROTOCOL_VERSION, peer_pb2, peer_pb2_grpc
from spgc.wire.errors import is_unavailable
from spgc.wire.transport import make_channel

log = logging.getLogger(__name__)


class PairedSessions:
    """One pairing session at H1 or at H2."""

    # ------------------------------------------------------------------ H1

    def _handshake(self, stub: peer_pb2_grpc.PeerStub, deadline: float) -> None:
        run_id = self.state.run_id or self.cfg.run_id or os.urandom(16).hex()
        # Announced to providers (Hello) only once H2 agreed to it: until then they are told
        # UNAVAILABLE, as by H2, and never learn of a run that may not take place.
        config = self.plan.training_config(run_id)
        hello = peer_pb2.PeerHello(
            protocol_version=PEER_PROTOCOL_VERSION,
            software_version=f"spgc {__version__}",
            role=self.cfg.role,
            config=config,
            round=self.state.round_info(None, None),
            ledger_public_key=self.state.ledger_public_key(),
            ledger_releases=self.state.releases,
            **self._backend_hello_fields(),  # backend: auto: the figures of H1's choice
        )
        answer = self._call_handshake(stub, hello, deadline)
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

    def _call_handshake(
        self, stub: peer_pb2_grpc.PeerStub, hello: peer_pb2.PeerHello, deadline: float
    ) -> peer_pb2.PeerHello:
        """H2's answer to ``hello``, retried while H2 is not up (until ``deadline``)."""
        while True:
            try:
                return stub.Handshake(hello, timeout=10)
            except grpc.RpcError as exc:
                if exc.code() == grpc.StatusCode.FAILED_PRECONDITION:  # H2 compared and refused
                    said = exc.details() or ""
                    if not is_peer_notice(said):  # H2's abort notice says it all as it is
                        said = f"the other server refused to pair: {said}"
                    raise PeerMismatchError(said) from None
                if not is_unavailable(exc) or self.stop_event.is_set():
                    raise PeerMismatchError(self._handshake_refusal(exc)) from None
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{self.cfg.peer_name} did not answer the Handshake at "
                        f"{self.cfg.peer_address}: {describe_error(exc)}"
                    ) from None
                time.sleep(0.2)

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

    def _run_h1(self, session: threading.Event, deadline: float) -> None:
        if self._peer_channel is None:
            self._peer_channel = make_channel(
                self.cfg.peer_address, self.tls, self.cfg.insecure, server_name=self.cfg.peer_name
            )
        stub = peer_pb2_grpc.PeerStub(self._peer_channel)
        # backend: auto: measure the link and fix the backend before the plan is sent
        self._choose_backend(partial(self._call_handshake, stub), deadline)
        self._handshake(stub, deadline)
        self._paired()
        self._checkpoint_the_start()  # before the link, hence before round 0 opens
        channels = self._accept_data_link(deadline)
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
        if self.state.finished and not self.stop_event.is_set():
            self._close_ledger(stub)
        log.info(
            "h1: training %s after %d round(s), %d step(s)",
            "stopped" if self.stop_event.is_set() else "finished",
            self.state.round,
            self.state.steps,
        )

    def _close_ledger(self, stub: peer_pb2_grpc.PeerStub) -> None:
        """Training is over on both servers: the co-signed closing entry, H2's first (Peer
        CloseLedger), then this server's. Without it the ledgers still count every release;
        a verifier then cannot rule out later ones (spgc account exits 3)."""
        state = self.state
        statement, signature = state.close_statement()
        request = peer_pb2.ReleaseStatement(
            run_id=state.run_id,
            round=state.round,
            role=self.cfg.role,
            statement=statement,
            signature=signature,
        )
        try:
            answer = stub.CloseLedger(request, timeout=RPC_SLACK)
        except grpc.RpcError as exc:
            log.warning("h1: the ledger's closing entry was not co-signed: %s", describe_error(exc))
            return
        if answer.statement != statement:
            raise PeerMismatchError("h2 co-signed another closing statement than h1's")
        state.record_close(answer.signature)

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

    def _await_ledger_close(self) -> None:
        """Training is over: H1's CloseLedger call comes next (peer_timeout at most)."""
        state = self.state
        with state.cond:
            closed = state.cond.wait_for(
                lambda: (
                    (state.ledger is not None and state.ledger.closed) or self.stop_event.is_set()
                ),
                self.cfg.peer_timeout,
            )
        if not closed:
            log.warning(
                "h2: no closing entry from %s within peer_timeout %g s: the ledger stays open",
                self.cfg.peer_name,
                self.cfg.peer_timeout,
            )

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
        channels = self._dial_data_link(session, epoch, deadline)
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
        if self.state.finished and not self.stop_event.is_set() and self.precompute is None:
            self._await_ledger_close()
        log.info(
            "h2: training %s after %d round(s), %d step(s)",
            "stopped" if self.stop_event.is_set() else "finished",
            self.state.round,
            self.state.steps,
        )

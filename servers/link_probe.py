"""``backend: auto`` at pairing: H1 measures the link to H2 and the two agree on the backend.

Before H1's Handshake, H1 calls a probe Handshake (``PeerHello.link_probe``): H2 compares the
backends and dials one connection to H1's circuit port, the data link's own path and TLS. On it
H1 times :data:`PINGS` small ping-pongs (the quickest is the round trip) and a bulk transfer to H2
of at most :data:`BULK_BYTES` or :data:`BULK_SECONDS` (bytes over the time less a round trip is
the throughput), then takes :func:`spgc.settings.backend_choice.choose_backend` for the plan's
coordinates. Its Handshake names the chosen backend in the plan and carries the figures; H2 runs
the same function on them and refuses a plan whose backend does not follow. The backend is then
fixed for the run: the ledger headers, the summary and every later pairing name it.

:class:`BackendSelection` is a part of :class:`~spgc.servers.daemon.ServerDaemon`
(servers/daemon.py sets up the fields it uses).
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from typing import Any

import garbled_core
from spgc.servers.checkpoint import config_digest
from spgc.servers.data_link import GC_HANDSHAKE_TIMEOUT, GC_IO_TIMEOUT
from spgc.servers.errors import PeerMismatchError
from spgc.settings.backend_choice import (
    AUTO,
    BackendChoice,
    LinkFigures,
    candidate_label,
    candidates,
    choose_backend,
)
from spgc.wire import PEER_PROTOCOL_VERSION, peer_pb2
from spgc.wire.errors import FailedPreconditionError
from spgc.wire.transport import split_host_port

log = logging.getLogger(__name__)

#: The probe connection's first bytes, both ways: anything else on it is not a probe.
PROBE_MAGIC = b"spgc-link-probe/1"
#: Ping-pongs timed for the round trip (the quickest: a ping only ever waits longer than the
#: link's round trip, for a core on a busy host; the pings of a probe made while the providers
#: started beside it read 12.9 ms by their median on a link shaped to 1 ms).
PINGS = 11
#: The bulk transfer: at most this many bytes, or this many seconds, in chunks of CHUNK.
BULK_BYTES = 8 << 20
BULK_SECONDS = 1.0
CHUNK = 64 << 10
#: Seconds H2 keeps dialing H1's circuit port for the probe.
PROBE_DIAL_SECONDS = 2 * GC_HANDSHAKE_TIMEOUT


def measure_link(channel: Any) -> LinkFigures:
    """H1's end of the probe on ``channel``: the quickest round trip and the throughput to H2."""
    channel.send(PROBE_MAGIC)
    channel.flush()
    if channel.recv(len(PROBE_MAGIC)) != PROBE_MAGIC:
        raise PeerMismatchError("the link probe's connection did not answer as a probe")
    trips = []
    for i in range(PINGS):
        started = time.perf_counter()
        channel.send(struct.pack("<Q", i))
        channel.flush()
        if struct.unpack("<Q", channel.recv(8))[0] != i:
            raise PeerMismatchError("the link probe's ping came back wrong")
        trips.append(time.perf_counter() - started)
    rtt = min(trips)
    chunk = b"\x01" + bytes(CHUNK)  # a flag (1: a chunk follows), then the chunk
    sent = 0
    started = time.perf_counter()
    while sent < BULK_BYTES and time.perf_counter() - started < BULK_SECONDS:
        channel.send(chunk)
        sent += CHUNK
    channel.send(b"\x00")
    channel.flush()
    received = struct.unpack("<Q", channel.recv(8))[0]
    elapsed = time.perf_counter() - started
    if received != sent:
        raise PeerMismatchError(f"the link probe sent {sent} bytes and h2 counted {received}")
    # The last byte arrives half a round trip after it leaves and the count comes back in the
    # other half: what is left is the transfer (at least a tenth of the time, for a link
    # whose round trip the pings overstated).
    transfer = max(elapsed - rtt, elapsed / 10)
    return LinkFigures(rtt_seconds=rtt, bytes_per_second=sent / transfer)


def answer_link_probe(channel: Any) -> int:
    """H2's end of the probe on ``channel``: echo the pings, count the bulk; its byte count."""
    if channel.recv(len(PROBE_MAGIC)) != PROBE_MAGIC:
        raise PeerMismatchError("the link probe's connection did not start as a probe")
    channel.send(PROBE_MAGIC)
    channel.flush()
    for _ in range(PINGS):
        channel.send(channel.recv(8))
        channel.flush()
    received = 0
    while channel.recv(1) == b"\x01":
        channel.recv(CHUNK)
        received += CHUNK
    channel.send(struct.pack("<Q", received))
    channel.flush()
    return received


class BackendSelection:
    """The backend of a run with ``backend: auto``: measured and chosen at H1, checked at H2."""

    def _fix_backend(self, choice: BackendChoice) -> None:
        """The run's backend (and gmw's trial depth, which auto chooses with it) from now on:
        in the plan (whose TrainingConfig and ledger header read them), the data link's sessions
        and the summary."""
        self._backend_choice = choice
        self.cfg.backend = choice.backend
        self.cfg.trial_depth = choice.trial_depth
        self.state.backend_choice = choice
        if self.state.config is not None:  # announced with auto before: announce the choice
            self.state.config = self.plan.training_config(self.state.run_id)

    def _adopt_checkpointed_backend(self, run_id: str, config_sha256: str) -> None:
        """A restart with backend auto continues its run on the backend (and trial depth) the
        run was fixed with: the one whose plan the checkpoint holds (none fits: left auto, and
        the resume refuses the checkpoint as another configuration's)."""
        for backend, depth in candidates(self.cfg.mode, self.cfg.security):
            self.cfg.backend, self.cfg.trial_depth = backend, depth
            if config_digest(self.plan.training_config(run_id)) == config_sha256:
                reason = "the run's, from its checkpoint"
                self._fix_backend(BackendChoice(backend, reason, trial_depth=depth))
                return
        self.cfg.backend, self.cfg.trial_depth = AUTO, None

    def _backend_undecided(self) -> bool:
        return self._requested_backend == AUTO and self._backend_choice is None

    # ------------------------------------------------------------------ H1

    def _choose_backend(self, call: Any, deadline: float) -> None:
        """H1, before its Handshake: with backend auto and no backend fixed yet for this run,
        probe the link to H2 and fix the backend with the least expected round time. ``call``:
        sends a PeerHello as a Handshake (retrying until ``deadline``), returns the answer."""
        if not self._backend_undecided():
            return
        probe = peer_pb2.PeerHello(
            protocol_version=PEER_PROTOCOL_VERSION,
            role=self.cfg.role,
            config=self.plan.training_config(self.state.run_id or ""),
            link_probe=True,
        )
        answer = call(probe, deadline)
        theirs = answer.config.backend
        if theirs != AUTO:
            # The other server set a backend, or fixed this run's at an earlier pairing.
            raise PeerMismatchError(
                f"training configurations differ in: backend (h1 'auto', h2 {theirs!r}): both "
                "servers must set the same backend"
            )
        if self._listener is None:
            host, _ = split_host_port(self.cfg.gc_address)
            self._listener = garbled_core.Listener(host, self.gc_port)
        wait = max(1.0, min(deadline - time.monotonic(), PROBE_DIAL_SECONDS + 5))
        try:
            channel = self._listener.accept(
                timeout=wait,
                handshake_timeout=GC_HANDSHAKE_TIMEOUT,
                on_refused=self._gc_refused,
                **self._gc_tls(),
            )
        except TimeoutError as exc:
            raise PeerMismatchError(
                f"backend auto: {self.cfg.peer_name} opened no link probe to this server's "
                f"gc_address {self.cfg.gc_address} within {wait:.0f} s ({exc}; is "
                f"{self.cfg.peer_name}'s gc_address this server's?)"
            ) from None
        try:
            channel.timeout = GC_IO_TIMEOUT
            link = measure_link(channel)
        finally:
            channel.close()
        choice = choose_backend(AUTO, self.cfg.mode, self.plan.share_dim, link, self.cfg.security)
        self._fix_backend(choice)
        log.info("%s: %s", self.cfg.role_name, choice.log_line())

    def _backend_hello_fields(self) -> dict[str, float]:
        """The figures H1's Handshake carries with a backend it chose (none otherwise)."""
        choice = self._backend_choice
        if choice is None or choice.link is None:
            return {}
        return {
            "link_rtt_seconds": choice.link.rtt_seconds,
            "link_bytes_per_second": choice.link.bytes_per_second,
        }

    # ------------------------------------------------------------------ H2

    def _answer_link_probe(self, hello: peer_pb2.PeerHello) -> peer_pb2.PeerHello:
        """H2: H1's probe Handshake. Answers with this server's plan (its backend: auto while
        undecided) and, while undecided, dials the probe connection for H1 to measure on."""
        if self.cfg.role != 2:
            raise FailedPreconditionError("only h2 answers a link probe")
        config = self.plan.training_config(hello.config.run_id)
        if self._backend_undecided():
            thread = threading.Thread(target=self._dial_link_probe, name="spgc-link-probe")
            thread.daemon = True
            thread.start()
        return peer_pb2.PeerHello(
            protocol_version=PEER_PROTOCOL_VERSION, role=self.cfg.role, config=config
        )

    def _dial_link_probe(self) -> None:
        host, port = split_host_port(self.cfg.gc_address)
        give_up = time.monotonic() + PROBE_DIAL_SECONDS
        while True:
            try:
                channel = garbled_core.Channel.connect(
                    host, port, timeout=GC_IO_TIMEOUT, **self._gc_tls()
                )
                break
            except (OSError, RuntimeError) as exc:
                if time.monotonic() > give_up or self.stop_event.is_set():
                    log.warning("h2: no link probe connection to %s: %s", self.cfg.gc_address, exc)
                    return
                time.sleep(0.2)
        try:
            answer_link_probe(channel)
        except Exception as exc:  # H1 gives up on its side and says why
            log.warning("h2: the link probe failed: %s", exc)
        finally:
            channel.close()

    def _check_backend_choice(self, hello: peer_pb2.PeerHello) -> None:
        """H2, in H1's Handshake: with backend auto still undecided here, H1's plan must name
        the backend that its figures give (the same function, the same figures); it is then
        this run's. FailedPreconditionError (one line) otherwise."""
        if not self._backend_undecided():
            return  # an explicit or fixed backend: the plans' comparison checks it
        chosen = candidate_label((hello.config.backend, hello.config.trial_depth or None))
        if hello.link_bytes_per_second <= 0:
            raise FailedPreconditionError(
                f"backend auto: h1's plan names backend {chosen!r} without the link figures it "
                "follows from"
            )
        link = LinkFigures(hello.link_rtt_seconds, hello.link_bytes_per_second)
        choice = choose_backend(AUTO, self.cfg.mode, self.plan.share_dim, link, self.cfg.security)
        if choice.label != chosen:
            raise FailedPreconditionError(
                f"backend auto: h1's plan names backend {chosen!r}, but its figures "
                f"({link.describe()}, d {self.plan.share_dim:,}) give {choice.label!r}: "
                "refusing the plan"
            )
        self._fix_backend(choice)
        log.info("%s: backend %s checked from h1's figures: %s", "h2", chosen, choice.log_line())

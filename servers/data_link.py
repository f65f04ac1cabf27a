"""The data link between the two servers: ``gc_lanes`` TLS connections that H1 accepts on its
circuit port (``gc_address``) and H2 dials, and the engine session opened on each.

:class:`DataLink` is a part of :class:`~spgc.servers.daemon.ServerDaemon` (servers/daemon.py
sets up the fields it uses); the pairing around it is servers/pairing.py's and
servers/sessions.py's.
"""

from __future__ import annotations

import logging
import struct
import threading
import time
from typing import Any

import garbled_core
from spgc.servers.audit import host_of
from spgc.servers.errors import PeerLost, PeerMismatchError
from spgc.servers.gc_party import PartyLink
from spgc.wire import peer_pb2_grpc
from spgc.wire.transport import split_host_port

log = logging.getLogger(__name__)

GC_HANDSHAKE_TIMEOUT = 10.0  # seconds a connection to the circuit port has to authenticate

#: Seconds the data link waits for the other server's next bytes (either end) before it gives
#: the link up as lost.
GC_IO_TIMEOUT = 10.0


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


class DataLink:
    """Opening the data link to the other server, at either end."""

    def _gc_tls(self) -> dict[str, Any]:
        """The TLS arguments of each data-link connection (none without tls: insecure)."""
        if self.tls is None:
            return {"insecure": True}
        # Providers hold certificates from the same CA: only the peer server's name may
        # open the garbled-circuit link.
        tls = garbled_core.TlsConfig(
            str(self.tls.cert), str(self.tls.key), str(self.tls.ca), peer_name=self.cfg.peer_name
        )
        return {"tls": tls}

    def _gc_refused(self, address: str, reason: str) -> None:
        if self.audit.record(
            "circuit_refused", repeat_key=host_of(address), identity=address, reason=reason
        ):
            log.warning("circuit port: refused a connection from %s: %s", address, reason)

    @property
    def _connections(self) -> int:
        """The data link's connections: one per lane, and in mode preprocessed one more for
        the rounds' exchange (noise production runs on the lanes meanwhile)."""
        return self.plan.gc_lanes + (1 if self.cfg.mode == "preprocessed" else 0)

    def _get_link(self, timeout: float) -> PartyLink:
        if not self._link_ready.wait(timeout) or self._link is None:
            raise RuntimeError("the garbled-circuit link to the other server is not up")
        return self._link

    def _accept_data_link(self, deadline: float) -> list[Any]:
        """H1: the data link's connections from H2 on the circuit port, until ``deadline``
        (time.monotonic())."""
        if self._listener is None:  # closed after the last link was taken
            host, _ = split_host_port(self.cfg.gc_address)
            self._listener = garbled_core.Listener(host, self.gc_port)
        # Only the peer's authenticated TLS connection is taken: anything else on the circuit
        # port (a scan, junk, another certificate, silence) is closed and logged, and the
        # listener keeps waiting for the real peer.
        channels = []
        try:
            for _ in range(self._connections):
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
                        channels[0], self.plan.gc_lanes, self.cfg.workers, self.cfg.peer_name
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
        return channels

    def _dial_data_link(self, session: threading.Event, epoch: int, deadline: float) -> list[Any]:
        """H2: the data link's connections to H1's circuit port, dialed until ``deadline``
        (time.monotonic()); PeerLost if H1 pairs again meanwhile (``session`` ends, or the
        pairing's ``epoch`` moves on)."""
        host, port = split_host_port(self.cfg.gc_address)
        channels: list[Any] = []
        told = ("", 0.0)  # the last failure logged, and when
        try:
            while len(channels) < self._connections:
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
                        channels[0], self.plan.gc_lanes, self.cfg.workers, self.cfg.peer_name
                    )
        except BaseException:
            for channel in channels:
                channel.close()
            raise
        return channels

    def _open_link(self, role: str, stub: peer_pb2_grpc.PeerStub | None = None) -> PartyLink:
        """The data link to the other server: an engine session on it, except in dng, which
        only exchanges the two noisy shares over the raw channel (no garbled circuit).
        ``stub``: H1's control channel to H2, which pairs the workers when workers > 1."""
        if self.cfg.mode == "dng":
            return PartyLink(role, self._gc_channels[0], None)
        lane_channels = self._gc_channels[: self.plan.gc_lanes]
        lanes = [
            PartyLink.open(
                role,
                ch,
                scheme=self.cfg.garbling_scheme,
                ot_k=self.cfg.ot_k,
                backend=self.cfg.backend,
                security=self.cfg.security,
                trial_depth=self.cfg.trial_depth,
            )
            for ch in lane_channels
        ]
        lanes[0].extra_lanes = lanes[1:]  # rounds run on every lane; a noise block on lane 0
        if len(self._gc_channels) > len(lane_channels):  # mode preprocessed
            lanes[0].exchange_channel = self._gc_channels[-1]
        if self.cfg.workers > 1:
            lanes[0].remote_lanes = self._pair_workers(role, stub)
        return lanes[0]

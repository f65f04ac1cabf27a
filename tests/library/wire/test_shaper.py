"""spgc.wire.shaper: the WAN shaper's proxy delays each direction by half the round trip and
paces bytes to the configured rate, and passes the bytes through unchanged."""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Iterator

import pytest

from spgc.wire.shaper import Pacer, Shaper


@pytest.fixture
def echo_server() -> Iterator[tuple[str, int]]:
    """A loopback server that echoes each connection's bytes until EOF, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                while data := conn.recv(1 << 16):
                    conn.sendall(data)

    threading.Thread(target=serve, daemon=True).start()
    yield listener.getsockname()[:2]
    listener.close()


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    out = bytearray()
    while len(out) < n:
        got = sock.recv(n - len(out))
        assert got, "the proxy closed the connection early"
        out += got
    return bytes(out)


def test_a_round_trip_through_the_proxy_takes_at_least_the_configured_rtt(echo_server) -> None:
    rtt = 0.2
    with Shaper() as shaper:
        address = shaper.proxy(echo_server, Pacer(rtt / 2), Pacer(rtt / 2))
        with socket.create_connection(address) as sock:
            start = time.monotonic()
            sock.sendall(b"ping")
            assert _recv_exactly(sock, 4) == b"ping"
            assert time.monotonic() - start >= rtt


def test_the_proxy_paces_bytes_to_the_rate_and_keeps_them_intact(echo_server) -> None:
    payload = os.urandom(300_000)  # 0.3 s at 8 Mbit/s in each direction
    forward, backward = Pacer(0.0, mbit=8.0), Pacer(0.0, mbit=8.0)
    with Shaper() as shaper:
        address = shaper.proxy(echo_server, forward, backward)
        with socket.create_connection(address) as sock:
            start = time.monotonic()
            sender = threading.Thread(target=sock.sendall, args=(payload,))
            sender.start()
            echoed = _recv_exactly(sock, len(payload))
            elapsed = time.monotonic() - start
            sender.join()
    assert echoed == payload
    assert elapsed >= len(payload) / 1e6  # the whole payload crossed the 1 MB/s wire
    assert forward.bytes >= len(payload) and backward.bytes >= len(payload)


def test_pacer_refuses_negative_settings() -> None:
    with pytest.raises(ValueError, match=">= 0"):
        Pacer(-1.0)

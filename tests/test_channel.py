"""The garbled-circuit data link: plaintext/TLS round trips, counters, failures."""

from __future__ import annotations

import os
import socket
import threading
import time

import pytest
from helpers import Background
from helpers import tls_config as tls_for

from garbled_core import _core


def _round_trip(server_kw, client_kw):
    payload = os.urandom(3_000_000)
    listener = _core.Listener("127.0.0.1", 0)

    def server():
        with listener.accept(timeout=10, **server_kw) as ch:
            ch.phase = "tables"
            data = ch.recv(len(payload))
            ch.phase = "outputs"
            ch.send(data[::-1])
            ch.send(b"x" * 10)
            ch.flush()
            ch.phase = "setup"
            ch.recv(1)  # wait for the client's goodbye before closing
            return ch.counters(), ch.is_tls

    bg = Background(server)
    ch = _core.Channel.connect("127.0.0.1", listener.port, timeout=10, **client_kw)
    ch.phase = "tables"
    for i in range(0, len(payload), 100_000):  # several pieces through the buffer
        ch.send(payload[i : i + 100_000])
    ch.phase = "outputs"
    assert ch.recv(len(payload)) == payload[::-1]
    assert ch.recv(10) == b"x" * 10
    ch.phase = "setup"
    ch.send(b"!")
    ch.flush()
    server_counters, server_tls = bg.result()
    listener.close()

    n = len(payload)
    client_counters = ch.counters()
    assert set(client_counters) == set(_core.PHASES)
    assert client_counters["tables"] == {"sent": n, "received": 0}
    assert client_counters["outputs"] == {"sent": 0, "received": n + 10}
    assert client_counters["setup"] == {"sent": 1, "received": 0}
    assert server_counters["tables"] == {"sent": 0, "received": n}
    assert server_counters["outputs"] == {"sent": n + 10, "received": 0}
    assert ch.bytes_sent == n + 1 and ch.bytes_received == n + 10
    ch.reset_counters()
    assert ch.bytes_sent == 0 and ch.counters()["tables"]["sent"] == 0
    is_tls = ch.is_tls
    ch.close()
    assert ch.closed
    return is_tls, server_tls


def test_plaintext_round_trip_and_counters():
    assert _round_trip({"insecure": True}, {"insecure": True}) == (False, False)


def test_tls_round_trip_and_counters(pki):
    assert _round_trip({"tls": tls_for(pki, "h1")}, {"tls": tls_for(pki, "h2")}) == (
        True,
        True,
    )


def test_from_socket_tls(pki):
    a, b = socket.socketpair()
    with a, b:
        bg = Background(
            lambda: _core.Channel.from_socket(a.fileno(), True, tls=tls_for(pki, "h1"), timeout=10)
        )
        cb = _core.Channel.from_socket(b, False, tls=tls_for(pki, "h2"), timeout=10)
        ca = bg.result()
        ca.send(b"hello")
        ca.flush()
        assert cb.recv(5) == b"hello"
        ca.close()
        cb.close()


def test_tls_required_unless_insecure(pki):
    listener = _core.Listener()
    with pytest.raises(ValueError, match="TLS is required"):
        listener.accept(timeout=0.1)
    with pytest.raises(ValueError, match="TLS is required"):
        _core.Channel.connect("127.0.0.1", listener.port, timeout=0.1)
    with pytest.raises(ValueError, match="TLS is required"):
        _core.Channel.from_socket(0, True)
    with pytest.raises(ValueError):
        _core.Channel.connect("127.0.0.1", listener.port, tls=tls_for(pki, "h2"), insecure=True)
    listener.close()


def test_tls_config_missing_file(pki, tmp_path):
    cert, key = pki["h1"]
    missing = str(tmp_path / "nope.pem")
    with pytest.raises(ValueError, match=r"nope\.pem"):
        _core.TlsConfig(cert, missing, pki["ca"])
    cfg = _core.TlsConfig(cert, key, pki["ca"])
    assert (cfg.cert, cfg.key, cfg.ca) == (cert, key, pki["ca"])


@pytest.mark.parametrize("bad_side", ["client_cert", "server_cert", "client_pki"])
def test_certificate_from_other_ca_fails_on_both_sides(pki, bad_side):
    # *_cert: that side presents a certificate from an unrelated CA but trusts the right CA;
    # client_pki: the client lives entirely in the unrelated PKI.
    if bad_side == "server_cert":
        server_tls = _core.TlsConfig(*pki["other:h1"], pki["ca"])
    else:
        server_tls = tls_for(pki, "h1")
    if bad_side == "client_cert":
        client_tls = _core.TlsConfig(*pki["other:h2"], pki["ca"])
    elif bad_side == "client_pki":
        client_tls = tls_for(pki, "other:h2", "other_ca")
    else:
        client_tls = tls_for(pki, "h2")
    listener = _core.Listener()
    start = time.monotonic()
    bg = Background(lambda: listener.accept(tls=server_tls, timeout=10))
    with pytest.raises(_core.TlsError) as client_err:
        _core.Channel.connect("127.0.0.1", listener.port, tls=client_tls, timeout=10)
    with pytest.raises(_core.TlsError) as server_err:
        bg.result()
    assert time.monotonic() - start < 5
    assert "TLS handshake failed" in str(client_err.value)
    assert "TLS handshake failed" in str(server_err.value)
    assert isinstance(client_err.value, _core.ChannelError)
    assert isinstance(client_err.value, ConnectionError)
    listener.close()


@pytest.mark.parametrize("use_tls", [False, True])
def test_peer_closes_mid_recv(pki, use_tls):
    listener = _core.Listener()
    server_kw = {"tls": tls_for(pki, "h1")} if use_tls else {"insecure": True}
    client_kw = {"tls": tls_for(pki, "h2")} if use_tls else {"insecure": True}

    def server():
        ch = listener.accept(timeout=10, **server_kw)
        ch.send(b"a" * 1000)
        time.sleep(0.2)
        ch.close()

    bg = Background(server)
    ch = _core.Channel.connect("127.0.0.1", listener.port, timeout=30, **client_kw)
    ch.phase = "inputs"
    start = time.monotonic()
    with pytest.raises(_core.PeerClosedError, match="during inputs"):
        ch.recv(100_000)
    assert time.monotonic() - start < 3
    bg.result()
    ch.close()
    listener.close()


def test_peer_closes_while_sending():
    listener = _core.Listener()
    bg = Background(lambda: listener.accept(insecure=True, timeout=10).close())
    ch = _core.Channel.connect("127.0.0.1", listener.port, insecure=True, timeout=10)
    bg.result()
    chunk = b"\0" * (1 << 20)
    with pytest.raises(_core.PeerClosedError):
        for _ in range(200):  # never SIGPIPE; EPIPE/ECONNRESET surfaces as PeerClosedError
            ch.send(chunk)
    ch.close()  # after a failure: closes without raising again
    listener.close()


@pytest.mark.parametrize("use_tls", [False, True])
def test_stalled_peer_times_out(pki, use_tls):
    listener = _core.Listener()
    server_kw = {"tls": tls_for(pki, "h1")} if use_tls else {"insecure": True}
    client_kw = {"tls": tls_for(pki, "h2")} if use_tls else {"insecure": True}
    release = threading.Event()

    def server():
        ch = listener.accept(timeout=10, **server_kw)
        release.wait(10)  # silent peer
        ch.close()

    bg = Background(server)
    ch = _core.Channel.connect("127.0.0.1", listener.port, timeout=10, **client_kw)
    ch.timeout = 1.0
    assert ch.timeout == 1.0
    ch.phase = "tables"
    start = time.monotonic()
    expected = "no data from peer for 1 s during tables"
    with pytest.raises(_core.ChannelTimeoutError, match=expected) as err:
        ch.recv(16)
    elapsed = time.monotonic() - start
    assert 0.9 <= elapsed < 5
    assert isinstance(err.value, TimeoutError)
    release.set()
    bg.result()
    ch.close()
    listener.close()


def test_accept_and_connect_time_out():
    listener = _core.Listener()
    start = time.monotonic()
    with pytest.raises(_core.ChannelTimeoutError):
        listener.accept(insecure=True, timeout=0.5)
    port = listener.port
    listener.close()
    with pytest.raises(_core.ChannelTimeoutError):
        _core.Channel.connect("127.0.0.1", port, insecure=True, timeout=0.5)
    assert time.monotonic() - start < 5


@pytest.mark.parametrize("use_tls", [False, True])
def test_both_sides_sending_at_once_do_not_deadlock(pki, use_tls):
    """Each side sends 48 MB before reading anything: far more than the socket
    buffers hold. A blocked writer reads ahead, so both finish."""
    size = 48 * 1024 * 1024
    listener = _core.Listener("127.0.0.1", 0)
    kw_s = {"tls": tls_for(pki, "h1")} if use_tls else {"insecure": True}
    kw_c = {"tls": tls_for(pki, "h2")} if use_tls else {"insecure": True}
    payload_s, payload_c = os.urandom(size), os.urandom(size)

    def server():
        with listener.accept(timeout=10, **kw_s) as ch:
            ch.send(payload_s)
            ch.flush()
            return ch.recv(size)

    side = Background(server)
    with _core.Channel.connect("127.0.0.1", listener.port, timeout=10, **kw_c) as ch:
        ch.send(payload_c)
        ch.flush()
        got_c = ch.recv(size)
    got_s = side.result(timeout=60)
    assert got_c == payload_s
    assert got_s == payload_c


@pytest.mark.parametrize("server_expects", ["h2", "p1"])
def test_peer_name_is_checked(pki, server_expects):
    """With peer_name set, a certificate from the right CA but for another party is refused:
    a provider's certificate must not open the servers' garbled-circuit link."""
    listener = _core.Listener("127.0.0.1", 0)
    h1_cert, h1_key = pki["h1"]
    h2_cert, h2_key = pki["h2"]
    server_tls = _core.TlsConfig(h1_cert, h1_key, pki["ca"], peer_name=server_expects)
    client_tls = _core.TlsConfig(h2_cert, h2_key, pki["ca"], peer_name="h1")
    bg = Background(lambda: listener.accept(tls=server_tls, timeout=10))
    if server_expects == "h2":
        with _core.Channel.connect("127.0.0.1", listener.port, tls=client_tls, timeout=10) as ch:
            assert ch.is_tls
        bg.result().close()
    else:
        with pytest.raises(_core.TlsError):
            _core.Channel.connect("127.0.0.1", listener.port, tls=client_tls, timeout=10)
        with pytest.raises(_core.TlsError, match=r"expected name|hostname"):
            bg.result()

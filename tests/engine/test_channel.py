"""The garbled-circuit data link: plaintext/TLS round trips, counters, failures."""

from __future__ import annotations

import os
import socket
import ssl
import threading
import time

import pytest
from helpers import Background
from helpers import tls_config as tls_for

from garbled_core import _core
from spgc.protocol.certs import make_dev_pki


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


@pytest.mark.parametrize("use_tls", [False, True])
def test_small_and_large_messages_keep_their_order(pki, use_tls):
    """Messages below the direct-send size are buffered, larger ones go out from the caller's
    memory after what is pending: on the wire the order is the order of the sends, whatever
    the sizes, and the receiver may read it in pieces of any size."""
    sizes = [1, 65535, 65536, 3, 200_000, 7, 1 << 20, 10, (1 << 20) + 1, 5, 64 << 10, 65537]
    messages = [os.urandom(n) for n in sizes]
    stream = b"".join(messages)
    server_kw = {"tls": tls_for(pki, "h1")} if use_tls else {"insecure": True}
    client_kw = {"tls": tls_for(pki, "h2")} if use_tls else {"insecure": True}
    listener = _core.Listener("127.0.0.1", 0)

    def server():
        with listener.accept(timeout=10, **server_kw) as ch:
            ch.phase = "tables"
            got = [ch.recv(n) for n in (len(stream) // 3, 70_001, 1)]
            got.append(ch.recv(len(stream) - sum(len(g) for g in got)))
            ch.send(b"k")
            ch.flush()
            return b"".join(got), ch.counters()["tables"]["received"]

    bg = Background(server)
    with _core.Channel.connect("127.0.0.1", listener.port, timeout=10, **client_kw) as ch:
        ch.phase = "tables"
        for m in messages:
            ch.send(m)
        assert ch.recv(1) == b"k"  # recv flushes what is still buffered
        assert ch.counters()["tables"]["sent"] == len(stream)
    received, counted = bg.result()
    listener.close()
    assert received == stream
    assert counted == len(stream)


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
    # The client sees a TlsError; the listener refuses the connection, reports it and goes on
    # waiting: for the real peer when only the client is wrong, else until its timeout, whose
    # message carries the refusal.
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
    refusals = _Refusals()
    start = time.monotonic()
    bg = _accept_and_echo(listener, server_tls, refusals, timeout=2)
    with pytest.raises(_core.TlsError) as client_err:
        _core.Channel.connect("127.0.0.1", listener.port, tls=client_tls, timeout=10)
    assert "TLS handshake failed" in str(client_err.value)
    assert isinstance(client_err.value, _core.ChannelError)
    assert isinstance(client_err.value, ConnectionError)
    ((_, reason),) = refusals.wait(1)
    assert "TLS handshake failed" in reason
    if bad_side == "server_cert":
        expected = r"1 connection refused; last: TLS handshake failed"
        with pytest.raises(_core.ChannelTimeoutError, match=expected):
            bg.result()
    else:
        _peer_exchange(listener.port, tls_for(pki, "h2"))
        assert bg.result() == b"hello"
    assert time.monotonic() - start < 5
    assert listener.refused == 1
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
    bg = Background(lambda: listener.accept(tls=server_tls, timeout=1.5))
    if server_expects == "h2":
        with _core.Channel.connect("127.0.0.1", listener.port, tls=client_tls, timeout=10) as ch:
            assert ch.is_tls
        bg.result().close()
        assert listener.refused == 0
    else:
        with pytest.raises(_core.TlsError):
            _core.Channel.connect("127.0.0.1", listener.port, tls=client_tls, timeout=10)
        expected = r"1 connection refused; last: .*expected name"
        with pytest.raises(_core.ChannelTimeoutError, match=expected):
            bg.result()
        assert listener.refused == 1


# ---- the listener authenticates each connection before returning it ------------------------
# Each case ends with the real peer (h2) connecting and data flowing both ways.


class _Refusals:
    """on_refused callback that records (peer_address, reason) and lets the test wait."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.times: list[float] = []
        self._cond = threading.Condition()

    def __call__(self, peer: str, reason: str) -> None:
        with self._cond:
            self.calls.append((peer, reason))
            self.times.append(time.monotonic())
            self._cond.notify_all()

    def wait(self, n: int, timeout: float = 5.0) -> list[tuple[str, str]]:
        with self._cond:
            assert self._cond.wait_for(lambda: len(self.calls) >= n, timeout), self.calls
            return list(self.calls)


def _accept_and_echo(listener, tls, refusals, **kw):
    """Accepts in the background; on the returned channel: receives 5 bytes, sends them back
    reversed plus '!', waits for the peer's goodbye. result() is the 5 bytes received."""

    def server():
        with listener.accept(tls=tls, on_refused=refusals, **kw) as ch:
            got = ch.recv(5)
            ch.send(got[::-1] + b"!")
            ch.flush()
            ch.recv(1)
            return got

    return Background(server)


def _peer_exchange(port, tls):
    with _core.Channel.connect("127.0.0.1", port, tls=tls, timeout=5) as ch:
        ch.send(b"hello")
        assert ch.recv(6) == b"olleh!"
        ch.send(b".")


def _tcp(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    return s, f"127.0.0.1:{s.getsockname()[1]}"


def _closed_by_server(sock, timeout=3.0):
    """True once the server closed the socket (EOF or reset; a TLS alert may come first)."""
    sock.settimeout(timeout)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    return True


@pytest.fixture(scope="module")
def gc_pki(tmp_path_factory):
    """h1, h2 and a provider-like p1 from one CA; the unrelated CA's h2 from `pki`."""
    made = make_dev_pki(tmp_path_factory.mktemp("gc_pki"), ["h1", "h2", "p1"])
    ca = str(made["h1"].ca)

    def cfg(name, peer_name=""):
        return _core.TlsConfig(str(made[name].cert), str(made[name].key), ca, peer_name=peer_name)

    return cfg, ca


def test_junk_connection_is_refused_then_peer_accepted(gc_pki):
    cfg, _ = gc_pki
    listener = _core.Listener()
    refusals = _Refusals()
    bg = _accept_and_echo(listener, cfg("h1", "h2"), refusals, timeout=10, handshake_timeout=2)
    junk, junk_addr = _tcp(listener.port)
    with junk:
        junk.sendall(b"GET / HTTP/1.0\r\n\r\n" + os.urandom(64))
        ((peer, reason),) = refusals.wait(1)
        assert _closed_by_server(junk)
    assert peer == junk_addr
    assert "TLS handshake failed" in reason
    _peer_exchange(listener.port, cfg("h2", "h1"))
    assert bg.result() == b"hello"
    assert len(refusals.calls) == 1
    assert listener.refused == 1
    listener.close()


def test_silent_connection_is_refused_after_handshake_timeout(gc_pki):
    cfg, _ = gc_pki
    listener = _core.Listener()
    refusals = _Refusals()
    bg = _accept_and_echo(listener, cfg("h1", "h2"), refusals, timeout=10, handshake_timeout=0.5)
    start = time.monotonic()  # before it connects: its handshake's 0.5 s start after this
    silent, silent_addr = _tcp(listener.port)
    with silent:
        ((peer, reason),) = refusals.wait(1)
        assert 0.45 <= refusals.times[0] - start < 2.5
        assert _closed_by_server(silent)
    assert peer == silent_addr
    assert reason == "TLS handshake with peer did not finish within 0.5 s"
    _peer_exchange(listener.port, cfg("h2", "h1"))
    assert bg.result() == b"hello"
    assert listener.refused == 1
    listener.close()


def test_silent_connection_does_not_hold_up_the_peer(gc_pki):
    """Handshakes run side by side: the real peer gets through while a silent connection
    still has most of its handshake timeout left; that one is closed and reported after."""
    cfg, _ = gc_pki
    listener = _core.Listener()
    refusals = _Refusals()
    bg = _accept_and_echo(listener, cfg("h1", "h2"), refusals, timeout=10, handshake_timeout=8)
    silent, silent_addr = _tcp(listener.port)
    with silent:
        time.sleep(0.1)  # the listener has taken it and is waiting for its ClientHello
        start = time.monotonic()
        _peer_exchange(listener.port, cfg("h2", "h1"))
        assert time.monotonic() - start < 5  # not held up for the silent one's 8 s
        assert bg.result() == b"hello"
        assert refusals.calls == [
            (silent_addr, "closed unauthenticated: the peer authenticated on another connection")
        ]
        assert _closed_by_server(silent)
    assert listener.refused == 1
    listener.close()


def test_wrong_ca_and_wrong_name_are_refused_then_peer_accepted(pki, gc_pki):
    cfg, ca = gc_pki
    listener = _core.Listener()
    refusals = _Refusals()
    start = time.monotonic()
    bg = _accept_and_echo(listener, cfg("h1", "h2"), refusals, timeout=10, handshake_timeout=2)
    # A certificate from another CA (the client itself trusts the right CA)...
    other_ca_client = _core.TlsConfig(*pki["other:h2"], ca, peer_name="h1")
    with pytest.raises(_core.TlsError, match="TLS handshake failed"):
        _core.Channel.connect("127.0.0.1", listener.port, tls=other_ca_client, timeout=5)
    refusals.wait(1)
    # ... and the right CA's certificate for another party (a provider).
    with pytest.raises(_core.TlsError, match="TLS handshake failed"):
        _core.Channel.connect("127.0.0.1", listener.port, tls=cfg("p1", "h1"), timeout=5)
    (_, other_ca_reason), (_, wrong_name_reason) = refusals.wait(2)
    assert "TLS handshake failed" in other_ca_reason
    assert "unable to get local issuer certificate" in other_ca_reason
    assert "TLS handshake failed" in wrong_name_reason
    assert "not issued to the expected name" in wrong_name_reason
    _peer_exchange(listener.port, cfg("h2", "h1"))
    assert bg.result() == b"hello"
    assert listener.refused == 2
    assert time.monotonic() - start < 5
    listener.close()


def test_client_without_certificate_is_refused_then_peer_accepted(gc_pki):
    cfg, ca = gc_pki
    listener = _core.Listener()
    refusals = _Refusals()
    bg = _accept_and_echo(listener, cfg("h1", "h2"), refusals, timeout=10, handshake_timeout=2)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_verify_locations(ca)
    ctx.check_hostname = False  # the server's certificate is checked against the CA only
    raw, addr = _tcp(listener.port)
    with ctx.wrap_socket(raw) as tls_sock:  # TLS 1.3: the client finishes before the server checks
        ((peer, reason),) = refusals.wait(1)
        with pytest.raises((ssl.SSLError, ConnectionError)):
            tls_sock.settimeout(3)
            if not tls_sock.recv(1):
                raise ConnectionResetError("closed")
    assert peer == addr
    assert "TLS handshake failed" in reason and "certificate" in reason
    _peer_exchange(listener.port, cfg("h2", "h1"))
    assert bg.result() == b"hello"
    assert listener.refused == 1
    listener.close()


def test_only_junk_times_out_counting_refusals(gc_pki):
    cfg, _ = gc_pki
    listener = _core.Listener()
    refusals = _Refusals()
    port = listener.port
    # All three wait in the listen queue before the accept and its 1 s start: none can come
    # after that second because the test's thread was slow.
    socks = []
    junk, _ = _tcp(port)  # junk, then stays open
    junk.sendall(b"\x00junk" * 20)
    socks.append(junk)
    scan, _ = _tcp(port)  # a port scan: connects and goes
    scan.close()
    silent, _ = _tcp(port)  # says nothing: the 0.5 s handshake timeout
    socks.append(silent)
    start = time.monotonic()
    bg = Background(
        lambda: listener.accept(
            tls=cfg("h1", "h2"), timeout=1.0, handshake_timeout=0.5, on_refused=refusals
        )
    )
    with pytest.raises(_core.ChannelTimeoutError) as err:
        bg.result()
    assert time.monotonic() - start < 3
    for s in socks:
        s.close()
    msg = str(err.value)
    assert msg.startswith(f"no authenticated connection on 127.0.0.1:{port} within 1 s")
    assert "(3 connections refused; last: " in msg
    assert isinstance(err.value, TimeoutError)
    assert listener.refused == 3
    assert len(refusals.calls) == 3
    reasons = sorted(r for _, r in refusals.calls)
    assert any("did not finish within 0.5 s" in r for r in reasons), reasons
    assert any("peer closed the connection" in r for r in reasons), reasons
    listener.close()


def test_tls_accept_timeout_without_connections(gc_pki):
    cfg, _ = gc_pki
    listener = _core.Listener()
    start = time.monotonic()
    with pytest.raises(_core.ChannelTimeoutError, match=r"within 0.3 s \(0 connections refused\)$"):
        listener.accept(tls=cfg("h1", "h2"), timeout=0.3)
    assert time.monotonic() - start < 5
    assert listener.refused == 0
    listener.close()


def test_on_refused_exception_propagates(gc_pki):
    cfg, _ = gc_pki
    listener = _core.Listener()

    def boom(peer, reason):
        raise RuntimeError(f"refused {peer}: {reason}")

    bg = Background(lambda: listener.accept(tls=cfg("h1", "h2"), timeout=5, on_refused=boom))
    junk, addr = _tcp(listener.port)
    with junk:
        junk.sendall(b"junk" * 10)
        with pytest.raises(RuntimeError, match=f"refused {addr}: TLS handshake failed"):
            bg.result()
    assert listener.refused == 1
    with pytest.raises(TypeError, match="on_refused"):
        listener.accept(tls=cfg("h1", "h2"), timeout=0.1, on_refused=42)
    listener.close()


def test_round_trips_count_the_turns_from_sending_to_receiving():
    """Channel.round_trips: a receive after a send since the previous receive is one round trip
    (by the calls, so the same on any link); receives in a row and sends in a row are not."""
    listener = _core.Listener("127.0.0.1", 0)

    def server():
        with listener.accept(timeout=10, insecure=True) as ch:
            for _ in range(3):  # echo three messages, one at a time
                ch.send(ch.recv(4))
            ch.recv(2)
            ch.send(b"zz")
            ch.flush()
            return ch.round_trips

    side = Background(server)
    with _core.Channel.connect("127.0.0.1", listener.port, timeout=10, insecure=True) as ch:
        assert ch.round_trips == 0
        for i in range(3):
            ch.send(b"ab%02d" % i)
            assert ch.recv(4) == b"ab%02d" % i
        assert ch.round_trips == 3
        ch.send(b"x")
        ch.send(b"y")  # two sends, then one receive: one turn
        assert ch.recv(2) == b"zz"
        assert ch.round_trips == 4
        ch.reset_counters()
        assert ch.round_trips == 0
    # the server received first (no send before it), then turned after each echo
    assert side.result() == 3
    listener.close()

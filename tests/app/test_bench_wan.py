"""`spgc bench wan`: its pieces (the shaped routes the daemons dial, the steady state read from
H1's round history, the table) and its argument checks; the shaper itself is in
test_shaper.py."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from spgc.app.bench_wan import shaped_route, steady_state, table
from spgc.app.demo import DemoOptions, write_configs
from spgc.wire.shaper import Shaper

SPGC = Path(sys.executable).parent / "spgc"


def test_every_server_to_server_link_goes_through_the_shaper(tmp_path: Path) -> None:
    """H1's peer_address, H2's peer_address and H2's gc_address are proxies; H1 still listens
    on the real gc port; the providers' addresses are untouched."""
    routed: dict[str, str] = {}

    def route(link: str, address: str) -> str:
        routed[link] = address
        return f"127.0.0.1:{1000 + len(routed)}"

    (h1, h2), providers = write_configs(
        DemoOptions(rounds=2, insecure=True, peer_route=route), tmp_path
    )
    c1, c2 = yaml.safe_load(h1.read_text()), yaml.safe_load(h2.read_text())
    p1 = yaml.safe_load(providers[0].read_text())
    assert set(routed) == {"peer-h1", "peer-h2", "gc"}
    assert c1["peer_address"] != c2["peer_listen"] and c2["peer_address"] != c1["peer_listen"]
    assert routed["peer-h2"] == c2["peer_listen"] and routed["peer-h1"] == c1["peer_listen"]
    assert routed["gc"] == c1["gc_address"] != c2["gc_address"]
    assert p1["h1"]["address"] == c1["listen"] and p1["h2"]["address"] == c2["listen"]


def test_a_shaped_route_delays_a_link_by_its_round_trip() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    served = threading.Event()

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.sendall(conn.recv(16))
        served.set()

    threading.Thread(target=serve, daemon=True).start()
    host, port = listener.getsockname()[:2]
    with Shaper() as shaper:
        address = shaped_route(shaper, 120.0, 0.0)("gc", f"{host}:{port}")
        proxy_host, _, proxy_port = address.rpartition(":")
        with socket.create_connection((proxy_host, int(proxy_port))) as sock:
            start = time.monotonic()
            sock.sendall(b"x")
            assert sock.recv(16) == b"x"
            assert time.monotonic() - start >= 0.120
    assert served.wait(5)
    listener.close()


def test_steady_state_is_the_median_after_the_warmup() -> None:
    history = [
        {"round": t, "published": True, "opened_at": at, "gc_bytes": 100 * (t + 1),
         "seconds": {"intake": 0.1 * (t + 1), "exchange": 0.01}}
        for t, at in enumerate([0.0, 5.0, 6.0, 7.5, 8.5, 9.0])
    ]  # fmt: skip
    history[3]["seconds"]["noise_wait"] = 0.2  # the only round that found the pool empty
    for r in history:  # after the next round opened: not part of the interval's rest
        r["seconds"]["checkpoint"] = 0.7
    out = steady_state(history, warmup=2)
    # intervals of rounds 2, 3, 4 (round 5 has no successor): 1.5, 1.0, 0.5
    assert out["round_s"] == pytest.approx(1.0) and out["round_s_mean"] == pytest.approx(1.0)
    assert out["rounds"] == 4
    assert out["intake"] == pytest.approx(0.45)
    assert out["exchange"] == pytest.approx(0.01) and out["circuit"] is None
    # the rest of each interval: 1.5 - 0.31, 1.0 - 0.61, 0.5 - 0.51 (the checkpoint overlaps
    # the next round, whose opening comes first)
    assert out["other"] == pytest.approx(0.39) and out["checkpoint"] == pytest.approx(0.7)
    assert out["noise_wait"] == 0.0 and out["noise_waits"] == 1  # 0 in the rounds not waiting
    text = table([{**out, "mode": "preprocessed", "rtt_ms": 50.0, "mbit": 0.0, "load_1min": 1.0}])
    assert "unlimited" in text and "preprocessed" in text and "1.000" in text
    assert "0.000 (1)" in text


def test_bench_wan_refuses_an_unknown_mode() -> None:
    done = subprocess.run(
        [str(SPGC), "bench", "wan", "--modes", "gc,fast"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2
    assert "modes are gc, gmw, preprocessed" in done.stderr and "Traceback" not in done.stderr

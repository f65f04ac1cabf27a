"""A party whose peer dies or stalls mid-run gets a clear error, never a hang."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from helpers import TEST_DIRS, Background, wait_until

from garbled_core import (
    ChannelError,
    ChannelTimeoutError,
    CircuitBuilder,
    Garbler,
    Listener,
    ProtocolError,
)

TESTS_DIR = os.pathsep.join(str(d) for d in TEST_DIRS)
PEER = textwrap.dedent(
    """
    import os, sys, time, numpy as np
    from garbled_core import Channel, Evaluator, Garbler
    role, port, n, mode, tests_dir = sys.argv[1:6]
    port, n, stall = int(port), int(n), mode == "stall"
    sys.path[:0] = tests_dir.split(os.pathsep)
    from test_engine_failures import bench_circuit
    ch = Channel.connect("127.0.0.1", port, insecure=True, timeout=10)
    if stall:
        time.sleep(60)  # connected, says nothing
    party = Evaluator(ch) if role == "evaluator" else Garbler(ch)
    values = np.arange(n, dtype=np.uint64) & np.uint64(0xFFFFFFFF)
    party.run(bench_circuit(), {"b" if role == "evaluator" else "a": values})
    """
)


def bench_circuit():
    b = CircuitBuilder("failures")
    a = b.input("a", owner="garbler", width=32)
    x = b.input("b", owner="evaluator", width=32)
    d = b.sub(a, x)
    b.output("y", b.mux(b.lt_signed(d, a), d, a), reveal="both")
    return b.build()


def start_peer(role: str, port: int, n: int, stall: bool = False) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            PEER,
            role,
            str(port),
            str(n),
            "stall" if stall else "run",
            TESTS_DIR,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def test_evaluator_killed_mid_run_fails_the_garbler_fast():
    listener = Listener("127.0.0.1", 0)
    # Hundreds of MB of tables: the evaluator cannot have read them all (and sent its outputs)
    # when the garbler's first tables are out, so the kill lands mid-run.
    n = 3_000_000
    peer = start_peer("evaluator", listener.port, n)
    try:
        ch = listener.accept(insecure=True, timeout=20)
        ch.timeout = 5
        garbler = Garbler(ch)
        values = np.arange(n, dtype=np.uint64) & np.uint64(0xFFFFFFFF)
        run = Background(lambda: garbler.run(bench_circuit(), {"a": values}))
        # The peer dies once the run is in its tables (not after a fixed delay, which a quick
        # run could beat and a slow start could make land before the run).
        wait_until(
            lambda: ch.counters()["tables"]["sent"] > 0 or not run.thread.is_alive(),
            "the garbler's first tables",
            timeout=60,
        )
        peer.kill()
        peer.wait()
        started = time.monotonic()
        with pytest.raises(ChannelError, match=r"peer|connection"):
            run.result(timeout=30)
        assert time.monotonic() - started < 15
    finally:
        peer.kill()
        peer.wait()


def test_stalled_peer_times_out():
    listener = Listener("127.0.0.1", 0)
    peer = start_peer("evaluator", listener.port, 10, stall=True)
    try:
        ch = listener.accept(insecure=True, timeout=20)
        ch.timeout = 1.0
        started = time.monotonic()
        with pytest.raises(ChannelTimeoutError, match="no data from peer"):
            Garbler(ch).run(bench_circuit(), {"a": np.zeros(10, dtype=np.uint64)})
        assert time.monotonic() - started < 5
    finally:
        peer.kill()
        peer.wait()


def test_two_garblers_are_told_so():
    listener = Listener("127.0.0.1", 0)
    peer = start_peer("garbler", listener.port, 10)
    try:
        ch = listener.accept(insecure=True, timeout=20)
        with pytest.raises(ProtocolError, match="both parties are garblers"):
            Garbler(ch).run(bench_circuit(), {"a": np.zeros(10, dtype=np.uint64)})
    finally:
        peer.kill()
        peer.wait()

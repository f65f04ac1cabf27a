"""A process's peak memory counts from its own exec, not from the process it was forked from."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from spgc.common.memory import peak_rss_kb, peak_rss_mb

CHILD = (
    "import json, resource; from spgc.common.memory import peak_rss_mb; "
    "print(json.dumps([peak_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss]))"
)


def test_a_child_of_a_big_process_reads_its_own_peak():
    ballast = bytearray(768 << 20)
    ballast[:: 1 << 12] = b"\x01" * len(range(0, len(ballast), 1 << 12))  # touch every page
    assert peak_rss_mb() > 768
    out = subprocess.run(
        [sys.executable, "-c", CHILD], capture_output=True, text=True, check=True
    ).stdout
    own_mb, kernel_kb = json.loads(out)
    del ballast
    # The child imports a little Python: far below the parent's 768 MB, which the kernel's
    # ru_maxrss (kernel_kb) keeps across the exec on Linux.
    assert 5 < own_mb < 400, (own_mb, kernel_kb)


def test_peak_of_another_process_and_of_none():
    assert peak_rss_kb(os.getpid()) == peak_rss_kb()
    assert peak_rss_kb(2**31 - 1) is None  # no such process

"""`spgc bench ot`: silent OT (Ferret) against SoftSpoken, measured over loopback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SPGC = Path(sys.executable).parent / "spgc"


def test_bench_ot_measures_bits_per_ot_after_setup() -> None:
    done = subprocess.run(
        [str(SPGC), "bench", "ot", "--json"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-3000:]
    silent, softspoken = json.loads(done.stdout)
    assert silent["source"] == "silent" and silent["secure"]
    # One iteration of Ferret's set: the bytes on the wire after setup are its tree messages.
    assert silent["ots"] == 10_805_248 - 589_760 - 1_319 * 13
    assert silent["iterations"] == 1
    assert silent["bits_per_ot"] == pytest.approx(silent["bits_per_ot_formula"])
    assert silent["bits_per_ot"] < 0.5  # issue 34: well under a bit per OT
    assert silent["setup_bytes"] > 0 and silent["setup_seconds"] > 0
    assert silent["ots_per_second"] > 0
    # SoftSpoken k = 7: ceil(128 / 7) = 19 bits per OT, and a little for its setup.
    assert softspoken["source"] == "softspoken-k7"
    assert 19 <= softspoken["bits_per_ot"] < 19.5
    assert "bits/OT" in done.stderr  # the table


def test_bench_ot_refuses_a_negative_count() -> None:
    done = subprocess.run(
        [str(SPGC), "bench", "ot", "--ots", "-5"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2
    assert "must be >= 0" in done.stderr and "Traceback" not in done.stderr

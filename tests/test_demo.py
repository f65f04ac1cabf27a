"""The README's main command, small: both servers and three providers as processes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def run_demo(*args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "spgc", "demo", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


def test_demo_trains_with_dp_over_tls():
    summary = run_demo("--rounds", "2", "--epsilon", "4")
    for key in ("rounds", "test_accuracy", "epsilon", "delta", "gc_bytes", "seconds"):
        assert key in summary
    assert summary["rounds"] == 2 and summary["steps"] == 2
    assert 0 < summary["epsilon"] <= 4
    assert summary["gc_bytes"] > 0
    assert summary["test_accuracy"] > 0.5  # cancer: better than chance after 2 noisy steps
    assert summary["failure"] is None


def test_demo_only_mpc_reports_no_privacy():
    summary = run_demo("--rounds", "1", "--mode", "only-mpc")
    assert summary["epsilon"] is None  # no noise: no finite epsilon
    assert summary["steps"] == 1


@pytest.mark.parametrize("mode", ["ldp", "dng", "preprocessed"])
def test_demo_noisy_modes_without_circuit_in_the_round(mode):
    summary = run_demo("--rounds", "1", "--mode", mode, "--epsilon", "8")
    assert summary["mode"] == mode and summary["steps"] == 1
    assert 0 < summary["epsilon"] <= 8
    # dng and preprocessed: two ring elements per coordinate, one each way
    assert summary["gc_bytes"] == (0 if mode == "ldp" else 2 * 8 * 62)
    assert (summary["offline_gc_bytes"] > 1000 * 62) == (mode == "preprocessed")
    assert summary["failure"] is None


def test_demo_refuses_unknown_mode_cleanly():
    done = subprocess.run(
        [sys.executable, "-m", "spgc", "demo", "--mode", "secure-ish"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("mode", ["plain", "only-mpc"])
def test_demo_insecure_links_work(mode):
    """--insecure: providers name themselves in every request (no certificate to do it)."""
    summary = run_demo("--rounds", "2", "--mode", mode, "--insecure", "--timeout", "120")
    assert summary["steps"] == 2 and summary["failure"] is None

"""The README's main command, small: both servers and three providers as processes."""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import run_in_process

from spgc.app.demo import (
    FIRST_DRAWN_PORT,
    PORT_RANGE_ENV,
    DemoOptions,
    _outgoing_port_range,
    drawn_port_range,
    free_ports,
    write_configs,
)
from spgc.privacy.accounting import PrivacyAccountant, quiet_dp_accounting
from spgc.privacy.budget import budget_summary

SPGC = str(Path(sys.executable).parent / "spgc")  # the installed console script


def run_demo(*args: str, stderr: list[str] | None = None) -> dict:
    done = subprocess.run(
        [SPGC, "demo", "--json", *args],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    if stderr is not None:
        stderr.append(done.stderr)
    return json.loads(done.stdout)


def test_free_ports_are_free_distinct_and_not_where_outgoing_connections_get_theirs():
    low, high = _outgoing_port_range()
    for consecutive in (False, True):
        ports = free_ports(5, consecutive=consecutive)
        assert len(set(ports)) == 5
        if consecutive:
            assert ports == list(range(ports[0], ports[0] + 5))
        assert all(not low <= p <= high for p in ports), (ports, low, high)
        socks = [socket.socket() for _ in ports]
        try:
            for sock, port in zip(socks, ports, strict=True):
                sock.bind(("127.0.0.1", port))  # free, as promised
        finally:
            for sock in socks:
                sock.close()


def test_free_ports_stay_in_the_drawn_range_and_above_rays_worker_ports(monkeypatch):
    monkeypatch.delenv(PORT_RANGE_ENV, raising=False)
    assert drawn_port_range() == (FIRST_DRAWN_PORT, 65_535)
    assert all(p >= FIRST_DRAWN_PORT for p in free_ports(20))  # Ray's workers: 10002-19999
    monkeypatch.setenv(PORT_RANGE_ENV, "23000-23009")
    for consecutive in (False, True):
        ports = free_ports(4, consecutive=consecutive)
        assert all(23000 <= p <= 23009 for p in ports), ports
    with pytest.raises(OSError, match="23000-23009"):
        free_ports(11)
    for bad in ("23000", "a-b", "900-2000", "30000-20000"):
        monkeypatch.setenv(PORT_RANGE_ENV, bad)
        with pytest.raises(ValueError, match=PORT_RANGE_ENV):
            drawn_port_range()


def test_demo_trains_with_dp_over_tls(tmp_path):
    port = free_ports(2, consecutive=True)[0]
    err: list[str] = []
    summary = run_demo(
        "--rounds", "2", "--epsilon", "4", "--state-dir", str(tmp_path / "run"),
        "--metrics-port", str(port), stderr=err,
    )  # fmt: skip
    assert (
        f"metrics: h1 http://127.0.0.1:{port}/metrics, h2 http://127.0.0.1:{port + 1}/metrics"
        in err[0]
    )
    for key in ("rounds", "test_accuracy", "epsilon", "delta", "gc_bytes", "seconds"):
        assert key in summary
    assert summary["rounds"] == 2 and summary["steps"] == 2
    assert 0 < summary["epsilon"] <= 4
    assert summary["gc_bytes"] > 0
    assert summary["test_accuracy"] > 0.5  # cancer: better than chance after 2 noisy steps
    assert summary["failure"] is None
    assert summary["differentially_private"] is True
    # delta = the accountant's + (1 + e^eps) x samples x 2^-64: one sample per coordinate
    # (62) per step, and not more than that.
    assert summary["noise_samples"] == 2 * 62
    sampler = (1 + math.exp(summary["epsilon"])) * 2 * 62 * 2.0**-64
    assert summary["delta"] == pytest.approx(summary["delta_accountant"] + sampler, rel=1e-12)
    assert summary["delta"] > summary["delta_accountant"] == 1e-5
    # --state-dir keeps both servers' state: checkpoints and the exported model
    for role in ("h1", "h2"):
        assert (tmp_path / "run" / role / "model.safetensors").is_file()
        assert (tmp_path / "run" / role / "checkpoint.json").is_file()
    # ... and each provider's: its data set's budget file, the run's release counted there
    for name in ("p1", "p2", "p3"):
        (budget,) = (tmp_path / "run" / name / "budget").glob("*.json")
        (run,) = budget_summary(budget)["runs"]
        assert 1 <= run["steps"] <= 2 and 0 < run["epsilon"] <= 4


def test_demo_only_mpc_reports_no_privacy_over_insecure_links():
    """only-mpc, over --insecure links (providers name themselves in every request: no
    certificate does it), reports that its model carries no privacy."""
    err: list[str] = []
    summary = run_demo(
        "--rounds", "1", "--mode", "only-mpc", "--insecure", "--timeout", "120", stderr=err
    )
    assert summary["failure"] is None
    assert summary["epsilon"] is None  # no noise: no finite epsilon
    assert summary["delta"] is None and summary["differentially_private"] is False
    assert summary["steps"] == 1
    # every round line says so
    rounds = [line for line in err[0].splitlines() if " round 0 -> model" in line]
    assert rounds and all("NOT differentially private" in line for line in rounds)


@pytest.mark.parametrize("mode", ["ldp", "dng", "preprocessed"])
def test_demo_noisy_modes_without_circuit_in_the_round(mode):
    # ldp runs one server over --insecure links: providers name themselves in every request
    # (the two servers' case is only-mpc's test above; TLS to one server: test_modes.py).
    insecure = ("--insecure",) if mode == "ldp" else ()
    summary = run_demo("--rounds", "1", "--mode", mode, "--epsilon", "8", *insecure)
    assert summary["mode"] == mode and summary["steps"] == 1
    assert 0 < summary["epsilon"] <= 8
    # dng and preprocessed: two ring elements per coordinate, one each way
    assert summary["gc_bytes"] == (0 if mode == "ldp" else 2 * 8 * 62)
    assert (summary["offline_gc_bytes"] > 1000 * 62) == (mode == "preprocessed")
    assert summary["failure"] is None


def test_demo_refuses_unknown_mode_cleanly():
    done = subprocess.run(
        [SPGC, "demo", "--mode", "secure-ish"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--epsilon", "0", "must be a finite number above 0"),
        ("--epsilon", "nan", "must be a finite number above 0"),
        ("--delta", "1", "must be below 1"),
        ("--timeout", "-3", "must be a finite number above 0"),
    ],
)
def test_demo_refuses_bad_numbers_before_starting_anything(option, value, message):
    done = run_in_process("demo", option, value)  # (the real command: the test above)
    assert done.returncode == 2
    assert message in done.stderr and option in done.stderr
    assert "h1.log" not in done.stderr and "Traceback" not in done.stderr


def test_demo_security_malicious_needs_a_mode_that_has_it(tmp_path):
    """--security malicious in a mode without a malicious variant: one line before anything
    starts; with gc (the default), gmw or auto (which then chooses between the two
    authenticated engines by their costs) the servers' configs carry it (a malicious run
    through the daemons: tests/e2e/test_peer_deviated.py)."""
    done = run_in_process("demo", "--security", "malicious", "--mode", "dng")
    assert done.returncode != 0
    assert "--security malicious: security: malicious needs backend: gmw" in done.stderr
    assert "mode dng has no malicious variant yet" in done.stderr
    assert "h1.log" not in done.stderr and "Traceback" not in done.stderr
    for backend in ("gc", "gmw", "auto"):
        opts = DemoOptions(backend=backend, security="malicious", state_dir=tmp_path / backend)
        server_cfgs, _ = write_configs(opts, tmp_path / backend)
        for cfg in server_cfgs:
            assert "security: malicious" in cfg.read_text()
            assert backend == "gc" or f"backend: {backend}" in cfg.read_text()  # gc: the default


def test_demo_adaptive_clipping_moves_the_clip_norm_and_the_ledger_records_it(tmp_path):
    """`spgc demo --clip adaptive`: C starts at the paper's C0 = 0.1 and moves with the noisy
    count each round; every release entry of both ledgers carries that round's C, co-signed,
    and `spgc account` re-accounts the run to the summary's epsilon."""
    summary = run_demo(
        "--rounds", "3", "--clip", "adaptive", "--state-dir", str(tmp_path / "run"),
    )  # fmt: skip
    assert summary["clip"] == "adaptive" and summary["steps"] == 3
    norms = summary["clip_norms"]
    assert len(norms) == 3 and norms[0] == 0.1 and len(set(norms)) == 3
    assert all(0.1 * math.exp(-0.2 * 3) <= c <= 0.1 * math.exp(0.2 * 3) for c in norms)
    assert summary["noise_samples"] == 3 * 63  # 62 coordinates and the count
    ledgers = [str(tmp_path / "run" / role / "ledger.jsonl") for role in ("h1", "h2")]
    done = subprocess.run(
        [SPGC, "account", "--ledger", *ledgers, "--json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    for ledger in answer["ledgers"]:
        assert ledger["clip_norms"] == norms
        assert ledger["clip"]["rule"] == "adaptive"
    assert answer["epsilon"] == pytest.approx(summary["epsilon"], rel=1e-9)


def test_demo_on_the_gmw_backend_trains_and_the_ledgers_name_it(tmp_path):
    """`spgc demo --backend gmw`: the round's circuits run on GMW with Beaver triples from
    silent OT; the model trains as on gc, the summary and both ledgers name the backend (bound
    by the co-signed plan digest), and `spgc account` agrees on epsilon."""
    summary = run_demo("--rounds", "2", "--backend", "gmw", "--state-dir", str(tmp_path / "run"))
    assert summary["backend"] == "gmw" and summary["steps"] == 2
    assert summary["test_accuracy"] >= 0.8
    # After the session's setup (silent OT's base and first LPN iteration, once), a round of
    # cancer's 62 coordinates costs tens of kB between the servers, against about 1.5 MB on gc.
    later = [r["gc_bytes"] for r in summary["history"][1:]]
    assert later and max(later) < 200_000
    ledgers = [str(tmp_path / "run" / role / "ledger.jsonl") for role in ("h1", "h2")]
    done = subprocess.run(
        [SPGC, "account", "--ledger", *ledgers, "--json"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert [ledger["backend"] for ledger in answer["ledgers"]] == ["gmw", "gmw"]
    assert answer["epsilon"] == pytest.approx(summary["epsilon"], rel=1e-9)
    human = subprocess.run(
        [SPGC, "account", "--ledger", ledgers[0]], capture_output=True, text=True
    )
    assert "backend gmw" in human.stdout


def test_demo_provider_level_dp_names_the_adjacency_and_the_ledger_agrees(tmp_path):
    """`spgc demo --adjacency provider` (DP-FedAvg): each provider takes part by its own coin,
    trains locally and shares its clipped delta; the summary, both ledgers and `spgc account`
    name add/remove one provider, and the account re-computes the summary's epsilon. With
    --noise-schedule (Geyer et al.'s adjustment) each release is accounted with its phase."""
    summary = run_demo(
        "--adjacency", "provider", "--providers", "3", "--rounds", "2", "--insecure",
        "--noise-schedule", "0:1.5:0.5,1:1.4:0.6", "--state-dir", str(tmp_path / "run"),
    )  # fmt: skip
    assert summary["adjacency"] == "add/remove one provider"
    with quiet_dp_accounting():
        phased = PrivacyAccountant(1.5, 1e-5, 0.5, schedule=[(0, 1.5, 0.5), (1, 1.4, 0.6)])
        want = phased.epsilon_after(2)
    assert summary["steps"] == 2 and summary["epsilon"] == pytest.approx(want, rel=1e-9)
    assert summary["epsilon"] <= 4.0
    ledgers = [str(tmp_path / "run" / role / "ledger.jsonl") for role in ("h1", "h2")]
    done = run_in_process("account", "--ledger", *ledgers, "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert [x["adjacency"] for x in answer["ledgers"]] == ["add/remove one provider"] * 2
    assert answer["epsilon"] == pytest.approx(summary["epsilon"], rel=1e-9)
    human = run_in_process("account", "--ledger", ledgers[0])
    assert "adjacency: add/remove one provider" in human.stdout
    assert (
        "from release 0: noise multiplier 1.5, rate 0.5; from release 1: noise multiplier 1.4, "
        "rate 0.6" in human.stdout
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--noise-schedule", "0:1.5:0.5"], "--noise-schedule needs --adjacency provider"),
        (["--adjacency", "provider", "--noise-schedule", "0:1.5"], "'0:1.5' is not RELEASE:"),
        (["--adjacency", "provider", "--noise-schedule", "2:1.5:0.5"], "start at step 0"),
        (["--adjacency", "provider", "--noise-schedule", "0:1.5:2"], "rate in (0, 1]"),
    ],
)
def test_demo_refuses_a_bad_noise_schedule_in_one_line(flags, message):
    done = run_in_process("demo", "--insecure", *flags)
    assert done.returncode != 0
    assert message in done.stderr and "Traceback" not in done.stderr

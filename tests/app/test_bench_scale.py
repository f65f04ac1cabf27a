"""`spgc bench scale`: a real round on worker pairs, checked against plaintext; the model."""

from __future__ import annotations

import json
import re

import pytest

from spgc.app import bench_scale, cli


@pytest.mark.parametrize("backend", ["gc", "gmw"])
def test_embedded_round_is_checked_and_reported(
    backend: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "scale", "--dim", "300", "--workers", "1", "--embedded", "--json"]
    rc = cli.main([*argv, "--backend", backend])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["correct"] and out["dim"] == 300 and out["workers"] == 1 and not out["ray"]
    assert out["backend"] == backend
    # gmw's channel counts its round trips: one trial run (at most 48 AND layers, the noisy sum
    # inside it), its outputs and the opening, per sampler stage (almost always one)
    assert (out["round_trips"] is None) == (backend == "gc")
    if backend == "gmw":
        assert 30 <= out["round_trips"] <= (48 + 3) * out["rounds"]
    assert out["and_gates"] > 300 * 500  # the sampler's trials plus the reconstruction
    assert out["seconds_per_round"] > 0
    if backend == "gc":  # garbled: 24.6 B per AND gate
        assert out["bytes_per_coordinate"] > 20 * 500
    else:  # GMW: under a byte per AND gate (and the silent OT's setup, not amortised at 300)
        assert out["bytes_per_coordinate"] < 10 * 500
    assert out["trial_depth"] == (28 if backend == "gmw" else None)


def test_a_deeper_trial_takes_fewer_and_gates_and_more_round_trips(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--trial-depth: gmw's trial run within that many AND layers (the plan's trial_depth);
    unbounded (10000) is the trial with the fewest AND gates, each layer a round trip."""
    argv = ["bench", "scale", "--dim", "300", "--workers", "1", "--embedded", "--json"]
    out = {}
    for depth in ("28", "10000"):
        assert cli.main([*argv, "--backend", "gmw", "--trial-depth", depth]) == 0
        out[depth] = json.loads(capsys.readouterr().out)
        assert out[depth]["correct"] and out[depth]["trial_depth"] == int(depth)
    assert out["10000"]["and_gates"] < 0.6 * out["28"]["and_gates"]
    assert out["10000"]["round_trips"] > 2 * out["28"]["round_trips"]


# Ray: one local cluster at a time on this machine (tests/servers/test_ray_workers.py).
@pytest.mark.xdist_group("ray")
def test_ray_worker_pairs_round(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray", reason="the Ray extra (pip install '.[ray]') is missing")
    rc = cli.main(["bench", "scale", "--dim", "200", "--workers", "2", "--model", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["correct"] and out["ray"] and out["workers"] == 2
    assert len(out["peak_rss_mb_per_worker"]) == 4 and min(out["peak_rss_mb_per_worker"]) > 10
    model = out["model"]
    assert {r["bound"] for r in model} <= {"CPU", "link", "memory"}
    row = next(r for r in model if r["dim"] == 10**9 and r["workers"] == 1)
    assert row["gigabytes"] == pytest.approx(out["bytes_per_coordinate"])  # 1e9 coords: B -> GB
    # the round's working set was measured on the workers: the model's memory column uses it
    assert out["rss_bytes_per_coordinate"] >= 0 and len(out["idle_rss_mb_per_worker"]) == 4
    assert all(r["worker_memory_gb"] > 0 for r in model) and out["model_intake"]


@pytest.mark.parametrize("ray_path", [False, True])
def test_preprocessed_pool_production_and_online_round(ray_path, capsys) -> None:
    """--mode preprocessed: the pool made on the pairs, stored, and one online round that opens
    the sums plus the production seeds' plaintext noise, using up the pool."""
    argv = ["bench", "scale", "--mode", "preprocessed", "--dim", "300", "--json"]
    if ray_path:
        pytest.importorskip("ray", reason="the Ray extra (pip install '.[ray]') is missing")
        argv += ["--workers", "2"]
    else:
        argv += ["--workers", "1", "--embedded"]
    assert cli.main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["correct"] and out["mode"] == "preprocessed" and out["pool_left_after_round"] == 0
    assert out["offline_bytes_per_sample"] > 20 * 500 and out["online_bytes_per_coordinate"] == 16
    assert out["samples_per_second"] > 0 and out["online_seconds_per_round"] > 0
    assert len(out["peak_rss_mb_per_worker"]) == (4 if ray_path else 0)


def test_model_bound_follows_the_slower_of_link_and_cpu() -> None:
    rows = bench_scale.model_rows(bytes_per_coord=25_000, seconds_per_coord_pair=20e-6)
    at = {(r["dim"], r["workers"], r["gbit_per_s"]): r for r in rows}
    slow = at[10**6, 1, 1]
    assert slow["link_seconds"] == pytest.approx(25_000 * 8e6 / 1e9)  # 200 s of link
    assert slow["compute_seconds"] == pytest.approx(20.0) and slow["bound"] == "link"
    fast = at[10**6, 1, 100]
    assert fast["bound"] == "CPU" and fast["round_seconds"] == pytest.approx(20.0)


def test_model_adds_gmws_round_trips() -> None:
    """gmw: the round also waits its AND layers' exchanges, half a round trip each (both servers
    send at once), which bound a small model on a fast link; the embedded gmw run counts them."""
    rows = bench_scale.model_rows(1_000, 20e-6, round_trips=50, rtt_seconds=0.05)
    small = next(
        r for r in rows if r["dim"] == 10**6 and r["workers"] == 64 and r["gbit_per_s"] == 100
    )
    assert small["round_trip_seconds"] == pytest.approx(1.25)
    assert small["round_seconds"] == pytest.approx(
        1.25 + max(small["compute_seconds"], small["link_seconds"])
    )
    assert small["bound"] == "round trips"
    assert all(r["round_trip_seconds"] == 0 for r in bench_scale.model_rows(1_000, 20e-6))


def test_model_memory_bound_and_intake() -> None:
    """A worker holds one batch's working set plus 24 bytes per coordinate of its range; a
    range that does not fit the worker's memory is memory-bound whatever the link."""
    rows = bench_scale.model_rows(25_000, 20e-6, rss_bytes_per_coord=600.0, idle_rss_mb=100.0,
                                  worker_memory_gb=16.0)  # fmt: skip
    at = {(r["dim"], r["workers"], r["gbit_per_s"]): r for r in rows}
    one = at[10**9, 1, 100]
    expected = (100 * 2**20 + bench_scale.RANGE_BATCH * 600.0 + 10**9 * 24) / 1e9
    assert one["worker_memory_gb"] == pytest.approx(expected) and one["bound"] == "memory"
    assert at[10**9, 64, 100]["bound"] != "memory"  # 1/64 of the range fits
    intake = {(r["dim"], r["providers"], r["gbit_per_s"]): r for r in bench_scale.intake_rows()}
    r = intake[10**6, 1000, 10]
    assert r["gigabytes_per_server"] == pytest.approx(8.0)  # 1000 x 1e6 x 8 bytes
    assert r["intake_seconds"] == pytest.approx(6.4)  # 64 Gbit at 10 Gbit/s


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dim", "0"], "--dim must be at least 1"),
        (["--workers", "0"], "--workers must be in 1..64"),
        (["--embedded", "--workers", "2"], "--embedded runs one pair"),
        (["--mode", "preprocessed", "--model"], "--model is for --mode spgc"),
        (["--trial-depth", "48"], "--trial-depth is for --backend gmw --mode spgc"),
        (["--backend", "gmw", "--trial-depth", "5"], "from 20 to 10000"),
        (["--backend", "gmw", "--mode", "preprocessed", "--trial-depth", "48"], "--mode spgc"),
    ],
)
def test_bad_input_is_one_line(argv, message, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "scale", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_workers_import_the_installed_package_from_any_directory(tmp_path) -> None:
    """Ray puts the driver's working directory on its workers' sys.path: started next to a
    directory named spgc (a checkout), the workers must still import the installed package."""
    pytest.importorskip("ray", reason="the Ray extra (pip install '.[ray]') is missing")
    import subprocess
    import sys
    from pathlib import Path

    shadow = tmp_path / "spgc"
    shadow.mkdir()
    (shadow / "__init__.py").write_text("")  # like the checkout's spgc/: no servers in it
    spgc = Path(sys.executable).parent / "spgc"
    run = subprocess.run(
        [str(spgc), "bench", "scale", "--dim", "40", "--workers", "2", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)["correct"]


def test_the_summary_line_shows_t_and_gmws_round_trips(capsys: pytest.CaptureFixture[str]) -> None:
    """Without --json: T (us per coordinate per pair, what the model scales) on both backends,
    and on gmw the round trips its channel counted."""
    argv = ["bench", "scale", "--dim", "200", "--workers", "1", "--embedded", "--backend", "gmw"]
    assert cli.main(argv) == 0
    line = capsys.readouterr().out.splitlines()[0]
    assert "200 coordinates on 1 worker pair(s) (embedded, TLS, gmw, trial depth 28)" in line
    assert re.search(r"T = \d+\.\d us per coordinate per pair", line)
    assert re.search(r", \d+ round trips, correct$", line)

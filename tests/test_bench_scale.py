"""`spgc bench scale`: a real round on worker pairs, checked against plaintext; the model."""

from __future__ import annotations

import json

import pytest

from spgc.app import bench_scale, cli


def test_embedded_round_is_checked_and_reported(capsys: pytest.CaptureFixture[str]) -> None:
    rc = cli.main(["bench", "scale", "--dim", "300", "--workers", "1", "--embedded", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["correct"] and out["dim"] == 300 and out["workers"] == 1 and not out["ray"]
    assert out["and_gates"] > 300 * 500  # the sampler's trials plus the reconstruction
    assert out["seconds_per_round"] > 0 and out["bytes_per_coordinate"] > 20 * 500


def test_ray_worker_pairs_round(capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("ray", reason="the Ray extra (pip install 'spgc[ray]') is missing")
    rc = cli.main(["bench", "scale", "--dim", "200", "--workers", "2", "--model", "--json"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["correct"] and out["ray"] and out["workers"] == 2
    assert len(out["peak_rss_mb_per_worker"]) == 4 and min(out["peak_rss_mb_per_worker"]) > 10
    model = out["model"]
    assert {r["bound"] for r in model} <= {"CPU", "link"}
    row = next(r for r in model if r["dim"] == 10**9 and r["workers"] == 1)
    assert row["gigabytes"] == pytest.approx(out["bytes_per_coordinate"])  # 1e9 coords: B -> GB


def test_model_bound_follows_the_slower_of_link_and_cpu() -> None:
    rows = bench_scale.model_rows(bytes_per_coord=25_000, seconds_per_coord_pair=20e-6)
    at = {(r["dim"], r["workers"], r["gbit_per_s"]): r for r in rows}
    slow = at[10**6, 1, 1]
    assert slow["link_seconds"] == pytest.approx(25_000 * 8e6 / 1e9)  # 200 s of link
    assert slow["compute_seconds"] == pytest.approx(20.0) and slow["bound"] == "link"
    fast = at[10**6, 1, 100]
    assert fast["bound"] == "CPU" and fast["round_seconds"] == pytest.approx(20.0)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dim", "0"], "--dim must be at least 1"),
        (["--workers", "0"], "--workers must be in 1..64"),
        (["--embedded", "--workers", "2"], "--embedded runs one pair"),
    ],
)
def test_bad_input_is_one_line(argv, message, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["bench", "scale", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]

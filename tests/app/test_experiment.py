"""`spgc experiment`: a real --quick run end to end (servers and providers as processes), the
per-epoch rows taken from a server history, and one-line errors for bad input."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from spgc.app import experiment
from spgc.app.cli import main
from spgc.app.experiment import COLUMNS, Run, epoch_rows, plan_runs, read_csv


def _env_with_absolute_pythonpath() -> dict[str, str]:
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        parts = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in parts if p)
    return env


def test_quick_run_end_to_end(tmp_path: Path) -> None:
    out, png = tmp_path / "r.csv", tmp_path / "r.png"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "spgc.app.cli",
            "experiment",
            "--quick",
            "--out",
            str(out),
            "--plot",
            str(png),
        ],
        cwd=tmp_path,  # the installed package (CI), or the checkout via an absolute PYTHONPATH
        env=_env_with_absolute_pythonpath(),
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "epoch 1/2" in proc.stderr and "epoch 2/2" in proc.stderr  # live progress
    with out.open() as f:
        assert f.readline().strip().split(",") == list(COLUMNS)
    rows = read_csv(out)
    assert {r["server_optimizer"] for r in rows} == {"adam"}  # the servers' summary says so
    runs = {(r["mode"], r["step_epsilon"]) for r in rows}
    assert runs == {("plain", None), ("spgc", 8.0)}
    per = experiment.rounds_per_epoch("cancer")
    for mode, _eps in runs:
        mine = [r for r in rows if r["mode"] == mode]
        assert [r["epoch"] for r in mine] == [1, 2]
        assert [r["rounds"] for r in mine] == [per, 2 * per]
        for r in mine:
            assert 0.0 <= r["test_accuracy"] <= 1.0
            assert r["computation_s"] > 0 and r["communication_s"] >= 0
        if mode == "plain":
            assert all(r["epsilon_total"] is None for r in mine)
            assert all(r["gc_bytes"] == 0 for r in mine)
        else:
            e1, e2 = (r["epsilon_total"] for r in mine)
            assert 0 < e1 < e2 and math.isfinite(e2)
            assert mine[0]["gc_bytes"] > 0 and mine[1]["gc_bytes"] > mine[0]["gc_bytes"]
            assert mine[1]["communication_s"] > 0
            assert mine[0]["noise_multiplier"] == pytest.approx(
                math.sqrt(2 * math.log(1.25 / 1e-3)) / 8
            )
    assert len(json.loads(out.with_suffix(".history.json").read_text())) == 2
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, words",
    [
        (["--datasets", "imagenet"], "unknown dataset"),
        (["--modes", "plain,fancy"], "unknown mode"),
        (["--epsilons", "0"], "epsilon must be"),
        (["--epsilons", "abc"], "not a number"),
        (["--epochs", "0"], "--epochs"),
        (["--plot", "x.jpg"], "PNG"),
        (["--out", "/nonexistent/dir/r.csv"], "does not exist"),
    ],
)
def test_bad_input_one_line_exit_2(
    argv: list[str], words: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["experiment", *argv]
    if "--out" not in argv:
        args += ["--out", str(tmp_path / "r.csv")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and words in err and "Traceback" not in err


def test_the_servers_update_rule_reaches_every_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """--server-optimizer sgd (with its --lr) is what each run's servers are configured with."""
    seen: list = []

    def fake_demo(opts, out):  # records the options instead of starting the daemons
        seen.append(opts)
        return {"history": [], "seconds": 0.0}

    monkeypatch.setattr(experiment, "run_demo", fake_demo)
    argv = ["experiment", "--datasets", "cancer", "--modes", "spgc", "--epsilons", "8",
            "--epochs", "1", "--server-optimizer", "sgd", "--lr", "0.5",
            "--out", str(tmp_path / "r.csv")]  # fmt: skip
    main(argv)
    (opts,) = seen
    assert opts.server_overrides["server_optimizer"] == "sgd"
    assert opts.server_overrides["lr"] == 0.5


def test_plan_runs_noise_free_modes_once() -> None:
    runs = plan_runs(["cancer"], ["plain", "spgc", "only-mpc"], [0.5, 2.0])
    assert [(r.mode, r.epsilon) for r in runs] == [
        ("plain", None),
        ("spgc", 0.5),
        ("spgc", 2.0),
        ("only-mpc", None),
    ]


def test_epoch_rows_split_and_partial_epoch() -> None:
    per = experiment.rounds_per_epoch("cancer")

    def rnd(t: int, published: bool = True) -> dict:
        return {
            "round": t,
            "published": published,
            "epsilon": 0.1 * (t + 1),
            "test_loss": 1.0 / (t + 1),
            "test_accuracy": 0.5 + t / 100,
            "gc_bytes": 10,
            "seconds": {"intake": 1.0, "circuit": 2.0, "update": 0.5},
        }

    # one and a half epochs, the last round of epoch 1 aborted
    hist = [rnd(t, published=t != per - 1) for t in range(per + per // 2)]
    rows = epoch_rows(Run("cancer", "spgc", 2.0), {"history": hist, "seconds": 9.0}, 3)
    assert len(rows) == 1  # epochs 2 and 3 did not finish
    (r,) = rows
    assert r["rounds"] == per and r["steps"] == per - 1
    assert r["test_accuracy"] == pytest.approx(0.5 + (per - 2) / 100)  # last PUBLISHED model
    # computation = intake (the providers' part) + update; communication = the circuit
    assert r["computation_s"] == pytest.approx(1.5 * per)
    assert r["communication_s"] == pytest.approx(2.0 * per)
    assert (r["intake_s"], r["servers_s"]) == (pytest.approx(per), pytest.approx(2.0 * per))
    assert r["gc_bytes"] == 10 * per

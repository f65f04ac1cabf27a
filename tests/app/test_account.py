"""`spgc account`: planning with the library's accountant (issue 13, item 7)."""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from spgc.app import account_cmd
from spgc.privacy.accounting import epsilon_for

# ANCHORS.md (dp-accounting): q=0.01, sigma=1.1, T=1000, delta=1e-5 -> 1.712 (RDP), 1.515 (PLD).
PLAN = ["--sampling-rate", "0.01", "--steps", "1000", "--delta", "1e-5"]
# rdp_discrete: 2.0151 by an independent implementation of Zhu-Wang's bound (the privacy audit).
REFERENCE = {"rdp": 1.712, "pld": 1.515, "rdp_discrete": 2.015}
FIELDS = {"epsilon", "noise_multiplier", "delta", "steps", "sampling_rate", "accountant"}


@pytest.fixture(scope="module")
def parser() -> argparse.ArgumentParser:
    # The same wiring cli.build_parser uses: a subcommand of a `spgc` parser.
    p = argparse.ArgumentParser(prog="spgc")
    account_cmd.add_parser(p.add_subparsers(dest="command", required=True))
    return p


def _run(parser: argparse.ArgumentParser, capsys, *argv: str) -> tuple[int, str, str]:
    code = account_cmd.run(parser.parse_args(["account", *argv]))
    out, err = capsys.readouterr()
    return code, out, err


def _json(parser: argparse.ArgumentParser, capsys, *argv: str) -> dict:
    code, out, err = _run(parser, capsys, *argv, "--json")
    assert (code, err) == (0, "")
    assert out.count("\n") == 1
    return json.loads(out)


@pytest.mark.parametrize("accountant", ["rdp", "pld", "rdp_discrete"])
def test_reference_epsilon(parser, capsys, accountant):
    got = _json(parser, capsys, "--sigma", "1.1", *PLAN, "--accountant", accountant)
    assert round(got["epsilon"], 3) == REFERENCE[accountant]
    assert set(got) >= FIELDS
    assert got["noise_multiplier"] == 1.1
    assert (got["delta"], got["steps"], got["sampling_rate"]) == (1e-5, 1000, 0.01)
    assert (got["accountant"], got["sampling"], got["solved_for"]) == (
        accountant,
        "poisson",
        "epsilon",
    )
    assert got["target_epsilon"] is None


def test_default_accountant_is_rdp_and_human_line(parser, capsys):
    code, out, err = _run(parser, capsys, "--sigma", "1.1", *PLAN)
    assert (code, err) == (0, "")
    assert (
        out == "epsilon 1.712 after 1000 steps (sigma 1.1, Poisson rate 0.01, delta 1e-05, RDP)\n"
    )


def test_human_figures_round_up(parser, capsys):
    # PLD's epsilon is 1.51537...: the line shows 1.516, never less than the accountant's figure.
    code, out, _ = _run(parser, capsys, "--sigma", "1.1", *PLAN, "--accountant", "pld")
    assert code == 0 and out.startswith("epsilon 1.516 after 1000 steps")


def test_epsilon_gives_the_noise_multiplier_and_back(parser, capsys):
    got = _json(parser, capsys, "--epsilon", "1.712", *PLAN)
    assert set(got) >= FIELDS
    assert got["solved_for"] == "noise_multiplier" and got["target_epsilon"] == 1.712
    assert got["noise_multiplier"] == pytest.approx(1.1, abs=1e-3)
    # The calibrated multiplier meets the target and is tight against it.
    assert got["epsilon"] <= 1.712 and round(got["epsilon"], 3) == 1.712
    assert got["epsilon"] == epsilon_for(got["noise_multiplier"], 1e-5, 0.01, 1000, "rdp")

    code, out, err = _run(parser, capsys, "--epsilon", "1.712", *PLAN)
    assert (code, err) == (0, "")
    match = re.fullmatch(
        r"noise multiplier (\S+) for epsilon 1\.712 after 1000 steps "
        r"\(Poisson rate 0\.01, delta 1e-05, RDP\)\n",
        out,
    )
    assert match, out
    printed = float(match.group(1))
    assert printed >= got["noise_multiplier"]  # rounded up: copying it never overspends

    # Plugging the printed multiplier back in gives the target epsilon again.
    back = _json(parser, capsys, "--sigma", match.group(1), *PLAN)
    assert back["noise_multiplier"] == printed
    assert back["epsilon"] <= 1.712 and round(back["epsilon"], 3) == 1.712


def test_pld_inverse(parser, capsys):
    got = _json(parser, capsys, "--epsilon", "1.515", *PLAN, "--accountant", "pld")
    assert got["noise_multiplier"] == pytest.approx(1.1, abs=1e-3)
    assert got["epsilon"] <= 1.515 and round(got["epsilon"], 3) == 1.515


@pytest.mark.parametrize(
    "argv",
    [
        [],  # neither --sigma nor --epsilon
        ["--sigma", "1.1", "--epsilon", "1.0", *PLAN],
        ["--sigma", "0", *PLAN],
        ["--sigma", "-1", *PLAN],
        ["--sigma", "nan", *PLAN],
        ["--epsilon", "inf", *PLAN],
        ["--sigma", "one", *PLAN],
        ["--sigma", "1.1", *PLAN, "--sampling-rate", "0"],
        ["--sigma", "1.1", *PLAN, "--sampling-rate", "1.5"],
        ["--sigma", "1.1", *PLAN, "--steps", "0"],
        ["--sigma", "1.1", *PLAN, "--steps", "2.5"],
        ["--sigma", "1.1", *PLAN, "--delta", "1"],
        ["--sigma", "1.1", *PLAN, "--delta", "0"],
        ["--sigma", "1.1", *PLAN, "--accountant", "gdp"],
    ],
)
def test_argparse_refuses_bad_values(parser, capsys, argv):
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["account", *argv])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "spgc account: error:" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ("--sigma 1.1 --steps 10 --delta 1e-5", "missing --sampling-rate"),
        ("--sigma 1.1 --sampling-rate 0.01", "missing --steps, --delta"),
        # Values argparse accepts but the accountant cannot handle: one line, no traceback.
        ("--sigma 1e300 --sampling-rate 0.01 --steps 10 --delta 1e-5", "rdp accountant overflowed"),
        (
            "--sigma 1e-9 --sampling-rate 1 --steps 10 --delta 1e-5 --accountant pld",
            "try --accountant rdp",
        ),
    ],
)
def test_run_refuses_in_one_line(parser, capsys, argv, message):
    code, out, err = _run(parser, capsys, *argv.split())
    assert (code, out) == (2, "")
    assert err.startswith("spgc account: error: ") and err.count("\n") == 1
    assert message in err


def test_run_checks_a_namespace_built_by_hand(capsys):
    args = argparse.Namespace(
        sigma=1.1, epsilon=1.0, sampling_rate=0.01, steps=10, delta=1e-5, accountant="rdp", json=0
    )
    assert account_cmd.run(args) == 2
    assert capsys.readouterr().err == (
        "spgc account: error: give exactly one of --sigma and --epsilon\n"
    )


def test_infinite_epsilon_is_null_in_json(parser, capsys):
    # PLD at an absurdly small delta has no finite epsilon; JSON has no Infinity.
    got = _json(parser, capsys, "--sigma", "1.1", "--sampling-rate", "0.01", "--steps", "1000",
                "--delta", "1e-300", "--accountant", "pld")  # fmt: skip
    assert got["epsilon"] is None


def test_console_script():
    spgc = Path(sys.executable).parent / "spgc"
    done = subprocess.run(
        [str(spgc), "account", "--sigma", "1.1", *PLAN, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert round(got["epsilon"], 3) == 1.712 and got["accountant"] == "rdp"

    bad = subprocess.run(
        [str(spgc), "account", "--sigma", "1.1", "--steps", "10"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (bad.returncode, bad.stdout) == (2, "")
    assert bad.stderr == (
        "spgc account: error: missing --sampling-rate, --delta (all three are required)\n"
    )

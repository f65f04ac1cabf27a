"""`spgc account --noise-floor` (issue 46 item 4): the three figures of a planned training."""

from __future__ import annotations

import json
import math

import pytest
from test_ledger import _run
from test_ledger import parser as parser  # the module's fixture

from spgc.privacy.accounting import epsilon_for
from spgc.privacy.noise_floor import floor_multipliers

PLAN = ["--sampling-rate", "0.07692307692307693", "--steps", "4", "--delta", "1e-5"]
FLOOR = ["--noise-floor", "0.25", "--sensitivity-units", "4096", "--coordinates", "62"]


def test_the_three_figures_of_a_planned_floor(parser, capsys):
    code, out, err = _run(parser, capsys, "--sigma", "0.838868", *PLAN, *FLOOR, "--json")
    assert (code, err) == (0, "")
    answer = json.loads(out)
    floor = answer["noise_floor"]
    # the noise std everyone who sees the release faces: sqrt(1.25) sigma, under 12% more
    assert floor["everyone"]["noise_std_ratio"] == pytest.approx(math.sqrt(1.25))
    assert floor["everyone"]["noise_std_ratio"] <= 1.12
    assert floor["curious_server"]["noise_std_ratio"] == 1.0
    assert floor["deviating_server"]["noise_std_ratio"] == 0.5
    m = floor_multipliers(0.838868, 0.25, 4096.0, 62)
    q = 0.07692307692307693
    for name, mult in m.as_dict().items():
        assert floor[name]["noise_multiplier"] == pytest.approx(mult)
        want = epsilon_for(mult, 1e-5, q, 4, "rdp", "poisson")
        assert floor[name]["epsilon"] == pytest.approx(want)
    assert m.deviating_server == pytest.approx(0.5 * 0.838868)  # the other's f sigma^2 alone
    assert answer["epsilon"] == floor["curious_server"]["epsilon"]  # the plan's guarantee
    code, out, _ = _run(parser, capsys, "--sigma", "0.838868", *PLAN, *FLOOR)
    assert "everyone who sees the release: noise std x1.118 sigma" in out
    assert "one server that deviates: noise std x0.5 sigma" in out


def test_calibrating_with_a_floor_holds_the_target_against_one_curious_server(parser, capsys):
    code, out, _ = _run(parser, capsys, "--epsilon", "4", *PLAN, *FLOOR, "--json")
    assert code == 0
    answer = json.loads(out)
    assert answer["noise_floor"]["curious_server"]["epsilon"] <= 4.0 * (1 + 1e-6)
    assert answer["noise_floor"]["curious_server"]["epsilon"] == pytest.approx(4.0, rel=1e-3)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sigma", "1", *PLAN, "--noise-floor", "0.25"], "needs --sensitivity-units"),
        (["--sigma", "1", *PLAN, "--coordinates", "3"], "go with --noise-floor"),
        (["--sigma", "1", *PLAN, "--noise-floor", "1"], "in [0, 1)"),
    ],
)
def test_refusals_are_one_line(parser, capsys, argv, message):
    try:
        code, _, err = _run(parser, capsys, *argv)
    except SystemExit as exc:  # argparse's own refusal of the value
        code, err = exc.code, capsys.readouterr().err
    assert code == 2
    assert message in err

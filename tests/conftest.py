"""Fixtures shared by the tests (the helpers themselves live in helpers.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from helpers import TEST_DIRS, TwoParty, make_test_pki

from spgc.app.demo import FIRST_DRAWN_PORT, PORT_RANGE_ENV
from spgc.learning.data import load_dataset
from spgc.learning.gradients import check_model_on_data
from spgc.learning.models import build_model

# The full matrices of the slowest end-to-end tests (every fault point on either server, ...)
# run with SPGC_EXTENDED_TESTS=1 (`make test-extended`); `make test` runs a representative case
# of each kind, so that CI stays within its time budget on two cores.
EXTENDED_ENV = "SPGC_EXTENDED_TESTS"

# Test modules import each other's fixtures by name (from test_server_daemon import start_pair)
# from any layer's folder.
sys.path[:0] = [str(d) for d in TEST_DIRS if str(d) not in sys.path]


def _worker_port_slice() -> str:
    """This pytest-xdist worker's own slice of the ports free_ports draws from (set in the
    environment, so the daemons and demos the tests start draw from it too): two workers'
    tests never draw the same port between its check and a daemon's bind."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker.removeprefix("gw")) if worker.removeprefix("gw").isdigit() else 0
    width = (32_000 - FIRST_DRAWN_PORT) // max(count, 1)
    low = FIRST_DRAWN_PORT + index * width
    return f"{low}-{low + width - 1}"


def pytest_configure(config: pytest.Config) -> None:
    os.environ[PORT_RANGE_ENV] = _worker_port_slice()
    config.addinivalue_line(
        "markers", f"extended: a case of a full matrix, run only with {EXTENDED_ENV}=1"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(EXTENDED_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"extended matrix: {EXTENDED_ENV}=1 runs it")
    for item in items:
        if item.get_closest_marker("extended") is not None:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def provider_state_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Providers keep their data sets' budget files under $XDG_STATE_HOME/spgc: a directory of
    each test's own, never the real home (daemons started as subprocesses inherit it)."""
    home = tmp_path_factory.mktemp("state-home")
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


@pytest.fixture(scope="session", autouse=True)
def warm_per_example_gradients() -> None:
    """The first per-example gradient in a process warms torch.func (1.4 s on an idle 2-core
    machine, about 5 s beside the other worker's daemons): longer than the 3-s round deadlines
    of the daemon tests, whose providers run in the test's process. Warmed once per worker
    before any test, none of them depends on which tests ran before it."""
    cancer = load_dataset("cancer")
    check_model_on_data(build_model("cancer"), cancer.x_train[:4], cancer.y_train[:4], "warm-up")


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return make_test_pki(Path(tmp_path_factory.mktemp("pki")))


@pytest.fixture
def two_party():
    """Factory of linked garbler/evaluator pairs, closed after the test."""
    made: list[TwoParty] = []

    def make(**kw: Any) -> TwoParty:
        tp = TwoParty(**kw)
        made.append(tp)
        return tp

    yield make
    for tp in made:
        tp.close()

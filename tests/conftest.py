"""Fixtures shared by the tests (the helpers themselves live in helpers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from helpers import TwoParty, make_test_pki


@pytest.fixture(autouse=True)
def provider_state_home(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Providers keep their data sets' budget files under $XDG_STATE_HOME/spgc: a directory of
    each test's own, never the real home (daemons started as subprocesses inherit it)."""
    home = tmp_path_factory.mktemp("state-home")
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


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

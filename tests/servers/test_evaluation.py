"""Where the servers' test set comes from (servers/evaluation.py: test_set_loader)."""

from __future__ import annotations

from pathlib import Path

from spgc.servers import evaluation
from spgc.settings.config import ServerConfig


def _cfg(tmp_path: Path, **kw) -> ServerConfig:
    return ServerConfig(insecure=True, providers=["p1"], min_providers=1, state_dir=tmp_path, **kw)


def test_the_built_in_data_sets_test_split_by_default(tmp_path: Path) -> None:
    loader = evaluation.test_set_loader(_cfg(tmp_path))
    assert loader is not None
    x, y = loader()
    assert len(x) == len(y) > 0


def test_test_data_none_means_no_evaluation(tmp_path: Path) -> None:
    # docs/CONFIG.md: "none: no evaluation" (it was read as a data file's name).
    assert evaluation.test_set_loader(_cfg(tmp_path, test_data="none")) is None

"""What a provider checks of itself at its start, before it calls any server: its own model
(it builds, and per-example gradients work through every layer: a BatchNorm layer is named),
its own data (the file or loader, the label column, its part when ``provider_count`` > 1) and
the two together (every label within the model's outputs, every example read by the model).
Feature columns whose scales differ by more than 100x get a warning naming them (not an
error: the run goes on, but DP training on such data is poor; spgc.privacy.feature_stats).

The same check serves ``spgc config check`` on a provider's file (spgc/app/cli.py) and the
provider itself (:meth:`spgc.providers.client.ProviderClient.self_check`, run by ``spgc
provider`` and the Python API before connecting): a broken provider fails at once, naming the
problem, even while its servers are down. What depends on the servers' plan (their built-in
model and data set, the architecture they announce) is checked when the plan is known
(providers/plan_checks.py, ``ProviderClient.connect``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from spgc.learning.data import load_user_data, provider_part_of
from spgc.learning.gradients import check_model_on_data
from spgc.learning.models import check_per_example_compatible, parameter_count, resolve_model
from spgc.learning.trainable import TrainableCoordinates
from spgc.privacy.feature_stats import scale_warning
from spgc.settings.provider_config import ProviderConfig

__all__ = ["SelfCheck", "check_model_and_data"]


@dataclass
class SelfCheck:
    """What the check built: a note for ``spgc config check``'s line (empty when the model is
    the servers' built-in one, known only from their plan)."""

    note: str
    parameters: int | None = None  # the provider's own model's parameter count
    examples: int | None = None  # how many local examples its own data holds
    # Its feature columns' scales differ by more than spgc.privacy.feature_stats.MAX_SCALE_RATIO:
    # the
    # warning naming them (None otherwise), logged at start and printed by config check.
    scale_warning: str | None = None


def check_model_and_data(
    cfg: ProviderConfig, data: tuple[np.ndarray, np.ndarray] | None = None
) -> SelfCheck:
    """The provider's own model and data, built and read as the provider will (``data``: its
    examples when given in code rather than by ``cfg.data``). Raises ValueError (or OSError,
    or one of spgc.learning.data.DATA_ERRORS) in one line naming the problem."""
    model = None
    if cfg.model:
        model = resolve_model(cfg.model)
        check_per_example_compatible(model)
    x = y = None
    what = "the data given"
    names: tuple[str, ...] = ()
    if data is not None:
        x, y = np.asarray(data[0]), np.asarray(data[1])
    elif cfg.data:
        found = load_user_data(cfg.data, cfg.data_label, task=cfg.task or "classification")
        x, y, names = found.x_train, found.y_train, found.feature_names
        if cfg.provider_count > 1:  # as the provider splits it
            x, y = provider_part_of(x, y, cfg.data, cfg.provider_count, cfg.provider_index)
        what = f"data {cfg.data!r}"
    examples = None if x is None else len(x)
    # standardize: the servers release the statistics it is standardised with: no warning.
    warning = None if x is None or cfg.standardize else scale_warning(x, names)
    if warning is not None:
        warning = f"{what}: {warning}"
    if model is None:  # the servers' built-in model: see connect
        return SelfCheck("", examples=examples, scale_warning=warning)
    if x is not None and y is not None:
        check_model_on_data(model, x, y, what, task=cfg.task or "classification", loss=cfg.loss)
    count = parameter_count(model)
    trained = TrainableCoordinates.of_model(model).describe()
    return SelfCheck(f" (model {cfg.model}: {trained})", count, examples, warning)

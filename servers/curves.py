"""Training curves where ML people look: TensorBoard event files (``tensorboard_dir``).

Per ended round, at step = the round number: ``privacy/epsilon_spent``, ``test/loss`` and
``test/accuracy`` (where the server evaluates; a regression run ``test/mse``, ``test/mae`` and
``test/r2`` instead of the accuracy), ``round_seconds/<phase>`` (the phases of
``spgc_round_duration_seconds``), ``peer_bytes/sent`` and ``peer_bytes/received``,
``providers/in_round``. Written through torch's SummaryWriter, which needs the tensorboard
package (the optional extra ``pip install 'spgc[tensorboard]'``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from spgc.privacy.ledger_format import run_file_name
from spgc.servers.metrics import PHASES
from spgc.servers.round_phases import RoundRecord

__all__ = ["TrainingCurves"]


class TrainingCurves:
    """One server's curves, a TensorBoard run per training run: ``directory/run-<run id>``
    (created at the first ended round, when the run id is agreed; a restart that resumes the
    run goes on in the same one, a new run gets its own). :meth:`observe_round` per ended
    round."""

    def __init__(
        self, directory: Path, epsilon: Callable[[], float], run_id: Callable[[], str]
    ) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package
        except ImportError:
            raise ValueError(
                "tensorboard_dir needs the tensorboard package: pip install 'spgc[tensorboard]' "
                "(or pip install tensorboard)"
            ) from None
        directory.mkdir(parents=True, exist_ok=True)
        self._make_writer = SummaryWriter
        self.directory = directory
        self.writer: Any = None
        self.epsilon = epsilon
        self.run_id = run_id

    def observe_round(self, rec: RoundRecord) -> None:
        if self.writer is None:
            name = f"run-{run_file_name(self.run_id())}"
            self.writer = self._make_writer(log_dir=str(self.directory / name))
        step, add = rec.round, self.writer.add_scalar
        eps = self.epsilon()
        if not math.isinf(eps):
            add("privacy/epsilon_spent", eps, step)
        if rec.test_loss is not None:
            add("test/loss", rec.test_loss, step)
        if rec.test_accuracy is not None:
            add("test/accuracy", rec.test_accuracy, step)
        for name, value in rec.test_metrics.items():  # regression: test_mse -> test/mse
            add(f"test/{name.removeprefix('test_')}", value, step)
        for phase, keys in PHASES.items():
            seconds = next((rec.seconds[k] for k in keys if k in rec.seconds), None)
            if seconds is not None:
                add(f"round_seconds/{phase}", seconds, step)
        for direction, count in rec.peer_bytes.items():
            add(f"peer_bytes/{direction}", count, step)
        add("providers/in_round", len(rec.agreed), step)
        if rec.clip_norm:  # adaptive clipping: the round's C and its noisy unclipped count
            add("clip/norm", rec.clip_norm, step)
            if rec.noisy_count is not None:
                add("clip/noisy_unclipped_count", rec.noisy_count, step)
        self.writer.flush()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()

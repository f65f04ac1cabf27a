"""A provider's data and its batches: the local examples (its own loader or file, or its part
of a built-in data set) and each round's batch, drawn as the servers' plan says: Poisson
sampling at rate q, or the paper's fixed batches from shuffled passes, one per release (one of
:class:`~spgc.providers.client.ProviderClient`'s parts)."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from spgc.common.csprng import SecureRandom
from spgc.learning.data import (
    fixed_batches,
    load_dataset,
    load_user_data,
    poisson_batch,
    provider_part_of,
    split_among_providers,
)
from spgc.learning.local_training import selected_this_round
from spgc.providers.errors import ProviderRefusal, RoundFailed
from spgc.providers.plan_checks import round_sampling_rate
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import aggregation_pb2

__all__ = ["Batches"]

log = logging.getLogger("spgc.provider")

pb = aggregation_pb2


class Batches:
    """Data and batches (a part of ProviderClient: the attributes below are set by
    ``ProviderClient.__init__`` and ``connect``)."""

    cfg: ProviderConfig
    training: Any
    sampling_rng: SecureRandom
    _data: tuple[np.ndarray, np.ndarray] | None
    _x: np.ndarray | None
    _round_infos: list[Any]
    _epoch: tuple[int, list[np.ndarray]] | None
    _first_epoch: int | None

    def _load_data(self, tc: Any) -> tuple[np.ndarray, np.ndarray]:
        if self._data is not None:
            x, y = self._data
        elif self.cfg.data:
            try:
                # Class labels, or real targets when the plan's task is regression.
                task = tc.task or "classification"
                ds = load_user_data(self.cfg.data, self.cfg.data_label, task=task)
            except ValueError as exc:
                raise ProviderRefusal(f"data {self.cfg.data!r}: {exc}") from None
            x, y = ds.x_train, ds.y_train
            if self.cfg.provider_count > 1:  # one loader for all: this provider's part of it
                try:
                    x, y = provider_part_of(
                        x, y, self.cfg.data, self.cfg.provider_count, self.cfg.provider_index
                    )
                except ValueError as exc:
                    raise ProviderRefusal(str(exc)) from None
        else:
            dataset = self.cfg.dataset or tc.dataset
            if not dataset:
                raise ProviderRefusal(
                    "the servers' plan names no built-in data set (each provider brings its "
                    "own): set data: to a loader or a .csv/.npz file"
                )
            kw: dict[str, Any] = {}
            if self.cfg.dataset_path is not None:
                kw["path"] = self.cfg.dataset_path
            if self.cfg.split_seed is not None:
                kw["split_seed"] = self.cfg.split_seed
            ds = load_dataset(dataset, **kw)
            x, y = split_among_providers(
                ds.x_train, ds.y_train, self.cfg.provider_count, self.cfg.provider_index
            )
        return np.asarray(x), np.asarray(y)

    def draw_batch(self) -> np.ndarray:
        """Indices of this round's local batch, as the announced sampling says (adjacency
        provider: all the local examples, or none when this provider's coin leaves it out)."""
        assert self._x is not None
        tc, n = self.training, len(self._x)
        if tc.adjacency == "provider":  # all its data, in the rounds its own coin picks
            rate = tc.sampling_rate
            if tc.noise_schedule:  # the phase of the release this round would make
                rate = round_sampling_rate(tc, self._release_index())
            chosen = selected_this_round(self.sampling_rng, rate)
            return np.arange(n, dtype=np.int64) if chosen else np.zeros(0, dtype=np.int64)
        if tc.sampling == pb.BATCH_SAMPLING_POISSON:
            return poisson_batch(n, tc.sampling_rate, self.sampling_rng)
        return self._fixed_batch(self._release_index())

    def _fixed_release(self) -> int | None:
        """Fixed batches: the release number this round's release takes (None: Poisson)."""
        if self.training.sampling == pb.BATCH_SAMPLING_POISSON:
            return None
        return self._release_index()

    def _release_index(self) -> int:
        """The run's release number this round's release would take (both servers must say
        the same: RoundInfo.releases_counted); RoundFailed when they do not."""
        counts = {i.releases_counted for i in self._round_infos}
        if len(counts) != 1:
            raise RoundFailed(
                f"the servers count different releases ({sorted(counts)}): a fixed batch is "
                "drawn by the release number, sitting this round out"
            )
        return counts.pop()

    def _fixed_batch(self, r: int) -> np.ndarray:
        """Batch r mod E of the permutation drawn for epoch r // E (E = batches_per_epoch), so
        an example is in at most one release per epoch, as the accountant counts: a round with
        no release leaves r as it was and its batch is used again. A process started in the
        middle of an epoch joins at the next one: it cannot know which examples a previous run
        of this provider put in the releases of this epoch."""
        assert self._x is not None and self.training is not None
        per_epoch = self.training.batches_per_epoch
        epoch, position = divmod(r, per_epoch)
        if self._first_epoch is None:
            self._first_epoch = epoch if position == 0 else epoch + 1
            if position:
                log.info(
                    "fixed batches: joining at the next epoch (release %d); this epoch's "
                    "earlier batches may hold examples a previous start of this provider used",
                    self._first_epoch * per_epoch,
                )
        if epoch < self._first_epoch:
            raise RoundFailed(
                f"fixed batches: this provider joins at release {self._first_epoch * per_epoch}, "
                f"the next epoch (release {r} now): sitting this round out"
            )
        if self._epoch is None or self._epoch[0] != epoch:
            batches = list(fixed_batches(len(self._x), self.training.batch_size, self.sampling_rng))
            self._epoch = (epoch, batches)
        return self._epoch[1][position]

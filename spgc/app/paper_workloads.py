"""The paper's workloads and Table 1 figures, what `spgc bench comm` measures against.

SPGC paper (shared/seeds/004, section 5.2 and Table 1): three providers, each with its part of
the data and its batch size, and the gigabytes between the servers over a whole training.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "DATASETS",
    "DEFAULT_EPOCHS",
    "EPOCHS_NOTE",
    "GB",
    "LINK_SPEEDS",
    "PAPER_PROVIDERS",
    "PAPER_TABLE_LAMBDA",
    "PAPER_TABLE_RING_BITS",
    "PaperWorkload",
]

PAPER_PROVIDERS = 3
PAPER_TABLE_LAMBDA = 16
PAPER_TABLE_RING_BITS = 16
# The paper (seeds/004, section 5) gives data and batch sizes but not the number of epochs; its
# text refers to epoch 18 of Figure 1, so the accuracy curves run at least that far.
DEFAULT_EPOCHS = 20
EPOCHS_NOTE = (
    "the paper does not state its number of epochs (its text mentions epoch 18 of Figure 1); "
    "{epochs} epochs assumed (--epochs)"
)
GB = 1e9  # the paper's "GB" read as 10^9 bytes (it does not say)
# Links the round time is shown for (bits per second): between two organisations the link, not
# the CPU, is often what runs out.
LINK_SPEEDS: dict[str, float] = {"1gbit": 1e9, "10gbit": 1e10}



@dataclass(frozen=True)
class PaperWorkload:
    """The paper's workload for one dataset (seeds/004 section 5.2 and Table 1)."""

    rows_per_provider: int
    batch_per_provider: int
    paper_dim: int  # the paper's model size (Cancer: 90 binarised inputs -> 2, not ours)
    table1_spgc_gb: dict[float, float]  # whole-training GB between the servers, per epsilon
    table1_only_mpc_gb: float

    @property
    def steps_per_epoch(self) -> int:
        return self.rows_per_provider // self.batch_per_provider


DATASETS: dict[str, PaperWorkload] = {
    "mnist": PaperWorkload(
        20_000,
        1000,
        28_938,
        {0.01: 5172.0, 0.1: 5164.6, 0.5: 5094.6, 2.0: 5094.6, 8.0: 5018.8},
        289.2,
    ),
    "cancer": PaperWorkload(
        130, 10, 182, {0.01: 736.9, 0.1: 707.8, 0.5: 711.7, 2.0: 699.8, 8.0: 698.8}, 39.5
    ),
    "diabetes": PaperWorkload(
        200, 10, 642, {0.01: 81.6, 0.1: 78.4, 0.5: 78.9, 2.0: 77.5, 8.0: 77.5}, 4.4
    ),
}

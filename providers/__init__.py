"""The SPGC provider client (SPEC section 3, steps 1-5: the paper's Algorithm 1).

A provider holds part of a dataset, computes its clipped, fixed-point gradient sum for each
round and sends one additive share of it to each of the two servers (or, in the one-server
modes, its clear or locally noised sum to the single server). Installed as ``spgc.providers``;
run it with ``spgc provider --config provider.yaml``.
"""

from __future__ import annotations

from spgc.providers.client import ProviderClient, ProviderRefusal, RoundReport

__all__ = ["ProviderClient", "ProviderRefusal", "RoundReport"]

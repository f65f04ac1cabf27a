"""The SPGC provider client (SPEC section 3, steps 1-5: the paper's Algorithm 1).

A provider holds part of a dataset, computes its clipped, fixed-point gradient sum for each
round and sends one additive share of it to each of the two servers (or, in the one-server
modes, its clear or locally noised sum to the single server). Run it with
``python -m spgc.providers --config provider.yaml``.
"""

from __future__ import annotations

from spgc.providers.client import ProviderClient, ProviderRefusal, RoundReport
from spgc.providers.config import ProviderConfig, load_config

__all__ = ["ProviderClient", "ProviderConfig", "ProviderRefusal", "RoundReport", "load_config"]

"""Flower apps on SPGC (``pip install 'spgc[flower]'``): a ClientApp mod that sends each
client's clipped update to SPGC's two servers as shares, and a strategy wrapper that gives the
ServerApp's strategy only the noisy aggregate and the privacy spent (docs/FLOWER.md)::

    app = ClientApp(mods=[spgc_mod(load_my_data)])          # the ClientApp
    strategy = SpgcStrategy(FedAvg(...), SpgcServers(...))  # the ServerApp
"""

from __future__ import annotations

from spgc.app.flower.arrays import DimensionMismatch, flat_vector, record_like
from spgc.app.flower.client_mod import RUN_CONFIG_KEYS, FlowerProvider, provider_config, spgc_mod
from spgc.app.flower.servers_view import NoisyRound, ServersError, SpgcServers
from spgc.app.flower.strategy import ROUND_KEY, SpgcStrategy

__all__ = [
    "ROUND_KEY",
    "RUN_CONFIG_KEYS",
    "DimensionMismatch",
    "FlowerProvider",
    "NoisyRound",
    "ServersError",
    "SpgcServers",
    "SpgcStrategy",
    "flat_vector",
    "provider_config",
    "record_like",
    "spgc_mod",
]

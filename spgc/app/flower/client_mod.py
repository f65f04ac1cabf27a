"""The ClientApp's side: :func:`spgc_mod` sends each client's clipped update to SPGC's two
servers as shares (with norm proofs when the servers' plan verifies inputs) and replaces the
update in the reply, so Flower's ServerApp never sees an individual update.

On a train message the mod lets the ClientApp train as usual, takes the difference between the
arrays it returns and those it received, and hands that delta to :class:`FlowerProvider`, a
:class:`~spgc.providers.client.ProviderClient` whose local training is the one the ClientApp
just did: everything else is the provider's own code (joining the run and checking the
servers' plan, the coin of provider-level sampling, clipping to the plan's C, encoding,
sharing, the norm proof, the data set's budget file, submission and retries). The reply holds
an empty ArrayRecord and a MetricRecord of constants (``num-examples`` 1, the SPGC round):
no update, no data size, no training loss leaves the client except through SPGC.

The run config names the servers (:data:`RUN_CONFIG_KEYS`); the node config's
``partition-id`` names the provider (``spgc-name-prefix`` + id), which must be in both
servers' ``providers`` list.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context, Error, Message, MessageType, MetricRecord, RecordDict
from flwr.clientapp.typing import ClientAppCallable, Mod

from spgc.app.flower.arrays import DimensionMismatch, flat_vector
from spgc.app.flower.strategy import ROUND_KEY
from spgc.providers.client import ProviderClient, ProviderRefusal, RoundFailed, RoundReport
from spgc.providers.errors import ModelFailed, RunFailed
from spgc.settings.config import ConfigError, TlsPaths
from spgc.settings.provider_config import ProviderConfig

__all__ = ["RUN_CONFIG_KEYS", "FlowerProvider", "provider_config", "spgc_mod"]

log = logging.getLogger("spgc.flower")

#: The run config keys the mod reads (pyproject.toml's [tool.flwr.app.config]) and their
#: defaults (None: required).
RUN_CONFIG_KEYS: dict[str, object] = {
    "spgc-h1": None,  # H1's address, host:port
    "spgc-h2": None,  # H2's address
    "spgc-model": None,  # the servers' model, module:factory or file.py:factory
    "spgc-insecure": False,  # plaintext gRPC (development only)
    "spgc-tls-dir": "",  # NAME.pem, NAME.key and ca.pem (spgc certs); empty with insecure
    "spgc-name-prefix": "flower-",  # provider name: prefix + the node's partition-id
    "spgc-state-dir": "",  # the providers' budget files (empty: the provider's default)
    # The client's own privacy limits (ProviderConfig's keys of the same name; 0: unset): it
    # refuses a plan promising less, and leaves a run that would pass max_total_epsilon.
    "spgc-min-noise-multiplier": 0.0,
    "spgc-max-step-epsilon": 0.0,
    "spgc-max-total-epsilon": 0.0,
}

#: Error code of a reply whose client could not share its update (Flower's Error.code).
SHARE_FAILED = 1


class FlowerProvider(ProviderClient):
    """A provider whose local training is the ClientApp's: :meth:`share_delta` submits the
    delta the ClientApp's training made, into the SPGC round the ServerApp named."""

    _delta: np.ndarray | None = None
    _expected_round: int | None = None

    def share_delta(self, delta: np.ndarray, spgc_round: int) -> RoundReport:
        """Take part in SPGC round ``spgc_round`` with ``delta`` (float64, the servers' d):
        clipped, encoded, shared and sent by the provider's own code. RoundFailed when the
        servers collect another round (this client sits it out)."""
        if self.training is None:
            self.self_check()
            self.connect()
        d = int(self.training.num_parameters)
        if delta.shape != (d,):
            raise DimensionMismatch(
                f"the ClientApp's update holds {delta.size:,} values but the servers' model "
                f"has {d:,}"
            )
        self._delta, self._expected_round = delta[None, :].astype(np.float64), spgc_round
        try:
            report = self.run_round()
        finally:
            self._delta = self._expected_round = None
        if report is None:
            raise RoundFailed("the SPGC servers finished training")
        return report

    def wait_for_round(self) -> Any | None:
        info = super().wait_for_round()
        expected = self._expected_round
        if info is not None and expected is not None and info.round != expected:
            raise RoundFailed(
                f"the SPGC servers collect round {info.round}, the ServerApp's train message "
                f"is for round {expected}: sitting it out"
            )
        return info

    def local_delta(self, idx: np.ndarray) -> np.ndarray:
        """The ClientApp's update (it trained on all its data: ``idx`` is all of it)."""
        if self._delta is None:
            raise RoundFailed("no ClientApp update to share")
        return self._delta


def provider_config(run_config: dict[str, Any], partition_id: int) -> ProviderConfig:
    """The provider's configuration from the Flower run config (:data:`RUN_CONFIG_KEYS`);
    ConfigError (one line) naming a missing key."""
    values = {k: run_config.get(k, default) for k, default in RUN_CONFIG_KEYS.items()}
    missing = [k for k, v in values.items() if RUN_CONFIG_KEYS[k] is None and v in (None, "")]
    if missing:
        raise ConfigError(f"the Flower run config lacks {', '.join(missing)} (spgc_mod)")
    name = f"{values['spgc-name-prefix']}{partition_id}"
    tls = None
    if values["spgc-tls-dir"]:
        d = Path(str(values["spgc-tls-dir"]))
        tls = TlsPaths(cert=d / f"{name}.pem", key=d / f"{name}.key", ca=d / "ca.pem")
    return ProviderConfig(
        name=name,
        h1_address=str(values["spgc-h1"]),
        h2_address=str(values["spgc-h2"]),
        insecure=bool(values["spgc-insecure"]),
        tls=tls,
        model=str(values["spgc-model"]),
        state_dir=Path(str(values["spgc-state-dir"])) if values["spgc-state-dir"] else None,
        min_noise_multiplier=_limit(values["spgc-min-noise-multiplier"]),
        max_step_epsilon=_limit(values["spgc-max-step-epsilon"]),
        max_total_epsilon=_limit(values["spgc-max-total-epsilon"]),
    )


def _limit(value: object) -> float | None:
    """A privacy limit of the run config: 0 (the default) leaves it unset."""
    number = float(value)  # type: ignore[arg-type]
    return number if number > 0 else None


# One provider per node name in this process: it keeps its run, its coin's generator and its
# budget file between rounds (a Flower simulation may run a node in another worker process
# later: that one joins the same run again, as a restarted provider does).
_providers: dict[tuple[int, str], FlowerProvider] = {}
_providers_lock = threading.Lock()


def _provider_for(
    context: Context, data_of: Callable[[Context], tuple[np.ndarray, np.ndarray]]
) -> FlowerProvider:
    partition = int(context.node_config.get("partition-id", 0))
    cfg = provider_config(dict(context.run_config), partition)
    key = (int(context.run_id), cfg.name)
    with _providers_lock:
        provider = _providers.get(key)
        if provider is None:
            x, y = data_of(context)
            provider = _providers[key] = FlowerProvider(cfg, data=(np.asarray(x), np.asarray(y)))
        return provider


def spgc_mod(data_of: Callable[[Context], tuple[np.ndarray, np.ndarray]]) -> Mod:
    """The ClientApp mod; ``data_of(context)``: this node's training data (x, y), the data its
    train function trains on (the provider checks the servers' model on it and keeps its
    budget file by its contents)."""

    def mod(msg: Message, context: Context, call_next: ClientAppCallable) -> Message:
        if msg.metadata.message_type != MessageType.TRAIN:
            return call_next(msg, context)
        if len(msg.content.array_records) != 1 or len(msg.content.config_records) != 1:
            return _failed(msg, "spgc_mod needs one ArrayRecord and one ConfigRecord")
        config = next(iter(msg.content.config_records.values()))
        if ROUND_KEY not in config:
            return _failed(msg, f"no {ROUND_KEY} in the train config: wrap the ServerApp's "
                                "strategy in spgc.app.flower.SpgcStrategy")  # fmt: skip
        sent = next(iter(msg.content.array_records.values()))
        reply = call_next(msg, context)
        if reply.has_error():
            return reply
        if len(reply.content.array_records) != 1:
            return _failed(msg, "the ClientApp's reply must hold one ArrayRecord")
        trained = next(iter(reply.content.array_records.values()))
        if list(trained.keys()) != list(sent.keys()):
            return _failed(msg, "the ClientApp's reply has other arrays than it was sent")
        try:
            provider = _provider_for(context, data_of)
            delta = flat_vector(trained) - flat_vector(sent)
            report = provider.share_delta(delta, int(config[ROUND_KEY]))  # type: ignore[arg-type]
        except (ConfigError, DimensionMismatch, ProviderRefusal, RoundFailed, RunFailed,
                ModelFailed) as exc:  # fmt: skip
            log.warning("spgc_mod: %s", exc)
            return _failed(msg, str(exc))
        content = RecordDict(
            {
                "arrays": ArrayRecord(),
                "metrics": MetricRecord(
                    {"num-examples": 1, ROUND_KEY: report.round, "accepted": int(report.accepted)}
                ),
            }
        )
        return Message(content, reply_to=msg)

    return mod


def _failed(msg: Message, reason: str) -> Message:
    return Message(Error(code=SHARE_FAILED, reason=reason), reply_to=msg)

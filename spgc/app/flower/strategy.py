"""The ServerApp's side: :class:`SpgcStrategy` wraps a Flower strategy (FedAvg, FedAdam, ...)
so that its update rule runs on SPGC's noisy aggregate instead of the clients' replies.

- ``configure_train`` asks the SPGC servers which round they collect and puts it in the train
  config (:data:`ROUND_KEY`): every ClientApp's ``spgc_mod`` shares into that round, or sits it
  out. The wrapped strategy picks the nodes as it would (it must pick every node: see below).
- ``aggregate_train`` never reads a reply's arrays (the mod sends none). It waits until both
  servers are past the round, reads the noisy mean delta (:class:`SpgcServers`) and hands the
  wrapped strategy ONE reply holding ``global + noisy mean delta`` at weight 1: FedAvg's
  average of it is exactly that; FedAdam, FedYogi, FedAvgM take ``it - global`` as their
  pseudo-gradient as they always do. The metrics are the privacy spent, as both servers count
  it (``epsilon``), the SPGC round and the number of releases.

Sampling, and so the accountant's rate: SPGC's own coin. Each client's mod flips the coin of
the servers' plan (``sampling_rate``, from its CSPRNG) and, when it says no, shares zeros
instead of its delta; neither server nor the ServerApp learns which. Flower's own sampling is
done by the ServerApp, which knows (and could choose) whom it asked, so no amplification may be
claimed for it: the wrapper requires the wrapped strategy to send every node a train message
(``fraction_train`` 1), and the servers' accountant counts the coin's rate only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from spgc.app.flower.arrays import check_dimension, flat_vector, record_like
from spgc.app.flower.servers_view import SpgcServers

__all__ = ["ROUND_KEY", "SpgcStrategy"]

log = logging.getLogger("spgc.flower")

#: The train config key naming the SPGC round a Flower round shares into.
ROUND_KEY = "spgc-round"


class SpgcStrategy(Strategy):
    """``strategy``'s update rule on the noisy aggregate of SPGC's two ``servers``."""

    def __init__(self, strategy: Strategy, servers: SpgcServers, round_timeout: float = 600.0):
        fraction = getattr(strategy, "fraction_train", 1.0)
        if fraction != 1.0:
            raise ValueError(
                f"the wrapped strategy samples fraction_train={fraction}: with SPGC every node "
                "gets the train message and SPGC's coin (the servers' sampling_rate) samples; "
                "set fraction_train=1.0"
            )
        self.strategy = strategy
        self.servers = servers
        self.round_timeout = round_timeout
        self.arrayrecord_key = str(getattr(strategy, "arrayrecord_key", "arrays"))
        self.weighted_by_key = str(getattr(strategy, "weighted_by_key", "num-examples"))
        # Flower round -> (its SPGC round, the global arrays sent with it).
        self._rounds: dict[int, tuple[int, ArrayRecord]] = {}

    def summary(self) -> None:
        log.info("SpgcStrategy: the noisy aggregate of SPGC's two servers, through:")
        self.strategy.summary()

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        check_dimension(arrays, int(self.servers.config.num_parameters), "the servers' model")
        spgc_round = self.servers.collecting_round(self.round_timeout)
        self._rounds[server_round] = (spgc_round, arrays)
        config = ConfigRecord({**dict(config), ROUND_KEY: spgc_round})
        return self.strategy.configure_train(server_round, arrays, config, grid)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        spgc_round, arrays = self._rounds.pop(server_round)
        failed = sum(1 for m in replies if m.has_error())  # the replies carry no arrays
        noisy = self.servers.noisy_round(spgc_round, self.round_timeout)
        metrics = MetricRecord(
            {"epsilon": float(noisy.epsilon), "spgc-round": spgc_round,
             "spgc-releases": int(noisy.releases), "clients-failed": failed}
        )  # fmt: skip
        if noisy.mean_delta is None:  # aborted: nothing released, the model stays
            log.warning("SPGC round %d was aborted: no update this round", spgc_round)
            return None, metrics
        aggregate = record_like(arrays, flat_vector(arrays) + noisy.mean_delta)
        content = RecordDict(
            {self.arrayrecord_key: aggregate, "metrics": MetricRecord({self.weighted_by_key: 1})}
        )
        one = Message(content, dst_node_id=0, message_type=MessageType.TRAIN)
        new_arrays, _ = self.strategy.aggregate_train(server_round, [one])
        return new_arrays, metrics

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        return self.strategy.configure_evaluate(server_round, arrays, config, grid)

    def aggregate_evaluate(
        self, server_round: int, replies: Iterable[Message]
    ) -> MetricRecord | None:
        return self.strategy.aggregate_evaluate(server_round, replies)

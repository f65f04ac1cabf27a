"""What a Flower ServerApp reads from SPGC's two servers: the round they collect, and after it
the noisy aggregate, each server's word checked against the other's.

The ServerApp calls the servers' Aggregator service as a registered party of the run (its name
is in both servers' ``providers`` list, as a provider's is). It says Hello, then declines the
plan (DeclinePlan): it never shares, so no round waits for it and it never counts among the
providers present. Per SPGC round t it reads:

- the round both servers collect (RoundStatus), which the strategy wrapper hands the
  ClientApps with the train message, so that every client shares into that round;
- after round t: models version v and v + 1 from BOTH servers (FetchModel; they must be equal,
  value for value), whose difference is the servers' step on the noisy sum. With the plan's
  ``adjacency: provider`` and ``server_optimizer: sgd`` (FedAvg's step) at learning rate lr,
  v + 1 = v + lr * (Y / s) / E[providers], so the noisy mean delta is (v + 1 - v) / lr: the
  only data-dependent thing the ServerApp receives, and already released (post-processing);
- the privacy both servers count as spent so far (RoundInfo.epsilon_spent, the larger).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import grpc
import numpy as np

from spgc.wire import PROTOCOL_VERSION, aggregation_pb2, aggregation_pb2_grpc
from spgc.wire.errors import WireError
from spgc.wire.messages import read_model_stream
from spgc.wire.tls import TlsFiles
from spgc.wire.transport import make_channel

__all__ = ["NoisyRound", "ServersError", "SpgcServers"]

pb = aggregation_pb2

#: Why the ServerApp's name sends no share (DeclinePlan's reason, in the servers' log).
SERVERAPP_REASON = "a Flower ServerApp: it reads the noisy aggregate and shares nothing"

#: Seconds between two RoundStatus calls while waiting for the servers.
POLL_SECONDS = 0.2


class ServersError(RuntimeError):
    """The SPGC servers cannot serve this Flower app (one line: why)."""


@dataclass(frozen=True)
class NoisyRound:
    """What SPGC round ``round`` released: the noisy mean of the clipped deltas over the
    expected providers (None when the round was aborted: no release), and the privacy spent."""

    round: int
    mean_delta: np.ndarray | None
    epsilon: float
    releases: int


class SpgcServers:
    """The two servers as the ServerApp sees them (see the module docstring)."""

    def __init__(
        self,
        h1_address: str,
        h2_address: str,
        name: str,
        *,
        insecure: bool = False,
        tls: TlsFiles | None = None,
        h1_name: str = "h1",
        h2_name: str = "h2",
        rpc_timeout: float = 60.0,
        connect_timeout: float = 120.0,
    ) -> None:
        self.name = name
        self.rpc_timeout = rpc_timeout
        self.connect_timeout = connect_timeout
        self._servers: list[tuple[str, Any, Any]] = []
        for address, server_name in ((h1_address, h1_name), (h2_address, h2_name)):
            channel = make_channel(address, tls, insecure=insecure, server_name=server_name)
            stub = aggregation_pb2_grpc.AggregatorStub(channel)
            self._servers.append((server_name, channel, stub))
        self._config: Any = None

    def close(self) -> None:
        for _, channel, _ in self._servers:
            channel.close()

    @property
    def config(self) -> Any:
        """The TrainingConfig both servers announce (Hello; they must be identical), checked to
        be one this wrapper can read the noisy aggregate of."""
        if self._config is None:
            configs = []
            for server_name, _, stub in self._servers:
                request = pb.HelloRequest(protocol_version=PROTOCOL_VERSION, provider_id=self.name)
                info = self._call(lambda s=stub, r=request: s.Hello(r, timeout=self.rpc_timeout),
                                  f"Hello at {server_name}")  # fmt: skip
                configs.append(info.config)
            # Hello made this name a party of the run; declining the plan tells each server
            # that no share will come from it, so no round waits for one (the ServerApp is
            # counted out as a provider that declined, with this reason).
            for server_name, _, stub in self._servers:
                request = pb.DeclineRequest(
                    run_id=configs[0].run_id, provider_id=self.name, reason=SERVERAPP_REASON
                )
                self._call(lambda s=stub, r=request: s.DeclinePlan(r, timeout=self.rpc_timeout),
                           f"DeclinePlan at {server_name}")  # fmt: skip
            a, b = (c.SerializeToString(deterministic=True) for c in configs)
            if a != b:
                raise ServersError("the two SPGC servers announce different training plans")
            tc = configs[0]
            if tc.adjacency != "provider" or tc.server_optimizer != "sgd":
                raise ServersError(
                    f"the SPGC servers' plan has adjacency {tc.adjacency or 'example'!r} and "
                    f"server_optimizer {tc.server_optimizer!r}: a Flower app needs adjacency: "
                    "provider and server_optimizer: sgd (the Flower strategy makes the step)"
                )
            if not tc.learning_rate > 0:
                raise ServersError(f"the servers' learning rate is {tc.learning_rate}")
            self._config = tc
        return self._config

    def _call(self, fn: Any, what: str) -> Any:
        """``fn()``; a server that is not up yet (UNAVAILABLE: starting, or before the two
        servers' handshake) is asked again for up to ``connect_timeout`` s."""
        end = time.monotonic() + self.connect_timeout
        while True:
            try:
                return fn()
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > end:
                    raise ServersError(f"{what}: {exc.code().name}: {exc.details()}") from None
            time.sleep(POLL_SECONDS)

    def _status(self, index: int, round_number: int | None = None) -> Any:
        server_name, _, stub = self._servers[index]
        if round_number is None:
            request = pb.RoundStatusRequest(provider_id=self.name)
        else:
            request = pb.RoundStatusRequest(round=round_number, provider_id=self.name)
        return self._call(
            lambda: stub.RoundStatus(request, timeout=self.rpc_timeout),
            f"RoundStatus at {server_name}",
        )

    def collecting_round(self, timeout: float) -> int:
        """The round both servers collect now (waiting up to ``timeout`` s for it)."""
        _ = self.config
        end = time.monotonic() + timeout
        while True:
            infos = [self._status(i) for i in range(len(self._servers))]
            if any(i.phase == pb.ROUND_PHASE_FINISHED for i in infos):
                raise ServersError(
                    "the SPGC servers finished training (their rounds or budget are spent): "
                    "give them as many rounds as the Flower app's num-server-rounds"
                )
            rounds = {i.round for i in infos}
            if all(i.phase == pb.ROUND_PHASE_COLLECTING for i in infos) and len(rounds) == 1:
                return rounds.pop()
            if time.monotonic() > end:
                raise ServersError(
                    f"the SPGC servers did not collect one round within {timeout:g} s "
                    f"(phases {[pb.RoundPhase.Name(i.phase) for i in infos]})"
                )
            time.sleep(POLL_SECONDS)

    def noisy_round(self, round_number: int, timeout: float) -> NoisyRound:
        """Wait until both servers are past ``round_number``, then read what it released."""
        tc = self.config
        end = time.monotonic() + timeout
        while True:
            infos = [self._status(i, round_number) for i in range(len(self._servers))]
            phases = {i.phase for i in infos}
            if phases <= {pb.ROUND_PHASE_PUBLISHED, pb.ROUND_PHASE_ABORTED}:
                break
            if time.monotonic() > end:
                raise ServersError(
                    f"SPGC round {round_number} did not end within {timeout:g} s "
                    f"(phases {[pb.RoundPhase.Name(i.phase) for i in infos]})"
                )
            time.sleep(POLL_SECONDS)
        if len(phases) != 1:
            raise ServersError(f"the servers disagree whether round {round_number} published")
        now = [self._status(i) for i in range(len(self._servers))]
        epsilon = max(i.epsilon_spent for i in now)
        releases = max(i.releases_counted for i in now)
        if phases == {pb.ROUND_PHASE_ABORTED}:
            return NoisyRound(round_number, None, epsilon, releases)
        version = infos[0].model_version
        before = self._model_both(version, tc.num_parameters)
        after = self._model_both(version + 1, tc.num_parameters)
        return NoisyRound(round_number, (after - before) / tc.learning_rate, epsilon, releases)

    def model(self, version: int) -> np.ndarray:
        """Model ``version`` (its trained coordinates, float64), the same at both servers:
        version 0 is where the servers' plan starts (a Flower app may start there too)."""
        return self._model_both(version, int(self.config.num_parameters))

    def _model_both(self, version: int, num_parameters: int) -> np.ndarray:
        """Model ``version`` from each server; ServersError unless they are equal."""
        got = []
        for server_name, _, stub in self._servers:
            request = pb.ModelRequest(version=version, provider_id=self.name)

            def fetch(s: Any = stub, r: Any = request) -> np.ndarray:
                try:
                    _, params = read_model_stream(
                        s.FetchModel(r, timeout=self.rpc_timeout),
                        version=version,
                        num_parameters=num_parameters,
                    )
                except WireError as exc:
                    raise ServersError(f"a malformed model: {exc}") from None
                return params

            got.append(self._call(fetch, f"FetchModel v{version} from {server_name}"))
        if not np.array_equal(got[0], got[1]):
            raise ServersError(f"the two SPGC servers serve different models of version {version}")
        return got[0]

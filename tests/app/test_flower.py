"""Flower apps on SPGC (spgc.app.flower, the flower extra): the arrays, the strategy wrapper's
rule on the noisy aggregate, the ClientApp mod, and a Flower app trained through two real
SPGC servers (the Flower messages delivered in threads, as a Grid would)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

flwr = pytest.importorskip("flwr", reason="the flower extra is not installed")

from flwr.app import (  # noqa: E402
    Array,
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp  # noqa: E402
from flwr.serverapp.strategy import FedAdam, FedAvg  # noqa: E402
from flwr.supercore.task_identity import TaskIdentity  # noqa: E402

from spgc.app.demo import free_ports  # noqa: E402
from spgc.app.flower import (  # noqa: E402
    ROUND_KEY,
    DimensionMismatch,
    NoisyRound,
    ServersError,
    SpgcServers,
    SpgcStrategy,
    flat_vector,
    provider_config,
    record_like,
    spgc_mod,
)
from spgc.learning.data import load_user_data  # noqa: E402
from spgc.learning.models import load_flat_params, resolve_model  # noqa: E402
from spgc.protocol.certs import make_dev_pki  # noqa: E402
from spgc.servers.daemon import ServerDaemon  # noqa: E402
from spgc.settings.config import ConfigError, ServerConfig, TlsPaths  # noqa: E402
from spgc.wire.tls import TlsFiles  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "custom-model" / "model.py"
MODEL = f"{EXAMPLE}:build_model"
DATA = f"{EXAMPLE}:load_digits_data"


@pytest.fixture(autouse=True)
def _flower_task_identity() -> Iterator[None]:
    """Flower's messages name the run of the process they are made in (set by its runtime)."""
    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 7, 1, 0
    yield
    TaskIdentity.run_id = TaskIdentity.task_id = TaskIdentity.node_id = None


def _record(*shapes: tuple[int, ...], seed: int = 0) -> ArrayRecord:
    rng = np.random.default_rng(seed)
    return ArrayRecord(
        {f"a{i}": Array(np.asarray(rng.normal(size=s), np.float32)) for i, s in enumerate(shapes)}
    )


def test_arrays_flatten_in_key_order_and_come_back_with_their_shapes_and_dtypes():
    rec = _record((2, 3), (4,))
    flat = flat_vector(rec)
    assert flat.dtype == np.float64 and flat.shape == (10,)
    back = record_like(rec, flat + 1.0)
    assert list(back.keys()) == ["a0", "a1"]
    for a, b in zip(rec.to_numpy_ndarrays(), back.to_numpy_ndarrays(), strict=True):
        assert b.shape == a.shape and b.dtype == a.dtype
        np.testing.assert_allclose(b, a + 1.0, rtol=1e-6)
    with pytest.raises(DimensionMismatch, match="hold 10 values but the vector has 9"):
        record_like(rec, np.zeros(9))


class RecordedServers:
    """The servers' answers, recorded: what SpgcStrategy reads (SpgcServers' interface)."""

    def __init__(self, d: int, deltas: dict[int, np.ndarray | None]) -> None:
        self.config = SimpleNamespace(num_parameters=d)
        self.deltas = deltas
        self.next_round = 3

    def collecting_round(self, timeout: float) -> int:
        return self.next_round

    def noisy_round(self, round_number: int, timeout: float) -> NoisyRound:
        self.next_round = round_number + 1
        return NoisyRound(round_number, self.deltas[round_number], 0.5 * round_number, round_number)


class OneNodeGrid:
    def get_node_ids(self) -> Iterable[int]:
        return [11, 12]


def _reply_with(arrays: ArrayRecord) -> Message:
    """A client reply carrying arrays: the wrapper must never read them."""
    content = RecordDict({"arrays": arrays, "metrics": MetricRecord({"num-examples": 1})})
    return Message(content, dst_node_id=0, message_type=MessageType.TRAIN)


def test_fedavg_through_spgc_is_global_plus_the_noisy_mean_delta_whatever_clients_reply():
    rec = _record((2, 3), (4,))
    delta = np.linspace(-1, 1, 10)
    servers = RecordedServers(10, {3: delta})
    strategy = SpgcStrategy(FedAvg(), servers)  # type: ignore[arg-type]
    messages = list(strategy.configure_train(1, rec, ConfigRecord({"lr": 0.1}), OneNodeGrid()))
    assert len(messages) == 2  # every node is asked; SPGC's coin samples
    for m in messages:
        assert m.content["config"][ROUND_KEY] == 3 and m.content["config"]["lr"] == 0.1
    poisoned = _reply_with(record_like(rec, np.full(10, 1e6)))
    arrays, metrics = strategy.aggregate_train(1, [poisoned])
    np.testing.assert_allclose(flat_vector(arrays), flat_vector(rec) + delta, rtol=1e-6)
    assert metrics["epsilon"] == 1.5 and metrics["spgc-round"] == 3


def test_fedadam_applies_its_own_rule_to_the_noisy_aggregate():
    rec = _record((5,))
    delta = np.array([0.1, -0.2, 0.0, 0.3, -0.4])
    strategy = SpgcStrategy(FedAdam(eta=0.01), RecordedServers(5, {3: delta}))  # type: ignore[arg-type]
    list(strategy.configure_train(1, rec, ConfigRecord(), OneNodeGrid()))
    arrays, _ = strategy.aggregate_train(1, [])
    moved = flat_vector(arrays) - flat_vector(rec)
    # Adam's first step moves each coordinate by about eta in the delta's direction.
    assert np.all(np.sign(moved[delta != 0]) == np.sign(delta[delta != 0]))
    assert not np.allclose(moved, delta)


def test_an_aborted_round_leaves_the_model_and_bad_settings_are_refused_in_one_line():
    strategy = SpgcStrategy(FedAvg(), RecordedServers(5, {3: None}))  # type: ignore[arg-type]
    list(strategy.configure_train(1, _record((5,)), ConfigRecord(), OneNodeGrid()))
    arrays, metrics = strategy.aggregate_train(1, [])
    assert arrays is None and metrics["spgc-round"] == 3
    with pytest.raises(ValueError, match=r"fraction_train=0.5: .* set fraction_train=1.0"):
        SpgcStrategy(FedAvg(fraction_train=0.5), RecordedServers(5, {}))  # type: ignore[arg-type]
    wrong = SpgcStrategy(FedAvg(), RecordedServers(6, {}))  # type: ignore[arg-type]
    with pytest.raises(DimensionMismatch, match="hold 5 values but the servers' model has 6"):
        wrong.configure_train(1, _record((5,)), ConfigRecord(), OneNodeGrid())


def test_the_run_config_names_the_servers_and_a_missing_key_is_named():
    cfg = provider_config(
        {
            "spgc-h1": "a:1",
            "spgc-h2": "b:2",
            "spgc-model": "m.py:f",
            "spgc-insecure": True,
            "spgc-min-noise-multiplier": 0.5,
        },
        4,
    )
    assert cfg.min_noise_multiplier == 0.5 and cfg.max_total_epsilon is None
    assert (cfg.name, cfg.h1_address, cfg.h2_address, cfg.model) == ("flower-4", "a:1", "b:2",
                                                                      "m.py:f")  # fmt: skip
    with pytest.raises(ConfigError, match="lacks spgc-h2, spgc-model"):
        provider_config({"spgc-h1": "a:1", "spgc-insecure": True}, 0)


def _train_message(arrays: ArrayRecord, config: dict[str, Any]) -> Message:
    content = RecordDict({"arrays": arrays, "config": ConfigRecord(config)})
    return Message(content, dst_node_id=1, message_type=MessageType.TRAIN)


def _context(partition: int, run_config: dict[str, Any]) -> Context:
    return Context(run_id=7, node_id=100 + partition, node_config={"partition-id": partition},
                   state=RecordDict(), run_config=run_config)  # fmt: skip


def test_the_mod_refuses_a_train_message_without_the_spgc_round():
    app = ClientApp(mods=[spgc_mod(lambda ctx: (np.zeros((1, 1)), np.zeros(1)))])
    called = []

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        called.append(1)
        return msg

    reply = app(_train_message(_record((3,)), {}), _context(0, {}))
    assert reply.has_error() and "wrap the ServerApp's strategy" in reply.error.reason
    assert not called  # the client trains only for a round it can share into


# ---------------------------------------------------------------- through two real servers

NAMES = ["flower-0", "flower-1", "flower-server"]


def _server_cfg(pki: Path, role: int, state: Path, **changes: Any) -> ServerConfig:
    name = f"h{role}"
    values: dict[str, Any] = {
        "role": role,
        "listen": "127.0.0.1:0",
        "peer_listen": "127.0.0.1:0",
        "peer_address": "127.0.0.1:1",
        "peer_name": f"h{3 - role}",
        "gc_address": "127.0.0.1:0",
        "tls": TlsPaths(cert=pki / f"{name}.pem", key=pki / f"{name}.key", ca=pki / "ca.pem"),
        "providers": NAMES,
        "dataset": "",
        "model": MODEL,
        "test_data": DATA,
        "adjacency": "provider",
        "sampling_rate": 1.0,
        "min_providers": 2,
        "round_deadline": 60.0,
        "rounds": 2,
        "target_epsilon": 50.0,
        "state_dir": state,
        "connect_timeout": 20.0,
        "verify_inputs": "l2",
        "scale": 2.0**12,
    }
    return ServerConfig(**{**values, **changes})


def _digits_part(partition: int) -> tuple[np.ndarray, np.ndarray]:
    ds = load_user_data(DATA)
    return ds.x_train[partition::2], ds.y_train[partition::2]


def _local_sgd(arrays: ArrayRecord, x: np.ndarray, y: np.ndarray) -> ArrayRecord:
    """The ClientApp's own training: one epoch of SGD on its data, from the arrays it got."""
    model = resolve_model(MODEL)
    load_flat_params(model, flat_vector(arrays))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    xt, yt = torch.as_tensor(x, dtype=torch.float32), torch.as_tensor(y)
    for start in range(0, len(x), 32):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(
            model(xt[start : start + 32]), yt[start : start + 32]
        ).backward()
        opt.step()
    return ArrayRecord(model.state_dict())


class ThreadGrid:
    """Delivers the ServerApp's messages to the nodes' ClientApps, each in its own thread (the
    nodes of a Flower deployment train at the same time); records what the ServerApp got."""

    def __init__(self, app: ClientApp, contexts: dict[int, Context]) -> None:
        self.app, self.contexts = app, contexts
        self.received: list[Message] = []

    def get_node_ids(self) -> Iterable[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], timeout: float) -> list[Message]:
        messages = list(messages)
        replies: list[Message | None] = [None] * len(messages)

        def deliver(i: int) -> None:
            m = messages[i]
            replies[i] = self.app(m, self.contexts[m.metadata.dst_node_id])

        threads = [threading.Thread(target=deliver, args=(i,)) for i in range(len(messages))]
        for th in threads:
            th.start()
        for th in threads:
            th.join(timeout)
        got = [r for r in replies if r is not None]
        self.received += got
        return got


@contextlib.contextmanager
def _two_servers(
    tmp_path: Path, **changes: Any
) -> Iterator[tuple[ServerDaemon, ServerDaemon, Path]]:
    pki = tmp_path / "pki"
    make_dev_pki(pki, ["h1", "h2", *NAMES])
    for sub in ("s1", "s2"):
        (tmp_path / sub).mkdir()
    d1 = ServerDaemon(_server_cfg(pki, 1, tmp_path / "s1", **changes)).bind()
    d2 = ServerDaemon(_server_cfg(pki, 2, tmp_path / "s2", **changes)).bind()
    d1.cfg.peer_address = f"127.0.0.1:{d2.peer_port}"
    d2.cfg.gc_address = f"127.0.0.1:{d1.gc_port}"
    d2.start()
    d1.start()
    try:
        yield d1, d2, pki
    finally:
        d1.stop()
        d2.stop()


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[ServerDaemon, ServerDaemon, Path]]:
    with _two_servers(tmp_path) as pair:
        yield pair


def test_the_serverapp_refuses_servers_whose_plan_it_cannot_read_in_one_line(
    tmp_path: Path,
) -> None:
    with _two_servers(tmp_path, adjacency="example", sampling_rate=0.5,
                      max_batch_size=64) as (d1, d2, pki):  # fmt: skip
        view = SpgcServers(f"127.0.0.1:{d1.port}", f"127.0.0.1:{d2.port}", "flower-server",
                           tls=TlsFiles.from_dir(pki, "flower-server"))  # fmt: skip
        try:
            with pytest.raises(ServersError, match="needs adjacency: provider and server_opt"):
                _ = view.config
        finally:
            view.close()


def test_a_flower_app_trains_through_two_spgc_servers_and_sees_only_the_noisy_aggregate(
    servers: tuple[ServerDaemon, ServerDaemon, Path], tmp_path: Path
) -> None:
    d1, d2, pki = servers
    run_config = {
        "spgc-h1": f"127.0.0.1:{d1.port}", "spgc-h2": f"127.0.0.1:{d2.port}",
        "spgc-model": MODEL, "spgc-tls-dir": str(pki), "spgc-state-dir": str(tmp_path / "p"),
        "spgc-min-noise-multiplier": 0.2,
    }  # fmt: skip
    app = ClientApp(mods=[spgc_mod(lambda ctx: _digits_part(int(ctx.node_config["partition-id"])))])

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        x, y = _digits_part(int(ctx.node_config["partition-id"]))
        trained = _local_sgd(msg.content["arrays"], x, y)
        metrics = MetricRecord({"num-examples": len(x), "train-loss": 0.25})
        return Message(RecordDict({"arrays": trained, "metrics": metrics}), reply_to=msg)

    view = SpgcServers(
        f"127.0.0.1:{d1.port}", f"127.0.0.1:{d2.port}", "flower-server",
        tls=TlsFiles.from_dir(pki, "flower-server"),
    )  # fmt: skip
    try:
        strategy = SpgcStrategy(FedAvg(), view, round_timeout=120)
        grid = ThreadGrid(app, {100 + p: _context(p, run_config) for p in (0, 1)})
        # The Flower app starts from the servers' initial model (both sides' FedAvg steps are
        # then one and the same: the servers' model after each round is the Flower model).
        template = ArrayRecord(resolve_model(MODEL).state_dict())
        arrays = record_like(template, d1.state.model(0)[1])
        epsilons = []
        for flower_round in (1, 2):
            sent = strategy.configure_train(flower_round, arrays, ConfigRecord(), grid)
            replies = grid.send_and_receive(sent, timeout=120)
            assert len(replies) == 2 and not any(r.has_error() for r in replies), [
                r.error.reason for r in replies if r.has_error()
            ]
            new, metrics = strategy.aggregate_train(flower_round, replies)
            assert new is not None
            arrays = new
            epsilons.append(metrics["epsilon"])
        assert d1.wait(60) and d2.wait(60)
    finally:
        view.close()
    # The ServerApp got no client's arrays, data size or loss: empty records and constants.
    for reply in grid.received:
        assert all(len(r) == 0 for r in reply.content.array_records.values())
        assert dict(reply.content["metrics"]) == {
            "num-examples": 1, ROUND_KEY: reply.content["metrics"][ROUND_KEY], "accepted": 1,
        }  # fmt: skip
    # Its model is the servers' (float32 arrays of the float64 vector), and its epsilon theirs.
    final = d1.state.model(None)[1]
    np.testing.assert_allclose(flat_vector(arrays), final, rtol=0, atol=1e-5)
    summary = d1.state.summary()
    assert summary["steps"] == 2 and summary["failure"] is None
    assert 0 < epsilons[0] < epsilons[1] == pytest.approx(summary["epsilon"])
    # The ServerApp's name declined the plan: it never counted as a provider of a round.
    assert [h["providers_used"] for h in summary["history"]] == [2, 2]


# ---------------------------------------------------------------- examples/flower, with flwr run


# Flower's simulation engine starts a Ray cluster: never beside the Ray worker tests' own.
@pytest.mark.xdist_group("ray")
def test_the_flower_example_runs_on_flowers_simulation_engine(tmp_path: Path) -> None:
    """examples/flower's run.sh, shortened to 2 rounds: flwr run on Flower's simulation engine
    against SPGC's two servers; its JSON line's epsilon is the servers' and the one spgc account
    re-accounts from both ledgers."""
    work = tmp_path / "flower"
    shutil.copytree(ROOT / "examples" / "flower", work,
                    ignore=shutil.ignore_patterns("certs", "state", "logs"))  # fmt: skip
    base = free_ports(43, consecutive=True)[0]  # run.sh uses base + 1 ... base + 42
    env = {**os.environ, "SPGC": str(Path(sys.executable).parent / "spgc"),
           "SPGC_FLOWER_ROUNDS": "2", "SPGC_PORT_BASE": str(base)}  # fmt: skip
    done = subprocess.run(["bash", str(work / "run.sh")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert (result["mode"], result["rounds"]) == ("simulation", 2)
    assert 0.0 <= result["accuracy"] <= 1.0
    assert 0 < result["epsilon"] <= 8.0 + 1e-9
    assert result["epsilon_ledgers"] == pytest.approx(result["epsilon"], abs=1e-4)
    assert not (ROOT / "examples" / "flower" / "state").exists()

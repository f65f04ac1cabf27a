"""The servers' plan with the user's own model and data, and providers that refuse a plan.

Two real server daemons in threads; real ProviderClients (the same code `spgc provider` runs).
The model and data are examples/custom-model/model.py, referenced as `file.py:function`.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO_ROOT
from safetensors.torch import save_file
from test_server_daemon import PROVIDERS, _cfg, bind_pair, start_pair
from test_server_daemon import pki as pki  # the module's fixture: certificates for h1, h2, p1..p3

from spgc.learning.models import resolve_model
from spgc.providers.client import ProviderClient, ProviderRefusal, resolve_device
from spgc.servers.daemon import ServerDaemon
from spgc.settings.config import ServerConfig
from spgc.settings.plan import build_run_model, make_plan
from spgc.settings.provider_config import ProviderConfig
from spgc.wire.chunks import MAX_CHUNK_BYTES, packed_width

ROOT = REPO_ROOT
EXAMPLE = ROOT / "examples" / "custom-model" / "model.py"
MODEL = f"{EXAMPLE}:build_model"
DATA = f"{EXAMPLE}:load_digits_data"


def provider_config(pki: Path, d1, d2, index: int, **kw) -> ProviderConfig:
    name = PROVIDERS[index]
    d = pki / "good"
    values = {
        "name": name,
        "h1_address": f"127.0.0.1:{d1.port}",
        "h2_address": f"127.0.0.1:{d2.port}",
        "tls_cert": d / f"{name}.pem",
        "tls_key": d / f"{name}.key",
        "tls_ca": d / "ca.pem",
        "provider_index": index,
        "provider_count": len(PROVIDERS),
        "min_noise_multiplier": 0.3,
        "poll_interval": 0.05,
        "wait_timeout": 60.0,
        "backoff_initial": 0.05,
    }
    values.update(kw)
    return ProviderConfig(**values)


def run_providers(configs: list[ProviderConfig]) -> list[BaseException | list]:
    results: list[BaseException | list] = [[] for _ in configs]

    def go(i: int) -> None:
        try:
            with ProviderClient(configs[i]) as client:
                results[i] = client.run()
        except BaseException as exc:  # handed to the test
            results[i] = exc

    threads = [threading.Thread(target=go, args=(i,)) for i in range(len(configs))]
    for th in threads:
        th.start()
    for th in threads:
        th.join(180)
    return results


USER_RUN = {
    "dataset": "",
    "model": MODEL,
    "test_data": DATA,
    "max_batch_size": 600,
    "sampling_rate": 0.2,
    "lr": 0.01,
    "target_epsilon": 8.0,
    "round_deadline": 30.0,
    "rounds": 3,
}


def test_user_model_and_data_train_end_to_end(pki: Path, tmp_path: Path) -> None:
    d1, d2 = start_pair(pki, tmp_path, **USER_RUN)
    try:
        announced = d1.plan.training_config("run")
        assert announced.model == MODEL and announced.model_fingerprint
        configs = [provider_config(pki, d1, d2, i, model=MODEL, data=DATA) for i in range(3)]
        results = run_providers(configs)
        assert all(isinstance(r, list) and r for r in results), results
        assert d1.wait(60) and d2.wait(60)
        summary = d1.state.summary()
        assert summary["steps"] == 3 and summary["failure"] is None
        # The servers evaluated their own test set (the example's 20% split) each round.
        assert 0.0 <= summary["test_accuracy"] <= 1.0
        assert all(h["test_accuracy"] is not None for h in summary["history"])
        # Both servers hold the same model, exported as the user's own module's weights.
        assert d1.state.model(None)[2] == d2.state.model(None)[2]
    finally:
        d1.stop()
        d2.stop()


def test_providers_refuse_a_plan_and_the_servers_hear_why(pki: Path, tmp_path: Path) -> None:
    d1, d2 = start_pair(pki, tmp_path, **{**USER_RUN, "rounds": 1})
    try:
        cases = {
            0: ({"max_total_epsilon": 2.0, "model": MODEL, "data": DATA}, "max_total_epsilon"),
            1: ({"accept_modes": ["dng"], "model": MODEL, "data": DATA}, "accepts dng"),
            2: ({"max_training_rounds": 1, "data": DATA}, "set model: to the same factory"),
        }
        configs = [provider_config(pki, d1, d2, i, **kw) for i, (kw, _) in cases.items()]
        results = run_providers(configs)
        for i, (_, expected) in cases.items():
            assert isinstance(results[i], ProviderRefusal), results[i]
            assert expected in str(results[i])
        for daemon in (d1, d2):
            declined = daemon.state.summary()["declined"]
            assert set(declined) == set(PROVIDERS)
            assert "max_total_epsilon" in declined["p1"] and "accepts dng" in declined["p2"]
    finally:
        d1.stop()
        d2.stop()


def test_a_provider_model_of_another_architecture_is_refused(pki: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.py"
    other.write_text(
        "from torch import nn\n"
        "def build_model():\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(64, 10))\n"
    )
    d1, d2 = start_pair(pki, tmp_path, **{**USER_RUN, "rounds": 1})
    try:
        cfg = provider_config(pki, d1, d2, 0, model=f"{other}:build_model", data=DATA)
        with pytest.raises(ProviderRefusal, match="parameters for model"):
            ProviderClient(cfg).connect()
        assert "p1" in d1.state.summary()["declined"]
    finally:
        d1.stop()
        d2.stop()


def test_a_model_that_cannot_train_on_the_data_is_found_before_any_round(
    pki: Path, tmp_path: Path
) -> None:
    """Labels beyond the model's outputs, or examples the model cannot read: a provider
    declines at its start (the servers hear why), and a server with such a test_data does not
    start, instead of failing after its first release."""
    rng = np.random.default_rng(0)
    four = tmp_path / "four.npz"  # 4 features, labels 0..2
    np.savez(four, x=rng.standard_normal((30, 4)), y=rng.integers(0, 3, 30))
    five = tmp_path / "five.npz"  # 5 features
    np.savez(five, x=rng.standard_normal((30, 5)), y=rng.integers(0, 2, 30))
    factory = tmp_path / "mlp.py"
    factory.write_text(
        "from torch import nn\n\ndef two_classes():\n"
        "    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))\n"
    )
    model = f"{factory}:two_classes"
    run = {**USER_RUN, "model": model, "test_data": "", "rounds": 1, "max_batch_size": 30}
    server = ServerConfig(insecure=True, providers=["p1"], min_providers=1, **run)
    for data, words in ((four, "class labels up to 2, but the model has 2 outputs"),
                        (five, "cannot read test_data .*shape \\(5,\\) fails: mat1")):  # fmt: skip
        with pytest.raises(ValueError, match=words):
            ServerDaemon(server.model_copy(update={"test_data": str(data)}))
    d1, d2 = start_pair(pki, tmp_path, **run)
    try:
        for i, (data, words) in enumerate(
            ((four, "class labels up to 2, but the model has 2 outputs"),
             (five, "cannot read data .*five.npz.*: an example of shape \\(5,\\) fails"))
        ):  # fmt: skip
            cfg = provider_config(pki, d1, d2, i, model=model, data=str(data))
            with pytest.raises(ProviderRefusal, match=words):
                ProviderClient(cfg).connect()
        declined = d1.state.summary()["declined"]
        assert "class labels up to 2" in declined["p1"] and "cannot read" in declined["p2"]
    finally:
        d1.stop()
        d2.stop()


def _bag_of_tokens(
    tmp_path: Path, vocabulary: int, width: int, tokens: int, seed: int
) -> tuple[str, str]:
    """(model reference, data file): a bag-of-embeddings classifier in a file of its own and
    40 examples of ``tokens`` token ids each, two classes."""
    rng = np.random.default_rng(seed)
    data = tmp_path / "tokens.npz"
    np.savez(data, x=rng.integers(0, vocabulary, (40, tokens)), y=rng.integers(0, 2, 40))
    factory = tmp_path / "bag.py"
    factory.write_text(
        "from torch import nn\n\n\nclass Bag(nn.Module):\n"
        "    def __init__(self):\n        super().__init__()\n"
        f"        self.embed = nn.Embedding({vocabulary}, {width})\n"
        f"        self.out = nn.Linear({width}, 2)\n\n"
        "    def forward(self, x):\n        return self.out(self.embed(x).mean(dim=1))\n\n\n"
        "def bag():\n    return Bag()\n"
    )
    return f"{factory}:bag", str(data)


def test_token_ids_reach_an_embedding_as_integers(pki: Path, tmp_path: Path) -> None:
    """Integer inputs (token ids in an .npz) stay integers for a model that takes them."""
    model, tokens = _bag_of_tokens(tmp_path, vocabulary=50, width=4, tokens=6, seed=1)
    run = {**USER_RUN, "model": model, "test_data": tokens, "rounds": 2,
           "max_batch_size": 40, "min_providers": 2, "round_deadline": 4.0}  # fmt: skip
    d1, d2 = start_pair(pki, tmp_path, **run)
    try:
        configs = [provider_config(pki, d1, d2, i, model=model, data=tokens) for i in (0, 1)]
        results = run_providers(configs)
        assert all(isinstance(r, list) and r for r in results), results
        assert d1.wait(60) and d2.wait(60)
        summary = d1.state.summary()
        assert summary["steps"] == 2 and summary["failure"] is None
        assert all(h["test_accuracy"] is not None for h in summary["history"])
    finally:
        d1.stop()
        d2.stop()


def test_a_model_above_one_chunk_of_widened_values_trains(pki: Path, tmp_path: Path) -> None:
    """150,014 parameters: each packed share chunk carries more values than 1 MiB holds as
    uint64 (131,072), which the intake once refused in every round. One round, mode dng (no
    circuit), real providers sending packed shares."""
    model, tokens = _bag_of_tokens(tmp_path, vocabulary=25_000, width=6, tokens=3, seed=2)
    run = {**USER_RUN, "model": model, "test_data": tokens, "rounds": 1, "mode": "dng",
           "max_batch_size": 40, "min_providers": 2, "round_deadline": 20.0}  # fmt: skip
    d1, d2 = start_pair(pki, tmp_path, **run)
    try:
        assert d1.plan.dim == 150_014 > MAX_CHUNK_BYTES // 8
        configs = [provider_config(pki, d1, d2, i, model=model, data=tokens) for i in (0, 1)]
        results = run_providers(configs)
        assert all(isinstance(r, list) and r for r in results), results
        sent = [s for r in results for report in r for s in report.results]
        width = packed_width(d1.plan.ring_bits)  # packed: fewer than 8 bytes a value
        assert width < 8 and len(sent) == 4
        assert all(s.accepted and s.bytes_sent == width * 150_014 for s in sent)
        assert d1.wait(60) and d2.wait(60)
        summary = d1.state.summary()
        assert summary["steps"] == 1 and summary["failure"] is None
        assert d1.state.history[0].agreed == ["p1", "p2"]
    finally:
        d1.stop()
        d2.stop()


def test_a_server_refuses_a_model_per_example_gradients_cannot_handle(tmp_path: Path) -> None:
    bn = tmp_path / "bn.py"
    bn.write_text(
        "from torch import nn\n"
        "def build_model():\n"
        "    return nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))\n"
    )
    cfg = ServerConfig(
        insecure=True,
        providers=["p1", "p2"],
        dataset="",
        model=f"{bn}:build_model",
        max_batch_size=10,
    )
    with pytest.raises(ValueError, match=r"1 \(BatchNorm1d\)"):
        build_run_model(cfg)


def test_initial_model_state_is_where_the_run_starts(tmp_path: Path) -> None:
    start = resolve_model(MODEL, seed=7)
    state = {k: v.contiguous() for k, v in start.state_dict().items()}
    save_file(state, tmp_path / "s.safetensors")
    cfg = ServerConfig(
        insecure=True,
        providers=["p1", "p2"],
        dataset="",
        model=MODEL,
        max_batch_size=10,
        initial_model=tmp_path / "s.safetensors",
    )
    model = build_run_model(cfg)
    for (name, a), b in zip(model.state_dict().items(), start.state_dict().values(), strict=True):
        assert torch.equal(a, b), name


BUFFERED = (
    "import torch\n"
    "from torch import nn\n"
    "class Shifted(nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = nn.Linear(4, 2)\n"
    "        self.bn = nn.BatchNorm1d(4).eval()\n"
    "        self.register_buffer('shift', torch.randn(4))  # drawn from the seeded RNG\n"
    "    def forward(self, x):\n"
    "        return self.fc(self.bn(x + self.shift))\n"
    "def build_model():\n"
    "    return Shifted()\n"
    "def build_frozen():\n"
    "    return Shifted().requires_grad_(False)\n"
)


def test_buffers_that_the_providers_would_build_otherwise_are_refused(tmp_path: Path) -> None:
    """Only parameters travel: a buffer that model_seed or initial_model changes would differ
    between the model the servers train and export and the providers' (which build it from
    the factory alone), and training would go on silently wrong. Refused, naming it."""
    (tmp_path / "buffered.py").write_text(BUFFERED)
    ref = f"{tmp_path / 'buffered.py'}:build_model"
    base = {"insecure": True, "providers": ["p1", "p2"], "dataset": "", "max_batch_size": 10}
    build_run_model(ServerConfig(**base, model=ref))  # seed 0: as every party builds it
    with pytest.raises(ValueError, match=r"buffer\(s\) shift differ .* without model_seed 7"):
        build_run_model(ServerConfig(**base, model=ref, model_seed=7))
    state = {k: v.contiguous() for k, v in resolve_model(ref).state_dict().items()}
    save_file(state, tmp_path / "same.safetensors")  # the factory's own buffers: fine
    build_run_model(ServerConfig(**base, model=ref, initial_model=tmp_path / "same.safetensors"))
    state["bn.running_mean"] = torch.full((4,), 3.0)
    save_file(state, tmp_path / "stats.safetensors")
    with pytest.raises(ValueError, match=r"bn\.running_mean differ .* without initial_model"):
        build_run_model(
            ServerConfig(**base, model=ref, initial_model=tmp_path / "stats.safetensors")
        )
    with pytest.raises(ValueError, match="every parameter of the model is frozen"):
        build_run_model(ServerConfig(**base, model=f"{tmp_path / 'buffered.py'}:build_frozen"))


def test_device_choice() -> None:
    """auto takes a GPU only where there is one; cuda without one is refused, never ignored."""
    has_gpu = torch.cuda.is_available()
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if has_gpu else "cpu")
    if has_gpu:
        assert resolve_device("cuda") == torch.device("cuda")
    else:
        with pytest.raises(ProviderRefusal, match="no CUDA GPU"):
            resolve_device("cuda")


@pytest.mark.parametrize(
    ("key", "h1", "h2", "named"),
    [
        ("rounds", 3, 5, "rounds (h1 3, h2 5)"),
        ("lr", 0.05, 0.1, "lr (h1 0.05, h2 0.1)"),
    ],
)
def test_servers_with_different_plans_refuse_to_pair(
    pki: Path, tmp_path: Path, key: str, h1: float, h2: float, named: str
) -> None:
    """H2 configured for 5 rounds, H1 for 3 (or another learning rate, which would make the
    models differ only after the first release): neither trains, both say which key differs."""
    d1, d2 = bind_pair(pki, tmp_path, **{key: h1})
    setattr(d2.cfg, key, h2)
    d2.plan = make_plan(d2.cfg)  # H2's plan as a daemon started from its own file would have
    d2.state.plan = d2.plan
    try:
        d2.start()
        d1.start()
        assert d1.wait(30) and d2.wait(30)
        assert "the other server refused to pair" in str(d1.error)
        assert named in str(d1.error)
        assert named in str(d2.state.failure)
        assert d1.state.releases == d2.state.releases == 0
    finally:
        d1.stop()
        d2.stop()


@pytest.mark.parametrize(
    "privacy",
    [
        {"noise_multiplier": 1.0, "target_epsilon": 0.5},  # 1.91 in one step
        {"calibration": "analytic", "step_epsilon": 4.0, "target_epsilon": 0.5},
    ],
)
def test_a_plan_whose_first_step_passes_the_target_is_refused(
    pki: Path, tmp_path: Path, privacy: dict
) -> None:
    """The run stops before a release would pass target_epsilon, so a noise whose first
    release alone passes it could never run: refused at the start (and by config check)."""
    with pytest.raises(ValueError, match=r"in one step, more than target_epsilon 0\.5"):
        make_plan(_cfg(pki, 1, tmp_path, mode="spgc", **privacy))
    make_plan(_cfg(pki, 1, tmp_path, mode="spgc", target_epsilon=0.5))  # calibrated: fits


def test_servers_with_different_initial_models_refuse_to_pair(pki: Path, tmp_path: Path) -> None:
    """Another model_seed (or initial_model) on H2: the handshake compares model v0 and both
    refuse, before any round."""
    d1, d2 = bind_pair(pki, tmp_path, model_seed=1)
    d2.stop()
    d2 = ServerDaemon(_cfg(pki, 2, tmp_path / "s2", model_seed=2)).bind()
    d1.cfg.peer_address = f"127.0.0.1:{d2.peer_port}"
    d2.cfg.gc_address = f"127.0.0.1:{d1.gc_port}"
    try:
        d2.start()
        d1.start()
        assert d1.wait(30) and d2.wait(30)
        assert "model v0 differs between the servers" in str(d1.error)
        assert "model_seed or initial_model" in str(d2.state.failure)
        assert d1.state.round == d2.state.round == 0
    finally:
        d1.stop()
        d2.stop()

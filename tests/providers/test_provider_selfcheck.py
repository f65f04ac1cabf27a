"""A provider checks itself before it calls a server (issue 33 item 5): its model, data, label
column, a BatchNorm layer (named) and the model-data fit fail at once with one line and exit
status 2, even with the servers down; while it waits for a server that is not up it says so
once (then at the configured backoff), not a warning per attempt; the Python API's config
classes take ``tls=TlsPaths(...)`` on both schemas, and a bad argument is one line."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest

from spgc.app.cli import main as cli_main
from spgc.providers.__main__ import main
from spgc.providers.client import ProviderClient, ProviderRefusal, SelfCheckFailed
from spgc.providers.plan_checks import build_provider_model
from spgc.providers.selfcheck import check_model_and_data
from spgc.settings.config import ConfigError, ServerConfig, TlsPaths
from spgc.settings.config_files import load_provider_config
from spgc.settings.provider_config import ProviderConfig

MODELS = (
    "from torch import nn\n"
    "def mlp():\n    return nn.Sequential(nn.Linear(2, 4), nn.Tanh(), nn.Linear(4, 2))\n"
    "def batchnorm():\n"
    "    return nn.Sequential(nn.Linear(2, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))\n"
)


def closed_port() -> int:
    """A port nobody listens on (bound once, then closed): a server that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "m.py").write_text(MODELS)
    rows = "".join(f"{i % 3},{i % 5},{i % 2}\n" for i in range(20))
    (tmp_path / "d.csv").write_text("a,b,label\n" + rows)
    rows3 = "".join(f"{i % 3},{i % 5},{i % 3}\n" for i in range(20))  # labels 0..2
    (tmp_path / "three.csv").write_text("a,b,label\n" + rows3)
    return tmp_path


def write_config(files: Path, **keys: str) -> Path:
    path = files / "p1.yaml"
    body = {
        "name": "p1",
        "h1_address": f"127.0.0.1:{closed_port()}",
        "h2_address": f"127.0.0.1:{closed_port()}",
        "insecure": "true",
        "allow_no_privacy": "true",
        "connect_timeout": "600",
        "model": f"{files / 'm.py'}:mlp",
        "data": "d.csv",
        **{k: v.format(dir=files) for k, v in keys.items()},
    }
    path.write_text("".join(f"{k}: {v}\n" for k, v in body.items()))
    return path


@pytest.mark.parametrize(
    ("keys", "words"),
    [
        ({"data": "nosuch.csv"}, "data file 'nosuch.csv': no such file"),
        ({"data_label": "target"}, "no label column 'target'; the columns are: a, b, label"),
        ({"model": "nofile.py:mlp"}, "no such file 'nofile.py'"),
        ({"model": "{dir}/m.py:batchnorm"}, "layer 1 (BatchNorm1d) is not supported"),
        ({"data": "three.csv"}, "class labels up to 2, but the model has 2 outputs"),
        ({"provider_count": "40"}, "(provider_count 40, provider_index 0): cannot split 20 rows"),
    ],
)
def test_a_broken_provider_fails_at_once_with_the_servers_down(
    files: Path, keys: dict[str, str], words: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing listens at h1/h2 and connect_timeout is 10 minutes: the provider still exits at
    once, with status 2 and the reason in one line, without ever waiting for a server."""
    path = write_config(files, **keys)
    assert main(["--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert words in err and "cannot start: " in err, err
    assert "waiting for" not in err and "Hello" not in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "cannot start" in line]) == 1


def test_the_python_api_and_config_check_share_the_check(files: Path) -> None:
    """The API's provider (ProviderClient.run) raises SelfCheckFailed, a ConfigError, before
    any call; `spgc config check` runs the very same function."""
    cfg = load_provider_config(write_config(files, model="{dir}/m.py:batchnorm"))
    with ProviderClient(cfg) as client, pytest.raises(SelfCheckFailed, match="BatchNorm1d"):
        client.run()
    assert isinstance(SelfCheckFailed("x"), ConfigError)
    good = load_provider_config(write_config(files))
    found = check_model_and_data(good)
    assert found.note.endswith("m.py:mlp: all 22 parameters trained)")
    assert found.parameters == 22
    assert found.examples == 20
    # No model of its own: the servers' built-in one is checked once the plan is known.
    assert check_model_and_data(load_provider_config(write_config(files, model="''"))).note == ""


def test_feature_columns_of_scales_100x_apart_are_named_at_start_and_by_config_check(
    files: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """A warning, not an error (issue 48 part 2): config check exits 0 and names both columns;
    the provider logs the same line at its start; data on one scale get none."""
    rows = "".join(f"{(i % 3) * 0.001},{(i % 5) * 100},{i % 2}\n" for i in range(20))
    (files / "wide.csv").write_text("age_decades,ldl,label\n" + rows)
    path = write_config(files, data="wide.csv")
    caplog.set_level(logging.WARNING, logger="spgc.provider")
    ProviderClient(load_provider_config(path)).self_check()
    assert "feature scales differ by more than 100x: ldl (std" in caplog.text
    assert cli_main(["config", "check", str(path)]) == 0
    err = capsys.readouterr().err
    assert "spgc config check: warning: data '" in err and "wide.csv'" in err
    assert "feature scales differ by more than 100x: ldl (std" in err
    assert "against age_decades (std" in err
    assert cli_main(["config", "check", str(write_config(files))]) == 0
    assert "warning" not in capsys.readouterr().err
    # With standardize the servers release the statistics it is standardised with: no warning.
    standardized = write_config(files, data="wide.csv", standardize="true")
    assert cli_main(["config", "check", str(standardized)]) == 0
    assert "warning" not in capsys.readouterr().err


def test_a_batchnorm_model_is_named_before_any_parameter_count(files: Path) -> None:
    """Against the servers' plan too: the layer is named, not a parameter-count mismatch (the
    plan below announces another count; the layer check comes first)."""
    cfg = load_provider_config(write_config(files, model="{dir}/m.py:batchnorm"))
    plan = SimpleNamespace(model="x", model_parameters=1, num_parameters=1, trainable=[])
    with pytest.raises(ProviderRefusal, match=r"layer 1 \(BatchNorm1d\) is not supported"):
        build_provider_model(plan, cfg)


def test_waiting_for_a_server_is_said_once_then_at_the_backoff(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """H1 is down for the whole connect_timeout (a clock of the test's own, advanced by each
    wait): one "waiting for h1 at ... (up to 60 s)" line, reminders at the configured backoff
    (far fewer than the attempts), no warning per attempt; then the connection error."""
    now = [0.0]
    waits: list[float] = []

    def sleep(seconds: float) -> None:
        waits.append(seconds)
        now[0] += seconds

    address = f"127.0.0.1:{closed_port()}"
    cfg = ProviderConfig(
        name="p1",
        h1_address=address,
        insecure=True,
        allow_no_privacy=True,
        connect_timeout=60.0,
        backoff_initial=0.5,
        backoff_max=10.0,
    )
    caplog.set_level(logging.DEBUG, logger="spgc.provider")
    client = ProviderClient(cfg, sleep=sleep, clock=lambda: now[0])
    with client, pytest.raises(ConnectionError, match=f"Hello to h1 at {address} failed after"):
        client.connect()
    records = [r for r in caplog.records if r.name == "spgc.provider"]
    said = [r.getMessage() for r in records if r.levelno >= logging.INFO]
    assert said.count(f"waiting for h1 at {address} (up to 60 s)") == 1, said
    assert sum("waiting for" in m for m in said) == 1
    reminders = [m for m in said if m.startswith(f"h1 at {address}: still UNAVAILABLE after")]
    # Reminders 0.5, 1, 2, 4, 8, 10, 10, ... s apart: at most 10 in 60 s; attempts <= 2 s apart.
    assert 1 <= len(reminders) <= 10 and len(waits) > len(reminders) + 1
    assert not [r for r in records if r.levelno >= logging.WARNING]
    assert max(waits) <= 2.0  # still asking soon: a server starting up is found quickly


def test_both_schemas_take_tls_paths_and_a_bad_argument_is_one_line(tmp_path: Path) -> None:
    cert, key, ca = (tmp_path / "p1.pem", tmp_path / "p1.key", tmp_path / "ca.pem")
    for path in (cert, key, ca):  # the schemas check that the files exist; TLS reads them later
        path.write_text("PEM")
    base = {"name": "p1", "h1_address": "127.0.0.1:5001", "min_noise_multiplier": 0.5}
    nested = ProviderConfig(**base, tls=TlsPaths(cert=cert, key=key, ca=ca))
    flat = ProviderConfig(**base, tls_cert=cert, tls_key=key, tls_ca=ca)
    mapping = ProviderConfig(**base, tls={"cert": cert, "key": key, "ca": ca})
    assert nested == flat == mapping and nested.tls is not None
    assert (nested.tls.cert, nested.tls.key, nested.tls.ca) == (cert, key, ca)
    yaml_file = tmp_path / "p1.yaml"
    yaml_file.write_text(
        "name: p1\nh1_address: 127.0.0.1:5001\nmin_noise_multiplier: 0.5\n"
        f"tls: {{cert: {cert}, key: {key}, ca: {ca}}}\n"
    )
    assert load_provider_config(yaml_file) == flat
    assert ProviderConfig(**base, insecure=True, tls=None).tls is None
    server = ServerConfig(providers=["p1", "p2"], tls=TlsPaths(cert=cert, key=key, ca=ca))
    assert server.tls is not None and server.tls.ca == ca

    for make, words in (
        (lambda: ProviderConfig(**base, insecure=True, retries=0),
         "ProviderConfig: retries: Input should be greater than or equal to 1 (given 0"),
        (lambda: ProviderConfig(**base, insecure=True, tls_cet=cert),
         "ProviderConfig: unknown key 'tls_cet'; did you mean 'tls_cert'?"),
        (lambda: ProviderConfig(**base, tls=TlsPaths(cert=cert, key=key, ca=ca), tls_ca=ca),
         "ProviderConfig: tls and tls_ca both given"),
        (lambda: ProviderConfig(**base, tls="certs/"),
         "ProviderConfig: tls: give TlsPaths(cert=..., key=..., ca=...)"),
        (lambda: ServerConfig(insecure=True, rounds=0),
         "ServerConfig: rounds: Input should be greater than or equal to 1 (given 0"),
        (lambda: TlsPaths(cert=cert, key=key), "TlsPaths: ca: Field required"),
    ):  # fmt: skip
        with pytest.raises(ConfigError) as info:
            make()
        message = str(info.value)
        assert message.startswith(words), message
        assert "\n" not in message and "pydantic" not in message
        assert "validation error" not in message

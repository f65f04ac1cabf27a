"""One configuration mechanism for both daemons: schema, loader, --set, errors, docs, commands."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers import REPO_ROOT, run_in_process

from spgc.common.logs import setup_logging
from spgc.servers.daemon import ServerDaemon
from spgc.settings.config import ConfigError, ServerConfig
from spgc.settings.config_files import (
    config_markdown,
    describe_keys,
    load_provider_config,
    load_server_config,
)
from spgc.settings.plan import AUTO_LANES_MIN_DIM, make_plan
from spgc.settings.provider_config import ProviderConfig

ROOT = REPO_ROOT
BIN = Path(sys.executable).parent


def run(*argv: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_docs_config_md_is_generated_from_the_schema() -> None:
    text = (ROOT / "docs" / "CONFIG.md").read_text()
    assert text.strip() == config_markdown().strip(), (
        "docs/CONFIG.md is stale: spgc config show server --markdown > docs/CONFIG.md"
    )
    for schema in (ServerConfig, ProviderConfig):
        for key, *_ in describe_keys(schema):
            assert f"`{key}`" in text


def test_every_key_has_a_meaning() -> None:
    for schema in (ServerConfig, ProviderConfig):
        missing = [k for k, _, _, meaning in describe_keys(schema) if not meaning.strip()]
        assert not missing, f"{schema.__name__}: keys without a description: {missing}"


def test_file_overrides_and_relative_paths(tmp_path: Path) -> None:
    (tmp_path / "pki").mkdir()
    for name in ("h1.pem", "h1.key", "ca.pem", "other-ca.pem"):
        (tmp_path / "pki" / name).write_text("PEM")
    f = tmp_path / "h1.yaml"
    f.write_text("tls: {cert: pki/h1.pem, key: pki/h1.key, ca: pki/ca.pem}\nproviders: [a, b]\n")
    other_ca = tmp_path / "pki" / "other-ca.pem"
    cfg = load_server_config(f, ["rounds=7", "lr=0.5", "providers=a,b,c", f"tls.ca={other_ca}"])
    assert cfg.rounds == 7 and cfg.lr == 0.5 and cfg.providers == ["a", "b", "c"]
    assert cfg.tls is not None and cfg.tls.cert == tmp_path / "pki" / "h1.pem"
    assert cfg.tls.ca == other_ca
    with pytest.raises(ConfigError, match=r"tls.key: .*nope.key is not a file"):
        load_server_config(f, ["tls.key=pki/nope.key"])


def test_data_files_resolve_against_the_file_when_they_are_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "train.csv").write_text("a,label\n1,0\n")
    (conf / "loader.py").write_text("def load():\n    pass\n")
    f = conf / "p1.yaml"
    f.write_text("name: p1\nh1_address: 'a:1'\ninsecure: true\nmin_noise_multiplier: 0.5\n")
    monkeypatch.chdir(tmp_path)
    cfg = load_provider_config(f, [])
    for given, resolved in (
        ("train.csv", str(conf / "train.csv")),  # beside the file
        ("loader.py:load", f"{conf / 'loader.py'}:load"),
        ("elsewhere.csv", "elsewhere.csv"),  # not there: the working directory's, as before
        ("cancer", "cancer"),
    ):
        f.write_text(f.read_text().split("data:")[0] + f"data: {given}\n")
        cfg = load_provider_config(f, [])
        assert cfg.data == resolved
    assert load_provider_config(f, ["data=train.csv"]).data == "train.csv"  # --set: as given


def test_key_path_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("h1.pem", "ca.pem", "h1.key"):
        (tmp_path / name).write_text("PEM")
    f = tmp_path / "h1.yaml"
    f.write_text("tls: {cert: h1.pem, key: 'env:H1_KEY_FILE', ca: ca.pem}\nproviders: [a, b]\n")
    monkeypatch.setenv("H1_KEY_FILE", str(tmp_path / "h1.key"))
    assert load_server_config(f).tls.key == tmp_path / "h1.key"
    monkeypatch.delenv("H1_KEY_FILE")
    with pytest.raises(ConfigError, match="environment variable H1_KEY_FILE"):
        load_server_config(f)


@pytest.mark.parametrize(
    ("text", "overrides", "expected"),
    [
        (
            "insecure: true\nproviders: [a, b]\nrounds: 0\n",
            [],
            r"rounds: .*given 0; allowed: int >= 1",
        ),
        ("insecure: true\nproviders: [a, b]\n", ["mode=fast"], r"mode: .*given 'fast'.*'spgc'"),
        ("insecure: true\nproviders: [a, b]\nrond: 3\n", [], r"unknown key 'rond'.*did you mean"),
        ("insecure: true\nproviders: [a, b]\n", ["lr=abc"], r"lr: .*'abc'; allowed: float > 0"),
        ("providers: [a, b]\n", [], r"give tls: \{cert, key, ca\} or set insecure: true"),
        ("- a\n- b\n", [], r"the top level must be a mapping"),
        ("insecure: [\n", [], r"not valid YAML"),
        ("insecure: true\nproviders: [a, b]\n", ["rounds"], r"--set expects key=value"),
        ("insecure: true\nproviders: [a, b]\n", ["listen=foo"], r"listen: 'foo' is not host:port"),
        (
            "insecure: true\nproviders: [a, b]\n",
            ["gc_address=127.0.0.1:70000"],
            r"gc_address: .*port 0..65535",
        ),
        (
            "insecure: true\nproviders: [a, b]\n",
            ["peer_address=127.0.0.1:0"],
            r"peer_address=.*port 0 cannot be dialled",
        ),
        ("insecure: true\nproviders: [a, b]\n", ["peer_name="], r"peer_name='' is not a cert"),
        # .inf must not read as "no privacy limit", nor .nan as a number
        (
            "insecure: true\nproviders: [a, b]\ntarget_epsilon: .inf\n",
            [],
            r"target_epsilon: .*finite",
        ),
        ("insecure: true\nproviders: [a, b]\n", ["target_delta=nan"], r"target_delta: .*finite"),
        (
            "insecure: true\nproviders: [a, b]\nworkers: 2\ngc_lanes: 2\n",
            [],
            r"gc_lanes: 2 with workers: 2: rounds run on the workers only",
        ),
        (
            "insecure: true\nproviders: [a, b]\nray_address: head\n",
            [],
            r"ray_address: .*'head' is not host:port, ray://host:port, auto or empty",
        ),
        (
            "insecure: true\nproviders: [a, b]\nray_address: 'ray://head:0'\n",
            [],
            r"ray_address: .*'ray://head:0': a Ray cluster's port cannot be 0",
        ),
    ],
)
def test_errors_name_file_key_value_and_what_is_allowed(
    tmp_path: Path, text: str, overrides: list[str], expected: str
) -> None:
    f = tmp_path / "server.yaml"
    f.write_text(text)
    with pytest.raises(ConfigError, match=expected) as info:
        load_server_config(f, overrides)
    if "--set" not in expected:
        assert str(f) in str(info.value)


def test_provider_nested_keys_flatten(tmp_path: Path) -> None:
    f = tmp_path / "p1.yaml"
    f.write_text(
        "name: p1\nh1: {address: 'a:1', name: h1}\ninsecure: true\nprovider: {index: 1, count: 3}\n"
        "min_noise_multiplier: 0.5\n"
    )
    cfg = load_provider_config(f, ["log_level=DEBUG"])
    assert (cfg.h1_address, cfg.provider_index, cfg.provider_count) == ("a:1", 1, 3)
    assert cfg.log_level == "debug"
    with pytest.raises(ConfigError, match=r"provider_index must be in \[0, 3\)"):
        load_provider_config(f, ["provider_index=3"])
    with pytest.raises(ConfigError, match=r"h1_address: 'a' is not host:port"):
        load_provider_config(f, ["h1_address=a"])
    with pytest.raises(ConfigError, match=r"h2_address='b:0': port 0 cannot be dialled"):
        load_provider_config(f, ["h2_address=b:0"])
    with pytest.raises(ConfigError, match=r"max_total_epsilon: .*finite"):
        load_provider_config(f, ["max_total_epsilon=inf"])


def test_spgc_server_help_describes_every_option() -> None:
    # The console scripts start for real (once each); `spgc ...` runs in this process.
    helps = []
    for out in (run_in_process("server", "--help"), run("spgc-server", "--help")):
        assert out.returncode == 0, out.stderr
        assert "--config FILE" in out.stdout and "--set KEY=VALUE" in out.stdout
        assert "usage: spgc server" in out.stdout
        helps.append(out.stdout)
    assert helps[0] == helps[1]
    out = run_in_process("server", "precompute", "--help")
    assert out.returncode == 0 and "--samples" in out.stdout
    for out in (run_in_process("provider", "--help"), run("spgc-provider", "--help")):
        assert out.returncode == 0 and "usage: spgc provider" in out.stdout


def test_daemons_exit_2_with_one_message_on_a_bad_config(tmp_path: Path) -> None:
    f = tmp_path / "h1.yaml"
    f.write_text("insecure: true\nproviders: [p1]\nrounds: many\n")
    for argv in (("spgc", "server"), ("spgc-server",)):
        out = run(*argv, "--config", str(f))
        assert out.returncode == 2
        assert "Traceback" not in out.stderr
        assert str(f) in out.stderr and "rounds" in out.stderr and "'many'" in out.stderr
    p = tmp_path / "p1.yaml"
    p.write_text("name: p1\nh1_address: 'x:1'\ninsecure: true\nmax_step_epsilon: -1\n")
    out = run("spgc", "provider", "--config", str(p))
    assert out.returncode == 2 and "max_step_epsilon" in out.stderr
    assert "Traceback" not in out.stderr
    out = run("spgc", "server", "--config", str(tmp_path / "missing.yaml"))
    assert out.returncode == 2 and "does not exist" in out.stderr


def test_config_check_and_show(tmp_path: Path) -> None:
    good = tmp_path / "h1.yaml"
    good.write_text("insecure: true\nproviders: [p1, p2]\n")
    # (in this process; the real command's start-up: the next test's first run)
    out = run_in_process("config", "check", str(good))
    assert out.returncode == 0 and "valid server configuration" in out.stdout
    bad = tmp_path / "p1.yaml"
    bad.write_text("name: p1\nh1_address: 'x:1'\ninsecure: true\n")
    out = run_in_process("config", "check", str(bad))
    assert out.returncode == 2 and "no minimum privacy" in out.stderr
    out = run_in_process("config", "show", "provider")
    assert out.returncode == 0
    for key, *_ in describe_keys(ProviderConfig):
        assert key in out.stdout


def test_config_check_says_alike_on_both_sides_how_many_parameters_train(tmp_path: Path) -> None:
    """One model with a frozen first layer: the servers' check and the provider's both name
    its parameters and the trained ones among them (the servers said "parameters" for the
    trained coordinates, the provider for all of them)."""
    (tmp_path / "m.py").write_text(
        "from torch import nn\n\ndef half():\n"
        "    net = nn.Sequential(nn.Linear(30, 4), nn.Tanh(), nn.Linear(4, 2))\n"
        "    net[0].requires_grad_(False)\n    return net\n"
    )
    model = f"{tmp_path / 'm.py'}:half"
    server = tmp_path / "h1.yaml"
    server.write_text(f"insecure: true\nproviders: [p1, p2]\nmodel: {model}\n")
    provider = tmp_path / "p1.yaml"
    provider.write_text(
        f"name: p1\nh1_address: 127.0.0.1:1\ninsecure: true\nallow_no_privacy: true\n"
        f"model: {model}\n"
    )
    said = "10 of 134 parameters trained (124 frozen)"  # the head's 4 x 2 + 2 of 134
    for path in (server, provider):
        out = run_in_process("config", "check", str(path))
        assert out.returncode == 0 and f"(model {model}: {said}" in out.stdout, out.stdout


def test_config_check_builds_the_model_and_reads_the_data(tmp_path: Path) -> None:
    """Beyond keys and values: what the daemon would build at its start, as it would."""
    good = tmp_path / "h1.yaml"
    good.write_text("insecure: true\nproviders: [p1, p2]\n")
    out = run("spgc", "config", "check", str(good))
    assert out.returncode == 0
    assert "(model cancer: all 62 parameters trained, ring Z_2^" in out.stdout
    assert "absl" not in out.stderr
    for change, words in (
        ("test_data=nosuch.csv", "data file 'nosuch.csv': no such file"),
        ("model=nofile.py:mlp", "no such file 'nofile.py'"),
        ("initial_model=nosuch.safetensors", "nosuch.safetensors': no such file"),
    ):
        # (in this process: the first run above is the real command's start-up and logging)
        out = run_in_process("config", "check", str(good), "--set", change, cwd=tmp_path)
        assert out.returncode == 2 and words in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
        schema = run_in_process("config", "check", str(good), "--set", change, "--schema-only")
        assert schema.returncode == 0, schema.stderr  # the keys and values alone are fine


def test_provider_config_check_tries_its_part_of_the_data_and_the_model(tmp_path: Path) -> None:
    """What the provider would refuse at its start: its part of a data file every provider
    loads whole (provider_count), a model without parameters; each named, no traceback."""
    (tmp_path / "m.py").write_text(
        "from torch import nn\n"
        "def mlp():\n    return nn.Sequential(nn.Linear(2, 2))\n"
        "def empty():\n    return nn.Sequential(nn.Flatten())\n"
    )
    (tmp_path / "d.csv").write_text("a,b,label\n1,2,0\n")
    cfg = tmp_path / "p1.yaml"
    cfg.write_text(
        "name: p1\nh1_address: 127.0.0.1:1\nh2_address: 127.0.0.1:2\ninsecure: true\n"
        "min_noise_multiplier: 0.5\nmodel: m.py:mlp\ndata: d.csv\nprovider_count: 2\n"
    )
    for change, words in (
        ("provider_count=2", "(provider_count 2, provider_index 0): cannot split 1 rows among 2"),
        ("model=m.py:empty", "the model has no parameters to train"),
    ):
        out = run_in_process("config", "check", str(cfg), "--set", change, cwd=tmp_path)
        assert out.returncode == 2 and words in out.stderr, out.stderr
        assert "Traceback" not in out.stderr
    out = run_in_process("config", "check", str(cfg), "--set", "provider_count=1", cwd=tmp_path)
    assert out.returncode == 0, out.stderr


def test_missing_state_dir_is_created_private(tmp_path: Path) -> None:
    state = tmp_path / "a" / "b" / "state"
    cfg = ServerConfig(insecure=True, providers=["p1"], min_providers=1, state_dir=state)
    daemon = ServerDaemon(cfg)
    try:
        assert state.is_dir() and (state.stat().st_mode & 0o777) == 0o700
    finally:
        daemon.intake.close()
    blocked = tmp_path / "file"
    blocked.write_text("")
    cfg = ServerConfig(insecure=True, providers=["p1"], min_providers=1, state_dir=blocked / "s")
    with pytest.raises(ValueError, match=r"state_dir: cannot create .*file/s: Not a directory"):
        ServerDaemon(cfg)


def test_grpc_core_quiet_unless_debug() -> None:
    code = "import os, spgc; print(os.environ.get('GRPC_VERBOSITY'))"
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert out.stdout.strip() == "ERROR"
    out = subprocess.run(
        [sys.executable, "-c", code, "--log-level", "debug"],
        capture_output=True,
        text=True,
        env=env,
    )
    assert out.stdout.strip() == "None"


def test_grpc_core_silent_with_json_logs(tmp_path: Path) -> None:
    """Its lines are not JSON (and any client can make it write one per connection): JSON
    logs asked for on the command line or in the --config file silence it."""
    code = "import os, spgc; print(os.environ.get('GRPC_VERBOSITY'))"
    env = {k: v for k, v in os.environ.items() if k != "GRPC_VERBOSITY"}
    cfg = tmp_path / "h1.yaml"
    cfg.write_text("role: 1\nlog_format: json\n")
    for args, want in (
        (["--log-format", "json"], "NONE"),
        (["--set", "log_format=json"], "NONE"),
        (["--config", str(cfg)], "NONE"),
        (["--config", str(cfg), "--log-format", "text"], "ERROR"),
        (["--config", str(tmp_path / "missing.yaml")], "ERROR"),
    ):
        out = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, env=env
        )
        assert out.stdout.strip() == want, args


def test_json_log_lines(capsys: pytest.CaptureFixture[str]) -> None:
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    try:
        # An earlier test's setup_logging may have left logging thinking warnings are
        # captured after pytest restored warnings.showwarning: start from neither.
        logging.captureWarnings(False)
        setup_logging("info", "json")
        logging.getLogger("spgc.servers.test").info("round %d done", 3)
        logging.getLogger("absl").warning("dp-accounting chatter")  # dropped below error
        with warnings.catch_warnings():
            warnings.simplefilter("always")
            warnings.warn("a library's warning", UserWarning, stacklevel=1)  # a JSON line too
        lines = [json.loads(line) for line in capsys.readouterr().err.strip().splitlines()]
        assert [(e["level"], e["logger"]) for e in lines] == [
            ("info", "spgc.servers.test"),
            ("warning", "py.warnings"),
        ]
        assert lines[0]["message"] == "round 3 done" and lines[0]["time"].endswith("Z")
        assert "a library's warning" in lines[1]["message"]
    finally:
        logging.captureWarnings(False)
        root.handlers[:] = saved[0]
        root.setLevel(saved[1])


def test_sigterm_stops_a_provider_like_ctrl_c(tmp_path: Path) -> None:
    """systemd, Kubernetes and kill send SIGTERM: the provider says so and exits 128 + 15."""
    cfg = tmp_path / "p1.yaml"
    cfg.write_text(
        "name: p1\nh1_address: 127.0.0.1:1\nh2_address: 127.0.0.1:2\ninsecure: true\n"
        "dataset: cancer\nmax_step_epsilon: 10\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "spgc.providers", "--config", str(cfg), "--log-format", "json"],
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    lines = []
    for line in proc.stderr:  # wait until it runs: waiting for the unreachable servers
        lines.append(line)
        if "waiting for h1 at 127.0.0.1:1" in line:
            break
    proc.terminate()
    rest = proc.communicate(timeout=30)[1]
    assert proc.returncode == 143
    entries = [json.loads(line) for line in [*lines, *rest.splitlines()] if line.strip()]
    assert entries[-1]["message"] == "interrupted (signal 15)"


@pytest.mark.parametrize(
    ("settings", "lanes"),
    [
        ({"dataset": "mnist", "backend": "gmw"}, 2),  # wide, on gmw: a second lane
        ({"dataset": "mnist", "backend": "auto"}, 2),
        ({"dataset": "mnist", "backend": "gc"}, 1),
        ({"dataset": "cancer", "backend": "gmw"}, 1),  # d = 62: not worth a second session
        ({"dataset": "mnist", "backend": "gmw", "security": "malicious"}, 1),
        ({"dataset": "mnist", "backend": "gmw", "gc_lanes": 1}, 1),  # set: as set
        ({"dataset": "cancer", "backend": "gc", "gc_lanes": 3}, 3),
    ],
)
def test_unset_gc_lanes_gives_wide_gmw_plans_two_lanes(settings: dict, lanes: int) -> None:
    cfg = ServerConfig(insecure=True, providers=["p1"], min_providers=1, **settings)
    plan = make_plan(cfg)
    assert plan.gc_lanes == lanes
    assert (plan.dim >= AUTO_LANES_MIN_DIM) == (settings["dataset"] == "mnist")

"""`spgc demo`: both servers and k providers on localhost, as separate processes, training a
few rounds; shows progress and a summary (or one JSON object).

Everything runs in a fresh temporary directory: a development CA and certificates for h1, h2
and every provider (TLS on every link unless --insecure), the daemons' YAML files, their logs
and the servers' JSON summaries. Children are stopped on the way out, Ctrl-C included.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import yaml

from spgc.learning.data import DATA_ERRORS, dataset_task, load_dataset
from spgc.learning.gradients import check_model_on_data
from spgc.learning.models import MODEL_INPUT_SHAPES, MODEL_NAMES, resolve_model
from spgc.privacy.accounting import check_schedule
from spgc.protocol.certs import make_dev_pki
from spgc.protocol.modes import (
    DEFAULT_SECURITY,
    NOISY_MODES,
    SINGLE_SERVER_MODES,
    TRAINING_MODES,
    default_verify_inputs,
    malicious_refusal,
)
from spgc.settings.config import parse_noise_schedule

# Per data set: the paper's local batch (providers' rows x rate) and a learning rate that
# trains in a few rounds.
DATASET_DEFAULTS: dict[str, dict[str, float]] = {
    "cancer": {"sampling_rate": 10 / 130, "lr": 0.05},
    "diabetes": {"sampling_rate": 10 / 200, "lr": 0.02},
    "mnist": {"sampling_rate": 1000 / 20000, "lr": 0.005},
    # Regression (linear model, mse): 30 of each provider's 100 rows a round.
    "diabetes-regression": {"sampling_rate": 30 / 100, "lr": 0.05},
}

# Per model other than a dataset's own (--model): server keys that replace the dataset's. The
# 10M-parameter mnist-wide costs a provider about 1 s per example on this machine (per-example
# gradient, clipping and encoding of 10M values), so its batch is about 10 examples per
# provider, and the round deadline and the peer's patience are longer.
MODEL_DEFAULTS: dict[str, dict[str, float]] = {
    "mnist-wide": {
        "sampling_rate": 10 / 20000,
        "lr": 0.001,
        "round_deadline": 300.0,
        "peer_timeout": 1200.0,
    },
}


# --adjacency provider (DP-FedAvg): each provider takes part with probability 0.5 (half the
# providers a round, in expectation), trains one local epoch of SGD, and the servers step by
# the noisy mean delta (FedAvg's server learning rate 1).
PROVIDER_LEVEL_DEFAULTS: dict[str, Any] = {
    "adjacency": "provider",
    "sampling_rate": 0.5,
    "lr": 1.0,
    "local_epochs": 1,
    "local_batch_size": 10,
    "local_lr": 0.1,
}


class DemoError(RuntimeError):
    """The demo could not run or a daemon failed; the message says which and why."""


# The first round's clip norm of `--clip adaptive` (Andrew et al.'s default C0).
ADAPTIVE_CLIP_C0 = 0.1


@dataclass
class DemoOptions:
    dataset: str = "cancer"
    providers: int = 3
    rounds: int = 5
    mode: str = "spgc"
    epsilon: float = 4.0
    delta: float = 1e-5
    insecure: bool = False
    # Empty: the dataset's own model; else a spgc.learning.models name reading the dataset's
    # examples,
    # or a user's factory, `file.py:factory` or `package.module:factory`.
    model: str = ""
    timeout: float = 600.0
    keep: bool = False
    # Where the servers keep their state (DIR/h1, DIR/h2: checkpoints, the exported model);
    # None: in the temporary work directory.
    state_dir: Path | None = None
    # Extra keys for every server's / provider's YAML (spgc experiment: rounds of several
    # epochs, calibration, lr, ...); empty for `spgc demo`.
    server_overrides: dict[str, Any] = field(default_factory=dict)
    provider_overrides: dict[str, Any] = field(default_factory=dict)
    # The most providers write_configs accepts (`spgc bench load` raises it).
    max_providers: int = 50
    # More certificates of the same CA, for names that are not providers (a benchmark's
    # intruder): pki/NAME.pem and pki/NAME.key.
    extra_certs: tuple[str, ...] = ()
    # Prometheus /metrics, /healthz, /readyz: H1 on this port, H2 on the next; None: off.
    metrics_port: int | None = None
    # "adaptive": C follows the median gradient norm (spgc.privacy.clipping) from clip_norm.
    clip: str = "fixed"
    # C (fixed) or C0 (adaptive); None: the servers' default 1.0, or the paper's C0 = 0.1.
    clip_norm: float | None = None
    # How the servers evaluate the round's circuits (spgc.protocol.modes.BACKENDS): gc or gmw.
    backend: str = "gc"
    # l2: the providers prove their vectors' norms and the servers check (spgc.protocol.norm_proof);
    # None: the servers' default (l2 in the two-server DP modes, default_verify_inputs).
    verify_inputs: str | None = None
    # The unit of privacy: example (DP-SGD) or provider (DP-FedAvg, PROVIDER_LEVEL_DEFAULTS).
    adjacency: str = "example"
    # adjacency provider: Geyer et al.'s phases "R:Z:Q,..."
    # (spgc.settings.config.parse_noise_schedule);
    # empty: one phase, the noise calibrated to the target epsilon.
    noise_schedule: str = ""
    # The servers' noise_floor (issue 46): each server's own share of the noise variance.
    noise_floor: float = 0.0
    # The servers' security (issue 46): semi-honest, or malicious (authenticated GMW).
    security: str = DEFAULT_SECURITY
    # (link, address) -> the address to dial instead, for the links between the two servers:
    # "peer-h2" (H1's control calls to H2's peer_listen), "peer-h1" (H2's to H1's) and "gc"
    # (H2's data link to H1's gc_address). `spgc bench wan` puts its shaping proxies there;
    # None: each server dials the other directly.
    peer_route: Callable[[str, str], str] | None = None


def verifies_inputs(opts: DemoOptions) -> bool:
    """Whether the servers of ``opts`` check norm proofs (explicitly, or by their default)."""
    chosen = opts.verify_inputs or default_verify_inputs(opts.mode)
    return chosen == "l2"


def _outgoing_port_range() -> tuple[int, int]:
    """The ports the kernel gives outgoing connections (Linux's setting; else IANA's range)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 49152, 65535


# Ray's workers bind ports 10002-19999 by default (ray start --min-worker-port/--max-worker-port):
# drawn ports start above them, so a Ray cluster on the same host cannot take one meanwhile.
FIRST_DRAWN_PORT = 20_000
# "LOW-HIGH": the ports free_ports draws from (the tests give each pytest-xdist worker its own
# slice, so that two tests never draw the same port between its check and the daemon's bind).
PORT_RANGE_ENV = "SPGC_PORT_RANGE"


def drawn_port_range() -> tuple[int, int]:
    """The ports :func:`free_ports` draws from: ``$SPGC_PORT_RANGE`` ("LOW-HIGH") where set,
    else everything from FIRST_DRAWN_PORT up."""
    text = os.environ.get(PORT_RANGE_ENV, "").strip()
    if not text:
        return FIRST_DRAWN_PORT, 65_535
    try:
        low, high = (int(part) for part in text.split("-"))
    except ValueError:
        message = f"{PORT_RANGE_ENV}={text!r}: expected LOW-HIGH, e.g. 20000-26000"
        raise ValueError(message) from None
    if not 1024 <= low <= high <= 65_535:
        raise ValueError(f"{PORT_RANGE_ENV}={text!r}: need 1024 <= LOW <= HIGH <= 65535")
    return low, high


def free_ports(count: int, *, consecutive: bool = False) -> list[int]:
    """``count`` distinct local ports that are free now (``consecutive``: N, N + 1, ...).

    The daemons bind them seconds later. Ports handed out by a bind to port 0 come from the
    range the kernel also gives outgoing connections, any of which could take one meanwhile;
    so they are drawn outside that range where there is room, where only another explicit
    bind can take one, and from :func:`drawn_port_range` (above Ray's worker ports).
    """
    low, high = _outgoing_port_range()
    range_low, range_high = drawn_port_range()
    first_ports = range(range_low, range_high - count + 2)
    if not first_ports:
        raise OSError(f"found no {count} free local ports in {range_low}-{range_high}")
    outside = [p for p in first_ports if p + count - 1 < low or p > high]
    held: list[socket.socket] = []
    try:
        for pool in (outside, first_ports):
            for _ in range(200 if pool else 0):
                first = secrets.choice(pool)
                trial: list[socket.socket] = []
                try:  # a port held already fails to bind too
                    for port in range(first, first + (count if consecutive else 1)):
                        trial.append(socket.socket())
                        trial[-1].bind(("127.0.0.1", port))
                except OSError:
                    for sock in trial:
                        sock.close()
                    continue
                held += trial
                if len(held) >= count:
                    return [s.getsockname()[1] for s in held[:count]]
        raise OSError(f"found no {count} free local ports in {range_low}-{range_high}")
    finally:
        for sock in held:
            sock.close()


def _write_yaml(path: Path, data: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _state_dir(opts: DemoOptions, work: Path, name: str) -> Path:
    """The state directory of daemon ``name`` (h1, h2, or a provider: its data sets' budget
    files): DIR/name with ``--state-dir DIR``, else in the demo's work directory."""
    if opts.state_dir is not None:
        return opts.state_dir.resolve() / name
    return work / f"{name}-state"


def _model_for(opts: DemoOptions) -> str:
    """The servers' ``model`` key for ``--model``: "" (the dataset's own), a built-in name that
    reads the dataset's examples, or a user's factory checked now on the dataset's examples
    (a ``file.py`` made absolute, since the daemons run elsewhere). DemoError naming why not."""
    if not opts.model:
        return ""
    if ":" not in opts.model:
        if MODEL_INPUT_SHAPES.get(opts.model) != MODEL_INPUT_SHAPES[opts.dataset]:
            shape = MODEL_INPUT_SHAPES[opts.dataset]
            fits = [n for n in MODEL_NAMES if MODEL_INPUT_SHAPES[n] == shape]
            raise DemoError(
                f"model {opts.model!r} does not read {opts.dataset}; choose: {fits}, or give "
                "your own factory as file.py:factory or package.module:factory"
            )
        return opts.model
    where, _, factory = opts.model.rpartition(":")
    if where.endswith(".py"):
        where = str(Path(where).expanduser().resolve())
    ref = f"{where}:{factory}"
    try:
        data = load_dataset(opts.dataset)
        check_model_on_data(
            resolve_model(ref),
            data.x_train[:64],
            data.y_train[:64],
            f"the {opts.dataset} data",
            task=dataset_task(opts.dataset),
        )
    except (ValueError, *DATA_ERRORS) as exc:
        raise DemoError(f"--model {opts.model}: {' '.join(str(exc).split())}") from None
    return ref


def _schedule_for(opts: DemoOptions) -> list[dict[str, float]]:
    """--noise-schedule as the servers' noise_schedule phases; DemoError naming what is wrong."""
    if not opts.noise_schedule:
        return []
    if opts.adjacency != "provider":
        raise DemoError("--noise-schedule needs --adjacency provider (Geyer et al.'s DP-FedAvg)")
    try:
        phases = parse_noise_schedule(opts.noise_schedule)
        check_schedule(
            [(p["from_release"], p["noise_multiplier"], p["sampling_rate"]) for p in phases]
        )
    except ValueError as exc:
        raise DemoError(f"--noise-schedule: {exc}") from None
    return phases


def write_configs(opts: DemoOptions, work: Path) -> tuple[list[Path], list[Path]]:
    """Certificates and the YAML files of both servers and every provider."""
    if opts.dataset not in DATASET_DEFAULTS:
        raise DemoError(f"unknown dataset {opts.dataset!r}; choose from {sorted(DATASET_DEFAULTS)}")
    if opts.mode not in TRAINING_MODES:
        raise DemoError(f"mode {opts.mode!r} is not available; choose from {TRAINING_MODES}")
    if not 1 <= opts.providers <= opts.max_providers:
        raise DemoError(f"--providers must be in 1..{opts.max_providers}")
    if opts.security == "malicious" and (refusal := malicious_refusal(opts.backend, opts.mode)):
        raise DemoError(f"--security malicious: {refusal} (--backend, --mode)")
    schedule = _schedule_for(opts)
    model = _model_for(opts)
    names = [f"p{i + 1}" for i in range(opts.providers)]
    servers = ["h1", "h2", *opts.extra_certs]
    pki = None if opts.insecure else make_dev_pki(work / "pki", servers, providers=names)
    listen1, listen2, peer1, peer2, gc = free_ports(5)
    defaults = DATASET_DEFAULTS[opts.dataset]

    def tls(name: str) -> dict[str, str] | None:
        if pki is None:
            return None
        p = pki[name]
        return {"cert": str(p.cert), "key": str(p.key), "ca": str(p.ca)}

    single = opts.mode in SINGLE_SERVER_MODES
    # (role, providers' port, own peer port, the other server's peer port)
    roles = ((1, listen1, peer1, peer2),) if single else (
        (1, listen1, peer1, peer2),
        (2, listen2, peer2, peer1),
    )
    route = opts.peer_route or (lambda _link, address: address)
    servers = []
    for role, listen, peer_listen, peer in roles:
        cfg: dict[str, Any] = {
            "role": role,
            "listen": f"127.0.0.1:{listen}",
            "peer_listen": f"127.0.0.1:{peer_listen}",
            "peer_address": route(f"peer-h{3 - role}", f"127.0.0.1:{peer}"),
            "peer_name": f"h{3 - role}",
            # H1 listens there, H2 dials it
            "gc_address": f"127.0.0.1:{gc}" if role == 1 else route("gc", f"127.0.0.1:{gc}"),
            "state_dir": str(_state_dir(opts, work, f"h{role}")),
            "summary_path": str(work / f"h{role}-summary.json"),
            "providers": names,
            "dataset": opts.dataset,
            "mode": opts.mode,
            "rounds": opts.rounds,
            "min_providers": min(2, opts.providers),
            "round_deadline": 60.0,
            "sampling_rate": defaults["sampling_rate"],
            "lr": defaults["lr"],
            "target_epsilon": opts.epsilon,
            "target_delta": opts.delta,
        }
        if model:
            cfg["model"] = model
            cfg.update(MODEL_DEFAULTS.get(model, {}))
        if opts.metrics_port is not None:
            cfg["metrics_port"] = opts.metrics_port + role - 1
        cfg["clip"] = opts.clip
        if opts.backend != "gc":
            cfg["backend"] = opts.backend
        if opts.verify_inputs is not None:  # "none" too: the servers' default may be l2
            cfg["verify_inputs"] = opts.verify_inputs
        if opts.adjacency == "provider":
            cfg.update(PROVIDER_LEVEL_DEFAULTS)
        if schedule:
            cfg["noise_schedule"] = schedule
        if opts.noise_floor:
            cfg["noise_floor"] = opts.noise_floor
        if opts.security != DEFAULT_SECURITY:
            cfg["security"] = opts.security
        if opts.clip_norm is not None or opts.clip == "adaptive":
            cfg["clip_norm"] = ADAPTIVE_CLIP_C0 if opts.clip_norm is None else opts.clip_norm
        cfg.update(opts.server_overrides)
        _state_dir(opts, work, f"h{role}").mkdir(mode=0o700, parents=True, exist_ok=True)
        if opts.state_dir is not None:
            cfg["resume"] = False  # a demo always starts a new run, whatever DIR holds
        if pki is None:
            cfg["insecure"] = True
        else:
            cfg["tls"] = tls(f"h{role}")
        servers.append(_write_yaml(work / f"h{role}.yaml", cfg))

    providers = []
    for i, name in enumerate(names):
        pcfg: dict[str, Any] = {
            "name": name,
            "h1": {"address": f"127.0.0.1:{listen1}", "name": "h1"},
            "dataset": opts.dataset,
            "provider": {"index": i, "count": opts.providers},
            "step_delta": opts.delta,
            "state_dir": str(_state_dir(opts, work, name)),
        }
        if ":" in model:  # a user's factory: the providers build the same one
            pcfg["model"] = model
        if not single:
            pcfg["h2"] = {"address": f"127.0.0.1:{listen2}", "name": "h2"}
        if opts.mode in NOISY_MODES:
            # The demo's providers accept the servers' per-step privacy when its noise
            # multiplier is at least 0.3 (a real provider sets its own minimum).
            pcfg["min_noise_multiplier"] = 0.3
        else:
            pcfg["allow_no_privacy"] = True
        if pki is None:
            pcfg["insecure"] = True
        else:
            pcfg["tls"] = tls(name)
        pcfg.update(opts.provider_overrides)
        providers.append(_write_yaml(work / f"{name}.yaml", pcfg))
    return servers, providers


def _follow(stream: TextIO, log: TextIO, echo: bool, out: TextIO) -> None:
    """Copies a daemon's output to its log file; echoes the round lines as progress."""
    for line in stream:
        log.write(line)
        log.flush()
        if echo and (" round " in line or "stopping" in line or "finished" in line):
            text = line.split(" INFO ", 1)[-1].split(" ERROR ", 1)[-1].strip()
            print(f"  {text}", file=out, flush=True)


def _child_env() -> dict[str, str]:
    """The environment with PYTHONPATH entries made absolute: the children run in the work
    directory, where a relative entry (PYTHONPATH=.) would no longer find the packages."""
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        parts = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).resolve()) for p in parts if p)
    return env


def _start(module: str, config: Path, work: Path, echo: bool, out: TextIO) -> subprocess.Popen:
    log = (work / f"{config.stem}.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", module, "--config", str(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env=_child_env(),
        cwd=work,  # `python -m` puts the cwd first on sys.path: not a source checkout
        text=True,
        start_new_session=True,  # Ctrl-C reaches the demo, which stops them in order
    )
    threading.Thread(target=_follow, args=(proc.stdout, log, echo, out), daemon=True).start()
    return proc


def _stop(procs: list[subprocess.Popen], grace: float = 5.0) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    end = time.monotonic() + grace
    for p in procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _tail(path: Path, lines: int = 15) -> str:
    if not path.exists():
        return ""
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def run_demo(opts: DemoOptions, out: TextIO = sys.stderr) -> dict[str, Any]:
    """Runs the demo; returns H1's summary plus wall seconds. Raises DemoError on failure."""
    # A data set whose package is not installed: one line saying how to install it, before
    # any daemon starts (they would each fail with the same message in their logs).
    load_dataset(opts.dataset)
    work = Path(tempfile.mkdtemp(prefix="spgc-demo-"))
    started = time.monotonic()
    procs: list[subprocess.Popen] = []
    try:
        server_cfgs, provider_cfgs = write_configs(opts, work)
        link = "plaintext (--insecure)" if opts.insecure else "TLS 1.3, mutual certificates"
        print(
            f"spgc demo: {opts.dataset}{f' ({opts.model})' if opts.model else ''}, "
            f"{opts.providers} providers, {opts.rounds} rounds, "
            f"mode {opts.mode}, target epsilon {opts.epsilon:g} (delta {opts.delta:g}), {link}"
            + (f", backend {opts.backend}" if opts.backend != "gc" else "")
            + (f", security {opts.security}" if opts.security != DEFAULT_SECURITY else "")
            + (", verified inputs (norm proofs)" if verifies_inputs(opts) else "")
            + (", provider-level DP (DP-FedAvg)" if opts.adjacency == "provider" else ""),
            file=out,
        )
        if opts.metrics_port is not None:
            ports = [opts.metrics_port + i for i in range(len(server_cfgs))]
            where = ", ".join(f"h{i + 1} http://127.0.0.1:{n}/metrics" for i, n in enumerate(ports))
            print(f"metrics: {where} (and /healthz, /readyz)", file=out)
        servers = [
            _start("spgc.servers", c, work, echo=i == 0, out=out) for i, c in enumerate(server_cfgs)
        ]
        procs += servers
        procs += [_start("spgc.providers", c, work, echo=False, out=out) for c in provider_cfgs]
        deadline = started + opts.timeout
        while any(s.poll() is None for s in servers):
            if time.monotonic() > deadline:
                raise DemoError(f"the servers did not finish within {opts.timeout:g} s")
            if any(s.poll() not in (None, 0) for s in servers):
                break
            time.sleep(0.2)
        _stop(procs)
        failed = [f"h{i + 1}" for i, s in enumerate(servers) if s.returncode != 0]
        summary_path = work / "h1-summary.json"
        if failed or not summary_path.exists():
            names = [f"h{i + 1}" for i in range(len(servers))]
            logs = "\n".join(f"--- {n}.log\n{_tail(work / f'{n}.log')}" for n in names)
            raise DemoError(f"server(s) {failed or ['h1']} failed; last log lines:\n{logs}")
        summary = json.loads(summary_path.read_text())
        summary["seconds"] = round(time.monotonic() - started, 2)
        summary["providers"] = opts.providers
        return summary
    finally:
        _stop(procs)
        if opts.keep:
            print(f"demo files kept in {work}", file=out)
        else:
            shutil.rmtree(work, ignore_errors=True)


def run_cli(opts: DemoOptions, as_json: bool) -> int:
    summary = run_demo(opts)
    if as_json:
        print(json.dumps(summary, indent=2, sort_keys=True))
        return 0
    acc, eps = summary.get("test_accuracy"), summary.get("epsilon")
    parts = [f"{summary['rounds']} rounds, {summary['steps']} model updates"]
    if summary.get("task") == "regression":
        r2, mse = summary.get("test_r2"), summary.get("test_mse")
        parts.append(
            "no update published" if r2 is None else f"test R^2 {r2:.4f} (MSE {mse:.4f})"
        )
    else:
        parts.append("no update published" if acc is None else f"test accuracy {acc:.4f}")
    parts.append(
        "no DP noise" if eps is None else f"epsilon {eps:.4f} (delta {summary['delta']:g})"
    )
    between = f"{summary['gc_bytes'] / 1e6:.1f} MB between the servers"
    if summary.get("offline_gc_bytes"):
        between += f" (+ {summary['offline_gc_bytes'] / 1e6:.1f} MB making noise shares offline)"
    between += " counted on the link"
    parts.append(between)
    parts.append(f"{summary['seconds']:.1f} s")
    print("done: " + ", ".join(parts))
    return 0

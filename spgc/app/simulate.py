"""`spgc experiment --adjacency provider`: provider-level DP (DP-FedAvg) with many providers
simulated in one process, for experiments at sizes the daemons are not meant for (1,000
providers on one machine).

What runs is the product's code, not a model of it: the plan (``spgc.settings.plan.make_plan`` on a
ServerConfig with ``adjacency: provider``: the noise multiplier calibrated for the whole
training, the fixed-point encoding, the ring, the refusal of a noise that swamps the signal),
each provider's coin, local training and clipped delta (``spgc.learning.local_training``, as the
provider
daemon calls it), its fixed-point encoding (``spgc.protocol.encoding.encode_batch``), the servers'
noise
(``spgc.privacy.noise.sample_noise_plain``: the exact discrete Gaussian sampler the round's circuit
evaluates, here in plaintext on fresh OS randomness), the servers' update
(``spgc.learning.optim.mean_delta_direction`` and ``SgdStep``), their accountant (add/remove one
provider) and their test-set evaluation. What is not simulated is the transport: the two
additive shares of each vector cancel in the sum, so the simulation adds the encoded vectors
directly. Unselected providers would send shares of zeros; they add nothing to the sum.

Output: one CSV row per evaluation (every ``--eval-every`` rounds and the last): round,
providers used, epsilon spent, test loss and accuracy; and a summary (JSON with ``--json``).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from spgc.common.csprng import SecureRandom
from spgc.common.progress import Progress
from spgc.learning.data import load_dataset, split_among_providers
from spgc.learning.local_training import LocalTraining, clipped_delta, selected_this_round
from spgc.learning.models import load_flat_params
from spgc.learning.optim import mean_delta_direction, server_optimizer
from spgc.privacy.accounting import quiet_dp_accounting
from spgc.privacy.noise import sample_noise_plain
from spgc.protocol.encoding import default_rounding_rng, encode_batch
from spgc.servers.evaluation import TestSetEvaluator, test_set_loader
from spgc.servers.noise_floor import draw_own_noise
from spgc.settings.config import ConfigError, ServerConfig, parse_noise_schedule
from spgc.settings.plan import build_run_model, make_plan

__all__ = ["SimulationError", "SimulationOptions", "run_simulation"]

#: Modes whose noise is one discrete Gaussian added to the sum (simulated), or none.
SIMULATED_MODES = ("spgc", "preprocessed", "only-mpc", "plain")

COLUMNS = (
    "dataset", "providers", "round", "providers_used", "epsilon", "delta", "noise_multiplier",
    "test_loss", "test_accuracy", "seconds",
)  # fmt: skip


class SimulationError(ValueError):
    """Bad options for the simulation (exit code 2, one line)."""


@dataclass
class SimulationOptions:
    """One provider-level run (DP-FedAvg), its defaults those of the MNIST target in
    docs/RESULTS.md."""

    dataset: str = "mnist"
    providers: int = 1000
    rounds: int = 50
    sampling_rate: float = 0.1
    epsilon: float = 8.0  # the whole training's target (add/remove one provider)
    delta: float = 1e-3
    clip_norm: float = 1.0
    local_epochs: int = 1
    local_batch_size: int = 10
    local_lr: float = 0.1
    local_optimizer: str = "sgd"
    server_lr: float = 1.0
    mode: str = "spgc"
    eval_every: int = 10
    model: str = ""
    # Geyer et al.'s adjustment: "R:Z:Q,R:Z:Q" phases (from release R, noise multiplier Z,
    # rate Q), replacing the calibrated noise and sampling_rate; empty: none.
    noise_schedule: str = ""

    def schedule_phases(self) -> list[dict[str, float]]:
        """--noise-schedule as ServerConfig.noise_schedule entries (SimulationError when
        malformed)."""
        try:
            return parse_noise_schedule(self.noise_schedule)
        except ValueError as exc:
            raise SimulationError(f"--noise-schedule: {exc}") from None

    def server_config(self) -> ServerConfig:
        """The ServerConfig a real deployment of this run would hold (the plan's input)."""
        if self.mode not in SIMULATED_MODES:
            raise SimulationError(
                f"mode {self.mode!r}: the simulation adds the noise once to the sum; choose from "
                f"{', '.join(SIMULATED_MODES)}"
            )
        if not 2 <= self.providers <= 100_000:
            raise SimulationError(f"--providers must be in 2..100000, got {self.providers}")
        if self.eval_every < 1:
            raise SimulationError(f"--eval-every must be >= 1, got {self.eval_every}")
        values: dict[str, Any] = {
            "insecure": True,
            "providers": [f"p{i + 1}" for i in range(self.providers)],
            "dataset": self.dataset,
            "mode": self.mode,
            "rounds": self.rounds,
            "min_providers": 1,
            "adjacency": "provider",
            "sampling_rate": self.sampling_rate,
            "target_epsilon": self.epsilon,
            "target_delta": self.delta,
            "clip_norm": self.clip_norm,
            "local_epochs": self.local_epochs,
            "local_batch_size": self.local_batch_size,
            "local_lr": self.local_lr,
            "local_optimizer": self.local_optimizer,
            "lr": self.server_lr,
            "verify_inputs": "none",
        }
        if self.noise_schedule:
            values["noise_schedule"] = self.schedule_phases()
        if self.mode == "preprocessed":
            values["pool_dir"] = "unused-by-the-simulation"
        if self.model:
            values["model"] = self.model
        try:
            return ServerConfig.model_validate(values)
        except (ConfigError, ValueError) as exc:
            raise SimulationError(str(exc).splitlines()[0]) from None


def run_simulation(
    opts: SimulationOptions, err: TextIO = sys.stderr, rows_out: list[dict[str, Any]] | None = None
) -> dict[str, Any]:
    """Train with ``opts`` and return the summary; each evaluation's row is appended to
    ``rows_out`` as it is made."""
    cfg = opts.server_config()
    started = time.monotonic()
    try:
        with quiet_dp_accounting():
            plan = make_plan(cfg)
    except ValueError as exc:
        raise SimulationError(f"the plan is refused: {exc}") from None
    tc = plan.training_config("simulation")
    training = LocalTraining.of_plan(tc)
    fp, coords = plan.fixed_point, plan.coordinates
    data = load_dataset(cfg.dataset)
    parts = [
        split_among_providers(data.x_train, data.y_train, opts.providers, i)
        for i in range(opts.providers)
    ]
    coins = [SecureRandom() for _ in range(opts.providers)]  # each provider's own CSPRNG
    rounding = default_rounding_rng()
    model = build_run_model(cfg)
    params = plan.initial_params.copy()
    optimizer = server_optimizer(plan.dim, cfg.lr, cfg.server_optimizer)
    accountant = plan.new_accountant()
    loader = test_set_loader(cfg)
    evaluate = None if loader is None else TestSetEvaluator(
        plan.model_name, loader, cfg.task, cfg.loss_name
    )  # fmt: skip
    rows = rows_out if rows_out is not None else []
    used_total, rounds_done = 0, 0
    bar = Progress(cfg.rounds, "rounds", desc="provider-level DP", stream=err, lines=False)
    for t in range(cfg.rounds):
        if accountant is not None:
            with quiet_dp_accounting():
                if accountant.epsilon_after(t + 1) > cfg.target_epsilon:
                    break  # as the servers stop: the next release would pass the target
        total = np.zeros(plan.share_dim, dtype=np.int64)
        used = 0
        rate = plan.sampling_rate_for(t)  # every round releases: round t is release t
        for (x, y), coin in zip(parts, coins, strict=True):
            if not selected_this_round(coin, rate):
                continue
            load_flat_params(model, params)
            row = clipped_delta(
                model, x, y, coords, training, cfg.clip_norm, coin,
                task=cfg.task, loss=cfg.loss_name,
            )  # fmt: skip
            total += encode_batch(row, fp, rounding, ring_bits=plan.ring_bits)
            used += 1
        noisy = total
        if plan.sigma_units > 0:  # the two servers' seeds, fresh: never used twice
            noise = sample_noise_plain(os.urandom(32), os.urandom(32), plan.share_dim,
                                       plan.joint_sigma_units_for(t))  # fmt: skip
            noisy = total + noise
            for _ in range(2):  # a noise_floor: each server's own noise too
                own = draw_own_noise(plan.share_dim, plan.floor_sigma_units_for(t))
                noisy = noisy if own is None else noisy + own
        direction = mean_delta_direction(noisy / cfg.scale, plan.expected_providers_for(t))
        new = params.copy()
        new[coords.index] = optimizer.step(params[coords.index], direction)
        params = new
        if accountant is not None:
            accountant.step()
        used_total += used
        rounds_done = t + 1
        bar.update(rounds_done)
        if evaluate is not None and (rounds_done % opts.eval_every == 0 or t == cfg.rounds - 1):
            rows.append(_row(opts, plan, accountant, evaluate(params), t, used, started))
            r = rows[-1]
            bar.note(
                f"round {t}: {used} providers, accuracy {r['test_accuracy']:.4f}, epsilon "
                f"{r['epsilon'] if r['epsilon'] is not None else '-'}"
            )
    bar.close()
    if evaluate is not None and rounds_done and (not rows or rows[-1]["round"] != rounds_done - 1):
        rows.append(_row(opts, plan, accountant, evaluate(params), rounds_done - 1, 0, started))
    last = rows[-1] if rows else {}
    with quiet_dp_accounting():
        eps = None if accountant is None else accountant.epsilon()
    return {
        "adjacency": "add/remove one provider" if accountant is not None else None,
        "options": asdict(opts),
        "rounds": rounds_done,
        "noise_multiplier": plan.noise_multiplier,
        "noise_std_units": plan.sigma_units,
        "expected_providers_per_round": plan.expected_providers,
        "mean_providers_per_round": used_total / rounds_done if rounds_done else 0.0,
        "coordinates": plan.dim,
        "ring_bits": plan.ring_bits,
        "epsilon": eps,
        "delta": cfg.target_delta if accountant is not None else None,
        "test_accuracy": last.get("test_accuracy"),
        "test_loss": last.get("test_loss"),
        # Bytes that depend on the circuit's bytes per coordinate (spgc bench comm): the
        # coordinates noised over the run, and each provider's upload to the two servers.
        "coordinate_releases": rounds_done * plan.dim,
        "provider_upload_bytes_per_round": 2 * 8 * plan.share_dim,
        "seconds": round(time.monotonic() - started, 1),
    }


def _row(
    opts: SimulationOptions, plan: Any, accountant: Any, metrics: dict[str, float], t: int,
    used: int, started: float,
) -> dict[str, Any]:  # fmt: skip
    with quiet_dp_accounting():
        eps = None if accountant is None else accountant.epsilon()
    return {
        "dataset": opts.dataset,
        "providers": opts.providers,
        "round": t,
        "providers_used": used,
        "epsilon": eps,
        "delta": opts.delta if accountant is not None else None,
        "noise_multiplier": plan.noise_multiplier_for(t),
        "test_loss": metrics.get("test_loss"),
        "test_accuracy": metrics.get("test_accuracy"),
        "seconds": round(time.monotonic() - started, 1),
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options `spgc experiment --adjacency provider` adds (the others are shared)."""
    g = parser.add_argument_group("provider-level DP (--adjacency provider, simulated in-process)")
    d = SimulationOptions()
    g.add_argument(
        "--adjacency", choices=["example", "provider"], default="example",
        help="provider: DP-FedAvg with --providers simulated in this process (spgc.app.simulate); "
        "example (default): the paper's experiment on the daemons",
    )  # fmt: skip
    g.add_argument("--providers", type=int, default=d.providers, metavar="N")
    g.add_argument("--rounds", type=int, default=d.rounds, metavar="R")
    g.add_argument(
        "--sampling-rate", type=float, default=d.sampling_rate, metavar="Q",
        help="each provider's chance to take part in a round",
    )  # fmt: skip
    g.add_argument("--delta", type=float, default=d.delta)
    g.add_argument("--clip-norm", type=float, default=d.clip_norm, metavar="C")
    g.add_argument("--local-epochs", type=int, default=d.local_epochs, metavar="E")
    g.add_argument("--local-batch-size", type=int, default=d.local_batch_size, metavar="B")
    g.add_argument("--local-lr", type=float, default=d.local_lr, metavar="LR")
    g.add_argument("--local-optimizer", choices=["sgd", "adam"], default=d.local_optimizer)
    g.add_argument("--server-lr", type=float, default=d.server_lr, metavar="LR")
    g.add_argument("--eval-every", type=int, default=d.eval_every, metavar="R")
    g.add_argument(
        "--noise-schedule", default="", metavar="R:Z:Q,...",
        help="phases from release R with noise multiplier Z and rate Q (Geyer et al.), "
        "replacing the calibrated noise and --sampling-rate",
    )  # fmt: skip


def run_from_args(args: argparse.Namespace, err: TextIO = sys.stderr) -> int:
    """`spgc experiment --adjacency provider`: --datasets (one), --modes (one), --epsilons
    (whole-training targets, one run each)."""
    ignored = [
        f
        for f, v in (
            ("--epochs", args.epochs),
            ("--plot", args.plot),
            ("--quick", args.quick or None),
            ("--clip-schedule", args.clip_schedule),
        )
        if v
    ]
    if ignored:  # the simulation counts rounds, not epochs, and draws no per-epoch plot
        raise SimulationError(
            f"{', '.join(ignored)}: not with --adjacency provider (it takes --rounds; the CSV "
            "has one row per evaluation)"
        )  # fmt: skip
    datasets = [v for item in args.datasets or ["mnist"] for v in item.split(",") if v]
    modes = [v for item in args.modes or ["spgc"] for v in item.split(",") if v]
    if len(datasets) != 1 or len(modes) != 1:
        raise SimulationError("--adjacency provider runs one dataset and one mode at a time")
    try:
        epsilons = [float(v) for item in args.epsilons or ["8"] for v in item.split(",") if v]
    except ValueError:
        raise SimulationError(f"--epsilons: not a number in {args.epsilons}") from None
    for path in (args.out,):
        if not path.resolve().parent.is_dir():
            raise SimulationError(f"directory of {path} does not exist")
    rows: list[dict[str, Any]] = []
    summaries = []
    for eps in epsilons:
        if not (math.isfinite(eps) and eps > 0):
            raise SimulationError(f"epsilon must be finite and > 0, got {eps:g}")
        opts = SimulationOptions(
            dataset=datasets[0], providers=args.providers, rounds=args.rounds,
            sampling_rate=args.sampling_rate, epsilon=eps, delta=args.delta,
            clip_norm=args.clip_norm, local_epochs=args.local_epochs,
            local_batch_size=args.local_batch_size, local_lr=args.local_lr,
            local_optimizer=args.local_optimizer, server_lr=args.server_lr, mode=modes[0],
            eval_every=args.eval_every, noise_schedule=args.noise_schedule,
        )  # fmt: skip
        summaries.append(run_simulation(opts, err, rows))
        _write_csv(args.out, rows)
    if args.json:
        print(json.dumps(summaries if len(summaries) > 1 else summaries[0], indent=2))
    else:
        for s in summaries:
            o = s["options"]
            eps = "-" if s["epsilon"] is None else f"{s['epsilon']:.4g}"
            print(
                f"{o['dataset']}, {o['providers']} providers, mode {o['mode']}, provider-level "
                f"DP: {s['rounds']} rounds, {s['mean_providers_per_round']:.1f} providers a "
                f"round, noise multiplier {s['noise_multiplier']:.4g}, epsilon {eps} (delta "
                f"{o['delta']:g}), test accuracy {s['test_accuracy']:.4f}, {s['seconds']:.0f} s"
            )
        print(f"{len(rows)} rows in {args.out}")
    return 0


def _write_csv(path: Path, rows: list[dict[str, Any]]) -> None:
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({k: "" if row.get(k) is None else row[k] for k in COLUMNS})

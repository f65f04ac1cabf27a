"""`spgc experiment`: the paper's accuracy experiment (its Figure 1 and the time columns of its
Table 1) with the real servers and providers.

Every run is dataset x mode x per-step epsilon, trained through ``spgc demo``'s machinery (both
servers and 3 providers as separate processes on localhost, TLS on every link unless
--insecure). The paper's settings: 3 providers, C = 1, delta = 1e-3, per-step epsilon 0.5, 2, 8
with its classic calibration sigma = sqrt(2 ln(1.25/delta))/epsilon per step. The classic formula
is only a valid (eps, delta) bound for eps < 1; like the paper we use it at 2 and 8 too (the
noise multiplier is computed here with ``allow_invalid=True`` and handed to the servers as
``noise_multiplier``), and the servers' RDP accountant reports the true total epsilon of the
whole training, with Poisson subsampling, in the CSV. Modes without noise (plain, only-mpc) run
once, whatever the epsilons.

Batches: the paper's local batch (cancer 10 of 130 rows per provider, diabetes 10 of 200, MNIST
1000 of 20000) as the Poisson rate q; one epoch = round(1/q) rounds. The paper does not state its
number of epochs (its MNIST figure mentions epoch 18, so it spans about 20); ours are in
EXPERIMENT_DEFAULTS, with the learning rates (Adam) tuned for these workloads.

CSV: one row per run and epoch, with values at the end of that epoch: ``test_accuracy`` and
``test_loss`` of the last published model, ``epsilon_total`` (the accountant's epsilon at
``delta`` over all steps so far; empty for plain and only-mpc), and times in seconds summed
over the rounds so far as H1 measured them (cumulative, like the paper's whole-training times).
The split follows the paper's Table 1 ("computation" = Algorithm 1 lines 1-5, the providers'
work; "communication" = everything else):

- ``computation_s`` = intake + update: the round's intake phase (the providers' model download,
  clipped per-example gradients, encoding and share upload, and the wait for the slowest one)
  plus the servers' model update (Adam). Providers do not report their own compute time (it
  would reveal their secret batch size), so the providers' transfers count as computation here;
- ``communication_s`` = the two servers' interactive phase (the garbled circuit, or
  dng's/preprocessed's exchange and decode);
- ``intake_s``, ``servers_s`` (that interactive phase) and ``update_s`` are the raw parts.

``gc_bytes`` is the cumulative traffic between the servers; ``run_wall_s`` the whole run,
process start-up included. ``OUT.history.json`` keeps H1's per-round history of every run.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from spgc.app import simulate
from spgc.app.demo import DATASET_DEFAULTS, DemoError, DemoOptions, run_demo
from spgc.common.progress import Progress
from spgc.learning.optim import SERVER_OPTIMIZERS
from spgc.privacy.accounting import classic_noise_multiplier
from spgc.protocol.modes import ADAPTIVE_CLIP_MODES, NOISY_MODES, TRAINING_MODES

# The clip schedules a run may compare (ServerConfig.clip; paper 000's comparison).
CLIP_SCHEDULES = ("fixed", "decay", "adaptive")
# The paper's per-step epsilons and delta (section 5.2.3).
PAPER_EPSILONS = (0.5, 2.0, 8.0)
PAPER_DELTA = 1e-3
PROVIDERS = 3
# Per dataset: Adam learning rate and number of epochs of a full experiment.
EXPERIMENT_DEFAULTS: dict[str, dict[str, float]] = {
    "cancer": {"lr": 0.05, "epochs": 15},
    "diabetes": {"lr": 0.02, "epochs": 10},
    "mnist": {"lr": 0.005, "epochs": 10},
}
# --quick: small enough for CI (two short runs, about a minute).
QUICK = {"datasets": ["cancer"], "modes": ["plain", "spgc"], "epsilons": [8.0], "epochs": 2}

COLUMNS = (
    "dataset",
    "mode",
    "step_epsilon",
    "clip_schedule",
    "clip_norm",
    "server_optimizer",
    "noise_multiplier",
    "epoch",
    "rounds",
    "steps",
    "test_accuracy",
    "test_loss",
    "epsilon_total",
    "delta",
    "computation_s",
    "communication_s",
    "intake_s",
    "servers_s",
    "update_s",
    "gc_bytes",
    "run_wall_s",
)


class ExperimentError(ValueError):
    """Bad input for the experiment (exit code 2, one line)."""


@dataclass
class Run:
    """One training run: dataset, mode and per-step epsilon (None: a mode without noise)."""

    dataset: str
    mode: str
    epsilon: float | None
    # The clip schedule (ServerConfig.clip): fixed, decay or adaptive.
    clip_schedule: str = "fixed"

    @property
    def label(self) -> str:
        """'mode' or 'mode eps=E', and the clip schedule unless fixed (progress lines and
        plot legends)."""
        base = self.mode if self.epsilon is None else f"{self.mode} eps={self.epsilon:g}"
        return base if self.clip_schedule == "fixed" else f"{base} clip {self.clip_schedule}"


def rounds_per_epoch(dataset: str) -> int:
    """One pass over the data in expectation: 1/q rounds of Poisson sampling at rate q."""
    return max(1, round(1 / DATASET_DEFAULTS[dataset]["sampling_rate"]))


def plan_runs(
    datasets: Sequence[str],
    modes: Sequence[str],
    epsilons: Sequence[float],
    clip_schedules: Sequence[str] = ("fixed",),
) -> list[Run]:
    """dataset x mode x epsilon, modes without noise once per dataset; validates the input."""
    for d in datasets:
        if d not in DATASET_DEFAULTS:
            raise ExperimentError(
                f"unknown dataset {d!r}; choose from {', '.join(DATASET_DEFAULTS)}"
            )
    for m in modes:
        if m not in TRAINING_MODES:
            raise ExperimentError(f"unknown mode {m!r}; choose from {', '.join(TRAINING_MODES)}")
    for e in epsilons:
        if not (math.isfinite(e) and e > 0):
            raise ExperimentError(f"epsilon must be finite and > 0, got {e:g}")
    if any(m in NOISY_MODES for m in modes) and not epsilons:
        raise ExperimentError("noisy modes need at least one --epsilons value")
    for c in clip_schedules:
        if c not in CLIP_SCHEDULES:
            raise ExperimentError(
                f"unknown clip schedule {c!r}; choose from {', '.join(CLIP_SCHEDULES)}"
            )
        if c == "adaptive" and (bad := [m for m in modes if m not in ADAPTIVE_CLIP_MODES]):
            raise ExperimentError(
                f"clip schedule adaptive runs in modes {', '.join(ADAPTIVE_CLIP_MODES)}, not "
                f"{', '.join(bad)}"
            )
    runs = []
    for d in dict.fromkeys(datasets):
        for m in dict.fromkeys(modes):
            for c in dict.fromkeys(clip_schedules):
                if m in NOISY_MODES:
                    runs += [Run(d, m, float(e), c) for e in dict.fromkeys(epsilons)]
                else:
                    runs.append(Run(d, m, None, c))
    return runs


def run_options(
    run: Run,
    epochs: int,
    insecure: bool,
    lr: float | None = None,
    server: dict[str, Any] | None = None,
) -> DemoOptions:
    """The demo options of one run: the paper's workload, rounds for ``epochs`` epochs, classic
    calibration at the paper's delta, and no stop on a total budget (the CSV reports it)."""
    defaults = DATASET_DEFAULTS[run.dataset]
    rounds = epochs * rounds_per_epoch(run.dataset)
    settings: dict[str, Any] = {
        "rounds": rounds,
        "sampling_rate": defaults["sampling_rate"],
        "lr": lr if lr is not None else EXPERIMENT_DEFAULTS[run.dataset]["lr"],
        "target_delta": PAPER_DELTA,
        "target_epsilon": 1e12,  # never stop early: the CSV shows what was spent
        "accountant": "rdp",
        "calibration": "classic",
    }
    # The clip schedule: the servers' clip, and (server) clip_norm, clip_decay, clip_min, and
    # the servers' update rule.
    settings["clip"] = run.clip_schedule
    settings.update(server or {})
    if run.epsilon is not None:
        settings["step_epsilon"] = run.epsilon
        # The paper's formula, also at eps >= 1 (its eps 2 and 8), as an explicit multiplier.
        settings["noise_multiplier"] = classic_noise_multiplier(
            run.epsilon, PAPER_DELTA, allow_invalid=True
        )
    per_round = 60.0 if run.dataset == "mnist" else 10.0
    return DemoOptions(
        dataset=run.dataset,
        providers=PROVIDERS,
        rounds=rounds,
        mode=run.mode,
        epsilon=1e12,
        delta=PAPER_DELTA,
        insecure=insecure,
        timeout=300.0 + per_round * rounds,
        server_overrides=settings,
        provider_overrides={"poll_interval": 0.1},  # rounds start promptly
    )


_NOT_SERVERS = ("intake", "update")


def split_seconds(seconds: dict[str, float]) -> dict[str, float]:
    """One round's seconds as the paper splits them (see the module docstring)."""
    intake, update = seconds.get("intake", 0.0), seconds.get("update", 0.0)
    servers = sum(v for k, v in seconds.items() if k not in _NOT_SERVERS)
    return {
        "computation_s": intake + update,
        "communication_s": servers,
        "intake_s": intake,
        "servers_s": servers,
        "update_s": update,
    }


def epoch_rows(run: Run, summary: dict[str, Any], epochs: int) -> list[dict[str, Any]]:
    """One CSV row per epoch from H1's per-round history (values at the end of the epoch)."""
    per = rounds_per_epoch(run.dataset)
    history = sorted(summary.get("history") or [], key=lambda r: r["round"])
    rows = []
    for e in range(1, epochs + 1):
        done = [r for r in history if r["round"] < e * per]
        if not done or done[-1]["round"] < e * per - 1:
            break  # the run ended before this epoch did
        published = [r for r in done if r["published"]]
        last = published[-1] if published else None
        eps = last["epsilon"] if last is not None else None
        parts = [split_seconds(r["seconds"]) for r in done]
        rows.append(
            {
                "dataset": run.dataset,
                "mode": run.mode,
                "step_epsilon": run.epsilon,
                "clip_schedule": run.clip_schedule,
                # The first round's C (the servers' clip_norm): the fixed one, or C0.
                "clip_norm": (summary.get("clip_norms") or [None])[0],
                "server_optimizer": summary.get("server_optimizer"),
                "noise_multiplier": None
                if run.epsilon is None
                else classic_noise_multiplier(run.epsilon, PAPER_DELTA, allow_invalid=True),
                "epoch": e,
                "rounds": len(done),
                "steps": len(published),
                "test_accuracy": None if last is None else last["test_accuracy"],
                "test_loss": None if last is None else last["test_loss"],
                "epsilon_total": eps if run.mode in NOISY_MODES else None,
                "delta": PAPER_DELTA,
                **{k: round(sum(p[k] for p in parts), 3) for k in parts[0]},
                "gc_bytes": sum(r["gc_bytes"] for r in done),
                "run_wall_s": summary.get("seconds"),
            }
        )
    return rows


class _EpochLines:
    """A text sink for the demo's round lines: a line per finished epoch (``note``)."""

    _ROUND = re.compile(r" round (\d+) .*?accuracy ([0-9.]+)")

    def __init__(self, run: Run, per_epoch: int, epochs: int, note: Callable[[str], None]):
        self.run, self.per, self.epochs, self.note = run, per_epoch, epochs, note
        self.started = time.monotonic()
        self._buf = ""

    def write(self, text: str) -> int:
        self._buf += text
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            m = self._ROUND.search(line)
            if m and (int(m.group(1)) + 1) % self.per == 0:
                epoch = (int(m.group(1)) + 1) // self.per
                eps = re.search(r"eps=([0-9.]+)", line)
                extra = f", epsilon {float(eps.group(1)):.3g}" if eps else ""
                self.note(
                    f"  {self.run.dataset} {self.run.label}: epoch {epoch}/{self.epochs}, "
                    f"accuracy {float(m.group(2)):.4f}{extra}, "
                    f"{time.monotonic() - self.started:.0f} s"
                )
        return len(text)

    def flush(self) -> None:
        pass


def _fmt(value: Any) -> Any:
    return "" if value is None else value


def write_csv(path: Path, rows: Iterable[dict[str, Any]]) -> None:
    """All rows so far (rewritten after every run, so a long experiment keeps its results)."""
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        for row in rows:
            w.writerow({k: _fmt(row.get(k)) for k in COLUMNS})


_TEXT_COLUMNS = ("dataset", "mode", "clip_schedule", "server_optimizer")  # the rest: numbers


def read_csv(path: Path) -> list[dict[str, Any]]:
    """Rows of a CSV written by :func:`write_csv`, numbers parsed, empty cells as None."""
    rows = []
    with path.open(newline="") as f:
        for raw in csv.DictReader(f):
            row: dict[str, Any] = {}
            for k, v in raw.items():
                if v == "" or k in _TEXT_COLUMNS:
                    row[k] = v if v != "" else None
                else:
                    row[k] = float(v) if any(c in v for c in ".eE") else int(v)
            rows.append(row)
    return rows


def plot(rows: Sequence[dict[str, Any]], path: Path) -> None:
    """Test accuracy against epoch: one subplot per dataset, one line per mode/epsilon
    (colour = mode, line style = per-step epsilon)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    datasets = list(dict.fromkeys(r["dataset"] for r in rows))
    if not datasets:
        raise ExperimentError("nothing to plot: no completed epoch")
    # One colour per mode, clip schedule and first clip norm (per mode, as in the paper's
    # figure, when a run compares no schedules), the same in every subplot.
    variants = sorted(
        {(r["mode"], r.get("clip_schedule") or "fixed", r.get("clip_norm") or 0.0) for r in rows},
        key=lambda v: (TRAINING_MODES.index(v[0]) if v[0] in TRAINING_MODES else 99, v[1], v[2]),
    )
    colours = {v: f"C{i % 10}" for i, v in enumerate(variants)}
    epsilons = sorted({r["step_epsilon"] for r in rows if r["step_epsilon"] is not None})
    styles = ["-", "--", ":", "-."]
    # the largest epsilon solid, smaller ones dashed, then dotted
    style = {e: styles[(len(epsilons) - 1 - i) % len(styles)] for i, e in enumerate(epsilons)}
    fig, axes = plt.subplots(
        1, len(datasets), figsize=(4.5 * len(datasets) + 2, 4.2), squeeze=False
    )
    for ax, d in zip(axes[0], datasets, strict=True):
        lines: dict[tuple[str, Any], list[tuple[int, float]]] = {}
        for r in rows:
            if r["dataset"] == d and r["test_accuracy"] is not None:
                key = (
                    r["mode"], r["step_epsilon"], r.get("clip_schedule") or "fixed",
                    r.get("clip_norm"),
                )  # fmt: skip
                lines.setdefault(key, []).append((r["epoch"], r["test_accuracy"]))
        for (mode, eps, schedule, c0), pts in lines.items():
            xs, ys = zip(*sorted(pts), strict=True)
            ax.plot(
                xs,
                ys,
                color=colours.get((mode, schedule, c0 or 0.0), "k"),
                linestyle="-" if eps is None else style[eps],
                marker="o",
                markersize=2.5,
                label=Run(d, mode, eps, schedule).label + ("" if c0 is None else f" C={c0:g}"),
            )
        ax.set_title(d)
        ax.set_xlabel("epoch")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_ylabel("test accuracy")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle(f"{PROVIDERS} providers, per-step epsilon, classic calibration, delta 1e-3")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The last epoch of every run, one line each (the terminal summary)."""
    last: dict[tuple[str, str, Any, Any], dict[str, Any]] = {}
    for r in rows:
        last[(r["dataset"], r["mode"], r["step_epsilon"], r.get("clip_schedule"),
              r.get("clip_norm"))] = r  # fmt: skip
    head = (
        f"{'dataset':<9} {'mode':<13} {'clip':<12} {'eps/step':>8} {'epochs':>6} {'accuracy':>8} "
        f"{'eps total':>9} {'comput. s':>9} {'comm. s':>9} {'GB':>7} {'wall s':>7}"
    )
    lines = [head]
    for r in last.values():
        step = "-" if r["step_epsilon"] is None else f"{r['step_epsilon']:g}"
        acc = "-" if r["test_accuracy"] is None else f"{r['test_accuracy']:.4f}"
        tot = "-" if r["epsilon_total"] is None else f"{r['epsilon_total']:.3g}"
        lines.append(
            f"{r['dataset']:<9} {r['mode']:<13} {_clip_text(r):<12} "
            f"{step:>8} {r['epoch']:>6} {acc:>8} {tot:>9} "
            f"{r['computation_s']:>9.1f} {r['communication_s']:>9.1f} "
            f"{r['gc_bytes'] / 1e9:>7.2f} {r['run_wall_s'] or 0:>7.0f}"
        )
    return "\n".join(lines)


def _clip_text(row: dict[str, Any]) -> str:
    """The clip schedule and the first clip norm of a row: "fixed 1", "decay 1"."""
    schedule = row.get("clip_schedule") or "fixed"
    c0 = row.get("clip_norm")
    return schedule if c0 is None else f"{schedule} {c0:g}"


def _split(values: Sequence[str] | None) -> list[str]:
    return [v.strip() for item in values or () for v in item.split(",") if v.strip()]


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the experiment's options to ``parser`` (the `spgc experiment` subparser)."""
    parser.add_argument(
        "--datasets", nargs="+", metavar="D", help=f"default: {' '.join(DATASET_DEFAULTS)}"
    )
    parser.add_argument(
        "--modes", nargs="+", metavar="M", help=f"default: {' '.join(TRAINING_MODES)}"
    )
    parser.add_argument(
        "--epsilons", nargs="+", metavar="E", help="per-step epsilons (default: 0.5 2 8)"
    )
    parser.add_argument(
        "--epochs", type=int, metavar="N", help="epochs per run (default: per dataset)"
    )
    parser.add_argument(
        "--lr", type=float, metavar="LR", help="the servers' learning rate (default: per dataset)"
    )
    parser.add_argument(
        "--server-optimizer",
        choices=list(SERVER_OPTIMIZERS),
        default="adam",
        help="the servers' update rule: adam (the default) or sgd (minus lr times the noisy "
        "mean gradient; give its --lr)",
    )
    parser.add_argument(
        "--clip-schedule",
        nargs="+",
        metavar="S",
        help=f"clip schedules to compare ({', '.join(CLIP_SCHEDULES)}; default fixed): decay "
        "shrinks the clip norm by --clip-decay a round down to --clip-min, adaptive follows the "
        "median gradient norm (spgc.privacy.clipping); --clip-norm is the fixed or first round's C",
    )
    parser.add_argument("--clip-decay", type=float, metavar="R", help="decay: factor per round")
    parser.add_argument("--clip-min", type=float, metavar="C", help="decay: the floor")
    parser.add_argument(
        "--out", type=Path, default=Path("results.csv"), metavar="FILE.csv", help="CSV output"
    )
    parser.add_argument("--plot", type=Path, metavar="FILE.png", help="accuracy per epoch plot")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="CI size: cancer, plain and spgc at eps 8, 2 epochs (explicit options win)",
    )
    parser.add_argument("--insecure", action="store_true", help="plaintext links (testing only)")
    parser.add_argument(
        "--json", action="store_true", help="print the rows as a JSON list on stdout"
    )
    simulate.add_arguments(parser)
    return parser


def _parse_floats(values: list[str]) -> list[float]:
    out = []
    for v in values:
        try:
            out.append(float(v))
        except ValueError:
            raise ExperimentError(f"--epsilons: not a number: {v!r}") from None
    return out


def run_from_args(args: argparse.Namespace, err: TextIO = sys.stderr) -> int:
    """Run the experiment from parsed options; ExperimentError for bad input (exit code 2)."""
    if getattr(args, "adjacency", "example") == "provider":
        try:
            return simulate.run_from_args(args, err)
        except simulate.SimulationError as exc:
            raise ExperimentError(str(exc)) from None
    datasets = _split(args.datasets) or (
        QUICK["datasets"] if args.quick else list(DATASET_DEFAULTS)
    )
    modes = _split(args.modes) or (QUICK["modes"] if args.quick else list(TRAINING_MODES))
    eps_text = _split(args.epsilons)
    epsilons = (
        _parse_floats(eps_text)
        if eps_text
        else (QUICK["epsilons"] if args.quick else list(PAPER_EPSILONS))
    )
    epochs = args.epochs if args.epochs is not None else (QUICK["epochs"] if args.quick else None)
    if epochs is not None and epochs < 1:
        raise ExperimentError(f"--epochs must be >= 1, got {epochs}")
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr > 0):
        raise ExperimentError(f"--lr must be finite and > 0, got {args.lr}")
    if args.plot is not None and args.plot.suffix.lower() != ".png":
        raise ExperimentError(f"--plot writes a PNG: give FILE.png, got {args.plot}")
    for path in (args.out, args.plot):
        if path is not None and not path.resolve().parent.is_dir():
            raise ExperimentError(f"directory of {path} does not exist")
    schedules = _split(args.clip_schedule) or ["fixed"]
    runs = plan_runs(datasets, modes, epsilons, schedules)
    server: dict[str, Any] = {
        "clip_norm": args.clip_norm,
        "server_optimizer": args.server_optimizer,
    }
    if args.clip_decay is not None:
        server["clip_decay"] = args.clip_decay
    if args.clip_min is not None:
        server["clip_min"] = args.clip_min

    rows: list[dict[str, Any]] = []
    histories: list[dict[str, Any]] = []
    history_path = args.out.with_suffix(".history.json")
    failures = []
    write_csv(args.out, rows)
    # Lines per run and epoch; on a terminal also a progress line of the runs.
    bar = Progress(len(runs), "runs", desc="experiment", stream=err, lines=False)
    for i, run in enumerate(runs, 1):
        bar.update(i - 1)
        n = epochs or int(EXPERIMENT_DEFAULTS[run.dataset]["epochs"])
        opts = run_options(run, n, args.insecure, args.lr, server)
        bar.note(
            f"[{i}/{len(runs)}] {run.dataset} {run.label}: {n} epochs of "
            f"{rounds_per_epoch(run.dataset)} rounds"
        )
        epoch_lines = _EpochLines(run, rounds_per_epoch(run.dataset), n, bar.note)
        try:
            summary = run_demo(opts, out=epoch_lines)  # type: ignore[arg-type]
        except DemoError as exc:
            first = str(exc).splitlines()[0]
            bar.note(f"  {run.dataset} {run.label} FAILED: {first}")
            failures.append(f"{run.dataset} {run.label}: {exc}")
            continue
        got = epoch_rows(run, summary, n)
        histories.append({"run": asdict(run), "epochs": n, "summary": summary})
        history_path.write_text(json.dumps(histories, indent=1))
        rows += got
        write_csv(args.out, rows)
        if got:
            last = got[-1]
            bar.note(
                f"  {run.dataset} {run.label}: done, accuracy {last['test_accuracy']}, "
                f"epsilon {last['epsilon_total']}, computation {last['computation_s']:.1f} s, "
                f"communication {last['communication_s']:.1f} s, wall {summary['seconds']:.0f} s"
            )
    bar.update(len(runs))
    bar.close()
    if args.plot is not None and rows:
        plot(rows, args.plot)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        if rows:
            print(table(rows))
        print(f"{len(rows)} rows in {args.out}" + (f", plot {args.plot}" if args.plot else ""))
    for f in failures:
        print(f"failed: {f}", file=err)
    return 1 if failures else 0

"""`spgc bench wan`: rounds at the speed of a WAN between the two organisations.

Runs the real daemons (both servers and the providers as processes, as `spgc demo` does) with
every link between the two servers (H1's control calls to H2, H2's to H1, the data link H2
dials) through a shaping proxy (spgc.wire.shaper): a one-way delay of half the round trip in
each direction and, with ``--mbit``, the bytes paced to that rate, one wire per direction
shared by all these links. TLS passes through the proxy untouched. The providers' links are
not shaped. Prints, per setting and mode, the steady-state round: the median interval between
round openings after ``--warmup`` rounds, and the median of each phase H1 logs (intake,
agreement, waiting for noise, pool reads, circuit or exchange, update; the checkpoint in
``--json``; and the rest of the interval, ``other``: the control calls' round trips, evaluating
and publishing the model), with the bytes between the servers per round and the machine's load
average when the run started.

Modes: ``gc`` and ``gmw`` are mode spgc on that backend; ``preprocessed`` is mode preprocessed
with its pool made on ``--pre-backend``; ``auto`` is mode spgc with ``backend: auto`` (the
table shows the backend H1 chose on the shaped link, ``auto:gc``, or ``auto:gmw/48`` with gmw's
trial depth; ``--json`` also the figures it measured and each backend's expected round,
``backend_choice``).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from spgc.app.demo import DemoError, DemoOptions, run_demo
from spgc.learning.data import DATASET_NAMES
from spgc.settings.backend_choice import candidate_label
from spgc.wire.shaper import Pacer, Shaper
from spgc.wire.transport import split_host_port

#: The servers' mode for each bench mode (gc and gmw also name the backend; auto: mode spgc with
#: backend: auto, the backend H1 chose on the shaped link in the row's ``backend``).
MODES: dict[str, str] = {
    "gc": "spgc",
    "gmw": "spgc",
    "preprocessed": "preprocessed",
    "auto": "spgc",
}
#: The grid of docs/RESULTS.md: round trips (ms) x rates (Mbit/s, 0: unlimited).
GRID_RTT_MS = (1.0, 10.0, 50.0)
GRID_MBIT = (100.0, 1000.0, 0.0)
#: H1's per-round phases, in the order a round runs them (RoundRecord.seconds).
PHASES = ("intake", "agree", "noise_wait", "pool", "circuit", "exchange", "update", "checkpoint")


def shaped_route(shaper: Shaper, rtt_ms: float, mbit: float) -> Any:
    """DemoOptions.peer_route: every server-to-server link through a proxy of ``shaper``, one
    wire per direction (H1 to H2 and H2 to H1) shared by all of them."""
    to_h2, to_h1 = Pacer(rtt_ms / 2000, mbit), Pacer(rtt_ms / 2000, mbit)

    def route(link: str, address: str) -> str:
        # peer-h2: H1 dials H2; peer-h1 and gc: H2 dials H1.
        forward, backward = (to_h2, to_h1) if link == "peer-h2" else (to_h1, to_h2)
        host, port = shaper.proxy(split_host_port(address), forward, backward)
        return f"{host}:{port}"

    return route


def steady_state(history: Sequence[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Medians over the published rounds from ``warmup`` on: the interval between consecutive
    round openings, each phase of H1's round, the rest of the interval (``other``: the control
    calls' round trips, evaluating and publishing the model), bytes between the servers."""
    rounds = [r for r in history if r.get("published")]
    opened = {r["round"]: r["opened_at"] for r in history}
    steady = [r for r in rounds if r["round"] >= warmup]
    timed = [r for r in steady if r["round"] + 1 in opened]
    intervals = [opened[r["round"] + 1] - opened[r["round"]] for r in timed]
    # H1 opens round t+1 before its checkpoint of round t, which so overlaps the next interval:
    # the rest of an interval is what its other phases leave
    before_next = [p for p in PHASES if p != "checkpoint"]
    other = [
        interval - sum(r["seconds"].get(p, 0.0) for p in before_next)
        for r, interval in zip(timed, intervals, strict=True)
    ]
    out: dict[str, Any] = {
        "rounds": len(steady),
        "round_s": statistics.median(intervals) if intervals else None,
        "round_s_mean": statistics.mean(intervals) if intervals else None,
        "other": statistics.median(other) if other else None,
        "gc_bytes": statistics.median([r["gc_bytes"] for r in steady]) if steady else None,
    }
    for phase in PHASES:
        # a phase some rounds skip (noise_wait: only a round that found the pool empty) is
        # 0 in the others; one no round has is None (the mode has no such phase)
        values = [r["seconds"].get(phase, 0.0) for r in steady]
        had = any(phase in r["seconds"] for r in steady)
        out[phase] = statistics.median(values) if had else None
    out["noise_waits"] = sum("noise_wait" in r["seconds"] for r in steady)
    return out


def run_setting(
    mode: str,
    rtt_ms: float,
    mbit: float,
    *,
    dataset: str = "cancer",
    rounds: int = 8,
    warmup: int = 2,
    providers: int = 3,
    pre_backend: str = "gmw",
    insecure: bool = False,
    timeout: float = 900.0,
    server_overrides: dict[str, Any] | None = None,
    keep: bool = False,
) -> dict[str, Any]:
    """One run of the daemons with shaped server-to-server links; its steady-state round.
    ``keep``: the run's files (the daemons' logs) stay, and stderr says where."""
    if mode not in MODES:
        raise DemoError(f"unknown mode {mode!r}; choose from {sorted(MODES)}")
    if rounds < warmup + 2:
        raise DemoError(f"--rounds must be at least --warmup + 2 ({warmup + 2}) for an interval")
    backend = pre_backend if mode == "preprocessed" else mode
    load = os.getloadavg()[0]
    with Shaper() as shaper:
        opts = DemoOptions(
            dataset=dataset,
            providers=providers,
            rounds=rounds,
            mode=MODES[mode],
            backend=backend,
            insecure=insecure,
            timeout=timeout,
            keep=keep,
            server_overrides=dict(server_overrides or {}),
            peer_route=shaped_route(shaper, rtt_ms, mbit),
        )
        summary = run_demo(opts, out=sys.stderr if keep else io.StringIO())
    result = {
        "mode": mode,
        "server_mode": MODES[mode],
        "backend": summary.get("backend", backend),  # auto: the one chosen
        "dataset": dataset,
        "rtt_ms": rtt_ms,
        "mbit": mbit,
        "load_1min": round(load, 2),
        "wall_s": summary["seconds"],
    }
    result.update(steady_state(summary.get("history", []), warmup))
    if "backend_choice" in summary:  # backend: auto: the figures H1 measured and its model's
        result["backend_choice"] = summary["backend_choice"]
    return result


def _fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _mode_label(row: dict[str, Any]) -> str:
    """The row's mode; auto with the backend it chose (auto:gc, auto:gmw/48: gmw's trial depth
    chosen with it)."""
    if row["mode"] != "auto":
        return row["mode"]
    depth = row.get("backend_choice", {}).get("trial_depth")
    return f"auto:{candidate_label((row['backend'], depth))}"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The results as a text table (seconds; MB between the servers per round)."""
    head = (
        f"{'rtt ms':>6} {'Mbit/s':>9} {'mode':>12} {'round s':>8} {'intake':>7} {'agree':>6} "
        f"{'noise wait (n)':>14} {'pool':>6} {'circuit':>8} {'exchange':>8} {'update':>6} "
        f"{'other':>6} {'MB/round':>9} {'load':>5}"
    )
    lines = [head]
    for r in rows:
        mb = None if r["gc_bytes"] is None else r["gc_bytes"] / 1e6
        rate = f"{r['mbit']:g}" if r["mbit"] else "unlimited"
        wait = "-" if r["noise_wait"] is None else f"{r['noise_wait']:.3f} ({r['noise_waits']})"
        lines.append(
            f"{r['rtt_ms']:>6g} {rate:>9} "
            f"{_mode_label(r):>12} {_fmt(r['round_s']):>8} {_fmt(r['intake']):>7} "
            f"{_fmt(r['agree']):>6} {wait:>14} {_fmt(r['pool']):>6} "
            f"{_fmt(r['circuit']):>8} {_fmt(r['exchange']):>8} {_fmt(r['update']):>6} "
            f"{_fmt(r['other']):>6} {_fmt(mb, 2):>9} {r['load_1min']:>5.2f}"
        )
    return "\n".join(lines)


def _floats(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers: {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected numbers >= 0: {text!r}")
    return values


def _modes(text: str) -> tuple[str, ...]:
    values = tuple(v.strip() for v in text.split(",") if v.strip())
    bad = [v for v in values if v not in MODES]
    if bad or not values:
        raise argparse.ArgumentTypeError(f"modes are {', '.join(MODES)}; got {text!r}")
    return values


def build_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument(
        "--rtt-ms", type=_floats, default=(50.0,),
        help="round trip(s) between the servers in ms, comma-separated (default 50)",
    )  # fmt: skip
    parser.add_argument(
        "--mbit", type=_floats, default=(0.0,),
        help="rate(s) of the link in Mbit/s each way, comma-separated; 0: unlimited (default)",
    )  # fmt: skip
    parser.add_argument(
        "--grid", action="store_true",
        help="every round trip of 1, 10, 50 ms with 100, 1000 Mbit/s and unlimited",
    )  # fmt: skip
    parser.add_argument(
        "--modes", type=_modes, default=tuple(MODES),
        help=f"comma-separated, of {', '.join(MODES)} (default: all)",
    )  # fmt: skip
    parser.add_argument(
        "--dataset", default="cancer", choices=DATASET_NAMES,
        help="a built-in data set (default cancer; mnist: d = 28,938)",
    )  # fmt: skip
    parser.add_argument("--rounds", type=int, default=8, help="rounds per run (default 8)")
    parser.add_argument(
        "--warmup", type=int, default=2,
        help="first rounds left out of the steady state (default 2)",
    )  # fmt: skip
    parser.add_argument("--providers", type=int, default=3, help="providers (default 3)")
    parser.add_argument(
        "--pre-backend", choices=("gc", "gmw"), default="gmw",
        help="the backend that makes preprocessed's noise pool (default gmw)",
    )  # fmt: skip
    parser.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE",
        help="a server configuration key for both servers (YAML value), repeatable",
    )  # fmt: skip
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per run")
    parser.add_argument("--insecure", action="store_true", help="plaintext links (no TLS)")
    parser.add_argument(
        "--keep", action="store_true", help="keep each run's files (the daemons' logs)"
    )
    parser.add_argument("--json", action="store_true", help="one JSON list on stdout")
    return parser


def _overrides(pairs: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise DemoError(f"--set takes KEY=VALUE, got {pair!r}")
        out[key] = yaml.safe_load(value)
    return out


def run_from_args(args: argparse.Namespace) -> int:
    rtts, mbits = (GRID_RTT_MS, GRID_MBIT) if args.grid else (args.rtt_ms, args.mbit)
    rows = []
    try:
        overrides = _overrides(args.set)
        for rtt in rtts:
            for mbit in mbits:
                for mode in args.modes:
                    row = run_setting(
                        mode, rtt, mbit, dataset=args.dataset, rounds=args.rounds,
                        warmup=args.warmup, providers=args.providers,
                        pre_backend=args.pre_backend, insecure=args.insecure,
                        timeout=args.timeout, server_overrides=overrides, keep=args.keep,
                    )  # fmt: skip
                    rows.append(row)
                    if not args.json:
                        print(table([row]).splitlines()[-1] if len(rows) > 1 else table([row]))
                        sys.stdout.flush()
    except DemoError as exc:
        print(f"spgc bench wan: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(rows, indent=2))
    return 0

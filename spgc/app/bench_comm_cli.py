"""The options of `spgc bench comm` and their entry point (spgc.app.bench_comm measures; this
module only parses what a user types and hands it over)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from spgc.app import bench_comm
from spgc.app.bench_comm import (
    DEFAULT_COORDINATES,
    DEFAULT_DELTA,
    DEFAULT_EPSILONS,
    DEFAULT_TABLE_COORDINATES,
    MODES,
)
from spgc.app.bench_sampler import add_backend_option
from spgc.app.paper_workloads import DATASETS, DEFAULT_EPOCHS
from spgc.protocol.modes import DEFAULT_SECURITY, SECURITY_NAMES

__all__ = ["build_parser", "main", "run_from_args"]


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Options of `spgc bench comm` (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(prog="spgc bench comm", description=bench_comm.__doc__)
    p.add_argument(
        "--dataset",
        default="cancer",
        metavar="NAME",
        help=f"model whose d is used: {', '.join(DATASETS)} (default: cancer)",
    )
    p.add_argument(
        "--model",
        default="",
        metavar="MODEL",
        help="measure this model instead of the dataset's own: a built-in name or your factory "
        "(file.py:factory, package.module:factory); d is its trained coordinates (frozen "
        "parameters never travel); the dataset still sets the paper's workload",
    )
    p.add_argument(
        "--epsilon",
        "--epsilons",  # the spelling of `spgc experiment`
        dest="epsilon",
        type=float,
        nargs="+",
        default=list(DEFAULT_EPSILONS),
        metavar="E",
        help="per-step epsilons (default: 0.01 0.1 0.5 2 8, the paper's)",
    )
    p.add_argument("--delta", type=float, default=DEFAULT_DELTA, help="default: 1e-3 (the paper's)")
    p.add_argument(
        "--calibration",
        default="classic",
        metavar="{classic,analytic}",
        help="classic: the paper's sqrt(2 ln(1.25/delta))/eps (default); analytic: Balle-Wang",
    )
    p.add_argument(
        "--modes",
        nargs="+",
        default=list(MODES),
        metavar="MODE",
        help=f"modes to run (default: {' '.join(MODES)})",
    )
    p.add_argument(
        "--coordinates",
        type=int,
        default=DEFAULT_COORDINATES,
        metavar="N",
        help=f"coordinates measured per run, at most d (default: {DEFAULT_COORDINATES}); each mode "
        "also runs N/4 to show the per-coordinate cost is constant",
    )
    p.add_argument(
        "--table-coordinates",
        type=int,
        default=None,
        metavar="N",
        help=f"sample for the table sampler (default: {DEFAULT_TABLE_COORDINATES}; 2 MB each)",
    )
    p.add_argument(
        "--epochs",
        type=int,
        default=DEFAULT_EPOCHS,
        metavar="E",
        help=f"epochs of the paper's workload (default: {DEFAULT_EPOCHS}, an assumption: the "
        "paper does not state it)",
    )
    p.add_argument("--chunk", type=int, default=None, metavar="N", help="engine batch size")
    p.add_argument("--tls", action="store_true", help="TLS 1.3 link with a throwaway dev PKI")
    p.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="K",
        help="run the circuits on K worker pairs of a local Ray cluster (extra spgc[ray]), as "
        "servers with workers: K do (default: 1, in this process)",
    )
    add_backend_option(p)
    p.add_argument(
        "--verify-inputs",
        choices=("none", "l2"),
        default="none",
        help="l2: the servers sum field shares of norm-verified inputs (spgc.protocol.norm_proof) "
        "and "
        "the circuits reconstruct them mod p (spgc and only-mpc); default none: ring shares",
    )
    p.add_argument(
        "--security",
        choices=list(SECURITY_NAMES),
        default=DEFAULT_SECURITY,
        help="semi-honest (the default) or malicious: the circuits on authenticated GMW "
        "(--backend gmw) or authenticated garbling (--backend gc), modes with a malicious "
        "variant: spgc.protocol.modes.MALICIOUS_VARIANTS",
    )
    p.add_argument(
        "--trial-depth",
        type=int,
        default=None,
        metavar="D",
        help="--backend gmw: the AND layers mode spgc's trial run keeps within (the servers' "
        "trial_depth: fewer layers, fewer round trips, more bytes); default: the session's "
        "(28 semi-honest, no bound malicious)",
    )
    p.add_argument("--json", action="store_true", help="JSON list on stdout (table to stderr)")
    p.add_argument("--plot", type=Path, default=None, metavar="FILE.png", help="write a PNG plot")
    return p


def run_from_args(args: argparse.Namespace) -> int:
    """Runs with the options :func:`build_parser` parsed (`spgc bench comm` and ``main``)."""
    return bench_comm.run(
        args.dataset,
        args.epsilon,
        delta=args.delta,
        calibration=args.calibration,
        modes=args.modes,
        coordinates=args.coordinates,
        table_coordinates=args.table_coordinates,
        epochs=args.epochs,
        chunk=args.chunk,
        tls=args.tls,
        workers=args.workers,
        as_json=args.json,
        plot=args.plot,
        model=args.model,
        backend=args.backend,
        verify_inputs=args.verify_inputs,
        security=args.security,
        trial_depth=args.trial_depth,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m spgc.app.bench_comm_cli [options]``."""
    try:
        return run_from_args(build_parser().parse_args(argv))
    except ValueError as exc:
        print(f"spgc bench comm: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

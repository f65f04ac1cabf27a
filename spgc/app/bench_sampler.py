"""`spgc bench sampler`: the discrete-Gaussian sampler circuit, per noise scale sigma_u.

For each sigma_u (fixed-point units) it prints: AND gates per sample (expected, including the
rejected trials, and measured), random bits per sample (garbler and evaluator: every random bit
is r1 xor r2, one bit from each), bytes per sample on the wire (both directions, measured), samples
per second with the garbler and the evaluator in two threads over loopback, and the per-sample
statistical-distance bound. ``--table-lambda`` adds the paper's table sampler as a labelled,
NOT differentially private baseline.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

import garbled_core as gc
from garbled_core.discrete_gaussian import (
    build_trial_circuit,
    derive_params,
    sampler_summary,
    theta,
)
from spgc.common.progress import Progress
from spgc.protocol.certs import make_dev_pki
from spgc.protocol.modes import BACKENDS, DEFAULT_SECURITY
from spgc.servers.gc_party import PartyLink, run_sampler
from spgc.servers.spgc_circuit import (
    TABLE_SAMPLER_LABEL,
    table_sampler_circuit,
    table_sampler_values,
)

DEFAULT_SIGMAS: tuple[float, ...] = (2.0, 1e2, 1e4, 65536.0, 1e6, 1e7)
DEFAULT_SAMPLES = 20_000
HOST = "127.0.0.1"


class BackgroundParty:
    """Runs fn (one party of a two-party benchmark) in a thread; result() re-raises its
    exception."""

    def __init__(self, fn: Any) -> None:
        self.value: Any = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Any) -> None:
        try:
            self.value = fn()
        except BaseException as exc:  # handed back to the caller
            self.error = exc

    def result(self, timeout: float = 600.0) -> Any:
        self.thread.join(timeout)
        if self.thread.is_alive():
            raise RuntimeError("a benchmark party hung")
        if self.error is not None:
            raise self.error
        return self.value


def loopback_channels(tls_dir: Path | None) -> tuple[Any, Any]:
    """A connected (garbler, evaluator) pair of engine channels over loopback: TLS 1.3 with a
    throwaway dev PKI made in ``tls_dir``, or plaintext TCP when it is None."""
    kw_g: dict[str, Any] = {"insecure": True}
    kw_e: dict[str, Any] = {"insecure": True}
    if tls_dir is not None:
        pki = make_dev_pki(tls_dir, ["h1", "h2"])
        kw_g = {"tls": gc.TlsConfig(str(pki["h1"].cert), str(pki["h1"].key), str(pki["h1"].ca))}
        kw_e = {"tls": gc.TlsConfig(str(pki["h2"].cert), str(pki["h2"].key), str(pki["h2"].ca))}
    listener = gc.Listener(HOST, 0)
    accepting = BackgroundParty(lambda: listener.accept(timeout=30, **kw_g))
    ch_e = gc.Channel.connect(HOST, listener.port, timeout=30, **kw_e)
    ch_g = accepting.result()
    listener.close()
    return ch_g, ch_e


def party_links(
    chunk: int | None,
    tls_dir: Path | None,
    backend: str = "gc",
    security: str = DEFAULT_SECURITY,
    trial_depth: int | None = None,
) -> tuple[Any, Any]:
    """H1's and H2's links over :func:`loopback_channels`, sessions of ``backend`` at
    ``security`` (malicious: authenticated GMW), with the plan's ``trial_depth`` (gmw)."""
    ch_g, ch_e = loopback_channels(tls_dir)
    kw = {"backend": backend, "security": security, "trial_depth": trial_depth}
    return (
        PartyLink.open("garbler", ch_g, chunk, **kw),
        PartyLink.open("evaluator", ch_e, chunk, **kw),
    )


def _sent(counters: dict[str, dict[str, int]]) -> int:
    return sum(v["sent"] for v in counters.values())


def two_party(links: tuple[Any, Any], fn_g: Any, fn_e: Any) -> tuple[float, int, Any]:
    """Runs both parties once; returns (seconds, bytes sent by both, garbler's result)."""
    lg, le = links
    before = _sent(lg.counters()) + _sent(le.counters())
    start = time.perf_counter()
    side = BackgroundParty(lambda: fn_g(lg))
    fn_e(le)
    value = side.result()
    seconds = time.perf_counter() - start
    return seconds, _sent(lg.counters()) + _sent(le.counters()) - before, value


def bench_sigma(
    sigma: float, samples: int, links: tuple[Any, Any], distance_log2: float
) -> dict[str, Any]:
    """One row: parameters, expected costs, and a measured two-party run of ``samples``."""

    t0 = time.perf_counter()
    params = derive_params(sigma, distance_log2)
    circuit = build_trial_circuit(params, arithmetic=links[0].arithmetic)
    derive_seconds = time.perf_counter() - t0
    summary = sampler_summary(params)

    def party(role: str, seed: bytes) -> Any:
        return lambda link: run_sampler(role, link, samples, seed, params)

    # warm-up (session setup, base OTs) outside the measurement
    two_party(links, party("garbler", os.urandom(32)), party("evaluator", os.urandom(32)))
    seconds, wire, stats = two_party(
        links, party("garbler", os.urandom(32)), party("evaluator", os.urandom(32))
    )
    trials = stats.trials / samples
    bits = params.random_bits
    return {
        "sampler": "dgauss-alias-rejection",
        "sigma_units": sigma,
        "and_gates_per_sample": summary["and_gates_per_sample"],
        "and_gates_per_sample_measured": circuit.and_count * trials,
        "and_gates_per_trial": circuit.and_count,
        "trials_per_sample": summary["trials_per_sample"],
        "trials_per_sample_measured": trials,
        "acceptance": params.acceptance,
        "random_bits_per_sample": 2 * bits * summary["trials_per_sample"],
        "random_bits_per_sample_garbler": bits * summary["trials_per_sample"],
        "random_bits_per_sample_evaluator": bits * summary["trials_per_sample"],
        "bytes_per_sample": wire / samples,
        "samples": samples,
        "samples_per_second": samples / seconds,
        "rounds": stats.rounds,
        "statistical_distance_log2": params.distance_log2,
        "bucket_bits": params.bucket_bits,
        "coin_bits": params.coin_bits,
        "alias_bits": params.alias.index_bits,
        "noise_bits": params.noise_bits,
        "derive_seconds": derive_seconds,
    }


def _table_distance(sigma: float, lam: int) -> float:
    """log2 of the statistical distance of the table's output from N_Z(0, sigma^2)."""

    values, counts = np.unique(table_sampler_values(sigma, lam), return_counts=True)
    pmf = np.exp(-(values.astype(np.float64) ** 2) / (2 * sigma * sigma)) / float(theta(sigma))
    overlap = float(np.minimum(counts / (1 << lam), pmf).sum())
    return math.log2(max(1.0 - overlap, 2.0**-1074))


def bench_table(sigma: float, lam: int, samples: int, links: tuple[Any, Any]) -> dict[str, Any]:
    """The paper's table sampler: NOT differentially private when the noise range exceeds
    2^lambda points; for communication comparisons only."""

    circuit = table_sampler_circuit(sigma, lam)

    def party(port: str) -> Any:
        def run(link: Any) -> Any:
            raw = np.frombuffer(os.urandom(8 * samples), dtype=np.uint64)
            idx = raw & np.uint64((1 << lam) - 1)
            return link.session.run(circuit, {port: idx}, {}, samples)

        return run

    two_party(links, party("idx_g"), party("idx_e"))
    seconds, wire, _ = two_party(links, party("idx_g"), party("idx_e"))
    return {
        "sampler": f"table-lambda{lam}",
        "label": TABLE_SAMPLER_LABEL,
        "sigma_units": sigma,
        "and_gates_per_sample": circuit.and_count,
        "and_gates_per_sample_measured": circuit.and_count,
        "trials_per_sample": 1.0,
        "random_bits_per_sample": 2 * lam,
        "random_bits_per_sample_garbler": lam,
        "random_bits_per_sample_evaluator": lam,
        "bytes_per_sample": wire / samples,
        "samples": samples,
        "samples_per_second": samples / seconds,
        "statistical_distance_log2": _table_distance(sigma, lam),
    }


def format_table(rows: list[dict[str, Any]]) -> str:
    head = (
        f"{'sampler':<24} {'sigma_u':>10} {'AND/sample':>11} {'(measured)':>11} "
        f"{'trials':>7} {'rand bits g/e':>15} {'bytes/sample':>13} {'samples/s':>10} "
        f"{'SD bound':>9}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        g, e = r["random_bits_per_sample_garbler"], r["random_bits_per_sample_evaluator"]
        bits = f"{g:.0f}/{e:.0f}"
        lines.append(
            f"{r['sampler']:<24} {r['sigma_units']:>10.6g} {r['and_gates_per_sample']:>11.1f} "
            f"{r['and_gates_per_sample_measured']:>11.1f} {r['trials_per_sample']:>7.4f} "
            f"{bits:>15} {r['bytes_per_sample']:>13.0f} {r['samples_per_second']:>10.0f} "
            f"{'2^' + format(r['statistical_distance_log2'], '.1f'):>9}"
        )
    if any(r["sampler"].startswith("table") for r in rows):
        lines.append(
            "table-lambda*: the paper's table sampler, NOT differentially private "
            "(its SD column is its actual distance from the discrete Gaussian)"
        )
    return "\n".join(lines)


def run(
    sigmas: Sequence[float] = DEFAULT_SIGMAS,
    samples: int = DEFAULT_SAMPLES,
    *,
    chunk: int | None = None,
    tls: bool = False,
    as_json: bool = False,
    backend: str = "gc",
    distance_log2: float = -64.0,
    table_lambda: int | None = None,
) -> int:
    """Run the benchmark; prints the table (stderr when ``as_json``) and the JSON list (stdout).
    Returns the exit code."""
    if samples < 1:
        raise ValueError(f"samples must be at least 1, got {samples}")
    rows: list[dict[str, Any]] = []
    out = sys.stderr if as_json else sys.stdout
    with tempfile.TemporaryDirectory(prefix="spgc-bench-sampler-") as tmp:
        links = party_links(chunk, Path(tmp) if tls else None, backend)
        bar = Progress(len(sigmas), "sigmas", desc="bench sampler", lines=False)
        try:
            for i, sigma in enumerate(sigmas, 1):
                rows.append(bench_sigma(float(sigma), samples, links, distance_log2))
                bar.note(f"sigma_u={sigma:g}: done")
                bar.update(i)
            if table_lambda is not None:
                for sigma in sigmas:
                    rows.append(bench_table(float(sigma), table_lambda, min(samples, 2000), links))
        finally:
            bar.close()
            for link in links:
                link.channel.close()
    for row in rows:
        row["backend"] = backend
    link_kind = "TLS 1.3" if tls else "plaintext TCP"
    print(
        f"two-party over loopback ({link_kind}), backend {backend}, {samples} samples per sigma",
        file=out,
    )
    print(format_table(rows), file=out)
    if as_json:
        print(json.dumps(rows, indent=2))
    return 0


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Options of `spgc bench sampler` (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(prog="spgc bench sampler", description=__doc__)
    p.add_argument(
        "--sigma",
        type=float,
        nargs="+",
        default=list(DEFAULT_SIGMAS),
        metavar="S",
        help="noise std in fixed-point units (default: 2 100 1e4 65536 1e6 1e7)",
    )
    p.add_argument(
        "--samples",
        type=int,
        default=DEFAULT_SAMPLES,
        metavar="N",
        help=f"samples per sigma in the two-party run (default: {DEFAULT_SAMPLES})",
    )
    p.add_argument(
        "--chunk",
        type=int,
        default=None,
        metavar="N",
        help="instances per engine batch (default: the engine's)",
    )
    p.add_argument(
        "--distance-log2",
        type=float,
        default=-64.0,
        metavar="D",
        help="statistical-distance target per sample, log2 (default: -64)",
    )
    p.add_argument(
        "--table-lambda",
        type=int,
        default=None,
        metavar="LAMBDA",
        help="also run the paper's table sampler with 2^LAMBDA entries (NOT DP)",
    )
    p.add_argument("--tls", action="store_true", help="TLS 1.3 link with a throwaway dev PKI")
    add_backend_option(p)
    p.add_argument(
        "--json", action="store_true", help="print a JSON list on stdout (the table goes to stderr)"
    )
    return p


def add_backend_option(p: argparse.ArgumentParser) -> None:
    """``--backend gc|gmw``: how the two parties evaluate the circuits
    (spgc.protocol.modes.BACKENDS)."""
    p.add_argument(
        "--backend",
        choices=list(BACKENDS),
        default="gc",
        help="gc: garbled circuits (the default); gmw: GMW with Beaver triples from silent OT",
    )


def run_from_args(args: argparse.Namespace) -> int:
    """Runs with the options :func:`build_parser` parsed (`spgc bench sampler` and ``main``)."""
    return run(
        args.sigma,
        args.samples,
        chunk=args.chunk,
        tls=args.tls,
        backend=args.backend,
        as_json=args.json,
        distance_log2=args.distance_log2,
        table_lambda=args.table_lambda,
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Stand-alone entry point: ``python -m spgc.app.bench_sampler [options]``."""
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

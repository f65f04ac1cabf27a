"""`spgc bench scale`: one real spgc round of D coordinates on K worker pairs, and what the
measured constants imply for larger deployments.

It starts a local Ray cluster (extra ``spgc[ray]``), K worker pairs (H1's worker i linked to
H2's worker i over TLS, as the servers do with ``workers: K``; ``--embedded --workers 1`` runs
the embedded path in this process instead), draws random shares of D coordinates and runs two
rounds with fresh round seeds: the first, on D/4 coordinates, also sets the sessions up; the
second, on all D, is the steady state. It prints ``seconds_per_round`` (the second),
``and_gates_per_second``, the bytes both servers sent and each worker's peak RSS, checked
against the plaintext evaluation of the same round. ``--model`` adds the per-round model of
docs/SCALE.md from this run's constants: bytes and seconds per coordinate per worker pair, the
workers' working set per coordinate (peak memory growth from the first round to the second),
and the providers' intake. ``--backend gmw`` runs the pairs' sessions on GMW (Beaver triples
from silent OT) instead of garbled circuits, checked against the same plaintext reference.
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

import garbled_core
from garbled_core.sampler_circuit import MIN_TRIAL_DEPTH, UNBOUNDED_TRIAL_DEPTH
from spgc.common.lanes import MAX_LANES
from spgc.privacy.noise import SPARES_EVERY, sample_noise_plain
from spgc.protocol.certs import make_dev_pki
from spgc.protocol.modes import BACKEND_NAMES
from spgc.servers.coordinator import dng_exchange
from spgc.servers.gc_party import RANGE_BATCH, PartyLink, run_aggregate
from spgc.servers.noise_pool import (
    BLOCK_ID_BYTES,
    MAX_BLOCK_SAMPLES,
    NoisePool,
    produce_noise_shares,
)
from spgc.servers.ray_workers import (
    WorkerTls,
    connect_workers,
    init_ray,
    kill_worker,
    ray_available,
    ray_get,
    shutdown_ray,
    start_workers,
)
from spgc.settings.backend_choice import GMW_EXCHANGE_SHARE
from spgc.wire import aggregation_pb2 as pb

HOST = "127.0.0.1"
RING_BITS = 32
DEFAULT_SIGMA = 1000.0
MODEL_DIMS = (10**6, 10**7, 10**8, 10**9)
MODEL_WORKERS = (1, 8, 64)
MODEL_GBITS = (1, 10, 100)
MODEL_PROVIDERS = (10, 1000, 100_000)
SHARE_BYTES = 8  # a share value on the provider wire (proto: little-endian uint64)
# Per coordinate of a worker's range beyond its batch: its shares, its part of Y and their
# concatenation (three 8-byte arrays), on top of the batch's measured working set.
RANGE_BYTES_PER_COORDINATE = 24
DEFAULT_WORKER_MEMORY_GB = 64.0
DEFAULT_RTT_MS = 10.0  # the model's round-trip time between the organisations (gmw pays it)


def _shares(d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(int.from_bytes(os.urandom(8), "little"))
    sums = rng.integers(-(1 << 20), 1 << 20, d, dtype=np.int64)
    r = rng.integers(0, 1 << RING_BITS, d, dtype=np.uint64)
    a1 = (sums.astype(np.uint64) + r) & np.uint64((1 << RING_BITS) - 1)
    return sums, a1, r


def _pair_embedded(
    tls_dir: Path | None, backend: str = "gc", trial_depth: int | None = None
) -> tuple[list[Any], list[Any]]:
    listener = garbled_core.Listener(HOST, 0)
    kw_g: dict[str, Any] = {"insecure": True}
    kw_e: dict[str, Any] = {"insecure": True}
    if tls_dir is not None:
        kw_g = {"tls": garbled_core.TlsConfig(*(str(tls_dir / f) for f in _files("h1")))}
        kw_e = {"tls": garbled_core.TlsConfig(*(str(tls_dir / f) for f in _files("h2")))}
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.update(ch=listener.accept(timeout=30, **kw_g)))
    t.start()
    ch_e = garbled_core.Channel.connect(HOST, listener.port, timeout=30, **kw_e)
    t.join()
    listener.close()
    return (
        [PartyLink.open("garbler", box["ch"], backend=backend, trial_depth=trial_depth)],
        [PartyLink.open("evaluator", ch_e, backend=backend, trial_depth=trial_depth)],
    )


def _files(name: str) -> tuple[str, str, str]:
    return f"{name}.pem", f"{name}.key", "ca.pem"


def start_worker_pairs(
    workers: int, tls_dir: Path | None, backend: str = "gc", trial_depth: int | None = None
) -> tuple[list[Any], list[Any], list[Any]]:
    """``workers`` H1 and H2 worker actors on the running Ray cluster, worker i of H1 linked to
    worker i of H2 (TLS with the dev PKI in ``tls_dir`` made by ``make_dev_pki(tls_dir, ["h1",
    "h2"])``, or plaintext when None), on ``backend``'s sessions. Returns (H1's lanes, H2's
    lanes, every actor). ``trial_depth``: gmw's trial runs within that many AND layers (the
    plan's trial_depth; None: the session's default)."""

    def worker_tls(name: str, peer: str) -> WorkerTls:
        if tls_dir is None:
            return WorkerTls(insecure=True)
        cert, key, ca = (str(tls_dir / f) for f in _files(name))
        return WorkerTls(cert, key, ca, peer)

    kw = {"backend": backend, "trial_depth": trial_depth}
    g = start_workers("garbler", workers, worker_tls("h1", "h2"), **kw)
    e = start_workers("evaluator", workers, worker_tls("h2", "h1"), **kw)
    try:
        lanes_g, lanes_e = connect_workers(g, e, HOST, backend=backend)
    except BaseException:
        for actor in g + e:
            kill_worker(actor)
        raise
    return lanes_g, lanes_e, g + e


def init_local_ray(workers: int) -> None:
    """A local Ray cluster for ``workers`` pairs (two actors each), or a clear error when the
    extra is missing."""
    if not ray_available():
        raise RuntimeError(
            "worker pairs run on Ray: pip install '.[ray]' in the checkout (or run one pair: "
            "--workers 1)"
        )
    init_ray(
        num_cpus=max(2, 2 * workers),
        include_dashboard=False,
        log_to_driver=False,
        configure_logging=False,
    )


def run_round(
    d: int,
    workers: int,
    sigma: float,
    use_ray: bool,
    tls: bool,
    backend: str = "gc",
    trial_depth: int | None = None,
) -> dict[str, Any]:
    """One round of d coordinates on ``workers`` pairs (gmw: its trial run within
    ``trial_depth`` AND layers, the session's default when None); the measured figures."""
    sums, a1, a2 = _shares(d)
    actors: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="spgc-scale-") as tmp:
        tls_dir = None
        if tls:
            tls_dir = Path(tmp)
            make_dev_pki(tls_dir, ["h1", "h2"])
        setup0 = time.perf_counter()
        if use_ray:
            lanes_g, lanes_e, actors = start_worker_pairs(workers, tls_dir, backend, trial_depth)
        else:
            lanes_g, lanes_e = _pair_embedded(tls_dir, backend, trial_depth)
        depth = lanes_g[0].trial_depth if backend == "gmw" and not use_ray else trial_depth
        setup_seconds = time.perf_counter() - setup0
        idle = workers_peak_rss_mb(actors)
        warm = max(1, d // 4)
        try:
            # Round 1, on a quarter of the coordinates, sets the sessions up (base OTs,
            # SoftSpoken trees) and warms the workers; round 2, all d with fresh seeds, is the
            # steady state that seconds_per_round reports. The workers' peak memory after each
            # gives the working set per coordinate without the fixed costs.
            first_seconds, _, _ = _one_round(lanes_g, lanes_e, a1[:warm], a2[:warm], sigma)
            after_warm = workers_peak_rss_mb(actors)
            seconds, cpu, (yg, ig, ye, ie, s1, s2) = _one_round(lanes_g, lanes_e, a1, a2, sigma)
        finally:
            for actor in actors:
                kill_worker(actor)
    z = sample_noise_plain(s1, s2, d, sigma, spares_every=SPARES_EVERY[backend])
    correct = bool(np.array_equal(yg, ye)) and bool(np.array_equal(ye - sums, z))
    sent = int(ig["sent"]) + int(ie["sent"])
    result: dict[str, Any] = {
        "mode": "spgc",
        "backend": backend,
        "dim": d,
        "workers": workers,
        "ray": use_ray,
        "tls": tls,
        "sigma_units": sigma,
        "trial_depth": depth,
        "seconds_per_round": seconds,
        "first_round_seconds": first_seconds,
        "setup_seconds": setup_seconds,
        "and_gates": int(ig["and_gates"]),
        "and_gates_per_second": ig["and_gates"] / seconds,
        "bytes_sent_both_servers": sent,
        "bytes_per_coordinate": sent / d,
        "seconds_per_coordinate_per_pair": seconds * workers / d,
        # Both servers' CPU per coordinate (embedded: both run in this process), a figure that
        # other jobs on a shared machine disturb far less than the wall time.
        "cpu_seconds_per_coordinate": None if use_ray else cpu / d,
        "trials": int(ig["trials"]),
        "rounds": int(ig["rounds"]),
        "round_trips": ig.get("round_trips"),  # gmw: counted by the channel (gc: None)
        "peak_rss_mb_per_worker": [] if not use_ray else _worker_rss(ig, ie),
        "idle_rss_mb_per_worker": idle,
        "correct": correct,
    }
    if use_ray:
        # The working set per coordinate of a worker's range (one batch while the range fits
        # RANGE_BATCH): the growth of peak memory from the quarter round to the full one, over
        # the coordinates added, from the worker that grew most. Small d: fixed costs still
        # show; run --dim 1000000 or more for the model's memory column.
        peak = result["peak_rss_mb_per_worker"]
        grown = max(p - w for p, w in zip(peak, after_warm, strict=True))
        added = max(1, -(-d // workers) - -(-warm // workers))
        result["rss_bytes_per_coordinate"] = max(grown, 0.0) * 2**20 / added
    return result


def run_preprocessed(
    d: int, workers: int, sigma: float, use_ray: bool, tls: bool, backend: str = "gc"
) -> dict[str, Any]:
    """Mode preprocessed at d coordinates: offline, the noise pool's production of d samples on
    ``workers`` pairs (the sampler and the share circuit, as `spgc server precompute` with
    ``workers: K`` runs it); both pools stored on disk as the daemons keep them; online, one
    round over the servers' own data link: each server takes d samples from its pool (cursor
    first, samples zeroed after) and the two open S + z, one ring element each way. Checked
    against the plaintext sampler for the two production seeds."""
    sums, a1, a2 = _shares(d)
    actors: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="spgc-scale-pool-") as tmp:
        tls_dir = None
        if tls:
            tls_dir = Path(tmp, "pki")
            make_dev_pki(tls_dir, ["h1", "h2"])
        daemon_g, daemon_e = _pair_embedded(tls_dir, backend)  # the daemons' own data link
        lanes_g, lanes_e = daemon_g, daemon_e
        try:
            if use_ray:
                lanes_g, lanes_e, actors = start_worker_pairs(workers, tls_dir, backend)

            # sessions set up (base OTs, SoftSpoken trees) outside the measurement
            def produce(role: str, lanes: list[Any], n: int, seed: bytes) -> Any:
                return lambda: produce_noise_shares(role, lanes, n, sigma, RING_BITS, seed)

            warm = min(d, 64)
            _both(
                produce("garbler", lanes_g, warm, os.urandom(32)),
                produce("evaluator", lanes_e, warm, os.urandom(32)),
            )
            s1, s2 = os.urandom(32), os.urandom(32)
            offline, (neg_r, info_g), (u, info_e) = _both(
                produce("garbler", lanes_g, d, s1), produce("evaluator", lanes_e, d, s2)
            )
            pools = {
                role: NoisePool(Path(tmp, f"pool-{role}"), role, sigma, RING_BITS)
                for role in ("h1", "h2")
            }
            start = time.perf_counter()
            for index, lo in enumerate(range(0, d, MAX_BLOCK_SAMPLES)):
                block_id = os.urandom(BLOCK_ID_BYTES)
                hi = min(d, lo + MAX_BLOCK_SAMPLES)
                pools["h1"].add_block(index, block_id, neg_r[lo:hi])
                pools["h2"].add_block(index, block_id, u[lo:hi])
            store_seconds = time.perf_counter() - start
            piece = pools["h1"].position(d)

            def online(role: int, pool: NoisePool, link: PartyLink, share: np.ndarray) -> Any:
                noise = pool.take(piece, 0)
                return dng_exchange(role, link.channel, share, noise.view(np.int64), RING_BITS)

            online_seconds, (yg, _), (ye, _) = _both(
                lambda: online(pb.SERVER_ROLE_H1, pools["h1"], daemon_g[0], a1),
                lambda: online(pb.SERVER_ROLE_H2, pools["h2"], daemon_e[0], a2),
            )  # fmt: skip
            used_left = pools["h1"].available + pools["h2"].available
        finally:
            for actor in actors:
                kill_worker(actor)
            for link in (*daemon_g, *daemon_e):
                link.channel.close()
    z = sample_noise_plain(s1, s2, d, sigma, spares_every=SPARES_EVERY[backend])
    correct = bool(np.array_equal(yg, ye)) and bool(np.array_equal(ye - sums, z))
    sent = int(info_g["sent"]) + int(info_e["sent"])
    return {
        "mode": "preprocessed",
        "backend": backend,
        "dim": d,
        "workers": workers,
        "ray": use_ray,
        "tls": tls,
        "sigma_units": sigma,
        "offline_seconds": offline,
        "samples_per_second": d / offline,
        "offline_bytes_per_sample": sent / d,
        "pool_store_seconds": store_seconds,
        "online_seconds_per_round": online_seconds,
        "online_bytes_per_coordinate": 16,
        "pool_left_after_round": used_left,
        "peak_rss_mb_per_worker": _worker_rss(info_g, info_e) if use_ray else [],
        "correct": correct and used_left == 0,
    }


def _both(fn_g: Any, fn_e: Any) -> tuple[float, Any, Any]:
    """H1's side in a thread, H2's here: (seconds, H1's result, H2's result)."""
    box: dict[str, Any] = {}

    def garbler() -> None:
        try:
            box["g"] = fn_g()
        except BaseException as exc:  # re-raised below, after H2's side
            box["error"] = exc

    t = threading.Thread(target=garbler)
    start = time.perf_counter()
    t.start()
    result_e = fn_e()
    t.join()
    seconds = time.perf_counter() - start
    if "error" in box:
        raise box["error"]
    return seconds, box["g"], result_e


def workers_peak_rss_mb(actors: list[Any]) -> list[float]:
    """Each worker process's peak resident memory so far (MB), in actor order."""
    return [float(x) for x in ray_get([a.peak_rss_mb.remote() for a in actors])] if actors else []


def _one_round(
    lanes_g: list[Any], lanes_e: list[Any], a1: np.ndarray, a2: np.ndarray, sigma: float
) -> tuple[float, float, tuple[Any, ...]]:
    """Both servers' sides of one spgc round with fresh seeds; (seconds, CPU-seconds of this
    process over the round, results). The CPU time is both servers' only on the embedded
    path (on Ray the workers run in other processes)."""
    s1, s2 = os.urandom(32), os.urandom(32)
    cpu0 = time.process_time()
    seconds, (yg, ig), (ye, ie) = _both(
        lambda: run_aggregate("garbler", lanes_g, a1, s1, sigma, RING_BITS, "spgc"),
        lambda: run_aggregate("evaluator", lanes_e, a2, s2, sigma, RING_BITS, "spgc"),
    )
    return seconds, time.process_time() - cpu0, (yg, ig, ye, ie, s1, s2)


def _worker_rss(ig: dict[str, Any], ie: dict[str, Any]) -> list[float]:
    return [float(x) for x in ig.get("worker_rss_mb", []) + ie.get("worker_rss_mb", [])]


def model_rows(
    bytes_per_coord: float,
    seconds_per_coord_pair: float,
    rss_bytes_per_coord: float | None = None,
    idle_rss_mb: float = 0.0,
    worker_memory_gb: float = DEFAULT_WORKER_MEMORY_GB,
    round_trips: int = 0,
    rtt_seconds: float = DEFAULT_RTT_MS / 1e3,
) -> list[dict[str, Any]]:
    """The circuit part of a round, per (d, K, link): link seconds (both directions' bytes over
    one link of G Gbit/s) against compute seconds (d coordinates over K pairs at this run's
    per-pair rate); the larger bounds the round, plus ``round_trips`` x ``rtt_seconds`` x
    GMW_EXCHANGE_SHARE (gmw's AND-layer exchanges, half a round trip each: both servers send at
    once; gc's few round trips are not counted). With a measured working set per
    coordinate, a worker's peak memory (idle + one batch of at most RANGE_BATCH coordinates + 24
    bytes per coordinate of its range) and whether it fits ``worker_memory_gb``."""
    rows = []
    for d in MODEL_DIMS:
        for k in MODEL_WORKERS:
            compute = d * seconds_per_coord_pair / k
            per_worker = -(-d // k)
            memory_gb = None
            if rss_bytes_per_coord is not None:
                batch = min(per_worker, RANGE_BATCH)
                memory_gb = (
                    idle_rss_mb * 2**20
                    + batch * rss_bytes_per_coord
                    + per_worker * RANGE_BYTES_PER_COORDINATE
                ) / 1e9
            for g in MODEL_GBITS:
                link = d * bytes_per_coord * 8 / (g * 1e9)
                waits = round_trips * GMW_EXCHANGE_SHARE * rtt_seconds
                bound = "link" if link > compute else "CPU"
                if waits > max(link, compute):
                    bound = "round trips"
                if memory_gb is not None and memory_gb > worker_memory_gb:
                    bound = "memory"
                rows.append(
                    {
                        "dim": d,
                        "workers": k,
                        "gbit_per_s": g,
                        "gigabytes": d * bytes_per_coord / 1e9,
                        "compute_seconds": compute,
                        "link_seconds": link,
                        "round_trip_seconds": waits,
                        "round_seconds": max(compute, link) + waits,
                        "worker_memory_gb": memory_gb,
                        "bound": bound,
                    }
                )
    return rows


def intake_rows() -> list[dict[str, Any]]:
    """The providers' part of a round, per (d, N providers, link): each server receives one
    8-byte (uint64) share element per coordinate from each provider (N d 8 bytes on its own
    ingress link; packed shares take ceil(L/8) of the 8) and spills shares above 64 KiB to disk,
    before the circuit runs."""
    rows = []
    for d in MODEL_DIMS:
        for n in MODEL_PROVIDERS:
            gigabytes = n * d * SHARE_BYTES / 1e9
            for g in MODEL_GBITS:
                rows.append(
                    {
                        "dim": d,
                        "providers": n,
                        "gbit_per_s": g,
                        "gigabytes_per_server": gigabytes,
                        "intake_seconds": gigabytes * 8 / g,
                    }
                )
    return rows


def format_model(rows: list[dict[str, Any]], intake: list[dict[str, Any]] | None = None) -> str:
    lines = [
        "circuit part of a round (between the servers):",
        f"{'dim':>13} {'K':>3} {'Gbit/s':>6} {'GB/round':>9} {'CPU s':>10} {'link s':>10} "
        f"{'RTT s':>7} {'round s':>10} {'GB/worker':>9}  bound",
    ]
    for r in rows:
        mem = "-" if r.get("worker_memory_gb") is None else f"{r['worker_memory_gb']:.2f}"
        lines.append(
            f"{r['dim']:>13,} {r['workers']:>3} {r['gbit_per_s']:>6} {r['gigabytes']:>9.1f} "
            f"{r['compute_seconds']:>10.1f} {r['link_seconds']:>10.1f} "
            f"{r.get('round_trip_seconds', 0.0):>7.2f} {r['round_seconds']:>10.1f} {mem:>9}  "
            f"{r['bound']}"
        )
    if intake:
        lines += [
            "intake part of a round (providers to each server, before the circuit):",
            f"{'dim':>13} {'providers':>9} {'Gbit/s':>6} {'GB/server':>10} {'seconds':>10}",
        ]
        for r in intake:
            lines.append(
                f"{r['dim']:>13,} {r['providers']:>9,} {r['gbit_per_s']:>6} "
                f"{r['gigabytes_per_server']:>10.1f} {r['intake_seconds']:>10.1f}"
            )
    return "\n".join(lines)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    """Options of `spgc bench scale` (added to ``parser`` when given)."""
    p = parser or argparse.ArgumentParser(prog="spgc bench scale", description=__doc__)
    p.add_argument("--dim", type=int, default=100_000, metavar="D", help="coordinates (100000)")
    p.add_argument(
        "--mode",
        choices=("spgc", "preprocessed"),
        default="spgc",
        help="spgc: a round's circuit on the pairs (default); preprocessed: the noise pool's "
        "production of D samples on the pairs, then one online round of D coordinates",
    )
    p.add_argument(
        "--workers", type=int, default=2, metavar="K", help=f"worker pairs, 1..{MAX_LANES} (2)"
    )
    p.add_argument(
        "--sigma", type=float, default=DEFAULT_SIGMA, help="noise std in fixed-point units"
    )
    p.add_argument(
        "--embedded",
        action="store_true",
        help="K = 1 in this process, without Ray (the workers: 1 path), for comparison",
    )
    p.add_argument("--insecure", action="store_true", help="plaintext worker links (not TLS)")
    p.add_argument(
        "--backend",
        choices=BACKEND_NAMES,
        default="gc",
        help="the pairs' sessions: gc (garbled circuits, the default) or gmw (GMW, Beaver "
        "triples from silent OT)",
    )
    p.add_argument(
        "--trial-depth",
        type=int,
        default=None,
        metavar="D",
        help="--backend gmw, --mode spgc: the AND layers the round's trial run keeps within "
        "(the plan's trial_depth; default: the session's, 28)",
    )
    p.add_argument("--model", action="store_true", help="also print the per-round model")
    p.add_argument(
        "--worker-memory-gb",
        type=float,
        default=DEFAULT_WORKER_MEMORY_GB,
        metavar="GB",
        help="memory of one worker for the model's memory bound (default: 64)",
    )
    p.add_argument(
        "--rtt-ms",
        type=float,
        default=DEFAULT_RTT_MS,
        metavar="MS",
        help="round-trip time between the organisations for the model: gmw waits half of it "
        f"per AND layer of the round (default: {DEFAULT_RTT_MS:g})",
    )
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    return p


def run_from_args(args: argparse.Namespace) -> int:
    if args.dim < 1:
        print("spgc: error: --dim must be at least 1", file=sys.stderr)
        return 2
    if not 1 <= args.workers <= MAX_LANES:
        print(f"spgc: error: --workers must be in 1..{MAX_LANES}", file=sys.stderr)
        return 2
    if args.model and args.mode != "spgc":
        print("spgc: error: --model is for --mode spgc", file=sys.stderr)
        return 2
    if args.embedded and args.workers != 1:
        print("spgc: error: --embedded runs one pair: pass --workers 1", file=sys.stderr)
        return 2
    if not math.isfinite(args.worker_memory_gb) or args.worker_memory_gb <= 0:
        print("spgc: error: --worker-memory-gb must be a positive number", file=sys.stderr)
        return 2
    if not math.isfinite(args.sigma) or args.sigma <= 0:
        print("spgc: error: --sigma must be a positive number", file=sys.stderr)
        return 2
    if args.trial_depth is not None and (
        args.backend != "gmw"
        or args.mode != "spgc"
        or not MIN_TRIAL_DEPTH <= args.trial_depth <= UNBOUNDED_TRIAL_DEPTH
    ):
        print(
            f"spgc: error: --trial-depth is for --backend gmw --mode spgc, from "
            f"{MIN_TRIAL_DEPTH} to {UNBOUNDED_TRIAL_DEPTH}",
            file=sys.stderr,
        )
        return 2
    use_ray = not args.embedded
    if use_ray:
        if not ray_available():
            print(
                "spgc: error: bench scale runs worker pairs on Ray: pip install '.[ray]' in the "
                "checkout (or --embedded --workers 1)",
                file=sys.stderr,
            )
            return 2
        init_local_ray(args.workers)
    shape = (args.dim, args.workers, args.sigma, use_ray, not args.insecure, args.backend)
    try:
        if args.mode == "spgc":
            result = run_round(*shape, trial_depth=args.trial_depth)
        else:
            result = run_preprocessed(*shape)
    finally:
        if use_ray:
            shutdown_ray()
    if args.model:
        idle = result["idle_rss_mb_per_worker"]
        result["model"] = model_rows(
            result["bytes_per_coordinate"],
            result["seconds_per_coordinate_per_pair"],
            result.get("rss_bytes_per_coordinate"),
            max(idle) if idle else 0.0,
            args.worker_memory_gb,
            result["round_trips"] or 0,
            args.rtt_ms / 1e3,
        )
        result["model_intake"] = intake_rows()
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(_summary_line(result))
        if result["peak_rss_mb_per_worker"]:
            rss = ", ".join(f"{x:.0f}" for x in result["peak_rss_mb_per_worker"])
            line = f"peak RSS per worker (MB): {rss}"
            if "rss_bytes_per_coordinate" in result:
                idle = ", ".join(f"{x:.0f}" for x in result["idle_rss_mb_per_worker"])
                line += (
                    f" (idle: {idle}); working set {result['rss_bytes_per_coordinate']:,.0f} B "
                    "per coordinate of a worker's range"
                )
            print(line)
        if args.model:
            print(format_model(result["model"], result["model_intake"]))
    return 0 if result["correct"] else 1


def _summary_line(result: dict[str, Any]) -> str:
    """One line: where it ran, what it measured, whether the release was checked correct."""
    depth = "" if result.get("trial_depth") is None else f", trial depth {result['trial_depth']}"
    where = (
        f"{result['workers']} worker pair(s) ({'Ray' if result['ray'] else 'embedded'}, "
        f"{'TLS' if result['tls'] else 'plaintext'}, {result['backend']}{depth})"
    )
    verdict = "correct" if result["correct"] else "WRONG"
    if result.get("mode") == "preprocessed":
        return (
            f"preprocessed, {result['dim']:,} coordinates, {where}: offline "
            f"{result['offline_seconds']:.2f} s ({result['samples_per_second']:,.0f} samples/s, "
            f"{result['offline_bytes_per_sample']:,.0f} B per sample), pools stored in "
            f"{result['pool_store_seconds']:.2f} s, online round "
            f"{result['online_seconds_per_round']:.2f} s (16 B per coordinate), {verdict}"
        )
    trips = result.get("round_trips")
    cpu = result.get("cpu_seconds_per_coordinate")
    return (
        f"{result['dim']:,} coordinates on {where}: {result['seconds_per_round']:.2f} s per "
        f"round, T = {result['seconds_per_coordinate_per_pair'] * 1e6:.1f} us per coordinate "
        f"per pair{'' if cpu is None else f' (CPU {cpu * 1e6:.1f} us, both servers)'}, "
        f"{result['and_gates_per_second'] / 1e6:.2f} M AND/s, "
        f"{result['bytes_per_coordinate']:,.0f} B per coordinate"
        f"{'' if trips is None else f', {trips} round trips'}, {verdict}"
    )


def main(argv: Sequence[str] | None = None) -> int:
    return run_from_args(build_parser().parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

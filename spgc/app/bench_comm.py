"""`spgc bench comm`: bytes between the two servers per training step, per mode and epsilon.

For one dataset's model (d parameters) and a list of per-step epsilons, every two-server mode runs
for real: garbler (H1) and evaluator (H2) in two threads over a loopback data link, on random
shares of a sample of coordinates. The link counts every byte per engine phase; the per-coordinate
cost is measured at two sample sizes (it must be constant for the linear scaling to d to hold) and
multiplied by d for a step, and by the number of steps for a whole training of the paper's
workloads (3 providers, the paper's per-provider data and batch sizes), printed next to the
paper's Table 1.

Modes: ``only-mpc`` (reconstruct only, no noise), ``spgc`` (reconstruct + exact discrete Gaussian
sampled in the circuit), ``dng`` (each server adds its own noise and the two exchange one ring
element per coordinate: no circuit), ``preprocessed`` (the circuit makes additive noise shares
offline, servers/noise_pool.py; online the servers open S + z, one ring element each way), and
``table16``, the paper's table sampler (lambda = 16, ring N = 16): a labelled baseline that is NOT
differentially private at these noise scales. What each mode is comes from the one modes table
(:mod:`spgc.protocol.modes`); how to measure it is one ``ModeSpec`` in ``MODES`` here.

``--workers K`` runs the circuits (spgc, only-mpc, preprocessed's noise blocks) on K Ray worker
pairs of a local cluster, as servers with ``workers: K`` do (servers/ray_workers.py); the bytes
are those of all pairs together (the same as one pair's, but for K session setups).
"""

from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from garbled_core.discrete_gaussian import MIN_TRIAL_DEPTH, build_trial_circuit, derive_params
from spgc.app.bench_comm_charges import (
    CHARGED_PHASES,
    GROUP_ORDER,
    amortised_ot,
    both_counters,
    charged_triples,
    gmw_usage,
    sent_by_phase,
    triple_usage,
)
from spgc.app.bench_comm_report import format_table, notes, write_plot
from spgc.app.bench_sampler import party_links, two_party
from spgc.app.bench_scale import init_local_ray, start_worker_pairs, workers_peak_rss_mb
from spgc.app.paper_workloads import (
    DATASETS,
    DEFAULT_EPOCHS,
    GB,
    LINK_SPEEDS,
    PAPER_PROVIDERS,
    PAPER_TABLE_LAMBDA,
    PAPER_TABLE_RING_BITS,
    PaperWorkload,
)
from spgc.common.lanes import MAX_LANES
from spgc.common.progress import Progress
from spgc.learning.models import parameter_count, resolve_model, trainable_count
from spgc.privacy import accounting
from spgc.privacy.noise import noise_bound_units, sample_discrete_gaussian
from spgc.privacy.seed_proof import SeedBinding
from spgc.protocol.encoding import FixedPointConfig
from spgc.protocol.modes import (
    BACKENDS,
    DEFAULT_SECURITY,
    MALICIOUS_VARIANTS,
    SECURITY_NAMES,
    get_mode,
    malicious_refusal,
)
from spgc.protocol.norm_proof import NormProofParams
from spgc.protocol.sharing import max_abs_sum_units, ring_bits_for
from spgc.servers.coordinator import dng_exchange
from spgc.servers.gc_party import run_aggregate
from spgc.servers.noise_pool import produce_noise_shares
from spgc.servers.ray_workers import kill_worker, shutdown_ray
from spgc.servers.spgc_circuit import (
    noise_share_circuit,
    noisy_sum_circuit,
    output_width,
    reconstruct_circuit,
    table_noisy_sum_circuit,
)
from spgc.settings.config import ServerConfig
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.digests import POOL_BLOCK_ID_BYTES, pool_seed_commitment, seed_commitment

__all__ = [
    "DATASETS",
    "DEFAULT_EPSILONS",
    "MODES",
    "CommContext",
    "Measurement",
    "ModeSpec",
    "PaperWorkload",
    "format_table",
    "make_context",
    "measure_rows",
    "run",
    "write_plot",
]

DEFAULT_EPSILONS: tuple[float, ...] = (0.01, 0.1, 0.5, 2.0, 8.0)
DEFAULT_DELTA = 1e-3
DEFAULT_COORDINATES = 2000
# The table sampler costs 2^16 AND gates per coordinate (2 MB): a smaller sample suffices.
DEFAULT_TABLE_COORDINATES = 128
TABLE_CHUNK = 64  # engine batch for the table circuit (see CommContext.table_links)


class BenchCommError(ValueError):
    """Bad input to the benchmark; the message is meant for the terminal (one line)."""


# ------------------------------------------------------------------------------ context


@dataclass
class CommContext:
    """What every mode needs: the model size, fixed point, ring and the open links."""

    dataset: str
    dim: int  # d: the coordinates that travel (the model's trained parameters)
    scale: float
    clip_norm: float
    l2_bound_units: int
    ring_bits: int
    max_abs_sum: int
    links: tuple[Any, Any] | None = None
    # The table circuit has 65k wires: its own session with small chunks keeps the engine's
    # per-run workspace (slots x chunk labels) small; bytes do not depend on the chunk.
    table_links: tuple[Any, Any] | None = None
    session_setup_bytes: int = 0
    table_lambda: int = PAPER_TABLE_LAMBDA
    model: str = ""  # the model measured ("": the dataset's own)
    model_parameters: int = 0  # its whole parameter count, frozen ones included
    backend: str = "gc"  # spgc.protocol.modes.BACKENDS
    # gmw: the bytes on the wire of the last run, before the OT phase was amortised.
    last_measured_bytes: int = 0
    last_round_trips: int = 0  # gmw: round trips of the last run, counted by H1's channel
    last_and_layers: int = 0  # gmw: AND-layer exchanges of the last run (part of them)
    last_ots: int = 0  # gmw: random OTs each way of the last run (one per AND group and instance)
    last_proved: int = 0  # security: malicious: AND gates H1 proved in zero knowledge (its seed)
    # --verify-inputs l2: the servers' sums are field shares mod this p (spgc.protocol.norm_proof),
    # and
    # the field circuits reconstruct them; None: ring shares, as without verification.
    field_modulus: int | None = None

    @property
    def silent_cots(self) -> bool:
        """Whether the links' sessions draw silent OT's COTs and count their exchanges: gmw, and
        either backend under security malicious (authenticated shares). Their OT phase is
        charged per COT (amortised_ot), their triples at the stock's cost."""
        return self.backend == "gmw" or (self.links is not None and self.links[0].authenticated)


@dataclass
class Measurement:
    """One two-party run over ``n`` coordinates: bytes sent by both parties per phase group."""

    n: int
    phases: dict[str, int]
    seconds: float
    and_gates: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.phases.values())


@dataclass(frozen=True)
class ModeSpec:
    """How to measure a two-server mode (its row in :data:`spgc.protocol.modes.MODES` says what it
    is):
    ``measure(ctx, sigma, n)`` runs ``n`` coordinates at noise std ``sigma`` (units)."""

    name: str
    measure: Callable[[CommContext, float, int], Measurement]
    max_coordinates: int | None = None  # default cap on the sample (the table is costly)
    # One-time work per training (parameters, circuits), done and timed before the runs.
    prepare: Callable[[CommContext, float], None] | None = None
    paper: str | None = None  # which Table 1 column it sits next to: "spgc" or "only-mpc"

    @property
    def label(self) -> str:
        return get_mode(self.name).label

    @property
    def dp(self) -> bool:
        return get_mode(self.name).differentially_private

    @property
    def noisy(self) -> bool:
        """Cost depends on sigma (one measurement per epsilon)."""
        return get_mode(self.name).noisy


def _run_pair(
    ctx: CommContext,
    fn_g: Callable[[Any], Any],
    fn_e: Callable[[Any], Any],
    table: bool = False,
) -> tuple[float, dict[str, int], Any]:
    """Both parties once (garbler in a thread): (seconds, bytes per phase group, result)."""

    links = ctx.table_links if table and ctx.table_links is not None else ctx.links
    assert links is not None
    before = both_counters(links)
    used = gmw_usage(links)
    proved = int(getattr(links[0].session, "ands_proved", 0))
    triples_before = triple_usage(links)
    seconds, wire, value = two_party(links, fn_g, fn_e)
    phases = sent_by_phase(before, both_counters(links))
    if sum(phases.values()) != wire:  # the two ways of counting must agree
        raise RuntimeError(f"phase counters ({sum(phases.values())}) != total sent ({wire})")
    ctx.last_measured_bytes = wire
    if ctx.silent_cots:
        now = gmw_usage(links)
        ots, layers, trips = (after - was for after, was in zip(now, used, strict=True))
        phases, ots = charged_triples(phases, ots, triples_before, triple_usage(links))
        ctx.last_round_trips, ctx.last_and_layers, ctx.last_ots = trips, layers, ots
        ctx.last_proved = int(getattr(links[0].session, "ands_proved", 0)) - proved
        phases = amortised_ot(phases, ots)
    return seconds, phases, value


# The run its seed commitments name: as long as a daemon's (os.urandom(16).hex()), so that the
# commitment proof costs what it costs in a run (the prefix's first block is public).
BENCH_RUN_ID = "0" * 32

# Round-trip times between the two servers for the implied round times (a data centre, a
# region, a continent apart).
ROUND_TRIP_TIMES: dict[str, float] = {"1ms": 0.001, "10ms": 0.010, "50ms": 0.050}


def _random_shares(n: int, ring_bits: int, field_modulus: int | None = None) -> np.ndarray:
    """Uniform ring (or field) elements from the OS CSPRNG (the cost does not depend on the
    values)."""
    raw = np.frombuffer(os.urandom(8 * n), dtype="<u8").astype(np.uint64)
    if field_modulus is not None:
        return raw % np.uint64(field_modulus)  # bias < 2^-2 per value: irrelevant to the cost
    return raw if ring_bits >= 64 else raw & np.uint64((1 << ring_bits) - 1)


# ------------------------------------------------------------------------------ the modes


def _measure_only_mpc(ctx: CommContext, sigma: float, n: int) -> Measurement:

    def party(role: str) -> Callable[[Any], Any]:
        p = ctx.field_modulus
        shares = _random_shares(n, ctx.ring_bits, p)
        return lambda link: run_aggregate(
            role, link, shares, None, None, ctx.ring_bits, "only-mpc", field_modulus=p
        )

    seconds, phases, _ = _run_pair(ctx, party("garbler"), party("evaluator"))
    verified = ctx.field_modulus is not None
    circuit = reconstruct_circuit(ctx.ring_bits, arithmetic=_arithmetic(ctx), field=verified)
    and_gates = float(circuit.and_count)
    return Measurement(n, phases, seconds, and_gates, _gmw_extra(ctx, n))


def _security_note(backend: str, modes: Sequence[str], security: str) -> str:
    """The header's note on the security level: the protocol that runs malicious rounds."""
    if security != "malicious" or not modes:
        return ""
    return f" (security: malicious, {MALICIOUS_VARIANTS[backend, modes[0]]})"


def _arithmetic(ctx: CommContext) -> str:
    """The circuits' arithmetic on the measured links (PartyLink.arithmetic)."""
    assert ctx.links is not None
    return ctx.links[0].arithmetic


def _gmw_extra(ctx: CommContext, n: int) -> dict[str, Any]:
    """gmw's round trips of the measured round, counted by H1's channel (every exchange: AND
    layers, run headers, outputs), its AND layers among them, and its random OTs each way per
    coordinate (one per AND group, fewer than its AND gates)."""
    if not ctx.silent_cots:
        return {}
    return {
        "round_trips": ctx.last_round_trips,
        "and_layers": ctx.last_and_layers,
        "random_ots_per_coordinate": ctx.last_ots / n,
        **({"proved_and_gates_per_coordinate": ctx.last_proved / n} if ctx.last_proved else {}),
    }


def _seed_bindings(
    ctx: CommContext, seeds: dict[str, bytes], block_id: bytes | None = None
) -> dict[str, SeedBinding | None]:
    """Under security: malicious the daemons prove their seeds (spgc.privacy.seed_proof): so
    does the bench, against commitments made as the daemons make them (a round's, or with
    ``block_id`` a pool block's). None for each side otherwise."""
    bindings: dict[str, SeedBinding | None] = {"garbler": None, "evaluator": None}
    assert ctx.links is not None
    if ctx.links[0].security != "malicious":
        return bindings
    roles = {"garbler": pb.SERVER_ROLE_H1, "evaluator": pb.SERVER_ROLE_H2}
    made = {
        who: seed_commitment(BENCH_RUN_ID, 0, roles[who], seeds[who])
        if block_id is None
        else pool_seed_commitment(BENCH_RUN_ID, 0, block_id, roles[who], seeds[who])
        for who in seeds
    }
    for who, peer in (("garbler", "evaluator"), ("evaluator", "garbler")):
        bindings[who] = SeedBinding(
            BENCH_RUN_ID, 0, roles[who], roles[peer], made[peer], block_id
        )
    return bindings


def _measure_spgc(ctx: CommContext, sigma: float, n: int) -> Measurement:
    seeds = {"garbler": os.urandom(32), "evaluator": os.urandom(32)}  # fresh, as a round's
    bindings = _seed_bindings(ctx, seeds)

    def party(role: str) -> Callable[[Any], Any]:
        p = ctx.field_modulus
        shares = _random_shares(n, ctx.ring_bits, p)
        return lambda link: run_aggregate(
            role, link, shares, seeds[role], sigma, ctx.ring_bits, "spgc", field_modulus=p,
            seed_binding=bindings[role],
        )  # fmt: skip

    seconds, phases, (_, info) = _run_pair(ctx, party("garbler"), party("evaluator"))
    extra = {"rounds": info["rounds"], "trials_per_coordinate": info["trials"] / n}
    extra.update(_gmw_extra(ctx, n))
    return Measurement(n, phases, seconds, info["and_gates"] / n, extra)


def dng_ring_bits(ctx: CommContext, sigma: float) -> int:
    """dng's ring: |S| plus the tail of both servers' noises (std sqrt(2) sigma), as in the plan."""

    return ring_bits_for(ctx.max_abs_sum, noise_std_units=sigma * math.sqrt(2), dim=ctx.dim)


def _measure_dng(ctx: CommContext, sigma: float, n: int) -> Measurement:

    ring = dng_ring_bits(ctx, sigma)

    def party(role: int) -> Callable[[Any], Any]:
        share = _random_shares(n, ring)

        def go(link: Any) -> Any:
            # each server's own work, timed with the step
            noise = sample_discrete_gaussian(n, sigma)
            return dng_exchange(role, link.channel, share, noise, ring)

        return go

    seconds, phases, _ = _run_pair(ctx, party(pb.SERVER_ROLE_H1), party(pb.SERVER_ROLE_H2))
    # dng sends raw bytes on the data link outside any engine phase: all of it is the opening
    return Measurement(n, {"opened": sum(phases.values())}, seconds, 0.0, {"ring_bits": ring})


def _measure_table(ctx: CommContext, sigma: float, n: int) -> Measurement:

    lam = ctx.table_lambda
    circuit = table_noisy_sum_circuit(PAPER_TABLE_RING_BITS, float(sigma), lam)

    def party(share_port: str, idx_port: str) -> Callable[[Any], Any]:
        inputs = {
            share_port: _random_shares(n, PAPER_TABLE_RING_BITS),
            idx_port: _random_shares(n, lam),
        }
        return lambda link: link.session.run(circuit, inputs, {}, n)

    seconds, phases, _ = _run_pair(ctx, party("a1", "idx_g"), party("a2", "idx_e"), table=True)
    return Measurement(n, phases, seconds, float(circuit.and_count))


def _prepare_spgc(ctx: CommContext, sigma: float) -> None:

    params = derive_params(sigma)
    build_trial_circuit(params, arithmetic=_arithmetic(ctx))
    noisy_sum_circuit(
        ctx.ring_bits,
        params.noise_bits,
        output_width(ctx.ring_bits, params.noise_bits),
        arithmetic=_arithmetic(ctx),
    )


def _prepare_table(ctx: CommContext, sigma: float) -> None:

    table_noisy_sum_circuit(PAPER_TABLE_RING_BITS, float(sigma), ctx.table_lambda)


def preprocessed_ring_bits(ctx: CommContext, sigma: float) -> int:
    """The preprocessed ring, as servers/plan.py sizes it: |S| plus the sampler's hard bound
    on |z| (the noise shares live in the providers' ring and S + z is opened there)."""

    return ring_bits_for(ctx.max_abs_sum + noise_bound_units(sigma))


def _prepare_preprocessed(ctx: CommContext, sigma: float) -> None:

    params = derive_params(sigma)
    build_trial_circuit(params, arithmetic=_arithmetic(ctx))
    noise_share_circuit(
        preprocessed_ring_bits(ctx, sigma), params.noise_bits, arithmetic=_arithmetic(ctx)
    )


def _measure_preprocessed(ctx: CommContext, sigma: float, n: int) -> Measurement:
    """Offline: the circuit makes n additive noise shares (servers/noise_pool.py); online: each
    server adds its shares to its sum and the two open S + z (one ring element each way)."""

    ring = preprocessed_ring_bits(ctx, sigma)

    seeds = {"garbler": os.urandom(32), "evaluator": os.urandom(32)}  # fresh, as a block's
    bindings = _seed_bindings(ctx, seeds, bytes(POOL_BLOCK_ID_BYTES))

    def offline(role: str) -> Callable[[Any], Any]:
        return lambda link: produce_noise_shares(
            role, link, n, sigma, ring, seeds[role], seed_binding=bindings[role]
        )

    pool: dict[str, Any] = {}

    def keep(role: str) -> Callable[[Any], Any]:
        def go(link: Any) -> Any:
            pool[role], info = offline(role)(link)
            return info

        return go

    off_s, off_phases, info = _run_pair(ctx, keep("garbler"), keep("evaluator"))
    proved = ctx.last_proved  # the online exchange below proves nothing

    def online(role: int, name: str) -> Callable[[Any], Any]:
        share = _random_shares(n, ring)
        return lambda link: dng_exchange(role, link.channel, share, pool[name].view(np.int64), ring)

    on_s, on_phases, _ = _run_pair(
        ctx, online(pb.SERVER_ROLE_H1, "garbler"), online(pb.SERVER_ROLE_H2, "evaluator")
    )
    phases = dict(off_phases)
    phases["opened"] = sum(on_phases.values())
    extra = {
        "ring_bits": ring,
        "rounds": info["rounds"],
        "trials_per_coordinate": info["trials"] / n,
        "offline_bytes_per_coordinate": sum(off_phases.values()) / n,
        "online_bytes_per_coordinate": phases["opened"] / n,
        "online_seconds_measured": on_s,
    }
    if proved:
        extra["proved_and_gates_per_coordinate"] = proved / n
    return Measurement(n, phases, off_s + on_s, 0.0, extra)


# Every two-server row of the modes table, training modes and baselines: a new one needs its
# measurement here (a one-server mode moves no bytes between the servers).
MODES: dict[str, ModeSpec] = {
    "only-mpc": ModeSpec("only-mpc", _measure_only_mpc, paper="only-mpc"),
    "spgc": ModeSpec("spgc", _measure_spgc, paper="spgc", prepare=_prepare_spgc),
    "dng": ModeSpec("dng", _measure_dng),
    "preprocessed": ModeSpec("preprocessed", _measure_preprocessed, prepare=_prepare_preprocessed),
    "table16": ModeSpec(
        "table16",
        _measure_table,
        max_coordinates=DEFAULT_TABLE_COORDINATES,
        paper="spgc",
        prepare=_prepare_table,
    ),
}


# ------------------------------------------------------------------------------ running


def make_context(
    dataset: str,
    *,
    scale: float | None = None,
    clip_norm: float | None = None,
    model: str = "",
) -> CommContext:
    """The model size, fixed point and ring the daemon would use for ``dataset`` with the
    paper's workload (3 providers, its per-provider batch as the enforced batch cap). ``model``:
    another model (a built-in name or a user's factory) whose trained coordinates are d."""

    if dataset not in DATASETS:
        raise BenchCommError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    defaults = ServerConfig.model_construct()  # the defaults, unvalidated
    scale = defaults.scale if scale is None else scale
    clip_norm = defaults.clip_norm if clip_norm is None else clip_norm
    try:
        net = resolve_model(model or dataset, seed=defaults.model_seed)
    except ValueError as exc:
        raise BenchCommError(f"--model {model}: {' '.join(str(exc).split())}") from None
    dim = trainable_count(net)  # only the trained coordinates travel (spgc.learning.trainable)
    if dim < 1:
        raise BenchCommError(f"--model {model}: every parameter is frozen: nothing travels")
    fp = FixedPointConfig(scale=scale, clip_norm=clip_norm, dim=dim)
    work = DATASETS[dataset]
    bound = max_abs_sum_units(work.batch_per_provider, fp.l2_bound_units, providers=PAPER_PROVIDERS)
    return CommContext(
        dataset, dim, scale, clip_norm, fp.l2_bound_units, ring_bits_for(bound), bound,
        model=model or dataset, model_parameters=parameter_count(net),
    )  # fmt: skip


def verified_field(ctx: CommContext) -> NormProofParams:
    """The norm proofs' parameters for the workload: each provider's vector within its batch
    of ``l2_bound_units`` examples (BenchCommError if no field holds the bound)."""
    bound = DATASETS[ctx.dataset].batch_per_provider * ctx.l2_bound_units
    try:
        return NormProofParams.for_plan(ctx.dim, bound, ctx.ring_bits)
    except ValueError as exc:
        raise BenchCommError(f"--verify-inputs l2: {exc}") from None


def sigma_units_for(
    ctx: CommContext, epsilon: float, delta: float, calibration: str
) -> tuple[float, float]:
    """(noise multiplier, sigma in fixed-point units) as the daemon derives them per step."""

    nm = accounting.noise_multiplier_for(
        calibration,  # type: ignore[arg-type]
        epsilon,
        delta,
        allow_invalid=True,  # classic at eps >= 1 only to reproduce the paper; flagged per row
    )
    return nm, nm * ctx.l2_bound_units


def _warm_up(ctx: CommContext) -> None:
    """Session setup (hello, base OTs) outside the measurements; its bytes are measured as the
    difference of the first and the second identical run."""
    first = _measure_only_mpc(ctx, 0.0, 8).total
    if ctx.silent_cots:
        # Everything the first run sent beyond its amortised work: the silent OT's setup and
        # its first LPN iteration (whose OTs later runs are charged for again: an overstatement
        # of 570 KB per session).
        ctx.session_setup_bytes = ctx.last_measured_bytes - first
        return
    second = _measure_only_mpc(ctx, 0.0, 8).total
    ctx.session_setup_bytes = first - second


def _check_inputs(
    epsilons: Sequence[float], delta: float, calibration: str, modes: Sequence[str],
    coordinates: int, epochs: int,
) -> None:  # fmt: skip
    if not epsilons:
        raise BenchCommError("give at least one epsilon")
    for eps in epsilons:
        if not (math.isfinite(eps) and eps > 0):
            raise BenchCommError(f"epsilon must be finite and > 0, got {eps:g}")
    if not 0 < delta < 1:
        raise BenchCommError(f"delta must be in (0, 1), got {delta:g}")
    if calibration not in ("classic", "analytic"):
        raise BenchCommError(f"calibration must be classic or analytic, got {calibration!r}")
    for m in modes:
        if m not in MODES:
            raise BenchCommError(f"unknown mode {m!r}; choose from {', '.join(MODES)}")
    if coordinates < 4:
        raise BenchCommError(f"--coordinates must be at least 4, got {coordinates}")
    if epochs < 1:
        raise BenchCommError(f"--epochs must be at least 1, got {epochs}")


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _timed(spec: ModeSpec, ctx: CommContext, sigma: float, n: int) -> Measurement:
    """One measured run; a short one (under 2 s, where scheduling noise matters) is run a
    second time and the faster time kept (the bytes are those of the first run)."""
    m = spec.measure(ctx, sigma, n)
    if m.seconds < 2.0:
        m.seconds = min(m.seconds, spec.measure(ctx, sigma, n).seconds)
    return m


def measure_rows(
    ctx: CommContext,
    epsilons: Sequence[float],
    *,
    delta: float = DEFAULT_DELTA,
    calibration: str = "classic",
    modes: Sequence[str] = tuple(MODES),
    coordinates: int = DEFAULT_COORDINATES,
    table_coordinates: int | None = None,
    epochs: int = DEFAULT_EPOCHS,
    progress: Callable[[str], None] = _progress,
    on_row: Callable[[int], None] | None = None,
) -> list[dict[str, Any]]:
    """One row per (mode, epsilon), each from two measured runs (the sample and a quarter of
    it); ``ctx.links`` must be open and warmed up. ``progress(line)`` per measurement,
    ``on_row(rows so far)`` per row."""
    work = DATASETS[ctx.dataset]
    steps = epochs * work.steps_per_epoch
    rows: list[dict[str, Any]] = []
    for name in modes:
        spec = MODES[name]
        cap = spec.max_coordinates
        if cap is not None and table_coordinates is not None:
            cap = table_coordinates
        n = min(coordinates, ctx.dim, cap) if cap else min(coordinates, ctx.dim)
        n_small = max(1, n // 4)
        cached: tuple[Measurement, Measurement] | None = None
        for eps in epsilons:
            nm, sigma = sigma_units_for(ctx, eps, delta, calibration)
            if cached is None or spec.noisy:
                t0 = time.perf_counter()
                if spec.prepare is not None:
                    spec.prepare(ctx, sigma)
                prepare_seconds = time.perf_counter() - t0
                spec.measure(ctx, sigma, min(8, n_small))  # first run of a circuit: untimed
                big = _timed(spec, ctx, sigma, n)
                small = _timed(spec, ctx, sigma, n_small)
                big.extra["prepare_seconds"] = prepare_seconds
                cached = (big, small)
                progress(
                    f"  {name:<12} eps={eps:<6g} sigma_u={sigma:<10.6g} {n} + {n_small} "
                    f"coordinates: {big.total / n:,.0f} B/coordinate "
                    f"({time.perf_counter() - t0:.1f} s)"
                )
            big, small = cached
            rows.append(
                _row(ctx, spec, eps, delta, calibration, nm, sigma, big, small, steps, epochs)
            )
            if on_row is not None:
                on_row(len(rows))
    _add_ratios(rows)
    return rows


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    """Traffic relative to only-mpc at the same epsilon, ours and the paper's (Table 1): a
    comparison that does not depend on the assumed number of steps or on d."""
    base = {r["epsilon"]: r["bytes_per_step"] for r in rows if r["mode"] == "only-mpc"}
    for r in rows:
        b = base.get(r["epsilon"])
        r["ratio_to_only_mpc"] = None if not b else r["bytes_per_step"] / b
        work = DATASETS[r["dataset"]]
        paper = r["paper_gb_per_training"]
        r["paper_ratio_to_only_mpc"] = None if paper is None else paper / work.table1_only_mpc_gb


def _row(
    ctx: CommContext, spec: ModeSpec, eps: float, delta: float, calibration: str, nm: float,
    sigma: float, big: Measurement, small: Measurement, steps: int, epochs: int,
) -> dict[str, Any]:  # fmt: skip
    work = DATASETS[ctx.dataset]
    per_coord = big.total / big.n
    scaled = big.n != ctx.dim
    per_step = big.total if not scaled else per_coord * ctx.dim
    seconds = big.seconds
    if scaled:  # linear fit through the two measured sizes: per-run overhead + per coordinate
        slope = big.seconds / big.n  # (a negative overhead would be timing noise: clamp)
        if big.n > small.n:
            slope = min(slope, max(0.0, (big.seconds - small.seconds) / (big.n - small.n)))
        seconds = max(big.seconds + slope * (ctx.dim - big.n), 0.0)
    row: dict[str, Any] = {
        "dataset": ctx.dataset,
        "model": ctx.model,
        "dim": ctx.dim,
        "coordinates": ctx.dim,  # the trained parameters: what the servers sum and noise
        "model_parameters": ctx.model_parameters,
        "mode": spec.name,
        "label": spec.label,
        "differentially_private": spec.dp,
        "epsilon": eps,
        "delta": delta,
        "calibration": calibration,
        "calibration_valid": not (calibration == "classic" and eps >= 1),
        "noise_multiplier": nm if spec.noisy else 0.0,
        "sigma_units": sigma if spec.noisy else 0.0,
        "ring_bits": ctx.ring_bits,
        "verify_inputs": "none" if ctx.field_modulus is None else "l2",
        "coordinates_measured": big.n,
        "coordinates_small": small.n,
        "bytes_per_coordinate": per_coord,
        "bytes_per_coordinate_small": small.total / small.n,
        "phase_bytes_per_coordinate": {
            g: big.phases[g] / big.n for g in GROUP_ORDER if big.phases.get(g)
        },
        "and_gates_per_coordinate": big.and_gates,
        "bytes_per_step": per_step,
        "seconds_per_step": seconds,
        "seconds_per_round": seconds,  # a training step is one round
        # measured, not scaled: the circuit's AND gates over the time of the measured run
        "and_gates_per_second": big.and_gates * big.n / big.seconds if big.seconds > 0 else 0.0,
        "scaled_to_dim": scaled,
        "epochs": epochs,
        "steps_per_training": steps,
        "session_setup_bytes": ctx.session_setup_bytes,
        # The phases whose bytes are charged by formula, not counted on the link (gmw's OTs:
        # _amortised_ot); every other figure is counted.
        "charged_phases": [g for g in CHARGED_PHASES if big.phases.get(g)]
        if ctx.silent_cots
        else [],
        "bytes_per_training": per_step * steps + ctx.session_setup_bytes,
        "seconds_per_training": seconds * steps,
        **big.extra,
    }
    # What the bytes alone imply at each link speed, beside the measured compute time: the
    # larger of the two bounds a step (a pipelined engine overlaps them).
    for name, bits_per_second in LINK_SPEEDS.items():
        link = 8 * per_step / bits_per_second
        row[f"link_seconds_per_step_{name}"] = link
        row[f"bound_at_{name}"] = "link" if link > seconds else "compute"
        # gmw's channel counts its round trips: the round's time on a link of this
        # speed and round-trip time, at least the transfer plus the waits, beside the compute.
        if "round_trips" in big.extra:
            for rtt_name, rtt in ROUND_TRIP_TIMES.items():
                wire = link + big.extra["round_trips"] * rtt
                row[f"round_seconds_{name}_{rtt_name}"] = max(wire, seconds)
    if spec.name in ("dng", "preprocessed"):
        row["ring_bits"] = big.extra["ring_bits"]
    if spec.name == "preprocessed":
        row["online_seconds_per_step"] = big.extra["online_seconds_measured"] / big.n * ctx.dim
        row["online_bytes_per_step"] = big.extra["online_bytes_per_coordinate"] * ctx.dim
    elif spec.name == "table16":
        row["ring_bits"] = PAPER_TABLE_RING_BITS
        row["table_lambda"] = ctx.table_lambda
    paper_gb = None
    if spec.paper == "only-mpc":
        paper_gb = work.table1_only_mpc_gb
    elif spec.paper == "spgc":
        paper_gb = work.table1_spgc_gb.get(float(eps))
    row["paper_column"] = spec.paper
    row["paper_gb_per_training"] = paper_gb
    row["paper_bytes_per_step"] = None if paper_gb is None else paper_gb * GB / steps
    row["paper_dim"] = work.paper_dim
    row["paper_bytes_per_coordinate"] = (
        None if paper_gb is None else row["paper_bytes_per_step"] / work.paper_dim
    )
    return row


def run(
    dataset: str = "cancer",
    epsilons: Sequence[float] = DEFAULT_EPSILONS,
    *,
    delta: float = DEFAULT_DELTA,
    calibration: str = "classic",
    modes: Sequence[str] = tuple(MODES),
    coordinates: int = DEFAULT_COORDINATES,
    table_coordinates: int | None = None,
    epochs: int = DEFAULT_EPOCHS,
    chunk: int | None = None,
    tls: bool = False,
    workers: int = 1,
    as_json: bool = False,
    plot: Path | None = None,
    model: str = "",
    backend: str = "gc",
    verify_inputs: str = "none",
    security: str = DEFAULT_SECURITY,
    trial_depth: int | None = None,
) -> int:
    """Run the benchmark; the table goes to stdout (stderr with ``as_json``), JSON to stdout.
    Returns the exit code; BenchCommError (a ValueError) for bad input. ``verify_inputs``
    ``l2``: the sums are field shares of verified inputs (spgc.protocol.norm_proof), spgc and
    only-mpc
    only."""

    if dataset not in DATASETS:
        raise BenchCommError(f"unknown dataset {dataset!r}; choose one of {', '.join(DATASETS)}")
    _check_inputs(epsilons, delta, calibration, modes, coordinates, epochs)
    if plot is not None and not Path(plot).parent.exists():
        raise BenchCommError(f"cannot write the plot: directory {Path(plot).parent} does not exist")
    if not 1 <= workers <= MAX_LANES:
        raise BenchCommError(f"--workers must be in 1..{MAX_LANES}, got {workers}")
    if chunk is not None and chunk < 1:
        raise BenchCommError(f"--chunk must be at least 1, got {chunk}")
    if backend not in BACKENDS:
        raise BenchCommError(f"unknown backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if security not in SECURITY_NAMES:
        raise BenchCommError(f"--security must be one of {', '.join(SECURITY_NAMES)}")
    if security == "malicious":
        for mode in modes:
            refusal = malicious_refusal(backend, mode)
            if refusal:
                raise BenchCommError(f"--security malicious: {refusal}")
        if workers > 1:
            raise BenchCommError("--security malicious runs on one worker pair (--workers 1)")
    if trial_depth is not None and (backend != "gmw" or trial_depth < MIN_TRIAL_DEPTH):
        raise BenchCommError(
            f"--trial-depth bounds the gmw trial run's AND layers: --backend gmw and a depth of "
            f"at least {MIN_TRIAL_DEPTH}"
        )
    if table_coordinates is not None and table_coordinates < 4:
        raise BenchCommError(f"--table-coordinates must be at least 4, got {table_coordinates}")
    ctx = make_context(dataset, model=model)
    ctx.backend = backend
    if verify_inputs == "l2":
        other = sorted(set(modes) - {"spgc", "only-mpc"})
        if other:
            raise BenchCommError(
                f"--verify-inputs l2 measures modes spgc and only-mpc, not {', '.join(other)}"
            )
        ctx.field_modulus = verified_field(ctx).p
    elif verify_inputs != "none":
        raise BenchCommError(f"--verify-inputs must be none or l2, got {verify_inputs!r}")
    out = sys.stderr if as_json else sys.stdout
    _progress(f"bench comm: {_what(ctx)}, modes {', '.join(modes)}")
    actors: list[Any] = []
    with tempfile.TemporaryDirectory(prefix="spgc-bench-comm-") as tmp:
        ctx.links = party_links(
            chunk, Path(tmp, "main") if tls else None, backend, security, trial_depth
        )
        depth = ctx.links[0].trial_depth if backend == "gmw" else None
        if "table16" in modes:
            ctx.table_links = party_links(TABLE_CHUNK, Path(tmp, "table") if tls else None, backend)
        try:
            if workers > 1:
                try:
                    init_local_ray(workers)
                except RuntimeError as exc:
                    raise BenchCommError(str(exc)) from None
                _progress(f"bench comm: {workers} worker pairs on a local Ray cluster")
                # the dev PKI party_links made: the workers' links use the servers' certificates
                lanes_g, lanes_e, actors = start_worker_pairs(
                    workers, Path(tmp, "main") if tls else None, backend
                )
                ctx.links[0].remote_lanes = lanes_g
                ctx.links[1].remote_lanes = lanes_e
            _warm_up(ctx)
            # A line per measurement; on a terminal also a progress line of the rows.
            bar = Progress(len(modes) * len(epsilons), "rows", desc="bench comm", lines=False)
            worker_rss: list[list[float]] = []  # each worker's peak so far, after each row

            def row_done(count: int) -> None:
                bar.update(count)
                if actors:
                    worker_rss.append(workers_peak_rss_mb(actors))

            rows = measure_rows(
                ctx, epsilons, delta=delta, calibration=calibration, modes=modes,
                coordinates=coordinates, table_coordinates=table_coordinates, epochs=epochs,
                progress=bar.note, on_row=row_done,
            )  # fmt: skip
            bar.close()
            for row, rss in zip(rows, worker_rss, strict=False):
                row["peak_rss_mb_per_worker"] = rss
        finally:
            for actor in actors:
                kill_worker(actor)
            if workers > 1:
                shutdown_ray()
            for pair in (ctx.links, ctx.table_links):
                for link in pair or ():
                    link.channel.close()
            ctx.links = ctx.table_links = None
    for row in rows:
        row["workers"] = workers
        row["backend"] = backend
        row["security"] = security
        row["trial_depth"] = depth
    link_kind = "TLS 1.3" if tls else "plaintext TCP"
    where = f", circuits on {workers} Ray worker pairs" if workers > 1 else ""
    header = (
        f"{_what(ctx)}, delta = {delta:g}, {calibration} calibration, backend {backend}"
        f"{_security_note(backend, modes, security)}, "
        f"two-party over loopback ({link_kind}{where})"
    )
    print(format_table(rows, header), file=out)
    print(notes(ctx, rows, epochs), file=out)
    if security == "malicious":
        print(
            "security malicious: the triples are made a batch at a time into a stock (the "
            "authenticated party's triple_batch); each run is charged the triples it used at "
            "the stock's average cost in bytes and COTs, not what it happened to make",
            file=out,
        )
    if rows and rows[-1].get("peak_rss_mb_per_worker"):
        rss = ", ".join(f"{x:.0f}" for x in rows[-1]["peak_rss_mb_per_worker"])
        print(f"peak RSS per worker after the last row (MB): {rss}", file=out)
    if plot is not None:
        write_plot(rows, Path(plot))
        print(f"plot written to {plot}", file=out)
    if as_json:
        print(json.dumps(rows, indent=2))
    return 0


def _what(ctx: CommContext) -> str:
    """The model measured, for the table's header: its d, and how many are frozen."""
    name = ctx.dataset if ctx.model == ctx.dataset else f"{ctx.dataset} workload, model {ctx.model}"
    frozen = ctx.model_parameters - ctx.dim
    return f"{name}: d = {ctx.dim:,}" + (
        f" trained coordinates ({frozen:,} frozen parameters never travel)" if frozen else ""
    )

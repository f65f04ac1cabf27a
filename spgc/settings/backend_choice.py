"""``backend: auto``: the backend (gc or gmw) with the least expected round time on the link
H1 measured to H2, for the plan's coordinates; in mode spgc on gmw also the trial run's depth
(``trial_depth``: fewer AND layers, fewer round trips, more bytes and CPU), in mode preprocessed
the production run size. Under ``security: malicious`` it prices the authenticated engines
(authenticated garbling, authenticated GMW: :func:`cost_tables`).

One job, pure functions: H1 calls :func:`choose_backend` on its measured :class:`LinkFigures`
and sends the figures with its choice in the Handshake; H2 calls it again on the same figures
and refuses a plan whose backend does not follow from them (both get the same answer: the same
floats through the same arithmetic).

The model of one round's circuit on a backend (or, in mode preprocessed, of making one round's
noise shares)::

    seconds = (round_trips + coordinates * round_trips_per_coordinate) * trip_share * rtt
              + coordinates * (bytes_per_coordinate / throughput + cpu_seconds_per_coordinate)

with the per-coordinate figures of :data:`ROUND_COSTS` and :data:`NOISE_COSTS`, measured by the
engine's own counters (see :data:`COSTS_COMMAND`; tests/app/test_backend_costs.py measures
the bytes and round trips again and fails when the table is stale). The CPU figures are this
project's 2-core development machine's, shared with other work when taken: they rank the
backends' compute, they do not predict another machine's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, NamedTuple

from garbled_core.sampler_circuit import MAX_TRIAL_DEPTH, UNBOUNDED_TRIAL_DEPTH
from spgc.protocol.modes import BACKEND_NAMES, DEFAULT_SECURITY, SECURITY_NAMES

__all__ = [
    "AUTO",
    "AUTO_MODES",
    "CALLS_PER_RUN",
    "COSTS_COMMAND",
    "GMW_DEPTH_COSTS",
    "GMW_EXCHANGE_SHARE",
    "MALICIOUS_COSTS_COMMAND",
    "MALICIOUS_GMW_DEPTH_COSTS",
    "MALICIOUS_NOISE_COSTS",
    "MALICIOUS_ROUND_COSTS",
    "MAX_RUN_ROUNDS",
    "NOISE_COSTS",
    "ROUND_COSTS",
    "RUN_OVERHEAD_SHARE",
    "BackendChoice",
    "BackendCost",
    "Candidate",
    "CostTables",
    "LinkFigures",
    "amortised_run",
    "candidate_label",
    "candidates",
    "choose_backend",
    "cost_tables",
    "expected_seconds",
    "production_costs",
]

#: The config value that asks for this choice.
AUTO = "auto"
#: The modes whose costs the table holds: spgc's round circuit, preprocessed's production.
AUTO_MODES: tuple[str, ...] = ("spgc", "preprocessed")

#: The command whose output :data:`ROUND_COSTS` and :data:`NOISE_COSTS` were read from (its
#: --json rows: ``bytes_per_coordinate``, ``round_trips``, ``rounds`` and ``seconds_per_step`` /
#: ``dim``; preprocessed's ``offline_bytes_per_coordinate``), once per backend.
COSTS_COMMAND = (
    "spgc bench comm --dataset mnist --epsilon 2 --modes spgc preprocessed "
    "--coordinates 2000 --backend gc|gmw --json (gmw's depths: --modes spgc --trial-depth D)"
)

#: A production run is made long enough that its round trips are at most this share of its
#: time (servers/pool_sync.RunSizer sizes runs by the same rule from measured runs).
RUN_OVERHEAD_SHARE = 0.1
#: Calls from H1 to H2 around each production run (its block's announcement and its end): round
#: trips a run has besides its circuit's.
CALLS_PER_RUN = 2


#: What one of gmw's counted round trips costs, in round trips of the link: an AND layer's
#: exchange has both parties send at once and each wait only for the other's message, half a
#: round trip (`spgc bench wan --grid`, cancer: gmw's circuit grew by 4.3 ms an exchange from
#: 1 to 10 ms and by 24.7 ms from 1 to 50 ms; docs/RESULTS.md section 12).
GMW_EXCHANGE_SHARE = 0.5


@dataclass(frozen=True)
class BackendCost:
    """What one run of a circuit costs on a backend: its round trips (per run, whatever its
    size; each costs ``trip_share`` of the link's round trip), and per coordinate (or noise
    sample) its bytes between the servers, the CPU seconds of the two parties running side by
    side and the round trips that grow with the run (the authenticated engines': their triples
    are made in chunks of a few exchanges each; 0 on the semi-honest ones)."""

    round_trips: float
    bytes_per_coordinate: float
    cpu_seconds_per_coordinate: float
    trip_share: float = 1.0
    round_trips_per_coordinate: float = 0.0

    def trip_seconds(self, link: LinkFigures) -> float:
        """Seconds of one run's fixed round trips on ``link``."""
        return self.round_trips * self.trip_share * link.rtt_seconds

    def seconds_per_coordinate(self, link: LinkFigures) -> float:
        """Seconds one more coordinate adds to a run on ``link``: its bytes, its CPU and its
        share of the round trips that grow with the run."""
        return (
            self.bytes_per_coordinate / link.bytes_per_second
            + self.cpu_seconds_per_coordinate
            + self.round_trips_per_coordinate * self.trip_share * link.rtt_seconds
        )


#: Mode spgc's round circuit on gmw (the fused trial run and the noisy sum) per trial depth (the
#: plan's ``trial_depth``): round trips, bytes per coordinate, CPU seconds per coordinate. The
#: round trips are the engine's count (``round_trips``); UNBOUNDED_TRIAL_DEPTH is the trial with
#: the fewest AND gates, whatever its layers (about 150). Measured in one run, 2026-12-05.
GMW_DEPTH_COSTS: dict[int, BackendCost] = {
    MAX_TRIAL_DEPTH: BackendCost(30, 1082.9, 60.5e-6, GMW_EXCHANGE_SHARE),
    48: BackendCost(50, 679.4, 39.2e-6, GMW_EXCHANGE_SHARE),
    UNBOUNDED_TRIAL_DEPTH: BackendCost(157, 507.5, 28.5e-6, GMW_EXCHANGE_SHARE),
}

#: Mode spgc's round circuit (the sampler's stages and the noisy sum) per backend, gmw at its
#: default depth: round trips, bytes per coordinate, CPU seconds per coordinate. gc's round
#: trips are not counted by the engine: two per sampler stage (the stage's run and the
#: evaluator's OT; ``rounds`` = 3 stages at d = 28,938).
ROUND_COSTS: dict[str, BackendCost] = {
    "gc": BackendCost(6, 20211.3, 24.1e-6),
    "gmw": GMW_DEPTH_COSTS[MAX_TRIAL_DEPTH],
}

#: The commands whose output the MALICIOUS_ tables were read from: the rows at 8,000
#: coordinates, the round trips that grow with the run from the difference to 4,000.
MALICIOUS_COSTS_COMMAND = (
    "spgc bench comm --dataset mnist --epsilon 2 --modes spgc preprocessed --coordinates "
    "4000|8000 --backend gc|gmw --security malicious --json"
)

#: Under ``security: malicious`` (the authenticated engines, docs/MALICIOUS.md). The engine
#: counts the round trips as on gmw (an exchange, half a round trip) on both. They grow with the
#: run: the triples are made in chunks of TripleFactory::kLeakyChunk (2^19) leaky triples, one
#: exchange a chunk (a chunk's corrections ride with the next one's first message), the seed
#: proofs take one exchange a batch of 2^20 proved AND gates (about 190 coordinates: a ChaCha8
#: block of 4,448 AND gates, 1.25 blocks a coordinate with the spare trials), and silent OT's
#: iterations add theirs. The bytes and CPU charge each run the triples it used at the stock's
#: average cost; they grow slowly with the run too (more batches, each bucketed at a higher
#: rho), so the rows are those of the larger run. The round rows were measured with the seed
#: proofs, 2026-12-06 02:09-02:11 UTC (4,000 to 8,000 coordinates: 95 to 189 round trips on
#: gc, 242 to 335 on gmw; 155,034.2 and 75,646.1 B a coordinate at 8,000; CPU the bench's
#: seconds_per_step over d = 28,938). gc's fixed count, 13, is its round's at d = 62 (``spgc
#: bench comm --dataset cancer --modes spgc --backend gc --security malicious``: 13 at every
#: epsilon), its growth (189 - 13) / 8,000. Before the proofs (2026-12-05 21:05-21:07): 62 to
#: 132 and 212 to 275 round trips, 153,322 and 73,934 B a coordinate.
#: gmw has its default depth only (no bound): at 28 and 48 layers its triples' round trips
#: stay while the bytes and CPU grow (2,000 coordinates: 150,240 and 73,979 B a coordinate
#: against 57,376, 196 and 136 round trips against 205).
MALICIOUS_GMW_DEPTH_COSTS: dict[int, BackendCost] = {
    UNBOUNDED_TRIAL_DEPTH: BackendCost(149, 75646.1, 1949.6e-6, GMW_EXCHANGE_SHARE, 0.0233),
}
#: Mode spgc's round under ``security: malicious``: authenticated garbling (one fused run and
#: the seed proofs, 13 round trips besides its triples' and the proofs' batches) and
#: authenticated GMW.
MALICIOUS_ROUND_COSTS: dict[str, BackendCost] = {
    "gc": BackendCost(13, 155034.2, 2121.1e-6, GMW_EXCHANGE_SHARE, 0.0220),
    "gmw": MALICIOUS_GMW_DEPTH_COSTS[UNBOUNDED_TRIAL_DEPTH],
}
#: Mode preprocessed's production under ``security: malicious``, per noise sample, with its
#: seed proofs (a pool block's commitment, then the ChaCha8 blocks its trials read: 5,563
#: proved AND gates a sample at 8,000), measured 2026-12-06 03:47-03:56 UTC at 8,000 samples:
#: gc 142,878.0 B and 3,487.5 / 3,644.7 us (2,604.3 without the proofs, the bench's seeds
#: unbound by a script, in the same minutes), gmw 69,613.8 B and 3,069.5 / 3,152.5 / 2,744.1 us
#: (67,902.0 B and 2,457.8 / 2,391.6 us without); CPU the mean. The round trips are the round
#: circuit's with its proofs (:data:`MALICIOUS_ROUND_COSTS`), as in :data:`NOISE_COSTS`.
MALICIOUS_NOISE_COSTS: dict[str, BackendCost] = {
    "gc": BackendCost(13, 142878.0, 3566.1e-6, GMW_EXCHANGE_SHARE, 0.0220),
    "gmw": BackendCost(149, 69613.8, 2988.7e-6, GMW_EXCHANGE_SHARE, 0.0233),
}


class CostTables(NamedTuple):
    """The model's costs at one security level."""

    rounds: dict[str, BackendCost]  # mode spgc's round per backend
    gmw_depths: dict[int, BackendCost]  # mode spgc's round on gmw per trial depth
    production: dict[str, BackendCost]  # mode preprocessed's production per backend


def cost_tables(security: str = DEFAULT_SECURITY) -> CostTables:
    """The model's costs at ``security``: the semi-honest engines' or the authenticated ones'."""
    if security not in SECURITY_NAMES:
        raise ValueError(f"security must be one of {', '.join(SECURITY_NAMES)}, not {security!r}")
    if security == DEFAULT_SECURITY:
        return CostTables(ROUND_COSTS, GMW_DEPTH_COSTS, NOISE_COSTS)
    return CostTables(MALICIOUS_ROUND_COSTS, MALICIOUS_GMW_DEPTH_COSTS, MALICIOUS_NOISE_COSTS)


#: What auto chooses among: a backend and, on gmw in mode spgc, the trial depth (None: the
#: backend has none to choose).
Candidate = tuple[str, int | None]


def candidates(mode: str, security: str = DEFAULT_SECURITY) -> list[Candidate]:
    """What ``backend: auto`` chooses among in ``mode``: gc, and gmw at each depth of the
    depth table (:func:`cost_tables`) in mode spgc (mode preprocessed's production runs gmw at
    its default)."""
    depth_costs = cost_tables(security).gmw_depths
    out: list[Candidate] = []
    for backend in BACKEND_NAMES:
        if backend == "gmw" and mode == "spgc":
            out += [(backend, depth) for depth in depth_costs]
        else:
            out.append((backend, None))
    return out


def candidate_label(candidate: Candidate) -> str:
    """``gc``, ``gmw`` or ``gmw/48``, ``gmw/unbounded``: a candidate in the log and summary."""
    backend, depth = candidate
    if depth is None:
        return backend
    return f"{backend}/{'unbounded' if depth >= UNBOUNDED_TRIAL_DEPTH else depth}"


#: Mode preprocessed's production run (the noise-share circuit) per backend, per noise sample.
#: bench comm counts no round trips for it: a run has the round circuit's sampler stages, so the
#: round circuit's counts stand in for them, on gmw those of the trial with the fewest AND
#: gates, which production builds on every backend (servers.gc_party.PRODUCTION_ARITHMETIC).
#: gmw's bytes and CPU re-measured with it, 2026-12-05 (25.6 and 32.2 us in two runs).
NOISE_COSTS: dict[str, BackendCost] = {
    "gc": BackendCost(6, 19740.9, 22.7e-6),
    "gmw": BackendCost(
        GMW_DEPTH_COSTS[UNBOUNDED_TRIAL_DEPTH].round_trips, 448.5, 28.9e-6, GMW_EXCHANGE_SHARE
    ),
}

#: Bytes per coordinate of mode preprocessed's online exchange (one ring element of 8 bytes each
#: way): the same on either backend, shown in the expected round time.
ONLINE_BYTES_PER_COORDINATE = 16


@dataclass(frozen=True)
class LinkFigures:
    """The server-to-server link as H1 measured it at pairing: the median round trip of small
    ping-pongs and the throughput of a timed bulk transfer, on the data link (TLS counted)."""

    rtt_seconds: float
    bytes_per_second: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.rtt_seconds) and self.rtt_seconds >= 0):
            raise ValueError(f"round trip must be a finite number >= 0, got {self.rtt_seconds}")
        if not (math.isfinite(self.bytes_per_second) and self.bytes_per_second > 0):
            raise ValueError(f"throughput must be finite and > 0, got {self.bytes_per_second}")

    def describe(self) -> str:
        return f"round trip {1000 * self.rtt_seconds:.2f} ms, {self.mbit:,.1f} Mbit/s"

    @property
    def mbit(self) -> float:
        return 8 * self.bytes_per_second / 1e6


def expected_seconds(
    cost: BackendCost, link: LinkFigures, coordinates: int, runs: float = 1
) -> float:
    """The model's seconds for ``runs`` runs of a circuit over ``coordinates`` in all."""
    return runs * cost.trip_seconds(link) + coordinates * cost.seconds_per_coordinate(link)


def production_costs(
    backend: str, link: LinkFigures, security: str = DEFAULT_SECURITY
) -> tuple[float, float]:
    """Mode preprocessed: (F, c) of a production run of n samples on ``backend`` at
    ``security``, modelled as F + c n seconds: F its round trips (its circuit's and
    CALLS_PER_RUN), c a sample's bytes and CPU."""
    cost = cost_tables(security).production[backend]
    per_sample = cost.seconds_per_coordinate(link)
    return cost.trip_seconds(link) + CALLS_PER_RUN * link.rtt_seconds, per_sample


def amortised_run(fixed_seconds: float, seconds_per_sample: float, cap: int) -> int:
    """The fewest samples whose run spends at most RUN_OVERHEAD_SHARE of its time on its fixed
    cost (its round trips), at most ``cap``."""
    if seconds_per_sample <= 0:
        return cap
    n = fixed_seconds * (1 - RUN_OVERHEAD_SHARE) / RUN_OVERHEAD_SHARE / seconds_per_sample
    return min(cap, max(1, math.ceil(n)))


@dataclass(frozen=True)
class BackendChoice:
    """The backend a plan runs, why, and (auto) the figures it follows from."""

    backend: str
    reason: str
    link: LinkFigures | None = None
    coordinates: int = 0
    expected: dict[str, float] | None = None  # candidate_label -> expected seconds a round
    run_samples: dict[str, int] | None = None  # preprocessed: backend -> production run size
    trial_depth: int | None = None  # gmw in mode spgc: the trial depth chosen with it
    security: str = DEFAULT_SECURITY  # whose costs it chose by (cost_tables)

    @property
    def automatic(self) -> bool:
        return self.link is not None

    @property
    def label(self) -> str:
        return candidate_label((self.backend, self.trial_depth))

    def log_line(self) -> str:
        """H1's one line: the figures, each backend's expected time, the choice and why."""
        if self.link is None:
            return f"backend {self.backend}: {self.reason}"
        times = ", ".join(f"{b} {s:.3f} s" for b, s in (self.expected or {}).items())
        runs = ""
        if self.run_samples:
            runs = f"; production runs of {self.run_samples[self.backend]:,} samples"
        level = "" if self.security == DEFAULT_SECURITY else f" (security {self.security})"
        return (
            f"backend auto{level}: {self.link.describe()}, d {self.coordinates:,}: expected "
            f"{times} a round; chose {self.label} ({self.reason}){runs}"
        )

    def summary(self) -> dict[str, Any]:
        """For the run summary."""
        out: dict[str, Any] = {"backend": self.backend, "reason": self.reason}
        if self.link is not None:
            out |= {
                "rtt_ms": 1000 * self.link.rtt_seconds,
                "mbit_per_s": self.link.mbit,
                "coordinates": self.coordinates,
                "expected_round_seconds": dict(self.expected or {}),
                "costs_of": self.security,  # the engines whose costs it chose by
            }
        if self.run_samples:
            out["production_run_samples"] = self.run_samples[self.backend]
        if self.trial_depth is not None:
            out["trial_depth"] = self.trial_depth
        return out


def _dominant_term(
    cost: BackendCost, link: LinkFigures, coordinates: int, runs: float, calls: int = 0
) -> str:
    """The largest of the expected time's terms, in words (``calls``: round trips a run has
    besides its circuit's)."""
    growing = coordinates * cost.round_trips_per_coordinate
    round_trips = runs * (cost.round_trips + calls) + growing
    trips = runs * (cost.trip_seconds(link) + calls * link.rtt_seconds) + (
        growing * cost.trip_share * link.rtt_seconds
    )
    wire = coordinates * cost.bytes_per_coordinate / link.bytes_per_second
    cpu = coordinates * cost.cpu_seconds_per_coordinate
    return max(
        (trips, f"{round_trips:.3g} round trips {trips:.3f} s"),
        (wire, f"{cost.bytes_per_coordinate:,.0f} B per coordinate on the wire {wire:.3f} s"),
        (cpu, f"compute {cpu:.3f} s"),
    )[1]


def choose_backend(
    requested: str,
    mode: str,
    coordinates: int,
    link: LinkFigures | None,
    security: str = DEFAULT_SECURITY,
) -> BackendChoice:
    """The plan's backend. ``requested``: the config's ``backend``; an explicit gc or gmw wins
    (``link`` unused); ``auto`` takes the candidate (:func:`candidates`) with the least expected
    round time on ``link`` for ``coordinates`` (a tie: the first), by the costs of the engines
    at the plan's ``security`` (:func:`cost_tables`: under malicious, the authenticated ones).

    Mode spgc: one round circuit (:data:`ROUND_COSTS`, gmw per depth :data:`GMW_DEPTH_COSTS`).
    Mode preprocessed: a round's noise comes from production runs (:data:`NOISE_COSTS`) of
    :func:`amortised_run` samples (at most MAX_RUN_ROUNDS rounds' worth), so a round carries
    coordinates / run of a run's round trips, plus the online exchange (a round trip and a ring
    element each way per coordinate, the same on either backend)."""
    if requested != AUTO:
        if requested not in BACKEND_NAMES:
            raise ValueError(f"backend must be one of {', '.join(BACKEND_NAMES)} or auto")
        return BackendChoice(requested, "set in the plan")
    if mode not in AUTO_MODES:
        raise ValueError(f"backend auto chooses in modes {', '.join(AUTO_MODES)}, not {mode}")
    if link is None:
        raise ValueError("backend auto needs the link's measured figures")
    if coordinates < 1:
        raise ValueError(f"backend auto needs the plan's coordinates (>= 1), got {coordinates}")
    round_costs, depth_costs, noise_costs = cost_tables(security)
    expected: dict[str, float] = {}
    run_samples: dict[str, int] = {}
    terms: dict[str, str] = {}
    options = candidates(mode, security)
    for backend, depth in options:
        label = candidate_label((backend, depth))
        if mode == "preprocessed":
            cost = noise_costs[backend]
            fixed, per_sample = production_costs(backend, link, security)
            run = amortised_run(fixed, per_sample, MAX_RUN_ROUNDS * coordinates)
            run_samples[backend] = run
            runs_per_round = coordinates / run
            online = link.rtt_seconds + (
                coordinates * ONLINE_BYTES_PER_COORDINATE / link.bytes_per_second
            )
            # a round's share of the runs that make its noise: their round trips, its samples
            expected[label] = online + runs_per_round * fixed + coordinates * per_sample
            terms[label] = _dominant_term(cost, link, coordinates, runs_per_round, CALLS_PER_RUN)
        else:
            cost = round_costs[backend] if depth is None else depth_costs[depth]
            expected[label] = expected_seconds(cost, link, coordinates)
            terms[label] = _dominant_term(cost, link, coordinates, 1)
    best = min(options, key=lambda c: expected[candidate_label(c)])
    best_label = candidate_label(best)
    others = "; ".join(f"{label}'s: {terms[label]}" for label in terms if label != best_label)
    largest = terms[best_label]
    reason = f"least expected round time; {best_label}'s largest cost: {largest}; {others}"
    return BackendChoice(
        best[0],
        reason,
        link,
        coordinates,
        expected,
        run_samples if mode == "preprocessed" else None,
        best[1],
        security,
    )


#: Mode preprocessed: a production run makes at most this many rounds' noise (the pool's
#: pool_block caps it further at H1).
MAX_RUN_ROUNDS = 64

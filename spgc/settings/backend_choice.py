"""``backend: auto``: the backend (gc or gmw) with the least expected round time on the link
H1 measured to H2, for the plan's coordinates; in mode preprocessed also the production run size.

One job, pure functions: H1 calls :func:`choose_backend` on its measured :class:`LinkFigures`
and sends the figures with its choice in the Handshake; H2 calls it again on the same figures
and refuses a plan whose backend does not follow from them (both get the same answer: the same
floats through the same arithmetic).

The model of one round's circuit on a backend (or, in mode preprocessed, of making one round's
noise shares)::

    seconds = round_trips * rtt + coordinates * (bytes_per_coordinate / throughput
                                                 + cpu_seconds_per_coordinate)

with the per-coordinate figures of :data:`ROUND_COSTS` and :data:`NOISE_COSTS`, measured by the
engine's own counters (see :data:`COSTS_COMMAND`; tests/app/test_backend_costs.py measures
the bytes and round trips again and fails when the table is stale). The CPU figures are this
project's 2-core development machine's, shared with other work when taken: they rank the
backends' compute, they do not predict another machine's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from spgc.protocol.modes import BACKEND_NAMES

__all__ = [
    "AUTO",
    "AUTO_MODES",
    "CALLS_PER_RUN",
    "COSTS_COMMAND",
    "MAX_RUN_ROUNDS",
    "NOISE_COSTS",
    "ROUND_COSTS",
    "RUN_OVERHEAD_SHARE",
    "BackendChoice",
    "BackendCost",
    "LinkFigures",
    "amortised_run",
    "choose_backend",
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
    "--coordinates 2000 --backend gc|gmw --json"
)

#: A production run is made long enough that its round trips are at most this share of its
#: time (servers/pool_sync.RunSizer sizes runs by the same rule from measured runs).
RUN_OVERHEAD_SHARE = 0.1
#: Calls from H1 to H2 around each production run (its block's announcement and its end): round
#: trips a run has besides its circuit's.
CALLS_PER_RUN = 2


@dataclass(frozen=True)
class BackendCost:
    """What one run of a circuit costs on a backend: its round trips (per run, whatever its
    size), and per coordinate (or noise sample) its bytes between the servers and the CPU
    seconds of the two parties running side by side."""

    round_trips: float
    bytes_per_coordinate: float
    cpu_seconds_per_coordinate: float


#: Mode spgc's round circuit (the sampler's stages and the noisy sum) per backend: round trips,
#: bytes per coordinate, CPU seconds per coordinate. gmw's round trips are the engine's count
#: (``round_trips``); gc's are not counted by the engine: two per sampler stage (the stage's
#: run and the evaluator's OT; ``rounds`` = 3 stages at d = 28,938).
ROUND_COSTS: dict[str, BackendCost] = {
    "gc": BackendCost(6, 20429.2, 24.2e-6),
    "gmw": BackendCost(30, 1082.9, 64.3e-6),
}

#: Mode preprocessed's production run (the noise-share circuit) per backend, per noise sample.
#: bench comm counts no round trips for it: a run has the round circuit's sampler stages, so the
#: round circuit's counts stand in for them.
NOISE_COSTS: dict[str, BackendCost] = {
    "gc": BackendCost(6, 19740.9, 22.7e-6),
    "gmw": BackendCost(30, 1022.4, 60.6e-6),
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
    per_coordinate = cost.bytes_per_coordinate / link.bytes_per_second
    return runs * cost.round_trips * link.rtt_seconds + coordinates * (
        per_coordinate + cost.cpu_seconds_per_coordinate
    )


def production_costs(backend: str, link: LinkFigures) -> tuple[float, float]:
    """Mode preprocessed: (F, c) of a production run of n samples on ``backend``, modelled as
    F + c n seconds: F its round trips (its circuit's and CALLS_PER_RUN), c a sample's bytes
    and CPU."""
    cost = NOISE_COSTS[backend]
    per_sample = cost.bytes_per_coordinate / link.bytes_per_second + cost.cpu_seconds_per_coordinate
    return (cost.round_trips + CALLS_PER_RUN) * link.rtt_seconds, per_sample


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
    expected: dict[str, float] | None = None  # backend -> expected seconds a round
    run_samples: dict[str, int] | None = None  # preprocessed: backend -> production run size

    @property
    def automatic(self) -> bool:
        return self.link is not None

    def log_line(self) -> str:
        """H1's one line: the figures, each backend's expected time, the choice and why."""
        if self.link is None:
            return f"backend {self.backend}: {self.reason}"
        times = ", ".join(f"{b} {s:.3f} s" for b, s in (self.expected or {}).items())
        runs = ""
        if self.run_samples:
            runs = f"; production runs of {self.run_samples[self.backend]:,} samples"
        return (
            f"backend auto: {self.link.describe()}, d {self.coordinates:,}: expected {times} a "
            f"round; chose {self.backend} ({self.reason}){runs}"
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
            }
        if self.run_samples:
            out["production_run_samples"] = self.run_samples[self.backend]
        return out


def _dominant_term(
    cost: BackendCost, link: LinkFigures, coordinates: int, runs: float, calls: int = 0
) -> str:
    """The largest of the expected time's terms, in words (``calls``: round trips a run has
    besides its circuit's)."""
    round_trips = runs * (cost.round_trips + calls)
    trips = round_trips * link.rtt_seconds
    wire = coordinates * cost.bytes_per_coordinate / link.bytes_per_second
    cpu = coordinates * cost.cpu_seconds_per_coordinate
    return max(
        (trips, f"{round_trips:.3g} round trips {trips:.3f} s"),
        (wire, f"{cost.bytes_per_coordinate:,.0f} B per coordinate on the wire {wire:.3f} s"),
        (cpu, f"compute {cpu:.3f} s"),
    )[1]


def choose_backend(
    requested: str, mode: str, coordinates: int, link: LinkFigures | None
) -> BackendChoice:
    """The plan's backend. ``requested``: the config's ``backend``; an explicit gc or gmw wins
    (``link`` unused); ``auto`` takes the least expected round time on ``link`` for
    ``coordinates`` (a tie: the first of BACKEND_NAMES).

    Mode spgc: one round circuit (:data:`ROUND_COSTS`). Mode preprocessed: a round's noise comes
    from production runs (:data:`NOISE_COSTS`) of :func:`amortised_run` samples (at most
    MAX_RUN_ROUNDS rounds' worth), so a round carries coordinates / run of a run's round trips,
    plus the online exchange (a round trip and a ring element each way per coordinate, the same
    on either backend)."""
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
    expected: dict[str, float] = {}
    run_samples: dict[str, int] = {}
    terms: dict[str, str] = {}
    for backend in BACKEND_NAMES:
        if mode == "preprocessed":
            cost = NOISE_COSTS[backend]
            fixed, per_sample = production_costs(backend, link)
            run = amortised_run(fixed, per_sample, MAX_RUN_ROUNDS * coordinates)
            run_samples[backend] = run
            runs_per_round = coordinates / run
            online = link.rtt_seconds + (
                coordinates * ONLINE_BYTES_PER_COORDINATE / link.bytes_per_second
            )
            # a round's share of the runs that make its noise: their round trips, its samples
            expected[backend] = online + runs_per_round * fixed + coordinates * per_sample
            terms[backend] = _dominant_term(cost, link, coordinates, runs_per_round, CALLS_PER_RUN)
        else:
            cost = ROUND_COSTS[backend]
            expected[backend] = expected_seconds(cost, link, coordinates)
            terms[backend] = _dominant_term(cost, link, coordinates, 1)
    best = min(BACKEND_NAMES, key=lambda b: expected[b])
    others = "; ".join(f"{b}'s: {terms[b]}" for b in BACKEND_NAMES if b != best)
    reason = f"least expected round time; {best}'s largest cost: {terms[best]}; {others}"
    return BackendChoice(
        best, reason, link, coordinates, expected, run_samples if mode == "preprocessed" else None
    )


#: Mode preprocessed: a production run makes at most this many rounds' noise (the pool's
#: pool_block caps it further at H1).
MAX_RUN_ROUNDS = 64

"""One server's side of an SPGC batch over the garbled-circuit data link.

H1 (the garbler) holds A1, H2 (the evaluator) A2, both in Z_{2^L}, one value per coordinate. In
``spgc`` mode the two run, per coordinate, the sampler's trials until one is accepted and then
reveal Y = smod(A1 - A2, 2^L) + z; in ``only-mpc`` mode they reveal S = smod(A1 - A2, 2^L).

Randomness: every random bit the sampler reads is r1 xor r2; each server expands only its own
32-byte round seed, outside the circuit (:func:`spgc.privacy.noise.expand_seed` gives the layout).
Given
both seeds the noise of a round is reproducible (:func:`spgc.privacy.noise.sample_noise_plain`).

Rounds (adaptive rejection): round r runs ``schedule[r]`` trials for each coordinate that has no
accepted trial yet; both servers see the accept bits (which depend on randomness only, never on
the data, and are independent of the accepted values), pick the first accepted trial of each
coordinate, and carry its kept noise labels into the reconstruction circuit for those
coordinates. On gmw the reconstruction and the addition ride in the trial run instead, and a
coordinate's Y is opened from masked sums in one exchange (:func:`_aggregate_fused`).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

import garbled_core
from garbled_core import ProofResult
from garbled_core.discrete_gaussian import (
    DEFAULT_DISTANCE_LOG2,
    DEFAULT_SCHEDULE,
    MAX_TRIAL_DEPTH,
    UNBOUNDED_TRIAL_DEPTH,
    SamplerParams,
    build_trial_circuit,
    derive_params,
)
from spgc.common.lanes import lane_ranges, run_lanes
from spgc.privacy.noise import (
    SPARE_GROUP,
    SPARES_EVERY,
    RoundResult,
    SamplerStats,
    TrialSegment,
    check_seed,
    expand_segments,
    sample_noise_plain,
    sampling_rounds,
    segment_instances,
    segments_layout,
)
from spgc.privacy.seed_proof import SeedBinding
from spgc.protocol.modes import (
    BACKENDS,
    DEFAULT_SECURITY,
    MALICIOUS_VARIANTS,
    MODES,
    SECURITY_NAMES,
)
from spgc.protocol.sharing import ring_mask
from spgc.servers.seed_binding import bound_random_ports, prove_committed_seed
from spgc.servers.spgc_circuit import (
    check_ring_bits,
    decode_signed,
    field_circuit_inputs,
    fused_trial_circuit,
    noise_share_circuit,
    noisy_sum_circuit,
    output_width,
    reconstruct_circuit,
)

__all__ = [
    "BACKENDS",
    "CIRCUIT_MODES",
    "ROLES",
    "PartyLink",
    "aggregate_plain",
    "as_party_link",
    "claim_seed",
    "counter_delta",
    "merge_part_infos",
    "noise_shares_range",
    "range_batches",
    "resolve_lanes",
    "run_aggregate",
    "run_sampler",
    "set_seed_journal",
]

ROLES = ("garbler", "evaluator")
# The training modes whose round runs a circuit per coordinate here (the modes table's).
CIRCUIT_MODES = tuple(
    m.name
    for m in MODES.values()
    if m.trainable and m.circuit in ("reconstruct", "reconstruct+noise")
)
_PORT_PREFIX = {"garbler": "g", "evaluator": "e"}
# Mode preprocessed's noise production builds its circuits with the fewest AND gates on every
# backend, gmw included (the MNIST trial: 666 AND gates in 161 layers, against 1,487 in 28):
# production runs beside the rounds in runs sized to amortise their round trips, so what it
# spends is CPU and bytes, which the rounds share; its layers only lengthen a run, which the
# pool's lead covers (servers.pool_sync.RunSizer).
PRODUCTION_ARITHMETIC = "ripple"
# Coordinates a lane runs at once (range_batches): the engine keeps every pending trial's noise
# labels, about 16 bytes per noise bit per trial, so a batch of 2^20 needs some hundreds of MB.
RANGE_BATCH = 1 << 20


# ------------------------------------------------------------------------------ randomness


_used_seeds: set[bytes] = set()
_used_seeds_lock = threading.Lock()
_seed_journal: Path | None = None


def set_seed_journal(path: Path | None) -> None:
    """Keep the digests of used seeds in ``path`` too (appended, fsynced), and refuse every seed
    recorded there: a restarted server (or a VM restored from a snapshot, whose RNG may replay)
    then cannot reuse a seed of an earlier process. None: this process's memory only."""
    global _seed_journal
    with _used_seeds_lock:
        _seed_journal = path
        if path is not None and path.exists():
            data = path.read_bytes()
            _used_seeds.update(data[i : i + 32] for i in range(0, len(data) - 31, 32))


def claim_seed(seed: bytes) -> None:
    """Refuses a round seed already used for noise (a reused seed repeats the noise, and
    differences of two releases would cancel it). Only digests are kept."""
    digest = hashlib.sha256(b"spgc-round-seed" + seed).digest()
    with _used_seeds_lock:
        if digest in _used_seeds:
            raise ValueError("this round seed was used before: draw a fresh one for every round")
        if _seed_journal is not None:
            fd = os.open(_seed_journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
            try:
                os.write(fd, digest)
                os.fsync(fd)
            finally:
                os.close(fd)
        _used_seeds.add(digest)


# ------------------------------------------------------------------------------ the link


@dataclass
class PartyLink:
    """One server's end of the garbled-circuit link: the channel (for byte counters) and the
    engine session (garbler or evaluator) that keeps its setup and kept labels across runs."""

    role: str
    channel: Any
    session: Any
    # "gc" or "gmw" (spgc.protocol.modes.BACKENDS): which circuits the link's runs use (arithmetic).
    backend: str = "gc"
    # Lanes 1.. of the data link (spgc.common.lanes), each its own connection and session; this link
    # is lane 0. run_aggregate runs a round on every lane, everything else on lane 0.
    extra_lanes: list[PartyLink] = field(default_factory=list)
    # Remote lanes (servers.ray_workers: worker pairs on the organisations' Ray clusters):
    # when set, run_aggregate runs a round on them instead, and this link carries the rest.
    remote_lanes: list[Any] = field(default_factory=list)
    # gmw, mode spgc: the AND layers the fused trial run keeps within (the plan's trial_depth);
    # None: the default for the session (trial_depth).
    max_trial_depth: int | None = None
    # Mode preprocessed: the data link's own connection for the rounds' exchange (a raw
    # channel), so that noise production on the lanes runs beside the rounds without
    # interleaving bytes with them; None: the exchange uses this link's channel.
    exchange_channel: Any = None

    def lanes(self) -> list[Any]:
        """The lanes a round or a noise block runs on: the remote ones if any, else this link's
        own, lane 0 (this one, without its extra lanes) first. Each has ``aggregate_range``,
        ``noise_shares_range`` and ``interrupt``."""
        if self.remote_lanes:
            return list(self.remote_lanes)
        own = PartyLink(self.role, self.channel, self.session, self.backend)
        own.max_trial_depth = self.max_trial_depth
        return [own, *self.extra_lanes]

    def aggregate_range(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        """This link's part of a round (:func:`aggregate_range`)."""
        return aggregate_range(link=self, **kwargs)

    def noise_shares_range(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        """This link's part of a block of preprocessed noise shares (:func:`noise_shares_range`)."""
        return noise_shares_range(link=self, **kwargs)

    @property
    def arithmetic(self) -> str:
        """How the link's circuits are built: ``depth`` for gmw, which pays a round trip per
        AND layer (at most 48 layers for about 1.3 to 1.5x the AND gates), ``ripple`` for gc,
        which pays per AND gate, and for authenticated GMW (``security: malicious``), which
        pays per AND gate most of all (about 80 bytes: docs/MALICIOUS.md), so takes 2.2 to 2.4x
        fewer AND gates over about 6x the layers. All compute the same function: the same
        outputs."""
        return "depth" if self.backend == "gmw" and not self.authenticated else "ripple"

    @property
    def authenticated(self) -> bool:
        """Whether the session is an authenticated backend (``security: malicious``):
        authenticated GMW or authenticated garbling."""
        return isinstance(self.session, garbled_core.AuthSession)

    @property
    def trial_depth(self) -> int:
        """The AND layers the fused trial run of mode spgc keeps within (gmw): the plan's
        ``trial_depth`` when it sets one, else 28 on GMW (round trips), none on authenticated
        GMW (bytes: the fewest AND gates, about 150 layers; see
        spgc_circuit.fused_trial_description)."""
        if self.max_trial_depth is not None:
            return self.max_trial_depth
        return UNBOUNDED_TRIAL_DEPTH if self.authenticated else MAX_TRIAL_DEPTH

    @property
    def security(self) -> str:
        """The session's level: ``malicious`` on an authenticated backend."""
        return "malicious" if self.authenticated else DEFAULT_SECURITY

    @property
    def fused_rounds(self) -> bool:
        """Whether mode spgc's round runs as one fused trial run and an exchange
        (:func:`fuses_rounds`)."""
        return fuses_rounds(self.backend, self.security)

    @property
    def spares_every(self) -> int:
        """The sampler's spare trials on this link (:func:`sampler_spares`)."""
        return sampler_spares(self.backend, self.security)

    @property
    def range_align(self) -> int:
        """Where ranges of a batch split on this link (:func:`range_align`)."""
        return range_align(self.backend, self.security)

    def interrupt(self) -> None:
        """Make a run blocked on this link fail now (another lane failed)."""
        self.channel.interrupt()

    @classmethod
    def open(
        cls,
        role: str,
        channel: Any,
        chunk: int | None = None,
        scheme: str = "threehalves",
        ot_k: int = garbled_core.DEFAULT_OT_K,
        backend: str = "gc",
        security: str = DEFAULT_SECURITY,
        trial_depth: int | None = None,
    ) -> PartyLink:
        """Wrap ``channel`` in a new session of ``role`` (setup happens on the first run).
        ``backend`` ``gc``: a garbler or evaluator session; ``scheme`` garbles AND gates
        (``threehalves`` or ``halfgates``), ``ot_k`` picks the OT extension (SoftSpoken k, 0 for
        IKNP). ``gmw``: a GMW party whose Beaver triples come from silent OT (Ferret), which
        runs the same circuits and returns the same outputs. With ``security`` ``malicious``
        the engine's authenticated party of the backend instead, authenticated GMW or
        authenticated garbling (every opening and garbled row MAC-checked before an output is
        opened: garbled_core.PeerDeviated when the peer deviated). ``trial_depth``
        (gmw): the plan's bound on the fused trial run's AND layers (None: the default, see
        :attr:`trial_depth`). Both sides must choose the same: the engine's hello refuses a
        mismatch of backend or security, the plan's comparison one of trial_depth."""
        role = _check_role(role)
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {tuple(BACKENDS)}, got {backend!r}")
        if security not in SECURITY_NAMES:
            raise ValueError(f"security must be one of {SECURITY_NAMES}, got {security!r}")
        if security == "malicious" and all(b != backend for b, _ in MALICIOUS_VARIANTS):
            raise ValueError(f"security: malicious: backend {backend} has no malicious variant")
        if backend == "gmw":
            session = (
                garbled_core.AuthGmwParty(channel, role)
                if security == "malicious"
                else garbled_core.GmwParty(channel, role, ot="silent")
            )
            link = cls(role, channel, session, "gmw")
            link.max_trial_depth = trial_depth
            return link
        if security == "malicious":
            return cls(role, channel, garbled_core.AuthGarbleParty(channel, role))
        party = garbled_core.Garbler if role == "garbler" else garbled_core.Evaluator
        kwargs: dict[str, Any] = {"scheme": scheme, "ot_k": ot_k}
        if chunk is not None:
            kwargs["chunk"] = chunk
        return cls(role, channel, party(channel, **kwargs))

    def evidence_digest(self) -> str | None:
        """The SHA-256 (hex) of everything the peer sent in the last engine run on this link,
        where the engine keeps it (the authenticated GMW party's ``evidence_digest``); with
        extra lanes, the SHA-256 of their digests in lane order (space-separated). None where
        a session keeps none (semi-honest sessions, remote lanes)."""
        if self.remote_lanes:
            return None
        sessions = [self.session, *(lane.session for lane in self.extra_lanes)]
        digests = [getattr(session, "evidence_digest", None) for session in sessions]
        if not digests or any(not isinstance(d, str) for d in digests):
            return None
        if len(digests) == 1:
            return digests[0]
        return hashlib.sha256(" ".join(digests).encode()).hexdigest()

    def counters(self) -> dict[str, dict[str, int]]:
        """Bytes per engine phase and direction on this link and every lane it holds (extra
        lanes, Ray worker pairs): what crossed between the two servers."""
        lanes = (*self.extra_lanes, *self.remote_lanes)
        return _add_phases([self.channel.counters(), *(lane.counters() for lane in lanes)])


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}, got {role!r}")
    return role


def as_party_link(role: str, channel_session: Any) -> PartyLink:
    """``channel_session`` as a :class:`PartyLink` of ``role``: an open link is checked, a bare
    garbled_core Channel gets a new session."""
    if isinstance(channel_session, PartyLink):
        if channel_session.role != role:
            raise ValueError(f"the link is the {channel_session.role}'s, not the {role}'s")
        return channel_session
    return PartyLink.open(role, channel_session)


def counter_delta(
    before: dict[str, dict[str, int]], after: dict[str, dict[str, int]]
) -> dict[str, Any]:
    """Bytes per engine phase (and totals) between two :meth:`PartyLink.counters` readings."""
    phases = {
        p: {d: after[p][d] - before.get(p, {}).get(d, 0) for d in ("sent", "received")}
        for p in after
    }
    return {
        "phases": phases,
        "sent": sum(v["sent"] for v in phases.values()),
        "received": sum(v["received"] for v in phases.values()),
    }


# ------------------------------------------------------------------------------ rounds


def _check_shares(shares: np.ndarray, ring_bits: int) -> np.ndarray:
    if not isinstance(shares, np.ndarray) or shares.dtype != np.uint64 or shares.ndim != 1:
        raise TypeError("shares must be a 1-D numpy uint64 array (one value per coordinate)")
    if ring_bits < 64 and len(shares) and int(shares.max()) >> ring_bits:
        raise ValueError(
            f"a share is {int(shares.max())}, outside the ring Z_2^{ring_bits} "
            f"(ring_bits={ring_bits})"
        )
    return np.ascontiguousarray(shares)


def _check_mode(mode: str) -> str:
    if mode not in CIRCUIT_MODES:
        raise ValueError(f"mode must be one of {CIRCUIT_MODES}, got {mode!r}")
    return mode


def run_sampler(
    role: str,
    link: PartyLink,
    n: int,
    seed: bytes,
    params: SamplerParams,
    schedule: Sequence[int] = DEFAULT_SCHEDULE,
    on_round: Callable[[RoundResult], None] | None = None,
    first_coordinate: int = 0,
    arithmetic: str | None = None,
    commitments: tuple[ProofResult, ProofResult] | None = None,
) -> SamplerStats:
    """Run the sampler's rounds for ``n`` coordinates (indices ``first_coordinate`` on, which
    address their randomness) on the link; ``on_round`` receives each round's accepted
    coordinates (0-based in this batch) with their kept noise (a ``Kept``) and trial indices.
    ``arithmetic``: how the trial circuit is built (default the link's). ``commitments``: both
    servers' proved seeds (:func:`spgc.servers.seed_binding.prove_committed_seed`, security:
    malicious): each stage's random ports are then the proved blocks of the two seed streams
    (:func:`spgc.servers.seed_binding.bound_random_ports`), never bits a server enters."""
    role = _check_role(role)
    seed = check_seed(seed)
    circuit = build_trial_circuit(
        params, arithmetic=arithmetic or link.arithmetic, bound=commitments is not None
    )
    prefix = _PORT_PREFIX[role]
    stats = SamplerStats()

    def run_stage(segments: list[TrialSegment]) -> tuple[np.ndarray, Any]:
        m = segment_instances(segments)
        if commitments is None:
            inputs = expand_segments(seed, segments, params.port_widths, prefix, first_coordinate)
            out = link.session.run(circuit, inputs, {}, m)
        else:
            layout = segments_layout(segments, len(params.port_widths), first_coordinate)
            carried = bound_random_ports(
                link.session, role, commitments, layout, params.port_widths
            )
            out = link.session.run(circuit, {}, carried, m)
        return out["accept"], out["z"]

    rounds = run_sampler_stages(link, n, schedule, run_stage, stats, first_coordinate)
    for result in rounds:
        if on_round is not None:
            on_round(result)
    return stats


def run_sampler_stages(
    link: PartyLink,
    n: int,
    schedule: Sequence[int],
    run_stage: Callable[[list[TrialSegment]], tuple[np.ndarray, Any]],
    stats: SamplerStats,
    first_coordinate: int = 0,
) -> Iterator[RoundResult]:
    """The sampler's rounds on ``link``'s backend (its spare trials): ``run_stage`` runs one
    stage's trials (:func:`spgc.privacy.noise.sampling_rounds`)."""
    return sampling_rounds(
        n, schedule, run_stage, stats, spares_every=link.spares_every,
        first_coordinate=first_coordinate,
    )  # fmt: skip


def resolve_lanes(role: str, channel_session: Any) -> list[Any]:
    """The lanes a batch runs on: a list of links or remote lanes as given (bare channels get a
    session each), a single remote lane, or a :class:`PartyLink`'s :meth:`PartyLink.lanes`."""
    if isinstance(channel_session, (list, tuple)):
        return [
            cs if hasattr(cs, "aggregate_range") else as_party_link(role, cs)
            for cs in channel_session
        ]
    if hasattr(channel_session, "aggregate_range") and not isinstance(channel_session, PartyLink):
        return [channel_session]
    return as_party_link(role, channel_session).lanes()


def _add_phases(readings: Sequence[Any]) -> dict[str, dict[str, int]]:
    """Several ``{phase: {"sent": n, "received": n}}`` byte readings added up, phase by phase."""
    total: dict[str, dict[str, int]] = {}
    for reading in readings:
        for phase, v in reading.items():
            mine = total.setdefault(phase, {"sent": 0, "received": 0})
            for direction, count in v.items():
                mine[direction] = mine.get(direction, 0) + count
    return total


def merge_part_infos(infos: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The info of a batch run in parts (lanes, or a lane's batches) added up: sampler rounds
    (the most any part ran) and trials, per-round trials and AND gates where the parts count
    them, the Ray workers' peak RSS where they report it, and the parts' byte ``counters``
    (each a :func:`counter_delta`) as phases and totals."""
    merged: dict[str, Any] = {
        "rounds": max((i["rounds"] for i in infos), default=0),
        "trials": sum(i["trials"] for i in infos),
    }
    if any("trials_per_round" in i for i in infos):
        per_round = [i.get("trials_per_round", []) for i in infos]
        merged["trials_per_round"] = [
            sum(r[k] for r in per_round if k < len(r)) for k in range(merged["rounds"])
        ]
    if any("and_gates" in i for i in infos):
        merged["and_gates"] = sum(i.get("and_gates", 0) for i in infos)
    trips = [i["round_trips"] for i in infos if "round_trips" in i]
    if trips:  # lanes run side by side: the round waits for the one with the most
        merged["round_trips"] = max(trips)
    rss = [i["peak_rss_mb"] for i in infos if "peak_rss_mb" in i]
    if rss:  # remote lanes (Ray workers) report their process's peak RSS
        merged["worker_rss_mb"] = rss
    deltas = [i["counters"] for i in infos if "counters" in i]
    if deltas:
        merged["phases"] = _add_phases([d["phases"] for d in deltas])
        merged["sent"] = sum(d["sent"] for d in deltas)
        merged["received"] = sum(d["received"] for d in deltas)
    return merged


def run_aggregate(
    role: str,
    channel_session: Any,
    shares: np.ndarray,
    seed: bytes | None,
    sigma_units: float | None,
    ring_bits: int,
    mode: str = "spgc",
    *,
    distance_log2: float = DEFAULT_DISTANCE_LOG2,
    schedule: Sequence[int] = DEFAULT_SCHEDULE,
    output_bits: int | None = None,
    on_stage: Callable[[], None] | None = None,
    field_modulus: int | None = None,
    seed_binding: SeedBinding | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """One server's side of a batch: returns (Y, counters).

    ``role``: "garbler" (H1, passes A1) or "evaluator" (H2, passes A2); ``channel_session``: a
    garbled_core ``Channel`` (a session is opened on it), a :class:`PartyLink`, or a list of
    them: lanes (:mod:`spgc.common.lanes`), lane i running coordinates ``lane_ranges(n, lanes)[i]``
    on its own link and thread (the other server must pass as many); ``shares``: this
    server's sums of shares, numpy uint64 in [0, 2^ring_bits); ``seed``: this server's 32-byte
    round seed (``spgc`` only; never reuse one); ``sigma_units``: noise std in fixed-point
    units. Both servers must pass the same sigma, ring_bits, mode, distance_log2, schedule,
    output_bits and number of coordinates. The released Y is the same for any number of lanes.

    Y is int64 when it fits 64 bits, else an object array of Python ints. The counters hold
    this party's bytes per engine phase over the call (all lanes), totals, rounds and trials.
    ``on_stage`` runs after each of the sampler's stages (fault injection).
    ``field_modulus``: the shares are sums in F_p of verified field shares
    (spgc.protocol.norm_proof),
    reconstructed as A + B mod p by the circuits' ``field=True`` builds; both servers pass
    the same p.
    ``seed_binding`` (mode spgc on an authenticated link, security: malicious): both servers
    prove their round seeds in zero knowledge and the trial runs read the proved streams
    (:mod:`spgc.servers.seed_binding`); both pass one or neither.
    """
    role = _check_role(role)
    mode = _check_mode(mode)
    ring_bits = check_ring_bits(ring_bits)
    if field_modulus is None:
        shares = _check_shares(shares, ring_bits)
    else:
        # One row per coordinate: (low L bits, flag): lanes and batches slice rows.
        low, flag = field_circuit_inputs(shares, field_modulus, ring_bits, role == "garbler")
        shares = np.ascontiguousarray(np.stack([low, flag], axis=1))
    links = resolve_lanes(role, channel_session)
    ranges = lane_ranges(len(shares), len(links), getattr(links[0], "range_align", 1))
    start = time.perf_counter()
    n = len(shares)
    params = width = None
    if mode != "only-mpc":
        if sigma_units is None:
            raise ValueError("spgc mode needs sigma_units")
        seed = check_seed(seed)  # type: ignore[arg-type]
        params = derive_params(sigma_units, distance_log2)
        width = output_width(ring_bits, params.noise_bits, output_bits)
        claim_seed(seed)  # after every check, before the first byte; once for all lanes

    def lane(i: int) -> Callable[[], tuple[np.ndarray, dict[str, Any]]]:
        lo, hi = ranges[i]
        return lambda: links[i].aggregate_range(
            role=role, shares=shares[lo:hi], first_coordinate=lo, seed=seed, params=params,
            width=width, ring_bits=ring_bits, mode=mode, schedule=schedule, on_stage=on_stage,
            field_inputs=field_modulus is not None, seed_binding=seed_binding,
        )  # fmt: skip

    parts = run_lanes(
        [lane(i) for i in range(len(links))], on_failure=lambda i: links[i].interrupt()
    )
    y = np.concatenate([p[0] for p in parts]) if parts else np.zeros(0, dtype=np.int64)
    info: dict[str, Any] = {"mode": mode, "coordinates": n, "lanes": len(links)}
    info.update(merge_part_infos([p[1] for p in parts]))
    info["seconds"] = time.perf_counter() - start
    return y, info


def aggregate_range(
    *,
    role: str,
    link: PartyLink,
    shares: np.ndarray,
    first_coordinate: int,
    seed: bytes | None,
    params: SamplerParams | None,
    width: int | None,
    ring_bits: int,
    mode: str,
    schedule: Sequence[int],
    on_stage: Callable[[], None] | None = None,
    field_inputs: bool = False,
    seed_binding: SeedBinding | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """One lane of :func:`run_aggregate` (checked and seed-claimed there): coordinates
    ``first_coordinate`` on, on one link. Returns (Y of the range, info with the link's byte
    ``counters`` over the call). ``field_inputs``: ``shares`` holds a (low bits, flag) row per
    coordinate (:func:`spgc.servers.spgc_circuit.field_circuit_inputs`)."""
    before = link.counters()
    gmw = hasattr(link.session, "layers_used")  # GMW and the authenticated backends count exchanges
    trips = int(link.channel.round_trips)  # counted by the engine's channel
    parts = []
    for lo, hi in range_batches(len(shares), link.range_align):
        part = _aggregate_on_link(
            role, link, shares[lo:hi], first_coordinate + lo, seed, params, width, ring_bits,
            mode, schedule, on_stage, field_inputs, seed_binding,
        )  # fmt: skip
        parts.append(part)
    if parts:
        y = np.concatenate([p[0] for p in parts])
    else:
        y = np.zeros(0, dtype=np.int64 if width is None or width <= 64 else object)
    info = merge_part_infos([p[1] for p in parts])
    if mode != "only-mpc":  # an empty range still reports its (zero) sampler work
        info.setdefault("trials_per_round", [])
        info.setdefault("and_gates", 0)
    info["counters"] = counter_delta(before, link.counters())
    if gmw:
        info["round_trips"] = int(link.channel.round_trips) - trips
    return y, info


def fuses_rounds(backend: str, security: str = DEFAULT_SECURITY) -> bool:
    """Whether mode spgc's round on ``backend`` at ``security`` is one fused trial run (the
    reconstruction and the noisy sum in every trial instance, spare trials so that one stage
    almost always suffices) and an exchange: where a sampler stage costs round trips more than
    the spares and the fused sums cost bytes. gmw pays a round trip per AND layer, and the
    authenticated backends about 6 per engine run (header, input masks, openings, check,
    outputs); semi-honest garbling streams a run in about 2 and pays per AND gate, so it runs
    the stages and the noisy sum as they are."""
    return backend == "gmw" or security == "malicious"


def sampler_spares(backend: str, security: str = DEFAULT_SECURITY) -> int:
    """The spare trials of the sampler on ``backend`` at ``security`` (spgc.privacy.noise.
    SPARES_EVERY): gmw's wherever rounds are fused (:func:`fuses_rounds`), none elsewhere.
    Both servers and the plaintext reference (:func:`aggregate_plain`) take the same."""
    return SPARES_EVERY["gmw"] if fuses_rounds(backend, security) else SPARES_EVERY[backend]


def range_align(backend: str, security: str = DEFAULT_SECURITY) -> int:
    """Where the ranges of a batch may split (lanes, worker pairs, range batches) so that they
    release what one batch does: multiples of spgc.privacy.noise.SPARE_GROUP where the sampler
    shares spare trials (:func:`sampler_spares`), anywhere else."""
    return SPARE_GROUP if sampler_spares(backend, security) else 1


def range_batches(n: int, align: int = 1) -> list[tuple[int, int]]:
    """A lane's range in batches of at most ``RANGE_BATCH`` coordinates (rounded up to a
    multiple of ``align``, :attr:`PartyLink.range_align`), run one after the other: a worker's
    memory for labels and trials stays bounded whatever d / K (coordinates address their own
    noise, so batching does not change what is released)."""
    step = -(-RANGE_BATCH // align) * align
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _aggregate_on_link(
    role: str,
    link: PartyLink,
    shares: np.ndarray,
    first_coordinate: int,
    seed: bytes | None,
    params: SamplerParams | None,
    width: int | None,
    ring_bits: int,
    mode: str,
    schedule: Sequence[int],
    on_stage: Callable[[], None] | None,
    field_inputs: bool = False,
    seed_binding: SeedBinding | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    n = len(shares)
    my_port = "a1" if role == "garbler" else "a2"
    flag_port = "k1" if role == "garbler" else "k2"

    def inputs(rows: Any) -> dict[str, np.ndarray]:
        if not field_inputs:
            return {my_port: shares[rows]}
        picked = shares[rows]
        return {
            my_port: np.ascontiguousarray(picked[:, 0]),
            flag_port: np.ascontiguousarray(picked[:, 1]),
        }

    info: dict[str, Any] = {"rounds": 0, "trials": 0}
    fused = mode == "spgc" and link.fused_rounds and width is not None and width <= 64
    if fused and n:
        assert params is not None and seed is not None
        args = (role, link, n, inputs, seed, params, width, ring_bits, schedule, on_stage)
        return _aggregate_fused(*args, first_coordinate, field_inputs, seed_binding)
    if seed_binding is not None and n and not fused:  # never a round without its proofs
        raise ValueError(
            f"seed proofs run in mode spgc's fused round, whose outputs fit 64 bits; this round "
            f"is mode {mode} with {width}-bit outputs"
        )
    if mode == "only-mpc":
        circuit = reconstruct_circuit(ring_bits, arithmetic=link.arithmetic, field=field_inputs)
        if n:
            out = link.session.run(circuit, inputs(slice(None)), {}, n)
            return decode_signed({"y": out["s"]}, ring_bits), info
        return np.zeros(0, dtype=np.int64), info
    assert params is not None and width is not None and seed is not None
    add = noisy_sum_circuit(
        ring_bits, params.noise_bits, width, arithmetic=link.arithmetic, field=field_inputs
    )
    y = np.zeros(n, dtype=np.int64) if width <= 64 else np.zeros(n, dtype=object)

    def finish(result: RoundResult) -> None:
        if len(result.coords) == 0:
            return
        carried = {"z": result.noise.select(result.instances)}
        mine = inputs(result.coords)
        out = link.session.run(add, mine, carried, len(result.coords))
        y[result.coords] = decode_signed(out, width)
        if on_stage is not None:
            on_stage()

    stats = SamplerStats()
    if n:
        stats = run_sampler(role, link, n, seed, params, schedule, finish, first_coordinate)
    info.update(rounds=stats.rounds, trials=stats.trials, trials_per_round=stats.per_round)
    trial = build_trial_circuit(params, arithmetic=link.arithmetic)
    info["and_gates"] = stats.trials * trial.and_count + n * add.and_count
    return y, info


def _aggregate_fused(
    role: str,
    link: PartyLink,
    n: int,
    inputs: Callable[[Any], dict[str, np.ndarray]],
    seed: bytes,
    params: SamplerParams,
    width: int,
    ring_bits: int,
    schedule: Sequence[int],
    on_stage: Callable[[], None] | None,
    first_coordinate: int,
    field_inputs: bool,
    seed_binding: SeedBinding | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Mode spgc where rounds are fused (gmw, and the authenticated backends:
    :func:`fuses_rounds`), with the reconstruction and the noisy sum fused into the trial run
    (:func:`spgc.servers.spgc_circuit.fused_trial_circuit`): each trial instance also reveals to
    H2 u_z = z + rz, and stage 0's instance c (c < n) u_s = S_c + rs, rs and rz H1's fresh masks
    (os.urandom, each used in one opening at most). A coordinate that took trial t is released
    by one exchange: H1 sends rs_c + rz_t, H2 u_s_c + u_z_t, and both get Y = S_c + z_t. So a
    round is the trial run's layers, its outputs and that exchange: no noisy-sum run."""
    garbler = role == "garbler"
    bound = seed_binding is not None
    if bound and link.security != "malicious":
        raise ValueError("seed proofs run on authenticated links only (security: malicious)")
    circuit = fused_trial_circuit(
        params, ring_bits, width, field=field_inputs, max_depth=link.trial_depth, bound=bound
    )
    # Both seeds proved before any input enters a run (its commitment, then each run's blocks).
    commitments = prove_committed_seed(link.session, seed_binding, seed) if seed_binding else None
    mask = ring_mask(width)
    nbytes = (width + 7) // 8
    prefix = _PORT_PREFIX[role]
    own_s = np.zeros(n, dtype=np.uint64)  # H1: rs of each coordinate; H2: u_s
    own_z: list[np.ndarray] = []  # per stage, per instance: H1: rz; H2: u_z
    y = np.zeros(n, dtype=np.int64)

    def fresh(m: int) -> np.ndarray:
        return np.frombuffer(os.urandom(8 * m), dtype="<u8").astype(np.uint64) & mask

    def run_stage(segments: list[TrialSegment]) -> tuple[np.ndarray, int]:
        carried: dict[str, Any] = {}
        if commitments is None:
            ports = expand_segments(seed, segments, params.port_widths, prefix, first_coordinate)
        else:
            layout = segments_layout(segments, len(params.port_widths), first_coordinate)
            ports = {}
            carried = bound_random_ports(
                link.session, role, commitments, layout, params.port_widths
            )
        m = segment_instances(segments)
        first = not own_z
        for port, values in inputs(slice(None)).items():  # S's shares at instances 0..n-1
            padded = np.zeros(m, dtype=np.uint64)
            if first:
                padded[:n] = values
            ports[port] = padded
        if garbler:
            ports["rs"], ports["rz"] = fresh(m), fresh(m)
        out = link.session.run(circuit, ports, carried, m)
        mine_s, mine_z = (ports["rs"], ports["rz"]) if garbler else (out["u_s"], out["u_z"])
        if first:
            own_s[:] = np.asarray(mine_s, dtype=np.uint64)[:n]
        own_z.append(np.asarray(mine_z, dtype=np.uint64))
        return out["accept"], len(own_z) - 1

    def finish(result: RoundResult) -> None:
        coords, stage = result.coords, int(result.noise)
        if len(coords) == 0:
            return
        mine = (own_s[coords] + own_z[stage][result.instances.astype(np.int64)]) & mask
        own_s[coords] = 0  # each mask opens one value only
        link.channel.phase = "outputs"
        link.channel.send(mine.astype("<u8").view(np.uint8).reshape(-1, 8)[:, :nbytes].tobytes())
        raw = np.frombuffer(link.channel.recv(nbytes * len(coords)), dtype=np.uint8)
        wide = np.zeros((len(coords), 8), dtype=np.uint8)
        wide[:, :nbytes] = raw.reshape(-1, nbytes)
        theirs = wide.view("<u8").reshape(-1).astype(np.uint64)
        released = (theirs - mine if garbler else mine - theirs) & mask  # wraps on purpose
        y[coords] = decode_signed({"y": released}, width)
        if on_stage is not None:
            on_stage()

    stats = SamplerStats()
    rounds = run_sampler_stages(link, n, schedule, run_stage, stats, first_coordinate)
    for result in rounds:
        finish(result)
    info: dict[str, Any] = {"rounds": stats.rounds, "trials": stats.trials}
    info["trials_per_round"] = stats.per_round
    info["and_gates"] = stats.trials * circuit.and_count
    return y, info


def noise_shares_range(
    *,
    role: str,
    link: PartyLink,
    n: int,
    first_coordinate: int,
    seed: bytes,
    params: SamplerParams,
    ring_bits: int,
    schedule: Sequence[int],
    field_modulus: int | None = None,
    seed_binding: SeedBinding | None = None,
) -> tuple[np.ndarray, dict[str, Any]]:
    """One lane of a block of preprocessed noise (:func:`servers.noise_pool.produce_noise_shares`,
    checked and seed-claimed there): samples ``first_coordinate`` on, as additive shares in
    Z_{2^L}. H1's are -r with r its fresh mask from ``os.urandom``, H2's u = z + r (the circuit
    reveals u to H2 only). ``field_modulus`` p (verified inputs): the same mod p, r uniform in
    [0, p). ``seed_binding`` (security: malicious; both servers pass one or neither): both
    prove their block seeds first, and every trial reads the proved streams. Returns (shares of
    the range, info with the link's ``counters``)."""
    if seed_binding is not None and link.security != "malicious":
        raise ValueError("seed proofs run on authenticated links only (security: malicious)")
    before = link.counters()
    gmw = hasattr(link.session, "layers_used")  # GMW and the authenticated backends count exchanges
    trips = int(link.channel.round_trips)  # counted by the engine's channel
    circuit = noise_share_circuit(
        ring_bits, params.noise_bits, arithmetic=PRODUCTION_ARITHMETIC, field_modulus=field_modulus
    )
    mask = ring_mask(ring_bits)
    shares = np.zeros(n, dtype=np.uint64)

    def finish(result: RoundResult, lo: int) -> None:
        m = len(result.coords)
        if m == 0:
            return
        carried = {"z": result.noise.select(result.instances)}
        where = result.coords + lo
        if link.role == "garbler" and field_modulus is not None:
            p = np.uint64(field_modulus)
            r = garbled_core.field_expand(os.urandom(16), m, field_modulus)  # uniform in [0, p)
            link.session.run(circuit, {"r": r}, carried, m)
            shares[where] = np.where(r == 0, r, p - r)  # -r mod p
        elif link.role == "garbler":
            r = np.frombuffer(os.urandom(8 * m), dtype="<u8").astype(np.uint64) & mask
            link.session.run(circuit, {"r": r}, carried, m)
            shares[where] = (np.uint64(0) - r) & mask  # -r: wraps on purpose
        else:
            out = link.session.run(circuit, {}, carried, m)
            u = np.asarray(out["u"], dtype=np.uint64)
            shares[where] = u if field_modulus is not None else u & mask

    # Both seeds proved before any trial runs, once for the lane's session.
    commitments = (
        prove_committed_seed(link.session, seed_binding, seed) if seed_binding and n else None
    )
    info: dict[str, Any] = {"rounds": 0, "trials": 0}
    for lo, hi in range_batches(n, link.range_align):
        stats = run_sampler(
            role, link, hi - lo, seed, params, schedule,
            lambda result, lo=lo: finish(result, lo), first_coordinate + lo,
            PRODUCTION_ARITHMETIC, commitments,
        )  # fmt: skip
        info["rounds"] = max(info["rounds"], stats.rounds)
        info["trials"] += stats.trials
    info["counters"] = counter_delta(before, link.counters())
    if gmw:
        info["round_trips"] = int(link.channel.round_trips) - trips
    return shares, info


# ------------------------------------------------------------------------------ plaintext


def aggregate_plain(
    a1: np.ndarray,
    a2: np.ndarray,
    ring_bits: int,
    mode: str = "spgc",
    *,
    seed1: bytes | None = None,
    seed2: bytes | None = None,
    sigma_units: float | None = None,
    distance_log2: float = DEFAULT_DISTANCE_LOG2,
    schedule: Sequence[int] = DEFAULT_SCHEDULE,
    backend: str = "gc",
    field_modulus: int | None = None,
    security: str = DEFAULT_SECURITY,
) -> np.ndarray:
    """What :func:`run_aggregate` reveals on ``backend``'s links at ``security``, computed in the
    clear from both servers' inputs (Python integers: the reference for tests and audits).
    ``field_modulus``: a1 and a2 are field sums, S = a1 + a2 mod p (centered)."""
    mode = _check_mode(mode)
    ring_bits = check_ring_bits(ring_bits)
    if field_modulus is None:
        a1 = _check_shares(a1, ring_bits)
        a2 = _check_shares(a2, ring_bits)
    if len(a1) != len(a2):
        raise ValueError("a1 and a2 must have one value per coordinate each")
    if field_modulus is None:
        full, half = 1 << ring_bits, 1 << (ring_bits - 1)
        s = [((int(p) - int(q)) % full) for p, q in zip(a1.tolist(), a2.tolist(), strict=True)]
        s = [v - full if v >= half else v for v in s]
    else:
        full, half = field_modulus, field_modulus // 2
        s = [((int(p) + int(q)) % full) for p, q in zip(a1.tolist(), a2.tolist(), strict=True)]
        s = [v - full if v > half else v for v in s]
    if mode == "only-mpc":
        return np.array(s, dtype=np.int64)
    if seed1 is None or seed2 is None or sigma_units is None:
        raise ValueError("spgc mode needs both seeds and sigma_units")
    if backend not in SPARES_EVERY:
        raise ValueError(f"backend must be one of {tuple(SPARES_EVERY)}, got {backend!r}")
    z = sample_noise_plain(
        seed1, seed2, len(s), sigma_units, distance_log2=distance_log2, schedule=schedule,
        spares_every=sampler_spares(backend, security),
    )  # fmt: skip
    return np.array([a + int(b) for a, b in zip(s, z, strict=True)], dtype=object)

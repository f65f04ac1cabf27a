"""The run's derived parameters (model size, sensitivity, noise, ring) and its TrainingConfig.

Everything here is a deterministic function of the configuration, so two servers with the same
training keys derive bit-identical TrainingConfig messages; the Handshake compares them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import nn

from spgc.learning.data import load_dataset, load_user_data
from spgc.learning.models import (
    check_buffers_match,
    check_per_example_compatible,
    flatten_params,
    load_initial_state,
    model_fingerprint,
    resolve_model,
)
from spgc.learning.trainable import TrainableCoordinates
from spgc.privacy import accounting
from spgc.privacy.accounting import check_schedule, phase_at
from spgc.privacy.clipping import AdaptiveClip, DecayClip
from spgc.privacy.feature_stats import FeatureRanges, StatsRelease, StatsThenStepsAccountant
from spgc.privacy.noise import noise_bound_units
from spgc.privacy.noise_floor import FloorMultipliers, floor_accountants, floor_multipliers
from spgc.protocol.encoding import FixedPointConfig
from spgc.protocol.modes import DEFAULT_SECURITY, NOISY_MODES, get_mode
from spgc.protocol.norm_proof import NormProofParams
from spgc.protocol.sharing import max_abs_sum_units, ring_bits_for
from spgc.settings.config import ServerConfig
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.digests import vector_sha256
from spgc.wire.messages import ACCEPTED_SHARE_ENCODINGS

#: The data link's lanes when the config leaves gc_lanes unset and the plan is a wide one on
#: gmw (RunPlan.gc_lanes): MNIST at 10 ms and 100 Mbit/s, the circuit 2.13-2.20 s with two
#: lanes against 2.37-2.55 s with one (docs/GMW.md, "Two lanes overlap the link with the CPU").
AUTO_LANES = 2
#: The fewest coordinates for AUTO_LANES: below, a second lane's engine session (its silent-OT
#: setup, about 1.3 MB and its LPN expansion) costs more than it overlaps.
AUTO_LANES_MIN_DIM = 10_000

_CALIBRATIONS = {
    "classic": pb.CALIBRATION_CLASSIC,
    "analytic": pb.CALIBRATION_ANALYTIC,
    "accountant": pb.CALIBRATION_ACCOUNTANT,
}


@dataclass
class RunPlan:
    """What both servers must agree on, derived from a :class:`ServerConfig`."""

    cfg: ServerConfig
    initial_params: np.ndarray
    fixed_point: FixedPointConfig
    ring_bits: int
    # Relative to l2_bound_units; 0 in only-mpc and plain. In ldp it is each provider's, in
    # dng each server's: the noise ONE party adds, which alone must give the target (the
    # accountant uses it; dng's total noise on the released sum is sqrt(2) times larger, ldp's
    # sqrt(k) times with k providers).
    noise_multiplier: float
    sigma_units: float  # that noise's std in units; 0 without noise
    step_epsilon: float
    # The accountant's sampling arguments (Poisson rate, or fixed batches of the smallest
    # provider's data), derived once: fixed batches read the data set to size the population.
    sampling: dict[str, Any]
    # The architecture (spgc.learning.models.model_fingerprint): providers building their own model
    # check they built the same one.
    model_fingerprint: str = ""
    # The largest local batch the ring is sized for (TrainingConfig.max_batch_size).
    max_batch_size: int = 0
    # The trained coordinates of the model's flat vector (requires_grad): the only ones that
    # travel, are noised and are updated; None: all of them.
    trainable: TrainableCoordinates | None = None
    # clip: adaptive (spgc.privacy.clipping): the count coordinate's size and the rule; None: fixed
    # C.
    adaptive_clip: AdaptiveClip | None = None
    # verify_inputs: l2: the providers' norm proofs (field, bound, sizes); None: not checked.
    norm_proof: NormProofParams | None = None
    # server_optimizer sgd, adjacency example: the examples a round is expected to sum, the
    # step's fixed denominator (DP-SGD's; Adam's step needs none); 0 otherwise.
    expected_examples: float = 0.0
    # standardize: the feature statistics' release, the run's round 0 (spgc.privacy.feature_stats:
    # its ranges, noise multiplier and scale); None without.
    feature_stats: StatsRelease | None = None

    @property
    def decay_clip(self) -> DecayClip | None:
        """clip: decay: the rule (spgc.privacy.clipping.DecayClip); None otherwise."""
        c = self.cfg
        return DecayClip(c.clip_norm, c.clip_decay, c.clip_min) if c.clip == "decay" else None

    @property
    def clip_moves(self) -> bool:
        """The clip norm changes from round to round (adaptive or decay): each round's is
        announced (RoundInfo.clip_norm) and recorded in the ledger's release entries."""
        return self.adaptive_clip is not None or self.cfg.clip == "decay"

    def __post_init__(self) -> None:
        if self.trainable is None:
            self.trainable = TrainableCoordinates.everything(len(self.initial_params))

    @property
    def coordinates(self) -> TrainableCoordinates:
        assert self.trainable is not None
        return self.trainable

    @property
    def dim(self) -> int:
        """d: the trained coordinates, the length of every model and share vector."""
        return self.coordinates.count

    @property
    def gc_lanes(self) -> int:
        """The data link's lanes: the config's ``gc_lanes``, else AUTO_LANES where gmw's
        AND layers wait on a link that a second lane can fill meanwhile (backend gmw, d >=
        AUTO_LANES_MIN_DIM, one worker, semi-honest), else 1. A function of the config and d
        only, so both servers of one plan agree (the data link checks it). With backend auto
        both servers have fixed the backend auto chose before the data link opens
        (servers.link_probe), so the lanes follow that choice; "auto" itself counts as gmw."""
        cfg = self.cfg
        if cfg.gc_lanes is not None:
            return cfg.gc_lanes
        wide = (
            cfg.backend in ("gmw", "auto")
            and cfg.workers == 1
            and cfg.security == DEFAULT_SECURITY
            and self.dim >= AUTO_LANES_MIN_DIM
        )
        return AUTO_LANES if wide else 1

    @property
    def share_dim(self) -> int:
        """The length of every share vector and of the released sum: d, plus the count of
        unclipped examples with adaptive clipping (its last coordinate); with standardize at
        least the feature statistics' 2F + 1 (a step's gradient then zero-padded)."""
        length = self.dim + (1 if self.adaptive_clip is not None else 0)
        stats = self.feature_stats
        return length if stats is None else max(length, stats.dim)

    @property
    def steps_before_training(self) -> int:
        """Releases before the first step: 1 with standardize (the statistics), else 0."""
        return 0 if self.feature_stats is None else 1

    def is_stats_release(self, release: int) -> bool:
        """Whether ledger release ``release`` (0-based) is the feature statistics'."""
        return self.feature_stats is not None and release == 0

    @property
    def model_dim(self) -> int:
        """The model's whole parameter count, frozen ones included."""
        return len(self.initial_params)

    def model_vector(self, whole: np.ndarray) -> np.ndarray:
        """The model vector of a whole parameter vector: what FetchModel serves, what
        model_sha256 hashes (the trained coordinates; the whole vector when nothing is
        frozen)."""
        if not self.coordinates.anything_frozen:
            return whole
        return self.coordinates.trainable_part(whole)

    def model_sha256(self, whole: np.ndarray) -> bytes:
        """SHA-256 of :meth:`model_vector` (RoundInfo.model_sha256, ModelHeader.sha256)."""
        return vector_sha256(self.model_vector(whole))

    def frozen_vector(self) -> np.ndarray:
        """The frozen coordinates, fixed for the run (empty when nothing is frozen)."""
        return self.coordinates.frozen_part(self.initial_params)

    @property
    def model_name(self) -> str:
        """The model the run trains: the configured one (a built-in name or a reference), or
        the dataset's own."""
        return self.cfg.model_name

    @property
    def total_noise_std_units(self) -> float:
        """Std of all the noise on the released sum: one sigma in spgc/preprocessed, two
        servers' in dng (sqrt 2), every provider's in ldp (sqrt k, all configured providers)."""
        if self.cfg.mode == "dng":
            return self.sigma_units * math.sqrt(2)
        if self.cfg.mode == "ldp":
            return self.sigma_units * math.sqrt(len(self.cfg.providers))
        # A noise floor: the joint (1 - f) sigma^2 and both servers' own f sigma^2.
        return self.sigma_units * math.sqrt(1.0 + self.noise_floor)

    def noise_samples_per_step(self, providers_used: int) -> int:
        """Discrete Gaussian samples one released step draws (the sampler's statistical
        distance counts per sample): one per share coordinate from the circuit (spgc, preprocessed),
        one per coordinate from each server (dng) or from each provider used (ldp)."""
        noise_by = get_mode(self.cfg.mode).noise_by
        if self.sigma_units <= 0 or noise_by == "nobody":
            return 0
        parties = {"circuit": 1, "each server": 2, "each provider": providers_used}[noise_by]
        if self.noise_floor > 0:
            parties += 2  # each server's own floor noise, a sample per coordinate
        return parties * self.share_dim  # the unclipped count too, with adaptive clipping

    def new_accountant(self) -> accounting.PrivacyAccountant | None:
        """A fresh accountant for the run (None when no noise is added: nothing to account).
        With standardize it counts releases, the first the statistics' (composed unsampled
        with the steps: spgc.privacy.feature_stats.StatsThenStepsAccountant)."""
        if self.noise_multiplier <= 0:
            return None
        if self.noise_floor > 0:  # the plan's guarantee holds against one curious server
            return self.floor_accountants()["curious_server"]  # (standardize is refused)
        kind = (
            accounting.PrivacyAccountant
            if self.feature_stats is None
            else StatsThenStepsAccountant  # counts releases: the statistics', then the steps
        )
        return kind(
            self.noise_multiplier,
            self.cfg.target_delta,
            method=self.cfg.accountant,  # type: ignore[arg-type]
            unsampled=_unsampled(self.feature_stats),
            **self.sampling,
        )

    def training_config(self, run_id: str) -> pb.TrainingConfig:
        """The TrainingConfig both servers announce (providers and the peer compare it)."""
        c = self.cfg
        return pb.TrainingConfig(
            run_id=run_id,
            mode=pb.Mode.Value(get_mode(c.mode).wire_name),
            dataset=c.dataset,
            model=self.model_name,
            num_parameters=self.dim,
            ring_bits=self.ring_bits,
            scale=c.scale,
            clip_norm=c.clip_norm,
            l2_bound_units=float(self.fixed_point.l2_bound_units),
            rounding=pb.ROUNDING_CONDITIONAL_STOCHASTIC,
            **_batch_fields(c),
            noise_multiplier=self.noise_multiplier,
            noise_std_units=self.sigma_units,
            step_epsilon=self.step_epsilon,
            step_delta=c.target_delta,
            target_epsilon=c.target_epsilon,
            target_delta=c.target_delta,
            calibration=_CALIBRATIONS[c.calibration],
            accountant=c.accountant,
            max_rounds=c.rounds,
            min_providers=c.min_providers,
            model_fingerprint=self.model_fingerprint,
            # G = s1 - s2 mod 2^L (spgc.protocol.sharing.share), or with verified inputs G = s1 + s2
            # mod p (spgc.protocol.norm_proof.prove): the rule providers must follow.
            sharing_rule=(
                pb.SHARING_RULE_DIFFERENCE_MOD_2L
                if self.norm_proof is None
                else pb.SHARING_RULE_SUM_MOD_P
            ),
            max_batch_size=self.max_batch_size,
            learning_rate=c.lr,
            server_optimizer=c.server_optimizer,
            batches_per_epoch=self.batches_per_epoch,
            share_encodings=ACCEPTED_SHARE_ENCODINGS,
            model_parameters=self.model_dim,
            trainable=[
                pb.CoordinateRange(start=a, length=n) for a, n in self.coordinates.wire_ranges()
            ],
            frozen_sha256=self.coordinates.frozen_sha256(self.initial_params),
            task=c.task,
            loss=c.loss_name,
            **self._adaptive_clip_fields(),
            backend=c.backend,
            **self._norm_proof_fields(),
            **self._adjacency_fields(),
            **self._feature_stats_fields(),
            noise_floor=self.noise_floor,
            # semi-honest: unset, the bytes (and plan_sha256) as before the field existed
            **({} if c.security == DEFAULT_SECURITY else {"security": c.security}),
            **({} if c.trial_depth is None else {"trial_depth": c.trial_depth}),
        )

    def _feature_stats_fields(self) -> dict[str, Any]:
        stats = self.feature_stats
        if stats is None:
            return {}  # the fields unset, as a server before them announced
        return {
            "standardize": True,
            "feature_lo": [float(v) for v in stats.ranges.lo],
            "feature_hi": [float(v) for v in stats.ranges.hi],
            "stats_noise_multiplier": stats.noise_multiplier,
            "stats_scale": stats.scale,
            "stats_max_rows": stats.max_rows,
        }

    def _adjacency_fields(self) -> dict[str, Any]:
        c = self.cfg
        if c.adjacency != "provider":
            return {}  # example: the fields unset, as a server before them announced
        return {
            "adjacency": "provider",
            "noise_schedule": [
                pb.NoisePhase(
                    from_release=start,
                    noise_multiplier=z,
                    sampling_rate=q,
                    noise_std_units=z * self.fixed_point.l2_bound_units,
                )
                for start, z, q in (self.schedule or ())
            ],
            "local_epochs": c.local_epochs,
            "local_batch_size": c.local_batch_size,
            "local_learning_rate": c.local_lr,
            "local_optimizer": c.local_optimizer,
        }

    @property
    def adjacency(self) -> str:
        """The unit of privacy: "example" or "provider" (spgc.privacy.accounting.UNITS)."""
        return self.cfg.adjacency

    @property
    def expected_providers(self) -> float:
        """adjacency: provider: q x the providers, the noisy sum's denominator (with a
        noise_schedule, its first phase's: see :meth:`expected_providers_for`)."""
        return expected_providers_per_round(self.cfg)

    @property
    def schedule(self) -> tuple[tuple[int, float, float], ...] | None:
        """noise_schedule as checked phases (first release, z, q); None without one."""
        phases = self.cfg.schedule_phases()
        return check_schedule(phases) if phases else None

    def noise_multiplier_for(self, release: int) -> float:
        """The noise multiplier of release ``release`` (0-based)."""
        schedule = self.schedule
        return self.noise_multiplier if schedule is None else phase_at(schedule, release)[1]

    def sigma_units_for(self, release: int) -> float:
        """The noise std in units that release ``release`` draws."""
        if self.is_stats_release(release):
            assert self.feature_stats is not None
            return self.feature_stats.sigma_units
        if self.schedule is None:
            return self.sigma_units
        return self.noise_multiplier_for(release) * self.fixed_point.l2_bound_units

    # --- noise_floor (issue 46): the joint noise and each server's own ---
    @property
    def noise_floor(self) -> float:
        """f: the fraction of sigma^2 each server adds on its own (0: none)."""
        return float(self.cfg.noise_floor)

    def joint_sigma_units_for(self, release: int) -> float:
        """The std of the noise the two servers make jointly for release ``release``
        (the round circuit, the preprocessed pool): sigma sqrt(1 - f)."""
        return self.sigma_units_for(release) * math.sqrt(1.0 - self.noise_floor)

    def floor_sigma_units_for(self, release: int) -> float:
        """The std of the noise each server adds on its own to release ``release``:
        sigma sqrt(f) (0 without a noise floor)."""
        return self.sigma_units_for(release) * math.sqrt(self.noise_floor)

    def floor_multipliers(self) -> FloorMultipliers:
        """The effective noise multipliers against everyone, one curious server and one
        server that deviates (spgc.privacy.noise_floor)."""
        return floor_multipliers(
            self.noise_multiplier,
            self.noise_floor,
            self.fixed_point.l2_bound_units,
            self.share_dim,
            sampling=str(self.sampling.get("sampling", "poisson")),
        )

    def floor_accountants(self) -> dict[str, accounting.PrivacyAccountant | None]:
        """One fresh accountant per figure (spgc.privacy.noise_floor.FIGURES)."""
        return floor_accountants(
            self.noise_multiplier,
            self.cfg.target_delta,
            method=self.cfg.accountant,
            sampling=self.sampling,
            noise_floor=self.noise_floor,
            sensitivity_units=self.fixed_point.l2_bound_units,
            coordinates=self.share_dim,
        )

    def sampling_rate_for(self, release: int) -> float:
        """Each provider's (or example's) Poisson rate for release ``release``."""
        schedule = self.schedule
        return self.cfg.sampling_rate if schedule is None else phase_at(schedule, release)[2]

    def expected_providers_for(self, release: int) -> float:
        """adjacency: provider: q x the providers of release ``release``'s phase."""
        return self.sampling_rate_for(release) * len(self.cfg.providers)

    def _norm_proof_fields(self) -> dict[str, Any]:
        n = self.norm_proof
        if n is None:
            return {"verify_inputs": "none"}
        return {
            "verify_inputs": "l2",
            "norm_field_modulus": n.p,
            "norm_bound_units": n.bound,
            "norm_repetitions": n.repetitions,
        }

    def _adaptive_clip_fields(self) -> dict[str, Any]:
        a, decay = self.adaptive_clip, self.decay_clip
        if decay is not None:
            return {
                "clip_rule": pb.CLIP_RULE_DECAY,
                "clip_decay": decay.rate,
                "clip_min": decay.floor,
            }
        if a is None:
            return {}
        return {
            "clip_rule": pb.CLIP_RULE_ADAPTIVE,
            "clip_target_quantile": a.target_quantile,
            "clip_learning_rate": a.learning_rate,
            "count_clip": a.count_clip,
            "expected_batch_size": a.expected_batch,
            "update_noise_multiplier": a.update_noise_multiplier(self.sigma_units, self.cfg.scale),
            "count_noise_std": a.count_noise_std(self.sigma_units, self.cfg.scale),
        }

    @property
    def batches_per_epoch(self) -> int:
        """Fixed batches: the batches of one epoch the accountant counts (0: Poisson)."""
        if self.sampling.get("sampling") != "fixed":
            return 0
        return accounting.batches_per_epoch(
            self.sampling["population"], self.sampling["sample_size"]
        )


def _sampling(cfg: ServerConfig) -> dict[str, Any]:
    """The accountant's sampling arguments. Fixed batches: the smallest provider's data is the
    population (the largest sampling ratio, the worst case); data are split evenly."""
    if cfg.adjacency == "provider":  # each provider's own coin (the unit named in reports)
        if cfg.noise_schedule:  # the phases' rates and multipliers, release by release
            phases = cfg.schedule_phases()
            return {"sampling_rate": phases[0][2], "sampling": "poisson", "unit": "provider",
                    "schedule": [list(p) for p in phases]}  # fmt: skip
        return {"sampling_rate": cfg.sampling_rate, "sampling": "poisson", "unit": "provider"}
    if cfg.batch_size <= 0:
        return {"sampling_rate": cfg.sampling_rate, "sampling": "poisson"}

    population = load_dataset(cfg.dataset).n_train // len(cfg.providers)
    if cfg.batch_size > population:
        raise ValueError(
            f"batch_size={cfg.batch_size} exceeds the {population} examples each of the "
            f"{len(cfg.providers)} providers holds"
        )
    return {"sampling": "fixed", "sample_size": cfg.batch_size, "population": population}


def _batch_fields(cfg: ServerConfig) -> dict[str, Any]:
    if cfg.batch_size > 0:
        return {"sampling": pb.BATCH_SAMPLING_SHUFFLE, "batch_size": cfg.batch_size}
    return {"sampling": pb.BATCH_SAMPLING_POISSON, "sampling_rate": cfg.sampling_rate}


def _max_batch(cfg: ServerConfig) -> int:
    """Largest batch any provider may contribute. A Poisson batch is bounded only by the
    provider's own data, which is at most the whole training set; loading it is cheap for
    the bundled datasets. A configured max_batch_size (an enforced cap) is tighter, and with
    verified inputs the plan sets one itself."""
    if cfg.adjacency == "provider":
        return 1  # one clipped model delta per provider
    if cfg.batch_size > 0:
        return cfg.batch_size
    if cfg.max_batch_size > 0:
        if cfg.dataset and cfg.mode in NOISY_MODES:  # only DP runs are accounted
            _check_batch_cap(cfg, load_dataset(cfg.dataset).n_train)
        return cfg.max_batch_size
    n_train = load_dataset(cfg.dataset).n_train
    if cfg.verify_inputs == "l2":
        # The norm proofs bound each provider's vector by its largest batch: the whole data
        # set would make that bound useless, so the plan caps the batch where a Poisson batch
        # exceeds it with probability 2^BATCH_OVERFLOW_LOG2 at most (as an explicit
        # max_batch_size must, _check_batch_cap).
        largest = -(-n_train // len(cfg.providers))
        return max(1, accounting.smallest_batch_cap(largest, cfg.sampling_rate))
    return n_train


def _check_batch_cap(cfg: ServerConfig, n_train: int) -> None:
    """A bundled data set is split evenly: refuse a max_batch_size its providers' Poisson
    batches could exceed (each provider would refuse to join; see
    accounting.poisson_overflow_log2)."""
    largest = -(-n_train // len(cfg.providers))
    if (
        accounting.poisson_overflow_log2(largest, cfg.sampling_rate, cfg.max_batch_size)
        > accounting.BATCH_OVERFLOW_LOG2
    ):
        need = accounting.smallest_batch_cap(largest, cfg.sampling_rate)
        raise ValueError(
            f"max_batch_size={cfg.max_batch_size} is below what a Poisson batch of a provider "
            f"holding {largest} examples of {cfg.dataset} ({len(cfg.providers)} provider(s), "
            f"sampling_rate {cfg.sampling_rate:g}) may reach: a larger batch would sit its round "
            "out, which the privacy accounting does not cover; set max_batch_size >= "
            f"{need}, or 0"
        )


def _unsampled(stats: StatsRelease | None) -> list[float]:
    """The once-only releases the accountant composes with the steps."""
    return [] if stats is None else [stats.noise_multiplier]


def stats_noise_multiplier(cfg: ServerConfig) -> float:
    """standardize: the statistics release's noise multiplier, (standardize_epsilon,
    target_delta) for one Gaussian release (Balle-Wang's analytic calibration)."""
    return accounting.analytic_gaussian_noise_multiplier(cfg.standardize_epsilon, cfg.target_delta)


def _feature_ranges(cfg: ServerConfig) -> FeatureRanges:
    """feature_ranges as declared, or (test_data) the servers' test set's per-feature
    minimum and maximum (a constant feature gets [v - 0.5, v + 0.5])."""
    if cfg.feature_ranges != "test_data":
        return FeatureRanges.from_pairs(cfg.feature_ranges or [], "feature_ranges")
    ds = load_user_data(cfg.test_data, cfg.test_data_label, task=cfg.task)
    x = np.concatenate([ds.x_train, ds.x_test]) if len(ds.x_test) else ds.x_train
    x = np.asarray(x, dtype=np.float64).reshape(len(x), -1)
    lo, hi = x.min(axis=0), x.max(axis=0)
    constant = hi <= lo
    return FeatureRanges(np.where(constant, lo - 0.5, lo), np.where(constant, hi + 0.5, hi))


def _feature_stats(cfg: ServerConfig, fp: FixedPointConfig, max_batch: int) -> StatsRelease | None:
    """standardize: the release fitted within the bound of a provider's round vector
    (max_batch examples of l2_bound_units each: the ring and the norm proof hold it)."""
    if not cfg.standardize:
        return None
    try:
        return StatsRelease.fit(
            _feature_ranges(cfg),
            stats_noise_multiplier(cfg),
            max_batch * fp.l2_bound_units,
            cfg.standardize_max_rows,
        )
    except ValueError as exc:
        raise ValueError(f"standardize: {exc}") from None


def _noise_multiplier(
    cfg: ServerConfig, sampling: dict[str, Any], stats: StatsRelease | None = None
) -> float:
    """The run's noise multiplier (with a noise_schedule, its first phase's); accountant
    calibration fits it to what the statistics' release leaves of target_epsilon."""
    if cfg.mode not in NOISY_MODES:
        return 0.0
    if cfg.noise_schedule:
        return cfg.noise_schedule[0].noise_multiplier
    if cfg.noise_multiplier > 0:
        return cfg.noise_multiplier
    if cfg.calibration == "accountant" and stats is not None:
        return accounting.calibrate_noise_multiplier(
            cfg.target_epsilon,
            cfg.target_delta,
            sampling.get("sampling_rate"),
            cfg.rounds,
            cfg.accountant,  # type: ignore[arg-type]
            sampling.get("sampling", "poisson"),
            sample_size=sampling.get("sample_size"),
            population=sampling.get("population"),
            unit=sampling.get("unit", "example"),
            unsampled=_unsampled(stats),
        )
    if cfg.calibration == "accountant":
        return accounting.noise_multiplier_for(
            "accountant",
            cfg.target_epsilon,
            cfg.target_delta,
            steps=cfg.rounds,
            method=cfg.accountant,  # type: ignore[arg-type]
            **sampling,
        )
    # classic/analytic: a per-release epsilon (the paper's convention); the accountant still
    # accounts the whole run and stops it at target_epsilon.
    return accounting.noise_multiplier_for(
        cfg.calibration,  # type: ignore[arg-type]
        cfg.step_epsilon,
        cfg.target_delta,
    )


def _fixed_point(
    cfg: ServerConfig, trainable: TrainableCoordinates, adaptive: AdaptiveClip | None
) -> FixedPointConfig:
    """The encoding. Only the trained coordinates travel: the rounding's slack counts them
    alone (and the unclipped-example count with adaptive clipping, whose rows are bounded by
    row_norm)."""
    if adaptive is None:
        return FixedPointConfig(scale=cfg.scale, clip_norm=cfg.clip_norm, dim=trainable.count)
    return FixedPointConfig(scale=cfg.scale, clip_norm=adaptive.row_norm, dim=trainable.count + 1)


def _calibrated_to_target(cfg: ServerConfig) -> bool:
    """The noise multiplier comes from calibrating the whole run to target_epsilon."""
    return not cfg.noise_schedule and cfg.noise_multiplier <= 0 and cfg.calibration == "accountant"


def expected_examples_per_round(cfg: ServerConfig) -> float:
    """The examples a round is expected to sum over all providers: the configured
    expected_batch_size, else from the data set (Poisson: sampling_rate x its training examples;
    fixed batches: batch_size x providers)."""
    if cfg.expected_batch_size > 0:
        return cfg.expected_batch_size
    if cfg.adjacency == "provider":  # the rows are providers' deltas
        return expected_providers_per_round(cfg)
    if cfg.batch_size > 0:
        return float(cfg.batch_size * len(cfg.providers))
    return cfg.sampling_rate * load_dataset(cfg.dataset).n_train


def expected_providers_per_round(cfg: ServerConfig) -> float:
    """adjacency: provider: the providers a round is expected to hold, q x the providers
    configured (the noisy sum's denominator, as DP-FedAvg's fixed-denominator estimator)."""
    rate = cfg.noise_schedule[0].sampling_rate if cfg.noise_schedule else cfg.sampling_rate
    return rate * len(cfg.providers)


def check_noise_against_signal(cfg: ServerConfig, noise_multiplier: float) -> None:
    """adjacency: provider: ValueError, naming the figures, when the noise's std (z x C) is
    above the largest signal a round can hold in expectation (C x the expected providers):
    each round's noisy mean would then be mostly noise (Geyer et al.'s point: the expected
    providers per round, not the noise alone, decide)."""
    if cfg.adjacency != "provider" or noise_multiplier <= 0:
        return
    phases = cfg.schedule_phases() or [(0, noise_multiplier, cfg.sampling_rate)]
    for start, z, q in phases:
        expected = q * len(cfg.providers)
        if z > expected:
            where = f" (noise_schedule, from release {start})" if cfg.noise_schedule else ""
            raise ValueError(
                f"adjacency: provider: the noise std is {z:.4g} x clip_norm{where}, more "
                f"than clip_norm x the {expected:.4g} providers a round holds in expectation "
                f"(sampling_rate {q:g} x {len(cfg.providers)} providers): the noise would "
                "swamp every round's signal; raise sampling_rate or the providers, or lower "
                "the noise (a larger target_epsilon or fewer rounds)"
            )


def _adaptive_clip(cfg: ServerConfig, noise_multiplier: float) -> AdaptiveClip | None:
    if cfg.clip != "adaptive":
        return None
    try:
        return AdaptiveClip.design(
            initial_norm=cfg.clip_norm,
            target_quantile=cfg.clip_target_quantile,
            learning_rate=cfg.clip_learning_rate,
            expected_batch=expected_examples_per_round(cfg),
            noise_multiplier=noise_multiplier,
            count_noise=cfg.clip_count_noise,
        )
    except ValueError as exc:
        raise ValueError(f"clip: adaptive: {exc}") from None


def _ring_noise_std(mode: str, sigma_units: float, providers: int) -> float:
    """Std of the noise that lives in the ring Z_2^L next to S (0: none does).

    spgc: the circuit adds the noise in a wider output, so only |S| must fit. ldp: the k
    providers' independent noises are summed in the ring (each provider's own G_j + z_j fits
    a fortiori). dng: each server adds its own noise to its share and the two noisy shares are
    subtracted in the ring, so S + z1 + z2 (std sqrt(2) sigma) must not wrap; the providers
    share in this ring, so L includes both noise tails.
    """
    if mode == "ldp":
        return sigma_units * math.sqrt(providers)
    if mode == "dng":
        return sigma_units * math.sqrt(2)
    return 0.0


def make_plan(cfg: ServerConfig) -> RunPlan:
    """Derive the run's parameters; ValueError (naming the limit) if no ring fits."""
    model = build_run_model(cfg)
    params = flatten_params(model)
    trainable = TrainableCoordinates.of_model(model)
    sampling = _sampling(cfg)
    max_batch = _max_batch(cfg)
    # The statistics' release fits a round's vector bound: C x scale for one example, as the
    # fixed clip (standardize needs clip: fixed) gives it.
    stats = _feature_stats(
        cfg, FixedPointConfig(scale=cfg.scale, clip_norm=cfg.clip_norm, dim=trainable.count),
        max_batch,
    )  # fmt: skip
    nm = _noise_multiplier(cfg, sampling, stats)
    check_noise_against_signal(cfg, nm)
    adaptive = _adaptive_clip(cfg, nm)
    fp = _fixed_point(cfg, trainable, adaptive)
    if cfg.noise_floor > 0 and nm > 0 and _calibrated_to_target(cfg):
        # The target holds against one curious server: its sum of two discrete Gaussians is
        # accounted by a multiplier a little below z (spgc.privacy.noise_floor), so raise z
        # (by a factor that does not depend on z) and design the clip for the raised one.
        curious = floor_multipliers(
            nm, cfg.noise_floor, fp.l2_bound_units, fp.dim, sampling=sampling["sampling"]
        ).curious_server
        nm *= nm / curious
        adaptive = _adaptive_clip(cfg, nm)
        fp = _fixed_point(cfg, trainable, adaptive)
    k = len(cfg.providers)
    bound = max_abs_sum_units(max_batch, fp.l2_bound_units, providers=k)
    sigma_units = nm * fp.l2_bound_units
    if cfg.mode == "preprocessed" and sigma_units > 0:
        # The noise shares live in the providers' ring and S + z is opened there: L holds |S|
        # plus the sampler's hard bound on |z| (not a tail probability), so nothing wraps.

        bound += noise_bound_units(sigma_units * math.sqrt(1.0 - cfg.noise_floor))
    # A noise_schedule's largest noise must fit the ring too (dng adds it in the ring).
    largest = max([nm, *(z for _, z, _ in cfg.schedule_phases())]) * fp.l2_bound_units
    if stats is not None:  # its noise too (its vector is within the same bound)
        largest = max(largest, stats.sigma_units)
    if cfg.noise_floor > 0 and largest > 0:
        # Each server's own noise is added to its share before the opening (spgc: to its input
        # of the circuit, whose difference of shares is read in the ring): |S| + |N_1| + |N_2|
        # must fit, by the sampler's hard bound, at the schedule's largest noise.
        bound += 2 * noise_bound_units(largest * math.sqrt(cfg.noise_floor))
    # Every share vector's length: d (+1 adaptive), at least 2F + 1 with standardize.
    length = fp.dim if stats is None else max(fp.dim, stats.dim)
    ring_bits = ring_bits_for(
        bound, noise_std_units=_ring_noise_std(cfg.mode, largest, k), dim=length
    )
    step_eps = accounting.per_step_epsilon(nm, cfg.target_delta) if nm > 0 else math.inf
    plan = RunPlan(
        cfg, params, fp, ring_bits, nm, sigma_units, step_eps, sampling, model_fingerprint(model),
        max_batch, trainable, adaptive, _norm_proof(cfg, fp, max_batch, ring_bits, length),
        expected_examples=(
            expected_examples_per_round(cfg)
            if cfg.server_optimizer == "sgd" and cfg.adjacency == "example"
            else 0.0
        ),
        feature_stats=stats,
    )  # fmt: skip
    accountant = plan.new_accountant()
    first_step = 1 + plan.steps_before_training  # with standardize: the statistics, a step
    if (
        accountant is not None
        and (first := accountant.epsilon_after(first_step)) > cfg.target_epsilon
    ):
        # The run stops before a release would pass the target: this one could never run.
        how = (
            "noise_multiplier"
            if cfg.noise_multiplier > 0
            else f"from calibration {cfg.calibration} with step_epsilon {cfg.step_epsilon:g}"
        )
        raise ValueError(
            f"the noise multiplier {nm:.4g} ({how}) spends epsilon {first:.4g} in one step, "
            f"more than target_epsilon {cfg.target_epsilon:g} (delta {cfg.target_delta:g}): "
            "raise it or target_epsilon (or calibration: accountant, which fits the noise "
            "to the target)"
        )
    return plan


def _norm_proof(
    cfg: ServerConfig, fp: FixedPointConfig, max_batch: int, ring_bits: int, length: int
) -> NormProofParams | None:
    """verify_inputs: l2: each provider's vector (``length`` values) is a sum of at most
    max_batch examples of norm at most l2_bound_units each (with standardize the statistics'
    vector is fitted within the same bound); ValueError naming the figures when no field
    holds it."""
    if cfg.verify_inputs != "l2":
        return None
    bound = max_batch * fp.l2_bound_units
    try:
        return NormProofParams.for_plan(length, bound, ring_bits, cfg.verify_repetitions)
    except ValueError as exc:
        raise ValueError(
            f"verify_inputs: l2: a provider's bound is {max_batch:,} examples x "
            f"{fp.l2_bound_units:,} units = {bound:,} units: {exc}; lower max_batch_size or "
            "scale, or set verify_inputs: none (then no provider's vector is checked)"
        ) from None


def build_run_model(cfg: ServerConfig) -> nn.Module:
    """The run's initial model: the configured model (a built-in name, or the user's
    ``module:factory``) from ``model_seed``, then the ``initial_model`` state if one is given.
    ValueError naming the reference or file when it cannot be built, or when per-example
    gradients cannot handle it (the providers would fail mid-round)."""
    model = resolve_model(cfg.model_name, seed=cfg.model_seed)
    check_per_example_compatible(model)
    if cfg.initial_model is not None:
        load_initial_state(model, cfg.initial_model)
    changes = [f"model_seed {cfg.model_seed}"] if cfg.model_seed else []
    if cfg.initial_model is not None:
        changes.append(f"initial_model {str(cfg.initial_model)!r}")
    if changes and any(True for _ in model.buffers()):
        how = " and ".join(changes)
        try:
            check_buffers_match(model, resolve_model(cfg.model_name), how)
        except ValueError as exc:
            raise ValueError(f"model {cfg.model_name!r}: {exc}") from None
    return model

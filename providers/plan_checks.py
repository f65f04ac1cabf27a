"""What a provider checks in the servers' plan before it takes part (SPEC section 3, step 1).

The announced TrainingConfig must name a sharing rule and ring this provider implements, with
numbers within the protocol's bounds (:func:`check_wire_contract`); describe a model, data set
and encoding this provider computes the same way (:func:`check_training_config`,
:func:`build_provider_model`); promise at least the provider's own minimum privacy per step
(:func:`check_privacy`) and stay within its own limits (:func:`check_plan`). Each refusal is a
:class:`ProviderRefusal` naming the field. Also: what the plan means for accounting
(:func:`effective_noise_multiplier`, :func:`accountant_sampling`, :func:`run_plan`).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from spgc.learning.local_training import LOCAL_OPTIMIZERS
from spgc.learning.losses import TASKS, resolved_loss, task_loss_problem
from spgc.learning.models import (
    MODEL_NAMES,
    build_model,
    check_per_example_compatible,
    model_fingerprint,
    parameter_count,
    resolve_model,
)
from spgc.learning.trainable import TrainableCoordinates, TrainableLayoutError
from spgc.privacy.accounting import (
    BATCH_OVERFLOW_LOG2,
    per_step_epsilon,
    poisson_overflow_log2,
    smallest_batch_cap,
)
from spgc.privacy.budget import RunPlan
from spgc.privacy.clipping import adaptive_clip_of, decay_clip_of
from spgc.privacy.feature_stats import FeatureRanges, StatsRelease
from spgc.privacy.noise_floor import floor_multipliers
from spgc.protocol.encoding import FixedPointConfig
from spgc.protocol.modes import (
    ADAPTIVE_CLIP_MODES,
    DEFAULT_SECURITY,
    MODES,
    SECURITY_NAMES,
    SINGLE_SERVER_MODES,
    TWO_SERVER_MODES,
    get_mode,
)
from spgc.protocol.norm_proof import NormProofParams
from spgc.providers.errors import ProviderRefusal
from spgc.settings.provider_config import ProviderConfig
from spgc.wire import aggregation_pb2 as pb
from spgc.wire.bounds import MAX_RING_BITS, MIN_RING_BITS, check_bounds
from spgc.wire.errors import WireError

__all__ = [
    "IMPLEMENTED_SHARING_RULES",
    "NOISELESS_WIRE",
    "ONE_SERVER_WIRE",
    "TWO_SERVER_WIRE",
    "WIRE_MODES",
    "accountant_sampling",
    "build_provider_model",
    "check_plan",
    "check_privacy",
    "check_trained_coordinates",
    "check_training_config",
    "check_wire_contract",
    "describe_diff",
    "describe_plan",
    "effective_noise_multiplier",
    "in_bounds",
    "norm_proof_params",
    "resolve_device",
    "run_plan",
    "share_length",
    "stats_release",
    "trained_coordinates",
]

# The wire enum values of the modes table's rows (spgc.protocol.modes), grouped as the client
# branches.
WIRE_MODES = {m.name: pb.Mode.Value(m.wire_name) for m in MODES.values() if m.trainable}
TWO_SERVER_WIRE = frozenset(WIRE_MODES[m] for m in TWO_SERVER_MODES)
ONE_SERVER_WIRE = frozenset(WIRE_MODES[m] for m in SINGLE_SERVER_MODES)
NOISELESS_WIRE = frozenset(WIRE_MODES[m] for m in WIRE_MODES if not MODES[m].noisy)


#: The sharing rules this provider implements: G = s1 - s2 mod 2^L (spgc.protocol.sharing.share),
#: and
#: with verified inputs G = s1 + s2 mod p (spgc.protocol.norm_proof.prove). 0 is a server from
#: before
#: TrainingConfig.sharing_rule existed, whose rule was the first.
IMPLEMENTED_SHARING_RULES = frozenset(
    {pb.SHARING_RULE_UNSPECIFIED, pb.SHARING_RULE_DIFFERENCE_MOD_2L, pb.SHARING_RULE_SUM_MOD_P}
)


def _enum_name(enum: Any, value: int) -> str:
    try:
        return str(enum.Name(value))
    except ValueError:
        return f"{value} (unknown)"


def in_bounds(message: Any, name: str, who: str) -> None:
    """check_bounds; a violation is a ProviderRefusal naming the server and the field."""
    try:
        check_bounds(message, name)
    except WireError as exc:
        msg = f"{who} sent a {name} out of the protocol's bounds: {exc.message}"
        raise ProviderRefusal(msg) from None


def check_wire_contract(tc: Any) -> None:
    """Refuse (ProviderRefusal, naming the field) a TrainingConfig this provider cannot follow:
    a ``sharing_rule`` other than SHARING_RULE_DIFFERENCE_MOD_2L (G = s1 - s2 mod 2^L), a
    ``ring_bits`` outside 2..64, or any number outside its bound (spgc.wire.bounds)."""
    if tc.sharing_rule not in IMPLEMENTED_SHARING_RULES:
        raise ProviderRefusal(
            "the servers announce TrainingConfig.sharing_rule="
            f"{_enum_name(pb.SharingRule, tc.sharing_rule)}; this provider implements only "
            "SHARING_RULE_DIFFERENCE_MOD_2L (G = s1 - s2 mod 2^L, s1 to H1, s2 to H2) and "
            "SHARING_RULE_SUM_MOD_P (verified inputs)"
        )
    if not MIN_RING_BITS <= tc.ring_bits <= MAX_RING_BITS:
        raise ProviderRefusal(
            f"the servers announce TrainingConfig.ring_bits={tc.ring_bits}; this provider "
            f"implements rings Z_2^L with L in {MIN_RING_BITS}..{MAX_RING_BITS}"
        )
    in_bounds(tc, "TrainingConfig", "the servers")


def describe_diff(a: Any, b: Any) -> str:
    diffs = []
    for f in a.DESCRIPTOR.fields:
        va, vb = getattr(a, f.name), getattr(b, f.name)
        if va != vb:
            diffs.append(f"{f.name}: {va!r} vs {vb!r}")
    return "; ".join(diffs) or "(serialisations differ)"


def _model_key(name: str, dataset: str) -> str:
    key = (name or dataset).strip().lower()
    if key in MODEL_NAMES:
        return key
    head = key.split("-", 1)[0]
    if head in MODEL_NAMES:
        return head
    raise ProviderRefusal(f"the servers announce model {name!r}, which this provider cannot build")


def effective_noise_multiplier(tc: Any) -> float:
    """Noise std / sensitivity per step in fixed-point units, as announced (0: no noise).

    The smaller of the announced ``noise_multiplier`` and ``noise_std_units / l2_bound_units``
    (the second is what the integer mechanism actually delivers when rounding inflates the
    sensitivity over s*C).
    """
    if tc.mode in NOISELESS_WIRE:
        return 0.0
    if tc.l2_bound_units <= 0 or tc.noise_std_units <= 0 or tc.noise_multiplier <= 0:
        return 0.0
    announced = min(tc.noise_multiplier, tc.noise_std_units / tc.l2_bound_units)
    for phase in tc.noise_schedule:  # a noise_schedule: its weakest release
        in_units = phase.noise_std_units / tc.l2_bound_units
        announced = min(announced, phase.noise_multiplier, in_units)
    if tc.noise_floor > 0:
        # A noise floor: what one curious server does not know is a sum of two discrete
        # Gaussians, accounted a little below the announced multiplier (spgc.privacy.noise_floor;
        # d + 1 coordinates covers an adaptive clip's count, and more coordinates only loosen).
        announced = floor_multipliers(
            announced,
            tc.noise_floor,
            tc.l2_bound_units,
            tc.num_parameters + 1,
            sampling="fixed" if tc.sampling == pb.BATCH_SAMPLING_SHUFFLE else "poisson",
        ).curious_server
    return announced


def check_privacy(tc: Any, cfg: ProviderConfig) -> float | None:
    """Refuse (ProviderRefusal) a TrainingConfig weaker per step than ``cfg``'s minimum.

    Returns the per-step epsilon at ``cfg.step_delta`` this provider computed itself (without
    subsampling amplification), None for a no-noise mode.
    """
    sigma = effective_noise_multiplier(tc)
    wants = cfg.max_step_epsilon is not None or cfg.min_noise_multiplier is not None
    mode = pb.Mode.Name(tc.mode)
    security = tc.security or DEFAULT_SECURITY
    if SECURITY_NAMES.index(security) < SECURITY_NAMES.index(cfg.min_security):
        raise ProviderRefusal(
            f"the servers announce security {security}, below this provider's min_security "
            f"{cfg.min_security} (a server that deviates could strip or bias the noise)"
        )
    if tc.noise_floor < cfg.min_noise_floor:
        raise ProviderRefusal(
            f"the servers announce noise_floor {tc.noise_floor:g}, below this provider's "
            f"min_noise_floor {cfg.min_noise_floor:g} (each server's own noise, what is left "
            "if one server strips the joint noise)"
        )
    if sigma <= 0:
        if wants:
            raise ProviderRefusal(
                f"the servers announce {mode} with no noise (noise_multiplier="
                f"{tc.noise_multiplier}, noise_std_units={tc.noise_std_units}); this provider "
                "requires a minimum privacy per step"
            )
        return None
    if cfg.min_noise_multiplier is not None and sigma < cfg.min_noise_multiplier:
        raise ProviderRefusal(
            f"announced noise multiplier {sigma:.6g} (std {tc.noise_std_units:g} units / "
            f"sensitivity {tc.l2_bound_units:g} units) is below this provider's minimum "
            f"{cfg.min_noise_multiplier:g}"
        )
    eps = per_step_epsilon(sigma, cfg.step_delta)
    if cfg.max_step_epsilon is not None and eps > cfg.max_step_epsilon:
        raise ProviderRefusal(
            f"one step of this run is ({eps:.4g}, {cfg.step_delta:g})-DP (noise multiplier "
            f"{sigma:.4g}), weaker than this provider's minimum epsilon {cfg.max_step_epsilon:g} "
            f"per step at delta {cfg.step_delta:g} (servers announce step_epsilon="
            f"{tc.step_epsilon:g})"
        )
    return eps


def _refuse_batches_over_the_cap(tc: Any, local_examples: int) -> None:
    """A Poisson batch over max_batch_size sits its round out, which the accountant does not
    model: join only where that is negligible (2^BATCH_OVERFLOW_LOG2 per round, counted in the
    servers' reported delta)."""
    cap, q = tc.max_batch_size, tc.sampling_rate
    if cap <= 0 or tc.noise_multiplier <= 0:  # no cap, or nothing accounted
        return
    if poisson_overflow_log2(local_examples, q, cap) <= BATCH_OVERFLOW_LOG2:
        return
    raise ProviderRefusal(
        f"with {local_examples} examples at sampling rate {q:g} a batch may exceed the servers' "
        f"max_batch_size {cap} (probability above 2^{BATCH_OVERFLOW_LOG2} per round; such a "
        "round would be sat out, which the privacy accounting does not cover): the servers' "
        f"max_batch_size must be at least {smallest_batch_cap(local_examples, q)} for this "
        "provider's data"
    )


def _encoded_rows(tc: Any, d: int) -> tuple[float, int]:
    """The clip norm and width of the rows this provider encodes: C and d, or with adaptive
    clipping sqrt(C0^2 + kappa^2) and d + 1 (spgc.privacy.clipping). ProviderRefusal for an adaptive
    rule that is malformed, or announced where its count would not be noised as announced."""
    try:
        adaptive = adaptive_clip_of(tc)
        decay_clip_of(tc)  # a decaying clip keeps C0 and d: its rows are rescaled to C0
    except ValueError as exc:
        raise ProviderRefusal(str(exc)) from None
    if adaptive is None:
        return tc.clip_norm, d
    modes = {get_mode(m).wire_name for m in ADAPTIVE_CLIP_MODES}
    if pb.Mode.Name(tc.mode) not in modes or tc.rounding != pb.ROUNDING_CONDITIONAL_STOCHASTIC:
        raise ProviderRefusal(
            f"the servers announce adaptive clipping in mode {pb.Mode.Name(tc.mode)} with "
            f"rounding {pb.Rounding.Name(tc.rounding)}; it runs only in mode(s) "
            f"{', '.join(ADAPTIVE_CLIP_MODES)} with conditional rounding"
        )
    return adaptive.row_norm, d + 1


def check_training_config(tc: Any, cfg: ProviderConfig, local_examples: int) -> FixedPointConfig:
    """Check that this provider computes what the servers announce; returns its encoding.

    Refuses (ProviderRefusal) another dataset, an impossible ring, an ``l2_bound_units``
    other than its own computation, and a batch setting
    it cannot draw.
    """
    if not cfg.data and cfg.dataset and tc.dataset.strip().lower() != cfg.dataset.lower():
        raise ProviderRefusal(
            f"the servers train on dataset {tc.dataset!r}; this provider holds {cfg.dataset!r}"
        )
    d = tc.num_parameters
    if not MIN_RING_BITS <= tc.ring_bits <= MAX_RING_BITS:
        raise ProviderRefusal(
            f"TrainingConfig.ring_bits={tc.ring_bits} is not in {MIN_RING_BITS}..{MAX_RING_BITS}"
        )
    clip, dim = _encoded_rows(tc, d)
    try:
        fp = FixedPointConfig(scale=tc.scale, clip_norm=clip, dim=dim)
    except ValueError as exc:
        raise ProviderRefusal(f"announced fixed-point parameters are unusable: {exc}") from None
    if tc.rounding == pb.ROUNDING_CONDITIONAL_STOCHASTIC:
        if tc.l2_bound_units != float(fp.l2_bound_units):
            raise ProviderRefusal(
                f"the servers announce l2_bound_units={tc.l2_bound_units:g}; this provider's "
                f"conditional rounding with s={tc.scale:g}, C={clip:g}, d={dim} bounds "
                f"each example by B={fp.l2_bound_units} units (sensitivity mismatch)"
            )
    elif tc.rounding in (pb.ROUNDING_STOCHASTIC, pb.ROUNDING_NEAREST):
        # Rounding the sum once: neighbours differ by up to s*C + sqrt(d) units.
        need = fp.scaled_clip_norm + math.sqrt(d)
        if tc.l2_bound_units < need:
            raise ProviderRefusal(
                f"the servers announce l2_bound_units={tc.l2_bound_units:g}, but rounding the "
                f"sum once has sensitivity up to s*C + sqrt(d) = {need:.6g} units"
            )
    else:
        raise ProviderRefusal(f"unsupported rounding {pb.Rounding.Name(tc.rounding)}")
    provider_level = check_adjacency(tc)
    if tc.standardize and local_examples > tc.stats_max_rows:
        raise ProviderRefusal(
            f"this provider holds {local_examples} examples; the servers' feature statistics "
            f"release is sized for at most {tc.stats_max_rows} per provider "
            "(standardize_max_rows)"
        )
    if tc.sampling == pb.BATCH_SAMPLING_POISSON:
        if tc.WhichOneof("batch") != "sampling_rate" or not 0 < tc.sampling_rate <= 1:
            raise ProviderRefusal("Poisson sampling announced without a rate in (0, 1]")
        if not provider_level:  # provider-level: one delta, no batch to cap
            _refuse_batches_over_the_cap(tc, local_examples)
    elif tc.sampling == pb.BATCH_SAMPLING_SHUFFLE:
        if tc.WhichOneof("batch") != "batch_size" or tc.batch_size < 1:
            raise ProviderRefusal("fixed-size batches announced without a batch size")
        if tc.batch_size > local_examples:
            raise ProviderRefusal(
                f"batch size {tc.batch_size} exceeds this provider's {local_examples} examples"
            )
        if tc.batches_per_epoch < 1:
            raise ProviderRefusal(
                "fixed-size batches announced without batches_per_epoch (a server that "
                "predates it): the batches could not follow the accountant's epochs"
            )
        if tc.batches_per_epoch * tc.batch_size > local_examples:
            raise ProviderRefusal(
                f"an epoch of {tc.batches_per_epoch} batches of {tc.batch_size} needs "
                f"{tc.batches_per_epoch * tc.batch_size} examples, this provider holds "
                f"{local_examples}: its examples would be in more releases than counted"
            )
    else:
        raise ProviderRefusal(f"unsupported sampling {pb.BatchSampling.Name(tc.sampling)}")
    if tc.mode == pb.MODE_UNSPECIFIED:
        raise ProviderRefusal("the servers announce no mode")
    # Refuses a verified plan this provider cannot prove for.
    norm_proof_params(tc, share_length(tc, dim))
    return fp


def share_length(tc: Any, encoded: int) -> int:
    """Every share vector's length: the ``encoded`` rows' width, at least the feature
    statistics' 2F + 1 with standardize (TrainingConfig.standardize)."""
    return max(encoded, 2 * len(tc.feature_lo) + 1) if tc.standardize else encoded


def round_sampling_rate(tc: Any, release: int) -> float:
    """The Poisson rate of release ``release`` (0-based): its noise_schedule phase's, or the
    plan's sampling_rate."""
    rate = tc.sampling_rate
    for phase in tc.noise_schedule:
        if phase.from_release <= release:
            rate = phase.sampling_rate
    return rate


def check_adjacency(tc: Any) -> bool:
    """The plan's unit of privacy: True for provider-level DP (DP-FedAvg), whose local
    training this provider must be able to run as announced; ProviderRefusal otherwise."""
    if tc.adjacency in ("", "example"):
        return False
    if tc.adjacency != "provider":
        raise ProviderRefusal(
            f"the servers announce adjacency {tc.adjacency!r}; this provider knows example and "
            "provider"
        )
    if tc.sampling != pb.BATCH_SAMPLING_POISSON:
        raise ProviderRefusal("adjacency provider announced without Poisson coins per provider")
    if tc.max_batch_size != 1:
        raise ProviderRefusal(
            f"adjacency provider: each provider sends one clipped delta, but the servers size "
            f"the ring for max_batch_size {tc.max_batch_size}"
        )
    if tc.local_epochs < 1 or tc.local_batch_size < 1 or not tc.local_learning_rate > 0:
        raise ProviderRefusal(
            "adjacency provider announced without its local training (local_epochs "
            f"{tc.local_epochs}, local_batch_size {tc.local_batch_size}, local_learning_rate "
            f"{tc.local_learning_rate:g})"
        )
    if tc.local_optimizer not in LOCAL_OPTIMIZERS:
        raise ProviderRefusal(
            f"the servers announce local_optimizer {tc.local_optimizer!r}; this provider runs "
            f"{', '.join(LOCAL_OPTIMIZERS)}"
        )
    return True


def norm_proof_params(tc: Any, share_dim: int) -> NormProofParams | None:
    """The norm proofs' parameters of a plan with verified inputs (None without), recomputed
    here: a field, bound or rule other than this provider's computation is refused."""
    if tc.verify_inputs in ("", "none"):
        if tc.sharing_rule == pb.SHARING_RULE_SUM_MOD_P:
            raise ProviderRefusal("field shares announced without verified inputs")
        return None
    if tc.verify_inputs != "l2":
        raise ProviderRefusal(
            f"the servers verify inputs by {tc.verify_inputs!r}; this provider proves only l2"
        )
    if tc.sharing_rule != pb.SHARING_RULE_SUM_MOD_P:
        raise ProviderRefusal("verified inputs announced without SHARING_RULE_SUM_MOD_P")
    try:
        params = NormProofParams.for_plan(
            share_dim, int(tc.norm_bound_units), tc.ring_bits, int(tc.norm_repetitions)
        )
    except ValueError as exc:
        raise ProviderRefusal(f"the plan's norm proofs are unusable: {exc}") from None
    if params.p != tc.norm_field_modulus:
        raise ProviderRefusal(
            f"the servers announce the norm proofs' field p = {tc.norm_field_modulus}; this "
            f"provider derives p = {params.p} from the same bound, ring and repetitions"
        )
    want = int(tc.l2_bound_units) * int(tc.max_batch_size)
    if tc.max_batch_size and int(tc.norm_bound_units) != want:
        raise ProviderRefusal(
            f"the servers announce a norm bound of {tc.norm_bound_units} units; a batch of "
            f"{tc.max_batch_size} examples of {tc.l2_bound_units:g} units is {want}"
        )
    return params


def check_plan(tc: Any, cfg: ProviderConfig) -> None:
    """Refuse (ProviderRefusal) a plan outside this provider's own limits: its mode, its
    whole-training epsilon, its number of rounds."""
    mode = pb.Mode.Name(tc.mode)
    name = next((m for m, v in WIRE_MODES.items() if v == tc.mode), mode)
    if cfg.accept_modes and name not in cfg.accept_modes:
        raise ProviderRefusal(
            f"the plan's mode is {name}; this provider accepts {', '.join(cfg.accept_modes)}"
        )
    if cfg.max_total_epsilon is not None:
        if tc.mode in NOISELESS_WIRE:
            raise ProviderRefusal(
                f"the plan's mode {name} adds no noise (no epsilon bound); this provider's "
                f"max_total_epsilon is {cfg.max_total_epsilon:g}"
            )
        if tc.target_epsilon > cfg.max_total_epsilon:
            raise ProviderRefusal(
                f"the plan spends up to epsilon {tc.target_epsilon:g} (delta "
                f"{tc.target_delta:g}) over the training; this provider's max_total_epsilon is "
                f"{cfg.max_total_epsilon:g}"
            )
    check_standardize(tc, cfg)
    if cfg.require_verified_inputs and tc.verify_inputs != "l2":
        raise ProviderRefusal(
            "the servers do not check the providers' norm proofs (verify_inputs "
            f"{tc.verify_inputs or 'none'!r}); this provider requires verified inputs "
            "(require_verified_inputs)"
        )
    if cfg.max_training_rounds is not None and tc.max_rounds > cfg.max_training_rounds:
        raise ProviderRefusal(
            f"the plan runs up to {tc.max_rounds} rounds; this provider's max_training_rounds "
            f"is {cfg.max_training_rounds}"
        )


def check_standardize(tc: Any, cfg: ProviderConfig) -> None:
    """The servers' standardize and this provider's must agree (ProviderRefusal naming both):
    a provider that did not ask for it would send its data's statistics unawares, one that did
    would train on raw features; and the announced release must be one it can make."""
    if bool(tc.standardize) != cfg.standardize:
        if tc.standardize:
            raise ProviderRefusal(
                "the servers' plan releases the feature statistics first (standardize: true) "
                "and this provider does not take part in it: set standardize: true to send its "
                "per-feature sums, sums of squares and row count (counted in its budget)"
            )
        raise ProviderRefusal(
            "this provider asks for standardize: true, but the servers' plan releases no "
            "feature statistics: set standardize: true on both servers, or false here"
        )
    if not tc.standardize:
        return
    if (
        len(tc.feature_lo) != len(tc.feature_hi)
        or not tc.feature_lo
        or tc.stats_scale < 1
        or tc.stats_max_rows < 1
        or not tc.stats_noise_multiplier > 0
    ):
        raise ProviderRefusal(
            "the servers announce standardize without usable feature ranges, scale, row limit "
            "or noise"
        )
    # The release is one more noisy release of this provider's data: its own minimum holds.
    z = tc.stats_noise_multiplier
    if cfg.min_noise_multiplier is not None and z < cfg.min_noise_multiplier:
        raise ProviderRefusal(
            f"the feature statistics' release has noise multiplier {z:.6g}, below this "
            f"provider's minimum {cfg.min_noise_multiplier:g}"
        )
    eps = per_step_epsilon(z, cfg.step_delta)
    if cfg.max_step_epsilon is not None and eps > cfg.max_step_epsilon:
        raise ProviderRefusal(
            f"the feature statistics' release is ({eps:.4g}, {cfg.step_delta:g})-DP (noise "
            f"multiplier {z:.4g}), weaker than this provider's minimum epsilon "
            f"{cfg.max_step_epsilon:g} per release"
        )


def stats_release(tc: Any) -> StatsRelease | None:
    """standardize: the statistics' release as announced (checked by
    :func:`check_standardize`); None without."""
    if not tc.standardize:
        return None
    try:
        ranges = FeatureRanges.from_pairs(
            list(zip(tc.feature_lo, tc.feature_hi, strict=True)), "feature_ranges"
        )
    except ValueError as exc:
        raise ProviderRefusal(f"the servers announce unusable feature ranges: {exc}") from None
    return StatsRelease(
        ranges, float(tc.stats_noise_multiplier), int(tc.stats_max_rows), int(tc.stats_scale)
    )


def build_provider_model(tc: Any, cfg: ProviderConfig) -> nn.Module:
    """The model this provider computes gradients of: its own ``model`` reference, or the
    built-in one the servers announce. Refuses (ProviderRefusal) one whose architecture
    (parameter count, fingerprint) is not the servers', or that per-example gradients cannot
    handle."""
    if cfg.model:
        try:
            model = resolve_model(cfg.model)
        except ValueError as exc:
            raise ProviderRefusal(f"model {cfg.model!r}: {exc}") from None
        where = f"this provider's model {cfg.model!r}"
    else:
        if ":" in tc.model:
            raise ProviderRefusal(
                f"the servers train the user model {tc.model!r}: set model: to the same "
                "factory (package.module:factory or file.py:factory)"
            )
        model = build_model(_model_key(tc.model, tc.dataset))
        where = f"this provider's built-in {tc.model or tc.dataset} model"
    try:  # first: a layer per-example gradients cannot handle is named, whatever else differs
        check_per_example_compatible(model)
    except ValueError as exc:
        raise ProviderRefusal(f"{where}: {exc}") from None
    check_trained_coordinates(tc, model, where)
    if tc.model_fingerprint and tc.model_fingerprint != model_fingerprint(model):
        raise ProviderRefusal(
            f"{where} has another architecture than the servers' {tc.model!r} (parameter names "
            f"and shapes: fingerprint {model_fingerprint(model)} vs {tc.model_fingerprint})"
        )
    return model


def trained_coordinates(tc: Any) -> TrainableCoordinates:
    """The coordinates the servers train (TrainingConfig.trainable); ProviderRefusal when
    the announced ranges do not make sense."""
    try:
        return TrainableCoordinates.from_wire(
            tc.num_parameters, tc.model_parameters, [(r.start, r.length) for r in tc.trainable]
        )
    except TrainableLayoutError as exc:
        raise ProviderRefusal(f"the servers' trainable coordinates: {exc}") from None


def check_trained_coordinates(tc: Any, model: nn.Module, where: str) -> None:
    """The model's parameter count and its trained coordinates (requires_grad, trainable
    masks) are the ones the servers announce: only those travel (spgc.learning.trainable)."""
    total = parameter_count(model)
    announced_total = tc.model_parameters or tc.num_parameters
    if announced_total != total:
        raise ProviderRefusal(
            f"the servers announce {announced_total:,} parameters for model {tc.model!r}; "
            f"{where} has {total:,}"
        )
    mine = TrainableCoordinates.of_model(model)
    if trained_coordinates(tc) != mine:
        raise ProviderRefusal(
            f"the servers train {tc.num_parameters:,} of model {tc.model!r}'s parameters, "
            f"{where} {mine.describe()}: freeze the same parameters (requires_grad=False) "
            "and mask the same elements (spgc.learning.trainable.set_trainable_mask)"
        )


def resolve_device(choice: str) -> torch.device:
    """``auto``: a CUDA GPU when there is one, else the CPU; ``cuda`` without one is an error."""
    if choice == "cuda" and not torch.cuda.is_available():
        raise ProviderRefusal("device: cuda, but torch sees no CUDA GPU on this machine")
    if choice == "cpu" or not torch.cuda.is_available():
        return torch.device("cpu")
    return torch.device("cuda")


def describe_plan(tc: Any) -> str:
    """The servers' plan in one line: what this provider is asked to take part in."""
    batch = (
        f"Poisson rate {tc.sampling_rate:g}"
        if tc.WhichOneof("batch") == "sampling_rate"
        else f"fixed batches of {tc.batch_size}"
    )
    if tc.adjacency == "provider":
        batch = (
            f"provider-level DP: each provider takes part with probability "
            f"{tc.sampling_rate:g} and trains {tc.local_epochs} local epoch(s) "
            f"({tc.local_optimizer}, batch {tc.local_batch_size}, lr {tc.local_learning_rate:g})"
        )
    noise = (
        "no noise (NOT differentially private)"
        if tc.mode in NOISELESS_WIRE
        else f"noise multiplier {tc.noise_multiplier:.4g}, budget epsilon "
        f"{tc.target_epsilon:g} at delta {tc.target_delta:g} ({tc.accountant})"
        + (f", noise floor {tc.noise_floor:g} (each server's own)" if tc.noise_floor > 0 else "")
    )
    security = tc.security or DEFAULT_SECURITY
    guard = (
        "servers secure against one that deviates (security malicious)"
        if security == "malicious"
        else "servers secure against servers that follow the protocol (security semi-honest)"
    )
    return (
        f"run {tc.run_id}: mode {pb.Mode.Name(tc.mode)}, model {tc.model} "
        f"(d={tc.num_parameters:,}), data set {tc.dataset or '(each provider own)'}, up to "
        f"{tc.max_rounds} rounds, {batch}, clip {tc.clip_norm:g}, scale {tc.scale:g}, {noise}, "
        f"{guard}"
    )


def accountant_sampling(tc: Any) -> dict[str, Any]:
    """The accountant's sampling arguments for plan ``tc`` (fixed batches: a population of
    batches_per_epoch batches, the epochs providers draw by)."""
    if tc.WhichOneof("batch") == "sampling_rate":
        if tc.adjacency == "provider":
            # A noise_schedule: its largest rate (with the weakest noise, see run_plan), an
            # upper bound on what the servers account release by release.
            rate = max([tc.sampling_rate, *(p.sampling_rate for p in tc.noise_schedule)])
            return {"sampling": "poisson", "sampling_rate": rate, "unit": "provider"}
        return {"sampling": "poisson", "sampling_rate": tc.sampling_rate}
    return {
        "sampling": "fixed",
        "sample_size": tc.batch_size,
        "population": tc.batches_per_epoch * tc.batch_size,
    }


def run_plan(tc: Any) -> RunPlan:
    """What the data set's budget file accounts run ``tc`` with: the effective noise
    multiplier (0: no noise), the plan's sampling, accountant, delta and budget."""
    name = next((m for m, v in WIRE_MODES.items() if v == tc.mode), pb.Mode.Name(tc.mode))
    noisy = tc.mode not in NOISELESS_WIRE
    return RunPlan(
        mode=name,
        noise_multiplier=effective_noise_multiplier(tc),
        sampling=accountant_sampling(tc),
        accountant=tc.accountant or "rdp",
        delta=tc.target_delta if noisy else 0.0,
        max_batch_size=tc.max_batch_size,
        num_parameters=tc.num_parameters,
        target_epsilon=tc.target_epsilon if noisy else None,
        # standardize: the statistics' release, the run's first, in this data set's budget
        stats_noise_multiplier=tc.stats_noise_multiplier if tc.standardize and noisy else 0.0,
    )


def plan_task_loss(tc: Any, cfg: ProviderConfig) -> tuple[str, str]:
    """(task, loss) of the servers' plan (TrainingConfig.task and .loss; empty, from a server
    that predates them: classification with cross_entropy). Refuses (ProviderRefusal) a task
    or loss this provider does not know, and the servers' own ``module:function`` loss unless
    this provider's ``loss`` names the same one: it imports no code the servers name."""
    task = tc.task or "classification"
    loss = resolved_loss(task, tc.loss) if task in TASKS else tc.loss
    if (problem := task_loss_problem(task, loss)) is not None:
        raise ProviderRefusal(f"the servers' plan: {problem}")
    if cfg.task and cfg.task != task:
        raise ProviderRefusal(
            f"the servers train a {task} task; this provider's data is for {cfg.task} "
            f"(task: {cfg.task})"
        )
    if ":" in loss and loss != cfg.loss.strip():
        raise ProviderRefusal(
            f"the servers train with their own loss {loss!r}: set loss: to the same reference "
            "in this provider's configuration (package.module:function or file.py:function)"
        )
    return task, loss

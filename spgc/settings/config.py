"""Daemon configuration: one typed schema per daemon and one error format.

:class:`ServerConfig` (``spgc server``) and :class:`ProviderConfig` (``spgc provider``) are
pydantic models: the loader (:mod:`spgc.settings.config_files`), the ``--set key=value`` overrides,
``spgc config show`` and docs/CONFIG.md all come from their fields. Every problem is a
:class:`ConfigError` whose message names the file, the key, the value given and what is
allowed (:func:`format_errors`), whether the values came from a file or from code.

Nothing secret lives in a configuration or in argv: TLS private keys are file *paths* (a value
``env:NAME`` reads the path from environment variable NAME), and the round seeds are drawn from
``os.urandom`` by the daemon, never configured.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from garbled_core import DEFAULT_OT_K, GARBLING_SCHEMES
from garbled_core.discrete_gaussian import MIN_TRIAL_DEPTH, UNBOUNDED_TRIAL_DEPTH
from spgc.common.lanes import MAX_LANES
from spgc.learning.data import dataset_task
from spgc.learning.local_training import LOCAL_OPTIMIZERS
from spgc.learning.losses import DEFAULT_LOSS, TASKS, task_loss_problem
from spgc.learning.models import MODEL_INPUT_SHAPES, MODEL_NAMES
from spgc.learning.optim import SERVER_OPTIMIZERS
from spgc.privacy.accounting import ACCOUNTANTS, UNITS, check_schedule
from spgc.privacy.feature_stats import MAX_FEATURES
from spgc.protocol.modes import (
    ADAPTIVE_CLIP_MODES,
    BACKEND_MODES,
    BACKEND_NAMES,
    DEFAULT_SECURITY,
    NOISE_FLOOR_MODES,
    NOISY_MODES,
    SECURITY_NAMES,
    SINGLE_SERVER_MODES,
    TRAINING_MODES,
    VERIFIED_MODES,
    default_verify_inputs,
    malicious_refusal,
)
from spgc.protocol.norm_proof import DEFAULT_REPETITIONS, GRINDING_BITS
from spgc.settings.backend_choice import AUTO, AUTO_MODES
from spgc.settings.config_errors import format_errors
from spgc.wire.tls import TlsFiles
from spgc.wire.transport import ray_cluster_endpoint, split_host_port

__all__ = [
    "LOG_LEVELS",
    "ConfigError",
    "ServerConfig",
    "TlsPaths",
    "parse_noise_schedule",
]

CALIBRATIONS = ("analytic", "classic", "accountant")
# standardize: the modes whose servers add each release's noise themselves.
STANDARDIZE_MODES = ("spgc", "dng")
LOG_LEVELS = ("debug", "info", "warning", "error")
_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the file, key and value."""


def _check_dial_address(key: str, value: str) -> None:
    try:
        port = split_host_port(value)[1]
    except ValueError as e:
        raise ValueError(f"{key}: {e}") from None
    if port == 0:
        raise ValueError(f"{key}={value!r}: port 0 cannot be dialled")


class _OneLineErrors(type(BaseModel)):  # type: ignore[misc]
    """Built in code (the Python API: ``ServerConfig(...)``, ``ProviderConfig(...)``,
    ``TlsPaths(...)``), a bad argument is a ConfigError of one line per problem naming the key,
    the value and what is allowed, as a file's is (load_config), not pydantic's ValidationError.
    (On the class's call, not in ``__init__``: pydantic runs a custom ``__init__`` inside
    ``model_validate`` too, where load_config formats the errors itself.)"""

    def __call__(cls, *args: Any, **data: Any) -> Any:
        try:
            return super().__call__(*args, **data)
        except ValidationError as exc:
            raise ConfigError(format_errors(exc, cls, cls.__name__, data)) from None


class _Schema(BaseModel, metaclass=_OneLineErrors):
    # Unknown keys are refused: a misspelt key must never silently fall back to a default.
    # No inf or nan anywhere: "epsilon: .inf" must not read as "no privacy limit".
    model_config = ConfigDict(extra="forbid", validate_default=True, allow_inf_nan=False)


class TlsPaths(_Schema):
    """PEM files: this party's certificate chain and private key, and the deployment CA."""

    cert: Path = Field(description="this party's certificate chain (PEM)")
    key: Path = Field(description="its private key (PEM file path; never the key itself)")
    ca: Path = Field(description="the deployment CA that signs every party (PEM)")

    def files(self) -> TlsFiles:
        return TlsFiles(cert=self.cert, key=self.key, ca=self.ca)


class NoisePhase(_Schema):
    """One phase of noise_schedule (adjacency: provider): from this release on, this noise
    multiplier and this chance per provider to take part (Geyer et al.'s adjustment)."""

    from_release: int = Field(
        ge=0, description="the first release (model update, counted from 0) of the phase"
    )
    noise_multiplier: float = Field(gt=0, description="the phase's noise std / clip norm")
    sampling_rate: float = Field(gt=0, le=1, description="each provider's chance per round")


def parse_noise_schedule(text: str) -> list[dict[str, float]]:
    """``"R:Z:Q,R:Z:Q"`` (from release R, noise multiplier Z, sampling rate Q), the short form
    of noise_schedule that ``--noise-schedule`` and ``--set noise_schedule=...`` take, as
    NoisePhase mappings; ValueError naming the item that is not of that form."""
    phases = []
    for item in (p.strip() for p in text.split(",") if p.strip()):
        try:
            start, z, q = item.split(":")
            phase = {"from_release": int(start), "noise_multiplier": float(z)}
            phases.append({**phase, "sampling_rate": float(q)})
        except ValueError:
            raise ValueError(
                f"{item!r} is not RELEASE:NOISE_MULTIPLIER:RATE (e.g. 0:1.2:0.05,100:0.9:0.1)"
            ) from None
    return phases


# ------------------------------------------------------------------------------------ server


class ServerConfig(_Schema):
    """One server daemon (H1 or H2). The training keys (from `run_id` on in the table below,
    but for `providers`, `round_deadline`, `test_data` and `test_data_label`) must be identical
    on both servers: they are compared at the handshake (the model, `model_seed` and
    `initial_model` through model v0's hash), and a difference is refused naming the keys."""

    # --- this daemon
    role: Literal[1, 2] = Field(1, description="1 = H1 (garbler, leads rounds), 2 = H2")
    listen: str = Field("127.0.0.1:50051", description="host:port for the providers' calls")
    peer_listen: str = Field(
        "127.0.0.1:50071",
        description="host:port for the other server's control calls (a gRPC server of its own: "
        "provider traffic never starves it)",
    )
    peer_address: str = Field(
        "127.0.0.1:50072",
        description="the other server's peer_listen address (H1 calls it; both probe it to "
        "notice a lost or restarted peer)",
    )
    peer_name: str = Field("h2", description="the name the other server's certificate carries")
    gc_address: str = Field(
        "127.0.0.1:50061",
        description="garbled-circuit data link: H1 listens here, H2 dials it",
    )
    tls: TlsPaths | None = Field(
        None, description="this server's certificate, key and the CA (mutual TLS on every link)"
    )
    insecure: bool = Field(
        False, description="plaintext on every link: development only, never with tls"
    )
    state_dir: Path | None = Field(
        None,
        description="checkpoints, seed journal, noise pool; created (mode 0700) if missing",
    )
    summary_path: Path | None = Field(
        None, description="JSON summary (rounds, accuracy, epsilon, bytes) written at the end"
    )
    keep_models: int = Field(
        0,
        ge=0,
        description="model versions kept in state_dir/models for spgc export --version: the "
        "latest N; 0: every version (a server warns at start when every version of the run "
        "would not fit the disk)",
    )
    resume: bool = Field(
        True, description="continue the run from the checkpoint in state_dir after a restart"
    )
    ledger_key: Path | None = Field(
        None,
        description="Ed25519 private key (PEM file) signing this server's privacy ledger "
        "(state_dir/ledger.jsonl); none: a key kept in state_dir (ledger-signing.key)",
    )
    audit_log: Path | None = Field(
        None,
        description="JSON-lines audit log (refusals, dropped providers, peer losses, restarts); "
        "none: state_dir/audit.jsonl, or the process log only without a state_dir",
    )
    pool_dir: Path | None = Field(
        None, description="mode preprocessed: where the noise shares live (state_dir/noise-pool)"
    )
    pool_rounds: int = Field(
        4,
        ge=1,
        description="preprocessed: rounds of noise H1 keeps ready at least (more while a "
        "production run outlasts a round; at most those left)",
    )
    pool_block: int = Field(
        262144,
        ge=1,
        le=1 << 24,
        description="preprocessed: largest block one production run makes (runs are sized "
        "to their measured cost below it)",
    )
    pool_produce: bool = Field(
        True,
        description="preprocessed: H1 produces while rounds run (false: only `spgc server "
        "precompute` fills the pool)",
    )
    pool_wait: float = Field(
        600.0, ge=0, description="preprocessed: seconds a round short of noise waits for it"
    )
    evaluate: bool = Field(True, description="test loss and accuracy of each published model")
    log_level: Literal[LOG_LEVELS] = Field("info", description="debug, info, warning or error")
    log_format: Literal["text", "json"] = Field("text", description="log lines: text or json")
    connect_timeout: float = Field(
        60.0, gt=0, description="seconds H1 waits for H2 (handshake, link) before giving up"
    )
    provider_max_streams: int = Field(
        4, ge=1, le=64, description="calls in flight at once per provider identity"
    )
    provider_rate: float = Field(
        200.0, gt=0, le=10_000, description="calls per second per provider identity (bursts 2x)"
    )
    provider_idle: float = Field(
        30.0, gt=0, description="seconds a provider's upload may send nothing before it is cut"
    )
    provider_stream_timeout: float = Field(
        600.0, gt=0, description="seconds a provider's upload may stay open at most"
    )
    peer_timeout: float = Field(
        300.0,
        gt=0,
        description="seconds a server waits for a lost peer to come back (and H2 for a call "
        "from a silent H1) before it stops; must exceed round_deadline plus H1's work in a round",
    )
    first_round_wait: float = Field(
        0.0,
        ge=0,
        description="seconds the run's first round may wait to open until min_providers "
        "providers have called this server (H1, or the single server), e.g. when providers are "
        "started by hand; then it opens anyway; 0: at once, as soon as the servers are paired. "
        "Once every provider has called and too few remain less those that declined the plan, "
        "the run ends at once, naming them",
    )
    backend: Literal[(*BACKEND_NAMES, AUTO)] = Field(
        "gc",
        description="how the two servers evaluate a round's circuits: gc (garbled circuits: "
        "about 20 kB per coordinate between the servers, a few round trips per round) or gmw "
        "(GMW with Beaver triples from silent OT: about 1 kB per coordinate, a round trip per "
        "AND layer, about 30 a round: for links with more bandwidth cost than latency); auto "
        "(modes spgc and preprocessed): H1 measures the round trip and throughput to H2 at "
        "pairing and takes the one with the least expected round time for the plan's d (in "
        "mode spgc on gmw also the trial_depth: 28, 48 or unbounded; in mode preprocessed "
        "the production run size; under security: malicious by the authenticated engines' "
        "costs), H2 checks the choice from the same "
        "figures, and the plan, the ledgers and the summary name the chosen one "
        "(spgc.settings.backend_choice); part of the plan: both servers must set the same; "
        "Ray worker pairs run either",
    )
    verify_inputs: Literal["none", "l2"] = Field(
        None,  # type: ignore[assignment]  # filled in from the mode by _default_verification
        description="l2: every share carries a zero-knowledge proof that its vector's L2 norm "
        "is within the plan's bound (the largest batch times each example's bound), checked "
        "by both servers before the round's agreement; a share whose proof fails is left out "
        "(docs/PRIVACY.md, Norm proofs); modes spgc, only-mpc, dng and preprocessed; none: not "
        "checked, any provider can poison the sum. Default: l2 in the two-server DP modes "
        "(spgc, dng, preprocessed), none in the others",
    )
    verify_repetitions: int = Field(
        DEFAULT_REPETITIONS,
        ge=DEFAULT_REPETITIONS,
        le=256,
        description="verify_inputs: l2: the wraparound checks of each proof; each halves a "
        f"cheating provider's chances. At least {DEFAULT_REPETITIONS}: a provider may re-share "
        f"up to 2^{GRINDING_BITS} times, so {DEFAULT_REPETITIONS} keep the soundness error "
        "at most 2^-40 per proof (docs/PRIVACY.md, Norm proofs; spgc bench proof prints it)",
    )
    # --- noise_floor (issue 46 item 4): each server's own noise, beside the joint noise ---
    noise_floor: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="modes spgc and preprocessed: the fraction f of the plan's noise variance "
        "that each server adds on its own (a fresh discrete Gaussian of variance f sigma^2 per "
        "coordinate, before anything is opened), the jointly made noise dropping to (1 - f) "
        "sigma^2: a server that deviates and strips the joint noise still leaves the other's "
        "f sigma^2 (docs/PRIVACY.md, The noise floor); part of the plan; 0: none",
    )
    # --- trial_depth (issue 47): the fused trial run's AND layers on gmw ---
    trial_depth: int | None = Field(
        None,
        ge=MIN_TRIAL_DEPTH,
        le=UNBOUNDED_TRIAL_DEPTH,
        description="backend gmw, mode spgc: the AND layers a round's trial run keeps within, "
        "each a round trip between the servers: fewer layers, more bytes (28 costs about 1.5x "
        "the bytes of 48: docs/GMW.md); not set: 28 on semi-honest gmw, no bound (the fewest "
        "AND gates, about 150 layers) under security: malicious; part of the plan",
    )
    # --- security (issue 46 item 2): what the circuits are secure against ---
    security: Literal[SECURITY_NAMES] = Field(  # type: ignore[valid-type]
        DEFAULT_SECURITY,
        description="semi-honest: the circuits are secure against servers that follow the "
        "protocol; malicious: a server that deviates is caught before anything of its round "
        "is released, and the other stops the run and records the abort in its ledger "
        "(mode: spgc or preprocessed, on backend gc by authenticated garbling or on gmw by "
        "authenticated GMW, auto choosing between them: spgc.protocol.modes.MALICIOUS_VARIANTS; "
        "workers: 1; "
        "docs/MALICIOUS.md); part of the plan: both servers must set the same",
    )
    garbling_scheme: Literal[GARBLING_SCHEMES] = Field(
        "threehalves",
        description="how AND gates are garbled: threehalves (24.6 bytes per AND gate) or "
        "halfgates (32 bytes, 1.5x fewer hash calls); both servers must set the same "
        "(semi-honest gc; under security: malicious gc garbles authenticated tables, 81 bytes "
        "per AND gate besides its triples)",
    )
    gc_lanes: int | None = Field(
        None,
        ge=1,
        le=MAX_LANES,
        description="connections of the data link between the servers; a round's coordinates "
        "are split into this many ranges run in parallel, each on its own connection, engine "
        "session and thread (about one core per lane on each server); unset: 2 with backend "
        "gmw (or auto choosing gmw), at least 10,000 coordinates, workers: 1 and security: "
        "semi-honest (one lane computes while the other's bytes travel), else 1; both servers "
        "must have the same",
    )
    workers: int = Field(
        1,
        ge=1,
        le=MAX_LANES,
        description="circuit workers: 1 runs the circuit in the server process; K > 1 runs each "
        "round's coordinates on K worker pairs of the organisation's Ray cluster (extra "
        "ray, pip install '.[ray]'; worker i of H1 and of H2 share a TLS link; gc_lanes must "
        "then be 1); both servers must set the same",
    )
    ray_address: str = Field(
        "",
        description="the Ray cluster for workers > 1 (as ray.init takes it, e.g. "
        "'ray://head:10001'); empty: a private local one started by the server (never one "
        "RAY_ADDRESS or `ray start` on the host names)",
    )
    ot_k: int = Field(
        DEFAULT_OT_K,
        ge=0,
        le=8,
        description="OT extension for H2's circuit inputs: SoftSpoken with this k sends "
        "ceil(128/k) bits per input bit (7, the default: 2.375 bytes, about 3x IKNP's CPU; 8: 2 "
        "bytes, about 5x; 4: 4 bytes at IKNP's CPU); 0: IKNP, 16 bytes; both servers must set the "
        "same (semi-honest gc; under security: malicious the inputs enter as authenticated "
        "shares from silent OT)",
    )
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="HTTP port for Prometheus /metrics and the /healthz and /readyz probes "
        "(unset: off; 0: any free port)",
    )
    metrics_host: str = Field(
        "127.0.0.1", description="address the metrics port binds to (0.0.0.0: every interface)"
    )
    tensorboard_dir: Path | None = Field(
        None,
        description="write TensorBoard curves per round to DIR/h1/run-<run id> (or h2): "
        "epsilon, test loss "
        "and accuracy, round seconds by phase, bytes to the peer, providers; needs pip install "
        "'spgc[tensorboard]'",
    )
    # --- training (identical on both servers)
    run_id: str = Field("", description="empty: H1 draws one, H2 adopts H1's at the handshake")
    providers: list[str] = Field(
        default_factory=list, description="the provider names allowed (certificate names)"
    )
    dataset: str = Field(
        "cancer",
        description="the built-in data set the providers hold (cancer, diabetes, mnist, "
        "diabetes-regression); empty "
        "when they bring their own data (then set model and max_batch_size)",
    )
    model: str = Field(
        "",
        description="the model: empty for the data set's own, a built-in name "
        f"({', '.join(MODEL_NAMES)}), or your own `package.module:factory` (or "
        "`file.py:factory`) returning a torch.nn.Module; the providers build the same",
    )
    initial_model: Path | None = Field(
        None, description="a .safetensors state the run starts from (default: the model's seed)"
    )
    test_data: str = Field(
        "",
        description="the servers' own test set: `package.module:loader`, or a .csv/.npz file "
        "as a provider's data (Data files below; default: the built-in data set's test split; "
        "none: no evaluation)",
    )
    test_data_label: str = Field("label", description="the label column of a test_data .csv")
    task: Literal[TASKS] = Field(  # type: ignore[valid-type]
        "classification",
        description="classification (class labels 0..C-1, test loss and accuracy) or regression "
        "(real targets, test MSE, MAE and R^2); a regression data set (diabetes-regression) "
        "sets regression when task is not given",
    )
    loss: str = Field(
        "",
        description="the loss the providers differentiate: cross_entropy (classification), mse "
        "(regression) or your own `package.module:function` (outputs, targets) -> mean loss; "
        "empty: the task's (cross_entropy, or mse for regression)",
    )
    mode: Literal[TRAINING_MODES] = Field(
        "spgc", description=f"how noise is added: {', '.join(TRAINING_MODES)} (spgc.protocol.modes)"
    )
    rounds: int = Field(
        10,
        ge=1,
        description="rounds at most: each published round is one model update; a round skipped "
        "for want of min_providers counts too (it spends no privacy)",
    )
    min_providers: int = Field(2, ge=1, description="fewest providers a round goes ahead with")
    round_deadline: float = Field(
        30.0, gt=0, description="seconds a round waits for shares after it opens"
    )
    clip_norm: float = Field(
        1.0,
        gt=0,
        description="L2 clip norm C of each example's gradient (with clip: adaptive, the "
        "first round's C0)",
    )
    clip: Literal["fixed", "adaptive", "decay"] = Field(
        "fixed",
        description="adaptive: C follows a target quantile of the examples' gradient norms "
        "(Andrew et al. 2021), from a noisy count that travels with the shares; decay: C "
        "shrinks by clip_decay each round down to clip_min (Maeda et al.), in every mode",
    )
    clip_decay: float = Field(
        0.99, gt=0, le=1, description="clip: decay: the clip norm's factor per round"
    )
    clip_min: float = Field(
        0.0, ge=0, description="clip: decay: the clip norm's floor (0: none), at most clip_norm"
    )
    clip_target_quantile: float = Field(
        0.5, gt=0, lt=1, description="clip: adaptive: the share of examples left unclipped"
    )
    clip_learning_rate: float = Field(
        0.2, gt=0, le=10, description="clip: adaptive: eta in C <- C exp(-eta (b - quantile))"
    )
    clip_count_noise: float = Field(
        0.0,
        ge=0,
        description="clip: adaptive: std of the noise on the unclipped-example count (in "
        "examples), > the noise multiplier; 0: the expected examples per round / 20 (the "
        "paper's default), at least twice the noise multiplier",
    )
    expected_batch_size: float = Field(
        0.0,
        ge=0,
        description="clip: adaptive, and server_optimizer: sgd: examples expected per round "
        "over all providers; 0: from the data set (sampling_rate x examples, or batch_size x "
        "providers)",
    )
    scale: float = Field(1024.0, gt=0, description="fixed-point units per gradient unit (s)")
    adjacency: Literal[UNITS] = Field(  # type: ignore[valid-type]
        "example",
        description="the unit of privacy: example (DP-SGD: each example's gradient clipped to "
        "clip_norm) or provider (DP-FedAvg: each selected provider trains locally and shares "
        "its model delta clipped to clip_norm; epsilon is per provider)",
    )
    sampling_rate: float = Field(
        0.01,
        gt=0,
        le=1,
        description="Poisson sampling rate q of each provider's examples (adjacency: provider: "
        "each provider's chance to take part in a round, from its own coin)",
    )
    noise_schedule: list[NoisePhase] = Field(
        default_factory=list,
        description="adjacency: provider, modes spgc and dng: phases [{from_release, "
        "noise_multiplier, sampling_rate}, ...] from release 0, accounted release by release; "
        "they replace noise_multiplier and sampling_rate (empty: one phase from those); also "
        'written short, as "0:1.5:0.5,100:1.2:0.6" (RELEASE:NOISE_MULTIPLIER:RATE)',
    )
    local_epochs: int = Field(
        1, ge=1, le=1000, description="adjacency: provider: passes over its data per round"
    )
    local_batch_size: int = Field(
        10, ge=1, description="adjacency: provider: the local optimiser's minibatch size"
    )
    local_lr: float = Field(
        0.05, gt=0, description="adjacency: provider: the local optimiser's learning rate"
    )
    local_optimizer: Literal[LOCAL_OPTIMIZERS] = Field(  # type: ignore[valid-type]
        "sgd", description="adjacency: provider: the providers' local optimiser"
    )
    batch_size: int = Field(
        0,
        ge=0,
        description="> 0: the paper's fixed shuffled batches of this size instead of Poisson "
        "sampling (accounted as sampling without replacement, RDP only)",
    )
    max_batch_size: int = Field(
        0,
        ge=0,
        description="largest local batch of any provider (ring sizing); 0: the data set's "
        "training-set size. With Poisson sampling it must be one no provider's batch passes "
        "but with probability <= 2^-64 per round (providers refuse to join otherwise)",
    )
    target_epsilon: float = Field(
        2.0, gt=0, description="privacy budget of the whole training (epsilon)"
    )
    target_delta: float = Field(1e-5, gt=0, lt=1, description="delta of the privacy budget")
    calibration: Literal[CALIBRATIONS] = Field(
        "accountant",
        description="noise calibration: accountant (whole run), analytic or classic "
        "(per-release step_epsilon; classic is the paper's formula, valid for epsilon < 1)",
    )
    accountant: Literal[ACCOUNTANTS] = Field(
        "rdp",
        description="privacy accountant: rdp, pld (tighter) or rdp_discrete (Poisson "
        "subsampling of the discrete Gaussian proved, not assumed as by the other two; looser)",
    )
    step_epsilon: float = Field(
        0.0, ge=0, description="per-release epsilon for calibration classic or analytic"
    )
    noise_multiplier: float = Field(
        0.0,
        ge=0,
        description="explicit noise multiplier; > 0 skips calibration (one whose first release "
        "alone would pass target_epsilon is refused)",
    )
    lr: float = Field(
        1e-3,
        gt=0,
        description="the servers' learning rate (server_optimizer's, on the noisy mean "
        "gradient); with adjacency: provider, on the noisy mean of the deltas (1.0 when not "
        "given: FedAvg)",
    )
    server_optimizer: Literal[SERVER_OPTIMIZERS] = Field(  # type: ignore[valid-type]
        "adam",
        description="the servers' update rule: adam, or sgd (parameters minus lr times the "
        "noisy mean gradient: DP-SGD's step); with adjacency: provider sgd when not given "
        "(FedAvg's step on the noisy mean delta), adam there is FedAdam",
    )
    model_seed: int = Field(0, description="seed of the initial model weights")

    # --- private feature statistics (issue 48 part 2; spgc.privacy.feature_stats)
    standardize: bool = Field(
        False,
        description="before training, one DP release of the per-feature counts, sums and sums "
        "of squares through both servers (counted in the ledger and the providers' budgets); "
        "every provider and the test set then standardise with the released means and "
        "deviations, stored with the model; the providers must set it too (modes spgc and dng, "
        "clip: fixed, adjacency: example)",
    )
    feature_ranges: list[list[float]] | Literal["test_data"] | None = Field(
        None,
        description="with standardize: each feature's [lo, hi] in column order, values clipped "
        "to it before the release (public bounds, not read from the providers' data), or "
        "test_data: the servers' test set's minimum and maximum per feature; at most "
        f"{MAX_FEATURES:,} features",
    )
    standardize_epsilon: float = Field(
        0.5,
        gt=0,
        description="with standardize: the statistics release's own epsilon at target_delta "
        "(its noise multiplier from the analytic Gaussian); the training's noise is calibrated "
        "to what target_epsilon leaves",
    )
    standardize_max_rows: int = Field(
        10000,
        ge=1,
        description="with standardize: the most rows any provider's data holds (a provider with "
        "more is refused); sizes the release within a round's vector bound",
    )

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @field_validator("providers", mode="before")
    @classmethod
    def _names(cls, value: Any) -> Any:
        if isinstance(value, str):  # --set providers=p1,p2,p3
            value = [v.strip() for v in value.split(",") if v.strip()]
        return value

    @field_validator("noise_schedule", mode="before")
    @classmethod
    def _phases(cls, value: Any) -> Any:
        if isinstance(value, str):  # --set noise_schedule=0:1.2:0.05,100:0.9:0.1
            value = parse_noise_schedule(value)
        return value

    @field_validator("listen", "peer_listen", "peer_address", "gc_address")
    @classmethod
    def _address(cls, value: str) -> str:
        split_host_port(value)  # ValueError naming the value; port 0 lets a listener pick
        return value

    @field_validator("ray_address")
    @classmethod
    def _ray_address(cls, value: str) -> str:
        ray_cluster_endpoint(value)  # ValueError naming the value
        return value

    @field_validator("role", mode="before")
    @classmethod
    def _role(cls, value: Any) -> Any:
        return int(value) if isinstance(value, str) and value.strip() in ("1", "2") else value

    @model_validator(mode="before")
    @classmethod
    def _default_verification(cls, data: Any) -> Any:
        """verify_inputs unset: l2 in the two-server DP modes, none elsewhere."""
        if isinstance(data, Mapping) and data.get("verify_inputs") is None:
            data = {**data, "verify_inputs": default_verify_inputs(data.get("mode", "spgc"))}
        return data

    @model_validator(mode="after")
    def _consistent(self) -> ServerConfig:
        if self.peer_timeout <= self.round_deadline:
            raise ValueError(
                f"peer_timeout ({self.peer_timeout:g} s) must exceed round_deadline "
                f"({self.round_deadline:g} s)"
            )
        self._check_task()
        if self.model and ":" not in self.model:
            self._check_model()
        if not self.dataset:
            if not self.model:
                raise ValueError("dataset is empty (providers bring their own data): set model")
            if self.max_batch_size <= 0 and self.adjacency == "example":
                raise ValueError(
                    "dataset is empty (providers bring their own data): set max_batch_size, the "
                    "largest local batch of any provider, which sizes the ring"
                )
            if self.batch_size > 0:
                raise ValueError(
                    "fixed batches (batch_size > 0) need the population size of a built-in "
                    "dataset; with your own data use Poisson sampling (sampling_rate)"
                )
        if self.single_server and self.role != 1:
            raise ValueError(
                f"mode {self.mode} runs ONE server (role 1, no peer, no garbled circuit); "
                f"a role-{self.role} server has nothing to do: start only role 1"
            )
        if (self.tls is None) == (not self.insecure):
            if self.tls is None:
                raise ValueError("tls: give tls: {cert, key, ca} or set insecure: true explicitly")
            raise ValueError("tls and insecure: true are mutually exclusive")
        if self.tls is not None:
            for key in ("cert", "key", "ca"):
                path = getattr(self.tls, key)
                if not path.is_file():
                    raise ValueError(f"tls.{key}: {path} is not a file")
        if not self.single_server:
            _check_dial_address("peer_address", self.peer_address)
        if self.backend != "gc" and self.mode not in BACKEND_MODES:
            raise ValueError(
                f"backend: {self.backend} evaluates a round's circuits, and mode {self.mode} "
                f"runs none; use one of {', '.join(BACKEND_MODES)}, or backend: gc"
            )
        if self.backend == AUTO and self.mode not in AUTO_MODES:
            raise ValueError(
                f"backend: auto with mode {self.mode}: the choice is modelled for modes "
                f"{', '.join(AUTO_MODES)}; set backend: gc or gmw"
            )
        if self.security == "malicious":
            self._check_malicious()
        if self.trial_depth is not None and (self.backend != "gmw" or self.mode != "spgc"):
            raise ValueError(
                f"trial_depth: {self.trial_depth} with backend {self.backend} and mode "
                f"{self.mode}: it bounds the AND layers of mode spgc's trial run on backend gmw "
                "(a round trip each); remove it or set backend: gmw and mode: spgc"
            )
        if self.verify_inputs == "l2" and self.mode not in VERIFIED_MODES:
            raise ValueError(
                f"verify_inputs: l2 with mode {self.mode}: norm proofs are checked by two "
                f"servers on field shares, in modes {', '.join(VERIFIED_MODES)}; set "
                "verify_inputs: none"
            )
        if self.noise_floor > 0 and self.mode not in NOISE_FLOOR_MODES:
            raise ValueError(
                f"noise_floor: {self.noise_floor:g} with mode {self.mode}: a noise floor splits "
                f"the noise two servers make jointly, in modes {', '.join(NOISE_FLOOR_MODES)}; "
                "set noise_floor: 0"
            )
        if self.noise_floor > 0 and self.standardize:
            raise ValueError(
                f"noise_floor: {self.noise_floor:g} with standardize: true: the statistics "
                "release is not accounted with a noise floor yet; set one of them off"
            )
        if self.workers > 1 and self.gc_lanes is not None and self.gc_lanes > 1:
            raise ValueError(
                f"gc_lanes: {self.gc_lanes} with workers: {self.workers}: rounds run on the "
                "workers only, and the data link's other connections would sit idle; set "
                "gc_lanes: 1 (workers split the coordinates across the Ray cluster)"
            )
        if not _NAME_RE.match(self.peer_name):
            raise ValueError(f"peer_name={self.peer_name!r} is not a certificate name")
        if not self.providers:
            raise ValueError("providers: list the allowed provider names")
        if len(set(self.providers)) != len(self.providers):
            raise ValueError("providers: duplicate names")
        bad = [p for p in self.providers if not _NAME_RE.match(p)]
        if bad:
            raise ValueError(f"providers: {bad} are not certificate names")
        if self.min_providers > len(self.providers):
            raise ValueError("min_providers exceeds the number of allowed providers")
        if self.batch_size > 0 and self.accountant == "pld" and self.mode in NOISY_MODES:
            raise ValueError(
                "fixed batches (batch_size > 0) are accounted with RDP only (dp-accounting has no "
                "PLD for sampling without replacement): set accountant: rdp"
            )
        if self.clip == "adaptive" and self.mode not in ADAPTIVE_CLIP_MODES:
            raise ValueError(
                f"clip: adaptive needs the noise added once to the sum or by each provider (modes "
                f"{', '.join(ADAPTIVE_CLIP_MODES)}); mode {self.mode} does not: use clip: fixed"
            )
        if self.clip == "decay" and self.clip_min > self.clip_norm:
            raise ValueError(
                f"clip: decay: clip_min {self.clip_min:g} is above clip_norm {self.clip_norm:g}, "
                "the first round's clip norm"
            )
        if (
            self.server_optimizer == "sgd"
            and self.adjacency == "example"
            and not self.dataset
            and self.expected_batch_size <= 0
        ):
            raise ValueError(
                "server_optimizer: sgd with providers' own data needs expected_batch_size, the "
                "examples expected per round over all providers (the step's denominator)"
            )
        if self.clip == "adaptive" and not self.dataset and self.expected_batch_size <= 0:
            raise ValueError(
                "clip: adaptive with providers' own data needs expected_batch_size, the "
                "examples expected per round over all providers"
            )
        if self.adjacency == "provider":
            self._check_provider_adjacency()
        if self.noise_schedule:
            self._check_noise_schedule()
        if self.standardize:
            self._check_standardize()
        if self.mode == "preprocessed" and self.pool_path is None:
            raise ValueError(
                "mode preprocessed keeps its noise pool on disk: set state_dir or pool_dir"
            )
        if (
            self.mode in NOISY_MODES
            and self.noise_multiplier == 0
            and self.calibration != "accountant"
            and self.step_epsilon <= 0
        ):
            raise ValueError(f"calibration {self.calibration} needs step_epsilon > 0")
        return self

    def _check_malicious(self) -> None:
        """security: malicious where the modes table has a variant, in the server process."""
        if (problem := malicious_refusal(self.backend, self.mode)) is not None:
            raise ValueError(problem)
        if self.workers > 1:
            raise ValueError(
                f"security: malicious with workers: {self.workers}: the Ray worker pairs have "
                "no malicious variant yet; set workers: 1"
            )

    def _check_provider_adjacency(self) -> None:
        """adjacency: provider: Poisson coins over providers, one clipped delta each; the
        servers' lr defaults to FedAvg's 1.0."""
        if self.batch_size > 0:
            raise ValueError(
                "adjacency: provider samples providers by their own Poisson coins "
                "(sampling_rate); batch_size (fixed batches of examples) does not apply: set "
                "batch_size: 0"
            )
        if self.max_batch_size > 1:
            raise ValueError(
                f"adjacency: provider: each provider sends one clipped model delta, so "
                f"max_batch_size {self.max_batch_size} does not apply: leave it 0"
            )
        if "lr" not in self.model_fields_set:
            self.lr = 1.0
        if "server_optimizer" not in self.model_fields_set:
            self.server_optimizer = "sgd"

    def _check_noise_schedule(self) -> None:
        """noise_schedule: provider-level, noise added once per release by the servers (their
        circuit or their own noise, whose size may change per release), phases in order."""
        if self.adjacency != "provider":
            raise ValueError("noise_schedule needs adjacency: provider (Geyer et al.'s DP-FedAvg)")
        if self.mode not in ("spgc", "dng"):
            raise ValueError(
                f"noise_schedule with mode {self.mode}: the noise of each release must be the "
                "servers' own (modes spgc and dng; a preprocessed pool or each provider's noise "
                "has one size)"
            )
        if self.noise_multiplier > 0:
            raise ValueError("noise_schedule sets each phase's noise: leave noise_multiplier 0")
        if self.clip == "adaptive":
            raise ValueError("noise_schedule with clip: adaptive is not supported: use fixed")
        try:
            check_schedule(self.schedule_phases())
        except ValueError as exc:
            raise ValueError(f"noise_schedule: {exc}") from None

    def _check_standardize(self) -> None:
        """standardize: the release as the run's first round (the servers' own noise, one
        size per release, a fixed clip) and declared feature ranges."""
        if self.mode not in STANDARDIZE_MODES:
            raise ValueError(
                f"standardize: true with mode {self.mode}: the statistics are released through "
                f"the servers' own noise, in modes {', '.join(STANDARDIZE_MODES)}"
            )
        if self.clip != "fixed" or self.adjacency != "example" or self.noise_schedule:
            raise ValueError(
                "standardize: true needs clip: fixed, adjacency: example and no noise_schedule"
            )
        if self.feature_ranges is None:
            raise ValueError(
                "standardize: true needs feature_ranges: each feature's [lo, hi] in column "
                "order (public bounds the values are clipped to, e.g. [[18, 95], [0, 1]]), or "
                "feature_ranges: test_data (the servers' test set's minimum and maximum)"
            )
        if self.feature_ranges == "test_data" and self.test_data in ("", "none"):
            raise ValueError(
                "feature_ranges: test_data needs the servers' own test set (test_data: a file "
                "or loader)"
            )

    def schedule_phases(self) -> list[tuple[int, float, float]]:
        """noise_schedule as (first release, noise multiplier, sampling rate) tuples."""
        return [(p.from_release, p.noise_multiplier, p.sampling_rate) for p in self.noise_schedule]

    def _check_task(self) -> None:
        """task and loss go together and fit the data set (a regression data set makes the
        default task regression)."""
        wanted = dataset_task(self.dataset) if self.dataset else None
        if wanted is not None and wanted != self.task:
            if "task" in self.model_fields_set:
                raise ValueError(
                    f"dataset {self.dataset} is a {wanted} data set, but task is {self.task}: "
                    f"set task: {wanted}"
                )
            self.task = wanted  # type: ignore[assignment]
        if (problem := task_loss_problem(self.task, self.loss)) is not None:
            raise ValueError(problem)

    @property
    def loss_name(self) -> str:
        """The loss trained: ``loss``, or the task's default when empty (spgc.learning.losses)."""
        return self.loss.strip() or DEFAULT_LOSS[self.task]

    def _check_model(self) -> None:
        """A named model must exist and read the dataset's examples, or every provider would
        fail mid-round; checked statically (no data or weights loaded)."""
        name = self.model_name
        if name not in MODEL_NAMES:
            raise ValueError(f"model must be one of {', '.join(MODEL_NAMES)}, got {self.model!r}")
        data_shape = MODEL_INPUT_SHAPES.get(self.dataset.strip().lower())
        if data_shape is not None and MODEL_INPUT_SHAPES[name] != data_shape:
            raise ValueError(
                f"model {name} reads inputs of shape {MODEL_INPUT_SHAPES[name]}, but dataset "
                f"{self.dataset} has examples of shape {data_shape}"
            )

    @property
    def role_name(self) -> str:
        """'h1' or 'h2' (for logs)."""
        return f"h{self.role}"

    @property
    def pool_path(self) -> Path | None:
        """The noise pool's directory (mode preprocessed), or None if none is configured."""
        if self.pool_dir is not None:
            return self.pool_dir
        return None if self.state_dir is None else self.state_dir / "noise-pool"

    @property
    def model_name(self) -> str:
        """The model trained: ``model`` if set (a reference as given, a built-in name in lower
        case), else the dataset's own (same name)."""
        ref = (self.model or self.dataset).strip()
        return ref if ":" in ref else ref.lower()

    @property
    def single_server(self) -> bool:
        """One server, no peer, no garbled circuit (modes plain and ldp)."""
        return self.mode in SINGLE_SERVER_MODES


# ------------------------------------------------------------------------------------ provider

"""Server daemon configuration: a YAML file, every key overridable by ``--set key=value``.

Nothing secret lives here or in argv: the TLS private key is a *path* to a file, and the round
seeds are drawn from ``os.urandom`` by the daemon, never configured.

Example ``server.yaml`` for H1::

    role: 1
    listen: 0.0.0.0:50051          # providers and the other server's control calls
    peer_address: h2.example:50051 # the other server's listen address
    peer_name: h2                  # the name its certificate must carry
    gc_address: 0.0.0.0:50061      # H1 listens here for the garbled-circuit link, H2 dials it
    tls: {cert: h1.pem, key: h1.key, ca: ca.pem}
    providers: [p1, p2, p3]
    dataset: cancer
    rounds: 20
    target_epsilon: 2.0
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from spgc.models import MODEL_INPUT_SHAPES, MODEL_NAMES
from spgc.modes import NOISY_MODES, SINGLE_SERVER_MODES, TRAINING_MODES

__all__ = [
    "ConfigError",
    "ServerConfig",
    "TlsPaths",
    "load_server_config",
]

CALIBRATIONS = ("analytic", "classic", "accountant")
ACCOUNTANTS = ("rdp", "pld")


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key."""


@dataclass
class TlsPaths:
    """PEM files: this server's certificate chain and private key, and the deployment CA."""

    cert: Path
    key: Path
    ca: Path


@dataclass
class ServerConfig:
    """One server daemon's settings. Keys in the "training" group must be identical on both
    servers (they are compared at the Handshake through the derived TrainingConfig)."""

    # --- this daemon
    role: int = 1
    listen: str = "127.0.0.1:50051"
    peer_address: str = "127.0.0.1:50052"
    peer_name: str = "h2"
    gc_address: str = "127.0.0.1:50061"
    tls: TlsPaths | None = None
    insecure: bool = False
    state_dir: Path | None = None
    # Where the daemon writes a JSON summary (rounds, test accuracy, epsilon, bytes) at the end.
    summary_path: Path | None = None
    # Continue a run from the checkpoint in state_dir after a restart (both servers must).
    resume: bool = True
    # Mode preprocessed: where this server keeps its noise shares (default state_dir/noise-pool),
    # how many rounds' worth H1 keeps ready, the largest block one production run makes, whether
    # H1 produces while rounds run (false: only `spgc server precompute` fills the pool), and how
    # long a round short of noise waits for production before it fails.
    pool_dir: Path | None = None
    pool_rounds: int = 4
    pool_block: int = 16384
    pool_produce: bool = True
    pool_wait: float = 600.0
    # Test loss and accuracy of each published model in the round log.
    evaluate: bool = True
    log_level: str = "INFO"
    # Seconds H1 waits for H2 (handshake, link) before giving up.
    connect_timeout: float = 60.0
    # Seconds H2 waits for a call from H1 between rounds before it concludes H1 is gone and
    # stops (never hang). Must exceed round_deadline plus H1's share of a round's work.
    peer_timeout: float = 300.0
    # --- training (identical on both servers)
    run_id: str = ""  # empty: H1 draws one, H2 adopts H1's at the Handshake
    providers: list[str] = field(default_factory=list)
    dataset: str = "cancer"
    # The model trained: empty means the dataset's paper model; otherwise a name of
    # spgc.models.MODEL_NAMES whose input shape is the dataset's (e.g. mnist-wide on mnist).
    model: str = ""
    mode: str = "spgc"
    rounds: int = 10
    min_providers: int = 2
    round_deadline: float = 30.0
    clip_norm: float = 1.0
    scale: float = 1024.0
    sampling_rate: float = 0.01
    # > 0: the paper's fixed batches instead of Poisson sampling: every provider shuffles its
    # data each epoch and contributes exactly this many examples per round (sampling_rate is
    # then unused). Accounted as sampling without replacement (replace-one DP, RDP only).
    batch_size: int = 0
    # Largest local batch of any provider (ring sizing). 0: the dataset's training-set size,
    # which bounds a Poisson batch whatever the split among providers.
    max_batch_size: int = 0
    target_epsilon: float = 2.0
    target_delta: float = 1e-5
    calibration: str = "accountant"
    accountant: str = "rdp"
    # Per-release epsilon for calibration classic/analytic (the paper's convention).
    step_epsilon: float = 0.0
    # Explicit noise multiplier; > 0 skips calibration.
    noise_multiplier: float = 0.0
    lr: float = 1e-3
    model_seed: int = 0

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
        """The model trained: ``model`` if set, else the dataset's own (same name)."""
        return (self.model or self.dataset).strip().lower()

    def _validate_model(self) -> None:
        """A named model must exist and read the dataset's examples, or every provider would
        fail mid-round; checked statically (no data or weights loaded)."""

        name = self.model_name
        if name not in MODEL_NAMES:
            raise ConfigError(f"model must be one of {', '.join(MODEL_NAMES)}, got {self.model!r}")
        data_shape = MODEL_INPUT_SHAPES.get(self.dataset.strip().lower())
        if data_shape is not None and MODEL_INPUT_SHAPES[name] != data_shape:
            raise ConfigError(
                f"model {name} reads inputs of shape {MODEL_INPUT_SHAPES[name]}, but dataset "
                f"{self.dataset} has examples of shape {data_shape}"
            )

    @property
    def single_server(self) -> bool:
        """One server, no peer, no garbled circuit (modes plain and ldp)."""
        return self.mode in SINGLE_SERVER_MODES

    def validate(self) -> ServerConfig:
        """Check every key; raises ConfigError naming the first bad one. Returns self."""
        if self.role not in (1, 2):
            raise ConfigError(f"role must be 1 or 2, got {self.role!r}")
        if self.peer_timeout <= self.round_deadline:
            raise ConfigError(
                f"peer_timeout ({self.peer_timeout:g} s) must exceed round_deadline "
                f"({self.round_deadline:g} s)"
            )
        if self.mode not in TRAINING_MODES:
            raise ConfigError(
                f"mode must be one of {', '.join(TRAINING_MODES)}, got {self.mode!r}"
            )
        if self.model:
            self._validate_model()
        if self.single_server and self.role != 1:
            raise ConfigError(
                f"mode {self.mode} runs ONE server (role 1, no peer, no garbled circuit); "
                f"a role-{self.role} server has nothing to do: start only role 1"
            )
        if self.calibration not in CALIBRATIONS:
            raise ConfigError(
                f"calibration must be one of {CALIBRATIONS}, got {self.calibration!r}"
            )
        if self.accountant not in ACCOUNTANTS:
            raise ConfigError(f"accountant must be one of {ACCOUNTANTS}, got {self.accountant!r}")
        if (self.tls is None) == (not self.insecure):
            if self.tls is None:
                raise ConfigError("give tls: {cert, key, ca} or set insecure: true explicitly")
            raise ConfigError("tls and insecure: true are mutually exclusive")
        if not self.providers:
            raise ConfigError("providers: list the allowed provider names")
        if len(set(self.providers)) != len(self.providers):
            raise ConfigError("providers: duplicate names")
        for key in ("rounds", "min_providers"):
            if getattr(self, key) < 1:
                raise ConfigError(f"{key} must be >= 1")
        if self.min_providers > len(self.providers):
            raise ConfigError("min_providers exceeds the number of allowed providers")
        for key in ("round_deadline", "clip_norm", "scale", "lr", "target_epsilon"):
            value = getattr(self, key)
            if not (math.isfinite(value) and value > 0):
                raise ConfigError(f"{key} must be finite and > 0, got {value}")
        if not 0 < self.sampling_rate <= 1:
            raise ConfigError(f"sampling_rate must be in (0, 1], got {self.sampling_rate}")
        if not 0 < self.target_delta < 1:
            raise ConfigError(f"target_delta must be in (0, 1), got {self.target_delta}")
        if (
            self.max_batch_size < 0
            or self.noise_multiplier < 0
            or self.step_epsilon < 0
            or self.batch_size < 0
        ):
            raise ConfigError(
                "max_batch_size, noise_multiplier, step_epsilon, batch_size must be >= 0"
            )
        if self.batch_size > 0 and self.accountant == "pld" and self.mode in NOISY_MODES:
            raise ConfigError(
                "fixed batches (batch_size > 0) are accounted with RDP only (dp-accounting has no "
                "PLD for sampling without replacement): set accountant: rdp"
            )
        if self.mode == "preprocessed" and self.pool_path is None:
            raise ConfigError(
                "mode preprocessed keeps its noise pool on disk: set state_dir or pool_dir"
            )
        if self.pool_rounds < 1 or self.pool_block < 1 or not self.pool_wait >= 0:
            raise ConfigError("pool_rounds and pool_block must be >= 1, pool_wait >= 0")
        if (
            self.mode in NOISY_MODES
            and self.noise_multiplier == 0
            and self.calibration != "accountant"
            and self.step_epsilon <= 0
        ):
            raise ConfigError(f"calibration {self.calibration} needs step_epsilon > 0")
        return self


_FIELDS = {f.name: f for f in dataclasses.fields(ServerConfig)}


def _coerce(key: str, value: Any) -> Any:
    """Convert a YAML/flag value to the type of field ``key``."""
    if key not in _FIELDS:
        raise ConfigError(f"unknown configuration key {key!r}")
    default = _FIELDS[key].default
    if key == "tls":
        if value is None:
            return None
        if not isinstance(value, dict) or set(value) != {"cert", "key", "ca"}:
            raise ConfigError("tls must be a mapping with exactly cert, key, ca")
        return TlsPaths(**{k: Path(v).expanduser() for k, v in value.items()})
    if key in ("state_dir", "summary_path", "pool_dir"):
        return None if value in (None, "") else Path(value).expanduser()
    if key == "providers":
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise ConfigError("providers must be a list of names")
        return list(value)
    try:
        if isinstance(default, bool):
            if isinstance(value, str):
                value = {"true": True, "false": False}.get(value.lower(), value)
            if not isinstance(value, bool):
                raise TypeError
            return value
        if isinstance(default, int):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise TypeError
            return int(value)
        if isinstance(default, float):
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{key}: cannot use {value!r}") from None


def _parse_override(item: str) -> tuple[str, Any]:
    key, sep, text = item.partition("=")
    if not sep:
        raise ConfigError(f"--set expects key=value, got {item!r}")
    key = key.strip().replace("-", "_")
    if key.startswith("tls."):  # --set tls.cert=...: one path of the tls mapping
        return key, text
    return key, yaml.safe_load(text) if text else ""


def load_server_config(
    path: Path | str | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    **explicit: Any,
) -> ServerConfig:
    """Read ``path`` (YAML mapping, optional), apply ``--set key=value`` overrides, then the
    ``explicit`` keyword values that are not None (dedicated flags), and validate.

    Relative TLS and state paths in the file are resolved against the file's directory.
    """
    raw: dict[str, Any] = {}
    base = Path.cwd()
    if path is not None:
        p = Path(path)
        loaded = yaml.safe_load(p.read_text()) or {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: the top level must be a mapping")
        raw.update(loaded)
        base = p.resolve().parent
        for sub in ("cert", "key", "ca"):
            tls = raw.get("tls")
            if isinstance(tls, dict) and sub in tls and not Path(tls[sub]).is_absolute():
                tls[sub] = str(base / tls[sub])
    for item in overrides:
        key, value = _parse_override(item)
        if key.startswith("tls."):
            tls = raw.get("tls") if isinstance(raw.get("tls"), dict) else {}
            raw["tls"] = {**tls, key[4:]: value}
        else:
            raw[key] = value
    raw.update({k: v for k, v in explicit.items() if v is not None})
    cfg = ServerConfig()
    for key, value in raw.items():
        setattr(cfg, key.replace("-", "_"), _coerce(key.replace("-", "_"), value))
    return cfg.validate()

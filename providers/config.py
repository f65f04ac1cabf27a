"""Provider configuration: a YAML file, every key overridable by a command-line flag.

Keys (flat; a nested mapping ``h1: {address: ..., name: ...}`` is read as ``h1_address``,
``h1_name``, and likewise ``tls: {cert, key, ca}``, ``provider: {index, count}``, ...)::

    name: p1                       # this provider's certificate name (its identity)
    h1_address: 127.0.0.1:50051    # H1 (or the single server of the one-server modes)
    h1_name: h1                    # the certificate name H1 must present
    h2_address: 127.0.0.1:50052    # H2 (empty for the one-server modes)
    h2_name: h2
    tls_cert: pki/p1.pem           # client certificate, private key (a FILE path: no secret
    tls_key: pki/p1.key            # ever travels in argv) and the CA that signs the servers
    tls_ca: pki/ca.pem
    insecure: false                # plaintext gRPC; only with an explicit `insecure: true`
    dataset: cancer                # the dataset whose part this provider holds
    provider_index: 0              # this provider's part (split_among_providers)
    provider_count: 3
    max_step_epsilon: 2.0          # refuse a run whose one step is weaker than (eps, delta)-DP
    step_delta: 1.0e-5             #   ... at this delta
    min_noise_multiplier: 0.8      # and/or whose noise std / sensitivity is below this
    retries: 5                     # submission attempts per server and round
    connect_timeout: 300           # seconds Hello keeps retrying a server that is not up yet
    backoff_initial: 0.5           # seconds before the first retry; doubles up to backoff_max
    backoff_max: 10.0
    poll_interval: 1.0             # seconds between RoundStatus polls while waiting
    long_poll: 10.0                # seconds a server may hold a RoundStatus until a round opens

A provider with neither ``max_step_epsilon`` nor ``min_noise_multiplier`` is refused unless
``allow_no_privacy: true`` says, explicitly, that it accepts any announced privacy level
(needed for the no-noise modes ``only-mpc`` and ``plain``).
"""

from __future__ import annotations

import argparse
import math
import re
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import yaml

from spgc.wire.tls import TlsFiles

__all__ = ["ConfigError", "ProviderConfig", "add_config_flags", "load_config"]

_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")


class ConfigError(ValueError):
    """The provider configuration is incomplete or inconsistent (the message says which key)."""


@dataclass(frozen=True)
class ProviderConfig:
    """Everything a provider needs; see the module docstring for the meaning of each key."""

    name: str = ""
    h1_address: str = ""
    h1_name: str = "h1"
    h2_address: str = ""
    h2_name: str = "h2"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_ca: Path | None = None
    insecure: bool = False
    dataset: str = "cancer"
    dataset_path: Path | None = None
    split_seed: int | None = None
    provider_index: int = 0
    provider_count: int = 1
    max_step_epsilon: float | None = None
    step_delta: float = 1e-5
    min_noise_multiplier: float | None = None
    allow_no_privacy: bool = False
    retries: int = 5
    connect_timeout: float = 300.0
    backoff_initial: float = 0.5
    backoff_max: float = 10.0
    poll_interval: float = 1.0
    long_poll: float = 10.0
    rpc_timeout: float = 120.0
    wait_timeout: float | None = None
    max_rounds: int | None = None
    chunk_bytes: int = 0
    # Examples per vectorised gradient chunk; lowered automatically for big models so a chunk's
    # float64 gradients stay within 128 MiB (spgc.gradients.bounded_chunk).
    gradient_chunk: int = 256

    # ------------------------------------------------------------------ derived views

    @property
    def tls(self) -> TlsFiles | None:
        """The TLS files, or None when running with ``insecure``."""
        if self.insecure:
            return None
        assert self.tls_cert and self.tls_key and self.tls_ca  # validate() checked
        return TlsFiles(cert=Path(self.tls_cert), key=Path(self.tls_key), ca=Path(self.tls_ca))

    @property
    def two_servers(self) -> bool:
        """Whether an H2 address is configured."""
        return bool(self.h2_address)

    def with_overrides(self, **changes: Any) -> ProviderConfig:
        """A copy with some keys changed (None values are ignored), validated."""
        kept = {k: v for k, v in changes.items() if v is not None}
        return _coerce(replace(self, **kept)).validate()

    # ------------------------------------------------------------------ checks

    def validate(self) -> ProviderConfig:
        """Raise :class:`ConfigError` naming the first bad key; returns ``self``."""
        if not _NAME_RE.match(self.name or ""):
            raise ConfigError(
                f"name={self.name!r}: give this provider's certificate name (letters, digits, "
                "inner hyphens)"
            )
        if not self.h1_address:
            raise ConfigError("h1_address is required (H1, or the single server)")
        for key in ("h1_name", "h2_name"):
            if not _NAME_RE.match(getattr(self, key)):
                raise ConfigError(f"{key}={getattr(self, key)!r} is not a certificate name")
        if self.insecure:
            if any((self.tls_cert, self.tls_key, self.tls_ca)):
                raise ConfigError("insecure: true and tls_cert/tls_key/tls_ca are exclusive")
        else:
            for key in ("tls_cert", "tls_key", "tls_ca"):
                value = getattr(self, key)
                if value is None:
                    raise ConfigError(
                        f"{key} is required (TLS is on by default; `insecure: true` turns it off "
                        "explicitly)"
                    )
                if not Path(value).is_file():
                    raise ConfigError(f"{key}: {value} is not a file")
        if self.provider_count < 1:
            raise ConfigError(f"provider_count must be >= 1, got {self.provider_count}")
        if not 0 <= self.provider_index < self.provider_count:
            raise ConfigError(
                f"provider_index must be in [0, {self.provider_count}), got {self.provider_index}"
            )
        if self.max_step_epsilon is not None and not (
            self.max_step_epsilon > 0 and math.isfinite(self.max_step_epsilon)
        ):
            raise ConfigError(f"max_step_epsilon must be > 0, got {self.max_step_epsilon}")
        if not 0 < self.step_delta < 1:
            raise ConfigError(f"step_delta must be in (0, 1), got {self.step_delta}")
        if self.min_noise_multiplier is not None and not self.min_noise_multiplier > 0:
            raise ConfigError(f"min_noise_multiplier must be > 0, got {self.min_noise_multiplier}")
        if (
            self.max_step_epsilon is None
            and self.min_noise_multiplier is None
            and not self.allow_no_privacy
        ):
            raise ConfigError(
                "no minimum privacy: set max_step_epsilon (with step_delta) and/or "
                "min_noise_multiplier, or `allow_no_privacy: true` to accept any announced level"
            )
        if self.retries < 1:
            raise ConfigError(f"retries must be >= 1, got {self.retries}")
        for key in (
            "backoff_initial",
            "backoff_max",
            "poll_interval",
            "rpc_timeout",
            "connect_timeout",
        ):
            if not getattr(self, key) > 0:
                raise ConfigError(f"{key} must be > 0, got {getattr(self, key)}")
        if not 0 <= self.long_poll < self.rpc_timeout:
            raise ConfigError(
                f"long_poll must be in [0, rpc_timeout={self.rpc_timeout:g}), got {self.long_poll}"
            )
        if self.wait_timeout is not None and not self.wait_timeout > 0:
            raise ConfigError(f"wait_timeout must be > 0, got {self.wait_timeout}")
        if self.max_rounds is not None and self.max_rounds < 1:
            raise ConfigError(f"max_rounds must be >= 1, got {self.max_rounds}")
        if self.chunk_bytes < 0 or self.chunk_bytes % 8:
            raise ConfigError(
                f"chunk_bytes must be a multiple of 8 (0: server's), got {self.chunk_bytes}"
            )
        if self.gradient_chunk < 1:
            raise ConfigError(f"gradient_chunk must be >= 1, got {self.gradient_chunk}")
        return self

    def describe(self) -> dict[str, Any]:
        """The configuration as plain values (paths as strings), for logs."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(self).items()}


# ---------------------------------------------------------------------- reading


def _field_types() -> dict[str, type]:
    """Base type of each field (``X | None`` -> ``X``)."""
    hints = typing.get_type_hints(ProviderConfig)
    out: dict[str, type] = {}
    for f in fields(ProviderConfig):
        hint = hints[f.name]
        if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
            hint = next(a for a in typing.get_args(hint) if a is not type(None))
        out[f.name] = hint
    return out


def _convert(key: str, value: Any, kind: type, base: Path | None) -> Any:
    if value is None:
        return None
    try:
        if kind is bool:
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError(f"not a boolean: {value!r}")
        if kind is Path:
            p = Path(str(value)).expanduser()
            return (base / p) if base is not None and not p.is_absolute() else p
        if kind is int:
            if isinstance(value, float) and not value.is_integer():
                raise ValueError(f"not an integer: {value!r}")
            return int(str(value).replace("_", "")) if isinstance(value, str) else int(value)
        if kind is float:
            return float(value)
        return str(value)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{key}: {exc}") from None


def _coerce(cfg: ProviderConfig, base: Path | None = None) -> ProviderConfig:
    kinds = _field_types()
    changes = {
        f.name: _convert(f.name, getattr(cfg, f.name), kinds[f.name], base) for f in fields(cfg)
    }
    return replace(cfg, **changes)


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{str(key).replace('-', '_')}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}_"))
        else:
            out[name] = value
    return out


def from_mapping(data: Mapping[str, Any], base: Path | None = None) -> ProviderConfig:
    """A ProviderConfig from a (possibly nested) mapping; relative paths resolve from ``base``.

    Unknown keys are refused (a misspelt ``max_step_epsilon`` must not silently drop the
    privacy minimum). Not validated: call :meth:`ProviderConfig.validate`.
    """
    flat = _flatten(data)
    known = {f.name for f in fields(ProviderConfig)}
    unknown = sorted(set(flat) - known)
    if unknown:
        raise ConfigError(f"unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
    kinds = _field_types()
    values = {k: _convert(k, v, kinds[k], base) for k, v in flat.items()}
    return ProviderConfig(**values)


def load_config(
    path: Path | str | None = None, overrides: Mapping[str, Any] | None = None
) -> ProviderConfig:
    """Read ``path`` (YAML) if given, apply ``overrides`` (None values ignored) and validate.

    Relative paths in the file resolve from the file's directory; those in overrides from the
    working directory.
    """
    cfg = ProviderConfig()
    if path is not None:
        p = Path(path)
        try:
            data = yaml.safe_load(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"configuration file {p} does not exist") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: invalid YAML: {exc}") from None
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"{p}: expected a mapping of keys, got {type(data).__name__}")
        cfg = from_mapping(data, base=p.resolve().parent)
    if overrides:
        kinds = _field_types()
        changes = {k: _convert(k, v, kinds[k], None) for k, v in overrides.items() if v is not None}
        cfg = replace(cfg, **changes)
    return _coerce(cfg).validate()


# ---------------------------------------------------------------------- flags


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` and one ``--KEY`` flag per configuration key (default: unset)."""
    parser.add_argument("--config", type=Path, metavar="FILE", help="provider YAML file")
    kinds = _field_types()
    group = parser.add_argument_group("configuration keys (override the file)")
    for f in fields(ProviderConfig):
        flag = "--" + f.name.replace("_", "-")
        default = None if f.default is MISSING else f.default
        helptext = f"(default: {default})"
        if kinds[f.name] is bool:
            group.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=helptext,
            )
        else:
            group.add_argument(flag, dest=f.name, default=None, metavar="VALUE", help=helptext)


def config_from_args(args: argparse.Namespace) -> ProviderConfig:
    """The validated configuration from parsed ``add_config_flags`` arguments."""
    overrides = {f.name: getattr(args, f.name, None) for f in fields(ProviderConfig)}
    return load_config(args.config, overrides)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse ``python -m spgc.providers`` arguments."""
    parser = argparse.ArgumentParser(
        prog="python -m spgc.providers",
        description="SPGC provider: share clipped, fixed-point gradient sums with the servers.",
    )
    add_config_flags(parser)
    parser.add_argument("--verbose", "-v", action="store_true", help="debug logging")
    return parser.parse_args(argv)

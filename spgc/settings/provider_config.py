"""The provider daemon's configuration schema (``spgc provider``; spgc.settings.config has
the servers' and what both share: the error format, TLS paths, the one-line errors)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from spgc.protocol.modes import (
    DEFAULT_SECURITY,
    SECURITY_NAMES,
    TRAINING_MODES,
)
from spgc.settings.config import (
    _NAME_RE,
    LOG_LEVELS,
    TlsPaths,
    _check_dial_address,
    _Schema,
)
from spgc.settings.config_errors import flatten_keys
from spgc.wire.tls import TlsFiles

__all__ = ["ProviderConfig"]


class ProviderConfig(_Schema):
    """One provider. Keys are flat; a nested mapping ``h1: {address: ..., name: ...}`` or
    ``tls: {cert, key, ca}`` (in a file, or ``tls=TlsPaths(cert=..., key=..., ca=...)`` in
    code, as a server takes it) reads as ``h1_address``, ``h1_name``, ``tls_cert``, ..."""

    model_config = ConfigDict(extra="forbid", validate_default=True, frozen=True)

    name: str = Field("", description="this provider's certificate name (its identity)")
    h1_address: str = Field("", description="H1's address (or the single server's)")
    h1_name: str = Field("h1", description="the certificate name H1 must present")
    h2_address: str = Field("", description="H2's address (empty for the one-server modes)")
    h2_name: str = Field("h2", description="the certificate name H2 must present")
    tls_cert: Path | None = Field(None, description="client certificate (PEM)")
    tls_key: Path | None = Field(
        None, description="its private key: a file path (or env:VAR naming one), never the key"
    )
    tls_ca: Path | None = Field(None, description="the CA that signs the servers (PEM)")
    insecure: bool = Field(False, description="plaintext gRPC; development only")
    dataset: str = Field(
        "",
        description="the built-in data set whose part this provider holds (empty: the one the "
        "servers announce); ignored with data",
    )
    data: str = Field(
        "",
        description="your own training data: `package.module:loader` (returns x, y or a torch "
        "Dataset), or a .csv file (a header row, commas, the data_label column and numeric "
        "features) or .npz file (arrays x, y): see Data files below",
    )
    data_label: str = Field("label", description="the label column of a data .csv")
    model: str = Field(
        "",
        description="your own model, `package.module:factory` or `file.py:factory` (empty: the "
        "built-in model the servers announce); it must match the servers' architecture",
    )
    loss: str = Field(
        "",
        description="when the servers' plan trains your own loss `package.module:function`: the "
        "same reference (a provider imports no code the servers name); the task and the "
        "built-in losses come from the plan",
    )
    task: Literal["", "classification", "regression"] = Field(
        "",
        description="what the labels of your own data are: class labels 0..C-1 (classification) "
        "or real targets (regression), as read and checked at the start; empty: class labels "
        "at the start, the plan's task once connected; when set, a plan of another task is "
        "refused",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="where gradients are computed: auto (a GPU if there is one), cpu, cuda"
    )
    dataset_path: Path | None = Field(
        None, description="a local copy of the data set's file (default: the packaged one)"
    )
    split_seed: int | None = Field(None, description="seed of the split among providers")
    provider_index: int = Field(0, ge=0, description="this provider's part of the data")
    provider_count: int = Field(
        1, ge=1, description="how many parts the data (built-in or data) is split into"
    )
    max_step_epsilon: float | None = Field(
        None, gt=0, description="refuse a run whose one step is weaker than (eps, step_delta)-DP"
    )
    step_delta: float = Field(1e-5, gt=0, lt=1, description="the delta of max_step_epsilon")
    min_noise_multiplier: float | None = Field(
        None, gt=0, description="refuse a run whose noise std / sensitivity is below this"
    )
    # --- min_noise_floor (issue 46 item 4) ---
    min_noise_floor: float = Field(
        0.0,
        ge=0.0,
        lt=1.0,
        description="refuse a plan whose noise_floor (each server's own share of the noise, "
        "what survives a server that strips the joint noise) is below this; 0: any",
    )
    # --- min_security (issue 46 item 2) ---
    min_security: Literal[SECURITY_NAMES] = Field(  # type: ignore[valid-type]
        DEFAULT_SECURITY,
        description="refuse a plan whose servers' circuits are secure against less: malicious "
        "takes part only where one server that deviates cannot strip or bias the noise "
        "(security: malicious: authenticated garbling or GMW); semi-honest: any",
    )
    max_total_epsilon: float | None = Field(
        None,
        gt=0,
        description="the most epsilon this provider's data set may spend in its lifetime, all "
        "runs together (its budget_file): a run that could pass it is declined, naming the "
        "figures, and a run is left before a release would pass it",
    )
    max_training_rounds: int | None = Field(
        None, ge=1, description="refuse a plan of more rounds than this"
    )
    state_dir: Path | None = Field(
        None,
        description="this provider's own state: its data sets' budget files (default: "
        "$XDG_STATE_HOME/spgc, or ~/.local/state/spgc when XDG_STATE_HOME is unset)",
    )
    budget_file: Path | None = Field(
        None,
        description="the privacy budget file of this provider's data set, kept across runs "
        "(default: state_dir/budget/SHA.json, SHA the SHA-256 of the data set's contents); "
        "`spgc account --budget FILE` prints it",
    )
    accept_modes: list[Literal[TRAINING_MODES]] = Field(
        default_factory=list, description="refuse a plan in any other mode (empty: any mode)"
    )
    require_verified_inputs: bool = Field(
        False,
        description="refuse a plan whose servers do not check every provider's norm proof "
        "(verify_inputs: l2): without it, any provider can poison the sum",
    )
    allow_no_privacy: bool = Field(
        False,
        description="accept any announced privacy level, no-noise modes included (only-mpc, "
        "plain); needed when neither minimum above is set",
    )
    standardize: bool = Field(
        False,
        description="take part in the servers' release of the feature statistics (standardize: "
        "true in their plan: this provider's per-feature sums, sums of squares and row count "
        "go as shares before training, counted in its budget) and train on its features "
        "standardised with the released means and deviations; a plan that differs is refused",
    )
    hide_participation: bool = Field(
        True,
        description="adjacency: provider: in a round this provider's coin leaves it out, it "
        "trains on its data anyway and discards the result before sharing zeros, so its shares "
        "leave when a selected provider's would; false saves that work, but a server timing "
        "the arrivals could then guess who took part, voiding amplification by sampling "
        "against that server",
    )
    retries: int = Field(5, ge=1, description="submission attempts per server and round")
    connect_timeout: float = Field(
        300.0,
        gt=0,
        description="seconds Hello keeps retrying a server that is not up yet (saying once "
        "'waiting for h1 at ADDRESS (up to N s)', then again at the backoff)",
    )
    backoff_initial: float = Field(
        0.5, gt=0, description="seconds before the first retry; doubles up to backoff_max"
    )
    backoff_max: float = Field(10.0, gt=0, description="longest wait between retries (seconds)")
    poll_interval: float = Field(1.0, gt=0, description="seconds between RoundStatus polls")
    long_poll: float = Field(
        10.0, ge=0, description="seconds a server may hold a RoundStatus until a round opens"
    )
    rpc_timeout: float = Field(120.0, gt=0, description="deadline of one call (seconds)")
    wait_timeout: float | None = Field(
        None, gt=0, description="give up when no round opens for this long (seconds)"
    )
    max_rounds: int | None = Field(
        None, ge=1, description="leave after taking part in this many rounds"
    )
    chunk_bytes: int = Field(
        0, ge=0, multiple_of=8, description="bytes per streamed chunk (0: the server's choice)"
    )
    gradient_chunk: int = Field(
        256,
        ge=1,
        description="examples per vectorised gradient chunk (lowered for big models so a "
        "chunk's float64 gradients stay within 128 MiB)",
    )
    log_level: Literal[LOG_LEVELS] = Field("info", description="debug, info, warning or error")
    log_format: Literal["text", "json"] = Field("text", description="log lines: text or json")

    @model_validator(mode="before")
    @classmethod
    def _flatten_tls(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            return data
        data = dict(data)
        tls = data.pop("tls", None)  # tls: None (or an empty `tls:` in a file): no TLS files
        if isinstance(tls, TlsPaths):  # the server's shape, in code
            tls = tls.model_dump()
        if tls is not None:
            if not isinstance(tls, Mapping):
                raise ValueError(
                    f"tls: give TlsPaths(cert=..., key=..., ca=...) or a mapping with cert, key "
                    f"and ca, got {tls!r}"
                )
            flat = [k for k in ("tls_cert", "tls_key", "tls_ca") if k in data]
            if flat:
                raise ValueError(f"tls and {', '.join(flat)} both given: give one of them")
            data["tls"] = tls
        return flatten_keys(data)

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.lower() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _consistent(self) -> ProviderConfig:
        if not _NAME_RE.match(self.name or ""):
            raise ValueError(
                f"name={self.name!r}: give this provider's certificate name (letters, digits, "
                "inner hyphens)"
            )
        if not self.h1_address:
            raise ValueError("h1_address is required (H1, or the single server)")
        for key in ("h1_address", "h2_address"):
            if getattr(self, key):
                _check_dial_address(key, getattr(self, key))
        for key in ("h1_name", "h2_name"):
            if not _NAME_RE.match(getattr(self, key)):
                raise ValueError(f"{key}={getattr(self, key)!r} is not a certificate name")
        if self.insecure:
            if any((self.tls_cert, self.tls_key, self.tls_ca)):
                raise ValueError("insecure: true and tls_cert/tls_key/tls_ca are exclusive")
        else:
            for key in ("tls_cert", "tls_key", "tls_ca"):
                value = getattr(self, key)
                if value is None:
                    raise ValueError(
                        f"{key} is required (TLS is on by default; `insecure: true` turns it off "
                        "explicitly)"
                    )
                if not Path(value).is_file():
                    raise ValueError(f"{key}: {value} is not a file")
        if self.provider_index >= self.provider_count:
            raise ValueError(
                f"provider_index must be in [0, {self.provider_count}), got {self.provider_index}"
            )
        if (
            self.max_step_epsilon is None
            and self.min_noise_multiplier is None
            and not self.allow_no_privacy
        ):
            raise ValueError(
                "no minimum privacy: set max_step_epsilon (with step_delta) and/or "
                "min_noise_multiplier, or `allow_no_privacy: true` to accept any announced level"
            )
        if self.long_poll >= self.rpc_timeout:
            raise ValueError(
                f"long_poll must be in [0, rpc_timeout={self.rpc_timeout:g}), got {self.long_poll}"
            )
        return self

    @property
    def tls(self) -> TlsFiles | None:
        """The TLS files, or None when running with ``insecure``."""
        if self.insecure:
            return None
        assert self.tls_cert and self.tls_key and self.tls_ca  # the validator checked
        return TlsFiles(cert=Path(self.tls_cert), key=Path(self.tls_key), ca=Path(self.tls_ca))

    @property
    def two_servers(self) -> bool:
        """Whether an H2 address is configured."""
        return bool(self.h2_address)

    def describe(self) -> dict[str, Any]:
        """The configuration as plain values (paths as strings), for logs."""
        return self.model_dump(mode="json")

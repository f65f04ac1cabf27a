"""Configuration files: reading a daemon's YAML file (``--config FILE``), the ``--set
key=value`` overrides, relative paths and ``env:NAME`` references, and the schemas' key tables
(``spgc config show``, docs/CONFIG.md). The schemas themselves are :mod:`spgc.settings.config`'s.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from spgc.settings.config import LOG_LEVELS, ConfigError, ServerConfig, TlsPaths
from spgc.settings.config_errors import flatten_keys, format_errors, type_words
from spgc.settings.provider_config import ProviderConfig

__all__ = [
    "SCHEMAS",
    "add_daemon_arguments",
    "config_markdown",
    "describe_keys",
    "detect_schema",
    "load_config",
    "load_provider_config",
    "load_server_config",
    "parse_override",
]

_ENV_PREFIX = "env:"


# ------------------------------------------------------------------------------------ loading

_C = TypeVar("_C", ServerConfig, ProviderConfig)
SCHEMAS: dict[str, type[BaseModel]] = {"server": ServerConfig, "provider": ProviderConfig}


def _is_path_field(schema: type[BaseModel], key: str) -> bool:
    """Whether ``key`` (dotted for nested models) holds a filesystem path."""
    head, _, rest = key.partition(".")
    field = schema.model_fields.get(head)
    if field is None:
        return False
    text = str(field.annotation)
    if rest:
        return "TlsPaths" in text and rest in TlsPaths.model_fields
    return "Path" in text or "TlsPaths" in text


# Keys naming a file by a string that may also be something else (a built-in name, a loader).
# Not `model`: the servers compare its reference as written (TrainingConfig.model).
_REFERENCE_FIELDS = frozenset({"data", "test_data"})
_DATA_SUFFIXES = (".csv", ".npz")


def _resolve_reference(value: str, base: Path) -> str:
    """A relative file in ``value`` ("file.py:factory", "data.csv") made absolute against the
    configuration file's directory when the file is there; anything else as given (a built-in
    name, "package.module:factory", a file relative to the working directory)."""
    target, colon, attr = value.rpartition(":")
    if colon and target.endswith(".py"):
        path, rest = target, f":{attr}"
    elif not colon and value.lower().endswith(_DATA_SUFFIXES):
        path, rest = value, ""
    else:
        return value
    candidate = Path(path).expanduser()
    if candidate.is_absolute() or not (base / candidate).is_file():
        return value
    return f"{base / candidate}{rest}"


def _resolve_paths(value: Any, base: Path, where: str) -> Any:
    """Relative paths resolve against the file's directory; ``env:NAME`` reads the path from
    the environment (so a key's location need not be written anywhere)."""
    if isinstance(value, Mapping):
        return {k: _resolve_paths(v, base, f"{where}.{k}") for k, v in value.items()}
    if value is None or value == "":
        return None
    text = str(value)
    if text.startswith(_ENV_PREFIX):
        name = text[len(_ENV_PREFIX) :]
        if name not in os.environ:
            raise ConfigError(f"{where}: environment variable {name} (given {text!r}) is not set")
        text = os.environ[name]
    p = Path(text).expanduser()
    return p if p.is_absolute() else base / p


def parse_override(item: str) -> tuple[str, Any]:
    """``key=value`` (``--set``): the value is read as YAML (numbers, booleans, lists)."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"--set expects key=value, got {item!r}")
    try:
        value = yaml.safe_load(text) if text else ""
    except yaml.YAMLError:
        value = text
    return key.strip().replace("-", "_"), value


def _set(raw: dict[str, Any], key: str, value: Any) -> None:
    head, _, rest = key.partition(".")
    if not rest:
        raw[head] = value
        return
    inner = raw.get(head)
    raw[head] = {**(inner if isinstance(inner, Mapping) else {}), rest: value}


def load_config(
    schema: type[_C],
    path: Path | str | None = None,
    overrides: Iterable[str] = (),
    **explicit: Any,
) -> _C:
    """Read ``path`` (a YAML mapping; optional), apply ``--set key=value`` ``overrides``
    (dotted keys reach into mappings: ``tls.cert=...``), then the ``explicit`` keyword values
    that are not None, and validate against ``schema``. ConfigError on any problem.

    Relative paths in the file resolve against the file's directory, those in overrides and
    explicit values against the working directory.
    """
    raw: dict[str, Any] = {}
    source = "command line"
    if path is not None:
        p = Path(path)
        source = str(p)
        try:
            loaded = yaml.safe_load(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"configuration file {p} does not exist") from None
        except IsADirectoryError:
            raise ConfigError(f"configuration file {p} is a directory") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"{p}: not valid YAML: {exc}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, Mapping):
            raise ConfigError(
                f"{p}: the top level must be a mapping of keys, got {type(loaded).__name__}"
            )
        if schema is ProviderConfig:
            loaded = flatten_keys(loaded)
        base = p.resolve().parent
        for key, value in loaded.items():
            if _is_path_field(schema, str(key)):
                value = _resolve_paths(value, base, f"{p}: {key}")
            elif str(key) in _REFERENCE_FIELDS and isinstance(value, str):
                value = _resolve_reference(value, base)
            raw[str(key)] = value
    cwd = Path.cwd()
    for item in overrides:
        key, value = parse_override(item)
        if _is_path_field(schema, key):
            value = _resolve_paths(value, cwd, f"--set {key}")
        _set(raw, key, value)
    for key, value in explicit.items():
        if value is not None:
            raw[key] = _resolve_paths(value, cwd, key) if _is_path_field(schema, key) else value
    if path is not None and (overrides or any(v is not None for v in explicit.values())):
        source += " (with command-line overrides)"
    try:
        return schema.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, schema, source, raw)) from None


def load_server_config(
    path: Path | str | None = None, overrides: Iterable[str] = (), **explicit: Any
) -> ServerConfig:
    """:func:`load_config` for the server daemon."""
    return load_config(ServerConfig, path, overrides, **explicit)


def load_provider_config(
    path: Path | str | None = None, overrides: Iterable[str] = (), **explicit: Any
) -> ProviderConfig:
    """:func:`load_config` for the provider."""
    return load_config(ProviderConfig, path, overrides, **explicit)


def add_daemon_arguments(parser: argparse.ArgumentParser, example: str) -> None:
    """The options every daemon takes: ``--config FILE``, ``--set KEY=VALUE`` (repeatable;
    ``example`` shows one), ``--log-level`` and ``--log-format`` (the keys of the same names)."""
    parser.add_argument("--config", type=Path, metavar="FILE", help="YAML configuration file")
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help=f"override a configuration key (repeatable; the value is YAML), e.g. {example}",
    )
    parser.add_argument("--log-level", choices=LOG_LEVELS, help="key log_level")
    parser.add_argument("--log-format", choices=("text", "json"), help="key log_format")


def detect_schema(path: Path | str) -> str:
    """'server' or 'provider' for ``spgc config check`` without ``--kind``: a file with a
    provider's identity keys is a provider's, anything else a server's."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return "server"  # load_config reports the problem
    keys = set(flatten_keys(data)) if isinstance(data, Mapping) else set()
    return "provider" if keys & {"name", "h1_address", "h1_name"} else "server"


# ------------------------------------------------------------------------------------ docs


def describe_keys(schema: type[BaseModel]) -> list[tuple[str, str, str, str]]:
    """(key, type, default, meaning) for every key of ``schema``, nested keys dotted."""
    rows = []
    for name, field in schema.model_fields.items():
        ann = field.annotation
        if name == "tls" and schema is ServerConfig:
            for sub, f in TlsPaths.model_fields.items():
                rows.append((f"tls.{sub}", "path", "(none)", f.description or ""))
            continue
        default = field.get_default(call_default_factory=True)
        kind = type_words(ann)
        rows.append((name, kind, "(none)" if default is None else repr(default),
                     field.description or ""))  # fmt: skip
    return rows


def config_markdown() -> str:
    """docs/CONFIG.md, generated from the schemas (a test fails when the file is stale)."""
    out = [
        "# Configuration",
        "",
        "Generated from `spgc/settings/config.py` and `provider_config.py`",
        "(`spgc config show server --markdown > docs/CONFIG.md`); do not edit by hand:",
        "`tests/library/settings/test_config.py` fails when this file is stale.",
        "",
        "Each daemon reads one YAML file (`--config FILE`); every key can be overridden with",
        "`--set key=value` (repeatable; the value is read as YAML; `--set tls.cert=PATH` reaches",
        "into a mapping). Relative paths in the file resolve against the file's directory (a",
        "path given with `--set`, against the directory the daemon runs in), and so do the",
        "files of `data` and `test_data` when they are there (else the directory the daemon",
        "runs in); `model` is read as written, from the directory the daemon runs in: the",
        "servers compare it as written. A path given as `env:NAME` is read from environment",
        "variable NAME. Unknown keys are refused. `spgc config check FILE` validates a file;",
        "`spgc config show server|provider` prints this.",
        "",
    ]
    for kind, schema in SCHEMAS.items():
        summary = " ".join((schema.__doc__ or "").split("\n\n")[0].split())
        out += [f"## `spgc {kind}` ({schema.__name__})", "", summary, ""]
        out += ["| key | type | default | meaning |", "|---|---|---|---|"]
        for key, kind_, default, meaning in describe_keys(schema):
            cell = kind_.replace("|", "\\|")
            out.append(f"| `{key}` | {cell} | `{default}` | {meaning} |")
        out.append("")
    return "\n".join(out + list(DATA_FILES_MARKDOWN))


#: docs/CONFIG.md's last section: the files `data` and `test_data` read (spgc.learning.data).
DATA_FILES_MARKDOWN = (
    "## Data files (`data`, `test_data`)",
    "",
    "`data` (a provider's) and `test_data` (the servers') name a built-in data set, a loader",
    "(`package.module:loader` or `file.py:loader`, returning `(x, y)`, `(x_train, y_train,",
    "x_test, y_test)` or a torch `Dataset` of `(x, y)` items), or one of these files:",
    "",
    "- **`.csv`**: UTF-8 text (a byte-order mark is skipped), fields separated by commas, a",
    "  field may be quoted with `\"` (Python's `csv` module). A file with another separator",
    "  (`;`, tab, `|`) is refused, saying so. The first line that is not blank is the header,",
    "  naming the columns (spaces around a name are dropped); blank lines are skipped; every",
    "  other row has as many fields as the header.",
    "- **Which columns are features**: the column named by `data_label` (`test_data_label` for",
    "  the servers; both `label` by default) holds the labels and must appear exactly once.",
    "  Every other column, in the file's order, is a feature: an example is its row without",
    "  the label, of shape `(features,)`, read as float32, so the model takes the features in",
    "  the file's order.",
    "- **Values**: every cell is a number as Python's `float()` reads it (`3`, `-0.5`,",
    "  `2e-3`). An empty cell, text, NaN, an infinity or a value beyond float32 is refused,",
    "  naming the file's line and column and the example and feature index (0-based).",
    "- **Labels**: with `task: classification` (the default but for a built-in regression data",
    "  set), whole numbers 0..C-1 (`2` or `2.0`), and the model has at least C outputs; with",
    "  `task: regression`, real numbers, one target per row. The providers follow the task of",
    "  the servers' plan.",
    "- **`.npz`**: arrays `x` (one row per example, any shape after it) and `y`, optionally",
    "  `x_test` and `y_test`; an integer `x` stays int64 (token ids for an embedding), any",
    "  other becomes float32. A .csv has no test split: every row is a training example.",
    "",
)

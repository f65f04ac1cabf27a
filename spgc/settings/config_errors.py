"""How configuration problems are worded for people (one line per problem: the key, the value
given and what the schema allows), and the flat key form of nested configuration files. Used by
the schemas (spgc.settings.config) and the file loader (spgc.settings.config_files); it reads the
schemas only
through pydantic's field information."""

from __future__ import annotations

import difflib
import re
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ValidationError

__all__ = ["flatten_keys", "format_errors", "type_words"]


def flatten_keys(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested mappings as flat keys (``tls: {cert: ...}`` -> ``tls_cert``), dashes as
    underscores."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{str(key).replace('-', '_')}"
        if isinstance(value, Mapping):
            out.update(flatten_keys(value, f"{name}_"))
        else:
            out[name] = value
    return out


_BOUND_WORDS = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "multiple_of": "a multiple of"}


def _allowed(schema: type[BaseModel], loc: Sequence[Any]) -> str:
    """What a key accepts, in words, from its schema field (type and bounds)."""
    model: type[BaseModel] | None = schema
    field = None
    for part in loc:
        if isinstance(part, int) or str(part).isdigit():
            continue  # an item of a list of nested models
        field = None if model is None else model.model_fields.get(str(part))
        if field is None:
            return ""
        model = _nested_model(field.annotation)
    if field is None:
        return ""
    kind = type_words(field.annotation)
    bounds = []
    for meta in field.metadata:
        for attr, word in _BOUND_WORDS.items():
            value = getattr(meta, attr, None)
            if value is not None:
                shown = f"{value:g}" if isinstance(value, float) else str(value)
                bounds.append(f"{word} {shown}")
    return " ".join([kind, *bounds]).strip()


def _nested_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, or the item of a list of models (None: a plain
    value)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, BaseModel):
            return candidate
    return None


def _model_at(schema: type[BaseModel], loc: Sequence[Any]) -> type[BaseModel]:
    """The model whose keys ``loc`` points into (``schema`` itself for a top-level key)."""
    model = schema
    for part in loc:
        if isinstance(part, int) or str(part).isdigit():
            continue
        field = model.model_fields.get(str(part))
        nested = None if field is None else _nested_model(field.annotation)
        if nested is None:
            return model
        model = nested
    return model


def type_words(annotation: Any) -> str:
    """A field's type as users read it: ``one of 'a', 'b'``, ``path or none``, ``float``."""
    text = re.sub(r"typing\.|pathlib\.|<class '([^']*)'>", r"\1", str(annotation))
    text = text.replace("PosixPath", "path").replace("Path", "path")
    literal = re.fullmatch(r"Literal\[(.*)\]", text)
    if literal:
        return f"one of {literal.group(1)}"
    return text.replace(" | None", " or none").replace("list[str]", "list of names")


def format_errors(
    exc: ValidationError, schema: type[BaseModel], source: str, given: Mapping
) -> str:
    """One line per problem: the key, the value given and what is allowed."""
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc)
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            known = sorted(_model_at(schema, loc[:-1]).model_fields)
            near = difflib.get_close_matches(loc[-1], known, n=1)
            hint = f"; did you mean {near[0]!r}?" if near else ""
            lines.append(f"{source}: unknown key {key!r}{hint} (known keys: {', '.join(known)})")
            continue
        if not loc:  # a check across keys: the message names them
            lines.append(f"{source}: {msg}")
            continue
        value = err.get("input")
        allowed = _allowed(schema, loc)
        lines.append(
            f"{source}: {key}: {msg} (given {value!r}"
            + (f"; allowed: {allowed})" if allowed else ")")
        )
    return "\n".join(lines) or f"{source}: {exc}"

"""The two spellings of every RLJob field: its snake_case name and its camelCase alias, as the
models define them; for files and stored objects that spell a field either way."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from rhymerl.api.spec import RLJob


def inner_model(annotation: Any) -> type[BaseModel] | None:
    """The model a field holds: itself, or inside Optional, a list or a union."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = inner_model(arg)
        if found is not None:
            return found
    return None


def field_of(model: type[BaseModel], key: str) -> str | None:
    """The name of `model`'s field that `key` spells (its name or its alias), None if none does."""
    if key in model.model_fields:
        return key
    return next((name for name, f in model.model_fields.items() if f.alias == key), None)


def _field_aliases(model: type[BaseModel], out: dict[str, str]) -> dict[str, str]:
    for name, field in model.model_fields.items():
        if field.alias is not None and field.alias != name:
            out[name] = field.alias
        inner = inner_model(field.annotation)
        if inner is not None and inner is not model:
            _field_aliases(inner, out)
    return out


# snake_case name -> camelCase alias of every RLJob field whose two spellings differ (from the models)
FIELD_ALIASES: dict[str, str] = _field_aliases(RLJob, {})
_SNAKE_WORD = re.compile(r"\b[a-z][a-z0-9]*(?:_[a-z0-9]+)+\b")


def camel_text(text: str) -> str:
    """`text` (a message or description) with each RLJob field it names in snake_case by its alias."""
    return _SNAKE_WORD.sub(lambda m: FIELD_ALIASES.get(m.group(0), m.group(0)), text)


def camel_keys(model: type[BaseModel], data: Any) -> Any:
    """`data` (unvalidated, e.g. an RLJob as stored before the camelCase CRD) with every key that spells a
    field of `model` or of a block inside it by the field's camelCase alias; other keys (labels, node
    selectors, what no field has) and every value as they are."""
    if isinstance(data, list):
        return [camel_keys(model, item) for item in data]
    if not isinstance(data, dict):
        return data
    out: dict[Any, Any] = {}
    for key, value in data.items():
        name = field_of(model, key) if isinstance(key, str) else None
        if name is None:
            out[key] = value
            continue
        field = model.model_fields[name]
        alias = field.alias or name
        if alias in out:
            raise ValueError(f"{key}: given twice, as {name} and as {alias}: keep one")
        inner = inner_model(field.annotation)
        out[alias] = value if inner is None else camel_keys(inner, value)
    return out

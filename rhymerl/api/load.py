"""Read an RLJob from YAML into the validated spec, with errors a person can act on.

Every problem is reported as ``field.path: reason (line N)``; unknown keys come with the closest
known key. `--set a.b=c` overrides are applied to the raw document before validation so they are
checked exactly like the file.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rhymerl.api.spec import RLJob


@dataclass(frozen=True)
class SpecProblem:
    path: str
    reason: str
    line: int | None = None

    def __str__(self) -> str:
        where = f" (line {self.line})" if self.line is not None else ""
        return f"{self.path}: {self.reason}{where}"


class SpecError(Exception):
    """A spec that cannot be used; carries every problem found, not just the first."""

    def __init__(self, problems: list[SpecProblem], source: str = "") -> None:
        self.problems = problems
        self.source = source
        head = f"{source}: " if source else ""
        super().__init__(head + "; ".join(str(p) for p in problems))


def _line_index(text: str) -> dict[tuple[str, ...], int]:
    """Map each key path of a YAML mapping document to its 1-based line."""
    lines: dict[tuple[str, ...], int] = {}

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                sub = (*path, str(key.value))
                lines[sub] = key.start_mark.line + 1
                walk(value, sub)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                sub = (*path, str(i))
                lines[sub] = item.start_mark.line + 1
                walk(item, sub)

    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return lines
    if root is not None:
        walk(root, ())
    return lines


def _model_at(path: tuple[str | int, ...]) -> type[BaseModel] | None:
    """The pydantic model that owns the last key of `path`, for suggesting spellings."""
    model: type[BaseModel] = RLJob
    for key in path[:-1]:
        field = model.model_fields.get(str(key))
        if field is None:
            return None
        inner = _unwrap_model(field.annotation)
        if inner is None:
            return None
        model = inner
    return model


def _unwrap_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in getattr(annotation, "__args__", ()) or ():
        found = _unwrap_model(arg)
        if found is not None:
            return found
    return None


def problems_from(error: ValidationError, lines: dict[tuple[str, ...], int]) -> list[SpecProblem]:
    problems = []
    for item in error.errors():
        loc = tuple(item["loc"])
        reason = item["msg"]
        if reason.startswith("Value error, "):
            reason = reason.removeprefix("Value error, ")
            # validators name the offending field first: "max_replicas: must be >= min_replicas"
            field, sep, rest = reason.partition(": ")
            if sep and field.isidentifier():
                loc = (*loc, field)
                reason = rest
        if item["type"] == "extra_forbidden":
            owner = _model_at(loc)
            known = list(owner.model_fields) if owner else []
            close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
            reason = "unknown field" + (f"; did you mean '{close[0]}'?" if close else "")
        path = ".".join(str(p) for p in loc) or "(document)"
        line = None
        for n in range(len(loc), 0, -1):
            line = lines.get(tuple(str(p) for p in loc[:n]))
            if line is not None:
                break
        problems.append(SpecProblem(path, reason, line))
    return problems


def _parse_value(raw: str) -> Any:
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def apply_overrides(doc: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply `key.path=value` overrides; paths are relative to `spec` unless they start with a top-level key."""
    for item in overrides:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise SpecError([SpecProblem(item or "--set", "expected key.path=value")], "--set")
        parts = key.split(".")
        if parts[0] not in RLJob.model_fields:
            parts = ["spec", *parts]
        node = doc
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise SpecError([SpecProblem(key, f"'{part}' is not a mapping")], "--set")
            node = child
        node[parts[-1]] = _parse_value(raw)
    return doc


def parse_job(text: str, source: str = "", overrides: list[str] | None = None) -> RLJob:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise SpecError([SpecProblem("(yaml)", str(getattr(exc, "problem", exc)), line)], source) from exc
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise SpecError([SpecProblem("(document)", "expected a mapping with apiVersion, kind, metadata, spec")], source)
    doc = apply_overrides(doc, overrides or [])
    try:
        return RLJob.model_validate(doc)
    except ValidationError as exc:
        raise SpecError(problems_from(exc, _line_index(text)), source) from exc


def load_job(path: str | Path, overrides: list[str] | None = None) -> RLJob:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise SpecError([SpecProblem("(file)", exc.strerror or str(exc))], str(p)) from exc
    return parse_job(text, str(p), overrides)


def dump_job(job: RLJob) -> str:
    """The fully resolved job as YAML (every default spelled out); parse_job(dump_job(j)) == j."""
    return yaml.safe_dump(job.model_dump(mode="json"), sort_keys=False)

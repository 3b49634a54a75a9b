"""The tests' one job factory: a test names only what its job changes of a base, and the job is read by the
production loader, so a bad change fails as a user's file would (SpecError, naming the field or --set item).

A change is a `--set` item (``"algorithm.epochs=1"``, applied by rhymerl.api.load.apply_overrides as the
CLI's --set is) or a nested mapping merged in (a value that is not a mapping replaces what is there).
A mapping's top-level keys, like a --set path, are the spec's unless they are the RLJob's own (apiVersion,
kind, metadata, spec). Mappings are merged first, then the --set items applied in order, as `rhymerl run
FILE --set ...` applies them to the file; write keys snake_case, as the bases do.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import yaml

from rhymerl.api import RLJob, parse_job
from rhymerl.api.load import apply_overrides
from rhymerl.api.spec import API_VERSION, KIND

Change = str | Mapping[str, Any]
Base = Literal["small", "defaults"]

# small: the smallest run, the embedded model on 4 short builtin prompts, 2 prompts x 2 samples of at most 16
# tokens a step, 2 epochs (4 steps). defaults: every default of the spec (RLJob()), for a test of what a job
# renders or refuses rather than of a run.
BASES: dict[Base, dict[str, Any]] = {
    "small": {"apiVersion": API_VERSION, "kind": KIND, "spec": {
        "model": {"path": "builtin:tiny-arith"},
        "data": {"num_prompts": 4, "min_ops": 1, "median_ops": 2, "max_ops": 3},
        "algorithm": {"group_size": 2, "prompts_per_step": 2, "max_response_length": 16, "epochs": 2, "lr": 0.01}}},
    "defaults": {"apiVersion": API_VERSION, "kind": KIND},
}


def make_job(*changes: Change, base: Base = "small") -> RLJob:
    """The validated job: the base with `changes`, read by parse_job (its --set items as overrides)."""
    doc, sets = _document(changes, base)
    return parse_job(_yaml(doc), overrides=sets)


def job_dict(*changes: Change, base: Base = "small") -> dict[str, Any]:
    """The document as plain data, not validated: the base with `changes`."""
    doc, sets = _document(changes, base)
    apply_overrides(doc, sets)
    return doc


def job_yaml(*changes: Change, base: Base = "small") -> str:
    """The document as the YAML text of a job file (for the CLI, or a test of the loader)."""
    return _yaml(job_dict(*changes, base=base))


def _yaml(doc: dict[str, Any]) -> str:
    return yaml.safe_dump(doc, sort_keys=False)


def _document(changes: Iterable[Change], base: Base) -> tuple[dict[str, Any], list[str]]:
    """The base with every mapping of `changes` merged in, and the --set items left to apply."""
    doc = copy.deepcopy(BASES[base])
    sets: list[str] = []
    for change in changes:
        if isinstance(change, str):
            sets.append(change)
            continue
        for key, value in change.items():
            _merge(doc if key in RLJob.model_fields else doc.setdefault("spec", {}), key, value)
    return doc, sets


def _merge(into: dict[str, Any], key: str, value: Any) -> None:
    if isinstance(value, Mapping) and isinstance(into.get(key), dict):
        for inner, item in value.items():
            _merge(into[key], inner, item)
    else:
        into[key] = copy.deepcopy(value)

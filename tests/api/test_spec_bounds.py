"""Every number of an RLJob has an upper bound, and a value past it is a spec error naming the field.

A number without one (`reward.timeout_s: 1e10`) passed validation and overflowed later, inside a
worker; walking the schema makes a new field without a bound fail here instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from rhymerl.api import RLJob, SpecError, parse_job

HEAD = "apiVersion: rhymerl.io/v1alpha1\nkind: RLJob\n"


def numeric_leaves(node: dict[str, Any], defs: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """(dotted path, schema) of every integer or number in the schema; list items are `path.0`."""
    ref = node.get("$ref")
    if ref is not None:
        node = {**defs[ref.rsplit("/", 1)[-1]], **{k: v for k, v in node.items() if k != "$ref"}}
    if node.get("type") in ("integer", "number"):
        yield path, node
    for variant in node.get("anyOf", ()):
        yield from numeric_leaves(variant, defs, path)
    for key, sub in node.get("properties", {}).items():
        yield from numeric_leaves(sub, defs, f"{path}.{key}" if path else key)
    if isinstance(node.get("items"), dict):
        yield from numeric_leaves(node["items"], defs, f"{path}.0")
    if isinstance(node.get("additionalProperties"), dict):
        yield from numeric_leaves(node["additionalProperties"], defs, f"{path}.key")


SCHEMA = RLJob.model_json_schema()
LEAVES = list(numeric_leaves(SCHEMA, SCHEMA.get("$defs", {}), ""))


def test_the_walk_finds_the_numbers_of_every_block() -> None:
    paths = {p for p, _ in LEAVES}
    assert {"spec.reward.timeoutS", "spec.algorithm.lr", "spec.checkpoint.keepLast",
            "spec.rollout.tolerations.0.tolerationSeconds", "spec.train.resources.memory"} <= paths
    assert len(paths) > 60


def test_every_integer_and_number_of_the_spec_has_an_upper_bound() -> None:
    unbounded = [p for p, node in LEAVES if "maximum" not in node and "exclusiveMaximum" not in node]
    assert unbounded == []


def test_every_integer_bound_fits_int64() -> None:
    too_big = [p for p, node in LEAVES if node.get("type") == "integer" and node.get("maximum", 0) > 2**63 - 1]
    assert too_big == []


def test_a_time_or_count_past_its_bound_names_the_field_and_line() -> None:
    with pytest.raises(SpecError) as exc:
        parse_job(HEAD + "spec:\n  reward:\n    timeout_s: 1e10\n", "job.yaml")
    assert str(exc.value) == "job.yaml: spec.reward.timeout_s: Input should be less than or equal to 86400 (line 5)"


def test_a_quantity_past_int64_is_one_problem_naming_the_field() -> None:
    with pytest.raises(SpecError) as exc:
        parse_job(HEAD + "spec:\n  train:\n    resources:\n      memory: 9223372036854775808\n", "job.yaml")
    assert str(exc.value) == ("job.yaml: spec.train.resources.memory: 9223372036854775808 is more than 2^63-1, "
                              "which no quantity may represent (Kubernetes' resource.Quantity) (line 6)")


SCALARS = [(p.removeprefix("spec."), node) for p, node in LEAVES
           if p.startswith("spec.") and ".0." not in p and ".key" not in p]


@pytest.mark.parametrize(("field", "node"), SCALARS, ids=[p for p, _ in SCALARS])
def test_a_value_past_each_bound_is_refused_by_its_path(field: str, node: dict[str, Any]) -> None:
    top = node.get("maximum", node.get("exclusiveMaximum"))
    past = int(top) + 1 if node["type"] == "integer" else float(top) * 2
    with pytest.raises(SpecError) as exc:
        parse_job(HEAD, "job.yaml", [f"{field}={past}"])
    assert f"spec.{field}" in [p.path for p in exc.value.problems]

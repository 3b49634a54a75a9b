"""Spec files as hostile input: what the loader refuses, and how it says so."""

from __future__ import annotations

from pathlib import Path

import pytest

from rhymerl.api import SpecError, load_job, parse_job
from rhymerl.api.load import MAX_SPEC_BYTES

HEAD = "apiVersion: rhymerl.io/v1alpha1\nkind: RLJob\n"


def problems(text: str | bytes, overrides: list[str] | None = None) -> list[str]:
    with pytest.raises(SpecError) as info:
        parse_job(text, "job.yaml", overrides)
    return [str(p) for p in info.value.problems]


def test_an_alias_bomb_is_refused_at_the_alias_that_crosses_the_budget() -> None:
    # nine levels of ten aliases each: 10**9 nodes once written out, which would never finish
    levels = ["    l0: &l0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"    l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    found = problems(HEAD + "metadata:\n  labels:\n" + "\n".join(levels) + "\n")
    assert len(found) == 1
    assert found[0].startswith("(yaml): aliases expand to more than 10000 nodes at *l")
    assert found[0].endswith("(line 8)")


def test_a_recursive_alias_is_refused() -> None:
    assert problems(HEAD + "metadata:\n  labels: &a {x: *a}\n") == [
        "(yaml): alias *a is used inside its own anchor (a recursive document) (line 4)"]


def test_nesting_thousands_deep_is_an_error_not_a_recursion_crash() -> None:
    assert problems(HEAD + "spec: " + "[" * 5000 + "]" * 5000 + "\n") == [
        "(yaml): nested deeper than 64 levels (line 3)"]


def test_a_few_legitimate_aliases_still_load() -> None:
    job = parse_job(HEAD + "spec:\n  train:\n    resources: &r {cpu: '4', memory: 8Gi}\n"
                    "  history:\n    resources: *r\n")
    assert job.spec.history.resources.memory == "8Gi"


def test_duplicate_keys_are_named_with_both_lines() -> None:
    text = HEAD + "spec:\n  algorithm:\n    epochs: 2\n    group_size: 4\n    epochs: 3\n  algorithm: {}\n"
    assert problems(text) == [
        "spec.algorithm.epochs: duplicate key (first on line 5) (line 7)",
        "spec.algorithm: duplicate key (first on line 4) (line 8)",
    ]


def test_an_empty_file_is_not_the_default_job() -> None:
    for text in ("", "# only a comment\n", "---\n"):
        assert problems(text) == [
            "(document): empty RLJob: write at least apiVersion: rhymerl.io/v1alpha1 and kind: RLJob"]


def test_apiversion_and_kind_are_required() -> None:
    assert problems("spec:\n  algorithm: {epochs: 2}\n") == [
        "apiVersion: required: write apiVersion: rhymerl.io/v1alpha1", "kind: required: write kind: RLJob"]


def test_bytes_that_are_not_utf8_are_named_by_line_and_column() -> None:
    assert problems(HEAD.encode() + b"metadata:\n  name: caf\xe9\n") == [
        "(file): not UTF-8: byte 0xe9 at column 12 (line 4)"]


def test_a_control_character_is_named_by_line() -> None:
    assert problems(HEAD + "metadata: {name: \"a\x07\"}\n") == [
        "(yaml): character U+0007 is not allowed in YAML (line 3)"]


def test_sizes_past_their_upper_bound_are_rejected_naming_the_bound() -> None:
    found = problems(HEAD + "spec:\n  data: {num_prompts: 100000000000000000000000000}\n"
                     "  algorithm: {max_response_length: 1000000000, group_size: 100000}\n")
    assert found == [
        "spec.data.num_prompts: Input should be less than or equal to 100000 (line 4)",
        "spec.algorithm.group_size: Input should be less than or equal to 1024 (line 5)",
        "spec.algorithm.max_response_length: Input should be less than or equal to 131072 (line 5)",
    ]


def test_infinity_is_not_a_number_a_spec_accepts() -> None:
    assert problems(HEAD + "spec:\n  algorithm: {lr: .inf}\n") == [
        "spec.algorithm.lr: Input should be a finite number (line 4)"]


def test_a_bad_override_is_reported_against_its_set_item_not_a_file_line() -> None:
    text = HEAD + "spec:\n  algorithm:\n    epochs: 2\n"
    assert problems(text, ["algorithm.epochs=0"]) == [
        "spec.algorithm.epochs: Input should be greater than 0 (--set algorithm.epochs=0)"]
    assert problems(text, ["algorithm.epochs.max=3"]) == [
        "spec.algorithm.epochs: not a mapping, cannot set a key under it (--set algorithm.epochs.max=3)"]


def test_an_override_value_is_loaded_under_the_same_alias_budget() -> None:
    levels = ["&l0 [x, x, x, x, x, x, x, x, x, x]"]
    levels += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, 10)]
    value = "[" + ", ".join(levels) + "]"  # 10**9 nodes written out: kept as the string it was given
    assert problems(HEAD, [f"metadata.labels={value}"]) == [
        f"metadata.labels: Input should be a valid dictionary (--set metadata.labels={value})"]


def test_a_file_larger_than_a_spec_can_be_is_refused_unread(tmp_path: Path) -> None:
    big = tmp_path / "big.yaml"
    big.write_bytes(HEAD.encode() + b"#" * MAX_SPEC_BYTES)
    with pytest.raises(SpecError) as info:
        load_job(big)
    assert [str(p) for p in info.value.problems] == ["(file): larger than 1 MiB; an RLJob is a few KB"]

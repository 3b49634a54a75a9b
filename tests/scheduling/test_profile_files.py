"""Iteration profiles measured on a real engine: the file format and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rhymerl.algorithms.scheduling import RooflineProfile
from rhymerl.tools.sim.iteration_profile_file import (
    ProfileError,
    ProfileFile,
    load_profile,
    resolve_profile,
    save_profile,
)


def _doc(points: list[tuple[int, int, float]], **extra: object) -> dict[str, object]:
    return {
        "format": "rhymerl.iteration-profile/v1", "engine": "torch", "model": "m", "device": "d",
        "max_batch": 8, "prefill_seconds_per_token": 0.001,
        "points": [{"batch_size": b, "context_len": c, "seconds": s} for b, c, s in points], **extra,
    }


GRID = [(1, 0, 1.0), (1, 100, 2.0), (4, 0, 3.0), (4, 100, 4.0)]


def test_a_measured_grid_loads_and_interpolates(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_doc(GRID)))
    p = load_profile(path)
    assert p.iteration_time(4, 100) == 4.0
    assert p.iteration_time(1, 50) == pytest.approx(1.5)
    assert p.max_batch == 8 and p.prefill_time(10) == pytest.approx(0.01)


def test_save_profile_round_trips_and_refuses_an_incomplete_grid(tmp_path: Path) -> None:
    path = save_profile(tmp_path / "p.json", ProfileFile.model_validate(_doc(GRID)))
    assert load_profile(path).iteration_time(1, 0) == 1.0
    with pytest.raises(ProfileError, match="grid is incomplete"):
        save_profile(tmp_path / "q.json", ProfileFile.model_validate(_doc([*GRID[:3], (2, 0, 1.0)])))
    assert not (tmp_path / "q.json").exists()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        (_doc([*GRID[:3], (1, 0, 9.0)]), "points[3]: duplicate point"),
        (_doc([(1, 0, 1.0), (1, 100, 2.0), (4, 0, 3.0), (8, 100, 4.0)]), "grid is incomplete"),
        (_doc([(1, 0, 1.0), (1, 100, 2.0), (4, 0, -3.0), (4, 100, 4.0)]), "points[2].seconds"),
        (_doc(GRID, speed="fast"), "speed: Extra inputs are not permitted"),
        ({**_doc(GRID), "format": "other/v9"}, "format"),
        (_doc(GRID, kv_capacity_tokens=0), "kv_capacity_tokens: Input should be greater than 0"),
    ],
)
def test_a_bad_profile_names_the_file_and_field(tmp_path: Path, doc: dict[str, object], message: str) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(ProfileError) as exc:
        load_profile(path)
    assert str(exc.value).startswith(str(path)) and message in str(exc.value)


def test_a_profile_that_is_not_json_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text('{\n  "format": \n}')
    with pytest.raises(ProfileError, match=r"p\.json:3: not JSON"):
        load_profile(path)


def test_without_a_profile_the_roofline_is_used() -> None:
    assert isinstance(resolve_profile(None), RooflineProfile)
    assert isinstance(resolve_profile("roofline"), RooflineProfile)


def test_a_kv_capacity_is_optional_and_reaches_the_simulator(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(json.dumps(_doc(GRID)))
    assert load_profile(path).kv_capacity_tokens is None
    path.write_text(json.dumps(_doc(GRID, kv_capacity_tokens=5000)))
    assert load_profile(path).kv_capacity_tokens == 5000


def test_the_roofline_holds_what_is_left_of_90_percent_of_hbm_after_the_weights() -> None:
    # (0.9 x 80 GB - 7.6e9 x 2 bytes) / 57,344 bytes per token
    assert RooflineProfile().kv_capacity_tokens == 990_513

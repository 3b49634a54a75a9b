"""`rhymerl bench profile-recovery` end to end on a tiny finished run: a spoiled profile corrected."""

from __future__ import annotations

import json
from pathlib import Path

from cli_runner import rhymerl


def test_bench_profile_recovery_corrects_the_spoiled_profile_and_keeps_the_tokens(tiny_run: Path,
                                                                                  tmp_path: Path) -> None:
    out = tmp_path / "bench"
    res = rhymerl("bench", "profile-recovery", "--run", str(tiny_run), "--steps", "2", "--repeats", "1",
                  "--out", str(out))
    assert res.returncode == 0, res.stderr
    result = json.loads((out / "results.json").read_text())
    assert result["identical_tokens"] and [row["step"] for row in result["steps"]] == [1, 2]
    first = result["steps"][0]
    assert first["spoiled-as-is"]["profile_x"] == 10.0 and first["clean-as-is"]["profile_x"] == 1.0
    # the passes of step 1 showed the measurement disturbed: re-measured, off the spoiled 10x toward this
    # machine's cost. How close it comes to the reference is the ratio of two timings taken minutes apart
    # (the reference at the start, the re-measurement after the step): 6.3x seen while the suite's Ray
    # scenarios shared the two cores, so only the direction is asserted, against the same profile as is
    assert first["spoiled"]["remeasured_cells"] > 0
    assert first["spoiled"]["profile_x"] < first["spoiled-as-is"]["profile_x"]
    assert set(result["totals"]) == {"clean", "spoiled", "spoiled-as-is", "uneven", "uneven-as-is", "clean-as-is"}
    assert 10.0 < first["uneven-as-is"]["profile_x"] < 55.0 and first["uneven"]["remeasured_cells"] > 0
    assert result["machine"]["torch_threads"] >= 1 and result["recovery_in_step_1"]["spoiled"]["passes_in_step"][0] > 0
    assert (out / "recovery.png").stat().st_size > 10_000 and "| step | clean tok/s |" in (out / "table.md").read_text()


def test_bench_profile_recovery_rejects_a_profile_that_is_not_spoiled(tmp_path: Path) -> None:
    res = rhymerl("bench", "profile-recovery", "--run", str(tmp_path), "--spoil", "0.5")
    assert res.returncode == 2
    assert "--spoil: 0.5 must be above 1" in res.stderr

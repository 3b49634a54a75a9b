"""`rhymerl bench contention`'s table and plot from a hand-made result (the bench itself times real runs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cli_runner import rhymerl
from rich.console import Console

from rhymerl.tools.bench.contention import plot, render, settings


def _result() -> dict[str, Any]:
    rows = []
    for busy, times in ((0, (2.9, 1.4, 1.5)), (1, (3.0, 12.0, 3.4))):
        for name, t in zip(settings(2), times, strict=True):
            rows.append({"busy": busy, "threads": name, "seconds": t, "vs_fair": round(t / times[0], 3),
                         "runs": [t, t], "identical": name != "adaptive" or busy == 0,
                         "passes_at": {"1": 90, "2": 10} if name == "adaptive" else {}})
    return {"samples": 64, "steps": 1, "repeats": 2, "machine_cpus": 2, "load_before": [0.1, 0.2, 0.3],
            "load_after": [1.0, 0.5, 0.4], "rows": rows}


def test_the_settings_are_one_thread_the_machines_count_and_adaptive() -> None:
    assert settings(2) == ("1", "2", "adaptive")
    assert settings(1) == ("1", "adaptive")


def test_the_table_names_every_setting_and_the_load_and_the_plot_is_written(tmp_path: Path) -> None:
    console = Console(width=200, record=True)
    md = render(_result(), console)
    assert md.count("| adaptive |") == 2 and "1:90 2:10" in md
    assert "load average before [0.1, 0.2, 0.3], after [1.0, 0.5, 0.4]" in md
    assert "0.483" in console.export_text()  # 1.4 / 2.9: two threads on an idle machine
    plot(_result(), tmp_path / "contention.png")
    assert (tmp_path / "contention.png").stat().st_size > 0


def test_a_negative_count_of_busy_processes_is_a_user_error(tmp_path: Path) -> None:
    res = rhymerl("bench", "contention", "--job", str(tmp_path / "job.yaml"), "--busy", "0,-1")
    assert res.returncode == 2 and "--busy" in res.stderr and "Traceback" not in res.stderr

"""Turn our own run dumps into the workload trace format, so our runs can be replayed and shared."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from rhymerl.workers.dumps import DumpError, RolloutRecord, read_run

from .io import write_trace


def trace_rows(records: Iterable[RolloutRecord]) -> list[tuple[int, str | None, int, int]]:
    """One (step, prompt_id, input_len, output_len) row per response, in step order."""
    rows: list[tuple[int, str | None, int, int]] = [(r.step, r.prompt_id, r.prompt_len, len(r.response_ids)) for r in records]
    rows.sort(key=lambda r: r[0])
    return rows


def export_run(run_dir: Path, out: Path) -> int:
    """Write RUN_DIR's rollout dumps as a trace CSV; returns the number of rows."""
    rows = trace_rows(read_run(run_dir))
    if not rows:
        raise DumpError(f"{run_dir}: the rollout dumps hold no responses")
    return write_trace(out, rows)

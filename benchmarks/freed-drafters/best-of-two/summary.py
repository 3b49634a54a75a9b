"""Tokens per pass and the freed drafter's share per step, own-first against best-of-two (README.md)."""

from __future__ import annotations

import json
from pathlib import Path

from matplotlib.figure import Figure

HERE = Path(__file__).parent
RUNS = {"own first (before)": ["own-first"], "best of two": ["best-of-two-1", "best-of-two-2"]}


def rows(name: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in (HERE / f"{name}.metrics.jsonl").read_text().splitlines()]


def main() -> None:
    print("| run | steps | tokens per pass (mean of steps) | freed-drafter share of drafting passes (steps) | its acceptance |")
    print("|---|---|---|---|---|")
    fig = Figure(figsize=(6.5, 3.2))
    ax = fig.subplots()
    for label, names in RUNS.items():
        for name in names:
            rs = rows(name)
            tpp = [float(r["tokens_per_pass"]) for r in rs]  # type: ignore[arg-type]
            freed = [(r.get("spec_sources") or {}).get("freed-drafter", {}) for r in rs]  # type: ignore[union-attr]
            shares = [f.get("share", 0.0) for f in freed]
            acc = [f["acceptance"] for f in freed if f.get("acceptance") is not None]
            print(f"| {name} | {len(rs)} | {sum(tpp) / len(tpp):.3f} | {min(shares):.4f}-{max(shares):.4f} | "
                  f"{min(acc):.2f}-{max(acc):.2f} |")
            ax.plot(range(1, len(tpp) + 1), tpp, marker="o", label=f"{label}: {name}")
    ax.set_xlabel("step (epoch 1)")
    ax.set_ylabel("tokens per pass")
    ax.set_title("quickstart epoch 1, 3 workers, a freed worker drafting (forced)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(HERE / "tokens-per-pass.png", dpi=120)


if __name__ == "__main__":
    main()

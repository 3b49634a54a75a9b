"""What sampling costs on a real vocabulary, before and after it ran in place and in blocks of rows
(workers/rollout/sampling.py): `sample_tokens` alone at the toy's, SmolLM2's and Qwen2's vocabulary
sizes, and SmolLM2-135M's plain rollout of 32 sequences (the smollm2-math job's batch) with either
sampler, side by side in one process, interleaved, medians. The "before" sampler is the module as it
was at BASELINE, read from git; tokens and log-probabilities are compared for equality.

    PYTHONSAFEPATH=1 .venv/bin/python benchmarks/sampling/measure.py > benchmarks/sampling/results.md
"""

from __future__ import annotations

import importlib.util
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from types import ModuleType

import torch

from rhymerl.tools.bench.timing import interleaved_medians
from rhymerl.workers.model.folder import model_dir
from rhymerl.workers.model.tokenizer import load_tokenizer
from rhymerl.workers.model.transformer import load_model
from rhymerl.workers.rollout import engine as engine_module
from rhymerl.workers.rollout import sampling
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, SamplingParams

BASELINE = "057113f"
REPO = Path(__file__).resolve().parents[2]
THREADS = 2
VOCABS = ((99, "the embedded model"), (49152, "SmolLM2"), (151936, "Qwen2"))
ROWS = (1, 8, 32, 64, 128, 256)


def baseline_module() -> ModuleType:
    source = subprocess.run(["git", "-C", str(REPO), "show", f"{BASELINE}:workers/rollout/sampling.py"],
                            capture_output=True, text=True, check=True).stdout
    path = Path(tempfile.mkdtemp()) / "sampling_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("sampling_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def sampler_rows(before: ModuleType) -> list[str]:
    out = ["| vocabulary | rows | before ms | after ms | before / after | equal |", "|---|---|---|---|---|---|"]
    torch.manual_seed(0)
    for vocab, name in VOCABS:
        for rows in ROWS:
            logits, ids, pos = torch.randn(rows, vocab) * 4, torch.arange(rows), torch.arange(rows) + 50
            args = (logits, 7, ids, pos, 1.0)
            equal = all(torch.equal(a, b) for a, b in zip(before.sample_tokens(*args), sampling.sample_tokens(*args),
                                                          strict=True))
            repeats = max(5, min(200, 2_000_000 // (rows * vocab)))
            t = interleaved_medians({"before": partial(before.sample_tokens, *args),
                                     "after": partial(sampling.sample_tokens, *args)}, repeats)
            out.append(f"| {vocab} ({name}) | {rows} | {t['before'] * 1e3:.2f} | {t['after'] * 1e3:.2f} | "
                       f"{t['before'] / t['after']:.2f} | {equal} |")
    return out


def rollout_rows(before: ModuleType, repeats: int = 5) -> list[str]:
    """Plain rollout of 32 sequences with each sampler; the seconds inside `sample_tokens` are timed
    too (the whole rollout moves by more than they do on this shared machine)."""
    folder = model_dir("builtin:smollm2-135m-instruct")
    tok = load_tokenizer(folder)
    engine = TorchEngine(load_model(folder, torch.float32), tok.stop_ids, max_batch_size=32)
    questions = ("What is 17 + 25?", "Mia has 4 boxes of 6 pencils. How many pencils does she have?",
                 "A train travels 60 km in 1.5 hours. What is its speed?", "Name three colors.")
    requests = [GenRequest(tok.encode(q), 1000 * i + k, f"q{i}") for i, q in enumerate(questions) for k in range(8)]
    params = SamplingParams(temperature=1.0, seed=3, max_response_length=96)
    results: dict[str, list[list[int]]] = {}
    sampling_s: dict[str, list[float]] = {"before": [], "after": []}

    def run(which: ModuleType, name: str) -> None:
        spent = [0.0]

        def timed(*args: object) -> tuple[torch.Tensor, torch.Tensor]:
            t0 = time.perf_counter()
            out: tuple[torch.Tensor, torch.Tensor] = which.sample_tokens(*args)
            spent[0] += time.perf_counter() - t0
            return out

        engine_module.sample_tokens = timed
        results[name] = [r.response_ids for r in engine.generate(requests, params)]
        sampling_s.setdefault(name, []).append(spent[0])

    run(sampling, "warm-up")
    t = interleaved_medians({"before": partial(run, before, "before"), "after": partial(run, sampling, "after")},
                            repeats)
    engine_module.sample_tokens = sampling.sample_tokens
    tokens = sum(len(r) for r in results["after"])
    inside = {k: statistics.median(v) for k, v in sampling_s.items() if k != "warm-up"}
    return ["| SmolLM2-135M plain rollout, 32 sequences, <= 96 tokens | before s | after s | before / after | "
            "tokens | identical |", "|---|---|---|---|---|---|",
            f"| whole rollout ({repeats} interleaved runs, medians) | {t['before']:.2f} | {t['after']:.2f} | "
            f"{t['before'] / t['after']:.2f} | {tokens} | {results['before'] == results['after']} |",
            f"| inside `sample_tokens` | {inside['before']:.2f} | {inside['after']:.2f} | "
            f"{inside['before'] / inside['after']:.2f} | | |"]


def main() -> None:
    torch.set_num_threads(THREADS)
    before = baseline_module()
    print(f"# Sampling before and after in place, in blocks of rows (baseline {BASELINE})\n")
    print(f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, torch "
          f"{torch.__version__}, Python {sys.version.split()[0]}; `sample_tokens` at temperature 1.0.\n")
    print("\n".join(sampler_rows(before)))
    print()
    print("\n".join(rollout_rows(before)))


if __name__ == "__main__":
    main()

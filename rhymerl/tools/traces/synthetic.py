"""Synthetic RL rollout traces calibrated to published workload figures.

Model: each prompt has a latent difficulty d (log-length offset) that drifts slowly between
epochs (AR(1) with correlation `epoch_corr`), and each response adds independent noise:

    output_len = min(max_len, mean(step) * exp(d + sigma_response * eps - (sigma_prompt^2 + sigma_response^2) / 2))

- long tails: lognormal; `math` matches PolyTrace §3.2's math task (median 8,388, p90 18,543
  tokens: total sigma ~0.62) and `code` PolyTrace §3.4's programming task (mean 9,329, std 8,651:
  sigma ~0.77), both truncated at a 16K max response length as in RhymeRL's evaluation;
- per-prompt similarity: most variance is between prompts (PolyTrace §3.1, Fig. 5);
- growth: mean(step) rises linearly from 1K at step 0 to 10K at step 320 (RhymeRL Fig. 3a);
  the default window starts at step 160;
- rank stability: `sigma_response` and `epoch_corr` are chosen so that rank_stability(..., 8)
  lands near RhymeRL's §6.3 table (85.7% on Math-1, 71.8% on Code-1); tests measure it
  (docs/scheduling.md lists the measured values, 16 groups included);
- inputs: lognormal and independent of outputs (PolyTrace §3.2: "patternless scatter").
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from .io import Progress, TraceError, read_trace
from .model import Trace

MAX_RESPONSES = 2_000_000  # a synthetic trace is built in memory


@dataclass(frozen=True)
class SyntheticConfig:
    name: str
    sigma_prompt: float
    sigma_response: float
    epoch_corr: float
    num_prompts: int = 512
    prompts_per_step: int = 64
    group_size: int = 16
    steps: int = 24
    start_step: int = 160
    mean_start: float = 1000.0
    mean_end: float = 10000.0
    ramp_steps: int = 320
    max_len: int = 16384
    input_median: float = 110.0
    input_sigma: float = 0.45
    input_max: int = 600
    seed: int = 0

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.num_prompts / self.prompts_per_step)

    def mean_length(self, step: int) -> float:
        """Mean response length before truncation at global training step `step`."""
        return self.mean_start + (self.mean_end - self.mean_start) * step / self.ramp_steps


PRESETS: dict[str, SyntheticConfig] = {
    "math": SyntheticConfig(name="synthetic:math", sigma_prompt=0.593, sigma_response=0.18, epoch_corr=0.997),
    "code": SyntheticConfig(
        name="synthetic:code",
        sigma_prompt=0.652,
        sigma_response=0.41,
        epoch_corr=0.96,
        input_median=250.0,
        input_sigma=0.5,
        input_max=1000,
    ),
}


def generate(cfg: SyntheticConfig) -> Trace:
    for name in ("num_prompts", "prompts_per_step", "group_size", "steps", "ramp_steps", "max_len", "input_max"):
        if getattr(cfg, name) < 1:
            raise TraceError(f"{cfg.name}: {name}: {getattr(cfg, name)} must be >= 1")
    for name in ("sigma_prompt", "sigma_response", "mean_start", "mean_end", "input_median", "input_sigma"):
        if not 0.0 <= getattr(cfg, name) < math.inf:
            raise TraceError(f"{cfg.name}: {name}: {getattr(cfg, name)} must be a finite number >= 0")
    for name in ("seed", "start_step"):
        if getattr(cfg, name) < 0:
            raise TraceError(f"{cfg.name}: {name}: {getattr(cfg, name)} must be >= 0")
    if not 0.0 <= cfg.epoch_corr <= 1.0:
        raise TraceError(f"{cfg.name}: epoch_corr: {cfg.epoch_corr} must lie in 0..1")
    if cfg.prompts_per_step > cfg.num_prompts:
        raise TraceError(f"{cfg.name}: prompts_per_step: larger than num_prompts")
    responses = cfg.steps * cfg.prompts_per_step * cfg.group_size
    if responses > MAX_RESPONSES:
        raise TraceError(f"{cfg.name}: steps x prompts_per_step x group_size = {responses} responses; at most "
                         f"{MAX_RESPONSES} (a synthetic trace is built in memory)")
    rng = np.random.default_rng(cfg.seed)
    n, spe = cfg.num_prompts, cfg.steps_per_epoch
    difficulty = rng.normal(0.0, cfg.sigma_prompt, n)
    inputs = np.clip(np.round(cfg.input_median * np.exp(rng.normal(0.0, cfg.input_sigma, n))), 8, cfg.input_max)
    shift = (cfg.sigma_prompt**2 + cfg.sigma_response**2) / 2.0
    innovation = cfg.sigma_prompt * math.sqrt(max(0.0, 1.0 - cfg.epoch_corr**2))
    steps: list[int] = []
    pids: list[str] = []
    ins: list[int] = []
    outs: list[int] = []
    order = rng.permutation(n)
    for s in range(1, cfg.steps + 1):
        pos = (s - 1) % spe
        if pos == 0 and s > 1:  # new epoch: difficulties drift, order reshuffles
            difficulty = cfg.epoch_corr * difficulty + rng.normal(0.0, innovation, n)
            order = rng.permutation(n)
        chosen = order[pos * cfg.prompts_per_step : (pos + 1) * cfg.prompts_per_step]
        mean = cfg.mean_length(cfg.start_step + s)
        for p in chosen.tolist():
            noise = rng.normal(0.0, cfg.sigma_response, cfg.group_size)
            lens = np.clip(np.round(mean * np.exp(difficulty[p] + noise - shift)), 1, cfg.max_len)
            steps.extend([s] * cfg.group_size)
            pids.extend([f"p{p:05d}"] * cfg.group_size)
            ins.extend([int(inputs[p])] * cfg.group_size)
            outs.extend(int(x) for x in lens)
    return Trace.build(cfg.name, steps, pids, ins, outs)


def synthetic(name: str, **overrides: object) -> Trace:
    """A named preset (`math`, `code`), optionally with fields overridden."""
    key = name.removeprefix("synthetic:")
    if key not in PRESETS:
        raise TraceError(f"synthetic:{key}: unknown synthetic trace; choose one of {', '.join(PRESETS)}")
    return generate(replace(PRESETS[key], **overrides))  # type: ignore[arg-type]


def parse_overrides(pairs: list[str]) -> dict[str, object]:
    """`KEY=VALUE` strings into SyntheticConfig overrides, typed like the field they set."""
    types = {f.name: f.type for f in fields(SyntheticConfig)}
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or key not in types or key == "name":
            valid = ", ".join(k for k in types if k != "name")
            raise TraceError(f"--synthetic {pair!r}: expected KEY=VALUE with KEY one of {valid}")
        kind = {"int": int, "float": float}[str(types[key])]
        try:
            out[key] = kind(value)
        except ValueError:
            raise TraceError(f"--synthetic {key}: {value!r} is not {'an integer' if kind is int else 'a number'}") from None
    return out


def load_trace(source: str, *, progress: Progress | None = None, **overrides: object) -> Trace:
    """`synthetic:NAME` or a CSV path; `progress` follows the reading of a file."""
    if source.startswith("synthetic:"):
        return synthetic(source, **overrides)
    if overrides:
        raise TraceError(f"{source}: options {', '.join(overrides)} only apply to synthetic traces")
    return read_trace(Path(source), progress)

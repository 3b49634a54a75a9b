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

The held-out class (issue 27: other frameworks' logs, short, ids that never recur, heavy tails
cut at the maximum length, a final partial step) uses the same model with more knobs, each off by
default so `math` and `code` draw the very same numbers as before:

- `recurring_ids` off: every step draws fresh prompts (fresh difficulties), ids `sSTEP-pJ`;
- `truncated_share`: the length scale of every step is set so that this share of responses is
  expected to reach `max_len` (the ramp `mean_start..mean_end` is then unused);
- `pareto_share`, `pareto_alpha`: that share of responses, drawn independently of their prompt,
  comes from a Pareto tail above the step's median length instead of the lognormal body (runaway
  generations: repetition, an agent looping on its tools);
- `last_step_share`: the last step keeps only this share of its GRPO groups (a log cut mid-step);
- `input_corr`: correlation of log prompt length with the prompt's difficulty (0: the scatter
  PolyTrace reports), which is what ranking by prompt length can exploit when there is no history.

Multi-turn agents (`max_turns` > 1, off by default): a response of L generated tokens is
min(max_turns, ceil(L / turn_tokens)) turns of near-equal length, with a tool call after every
turn but the last, its latency lognormal (`tool_median_s`, `tool_sigma`). Turns are drawn from a
generator of their own, so the lengths are the very numbers the single-turn trace draws.

The held-out presets (`dapo-math`, `vl-video`, `code-14b`, `search-agent`) are documented in
docs/scheduling.md ("Traces"), with the public figure or the assumption behind each value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from .io import Progress, TraceError, read_trace
from .model import Trace, Turns

MAX_RESPONSES = 2_000_000  # a synthetic trace is built in memory


@dataclass(frozen=True)
class SyntheticConfig:
    name: str
    sigma_prompt: float
    """Spread of log length between prompts (the latent difficulty d)."""
    sigma_response: float
    """Spread of log length between one prompt's responses."""
    epoch_corr: float
    """Correlation of a prompt's difficulty between consecutive epochs (recurring ids only)."""
    num_prompts: int = 512
    """Prompts in the data set, visited once an epoch (recurring ids only)."""
    prompts_per_step: int = 64
    """GRPO groups per step: a step holds prompts_per_step x group_size responses."""
    group_size: int = 16
    steps: int = 24
    start_step: int = 160
    """Global training step of the first generated step (places it on the length ramp)."""
    mean_start: float = 1000.0
    mean_end: float = 10000.0
    ramp_steps: int = 320
    max_len: int = 16384
    """Maximum response length: longer responses are truncated to it."""
    input_median: float = 110.0
    input_sigma: float = 0.45
    input_max: int = 600
    seed: int = 0
    """Draws another instance of the same shape."""
    recurring_ids: bool = True
    """Prompt ids recur once an epoch (history exists); off: fresh prompts every step."""
    truncated_share: float = 0.0
    """When > 0: expected share of responses at max_len; sets each step's length scale."""
    pareto_share: float = 0.0
    """Share of responses drawn from the Pareto tail instead of the lognormal body."""
    pareto_alpha: float = 1.5
    """Pareto tail index: smaller is heavier."""
    last_step_share: float = 1.0
    """Share of a step's GRPO groups the last step keeps (at least one group)."""
    input_corr: float = 0.0
    """Correlation of log prompt length with the prompt's difficulty."""
    max_turns: int = 1
    """Turns of a multi-turn agent's response at most (1: single-turn, no tool calls)."""
    turn_tokens: int = 500
    """Generated tokens per turn: a response takes ceil(length / turn_tokens) turns, up to max_turns."""
    tool_median_s: float = 1.0
    """Median seconds of one tool call (lognormal)."""
    tool_sigma: float = 0.6
    """Spread of log tool seconds."""

    @property
    def steps_per_epoch(self) -> int:
        return math.ceil(self.num_prompts / self.prompts_per_step)

    @property
    def responses_per_step(self) -> int:
        return self.prompts_per_step * self.group_size

    @property
    def last_step_groups(self) -> int:
        return max(1, math.floor(self.last_step_share * self.prompts_per_step + 1e-9))

    def mean_length(self, step: int) -> float:
        """Mean response length before truncation at global training step `step`."""
        return self.mean_start + (self.mean_end - self.mean_start) * step / self.ramp_steps


def expected_truncated_share(median: float, cfg: SyntheticConfig) -> float:
    """Expected share of responses at `cfg.max_len` when the body's median length is `median`:
    (1 - w) P(lognormal >= max_len) + w P(Pareto >= max_len)."""
    sigma = math.hypot(cfg.sigma_prompt, cfg.sigma_response)
    ratio = math.log(cfg.max_len / median)
    body = 0.5 * math.erfc(ratio / (sigma * math.sqrt(2.0))) if sigma > 0 else float(ratio <= 0)
    tail = min(1.0, math.exp(-cfg.pareto_alpha * ratio))
    return (1.0 - cfg.pareto_share) * body + cfg.pareto_share * tail


def median_for_share(cfg: SyntheticConfig) -> float:
    """The body's median length at which `expected_truncated_share` (increasing in it) meets
    `cfg.truncated_share`: bisection in log space below max_len, where the share is >= 1/2."""
    lo, hi = math.log(cfg.max_len) - 60.0, math.log(cfg.max_len)
    for _ in range(200):
        mid = (lo + hi) / 2.0
        if expected_truncated_share(math.exp(mid), cfg) < cfg.truncated_share:
            lo = mid
        else:
            hi = mid
    return math.exp((lo + hi) / 2.0)


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
    "dapo-math": SyntheticConfig(
        name="synthetic:dapo-math",
        sigma_prompt=0.593,
        sigma_response=0.18,
        epoch_corr=0.0,
        recurring_ids=False,
        steps=12,
        prompts_per_step=64,
        group_size=16,
        max_len=20480,
        truncated_share=0.12,
        pareto_share=0.05,
        pareto_alpha=1.5,
        last_step_share=0.4,
        input_median=140.0,
        input_sigma=0.4,
        input_max=2048,
    ),
    "vl-video": SyntheticConfig(
        name="synthetic:vl-video",
        sigma_prompt=0.35,
        sigma_response=0.3,
        epoch_corr=0.0,
        recurring_ids=False,
        steps=20,
        prompts_per_step=32,
        group_size=8,
        max_len=768,
        truncated_share=0.05,
        pareto_share=0.02,
        pareto_alpha=2.5,
        last_step_share=0.25,
        input_median=4300.0,
        input_sigma=0.25,
        input_max=16384,
    ),
    "code-14b": SyntheticConfig(
        name="synthetic:code-14b",
        sigma_prompt=0.652,
        sigma_response=0.41,
        epoch_corr=0.0,
        recurring_ids=False,
        steps=8,
        prompts_per_step=64,
        group_size=8,
        max_len=32768,
        truncated_share=0.08,
        pareto_share=0.03,
        pareto_alpha=1.5,
        last_step_share=0.6,
        input_median=450.0,
        input_sigma=0.6,
        input_max=4096,
    ),
    "search-agent": SyntheticConfig(
        name="synthetic:search-agent",
        sigma_prompt=0.45,
        sigma_response=0.5,
        epoch_corr=0.0,
        recurring_ids=False,
        steps=16,
        prompts_per_step=32,
        group_size=5,
        max_len=1500,
        truncated_share=0.25,
        pareto_share=0.1,
        pareto_alpha=1.2,
        last_step_share=0.5,
        input_median=300.0,
        input_sigma=0.3,
        input_max=2048,
        max_turns=3,
        turn_tokens=500,
        tool_median_s=1.5,
        tool_sigma=0.6,
    ),
}


def _validate(cfg: SyntheticConfig) -> None:
    for name in ("num_prompts", "prompts_per_step", "group_size", "steps", "ramp_steps", "max_len", "input_max",
                 "max_turns", "turn_tokens"):
        if getattr(cfg, name) < 1:
            raise TraceError(f"{cfg.name}: {name}: {getattr(cfg, name)} must be >= 1")
    for name in ("sigma_prompt", "sigma_response", "mean_start", "mean_end", "input_median", "input_sigma",
                 "tool_median_s", "tool_sigma"):
        if not 0.0 <= getattr(cfg, name) < math.inf:
            raise TraceError(f"{cfg.name}: {name}: {getattr(cfg, name)} must be a finite number >= 0")
    for name in ("seed", "start_step"):
        if getattr(cfg, name) < 0:
            raise TraceError(f"{cfg.name}: {name}: {getattr(cfg, name)} must be >= 0")
    bounds = {"epoch_corr": (0.0, 1.0), "pareto_share": (0.0, 1.0), "input_corr": (-1.0, 1.0)}
    for name, (low, high) in bounds.items():
        if not low <= getattr(cfg, name) <= high:
            raise TraceError(f"{cfg.name}: {name}: {getattr(cfg, name)} must lie in {low:g}..{high:g}")
    if not 0.0 <= cfg.truncated_share < 0.5:
        raise TraceError(f"{cfg.name}: truncated_share: {cfg.truncated_share} must lie in 0..0.5 (0 keeps the "
                         f"mean_start..mean_end ramp)")
    if not 0.0 < cfg.last_step_share <= 1.0:
        raise TraceError(f"{cfg.name}: last_step_share: {cfg.last_step_share} must lie in (0, 1]")
    if not 0.0 < cfg.pareto_alpha < math.inf:
        raise TraceError(f"{cfg.name}: pareto_alpha: {cfg.pareto_alpha} must be a finite number > 0")
    if cfg.truncated_share > 0 and cfg.sigma_prompt == cfg.sigma_response == 0.0 and cfg.pareto_share == 0.0:
        raise TraceError(f"{cfg.name}: truncated_share needs a spread of lengths (sigma_prompt, sigma_response or "
                         f"pareto_share > 0)")
    if cfg.recurring_ids and cfg.prompts_per_step > cfg.num_prompts:
        raise TraceError(f"{cfg.name}: prompts_per_step: larger than num_prompts")
    responses = cfg.steps * cfg.responses_per_step
    if responses > MAX_RESPONSES:
        raise TraceError(f"{cfg.name}: steps x prompts_per_step x group_size = {responses} responses; at most "
                         f"{MAX_RESPONSES} (a synthetic trace is built in memory)")


def _inputs(rng: np.random.Generator, cfg: SyntheticConfig, difficulty: NDArray[np.float64]) -> NDArray[np.float64]:
    log_in = rng.normal(0.0, cfg.input_sigma, len(difficulty))
    if cfg.input_corr and cfg.sigma_prompt > 0:
        rho = cfg.input_corr
        log_in = cfg.input_sigma * rho * difficulty / cfg.sigma_prompt + math.sqrt(1.0 - rho**2) * log_in
    return np.asarray(np.clip(np.round(cfg.input_median * np.exp(log_in)), 8, cfg.input_max))


def generate(cfg: SyntheticConfig) -> Trace:
    _validate(cfg)
    rng = np.random.default_rng(cfg.seed)
    n, spe = cfg.num_prompts, cfg.steps_per_epoch
    g = cfg.group_size
    calibrated = median_for_share(cfg) if cfg.truncated_share > 0 else 0.0
    shift = 0.0 if calibrated else (cfg.sigma_prompt**2 + cfg.sigma_response**2) / 2.0
    difficulty = rng.normal(0.0, cfg.sigma_prompt, n if cfg.recurring_ids else cfg.prompts_per_step)
    inputs = _inputs(rng, cfg, difficulty)
    innovation = cfg.sigma_prompt * math.sqrt(max(0.0, 1.0 - cfg.epoch_corr**2))
    steps: list[int] = []
    pids: list[str] = []
    ins: list[int] = []
    outs: list[int] = []
    order = rng.permutation(n) if cfg.recurring_ids else np.arange(cfg.prompts_per_step)
    for s in range(1, cfg.steps + 1):
        pos = (s - 1) % spe
        if not cfg.recurring_ids:
            if s > 1:
                difficulty = rng.normal(0.0, cfg.sigma_prompt, cfg.prompts_per_step)
                inputs = _inputs(rng, cfg, difficulty)
            chosen = order
        else:
            if pos == 0 and s > 1:  # new epoch: difficulties drift, order reshuffles
                difficulty = cfg.epoch_corr * difficulty + rng.normal(0.0, innovation, n)
                order = rng.permutation(n)
            chosen = order[pos * cfg.prompts_per_step : (pos + 1) * cfg.prompts_per_step]
        if s == cfg.steps and cfg.last_step_share < 1.0:
            chosen = chosen[: cfg.last_step_groups]
        mean = calibrated or cfg.mean_length(cfg.start_step + s)
        for p in chosen.tolist():
            noise = rng.normal(0.0, cfg.sigma_response, g)
            raw = mean * np.exp(difficulty[p] + noise - shift)
            if cfg.pareto_share > 0:
                runaway = rng.random(g) < cfg.pareto_share
                tail = mean * math.exp(-shift) * (1.0 - rng.random(g)) ** (-1.0 / cfg.pareto_alpha)
                raw = np.where(runaway, tail, raw)
            lens = np.clip(np.round(raw), 1, cfg.max_len)
            steps.extend([s] * g)
            pids.extend([f"p{p:05d}" if cfg.recurring_ids else f"s{s:03d}-p{p:04d}"] * g)
            ins.extend([int(inputs[p])] * g)
            outs.extend(int(x) for x in lens)
    return Trace.build(cfg.name, steps, pids, ins, outs, turns=_turns(cfg, outs) if cfg.max_turns > 1 else None)


def _turns(cfg: SyntheticConfig, outs: list[int]) -> Turns:
    """Split each response into turns with a tool call between consecutive ones (module docstring)."""
    rng = np.random.default_rng([cfg.seed, 1])
    lens = np.asarray(outs, dtype=np.int64)
    count = np.clip(-(-lens // cfg.turn_tokens), 1, cfg.max_turns)
    tool = cfg.tool_median_s * np.exp(rng.normal(0.0, cfg.tool_sigma, int(count.sum())))
    rows: list[list[tuple[int, float]]] = []
    at = 0
    for n, k in zip(lens.tolist(), count.tolist(), strict=True):
        base, extra = divmod(n, k)
        rows.append([(base + (j < extra), float(tool[at + j])) for j in range(k)])
        at += k
    return Turns.of(rows)


def synthetic(name: str, **overrides: object) -> Trace:
    """A named preset (see PRESETS), optionally with fields overridden."""
    key = name.removeprefix("synthetic:")
    if key not in PRESETS:
        raise TraceError(f"synthetic:{key}: unknown synthetic trace; choose one of {', '.join(PRESETS)}")
    return generate(replace(PRESETS[key], **overrides))  # type: ignore[arg-type]


BOOLS = {"true": True, "1": True, "yes": True, "on": True, "false": False, "0": False, "no": False, "off": False}


def parse_overrides(pairs: list[str], option: str = "--synthetic") -> dict[str, object]:
    """`KEY=VALUE` strings into SyntheticConfig overrides, typed like the field they set."""
    types = {f.name: str(f.type) for f in fields(SyntheticConfig)}
    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip()
        if not sep or key not in types or key == "name":
            valid = ", ".join(k for k in types if k != "name")
            raise TraceError(f"{option} {pair!r}: expected KEY=VALUE with KEY one of {valid}")
        if types[key] == "bool":
            if value.strip().lower() not in BOOLS:
                raise TraceError(f"{option} {key}: {value!r} is not true or false")
            out[key] = BOOLS[value.strip().lower()]
            continue
        kind = {"int": int, "float": float}[types[key]]
        try:
            out[key] = kind(value)
        except ValueError:
            raise TraceError(f"{option} {key}: {value!r} is not {'an integer' if kind is int else 'a number'}") from None
    return out


def load_trace(source: str, *, progress: Progress | None = None, **overrides: object) -> Trace:
    """`synthetic:NAME` or a CSV path; `progress` follows the reading of a file."""
    if source.startswith("synthetic:"):
        return synthetic(source, **overrides)
    if overrides:
        raise TraceError(f"{source}: options {', '.join(overrides)} only apply to synthetic traces")
    return read_trace(Path(source), progress)

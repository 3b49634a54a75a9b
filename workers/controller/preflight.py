"""A job's prompts checked against its model before anything is written.

The step loop meets a prompt only when that prompt's step comes: a character the tokenizer lacks,
or a prompt too long for the model's context, used to stop a run hours in, after checkpoints were
written. Here every prompt is read, tokenized and measured up front, from the model's config.json
and tokenizer.json only (no weights, no torch), so `rhymerl validate` can afford it too. `rhymerl
run` also reaches the job's Redis first (check_redis), which `rhymerl validate` cannot: a cluster's
Redis is seldom reachable from where the spec is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from rhymerl.api import RLJob, SpecError
from rhymerl.api.history_keys import REDIS_PASSWORD_ENV
from rhymerl.api.load import SpecProblem
from rhymerl.workers.history.redis_store import PING_TIMEOUT_S, ping
from rhymerl.workers.model.folder import ModelConfig, check_native, model_dir, read_config
from rhymerl.workers.model.tokenizer import Tokenizer, load_tokenizer
from rhymerl.workers.task.prompts import (
    BUILTIN_PREFIX,
    DataError,
    Prompt,
    located_prompts,
    prompt_text,
    prompt_tokens,
)

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
KV_LANES = 16  # the native attention kernel rounds cache rows up to this many positions


@dataclass(frozen=True)
class Checked:
    """What preflight found: the model's config and the longest prompt, where they could be read."""

    config: ModelConfig | None = None
    longest_prompt: int | None = None  # tokens, <bos> included
    skipped: list[str] = field(default_factory=list)  # checks left out because a path is not on this machine


def _describe(ch: str) -> str:
    return f"{ch!r} (U+{ord(ch):04X})"


def check_prompt(where: str, prompt: Prompt, tok: Tokenizer, positions: int,
                 response: int) -> tuple[int, list[str]]:
    """The prompt's length in tokens (with what the tokenizer puts first, or as the chat template renders it; 0 when it
    cannot be encoded) and what keeps the model from taking it: a template that refuses it, a character without a
    token, or more tokens than its context leaves."""
    found = []
    try:
        text = prompt_text(tok, prompt)
    except DataError as exc:
        return 0, [f"{where}: {exc}"]
    for name, value in (("prompt", text), ("answer", prompt.answer)):
        at = tok.unknown(value)
        if at is not None:
            found.append(f"{where}: {name}: character {_describe(value[at])} at position {at + 1} is not in the "
                         "model's tokenizer")
    if found:
        return 0, found
    tokens = len(prompt_tokens(tok, prompt))
    if tokens + response + 1 > positions:
        found.append(f"{where}: prompt is {tokens} tokens; with algorithm.max_response_length {response} a "
                     f"sample needs {tokens + response + 1} positions and the model has {positions}")
    return tokens, found


def _summary(problems: list[str]) -> str:
    more = len(problems) - 1
    return problems[0] + (f" (and {more} more problem{'s' * (more > 1)} in the prompts)" if more else "")


def preflight(job: RLJob, absent_ok: bool = False) -> Checked:
    """Read every prompt of `job` and check it against the model; raise DataError naming `file:line`
    (or ModelError naming the model file). With `absent_ok`, a model folder or data file that is not
    on this machine (a cluster job's paths) is noted in `Checked.skipped` instead of being an error."""
    spec = job.spec
    skipped: list[str] = []
    cfg: ModelConfig | None = None
    tok: Tokenizer | None = None
    local_model = spec.model.path.startswith(BUILTIN_PREFIX) or Path(spec.model.path).exists()
    if absent_ok and not local_model:
        skipped.append(f"model: {spec.model.path} is not on this machine")
    else:
        folder = model_dir(spec.model.path)
        if spec.model.implementation == "native":
            check_native(folder)
        cfg = read_config(folder)
        tok = load_tokenizer(folder)
        response = spec.algorithm.max_response_length
        if response + 3 > cfg.max_position_embeddings:  # <bos>, one prompt token, the sampled token
            raise SpecError([SpecProblem("spec.algorithm.max_response_length",
                                         f"{response} leaves no room for a prompt in the model's "
                                         f"{cfg.max_position_embeddings} positions ({folder / 'config.json'})")])
    source = spec.data.source
    if absent_ok and not source.startswith(BUILTIN_PREFIX) and not Path(source).exists():
        skipped.append(f"data: {source} is not on this machine")
        return Checked(cfg, None, skipped)
    prompts = located_prompts(spec.data)
    if tok is None or cfg is None:
        return Checked(cfg, None, skipped)
    problems: list[str] = []
    longest = 0
    for where, prompt in prompts:
        tokens, found = check_prompt(where, prompt, tok, cfg.max_position_embeddings,
                                     spec.algorithm.max_response_length)
        problems += found
        longest = max(longest, tokens)
    if problems:
        raise DataError(_summary(problems))
    return Checked(cfg, longest, skipped)


def kv_cache_bytes(job: RLJob, cfg: ModelConfig, longest_prompt: int) -> int:
    """Bytes of KV cache the local torch engines allocate at most: every rollout worker's slots, each as long
    as the longest prompt plus the longest response."""
    spec = job.spec
    batch = spec.algorithm.group_size * spec.algorithm.prompts_per_step
    slots = min(batch, spec.rollout.replicas * spec.rollout.max_batch_size)
    positions = -(-(longest_prompt + spec.algorithm.max_response_length + 1) // KV_LANES) * KV_LANES
    per_slot = 2 * cfg.num_hidden_layers * cfg.kv_heads * cfg.head_dim * positions
    return int(slots * per_slot * DTYPE_BYTES[spec.model.dtype])


def physical_memory() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def check_memory(job: RLJob, checked: Checked, memory: int | None = None) -> None:
    """Refuse a local job whose torch engines' KV cache alone exceeds this machine's memory (`memory`
    bytes); vLLM sizes its own cache (VLLM_CPU_KVCACHE_SPACE, gpu_memory_utilization)."""
    if checked.config is None or checked.longest_prompt is None or job.spec.rollout.engine != "torch":
        return
    need = kv_cache_bytes(job, checked.config, checked.longest_prompt)
    have = physical_memory() if memory is None else memory
    if need > have:
        gib = 1 << 30
        raise SpecError([SpecProblem(
            "spec.rollout.max_batch_size",
            f"the KV cache alone needs {need / gib:.1f} GiB (sequences decoded together: min(group_size x "
            f"prompts_per_step, rollout workers x max_batch_size); each up to {checked.longest_prompt} prompt + "
            f"{job.spec.algorithm.max_response_length} response tokens) and this machine has {have / gib:.1f} GiB")])


def check_redis(job: RLJob, timeout_s: float = PING_TIMEOUT_S) -> None:
    """Reach the job's Redis (PING, with the password from RHYMERL_REDIS_PASSWORD) before a run writes
    anything: a run whose Redis is down or refuses it would roll out without history drafts from its
    first step (HistoryStoreError, one line naming the URL without a password)."""
    history = job.spec.history
    if history.store != "redis":
        return
    assert history.redis_url is not None
    ping(history.redis_url, os.environ.get(REDIS_PASSWORD_ENV) or None, timeout_s)

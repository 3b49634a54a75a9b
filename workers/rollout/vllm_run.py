"""A vLLM generate driven one engine step at a time: the loop of vLLM's own `LLM._run_engine`
(add_request, step until done), opened up so that a caller acts between steps. A rollout worker
told to leave (a spot notice, a scale-down) hands its running requests back after the current
step: they are aborted in vLLM and come back with the tokens and log-probabilities they had, and
a request resumed from such a partial result continues from its tokens, so a notice waits for at
most one engine step.

Requests stream their new tokens each step (vLLM's DELTA outputs): what a request has so far is
always here, in this process, with nothing to ask vLLM for when it is aborted. A resumed request
is sent to vLLM as its prompt followed by the tokens it brought, and samples the rest with a seed
of its own (the sample's seed mixed with how many tokens it brought: reusing the sample's seed
would reuse the random numbers its first tokens were drawn with).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams


def request_seed(seed: int, sample_id: int) -> int:
    """A request's sampling seed: the job's seed and the sample's stable key, mixed (splitmix64)."""
    z = (seed * 0x9E3779B97F4A7C15 + sample_id + 1) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFF


def resumed_seed(seed: int, sample_id: int, carried: int) -> int:
    """The seed of a request that brought `carried` tokens: the sample's own seed when it brought none."""
    first = request_seed(seed, sample_id)
    return first if carried == 0 else request_seed(first, carried)


def joined(carried: GenResult, ids: list[int], logprobs: list[float] | None) -> GenResult:
    """A partial result followed by tokens generated since (with their log-probabilities, None where
    either part has none or one is not finite): one result, the carried counters kept."""
    lps = None if carried.logprobs is None or logprobs is None else [*carried.logprobs, *logprobs]
    if lps is not None and not all(math.isfinite(x) for x in lps):
        lps = None
    return replace(carried, response_ids=[*carried.response_ids, *ids], logprobs=lps,
                   by_source={n: replace(c) for n, c in carried.by_source.items()})


@dataclass
class _Live:
    request_id: str
    carried: GenResult
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] | None = field(default_factory=list)


class VllmRun:
    """Requests on one vLLM engine (`llm`: vLLM's `LLM`), stepped by the caller: `add` queues a
    request under a key (optionally resuming a partial result), `step` runs one engine step and
    returns what finished, `take` aborts a request and returns its partial result."""

    def __init__(self, llm: Any, params: SamplingParams, stops: Sequence[int], logprobs: bool = True) -> None:
        self.llm = llm
        self.params = params
        self.stops = list(stops)
        self.logprobs = logprobs
        self._live: dict[int, _Live] = {}
        self._keys: dict[str, int] = {}

    @property
    def busy(self) -> bool:
        return bool(self._live)

    def running(self) -> list[int]:
        """Keys of the requests not finished yet, in the order they were added."""
        return list(self._live)

    def generated(self, key: int) -> int:
        """Response tokens an unfinished request has so far (those it brought included)."""
        live = self._live[key]
        return len(live.carried.response_ids) + len(live.ids)

    def add(self, key: int, request: GenRequest, resume: GenResult | None = None) -> None:
        self.add_all([(key, request, resume)])

    def add_all(self, items: Sequence[tuple[int, GenRequest, GenResult | None]]) -> None:
        """Queue requests, each under a key unique in this run; a resumed one must be unfinished."""
        from vllm import SamplingParams as VParams
        from vllm import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        vparams, prompts = [], []
        for key, request, resume in items:
            carried = resume if resume is not None else GenResult(logprobs=[])
            n = len(carried.response_ids)
            if key in self._live or n >= self.params.max_response_length \
                    or (n and carried.response_ids[-1] in self.stops):
                raise ValueError(f"key {key}: already running, or resumed from a finished response")
            vparams.append(VParams(n=1, temperature=self.params.temperature, top_p=self.params.top_p,
                                   seed=resumed_seed(self.params.seed, request.sample_id, n),
                                   max_tokens=self.params.max_response_length - n,
                                   stop_token_ids=self.stops or None, ignore_eos=not self.stops, detokenize=False,
                                   logprobs=0 if self.logprobs else None, output_kind=RequestOutputKind.DELTA))
            prompts.append(TokensPrompt(prompt_token_ids=[*request.prompt_ids, *carried.response_ids]))
            live = _Live(str(next(self.llm.request_counter)), carried)
            live.logprobs = [] if self.logprobs else None
            self._live[key] = live
            self._keys[live.request_id] = key
        for prompt, vp, (key, _, _) in zip(self.llm._preprocess_cmpl(prompts), vparams, items, strict=True):
            self.llm.llm_engine.add_request(self._live[key].request_id, prompt, vp)

    def step(self) -> list[tuple[int, GenResult]]:
        """One engine step; the requests that finished in it (key, result)."""
        done = []
        for out in self.llm.llm_engine.step():
            key = self._keys.get(out.request_id)
            if key is None:
                continue
            live = self._live[key]
            (choice,) = out.outputs
            ids = list(choice.token_ids)
            live.ids += ids
            if live.logprobs is not None:
                if choice.logprobs is None or len(choice.logprobs) != len(ids):
                    live.logprobs = None
                else:
                    live.logprobs += [d[t].logprob for d, t in zip(choice.logprobs, ids, strict=True)]
            if out.finished:
                done.append((key, self._pop(key)))
        return done

    def take(self, key: int) -> GenResult:
        """Abort an unfinished request; its partial result (what resumes it, here or elsewhere)."""
        live = self._live[key]
        self.llm.llm_engine.abort_request([live.request_id])
        return self._pop(key)

    def close(self) -> None:
        """Abort every request still running (a call that ended early leaves the engine empty)."""
        for key in list(self._live):
            self.take(key)

    def _pop(self, key: int) -> GenResult:
        live = self._live.pop(key)
        del self._keys[live.request_id]
        result = joined(live.carried, live.ids, live.logprobs)
        ids = result.response_ids
        result.finish_reason = "stop" if ids and ids[-1] in self.stops else "length"
        return result

"""The torch rollout engine: continuous batching over a slot KV cache, position-keyed sampling.

Requests wait in a queue; whenever a slot frees up, waiting prompts are prefilled into free slots
and every running slot decodes one token per pass. When the queue is empty and fewer than half
the slots are still running (the long tail), running sequences are packed into the lowest slots
so later passes only touch live rows.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from rhymerl.workers.model.transformer import KVCache, TinyLlama
from rhymerl.workers.rollout.sampling import sample_tokens


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int = 0
    max_response_length: int = 640


@dataclass(frozen=True)
class GenRequest:
    prompt_ids: list[int]
    sample_id: int


@dataclass
class GenResult:
    response_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    forward_passes: int = 0


class TorchEngine:
    def __init__(self, model: TinyLlama, eos_id: int, max_batch_size: int = 256,
                 device: str | torch.device = "cpu") -> None:
        self.model = model.eval()
        self.eos_id = eos_id
        self.max_batch_size = max_batch_size
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        """New policy weights (e.g. after a training step)."""
        self.model.load_state_dict(state)

    @torch.inference_mode()
    def generate(self, requests: list[GenRequest], params: SamplingParams) -> list[GenResult]:
        if not requests:
            return []
        longest_prompt = max(len(r.prompt_ids) for r in requests)
        max_len = longest_prompt + params.max_response_length
        if max_len > self.model.cfg.max_position_embeddings:
            raise ValueError(f"prompt ({longest_prompt}) + max_response_length ({params.max_response_length}) "
                             f"exceeds the model's {self.model.cfg.max_position_embeddings} positions")
        n_slots = min(self.max_batch_size, len(requests))
        cache = KVCache(self.model.cfg, n_slots, max_len, self.dtype, self.device)
        results = [GenResult() for _ in requests]
        queue = deque(range(len(requests)))
        owner = [-1] * n_slots          # request index in each slot, -1 when free
        lens = torch.zeros(n_slots, dtype=torch.int64, device=self.device)   # tokens stored per slot
        last = torch.zeros(n_slots, dtype=torch.int64, device=self.device)   # sampled, not yet stored
        sample_ids = torch.zeros(n_slots, dtype=torch.int64, device=self.device)
        rows = n_slots                   # passes touch slots [0, rows)

        def accept(slot: int, token: int) -> None:
            res = results[owner[slot]]
            res.response_ids.append(token)
            res.forward_passes += 1
            if token == self.eos_id:
                res.finish_reason = "stop"
            if token == self.eos_id or len(res.response_ids) >= params.max_response_length:
                owner[slot] = -1

        while queue or any(o >= 0 for o in owner[:rows]):
            free = [s for s in range(rows) if owner[s] < 0]
            if queue and free:
                self._prefill(requests, queue, free, owner, cache, lens, last, sample_ids, params, accept)
            running = [s for s in range(rows) if owner[s] >= 0]
            if not running:
                continue
            if not queue and len(running) <= rows // 2:
                src = torch.tensor(running, device=self.device)
                dst = torch.arange(len(running), device=self.device)
                cache.move(src, dst)
                lens[dst], last[dst], sample_ids[dst] = lens[src].clone(), last[src].clone(), sample_ids[src].clone()
                owner[: len(running)] = [owner[s] for s in running]
                rows = len(running)
                owner[rows:] = [-1] * (n_slots - rows)
                running = list(range(rows))
            logits = self.model.forward_cached(last[:rows, None], lens[:rows], cache)[:, 0]
            positions = torch.tensor([len(results[owner[s]].response_ids) if owner[s] >= 0 else 0
                                      for s in range(rows)], device=self.device)
            tokens = sample_tokens(logits, params.seed, sample_ids[:rows], positions, params.temperature, params.top_p)
            lens[:rows] += torch.tensor([owner[s] >= 0 for s in range(rows)], device=self.device)
            last[:rows] = tokens
            for s, tok in zip(running, tokens[running].tolist(), strict=True):
                accept(s, tok)
        return results

    def _prefill(self, requests: list[GenRequest], queue: deque[int], free: list[int], owner: list[int],
                 cache: KVCache, lens: torch.Tensor, last: torch.Tensor, sample_ids: torch.Tensor,
                 params: SamplingParams, accept: Callable[[int, int], None]) -> None:
        taken = [(slot, queue.popleft()) for slot in free[: len(queue)]]
        width = max(len(requests[i].prompt_ids) for _, i in taken)
        tokens = torch.zeros(len(taken), width, dtype=torch.int64, device=self.device)
        for row, (_, i) in enumerate(taken):
            ids = requests[i].prompt_ids
            tokens[row, : len(ids)] = torch.tensor(ids, device=self.device)
        slots = torch.tensor([s for s, _ in taken], device=self.device)
        ends = torch.tensor([len(requests[i].prompt_ids) - 1 for _, i in taken], device=self.device)
        logits = self.model.prefill(tokens, slots, cache)[torch.arange(len(taken)), ends]
        sids = torch.tensor([requests[i].sample_id for _, i in taken], device=self.device)
        first = sample_tokens(logits, params.seed, sids, torch.zeros_like(sids), params.temperature, params.top_p)
        lens[slots], last[slots], sample_ids[slots] = ends + 1, first, sids
        for (slot, i), tok in zip(taken, first.tolist(), strict=True):
            owner[slot] = i
            accept(slot, tok)

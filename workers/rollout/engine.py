"""The torch rollout engine: continuous batching over a slot KV cache, lossless batched speculation.

Requests wait in a queue; whenever a slot frees up, waiting prompts are prefilled into free slots.
Every pass appends, for each running slot, its last sampled token plus an optional draft (ragged
lengths, padded) and runs the whole batch through the model once. The target token at every
appended position is sampled with the position-keyed rule (sampling.py), so a draft token is
accepted exactly when it equals the token plain decoding would have produced there: the accepted
prefix and the token after it are emitted, the rejected tail is rolled back by not advancing the
slot's cache length. With no drafts this is plain decoding, through the same code.

When the queue is empty and at most half the slots still run (the long tail), running sequences
are packed into the lowest slots so later passes only touch live rows.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

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
    prompt_id: str = ""


@dataclass
class GenResult:
    response_ids: list[int] = field(default_factory=list)
    finish_reason: str = "length"
    forward_passes: int = 0
    drafted: int = 0
    accepted: int = 0


class DraftSource(Protocol):
    """What the engine needs from a speculator; `slot` identifies a running sequence."""

    def begin(self, slot: int, request: GenRequest) -> None: ...

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        """Drafts for these running slots; `batch_size` running sequences share the pass."""
        ...

    def settle(self, slots: list[int], drafted: list[int], accepted: list[int], emitted: list[list[int]]) -> None:
        """After verification: per slot, draft length, accepted prefix length, tokens appended."""
        ...

    def end(self, slot: int) -> None: ...

    def move(self, src: list[int], dst: list[int]) -> None:
        """Running sequences were packed from slots src[i] to dst[i]."""
        ...


class _Batch:
    """Mutable per-slot state of one generate() call."""

    def __init__(self, n_slots: int, device: torch.device) -> None:
        self.owner = [-1] * n_slots  # request index per slot, -1 when free
        self.lens = torch.zeros(n_slots, dtype=torch.int64, device=device)       # tokens in the cache
        self.last = torch.zeros(n_slots, dtype=torch.int64, device=device)       # sampled, not yet cached
        self.sample_ids = torch.zeros(n_slots, dtype=torch.int64, device=device)
        self.rows = n_slots  # passes touch slots [0, rows)

    def running(self) -> list[int]:
        return [s for s in range(self.rows) if self.owner[s] >= 0]


class TorchEngine:
    def __init__(self, model: TinyLlama, eos_id: int, max_batch_size: int = 256,
                 device: str | torch.device = "cpu") -> None:
        self.model = model.eval()
        self.eos_id = eos_id
        self.max_batch_size = max_batch_size
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype

    @torch.inference_mode()
    def generate(self, requests: list[GenRequest], params: SamplingParams,
                 drafts: DraftSource | None = None) -> list[GenResult]:
        if not requests:
            return []
        longest_prompt = max(len(r.prompt_ids) for r in requests)
        max_len = longest_prompt + params.max_response_length + 1
        if max_len > self.model.cfg.max_position_embeddings:
            raise ValueError(f"prompt ({longest_prompt}) + max_response_length ({params.max_response_length}) "
                             f"exceeds the model's {self.model.cfg.max_position_embeddings} positions")
        n_slots = min(self.max_batch_size, len(requests))
        cache = KVCache(self.model.cfg, n_slots, max_len, self.dtype, self.device)
        results = [GenResult() for _ in requests]
        queue = deque(range(len(requests)))
        b = _Batch(n_slots, self.device)

        def emit(slot: int, tokens: list[int]) -> list[int]:
            """Append sampled tokens to the slot's response; stop at EOS or the length limit."""
            res = results[b.owner[slot]]
            room = params.max_response_length - len(res.response_ids)
            kept = tokens[:room]
            if self.eos_id in kept:
                kept = kept[: kept.index(self.eos_id) + 1]
                res.finish_reason = "stop"
            res.response_ids += kept
            if kept[-1] == self.eos_id or len(res.response_ids) >= params.max_response_length:
                b.owner[slot] = -1
                if drafts is not None:
                    drafts.end(slot)
            return kept

        while queue or b.running():
            free = [s for s in range(b.rows) if b.owner[s] < 0]
            if queue and free:
                self._prefill(requests, queue, free, b, cache, params, results, emit, drafts)
            running = b.running()
            if not running:
                continue
            if not queue and len(running) <= b.rows // 2:
                self._pack(b, cache, running, drafts)
                running = list(range(b.rows))
            proposals = drafts.propose(running, len(running)) if drafts is not None else [[] for _ in running]
            self._verify(b, cache, running, proposals, params, results, emit, drafts)
        return results

    def _verify(self, b: _Batch, cache: KVCache, running: list[int], proposals: list[list[int]],
                params: SamplingParams, results: list[GenResult], emit: _Emit, drafts: DraftSource | None) -> None:
        rows = b.rows
        width = 1 + max((len(p) for p in proposals), default=0)
        draft_len = [0] * rows
        tokens = b.last[:rows, None]
        if width > 1:
            padded = [[0] * (width - 1) for _ in range(rows)]
            for s, prop in zip(running, proposals, strict=True):
                padded[s][: len(prop)] = prop
                draft_len[s] = len(prop)
            tokens = torch.cat([tokens, torch.tensor(padded, dtype=torch.int64, device=self.device)], dim=1)
        logits = self.model.forward_cached(tokens, b.lens[:rows], cache)
        done = torch.tensor([len(results[b.owner[s]].response_ids) if b.owner[s] >= 0 else 0 for s in range(rows)],
                            device=self.device)
        positions = done[:, None] + torch.arange(width, device=self.device)[None, :]
        target = sample_tokens(logits, params.seed, b.sample_ids[:rows, None].expand(-1, width), positions,
                               params.temperature, params.top_p)
        # accepted prefix: leading positions where the draft equals the target sampled before it
        match = (tokens[:, 1:] == target[:, :-1]).to(torch.int64)
        accepted_all = match.cumprod(dim=1).sum(dim=1) if width > 1 else torch.zeros(rows, dtype=torch.int64)
        target_rows, accepted_rows = target.tolist(), accepted_all.tolist()
        grow = [0] * rows
        last = b.last[:rows].tolist()
        settled: list[tuple[int, int, int, list[int]]] = []
        for s in running:
            a = min(accepted_rows[s], draft_len[s])
            res = results[b.owner[s]]
            res.forward_passes += 1
            res.drafted += draft_len[s]
            res.accepted += a
            grow[s] = 1 + a  # the fed token plus the accepted draft stay cached; the rest is rolled back
            kept = emit(s, target_rows[s][: a + 1])
            last[s] = kept[-1]
            if b.owner[s] >= 0:
                settled.append((s, draft_len[s], a, kept))
        b.lens[:rows] += torch.tensor(grow, device=self.device)
        b.last[:rows] = torch.tensor(last, device=self.device)
        if drafts is not None and settled:
            drafts.settle([x[0] for x in settled], [x[1] for x in settled], [x[2] for x in settled],
                          [x[3] for x in settled])

    def _pack(self, b: _Batch, cache: KVCache, running: list[int], drafts: DraftSource | None) -> None:
        src = torch.tensor(running, device=self.device)
        dst = torch.arange(len(running), device=self.device)
        cache.move(src, dst)
        b.lens[dst], b.last[dst], b.sample_ids[dst] = b.lens[src].clone(), b.last[src].clone(), b.sample_ids[src].clone()
        owners = [b.owner[s] for s in running]
        b.owner = owners + [-1] * (len(b.owner) - len(owners))
        b.rows = len(running)
        if drafts is not None:
            drafts.move(running, list(range(len(running))))

    def _prefill(self, requests: list[GenRequest], queue: deque[int], free: list[int], b: _Batch, cache: KVCache,
                 params: SamplingParams, results: list[GenResult], emit: _Emit, drafts: DraftSource | None) -> None:
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
        b.lens[slots], b.last[slots], b.sample_ids[slots] = ends + 1, first, sids
        for (slot, i), tok in zip(taken, first.tolist(), strict=True):
            b.owner[slot] = i
            results[i].forward_passes += 1
            if drafts is not None:
                drafts.begin(slot, requests[i])
            kept = emit(slot, [tok])
            if drafts is not None and b.owner[slot] >= 0:
                drafts.settle([slot], [0], [0], [kept])


class _Emit(Protocol):
    def __call__(self, slot: int, tokens: list[int]) -> list[int]: ...

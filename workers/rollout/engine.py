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

`EngineSession` exposes this loop pass by pass, so a scheduler can drive several engines
(the rollout fleet, workers/controller/fleet.py): requests are added and taken out between passes, and a
request can resume from tokens generated elsewhere. A resumed sample is prefilled with prompt +
generated tokens and continues at position len(generated); because a token depends only on the
logits and (seed, sample id, position), it continues exactly as it would have where it started.
`TorchEngine.generate` is a loop over one session.

With a `ThreadChooser` (spec.rollout.adaptive_threads) each decode pass runs at the thread count
it names and reports its time back, so a machine shared with busy processes is used at its fair
share (rhymerl/algorithms/thread_choice.py). That count is torch's, for the whole process; the
tokens do not depend on it while MKL runs in strict reproducibility mode (rhymerl/__init__.py).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Protocol

import torch

from rhymerl.algorithms.thread_choice import ThreadChooser
from rhymerl.workers.model.transformer import KVCache, TinyLlama
from rhymerl.workers.rollout.generation import GenRequest, GenResult, SamplingParams, SourceCount
from rhymerl.workers.rollout.sampling import sample_tokens


class DraftSource(Protocol):
    """What the engine needs from a speculator; `slot` identifies a running sequence."""

    def begin(self, slot: int, request: GenRequest) -> None: ...

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        """Drafts for these running slots; `batch_size` running sequences share the pass."""
        ...

    def settle(self, slots: list[int], drafted: list[int], accepted: list[int], emitted: list[list[int]]) -> None:
        """After verification: per slot, draft length, accepted prefix length, tokens appended."""
        ...

    def end(self, slot: int) -> None:
        """The sequence in `slot` finished or was taken; a finished one was settled first."""
        ...

    def move(self, src: list[int], dst: list[int]) -> None:
        """Running sequences were packed from slots src[i] to dst[i]."""
        ...

    def source_of(self, slot: int) -> str:
        """The name of the source whose draft the slot's last proposal was."""
        ...


class _Batch:
    """Mutable per-slot state of one session."""

    def __init__(self, n_slots: int, device: torch.device) -> None:
        self.owner = [-1] * n_slots  # key of the request in the slot, -1 when free
        self.lens = torch.zeros(n_slots, dtype=torch.int64, device=device)       # tokens in the cache
        self.last = torch.zeros(n_slots, dtype=torch.int64, device=device)       # sampled, not yet cached
        self.sample_ids = torch.zeros(n_slots, dtype=torch.int64, device=device)
        self.rows = n_slots  # passes touch slots [0, rows)

    def running(self) -> list[int]:
        return [s for s in range(self.rows) if self.owner[s] >= 0]


class TorchEngine:
    def __init__(self, model: TinyLlama, stop_ids: int | Iterable[int], max_batch_size: int = 256,
                 device: str | torch.device = "cpu", threads: ThreadChooser | None = None) -> None:
        """stop_ids: the tokens that end a response (the tokenizer's `stop_ids`: eos and an instruct model's end
        of turn; one int for one token); threads: chooses each decode pass's torch thread count from pass
        times (None: torch's as it is)."""
        self.model = model.eval()
        self.threads = threads
        self.stop_ids = frozenset([stop_ids] if isinstance(stop_ids, int) else stop_ids)
        self.max_batch_size = max_batch_size
        self.device = torch.device(device)
        self.dtype = next(model.parameters()).dtype

    def session(self, params: SamplingParams, drafts: DraftSource | None = None, *, slots: int | None = None,
                max_prompt_len: int) -> EngineSession:
        """A session of at most `slots` running sequences (default max_batch_size) whose prompts
        have at most `max_prompt_len` tokens."""
        return EngineSession(self, params, drafts, slots=min(self.max_batch_size, slots or self.max_batch_size),
                             max_prompt_len=max_prompt_len)

    @torch.inference_mode()
    def generate(self, requests: list[GenRequest], params: SamplingParams,
                 drafts: DraftSource | None = None) -> list[GenResult]:
        if not requests:
            return []
        session = self.session(params, drafts, slots=len(requests),
                               max_prompt_len=max(len(r.prompt_ids) for r in requests))
        for i, r in enumerate(requests):
            session.add(i, r)
        results: dict[int, GenResult] = {}
        while session.busy:
            results.update(session.step())
        return [results[i] for i in range(len(requests))]

    def _verify(self, b: _Batch, cache: KVCache, running: list[int], proposals: list[list[int]],
                params: SamplingParams, results: Mapping[int, GenResult], emit: _Emit,
                drafts: DraftSource | None) -> None:
        rows = b.rows
        width = 1 + max((len(p) for p in proposals), default=0)
        draft_len = [0] * rows
        counts = [0] * rows
        tokens = b.last[:rows, None]
        for s, prop in zip(running, proposals, strict=True):
            draft_len[s] = len(prop)
            counts[s] = 1 + len(prop)
        if width > 1:
            padded = [[0] * (width - 1) for _ in range(rows)]
            for s, prop in zip(running, proposals, strict=True):
                padded[s][: len(prop)] = prop
            tokens = torch.cat([tokens, torch.tensor(padded, dtype=torch.int64, device=self.device)], dim=1)
        per_row = torch.tensor(counts, device=self.device)
        real = torch.arange(width, device=self.device)[None, :] < per_row[:, None]
        logits = self.model.forward_cached(tokens, b.lens[:rows], cache, per_row)
        done = torch.tensor([len(results[b.owner[s]].response_ids) if b.owner[s] >= 0 else 0 for s in range(rows)],
                            device=self.device)
        positions = done[:, None] + torch.arange(width, device=self.device)[None, :]
        # only the real cells are sampled; padding gets -1, which no draft token equals
        target = torch.full((rows, width), -1, dtype=torch.int64, device=self.device)
        behaviour = torch.zeros((rows, width), dtype=torch.float64, device=self.device)
        target[real], behaviour[real] = sample_tokens(
            logits[real], params.seed, b.sample_ids[:rows, None].expand(-1, width)[real], positions[real],
            params.temperature, params.top_p)
        # accepted prefix: leading positions where the draft equals the target sampled before it
        match = (tokens[:, 1:] == target[:, :-1]).to(torch.int64)
        accepted_all = match.cumprod(dim=1).sum(dim=1) if width > 1 else torch.zeros(rows, dtype=torch.int64)
        target_rows, accepted_rows, behaviour_rows = target.tolist(), accepted_all.tolist(), behaviour.tolist()
        grow = [0] * rows
        last = b.last[:rows].tolist()
        settled: list[tuple[int, int, int, list[int]]] = []
        for s in running:
            a = min(accepted_rows[s], draft_len[s])
            res = results[b.owner[s]]
            res.forward_passes += 1
            res.drafted += draft_len[s]
            res.accepted += a
            if draft_len[s] and drafts is not None:
                count = res.by_source.setdefault(drafts.source_of(s), SourceCount())
                count.add(SourceCount(1, draft_len[s], a))
            grow[s] = 1 + a  # the fed token plus the accepted draft stay cached; the rest is rolled back
            kept = emit(s, target_rows[s][: a + 1], behaviour_rows[s][: a + 1])
            last[s] = kept[-1]
            settled.append((s, draft_len[s], a, kept))  # a finished one too: its last tokens draft for its group
        b.lens[:rows] += torch.tensor(grow, device=self.device)
        b.last[:rows] = torch.tensor(last, device=self.device)
        if drafts is not None and settled:
            drafts.settle([x[0] for x in settled], [x[1] for x in settled], [x[2] for x in settled],
                          [x[3] for x in settled])


class EngineSession:
    """One engine's rollout, driven pass by pass.

    `add` queues a request under a caller-chosen key (an int >= 0, unique in the session),
    optionally resuming from a partial result; `step` admits queued requests into free slots and
    runs one pass, returning what finished; `take` removes a waiting or running request and
    returns its partial result (to resume it elsewhere). The draft source's per-slot state
    follows: `begin` when a request is admitted (a resumed one is then fed its generated tokens
    through `settle` with nothing drafted), `end` when it is taken or, once its last tokens were
    settled, when it finishes.
    """

    def __init__(self, engine: TorchEngine, params: SamplingParams, drafts: DraftSource | None, *, slots: int,
                 max_prompt_len: int) -> None:
        max_len = max_prompt_len + params.max_response_length + 1
        if max_len > engine.model.cfg.max_position_embeddings:
            raise ValueError(f"prompt ({max_prompt_len}) + max_response_length ({params.max_response_length}) "
                             f"exceeds the model's {engine.model.cfg.max_position_embeddings} positions")
        if slots < 1:
            raise ValueError("slots: at least 1")
        self.engine = engine
        self.params = params
        self.drafts = drafts
        self.max_prompt_len = max_prompt_len
        self.slots = slots
        with torch.inference_mode():  # the state is only ever touched by passes, which run in inference mode
            self._cache = KVCache(engine.model.cfg, slots, max_len, engine.dtype, engine.device)
            self._b = _Batch(slots, engine.device)
        self._b.rows = 0  # grows as slots are taken, so a session sized for many requests pays for the live ones
        self._requests: dict[int, GenRequest] = {}
        self._results: dict[int, GenResult] = {}
        self._queue: deque[int] = deque()
        self._finished: list[tuple[int, GenResult]] = []
        self._ended: list[int] = []  # slots finished in this pass, ended in the draft source once settled

    # ------------------------------------------------------------------ queries
    @property
    def busy(self) -> bool:
        """Whether anything is waiting or running."""
        return bool(self._queue) or any(o >= 0 for o in self._b.owner)

    def waiting(self) -> list[int]:
        """Keys not admitted yet, in admission order."""
        return list(self._queue)

    def running(self) -> list[int]:
        return [o for o in self._b.owner if o >= 0]

    def __contains__(self, key: object) -> bool:
        return key in self._requests

    def generated(self, key: int) -> int:
        """Response tokens a waiting or running request has so far."""
        return len(self._results[key].response_ids)

    def tokens(self, key: int, start: int = 0) -> list[int]:
        """A waiting or running request's response tokens from `start` on (a copy)."""
        return self._results[key].response_ids[start:]

    def progress(self) -> dict[int, GenResult]:
        """Copies of every waiting or running request's partial result: what resumes them (`add`)
        if this session is lost."""
        return {k: replace(r, response_ids=list(r.response_ids), logprobs=None if r.logprobs is None else list(r.logprobs),
                           by_source={n: replace(c) for n, c in r.by_source.items()})
                for k, r in self._results.items()}

    # ------------------------------------------------------------------ changes
    def add(self, key: int, request: GenRequest, resume: GenResult | None = None, *, first: bool = False) -> None:
        """Queue `request`; `resume` carries tokens (and counters) generated elsewhere; `first` puts it
        at the head of the queue."""
        if key < 0 or key in self._requests:
            raise ValueError(f"key {key}: must be >= 0 and not already in the session")
        if len(request.prompt_ids) > self.max_prompt_len:
            raise ValueError(f"key {key}: prompt of {len(request.prompt_ids)} tokens exceeds the session's "
                             f"{self.max_prompt_len}")
        res = resume if resume is not None else GenResult()
        if res.logprobs is None and not res.response_ids:
            res.logprobs = []
        ids = res.response_ids
        if ids and (ids[-1] in self.engine.stop_ids or len(ids) >= self.params.max_response_length):
            raise ValueError(f"key {key}: cannot resume a finished response")
        self._requests[key] = request
        self._results[key] = res
        if first:
            self._queue.appendleft(key)
        else:
            self._queue.append(key)

    def take(self, key: int) -> GenResult:
        """Remove a waiting or running request; returns its partial result (resume it with `add`)."""
        if key not in self._requests:
            raise KeyError(f"key {key}: not in the session")
        b = self._b
        if key in self._queue:
            self._queue.remove(key)
        else:
            slot = b.owner.index(key)
            b.owner[slot] = -1
            if self.drafts is not None:
                self.drafts.end(slot)
        del self._requests[key]
        return self._results.pop(key)

    def _end_finished(self) -> None:
        """Tell the draft source which sequences finished, after their last tokens were settled."""
        ended, self._ended = self._ended, []
        if self.drafts is not None:
            for slot in ended:
                self.drafts.end(slot)

    @torch.inference_mode()
    def step(self) -> list[tuple[int, GenResult]]:
        """Admit waiting requests into free slots, then run one pass; returns the requests that
        finished (key, result), in the order they finished."""
        b, drafts = self._b, self.drafts
        threads = self._set_threads()  # before prefill and before the drafter prices the pass
        free = [s for s in range(self.slots) if b.owner[s] < 0]
        if self._queue and free:
            self._prefill(free)
        running = b.running()
        if running:
            if not self._queue and len(running) <= b.rows // 2:
                self._pack(running)
                running = list(range(b.rows))
            proposals: list[list[int]] = [[] for _ in running]
            if drafts is not None:
                # tokens past the length limit would be dropped by _emit; cut their drafts so every
                # position a pass appends fits the cache (max_prompt_len + max_response_length + 1)
                limit = self.params.max_response_length
                proposals = [p[: limit - len(self._results[b.owner[s]].response_ids) - 1]
                             for s, p in zip(running, drafts.propose(running, len(running)), strict=True)]
            self._timed_pass(running, proposals, threads)
        done, self._finished = self._finished, []
        return done

    # ------------------------------------------------------------------ internals
    def _set_threads(self) -> int:
        """torch's thread count for the next pass, as the engine's ThreadChooser names it (0: none)."""
        chooser = self.engine.threads
        if chooser is None:
            return 0
        n = chooser.threads()
        if torch.get_num_threads() != n:
            torch.set_num_threads(n)
        return n

    def _timed_pass(self, running: list[int], proposals: list[list[int]], threads: int) -> None:
        """One decode pass; its time goes to the engine's ThreadChooser."""
        t0 = time.perf_counter()
        self.engine._verify(self._b, self._cache, running, proposals, self.params, self._results, self._emit,
                            self.drafts)
        self._end_finished()
        if self.engine.threads is not None:
            self.engine.threads.observe(threads, time.perf_counter() - t0, len(running) + sum(map(len, proposals)))

    def _emit(self, slot: int, tokens: list[int], logprobs: list[float]) -> list[int]:
        """Append sampled tokens (and their log-probabilities) to the slot's response; stop at a stop
        token or the length limit."""
        b, stops, limit = self._b, self.engine.stop_ids, self.params.max_response_length
        key = b.owner[slot]
        res = self._results[key]
        room = limit - len(res.response_ids)
        kept = tokens[:room]
        end = next((i for i, t in enumerate(kept) if t in stops), None)
        if end is not None:
            kept = kept[: end + 1]
            res.finish_reason = "stop"
        if res.logprobs is not None and len(res.logprobs) == len(res.response_ids):
            res.logprobs += logprobs[: len(kept)]
        else:  # resumed from tokens whose log-probabilities nobody kept
            res.logprobs = None
        res.response_ids += kept
        if kept[-1] in stops or len(res.response_ids) >= limit:
            b.owner[slot] = -1
            self._ended.append(slot)
            del self._requests[key]
            self._finished.append((key, self._results.pop(key)))
        return kept

    def _pack(self, running: list[int]) -> None:
        b, device = self._b, self.engine.device
        src = torch.tensor(running, device=device)
        dst = torch.arange(len(running), device=device)
        self._cache.move(src, dst, int(b.lens[src].max()))
        b.lens[dst], b.last[dst], b.sample_ids[dst] = b.lens[src].clone(), b.last[src].clone(), b.sample_ids[src].clone()
        owners = [b.owner[s] for s in running]
        b.owner = owners + [-1] * (len(b.owner) - len(owners))
        b.rows = len(running)
        if self.drafts is not None:
            self.drafts.move(running, list(range(len(running))))

    def _prefill(self, free: list[int]) -> None:
        """Prefill prompt + already generated tokens of waiting requests into free slots and sample
        each one's next token at its response position."""
        b, device, params, drafts = self._b, self.engine.device, self.params, self.drafts
        taken = [(slot, self._queue.popleft()) for slot in free[: len(self._queue)]]
        # a GRPO group's samples share their prompt: each distinct sequence is scored once and its
        # keys/values written to every slot that holds it. On the native kernel a row gets the bits
        # its tokens would get decoded one by one, whatever rows are scored beside it
        # (tests/rollout/test_ragged_forward.py): a moved or resumed sample continues exactly
        distinct: dict[tuple[int, ...], int] = {}
        row_of = [distinct.setdefault(tuple(self._requests[k].prompt_ids + self._results[k].response_ids),
                                      len(distinct)) for _, k in taken]
        width = max(len(ids) for ids in distinct)
        tokens = torch.zeros(len(distinct), width, dtype=torch.int64, device=device)
        for row, ids in enumerate(distinct):
            tokens[row, : len(ids)] = torch.tensor(ids, device=device)
        slots = torch.tensor([s for s, _ in taken], device=device)
        rows = torch.tensor(row_of, device=device)
        ends = torch.tensor([len(ids) - 1 for ids in distinct], device=device)
        logits = self.engine.model.prefill(tokens, ends + 1, slots, self._cache, rows)[rows]
        ends = ends[rows]
        sids = torch.tensor([self._requests[k].sample_id for _, k in taken], device=device)
        positions = torch.tensor([len(self._results[k].response_ids) for _, k in taken], device=device)
        first, first_logprobs = sample_tokens(logits, params.seed, sids, positions, params.temperature, params.top_p)
        b.lens[slots], b.last[slots], b.sample_ids[slots] = ends + 1, first, sids
        b.rows = max(b.rows, max(s for s, _ in taken) + 1)
        for (slot, key), tok, logprob in zip(taken, first.tolist(), first_logprobs.tolist(), strict=True):
            b.owner[slot] = key
            res = self._results[key]
            prefix = list(res.response_ids)
            res.forward_passes += 1
            if drafts is not None:
                drafts.begin(slot, self._requests[key])
            kept = self._emit(slot, [tok], [logprob])
            if drafts is not None:
                drafts.settle([slot], [0], [0], [prefix + kept])
        self._end_finished()


class _Emit(Protocol):
    def __call__(self, slot: int, tokens: list[int], logprobs: list[float]) -> list[int]: ...

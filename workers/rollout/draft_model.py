"""A small model of the policy's tokenizer as the torch engine's draft source (`method: draft-model`).

History drafts cost no model but need a previous epoch (or siblings) to match; a draft model drafts
in every epoch and for every prompt, at the price of its own forward passes: k greedy steps per
pass, batched over the live sequences, through the engine's cached forward (`TinyLlama.
forward_cached`, the same attention code) on a KV cache of its own. The engine's verification is
unchanged, so the tokens are plain decoding's.

The draft's cache follows the engine's slots. It holds a prefix of each sequence's context;
whatever the last pass emitted (and, after a park, everything since) is fed as the first, ragged,
step of the next drafting. Draft tokens the engine accepted stay cached where they were computed
(their context was the accepted one); the rejected tail is rolled back by not counting it, as the
engine does. Each sequence drafts up to its AIMD window under the DraftCapController's per-pass
cap; the drafting runs after the cap is chosen and before the pass it belongs to, so its time is
part of the pass time the controller observes. The controller prices a pass from the verify-cost
profile plus a constant overhead, which would hide that a draft of k tokens costs k draft steps:
so the drafts on offer are first cut to the cap that `choose_cap` finds best on the profile with
k measured draft steps added to each cell (a step's cost as a measured fraction of the profile's
plain pass at that batch). Where that is 0 the source offers nothing, and offers its windows again
after PROBE_EVERY passes, then after twice as many each time the price stays 0 (up to MAX_PROBE_GAP):
a probe costs a catch-up of the draft's cache as well as its drafts, so it is made rarely while
drafting stays unpaid, yet acceptance and the step cost stay measured.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from rhymerl.algorithms.drafting.adaptive_cap import CostCalibration, CostProfile, choose_cap
from rhymerl.algorithms.drafting.index import AimdWindows
from rhymerl.api.speculation import EMBEDDED_DRAFTS, SpeculationSpec
from rhymerl.workers.model.folder import ModelError, model_dir, read_config, read_json
from rhymerl.workers.model.transformer import KVCache, TinyLlama, load_model
from rhymerl.workers.rollout.generation import GenRequest
from rhymerl.workers.rollout.speculators import PROBE_EVERY, DraftCapController

FIELD = "spec.rollout.speculation.draft_model"

MAX_PROBE_GAP = 16 * PROBE_EVERY
"""Most passes between two probes while drafting is priced off."""

def default_draft(policy: str) -> str | None:
    """The draft model that goes with a policy's model.path, where one is known (the embedded policy's)."""
    return EMBEDDED_DRAFTS.get(policy)


def draft_folder(draft: str, policy: Path) -> Path:
    """The draft model's folder, refused (a ModelError naming FIELD) unless it speaks the policy's
    tokenizer: the same vocabulary size and, where both folders have one, the same tokenizer.json."""
    folder = model_dir(draft, field=FIELD)
    try:
        mine = read_config(folder)
    except ModelError as exc:
        raise ModelError(f"{FIELD}: {exc}") from None
    theirs = read_config(policy)
    if mine.vocab_size != theirs.vocab_size:
        raise ModelError(f"{FIELD}: {draft} has a vocabulary of {mine.vocab_size} tokens, the policy "
                         f"({policy}) {theirs.vocab_size}: a draft model must use the policy's tokenizer")
    vocabularies = [_vocabulary(folder), _vocabulary(policy)]
    if None not in vocabularies and vocabularies[0] != vocabularies[1]:
        raise ModelError(f"{FIELD}: {draft}'s tokenizer.json is not the policy's ({policy}): a draft model must "
                         "use the policy's tokenizer")
    return folder


def _vocabulary(folder: Path) -> object:
    """The token vocabulary of a folder's tokenizer.json (None without one)."""
    path = folder / "tokenizer.json"
    data = read_json(path) if path.is_file() else None
    return data.get("model", data) if isinstance(data, dict) else data


def load_draft_model(draft: str, policy: Path, dtype: torch.dtype = torch.float32,
                     device: str | torch.device = "cpu") -> TinyLlama:
    """The draft model of `draft` (a folder or builtin name), checked against the policy's folder."""
    return load_model(draft_folder(draft, policy), dtype, device).eval()


class DraftModelDrafts:
    """Drafts of k greedy tokens per running sequence from a small model (see the module docstring).
    Without a controller it drafts at each sequence's own window (for a source that combines others);
    `pricing` is then the controller whose profile its steps are measured against (`draft_seconds`)."""

    def __init__(self, spec: SpeculationSpec, model: TinyLlama, control: DraftCapController | None,
                 pricing: DraftCapController | None = None) -> None:
        self.spec = spec
        self.model = model.eval()
        self.control = control
        self.pricing = control or pricing
        self.windows = AimdWindows(spec.window)
        self.context: dict[int, list[int]] = {}  # slot -> prompt + emitted tokens
        self.cached: dict[int, int] = {}         # slot -> tokens of its context in the draft's cache
        self.fed: dict[int, int] = {}            # slot -> draft tokens of the last drafting cached after them
        self.cache: KVCache | None = None
        self.step_cost: float | None = None
        """Seconds of one draft step over the profile's plain pass at the same batch (a moving average)."""
        self._unpaid = 0  # passes since the last probe while drafting is priced off
        self._probe_gap = PROBE_EVERY
        self._off_at = 0  # the batch size drafting was last priced off at (priced afresh at half or double)
        self._priced_with: tuple[CostProfile, float, CostProfile] | None = None  # (profile, step cost, with steps)
        param = next(model.parameters())
        self.dtype, self.device = param.dtype, param.device

    # ------------------------------------------------------------------ DraftSource
    def begin(self, slot: int, request: GenRequest) -> None:
        if slot >= self.windows.windows.size:
            self.windows.resize(slot + 1)
        self.windows.reset(slot)
        self.context[slot] = list(request.prompt_ids)
        self.cached[slot] = self.fed[slot] = 0

    def propose(self, slots: list[int], batch_size: int) -> list[list[int]]:
        if self.control is not None and self.control.parked(batch_size):
            return [[] for _ in slots]
        room = self.model.cfg.max_position_embeddings
        lengths = [max(0, min(int(self.windows.windows[s]), room - len(self.context[s]))) for s in slots]
        if self.control is None:
            cap = max(lengths, default=0)
        else:
            offer = self._priced(batch_size, lengths)
            cap = self.control.cap(batch_size, offer, priced_off=any(lengths) and not any(offer))
        if cap == 0:
            return [[] for _ in slots]
        return self._draft(slots, [min(n, cap) for n in lengths])

    def _priced(self, batch_size: int, lengths: list[int]) -> list[int]:
        """The drafts on offer cut to the cap that pays with the draft's own steps priced (module
        docstring); nothing while that cap is 0, except on a probe."""
        assert self.control is not None
        profile, step = self.control.profile, self.step_cost
        if profile is None or step is None:  # nothing to price with yet: the controller decides alone
            return lengths
        if self._unpaid and self._unpaid < self._probe_gap and self._off_at / 2 < batch_size < 2 * self._off_at:
            self._unpaid += 1  # priced off: nothing that prices drafting moved (no drafts were verified)
            return [0] * len(lengths)
        if self._priced_with is None or self._priced_with[0] is not profile or self._priced_with[1] != step:
            steps = [step * profile.cost(b, 1) for b in profile.batch_sizes]
            self._priced_with = (profile, step, CostProfile(
                profile.batch_sizes, profile.tokens,
                tuple(tuple(t + (n - 1) * s for t, n in zip(row, profile.tokens, strict=True))
                      for row, s in zip(profile.seconds, steps, strict=True)),
                None if profile.verify_one is None else tuple(v + s for v, s in zip(profile.verify_one, steps,
                                                                                   strict=True))))
        # the controller's calibration of speculative passes holds drafting already: both sides pay
        # the plain passes' overhead here, and the draft steps are priced explicitly
        plain = self.control.calibration.plain
        cap = choose_cap(self._priced_with[2], batch_size, self.control.tracker, lengths,
                         limit=self.spec.window.max, calibration=CostCalibration(spec=plain, plain=plain))
        if cap > 0:
            self._unpaid, self._probe_gap = 0, PROBE_EVERY
            return [min(n, cap) for n in lengths]
        self._unpaid += 1
        self._off_at = batch_size
        if self._unpaid < self._probe_gap:
            return [0] * len(lengths)
        self._unpaid, self._probe_gap = 0, min(2 * self._probe_gap, MAX_PROBE_GAP)
        return lengths

    def settle(self, slots: list[int], drafted: list[int], accepted: list[int], emitted: list[list[int]]) -> None:
        if self.control is not None:
            self.control.observe(drafted, accepted)
        self.windows.update(drafted, accepted, rows=slots)
        for s, a, toks in zip(slots, accepted, emitted, strict=True):
            context = self.context[s]
            if self.cached[s] == len(context):  # drafted this pass: accepted draft tokens stay cached
                # but never the last emitted token: the next drafting starts from its logits (in the
                # engine it is the pass's own token; a freed drafter hears tokens its stream predicted)
                self.cached[s] += min(a, self.fed[s], len(toks) - 1)
            self.fed[s] = 0
            context += toks

    def end(self, slot: int) -> None:
        for state in (self.context, self.cached, self.fed):
            state.pop(slot, None)

    def source_of(self, slot: int) -> str:
        return "draft-model"

    def move(self, src: list[int], dst: list[int]) -> None:
        if self.cache is not None:
            moved = [(s, d) for s, d in zip(src, dst, strict=True) if s < self.cache.slots]
            if moved:
                self.cache.move(torch.tensor([s for s, _ in moved], device=self.device),
                                torch.tensor([d for _, d in moved], device=self.device),
                                max(self.cached.get(s, 0) for s, _ in moved))
        pairs = [(s, d) for s, d in zip(src, dst, strict=True) if s in self.context]
        self.context = {d: self.context[s] for s, d in pairs}
        self.cached = {d: self.cached[s] for s, d in pairs}
        self.fed = {d: self.fed[s] for s, d in pairs}
        self.windows.windows[dst] = self.windows.windows[src]

    # ------------------------------------------------------------------ drafting
    @torch.inference_mode()
    def _draft(self, slots: list[int], ks: list[int]) -> list[list[int]]:
        """k greedy tokens per slot (ks[i] for slots[i]; 0: none), all slots stepped together."""
        live = [(s, k) for s, k in zip(slots, ks, strict=True) if k > 0]
        out: dict[int, list[int]] = {s: [] for s, _ in live}
        if not live:
            return [[] for _ in slots]
        t0 = time.perf_counter()
        rows = max(s for s, _ in live) + 1
        self._reserve(rows, max(len(self.context[s]) + k for s, k in live))
        assert self.cache is not None
        # first step: each slot's uncached context (at least the token the engine sampled last)
        feed = {s: self.context[s][self.cached[s]:] for s, _ in live}
        start = [self.cached.get(r, 0) for r in range(rows)]
        counts = [len(feed.get(r, ())) for r in range(rows)]
        width = max(counts)
        tokens = torch.zeros(rows, width, dtype=torch.int64)
        for s, toks in feed.items():
            tokens[s, : len(toks)] = torch.tensor(toks)
        logits = self._forward(tokens, start, counts)
        last = torch.tensor([max(c - 1, 0) for c in counts], device=self.device)
        guess = logits[torch.arange(rows, device=self.device), last].argmax(-1).tolist()
        for s, _ in live:
            self.cached[s] = len(self.context[s])
            out[s].append(guess[s])
        # then one token per step for the slots whose draft is still short of its k
        for step in range(1, max(k for _, k in live)):
            going = {s for s, k in live if k > step}
            counts = [1 if r in going else 0 for r in range(rows)]
            start = [len(self.context[r]) + step - 1 if r in going else 0 for r in range(rows)]
            tokens = torch.tensor([[out[r][-1] if r in going else 0] for r in range(rows)], dtype=torch.int64)
            guess = self._forward(tokens, start, counts)[:, 0].argmax(-1).tolist()
            for s in going:
                out[s].append(guess[s])
        for s, k in live:
            self.fed[s] = k - 1  # the last draft token was never fed
        profile = None if self.pricing is None else self.pricing.profile
        if profile is not None:
            seen = (time.perf_counter() - t0) / max(k for _, k in live) / profile.cost(len(live), 1)
            self.step_cost = seen if self.step_cost is None else 0.8 * self.step_cost + 0.2 * seen
        return [out.get(s, []) for s in slots]

    def probe(self, slots: list[int], batch_size: int) -> list[list[int]]:
        """Drafts of at most window.initial tokens (a probe of Fastest-of-N: a few steps, whatever the
        windows grew to)."""
        room = self.model.cfg.max_position_embeddings
        return self._draft(slots, [max(0, min(int(self.windows.windows[s]), self.spec.window.initial,
                                              room - len(self.context[s]))) for s in slots])

    def draft_seconds(self, slots: list[int]) -> float | None:
        """What drafting for `slots` would cost now: a step per token of the longest window among them,
        each at the measured share (`step_cost`) of the pricing profile's plain pass at their batch;
        None until a drafting was measured."""
        profile = None if self.pricing is None else self.pricing.profile
        if profile is None or self.step_cost is None or not slots:
            return None
        steps = max(int(self.windows.windows[s]) for s in slots)
        return steps * self.step_cost * profile.cost(len(slots), 1)

    def _forward(self, tokens: torch.Tensor, start: list[int], counts: list[int]) -> torch.Tensor:
        assert self.cache is not None
        return self.model.forward_cached(tokens.to(self.device), torch.tensor(start, device=self.device),
                                         self.cache, torch.tensor(counts, device=self.device))

    def _reserve(self, rows: int, length: int) -> None:
        """A cache of at least `rows` slots and `length` positions, keeping what it holds."""
        old = self.cache
        if old is not None and rows <= old.slots and length <= old.max_len:
            return
        cfg = self.model.cfg
        if old is None:
            length *= 2  # room to grow: few copies per rollout
        elif length > old.max_len:
            length = max(length, 2 * old.max_len)
        else:
            length = old.max_len
        new = KVCache(cfg, max(rows, old.slots if old else 0), min(length, cfg.max_position_embeddings),
                      self.dtype, self.device)
        if old is not None:
            n, keep = old.slots, old.max_len
            if new.native:
                new.k[:, :n, :, :, :keep] = old.k
            else:
                new.k[:, :n, :, :keep] = old.k
            new.v[:, :n, :, :keep] = old.v
        self.cache = new

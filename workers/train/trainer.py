"""The policy update: GRPO/DAPO clipped policy gradient on a batch of scored responses.

Responses are packed into length-sorted micro-batches under a token budget (memory and padding),
and every mini-batch's loss normaliser is fixed before it is split (see objectives.aggregate), so
the gradient does not depend on the micro-batch size.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor

from rhymerl.algorithms import objectives as obj
from rhymerl.api.spec import AlgorithmSpec
from rhymerl.workers.model.policy import PolicyModel
from rhymerl.workers.train import guards


@dataclass(frozen=True)
class TrainSample:
    prompt_ids: list[int]
    response_ids: list[int]
    advantage: float
    label: str = ""  # names the sample in errors, e.g. "prompt ac-0-00003 sample 5"


@dataclass
class _Packed:
    tokens: Tensor      # [b, L] prompt + response, right-padded
    gather: Tensor      # [b, T] index of the logit that predicts each response token
    targets: Tensor     # [b, T] response tokens
    mask: Tensor        # [b, T]
    advantages: Tensor  # [b]
    rows: list[int]     # indices into the caller's sample list


def pack(samples: list[TrainSample], rows: list[int], pad_id: int = 0) -> _Packed:
    width = max(len(samples[i].prompt_ids) + len(samples[i].response_ids) for i in rows)
    resp = max(len(samples[i].response_ids) for i in rows)
    tokens = torch.full((len(rows), width), pad_id, dtype=torch.int64)
    gather = torch.zeros((len(rows), resp), dtype=torch.int64)
    targets = torch.zeros((len(rows), resp), dtype=torch.int64)
    mask = torch.zeros((len(rows), resp), dtype=torch.float32)
    for r, i in enumerate(rows):
        s = samples[i]
        p, n = len(s.prompt_ids), len(s.response_ids)
        tokens[r, : p + n] = torch.tensor(s.prompt_ids + s.response_ids)
        gather[r, :n] = torch.arange(p - 1, p - 1 + n)
        targets[r, :n] = torch.tensor(s.response_ids)
        mask[r, :n] = 1.0
    adv = torch.tensor([samples[i].advantage for i in rows], dtype=torch.float32)
    return _Packed(tokens, gather, targets, mask, adv, rows)


def micro_batches(samples: list[TrainSample], rows: list[int], token_budget: int) -> list[list[int]]:
    """Split rows into length-sorted groups whose padded size stays under `token_budget`."""
    order = sorted(rows, key=lambda i: len(samples[i].prompt_ids) + len(samples[i].response_ids))
    out: list[list[int]] = []
    cur: list[int] = []
    for i in order:
        length = len(samples[i].prompt_ids) + len(samples[i].response_ids)
        if cur and (len(cur) + 1) * length > token_budget:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out


class Trainer:
    def __init__(self, model: PolicyModel, algo: AlgorithmSpec, temperature: float,
                 micro_batch_tokens: int = 16384) -> None:
        self.model = model
        self.algo = algo
        self.temperature = temperature if temperature > 0 else 1.0
        self.micro_batch_tokens = micro_batch_tokens
        self.ref = copy.deepcopy(model).eval().requires_grad_(False) if algo.kl_coef > 0 else None
        self.skipped_samples: list[str] = []  # of the last step, by label
        self.skipped_updates = 0
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=algo.lr, weight_decay=algo.weight_decay,
                                           betas=(0.9, 0.999))

    def _score(self, model: PolicyModel, batch: _Packed) -> tuple[Tensor, Tensor]:
        logits = model(batch.tokens) / self.temperature
        picked = logits.gather(1, batch.gather.unsqueeze(-1).expand(-1, -1, logits.shape[-1]))
        return obj.token_logprobs_and_entropy(picked, batch.targets)

    @torch.no_grad()
    def _logprobs(self, model: PolicyModel, samples: list[TrainSample], rows: list[int]) -> dict[int, Tensor]:
        out: dict[int, Tensor] = {}
        for mb in micro_batches(samples, rows, self.micro_batch_tokens):
            batch = pack(samples, mb)
            logp, _ = self._score(model, batch)
            for r, i in enumerate(mb):
                out[i] = logp[r, : len(samples[i].response_ids)]
        return out

    def step(self, samples: list[TrainSample]) -> dict[str, float]:
        """One training step (ppo_epochs x mini-batches of optimiser updates) on a rollout batch."""
        algo = self.algo
        assert algo.clip_ratio_high is not None and algo.loss_agg_mode is not None
        self.skipped_samples, self.skipped_updates = [], 0
        samples = self._finite_advantages(samples)
        if not samples:
            return {"skipped_samples": float(len(self.skipped_samples)), "skipped_updates": 0.0}
        self.model.train()
        everyone = list(range(len(samples)))
        mb_size = algo.mini_batch_size or len(samples)
        single_update = algo.ppo_epochs == 1 and mb_size >= len(samples)
        # With one update per batch the old policy is the current one: ratio == 1 exactly, no extra pass.
        old = None if single_update else self._logprobs(self.model, samples, everyone)
        ref = self._logprobs(self.ref, samples, everyone) if self.ref is not None else None
        sums = {"loss": 0.0, "pg_clipfrac": 0.0, "kl": 0.0, "entropy": 0.0, "grad_norm": 0.0, "tokens": 0.0}
        updates = 0
        gen = torch.Generator().manual_seed(len(samples))
        for _ in range(algo.ppo_epochs):
            perm = torch.randperm(len(samples), generator=gen).tolist() if not single_update else everyone
            for lo in range(0, len(samples), mb_size):
                rows = perm[lo: lo + mb_size]
                total_mask = torch.tensor([len(samples[i].response_ids) for i in rows], dtype=torch.float32)
                den = obj.Denominators(algo.loss_agg_mode, float(total_mask.sum()), float(len(rows)),
                                       algo.max_response_length)
                self.optimizer.zero_grad(set_to_none=True)
                contributed = False
                for mb in micro_batches(samples, rows, self.micro_batch_tokens):
                    while mb:
                        mb, stats = self._backward(samples, mb, old, ref, den)
                        if stats is not None:
                            for key, value in stats.items():
                                sums[key] += value
                            contributed = True
                            break
                if not contributed:  # every sample of the mini-batch was skipped
                    self.skipped_updates += 1
                    continue
                norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), algo.max_grad_norm))
                if not guards.finite(norm):
                    if algo.on_nonfinite == "fail":
                        raise guards.NonFiniteError(
                            f"gradient norm is {norm} in update {updates + self.skipped_updates + 1} of the step "
                            f"(finite losses, so no single sample is to blame; lower algorithm.lr or check the "
                            f"rewards); this update was not applied; {guards.SKIP_HINT}")
                    self.skipped_updates += 1
                    self.optimizer.zero_grad(set_to_none=True)
                    continue
                self.optimizer.step()
                sums["grad_norm"] += norm
                updates += 1
        self.model.eval()
        tokens_seen = max(sums["tokens"], 1.0)
        out = {
            "loss": sums["loss"] / max(updates, 1),
            "grad_norm": sums["grad_norm"] / max(updates, 1),
            "pg_clipfrac": sums["pg_clipfrac"] / tokens_seen,
            "entropy": sums["entropy"] / tokens_seen,
            "kl": sums["kl"] / tokens_seen,
        }
        if self.skipped_samples or self.skipped_updates:
            out |= {"skipped_samples": float(len(self.skipped_samples)), "skipped_updates": float(self.skipped_updates)}
        return out

    def _finite_advantages(self, samples: list[TrainSample]) -> list[TrainSample]:
        """The batch without samples whose advantage is nan or inf (`skip`), or an error (`fail`).
        Checked before the step, so a skipped sample is out of every loss normaliser too."""
        bad = [s for s in samples if not guards.finite(s.advantage)]
        if bad and self.algo.on_nonfinite == "fail":
            raise guards.NonFiniteError(f"{bad[0].label or 'a sample'}: advantage {bad[0].advantage}; no weight was "
                                        f"changed; {guards.SKIP_HINT}")
        self.skipped_samples += [s.label for s in bad]
        return [s for s in samples if guards.finite(s.advantage)] if bad else samples

    def _backward(self, samples: list[TrainSample], mb: list[int], old: dict[int, Tensor] | None,
                  ref: dict[int, Tensor] | None, den: obj.Denominators) -> tuple[list[int], dict[str, float] | None]:
        """Accumulate one micro-batch's gradient, unless a row's loss is not finite: then `fail`
        raises naming the sample, and `skip` returns the micro-batch without those rows (to be
        scored again: a nan row's backward would leak nan into every weight's gradient even
        if masked out)."""
        algo = self.algo
        assert algo.clip_ratio_high is not None
        batch = pack(samples, mb)
        logp, entropy = self._score(self.model, batch)
        old_logp = logp.detach() if old is None else _stack(old, mb, batch.mask)
        pg, clipped = obj.clipped_policy_loss(logp, old_logp, batch.advantages, algo.clip_ratio_low,
                                              algo.clip_ratio_high)
        per_token = pg - algo.entropy_coef * entropy
        kl = None
        if ref is not None:
            kl = obj.kl_k3(logp, _stack(ref, mb, batch.mask))
            per_token = per_token + algo.kl_coef * kl
        bad = guards.bad_rows(per_token, batch.mask)
        if bad:
            sample = samples[mb[bad[0]]]
            value = guards.first_bad_value(per_token, batch.mask, bad[0])
            if algo.on_nonfinite == "fail":
                raise guards.NonFiniteError(f"{sample.label or 'a sample'}: its loss is {value} (advantage "
                                            f"{sample.advantage}); this update was not applied; {guards.SKIP_HINT}")
            self.skipped_samples += [samples[mb[r]].label for r in bad]
            return [i for r, i in enumerate(mb) if r not in set(bad)], None
        loss = obj.aggregate(per_token, batch.mask, den)
        loss.backward()
        stats = {"loss": float(loss.detach()), "pg_clipfrac": float((clipped * batch.mask).sum()),
                 "entropy": float((entropy.detach() * batch.mask).sum()), "tokens": float(batch.mask.sum())}
        if kl is not None:
            stats["kl"] = float((kl.detach() * batch.mask).sum())
        return mb, stats


def _stack(values: dict[int, Tensor], rows: list[int], mask: Tensor) -> Tensor:
    out = torch.zeros_like(mask)
    for r, i in enumerate(rows):
        out[r, : values[i].numel()] = values[i]
    return out

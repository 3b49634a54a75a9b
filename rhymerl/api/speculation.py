"""Speculative decoding in rollout: which drafts a sequence gets (history, n-gram, a draft model) and
how long they run. Its defaults are measured choices (benchmarks/), not bounds."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rhymerl.api.blocks import MAX_BATCH, MAX_PATH, NonNegInt, PositiveInt, Strict

# Upper bounds (as in rhymerl.api.blocks), then the drafting defaults that are measured choices.
MAX_RECENT_TOKENS = 1 << 26  # a recent-responses index of 64Mi tokens is ~1.5 GB shipped with every rollout call
MAX_HISTORY_EPOCHS = 64
HISTORY_EPOCHS = 2  # benchmarks/history-epochs: 2 lifts epochs 3-5 of the quickstart past 4 tokens per pass
RECENT_TOKENS = 1 << 18  # ~6 MB of index: the quickstart's last 16 steps, a real job's last few dozen responses
EMBEDDED_DRAFTS = {"builtin:tiny-arith": "builtin:tiny-arith-draft"}
"""The draft model distilled from each embedded policy (`rhymerl pretrain --draft`): a job's draft_model
where it needs one and names none."""


class DraftWindowSpec(Strict):
    initial: PositiveInt = Field(2, le=1024, description="AIMD draft window at the start and after a rejection "
                                 "(at most 1024)")
    step: PositiveInt = Field(2, le=1024, description="additive increase after a fully accepted draft (at most 1024)")
    max: PositiveInt = Field(32, le=1024, description="cap of the draft window (at most 1024 tokens verified per pass)")

    @model_validator(mode="after")
    def _ordered(self) -> DraftWindowSpec:
        if self.initial > self.max:
            raise ValueError("initial: larger than max")
        return self


class DraftPrefixSpec(Strict):
    """How much of a sequence's context is matched against its history (RhymeRL §5.3 uses 7 -> 3).

    The defaults match longer and fall back further than the paper; `min_prob` keeps the short
    matches from drafting guesses. Measured on the quickstart's rollout (benchmarks/acceptance,
    benchmarks/rollout): more tokens per pass at a higher acceptance rate than 7 -> 3.
    """

    max: PositiveInt = Field(32, le=1024, description="longest context suffix matched against the history index "
                             "(at most 1024)")
    min: PositiveInt = Field(1, le=1024, description="shortest suffix tried before giving up on a draft (at most "
                             "1024)")

    @model_validator(mode="after")
    def _ordered(self) -> DraftPrefixSpec:
        if self.min > self.max:
            raise ValueError("min: larger than max")
        return self


class SpeculationSpec(Strict):
    method: Literal["none", "history", "ngram", "draft-model", "fastest-of-n"] = Field(
        "history", description="history: HistoSpec (the prompt's responses of its last history_epochs epochs, the "
        "run's recent responses for a prompt without any, and the group's own with group_drafts); "
        "ngram: each sequence's own context; draft-model: a small model (draft_model); fastest-of-n: every source "
        "there is (history with the group, n-gram, the draft model where draft_model is set, on either engine) "
        "drafts and each response takes the drafts of the one its own tokens confirmed most"
    )
    reward_weighted: bool = Field(
        False, description="history: rank branches by the summed reward of the responses through them (RhymeRL), "
        "not by their number; measured no better on the quickstart's rollouts (benchmarks/reward-weighting)"
    )
    window: DraftWindowSpec = Field(default_factory=DraftWindowSpec)
    prefix: DraftPrefixSpec = Field(default_factory=DraftPrefixSpec)
    min_prob: float = Field(
        0.5, ge=0.0, le=1.0,
        description="history: end a draft before the token whose path probability under the branch priorities "
                    "drops below this (0: follow the best branch to the window, as the paper does)",
    )
    group_drafts: bool = Field(
        True, description="history: also draft from the responses of the same prompt's group generated so far in "
        "the current step (on each rollout worker, a sample moved there included), in every epoch, the first "
        "included; each sequence drafts from whichever of history and group matches the longer suffix"
    )
    group_relay: bool = Field(
        True, description="group_drafts on several rollout workers (torch engine): each worker's new tokens are "
        "relayed to the workers running the same groups, so every worker drafts from the whole group as it grows, "
        "not only from the siblings it runs itself; it costs a message per worker every 4 passes and the indexing "
        "of the siblings' tokens (benchmarks/group-drafts/relay)"
    )
    history_epochs: PositiveInt = Field(
        HISTORY_EPOCHS, le=MAX_HISTORY_EPOCHS,
        description="history: a prompt drafts from its responses of its last this many epochs, in one index (1: the "
        "previous epoch only, as RhymeRL); each one adds the size of an epoch's index to what is shipped "
        "(benchmarks/history-epochs)"
    )
    recent_tokens: NonNegInt = Field(
        RECENT_TOKENS, le=MAX_RECENT_TOKENS,
        description="history: a prompt without responses of its own in the history (every prompt in epoch 1) drafts "
        "from the run's newest responses to any prompt, this many tokens of them at most (like suffix decoding's "
        "global tree; about 24 bytes of index per token, shipped with each rollout call); 0: only from its group "
        "(benchmarks/group-drafts/recent)"
    )
    disable_above_batch: PositiveInt | None = Field(
        None, le=MAX_BATCH, description="switch speculation off above this many running sequences; default: "
        "profiled cost model"
    )
    draft_model: str | None = Field(
        None, max_length=MAX_PATH, description="draft-model, freed_drafters (and, where set, fastest-of-n): path of "
        "the draft model; for the embedded policy (model.path builtin:tiny-arith) its distilled draft, "
        "builtin:tiny-arith-draft, where none is named"
    )
    freed_drafters: bool = Field(
        False, description="in a round's tail, rollout workers left with nothing to run draft with the draft model "
        "(draft_model) for the workers still running the stragglers, which verify per sequence those drafts or their "
        "own method's, whichever its tokens confirmed more; the controller pairs them where its cost model prices the "
        "drafted passes faster (SPECATOR's drafters on freed GPUs); with engine vllm: method history or fastest-of-n "
        "(rhymerl's proposer verifies them inside vLLM)"
    )
    consolidate_tail: bool = Field(
        True, description="with freed_drafters, torch engine: a straggling worker no freed one is left to draft for is "
        "emptied onto another straggling worker (its samples move with their tokens, their KV cache recomputed there) and drafts "
        "for it, where the cost model predicts the two finish sooner that way (benchmarks/freed-drafters: 1.07-1.09x "
        "rollout in the simulator, against 1.03-1.04x without)"
    )

    @property
    def reads_history(self) -> bool:
        """Whether the method drafts from last epoch's responses (history, fastest-of-n)."""
        return self.method in ("history", "fastest-of-n")

    @classmethod
    def paper_rule(cls, **fields: Any) -> SpeculationSpec:
        """RhymeRL's drafting rule as published (§5.3): match the last 7 context tokens, fall back to 3,
        follow the best branch to the window (no `min_prob` cut-off); `fields` set the rest."""
        return cls(prefix=DraftPrefixSpec(max=7, min=3), min_prob=0.0, **fields)

    @property
    def draft_model_use(self) -> str | None:
        """Why this block needs a draft model (None: it does not; fastest-of-n uses one only if named)."""
        if self.method == "draft-model":
            return "method is draft-model"
        if self.freed_drafters:
            return "freed_drafters is true (what the freed workers draft with)"
        return None

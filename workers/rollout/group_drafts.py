"""The group indexes of one rollout call (Seer's grouped speculation, `speculation.group_drafts`).

Per prompt, the current step's responses of its group: those this worker generates (bound to
their sequences in the drafter, rollout/speculators.py) and those its siblings generate on other
rollout workers. A GRPO group is spread over the fleet (a shared queue is dealt one sample at a
time), so with W workers each holds about 1/W of it: a call's reports carry its samples' new
tokens as one block (`GrownTokens`), the step loop forwards each block whole to the calls running
any of its groups elsewhere (controller/fleet.py; no work per token there), and here each sibling
of the call's own prompts joins its group through a feed of its own, O(depth) per token.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from rhymerl.algorithms.drafting.index import GroupFeed, GroupIndex
from rhymerl.api.speculation import SpeculationSpec


@dataclass(frozen=True)
class GrownTokens:
    """Tokens a call's samples generated since it last shared them, in one block: sample i
    (`sample_ids[i]`, the request's stable key, of prompt `prompt_ids[i]`) has
    tokens[offsets[i]:offsets[i + 1]], its response's tokens from position `starts[i]` on."""

    groups: frozenset[tuple[int, str]]
    """The (epoch, prompt) groups of the block's samples."""
    sample_ids: NDArray[np.int64]
    prompt_ids: tuple[str, ...]
    starts: NDArray[np.int64]
    offsets: NDArray[np.int64]
    tokens: NDArray[np.int32]

    @classmethod
    def of(cls, grown: Iterable[tuple[int, int, str, int, Sequence[int]]]) -> GrownTokens | None:
        """From (epoch, sample id, prompt id, start, tokens) per sample; None if there are none."""
        rows = list(grown)
        if not rows:
            return None
        lengths = np.fromiter((len(r[4]) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.zeros(len(rows) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        return cls(frozenset((r[0], r[2]) for r in rows),
                   np.fromiter((r[1] for r in rows), dtype=np.int64, count=len(rows)),
                   tuple(r[2] for r in rows),
                   np.fromiter((r[3] for r in rows), dtype=np.int64, count=len(rows)),
                   offsets, np.fromiter((t for r in rows for t in r[4]), dtype=np.int32, count=int(offsets[-1])))


class GroupDrafts:
    """The group indexes a call's history drafter binds its sequences to, and the siblings heard
    from other workers for the call's prompts (`prompts`, grown as samples join the call)."""

    def __init__(self, spec: SpeculationSpec, prompts: Iterable[str] = ()) -> None:
        self.spec = spec
        self.prompts = set(prompts)
        self.indexes: dict[str, GroupIndex] = {}
        self._feeds: dict[int, GroupFeed] = {}
        self._heard_to: dict[int, int] = {}  # per sibling: the position its feed has reached
        self.heard = 0
        """Tokens heard from siblings elsewhere and indexed."""
        self.gaps = 0
        """Times a sibling's tokens arrived past a gap (a report lost with its worker, a sample
        moved between reports): the rest is indexed as a response of its own."""

    def index(self, prompt_id: str) -> GroupIndex:
        group = self.indexes.get(prompt_id)
        if group is None:
            group = self.indexes[prompt_id] = GroupIndex.for_spec(self.spec)
        return group

    def hear(self, blocks: Sequence[GrownTokens]) -> None:
        """Siblings' new tokens: each of the call's prompts' siblings appended after what was heard
        of it; tokens heard already are skipped (a report repeated after a move)."""
        for b in blocks:
            for i, prompt_id in enumerate(b.prompt_ids):
                if prompt_id not in self.prompts:
                    continue
                sid, start = int(b.sample_ids[i]), int(b.starts[i])
                tokens = b.tokens[b.offsets[i]: b.offsets[i + 1]]
                at = self._heard_to.get(sid)
                feed = self._feeds.get(sid)
                if feed is None or at is None or start > at:
                    self.gaps += feed is not None
                    feed = self._feeds[sid] = self.index(prompt_id).follow()
                    at = start
                new = tokens[at - start:]
                if new.size:
                    feed.append(new)
                    self.heard += int(new.size)
                self._heard_to[sid] = max(at, start + int(tokens.size))

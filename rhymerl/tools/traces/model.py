"""The in-memory trace: columns as arrays, rows sorted by step, steps numbered 1..S.

Whether prompt ids can serve as history matters to every history-aware policy, so the trace
says which kind of ids it has: `stable` (a prompt id recurs across steps: epochs can be
matched), `step-local` (ids only group a step's responses into GRPO groups), or `none` (no
prompt_id column: every row is its own prompt).

A multi-turn agent's response is several turns, each decoded and then (all but the last) handed
to a tool whose call takes seconds: `Turns` holds them per row. A trace without them is
single-turn: every response decoded in one piece.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, SupportsIndex, overload

import numpy as np
from numpy.typing import NDArray

IdKind = Literal["stable", "step-local", "none"]

ID_NOTES: dict[IdKind, str] = {
    "stable": "prompt ids recur across steps: history-aware policies rank by last epoch's lengths",
    "step-local": "prompt ids never recur across steps: no history, so histopipe and skew-aware fall back "
    "(histopipe ranks by the first_epoch policy, skew-aware splits equally); their numbers show that fallback",
    "none": "no prompt_id column: every response is its own prompt, no history and no GRPO groups; histopipe "
    "and skew-aware fall back (histopipe ranks by the first_epoch policy, skew-aware splits equally)",
}


class PromptIds(Sequence[str]):
    """A trace's prompt id per row, stored compactly: a code per row into a table of distinct ids, so
    a million rows of a few thousand prompts hold eight bytes a row. Without a table (`names` None) row
    `i` is its own prompt, named `row<code>`."""

    def __init__(self, codes: NDArray[np.int64], names: Sequence[str] | None) -> None:
        self.codes = codes
        self.names = names

    @staticmethod
    def of(ids: Sequence[str]) -> PromptIds:
        table: dict[str, int] = {}
        codes = np.fromiter((table.setdefault(pid, len(table)) for pid in ids), dtype=np.int64, count=len(ids))
        return PromptIds(codes, list(table))

    def __len__(self) -> int:
        return len(self.codes)

    @overload
    def __getitem__(self, index: SupportsIndex) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> PromptIds: ...

    def __getitem__(self, index: SupportsIndex | slice) -> str | PromptIds:
        if isinstance(index, slice):
            return PromptIds(self.codes[index], self.names)
        return self._name(int(self.codes[index]))

    def __iter__(self) -> Iterator[str]:
        for code in self.codes.tolist():
            yield self._name(code)

    def _name(self, code: int) -> str:
        return self.names[code] if self.names is not None else f"row{code}"

    def recur(self, step: NDArray[np.int64]) -> NDArray[np.bool_]:
        """Per row (rows in step order): its id already appeared in an earlier step."""
        if not len(self.codes):
            return np.zeros(0, dtype=np.bool_)
        first = np.full(int(self.codes.max()) + 1, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(first, self.codes, step)
        return np.asarray(first[self.codes] != step)


@dataclass(frozen=True)
class Turns:
    """Per row, its turns: generated tokens of each turn and the seconds of the tool call after it
    (the last turn's is 0: the response ends there). Row `i`'s turns are `offsets[i]:offsets[i+1]`
    of the flat arrays; a single-turn row has one turn of all its tokens."""

    offsets: NDArray[np.int64]
    tokens: NDArray[np.int64]
    tool_s: NDArray[np.float64]

    @staticmethod
    def of(rows: Sequence[Sequence[tuple[int, float]]]) -> Turns:
        """From (tokens, tool seconds) lists per row; the last turn's seconds are dropped (set 0)."""
        sizes = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        tokens = np.fromiter((t for r in rows for t, _ in r), dtype=np.int64, count=int(offsets[-1]))
        tool = np.fromiter((s for r in rows for _, s in r), dtype=np.float64, count=int(offsets[-1]))
        tool[offsets[1:][sizes > 0] - 1] = 0.0
        return Turns(offsets, tokens, tool)

    def take(self, order: NDArray[np.int64]) -> Turns:
        """The rows `order` (a permutation or a subset), in that order."""
        sizes = (self.offsets[1:] - self.offsets[:-1])[order]
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        flat = np.repeat(self.offsets[:-1][order] - offsets[:-1], sizes) + np.arange(int(offsets[-1]))
        return Turns(offsets, self.tokens[flat], self.tool_s[flat])

    def of_row(self, i: int) -> tuple[list[int], list[float]]:
        lo, hi = int(self.offsets[i]), int(self.offsets[i + 1])
        return self.tokens[lo:hi].tolist(), self.tool_s[lo:hi].tolist()

    def count(self) -> NDArray[np.int64]:
        """Turns per row."""
        return np.asarray(self.offsets[1:] - self.offsets[:-1])

    def totals(self) -> NDArray[np.int64]:
        """Generated tokens per row (all its turns)."""
        sums = np.concatenate([[0], np.cumsum(self.tokens)]).astype(np.int64)
        return np.asarray(sums[self.offsets[1:]] - sums[self.offsets[:-1]])

    def tool_seconds(self) -> NDArray[np.float64]:
        """Tool seconds per row (all its calls)."""
        sums = np.concatenate([[0.0], np.cumsum(self.tool_s)])
        return np.asarray(sums[self.offsets[1:]] - sums[self.offsets[:-1]])


@dataclass(frozen=True)
class Trace:
    name: str
    step: NDArray[np.int64]
    """Ordinal step, 1..S, in the order of the source's step numbers."""
    prompt_id: PromptIds
    input_len: NDArray[np.int64]
    output_len: NDArray[np.int64]
    ids: IdKind
    source_steps: list[int] = field(default_factory=list)
    """The source's step number for each ordinal step (index 0 is step 1)."""
    notes: list[str] = field(default_factory=list)
    turns: Turns | None = None
    """Per-row turns and tool seconds of a multi-turn trace; None: every response is one turn."""

    @staticmethod
    def build(
        name: str,
        steps: Sequence[int] | NDArray[np.int64],
        prompt_ids: Sequence[str] | PromptIds | None,
        input_len: Sequence[int] | NDArray[np.int64],
        output_len: Sequence[int] | NDArray[np.int64],
        notes: list[str] | None = None,
        turns: Turns | None = None,
    ) -> Trace:
        """Sort rows by step (stably), number steps 1..S and classify the prompt ids. Columns may be
        lists or arrays (an `array('q')` is read without a copy)."""
        raw_steps = np.asarray(steps, dtype=np.int64)
        n = len(raw_steps)
        if turns is not None and (len(turns.offsets) != n + 1 or not np.array_equal(
                turns.totals(), np.asarray(output_len, dtype=np.int64))):
            raise ValueError("turns: one list per row, its tokens summing to the row's output_len")
        order = np.argsort(raw_steps, kind="stable")
        raw = raw_steps[order]
        uniq, ordinal = np.unique(raw, return_inverse=True)
        step = (ordinal.reshape(-1) + 1).astype(np.int64) if n else np.zeros(0, dtype=np.int64)
        if prompt_ids is None:
            pids = PromptIds(order.astype(np.int64), None)
            ids: IdKind = "none"
        else:
            coded = prompt_ids if isinstance(prompt_ids, PromptIds) else PromptIds.of(prompt_ids)
            pids = PromptIds(coded.codes[order], coded.names)
            ids = "stable" if pids.recur(step).any() else "step-local"
        return Trace(
            name=name,
            step=step,
            prompt_id=pids,
            input_len=np.asarray(input_len, dtype=np.int64)[order],
            output_len=np.asarray(output_len, dtype=np.int64)[order],
            ids=ids,
            source_steps=[int(s) for s in uniq],
            notes=list(notes or []),
            turns=turns.take(order) if turns is not None else None,
        )

    @staticmethod
    def from_steps(steps: list[list[tuple[str, int]]], input_len: int = 10, name: str = "hand-made") -> Trace:
        """A trace written by hand: steps[i] lists the (prompt_id, output_len) responses of step i + 1."""
        rows = [(i, p, n) for i, step in enumerate(steps, start=1) for p, n in step]
        return Trace.build(name, [r[0] for r in rows], [r[1] for r in rows], [input_len] * len(rows),
                           [r[2] for r in rows])

    @property
    def num_steps(self) -> int:
        return len(self.source_steps)

    def __len__(self) -> int:
        return len(self.prompt_id)

    def step_rows(self) -> list[NDArray[np.int64]]:
        """Row indices of each ordinal step (index 0 is step 1)."""
        bounds = np.searchsorted(self.step, np.arange(1, self.num_steps + 2))
        return [np.arange(bounds[i], bounds[i + 1]) for i in range(self.num_steps)]

    def epoch_length(self) -> int:
        """Steps before a prompt id first recurs (one epoch), or 0 when ids never recur."""
        if self.ids != "stable":
            return 0
        recur = self.prompt_id.recur(self.step)
        return int(self.step[int(np.argmax(recur))]) - 1 if recur.any() else 0

    def id_note(self) -> str:
        return ID_NOTES[self.ids]

    def turns_note(self) -> str | None:
        """What a multi-turn trace holds, in a line; None for a single-turn one."""
        if self.turns is None:
            return None
        calls = int(np.sum(self.turns.count() - 1))
        seconds = float(self.turns.tool_seconds().sum())
        return (f"multi-turn: {np.mean(self.turns.count()):.2f} turns a response, {calls} tool calls of "
                f"{seconds / max(calls, 1):.2f} s on average; at each call a sample leaves its worker, drops its KV "
                f"cache and prefills prompt + tokens so far when it comes back")

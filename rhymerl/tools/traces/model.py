"""The in-memory trace: columns as arrays, rows sorted by step, steps numbered 1..S.

Whether prompt ids can serve as history matters to every history-aware policy, so the trace
says which kind of ids it has: `stable` (a prompt id recurs across steps: epochs can be
matched), `step-local` (ids only group a step's responses into GRPO groups), or `none` (no
prompt_id column: every row is its own prompt).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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


@dataclass(frozen=True)
class Trace:
    name: str
    step: NDArray[np.int64]
    """Ordinal step, 1..S, in the order of the source's step numbers."""
    prompt_id: list[str]
    input_len: NDArray[np.int64]
    output_len: NDArray[np.int64]
    ids: IdKind
    source_steps: list[int] = field(default_factory=list)
    """The source's step number for each ordinal step (index 0 is step 1)."""
    notes: list[str] = field(default_factory=list)

    @staticmethod
    def build(
        name: str,
        steps: list[int],
        prompt_ids: list[str] | None,
        input_len: list[int],
        output_len: list[int],
        notes: list[str] | None = None,
    ) -> Trace:
        """Sort rows by step (stably), number steps 1..S and classify the prompt ids."""
        n = len(steps)
        order = np.argsort(np.asarray(steps, dtype=np.int64), kind="stable")
        raw = np.asarray(steps, dtype=np.int64)[order]
        uniq, ordinal = np.unique(raw, return_inverse=True)
        if prompt_ids is None:
            pids = [f"row{i}" for i in order.tolist()]
            ids: IdKind = "none"
        else:
            pids = [prompt_ids[i] for i in order.tolist()]
            first_step: dict[str, int] = {}
            recur = False
            for pid, st in zip(pids, raw.tolist(), strict=True):
                seen = first_step.setdefault(pid, st)
                if seen != st:
                    recur = True
                    break
            ids = "stable" if recur else "step-local"
        return Trace(
            name=name,
            step=(ordinal + 1).astype(np.int64) if n else np.zeros(0, dtype=np.int64),
            prompt_id=pids,
            input_len=np.asarray(input_len, dtype=np.int64)[order],
            output_len=np.asarray(output_len, dtype=np.int64)[order],
            ids=ids,
            source_steps=[int(s) for s in uniq],
            notes=list(notes or []),
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
        seen: dict[str, int] = {}
        for pid, st in zip(self.prompt_id, self.step.tolist(), strict=True):
            first = seen.setdefault(pid, st)
            if first != st:
                return int(st) - 1
        return 0

    def id_note(self) -> str:
        return ID_NOTES[self.ids]

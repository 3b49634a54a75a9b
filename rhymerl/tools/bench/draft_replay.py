"""Lockstep replay of target responses through a draft source, and the vectorised verifier that
decides how much of each draft a target accepts: the benches' stand-in for an engine."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from rhymerl.api.speculation import SpeculationSpec
from rhymerl.tools.bench.draft_sources import Source
from rhymerl.tools.bench.draft_workloads import PromptWork

I32 = NDArray[np.int32]
I64 = NDArray[np.int64]




def accepted_lengths(offsets: I64, tokens: I32, targets: I32, positions: I64, target_lens: I64) -> I64:
    """Accepted prefix length of each draft: drafts[i] vs targets[i, positions[i]:] (row-major 2-D)."""
    lens = np.diff(offsets)
    if tokens.size == 0:
        return np.zeros(lens.size, dtype=np.int64)
    seg = np.repeat(np.arange(lens.size), lens)
    k = np.arange(tokens.size) - offsets[:-1][seg]
    col = positions[seg] + k
    valid = col < target_lens[seg]
    truth = targets[seg, np.minimum(col, targets.shape[1] - 1)]
    bad_k = np.where((tokens != truth) | ~valid, k, np.iinfo(np.int64).max)
    first_bad = np.full(lens.size, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_bad, seg, bad_k)
    return np.minimum(lens, first_bad)


def gather_new_tokens(targets: I32, positions: I64, counts: I64) -> tuple[I64, I32]:
    """Flat (offsets, tokens) of targets[i, positions[i] : positions[i] + counts[i]]."""
    offsets = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    seg = np.repeat(np.arange(counts.size), counts)
    k = np.arange(int(offsets[-1])) - offsets[:-1][seg]
    return offsets, targets[seg, positions[seg] + k].astype(np.int32)


def pad_rows(rows: Sequence[I32], extra: int = 0) -> tuple[I32, I64]:
    width = max((len(r) for r in rows), default=0) + extra + 1
    out = np.zeros((len(rows), width), dtype=np.int32)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return out, np.asarray([len(r) for r in rows], dtype=np.int64)



# ---------------------------------------------------------------------------------------------
# Lockstep replay: every sequence drafts, the verifier accepts the matching prefix plus the one
# token the model produces, and the sequence advances, like an engine's decode loop.


@dataclass
class ReplayStats:
    batch: int
    step_seconds: list[float] = field(default_factory=list)  # timed part of each batched step
    generated: int = 0  # target tokens covered
    accepted: int = 0  # draft tokens accepted
    drafted: int = 0  # draft tokens proposed
    verify_steps: int = 0  # sequence-steps (one forward pass per sequence and step)

    @property
    def accepted_fraction(self) -> float:
        return self.accepted / max(self.generated, 1)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(self.drafted, 1)

    @property
    def tokens_per_step(self) -> float:
        return self.generated / max(self.verify_steps, 1)

    def per_sequence_us(self) -> NDArray[np.float64]:
        return np.asarray(self.step_seconds, dtype=np.float64) / max(self.batch, 1) * 1e6


def replay(
    source: Source,
    units: Sequence[int],
    prompts: Sequence[I32],
    targets: Sequence[I32],
    starts: Sequence[int],
    *,
    iterations: int | None = None,
    rng: np.random.Generator | None = None,
    restart_fraction: float = 0.9,
    admitted: Sequence[int] | None = None,
    batch: int | None = None,
) -> ReplayStats:
    """Generate `targets` (from `starts`) through `source`'s drafts.

    iterations=None: run until every sequence is complete (acceptance measurement). Otherwise run
    that many batched steps, restarting finished sequences at a random point (latency measurement).
    admitted: the step at which each sequence starts generating (default: all at step 0).
    batch: at most this many sequences generate at once, as in an engine's continuous batching: the
    others wait, in the order of the targets, and each one finishing admits the next (None: all).
    """
    run = _Replay(source, units, prompts, targets, starts)
    start_step, waiting = _schedule(run.active, admitted, batch, iterations)
    source.start(units, prompts, [t[: int(s)] for t, s in zip(targets, run.pos, strict=True)], run.rows.shape[1])
    offsets = np.zeros(len(targets) + 1, dtype=np.int64)
    tokens = np.zeros(0, dtype=np.int32)
    accepted: I32 | None = None
    rng = rng or np.random.default_rng(0)
    done_steps = 0
    while run.active.any() if iterations is None else done_steps < iterations:
        d_off, d_tok, secs = source.step(offsets, tokens, accepted)
        run.stats.step_seconds.append(secs)
        running = run.active & (start_step <= done_steps)
        acc, counts = run.verify(running, d_off, d_tok)
        new_pos = run.pos + counts
        if iterations is not None:
            run.restart_finished(new_pos, counts, acc, rng, restart_fraction)
        offsets, tokens = gather_new_tokens(run.rows, run.pos, counts)
        run.pos = new_pos
        accepted = acc.astype(np.int32)
        if iterations is None:
            for _ in range(int((running & (run.pos >= run.tlens)).sum())):  # each one finishing admits the next
                if waiting:
                    start_step[waiting.pop(0)] = done_steps + 1
            run.active &= run.pos < run.tlens
        done_steps += 1
    source.close()
    return run.stats


def _schedule(active: NDArray[np.bool_], admitted: Sequence[int] | None, batch: int | None,
              iterations: int | None) -> tuple[I64, list[int]]:
    """The step each sequence starts at, and (with `batch`) the sequences waiting for a place, in order."""
    start_step = np.zeros(active.size, dtype=np.int64) if admitted is None else np.asarray(admitted, dtype=np.int64)
    if batch is None:
        return start_step, []
    if batch < 1 or admitted is not None or iterations is not None:
        raise ValueError("batch: at least 1, and only for a whole replay without `admitted`")
    waiting: list[int] = np.flatnonzero(active).tolist()[batch:]  # admitted as running sequences finish
    start_step[waiting] = np.iinfo(np.int64).max
    return start_step, waiting


class _Replay:
    """Where each sequence of one replay is, and what its verify passes counted."""

    def __init__(self, source: Source, units: Sequence[int], prompts: Sequence[I32], targets: Sequence[I32],
                 starts: Sequence[int]) -> None:
        self.source, self.units, self.prompts, self.targets = source, units, prompts, targets
        self.rows, self.tlens = pad_rows(targets, extra=source_pad(source))
        self.pos = np.asarray(starts, dtype=np.int64).copy()
        self.active = self.pos < self.tlens
        self.stats = ReplayStats(batch=len(targets))

    def verify(self, running: NDArray[np.bool_], d_off: I64, d_tok: I32) -> tuple[I64, I64]:
        """One verify pass of the running sequences: each one's accepted draft prefix and tokens generated."""
        acc = np.where(running, accepted_lengths(d_off, d_tok, self.rows, self.pos, self.tlens), 0)
        counts = np.where(running, np.minimum(acc + 1, self.tlens - self.pos), 0)
        self.stats.drafted += int(np.diff(d_off)[running].sum())
        self.stats.accepted += int(acc[running].sum())
        self.stats.generated += int(counts.sum())
        self.stats.verify_steps += int(running.sum())
        return acc, counts

    def restart_finished(self, new_pos: I64, counts: I64, acc: I64, rng: np.random.Generator, fraction: float) -> None:
        """Restart every sequence that reached its end at a random point of its first `fraction`."""
        for i in np.flatnonzero(new_pos >= self.tlens).tolist():
            start = int(rng.integers(0, max(1, int(self.tlens[i] * fraction))))
            self.source.restart(i, self.units[i], self.prompts[i], self.targets[i][:start])
            counts[i], acc[i], self.pos[i], new_pos[i] = 0, 0, start, start


def source_pad(source: Source) -> int:
    knobs = getattr(source, "knobs", None)
    return (knobs.window.max if isinstance(knobs, SpeculationSpec) else 64) + 2


def replay_units(source: Source, units: Sequence[PromptWork], lead: int = 0, batch: int | None = None,
                 spread: bool = False) -> ReplayStats:
    """Replay every target response of every unit from its start against the unit's history.
    lead: the first response of each unit starts that many steps before its siblings. batch: at most
    this many at once, admitted unit by unit or, with `spread`, sibling by sibling (every unit's first
    response, then every one's second, ...: HistoPipe's `spread_groups`)."""
    if lead and batch is not None:
        raise ValueError("lead and batch: one or the other")
    order = [(i, k) for i, u in enumerate(units) for k in range(len(u.targets))]
    if spread:
        order.sort(key=lambda unit_sibling: (unit_sibling[1], unit_sibling[0]))
    seq_units, prompts, targets, admitted = [], [], [], []
    for i, k in order:
        seq_units.append(i)
        prompts.append(units[i].prompt)
        targets.append(units[i].targets[k])
        admitted.append(lead if k else 0)
    if batch is not None:
        return replay(source, seq_units, prompts, targets, [0] * len(targets), batch=batch)
    return replay(source, seq_units, prompts, targets, [0] * len(targets), admitted=admitted)


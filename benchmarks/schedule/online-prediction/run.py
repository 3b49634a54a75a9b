"""Does online length prediction pay for the default (issue 27, item 1)? Variants of the default
histopipe (shared queue), each a subclass using only the scheduler's own hooks:

- oracle order: the shared queue in true-length order, longest first: the ceiling of any length
  prediction used to order the queue (a group's first finished lengths included);
- probe first: the first sample of every group ahead of the rest, so that first finished lengths
  exist while siblings still wait; `known` counts, over all pulls from the shared queue
  (`on_admitted`), those of a sample with a finished sibling: what an online re-ranking could act on;
- defer TAIL/LAMBDA: once a step is down to TAIL of its samples, a running one that passes LAMBDA x
  its group's longest finished sibling (the step's longest where none finished) is deferred to the
  next round with its tokens (the existing inter-step migration): online outlier detection.

Simulator, H100/7B roofline, 16 workers, 8 ranking groups, off-policyness 1, one warm-up epoch.
Usage: python benchmarks/schedule/online-prediction/run.py > benchmarks/schedule/online-prediction/table.md
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from rhymerl.algorithms.scheduling import RooflineProfile, make_scheduler
from rhymerl.algorithms.scheduling.base import SampleState
from rhymerl.algorithms.scheduling.histopipe import HistoPipe
from rhymerl.algorithms.scheduling.types import Action, Move, RoundPlan, Sample, SampleId, Watch
from rhymerl.api.scheduling import SchedulingSpec
from rhymerl.tools.sim import SimConfig, simulate
from rhymerl.tools.traces import load_trace

HERE = os.path.dirname(os.path.abspath(__file__))
TRACES = ("synthetic:dapo-math", "synthetic:vl-video", "synthetic:code-14b", "synthetic:search-agent",
          "synthetic:math", "synthetic:code", os.path.join(HERE, "..", "quickstart_trace.csv"))


class Counted(HistoPipe):
    """The default, counting pulls of samples whose group already has a finished response."""

    pulls = known = 0

    def on_admitted(self, sid: SampleId, worker: int) -> None:
        super().on_admitted(sid, worker)
        self.pulls += 1
        self.known += bool(self._visit_lengths.get(self._samples[sid].visit))


class OracleOrder(Counted):
    def _plan(self, round_no: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        plan = super()._plan(round_no, samples, carried)
        true = {s.sid: s.oracle_len or 0 for s in [*samples, *carried]}
        first = {s.sid for s in carried}
        plan.shared.sort(key=lambda sid: (sid not in first, -true[sid]))
        return plan


class ProbeFirst(Counted):
    def _plan(self, round_no: int, samples: list[Sample], carried: list[Sample]) -> RoundPlan:
        plan = super()._plan(round_no, samples, carried)
        first: dict[str, SampleId] = {}
        for sid in plan.shared:
            first.setdefault(self._samples[sid].sample.prompt_id, sid)
        probes = list(first.values())
        rest = set(plan.shared) - set(probes)
        plan.shared[:] = probes + [sid for sid in plan.shared if sid in rest]
        return plan


class DeferTail(Counted):
    tail = 0.3
    lam = 0.5

    def _after_finish(self, st: SampleState, now: float) -> list[Action]:
        out = super()._after_finish(st, now)
        r = st.round_no
        assert r is not None
        sizes: dict[int, int] = self.__dict__.setdefault("sizes", {})
        tailing: set[int] = self.__dict__.setdefault("tailing", set())
        watched: dict[SampleId, int] = self.__dict__.setdefault("watched", {})
        size = sizes.setdefault(r, self._round_left[r] + 1)
        if r in tailing or self._round_left[r] > self.tail * size or not self.later_round_possible():
            return out
        tailing.add(r)
        done = [n for (_, rr), ls in self._visit_lengths.items() if rr == r for n in ls]
        for sid, s in self._samples.items():
            if s.round_no == r and not s.done and not s.migrated:
                ref = max(self._visit_lengths.get(s.visit) or done or [0])
                watched[sid] = max(1, math.floor(self.lam * ref) + 1)
                out.append(Watch(sid, watched[sid]))
        return out

    def _progress(self, st: SampleState, worker: int, generated: int, now: float) -> list[Action]:
        limit = self.__dict__.get("watched", {}).get(st.sample.sid)
        if limit is None or st.migrated or generated < limit or not self.later_round_possible():
            return super()._progress(st, worker, generated, now)
        return [self._emit(Move(sid=st.sample.sid, src=worker, dst=None, generated=generated, recompute=True))]


def run(trace_name: str, variants: Sequence[tuple[str, type[Counted], dict[str, float]]]) -> list[tuple[str, float, float, float]]:
    trace, profile = load_trace(trace_name), RooflineProfile()
    out = []
    for label, cls, attrs in variants:
        sched = make_scheduler(SchedulingSpec(policy="histopipe", ranking_groups=8), 16, profile=profile)
        sched.__class__ = cls
        for k, v in attrs.items():
            setattr(sched, k, v)
        r = simulate(trace, sched, SimConfig(workers=16, profile=profile), warmup_steps=trace.epoch_length())
        assert isinstance(sched, Counted)
        out.append((label, r.samples_per_s, 100 * sched.known / max(1, sched.pulls), 100 * r.migrated_fraction))
    return out


VARIANTS: list[tuple[str, type[Counted], dict[str, float]]] = [
    ("default", Counted, {}), ("oracle order", OracleOrder, {}), ("probe first", ProbeFirst, {}),
    ("defer 10%/1.1", DeferTail, {"tail": 0.1, "lam": 1.1}), ("defer 20%/1.1", DeferTail, {"tail": 0.2, "lam": 1.1}),
    ("defer 30%/0.5", DeferTail, {"tail": 0.3, "lam": 0.5}),
]

if __name__ == "__main__":
    names = sys.argv[1:] or list(TRACES)
    print("| trace | " + " | ".join(v[0] for v in VARIANTS) + " |")
    print("|---|" + "---|" * len(VARIANTS))
    speed: dict[str, list[float]] = {}
    for name in names:
        res = run(name, VARIANTS)
        base = res[0][1]
        short = os.path.basename(name)
        speed[short] = [s / base for _, s, _, _ in res]
        cells = [f"{s / base:.3f} (known {k:.0f}%, deferred {m:.1f}%)" for _, s, k, m in res]
        print(f"| {short} | " + " | ".join(cells) + " |", flush=True)
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / len(VARIANTS)
    for j, variant in enumerate(VARIANTS):
        ax.bar([i + j * width for i in range(len(speed))], [v[j] for v in speed.values()], width, label=variant[0])
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(speed))], list(speed), rotation=20, fontsize=8)
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_ylim(0.7, 1.4)
    ax.set_ylabel("samples/s over the default")
    ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    fig.savefig(os.path.join(HERE, "speedups.png"), dpi=100)

"""A simulated rollout fleet that changes while it runs: spot GPUs preempted (a notice, then the
worker hands its samples back with their tokens through the executor's evacuation, or, without a
usable notice, it is lost and its samples' generated tokens are decoded again elsewhere),
replacements joining after a delay, and the fleet-size recommendation (scheduling/fleet_size.py)
resizing the fleet between steps. The simulator calls in here through its hooks
(engine.FleetHooks), and this module changes the fleet through the simulator's public `join`,
`leave` and `compact` (membership.py carries them out); prices, preemption draws and the bill are
spot.py's.

Resizing between steps needs the synchronous pipeline (max_off_policy 0): every sample of a step
is done before the next is planned, and the workers that stay are renumbered 0..n-1 for the next
plan, as the rollout fleet renumbers its members each round. Mid-step a worker that leaves keeps
its index, taking no work, until then; one that joins gets a new index and steals unfinished
samples of the step (or pulls from the shared queue). A worker that leaves when no other is live
keeps its samples until one joins: no sample is ever lost.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from rhymerl.algorithms.scheduling.base import Scheduler
from rhymerl.algorithms.scheduling.fleet_size import FleetAdvice, calibration, predicted_lengths, recommend
from rhymerl.tools.traces.model import Trace

from .config import SimConfig, SimulationError
from .engine import Simulator
from .metrics import SimResult
from .spot import Ledger, Preemption, PreemptionModel, Prices, SpotReport


@dataclass(frozen=True)
class FleetPlan:
    gpus: int
    """The fleet's size (fixed), or its largest (elastic)."""
    spot: bool
    elastic: bool = False
    """Sized by the fleet-size recommendation before every step, within min_gpus..gpus."""
    min_gpus: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.min_gpus <= self.gpus:
            raise ValueError(f"gpus: need 1 <= min_gpus <= gpus, got {self.min_gpus}..{self.gpus}")

    @property
    def label(self) -> str:
        return f"{'elastic ' if self.elastic else 'fixed '}{'spot' if self.spot else 'on-demand'}"


# ---------------------------------------------------------------------- the fleet's controller
class ElasticFleet:
    """The engine's FleetHooks for one run: spot preemptions, replacements, recommendation-driven
    sizes, and the bill."""

    def __init__(self, plan: FleetPlan, model: PreemptionModel, prices: Prices,
                 forced: Mapping[int, Preemption] | None = None) -> None:
        self.plan = plan
        self.model = model
        self.ledger = Ledger(prices)
        self.forced = dict(forced or {})
        """serial -> a chosen preemption of that GPU instead of a drawn one (tests)."""
        self.serials: list[int | None] = []
        """Per simulator slot: the GPU in it (None once it left)."""
        self.next_serial = 0
        self.events: dict[int, tuple[str, int, bool]] = {}
        self.requested: set[int] = set()
        """Join events of GPUs asked for and not arrived yet."""
        self.target = plan.gpus
        self.tokens_lost = 0
        self.preemptions = 0
        self.missed = 0
        self.joins = 0
        self.sizes: list[int] = []
        """Live GPUs at the start of each step (after resizing)."""
        self.advice: list[FleetAdvice] = []

    # ------------------------------------------------------------------ setup
    def attach(self, sim: Simulator) -> None:
        sim.hooks = self
        for slot in range(len(sim.workers)):
            self._start(sim, slot, 0.0)
        if self.plan.elastic:
            self._resize(sim, sim.first_step)
        self.sizes.append(len(sim.live_slots()))

    def _start(self, sim: Simulator, slot: int, at: float) -> None:
        serial = self.next_serial
        self.next_serial += 1
        self.ledger.start(serial, self.plan.spot, at)
        self.serials.extend([None] * (slot + 1 - len(self.serials)))
        self.serials[slot] = serial
        if self.plan.spot:
            p = self.forced.get(serial) or self.model.draw(serial, at)
            if p is not None:
                self._event(sim, max(at, p.at), "preempt", serial, p.usable)

    def _event(self, sim: Simulator, t: float, kind: str, serial: int, usable: bool = True) -> int:
        eid = len(self.events)
        self.events[eid] = (kind, serial, usable)
        sim.fleet_event(t, eid)
        return eid

    def _request(self, sim: Simulator, count: int) -> None:
        for _ in range(count):
            self.requested.add(self._event(sim, sim.now + self.model.replacement_s, "join", -1))

    @staticmethod
    def _done(sim: Simulator) -> bool:
        return len(sim.finished) == len(sim.seqs)

    # ------------------------------------------------------------------ hooks
    def on_fleet_event(self, sim: Simulator, arg: int) -> None:
        kind, serial, usable = self.events[arg]
        if self._done(sim):
            return
        if kind == "join":
            if arg not in self.requested:  # cancelled
                return
            self.requested.discard(arg)
            slot = sim.join()
            del self.serials[slot:]  # a join into an empty fleet starts a new numbering
            self._start(sim, slot, sim.now)
            self.joins += 1
            return
        if serial not in self.serials:  # released before its preemption came
            return
        slot = self.serials.index(serial)
        self.serials[slot] = None
        self.preemptions += 1
        self.missed += not usable
        self.ledger.stop(serial, sim.now)
        self.tokens_lost += sim.leave(slot, keep_tokens=usable)
        live = len(sim.live_slots())
        if live + len(self.requested) < self.target:
            self._request(sim, self.target - live - len(self.requested))

    def between_steps(self, sim: Simulator, trained: int) -> None:
        if self._done(sim) or trained + 1 > sim.last_step:
            return
        if not self.plan.elastic and not sim.gone:  # nothing to change
            self.sizes.append(len(sim.workers))
            return
        if not sim.quiescent():
            raise SimulationError("a fleet that changes needs the synchronous pipeline (max_off_policy 0): "
                                  f"samples are on workers when step {trained} has trained")
        if self.plan.elastic:
            self._resize(sim, trained + 1)
        elif sim.gone and sim.live_slots():
            self._compact(sim, sim.live_slots())
        self.sizes.append(len(sim.live_slots()))

    # ------------------------------------------------------------------ sizing
    def _resize(self, sim: Simulator, step: int) -> None:
        """Ask the recommendation for `step`, release the surplus, cancel or request GPUs."""
        advice = self.recommendation(sim, step)
        self.advice.append(advice)
        self.target = advice.workers
        live = sim.live_slots()
        for slot in live[self.target:]:
            serial = self.serials[slot]
            assert serial is not None
            self.ledger.stop(serial, sim.now)
            self.serials[slot] = None
        live = live[: self.target]
        while len(live) + len(self.requested) > self.target and self.requested:
            self.requested.remove(max(self.requested))
        if live:
            self._compact(sim, live)
        self._request(sim, self.target - len(live) - len(self.requested))

    def _compact(self, sim: Simulator, keep: list[int]) -> None:
        serials = [self.serials[i] for i in keep]
        sim.compact(keep)
        self.serials = list(serials)

    def recommendation(self, sim: Simulator, step: int) -> FleetAdvice:
        """scheduling/fleet_size.py's answer for `step`'s prompts, calibrated by the last step run
        (as `RolloutFleet.recommend` asks it; rollout does not overlap training here)."""
        samples = sim.step_samples[step]
        prompts = list(dict.fromkeys(s.prompt_id for s in samples))
        group = max(1, round(len(samples) / max(1, len(prompts))))
        input_len = float(np.mean([s.input_len for s in samples])) if samples else 0.0
        lengths = predicted_lengths(sim.sched.history, prompts, group)
        k = 1.0
        last = step - 1
        if last in sim.completed and last in sim.step_start and len(self.sizes) >= 1:
            ran = [q for q in sim.seqs.values() if q.origin == last]
            out = np.array([q.target for q in ran], dtype=np.float64)
            k = calibration([(sim.completed[last] - sim.step_start[last], out, self.sizes[-1])],
                            float(np.mean([q.input_len for q in ran])), sim.profile, sim.cfg.speculation)
        return recommend(lengths, input_len, sim.profile, (self.plan.min_gpus, self.plan.gpus),
                         speculation=sim.cfg.speculation, calibration=k, current=self.target)


def run_fleet(trace: Trace, scheduler: Scheduler, config: SimConfig, plan: FleetPlan, *,
              model: PreemptionModel | None = None, prices: Prices | None = None, warmup_steps: int = 0,
              steps: int | None = None, forced: Mapping[int, Preemption] | None = None,
              ) -> tuple[SpotReport, SimResult, ElasticFleet]:
    """Simulate the trace on this fleet and price it. Raises SimulationError if a sample is lost."""
    if (plan.spot or plan.elastic or forced) and scheduler.staleness != 0:
        raise ValueError(f"{plan.label}: fleets that change need max_off_policy 0 (the synchronous pipeline)")
    if config.workers != plan.gpus:
        raise ValueError(f"workers: the simulator starts with {config.workers}, the fleet with {plan.gpus}")
    model = model if model is not None else PreemptionModel()
    sim = Simulator(trace, scheduler, config, warmup_steps=warmup_steps, steps=steps)
    fleet = ElasticFleet(plan, model, prices if prices is not None else Prices(), forced)
    fleet.attach(sim)
    result = sim.run()
    incomplete = [q.sid for q in sim.seqs.values() if not q.done or q.generated != q.target]
    lost = len(sim.seqs) - len(sim.finished) + len(incomplete)
    if lost:
        raise SimulationError(f"{plan.label}: {lost} samples lost or cut short")
    end = result.makespan
    report = SpotReport(
        fleet=plan.label, trace=trace.name, max_gpus=plan.gpus, steps=len(result.steps), samples=result.samples,
        seconds=end, dollars=fleet.ledger.dollars(end), gpu_hours=fleet.ledger.gpu_seconds(end) / 3600.0,
        samples_lost=lost, tokens_recomputed=fleet.tokens_lost, prefill_tokens_recomputed=result.recompute_tokens,
        preemptions=fleet.preemptions, missed_notices=fleet.missed, joins=fleet.joins,
        mean_gpus=fleet.ledger.gpu_seconds(end) / end if end > 0 else 0.0,
    )
    return report, result, fleet

"""The price of a rollout fleet on spot GPUs: prices, preemptions and the bill, as pure arithmetic
(elastic.py applies them to a simulated fleet; `rhymerl bench spot` compares fleets with them).

Defaults are public list figures, not measured here; they were set on 2026-11-26 from:
- on-demand: AWS p5.48xlarge (8x H100 80 GB), $98.32 per instance-hour in us-east-1, i.e.
  $12.29 per GPU-hour (AWS EC2 on-demand price list, as quoted by The Next Platform, 2023-07-27,
  "H100 GPU Instance Pricing On AWS"). AWS has since announced lower P5 on-demand prices (up to
  45% in June 2025), so pass today's quote with `--on-demand`;
- spot: 60% below on-demand, $4.92 per GPU-hour: the smallest discount in Google Cloud's Spot VM
  documentation ("60-91% discount compared to the price of standard VMs",
  cloud.google.com/compute/docs/instances/spot). Spot prices move daily; pass a quote with `--spot`;
- notice and grace: 120 s, the AWS Spot Instance interruption notice ("issued two minutes before
  Amazon EC2 stops or terminates your Spot Instance", docs.aws.amazon.com, spot-instance-termination-
  notices); Google Cloud gives 30 s. AWS emits notices "on a best effort basis": `missed_notice` is
  the share of preemptions without a usable one (default 0.1, an assumption, not a published figure);
- preemption rate: 0.25 per GPU-hour (a mean spot lifetime of 4 hours). An assumption chosen to
  stress the fleet, not a measurement: AWS's Spot Instance Advisor only publishes monthly
  frequency-of-interruption buckets per instance type (the highest is ">20%" a month, about
  0.0003 per hour), far below this; market commentary in 2026 reports H100 spot windows of 2-4
  hours in busy regions. Preemptions are memoryless (exponential lifetimes), independent per GPU;
- replacement delay: 300 s from a preemption (or a request to grow) until a new spot GPU has
  booted and loaded the weights (an assumption).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

ON_DEMAND_GPU_H = 98.32 / 8
SPOT_GPU_H = round(ON_DEMAND_GPU_H * 0.4, 2)


@dataclass(frozen=True)
class Prices:
    """Dollars per GPU-hour."""

    on_demand: float = ON_DEMAND_GPU_H
    spot: float = SPOT_GPU_H

    def __post_init__(self) -> None:
        for name in ("on_demand", "spot"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name}: a price per GPU-hour is at least 0, got {getattr(self, name)}")

    def per_hour(self, spot: bool) -> float:
        return self.spot if spot else self.on_demand


@dataclass(frozen=True)
class Preemption:
    """A spot GPU reclaimed by the cloud: its notice arrives `at` seconds into the run; `usable`:
    whether the worker gets it in time to hand its samples back within the grace period."""

    at: float
    usable: bool


@dataclass(frozen=True)
class PreemptionModel:
    rate_per_gpu_h: float = 0.25
    grace_s: float = 120.0
    missed_notice: float = 0.1
    replacement_s: float = 300.0
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.rate_per_gpu_h >= 0:
            raise ValueError(f"rate_per_gpu_h: at least 0, got {self.rate_per_gpu_h}")
        if not self.grace_s >= 0:
            raise ValueError(f"grace_s: at least 0, got {self.grace_s}")
        if not 0.0 <= self.missed_notice <= 1.0:
            raise ValueError(f"missed_notice: a share in [0, 1], got {self.missed_notice}")
        if not self.replacement_s >= 0:
            raise ValueError(f"replacement_s: at least 0, got {self.replacement_s}")

    def draw(self, serial: int, started: float) -> Preemption | None:
        """The preemption of the `serial`-th spot GPU of a run, started at `started`: an exponential
        lifetime and a missed-notice coin from a generator seeded by (seed, serial), so one GPU's
        fate does not depend on what the others did. None when the rate is 0."""
        if self.rate_per_gpu_h <= 0:
            return None
        rng = np.random.default_rng([self.seed, serial])
        life = float(rng.exponential(3600.0 / self.rate_per_gpu_h))
        return Preemption(at=started + life, usable=bool(rng.random() >= self.missed_notice))


@dataclass
class Ledger:
    """Who was in the fleet when, and what it cost: each GPU is billed per second from the moment
    it is up until it leaves (hands its samples back, is lost or is released)."""

    prices: Prices
    spans: dict[int, tuple[bool, float, float | None]] = field(default_factory=dict)
    """serial -> (spot, start, end or None while in the fleet)."""

    def start(self, serial: int, spot: bool, at: float) -> None:
        if serial in self.spans:
            raise ValueError(f"GPU {serial}: started twice")
        self.spans[serial] = (spot, at, None)

    def stop(self, serial: int, at: float) -> None:
        spot, start, end = self.spans[serial]
        if end is not None:
            raise ValueError(f"GPU {serial}: stopped twice")
        if at < start:
            raise ValueError(f"GPU {serial}: stopped at {at} before it started at {start}")
        self.spans[serial] = (spot, start, at)

    def gpu_seconds(self, until: float) -> float:
        return sum(max(0.0, min(until, end if end is not None else until) - start)
                   for _, start, end in self.spans.values())

    def dollars(self, until: float) -> float:
        """The bill for [0, until]."""
        return sum(self.prices.per_hour(spot) * max(0.0, min(until, end if end is not None else until) - start) / 3600.0
                   for spot, start, end in self.spans.values())


@dataclass(frozen=True)
class SpotReport:
    """One simulated run's economics."""

    fleet: str
    trace: str
    max_gpus: int
    steps: int
    samples: int
    seconds: float
    dollars: float
    gpu_hours: float
    samples_lost: int
    tokens_recomputed: int
    """Generated tokens lost with a worker that left without a usable notice, decoded again elsewhere."""
    prefill_tokens_recomputed: int
    """Prompt + kept tokens re-prefilled where samples resumed (moves, KV preemption, hand-backs)."""
    preemptions: int
    missed_notices: int
    joins: int
    """GPUs that joined after the start (replacements, growth)."""
    mean_gpus: float
    """GPU-seconds billed over the run's seconds."""

    @property
    def seconds_per_step(self) -> float:
        return self.seconds / self.steps if self.steps else 0.0

    @property
    def dollars_per_step(self) -> float:
        return self.dollars / self.steps if self.steps else 0.0

    @property
    def samples_per_dollar(self) -> float:
        return self.samples / self.dollars if self.dollars > 0 else 0.0

    def row(self) -> dict[str, object]:
        return {**{k: getattr(self, k) for k in self.__dataclass_fields__},
                "seconds_per_step": self.seconds_per_step, "dollars_per_step": self.dollars_per_step,
                "samples_per_dollar": self.samples_per_dollar}

"""Prometheus metrics of the role workers and of the controller.

A role worker runs in a process Ray starts on its pod, not in the pod's main process (the one
serving the pod's HTTP port), so it hands its metrics over the way node_exporter's textfile
collector does: after each call it writes them, atomically, to a `.prom` file in the pod's
`RHYMERL_METRICS_DIR`, and the pod's endpoint (endpoints.py) serves those files with its own
metrics. Without that variable (a local run) the metrics stay in memory.
"""

from __future__ import annotations

import os
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, write_to_textfile

from rhymerl.api.roles import Role
from rhymerl.workers.run_folder.step_metrics import StepMetrics

METRICS_DIR_ENV = "RHYMERL_METRICS_DIR"


class WorkerMetrics:
    """One worker's counters, labelled with its role."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.registry = CollectorRegistry()
        r = self.registry
        self.calls = Counter("rhymerl_worker_calls", "calls a role worker has finished", ["role"], registry=r)
        self.seconds = Counter("rhymerl_worker_busy_seconds", "time a role worker spent in calls", ["role"],
                               registry=r)
        self.tokens = Counter("rhymerl_rollout_tokens", "response tokens generated", registry=r)
        self.drafted = Counter("rhymerl_rollout_drafted_tokens", "draft tokens proposed", registry=r)
        self.accepted = Counter("rhymerl_rollout_accepted_tokens", "draft tokens accepted", registry=r)
        self.resumed = Counter("rhymerl_rollout_resumed_tokens", "tokens taken over from a lost call",
                               registry=r)
        self.heard = Counter("rhymerl_rollout_group_tokens_heard", "tokens siblings generated on other rollout "
                             "workers, indexed for group drafts", registry=r)
        self.policy = Gauge("rhymerl_rollout_policy_version", "policy version loaded", registry=r)
        self.scored = Counter("rhymerl_reward_samples", "responses scored", registry=r)
        self.shipped = Counter("rhymerl_history_indexes_shipped", "indexes sent to rollout workers (the recent responses' once for all the prompts of a call)",
                               registry=r)
        self.shipped_bytes = Counter("rhymerl_history_bytes_shipped", "bytes of serialised indexes sent",
                                     registry=r)

    def call(self, seconds: float) -> None:
        self.calls.labels(self.role).inc()
        self.seconds.labels(self.role).inc(seconds)

    def flush(self) -> None:
        folder = os.environ.get(METRICS_DIR_ENV)
        if folder:
            write_to_textfile(str(Path(folder) / f"{self.role}.prom"), self.registry)


class ControllerMetrics:
    """The step loop's view, refreshed after every step."""

    def __init__(self, registry: CollectorRegistry) -> None:
        r = registry
        self.step = Gauge("rhymerl_step", "last finished step", registry=r)
        self.phase = Gauge("rhymerl_step_phase_seconds", "time of the last step's phases", ["phase"], registry=r)
        self.tokens_per_s = Gauge("rhymerl_rollout_tokens_per_second", "rollout throughput of the last step",
                                  registry=r)
        self.acceptance = Gauge("rhymerl_spec_acceptance", "draft acceptance of the last step", registry=r)
        self.bubble = Gauge("rhymerl_rollout_bubble_ratio", "idle share of rollout workers in the last step",
                            registry=r)
        self.reward = Gauge("rhymerl_reward_mean", "mean reward of the last step", registry=r)
        self.lag = Gauge("rhymerl_policy_lag", "policy versions the last step's oldest sample lagged", registry=r)
        self.workers = Gauge("rhymerl_rollout_workers", "rollout workers in the fleet after the last step", registry=r)
        self.wanted = Gauge("rhymerl_rollout_workers_wanted", "rollout workers the job wants (spec.rollout.replicas)",
                            registry=r)
        self.recommended = Gauge("rhymerl_rollout_workers_recommended", "rollout workers the next step wants, from "
                                 "its predicted work and the measured throughput (an autoscaler's target)", registry=r)
        self.reruns = Counter("rhymerl_worker_reruns", "calls run again after their worker died", registry=r)

    def update(self, m: StepMetrics) -> None:
        self.step.set(m.step)
        for phase, value in (("rollout", m.time_rollout_s), ("reward", m.time_reward_s),
                             ("train", m.time_train_s), ("step", m.time_step_s),
                             ("wait_rollout", m.time_wait_rollout_s)):
            if value is not None:
                self.phase.labels(phase).set(value)
        self.tokens_per_s.set(m.rollout_tokens_per_s)
        self.reward.set(m.reward_mean)
        if m.spec_acceptance is not None:
            self.acceptance.set(m.spec_acceptance)
        if m.rollout_bubble is not None:
            self.bubble.set(m.rollout_bubble)
        if m.policy_lag_max is not None:
            self.lag.set(m.policy_lag_max)
        self.reruns.inc(m.worker_reruns or 0)
        for gauge, value in ((self.workers, m.rollout_workers_live), (self.wanted, m.rollout_workers_wanted),
                             (self.recommended, m.fleet_recommended)):
            if value is not None:
                gauge.set(value)

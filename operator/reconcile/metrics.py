"""The operator's Prometheus metrics, in a registry of its own (one per operator, so tests can run several).

rhymerl_operator_reconciles_total{result}     passes: ok, error
rhymerl_operator_reconcile_errors_total{type}  passes that raised, by exception type (ApiException_409, ...)
rhymerl_operator_reconcile_seconds             duration of a pass
rhymerl_operator_writes_total{verb,kind}      writes to the API server (an idle operator adds none)
rhymerl_operator_jobs{phase}                  RLJobs served, by phase
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from rhymerl.api.status import Phase

PHASES: tuple[Phase, ...] = ("Pending", "Running", "Suspended", "Succeeded", "Failed")


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.reconciles = Counter("rhymerl_operator_reconciles", "Reconcile passes by result", ["result"],
                                  registry=self.registry)
        self.errors = Counter("rhymerl_operator_reconcile_errors", "Reconcile passes that raised, by exception type",
                              ["type"], registry=self.registry)
        self.seconds = Histogram("rhymerl_operator_reconcile_seconds", "Duration of one reconcile pass",
                                 buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30), registry=self.registry)
        self.writes = Counter("rhymerl_operator_writes", "Writes to the Kubernetes API", ["verb", "kind"],
                              registry=self.registry)
        self.jobs = Gauge("rhymerl_operator_jobs", "RLJobs served, by phase", ["phase"], registry=self.registry)
        self._phases: dict[tuple[str, str], str] = {}
        for phase in PHASES:
            self.jobs.labels(phase).set(0)

    def wrote(self, verb: str, kind: str) -> None:
        self.writes.labels(verb, kind).inc()

    def job_phase(self, key: tuple[str, str], phase: str | None) -> None:
        """Record the phase of job `key` (namespace, name); None: the job is gone."""
        if phase is None or phase not in PHASES:
            self._phases.pop(key, None)
        else:
            self._phases[key] = phase
        for p in PHASES:
            self.jobs.labels(p).set(sum(1 for v in self._phases.values() if v == p))

    def text(self) -> bytes:
        return generate_latest(self.registry)

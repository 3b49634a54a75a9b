"""An RLJob as stored -> the spec or its problems (reconcile.validate); a metrics row -> status.progress
(rhymerl.operator.progress)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rhymerl.operator.progress import progress_of
from rhymerl.operator.reconcile.validate import clamp_replicas, parse


def stored(spec: dict[str, Any]) -> dict[str, Any]:
    """An RLJob as the API server returns it: with its own metadata fields."""
    return {"apiVersion": "rhymerl.io/v1alpha1", "kind": "RLJob",
            "metadata": {"name": "j", "namespace": "ns", "uid": "u", "resourceVersion": "7", "generation": 2,
                         "creationTimestamp": "2026-01-01T00:00:00Z", "finalizers": ["x"],
                         "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{}"}},
            "spec": spec, "status": {"phase": "Running"}}


def test_a_stored_job_validates_whatever_the_server_added_to_its_metadata() -> None:
    parsed = parse(stored({"rollout": {"replicas": 2, "maxReplicas": 3}}))
    assert parsed.problems is None and parsed.job is not None
    assert (parsed.job.metadata.namespace, parsed.job.spec.rollout.replicas) == ("ns", 2)


def test_a_job_stored_in_snake_case_before_the_camel_case_crd_reads_as_its_camel_case_twin() -> None:
    old = parse(stored({"rollout": {"replicas": 9, "max_replicas": 3}, "failure_policy": {"backoff_limit": 7}}))
    new = parse(stored({"rollout": {"replicas": 9, "maxReplicas": 3}, "failurePolicy": {"backoffLimit": 7}}))
    assert old.job is not None and old.job == new.job
    assert (old.job.spec.rollout.replicas, old.clamped_from, old.job.spec.failure_policy.backoff_limit) == (3, 9, 7)


def test_an_invalid_spec_names_every_bad_field_as_rhymerl_validate_does() -> None:
    parsed = parse(stored({"rollout": {"temperature": -1, "tempreature": 1}}))
    assert parsed.job is None
    assert parsed.problems == ("spec.rollout.temperature: Input should be greater than or equal to 0; "
                               "spec.rollout.tempreature: unknown field; did you mean 'temperature'?")


def test_scaled_replicas_out_of_bounds_are_clamped_not_refused() -> None:
    high = parse(stored({"rollout": {"replicas": 10, "minReplicas": 2, "maxReplicas": 4}}))
    assert high.job is not None and high.job.spec.rollout.replicas == 4 and high.clamped_from == 10
    low = parse(stored({"rollout": {"replicas": 0, "minReplicas": 2, "maxReplicas": 4}}))
    assert low.job is not None and low.job.spec.rollout.replicas == 2
    assert clamp_replicas({"rollout": {"replicas": 3, "maxReplicas": 4}}) is None
    assert clamp_replicas({"rollout": {"replicas": "many"}}) is None
    bounds_wrong = parse(stored({"rollout": {"replicas": 3, "minReplicas": 5, "maxReplicas": 4}}))
    assert bounds_wrong.problems is not None
    assert bounds_wrong.problems.startswith("spec.rollout.maxReplicas: must be >= minReplicas")


def test_a_metrics_row_becomes_status_progress_leaving_out_what_is_not_a_number() -> None:
    row = {"step": 12, "epoch": 3, "policy_version": 12, "reward_mean": 0.5, "spec_acceptance": 0.75,
           "rollout_bubble": 0.125, "time_rollout_s": 2.0, "time_reward_s": 0.5, "time_train_s": 1.25,
           "loss": float("nan"), "rollout_workers_live": 3, "rollout_workers_wanted": 4, "fleet_recommended": 2}
    at = datetime(2026, 5, 6, 7, 8, 9, tzinfo=UTC)
    assert progress_of(row, at) == {"step": 12, "epoch": 3, "policyVersion": 12, "rewardMean": 0.5,
                                    "acceptanceRate": 0.75, "bubbleRatio": 0.125, "lastStepSeconds": 3.75,
                                    "rolloutWorkers": 3, "rolloutWorkersWanted": 4, "recommendedRolloutWorkers": 2,
                                    "message": "step 12 done", "updatedAt": "2026-05-06T07:08:09Z",
                                    "finished": False}
    sparse = progress_of({"step": 1, "reward_mean": float("inf")}, at, finished=True)
    assert sparse == {"step": 1, "message": "finished", "updatedAt": "2026-05-06T07:08:09Z", "finished": True}


def test_a_stored_job_with_a_password_in_its_redis_url_is_refused_without_showing_it() -> None:
    parsed = parse(stored({"history": {"store": "redis", "redisUrl": "redis://reader:s3cret-pw@redis:6379/0"}}))
    assert parsed.job is None and parsed.problems is not None
    assert parsed.problems.startswith("spec.history.redisUrl: a password does not go in the URL")
    assert "s3cret-pw" not in parsed.problems


def test_a_stored_job_whose_statefulset_etcd_would_refuse_is_invalid_naming_the_overrides() -> None:
    env = [{"name": f"LONG_{i}", "value": "v" * 30_000} for i in range(26)]
    parsed = parse(stored({"rollout": {"pod": {"env": env}}}))
    assert parsed.job is None and parsed.problems is not None
    assert parsed.problems.startswith("spec.rollout.pod: the role's StatefulSet would be about")

"""What each pod and worker asks of the cluster: GPUs, role units, threads (pure, no Ray)."""

from __future__ import annotations

import os
from pathlib import Path

from jobs import make_job

from rhymerl.api.roles import train_ranks, workers_per_pod
from rhymerl.workers.roles.threads import cpu_limit, cpu_request
from rhymerl.workers.rollout.vllm_engine import job_settings
from rhymerl.workers.runtime.cluster import role_gpus, role_resources
from rhymerl.workers.runtime.node import wanted_roles

GPU_JOB = {"metadata": {"name": "big"}, "rollout": {"engine": "vllm", "gpus_per_replica": 4, "resources": {"gpu": 4}},
           "train": {"replicas": 2, "resources": {"gpu": 8}}}


def test_train_pods_host_one_rank_per_gpu_and_workers_reserve_their_gpus() -> None:
    job = make_job(GPU_JOB, base="defaults")
    assert train_ranks(job) == 16
    assert workers_per_pod(job, "train") == 8 and workers_per_pod(job, "rollout") == 1
    assert role_resources("train", 8) == {"rhymerl_train": 8.0}
    assert role_resources("train", 8, lead=True) == {"rhymerl_train": 8.0, "rhymerl_train_lead": 1.0}
    assert role_gpus(job)["train"] == 1.0 and role_gpus(job)["rollout"] == 4.0 and role_gpus(job)["reward"] == 0.0
    assert wanted_roles(job)["train"] == 16  # the run starts once every rank has its pod
    assert job_settings(job, 100).tensor_parallel_size == 4


def test_a_job_without_gpus_trains_one_rank_per_pod_and_reserves_none() -> None:
    job = make_job("train.replicas=3", base="defaults")
    assert train_ranks(job) == 3 and workers_per_pod(job, "train") == 1
    assert set(role_gpus(job).values()) == {0.0}
    assert job_settings(job, 100).tensor_parallel_size == 1


def test_the_cpu_limit_is_read_from_cgroup_v2_then_v1_rounded_up(tmp_path: Path) -> None:
    cores = len(os.sched_getaffinity(0))
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cpu.max").write_text("150000 100000\n")
    assert cpu_limit(v2) == min(2, cores)
    (v2 / "cpu.max").write_text("max 100000\n")
    assert cpu_limit(v2) is None
    v1 = tmp_path / "v1"
    (v1 / "cpu").mkdir(parents=True)
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("50000\n")
    (v1 / "cpu" / "cpu.cfs_period_us").write_text("100000\n")
    assert cpu_limit(v1) == 1
    (v1 / "cpu" / "cpu.cfs_quota_us").write_text("-1\n")
    assert cpu_limit(v1) is None
    assert cpu_limit(tmp_path / "none") is None


def test_without_a_cpu_limit_a_pods_workers_compute_with_its_cpu_request_not_the_nodes_cores() -> None:
    cores = len(os.sched_getaffinity(0))
    assert cpu_request({"RHYMERL_CPU_REQUEST": "1"}) == 1  # the downward API's request, rounded up
    assert cpu_request({"RHYMERL_CPU_REQUEST": "512"}) == cores  # never more than the process may run on
    assert cpu_request({}) is None and cpu_request({"RHYMERL_CPU_REQUEST": "0"}) is None

"""The StatefulSets the operator renders, started as processes the way a kubelet would start their
pods (tests/pods_as_processes.py), run a job across them: 1 controller, 2 rollout, 1 train,
1 reward, 1 history; and go on when the controller pod (the Ray head) is killed mid-run; and a
vLLM job, whose rollout pod serves vLLM with the train pod's weights."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pods_as_processes import Kubelet, Pod, pods_of

from rhymerl.api.load import parse_job
from rhymerl.operator.manifests import desired
from rhymerl.workers import dumps

pytestmark = pytest.mark.slow

JOB = """
apiVersion: rhymerl.io/v1alpha1
kind: RLJob
metadata: {name: pods, namespace: test}
spec:
  model: {path: "builtin:tiny-arith"}
  data: {source: "builtin:arith-chain", num_prompts: 4, seed: 0}
  algorithm: {name: grpo, group_size: 4, prompts_per_step: 2, max_response_length: 120, epochs: 1,
              max_off_policy_steps: 1}
  rollout: {replicas: 2, max_replicas: 2, seed: 0, speculation: {method: history}}
  reward: {function: "pods_reward:score", replicas: 1, workers: 1}
  history: {replicas: 1}
"""


def _wait(what: str, done: Callable[[], bool], timeout_s: float, kubelet: Kubelet) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        kubelet.restart_exited()
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.output()[-3000:]}" for p in kubelet.pods)
            raise AssertionError(f"{what}: not within {timeout_s:.0f}s\n{logs}")
        time.sleep(1.0)


def _metrics_rows(controller: Pod) -> list[dict[str, object]]:
    path = controller.root / "volumes" / "data" / "run" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def test_a_two_step_job_runs_across_the_rendered_pods_and_survives_the_loss_of_the_ray_head(
        tmp_path: Path) -> None:
    user_code = tmp_path / "user_code"
    user_code.mkdir()
    (user_code / "pods_reward.py").write_text(textwrap.dedent("""
        def score(prompt, response, answer):
            return float(response.strip().endswith(answer))
    """))
    job = parse_job(JOB)
    pods = pods_of(desired(job, owner=None), tmp_path / "pods",
                   {"PYTHONPATH": str(user_code), "RHYMERL_OBJECT_STORE_BYTES": str(200 * 2**20),
                    # a node gives up on a lost head after this long (Ray's default: 60 s)
                    "RAY_gcs_rpc_server_reconnect_timeout_s": "5",
                    # six nodes starting at once on two cores register slowly (Ray's default: 10 s)
                    "RAY_raylet_start_wait_time_s": "120"})
    assert sorted(p.role for p in pods) == ["controller", "history", "reward", "rollout", "rollout", "train"]
    kubelet = Kubelet(pods)
    controller = next(p for p in pods if p.role == "controller")
    rollout = next(p for p in pods if p.role == "rollout")
    train = next(p for p in pods if p.role == "train")
    once = tmp_path / "once"
    once.mkdir()
    # the controller pod dies (SIGKILL, the Ray head with it) when step 2 is rolled out, after step 1's
    # checkpoint: every other pod's node loses its cluster
    controller.env.update({"RHYMERL_CRASH_AT": "train:2", "RHYMERL_CRASH_ONCE_DIR": str(once)})
    kubelet.start_all()
    try:
        _wait("two steps, the controller pod restarted on the way", lambda: controller.restarts >= 1 and all(
            p.restarts >= 1 for p in pods) and "finished (2 steps)" in controller.output(), 600, kubelet)
        assert (once / "train-2").exists()
        assert controller.get("/readyz")[0] == 200 and rollout.get("/healthz")[0] == 200
        assert rollout.get("/readyz")[0] == 200
        status, body = rollout.get("/metrics")
        assert status == 200 and "rhymerl_rollout_tokens_total" in body
        status, body = controller.get("/metrics")
        assert "rhymerl_step 2.0" in body
    finally:
        codes = kubelet.stop_all()
    rows = _metrics_rows(controller)
    assert [r["step"] for r in rows] == [1, 2]
    # step 2 ran again after the restart, from the step-1 checkpoint's weights (version 1)
    assert rows[1]["policy_lag_max"] == 0 and rows[1]["policy_version"] == 2
    assert rows[0]["rollout_workers"] == 2
    # the train pod keeps the dumps (its own data volume): every response of the job exactly once
    records = dumps.read_run(train.root / "volumes" / "data" / "run")
    keys = [(r.prompt_id, r.sample_index) for r in records]
    assert len(keys) == len(set(keys)) == 4 * 4
    assert {r.policy_version for r in records if r.step == 1} == {0}
    assert {r.policy_version for r in records if r.step == 2} == {1}
    assert all(code == 0 for code in codes.values()), codes
    assert "resuming pods" in controller.output()
    assert all("joined the Ray head" in p.output() for p in pods if p.role != "controller")


def test_rollout_pods_run_vllm_with_the_train_pods_weights(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    user_code = tmp_path / "user_code"
    user_code.mkdir()
    (user_code / "pods_reward.py").write_text("def score(prompt, response, answer):\n"
                                              "    return float(response.strip().endswith(answer))\n")
    job = parse_job(JOB.replace("rollout: {replicas: 2, max_replicas: 2,",
                                "rollout: {engine: vllm, replicas: 1, max_replicas: 1,"))
    pods = pods_of(desired(job, owner=None), tmp_path / "pods",
                   {"PYTHONPATH": str(user_code), "RHYMERL_OBJECT_STORE_BYTES": str(200 * 2**20),
                    "RAY_raylet_start_wait_time_s": "120"})
    kubelet = Kubelet(pods)
    controller = next(p for p in pods if p.role == "controller")
    kubelet.start_all()
    try:
        _wait("two steps", lambda: "finished (2 steps)" in controller.output(), 600, kubelet)
    finally:
        codes = kubelet.stop_all()
    rows = _metrics_rows(controller)
    assert [r["step"] for r in rows] == [1, 2]
    # the train pod measured vLLM's log-probabilities against the weights it held when they were
    # sampled (at off-policy 1 step 2 was rolled out before step 1 trained: version 0 both times)
    # (only vLLM returns the log-probabilities this gap is measured from: the torch engine keeps none)
    assert "rollout_logprob_diff_max" in rows[0]
    assert all(float(str(r["rollout_logprob_diff_max"])) < 1e-3 for r in rows if "rollout_logprob_diff_max" in r)
    assert all(code == 0 for code in codes.values()), codes

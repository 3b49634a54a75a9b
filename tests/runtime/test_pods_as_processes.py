"""The StatefulSets the operator renders, started as processes the way a kubelet would start their
pods (tests/pods_as_processes.py), run a job across them while the fleet changes under it: rollout
pods scaled from 2 to 4 and back, one deleted with notice (SIGTERM, a spot reclaim) and one killed
without (SIGKILL, a lost node), the controller pod (the Ray head) killed once, a worker whose call ended
drafting for one still running (freed drafters, forced); and a vLLM job, whose
rollout pod serves vLLM with the train pod's weights. Every event is forced at a hold point."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from jobs import job_dict, job_yaml, make_job
from pods_as_processes import POD_IP, Cluster, Kubelet, Pod, gcs_answers, pods_of

from rhymerl.api import RLJob
from rhymerl.operator.manifests import desired
from rhymerl.operator.manifests.access import ray_token_secret
from rhymerl.operator.manifests.objects import Manifest
from rhymerl.workers import dumps

pytestmark = pytest.mark.slow

# consolidate_tail off: with every pair forced, an emptied worker would take the samples the scenario
# needs handed back by the worker it holds and then deletes (consolidation: tests/controller/test_fleet.py)
JOB: dict[str, Any] = {
    "metadata": {"name": "pods", "namespace": "test"},
    "model": {"path": "builtin:tiny-arith"},
    "data": {"source": "builtin:arith-chain", "num_prompts": 8, "seed": 0},
    "algorithm": {"name": "grpo", "group_size": 4, "prompts_per_step": 2, "max_response_length": 120, "epochs": 1,
                  "max_off_policy_steps": 0},
    "rollout": {"replicas": 2, "max_replicas": 4, "seed": 0,
                "speculation": {"method": "history", "freed_drafters": True, "consolidate_tail": False,
                                "draft_model": "builtin:tiny-arith-draft"}},
    "reward": {"function": "pods_reward:score", "replicas": 1, "workers": 1},
    "history": {"replicas": 1},
    "checkpoint": {"every_steps": 1},
}
# one rollout pod serving vLLM, at off-policy 1 (vLLM workers drafting for each other: test_ray_failures.py)
VLLM_JOB = job_dict(JOB, "data.num_prompts=4", "algorithm.max_off_policy_steps=1", "rollout.engine=vllm",
                    "rollout.replicas=1", "rollout.max_replicas=1", "rollout.speculation.freed_drafters=false",
                    "rollout.speculation.consolidate_tail=true", base="defaults")
REWARD = """
def score(prompt, response, answer):
    return float(response.strip().endswith(answer))
"""


def _wait(what: str, done: Callable[[], bool], timeout_s: float, kubelet: Kubelet) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            logs = "\n".join(f"--- {p.name}\n{p.output()[-3000:]}{_ray_logs(p)}" for p in kubelet.pods)
            raise AssertionError(f"{what}: not within {timeout_s:.0f}s\n{logs}")
        time.sleep(0.5)


def _ray_logs(pod: Pod) -> str:
    """The last lines of the pod's Ray node logs (`ray start`'s output: why a node did not come up)."""
    return "".join(f"\n- {log.name}: " + " / ".join(log.read_text(errors="replace").strip().splitlines()[-8:])
                   for log in sorted(pod.root.rglob("ray-*.log")))


def _metrics_rows(controller: Pod) -> list[dict[str, object]]:
    path = controller.root / "volumes" / "data" / "run" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


def _objects(job: RLJob, token: str = "0123456789abcdef" * 4) -> list[Manifest]:
    """What the operator makes for `job`: its children and its Ray token Secret (pods mount it)."""
    return [*desired(job, owner=None), ray_token_secret(job, None, token)]


def _user_code(tmp_path: Path) -> Path:
    code = tmp_path / "user_code"
    code.mkdir()
    (code / "pods_reward.py").write_text(textwrap.dedent(REWARD))
    return code


def _reference(tmp_path: Path, code: Path) -> Path:
    """The samples a fixed fleet of 2 rollout workers trains, in one process."""
    job_file = tmp_path / "job.yaml"
    job_file.write_text(job_yaml(JOB, base="defaults"))
    reference = tmp_path / "reference"
    res = subprocess.run([str(Path(sys.executable).with_name("rhymerl")), "run", str(job_file), "--out", str(reference)],
                         capture_output=True, text=True, env={"PATH": str(Path(sys.executable).parent),
                                                              "PYTHONPATH": str(code), "HOME": str(tmp_path)},
                         cwd=tmp_path, timeout=900)
    assert res.returncode == 0, res.stderr
    return reference


class _FleetScenario:
    """The rendered pods of JOB under a kubelet, held at the hold points the scenario forces its events at."""

    TOKEN = "5eed" * 16

    def __init__(self, tmp_path: Path, code: Path) -> None:
        self.holds = tmp_path / "holds"
        self.holds.mkdir()
        self.cluster = Cluster(_objects(make_job(JOB, base="defaults"), self.TOKEN), tmp_path / "pods",
                               {"PYTHONPATH": str(code), "RHYMERL_OBJECT_STORE_BYTES": str(200 * 2**20),
                                "RAY_gcs_rpc_server_reconnect_timeout_s": "5",  # a node gives up on a lost head sooner
                                "RHYMERL_HOLD_AT": "metrics:1,rollout-worker:2,rollout-worker:3,metrics:3",
                                "RHYMERL_FORCE": "freed-drafters",  # a worker whose call ended drafts for one running
                                "RHYMERL_HOLD_DIR": str(self.holds)})
        self.kubelet = Kubelet(self.cluster.pods())
        self.controller = next(p for p in self.kubelet.pods if p.role == "controller")
        self.controller.env.update({"RHYMERL_CRASH_AT": "train:4", "RHYMERL_CRASH_ONCE_DIR": str(self.holds)})
        self.run_dir = self.controller.root / "volumes" / "data" / "run"
        self.replaced: list[str] = []  # exit codes of the rollout pods deleted with notice

    def reached(self, point: str) -> str:
        """Wait for a pod to hold at `point`; the name of the pod holding there."""
        marker = self.holds / f"{point.replace(':', '-')}.reached"
        _wait(point, marker.exists, 600, self.kubelet)
        return marker.read_text().split()[-1]

    def go(self, point: str) -> None:
        (self.holds / f"{point.replace(':', '-')}.go").touch()

    def pod(self, name: str) -> Pod:
        return next(p for p in self.kubelet.pods if p.name == name)

    def replace(self, old: Pod) -> Pod:
        """The StatefulSet makes a new pod of the same name (its volumes kept)."""
        new = self.cluster.pod(old.role, int(old.name.rsplit("-", 1)[1]))
        if old in self.kubelet.pods:
            self.kubelet.replace(old, new)
        else:
            self.kubelet.add(new)
        return new

    def scale(self, rollout: int) -> None:
        subprocess.run([str(Path(sys.executable).with_name("rhymerl")), "scale", str(self.run_dir), "--rollout",
                        str(rollout)], check=True, capture_output=True)

    def events(self) -> str:
        log = self.run_dir / "events.log"
        return log.read_text() if log.is_file() else ""

    def step_1_grows_the_fleet(self) -> None:
        self.reached("metrics:1")  # step 1 done: the job is scaled to 4 rollout workers
        # Ray token authentication is on: the head's GCS refuses a client without the job's token
        head = f"{POD_IP}:{self.cluster.head_port}"
        assert (gcs_answers(head, None), gcs_answers(head, "0" * 64), gcs_answers(head, self.TOKEN)) == \
            ("UNAUTHENTICATED", "UNAUTHENTICATED", "OK")
        self.scale(4)
        for i in (2, 3):
            self.kubelet.add(self.cluster.pod("rollout", i))
        self.go("metrics:1")

    def step_2_deletes_a_pod_with_notice(self) -> None:
        noticed = self.pod(self.reached("rollout-worker:2"))  # a rollout worker in the middle of step 2
        deleting = threading.Thread(target=lambda: self.replaced.append(str(self.kubelet.delete(noticed))))
        deleting.start()  # SIGTERM, the spot notice: its workers hand their samples back, it exits 0
        time.sleep(2.0)
        # held mid-call, it keeps unfinished samples while the other workers' calls end: freed, one drafts for it
        _wait("a freed worker drafting", lambda: "drafts for rollout worker" in self.events(), 600, self.kubelet)
        self.go("rollout-worker:2")
        deleting.join(90)
        self.replace(noticed)

    def step_3_loses_a_pod_and_shrinks(self) -> None:
        lost = self.pod(self.reached("rollout-worker:3"))  # a rollout worker in the middle of step 3
        self.replace(lost)  # its node is gone: no notice, every process of it killed
        self.go("rollout-worker:3")
        self.reached("metrics:3")  # step 3 done: back to 2 (the StatefulSet deletes the highest ordinals)
        self.scale(2)
        for name in ("pods-rollout-3", "pods-rollout-2"):
            self.replaced.append(str(self.kubelet.delete(self.pod(name))))
        self.go("metrics:3")

    def step_4_loses_the_controller(self) -> None:
        """The controller pod dies (SIGKILL) and its replacement resumes from step 3's checkpoint."""
        controller = self.controller
        _wait("the controller pod killed", lambda: controller.proc is not None and controller.proc.poll() is not None,
              600, self.kubelet)
        self.controller = self.replace(controller)  # what its Ray head left behind goes with it
        _wait("four steps", lambda: "finished (4 steps)" in self.controller.output(), 600, self.kubelet)
        assert self.controller.get("/readyz")[0] == 200
        status, body = self.controller.get("/metrics")
        assert status == 200 and "rhymerl_step 4.0" in body


def test_a_job_runs_across_the_rendered_pods_while_its_fleet_grows_shrinks_loses_pods_and_its_controller(
        tmp_path: Path) -> None:
    code = _user_code(tmp_path)
    reference = _reference(tmp_path, code)
    scenario = _FleetScenario(tmp_path, code)
    scenario.kubelet.start_all()
    try:
        scenario.step_1_grows_the_fleet()
        scenario.step_2_deletes_a_pod_with_notice()
        scenario.step_3_loses_a_pod_and_shrinks()
        scenario.step_4_loses_the_controller()
    finally:
        codes = scenario.kubelet.stop_all()
    assert scenario.replaced == ["0", "0", "0"]  # every rollout pod deleted with notice exited 0 within its grace
    rows = _metrics_rows(scenario.controller)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert [r["rollout_workers_wanted"] for r in rows] == [2, 4, 4, 2]
    assert int(str(rows[1]["rollout_handed_back"])) > 0 and int(str(rows[2]["rollout_handed_back"])) > 0
    assert int(str(rows[1]["rollout_drafting_workers"])) >= 1  # step 2: while a worker was held
    # the train pod keeps the dumps (its own data volume): every response of the job exactly once, with
    # the tokens of the fixed fleet
    train = next(p for p in scenario.kubelet.pods if p.role == "train")
    got = [(r.step, r.prompt_id, r.sample_index, r.response_ids)
           for r in dumps.read_run(train.root / "volumes" / "data" / "run")]
    want = [(r.step, r.prompt_id, r.sample_index, r.response_ids) for r in dumps.read_run(reference)]
    assert got == want
    # no container restarted: the member pods joined the new head without exiting
    assert all(p.restarts == 0 and p.exits == [] for p in scenario.kubelet.pods), \
        [(p.name, p.exits) for p in scenario.kubelet.pods]
    assert all(code == 0 for code in codes.values()), codes
    assert "resuming pods" in scenario.controller.output()


def test_rollout_pods_run_vllm_with_the_train_pods_weights(tmp_path: Path) -> None:
    pytest.importorskip("vllm")
    user_code = tmp_path / "user_code"
    user_code.mkdir()
    (user_code / "pods_reward.py").write_text("def score(prompt, response, answer):\n"
                                              "    return float(response.strip().endswith(answer))\n")
    job = make_job(VLLM_JOB, base="defaults")
    pods = pods_of(_objects(job), tmp_path / "pods",
                   {"PYTHONPATH": str(user_code), "RHYMERL_OBJECT_STORE_BYTES": str(200 * 2**20)})
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

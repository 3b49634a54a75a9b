"""End-to-end smoke runs of the `rhymerl` command line, as a user types it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer
import yaml
from cli_runner import rhymerl
from jobs import make_job
from typer.testing import CliRunner

from rhymerl.api.crd import crd_yaml

BAD = """apiVersion: rhymerl.io/v1alpha1
kind: RLJob
metadata: {name: bad}
spec:
  algorithm:
    group_sise: 8
    group_size: -1
  rollout: {min_replicas: 3, max_replicas: 2}
"""


def test_validate_accepts_the_quickstart(repo: Path) -> None:
    res = rhymerl("validate", str(repo / "examples" / "quickstart.yaml"))
    assert res.returncode == 0, res.stderr
    assert "valid RLJob 'quickstart'" in res.stdout


def test_validate_names_every_bad_field_and_exits_2(tmp_path: Path) -> None:
    job = tmp_path / "bad.yaml"
    job.write_text(BAD)
    res = rhymerl("validate", str(job))
    assert res.returncode == 2
    assert "spec.algorithm.group_sise: unknown field; did you mean 'group_size'? (line 6)" in res.stderr
    assert "spec.algorithm.group_size: Input should be greater than 0 (line 7)" in res.stderr
    assert "spec.rollout.max_replicas: must be >= min_replicas (line 8)" in res.stderr


def test_crd_prints_the_generated_definition() -> None:
    res = rhymerl("crd")
    assert res.returncode == 0
    assert res.stdout == crd_yaml()
    assert yaml.safe_load(res.stdout)["spec"]["names"]["kind"] == "RLJob"


def test_respell_rewrites_stored_rljobs_camel_case_for_the_crd_upgrade(tmp_path: Path) -> None:
    stored = tmp_path / "rljobs.yaml"
    stored.write_text("apiVersion: v1\nkind: List\nitems:\n- apiVersion: rhymerl.io/v1alpha1\n  kind: RLJob\n"
                      "  metadata: {name: a, resourceVersion: '7'}\n  spec: {failure_policy: {backoff_limit: 2}}\n")
    res = rhymerl("respell", str(stored))
    assert res.returncode == 0, res.stderr
    assert yaml.safe_load(res.stdout)["items"][0] == {"apiVersion": "rhymerl.io/v1alpha1", "kind": "RLJob",
                                                      "metadata": {"name": "a", "resourceVersion": "7"},
                                                      "spec": {"failurePolicy": {"backoffLimit": 2}}}
    stored.write_text("spec: {failure_policy: {}, failurePolicy: {}}\n")
    res = rhymerl("respell", str(stored))
    assert res.returncode == 2 and "given twice, as failure_policy and as failurePolicy" in res.stderr


def test_run_with_a_bad_override_writes_nothing(repo: Path, tmp_path: Path) -> None:
    res = rhymerl("run", str(repo / "examples" / "quickstart.yaml"), "--set", "algorithm.group_size=0",
                  "--out", str(tmp_path / "run"))
    assert res.returncode == 2
    assert "spec.algorithm.group_size" in res.stderr
    assert not (tmp_path / "run").exists()


def test_a_one_step_run_of_the_embedded_model_then_resume(repo: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    res = rhymerl("run", str(repo / "examples" / "quickstart.yaml"), "--out", str(out),
                  "--set", "data.num_prompts=2", "--set", "algorithm.prompts_per_step=2",
                  "--set", "algorithm.group_size=4", "--set", "algorithm.epochs=1",
                  "--set", "algorithm.max_response_length=96")
    assert res.returncode == 0, res.stderr
    assert "step   1 ep 1 | reward" in res.stdout
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["samples"] == 8 and 0.0 <= rows[0]["reward_mean"] <= 1.0
    assert len((out / "rollouts" / "step_000001.jsonl").read_text().splitlines()) == 8
    assert (out / "plots" / "metrics.png").stat().st_size > 10_000
    assert (out / "checkpoints" / "step_000001" / "model.safetensors").is_file()
    # the job is finished: resuming runs no step and keeps the single metrics line
    res = rhymerl("run", "--resume", str(out))
    assert res.returncode == 0, res.stderr
    assert "finished already (step 1, epoch 1 of 1): nothing to run" in res.stdout
    assert "verify cost" not in res.stdout  # no worker started
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 1
    res = rhymerl("scale", str(out), "--rollout", "1")
    assert res.returncode == 2 and "the run finished (step 1): there is nothing to scale" in res.stderr
    assert not (out / "fleet.json").exists()


def test_a_vllm_job_with_several_replicas_is_refused_locally_before_anything_is_written(repo: Path,
                                                                                          tmp_path: Path) -> None:
    res = rhymerl("run", str(repo / "examples" / "quickstart-vllm.yaml"), "--set", "rollout.replicas=2",
                  "--set", "rollout.max_replicas=2", "--out", str(tmp_path / "run"))
    assert res.returncode == 2
    assert "spec.rollout.replicas" in res.stderr
    assert not (tmp_path / "run").exists()


def test_the_package_never_shadows_the_standard_library_operator(repo: Path) -> None:
    code = "import operator, rhymerl.operator; print(operator.__file__); print(rhymerl.operator.__file__)"
    res = subprocess.run([sys.executable, "-P", "-c", code], capture_output=True, text=True, cwd=repo, timeout=60)
    stdlib, ours = res.stdout.split()
    assert "site-packages" not in stdlib and not stdlib.startswith(str(repo))
    assert ours == str(repo / "operator" / "__init__.py")


def _commands(group: Any, prefix: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    """Every leaf command under a typer group (typer vendors its click: groups are told by `commands`)."""
    found: list[tuple[tuple[str, ...], Any]] = []
    for name, command in group.commands.items():
        found += _commands(command, (*prefix, name)) if hasattr(command, "commands") else [((*prefix, name), command)]
    return found


def test_every_commands_help_shows_each_option_name_whole_in_80_columns() -> None:
    from rhymerl.cli.main import app

    commands = _commands(typer.main.get_command(app))
    assert len(commands) > 15
    runner = CliRunner()
    for path, command in commands:
        res = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "80", "TERM": "dumb"}, terminal_width=80)
        assert res.exit_code == 0, (path, res.output)
        for param in command.params:
            for name in [*param.opts, *param.secondary_opts]:
                if name.startswith("--"):
                    assert name in res.output, f"rhymerl {' '.join(path)} --help cuts {name} at 80 columns"


def test_scale_says_whether_the_run_is_running_to_follow_it_or_takes_it_up_when_resumed(tmp_path: Path) -> None:
    from rhymerl.cli.main import app
    from rhymerl.workers.run_folder.run_dir import RunDir

    run = RunDir(tmp_path / "run")
    run.create(make_job(base="defaults"))  # holds the run's lock, as a running `rhymerl run` does
    res = CliRunner().invoke(app, ["scale", str(run.path), "--rollout", "1"])
    assert res.exit_code == 0 and "1 rollout workers wanted; the running run follows" in res.output
    run.close()
    res = CliRunner().invoke(app, ["scale", str(run.path), "--rollout", "1"])
    assert res.exit_code == 0 and "the run is not running: it starts with them when resumed" in res.output
    assert json.loads((run.path / "fleet.json").read_text()) == {"rollout": 1}


def test_a_ray_join_is_judged_by_its_own_lines_of_the_node_log_every_join_appends_to(tmp_path: Path) -> None:
    """An earlier join's "Ray runtime started" says nothing of this one: a join that never starts counts
    as failed, so a pod whose joins keep failing exits for a fresh container (REJOIN_EXIT_CODE)."""
    import threading

    from rhymerl.workers.runtime.pod_supervisor import started as _started

    class Running:
        def poll(self) -> int | None:
            return None

    log = tmp_path / "ray-node.log"
    log.write_text("Local node IP: 10.0.0.5\nRay runtime started.\n")  # the join before this one
    before = log.stat().st_size
    assert not _started(Running(), log, before, threading.Event(), timeout_s=0.6)
    with log.open("a") as f:
        f.write("Local node IP: 10.0.0.5\nRay runtime started.\n")
    assert _started(Running(), log, before, threading.Event(), timeout_s=0.6)

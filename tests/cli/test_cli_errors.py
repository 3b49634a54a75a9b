"""What the `rhymerl` command line says about bad input: one plain line per problem, exit 2, no traceback
(and about a run that lost what it runs on: one line, exit 1)."""

from __future__ import annotations

import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_runner import rhymerl
from jobs import job_yaml

from rhymerl.workers.model.folder import model_dir

HEAD = "apiVersion: rhymerl.io/v1alpha1\nkind: RLJob\n"


def write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


def test_a_key_with_rich_markup_is_printed_literally(tmp_path: Path) -> None:
    job = write(tmp_path / "job.yaml", HEAD + "spec:\n  '[red]x[/]': 1\n  '[bold]': 2\n")
    res = rhymerl("validate", str(job))
    assert res.returncode == 2
    assert res.stderr.splitlines() == [f"error: {job}: spec.[red]x[/]: unknown field (line 4)",
                                       f"error: {job}: spec.[bold]: unknown field (line 5)"]


def test_a_control_character_in_a_key_is_escaped_so_the_problem_stays_one_line(tmp_path: Path) -> None:
    job = write(tmp_path / "job.yaml", HEAD + 'spec:\n  "a\\nb\\u001b[2J": 1\n')
    res = rhymerl("validate", str(job))
    assert res.returncode == 2
    assert res.stderr.splitlines() == [f"error: {job}: spec.a\\nb\\x1b[2J: unknown field (line 4)"]


def test_validate_takes_several_files_and_lists_the_problems_of_each(repo: Path, tmp_path: Path) -> None:
    good = repo / "examples" / "quickstart.yaml"
    empty = write(tmp_path / "empty.yaml", "")
    bad = write(tmp_path / "bad.yaml", HEAD + "spec:\n  algorithm: {epochs: 0, epochs: 2}\n")
    res = rhymerl("validate", str(good), str(empty), str(bad))
    assert res.returncode == 2
    assert res.stdout.splitlines() == [f"{good}: valid RLJob 'quickstart'"]
    assert res.stderr.splitlines() == [
        f"error: {empty}: (document): empty RLJob: write at least apiVersion: rhymerl.io/v1alpha1 and kind: RLJob",
        f"error: {bad}: spec.algorithm.epochs: duplicate key (first on line 4) (line 4)",
    ]


def test_validate_of_every_example_passes_and_notes_what_only_a_cluster_has(repo: Path) -> None:
    examples = sorted((repo / "examples").glob("*.yaml"))
    res = rhymerl("validate", *map(str, examples))
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == len(examples)
    assert "data: /opt/math-grpo/math.jsonl is not on this machine" in res.stdout


def test_a_set_that_fails_validation_names_the_set_item_not_a_line(repo: Path) -> None:
    res = rhymerl("validate", str(repo / "examples" / "quickstart.yaml"), "--set", "algorithm.group_size=0")
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        f"error: {repo / 'examples' / 'quickstart.yaml'}: spec.algorithm.group_size: Input should be greater than 0 "
        "(--set algorithm.group_size=0)"]


def test_run_reports_a_mistake_in_the_spec_before_it_imports_the_runner(repo: Path, tmp_path: Path) -> None:
    """A spec error costs the time to read the spec, not the 2-3 s of importing torch and the step loop."""
    job = repo / "examples" / "quickstart.yaml"
    code = ("import sys\nfrom rhymerl.cli.main import app\ntry:\n    app(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    print(e.code, 'torch' in sys.modules, 'rhymerl.cli.local_run' in sys.modules)")
    res = subprocess.run([sys.executable, "-P", "-c", code, "run", str(job), "--out", str(tmp_path / "run"), "--set",
                          "algorithm.group_size=0"], capture_output=True, text=True, timeout=120)
    assert res.stdout.split() == ["2", "False", "False"], res.stderr
    assert "spec.algorithm.group_size: Input should be greater than 0" in res.stderr
    assert not (tmp_path / "run").exists()


def test_sizes_beyond_their_bound_are_refused_by_validate(tmp_path: Path) -> None:
    job = write(tmp_path / "job.yaml", HEAD + "spec:\n  data:\n    num_prompts: 100000000000000000000000000\n")
    res = rhymerl("validate", str(job))
    assert res.returncode == 2
    assert res.stderr.splitlines() == [
        f"error: {job}: spec.data.num_prompts: Input should be less than or equal to 100000 (line 5)"]


def test_run_refuses_prompts_the_model_cannot_take_before_the_run_folder_exists(tmp_path: Path) -> None:
    cases = {
        "accent": ('{"prompt": "1+1?", "answer": "2"}\n{"prompt": "na\\u00efve 1+1?", "answer": "2"}\n',
                   "data.jsonl:2: prompt: character 'ï' (U+00EF) at position 3 is not in the model's tokenizer"),
        "long": ('{"prompt": "' + "9" * 2000 + '", "answer": "2"}\n',
                 "data.jsonl:1: prompt is 2001 tokens; with algorithm.max_response_length 96 a sample needs 2098 "
                 "positions and the model has 1024"),
    }
    for name, (lines, message) in cases.items():
        folder = tmp_path / name
        folder.mkdir()
        write(folder / "data.jsonl", lines)
        job = write(folder / "job.yaml", job_yaml("data.source=data.jsonl", "algorithm.max_response_length=96",
                                                  base="defaults"))
        out = folder / "run"
        res = rhymerl("run", str(job), "--out", str(out))
        assert res.returncode == 2, res.stderr
        assert res.stderr.splitlines() == [f"error: {folder / message}"]
        assert not out.exists()
        # validate finds the same problem, naming the job file first
        res = rhymerl("validate", str(job))
        assert (res.returncode, res.stderr.splitlines()) == (2, [f"error: {job}: {folder / message}"])


def test_a_damaged_config_json_in_a_model_folder_is_named(tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(model_dir("builtin:tiny-arith"), model)
    (model / "config.json").write_text('{"hidden_size": 128,')
    job = write(tmp_path / "job.yaml", job_yaml(f"model.path={model}", base="defaults"))
    for command in (["validate", str(job)], ["run", str(job), "--out", str(tmp_path / "run")]):
        res = rhymerl(*command)
        assert res.returncode == 2
        assert res.stderr.splitlines() == [
            f"error: {job}: {model / 'config.json'}:1: not JSON: Expecting property name enclosed in double quotes"
            if command[0] == "validate" else
            f"error: {model / 'config.json'}:1: not JSON: Expecting property name enclosed in double quotes"]
    assert not (tmp_path / "run").exists()


def test_version_prints_the_installed_version() -> None:
    res = rhymerl("--version")
    assert res.returncode == 0
    assert res.stdout == f"rhymerl {importlib.metadata.version('rhymerl')}\n"


def test_trace_export_to_an_unwritable_path_is_one_line_and_no_traceback(tiny_run: Path, tmp_path: Path) -> None:
    blocker = write(tmp_path / "a-file", "")
    res = rhymerl("trace", "export", str(tiny_run), "-o", str(blocker / "trace.csv"))
    assert res.returncode == 2
    assert res.stderr.splitlines() == [f"error: cannot write {blocker / 'trace.csv'}: {blocker}: File exists"]
    res = rhymerl("trace", "export", str(tiny_run), "-o", str(tmp_path))
    assert (res.returncode, res.stderr.splitlines()) == (
        2, [f"error: cannot write {tmp_path}: it is a folder; give a file name"])
    assert list(tmp_path.iterdir()) == [blocker]


def test_a_bench_refuses_an_output_path_it_cannot_write_before_it_computes(tmp_path: Path) -> None:
    blocker = write(tmp_path / "a-file", "")
    res = rhymerl("bench", "schedule", "--steps", "1", "--workers", "4", "--out", str(blocker / "out"))
    assert res.returncode == 2
    assert res.stdout == ""
    assert res.stderr.splitlines() == [f"error: cannot write into {blocker / 'out'}: {blocker} is a file, not a folder"]


def test_bench_option_values_are_user_errors_not_tracebacks(tmp_path: Path) -> None:
    res = rhymerl("bench", "engine-profile", "--out", str(tmp_path), "--batch-sizes", "1,x")
    assert (res.returncode, res.stderr.splitlines()) == (
        2, ["error: --batch-sizes: '1,x' is not a comma-separated list of integers"])
    res = rhymerl("bench", "schedule", "--synthetic", "seed=-1")
    assert (res.returncode, res.stderr.splitlines()) == (2, ["error: synthetic:math: seed: -1 must be >= 0"])
    res = rhymerl("bench", "rollout", "--run", str(tmp_path), "--engine", "tensorrt")
    assert (res.returncode, res.stderr.splitlines()) == (2, ["error: --engine: 'tensorrt' is not torch or vllm"])
    res = rhymerl("bench", "rollout", "--run", str(tmp_path), "--engine", "vllm", "--methods", "history-paper")
    assert res.returncode == 2
    assert res.stderr.startswith("error: --methods: unknown history-paper; known with --engine vllm: none, ngram")
    res = rhymerl("bench", "rollout", "--run", str(tmp_path), "--engine", "vllm", "--batch-sizes", "job,0")
    assert (res.returncode, res.stderr.splitlines()) == (2, ["error: --batch-sizes: 0 must be >= 1"])


def test_run_refuses_train_ranks_and_gpus_this_machine_cannot_give_before_the_run_folder_exists(
        tmp_path: Path) -> None:
    ranks = write(tmp_path / "ranks.yaml", job_yaml("train.replicas=2", base="defaults"))
    res = rhymerl("run", str(ranks), "--out", str(tmp_path / "run"))
    assert res.returncode == 2, res.stderr
    assert "spec.train.replicas: 2 train ranks run as processes of their own: set backend: ray" in res.stderr
    gpus = write(tmp_path / "gpus.yaml", job_yaml("backend=ray", "train.resources.gpu=1", base="defaults"))
    res = rhymerl("run", str(gpus), "--out", str(tmp_path / "run"))
    assert res.returncode == 2, res.stderr
    assert "spec.train.resources.gpu: 1: this machine has no CUDA GPU" in res.stderr
    assert not (tmp_path / "run").exists()


def test_a_run_that_lost_what_it_runs_on_is_one_line_and_exit_1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from rhymerl.cli import local_run
    from rhymerl.cli.main import app
    from rhymerl.errors import RunFailed

    said = (f"lost the train worker (The actor died unexpectedly before finishing this task.); the run cannot go on "
            f"without it; run stopped after step 1; ... Resume with: rhymerl run --resume {tmp_path}")

    def lost(*args: object, **kwargs: object) -> None:
        raise RunFailed(said)

    monkeypatch.setattr(local_run, "run_local", lost)
    res = CliRunner().invoke(app, ["run", "--resume", str(tmp_path)])
    assert (res.exit_code, res.stderr) == (1, f"error: {said}\n")

"""What the Ray scenarios (tests/runtime/test_ray_*.py) share: the quickstart job made tiny, `rhymerl run`
as a subprocess (started, or run to its end), and what a finished run left (samples, metrics rows,
its final weights), with the holds and counts a scenario waits on."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from rhymerl.workers import dumps

SCRIPT = Path(sys.executable).parent / "rhymerl"


QUICKSTART = Path(__file__).resolve().parents[1] / "examples" / "quickstart.yaml"


# 4 prompts, 2 per step, 2 epochs: steps 1-4, history drafts in steps 3-4
TINY = ["data.num_prompts=4", "algorithm.prompts_per_step=2", "algorithm.group_size=4", "algorithm.epochs=2",
        "algorithm.max_response_length=200", "algorithm.max_off_policy_steps=0"]


RAY = ["backend=ray"]


PIPELINED = [*TINY, *RAY, "algorithm.max_off_policy_steps=1"]


TWO_WORKERS = ["rollout.replicas=2", "rollout.max_replicas=2"]


def start(out: Path, sets: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RHYMERL_CRASH")}
    return subprocess.Popen([str(SCRIPT), "run", str(QUICKSTART), "--out", str(out),
                             *(a for s in sets for a in ("--set", s))], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, env=clean | (env or {}), cwd=tempfile.gettempdir())


def rhymerl_scale(out: Path, rollout: int) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "scale", str(out), "--rollout", str(rollout)], capture_output=True, text=True,
                          timeout=60)


def run(out: Path, sets: list[str], env: dict[str, str] | None = None,
        resume: bool = False) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RHYMERL_CRASH")}
    args = ["run", "--resume", str(out), *sets] if resume else \
        ["run", str(QUICKSTART), "--out", str(out), *(a for s in sets for a in ("--set", s))]
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, env=clean | (env or {}),
                          cwd=tempfile.gettempdir(), timeout=900)


def samples(out: Path) -> list[tuple[int, str, int, tuple[int, ...], float]]:
    recs = dumps.read_run(out)
    keys = [(r.step, r.prompt_id, r.sample_index) for r in recs]
    assert len(keys) == len(set(keys)), "a sample counted twice"
    return [(r.step, r.prompt_id, r.sample_index, tuple(r.response_ids), r.reward) for r in recs]


def metrics(out: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def assert_same_run(out: Path, reference: Path) -> None:
    """Tokens, rewards, policy versions and the final weights bit for bit of the uninterrupted run: a
    sample's batch-mates on the shared queue depend on when workers free a slot, but its behaviour
    log-probabilities (the importance weights at off-policy 1) do not (the engine is batch-invariant:
    workers/model/cached_attention.py)."""
    assert samples(out) == samples(reference)
    # a resumed run's workers load the restored in-flight version from the object store at once: a
    # broadcast of a version the train worker never published would hold them STAGED_WAIT_S
    assert [m["weight_fallbacks"] for m in metrics(out)] == [0] * len(metrics(out))
    assert [(r.step, r.policy_version) for r in dumps.read_run(out)] == \
        [(r.step, r.policy_version) for r in dumps.read_run(reference)]
    gaps = weight_gaps(out, reference, "step_000004/model.safetensors")
    assert gaps == {}, f"the final weights differ in {len(gaps)} tensors (largest gap {max(gaps.values()):.3g}); " + \
        "; ".join(f"{name}: {len(weight_gaps(out, reference, name))} differ" for name in earlier_weights(out, reference))


def weight_gaps(out: Path, reference: Path, name: str) -> dict[str, float]:
    """The tensors of checkpoint file `name` (under checkpoints/) that are not bit for bit the
    reference's, with their largest absolute difference."""
    ours, theirs = (load_file(str(p / "checkpoints" / name)) for p in (out, reference))
    assert ours.keys() == theirs.keys()
    return {k: float((ours[k] - theirs[k]).abs().max()) for k in ours if not torch.equal(ours[k], theirs[k])}


def earlier_weights(out: Path, reference: Path) -> list[str]:
    """The weight files of the earlier checkpoints both runs kept (where a run that ends elsewhere
    started to differ: a step's weights, or the in-flight version it kept)."""
    def kept(run: Path) -> set[str]:
        return {str(f.relative_to(run / "checkpoints")) for f in (run / "checkpoints").glob("step_*/*")
                if f.suffix in (".safetensors", ".weights") and f.parent.name != "step_000004"}
    return sorted(kept(out) & kept(reference))


def assert_step_2_kept_step_3s_round(out: Path) -> None:
    """Step 3's first round ran with version 1 when step 2 (version 2) was checkpointed: the
    checkpoint records it and keeps version 1's weights."""
    ckpt = out / "checkpoints" / "step_000002"
    assert json.loads((ckpt / "extra.json").read_text())["ahead_version"] == 1
    assert (ckpt / "in_flight_v1.weights").is_file()


def reached(holds: Path, point: str, proc: subprocess.Popen[str], timeout_s: float = 600) -> str:
    """Wait for a run to hold at `point` (RHYMERL_HOLD_AT); the pid and pod of the process holding."""
    deadline = time.monotonic() + timeout_s
    marker = holds / f"{point.replace(':', '-')}.reached"
    while not marker.exists():
        assert proc.poll() is None, f"the run ended ({proc.returncode}) before {point}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"{point}: not reached"
        time.sleep(0.1)
    return marker.read_text()


def count_said(out: Path, count: str, proc: subprocess.Popen[str], timeout_s: float = 600) -> None:
    """Wait until the newest rollout worker count in the run's events.log is `count` ("4 of 4")."""
    deadline = time.monotonic() + timeout_s
    said = re.compile(r"rollout workers: (\d+ of \d+) wanted")
    while (found := said.findall((out / "events.log").read_text())) == [] or found[-1] != count:
        assert proc.poll() is None, f"the run ended ({proc.returncode}) at {found[-1:]}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"rollout workers: {found[-1:]}, never {count}"
        time.sleep(0.2)


def said(out: Path, text: str, proc: subprocess.Popen[str], timeout_s: float = 600) -> None:
    """Wait until the run's events.log holds `text`."""
    deadline = time.monotonic() + timeout_s
    while text not in (out / "events.log").read_text():
        assert proc.poll() is None, f"the run ended ({proc.returncode}) before saying {text!r}: " \
            f"{proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"never said {text!r}"
        time.sleep(0.2)


def go(holds: Path, point: str) -> None:
    (holds / f"{point.replace(':', '-')}.go").touch()


MARK = "RHYMERL_TEST_MARK"  # inherited by every process a run starts, Ray's included


def marked(mark: str) -> dict[int, str]:
    """Live processes (zombies read an empty environment) carrying `mark`: pid -> command line."""
    found = {}
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and f"{MARK}={mark}".encode() in (entry / "environ").read_bytes().split(b"\0"):
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def left_behind(mark: str, timeout_s: float = 120.0) -> list[str]:
    """The marked processes left once the run's watchdog (workers/runtime/reaper.py, which sweeps
    its Ray processes when its driver dies) has exited; the run itself has exited already."""
    deadline = time.monotonic() + timeout_s
    while any("reaper.py" in cmd for cmd in marked(mark).values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted(marked(mark).values())

"""The reward worker pool: every way a user function can fail costs one sample, never the run."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rhymerl.api.services import RewardSpec
from rhymerl.workers.reward.outcome import Outcome
from rhymerl.workers.reward.pool import InProcess, RewardPool, Sample, open_scorer
from rhymerl.workers.reward.verifiers import RewardError

WriteModule = Callable[[str], str]  # the reward_module fixture (conftest.py)

# `response` says what the function does: "<kind>:<argument>".
MISBEHAVING = """
import os, signal, sys, time

def score(prompt, response, answer):
    kind, _, arg = response.partition(":")
    if kind == "raise":
        raise ValueError(arg)
    if kind == "hang":
        time.sleep(3600)
    if kind == "string":
        return "abc"
    if kind == "none":
        return None
    if kind == "nan":
        return float("nan")
    if kind == "sys-exit":
        sys.exit(0)
    if kind == "os-exit":
        os._exit(3)
    if kind == "segfault":
        os.kill(os.getpid(), signal.SIGSEGV)
    return float(arg)
"""


def _samples(*responses: str) -> list[tuple[str, str, str]]:
    return [("prompt", r, "answer") for r in responses]


def test_every_kind_of_failure_costs_its_sample_the_failure_reward_with_a_one_line_reason(
        reward_module: WriteModule) -> None:
    ref = reward_module(MISBEHAVING)
    cases = [
        ("ok:1.5", Outcome(1.5)),
        ("raise:bad", Outcome(-1.0, "raised ValueError: bad")),
        ("hang:", Outcome(-1.0, "timed out after 0.5 s")),
        ("string:", Outcome(-1.0, "returned 'abc' (str), not a number")),
        ("none:", Outcome(-1.0, "returned None, not a number")),
        ("nan:", Outcome(-1.0, "returned nan")),
        ("sys-exit:", Outcome(-1.0, "worker exited with code 0 while scoring")),
        ("os-exit:", Outcome(-1.0, "worker exited with code 3 while scoring")),
        ("segfault:", Outcome(-1.0, "worker was killed by SIGSEGV while scoring")),
        ("ok:2", Outcome(2.0)),
    ]
    with RewardPool(ref, workers=2, timeout_s=0.5, failure_reward=-1.0) as pool:
        assert pool.score(_samples(*(c for c, _ in cases))) == [want for _, want in cases]


def test_a_hung_call_is_killed_and_a_fresh_worker_takes_its_place(reward_module: WriteModule) -> None:
    ref = reward_module(MISBEHAVING)
    with RewardPool(ref, workers=1, timeout_s=0.5) as pool:
        first = pool.pids
        out = pool.score(_samples("ok:1", "hang:", "ok:3"))
        assert out == [Outcome(1.0), Outcome(0.0, "timed out after 0.5 s"), Outcome(3.0)]
        assert pool.pids != first
        assert pool.score(_samples("ok:4")) == [Outcome(4.0)]


def test_results_come_back_in_input_order_from_several_workers(reward_module: WriteModule) -> None:
    ref = reward_module(MISBEHAVING)
    values = [float(i) for i in range(300)]
    with RewardPool(ref, workers=4, timeout_s=30) as pool:
        assert [o.value for o in pool.score(_samples(*(f"ok:{v}" for v in values)))] == values
        assert pool.score([]) == []


def test_a_worker_dying_mid_batch_neither_loses_nor_repeats_a_sample(reward_module: WriteModule,
                                                                     tmp_path: Path) -> None:
    log = tmp_path / "calls.log"
    ref = reward_module(f"""
        import os

        def score(prompt, response, answer):
            with open({str(log)!r}, "a") as f:
                f.write(response + "\\n")
            if response.startswith("die"):
                os._exit(3)
            return float(response)
    """)
    responses = [f"die{i}" if i % 7 == 3 else str(i) for i in range(60)]
    with RewardPool(ref, workers=3, timeout_s=30, failure_reward=-1.0) as pool:
        out = pool.score(_samples(*responses))
    for r, o in zip(responses, out, strict=True):
        assert o == (Outcome(-1.0, "worker exited with code 3 while scoring") if r.startswith("die")
                     else Outcome(float(r)))
    assert sorted(log.read_text().split()) == sorted(responses)


def test_a_function_that_times_itself_with_signal_alarm_works_in_a_worker(reward_module: WriteModule) -> None:
    ref = reward_module("""
        import signal, time

        def _expired(signum, frame):
            raise TimeoutError("alarm fired")

        def score(prompt, response, answer):
            signal.signal(signal.SIGALRM, _expired)
            signal.alarm(1)
            try:
                while response == "slow":
                    time.sleep(0.01)
                return 1.0
            finally:
                signal.alarm(0)
    """)
    with RewardPool(ref, workers=1, timeout_s=60) as pool:
        assert pool.score(_samples("fast", "slow", "fast")) == [
            Outcome(1.0), Outcome(0.0, "raised TimeoutError: alarm fired"), Outcome(1.0)]


def test_a_function_that_cannot_be_loaded_is_a_user_error_naming_the_spec_field(
        reward_module: WriteModule) -> None:
    with pytest.raises(RewardError, match=r"spec.reward.function 'no_such_module_xyz:f': cannot import"):
        open_scorer(RewardSpec(function="no_such_module_xyz:f"))
    ref = reward_module("def other(prompt, response, answer):\n    return 1.0\n")
    with pytest.raises(RewardError, match=r"spec.reward.function '.*:score': module '.*' has no callable 'score'"):
        open_scorer(RewardSpec(function=ref))
    ref = reward_module("raise ValueError('broken at import')\n")
    with pytest.raises(RewardError, match=r"importing '.*' raised ValueError: broken at import"):
        open_scorer(RewardSpec(function=ref))
    assert multiprocessing.active_children() == []


def test_the_builtin_verifier_runs_in_process_and_starts_no_worker() -> None:
    with open_scorer(RewardSpec()) as scorer:
        assert isinstance(scorer, InProcess)
        assert scorer.score([("1+1", "x = 2", "2"), ("1+1", "x = 3", "2")]) == [Outcome(1.0), Outcome(0.0)]
        assert multiprocessing.active_children() == []


def test_closing_the_pool_ends_every_worker(reward_module: WriteModule) -> None:
    ref = reward_module(MISBEHAVING)
    with open_scorer(RewardSpec(function=ref, workers=3)) as pool:
        assert isinstance(pool, RewardPool)
        assert pool.score(_samples("ok:1")) == [Outcome(1.0)]
        assert len(multiprocessing.active_children()) == 3
    assert multiprocessing.active_children() == []


def test_closing_the_pool_mid_call_kills_the_busy_worker(reward_module: WriteModule) -> None:
    ref = reward_module(MISBEHAVING)
    pool = RewardPool(ref, workers=2, timeout_s=3600)
    with pytest.raises(KeyboardInterrupt), pool:
        signal.signal(signal.SIGALRM, _interrupt)
        signal.setitimer(signal.ITIMER_REAL, 1.0)
        try:
            pool.score(_samples("hang:"))
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
    assert multiprocessing.active_children() == []


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


CONTROLLER = """
import sys
from rhymerl.workers.reward.pool import RewardPool

pool = RewardPool(sys.argv[1], workers=2, timeout_s=3600)
print(*pool.pids, flush=True)
pool.score([("p", "hang:", "a")])
"""


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads process states from /proc")
def test_workers_exit_when_the_controller_is_killed(reward_module: WriteModule) -> None:
    ref = reward_module(MISBEHAVING)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    proc = subprocess.Popen([sys.executable, "-P", "-c", CONTROLLER, ref], stdout=subprocess.PIPE, text=True,
                            env=env)
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert len(pids) == 2 and all(_running(p) for p in pids)
    proc.kill()
    proc.wait()
    give_up = time.monotonic() + 60
    while any(_running(p) for p in pids) and time.monotonic() < give_up:
        time.sleep(0.05)
    assert not any(_running(p) for p in pids)


EXTRAS_AWARE = """
def score(prompt, response, answer, *, data_source=None, extra_info=None):
    return {"gsm8k": 1.0, None: 0.0}.get(data_source, 5.0) + (extra_info or {}).get("index", 0) * 10


def plain(prompt, response, answer):
    return float(response == answer)


def anything(prompt, response, answer, **more):
    return float(len(more))
"""


def test_a_function_naming_data_source_and_extra_info_receives_them_through_the_pool(
        reward_module: WriteModule) -> None:
    ref = reward_module(EXTRAS_AWARE)
    samples: list[Sample] = [("p", "r", "a", {"data_source": "gsm8k", "extra_info": {"index": 3}}),
                             ("p", "r", "a", {"data_source": "math"}), ("p", "r", "a", {}), ("p", "r", "a")]
    with RewardPool(ref, workers=2, timeout_s=30) as pool:
        assert [o.value for o in pool.score(samples)] == [31.0, 5.0, 0.0, 0.0]


def test_a_three_argument_function_still_works_when_a_sample_has_extras(reward_module: WriteModule) -> None:
    ref = reward_module(EXTRAS_AWARE).replace(":score", ":plain")
    with RewardPool(ref, workers=1, timeout_s=30) as pool:
        outcomes = pool.score([("p", "4", "4", {"data_source": "gsm8k", "extra_info": {"index": 1}})])
    assert [(o.value, o.error) for o in outcomes] == [(1.0, None)]


def test_a_function_taking_keyword_arguments_gets_every_extra(reward_module: WriteModule) -> None:
    ref = reward_module(EXTRAS_AWARE).replace(":score", ":anything")
    with RewardPool(ref, workers=1, timeout_s=30) as pool:
        outcomes = pool.score([("p", "r", "a", {"data_source": "s", "extra_info": {}}), ("p", "r", "a")])
    assert [o.value for o in outcomes] == [2.0, 0.0]

"""The adaptive thread count: ThreadChooser fed hand-made pass times (no clock), and the engine's seam."""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.algorithms.thread_choice import ThreadChooser, ladder
from rhymerl.workers.model.transformer import TinyLlama
from rhymerl.workers.rollout.engine import TorchEngine
from rhymerl.workers.rollout.generation import GenRequest, SamplingParams
from rhymerl.workers.rollout.sampling import sample_key
from rhymerl.workers.rollout.verify_cost import ProfileStore

pytestmark = pytest.mark.usefixtures("settable_threads")  # vLLM may have run in this process (conftest.py)

WORK = 10.0  # tokens per pass


def drive(c: ThreadChooser, per_token: Callable[[int, int], float], passes: int, start: int = 0) -> list[int]:
    """Run `passes` passes whose per-token seconds are per_token(threads, pass index); the counts run."""
    ran = []
    for i in range(start, start + passes):
        n = c.threads()
        c.observe(n, per_token(n, i) * WORK, WORK)
        ran.append(n)
    return ran


IDLE = {2: 1e-3, 1: 1.6e-3}       # two threads faster, as on an idle 2-core machine
CONTENDED = {2: 1e-2, 1: 1.2e-3}  # two threads wait on a descheduled one at every barrier


def test_the_ladder_halves_down_to_one() -> None:
    assert ladder(16) == (16, 8, 4, 2, 1)
    assert ladder(3) == (3, 1)
    assert ladder(1) == (1,)


def test_one_thread_has_nothing_to_choose() -> None:
    c = ThreadChooser(1)
    assert set(drive(c, lambda n, i: 1e-3, 500)) == {1}
    assert c.probes == 0


def test_an_idle_machine_climbs_to_the_configured_count_at_once_and_probes_rarely() -> None:
    c = ThreadChooser(2)
    ran = drive(c, lambda n, i: IDLE[n], 20_000)
    assert ran[0] == 1 and ran.index(2) == c.first  # starts low: a wrong 1 costs 1.6x, a wrong 2 up to 50x
    assert c.current == 2 and c.switches == 1
    assert ran.count(1) / len(ran) < 0.01  # probes back off: their cost vanishes
    assert c.passes_at == {2: ran.count(2), 1: ran.count(1)}


def test_a_contended_machine_stays_at_fewer_threads_and_each_probe_costs_one_pass() -> None:
    c = ThreadChooser(2)
    ran = drive(c, lambda n, i: CONTENDED[n], 3000)
    assert c.current == 1 and c.switches == 0
    # each probe at 2 threads is abandoned after its first pass (abort), and probes back off
    assert ran.count(2) == c.probes
    assert ran.count(2) / len(ran) < 0.01


def test_a_large_idle_machine_climbs_the_whole_ladder_within_a_few_dozen_passes() -> None:
    c = ThreadChooser(16)
    ran = drive(c, lambda n, i: 1e-3 / n, 200)
    assert c.current == 16 and c.switches == 4
    assert ran.index(16) < 40


def test_the_choice_follows_the_machine_both_ways() -> None:
    c = ThreadChooser(2)
    drive(c, lambda n, i: CONTENDED[n], 3000)
    assert c.current == 1
    ran = drive(c, lambda n, i: IDLE[n], 3000)
    assert c.current == 2
    assert ran.index(2) < 3000  # a probe within the longest interval (max_every_s at these pass times)
    drive(c, lambda n, i: CONTENDED[n], 3000)
    assert c.current == 1


def test_a_probe_slower_than_abort_times_the_current_ends_after_one_pass() -> None:
    c = ThreadChooser(2, first=4, probe_passes=5, abort=3.0)
    drive(c, lambda n, i: 1e-3, 4)
    assert c.threads() == 2
    c.observe(2, 7e-3 * WORK, WORK)  # the first probe pass is allowed twice `abort` (it starts threads)
    assert c.threads() == 1 and c.current == 1
    c2 = ThreadChooser(2, first=4, probe_passes=5, abort=3.0)
    drive(c2, lambda n, i: 1e-3, 4)
    c2.observe(2, 5e-3 * WORK, WORK)
    c2.observe(2, 3.5e-3 * WORK, WORK)
    assert c2.threads() == 1 and c2.probes == 1


def test_a_pass_at_another_count_than_asked_teaches_nothing() -> None:
    c = ThreadChooser(2, first=2)
    for _ in range(50):
        c.observe(2, 1.0, WORK)  # someone else set the process's count
    assert c.threads() == 1 and c.probes == 0
    assert c.passes_at == {2: 50}


def test_the_first_pass_after_a_change_is_not_counted() -> None:
    c = ThreadChooser(2, first=4, probe_passes=2)
    drive(c, lambda n, i: 1e-3, 4)
    assert c.threads() == 2
    c.observe(2, 2.5e-3 * WORK, WORK)  # pays for starting the threads: dropped, not compared
    c.observe(2, 0.5e-3 * WORK, WORK)
    c.observe(2, 0.5e-3 * WORK, WORK)
    assert c.current == 2 and c.switches == 1


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), noise=st.floats(0.0, 0.07), configured=st.sampled_from([2, 4, 8]))
def test_equal_costs_within_the_margin_never_switch(seed: int, noise: float, configured: int) -> None:
    rng = random.Random(seed)
    c = ThreadChooser(configured)
    drive(c, lambda n, i: 1e-3 * (1 + rng.uniform(-noise, noise)), 3000)
    assert c.switches == 0 and c.current == 1


@settings(max_examples=60, deadline=None)
@given(times=st.lists(st.floats(1e-6, 10.0), min_size=1, max_size=400), work=st.integers(1, 300),
       configured=st.integers(1, 16))
def test_any_timings_keep_the_count_on_the_ladder(times: list[float], work: int, configured: int) -> None:
    c = ThreadChooser(configured, window=2, first=1, probe_passes=1, every=4, every_s=0.01)
    for t in times:
        n = c.threads()
        assert n in ladder(configured)
        c.observe(n, t, work)
    assert c.current in ladder(configured)


@settings(max_examples=30, deadline=None)
@given(best=st.sampled_from([8, 4, 2, 1]), seed=st.integers(0, 2**32 - 1))
def test_a_steady_machine_settles_on_its_fastest_count(best: int, seed: int) -> None:
    rng = random.Random(seed)
    ranks = ladder(8)
    c = ThreadChooser(8)
    # cost grows 40% per rung away from the best count, with 5% noise
    drive(c, lambda n, i: 1e-3 * 1.4 ** abs(ranks.index(n) - ranks.index(best)) * (1 + rng.uniform(-0.05, 0.05)),
          6000)
    assert c.current == best


class Scripted(ThreadChooser):
    """The engine's seam: names counts from a script and records what the engine reports."""

    def __init__(self, script: list[int]) -> None:
        super().__init__(2)
        self.script = script
        self.seen: list[tuple[int, int, float, float]] = []  # asked, torch's count in the pass, seconds, work

    def threads(self) -> int:
        return self.script[len(self.seen) % len(self.script)]

    def observe(self, threads: int, seconds: float, work: float) -> None:
        self.seen.append((threads, torch.get_num_threads(), seconds, work))


def test_the_engine_runs_each_pass_at_the_named_count_and_reports_it(tiny_model: TinyLlama) -> None:
    was = torch.get_num_threads()
    chooser = Scripted([2, 1, 1])
    reqs = [GenRequest([1, 5, 7], sample_key("p", i)) for i in range(3)]
    params = SamplingParams(seed=3, max_response_length=12)
    try:
        out = TorchEngine(tiny_model.double(), 2, threads=chooser).generate(reqs, params)
    finally:
        torch.set_num_threads(was)
    assert chooser.seen and all(asked == ran for asked, ran, _, _ in chooser.seen)
    assert [asked for asked, *_ in chooser.seen] == [[2, 1, 1][i % 3] for i in range(len(chooser.seen))]
    assert all(seconds >= 0 and 1 <= work <= 3 for *_, seconds, work in chooser.seen)
    assert len(chooser.seen) == max(r.forward_passes for r in out) - 1  # every decode pass; prefill is not one


def test_the_profile_is_remeasured_at_its_own_count(tiny_model: TinyLlama, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from rhymerl.workers.rollout import verify_cost

    was = torch.get_num_threads()
    counts: list[int] = []
    real = verify_cost.measure_cells

    def spy(*args: object, **kwargs: object) -> dict[tuple[int, int], float]:
        counts.append(torch.get_num_threads())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(verify_cost, "measure_cells", spy)
    try:
        torch.set_num_threads(2)
        store = ProfileStore.open(tiny_model, context=8, batches=(1, 2), tokens=(1, 2), folder=tmp_path)
        torch.set_num_threads(1)  # a ThreadChooser moved the passes
        store.measured.clear()
        store.remeasure([(0, 0)])
        assert counts == [2, 2] and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(was)


def test_passes_at_another_count_than_the_profiles_do_not_correct_its_cells() -> None:
    from rhymerl.algorithms.drafting.adaptive_cap import CostEvidence, CostProfile
    from rhymerl.api.speculation import SpeculationSpec
    from rhymerl.workers.rollout.speculators import DraftCapController

    profile = CostProfile((1, 4), (1, 2), ((0.02, 0.03), (0.04, 0.06)), (0.025, 0.05))
    at_profile = iter([False, False, True, True])  # the profile's count only from the third pass on
    ticks = iter([0.0, 0.001, 0.002, 0.003])  # every pass 1 ms: far below its cell, a bound if counted
    evidence = CostEvidence(profile, confirm=1)
    control = DraftCapController(SpeculationSpec(), profile, evidence=evidence, clock=lambda: next(ticks),
                                 profiled=lambda: next(at_profile))
    for _ in range(3):
        control.cap(4)
    # passes 1 and 2 ran at another count; only pass 3's time (settled at the 4th choice) may count
    assert evidence.profile == profile
    control.cap(4)
    assert evidence.profile != profile


def test_the_embedded_models_passes_sample_the_same_tokens_and_log_probabilities_at_any_thread_count() -> None:
    """What lets adaptive_threads be on by default: MKL in strict reproducibility mode (rhymerl/__init__.py)
    computes every pass of the quickstart model bit for bit alike at 1 and 2 threads, batch sizes of 1-17
    rows included (where MKL's default mode takes a thread-dependent path)."""
    from rhymerl.api import RLJob
    from rhymerl.workers.model.registry import load_native_policy
    from rhymerl.workers.model.tokenizer import load_job_tokenizer
    from rhymerl.workers.task.prompts import encode_prompts, load_prompts

    job = RLJob.model_validate({"spec": {"data": {"num_prompts": 17}}})
    model, tok = load_native_policy(job.spec.model)
    prompts = encode_prompts(load_job_tokenizer(job), load_prompts(job.spec.data))
    reqs = [GenRequest(ids, sample_key(pid, 0)) for pid, ids in prompts.items()]
    params = SamplingParams(seed=0, max_response_length=160)
    was = torch.get_num_threads()
    runs = []
    try:
        for script in ([1], [2], [2, 1, 1, 2, 1]):
            out = TorchEngine(model, tok.eos_id, threads=Scripted(script)).generate(reqs, params)
            runs.append([(r.response_ids, r.logprobs) for r in out])
    finally:
        torch.set_num_threads(was)
    assert len({len(ids) for ids, _ in runs[0]}) > 5  # the batch shrinks through many sizes as samples finish
    assert runs[1] == runs[0] and runs[2] == runs[0]

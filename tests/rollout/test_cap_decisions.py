"""The record of each pass's draft cap and its reason by batch-size band (issue 41), and the cap
controllers of both engines filling it."""

from __future__ import annotations

import itertools
import json
from types import SimpleNamespace
from typing import cast

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rhymerl.algorithms.drafting.adaptive_cap import AcceptanceTracker, CostProfile
from rhymerl.algorithms.drafting.cap_decisions import (
    DRAFTING,
    REASONS,
    CapDecisions,
    Reason,
    band,
    band_label,
)
from rhymerl.api.speculation import SpeculationSpec
from rhymerl.workers.roles.vllm_rollout import VllmRollout
from rhymerl.workers.rollout.speculators import PROBE_EVERY, DraftCapController
from rhymerl.workers.rollout.vllm_engine import VllmEngine
from rhymerl.workers.rollout.vllm_proposer import HistoryProposer


def test_a_batch_falls_in_the_band_of_the_power_of_two_at_or_below_it() -> None:
    assert [band(b) for b in (0, 1, 2, 3, 4, 7, 8, 255, 256)] == [1, 1, 2, 2, 4, 4, 8, 128, 256]
    assert [band_label(b) for b in (1, 2, 4, 256)] == ["1", "2-3", "4-7", "256-511"]


def _example() -> CapDecisions:
    record = CapDecisions()
    record.record(256, "fixed-off")
    record.record(200, "parked")
    record.record(129, "parked")
    record.record(6, "priced", 4)
    record.record(5, "priced", 8)
    record.record(4, "priced-off")
    record.record(1, "unpriced", 32)
    record.record(1, "no-draft")
    return record


def test_the_summary_gives_each_band_its_passes_drafted_share_mean_cap_and_commonest_reason() -> None:
    summary = _example().summary()
    assert list(summary) == ["1", "4-7", "128-255", "256-511"]  # bands without passes are left out
    assert summary["4-7"] == {"passes": 3, "drafted": 0.6667, "cap": 6.0, "reason": "priced",
                              "reasons": {"priced": 2, "priced-off": 1}}
    # a tie goes to the reason listed first: no-draft before unpriced
    assert summary["1"] == {"passes": 2, "drafted": 0.5, "cap": 32.0, "reason": "no-draft",
                            "reasons": {"no-draft": 1, "unpriced": 1}}
    assert summary["128-255"] == {"passes": 2, "drafted": 0.0, "cap": None, "reason": "parked",
                                  "reasons": {"parked": 2}}
    assert summary["256-511"]["reason"] == "fixed-off"


def test_a_pass_whose_cap_contradicts_its_reason_is_refused() -> None:
    with pytest.raises(ValueError, match="cap 0"):
        CapDecisions().record(4, "priced", 0)
    with pytest.raises(ValueError, match="cap 2"):
        CapDecisions().record(4, "parked", 2)


def test_the_record_goes_through_json_and_leaves_other_counters_alone() -> None:
    record = _example()
    flat = json.loads(json.dumps(record.to_json()))
    assert flat["cap 4-7 priced"] == 2 and flat["cap 4-7 sum"] == 12 and flat["cap 1 sum"] == 32
    assert CapDecisions.from_json(flat | {"calls": 7, "rows": 3}) == record
    for bad in ("cap 5-7 priced", "cap 4-7 bogus", "cap 4-8 parked"):
        with pytest.raises(ValueError):
            CapDecisions.from_json({bad: 1})


_PASS = st.sampled_from(REASONS).flatmap(
    lambda r: st.tuples(st.integers(0, 600), st.just(r), st.integers(1, 64) if r in DRAFTING else st.just(0)))


@given(st.lists(_PASS, max_size=60), st.lists(st.integers(0, 60), max_size=4))
def test_merging_the_records_of_any_split_equals_recording_every_pass_in_one(
        passes: list[tuple[int, Reason, int]], cuts: list[int]) -> None:
    whole = CapDecisions()
    for p in passes:
        whole.record(*p)
    bounds = [0, *sorted(cuts), len(passes)]
    parts = []
    for lo, hi in itertools.pairwise(bounds):
        part = CapDecisions()
        for p in passes[lo:hi]:
            part.record(*p)
        parts.append(part)
    assert sum(parts, CapDecisions()) == whole
    assert sum(reversed(parts), CapDecisions()).summary() == whole.summary()


def _reasons(control: DraftCapController) -> dict[str, dict[str, int]]:
    return {b: s["reasons"] for b, s in control.take_decisions().summary().items()}


def test_the_controller_records_why_each_pass_ran_under_its_cap() -> None:
    poor = CostProfile((1, 64), (1, 33), ((1.0, 33.0), (64.0, 64.0 * 33)))  # drafts never pay
    control = DraftCapController(SpeculationSpec(), poor, AcceptanceTracker(prior=0.05))
    ramp = 4 + 1 + 2 + 4 + 8  # off, parked 1, off, parked 2, ... (test_speculators.py), then two probe cycles
    caps = [None if control.parked(64) else control.cap(64) for _ in range(ramp + 2 * (PROBE_EVERY + 1))]
    assert caps.count(SpeculationSpec().window.initial) == control.probes == 2
    decisions = control.take_decisions().summary()["64-127"]
    assert decisions["reasons"] == {"priced-off": caps.count(0), "parked": caps.count(None), "probe": 2}
    assert decisions["cap"] == SpeculationSpec().window.initial
    assert control.take_decisions() == CapDecisions()  # taken: the next call starts afresh

    fixed = DraftCapController(SpeculationSpec(disable_above_batch=8))
    assert [fixed.cap(8), fixed.cap(9), fixed.cap(4, [0, 0, 0, 0]), fixed.cap(2, [])] == [32, 0, 32, 32]
    assert _reasons(fixed) == {"8-15": {"fixed-off": 1, "unpriced": 1}, "2-3": {"no-draft": 1}, "4-7": {"no-draft": 1}}


def test_a_vllm_call_reads_its_cap_decisions_from_the_proposers_step_stats() -> None:
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=8),
                             model_config=SimpleNamespace(max_model_len=256))
    proposer = HistoryProposer(config)
    proposer.set_step([[1, 5, 6]], [None])
    proposer.control.cap(3, [2, 0, 0])  # what its draft source asks each engine step
    proposer.control.cap(3, [0, 0, 0])
    assert proposer.stats.as_dict()["calls"] == 0  # the other counters are still there
    rollout = VllmRollout.__new__(VllmRollout)  # the call's side, without vLLM: the stats as the RPC returns them
    rollout.vllm = cast(VllmEngine, SimpleNamespace(settings=SimpleNamespace(method="history"),
                                                    proposer_stats=lambda: proposer.stats.as_dict()))
    assert rollout.cap_decisions().summary()["2-3"]["reasons"] == {"no-draft": 1, "unpriced": 1}
    proposer.set_step([[1, 5, 6]], [None])  # the next call: counted afresh
    assert rollout.cap_decisions() == CapDecisions()

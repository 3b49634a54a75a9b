"""Spot economics: prices, seeded preemptions and the bill by hand, and simulated fleets that lose a
GPU at a chosen time (with and without a usable notice) without losing a sample."""

from __future__ import annotations

import numpy as np
import pytest

from rhymerl.algorithms.scheduling import EqualSplit, TableProfile
from rhymerl.tools.sim import SimConfig
from rhymerl.tools.sim.elastic import FleetPlan, run_fleet
from rhymerl.tools.sim.spot import Ledger, Preemption, PreemptionModel, Prices, SpotReport
from rhymerl.tools.traces import Trace

PRICES = Prices(on_demand=7.2, spot=3.6)  # $ 0.002 and 0.001 per GPU-second
NO_DRAWS = PreemptionModel(rate_per_gpu_h=0.0, replacement_s=1000.0)


def test_the_bill_is_each_gpus_seconds_at_its_price_up_to_the_end() -> None:
    ledger = Ledger(PRICES)
    ledger.start(0, spot=False, at=0.0)
    ledger.start(1, spot=True, at=900.0)
    ledger.stop(0, at=1800.0)
    assert ledger.gpu_seconds(3600.0) == pytest.approx(1800.0 + 2700.0)
    assert ledger.dollars(3600.0) == pytest.approx(1800 * 0.002 + 2700 * 0.001)
    assert ledger.dollars(1000.0) == pytest.approx(1000 * 0.002 + 100 * 0.001)  # only what ran before the end
    with pytest.raises(ValueError, match="stopped twice"):
        ledger.stop(0, at=2000.0)
    with pytest.raises(ValueError, match="before it started"):
        ledger.stop(1, at=10.0)


def test_a_report_divides_the_bill_by_steps_and_samples() -> None:
    r = SpotReport(fleet="fixed spot", trace="t", max_gpus=2, steps=4, samples=200, seconds=100.0, dollars=8.0,
                   gpu_hours=0.05, samples_lost=0, tokens_recomputed=0, prefill_tokens_recomputed=0, preemptions=0,
                   missed_notices=0, joins=0, mean_gpus=1.8)
    assert (r.seconds_per_step, r.dollars_per_step, r.samples_per_dollar) == (25.0, 2.0, 25.0)


def test_bad_prices_and_preemption_inputs_name_the_field() -> None:
    with pytest.raises(ValueError, match="spot"):
        Prices(spot=-1.0)
    with pytest.raises(ValueError, match="missed_notice"):
        PreemptionModel(missed_notice=1.5)
    with pytest.raises(ValueError, match="grace_s"):
        PreemptionModel(grace_s=-1.0)


def test_preemptions_are_seeded_per_gpu_and_memoryless_at_the_given_rate() -> None:
    model = PreemptionModel(rate_per_gpu_h=2.0, missed_notice=0.25, seed=7)
    draws = [model.draw(serial, 100.0) for serial in range(4000)]
    assert draws[:5] == [model.draw(serial, 100.0) for serial in range(5)]  # the same GPU, the same fate
    assert draws[0] != PreemptionModel(rate_per_gpu_h=2.0, missed_notice=0.25, seed=8).draw(0, 100.0)
    lives = np.array([d.at - 100.0 for d in draws if d is not None])
    assert lives.min() > 0 and lives.mean() == pytest.approx(1800.0, rel=0.05)  # 3600 s / 2 per hour
    assert np.mean([not d.usable for d in draws if d is not None]) == pytest.approx(0.25, abs=0.03)
    assert PreemptionModel(rate_per_gpu_h=0.0).draw(0, 0.0) is None


def _four_samples() -> Trace:
    return Trace.from_steps([[("a", 10), ("b", 10), ("c", 10), ("d", 10)]])


def _run(trace: Trace, gpus: int, forced: dict[int, Preemption], model: PreemptionModel = NO_DRAWS,
         ) -> tuple[SpotReport, float]:
    profile = TableProfile.constant(1.0)  # one second per iteration, whatever the batch; free prefill
    report, result, _ = run_fleet(trace, EqualSplit(gpus, profile=profile, staleness=0),
                                  SimConfig(workers=gpus, profile=profile), FleetPlan(gpus, spot=True),
                                  model=model, prices=PRICES, forced=forced)
    assert sorted(result.finished) == list(range(len(trace)))
    return report, result.makespan


def test_a_worker_lost_without_notice_loses_its_tokens_but_no_sample() -> None:
    # two workers, two 10-token samples each; GPU 0 is lost at 4.5 s with 4 tokens on each sample
    report, makespan = _run(_four_samples(), 2, {0: Preemption(at=4.5, usable=False)})
    assert report.samples_lost == 0 and report.preemptions == 1 and report.missed_notices == 1
    assert report.tokens_recomputed == 2 * 4
    assert makespan == pytest.approx(4.5 + 10)  # worker 1 decodes them again from the first token
    assert report.dollars == pytest.approx((4.5 + 14.5) * 0.001)  # GPU 0 billed until it was lost


def test_a_worker_with_a_usable_notice_hands_its_samples_back_with_their_tokens() -> None:
    report, makespan = _run(_four_samples(), 2, {0: Preemption(at=4.5, usable=True)})
    assert report.samples_lost == 0 and report.tokens_recomputed == 0 and report.missed_notices == 0
    assert makespan == pytest.approx(4.5 + 6)  # worker 1 resumes them at token 4
    assert report.prefill_tokens_recomputed == 2 * (10 + 4)  # their prompts and kept tokens re-prefilled


def test_the_last_worker_leaving_keeps_its_samples_until_a_replacement_joins() -> None:
    model = PreemptionModel(rate_per_gpu_h=0.0, replacement_s=5.0)
    report, makespan = _run(Trace.from_steps([[("a", 10), ("b", 10)]]), 1, {0: Preemption(at=4.5, usable=True)},
                            model)
    assert report.samples_lost == 0 and report.joins == 1
    assert makespan == pytest.approx(4.5 + 5.0 + 6)
    assert report.dollars == pytest.approx((4.5 + 6) * 0.001)  # nobody billed while the fleet was empty


def test_a_fixed_spot_fleet_shrinks_between_steps_until_its_replacement_joins_and_steals() -> None:
    two_steps = Trace.from_steps([[("a", 10), ("b", 10)], [("c", 10), ("d", 10), ("e", 10), ("f", 10)]])
    model = PreemptionModel(rate_per_gpu_h=0.0, replacement_s=12.0)
    profile = TableProfile.constant(1.0)
    report, result, fleet = run_fleet(two_steps, EqualSplit(2, profile=profile, staleness=0),
                                      SimConfig(workers=2, profile=profile), FleetPlan(2, spot=True), model=model,
                                      prices=PRICES, forced={0: Preemption(at=4.5, usable=True)})
    assert fleet.sizes == [2, 1]  # step 2 planned on the one worker left
    assert report.joins == 1 and report.samples_lost == 0 and len(result.finished) == 6
    assert result.makespan < 10.5 + 40  # the replacement (at 16.5) took over work of step 2


def test_fleets_that_change_need_the_synchronous_pipeline() -> None:
    with pytest.raises(ValueError, match="max_off_policy 0"):
        run_fleet(_four_samples(), EqualSplit(2, staleness=1), SimConfig(workers=2), FleetPlan(2, spot=True))


def test_the_elastic_fleet_starts_at_the_recommended_size_and_pays_only_for_it() -> None:
    warm = [(p, n) for p, n in (("s", 4), ("l", 40)) for _ in range(4)]
    trace = Trace.from_steps([warm, warm])
    profile = TableProfile.constant(1.0)
    report, _, fleet = run_fleet(trace, EqualSplit(4, profile=profile, staleness=0),
                                 SimConfig(workers=4, profile=profile), FleetPlan(4, spot=False, elastic=True),
                                 model=NO_DRAWS, prices=PRICES, warmup_steps=1)
    # a constant iteration time makes one worker as fast as four: the recommendation wants one
    assert fleet.advice[0].workers == 1 and fleet.sizes == [1]
    assert report.dollars == pytest.approx(report.seconds * 0.002)


def test_a_fixed_on_demand_fleet_may_run_pipelined_and_costs_its_size_times_its_time() -> None:
    two_steps = Trace.from_steps([[("a", 10), ("b", 4)], [("c", 10), ("d", 4)]])
    report, result, _ = run_fleet(two_steps, EqualSplit(2, staleness=1), SimConfig(workers=2),
                                  FleetPlan(2, spot=False), prices=PRICES)
    assert report.preemptions == 0 and len(result.finished) == 4
    assert report.dollars == pytest.approx(2 * result.makespan * 0.002)

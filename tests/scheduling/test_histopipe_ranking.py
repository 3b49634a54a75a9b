"""Tier 1: ranking prompts by last epoch's GRPO-group median and laying groups out on workers."""

from __future__ import annotations

from rhymerl.algorithms.scheduling import HistoPipe, LengthHistory, Sample
from rhymerl.algorithms.scheduling.ranking import equal_share, layout, rank_prompts, step_order


def _history(medians: dict[str, list[int]]) -> LengthHistory:
    h = LengthHistory()
    for p, lens in medians.items():
        h.observe(p, lens)
    return h


def test_prompts_are_ranked_by_the_median_of_their_last_group_not_the_mean() -> None:
    h = _history({"a": [1, 2, 1000], "b": [50, 50, 50], "c": [10, 10, 10], "d": [80, 90, 100]})
    r = rank_prompts(["a", "b", "c", "d"], {p: 1 for p in "abcd"}, h, 4, "prompt-length", 0)
    assert r.source == "history"
    assert r.groups == [["a"], ["c"], ["b"], ["d"]]  # a's median is 2 despite one 1000-token outlier


def test_ranking_groups_split_the_prompts_equally() -> None:
    h = _history({f"p{i}": [i] for i in range(10)})
    r = rank_prompts([f"p{i}" for i in range(10)], {f"p{i}": 1 for i in range(10)}, h, 4, "random", 0)
    assert [len(g) for g in r.groups] == [3, 3, 2, 2]
    assert [p for g in r.groups for p in g] == [f"p{i}" for i in range(10)]


def test_prompts_without_history_take_the_median_rank_of_those_with_history() -> None:
    h = _history({"short": [10], "mid": [50], "long": [90]})
    r = rank_prompts(["new", "short", "long", "mid"], {"new": 1, "short": 1, "long": 1, "mid": 1}, h, 4, "random", 0)
    assert r.keys["new"] == 50
    assert r.known == 3


def test_first_epoch_ranks_by_prompt_length_when_there_is_no_history() -> None:
    r = rank_prompts(["x", "y", "z"], {"x": 300, "y": 100, "z": 200}, LengthHistory(), 3, "prompt-length", 0)
    assert r.source == "prompt-length"
    assert r.groups == [["y"], ["z"], ["x"]]


def test_first_epoch_random_ranking_is_a_seeded_shuffle() -> None:
    ids = [f"p{i}" for i in range(20)]
    a = rank_prompts(ids, dict.fromkeys(ids, 1), LengthHistory(), 4, "random", 7)
    b = rank_prompts(ids, dict.fromkeys(ids, 1), LengthHistory(), 4, "random", 7)
    c = rank_prompts(ids, dict.fromkeys(ids, 1), LengthHistory(), 4, "random", 8)
    assert a.source == "random"
    assert a.groups == b.groups
    assert a.groups != c.groups


def test_odd_steps_map_groups_ascending_and_even_steps_descending() -> None:
    assert step_order(1) == "ascending" and step_order(2) == "descending"
    assert layout([1, 2, 3], 1) == [range(0, 1), range(1, 3), range(3, 6)]
    assert layout([1, 2, 3], 2) == [range(5, 6), range(3, 5), range(0, 3)]


def test_equal_share_gives_the_remainder_to_the_longest_groups() -> None:
    assert equal_share(3, 8) == [2, 3, 3]
    assert equal_share(4, 4) == [1, 1, 1, 1]


def test_a_worker_with_short_work_on_an_odd_step_gets_long_work_on_the_next() -> None:
    sched = HistoPipe(4, placement="per-worker", groups=4, two_tier=False)
    for i in range(4):
        sched.prime(f"p{i}", [100 * (i + 1)] * 2)
    sid = 0
    plans = []
    for step in (1, 2):
        samples = []
        for i in range(4):
            for _ in range(2):
                samples.append(Sample(sid=sid, prompt_id=f"p{i}", input_len=5))
                sid += 1
        plans.append(sched.plan_round(step, samples))
    prompt_of = {s: f"p{(s % 8) // 2}" for s in range(16)}
    assert {prompt_of[s] for s in plans[0].queues[0]} == {"p0"}  # odd step: shortest group on worker 0
    assert {prompt_of[s] for s in plans[1].queues[0]} == {"p3"}  # even step: longest group on worker 0
    assert plans[0].order == "ascending" and plans[1].order == "descending"


def test_without_history_histopipe_reports_its_fallback_and_splits_workers_equally() -> None:
    sched = HistoPipe(4, placement="per-worker", groups=2)
    plan = sched.plan_round(1, [Sample(sid=i, prompt_id=f"p{i}", input_len=10 * i) for i in range(8)])
    assert plan.ranking == "prompt-length"
    assert plan.workers_per_group == [2, 2]
    assert plan.predicted_group_time == []

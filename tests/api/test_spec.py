from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rhymerl.api import RLJob, SpecError, dump_job, load_job, parse_job

GOOD = """
apiVersion: rhymerl.io/v1alpha1
kind: RLJob
metadata: {name: demo}
spec:
  algorithm: {group_size: 4}
"""


def problems_of(text: str) -> dict[str, str]:
    with pytest.raises(SpecError) as info:
        parse_job(text, "job.yaml")
    return {p.path: p.reason for p in info.value.problems}


def test_every_example_yaml_is_a_valid_rljob(repo: Path) -> None:
    examples = sorted((repo / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        assert load_job(path).kind == "RLJob"


def test_a_misspelt_key_is_named_with_the_closest_known_key() -> None:
    found = problems_of(GOOD.replace("group_size", "group_sise"))
    assert found == {"spec.algorithm.group_sise": "unknown field; did you mean 'group_size'?"}


def test_a_negative_group_size_is_rejected_by_field() -> None:
    found = problems_of(GOOD.replace("group_size: 4", "group_size: -2"))
    assert list(found) == ["spec.algorithm.group_size"]
    assert "greater than 0" in found["spec.algorithm.group_size"]


def test_max_replicas_below_min_replicas_names_max_replicas() -> None:
    text = GOOD + "  rollout: {min_replicas: 4, max_replicas: 2, replicas: 4}\n"
    assert problems_of(text) == {"spec.rollout.max_replicas": "must be >= min_replicas"}


def test_all_problems_are_reported_together_with_lines() -> None:
    text = GOOD.replace("group_size: 4", "group_size: 0, clip_ratio_lo: 0.1")
    with pytest.raises(SpecError) as info:
        parse_job(text, "job.yaml")
    assert {p.path for p in info.value.problems} == {"spec.algorithm.group_size", "spec.algorithm.clip_ratio_lo"}
    assert all(p.line == 6 for p in info.value.problems)


def test_yaml_syntax_errors_carry_the_line() -> None:
    with pytest.raises(SpecError) as info:
        parse_job("spec:\n  algorithm: [1,\n", "job.yaml")
    assert info.value.problems[0].line == 3


def test_dapo_defaults_differ_from_grpo_defaults() -> None:
    grpo = parse_job(GOOD).spec.algorithm
    dapo = parse_job(GOOD.replace("group_size: 4", "group_size: 4, name: dapo")).spec.algorithm
    assert (grpo.clip_ratio_high, grpo.loss_agg_mode) == (0.2, "seq-mean-token-mean")
    assert (dapo.clip_ratio_high, dapo.loss_agg_mode) == (0.28, "token-mean")
    assert dapo.dynamic_sampling is not None and dapo.dynamic_sampling.enabled
    assert grpo.dynamic_sampling is not None and not grpo.dynamic_sampling.enabled


def test_overrides_are_validated_like_the_file() -> None:
    job = parse_job(GOOD, overrides=["algorithm.epochs=7", "rollout.speculation.method=ngram"])
    assert job.spec.algorithm.epochs == 7 and job.spec.rollout.speculation.method == "ngram"
    with pytest.raises(SpecError) as info:
        parse_job(GOOD, overrides=["algorithm.epochz=7"])
    assert info.value.problems[0].path == "spec.algorithm.epochz"


def test_redis_store_requires_a_url() -> None:
    assert problems_of(GOOD + "  history: {store: redis}\n") == {
        "spec.history.redis_url": "required when store is redis"}


def test_the_resolved_dump_parses_back_to_the_same_job(repo: Path) -> None:
    for path in sorted((repo / "examples").glob("*.yaml")):
        job = load_job(path)
        assert parse_job(dump_job(job)) == job


@settings(max_examples=40, deadline=None)
@given(group=st.integers(2, 64), prompts=st.integers(1, 512), temp=st.floats(0, 2), top_p=st.floats(0.01, 1),
       name=st.sampled_from(["grpo", "dapo"]), lo=st.integers(1, 8), extra=st.integers(0, 8))
def test_spec_round_trips_through_yaml(group: int, prompts: int, temp: float, top_p: float, name: str,
                                       lo: int, extra: int) -> None:
    job = RLJob.model_validate({"spec": {
        "algorithm": {"name": name, "group_size": group, "prompts_per_step": prompts},
        "rollout": {"temperature": temp, "top_p": top_p, "min_replicas": lo, "replicas": lo,
                    "max_replicas": lo + extra}}})
    assert parse_job(dump_job(job)) == job


REDIS = GOOD + "  history: {store: redis, redis_url: 'URL'}\n"
SECRET = "s3cret-pw"


@pytest.mark.parametrize(("url", "reason"), [
    ("http://r:6379/0", "expected redis://host:port/db"),
    ("REDIS://r:6379/0", "expected redis://host:port/db"),
    ("r:6379", "expected redis://host:port/db"),
    ("redis://r:70000/0", "port must be a number from 1 to 65535"),
    ("redis://r:0/0", "port must be a number from 1 to 65535"),
    ("redis://r:63x79/0", "port must be a number from 1 to 65535"),
    ("redis:///0", "no host"),
    ("redis://r$/0", "not a host name"),
    ("redis://r:6379/abc", "the database goes after the host as /N"),  # redis-py reads db 0
    ("redis://r:6379/1/2", "the database goes after the host as /N"),  # redis-py reads db 12
    ("redis://r:6379/-1", "the database goes after the host as /N"),
    ("redis://r:6379/0?socket_timeout=1", "query parameter 'socket_timeout' is not one rhymerl passes on"),
    ("redis://r:6379/0?db=3", "query parameter 'db' is not one rhymerl passes on"),
    ("rediss://r:6379/0?ssl_cert_reqs=maybe", "takes one of none, optional, required"),
    ("unix://r/tmp/redis.sock", "a unix URL names no host"),
    ("unix:///tmp/redis.sock?db=x", "database number must be a non-negative integer"),
    ("redis://r:6379/0#frag", "fragment"),
    ("redis://r :6379/0", "spaces or control characters"),
])
def test_a_redis_url_redis_py_would_misread_or_fail_on_is_refused_naming_the_field(url: str, reason: str) -> None:
    found = problems_of(REDIS.replace("URL", url))
    assert list(found) == ["spec.history.redis_url"] and reason in found["spec.history.redis_url"]


@pytest.mark.parametrize("url", ["redis://r", "redis://rhymerl-redis.ns.svc:6379/15", "redis://[::1]:6379/0",
                                 "redis://reader@r:6379/0", "rediss://r:6380/1?ssl_cert_reqs=required",
                                 "unix:///run/redis.sock?db=2"])
def test_a_well_formed_redis_url_is_accepted(url: str) -> None:
    assert parse_job(REDIS.replace("URL", url)).spec.history.redis_url == url


@pytest.mark.parametrize("url", [f"redis://:{SECRET}@r:6379/0", f"redis://reader:{SECRET}@r:6379/0",
                                 f"rediss://u:{SECRET}@r/0?ssl_cert_reqs=none", f"unix://:{SECRET}@/run/redis.sock",
                                 f"http://:{SECRET}@r/0"])
def test_a_password_in_the_redis_url_is_refused_saying_where_it_goes_and_never_echoed(url: str) -> None:
    for text, sets in ((REDIS.replace("URL", url), []), (GOOD, ["history.store=redis", f"history.redis_url={url}"]),
                       (GOOD, [f"history.redis_url:{url}"])):  # a typo: '=' written ':'
        with pytest.raises(SpecError) as info:
            parse_job(text, "job.yaml", sets)
        assert SECRET not in str(info.value) and SECRET not in repr(info.value.problems)
        assert SECRET not in str(info.value.__cause__ or "")  # pydantic's own message: no input_value
    found = problems_of(REDIS.replace("URL", url))
    if url.startswith("http"):
        return
    assert "history.redis_password_secret" in found["spec.history.redis_url"]
    assert "RHYMERL_REDIS_PASSWORD" in found["spec.history.redis_url"]


@pytest.mark.parametrize(("url", "reason"), [
    (f"redis://r:6379/0?password={SECRET}", "a password does not go in the URL"),
    (f"rediss://r/0?ssl_cert_reqs=none&auth_token={SECRET}", "a password does not go in the URL"),
    (f"redis://r:6379/0#{SECRET}", "fragment"),
    (f"redis://r:6379/{SECRET}", "the database goes after the host as /N"),
    (f"redis://r/{SECRET}?db=1", "query parameter 'db' is not one rhymerl passes on"),
])
def test_a_credential_in_a_redis_urls_query_fragment_or_path_is_refused_and_never_echoed(url: str, reason: str) -> None:
    for text, sets in ((REDIS.replace("URL", url), []), (GOOD, ["history.store=redis", f"history.redis_url={url}"])):
        with pytest.raises(SpecError) as info:
            parse_job(text, "job.yaml", sets)
        [problem] = info.value.problems
        assert problem.path == "spec.history.redis_url" and reason in problem.reason
        assert SECRET not in str(info.value) and SECRET not in str(info.value.__cause__ or "")


def test_a_refused_spec_is_not_echoed_by_pydantic_even_for_a_problem_of_another_block() -> None:
    from pydantic import ValidationError

    doc = {"spec": {"history": {"store": "redis", "redis_url": f"redis://:{SECRET}@r/0"},
                    "data": {"min_ops": 9, "median_ops": 3}}}  # a whole-block check: pydantic echoes the block
    with pytest.raises(ValidationError) as info:
        RLJob.model_validate(doc)
    assert SECRET not in str(info.value)


def test_freed_drafters_on_vllm_need_a_method_rhymerls_proposer_runs_inside_vllm() -> None:
    sets = ["rollout.engine=vllm", "rollout.speculation.freed_drafters=true"]
    assert parse_job(GOOD, overrides=sets).spec.rollout.speculation.freed_drafters
    assert problems_of(GOOD + "  rollout: {engine: vllm, speculation: {freed_drafters: true, method: ngram}}\n") == {
        "spec.rollout.speculation": "freed_drafters on vLLM needs method history or fastest-of-n (rhymerl's "
                                    "proposer verifies the freed drafters' drafts inside vLLM)"}


def test_a_draft_model_is_required_only_where_the_policy_has_no_embedded_one() -> None:
    assert parse_job(GOOD, overrides=["rollout.speculation.method=draft-model"]).spec.rollout.speculation.draft_model \
        == "builtin:tiny-arith-draft"
    assert problems_of(GOOD + "  model: {path: /models/m}\n  rollout: {speculation: {freed_drafters: true}}\n") == {
        "spec.rollout.speculation.draft_model": "required when freed_drafters is true (what the freed workers draft "
                                                "with) (model.path /models/m has no embedded draft model)"}

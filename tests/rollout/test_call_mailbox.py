"""What a running rollout call hears between passes (workers/roles/call_mailbox.py), and the
abilities the fleet can read from a spec without starting an engine (workers/roles/rollout_engine.py)."""

from __future__ import annotations

from jobs import make_job

from rhymerl.workers.roles.call_mailbox import CallMailbox
from rhymerl.workers.roles.rollout_engine import TORCH, VLLM, engine_abilities
from rhymerl.workers.roles.samples import SampleRef
from rhymerl.workers.roles.torch_rollout import TorchRollout
from rhymerl.workers.roles.vllm_rollout import VllmRollout
from rhymerl.workers.rollout.generation import GenRequest

A, B = SampleRef("p", 0, 1), SampleRef("p", 1, 1)


def _request(prompt_len: int) -> GenRequest:
    return GenRequest(list(range(prompt_len)), 0, "p")


def test_requests_for_a_call_that_ended_or_never_ran_are_ignored() -> None:
    box = CallMailbox()
    box.release(3, [A])
    box.open(4, max_prompt=8)
    box.release(3, [B])
    box.hear(3, [])
    assert not box.admit(3, [A], [_request(2)], None)
    box.draft_from(3, None)
    mail = box.collect()
    assert mail.release == set() and mail.admitted == [] and mail.link == [] and not mail.leaving


def test_a_collection_takes_what_arrived_once_and_a_notice_to_leave_stays() -> None:
    box = CallMailbox()
    box.open(1, max_prompt=8)
    box.release(1, [A])
    box.draft_from(1, None)
    box.leave()
    first, second = box.collect(), box.collect()
    assert first.release == {A} and first.link == [None] and first.leaving
    assert second.release == set() and second.link == [] and second.leaving


def test_an_admit_is_refused_past_the_calls_cache_or_once_leaving_and_a_call_with_admits_stays_open() -> None:
    box = CallMailbox()
    box.open(1, max_prompt=4)
    assert not box.admit(1, [A], [_request(5)], None)  # its KV cache was sized for prompts of 4
    assert box.admit(1, [A], [_request(4)], None)
    assert not box.close_unless_admitted() and not box.idle
    assert [s for s, _, _ in box.collect().admitted] == [A]
    assert box.close_unless_admitted() and box.idle
    box.open(2, max_prompt=0)  # a call that admits nothing (vLLM's)
    assert not box.admit(2, [B], [_request(1)], None)
    box.leave()
    box.open(3, max_prompt=8)
    assert not box.admit(3, [B], [_request(1)], None)


def test_a_notice_to_leave_says_whether_the_worker_is_idle() -> None:
    box = CallMailbox()
    assert box.notice()
    box.open(1, max_prompt=4)
    assert not box.notice() and box.leaving


def test_the_abilities_read_from_a_spec_are_those_its_engine_declares() -> None:
    assert engine_abilities(make_job("rollout.engine=torch", base="defaults").spec) == TorchRollout.abilities == TORCH
    assert engine_abilities(make_job("rollout.engine=vllm", base="defaults").spec) == VllmRollout.abilities == VLLM
    assert VLLM.releases and VLLM.remote_drafts and not (VLLM.admits or VLLM.snapshots or VLLM.relays_groups)
    assert TORCH.releases and TORCH.admits and TORCH.snapshots and TORCH.remote_drafts and TORCH.relays_groups

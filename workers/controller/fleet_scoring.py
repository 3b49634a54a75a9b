"""Scoring a rollout fleet's calls: each call's output goes to a reward worker; a reward worker that
dies scores again (RERUNS times at most), and an output that died with its rollout worker before
it was scored has its call run again."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rhymerl.workers.controller.fleet_records import RERUNS, Call, Calls, Round, WorkerLost
from rhymerl.workers.controller.role_apis import RewardAPI
from rhymerl.workers.controller.transport import Handle, ResultLost, Transport, WorkerGone


class Scoring:
    """The reward workers' side of a round."""

    def __init__(self, transport: Transport, reward: Sequence[Handle[RewardAPI]], calls: Calls,
                 restart: Callable[[Call], None], note: Callable[[str], None]) -> None:
        """restart: a call whose output died runs again."""
        self.transport, self.reward, self.calls, self.restart, self.note = transport, reward, calls, restart, note

    def score(self, call: Call) -> None:
        reward = self.reward[call.id % len(self.reward)]
        assert call.output is not None, "scored before its output came"
        call.scored, call.summary = self.transport.call2(reward, RewardAPI.score, self.transport.arg(call.output),
                                                         call.round.step)

    def summaries(self, rnd: Round) -> bool:
        """Every call's summary into `rnd.summaries`; a reward worker that died scores again. False if
        a call's output died with its worker before it was scored: that call runs again."""
        out = []
        for c in rnd.calls:
            if c.output is None:
                continue
            for attempt in range(RERUNS + 1):
                try:
                    assert c.summary is not None, "a call's output is scored as it comes"
                    summary = self.transport.get(c.summary)
                    break
                except ResultLost:
                    self.restart(c)
                    return False
                except WorkerGone as exc:
                    if attempt == RERUNS:
                        raise WorkerLost(f"step {rnd.step}: scoring rollout worker {c.member.id}'s samples failed "
                                         f"{attempt + 1} times: {exc}") from exc
                    self.calls.reruns += 1
                    self.note(f"step {rnd.step}: a reward worker died; scoring rollout worker {c.member.id}'s "
                              f"{len(c.samples)} samples again")
                    self.transport.wait_alive(self.reward[c.id % len(self.reward)])
                    self.score(c)
            out.append((c, summary))
        rnd.summaries = out
        return True

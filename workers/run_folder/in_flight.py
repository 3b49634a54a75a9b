"""What a pipelined run had in flight when it saved a checkpoint, so that a resume re-creates it.

At `max_off_policy_steps >= 1` rollout runs ahead of training: when step n is checkpointed the
next step's first round was already launched with the policy version before step n's update, and
outliers deferred by HistoPipe's inter-step migration keep the version their group started with.
Tokens are a pure function of the weights, the seed and (sample, position), so a resume that
starts the same groups with the same versions' weights generates the same tokens as the run that
was not interrupted. The checkpoint keeps this record in `extra.json` and the weights of every
version in it other than its own (`in_flight_vN.weights`: safetensors under a name that vLLM and
transformers, which load every `*.safetensors` of a model folder, leave alone).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GroupKey = tuple[int, str]


@dataclass(frozen=True)
class InFlight:
    """ahead: the policy version of the round started ahead for the next step (its prompts are that
    step's first; None: none was); groups: groups left open (epoch, prompt) -> the version they
    started with; a resume generates them again, whole, in its first round."""

    ahead: int | None = None
    groups: Mapping[GroupKey, int] | None = None

    def open_groups(self) -> dict[GroupKey, int]:
        return dict(self.groups or {})

    def versions(self) -> set[int]:
        """Every policy version the record needs."""
        return set(self.open_groups().values()) | ({self.ahead} if self.ahead is not None else set())

    def to_json(self) -> dict[str, Any]:
        return {"ahead_version": self.ahead,
                "open_groups": [[epoch, pid, v] for (epoch, pid), v in self.open_groups().items()]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], version: int) -> InFlight:
        """Read a checkpoint's record; `version`: the checkpoint's own policy version, which the
        groups of a record written before versions were kept ([epoch, prompt] pairs) take."""
        ahead = data.get("ahead_version")
        if ahead is not None and (not isinstance(ahead, int) or isinstance(ahead, bool) or ahead < 0):
            raise ValueError(f"ahead_version: {ahead!r} is not a policy version")
        raw = data.get("open_groups", [])
        if not isinstance(raw, list):
            raise ValueError("open_groups: not a list")
        groups: dict[GroupKey, int] = {}
        for entry in raw:
            if not isinstance(entry, list) or len(entry) not in (2, 3) or not isinstance(entry[0], int):
                raise ValueError(f"open_groups: {entry!r} is not [epoch, prompt_id, policy_version]")
            v = entry[2] if len(entry) == 3 else version
            if not isinstance(v, int) or v < 0:
                raise ValueError(f"open_groups: {entry!r} has no valid policy version")
            groups[(entry[0], str(entry[1]))] = v
        return cls(ahead, groups)

    @staticmethod
    def weights_file(version: int) -> str:
        return f"in_flight_v{version}.weights"  # safetensors, named so no loader of the folder takes it for the model


NOTHING = InFlight()


def carried(versions: Sequence[int], current: int) -> list[int]:
    """The versions a checkpoint of policy version `current` keeps weights for, in order."""
    return sorted(set(versions) - {current})

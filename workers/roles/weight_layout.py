"""What a weight transfer (roles/weight_sync.py) is, as plain records: its members (`Group`) and what it
carries (`Layout`). No torch here, so the role APIs and the step loop's side name them without loading it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torch import Tensor


@dataclass(frozen=True)
class Layout:
    """What a transfer carries: each distinct tensor's name, shape and dtype, in order, and the
    names that share another's tensor (a tied output layer)."""

    tensors: tuple[tuple[str, tuple[int, ...], str], ...]
    aliases: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, weights: Mapping[str, Tensor]) -> Layout:
        seen: dict[int, str] = {}
        tensors, aliases = [], []
        for name, t in weights.items():
            first = seen.setdefault(t.data_ptr(), name)
            if first != name:
                aliases.append((name, first))
            else:
                tensors.append((name, tuple(t.shape), str(t.dtype).removeprefix("torch.")))
        return cls(tuple(tensors), tuple(aliases))


@dataclass(frozen=True)
class Group:
    """One transfer's members: the sender's store, the group's id (one transfer's, never used again),
    how many members (rank 0 sends)."""

    host: str
    port: int
    group_id: str
    size: int

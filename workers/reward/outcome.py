"""What one reward call came to, and when a step's failures are too many to go on (pure logic).

A reward function's failure on one sample (it raised, hung, returned something that is not a
finite number, or took its worker process down) costs that sample `reward.failure_reward`, and the
reason is kept with the sample (`reward_error` in the rollout dump); the run stops only when more
than `reward.max_failed_fraction` of a step's samples failed.

Accepted results: any real number (`numbers.Real`: int, float, numpy scalars) that is finite.
A bool counts as 1.0 / 0.0: Python treats it as an int, and verifiers such as math-verify's
`verify()` return one, so `return verify(gold, pred)` is a natural reward function.
"""

from __future__ import annotations

import math
import numbers
import reprlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rhymerl.workers.reward.verifiers import RewardError

if TYPE_CHECKING:  # reward workers import this module; they need no pydantic
    from rhymerl.api.services import RewardSpec

_MAX_REASON = 300


@dataclass(frozen=True)
class Outcome:
    """One reward call: the reward, and why the call failed (None when it scored)."""

    value: float
    error: str | None = None
    # the nan or inf the function returned (algorithm.on_nonfinite decides); not part of equality
    nonfinite: float | None = field(default=None, compare=False)


def judge(result: object, failure_reward: float) -> Outcome:
    """The outcome of a call that returned `result`."""
    if isinstance(result, numbers.Real):
        try:
            value = float(result)
        except (OverflowError, TypeError, ValueError):
            return Outcome(failure_reward, f"returned {_short(result)} ({type(result).__name__}), not a float")
        if math.isfinite(value):
            return Outcome(value)
        return Outcome(failure_reward, f"returned {value}", nonfinite=value)
    if result is None:
        return Outcome(failure_reward, "returned None, not a number")
    return Outcome(failure_reward, f"returned {_short(result)} ({type(result).__name__}), not a number")


def raised(exc: BaseException, failure_reward: float) -> Outcome:
    """The outcome of a call that raised `exc`."""
    try:
        message = " ".join(str(exc).split())
    except Exception:
        message = ""
    reason = f"raised {type(exc).__name__}: {message}" if message else f"raised {type(exc).__name__}"
    return Outcome(failure_reward, reason if len(reason) <= _MAX_REASON else reason[:_MAX_REASON - 3] + "...")


def check_failures(errors: Sequence[str | None], spec: RewardSpec, step: int, dump: Path) -> None:
    """RewardError when more than `spec.max_failed_fraction` of a step's samples failed."""
    failed = [e for e in errors if e is not None]
    if not failed or len(failed) <= spec.max_failed_fraction * len(errors):
        return
    name = f"spec.reward.function '{spec.function}'" if spec.function else f"spec.reward.verifier '{spec.verifier}'"
    raise RewardError(
        f"{name} failed on {len(failed)} of {len(errors)} samples in step {step}, more than "
        f"spec.reward.max_failed_fraction ({spec.max_failed_fraction:g}); first: {failed[0]}; "
        f"the reward_error of every sample is in {dump}")


def _short(value: object) -> str:
    return " ".join(reprlib.repr(value).split())

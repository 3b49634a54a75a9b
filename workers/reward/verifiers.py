"""Built-in verifiers and loading of user reward functions.

A user function is named ``module:function`` in the spec and called as
``fn(prompt: str, response: str, answer: str) -> float``. It is imported once when the job starts,
so a typo fails the job at once, not after the first rollout.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable

from rhymerl.api.spec import RewardSpec

RewardFn = Callable[[str, str, str], float]


def final_answer(response: str, answer: str) -> float:
    """1.0 when the text after the last '=' on the response's last non-empty line equals `answer`."""
    lines = [ln for ln in response.strip().splitlines() if ln.strip()]
    if not lines or "=" not in lines[-1]:
        return 0.0
    return 1.0 if lines[-1].rsplit("=", 1)[1].strip() == answer.strip() else 0.0


def _final_answer_fn(prompt: str, response: str, answer: str) -> float:
    return final_answer(response, answer)


BUILTIN: dict[str, RewardFn] = {"final-answer": _final_answer_fn}


def load_user_function(ref: str) -> RewardFn:
    module_name, _, attr = ref.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"reward.function: cannot import module '{module_name}': {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise ValueError(f"reward.function: '{module_name}' has no callable '{attr}'")
    try:
        inspect.signature(fn).bind("prompt", "response", "answer")
    except TypeError as exc:
        raise ValueError(f"reward.function: '{ref}' must accept (prompt, response, answer): {exc}") from exc
    return fn


def reward_function(spec: RewardSpec) -> RewardFn:
    if spec.function is not None:
        return load_user_function(spec.function)
    assert spec.verifier is not None
    return BUILTIN[spec.verifier]

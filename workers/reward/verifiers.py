"""Built-in verifiers and loading of user reward functions.

A user function is named ``module:function`` in the spec and called as
``fn(prompt: str, response: str, answer: str) -> float``. The job imports it once in the
controller before any rollout, so a typo fails the job at once; the reward workers that call it
(pool.py) import it again themselves.
"""

from __future__ import annotations

import importlib
import inspect
import re
from collections.abc import Callable
from typing import cast

from rhymerl.errors import UserError

RewardFn = Callable[[str, str, str], float]


class RewardError(UserError):
    """A reward function that cannot be loaded, or that failed on too many of a step's samples."""


def final_answer(response: str, answer: str) -> float:
    """1.0 when the text after the last '=' on the response's last non-empty line equals `answer`."""
    lines = [ln for ln in response.strip().splitlines() if ln.strip()]
    if not lines or "=" not in lines[-1]:
        return 0.0
    return 1.0 if lines[-1].rsplit("=", 1)[1].strip() == answer.strip() else 0.0


def _final_answer_fn(prompt: str, response: str, answer: str) -> float:
    return final_answer(response, answer)


BOX_OPEN = "\\boxed{"
THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d+)?")
WHOLE_FLOAT = re.compile(r"-?\d+\.0+")


def last_boxed(text: str) -> str | None:
    """The content of the last `\\boxed{...}` that closes, braces balanced (a box inside it is part of it)."""
    found: str | None = None
    start = text.find(BOX_OPEN)
    while start != -1:
        depth, i = 1, start + len(BOX_OPEN)
        while i < len(text) and depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        if depth:  # never closed: a box opened inside it may still close
            start = text.find(BOX_OPEN, start + len(BOX_OPEN))
            continue
        found = text[start + len(BOX_OPEN):i - 1]
        start = text.find(BOX_OPEN, i)
    return found


def normalise_answer(text: str) -> str:
    """Spaces, dollar signs, thousands commas, a leading '+' and a trailing '.0' removed."""
    s = "".join(text.replace("\\$", "").replace("$", "").split())
    if THOUSANDS.fullmatch(s):
        s = s.replace(",", "")
    s = s.removeprefix("+")
    if WHOLE_FLOAT.fullmatch(s):
        s = s.partition(".")[0]
    return s


def boxed(response: str, answer: str) -> float:
    """1.0 when the last `\\boxed{}` of the response holds `answer` (both normalised); no box: 0.0."""
    content = last_boxed(response)
    if content is None:
        return 0.0
    return 1.0 if normalise_answer(content) == normalise_answer(answer) else 0.0


def _boxed_fn(prompt: str, response: str, answer: str) -> float:
    return boxed(response, answer)


BUILTIN: dict[str, RewardFn] = {"final-answer": _final_answer_fn, "boxed": _boxed_fn}


def load_user_function(ref: str) -> RewardFn:
    """Import `module:function` and check it takes (prompt, response, answer); RewardError if not."""
    module_name, _, attr = ref.partition(":")
    where = f"spec.reward.function '{ref}'"
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise RewardError(f"{where}: cannot import module '{module_name}': {exc}") from exc
    except Exception as exc:
        raise RewardError(f"{where}: importing '{module_name}' raised {type(exc).__name__}: {exc}") from exc
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise RewardError(f"{where}: module '{module_name}' has no callable '{attr}'")
    try:
        inspect.signature(fn).bind("prompt", "response", "answer")
    except TypeError as exc:
        raise RewardError(f"{where}: must accept (prompt, response, answer): {exc}") from exc
    except ValueError:
        pass  # a builtin without a signature: it is called as it is
    return cast(RewardFn, fn)


def check_user_function(ref: str) -> str | None:
    """`rhymerl validate`'s check of a reward function: what `load_user_function` refuses is an
    error, except a module that is not on this machine at all (a cluster image may hold it): that
    check is left out, and the returned note says so."""
    module_name = ref.partition(":")[0]
    try:
        load_user_function(ref)
    except RewardError as exc:
        missing = exc.__cause__.name if isinstance(exc.__cause__, ModuleNotFoundError) else None
        if missing is not None and (module_name == missing or module_name.startswith(missing + ".")):
            return f"reward.function: module '{module_name}' is not importable here"
        raise
    return None

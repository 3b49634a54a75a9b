"""The cluster example's reward function (examples/cluster.yaml: reward.function my_rewards:math_verify).

It reaches the pods in a ConfigMap (`kubectl create configmap math-grpo-files --from-file=
examples/math-grpo/`) mounted at /opt/math-grpo, which the job puts on PYTHONPATH.
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = r"-?\d+(?:\.\d+)?(?:/\d+)?"
_BOXED = re.compile(r"\\boxed\{\s*(" + _NUMBER + r")\s*\}")
_LAST = re.compile(_NUMBER)


def _value(text: str) -> Fraction | None:
    try:
        return Fraction(text.replace(",", ""))
    except (ValueError, ZeroDivisionError):
        return None


def final_number(response: str) -> Fraction | None:
    """The answer a response gives: its last \\boxed{...}, else the last number in it."""
    boxed = _BOXED.findall(response)
    if boxed:
        return _value(boxed[-1])
    found = _LAST.findall(response.replace(",", ""))
    return _value(found[-1]) if found else None


def math_verify(prompt: str, response: str, answer: str) -> float:
    """1.0 when the response's final number equals the answer (as exact fractions), else 0.0."""
    given, expected = final_number(response), _value(answer)
    return 1.0 if given is not None and given == expected else 0.0

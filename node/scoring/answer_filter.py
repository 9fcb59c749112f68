"""A cheap look at an answer before a symbolic scorer parses it: refuse obvious compute bombs.

math-verify and reasoning-gym's sympy-based scorers evaluate what they parse: `9**9**9**9` is one
big-integer power inside a C call that never releases the GIL. The scorer sandbox
(node/scoring/sandbox.py) kills such calls at their deadline, but every kill costs a worker restart;
this filter refuses the obvious ones in microseconds. It only has to be right on honest answers
(none of these shapes is an answer to a task a node trains on); anything it misses, the deadline
catches.
"""
from __future__ import annotations

import re

MAX_NESTING = 16        # brackets of any kind, nested
MAX_OPERATORS = 64      # + - * / ^ ! %
MAX_DIGITS = 256        # digits in the whole answer
_EXPONENT = r"(?:\*\*|\^)"
# An exponent whose own exponent is another power: a**b**c, a^{b^c}, a^(b**c).
_TOWER = re.compile(_EXPONENT + r"\s*(?:[-+]?[\w.]+\s*" + _EXPONENT + r"|[({][^)}]*" + _EXPONENT + r")")
_HUGE_EXPONENT = re.compile(_EXPONENT + r"\s*[({]?\s*[-+]?\d{6,}")  # x ** 100000 and beyond
_HUGE_FACTORIAL = re.compile(r"\d{5,}\s*[)}]?\s*!")                  # 10000! and beyond
_OPERATORS = re.compile(r"\*\*|[-+*/^!%]")


def bomb_reason(answer: str) -> str | None:
    """Why `answer` is refused before any scorer sees it, or None when it may be scored."""
    if _TOWER.search(answer):
        return "power_tower"
    if _HUGE_EXPONENT.search(answer):
        return "huge_exponent"
    if _HUGE_FACTORIAL.search(answer):
        return "huge_factorial"
    if _nesting_depth(answer) > MAX_NESTING:
        return "nesting_depth"
    if len(_OPERATORS.findall(answer)) > MAX_OPERATORS:
        return "operator_count"
    if sum(c.isdigit() for c in answer) > MAX_DIGITS:
        return "digit_count"
    return None


def _nesting_depth(text: str) -> int:
    depth = deepest = 0
    for char in text:
        if char in "([{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in ")]}":
            depth = max(0, depth - 1)
    return deepest

"""The rule that decides a compare's verdict: :class:`Rule`. No torch, no numpy.

``Rule.JUDGE`` is ``compare()``'s default judgement (every call replayed against a float64 oracle;
the step fails on a root cause or unusable data); ``Rule.PTDBG`` and ``Rule.DTYPE`` are the
per-tensor threshold rules of ``comparison/verdict.py``, which also fill the CSV's ``Accuracy
Reached or Not`` (ptdbg's rule under the judgement).
"""
from __future__ import annotations

from typing import Union

from pytest_ptdbg.runtime.text import TextEnum

__all__ = ["Rule", "parse_rule"]


class Rule(TextEnum):
    """A verdict rule; a ``str`` enum (``Rule.JUDGE == "judge"``), written and repr'd as its value."""

    JUDGE = "judge"
    PTDBG = "ptdbg"
    DTYPE = "dtype"

    def __repr__(self) -> str:   # messages say rule='dtype', as they did for the plain string
        return repr(self.value)

    @property
    def row_rule(self) -> "Rule":
        """The per-tensor rule that fills ``Accuracy Reached or Not``: ptdbg's under the judgement."""
        return Rule.PTDBG if self is Rule.JUDGE else self


def parse_rule(value: Union["Rule", str, None], allowed: tuple = tuple(Rule)) -> Rule:
    """``value`` as a :class:`Rule` (``None``: ``Rule.JUDGE``); ValueError names the allowed values."""
    if value is None:
        value = Rule.JUDGE
    try:
        rule = Rule(value)
    except ValueError:
        rule = None
    if rule is None or rule not in allowed:
        raise ValueError(f"unknown verdict rule {value!r}; choose one of "
                         f"{tuple(str(r.value) for r in allowed)}")
    return rule

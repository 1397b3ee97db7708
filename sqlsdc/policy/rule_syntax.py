"""Syntax of primary suppression rules (``freq:3``, ``nk:2,85``, ``p:10``, ``pq:25,50``).

Shared by the policy's ``rules:`` (checked when a policy is validated) and ``sqlsdc protect
--rule``; :func:`sqlsdc.tabular.rules.parse_rule` builds the rule objects.
"""

from __future__ import annotations

import math

RULE_FIELDS = {
    "freq": ("min_freq", "safety_range"),
    "nk": ("n", "k"),
    "p": ("p",),
    "pq": ("p", "q"),
}
RULE_USAGE = {"freq": "freq:3 or freq:3,30", "nk": "nk:2,85", "p": "p:10", "pq": "pq:25,50"}


def rule_arguments(text: str) -> tuple[str, dict]:
    """The rule name and its keyword arguments; ValueError naming the rule and a remedy.

    Every rule states its numbers (``freq`` alone is refused, not read as a default), and they
    must protect something: ``freq:N`` with an integer N >= 1, ``nk:N,K`` with N >= 1 and
    0 < K <= 100, ``p:P`` with 0 < P <= 100, ``pq:P,Q`` with 0 < P <= Q <= 100, a safety range
    in [0, 100].

    Example:
        >>> rule_arguments("nk:2,85")
        ('nk', {'n': 2, 'k': 85.0})
    """
    name, _, numbers = text.strip().partition(":")
    if name not in RULE_FIELDS:
        raise ValueError(f"unknown rule {text!r}; use one of freq:N, nk:N,K, p:P, pq:P,Q")
    fields, usage = RULE_FIELDS[name], RULE_USAGE[name]
    try:
        values = [float(v) for v in numbers.split(",")] if numbers else []
    except ValueError:
        raise ValueError(f"rule {text!r}: parameters must be numbers, e.g. {usage}") from None
    required = 2 if name in ("nk", "pq") else 1
    if not required <= len(values) <= len(fields):
        counts = f"{required}" if required == len(fields) else f"{required} or {len(fields)}"
        raise ValueError(
            f"rule {text!r} needs {counts} number(s) ({', '.join(fields)}), e.g. {usage}"
        )
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"rule {text!r}: parameters must be finite numbers, e.g. {usage}")
    kwargs = dict(zip(fields, values, strict=False))
    for field in ("min_freq", "n"):
        if field in kwargs:
            if kwargs[field] < 1 or kwargs[field] != int(kwargs[field]) or kwargs[field] > 10**6:
                raise ValueError(f"rule {text!r}: N must be an integer >= 1, e.g. {usage}")
            kwargs[field] = int(kwargs[field])
    percents = {f: v for f, v in kwargs.items() if f in ("k", "p", "q")}
    if any(not 0 < v <= 100 for v in percents.values()):
        raise ValueError(f"rule {text!r}: percentages must be above 0 and at most 100")
    if name == "pq" and kwargs["p"] > kwargs["q"]:
        raise ValueError(f"rule {text!r}: p must not exceed q, e.g. {usage}")
    if not 0 <= kwargs.get("safety_range", 0) <= 100:
        raise ValueError(f"rule {text!r}: the safety range is a percentage in [0, 100]")
    return name, kwargs

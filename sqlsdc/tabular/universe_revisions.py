"""Revisions of a suppression universe (:mod:`sqlsdc.tabular.universe_pattern`): a cell the
earlier pattern published with another value is a release of the units that changed since.

An analyst keeps the answers of the query path as jobs' readers keep versions. After new data a
cell published before and now gives its change, the contribution of the units that entered,
left or were revised: red team s43e, on the 20,000-person suppression demo, one new enterprise
of turnover 777,777 in (A, R02) moved the count of (A, R02), (A, Total), (Total, R02) and the
grand total by 1 and their turnover by exactly 777,777 (two queries); one of turnover 0 moved
the counts by 1 beside the unchanged, published turnover, telling a firm of turnover 0 had
entered the cell (the query path's case of red team s42l's ``revision (n)`` for jobs). The
difference table is a table of its own and its sensitive cells are protected in the new
version (Hundepool et al. 2012, *Statistical Disclosure Control*, 4.5 "linked tables"), the
earlier published values being constants its readers hold, so an interval of the new value is
the same interval of the difference (:mod:`sqlsdc.jobs.revisions` for jobs).

Jobs keep each unit's contribution per version and apply the rules to the difference
population. The query path keeps only the earlier pattern, so it bounds that population from
the cell values alone and fails closed where the bound cannot show the difference safe:

- a count's difference ``d`` counts at least ``|d|`` units that entered or left, so it passes a
  unit frequency rule ``freq:m`` when ``|d| >= m``; below that (one firm more), or under a rule
  of another kind, the cell is a primary with the rule's level on ``|d|``. Readers keep every
  version, so ``d`` is taken from each value any earlier pattern published (``<count>__seen``
  in the stored pattern): four firms in (+4) and three out (-3) were both published, and the
  first and third versions differed by one firm (red team s43e);
- a sum's difference may be one unit's change beside any number of unchanged or offsetting
  contributions, which no cell value bounds: every changed sum is a primary, with the largest
  frequency safety range (30 % without one) of ``|d|``, at least 1, as jobs without kept units
  do (:func:`sqlsdc.jobs.revisions.unknown_revisions`);
- a sum published before whose cell's unit count changed is revised even when its value did
  not: published unchanged (as known) beside the hidden count, it told that the units that
  entered had turnover 0 or NULL, and where (red team s43k: one firm, two queries). Its level
  is 1, the least any revised sum gets.

A cell published before with the value it has now is known, not revised
(:func:`~sqlsdc.tabular.universe_pattern._carried_over` forces it published; a sum only where
its cell's unit count did not change), and a cell hidden
for a revision stays hidden in later patterns as every suppression does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from sqlsdc.tabular.rules import FrequencyRule, RuleResult

REVISION = "revision"


@dataclass(frozen=True)
class Revised:
    """A primary rule of the new pattern: the cells whose change since the earlier pattern
    fails the rules, with their levels on that change."""

    cells: np.ndarray
    level: np.ndarray
    name: str = REVISION

    def evaluate(self, stats) -> RuleResult:
        return RuleResult(self.cells.copy(), self.level.copy(), self.level.copy())


def revision_rule(
    counts: bool,
    rules,
    values: np.ndarray,
    before,
    seen: list[list[float]] | None = None,
    moved: np.ndarray | None = None,
) -> Revised | None:
    """The revision rule of one aggregate (``counts``: the unit counts, else a measure's sums)
    under its ``rules``, for the table's ``values`` now and the earlier pattern ``before``
    (``value`` and ``status`` per cell, aligned; None when there is none), or None when no
    published cell changed. ``seen``: per cell, every value published before
    (:func:`seen_values`); a count's change is its smallest non-zero one from them.
    ``moved``: for a sum, the cells whose unit count changed (:func:`count_changes`): their sum
    published before is revised even when unchanged, a change of 0 (its level at least 1)."""
    if before is None:
        return None
    values = np.asarray(values, dtype=float)
    if seen is not None:
        changed, change = _smallest_changes(values, seen)
    else:
        old = before["value"].to_numpy(dtype=float)
        published = (before["status"].to_numpy(dtype=object) == "published") & ~np.isnan(old)
        same = np.isclose(np.where(published, old, 0.0), values, rtol=1e-12, atol=0.0)
        changed = published & ~same
        change = np.abs(np.where(changed, values - np.nan_to_num(old), 0.0))
        if moved is not None:
            # red team s43k: a firm of turnover 0 (or NULL) entering (A, R02) left its sums
            # published unchanged beside the revised counts, which told its cell and value
            changed = changed | (published & np.asarray(moved, dtype=bool))
    if not changed.any():
        return None
    frequency = [r for r in rules if isinstance(r, FrequencyRule)]
    if counts and frequency and len(frequency) == len(rules):
        return _counts(changed, change, frequency)
    ranges = [r.safety_range for r in frequency] or [30.0]
    return Revised(changed, np.where(changed, np.maximum(change * max(ranges) / 100.0, 1.0), 0.0))


def count_changes(values: np.ndarray, seen: list[list[float]]) -> np.ndarray:
    """Per cell, whether its unit count ``values`` differs from a value published before: units
    entered or left it, whatever its sums did."""
    return _smallest_changes(np.asarray(values, dtype=float), seen)[0]


def _counts(changed: np.ndarray, change: np.ndarray, rules: list[FrequencyRule]) -> Revised:
    """Counts under frequency rules only: at least ``|d|`` units changed, so a rule over units
    flags ``|d| < min_freq``; a rule over holdings cannot be bounded (many units, one holding)
    and flags every change."""
    hit, level = np.zeros(len(changed), dtype=bool), np.zeros(len(changed))
    for rule in rules:
        flags = changed & ((change < rule.min_freq) | (rule.level != "unit"))
        hit |= flags
        level = np.where(flags, np.maximum(level, change * rule.safety_range / 100.0), level)
    return Revised(hit, level)


def seen_values(before, count: int) -> list[list[float]]:
    """Per cell, the values the earlier patterns published: the stored ``seen`` list (patterns
    made before it was kept have none) and the last pattern's value where it was published."""
    if before is None:
        return [[] for _ in range(count)]
    out = []
    for value, status, seen in zip(before["value"], before["status"], before["seen"], strict=True):
        found = [float(v) for v in json.loads(seen)] if isinstance(seen, str) else []
        if status == "published" and value == value and float(value) not in found:
            found.append(float(value))
        out.append(found)
    return out


def with_published(seen: list[list[float]], values: np.ndarray) -> np.ndarray:
    """The ``seen`` lists with this pattern's published ``values`` (NaN where hidden), as the
    JSON text the stored pattern keeps."""
    out = np.empty(len(seen), dtype=object)
    for i, (found, value) in enumerate(zip(seen, values, strict=True)):
        kept = list(found)
        if value == value and float(value) not in kept:
            kept.append(float(value))
        out[i] = json.dumps(sorted(kept))
    return out


def _smallest_changes(values: np.ndarray, seen: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """Whether each cell differs from a value published before, and its smallest such
    difference (the one that tells the fewest units)."""
    changed, change = np.zeros(len(values), dtype=bool), np.zeros(len(values))
    for i, (value, found) in enumerate(zip(values, seen, strict=True)):
        moves = [abs(value - v) for v in found if not np.isclose(v, value, rtol=1e-12, atol=0.0)]
        if moves:
            changed[i], change[i] = True, min(moves)
    return changed, change

"""Two exact releases of a sum whose difference is a group of units the job's rules protect.

:mod:`sqlsdc.jobs.differencing` asks a difference of two exact releases of one table for the
minimum frequency of units only. A sum's difference tells more: red team s45f, the default
rules (``freq``, ``p:10``), a suppression job of all of R02's turnover and one of R02 without
activity J, each cell passing its rules, differed by J's 364,839,073 over 14 firms, 91 % of it
one firm's. The difference of two releases is a table of its own, and its cells are
protected by the job's rules (Hundepool et al. 2012, *Statistical Disclosure Control*, 4.5
"linked tables", as :mod:`sqlsdc.jobs.revisions` does for two versions of one output).

:func:`refuse_dominated_differences` takes every cell of the job or of an earlier exact release
of the same table and measure whose cover by the other's inner cells lacks units of it and
holds none outside it (:func:`sqlsdc.jobs.uncovered.dominated_cells`: one SQL per order of
the pair), so that the two values differ by exactly those units' sum, and applies the job's
primary rules to those units' contributions (per unit, after unit noise, as the job adds them
up; dominance and p% read their absolute values, as revisions do). A cell the rules flag
refuses the job. Differences on both sides (units lacking and units in excess) mix two groups
and are not looked at, as in the frequency check; with a third release that publishes the
other group they are (:mod:`sqlsdc.jobs.dominated_groups`, which this check calls).
"""

from __future__ import annotations

import numpy as np

from sqlsdc.errors import TabularError
from sqlsdc.jobs.dominated_groups import refuse_dominated_groups
from sqlsdc.jobs.exact_release import Release
from sqlsdc.jobs.uncovered import cell_text, dominated_cells
from sqlsdc.tabular.rules import CellStats, FrequencyRule, apply_rules, required_top_k


def refuse_dominated_differences(
    con, spec, others: list[Release], rules, label: str = "the job", *, error=None
) -> None:
    """Raise ``error`` (made from the message; :class:`TabularError` by default) when the sum
    job ``spec`` (its primary ``rules``; ``label`` names it) and one of ``others`` publish two
    values that differ by a group of units which ``rules`` flag as a primary cell. Count jobs
    and rules of frequency only are left to the frequency check."""
    error = error or TabularError
    if spec.measure is None or all(isinstance(r, FrequencyRule) for r in rules):
        return
    top_k = required_top_k(rules)
    for other in others:
        found = dominated_cells(con, spec, other, top_k)
        if not found:
            continue
        stats = CellStats(
            n=np.array([f[2] for f in found], dtype=np.int64),
            value=np.array([f[3] for f in found], dtype=np.float64),
            total=np.array([f[4] for f in found], dtype=np.float64),
            top=np.array([(f[5] + [0.0] * top_k)[:top_k] for f in found], dtype=np.float64),
        )
        result = apply_rules(stats, rules)
        hit = np.flatnonzero(result.primary)
        if hit.size:
            cell, side = found[hit[0]][:2]
            rule = result.rule[hit[0]]
            raise error(_message(spec, label, other.label, cell, side, rule))
    # three or more: a signed sum of them may isolate a group no pair does (red team s46b)
    refuse_dominated_groups(con, spec, others, rules, label, error=error)


def _message(spec, first: str, second: str, cell: dict, side: str, rule: str) -> str:
    named = cell_text(cell)
    holder, lacking = (first, second) if side == "a" else (second, first)
    return (
        f"{first} and {second} publish exact sums of {spec.measure} of {spec.table} that differ "
        f"by the units {holder} counts and {lacking} does not in a cell ({named}) of {holder}: "
        f"their difference is a cell of its own, and the rules of {first} ({rule}) flag it as "
        "primary (a few units dominate it). Protect both populations in one job (its cells "
        "and margins then hide it), or tabulate a population whose overlap with the other "
        "leaves no such group"
    )

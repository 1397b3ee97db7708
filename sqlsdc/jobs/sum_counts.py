"""A suppression job of a sum: its cells' unit counts audited with its sums.

A suppression job of a sum publishes, with each published cell's sum, the number of units it
adds up (``n``): the count a reader of a magnitude table expects (enterprises by nace x
region and their turnover), exact, and recorded in the ledger. The sums' pattern is audited
for the sums only: the attacker's LP over the published sums keeps every primary's safety
range, but the published counts are another table, whose margins and inner cells (each holds
a unit) bound a hidden count otherwise. Red team s38b: enterprises with 10 or more employees
by nace x region, the published ``n`` alone put (D, R02)'s 4 enterprises at most at 4 and (L,
R03)'s 5 in [1, 6], where the frequency rule's safety range (30 %) asks for an upper bound of
at least 5.2 and 6.5.

Decision: the counts are audited with the sums, as one pattern (:func:`audit_counts`), rather
than ``n`` left out of the release. A cell under a frequency rule is hidden because its count
is small; hiding only its sum while its count can be read back would leave the rule's purpose
half done, and publishing no ``n`` would take from readers the number of contributors that
statistical offices publish with magnitude tables (and that a count job of the same rows
publishes anyway, whose pattern the sum job keeps: :func:`sqlsdc.jobs.earlier_suppressions
.earlier_suppressions`). The count table of the job's cells (values ``n``, the a-priori
bound of a count: each inner cell holds a unit) gets the job's frequency rules, with every
cell the sums' pattern hides kept hidden (a primary of safety range 0); its secondary
suppression adds the cells the counts need. Hiding more cells never narrows a sum's interval,
but the sums' pattern is computed again with those cells kept hidden (its published
intervals ``lower_bound``/``upper_bound`` and secondaries are the sums'), until neither adds a
cell; then the counts are verified as the sums are. The query path's universe protects its
counts as a table of their own (``count`` aggregate) and publishes a measure's contributors
under the measure's pattern; a job holds one table, so its one pattern serves both.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np
import pandas as pd

from sqlsdc.errors import TabularError
from sqlsdc.jobs.tabulation import rated
from sqlsdc.tabular.model import Table
from sqlsdc.tabular.rules import FrequencyRule, ManualRule, apply_rules
from sqlsdc.tabular.universe_pattern import exempt_known, kind_of, suppression_pattern
from sqlsdc.tabular.verify import verify_suppression

ROUNDS = 4  # sums' pattern, counts' pattern, again: a pattern that still grows is refused


def count_table(table: Table) -> Table:
    """The job's table of sums (its ``n`` every unit of the cell, as published; not the sums'
    frequency count, :func:`sqlsdc.jobs.tabulation.rated`) as the table of its cells' unit
    counts (value ``n``)."""
    cells = table.cells.assign(value=table.cells["n"].astype(float))
    return dataclasses.replace(table, cells=cells, count=True, negative=False)


def audit_counts(
    table: Table,
    rules: list,
    result: pd.DataFrame,
    pattern: Callable[[list], pd.DataFrame],
    *,
    method: str,
    time_limit: float,
    forced: np.ndarray | None,
    revised=None,
    singleton: str = "anySumAudit",
) -> pd.DataFrame:
    """The sums' pattern ``result`` of ``table``, grown until the job's frequency rules
    (among ``rules``, also when :func:`~sqlsdc.tabular.universe_pattern.exempt_known` wrapped
    them) hold for its unit counts too; ``pattern(rules)`` computes the sums'
    pattern again with more primary ``rules`` (the cells the counts hide, of safety range
    0, named ``unit counts (n)``). ``forced``: cells published before with their sums
    (public), which the sums' pattern may not hide. ``revised``: the revision rule of the
    counts (:func:`sqlsdc.jobs.revisions.counts_of`), or None. ``singleton``: the job's
    GaussSuppression singleton method, for the counts' pattern too.

    A forced cell is known for its sum, not for its ``n``: one whose ``n`` fails ``revised``
    (red team s42i: a unit of turnover 0 joined it) is no forced cell of the counts' pattern,
    and when that pattern hides it, only its ``n`` is hidden (column :data:`N_HIDDEN` of the
    result, True there); its sum stays published.

    Raises:
        TabularError: the counts' pattern cannot be found, or the two patterns still grow
            after :data:`ROUNDS` rounds.
    """
    # the frequency rules, as given: a rule that exempts known cells keeps exempting them
    frequency = [rule for rule in rules if isinstance(kind_of(rule), FrequencyRule)]
    if revised is not None and revised.cells.any():
        frequency = [*frequency, revised]
    result = result.assign(**{N_HIDDEN: False})
    if not frequency:
        return result  # the job protects no count
    public = np.zeros(len(result), dtype=bool) if forced is None else forced
    if revised is not None:  # a sum known, its n changed: the n revised
        frequency = [_only_known_n(rule, revised.cells) for rule in frequency]
    known_n = public if revised is None else public & ~revised.cells
    counts = count_table(table)
    lower = known_lower(counts)
    added = np.zeros(len(counts.cells), dtype=bool)
    for _round in range(ROUNDS):
        hidden = (result["status"] != "published").to_numpy()
        found = suppression_pattern(
            counts,
            frequency,
            method=method,
            singleton_method=singleton,
            time_limit=time_limit,
            apriori=lower,
            primary=ManualRule(hidden, safety_range=0.0, name="sum pattern"),
            forced=known_n if known_n.any() else None,
        )
        more = (found["status"] != "published").to_numpy() & ~hidden
        if not (more & ~public).any():
            _verify(counts, frequency, hidden | more, lower, time_limit)
            return result.assign(**{N_HIDDEN: more})
        added |= more & ~public
        result = pattern([ManualRule(added.copy(), safety_range=0.0, name="unit counts (n)")])
    raise TabularError(
        f"the suppression pattern of the sums and that of their unit counts (n) still grew "
        f"after {ROUNDS} rounds; tabulate fewer cells or use fewer rules"
    )


N_HIDDEN = "n_hidden"  # a cell whose sum is published and whose n is not


def _only_known_n(rule, revised: np.ndarray):
    """``rule`` whose exemption of known cells (:func:`exempt_known`) leaves out the cells
    whose ``n`` is revised: their sums are known, their counts not."""
    if kind_of(rule) is rule:
        return rule
    return exempt_known([kind_of(rule)], rule.known & ~revised)[0]


def known_lower(table: Table) -> tuple[np.ndarray, float]:
    """What a reader of a count table knows of every cell before any value: the table lists
    every inner cell (each made of at least one unit), so a cell counts at least the inner
    cells it adds up. The pattern and its check protect against that bound, as the query path
    does (:func:`sqlsdc.tabular.universe_pattern._known_bounds`); red team s30f: with ``[0, inf)``
    four counts of 2 under ``freq:3`` were narrowed to [1, 2]. Sums keep ``[0, inf)``."""
    if table.X is None:  # pragma: no cover - a job tabulates one table, never linked ones
        raise TabularError("the job's table has no model matrix; this is a bug")
    return np.asarray(table.X.sum(axis=0), dtype=float).ravel(), np.inf


def measure_bounds(table: Table, bound: tuple[float, float] | None):
    """What a reader of a sum job's table knows of every cell from the policy's ``bounds: [lo,
    hi]`` of the measure (``sqlsdc policy show``): at most ``hi`` and at least ``lo`` per
    contributing unit. The upper bound counts the cell's true units ``n``, the lower one (for
    ``lo > 0``, every unit with a value contributes at least ``lo``) its contributors: where
    the job hides ``n`` the reader may know less, so the pattern protects against more, never
    less. Each bound is cut to the cell's value (a unit of several rows may sum past ``hi``).
    Without bounds: None (``[0, inf)``). Red team s44i: the query path's audit assumed
    ``[0, inf)`` and reported protected a sum that an LP with the bounds proved short."""
    if bound is None:
        return None
    lo, hi = bound
    values = table.values.astype(float)
    units = np.asarray(table.n, dtype=float)
    lower = lo * (units if lo < 0 else np.asarray(rated(table).n, dtype=float))
    upper = hi * (units if hi >= 0 else np.asarray(rated(table).n, dtype=float))
    return np.minimum(lower, values), np.maximum(upper, values)


def _verify(counts: Table, frequency: list, hidden: np.ndarray, lower, time_limit) -> None:
    """The counts' primaries keep their safety ranges under the final pattern (checked
    independently of the pattern's own audit, as the sums are)."""
    found = apply_rules(counts, frequency)
    verify_suppression(counts, hidden, primary=found.primary, upl=found.upl, lpl=found.lpl,
                       time_limit=time_limit, lower=lower[0]).require()  # fmt: skip


JOINT_ROUNDS = 4  # the pattern protected again with the cells the joint audit adds


def audit_jointly(
    table: Table,
    rules: list,
    result: pd.DataFrame,
    redo: Callable[[np.ndarray], pd.DataFrame],
    bound: tuple[float, float] | None,
    *,
    forced: np.ndarray | None,
    time_limit: float,
) -> pd.DataFrame:
    """The job's pattern ``result`` (sums, and ``n`` by :func:`audit_counts`), grown until the
    attacker's LP over the published ``n`` and sums together, linked by the policy's ``bounds:
    [lo, hi]`` (``sum <= hi * n``), leaves no primary short (:mod:`sqlsdc.tabular.joint_audit`);
    ``redo(cells)`` protects the table again with ``cells`` hidden too. The sums' own audit
    counts ``hi`` times the true ``n`` and clips the levels to it; the reader who does not
    know a hidden ``n`` is bound by the largest count the published ones allow, so the levels
    are clipped to that here. Red team s45g: one firm of 1,000 (bounds [0, 1000], nk(1, 60)
    asking 1,666.7) was put at most at 1,540 by that LP. Without bounds, the result as is.

    Raises:
        TabularError: a short primary no hidden cell widens, or still short after
            :data:`JOINT_ROUNDS` rounds.
    """
    if bound is None or not 0 <= bound[1] < np.inf:
        return result
    from sqlsdc.tabular.joint_audit import widening

    known = np.zeros(len(table.cells), dtype=bool) if forced is None else forced
    added = np.zeros(len(table.cells), dtype=bool)
    for _round in range(JOINT_ROUNDS):
        counts, sums = _joint_sides(table, rules, result, bound, time_limit)
        more, stuck = widening(table.A, counts, sums, bound, forced=known, cost=table.values,
                               time_limit=time_limit)  # fmt: skip
        if not more.any():
            if stuck:
                break
            return result
        added |= more
        result = redo(added.copy())
    raise TabularError(
        "a primary cell is short of its protection when the published unit counts (n) and "
        "sums are read together with the measure's bounds (sum <= hi x n), and hiding more "
        "cells did not protect it; tabulate fewer cells or widen the measure's bounds"
    )


def _joint_sides(table: Table, rules: list, result: pd.DataFrame, bound, time_limit: float):
    """The counts and the sums of the job's pattern as the joint audit reads them."""
    from sqlsdc.tabular.attacker import audit_intervals
    from sqlsdc.tabular.joint_audit import Side

    status = result["status"].to_numpy()
    hidden = status != "published"
    n_hidden = hidden | result[N_HIDDEN].to_numpy(dtype=bool) if N_HIDDEN in result else hidden
    counts = count_table(table)
    units = counts.values
    leaves = known_lower(counts)[0]
    frequency = [rule for rule in rules if isinstance(kind_of(rule), FrequencyRule)]
    found = apply_rules(counts, frequency) if frequency else None
    none = np.zeros(len(units), dtype=bool)
    unbounded = np.full(len(units), np.inf)
    count_side = Side(
        values=units, hidden=n_hidden, lower=leaves, upper=unbounded,
        primary=none if found is None else found.primary,
        upl=none * 0.0 if found is None else found.upl,
        lpl=none * 0.0 if found is None else np.minimum(found.lpl, units - leaves),
    )  # fmt: skip
    # the largest count the published ones allow (an outer bound where not proven exact)
    top = audit_intervals(table.A, units, n_hidden, lower=leaves, upper=unbounded, integer=True,
                          time_limit=time_limit).hi  # fmt: skip
    top = np.maximum(np.where(n_hidden, np.floor(top + 1e-6), units), units)
    values = table.values.astype(float)
    lo, hi = bound
    lower = np.minimum(lo * np.asarray(rated(table).n, dtype=float), values) if lo > 0 else (
        np.minimum(lo * units, values))  # fmt: skip
    primary = apply_rules(rated(table), rules)
    sum_side = Side(
        values=values, hidden=hidden, lower=lower, upper=np.full(len(values), np.inf),
        primary=primary.primary,
        upl=np.maximum(np.minimum(primary.upl, hi * top - values), 0.0),
        lpl=np.maximum(np.minimum(primary.lpl, values - lower), 0.0),
    )  # fmt: skip
    return count_side, sum_side

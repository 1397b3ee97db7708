"""Signed sums of three or more exact releases of a sum that isolate a group the rules flag.

:mod:`sqlsdc.jobs.isolated_groups` refuses a release when a signed sum of it and two or more
others is a group of fewer units than the minimum frequency, and
:mod:`sqlsdc.jobs.dominated_differences` judges a pair's one-sided difference of any size by
the job's rules. A signed sum of three releases may isolate a group of any size that no pair
does (red team s46b: turnover of R02 over activities I and A, over A and B, and over B, three
suppression jobs with the default rules, each cell published, each pair differing on both
sides or by A's 14 firms: T1 - T2 + T3 was I's 163,828,280 over 12 firms, 91 % of it one
firm's, which p:10 flags). The group is a cell of its own, protected by the job's rules
(Hundepool et al. 2012, *Statistical Disclosure Control*, 4.5 "linked tables").

:func:`refuse_dominated_groups` finds, in every cell that three or more of the releases
publish, the groups of Venn regions whose sum a signed combination of the releases gives
(their indicator lies in the releases' row space) and that the others without the job do not
give, keeps the minimal ones (a larger one is a disjoint union of minimal ones, and the p%
and nk rules are subadditive: a union of groups none of which is sensitive is not sensitive,
Hundepool et al. 2012, 4.2), and applies the job's rules to their units' contributions (each
unit's contributions summed first, after unit noise, as the job adds them up; dominance and
p% read absolute values, as :mod:`sqlsdc.jobs.dominated_differences` does).
"""

from __future__ import annotations

import functools

import numpy as np
from sqlglot import exp

from sqlsdc.errors import TabularError
from sqlsdc.jobs.exact_release import Release, kept
from sqlsdc.jobs.isolated_groups import passes, venn_regions
from sqlsdc.jobs.tabulation import measure_sum
from sqlsdc.rewrite.ckm_mix import join_mix
from sqlsdc.tabular.rules import CellStats, FrequencyRule, apply_rules, required_top_k

MAX_REGIONS = 16  # Venn regions of one cell whose groups are enumerated (2**16 of them)


def refuse_dominated_groups(
    con, spec, others: list[Release], rules, label: str = "the job", *, error=None
) -> None:
    """Raise ``error`` (made from the message; :class:`TabularError` by default) when the sum
    job ``spec`` (its primary ``rules``; ``label`` names it), with two or more of ``others``
    that publish a cell, gives a signed sum over a group of units which ``rules`` flag as a
    primary cell and which ``others`` alone do not give. Count jobs and rules of frequency only
    are left to :func:`~sqlsdc.jobs.isolated_groups.refuse_isolated_groups`."""
    error = error or TabularError
    if spec.measure is None or all(isinstance(r, FrequencyRule) for r in rules):
        return
    top_k = required_top_k(rules)
    releases = [(label, spec.where, tuple(spec.dims))]
    releases += [(o.label, o.where, tuple(o.dims)) for o in others]
    # a population of one region takes part as its cell, one of a few as their sum
    for fixed, taking, name in passes(con, spec, releases):
        if len(taking) < 3:  # two releases: the pairwise checks'
            continue
        wheres = [r[1] for r in taking]
        found = {}
        for cell, regions in venn_regions(con, spec, fixed, wheres).items():
            groups = new_groups(list(regions), len(taking))
            if groups is None:
                raise error(_too_many(spec, label, name or _named(fixed, cell), taking))
            if groups:
                found[cell] = groups
        if not found:
            continue
        units = _contributions(con, spec, fixed, wheres)
        for cell, groups in found.items():
            stats = _stats(units.get(cell, {}), groups, top_k)
            flagged = np.flatnonzero(apply_rules(stats, rules).primary)
            if flagged.size:
                rule = apply_rules(stats, rules).rule[flagged[0]]
                raise error(_message(spec, label, name or _named(fixed, cell), taking, rule))


def new_groups(masks: list[int], releases: int, limit: int = MAX_REGIONS):
    """The minimal groups of the Venn regions ``masks`` (bit j: release j holds the region)
    whose sum a signed combination of the ``releases`` gives and the releases but the first
    (the new one) do not, each as a tuple of masks; a release's own cell is left out (it is
    protected as such). None when there are more than ``limit`` regions to enumerate."""
    if len(masks) > limit:
        return None
    found = _groups(tuple(masks), releases)
    return [tuple(m for i, m in enumerate(masks) if g >> i & 1) for g in found]


@functools.lru_cache(maxsize=1024)
def _groups(masks: tuple[int, ...], releases: int) -> tuple[int, ...]:
    """:func:`new_groups` as bit sets over the positions of ``masks`` (cells of a table mostly
    repeat a few sets of regions: computed once each)."""
    size = len(masks)
    matrix = np.array([[m >> j & 1 for m in masks] for j in range(releases)], dtype=float)
    subsets = (np.arange(1, 2**size)[:, None] >> np.arange(size)) & 1
    given = np.all(np.abs(subsets @ _null(matrix)) < 1e-9, axis=1)
    before = np.all(np.abs(subsets @ _null(matrix[1:])) < 1e-9, axis=1)
    codes = np.arange(1, 2**size)
    own = {int(sum(1 << i for i in range(size) if masks[i] >> j & 1)) for j in range(releases)}
    order = np.argsort(subsets[given].sum(axis=1), kind="stable")
    minimal: list[int] = []
    found = []
    # by size: a group none of the minimal ones found so far lies in is minimal (a disclosed
    # subset of it would hold a minimal one, found before it)
    for code, old in zip(codes[given][order], before[given][order], strict=True):
        code = int(code)
        if any(m & code == m for m in minimal):
            continue
        minimal.append(code)
        if not old and code not in own:
            found.append(code)
    return tuple(found)


def _null(matrix: np.ndarray) -> np.ndarray:
    """A basis (columns) of the vectors v with matrix @ v = 0: a group's indicator lies in
    the rows' span exactly when it is orthogonal to them."""
    _u, s, vt = np.linalg.svd(matrix, full_matrices=True)
    rank = int((s > 1e-9).sum())
    return vt[rank:].T


def _contributions(con, spec, fixed: list[str], wheres: list) -> dict:
    """Per cell of the grouping ``fixed``: per Venn region (its mask, bit j for ``wheres[j]``)
    each unit's contribution, summed over its rows there, as the job adds it up."""
    bits = [
        exp.If(this=kept(w), true=exp.Literal.number(1 << j), false=exp.Literal.number(0))
        for j, w in enumerate(wheres)
    ]
    mask = bits[0]
    for bit in bits[1:]:
        mask = exp.Add(this=mask, expression=bit)
    rows = exp.select(
        *(exp.column(d) for d in fixed),
        mask.as_("__m"),
        exp.column(spec.unit).as_("__u"),
        measure_sum(spec).this.as_("__x"),
    ).from_(spec.table)
    if spec.unit_noise is not None:
        join_mix(rows)
    rows = rows.where(exp.or_(*(kept(w) for w in wheres)))
    keys = [exp.column(d) for d in fixed]
    select = (
        exp.select(*keys, exp.column("__m"), exp.column("__u"),
                   exp.Sum(this=exp.column("__x")).as_("__x"))
        .from_(rows.subquery("__r"))
        .group_by(*[k.copy() for k in keys], exp.column("__m"), exp.column("__u"))
    )  # fmt: skip
    found: dict = {}
    for *cell, region, unit, x in con.execute(select.sql("duckdb")).fetchall():
        by_unit = found.setdefault(tuple(cell), {}).setdefault(int(region), {})
        by_unit[unit] = by_unit.get(unit, 0.0) + float(x or 0.0)
    return found


def _stats(regions: dict, groups: list[tuple[int, ...]], top_k: int) -> CellStats:
    """The rules' view of each group: its units (each unit's contributions in the group
    summed), the non-zero ones counted, their sum, absolute sum and ``top_k`` largest."""
    n, value, total, top = [], [], [], []
    for group in groups:
        per_unit: dict = {}
        for mask in group:
            for unit, x in regions.get(mask, {}).items():
                per_unit[unit] = per_unit.get(unit, 0.0) + x
        xs = np.array([x for x in per_unit.values() if x != 0], dtype=np.float64)
        largest = sorted(np.abs(xs), reverse=True)[:top_k]
        n.append(len(xs))
        value.append(float(xs.sum()))
        total.append(float(np.abs(xs).sum()))
        top.append(list(largest) + [0.0] * (top_k - len(largest)))
    return CellStats(
        n=np.array(n, dtype=np.int64),
        value=np.array(value, dtype=np.float64),
        total=np.array(total, dtype=np.float64),
        top=np.array(top, dtype=np.float64).reshape(len(groups), top_k),
    )


def _named(fixed: list[str], cell: tuple) -> str:
    return ", ".join(f"{d} = {v!r}" for d, v in zip(fixed, cell, strict=True)) or "total"


def _message(spec, label: str, named: str, taking, rule: str) -> str:
    labels = ", ".join(r[0] for r in taking[1:])
    return (
        f"with {labels}, {label} would publish exact sums of {spec.measure} of {spec.table} "
        f"whose sum and difference in a cell ({named}) is a group of units of "
        f"its own, which the rules of {label} ({rule}) flag as primary (a few units dominate "
        "it). Protect these populations in one job (its cells and margins then hide it), or "
        "tabulate a population whose overlaps with those leave no such group"
    )


def _too_many(spec, label: str, named: str, taking) -> str:
    labels = ", ".join(r[0] for r in taking[1:])
    return (
        f"with {labels}, {label} would split a cell ({named}) of {spec.table} "
        f"into more than {MAX_REGIONS} groups of units by which populations hold them, too "
        "many to check whether a sum and difference of the tables isolates a group its rules "
        "flag. Protect these populations in one job, or tabulate one that overlaps fewer of "
        "them"
    )

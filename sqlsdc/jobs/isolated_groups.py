"""Signed sums of three or more exact releases that isolate a small group.

A pairwise differencing check (:mod:`sqlsdc.jobs.differencing`) sees two tables at a time; a
sum and difference of several sees the Venn regions of their populations (red team s38b: four
jobs by sex over ``age >= 85`` and R02 ∪ R03 ∪ {one person}, R02 ∪ R03 ∪ R04, R02 ∪ R04 and
R02, each pair differing on both sides or by a whole region, gave that person's income as
T1 - T2 + T3 - T4). :func:`refuse_isolated_groups` refuses a release that, with the others, makes
such a combination a sum over fewer units than the minimum frequency.
"""

from __future__ import annotations

import itertools

import numpy as np
from sqlglot import exp

from sqlsdc.errors import TabularError
from sqlsdc.jobs.exact_release import Release, kept


def refuse_isolated_groups(
    con, spec, others: list[Release], least: int, *, label: str = "the job", error=TabularError
) -> None:
    """Refuse the release ``spec`` (a job's, or a file's as a table of its plain dimension
    columns, labelled ``label``) when, with it, the exact releases ``others`` isolate a group
    of fewer than ``least`` units in some cell, and without it they do not.

    A pairwise check sees two tables at a time; a signed sum of several sees their Venn
    regions (red team s38b: four jobs by sex over ``age >= 85`` and R02 ∪ R03 ∪ {one person},
    R02 ∪ R03 ∪ R04, R02 ∪ R04 and R02, each pair differing on both sides or by a whole
    region, gave that person's income as T1 - T2 + T3 - T4). In every cell of every grouping
    of the release's dimensions, the releases that publish the cell (those that group by the
    dimensions it fixes) split its units into regions by which populations hold them; a
    release is the sum of the regions it holds, and a group of regions is disclosed when a
    combination of releases is a sum over those regions alone (:func:`_isolated`)."""
    releases = [(label, spec.where, tuple(spec.dims))]
    releases += [(o.label, o.where, tuple(o.dims)) for o in others]
    releases = with_fixed_dims(con, spec, releases)
    dims = list(releases[0][2])
    for level in range(2 ** len(dims)):
        fixed = [d for j, d in enumerate(dims) if level >> j & 1]
        taking = [r for r in releases if set(fixed) <= set(r[2])]
        if len(taking) < 3:  # two releases: the pairwise check's
            continue
        for cell, regions in venn_regions(con, spec, fixed, [r[1] for r in taking]).items():
            found = _isolated(regions, len(taking), least)
            if found is None or _isolated(regions, len(taking), least, skip=0):
                continue
            named = ", ".join(f"{d} = {v!r}" for d, v in zip(fixed, cell, strict=True))
            labels = ", ".join(r[0] for r in taking[1:])
            raise error(
                f"with {labels}, {label} would isolate {found} unit(s) of {spec.table} in the "
                f"cell ({named or 'total'}): a sum and difference of the tables' values there "
                f"is what those units add up to, which no cell of fewer than {least} units "
                "(the policy's minimum frequency) may show. Tabulate a population whose "
                "difference from each of those is made of whole groups of at least that many "
                "units"
            )


def with_fixed_dims(con, spec, releases: list[tuple]) -> list[tuple]:
    """``releases`` (``(label, population, dims)``), each with the dimensions of any of them
    that its population holds one value of added to its own: its total is that value's cell
    (red team s46b: turnover of R02's activity B by size class totals R02's B, a cell of a
    table by region over B and A; the signed sums were looked for only among tables grouping
    by region, and T1 - T2 + T3 of R02 over I and A, of every region over A and B, and of
    R02's B by size class was I's total). Rows that add nothing to a sum are left out, as
    :func:`venn_regions` leaves them."""
    candidates = list(dict.fromkeys(d for r in releases for d in r[2]))
    found = []
    for label, where, dims in releases:
        missing = [d for d in candidates if d not in dims]
        if not missing:
            found.append((label, where, dims))
            continue
        values = [
            exp.Add(
                this=exp.Count(this=exp.Distinct(expressions=[exp.column(d)])),
                expression=exp.Cast(
                    this=exp.GT(this=exp.Count(this=exp.Star()),
                                expression=exp.Count(this=exp.column(d))),
                    to=exp.DataType.build("INT"),
                ),
            )
            for d in missing
        ]  # fmt: skip
        rows = kept(where)
        if spec.measure is not None:
            nonzero = exp.column(spec.measure).neq(exp.Literal.number(0))
            rows = exp.and_(rows, exp.Coalesce(this=nonzero, expressions=[exp.false()]))
        select = exp.select(*values).from_(spec.table).where(rows)
        counts = con.execute(select.sql("duckdb")).fetchone()
        one = tuple(d for d, n in zip(missing, counts, strict=True) if n <= 1)
        found.append((label, where, dims + one))
    return found


def venn_regions(con, spec, fixed: list[str], wheres: list) -> dict[tuple, dict[int, int]]:
    """Per cell of the grouping ``fixed``: the number of units of each Venn region of the
    populations ``wheres`` (a bit per population), empty regions and the outside left out."""
    bits = [
        exp.If(this=kept(w), true=exp.Literal.string("1"), false=exp.Literal.string("0"))
        for w in wheres
    ]
    mask = exp.Concat(expressions=bits)  # a character per population: any number of them
    rows = exp.select(
        *(exp.column(d) for d in fixed), mask.as_("__m"), exp.column(spec.unit).as_("__u")
    ).from_(spec.table)
    rows = rows.where(exp.or_(*(kept(w) for w in wheres)))  # rows of no population: none
    if spec.measure is not None:  # rows that add nothing to a sum are no part of a difference
        nonzero = exp.column(spec.measure).neq(exp.Literal.number(0))
        rows = rows.where(exp.Coalesce(this=nonzero, expressions=[exp.false()]))
    keys = [exp.column(d) for d in fixed]
    count = exp.Count(this=exp.Distinct(expressions=[exp.column("__u")]))
    select = (
        exp.select(*keys, exp.column("__m"), count.as_("__n"))
        .from_(rows.subquery("__r"))
        .where(exp.column("__m").neq(exp.Literal.string("0" * len(wheres))))
        .group_by(*[k.copy() for k in keys], exp.column("__m"))
    )
    found: dict[tuple, dict[int, int]] = {}
    for *cell, region, units in con.execute(select.sql("duckdb")).fetchall():
        found.setdefault(tuple(cell), {})[int(region[::-1], 2)] = int(units)
    return found


ISOLATION_SUBSETS = 4096  # groups of small regions tried before a cell is refused unproven


def _isolated(regions: dict[int, int], releases: int, least: int, skip=None):
    """The units of the smallest group of regions (fewer than ``least`` units in all) whose
    sum a signed combination of the releases gives with nothing else, or None; ``skip``
    leaves one release out. A cell whose small regions admit more groups than
    :data:`ISOLATION_SUBSETS` and some combination of releases over them alone is treated as
    isolating them all (the safe side)."""
    rows = [j for j in range(releases) if j != skip]
    masks = list(regions)
    matrix = np.array([[m >> j & 1 for m in masks] for j in rows], dtype=float)
    large = [i for i, m in enumerate(masks) if regions[m] >= least]
    small = [i for i, m in enumerate(masks) if regions[m] < least]
    if not small:
        return None
    # combinations of releases that cancel every large region: their values are sums over
    # small regions only
    kernel = _left_null(matrix[:, large]) if large else np.eye(len(rows))
    if kernel.shape[1] == 0:
        return None
    spans = kernel.T @ matrix[:, small]
    rank = np.linalg.matrix_rank(spans, tol=1e-9)
    if rank == 0:
        return None
    sizes = [regions[masks[i]] for i in small]
    # a group that is one release's own cell there is no sum of several: that release
    # publishes it (or its pattern hides it) alone, as the pairwise check sees it (a job's
    # small cell next to a file and its earlier version of one population)
    own = {frozenset(np.flatnonzero(row).tolist()) for row in matrix}
    tried = 0
    for count in range(1, len(small) + 1):
        for group in itertools.combinations(range(len(small)), count):
            total = sum(sizes[i] for i in group)
            if total >= least or frozenset(small[i] for i in group) in own:
                continue
            tried += 1
            if tried > ISOLATION_SUBSETS:
                return sum(sizes)
            rest = [i for i in range(len(small)) if i not in group]
            if np.linalg.matrix_rank(spans[:, rest], tol=1e-9) < rank if rest else True:
                return total
    return None


def _left_null(matrix: np.ndarray) -> np.ndarray:
    """A basis (columns) of the vectors y with y @ matrix = 0."""
    u, s, _vt = np.linalg.svd(matrix, full_matrices=True)
    rank = int((s > 1e-9).sum())
    return u[:, rank:]

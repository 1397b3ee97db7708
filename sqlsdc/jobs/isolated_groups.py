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
    for fixed, taking, name in passes(con, spec, releases):
        if len(taking) < 3:  # two releases: the pairwise check's
            continue
        for cell, regions in venn_regions(con, spec, fixed, [r[1] for r in taking]).items():
            found = _isolated(regions, len(taking), least)
            if found is None or _isolated(regions, len(taking), least, skip=0):
                continue
            named = name or ", ".join(f"{d} = {v!r}" for d, v in zip(fixed, cell, strict=True))
            labels = ", ".join(r[0] for r in taking[1:])
            raise error(
                f"with {labels}, {label} would isolate {found} unit(s) of {spec.table} in the "
                f"cell ({named or 'total'}): a sum and difference of the tables' values there "
                f"is what those units add up to, which no cell of fewer than {least} units "
                "(the policy's minimum frequency) may show. Tabulate a population whose "
                "difference from each of those is made of whole groups of at least that many "
                "units"
            )


# a population of 2 to this many values of a dimension: one merged cell. Red team s47c: 8
# left a population of nine activities out (turnover of nine naces' large and medium firms by
# region, of every nace's micro and medium by nace, of the nine's micro by region: T1 - T2's
# nine cells + T3 was one large firm's 237,073,633); a dimension of a tabulation has far
# fewer values than this, which only bounds the IN list of a merged cell
MERGED_VALUES = 10_000


def passes(con, spec, releases: list[tuple]) -> list[tuple[list[str], list[tuple], str | None]]:
    """The cells the three-table checks look at, as ``(fixed, taking, name)``: per grouping
    ``fixed`` of the dimensions of the release first in ``releases`` (``(label, population,
    dims)``, the new one), the releases that publish its cells (``name`` None); then per
    set S of 2 to :data:`MERGED_VALUES` values of a dimension d that a release's population
    holds, one merged cell (``fixed`` empty, each population cut to d IN S, ``name`` saying
    so), published by the releases that group by d (the sum of their cells) and those whose
    population holds values of S only (their total), when the new one is among them.

    Red team s46b: a table's total is a cell of a table by region when its population holds
    one region (R02's B by size class beside R02's I+A and every region's A+B, by region: T1 -
    T2 + T3 was I's total), and the sum of two of its cells when it holds two:
    turnover of R02's and R08's I+A by region, of every region's A+B by region, and of R02's
    and R08's B by size class: T1's total less T2's two cells plus T3's total was I of both
    regions, 164,915,325, 91 % one firm's; red team s47c: a population of nine activities
    beside a table by nace, one large firm's 237,073,633)."""
    values = _values(con, spec, releases)
    releases = [
        (label, where, dims + tuple(d for d, v in held.items() if len(v) <= 1))
        for (label, where, dims), held in zip(releases, values, strict=True)
    ]
    found = []
    dims = list(releases[0][2])
    for level in range(2 ** len(dims)):
        fixed = [d for j, d in enumerate(dims) if level >> j & 1]
        found.append((fixed, [r for r in releases if set(fixed) <= set(r[2])], None))
    merged = sorted({(d, frozenset(v)) for held in values for d, v in held.items() if len(v) > 1},
                    key=lambda m: (m[0], sorted(map(str, m[1]))))  # fmt: skip
    for d, chosen in merged:
        taking = [
            r
            for r, held in zip(releases, values, strict=True)
            if d in r[2] or (d in held and held[d] <= chosen)
        ]
        if not taking or taking[0] is not releases[0]:
            continue  # the new release publishes no part of it: nothing new
        listed = sorted(chosen, key=str)
        cut = exp.column(d).isin(*(exp.convert(v) for v in listed))
        taking = [(label, exp.and_(kept(where), cut.copy()), dims)
                  for label, where, dims in taking]  # fmt: skip
        found.append(([], taking, f"{d} IN ({', '.join(repr(v) for v in listed)})"))
    return found


def _values(con, spec, releases: list[tuple]) -> list[dict[str, frozenset]]:
    """Per release, the dimensions of the others it does not group by whose values its
    population holds at most :data:`MERGED_VALUES` of (none NULL): those values. Rows that
    add nothing to a sum are left out, as :func:`venn_regions` leaves them."""
    candidates = list(dict.fromkeys(d for r in releases for d in r[2]))
    found = []
    for _label, where, dims in releases:
        missing = [d for d in candidates if d not in dims]
        if not missing:
            found.append({})
            continue
        rows = kept(where)
        if spec.measure is not None:
            nonzero = exp.column(spec.measure).neq(exp.Literal.number(0))
            rows = exp.and_(rows, exp.Coalesce(this=nonzero, expressions=[exp.false()]))
        lists = []
        for d in missing:
            few = exp.and_(
                exp.LTE(
                    this=exp.Count(this=exp.Distinct(expressions=[exp.column(d)])),
                    expression=exp.Literal.number(MERGED_VALUES),
                ),
                exp.Count(this=exp.Star()).eq(exp.Count(this=exp.column(d))),
            )
            listed = exp.Anonymous(
                this="list", expressions=[exp.Distinct(expressions=[exp.column(d)])]
            )
            lists.append(exp.If(this=few, true=listed, false=exp.null()))
        select = exp.select(*lists).from_(spec.table).where(rows)
        (row,) = con.execute(select.sql("duckdb")).fetchall()  # one row: the result done
        found.append({d: frozenset(v) for d, v in zip(missing, row, strict=True) if v is not None})
    return found


def venn_regions(con, spec, fixed: list[str], wheres: list) -> dict[tuple, dict[int, int]]:
    """Per cell of the grouping ``fixed``: the number of units of each Venn region of the
    populations ``wheres`` (a bit per population), empty regions and the outside left out."""
    bits = [
        exp.If(this=kept(w), true=exp.Literal.string("1"), false=exp.Literal.string("0"))
        for w in wheres
    ]
    mask = exp.Concat(expressions=bits)  # a character per population: any number of them
    # built without sqlglot's copy at each builder step (each took the query so far)
    rows = exp.select(
        *(exp.column(d) for d in fixed),
        mask.as_("__m", copy=False),
        exp.column(spec.unit).as_("__u"),
        copy=False,
    ).from_(spec.table, copy=False)
    # rows of no population: none
    rows = rows.where(exp.or_(*(kept(w) for w in wheres), copy=False), copy=False)
    if spec.measure is not None:  # rows that add nothing to a sum are no part of a difference
        nonzero = exp.column(spec.measure).neq(exp.Literal.number(0))
        rows = rows.where(exp.Coalesce(this=nonzero, expressions=[exp.false()]), copy=False)
    keys = [exp.column(d) for d in fixed]
    count = exp.Count(this=exp.Distinct(expressions=[exp.column("__u")]))
    select = (
        exp.select(*keys, exp.column("__m"), count.as_("__n"), copy=False)
        .from_(rows.subquery("__r", copy=False), copy=False)
        .where(exp.column("__m").neq(exp.Literal.string("0" * len(wheres))), copy=False)
        .group_by(*[k.copy() for k in keys], exp.column("__m"), copy=False)
    )
    found: dict[tuple, dict[int, int]] = {}
    # written once and dropped: the generator need not copy it first
    for *cell, region, units in con.execute(select.sql("duckdb", copy=False)).fetchall():
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

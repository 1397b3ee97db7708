"""Two releases of one table over populations that differ by a few units in a cell.

A job's table and another release of the same table and aggregate (the guard's suppression
pattern, which ``sqlsdc publish`` releases, a stored job output, or an anonymised file of the
table, whose records add up to any table over its columns) share the cells whose dimensions
both group by. Where both publish exact values (suppression; the cells CTA did not
move; the margins an IPF job was given, which are the true ones when the admin wrote them from
the data) and a shared cell's two populations overlap, a few units one holds and the other lacks —
with none the other way — are exactly the difference of the two values: their count, or their
sum. Red team s36c: on the suppression demo a job by geography x sex over ``WHERE age >= 1``,
published next to the live pattern of every person, gave 144 cells of counts 1-4 of the 144
persons aged 0 (one girl aged 0 in R01-M001), cells the policy's ``freq:5`` hides; a job of
``WHERE employees >= 10`` over enterprises does the same to the turnover of a cell's few small
enterprises. Red team s37c: an IPF job of income by region x education over ``age >= 85``,
raked to its true margins, next to a suppression job by sex over the same people but the one
of a municipality, gave that person's income as the difference of the two grand totals.

:func:`refuse_small_differences` refuses such a job before it computes anything. Pairwise,
every cell of either table (every grouping of its dimensions) is compared with the inner cells
of the other that cover its units, whatever their dimensions: a WHERE that fixes a dimension
the other table groups by (``region = 'R01'`` beside a table by region) makes its total a
cell of the other (red team s38b: a job by sex over ``age >= 85 AND region = 'R01'`` and one
by region over ``age >= 85`` less one municipality's person gave that person's income). Where
the covering cells hold no unit of the cell's own population outside the cell (else they are
no tighter than the cell's table's own margins, which its pattern protects), the cell and its
cover must differ by none or by at least the minimum frequency of units on the side that
differs (differences on both sides mix what the two groups add up to).
Across more tables (:func:`refuse_isolated_groups`), a signed sum of several may isolate a
group that no pair does (T1 - T2 + T3 - T4 of four jobs over R02 ∪ R03 ∪ {one person}, R02 ∪
R03 ∪ R04, R02 ∪ R04 and R02, red team s38b): in each cell that three or more of them
publish, no combination of them may add up to a group of regions of their populations'
Venn diagram of fewer than the minimum frequency of units.

Not covered: a rounded or raked table next to another (their difference bounds those units'
sum within the two perturbations; red team s33c keeps that allowed); combinations of cells of
several tables of different dimensions beyond a cell and its cover; and the two patterns
together (a cell hidden in one table and published in the other, the attacker LP over both
with non-negative differences): protecting linked tables of different populations needs one
covering universe (red team s30f).
"""

from __future__ import annotations

import itertools

import numpy as np
from sqlglot import exp

from sqlsdc.errors import TabularError
from sqlsdc.policy import Policy
from sqlsdc.tabular.rules import FrequencyRule, parse_rule

# (label, population WHERE or None, dimension columns) of a release the job's cells meet
Other = tuple[str, exp.Expr | None, tuple[str, ...]]


def refuse_small_differences(con, policy: Policy, spec, others: list[Other]) -> None:
    """Refuse the job ``spec`` (a :class:`~sqlsdc.jobs.protect.JobSpec`) when one of
    ``others`` (same table and aggregate) shares a cell with it whose populations overlap and
    differ, on one side only, by fewer units than the table's minimum frequency."""
    least = min_frequency(policy, spec.table)
    for label, where, dims in others:
        found = _smallest_difference(con, spec, where, tuple(dims), least)
        if found is None:
            continue
        cell, units = found
        named = ", ".join(f"{d} = {v!r}" for d, v in cell.items() if v is not None) or "total"
        raise TabularError(
            f"the job's population and that of {label} overlap and differ by only {units} "
            f"unit(s) of {spec.table} in a cell of one table ({named}) and the inner cells of "
            "the other that cover it: the difference of their values would show what those "
            "units add up to, which no cell of fewer "
            f"than {least} units (the policy's minimum frequency) may show. Tabulate a "
            "population that differs from it by none or by at least that many units in every "
            "cell they share"
        )
    refuse_isolated_groups(con, spec, others, least)


def min_frequency(policy: Policy, table: str) -> int:
    """The largest minimum frequency the policy sets for ``table``: any aggregate kind's
    ``min_frequency`` and any ``freq:N`` suppression rule."""
    rules = policy.table(table).protection.values()
    found = [r.min_frequency for r in rules]
    for rule in rules:
        for text in rule.rules:
            parsed = parse_rule(text)
            if isinstance(parsed, FrequencyRule):
                found.append(int(parsed.min_freq))
    return max(found)


def _smallest_difference(con, spec, where, dims: tuple[str, ...], least: int):
    """``(cell, units)`` of a cell of either table that the inner cells of the other cover
    but for ``0 < units < least`` units on one side only, or None."""
    for cut, cut_dims, cover, cover_dims in (
        (spec.where, spec.dims, where, dims),
        (where, dims, spec.where, spec.dims),
    ):
        found = _uncovered(con, spec, (cut, tuple(cut_dims)), (cover, tuple(cover_dims)), least)
        if found is not None:
            return found
    return None


def _uncovered(con, spec, cut, cover, least: int):
    """``(cell, units)`` of a cell of the table ``cut`` (its WHERE and dimensions; every
    grouping of them) whose units in the population of ``cover`` fill the inner cells of
    ``cover`` they lie in but for ``units`` more, with none of the cell outside that
    population, or the other way round, ``0 < units < least``; or None. The cell's value
    and the sum of those inner cells then differ by what those few units add up to."""
    (cut_where, cut_dims), (cover_where, cover_dims) = cut, cover
    keys = [f"__c{j}" for j in range(len(cut_dims))]
    inner = [f"__v{j}" for j in range(len(cover_dims))]
    rows = exp.select(
        exp.column(spec.unit).as_("__u"),
        *(exp.column(d).as_(k) for d, k in zip(cut_dims, keys, strict=True)),
        *(exp.column(d).as_(k) for d, k in zip(cover_dims, inner, strict=True)),
        _kept(cut_where).as_("__in_c"),
        _kept(cover_where).as_("__in_v"),
    ).from_(spec.table)
    rows = rows.where(exp.or_(_kept(cut_where), _kept(cover_where)))  # rows of neither: none
    if spec.measure is not None:  # rows that add nothing to a sum are no part of a difference
        nonzero = exp.column(spec.measure).neq(exp.Literal.number(0))
        rows = rows.where(exp.Coalesce(this=nonzero, expressions=[exp.false()]))

    def units(alias: str) -> exp.Expr:
        return exp.Count(this=exp.Distinct(expressions=[exp.column("__u")])).as_(alias)

    def cube(select: exp.Select) -> exp.Select:
        level = exp.Anonymous(this="GROUPING", expressions=[exp.column(k) for k in keys])
        select = select.select(level.as_("__g") if keys else exp.Literal.number(0).as_("__g"))
        return (
            select.group_by(exp.Cube(expressions=[exp.column(k) for k in keys])) if keys else select
        )

    both = exp.and_(exp.column("__in_c"), exp.column("__in_v"))
    # units of a cut cell in the cover's population, per inner cell of the cover they lie in
    hits = cube(
        exp.select(*map(exp.column, keys), *map(exp.column, inner), units("__k"))
        .from_("__r")
        .where(both)
        .group_by(*map(exp.column, inner))
    )
    in_cut = exp.Filter(this=units("__x").this, expression=exp.Where(this=exp.column("__in_c")))
    sizes = exp.select(*map(exp.column, inner), units("__size"), in_cut.as_("__inside"))
    sizes = sizes.from_("__r")
    sizes = sizes.where(exp.column("__in_v")).group_by(*map(exp.column, inner))
    cells = cube(
        exp.select(*map(exp.column, keys), units("__n")).from_("__r").where(exp.column("__in_c"))
    )

    def same(left: str, right: str, names: list[str]) -> exp.Expr:
        return (
            exp.and_(
                *(
                    exp.NullSafeEQ(this=exp.column(n, left), expression=exp.column(n, right))
                    for n in names
                )
            )
            if names
            else exp.true()
        )

    covered = (
        exp.select(
            exp.column("__g", "h"),
            *(exp.column(k, "h") for k in keys),
            exp.Sum(this=exp.column("__k", "h")).as_("__both"),
            exp.Sum(this=exp.column("__size", "s")).as_("__covered"),
            exp.Sum(this=exp.column("__inside", "s")).as_("__inside"),
        )
        .from_(exp.to_table("__hits").as_("h"))
        .join(exp.to_table("__sizes").as_("s"), on=same("h", "s", inner), join_type="inner")
        .group_by(exp.column("__g", "h"), *(exp.column(k, "h") for k in keys))
    )
    outside = exp.Sub(this=exp.column("__n", "c"), expression=exp.column("__both", "o"))
    # units of the covering cells outside the cut's population, and inside it but not in the
    # cell: with any of the latter the cover is no tighter than the cut table's own margins,
    # which the pattern (or the linked audit) already protects
    excess = exp.Sub(this=exp.column("__covered", "o"), expression=exp.column("__inside", "o"))
    beside = exp.Sub(this=exp.column("__inside", "o"), expression=exp.column("__both", "o"))
    one_side = exp.and_(
        beside.eq(0),
        exp.or_(
            exp.and_(outside.copy().eq(0), excess.copy().between(1, least - 1)),
            exp.and_(excess.copy().eq(0), outside.copy().between(1, least - 1)),
        ),
    )
    select = (
        exp.select(
            exp.column("__g", "c"),
            *(exp.column(k, "c") for k in keys),
            outside.as_("__a"),
            excess.as_("__b"),
        )
        .from_(exp.to_table("__cells").as_("c"))
        .join(
            exp.to_table("__covered").as_("o"),
            on=exp.and_(exp.column("__g", "c").eq(exp.column("__g", "o")), same("c", "o", keys)),
            join_type="inner",
        )
        .where(one_side)
        .limit(1)
    )
    for name, body in (
        ("__r", rows),
        ("__hits", hits),
        ("__sizes", sizes),
        ("__cells", cells),
        ("__covered", covered),
    ):
        select = select.with_(name, as_=body)
    row = con.execute(select.sql("duckdb")).fetchone()
    if row is None:
        return None
    level, values = row[0], row[1 : 1 + len(keys)]
    cell = {
        d: (None if level >> (len(keys) - 1 - j) & 1 else v)
        for j, (d, v) in enumerate(zip(cut_dims, values, strict=True))
    }
    return cell, max(row[-2:])


def _kept(where: exp.Expr | None) -> exp.Expr:
    if where is None:
        return exp.true()
    return exp.paren(exp.Coalesce(this=where.copy(), expressions=[exp.false()]))


def refuse_isolated_groups(con, spec, others: list[Other], least: int) -> None:
    """Refuse the job when, with it, the exact releases ``others`` and the job isolate a
    group of fewer than ``least`` units in some cell, and without it they do not.

    A pairwise check sees two tables at a time; a signed sum of several sees their Venn
    regions (red team s38b: four jobs by sex over ``age >= 85`` and R02 ∪ R03 ∪ {one person},
    R02 ∪ R03 ∪ R04, R02 ∪ R04 and R02, each pair differing on both sides or by a whole
    region, gave that person's income as T1 - T2 + T3 - T4). In every cell of every grouping
    of the job's dimensions, the releases that publish the cell (those that group by the
    dimensions it fixes) split its units into regions by which populations hold them; a
    release is the sum of the regions it holds, and a group of regions is disclosed when a
    combination of releases is a sum over those regions alone
    (:func:`_isolated`)."""
    releases = [("the job", spec.where, tuple(spec.dims)), *others]
    dims = list(spec.dims)
    for level in range(2 ** len(dims)):
        fixed = [d for j, d in enumerate(dims) if level >> j & 1]
        taking = [r for r in releases if set(fixed) <= set(r[2])]
        if len(taking) < 3:  # two releases: the pairwise check's
            continue
        for cell, regions in _regions(con, spec, fixed, [r[1] for r in taking]).items():
            found = _isolated(regions, len(taking), least)
            if found is None or _isolated(regions, len(taking), least, skip=0):
                continue
            named = ", ".join(f"{d} = {v!r}" for d, v in zip(fixed, cell, strict=True))
            labels = ", ".join(r[0] for r in taking[1:])
            raise TabularError(
                f"with {labels}, the job's table would isolate {found} unit(s) of {spec.table} "
                f"in the cell ({named or 'total'}): a sum and difference of the tables' values "
                "there is what those units add up to, which no cell of fewer than "
                f"{least} units (the policy's minimum frequency) may show. Tabulate a "
                "population whose difference from each of those is made of whole groups of "
                "at least that many units"
            )


def _regions(con, spec, fixed: list[str], wheres: list) -> dict[tuple, dict[int, int]]:
    """Per cell of the grouping ``fixed``: the number of units of each Venn region of the
    populations ``wheres`` (a bit per population), empty regions and the outside left out."""
    bits = [
        exp.If(this=_kept(w), true=exp.Literal.string("1"), false=exp.Literal.string("0"))
        for w in wheres
    ]
    mask = exp.Concat(expressions=bits)  # a character per population: any number of them
    rows = exp.select(
        *(exp.column(d) for d in fixed), mask.as_("__m"), exp.column(spec.unit).as_("__u")
    ).from_(spec.table)
    rows = rows.where(exp.or_(*(_kept(w) for w in wheres)))  # rows of no population: none
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
    tried = 0
    for count in range(1, len(small) + 1):
        for group in itertools.combinations(range(len(small)), count):
            total = sum(sizes[i] for i in group)
            if total >= least:
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

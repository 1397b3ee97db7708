"""Two job tables over other rows whose cells are sums of each other's: a cell of one is the
union of some inner cells of the other.

:func:`sqlsdc.jobs.stored_tables._share_a_cell` pairs two jobs of one table and aggregate when a
cell of one holds what a cell of the other holds. Populations that differ can be linked without
sharing a cell: a WHERE on a dimension of the other table (``nace IN ('A', 'B', 'D', 'F', 'G',
'H')``) that groups more coarsely (by region only) makes each of its cells the sum of several
inner cells of the other (the region's cells of those six activities), none of them a cell of
its own. Its value is then one more equation over the other table's cells: where the other hides
one of them and publishes the rest, the hidden one is the difference.

Red team s45f: enterprises' turnover by region x nace suppressed under ``nk:1,60`` and ``freq:3``
(85 primaries), then the same table over ``nace IN ('A','B','D','F','G','H')`` by region, as a
second suppression job (nothing sensitive in it) or a rounding to base 5: R04's cell less the
five published activities of R04 gave the hidden (R04, H), 23,879,637, exactly or within 4,
where the first job's own audit reported [0, 79,696,326]. The second table's cells are no
cells of the first, so both jobs were stored.

:func:`union_of_cells` finds such a pair in the data now, in either order: a cell of one table
(any grouping of its dimensions) whose units all lie in the other's population and which holds
every unit of each of the other's inner cells it meets. A suppression job next to it could be
audited together with it only over one cover of both populations (the LP over the cross
classification of both tables' dimensions and of the two WHEREs; the linked audit,
:mod:`sqlsdc.jobs.linked_audit`, models one population only), so the pair is refused as two
protections of the same cells are (:func:`sqlsdc.jobs.refusals._refuse_second_protection`).
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.jobs.exact_release import kept
from sqlsdc.jobs.unit_cells import one_cell_each


def union_of_cells(con, first, second, *, first_keys: list[exp.Expr] | None = None) -> bool:
    """Whether a cell of one of two jobs (``JobSpec``, same table and aggregate) is the union
    of inner cells of the other, in the table's data now (:func:`_union_query`, both orders).
    ``first_keys``: the expressions on the table's rows that cut ``first``'s cells, when they
    are not its ``dims``."""
    keys = first_keys if first_keys is not None else _keys(first)
    return cells_add_up(con, first, second, keys) or cells_add_up(con, second, first)


def cells_add_up(con, cells, inner, cells_keys=None, *, shared: bool = True) -> bool:
    """Whether a cell of ``cells`` is the union of inner cells of ``inner``
    (:func:`_union_query`), ``cells_keys`` cutting its cells when they are not its ``dims``
    (an anonymised file's exact columns, as :class:`~sqlsdc.jobs.exact_release.Release`
    holds them); ``shared`` False: one that is a cell of ``inner`` (inner or margin) does not
    count."""
    keys = cells_keys if cells_keys is not None else _keys(cells)
    additive = _additive(con, cells, inner, keys, _keys(inner))
    query = _union_query(cells, inner, keys, _keys(inner), shared, additive=additive)
    # written once and dropped: the generator need not copy it first
    return con.execute(query.sql("duckdb", copy=False)).fetchall()[0][0] > 0


def _additive(con, cells, inner, cells_keys, inner_keys) -> bool:
    """Whether each unit of the rows either release reads lies in one finest cell (both
    releases' keys, both populations): then the union query adds up per-cell counts and sums
    of hashes instead of counting distinct units per grouping
    (:func:`~sqlsdc.jobs.unit_cells.one_cell_each`)."""
    member, rows = _member(cells)
    in_a, in_b = kept(cells.where), kept(inner.where)
    names = [f"__k{i}" for i in range(len(cells_keys) + len(inner_keys))]
    keyed = zip([*cells_keys, *inner_keys], names, strict=True)
    select = exp.select(
        *(exp.alias_(k.copy(), n) for k, n in keyed),
        exp.alias_(in_a.copy(), "__in_a"),
        exp.alias_(in_b.copy(), "__in_b"),
        exp.alias_(exp.Anonymous(this="hash", expressions=[member]), "__m"),
        copy=False,
    ).from_(cells.table, copy=False)
    select = select.where(exp.and_(exp.or_(in_a, in_b), rows), copy=False)
    return one_cell_each(con, select, "__m", [*names, "__in_a", "__in_b"])


def _member(cells) -> tuple[exp.Expr, exp.Expr]:
    """``(unit, rows)``: what a unit is (the unit of a count, the row of a sum) and the rows
    that hold one (a sum's with a non-zero measure)."""
    if cells.measure is None:
        return exp.column(cells.unit), exp.true()
    member = exp.column(cells.table)  # the row as a struct (a view has no rowid)
    nonzero = exp.column(cells.measure).neq(exp.Literal.number(0))
    return member, exp.Coalesce(this=nonzero, expressions=[exp.false()])


def _keys(spec) -> list[exp.Expr]:
    return [exp.column(d) for d in spec.dims]


def _union_query(
    cells, inner, cells_keys, inner_keys, shared: bool = True, *, additive: bool = False
) -> exp.Select:
    """The number of cells of ``cells`` (every grouping of its dimensions) that are unions of
    inner cells of ``inner``: each of its units is in ``inner``'s population, and each inner
    cell of ``inner`` it meets, it meets whole. Units are counted as the fingerprints of
    :func:`sqlsdc.jobs.stored_tables._fingerprints` count them: the unit of a count, the row
    with a non-zero measure of a sum (a sum's value is theirs). ``shared`` False: such a
    cell that holds what a cell of ``inner`` holds (the same number and sum of hashes of its
    units) is left out. ``additive`` (each unit in one finest cell, :func:`_additive`): the
    rows are aggregated by their finest cells first and the groupings add those up, the same
    numbers at a fraction of the cost.

    Built without sqlglot's copy at each builder step (``copy=False``): a step copied the
    whole query so far, nested subqueries included (25-33 query copies per union query); a
    query used twice (``r``, ``whole``) is copied at each use but its last."""
    # a release of no cut (a file of measures only) is one cell: a constant key (an empty
    # CUBE is no SQL: the engine refused the whole check, s48c)
    cells_keys, inner_keys = (
        cells_keys or [exp.Literal.number(0)],
        inner_keys or [exp.Literal.number(0)],
    )
    a = [f"__a{i}" for i in range(len(cells_keys))]
    b = [f"__b{i}" for i in range(len(inner_keys))]
    member, rows = _member(cells)
    in_a, in_b = kept(cells.where), kept(inner.where)
    r = (
        exp.select(
            *(exp.alias_(k.copy(), n) for k, n in zip(cells_keys, a, strict=True)),
            *(exp.alias_(k.copy(), n) for k, n in zip(inner_keys, b, strict=True)),
            exp.alias_(exp.Anonymous(this="hash", expressions=[member]), "__m"),
            exp.alias_(in_b.copy(), "__in_b"),
            copy=False,
        )
        .from_(cells.table, copy=False)
        .where(exp.and_(in_a, rows), copy=False)
    )
    whole = (
        exp.select(
            *(exp.alias_(k.copy(), n) for k, n in zip(inner_keys, b, strict=True)),
            exp.alias_(exp.Anonymous(this="hash", expressions=[member.copy()]), "__m"),
            copy=False,
        )
        .from_(cells.table, copy=False)
        .where(exp.and_(in_b.copy(), rows.copy()), copy=False)
    )
    if additive:  # each unit in one finest cell: count its rows' units once, add them up
        r = _per_cell(r.subquery("__r0", copy=False), [*a, "__in_b", *b])
        whole = _per_cell(whole.subquery("__w0", copy=False), b)
    count, hashes = _adders(additive)
    sizes = (
        exp.select(*b, exp.alias_(count(), "__nb"), copy=False)
        .from_(whole.subquery("__w", copy=not shared), copy=False)  # used again unless shared
        .group_by(*b, copy=False)
    )
    grouping = exp.Anonymous(this="grouping", expressions=[exp.column(n) for n in a])
    pairs = (
        exp.select(
            exp.alias_(grouping, "__g"),
            *a,
            "__in_b",
            *b,
            exp.alias_(count(), "__k"),
            exp.alias_(hashes(), "__h"),
            copy=False,
        )
        .from_(r.subquery("__r", copy=not shared), copy=False)  # used again unless shared
        .group_by(exp.Cube(expressions=[exp.column(n) for n in a]), "__in_b", *b, copy=False)
    )
    on = exp.and_(
        exp.column("__in_b", "p"),
        *(exp.NullSafeEQ(this=exp.column(n, "p"), expression=exp.column(n, "s")) for n in b),
    )
    whole_cell = exp.Coalesce(
        this=exp.and_(
            exp.column("__in_b", "p"),
            exp.column("__k", "p").eq(exp.column("__nb", "s")),
        ),
        expressions=[exp.false()],
    )
    per_cell = (
        exp.select(
            exp.alias_(exp.func("bool_and", whole_cell), "__union"),
            exp.alias_(exp.Sum(this=exp.column("__k", "p")), "__n"),
            exp.alias_(exp.Sum(this=exp.column("__h", "p")), "__h"),
            copy=False,
        )
        .from_(pairs.subquery("p", copy=False), copy=False)
        .join(exp.Join(this=sizes.subquery("s", copy=False), side="LEFT"), on=on, copy=False)
        .group_by(exp.column("__g", "p"), *(exp.column(n, "p") for n in a), copy=False)
    )
    if shared:
        found = exp.select(exp.Count(this=exp.Star()), copy=False)
        found = found.from_(per_cell.subquery("c", copy=False), copy=False)
        return found.where(exp.column("__union", "c"), copy=False)
    # an inner cell of ``inner`` that is a cell of ``cells`` too: ``cells`` shows it itself
    mine = _fingerprints(r.subquery("__r", copy=False), a, cube=True, additive=additive)
    parts = _fingerprints(whole.subquery("__w"), b, cube=False, additive=additive)
    shown = (
        exp.select(*(exp.column(n, "q") for n in b), copy=False)
        .from_(parts.subquery("q", copy=False), copy=False)
        .join(
            exp.Join(this=mine.subquery("f", copy=False), kind="INNER"),
            on=exp.and_(
                exp.column("__n", "q").eq(exp.column("__n", "f")),
                exp.column("__h", "q").eq(exp.column("__h", "f")),
            ),
            copy=False,
        )
        .distinct(copy=False)
    )
    seen = exp.column("__seen", "v").is_(exp.true())
    shown = shown.select(exp.alias_(exp.true(), "__seen"), copy=False).subquery("v", copy=False)
    on = exp.and_(
        exp.column("__in_b", "p"),
        *(exp.NullSafeEQ(this=exp.column(n, "p"), expression=exp.column(n, "v")) for n in b),
    )
    per_cell = per_cell.join(exp.Join(this=shown, side="LEFT"), on=on, copy=False)
    all_shown = exp.func("bool_and", exp.Coalesce(this=seen, expressions=[exp.false()]))
    per_cell = per_cell.select(exp.alias_(all_shown, "__shown"), copy=False)
    found = exp.select(exp.Count(this=exp.Star()), copy=False)
    found = found.from_(per_cell.subquery("c", copy=False), copy=False)
    found = found.where(exp.not_(exp.column("__shown", "c")), copy=False)
    theirs = _fingerprints(whole.subquery("__w", copy=False), b, cube=True, additive=additive)
    same = exp.and_(
        exp.column("__n", "c").eq(exp.column("__n", "t")),
        exp.column("__h", "c").eq(exp.column("__h", "t")),
    )
    found = found.join(
        exp.Join(this=theirs.subquery("t", copy=False), side="LEFT"), on=same, copy=False
    )
    unseen = exp.and_(exp.column("__union", "c"), exp.column("__n", "t").is_(exp.null()))
    return found.where(unseen, copy=False)


def _fingerprints(
    source: exp.Expr, keys: list[str], *, cube: bool, additive: bool = False
) -> exp.Select:
    """``(keys..., __n, __h)``: the number and sum of hashes of the units of each cell of
    ``source`` by ``keys`` (every grouping of them when ``cube``, the keys then left out);
    ``additive``: ``source`` is per finest cell (:func:`_per_cell`)."""
    count, hashes = _adders(additive)
    select = exp.select(
        *([] if cube else keys),
        exp.alias_(count(), "__n"),
        exp.alias_(hashes(), "__h"),
        copy=False,
    ).from_(source, copy=False)
    if cube:
        return select.group_by(exp.Cube(expressions=[exp.column(k) for k in keys]), copy=False)
    return select.group_by(*keys, copy=False)


def _distinct_count(column: str) -> exp.Count:
    return exp.Count(this=exp.Distinct(expressions=[exp.column(column)]))


def _per_cell(source: exp.Expr, keys: list[str]) -> exp.Select:
    """``source``'s rows aggregated by ``keys``: ``__k`` units and ``__m`` the sum of their
    hashes per cell (the columns :func:`_adders` adds up)."""
    return (
        exp.select(
            *keys,
            exp.alias_(_distinct_count("__m"), "__k"),
            exp.alias_(exp.Sum(this=exp.Distinct(expressions=[exp.column("__m")])), "__m"),
            copy=False,
        )
        .from_(source, copy=False)
        .group_by(*keys, copy=False)
    )


def _adders(additive: bool):
    """``(count, hashes)``: builders of a cell's number of units and sum of their hashes,
    over rows (distinct ``__m``) or over finest cells (:func:`_per_cell`: sums)."""
    if additive:  # a COUNT of no rows is 0, a SUM NULL (a CUBE's grand total over none)
        zero = exp.Literal.number(0)
        return (
            lambda: exp.Coalesce(this=exp.Sum(this=exp.column("__k")), expressions=[zero.copy()]),
            lambda: exp.Sum(this=exp.column("__m")),
        )
    return (
        lambda: _distinct_count("__m"),
        lambda: exp.Sum(this=exp.Distinct(expressions=[exp.column("__m")])),
    )

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
    query = _union_query(cells, inner, keys, _keys(inner), shared)
    return con.execute(query.sql("duckdb")).fetchall()[0][0] > 0


def _keys(spec) -> list[exp.Expr]:
    return [exp.column(d) for d in spec.dims]


def _union_query(cells, inner, cells_keys, inner_keys, shared: bool = True) -> exp.Select:
    """The number of cells of ``cells`` (every grouping of its dimensions) that are unions of
    inner cells of ``inner``: each of its units is in ``inner``'s population, and each inner
    cell of ``inner`` it meets, it meets whole. Units are counted as the fingerprints of
    :func:`sqlsdc.jobs.stored_tables._fingerprints` count them: the unit of a count, the row
    with a non-zero measure of a sum (a sum's value is theirs). ``shared`` False: such a
    cell that holds what a cell of ``inner`` holds (the same number and sum of hashes of its
    units) is left out."""
    # a release of no cut (a file of measures only) is one cell: a constant key (an empty
    # CUBE is no SQL: the engine refused the whole check, s48c)
    cells_keys, inner_keys = (
        cells_keys or [exp.Literal.number(0)],
        inner_keys or [exp.Literal.number(0)],
    )
    a = [f"__a{i}" for i in range(len(cells_keys))]
    b = [f"__b{i}" for i in range(len(inner_keys))]
    if cells.measure is None:
        member, rows = exp.column(cells.unit), exp.true()
    else:
        member = exp.column(cells.table)  # the row as a struct (a view has no rowid)
        nonzero = exp.column(cells.measure).neq(exp.Literal.number(0))
        rows = exp.Coalesce(this=nonzero, expressions=[exp.false()])
    in_a, in_b = kept(cells.where), kept(inner.where)
    r = (
        exp.select(
            *(exp.alias_(k.copy(), n) for k, n in zip(cells_keys, a, strict=True)),
            *(exp.alias_(k.copy(), n) for k, n in zip(inner_keys, b, strict=True)),
            exp.alias_(exp.Anonymous(this="hash", expressions=[member]), "__m"),
            exp.alias_(in_b.copy(), "__in_b"),
        )
        .from_(cells.table)
        .where(exp.and_(in_a, rows))
    )
    whole = (
        exp.select(
            *(exp.alias_(k.copy(), n) for k, n in zip(inner_keys, b, strict=True)),
            exp.alias_(exp.Anonymous(this="hash", expressions=[member.copy()]), "__m"),
        )
        .from_(cells.table)
        .where(exp.and_(in_b.copy(), rows.copy()))
    )
    sizes = (
        exp.select(*b, exp.alias_(_distinct_count("__m"), "__nb"))
        .from_(whole.subquery("__w"))
        .group_by(*b)
    )
    grouping = exp.Anonymous(this="grouping", expressions=[exp.column(n) for n in a])
    pairs = (
        exp.select(
            exp.alias_(grouping, "__g"),
            *a,
            "__in_b",
            *b,
            exp.alias_(_distinct_count("__m"), "__k"),
            exp.alias_(exp.Sum(this=exp.Distinct(expressions=[exp.column("__m")])), "__h"),
        )
        .from_(r.subquery("__r"))
        .group_by(exp.Cube(expressions=[exp.column(n) for n in a]), "__in_b", *b)
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
        )
        .from_(pairs.subquery("p"))
        .join(sizes.subquery("s"), on=on, join_type="left")
        .group_by(exp.column("__g", "p"), *(exp.column(n, "p") for n in a))
    )
    if shared:
        found = exp.select(exp.Count(this=exp.Star())).from_(per_cell.subquery("c"))
        return found.where(exp.column("__union", "c"))
    # an inner cell of ``inner`` that is a cell of ``cells`` too: ``cells`` shows it itself
    mine = _fingerprints(r.subquery("__r"), a, cube=True)
    parts = _fingerprints(whole.subquery("__w"), b, cube=False)
    shown = (
        exp.select(*(exp.column(n, "q") for n in b))
        .from_(parts.subquery("q"))
        .join(
            mine.subquery("f"),
            on=exp.and_(
                exp.column("__n", "q").eq(exp.column("__n", "f")),
                exp.column("__h", "q").eq(exp.column("__h", "f")),
            ),
            join_type="inner",
        )
        .distinct()
    )
    seen = exp.column("__seen", "v").is_(exp.true())
    per_cell = per_cell.join(
        shown.select(exp.alias_(exp.true(), "__seen")).subquery("v"),
        on=exp.and_(
            exp.column("__in_b", "p"),
            *(exp.NullSafeEQ(this=exp.column(n, "p"), expression=exp.column(n, "v")) for n in b),
        ),
        join_type="left",
    ).select(exp.alias_(exp.func("bool_and", exp.Coalesce(this=seen, expressions=[exp.false()])),
                        "__shown"))  # fmt: skip
    found = exp.select(exp.Count(this=exp.Star())).from_(per_cell.subquery("c"))
    found = found.where(exp.not_(exp.column("__shown", "c")))
    theirs = _fingerprints(whole.subquery("__w"), b, cube=True)
    same = exp.and_(
        exp.column("__n", "c").eq(exp.column("__n", "t")),
        exp.column("__h", "c").eq(exp.column("__h", "t")),
    )
    found = found.join(theirs.subquery("t"), on=same, join_type="left")
    return found.where(exp.and_(exp.column("__union", "c"), exp.column("__n", "t").is_(exp.null())))


def _fingerprints(source: exp.Expr, keys: list[str], *, cube: bool) -> exp.Select:
    """``(keys..., __n, __h)``: the number and sum of hashes of the units of each cell of
    ``source`` by ``keys`` (every grouping of them when ``cube``, the keys then left out)."""
    select = exp.select(
        *([] if cube else keys),
        exp.alias_(_distinct_count("__m"), "__n"),
        exp.alias_(exp.Sum(this=exp.Distinct(expressions=[exp.column("__m")])), "__h"),
    ).from_(source)
    if cube:
        return select.group_by(exp.Cube(expressions=[exp.column(k) for k in keys]))
    return select.group_by(*keys)


def _distinct_count(column: str) -> exp.Count:
    return exp.Count(this=exp.Distinct(expressions=[exp.column(column)]))

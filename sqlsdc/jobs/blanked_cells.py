"""The blanked-cells check: a local suppression's blanked values placed by an exact table.

A local suppression's blanked values are a cell of their own (:func:`blanked_difference`):
counted as they were, a file and an exact table of the same people by a blanked column differ
nowhere, but the file shows the column's cell short of its blanked records there, so the
table's cell less the file's records that show it is the number of blanked records that belong
to it, which places blanked values when it is small (red team s37c: a 3-anonymous file of
everyone aged 85 or over, 453 municipalities blanked, next to a table of the same people by
municipality: 4 in R01-M001). Every cell of the table counts as published, a cell its own
pattern hides too. Hundepool et al., *Statistical Disclosure Control*, Wiley 2012: local
suppression replaces values by missing ones (ch. 3), and releases of the same data are linked
tables whose protection must be judged together (ch. 4); digest
``shared/reference/seed_2006_tabular.md`` (consistent suppression across linked tables). Not
covered there: a cell where the file holds records the table does not count and its columns
do not tell which (both sides mix), and a coarser column that only a combination of the file's
columns determines. :mod:`sqlsdc.jobs.differencing` turns a finding into a refusal.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.jobs.exact_release import Release, columns_read, held_cuts, kept


def blanked_difference(con, spec, other: Release, least: int):
    """``(cell, units, columns)`` of a cell of the job ``spec`` that the file ``other``
    shows short of some records whose value of ``columns`` a local suppression blanked, and
    whose exact value less the file's records that show the cell is ``0 < units < least``;
    or None (always when no column of the cell was blanked: the ordinary case costs nothing).

    The file's shown count in a cell of a blanked column is its true count less its blanked
    records there, so next to the job's exact value of the cell the difference is those records
    (plus the job's units outside the file): a small one places the blanked values. The cell's
    columns are the file's cuts that read only the job's dimensions (the job's cells summed to
    the file's bands) and the job's dimensions the file's values determine (a region by its
    municipalities: the coarser table's difference is the sum of its municipalities'). The
    file's records count where the reader knows them to be in the job's population: all of a
    cell that holds none outside it, or, when the file's other columns tell of each record
    whether the job counts it (:func:`~sqlsdc.jobs.exact_release.tells`), those it counts. A
    cell whose records the job's population does not hold and the file's do mixes both sides.
    Records are counted whatever a sum's measure (more differences, the safe side); a unit of
    several rows is counted as its rows."""
    if other.exact is None or not other.blanked or other.records is None:
        return None
    keys = _placed_keys(con, spec, other)
    if not any(blanked for *_k, blanked in keys):
        return None
    held = held_cuts(con, spec, other) if spec.where is not None else []
    told = spec.where is None or bool(held)
    mine, theirs = kept(spec.where), kept(other.where)
    names = [f"k{j}" for j in range(len(keys))]
    rows = (
        exp.select(
            *(
                exp.alias_(_norm(source), n)
                for n, (_l, source, _f, _b) in zip(names, keys, strict=True)
            ),
            exp.alias_(exp.column(spec.unit), "u"),
            exp.alias_(mine, "m"),
            exp.alias_(theirs.copy(), "t"),
        )
        .from_(spec.table)
        .where(exp.or_(mine.copy(), theirs.copy()))
    )

    grouping = exp.alias_(
        exp.Anonymous(this="GROUPING", expressions=[exp.column(n) for n in names]), "g"
    )
    cube = exp.Cube(expressions=[exp.column(n) for n in names])
    source_cells = (
        exp.select(
            *(exp.column(n) for n in names),
            grouping.copy(),
            _count("m", "n", distinct=True),
            _count("m AND t", "i", distinct=False),
            _count("t AND NOT m", "b", distinct=False),
        )
        .from_(rows.subquery("r"))
        .group_by(cube.copy())
    )
    file_rows = _file_rows(spec, other, keys, names, held)
    file_cells = (
        exp.select(
            *(exp.column(n) for n in names),
            grouping,
            exp.alias_(exp.func("count_if", exp.column("inside")), "s"),
        )
        .from_(file_rows.subquery("f"))
        .group_by(cube)
    )
    same = [exp.column("g", table="x").eq(exp.column("g", table="y"))] + [
        exp.NullSafeEQ(this=exp.column(n, table="x"), expression=exp.column(n, table="y"))
        for n in names
    ]
    shown = exp.Coalesce(this=exp.column("s", table="y"), expressions=[exp.Literal.number(0)])
    short = exp.Sub(this=exp.column("i", table="x"), expression=shown.copy())
    left = exp.Sub(this=exp.column("n", table="x"), expression=shown)
    wanted = exp.and_(
        exp.GT(this=short, expression=exp.Literal.number(0)),
        left.copy().between(1, least - 1),
        exp.true() if told else exp.column("b", table="x").eq(0),
    )
    select = (
        exp.select(
            *(exp.column(n, table="x") for n in names),
            exp.column("g", table="x"),
            exp.alias_(left, "d"),
        )
        .from_(source_cells.subquery("x"))
        .join(file_cells.subquery("y"), on=exp.and_(*same), join_type="left")
        .where(wanted)
        .order_by(*(exp.column(n, table="x") for n in names))
        .limit(1)
    )
    row = next(iter(con.execute(select.sql("duckdb")).fetchall()), None)
    if row is None:
        return None
    values, g, units = row[: len(names)], row[-2], row[-1]
    cell = {label: (None if g >> (len(keys) - 1 - j) & 1 else value)
            for j, ((label, *_r), value) in enumerate(zip(keys, values, strict=True))}  # fmt: skip
    columns = sorted({blanked for *_k, blanked in keys if blanked})
    return cell, units, columns


def _placed_keys(con, spec, other: Release) -> list[tuple[str, exp.Expr, exp.Expr, str | None]]:
    """``(label, expression on the table, expression on the file's records, blanked)`` of the
    columns by which the job's exact cells can be compared with the file's shown records:
    the file's cuts that read only the job's dimensions, then each other dimension of the job
    that a plain column of the file determines over the file's population (blanked ones
    tried first), looked up by its value. ``blanked``: the file's column it is shown by, if a
    local suppression blanked it."""
    dims = {d.lower() for d in spec.dims}
    found, covered = [], set()
    for name, expression in other.exact:
        reads = columns_read(expression)
        if reads and reads <= dims:
            blanked = name if reads & other.blanked else None
            found.append((name, expression.copy(), _record(name), blanked))
            covered |= reads
    plain = [(n, e) for n, e in other.exact if isinstance(e, exp.Column)]
    blanked_first = [c for c in plain if c[1].name.lower() in other.blanked]
    for columns in (blanked_first, [c for c in plain if c not in blanked_first]):
        if columns is not blanked_first and not any(b for *_k, b in found):
            break  # nothing blanked to compare: the other lookups would be for nothing
        for dim in (d for d in spec.dims if d.lower() not in covered):
            for name, column in columns:
                if _determines(con, spec.table, other.where, column, dim):
                    value = _norm(exp.column(dim))
                    lookup = _lookup(spec.table, other.where, column, name, value)
                    blanked = name if column.name.lower() in other.blanked else None
                    found.append((dim, exp.column(dim), lookup, blanked))
                    covered.add(dim.lower())
                    break
    return found


def _determines(con, table: str, where, column: exp.Column, dim: str) -> bool:
    """Whether each value of ``column`` in the file's population has one value of ``dim``."""
    several = (
        exp.select(exp.Literal.number(1))
        .from_(table)
        .where(
            exp.and_(kept(where), exp.Not(this=exp.Is(this=column.copy(), expression=exp.null())))
        )
        .group_by(column.copy())
        .having(
            exp.GT(
                this=exp.Count(this=exp.Distinct(expressions=[exp.column(dim)])),
                expression=exp.Literal.number(1),
            )
        )
        .limit(1)
    )
    return not con.execute(several.sql("duckdb")).fetchall()


def _file_rows(spec, other: Release, keys, names: list[str], held) -> exp.Select:
    """The file's records with the cell they show (``names``) and whether the reader knows
    the job counts them (``inside``): each, unless the file's held columns (``held``, from
    :func:`held_cuts`) tell it, looked up by their values."""
    inside: exp.Expr = exp.true()
    if held:
        inside = exp.select(exp.func("bool_and", kept(spec.where))).from_(spec.table)
        inside = inside.where(exp.and_(kept(other.where), *(
            exp.NullSafeEQ(this=_norm(e), expression=_norm(_record(n))) for n, e in held
        ))).subquery()  # fmt: skip
    return exp.select(
        *(exp.alias_(_norm(shown), n) for n, (_l, _s, shown, _b) in zip(names, keys, strict=True)),
        exp.alias_(inside, "inside"),
    ).from_(other.records.copy().as_("r"))


def _lookup(table: str, where, column: exp.Column, name: str, value: exp.Expr) -> exp.Expr:
    """``value`` of the table's rows of the file's population whose ``column`` is the file
    record's ``name`` (one value: :func:`_determines`); NULL for a blanked one."""
    match = exp.EQ(this=_norm(column), expression=_norm(_record(name)))
    found = exp.select(exp.Min(this=value)).from_(table).where(exp.and_(kept(where), match))
    return found.subquery()


def _record(name: str) -> exp.Column:
    return exp.column(name, table="r", quoted=True)


def _norm(value: exp.Expr) -> exp.Expr:
    """A value as text that reads alike in the table and in the file (whose numbers may come
    back as floats, its categories as text): a number as a DOUBLE's text, else the text."""
    number = exp.TryCast(this=value.copy(), to=exp.DataType.build("DOUBLE"))
    text = exp.Cast(this=number, to=exp.DataType.build("VARCHAR"))
    return exp.Coalesce(
        this=text, expressions=[exp.Cast(this=value.copy(), to=exp.DataType.build("VARCHAR"))]
    )


def _count(condition: str, alias: str, *, distinct: bool) -> exp.Expr:
    """The rows of ``r`` where ``condition`` holds, or their distinct units ``u``."""
    counted = exp.Count(this=exp.Distinct(expressions=[exp.column("u")]) if distinct
                        else exp.Star())  # fmt: skip
    where = exp.Where(this=exp.condition(condition))
    return exp.alias_(exp.Filter(this=counted, expression=where), alias)

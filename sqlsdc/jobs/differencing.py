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

:func:`refuse_small_differences` refuses such a job before it computes anything. Pairwise
(:func:`_uncovered`, both orders), every cell of either release (every grouping of its
columns) is compared with the inner cells of the other that cover its units, whatever their
dimensions: a WHERE that fixes a dimension the other table groups by (``region = 'R01'``
beside a table by region) makes its total a cell of the other (red team s38b: a job by sex
over ``age >= 85 AND region = 'R01'`` and one by region over ``age >= 85`` less one
municipality's person gave that person's income). The cover less the cell is the cover's
units outside the cell's population, less the cell's units outside the cover's, plus the
cover's units of the cell's own release in its other inner cells: those of whole inner cells
are its own published cells (or margins its pattern protects) and tell nothing new, those of
inner cells the cover holds only in part count as a difference (red team s38e: a job of
everyone aged 84 or over by region and education, less the README's file's band ``>=85`` of
the same cell, was the one person aged 84 of the file's band 75-84). The rest must be none or
at least the minimum frequency of units on the side that differs (differences on both sides
mix what the two groups add up to). Across more tables
(:func:`sqlsdc.jobs.isolated_groups.refuse_isolated_groups`), a signed
sum of several may isolate a group that no pair does (T1 - T2 + T3 - T4 of four jobs over R02
∪ R03 ∪ {one person}, R02 ∪ R03 ∪ R04, R02 ∪ R04 and R02, red team s38b): in each cell that
three or more of them publish, no combination of them may add up to a group of regions of
their populations' Venn diagram of fewer than the minimum frequency of units.

An anonymised file is the exact tables it implies (:class:`Release` with ``exact``, written by
:mod:`sqlsdc.jobs.record_files` from :func:`sqlsdc.microdata.steps.exact_columns`): a cell for
every combination of values of its columns that no perturbative step changed and that read a
dimension (under any name), a recoded column cut by its bands. Its inner cells are the
combinations of all of them, so a table's cell is compared with the file's cells that cover it,
however finely the file cuts (red team s37c: the README's ``seniors_r01``, R01 aged 65 or over
with age banded 65/75/85, and ``old_people``, everyone aged 90 or over by municipality and
education: a cell of the 85+ band less the job's gave the 85-89-year-olds of that municipality
and education; red team s38b: a file's (R01, education) sum next to a job by region over one
education). Where the file's exact columns tell of each of its records whether the table counts
it (the table's WHERE reads only columns the file holds and no local suppression blanked, and
is the same within each combination of their released values: ``age >= 90`` next to a band
``>=90``), the file's records outside the table are counts of the file's own cells, no new
information; then only the table's units outside the file are a difference.
:func:`refuse_file_differences` checks a new file against the exact tables stored before it,
:func:`refuse_small_differences` a new table against the stored files.

Not covered: a rounded or raked table next to another (their difference bounds those units' sum
within the two perturbations; red team s33c keeps that allowed); combinations of cells of
several tables of different dimensions beyond a cell and its cover (the signed sums take the
tables that group by a cell's dimensions, a file by its plain dimension columns); the two
patterns together (a cell hidden in one table and published in the other, the attacker LP over
both with non-negative differences): protecting linked tables of different populations needs
one covering universe (red team s30f); two anonymised files of one table cut by cut (when both
are released, each file's counts by its plain columns are compared with the other's cells and
cuts, ``sqlsdc.jobs.file_pairs``; a cut of one next to a cut of the other is not; a file
whose query is no WHERE is refused released with another file of its table). Replaced or
dropped outputs are compared as their readers keep them, every earlier version of a job's
table (``sqlsdc.jobs.protect.exact_tables``) and of an anonymised file
(``sqlsdc.jobs.record_files.stored_files``), from the outputs' history
(:mod:`sqlsdc.jobs.output_history`).

A local suppression's blanked values are a cell of their own (:func:`_blanked_difference`):
counted as they were, a file and an exact table of the same people by a blanked column differ
nowhere, but the file shows the column's cell short of its blanked records there, so the
table's cell less the file's records that show it is the number of blanked records that belong
to it, which places blanked values when it is small (red team s37c: a 3-anonymous file of
everyone aged 85 or over, 453 municipalities blanked, next to a table of the same people by
municipality: 4 in R01-M001). Every cell of the table counts as published, as above, a cell its
own pattern hides too. Hundepool et al., *Statistical Disclosure Control*, Wiley 2012: local
suppression replaces values by missing ones (ch. 3), and releases of the same data are linked
tables whose protection must be judged together (ch. 4); digest
``shared/reference/seed_2006_tabular.md`` (consistent suppression across linked tables). Not
covered there: a cell where the file holds records the table does not count and its columns
do not tell which (both sides mix), and a coarser column that only a combination of the file's
columns determines.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlglot import exp

from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.isolated_groups import kept as _kept
from sqlsdc.jobs.isolated_groups import refuse_isolated_groups
from sqlsdc.policy import Policy
from sqlsdc.tabular.rules import FrequencyRule, parse_rule


@dataclass(frozen=True)
class Release:
    """Another release of a table, as the exact cells it gives.

    Attributes:
        label: how messages name it (an output, the suppression pattern).
        where: its population, a condition on the table's rows (None: every row).
        dims: the table's columns it cuts cells by as they are.
        exact: an anonymised file's columns that no perturbative step changed and that cut
            cells (those that read a dimension, and any recoded column), as ``(name in the file,
            expression on the table)`` (a recoded column is its bands); every combination of
            their values is a cell. None for a table, whose cells are the groupings of
            ``dims``.
        held: the table's columns a file holds unperturbed, coarsened or not (it gives their
            sums; a top-coded one counts, which errs on the safe side).
        blanked: the table's columns a file's local suppression blanked in some records:
            counted as they were (more cells, the safe side), they tell nobody which records
            a table counts.
        records: a file's records as it shows them (a stored table, or the new file
            registered for the check), read for the cells its blanked values leave short.
    """

    label: str
    where: exp.Expr | None
    dims: tuple[str, ...]
    exact: tuple[tuple[str, exp.Expr], ...] | None = None
    held: frozenset[str] = frozenset()
    blanked: frozenset[str] = frozenset()
    records: exp.Table | None = None

    def holds(self, column: str) -> bool:
        """Whether its cells give sums of ``column``."""
        return self.exact is None or column.lower() in self.held


def refuse_small_differences(
    con, policy: Policy, spec, others: list[Release], label: str = "the job", *, error=None
) -> None:
    """Refuse the job ``spec`` (a :class:`~sqlsdc.jobs.protect.JobSpec`; ``label`` names it)
    when one of ``others`` (same table and aggregate) and it hold a cell and the other's inner
    cells that cover it whose populations differ, on one side only, by fewer units than the
    table's minimum frequency (:func:`_smallest_difference`), when a file's blanked values
    leave one of its cells that few units short (:func:`_blanked_difference`), or when with
    three or more of them a signed sum isolates that few (:func:`refuse_isolated_groups`).
    ``error`` makes the refusal's exception from its message (a job's: TabularError)."""
    error = error or TabularError
    least = min_frequency(policy, spec.table)
    for other in others:
        _refuse_pair(con, spec, other, least, (label, other.label), error)
    refuse_isolated_groups(con, spec, others, least, label=label, error=error)


def refuse_file_differences(con, policy: Policy, file: Release, tables: list) -> None:
    """Refuse an anonymised file (``file``, labelled as the job's output) when one of the
    exact tables stored before it (``tables``: ``(label, JobSpec)`` of its table) and the file
    differ so, or several with it isolate a group: the other order of
    :func:`refuse_small_differences`. A table of sums is compared only with a file that holds
    its measure unperturbed."""
    tables = [(label, spec) for label, spec in tables
              if spec.measure is None or file.holds(spec.measure)]  # fmt: skip
    for label, spec in tables:
        least = min_frequency(policy, spec.table)
        _refuse_pair(con, spec, file, least, (label, file.label), MicrodataError)
    for measure in dict.fromkeys(spec.measure for _l, spec in tables):
        same = [(label, spec) for label, spec in tables if spec.measure == measure]
        # the file as a table of this aggregate by its plain dimension columns
        spec = replace(same[0][1], dims=file.dims, where=file.where)
        others = [Release(label, theirs.where, theirs.dims) for label, theirs in same]
        least = min_frequency(policy, spec.table)
        refuse_isolated_groups(con, spec, others, least, label=file.label, error=MicrodataError)


def _refuse_pair(con, spec, other: Release, least: int, names: tuple[str, str], error) -> None:
    """Raise ``error`` when the table ``spec`` and the release ``other`` differ by fewer than
    ``least`` units in a cell and its cover (:func:`_smallest_difference`), or leave a file's
    blanked values placed (:func:`_blanked_difference`); ``names`` are the two in the message,
    the table's first."""
    found = _smallest_difference(con, spec, other, least)
    if found is not None:
        raise error(_message(spec.table, *names, found, least))
    placed = _blanked_difference(con, spec, other, least)
    if placed is not None:
        raise error(_blanked_message(spec.table, *names, placed, least))


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


def _message(table: str, first: str, second: str, found, least: int) -> str:
    cell, units, side = found
    named = ", ".join(f"{d} = {v!r}" for d, v in cell.items() if v is not None) or "total"
    holder, other = (first, second) if side == "a" else (second, first)
    return (
        f"the population of {first} and that of {second} overlap and differ by only {units} "
        f"unit(s) of {table} in a cell of one ({named}) and the inner cells of the other that "
        f"cover it, {units} that {holder} counts and {other} does not: the difference of "
        f"their values would show what those units add up to, which no cell of fewer than "
        f"{least} units (the policy's minimum frequency) may show. Tabulate a population that "
        "differs from it by none or by at least that many units in every cell they share"
    )


def _blanked_message(table: str, job: str, file: str, placed, least: int) -> str:
    cell, units, columns = placed
    named = ", ".join(f"{d} = {v!r}" for d, v in cell.items() if v is not None) or "total"
    return (
        f"{file} blanked values of {', '.join(columns)} by local suppression, and {job} "
        f"publishes an exact value of the same units of {table} in a cell ({named}) from "
        f"which the file's records that show the cell leave only {units} unit(s): the "
        "difference counts the file's records whose blanked value belongs to the cell, and "
        f"places those values in a group of fewer than {least} units (the policy's minimum "
        "frequency). Tabulate another population or grouping, or anonymise with a step "
        "that blanks or perturbs other columns"
    )


def _blanked_difference(con, spec, other: Release, least: int):
    """``(cell, units, columns)`` of a cell of the job ``spec`` that the file ``other``
    shows short of some records whose value of ``columns`` a local suppression blanked, and
    whose exact value less the file's records that show the cell is ``0 < units < least``;
    or None (always when no column of the cell was blanked: the ordinary case costs nothing).

    The file's shown count in a cell of a blanked column is its true count less its blanked
    records there, so next to the job's exact value of the cell the difference is those
    records (plus the job's units outside the file): a small one places the blanked values.
    The cell's columns are the file's cuts that read only the job's dimensions (the job's
    cells summed to the file's bands) and the job's dimensions the file's values determine
    (a region by its municipalities: the coarser table's difference is the sum of its
    municipalities'). The file's records count where the reader knows them to be in the
    job's population: all of a cell that holds none outside it, or, when the file's other
    columns tell of each record whether the job counts it (:func:`_tells`), those it counts.
    A cell whose records the job's population does not hold and the file's do mixes both
    sides. Records are counted whatever a sum's measure (more differences, the safe side);
    a unit of several rows is counted as its rows."""
    if other.exact is None or not other.blanked or other.records is None:
        return None
    keys = _placed_keys(con, spec, other)
    if not any(blanked for *_k, blanked in keys):
        return None
    held = _held(con, spec, other) if spec.where is not None else []
    told = spec.where is None or bool(held)
    mine, theirs = _kept(spec.where), _kept(other.where)
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
        reads = _reads(expression)
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
            exp.and_(_kept(where), exp.Not(this=exp.Is(this=column.copy(), expression=exp.null())))
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
    :func:`_held`) tell it, looked up by their values."""
    inside: exp.Expr = exp.true()
    if held:
        inside = exp.select(exp.func("bool_and", _kept(spec.where))).from_(spec.table)
        inside = inside.where(exp.and_(_kept(other.where), *(
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
    found = exp.select(exp.Min(this=value)).from_(table).where(exp.and_(_kept(where), match))
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


def _smallest_difference(con, spec, other: Release, least: int):
    """``(cell, units, side)`` of a cell of the job ``spec`` or of ``other`` that the inner
    cells of the other cover but for ``0 < units < least`` units on one side only; or None.
    ``cell`` names the cell by its table's columns; ``side`` says who counts the units:
    ``"a"`` the job and not ``other``, ``"b"`` the other way.

    Both orders are tried (:func:`_uncovered`): the job's cells against ``other``'s inner
    cells, then ``other``'s against the job's. A file's cells are those of its exact columns
    (:attr:`Release.exact`), a table's those of its dimensions. When a file tells of each of
    its records whether the job counts it (:func:`_tells`), its records outside the job are
    counts of its own cells, no difference."""
    told = _tells(con, spec, other)
    job = (spec.where, [(d, exp.column(d)) for d in spec.dims], False)
    theirs = (other.where, _keys(other), told)
    found = _uncovered(con, spec, job, theirs, least)
    if found is not None:
        return found
    found = _uncovered(con, spec, theirs, job, least)
    if found is None:
        return None
    cell, units, side = found
    return cell, units, "b" if side == "a" else "a"


def _keys(release: Release) -> list[tuple[str, exp.Expr]]:
    """``(label, expression on the table)`` of the columns ``release`` cuts cells by."""
    if release.exact is not None:
        return [(n, e.copy()) for n, e in release.exact]
    return [(d, exp.column(d)) for d in release.dims]


Side = tuple  # (population WHERE or None, [(label, expression)], its outsiders are known)


def _uncovered(con, spec, cut: Side, cover: Side, least: int):
    """``(cell, units, side)`` of a cell of the release ``cut`` (every grouping of its keys)
    whose units in the population of ``cover`` fill the inner cells of ``cover`` they lie in
    but for ``units`` more (``side`` ``"b"``), with none of the cell outside that population,
    or the other way round (``"a"``: units of the cell that ``cover`` lacks), ``0 < units <
    least``; or None. The cell's value and the sum of those inner cells then differ by what
    those few units add up to. A side whose units outside the other population are known
    (the third element: a file that tells which of its records the job counts) counts none
    there."""
    (cut_where, cut_keys, cut_known), (cover_where, cover_keys, cover_known) = cut, cover
    keys = [f"__c{j}" for j in range(len(cut_keys))]
    inner = [f"__v{j}" for j in range(len(cover_keys))]
    rows = exp.select(
        exp.column(spec.unit).as_("__u"),
        *(e.copy().as_(k) for (_l, e), k in zip(cut_keys, keys, strict=True)),
        *(e.copy().as_(k) for (_l, e), k in zip(cover_keys, inner, strict=True)),
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
        pairs = [exp.NullSafeEQ(this=exp.column(n, left), expression=exp.column(n, right))
                 for n in names]  # fmt: skip
        return exp.and_(*pairs) if pairs else exp.true()

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
    # the cut's inner cells (all its keys) that the cover of a cell holds only in part: their
    # units there, outside the cell, are no sum of the cut's cells. An inner cell of one inner
    # cell of the cover, all in its population, is whole in every cover that meets it: only
    # the others (split) are looked at cell by cell
    outside_cover = exp.Filter(
        this=units("__x").this, expression=exp.Where(this=exp.not_(exp.column("__in_v")))
    )

    def count(expression: exp.Expr) -> exp.Expr:
        return exp.Count(this=expression)

    spans = [exp.GT(this=outside_cover, expression=exp.Literal.number(0))] + [
        exp.or_(  # two values of a key of the cover, NULL one of them
            exp.GT(this=count(exp.Distinct(expressions=[exp.column(v)])),
                   expression=exp.Literal.number(1)),
            exp.and_(exp.GT(this=count(exp.column(v)), expression=exp.Literal.number(0)),
                     exp.LT(this=count(exp.column(v)), expression=count(exp.Star()))),
        ) for v in inner
    ]  # fmt: skip
    whole = exp.select(*map(exp.column, keys), units("__all"), exp.or_(*spans).as_("__split"))
    whole = whole.from_("__r").where(exp.column("__in_c"))
    whole = whole.group_by(*map(exp.column, keys)) if keys else whole
    split = exp.select(*(exp.column(k, "r") for k in keys), exp.column("__u", "r"))
    split = split.select(exp.column("__in_c", "r"), exp.column("__in_v", "r"))
    split = split.select(*(exp.column(v, "r") for v in inner))
    split = split.from_(exp.to_table("__r").as_("r"))
    split = split.join(exp.to_table("__whole").as_("w"), on=same("r", "w", keys), join_type="inner")
    split = split.where(exp.column("__split", "w"))
    n = len(keys)
    in_cell = [exp.or_(
        exp.BitwiseAnd(this=exp.column("__g", "h"), expression=exp.Literal.number(1 << (n - 1 - j)))
        .neq(0),
        exp.NullSafeEQ(this=exp.column(k, "r"), expression=exp.column(k, "h")),
    ) for j, k in enumerate(keys)]  # fmt: skip
    elsewhere = exp.not_(exp.and_(*in_cell)) if keys else exp.false()  # a row outside the cell
    met = (
        exp.select(
            exp.column("__g", "h"),
            *(exp.column(k, "h").as_(f"__h{j}") for j, k in enumerate(keys)),
            *(exp.column(k, "r") for k in keys),
            exp.Count(this=exp.Distinct(expressions=[exp.column("__u", "r")])).as_("__met"),
        )
        .from_(exp.to_table("__split").as_("r"))
        .join(exp.to_table("__hits").as_("h"), on=same("r", "h", inner), join_type="inner")
        .where(exp.and_(exp.column("__in_c", "r"), exp.column("__in_v", "r"), elsewhere))
        .group_by(
            exp.column("__g", "h"),
            *(exp.column(k, "h") for k in keys),
            *(exp.column(k, "r") for k in keys),
        )
    )
    parts = (
        exp.select(
            exp.column("__g", "m"),
            *(exp.column(f"__h{j}", "m").as_(k) for j, k in enumerate(keys)),
            exp.Sum(this=exp.column("__met", "m")).as_("__part"),
        )
        .from_(exp.to_table("__met").as_("m"))
        .join(exp.to_table("__whole").as_("w"), on=same("m", "w", keys), join_type="inner")
        .where(exp.column("__met", "m") < exp.column("__all", "w"))
        .group_by(exp.column("__g", "m"), *(exp.column(f"__h{j}", "m") for j in range(n)))
    )
    zero = exp.Literal.number(0)
    outside = exp.Sub(this=exp.column("__n", "c"), expression=exp.column("__both", "o"))
    # units of the covering cells outside the cut's population, and inside it but not in the
    # cell where they are parts of the cut's inner cells (whole inner cells of the cut are its
    # own published cells, or margins its pattern protects: red team s38e, the one person
    # aged 84 of a job's cell was the file's band 75-84 cut by the job)
    excess = exp.Sub(this=exp.column("__covered", "o"), expression=exp.column("__inside", "o"))
    outside = zero.copy() if cut_known else outside
    excess = zero.copy() if cover_known else excess
    part = exp.Coalesce(this=exp.column("__part", "p"), expressions=[zero.copy()])
    excess = exp.Add(this=exp.paren(excess), expression=part)
    one_side = exp.or_(
        exp.and_(outside.copy().eq(0), excess.copy().between(1, least - 1)),
        exp.and_(excess.copy().eq(0), outside.copy().between(1, least - 1)),
    )
    coarsest_first = exp.Ordered(this=exp.column("__g", "c"), desc=True)
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
        .join(
            exp.to_table("__parts").as_("p"),
            on=exp.and_(exp.column("__g", "c").eq(exp.column("__g", "p")), same("c", "p", keys)),
            join_type="left",
        )
        .where(one_side)
        .order_by(coarsest_first, *(exp.column(k, "c") for k in keys))  # one message
        .limit(1)
    )
    for name, body in (
        ("__r", rows),
        ("__hits", hits),
        ("__sizes", sizes),
        ("__cells", cells),
        ("__covered", covered),
        ("__whole", whole),
        ("__split", split),
        ("__met", met),
        ("__parts", parts),
    ):
        select = select.with_(name, as_=body)
    row = next(iter(con.execute(select.sql("duckdb")).fetchall()), None)
    if row is None:
        return None
    level, values = row[0], row[1 : 1 + len(keys)]
    cell = {
        label: (None if level >> (len(keys) - 1 - j) & 1 else v)
        for j, ((label, _e), v) in enumerate(zip(cut_keys, values, strict=True))
    }
    a_units, b_units = row[-2:]
    return (cell, a_units, "a") if 0 < a_units < least else (cell, b_units, "b")


def _count(condition: str, alias: str, *, distinct: bool) -> exp.Expr:
    """The rows of ``r`` where ``condition`` holds, or their distinct units ``u``."""
    counted = exp.Count(this=exp.Distinct(expressions=[exp.column("u")]) if distinct
                        else exp.Star())  # fmt: skip
    where = exp.Where(this=exp.condition(condition))
    return exp.alias_(exp.Filter(this=counted, expression=where), alias)


def _tells(con, spec, other: Release) -> bool:
    """Whether a file's exact columns tell of each of its records whether the job counts it:
    the job's WHERE reads only columns of the table that the file holds (as they are or
    coarsened, never blanked by a local suppression), and within each combination of their
    released values it is the same for every record of the file. Then the file's records
    outside the job, in any cell, are a count of the file's own cells."""
    if other.exact is None:
        return False
    return spec.where is None or bool(_held(con, spec, other))


def _held(con, spec, other: Release) -> list[tuple[str, exp.Expr]]:
    """The file's cuts that tell whether the job (whose WHERE is not None) counts a record
    (:func:`_tells`); empty when they do not."""
    if spec.where.find(exp.Query, exp.Subquery):  # a lookup elsewhere: not a function of them
        return []
    read = _reads(spec.where)
    held = [(n, e) for n, e in other.exact
            if _reads(e) and _reads(e) <= read and not _reads(e) & other.blanked]  # fmt: skip
    if not held or set().union(*(_reads(e) for _n, e in held)) != read:
        return []
    mine = _kept(spec.where)
    mixed = (
        exp.select(exp.Literal.number(1))
        .from_(spec.table)
        .where(_kept(other.where))
        .group_by(*(e.copy() for _n, e in held))
        .having(
            exp.NEQ(this=exp.func("bool_or", mine.copy()), expression=exp.func("bool_and", mine))
        )
        .limit(1)
    )
    return [] if con.execute(mixed.sql("duckdb")).fetchall() else held


def _reads(expression: exp.Expr) -> set[str]:
    return {c.name.lower() for c in expression.find_all(exp.Column)}

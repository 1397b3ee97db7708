"""Two released files of one table that link record by record show the union of their keys.

Two anonymised files of the same people that both hold an exact column of many distinct
values (the demo's ``weight``: 18,177 values among 20,000 persons) link one to one by it: a
record whose values of the columns both files hold unperturbed (the same column of the table,
coarsened alike, or as it is in one file and coarsened in the other) are held by no other
record of either file is one person in both; two other expressions of one column link through
the values they take together in the table (:func:`link_columns`). Readers of
both then hold that person's columns of both files, a key neither file's risk report measured
(red team s47o: sex, age band, education, weight and sex, age band, occupation, weight of
every person, both under ``releases:``, accepted: 16,455 persons linked by weight, 8 of them
unique by sex, age band, education and occupation, while each file alone showed 0 and 1
records below k = 2). Hundepool et al., *Statistical Disclosure Control*, Wiley 2012, ch. 3:
re-identification risk is measured on the key variables an intruder can match on; so two
releases linked record by record are judged as one release of their union.

:func:`linked_records` measures it: among the records linked one to one, those whose key of
both files' cuts (:attr:`~sqlsdc.jobs.exact_release.Release.exact`, the columns a table
would cut cells by) fewer than the minimum frequency of linked records show, while each file
alone shows them among that many or more: the risk the pair adds. Files whose populations
share no row are not compared (a link between them is a coincidence of values).
:func:`sqlsdc.jobs.file_pairs.refuse_file_pairs` refuses such a pair.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.jobs.exact_release import Release, kept
from sqlsdc.policy import Policy
from sqlsdc.rewrite.derived_classes import derived_classes


def link_columns(
    con, table: str, mine: Release, theirs: Release
) -> list[tuple[str, exp.Expr, exp.Expr]]:
    """``(the table's column, its value in mine, in theirs)``, as expressions on each file's
    columns, for each column of the table both files hold exactly: as the same expression of
    it (a column, or its bands cut alike), or one file as it is and the other coarsened (its
    coarsening applied to the first file's column: ``round(weight, 1)`` beside ``weight``
    links by 1,001 values, 758 persons of the CLI demo one to one), or as two other
    expressions of it, linked through the table (:func:`_through_table`): ``weight + 0``
    beside ``weight * 1`` (the same values, spelt apart) linked 19,296 persons of the CLI
    demo, 211 below the minimum frequency by the union of the keys, accepted before (red
    team s48o); ``round(weight, 2)`` beside ``round(weight, 1)`` links as the second beside
    ``weight`` does."""
    found = []
    for name, ours in _linkable(mine):
        for other, their in _linkable(theirs):
            read = {c.name.lower() for c in ours.find_all(exp.Column)}
            their_read = {c.name.lower() for c in their.find_all(exp.Column)}
            if not read & their_read:
                continue
            # a column read by both, with other columns beside it in one of them: ``weight +
            # 0 * income`` beside ``weight`` linked 18,881 persons of the demo one to one and
            # was accepted (red team s48q): linked through the table as two spellings are
            column = ", ".join(sorted(read & their_read))
            if ours.sql("duckdb") == their.sql("duckdb"):
                found.append((column, _file_column(name), _file_column(other)))
            elif isinstance(ours, exp.Column) and their_read == read:
                found.append((column, _applied(their, name), _file_column(other)))
            elif isinstance(their, exp.Column) and their_read == read:
                found.append((column, _file_column(name), _applied(ours, other)))
            else:
                found.append(_through_table(con, table, mine, theirs, column, (name, ours),
                                            (other, their)))  # fmt: skip
    return found


def _linkable(file: Release) -> tuple:
    """A file's exact columns that read the table (``links``, else ``sums``)."""
    return file.links if file.links is not None else file.sums or ()


def _through_table(con, table, mine, theirs, column, ours, their):
    """The link of two files that hold one column of ``table`` as two different expressions
    (``(name in the file, expression on the table)`` each): the finer one's file values
    mapped to the coarser's, by the pairs of values the two expressions take together on the
    rows both files hold, where a value of the finer meets one value of the coarser only (a
    scaling, another spelling, a finer rounding: all of them; bands at other breaks: the
    bands one band of the other holds). An intruder who knows both expressions makes the
    same map. Values are compared as text of their DOUBLE when they are numbers (``1.50``
    and ``1.5`` meet), so that no comparison of two types can fail in the engine."""
    population = exp.and_(kept(mine.where), kept(theirs.where))
    counted = exp.select(
        exp.Count(this=exp.Distinct(expressions=[ours[1].copy()])),
        exp.Count(this=exp.Distinct(expressions=[their[1].copy()])),
    ).from_(table).where(population)  # fmt: skip
    finer, coarser = con.execute(counted.sql("duckdb")).fetchone()
    if finer < coarser:  # theirs is the finer: map it to ours
        _c, mapped, plain = _through_table(con, table, theirs, mine, column, their, ours)
        return column, plain, mapped
    pairs = (
        exp.select(_normal(ours[1]).as_("o"), _normal(their[1]).as_("t"))
        .distinct()
        .from_(table)
        .where(population)
    )
    single = (
        exp.select(exp.column("o"), exp.Min(this=exp.column("t")).as_("t"))
        .from_(pairs.subquery("p"))
        .group_by(exp.column("o"))
        .having(exp.Count(this=exp.Star()).eq(1))
    )
    value = _normal(exp.column(ours[0], _ROW, quoted=True))
    found = (
        exp.select(exp.column("t", "m"))
        .from_(single.subquery("m"))
        .where(exp.NullSafeEQ(this=exp.column("o", "m"), expression=value))
    )
    return column, exp.Subquery(this=found), _normal(_file_column(their[0]))


_ROW = "_sqlsdc_record"  # a file's records as :func:`_side` names them


def _normal(value: exp.Expr) -> exp.Expr:
    """``value`` as text, a number as the text of its DOUBLE (casts that never fail)."""
    text = exp.cast(value.copy(), "VARCHAR")
    number = exp.TryCast(this=text.copy(), to=exp.DataType.build("DOUBLE"))
    return exp.Coalesce(this=exp.cast(number, "VARCHAR"), expressions=[text])


def _file_column(name: str) -> exp.Column:
    return exp.column(name, quoted=True)


def _applied(expression: exp.Expr, name: str) -> exp.Expr:
    """``expression`` (of one column of the table) computed on the file column ``name``."""
    return expression.copy().transform(
        lambda node: _file_column(name) if isinstance(node, exp.Column) else node
    )


def derived_pairs(policy: Policy, table: str) -> list[tuple[str, str]]:
    """``(dimension, measure)`` of ``table``'s dimensions read as the class of a unit-noised
    measure (:mod:`sqlsdc.jobs.class_views`), lower case: a file that shows the one beside a
    linked file that shows the other tells, for units near a break, the side of 1 of their
    noise factor (red team s47n's finding across two files, s48c)."""
    found = derived_classes(policy).get(table.lower(), {})
    return [(how.column.lower(), how.classes.measure.lower()) for how in found.values()]


def linked_records(con, table: str, mine: Release, theirs: Release, least: int) -> tuple[int, int]:
    """``(linked, exposed)``: the records of the two files that link one to one by
    :func:`link_columns`, and how many of them the union of the files' cuts shows among
    fewer than ``least`` linked records while each file's own cuts show them among ``least``
    records or more. ``(0, 0)`` when the files share no exact column or no records."""
    links = link_columns(con, table, mine, theirs)
    if not links or mine.records is None or theirs.records is None:
        return 0, 0
    a = _side(mine, [ours for _c, ours, _t in links])
    b = _side(theirs, [their for _c, _o, their in links])
    on = exp.and_(*(_same(f"l{i}") for i in range(len(links))))
    keys = [exp.column(f"k{i}", "a") for i in range(len(mine.exact or ()))]
    keys += [exp.column(f"k{i}", "b") for i in range(len(theirs.exact or ()))]
    union = _count_over(keys, "fu") if keys else exp.alias_(exp.Literal.number(0), "fu")
    joined = (
        exp.select(union, exp.column("f", "a").as_("fa"), exp.column("f", "b").as_("fb"))
        .from_(a.subquery("a"))
        .join(b.subquery("b"), on=on)
        .where(exp.and_(exp.column("n", "a").eq(1), exp.column("n", "b").eq(1)))
    )
    least_ = exp.Literal.number(least)
    below = exp.and_(
        exp.LT(this=exp.column("fu"), expression=least_.copy()),
        exp.GTE(this=exp.column("fa"), expression=least_.copy()),
        exp.GTE(this=exp.column("fb"), expression=least_.copy()),
    )
    counted = exp.select(
        exp.Count(this=exp.Star()),
        exp.Filter(this=exp.Count(this=exp.Star()), expression=exp.Where(this=below)),
    ).from_(joined.subquery("u"))
    linked, exposed = con.execute(counted.sql("duckdb")).fetchone()
    return int(linked), int(exposed or 0)


def _side(file: Release, links: list[exp.Expr]) -> exp.Select:
    """A file's records as their link values ``l<i>``, cuts ``k<i>``, how many records share
    their link (``n``) and their cuts (``f``)."""
    cuts = [_file_column(name) for name, _e in file.exact or ()]
    columns = [exp.alias_(link.copy(), f"l{i}") for i, link in enumerate(links)]
    columns += [exp.alias_(cut.copy(), f"k{i}") for i, cut in enumerate(cuts)]
    columns.append(_count_over(links, "n"))
    columns.append(_count_over(cuts, "f") if cuts else exp.alias_(exp.Literal.number(0), "f"))
    rows = exp.select("*").from_(file.records.copy()).subquery(_ROW)
    return exp.select(*columns).from_(rows)


def _same(column: str) -> exp.NullSafeEQ:
    """``a.column IS NOT DISTINCT FROM b.column`` (a blank links to a blank)."""
    return exp.NullSafeEQ(this=exp.column(column, "a"), expression=exp.column(column, "b"))


def _count_over(partition: list[exp.Expr], alias: str) -> exp.Alias:
    window = exp.Window(this=exp.Count(this=exp.Star()), partition_by=[p.copy() for p in partition])
    return exp.alias_(window, alias)

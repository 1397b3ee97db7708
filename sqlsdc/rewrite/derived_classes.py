"""A dimension declared the class of a unit-noised measure is read as the class of x·m.

A policy may declare that a dimension is the class of a measure of its table (``classes_of``,
:class:`sqlsdc.policy.model.ClassesOf`): the demo's ``enterprises.size_class`` is micro below
10 employees, small below 50, medium below 250, large from 250 up. When the measure carries
permanent unit noise (:mod:`sqlsdc.mechanisms.unit_noise`) its sums add x·m and its
comparisons compare x·m (:mod:`sqlsdc.rewrite.noised_conditions`); a stored class of x
published beside them tells, for the units near a break, which side of 1 their factor m lies
on (red team s46j: ``WHERE employees < 10 GROUP BY size_class`` published a 'small' row, and
beside a padded average of x·m the class told the branch of m of 26 of 1,000 enterprises,
estimating x within 2.4 %). So every reference to such a dimension reads
``CASE WHEN x·m IS NULL THEN NULL WHEN x·m < b1 THEN l1 ... ELSE ln END``, with x·m computed
by :func:`sqlsdc.rewrite.unit_noise.noised` exactly as the sums compute it: the published
class and the noisy sums agree, and the stored column is never read.

Two readers: :func:`derive_classes` replaces, in a guarded query's final tree, each column
that reads the dimension from its table (any clause, any scope: GROUP BY, WHERE, JOIN ON,
CASE, HAVING, a CTE's or derived table's output, a cast or a string function of it), so no
spelling reads the stored class; :func:`class_view` is the table with the dimension
replaced, which the back-end jobs read instead of the stored table
(:func:`sqlsdc.jobs.session.job_catalog`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from sqlglot import exp

from sqlsdc.catalog.keys import RKEY
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.parameters import UnitNoise
from sqlsdc.policy import Policy
from sqlsdc.policy.model import ClassesOf
from sqlsdc.rewrite.ckm_mix import CKM_MIX, MIX
from sqlsdc.rewrite.noised_conditions import join_mix_first, policy_lookup
from sqlsdc.rewrite.unit_noise import noised


@dataclass(frozen=True)
class DerivedClass:
    """A dimension that is the class of a unit-noised measure: how to compute it."""

    column: str
    classes: ClassesOf
    salt: str  # the measure's ``table.column``, which salts its unit factor
    noise: UnitNoise


def derived_classes(policy: Policy) -> dict[str, dict[str, DerivedClass]]:
    """table → dimension → its derivation, for the dimensions declared the class of a measure
    that carries unit noise (a class of a measure without noise is the stored class: the
    sums add x, and the stored column agrees with them)."""
    lookup = policy_lookup(policy)
    found: dict[str, dict[str, DerivedClass]] = {}
    for table in policy.tables.values():
        for column in table.columns.values():
            classes = column.classes_of
            noised_measure = None if classes is None else lookup(table.name, classes.measure)
            if noised_measure is not None:
                salt, noise = noised_measure
                found.setdefault(table.name, {})[column.name] = DerivedClass(
                    column.name, classes, salt, noise
                )
    return found


def class_case(value: exp.Expr, classes: ClassesOf) -> exp.Case:
    """The label of ``value``'s class: NULL for NULL, ``labels[i]`` below ``breaks[i]``,
    the last label from the last break up."""
    ifs = [exp.If(this=exp.Is(this=value.copy(), expression=exp.null()), true=exp.null())]
    for cut, label in zip(classes.breaks, classes.labels, strict=False):
        ifs.append(exp.If(this=exp.LT(this=value.copy(), expression=_literal(cut)),
                          true=_literal(label)))  # fmt: skip
    return exp.Case(ifs=ifs, default=_literal(classes.labels[-1]))


def _literal(value) -> exp.Expr:
    return exp.Literal.string(value) if isinstance(value, str) else exp.Literal.number(value)


def noised_class(derived: DerivedClass, alias: str) -> exp.Case:
    """The class of x·m of the row of table ``alias`` (qualified by it when given), over a
    select that joins the mix as ``__mix``."""
    measure = exp.column(derived.classes.measure, alias or None)
    rkey = exp.column(RKEY, alias or None)
    return class_case(noised(measure, rkey, (derived.salt,), derived.noise), derived.classes)


def derive_classes(tree: exp.Expr, policy: Policy, reads: Iterable[str] | None = None) -> None:
    """Replace, in ``tree`` (mutated), every column that reads a derived class dimension from
    its table by the class of x·m (:func:`noised_class`), and join the mix in the select that
    reads the table. A join USING or NATURAL over such a table is refused (it would match the
    stored column).

    ``reads``: the declared tables the statement reads (lower case), when the caller knows
    them all (:func:`sqlsdc.guard.resolve.check_tables`, which refuses any other table): a
    statement that reads no table with a derived class is left as it is without a walk of
    its tree (a rewritten query's tree has a thousand nodes and more: 2 ms of CPU a query)."""
    derived = _read(policy, reads)
    if not derived:
        return
    names = {c for columns in derived.values() for c in columns}
    walked = list(tree.find_all(exp.Column, exp.Select))  # one walk, before the replacements
    for column in walked:
        if not isinstance(column, exp.Column) or column.name.lower() not in names:
            continue
        found = _source(column, derived)
        if found is None:
            continue
        select, alias, how = found
        case = noised_class(how, alias)
        if column.parent is select and column.arg_key == "expressions":
            column.replace(exp.alias_(case, column.name))
        else:
            column.replace(case)
        join_mix_first(select)
    for select in walked:
        if isinstance(select, exp.Select):
            _refuse_implicit_joins(select, derived)


def _read(policy: Policy, reads: Iterable[str] | None) -> dict[str, dict[str, DerivedClass]]:
    """The derived classes of the tables in ``reads`` (of every table when None)."""
    derived = derived_classes(policy)
    if reads is None or not derived:
        return derived
    return {t: how for t, how in derived.items() if t in {r.lower() for r in reads}}


def refuse_derived_classes(
    tree: exp.Expr, policy: Policy, reads: Iterable[str] | None = None
) -> None:
    """Refuse ``tree`` (SQL run apart from the result, a DP stage's exact cells) when it reads
    a derived class dimension: that SQL is not rewritten, and would read the stored class
    (fail closed). ``reads``: as for :func:`derive_classes`."""
    derived = _read(policy, reads)
    names = {c for columns in derived.values() for c in columns}
    for column in tree.find_all(exp.Column) if names else ():
        if column.name.lower() in names and _source(column, derived) is not None:
            raise PolicyViolation(
                f"{column.sql('duckdb')} is the class of a measure that carries a permanent "
                "noise factor per unit, read as the class of the noised value, and "
                "differentially private cells cannot read it so",
                f"leave {column.name} out of this query",
            )


def _source(
    column: exp.Column, derived: dict[str, dict[str, DerivedClass]]
) -> tuple[exp.Select, str, DerivedClass] | None:
    """(the select that reads ``column``'s table, the table's alias there, the derivation) when
    ``column`` reads a derived class from a stored table; None otherwise (a CTE's or derived
    table's output is derived where that one reads the table)."""
    select = column.parent_select
    while select is not None:
        for source, alias in _tables(select):
            if column.table and alias != column.table:
                continue
            how = _derived_of(source, column.name.lower(), derived)
            if how is not None:
                return select, alias, how
            if column.table:
                return None
        if not column.table:
            return None
        select = select.parent_select
    return None


def _tables(select: exp.Select) -> list[tuple[exp.Expr, str]]:
    from_ = select.args.get("from_")
    sources = [from_.this] if from_ is not None else []
    sources += [join.this for join in select.args.get("joins") or []]
    found = []
    for source in sources:
        alias = source.alias
        while isinstance(source, exp.Subquery) and isinstance(
            source.this, (exp.Subquery, exp.Table)
        ):  # a parenthesized table, ((enterprises AS e)) AS q
            source = source.this
            alias = alias or source.alias
        found.append((source, alias or source.alias_or_name))
    return found


def _derived_of(
    source: exp.Expr, name: str, derived: dict[str, dict[str, DerivedClass]]
) -> DerivedClass | None:
    """The derivation of column ``name`` of ``source`` when it is a stored table with a derived
    class of that name (by its name alone, whatever schema or catalog qualifies it: fail
    closed)."""
    if not isinstance(source, exp.Table) or _is_cte(source):
        return None
    return derived.get(source.name.lower(), {}).get(name)


def _is_cte(table: exp.Table) -> bool:
    if table.args.get("db"):
        return False
    node: exp.Expr | None = table
    while node is not None:
        with_ = node.args.get("with_") if isinstance(node, exp.Query) else None
        for cte in with_.expressions if with_ is not None else []:
            if cte.alias_or_name == table.name and not _inside(table, cte):
                return True
        node = node.parent
    return False


def _inside(node: exp.Expr, ancestor: exp.Expr) -> bool:
    while node is not None:
        if node is ancestor:
            return True
        node = node.parent
    return False


def _refuse_implicit_joins(select: exp.Select, derived: dict[str, dict[str, DerivedClass]]) -> None:
    tables = [s.name.lower() for s, _a in _tables(select) if _derived_of_table(s, derived)]
    if not tables:
        return
    dims = {c for t in tables for c in derived[t]}
    for join in select.args.get("joins") or []:
        using = {u.name.lower() for u in join.args.get("using") or []}
        if join.args.get("method") or (using & dims):  # NATURAL, POSITIONAL, ASOF
            raise PolicyViolation(
                f"{join.sql('duckdb')[:80]}: {', '.join(sorted(dims))} is the class of a "
                "measure that carries a permanent noise factor per unit, read as the class "
                "of the noised value; a join USING or NATURAL would match the stored class",
                "join with ON and the columns named",
            )


def _derived_of_table(source: exp.Expr, derived: dict[str, dict[str, DerivedClass]]) -> bool:
    return isinstance(source, exp.Table) and not _is_cte(source) and source.name.lower() in derived


def class_view(table: str, policy: Policy, catalog: str) -> exp.Select | None:
    """``SELECT * REPLACE (<class of x·m> AS dim, ...) FROM catalog.main.table``: the rows
    of ``table`` with each derived class dimension computed from x·m, the mix's constants
    read by scalar subqueries of ``catalog.sqlsdc.ckm_mix`` (the SQL names the table, never
    the constants); None when ``table`` has no such dimension. A job reads it in place of
    the stored table."""
    columns = derived_classes(policy).get(table.lower())
    if not columns:
        return None
    replaced = []
    for how in columns.values():
        case = noised_class(how, "")
        for mix in list(case.find_all(exp.Column)):
            if mix.table == MIX:
                constants = CKM_MIX.copy()
                constants.set("catalog", exp.to_identifier(catalog, quoted=True))
                mix.replace(exp.select(mix.name).from_(constants).subquery())
        replaced.append(exp.alias_(case, how.column))
    stored = exp.Table(
        this=exp.to_identifier(table),
        db=exp.to_identifier("main"),
        catalog=exp.to_identifier(catalog, quoted=True),
    )
    return exp.select(exp.Star(replace=replaced)).from_(stored)

"""Conditions on a unit-noised measure compare x·m, the value every sum adds, not the stored x.

Under the cell key method a table's magnitudes may carry permanent unit noise
(:mod:`sqlsdc.mechanisms.unit_noise`): each contribution x enters every SUM and AVG as x·m.
A condition that compared the stored x with a class break (:mod:`sqlsdc.planner.breaks`) beside
a padded average of y = x·m told which side of 1 the factor m lies on wherever a break falls
between the two branches of x given y (red team s45l: for 17 % of incomes of 20,000 or more the
centred estimate was within 2.4 % of x on average, under the (a − 1) the method promises). So
every comparison of such a column with its breaks compares x·m, computed with the same
:func:`sqlsdc.rewrite.unit_noise.noised` as the sums: a class of income is a class of x·m, and
a count filtered by a break counts the units whose noised value passes it.

A column is converted where it is compared in the query that reads its table (its WHERE, JOIN
ON, a CASE of a key or of an aggregate's argument, a derived table's own WHERE); that select
joins the secret mix (:func:`sqlsdc.rewrite.ckm_mix.join_mix`). A comparison that reads the
column through a derived table or a CTE (``FROM (SELECT income AS i ...) WHERE i >= 20000``), or
compares a function of it, cannot be converted here and is refused (fail closed).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from sqlsdc.catalog.keys import RKEY
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.parameters import UnitNoise
from sqlsdc.planner.breaks import CLASSED_ROLES, COMPARISONS
from sqlsdc.policy import AggregateKind, Policy
from sqlsdc.rewrite.cells import CELLS
from sqlsdc.rewrite.ckm_mix import CKM_MIX, MIX, has_mix
from sqlsdc.rewrite.unit_noise import noised

COMPARED = (*COMPARISONS, exp.Between, exp.In)  # as the planner's check reads them

Noised = tuple[str, UnitNoise]  # the measure's salt name (``table.column``) and its noise
Lookup = Callable[[str, str], Noised | None]  # (table, column) -> noise of that column


def policy_lookup(policy: Policy) -> Lookup:
    """(table, column) of the policy → (``table.column``, its unit noise) when the table's
    magnitudes carry unit noise and the column is a measure or weight, else None."""

    def lookup(table: str, column: str) -> Noised | None:
        declared = policy.table(table)
        if declared is None or declared.is_public:
            return None
        magnitude = declared.rule(AggregateKind.MAGNITUDES).magnitude
        noise = None if magnitude is None else magnitude.unit_noise
        col = declared.column(column)
        if noise is None or col is None or col.role not in CLASSED_ROLES:
            return None
        return f"{declared.name}.{col.name}", noise

    return lookup


DONE = "sqlsdc_noised_conditions"  # meta of a CTE's definition already converted


def noise_conditions(
    tree: exp.Expr,
    lookup: Lookup,
    sql: Callable[[], str],
    context: exp.Expr | None = None,
    *,
    in_place: bool = True,
) -> bool:
    """Replace, in ``tree`` (mutated, every scope), each compared unit-noised column by its
    noised value x·m, and join the mix in each select that now reads it. Refuse a comparison
    that reads such a column otherwise than as it is in the select that reads its table.
    ``context``: the node of the whole statement ``tree`` was built from, whose enclosing
    WITH clauses name the CTEs ``tree`` may read: the definitions of those it reads are
    converted too, once (``in_place``; else copies of them, only to tell whether anything
    would be); ``sql`` gives the text a refusal shows. Returns whether anything was
    converted."""
    outer = _outer_ctes(context)
    converted = _convert(tree, _Resolver(lookup, outer), sql)
    for name in _read_ctes(tree, outer):
        body = outer[name]
        if DONE in body.meta:  # converted by an earlier frame: whether it was, all the same
            converted |= not in_place and body.meta[DONE]  # (s47a: else order-dependent)
            continue
        if not in_place:
            converted |= _convert(body.copy(), _Resolver(lookup, _outer_ctes(body)), sql)
            continue
        body.meta[DONE] = False
        body.meta[DONE] = _convert(body, _Resolver(lookup, _outer_ctes(body)), sql)
        converted |= body.meta[DONE]
    return converted


def _read_ctes(tree: exp.Expr, outer: dict[str, exp.Expr]) -> list[str]:
    """The names of the CTEs of ``outer`` that ``tree`` reads, directly or through others."""
    found: list[str] = []
    pending = [tree]
    while pending:
        node = pending.pop()
        for table in node.find_all(exp.Table):
            if table.name in outer and table.name not in found and not table.args.get("db"):
                found.append(table.name)
                pending.append(outer[table.name])
    return found


def _convert(tree: exp.Expr, resolver: _Resolver, sql: Callable[[], str]) -> bool:
    converted: list[exp.Select] = []
    for comparison in list(tree.find_all(*COMPARED)):
        for operand in _operands(comparison):
            for column in _row_columns(operand):
                if _protected_frame(column, tree):
                    continue
                origin = resolver.origin(column)
                if origin is None:
                    continue
                select, alias, (name, noise) = origin
                if _unparen(operand) is not column or select is None:
                    raise PolicyViolation(
                        f"{comparison.sql('duckdb')[:80]}: {name} carries a permanent noise "
                        "factor per unit, and a condition on it compares the noised value x·m; "
                        "this condition reads it through a derived table or a function of it",
                        f"compare {name.split('.', 1)[1]} as it is with a class break in the "
                        "query that reads its table (FROM table WHERE column >= break)",
                        sql(),
                    )
                rkey = exp.column(RKEY, alias) if alias else exp.column(RKEY)
                column.replace(noised(column.copy(), rkey, (name,), noise))
                converted.append(select)
    seen: set[int] = set()
    for select in converted:
        if id(select) not in seen:
            seen.add(id(select))
            join_mix_first(select)
    return bool(converted)


def join_mix_first(select: exp.Select) -> None:
    """Join the mix first among ``select``'s joins (unless it is joined already), so that
    every later join's ON may read it: ``LEFT JOIN sqlsdc.ckm_mix AS __mix ON TRUE``."""
    if has_mix(select):
        return
    join = exp.Join(this=CKM_MIX.copy().as_(MIX), side="LEFT", on=exp.true())
    select.set("joins", [join, *(select.args.get("joins") or [])])


def _operands(comparison: exp.Expr) -> list[exp.Expr]:
    if isinstance(comparison, exp.Between):
        return [comparison.this, comparison.args["low"], comparison.args["high"]]
    if isinstance(comparison, exp.In):
        return [comparison.this, *comparison.expressions]
    return [comparison.left, comparison.right]


def _protected_frame(column: exp.Column, tree: exp.Expr) -> bool:
    """Whether ``column`` is an output of protected cells (``__cells.x``) or inside cells
    nested in ``tree``: a scalar subquery rewritten, its own conditions converted, before the
    query around it. Its guards (``__cells.__ma0 >= 10``) compare protected or internal
    values, never a row's (s49a: a group key ``(SELECT SUM(income) FROM persons)`` was refused
    as a condition on income, naming ``__cells.__ma0``). Cells around ``tree`` do not count:
    a subquery converted after the frame around it was built is still the analyst's."""
    if column.table == CELLS:
        return True
    node = column.parent
    while node is not None and node is not tree:
        if isinstance(node, exp.Subquery) and node.alias == CELLS:
            return True
        node = node.parent
    return False


def _row_columns(operand: exp.Expr) -> list[exp.Column]:
    """The columns ``operand`` reads in its own scope (not in a nested query)."""
    found = []
    for column in [operand] if isinstance(operand, exp.Column) else operand.find_all(exp.Column):
        node, nested = column.parent, False
        while node is not None and node is not operand.parent:
            if isinstance(node, (exp.Query, exp.Subquery)):
                nested = True
                break
            node = node.parent
        if not nested:
            found.append(column)
    return found


def _outer_ctes(node: exp.Expr | None) -> dict[str, exp.Expr]:
    """The CTEs the WITH clauses around ``node`` define, the innermost first."""
    ctes: dict[str, exp.Expr] = {}
    while node is not None:
        with_ = node.args.get("with_") if isinstance(node, exp.Query) else None
        for cte in with_.expressions if with_ is not None else []:
            ctes.setdefault(cte.alias_or_name, cte.this)
        node = node.parent
    return ctes


def _sources(select: exp.Select) -> list[tuple[exp.Expr, str]]:
    """The relations ``select`` reads (FROM and joins), each with the name its columns are
    qualified by; a parenthesized table (``FROM (persons)``, ``FROM ((persons AS p)) AS q``)
    is the table itself, named by its outermost alias (red team s46a: read as a derived
    table without a query, its conditions compared the stored x)."""
    found = []
    from_ = select.args.get("from_")
    for source in ([from_.this] if from_ is not None else []) + [
        join.this for join in select.args.get("joins") or []
    ]:
        source, alias = _unwrapped(source)
        if isinstance(source, exp.Subquery) and not isinstance(source.this, exp.Query):
            _refuse_unfollowed(source)  # a nested join (a JOIN b): its tables are not traced
        found.append((source, alias))
    return found


def _refuse_unfollowed(source: exp.Expr, name: str = "") -> None:
    """Refuse a relation whose columns the conversion cannot trace to their tables: tables
    and derived tables are all the planner admits, so a condition read from another shape is
    refused, never left on the stored x unseen (red team s46a: a parenthesized table was
    such a relation)."""
    raise PolicyViolation(
        f"{source.sql('duckdb')[:80]}: sqlsdc cannot trace "
        f"{f'column {name}' if name else 'the columns'} of this relation to a table, so a "
        "condition on it could compare a measure's stored value where its sums add the value "
        "times a permanent noise factor",
        "read the declared tables by name, or a derived table (SELECT ...)",
    )


def _unwrapped(source: exp.Expr) -> tuple[exp.Expr, str]:
    """``source`` without the parentheses around a table, and the name it is read by."""
    alias = source.alias
    while isinstance(source, exp.Subquery) and (
        isinstance(source.this, exp.Subquery)  # a Query to sqlglot: ((persons)) is two
        or (isinstance(source.this, exp.Table) and not source.this.args.get("joins"))
    ):  # (a JOIN b) is a Table with joins inside: not followed (noised_in refuses it)
        source = source.this
        alias = alias or source.alias
    return source, alias or source.alias_or_name


class _Resolver:
    """Which unit-noised column a column is, through derived tables and CTEs."""

    def __init__(self, lookup: Lookup, ctes: dict[str, exp.Expr]):
        self.lookup, self.ctes = lookup, ctes
        # noised_in's answers by (query, output name), for one origin() (the tree does not
        # change within one): a frame's CTEs read each other many times over, and following
        # every path through them again was exponential (a scalar subquery's CKM frame: ~3
        # million calls and ~25 s of CPU for one statement)
        self._answers: dict[tuple[int, str], Noised | None] = {}
        # _sources of each select, and the first of them by name: a _convert changes columns,
        # never a select's FROM and joins (the mix is joined after its last origin()), and
        # listing every source again for each column was quadratic (a join of 2,048 readings
        # of one table: 8.4 million _unwrapped calls for 4,094 columns, ~14 s of CPU)
        self._listed: dict[int, tuple[exp.Select, list, dict]] = {}

    def origin(self, column: exp.Column) -> tuple[exp.Select | None, str, Noised] | None:
        """(the select reading the table of unit-noised ``column``, the table's alias there,
        its noise), the select None when it is read through a derived table or CTE; None
        when ``column`` is no unit-noised column."""
        self._answers.clear()
        select = column.parent_select
        while select is not None:
            for source, alias in self._candidates(select, column):
                if isinstance(source, exp.Table) and self.cte(source) is None:
                    found = self.lookup(source.name, column.name)
                    if found is not None:
                        return select, alias if column.table else "", found
                else:
                    found = self.noised_in(source, column.name)
                    if found is not None:
                        return None, alias, found
                if column.table:
                    return None
            select = select.parent_select if column.table else None
        return None

    def _candidates(self, select: exp.Select, column: exp.Column) -> list[tuple[exp.Expr, str]]:
        """The sources of ``select`` that ``column`` may read: all of them (:func:`_sources`),
        or the first one of its qualifier's name (none if no source has that name). Listed
        once per select (``select`` kept in the entry, so that its id is not reused)."""
        listed = self._listed.get(id(select))
        if listed is None:
            found = _sources(select)
            first: dict[str, tuple[exp.Expr, str]] = {}
            for source, alias in found:
                first.setdefault(alias, (source, alias))
            listed = self._listed[id(select)] = (select, found, first)
        _select, found, first = listed
        if not column.table:
            return found
        return [first[column.table]] if column.table in first else []

    def cte(self, table: exp.Table) -> exp.Expr | None:
        """The definition of the CTE ``table`` names, if it names one (not a stored table)."""
        if table.args.get("db"):
            return None
        node: exp.Expr | None = table
        within: set[str] = set()  # inside a CTE's own definition its name is the table's
        while node is not None:
            if isinstance(node, exp.CTE):
                within.add(node.alias_or_name)
            with_ = node.args.get("with_") if isinstance(node, exp.Query) else None
            for cte in with_.expressions if with_ is not None else []:
                if cte.alias_or_name == table.name and table.name not in within:
                    return cte.this
            node = node.parent
        return None if table.name in within else self.ctes.get(table.name)

    def noised_in(self, source: exp.Expr, name: str) -> Noised | None:
        """The unit-noised column behind output ``name`` of ``source`` (a derived table, or a
        CTE's name), followed through the projections of every branch; a star reads every
        column of its sources."""
        if isinstance(source, exp.Table):
            root = self.cte(source)
        else:
            root = source.this if isinstance(source, exp.Subquery) else source
        if not isinstance(root, exp.Query):
            _refuse_unfollowed(source, name)
        key = (id(root), name)
        if key not in self._answers:
            self._answers[key] = self._noised_in(root, name)
        return self._answers[key]

    def _noised_in(self, root: exp.Query, name: str) -> Noised | None:
        branches = [root] if isinstance(root, exp.Select) else list(root.find_all(exp.Select))
        for branch in branches:
            for projection in branch.expressions:
                if isinstance(projection, exp.Star) or (
                    isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)
                ):
                    for inner, _alias in _sources(branch):
                        found = self.source_noise(name, inner)
                        if found is not None:
                            return found
                elif projection.alias_or_name == name:
                    for column in projection.find_all(exp.Column):
                        found = self.noise_of(column)
                        if found is not None:
                            return found
        return None

    def source_noise(self, name: str, source: exp.Expr) -> Noised | None:
        source, _alias = _unwrapped(source)
        if isinstance(source, exp.Table) and self.cte(source) is None:
            return self.lookup(source.name, name)
        return self.noised_in(source, name)

    def noise_of(self, column: exp.Column) -> Noised | None:
        """The noise of ``column`` in its own select, through derived tables."""
        select = column.parent_select
        while select is not None:
            for source, _alias in self._candidates(select, column):
                found = self.source_noise(column.name, source)
                if found is not None or column.table:
                    return found
            select = select.parent_select if column.table else None
        return None


def _unparen(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def any_unit_noise(policy: Policy) -> bool:
    """Whether some table of ``policy`` has unit-noised magnitudes."""
    for table in policy.tables.values():
        if table.is_public:
            continue
        magnitude = table.rule(AggregateKind.MAGNITUDES).magnitude
        if magnitude is not None and magnitude.unit_noise is not None:
            return True
    return False


def refuse_noised_conditions(select: exp.Select, where: exp.Expr | None, policy: Policy) -> None:
    """Refuse a condition on a unit-noised measure in an aggregation another method than the
    cell key method protects (a table whose counts are not CKM beside its CKM magnitudes):
    its frame would compare the stored x, not x·m (fail closed). ``where``: the aggregation's
    WHERE when it was taken out of ``select``."""
    if not any_unit_noise(policy):
        return
    probe = select.copy()
    if where is not None:
        probe.set("where", where.copy())
    text = probe.sql("duckdb")  # before the probe is converted
    if noise_conditions(probe, policy_lookup(policy), lambda: text, select, in_place=False):
        raise PolicyViolation(
            f"{text[:80]}: a condition on a measure whose values carry a permanent noise "
            "factor per unit compares the noised value x·m, which only the cell key method's "
            "rows compute, and this aggregation is protected by another method",
            "leave the condition on the measure out, or select by dimensions",
            text,
        )

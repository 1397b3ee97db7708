"""The checks of aggregate calls over confidential rows: which aggregates a mechanism covers,
what their arguments may be (linear in the measures, distinct counts of stored columns), and
their normal form (``a·SUM(x) + b·COUNT(x)``), which the cell key method protects."""

from __future__ import annotations

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from sqlsdc.planner.allowlist import (
    DP_AGGREGATES,
    PROTECTED_AGGREGATES,
)
from sqlsdc.planner.identity import canonical_expression
from sqlsdc.planner.linear import LinearForm, NotLinear, constant, is_constant, linear_form
from sqlsdc.planner.normal_form import STATISTIC, SUMMED, normal_form
from sqlsdc.planner.plan import COUNTED_UNITS, CountedUnits, group_keys
from sqlsdc.planner.scopes import (
    DIALECT,
    ROW_ROLES,
    Lineage,
    ScopeInfo,
    names,
    role_text,
    unwrap,
)
from sqlsdc.planner.totality import NUMERIC, family, wide_exact
from sqlsdc.policy import AggregateKind, ColumnRole, Method
from sqlsdc.written import written_name


class AggregateChecks:
    """Mixed into the checker (:mod:`sqlsdc.planner.analyze`): ``self.policy``, ``self.refuse``,
    ``self.lineage``, ``self.column_lineage``, ``self._check_total`` and ``self.forget_walks``
    (after changing the tree) come from there."""

    def _check_plain_distinct(self, aggregate: exp.AggFunc, argument: exp.Expr, info) -> None:
        """COUNT(DISTINCT x) takes a stored column as it is. The distinct values of an
        expression are another statistic of the same column, whose noise would either repeat
        the column's (and their difference cancel it: ``COUNT(DISTINCT m) − COUNT(DISTINCT
        CASE WHEN m = 'a' THEN 'b' ELSE m END)`` tells whether 'a' holds anyone) or be drawn
        afresh for every spelling (and averaged away)."""
        if not isinstance(canonical_expression(info.scope, argument), exp.Column):
            raise self.refuse(
                f"{aggregate.sql(DIALECT)[:80]}: COUNT(DISTINCT ...) counts the values of one "
                "stored column, not of an expression",
                "count the distinct values of a dimension or unit as it is, e.g. "
                "COUNT(DISTINCT municipality), and filter rows with WHERE",
            )

    def _counted_units(self, lineage: Lineage) -> CountedUnits:
        """The units a distinct count of the unit identifier ``lineage`` counts: the table's own
        when it is the table's privacy unit (persons.person_id, also benefits.person_id, whose
        rows have keys of their own), else those of the table it references
        (persons.household_id: households)."""
        table, column = next(iter(lineage.sources))
        if self.policy.table(table).privacy_unit == column:
            return CountedUnits(table, column, referenced=False)
        return CountedUnits(*self._key_target(table, column), referenced=True)

    def _is_unit(self, lineage: Lineage) -> bool:
        if lineage.roles != {ColumnRole.IDENTIFIER} or len(lineage.sources) != 1:
            return False
        table, column = self._key_target(*next(iter(lineage.sources)))
        target = self.policy.table(table)
        return target is not None and target.privacy_unit == column

    def _check_grouping(self, grouping: exp.Grouping, info: ScopeInfo) -> None:
        """``GROUPING(key, ...)`` of a ROLLUP/CUBE/GROUPING SETS query is a bit mask of which
        keys a result row totals over: a function of the grouping level alone, never of
        confidential values, so it needs no protection. Its arguments must be whole group keys
        (DuckDB refuses anything else, and an error must not depend on the query's data)."""
        keys = group_keys(info.scope.expression)
        for argument in grouping.expressions:
            if not isinstance(argument, exp.Column) or argument not in keys:
                raise self.refuse(
                    f"{grouping.sql(DIALECT)[:80]}: GROUPING takes columns the query groups by",
                    "name group keys as they are, e.g. GROUPING(region) with "
                    "GROUP BY ROLLUP (region, sex)",
                )

    def _check_aggregate(self, aggregate: exp.AggFunc, info: ScopeInfo, infos) -> list:
        """Check one aggregate; return the aggregates that replace it in the tree.

        SUM and AVG over confidential rows are normalised to their linear form first
        (:mod:`sqlsdc.planner.linear`): ``SUM(a·x + b)`` becomes ``a·SUM(x) + b·COUNT(x)``,
        ``AVG(a·x + b)`` becomes ``a·AVG(x) + b`` and an argument whose value does not depend on
        a measure (``1``, ``income * 0``, ``age - age``, ``CASE WHEN c THEN 1 END``) becomes the
        COUNT of the rows it is defined on, so that the mechanism only ever protects ``SUM(x)``
        and ``COUNT(x)`` of a column as it is stored, and the constants are applied to the
        protected values. Each protected aggregate gets its statistic's identity in
        ``meta[STATISTIC]`` (the base columns of its value), which the cell key method uses to
        give different statistics of the same rows independent noise.
        """
        name = (written_name(aggregate) or aggregate.sql_name()).upper()
        if isinstance(aggregate, exp.Grouping):
            self._check_grouping(aggregate, info)
            return []  # not an aggregate of values: the rewrite reads it from the cell's level
        if isinstance(aggregate, DP_AGGREGATES) and self._dp_magnitudes(aggregate, info, infos):
            if isinstance(aggregate.this, exp.Distinct):  # DP bounds rows, not distinct values
                raise self.refuse(f"{name}(DISTINCT ...) is not allowed", f"use {name}(...)")
            self._check_total(aggregate.this, info.scope)  # the aggregate itself is rewritten
            return [aggregate]
        if not isinstance(aggregate, PROTECTED_AGGREGATES):
            raise self.refuse(
                f"{name} over confidential values is not allowed (no protection mechanism "
                "covers it yet)",
                "use COUNT, SUM or AVG",
            )
        if isinstance(aggregate.parent, exp.Filter) or aggregate.find(exp.Filter):
            raise self.refuse(
                "FILTER (WHERE ...) on aggregates is not supported",
                "move the condition into a CASE WHEN inside the aggregate",
            )
        argument = aggregate.this
        distinct = isinstance(argument, exp.Distinct)
        if distinct:
            if len(argument.expressions) != 1:
                raise self.refuse(f"{name}(DISTINCT ...) takes exactly one column")
            argument = argument.expressions[0]
        if isinstance(argument, exp.Star):
            return [aggregate]
        if argument is None:  # DuckDB's COUNT(), its count of rows: sqlglot keeps no argument
            raise self.refuse(f"{name}() without an argument is not supported", "write COUNT(*)")
        lineage = self.lineage(argument, info.scope, infos)
        if isinstance(aggregate, exp.Count):
            if distinct:
                self._check_plain_distinct(aggregate, argument, info)
            if distinct and self._is_unit(lineage):
                # keyed by the counted units' record keys (households, also when counted
                # through persons.household_id): one set of units, one noise (red team s29b)
                aggregate.meta[COUNTED_UNITS] = self._counted_units(lineage)
                return [aggregate]
            allowed = {ColumnRole.DIMENSION} if distinct else ROW_ROLES
            if lineage.roles - allowed:
                raise self.refuse(
                    f"{name}({'DISTINCT ' if distinct else ''}{argument.sql(DIALECT)}) uses "
                    f"{role_text(lineage.roles - allowed)} {names(lineage)}",
                    "count rows with COUNT(*), units with COUNT(DISTINCT <privacy unit>), or "
                    "distinct values of a dimension",
                )
            if distinct:
                aggregate.meta[STATISTIC] = "distinct:" + names(lineage)
            self._check_total(argument, info.scope)
            return [aggregate]
        if distinct:
            raise self.refuse(f"{name}(DISTINCT ...) is not allowed", f"use {name}(...)")
        if lineage.roles - ROW_ROLES:
            raise self.refuse(
                f"{name} over {role_text(lineage.roles - ROW_ROLES)} {names(lineage)} "
                "is not allowed",
                "sum or average measures",
            )
        if not lineage.row and not is_constant(argument):
            raise self.refuse(
                f"{name}({argument.sql(DIALECT)[:80]}) does not depend on a confidential "
                "measure: it is a count of rows times a value",
                "count the rows with COUNT(*) and multiply the protected count",
            )
        self._check_total(argument, info.scope)  # fail closed even on what normalising drops
        problem = self._nonlinear(argument, info.scope, infos)
        if isinstance(problem, str):
            raise self.refuse(
                f"{name}({argument.sql(DIALECT)[:80]}) is not a linear sum of columns ({problem})",
                _else_zero_hint(argument, name) or _LINEAR_HINT,
            )
        replacement, aggregates = normal_form(aggregate, problem)
        for new in aggregates:
            inner = new.this
            if isinstance(inner, exp.Star):
                continue
            # the value's columns, not the filter's: the cell key already tells which rows a
            # CASE WHEN keeps (as for a WHERE), and naming the filter's columns too gave one
            # sum of one set of records as many noises as column sets (red team s29b)
            core = problem.core
            measured = inner if core is None else core
            new.meta[STATISTIC] = names(self.lineage(measured, info.scope, infos))
            self._check_total(inner, info.scope)
            if isinstance(new, (exp.Sum, exp.Avg)) and family(core) in ("float", None):
                # the values added up, to be checked finite and bounded (sqlsdc.guard.summable)
                new.meta[SUMMED] = self.lineage(core, info.scope, infos).sources
            if isinstance(new, (exp.Sum, exp.Avg)) and (wide_exact(inner) or wide_exact(core)):
                raise self.refuse(
                    f"{name}({argument.sql(DIALECT)[:80]}) adds up HUGEINT or DECIMAL(p > 18) "
                    "values, which can overflow in the engine for some confidential values only "
                    "(the error would reveal them)",
                    "ask an admin to store the measure as DOUBLE, BIGINT or DECIMAL(18, s)",
                )
        if replacement is not aggregate:
            aggregate.replace(replacement)
            self.forget_walks()
        return aggregates

    def _dp_magnitudes(self, aggregate: exp.AggFunc, info: ScopeInfo, infos) -> bool:
        """Whether ``aggregate`` reads only measures of tables whose magnitudes use DP (which
        releases variances and quantiles of bounded measures; sqlsdc.rewrite.dp checks the
        rest)."""
        lineage = self.lineage(aggregate.this, info.scope, infos)
        tables = {t for t, _c in lineage.sources}
        return bool(tables) and all(
            self.policy.table(t).rule(AggregateKind.MAGNITUDES).method is Method.DP for t in tables
        )

    def _nonlinear(self, node: exp.Expr, scope: Scope, infos) -> LinearForm | str:
        """The linear form ``a·x + b`` of a SUM/AVG argument, or why it has none.

        Sums of transformed values defeat the minimum frequency and the magnitude noise: a
        power mean ``SUM(POW(income, 50))`` reveals the largest income of any cell, zero padding
        (``CASE WHEN age > 90 THEN income ELSE 0 END``, ``COALESCE(income, 0)``) makes one
        person's value a cell of many contributors, and a scale (``income * 0.001``) moves
        every value under the flex function's threshold. So the argument must be built from one
        measure or numeric dimension column — stored as it is, not computed in a derived table
        — times constants, plus a constant, optionally times a weight, under single-branch
        ``CASE WHEN condition THEN ... END`` filters (other rows are NULL and do not count); see
        :func:`sqlsdc.planner.linear.linear_form`.
        """

        def kind(column: exp.Column) -> str:
            roles = self.column_lineage(column, scope, infos).roles
            if not self._stored(column, scope):
                raise NotLinear(
                    f"{column.sql(DIALECT)} is computed in a derived table; compute it inside "
                    "the aggregate instead"
                )
            if roles == {ColumnRole.WEIGHT}:
                return "weight"
            if roles and roles <= ROW_ROLES and family(column) in NUMERIC:
                return "value"
            raise NotLinear(f"{column.sql(DIALECT)} is not a numeric measure or dimension")

        try:
            return linear_form(node, kind)
        except NotLinear as problem:
            return str(problem)

    def _stored(self, column: exp.Column, scope: Scope) -> bool:
        """Whether ``column`` is a base table's column, passed unchanged through any derived
        tables and CTEs on the way (a value computed there would hide its scale)."""
        source = scope.sources.get(column.table)
        if isinstance(source, exp.Table):
            return True
        if not isinstance(source, Scope) or not isinstance(source.expression, exp.Select):
            return False
        for projection in source.expression.expressions:
            if projection.alias_or_name == column.name:
                inner = unwrap(projection.unalias())
                return isinstance(inner, exp.Column) and self._stored(inner, source)
        return False


def _else_zero_hint(argument: exp.Expr, name: str) -> str | None:
    """What to write for ``SUM``/``AVG`` of ``CASE WHEN c THEN v ELSE 0 END`` (or ``IF(c, v,
    0)``), the conditional count or share BI tools write, or None for any other argument. The
    form stays refused: padding with zeros is how one value became a cell of many
    contributors."""
    node = unwrap(argument)
    if isinstance(node, exp.Case) and len(node.args.get("ifs") or []) == 1:
        default = node.args.get("default")
    elif isinstance(node, exp.If):
        default = node.args.get("false")
    else:
        return None
    try:
        if default is None or not is_constant(default) or constant(default) != 0:
            return None
    except NotLinear:
        return None
    if name == "SUM":
        return (
            "leave out ELSE 0: SUM(CASE WHEN condition THEN value END) adds the same values "
            "(COALESCE(SUM(...), 0) for a 0 where no row matches)"
        )
    return (
        "leave out ELSE 0 for the mean of the rows that match; for a share write "
        "COUNT(CASE WHEN condition THEN 1 END) * 1.0 / COUNT(*)"
    )


_LINEAR_HINT = (
    "sum measures as they are, weighted (income * weight), scaled by constants, or filtered with "
    "WHERE or CASE WHEN condition THEN measure END; other transformations need a mechanism "
    "such as CKM or DP"
)

"""Totality checks on a query's expressions: no error may depend on confidential values
(value arguments by :mod:`sqlsdc.planner.totality`, arguments that must be literals by
:mod:`sqlsdc.planner.signatures`), and released values are checked as they are computed."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from sqlglot import exp
from sqlglot.optimizer.scope import Scope

from sqlsdc.engines.trees import of_kind
from sqlsdc.planner.exact_mixing import DERIVED, ENGINE_TYPED, shape
from sqlsdc.planner.scopes import DIALECT, SET_OPERATIONS, own_nodes, reads_public_only
from sqlsdc.planner.signatures import SIGNATURES, literal_refusal
from sqlsdc.planner.totality import (
    NUMERIC_FAMILIES,
    STORED,
    TOTALITY_HINT,
    aggregate_partiality,
    condition_problem,
    family,
    partiality,
    set_operation_problem,
    simple_case_branch,
)
from sqlsdc.written import spelled_sql


class TotalityChecks:
    """Mixed into the checker (:mod:`sqlsdc.planner.analyze`): ``self.refuse`` and
    ``self.constant_type`` come from there."""

    def _check_condition(self, condition: exp.Expr | None, label: str) -> None:
        """Refuse a WHERE, JOIN ON, HAVING or QUALIFY condition that DuckDB would cast to
        BOOLEAN with an error for some values (:func:`sqlsdc.planner.totality.condition_problem`:
        ``WHERE occupation`` fails on every row that reaches it, red team s42b)."""
        problem = condition_problem(condition)
        if problem:
            raise self.refuse(
                f"{label} {spelled_sql(condition, DIALECT)[:80]} could raise an error for some "
                f"confidential values ({problem}), which would reveal them",
                TOTALITY_HINT,
            )

    def _check_released(self, select: exp.Select, scope: Scope) -> None:
        """Projections, HAVING and ORDER BY of an aggregation are evaluated on every cell."""
        having, order = select.args.get("having"), select.args.get("order")
        if having is not None:
            self._check_condition(having.this, "HAVING")
        parts = [
            *select.expressions,
            *([having.this] if having else []),
            *(order.expressions if order else []),
        ]
        for part in parts:
            self._check_total(part, scope, released=True)

    def _check_public(self, info, infos) -> None:
        """In a statement that reads confidential rows, what a scope computes from public rows
        alone must be total too. Whether the engine evaluates it at all depends on the
        confidential rows: DuckDB drops the parts of a plan that its table statistics prove
        empty, so ``WHERE age > 93 AND region IN (SELECT region FROM regions WHERE CAST(name
        AS INTEGER) > 0)`` failed and ``age > 94`` did not, which told the oldest person's
        age (red team s35c). Values computed from released cells are checked where they are
        computed (:meth:`_check_released`); here only nodes that read public columns alone."""
        select = info.scope.expression
        if not isinstance(select, exp.Select):
            return
        public = {alias for alias, source in info.scope.sources.items()
                  if reads_public_only(source, infos)}  # fmt: skip
        parts = [*select.expressions, *(j.args.get("on") for j in select.args.get("joins") or [])]
        for on in parts[len(select.expressions) :]:
            self._check_condition(on, "JOIN ON")
        for key in ("where", "having", "qualify"):
            clause = select.args.get(key)
            parts.append(clause.this if clause is not None else None)
            if clause is not None:
                self._check_condition(clause.this, key.upper())
        for key in ("group", "order"):
            clause = select.args.get(key)
            parts.extend(clause.expressions if clause is not None else [])
        for part in parts:
            if part is None:
                continue
            self._check_constants(part)
            for window in of_kind(own_nodes(part), exp.Window):
                spec = window.args.get("spec")
                if spec is not None:
                    self._check_frame(spec)
                    self._check_public_range(window, spec, public)
            for n in _public_nodes(part, public, mixed=len(public) < len(info.scope.sources)):
                if isinstance(n, (exp.Sum, exp.Avg)):
                    self._check_public_sum(n)
                problem = aggregate_partiality(n) if _is_aggregate_call(n) else None
                if problem:  # ``MEDIAN(d)`` of dates far apart (red team s36b)
                    raise self.refuse(
                        f"{spelled_sql(n, DIALECT)} could raise an error on public values, and "
                        f"whether it runs depends on the confidential rows ({problem})",
                        "take MEDIAN, QUANTILE_CONT, AVG, STDDEV or VARIANCE of numbers (e.g. of "
                        "year(d) or EXTRACT(epoch FROM d)), or MIN, MAX or QUANTILE_DISC",
                    )
                if _is_aggregate_call(n) or isinstance(n, (exp.Window, exp.WindowSpec)):
                    continue  # of public values: MIN, COUNT...; their arguments are checked
                for column in n.find_all(exp.Column):
                    _type_column(column, info.scope, 0)
                refusal = literal_refusal(n, self.constant_type) if type(n) in SIGNATURES else None
                if refusal:  # ``length(label) // 0``: a divisor must be a positive literal
                    raise self.refuse(refusal.reason, refusal.hint)
                problem = partiality(n)
                if problem:
                    raise self.refuse(
                        f"{spelled_sql(n, DIALECT)} could raise an error on public values, and "
                        f"whether it runs depends on the confidential rows ({problem})",
                        TOTALITY_HINT,
                    )

    def check_limit_values(self, walked: list[exp.Expr]) -> None:
        """In a statement that reads confidential rows, LIMIT and OFFSET take a number literal
        (parameters are bound as literals; :func:`sqlsdc.guard.parse.check_limits` checks its
        range). DuckDB raises on a negative limit when the operator runs, and whether it runs
        depends on the confidential rows: ``age > 93 AND region IN (SELECT region FROM regions
        LIMIT (SELECT -1))`` failed and ``age > 94`` answered, the oldest person's age by
        bisection (red team s36a). ``walked``: every node of the statement (a set
        operation's LIMIT belongs to no SELECT's scope)."""
        for clause in walked:
            if not isinstance(clause, (exp.Limit, exp.Offset)):
                continue
            value = clause.expression
            if value is None or isinstance(value, (exp.Literal, exp.Null)):
                continue
            if isinstance(value, exp.Var) and value.name.upper() == "ALL":
                continue  # LIMIT ALL, as LIMIT NULL: no limit
            word = "LIMIT" if isinstance(clause, exp.Limit) else "OFFSET"
            raise self.refuse(
                f"{word} {value.sql(DIALECT)[:80]} is computed: in a query that reads "
                "confidential rows, a computed limit could fail or not as those rows say",
                f"write the number of rows as a literal, e.g. {word} 10",
            )

    def check_outer_order(self, walked: list[exp.Expr]) -> None:
        """In a statement that reads confidential rows, the ORDER BY of a set operation or of a
        parenthesised query (``((SELECT ...) ORDER BY ... LIMIT 3)``) takes output names and
        positions only. It belongs to no SELECT's scope, so no check saw what it computes, and
        DuckDB evaluates it only when the operator runs: ``age > 98 AND code IN (SELECT x FROM
        (SELECT code AS x FROM codes UNION ALL SELECT label FROM codes ORDER BY 1 // 0 LIMIT
        30) u)`` failed and ``age > 99`` answered (red team s36a). ``walked``: every node of
        the statement."""
        for operation in walked:
            outer = isinstance(operation, (*SET_OPERATIONS, exp.Subquery))
            order = operation.args.get("order") if outer else None
            for term in order.expressions if order is not None else []:
                value = term.this if isinstance(term, exp.Ordered) else term
                if isinstance(value, exp.Column) or (
                    isinstance(value, exp.Literal) and not value.is_string
                ):
                    continue
                what = "a subquery" if isinstance(operation, exp.Subquery) else "a set operation"
                raise self.refuse(
                    f"ORDER BY {value.sql(DIALECT)[:80]} of {what} computes a value: in a query "
                    "that reads confidential rows, it could fail or not as those rows say",
                    "order a UNION, INTERSECT, EXCEPT or parenthesised query by its outputs' "
                    "names or positions (e.g. ORDER BY 1), and compute the value inside it",
                )

    def check_set_operations(self, walked: list[exp.Expr]) -> None:
        """In a statement that reads confidential rows, each column of a UNION, INTERSECT or
        EXCEPT has values its branches' types convert to without error: DuckDB casts them to
        the common type where the operator runs, so ``code IN (SELECT code FROM (SELECT code,
        hi AS v FROM p UNION ALL SELECT code, d38 FROM p) u)`` (a HUGEINT and a DECIMAL(38,
        0)) failed for ``age > 98`` and answered for ``age > 99`` (red team s36b).
        ``walked``: every node of the statement."""
        for operation in walked:
            if not isinstance(operation, SET_OPERATIONS):
                continue
            columns = _branch_values(operation)
            for values in columns or []:
                problem = set_operation_problem(values)
                if problem:
                    listed = ", ".join(v.sql(DIALECT)[:30] for v in values[:3])
                    raise self.refuse(
                        f"the set operation's column of {listed} could raise an error "
                        f"converting its values to one type ({problem}), and whether it runs "
                        "depends on the confidential rows",
                        "select values of one type in every branch, e.g. cast each to VARCHAR "
                        "or DOUBLE",
                    )
            if columns is None:
                raise self.refuse(
                    "a set operation whose branches' values are not known",
                    "name the columns of each branch of a UNION, INTERSECT or EXCEPT",
                )

    def _check_public_sum(self, n: exp.Expr) -> None:
        """A SUM or AVG of public values whose type DuckDB adds up in place (HUGEINT, DECIMAL
        wider than 18 digits, or a type not known) can overflow, an error that runs or not as
        the confidential rows say (``HAVING SUM(big) > 0`` failed for ``age > 98`` and not for
        ``age > 99``; red team s35d). Smaller integers and decimals are summed in HUGEINT or
        DECIMAL(38), and floats reach infinity without an error."""
        argument = n.this
        typed = [argument.to] if isinstance(argument, (exp.Cast, exp.TryCast)) else None
        for kind in typed or [c.type for c in argument.find_all(exp.Column)]:
            small = kind is not None and (
                kind.is_type(*_SUMMED_WIDER, exp.DataType.Type.FLOAT, exp.DataType.Type.DOUBLE)
                or (kind.is_type(exp.DataType.Type.DECIMAL) and _precision(kind) <= 18)
            )
            if not small:
                raise self.refuse(
                    f"{n.sql(DIALECT)[:80]} adds up public values of type {kind} in place, "
                    "which can overflow, and whether it runs depends on the confidential rows",
                    "sum a column of a smaller type (BIGINT, DECIMAL(18, s), DOUBLE), or cast "
                    "it to DOUBLE",
                )

    def _check_constants(self, part: exp.Expr) -> None:
        """Evaluate the constants of a public scope's ``part`` apart from the file (refused if
        one raises), as a confidential scope's are: ``code IN (SELECT code FROM codes WHERE
        CAST('x' AS INTEGER) = 1)`` failed with ``age > 98`` and answered with ``age > 99``
        (DuckDB dropped the subquery that its statistics proved unused): the oldest person's
        age by bisection (red team s35d). A constant here is a largest part that reads no
        column and holds no subquery, aggregate or window (those are computed over rows)."""
        for n in _constant_parts(part):
            self._type_constant(n)

    def _check_total(
        self,
        node: exp.Expr,
        scope: Scope,
        released: bool = False,
        walked: list[exp.Expr] | None = None,
    ) -> None:
        """Refuse ``node`` unless no confidential value can make it raise an error.

        Every function must be listed in :data:`sqlsdc.planner.signatures.SIGNATURES`, its
        literal arguments (date parts, formats, divisors, positions...) must be literals, and
        its value arguments must have types it is total on. ``released`` marks the projections,
        HAVING and ORDER BY of an aggregation: they run on every cell, published or not, so an
        error there would reveal which cells exist; aggregate results are released values there,
        and only the literal arguments are checked on what depends on them. ``walked``:
        ``own_nodes(node)``, when the caller has it (not read with ``released``).
        """
        nodes, reads_column, released_values = _evaluated_nodes(node, released, walked)
        kinds = set(map(type, nodes))  # the class tests below, made once per class
        acting = {
            k for k in kinds if issubclass(k, (exp.Column, exp.WindowSpec)) or k in SIGNATURES
        }
        inert = {k for k in kinds if issubclass(k, _INERT)}
        for n in nodes:
            if type(n) not in acting:  # nothing below applies to it
                continue
            if isinstance(n, exp.Column):
                _type_column(n, scope, 0)
            # only a listed function or operator has arguments that must be literals
            refusal = literal_refusal(n, self.constant_type) if type(n) in SIGNATURES else None
            if refusal:
                raise self.refuse(refusal.reason, refusal.hint)
            if isinstance(n, exp.WindowSpec):
                self._check_frame(n)
        checked = []
        for n, reads, computed in zip(nodes, reads_column, released_values, strict=True):
            if computed:  # on an aggregate result, or a window function over the cells
                continue
            if not reads:
                if type(n) not in inert and not simple_case_branch(n) and type(n) is not exp.Group:
                    # evaluated alone; a GROUP BY clause is no value (its keys are: s44q)
                    self._type_constant(n)
                continue
            checked.append(n)
        for n in checked:  # after the constants have the engine's types
            problem = partiality(n)
            if problem:
                raise self.refuse(
                    f"{spelled_sql(n, DIALECT)} could raise an error for some confidential values "
                    f"({problem}), which would reveal them",
                    TOTALITY_HINT,
                )

    def _check_frame(self, spec: exp.WindowSpec) -> None:
        """A window frame's offsets are UNBOUNDED, CURRENT ROW or non-negative literals: DuckDB
        raises on a negative offset row by row, so an offset computed from the cells could
        fail for some of them, and one computed in a public scope (``ROWS BETWEEN (SELECT
        -1.0) PRECEDING``) fails only where the plan keeps the window (red team s36a)."""
        if not _literal_frame(spec):
            raise self.refuse(
                f"the window frame {spec.sql(DIALECT)[:80]} has an offset that is not a "
                "number or interval literal, or a ROWS or GROUPS offset beyond BIGINT (a "
                "computed offset could fail for some rows, a huge one where the window runs)",
                "write the frame with literal offsets of at most 9223372036854775807, e.g. "
                "ROWS BETWEEN 2 PRECEDING AND CURRENT ROW",
            )

    def _check_public_range(self, window: exp.Window, spec: exp.WindowSpec, public) -> None:
        """A RANGE frame with an offset adds it to the ORDER BY value of every row, which
        overflows an exact or date value near its type's limit: ``COUNT(code) OVER (ORDER BY
        length(label) RANGE BETWEEN 9223372036854775807 FOLLOWING AND UNBOUNDED FOLLOWING)``
        in a public subquery failed for ``age > 98`` and answered for ``age > 99`` (red team
        s36a). Over public values such a frame needs a floating-point ORDER BY (infinities,
        no error); over released cells the error tells what the cells show."""
        if str(spec.args.get("kind") or "").upper() != "RANGE":
            return
        offsets = (spec.args.get("start"), spec.args.get("end"))
        if all(o is None or isinstance(o, str) for o in offsets):
            return  # UNBOUNDED and CURRENT ROW only
        order = window.args.get("order")
        for term in order.expressions if order is not None else []:
            key = term.this if isinstance(term, exp.Ordered) else term
            if any(c.table not in public for c in key.find_all(exp.Column)):
                continue  # a value of released cells
            if family(key) != "float":
                raise self.refuse(
                    f"the RANGE frame over {key.sql(DIALECT)[:60]} adds its offset to "
                    "public values, which can overflow, and whether it runs depends on the "
                    "confidential rows",
                    "use a ROWS frame, or order the RANGE frame by a DOUBLE (e.g. ORDER BY "
                    "CAST(x AS DOUBLE))",
                )

    def _type_constant(self, n: exp.Expr) -> None:
        """Evaluate a constant once (refused if it raises) and give it the engine's type:
        DuckDB types ``1.000 * 1`` DECIMAL(38, 3) and ``NULLIF(1.5, 0)`` DECIMAL(2, 1), which
        sqlglot's inference does not know, and comparing such a value with a stored exact
        number casts both to one type that may not hold some stored values."""
        if isinstance(n, _INERT):
            return
        engine_type = self.constant_type(n)
        if engine_type is None:
            raise self.refuse(
                f"the expression {n.sql(DIALECT)} raises an error", "fix the expression"
            )
        n.type = engine_type
        n.meta[ENGINE_TYPED] = True


def _type_column(column: exp.Column, scope: Scope, depth: int) -> None:
    """Mark what a column's values are, where sqlglot's inferred type may be wrong: a stored
    column has its table's type (``STORED``); a derived table's column has the family and
    exact shape of the value it selects (``DERIVED``), read through nested derived tables and
    set operations (sqlglot types ``1.5`` and ``CASE … THEN 1.5 END`` DOUBLE where DuckDB has
    a DECIMAL, and ``tinyint_col // 2`` INTEGER where DuckDB has a TINYINT). A column whose
    values cannot be followed has no family: comparisons with it are refused."""
    source = scope.sources.get(column.table)
    if isinstance(source, exp.Table):
        column.meta[STORED] = True
        return
    if not isinstance(source, Scope) or column.meta.get(DERIVED) is not None:
        return
    values = _selected(source, column.name, depth)
    if values is None:
        column.meta[DERIVED] = (None, None)
        return
    families = {family(v) for v in values} - {"null"}
    found = families.pop() if len(families) == 1 else None
    if families and families <= NUMERIC_FAMILIES:
        found = (
            "float" if "float" in families else "decimal" if "decimal" in families else "integer"
        )
    shapes = [shape(v, family) for v in values if family(v) in ("integer", "decimal")]
    joined = None
    if shapes and None not in shapes and found in ("integer", "decimal"):
        joined = shapes[0]
        for s in shapes[1:]:
            joined = joined.join(s)
    column.meta[DERIVED] = (found, joined)


def _selected(source: Scope, name: str, depth: int) -> list[exp.Expr] | None:
    """The values a derived table's column ``name`` takes (one per branch of a set
    operation), their own columns marked; None if they cannot be found."""
    if depth > _DEPTH:
        return None
    if isinstance(source.expression, SET_OPERATIONS):
        branches = source.set_operation_scopes
        first = source.expression.selects
        position = next((i for i, p in enumerate(first) if p.alias_or_name == name), None)
        if position is None:
            return None
        values = []
        for branch in branches:
            selects = branch.expression.selects
            if position >= len(selects):
                return None
            found = _selected(branch, selects[position].alias_or_name, depth + 1)
            if found is None:
                return None
            values.extend(found)
        return values
    for projection in source.expression.selects:
        if projection.alias_or_name == name:
            value = projection.unalias()
            for n in own_nodes(value):
                if isinstance(n, exp.Column):
                    _type_column(n, source, depth + 1)
            return [value]
    return None


_DEPTH = 64  # nested derived tables followed; deeper ones are unknown


_INERT = (
    exp.Literal,
    exp.Null,
    exp.Boolean,
    exp.Star,
    exp.DataType,
    exp.Var,
    exp.Identifier,
    exp.TableAlias,  # a subquery's output name (``(SELECT ...) AS _col_2``), no value
    exp.DataTypeParam,
    exp.WindowSpec,  # a frame's clauses; its offsets are nodes of their own, checked as any
)


def _literal_frame(spec: exp.WindowSpec) -> bool:
    """Whether each offset of a window frame is UNBOUNDED, CURRENT ROW, a non-negative number
    literal or an interval of one; a ROWS or GROUPS offset one that a BIGINT holds (DuckDB
    casts it where the window runs: ``ROWS BETWEEN 18446744073709551615 PRECEDING`` in a
    public subquery failed for ``age > 98`` and answered for ``age > 99``; red team s36b)."""
    counted = str(spec.args.get("kind") or "").upper() in ("ROWS", "GROUPS")
    for offset in (spec.args.get("start"), spec.args.get("end")):
        if isinstance(offset, exp.Interval):
            offset = offset.this
        if offset is None or isinstance(offset, str):
            continue
        if not _number_literal(offset) or (counted and not _fits_bigint(str(offset.this))):
            return False
    return True


def _number_literal(node: exp.Expr) -> bool:
    return isinstance(node, exp.Literal) and (
        not node.is_string or node.this.replace(".", "", 1).isdigit()
    )


_BIGINT_MAX = 2**63 - 1


def _fits_bigint(text: str) -> bool:
    """Whether a non-negative number literal converts to BIGINT: an integer up to 2^63 - 1, a
    decimal below it (DuckDB rounds), a double below 2^63 (``9223372036854775807e0`` rounds
    up to it)."""
    try:
        if "e" in text.lower():
            return float(text) < 2.0**63
        value = Decimal(text)
    except (ValueError, InvalidOperation, OverflowError):
        return False
    return value <= _BIGINT_MAX if value == value.to_integral_value() else value < _BIGINT_MAX


def _evaluated_nodes(
    node: exp.Expr, released: bool, walked: list[exp.Expr] | None = None
) -> tuple[list[exp.Expr], list[bool], list[bool]]:
    """The nodes of ``node`` in its scope, parents first, whether each reads a column of
    the scope (is one or has one below it), and, with ``released``, whether each computes on
    an aggregate result or is a window function over the cells (an aggregate call or a window
    is it or below it in its scope, or it is a window's function; all False without
    ``released``). With ``released``, the arguments of aggregates are not entered (they are
    checked as aggregate arguments). One walk, whatever the size: the flags are carried up
    from the children, not searched for from every node (a search below every node of a
    CASE of 4,000 WHENs walked the CASE 4,000 times).

    Under ``released`` the column flag of a node with an aggregate below it misses the
    aggregate's arguments; such a node is skipped as a released value.

    ``walked``: ``own_nodes(node)`` (this walk's order, without ``released``), when the
    caller has it: the flags are then carried up along the nodes' parents, each of which must
    come before its child in it (else the walk is made here)."""
    if walked is not None and not released and walked and walked[0] is node:
        carried = _carried_up(walked)
        if carried is not None:
            return walked, carried, [False] * len(walked)
    nodes: list[exp.Expr] = []
    parents: list[int] = []
    stack = [(node, -1)]
    while stack:
        current, parent = stack.pop()
        index = len(nodes)
        nodes.append(current)
        parents.append(parent)
        if released and _is_aggregate_call(current):
            continue
        for value in reversed(current.args.values()):  # iter_expressions(reverse=True)
            if isinstance(value, exp.Expr):
                if not isinstance(value, _NESTED):
                    stack.append((value, index))
            elif isinstance(value, list):
                children = (v for v in reversed(value) if isinstance(v, exp.Expr))
                stack.extend((v, index) for v in children if not isinstance(v, _NESTED))
    reads_column = [isinstance(n, exp.Column) or _holds_subquery(n) for n in nodes]
    for index in range(len(nodes) - 1, 0, -1):  # children come after their parents
        if reads_column[index]:
            reads_column[parents[index]] = True
    if not released:
        return nodes, reads_column, [False] * len(nodes)
    # below an aggregate call, which is not entered, there is nothing it does not say already
    computed = [_is_aggregate_call(n) or isinstance(n, exp.Window) for n in nodes]
    for index in range(len(nodes) - 1, 0, -1):
        if computed[index]:
            computed[parents[index]] = True
    for index, n in enumerate(nodes):
        if isinstance(n.parent, exp.Window) and n.arg_key == "this":
            computed[index] = True
    return nodes, reads_column, computed


def _carried_up(walked: list[exp.Expr]) -> list[bool] | None:
    """Whether each node of ``walked`` (a walk with parents first, the root first) is a column
    or has one below it, carried up along each node's parent; None when a parent is not
    before its node in ``walked``."""
    position = {id(n): i for i, n in enumerate(walked)}
    reads_column = [isinstance(n, exp.Column) or _holds_subquery(n) for n in walked]
    parents = [-1]
    for i in range(1, len(walked)):
        parent = position.get(id(walked[i].parent), i)
        if parent >= i:
            return None
        parents.append(parent)
    for index in range(len(walked) - 1, 0, -1):  # children come after their parents
        if reads_column[index]:
            reads_column[parents[index]] = True
    return reads_column


_NESTED = (exp.Subquery, exp.Select, *SET_OPERATIONS)


def _holds_subquery(node: exp.Expr) -> bool:
    """Whether an operand of ``node`` is a query (a scalar subquery, EXISTS's or IN's): a value
    computed in a scope of its own, which varies like a column here (``(SELECT
    MIN(population) FROM regions) * 9223372036854775807`` and ``CAST(EXISTS (SELECT 1 FROM
    codes) AS BIGINT) * 9223372036854775807 + 1`` overflow; as constants they were typed and
    never judged, red team s36a). A query itself (a projection ``(SELECT ...) AS x``) is no
    operation on one."""
    if isinstance(node, _NESTED):
        return False
    for value in node.args.values():
        if isinstance(value, _NESTED):
            return True
        if isinstance(value, list) and any(isinstance(v, _NESTED) for v in value):
            return True
    return False


_SUMMED_WIDER = (
    exp.DataType.Type.TINYINT, exp.DataType.Type.SMALLINT, exp.DataType.Type.INT,
    exp.DataType.Type.BIGINT, exp.DataType.Type.UTINYINT, exp.DataType.Type.USMALLINT,
    exp.DataType.Type.UINT, exp.DataType.Type.UBIGINT, exp.DataType.Type.BOOLEAN,
)  # fmt: skip
"""Integer types DuckDB's SUM adds up in HUGEINT: no overflow below 2^64 rows."""


def _precision(kind: exp.DataType) -> int:
    """A DECIMAL's precision (DuckDB's default 18 when not written)."""
    params = kind.expressions
    if not params:
        return 18
    value = params[0].this if isinstance(params[0], exp.DataTypeParam) else params[0]
    try:
        return int(value.name if isinstance(value, exp.Expr) else value)
    except (TypeError, ValueError):
        return 39  # not read: treated as wide


def _constant_parts(node: exp.Expr) -> list[exp.Expr]:
    """The largest parts of ``node`` in its scope that read no column and hold no subquery,
    aggregate or window (flags carried up from the children: one walk), leaving out what is
    not evaluated alone (literals, names, ORDER BY terms)."""
    nodes: list[exp.Expr] = []
    parents: list[int] = []
    stack = [(node, -1)]
    while stack:
        current, parent = stack.pop()
        nodes.append(current)
        parents.append(parent)
        if isinstance(current, _NESTED):
            continue  # a scope of its own: not entered
        index = len(nodes) - 1
        for value in current.args.values():
            children = value if isinstance(value, list) else [value]
            stack.extend((v, index) for v in children if isinstance(v, exp.Expr))
    varies = [
        isinstance(n, (exp.Column, exp.Window, exp.WindowSpec, *_NESTED))
        or _is_aggregate_call(n)
        or (isinstance(n.parent, exp.Window) and n.arg_key == "this")  # a window's function
        for n in nodes
    ]
    for index in range(len(nodes) - 1, 0, -1):  # children come after their parents
        varies[parents[index]] |= varies[index]
    candidate = [
        not v
        and not isinstance(n, (*_INERT, exp.Identifier, exp.Order, exp.Ordered))
        and not simple_case_branch(n)
        for n, v in zip(nodes, varies, strict=True)
    ]
    return [
        n
        for n, c, p in zip(nodes, candidate, parents, strict=True)
        if c and (p < 0 or not candidate[p])
    ]


def _is_aggregate_call(node: exp.Expr) -> bool:
    return isinstance(node, exp.AggFunc) and not isinstance(node.parent, exp.Window)


def _public_nodes(node: exp.Expr, public: set[str], mixed: bool = False) -> list[exp.Expr]:
    """The nodes of ``node`` in its scope that compute on values of the ``public`` sources
    only (a column, a scalar subquery, a window or an aggregate; at least one): flags carried
    up from the children, one walk. ``mixed``: the scope reads other sources too (released
    cells), so what a window or an aggregate computes over its rows is not public alone."""
    nodes: list[exp.Expr] = []
    parents: list[int] = []
    stack = [(node, -1)]
    while stack:
        current, parent = stack.pop()
        index = len(nodes)
        nodes.append(current)
        parents.append(parent)
        for value in current.args.values():
            children = value if isinstance(value, list) else [value]
            kept = (v for v in children if isinstance(v, exp.Expr) and not isinstance(v, _NESTED))
            stack.extend((v, index) for v in kept)
    # a scalar subquery, a window and an aggregate vary as a column does, though they may
    # name none (``ROW_NUMBER() OVER () * 9223372036854775807``, red team s36a)
    over_rows = [isinstance(n, exp.Window) or _is_aggregate_call(n) for n in nodes]
    reads = [
        isinstance(n, exp.Column) or r or _holds_subquery(n)
        for n, r in zip(nodes, over_rows, strict=True)
    ]
    other = [
        (isinstance(n, exp.Column) and n.table not in public) or (mixed and r)
        for n, r in zip(nodes, over_rows, strict=True)
    ]
    for index in range(len(nodes) - 1, 0, -1):  # children come after their parents
        reads[parents[index]] |= reads[index]
        other[parents[index]] |= other[index]
    return [
        n
        for n, r, o in zip(nodes, reads, other, strict=True)
        if r and not o and not isinstance(n, exp.Column)
    ]


def _branch_values(node: exp.Expr) -> list[list[exp.Expr]] | None:
    """The values each branch of a set operation selects, column by column (nested set
    operations' branches included), or None when a branch's columns are not known."""
    while isinstance(node, (exp.Subquery, exp.Paren)):
        node = node.this
    if isinstance(node, exp.Select):
        values = [e.unalias() for e in node.expressions]
        return None if any(isinstance(v, exp.Star) for v in values) else [[v] for v in values]
    if not isinstance(node, SET_OPERATIONS):
        return None
    left, right = _branch_values(node.this), _branch_values(node.expression)
    if left is None or right is None or len(left) != len(right):
        return None
    return [a + b for a, b in zip(left, right, strict=True)]

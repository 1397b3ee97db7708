"""One spelling for values SQL holds equal, wherever the engine picks one of them.

SQL compares -0.0 equal to 0.0, NaN equal to -NaN (DuckDB) and ``INTERVAL 1 MONTH`` equal to
``INTERVAL 30 DAY``, yet they print differently and ``1 / x`` tells the zeros apart (-inf,
inf). Where the engine keeps one of several equal values it keeps the first it reads, and
DuckDB's reading order comes from its hash tables, which hidden groups move (red team s33:
one person's age read from the order of released rows). So a query that puts -0.0 in some
groups and 0.0 in others learns that order from which spelling survives:

* the representative a GROUP BY keeps for a key (``SELECT 1 / x ... GROUP BY x``; red team
  s33c), in the analyst's scopes and in the cell frames, which group raw rows;
* the row a DISTINCT, a set operation (UNION, INTERSECT, EXCEPT) or a LIMIT among ties keeps,
  and the values an aggregate's DISTINCT keeps (``SUM(DISTINCT x)`` of NaNs: red team s34);
* the value MIN, MAX, the quantiles, FIRST_VALUE, LAST_VALUE, LAG and LEAD return
  (:mod:`sqlsdc.rewrite.order` calls :func:`in_one_spelling` on them).

Structs, lists and VARIANTs among them, and values of a type the guard cannot tell where
it must, are refused (red teams s34 and s34b).

Each such value is written in one spelling before anything reads it: a float as ``x + 0``
(-0.0 + 0.0 is 0.0) and a NaN as ``ABS(x)`` (the positive NaN), an interval through
``normalized_interval`` (30 days as 1 month, 24 hours as 1 day). A group key is spelled where
the grouped query reads it (its projections, HAVING, QUALIFY, ORDER BY), which leaves the
GROUP BY clause as written and the representative irrelevant. The released result is
written the same way again (:func:`sqlsdc.guard.postprocess.values_of`).

Which values need it is decided by their type, and sqlglot's types differ from DuckDB's in
places that matter here (``m / 2`` of a DECIMAL is a DOUBLE, ``ts - ts`` an INTERVAL,
``n * 1.5`` a DECIMAL): :func:`_kind` gives DuckDB's (checked against ``typeof`` in
``tests/security/test_redteam_s34b.py``), and ``x + 0`` keeps a DECIMAL that sqlglot takes
for a DOUBLE a DECIMAL.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.engines.trees import nodes
from sqlsdc.errors import PolicyViolation
from sqlsdc.rewrite.sql import data_type

_T = exp.DataType.Type
_FLOATS = (_T.DOUBLE, _T.FLOAT)
_SPELLED = (*_FLOATS, _T.INTERVAL)
ONE_SPELLING = frozenset((
    _T.BOOLEAN, _T.TINYINT, _T.UTINYINT, _T.SMALLINT, _T.USMALLINT, _T.INT, _T.UINT,
    _T.BIGINT, _T.UBIGINT, _T.INT128, _T.UINT128, _T.DECIMAL, _T.VARCHAR, _T.CHAR, _T.TEXT,
    _T.DATE, _T.TIME, _T.TIMESTAMP, _T.TIMESTAMPNTZ, _T.DATETIME, _T.TIMESTAMPTZ, _T.TIMESTAMP_S,
    _T.TIMESTAMP_MS, _T.TIMESTAMP_NS, _T.UUID, _T.VARBINARY, _T.BINARY, _T.BIT, _T.ENUM, _T.NULL,
))  # fmt: skip
"""Types whose values SQL holds equal only when they are written alike."""
_CHOOSING = (exp.Min, exp.Max, exp.Median, exp.Quantile, exp.PercentileCont, exp.PercentileDisc,
             exp.FirstValue, exp.LastValue, exp.Lag, exp.Lead)  # fmt: skip
_CHOSEN_TYPE = "sdc_chosen_type"  # meta key: the type a chosen value had in the analysed tree
_TEMPORAL = {  # sqlglot writes DuckDB's TIMESTAMP as TIMESTAMPNTZ
    _T.DATE, _T.DATETIME, _T.TIMESTAMP, _T.TIMESTAMPNTZ, _T.TIMESTAMPTZ, _T.TIMESTAMP_S,
    _T.TIMESTAMP_MS, _T.TIMESTAMP_NS, _T.TIMESTAMPLTZ, _T.TIME, _T.TIMETZ,
}  # fmt: skip
_INTERPOLATING = (exp.Median, exp.Quantile, exp.PercentileCont)
_PASSING = (exp.Sum, exp.Min, exp.Max, exp.PercentileDisc, exp.FirstValue, exp.LastValue,
            exp.Lag, exp.Lead)  # fmt: skip
_STRINGS = {_T.VARCHAR, _T.CHAR, _T.TEXT}
_NOT_TIMESTAMPS = {_T.DATE, _T.TIME, _T.TIMETZ}  # their differences are no intervals
_EXACT_WITH_DECIMALS = {  # what a DECIMAL adds, subtracts or multiplies as a DECIMAL
    _T.DECIMAL, _T.TINYINT, _T.SMALLINT, _T.INT, _T.BIGINT, _T.UTINYINT, _T.USMALLINT,
    _T.UINT, _T.UBIGINT, _T.NULL,
}  # fmt: skip
_MAX_DEPTH = 150  # nodes and projections :func:`_kind` follows, a bound on its recursion
_DOUBLE_PARTS = ("EPOCH", "JULIAN")  # the parts EXTRACT returns as a DOUBLE
_SET_OPERATIONS = (exp.Union, exp.Intersect, exp.Except)
# where a grouped query reads its keys (not GROUP BY itself, not WHERE: rows before grouping)
_READING = ("expressions", "having", "qualify", "order")


def released_in_one_spelling(tree: exp.Expr, sql: str | None = None, within=None) -> None:
    """Spell, in every query of ``tree`` (a protected query, changed in place), the values of
    each aggregate's DISTINCT, the keys of each GROUP BY where the query reads them, and the
    outputs of every query that keeps some of its rows among equal ones (DISTINCT, a set
    operation's operands, LIMIT or OFFSET). ``within`` (a test of a SELECT): only in the
    queries it accepts (a DP stage's exact cells spell the analyst's scopes alone,
    :func:`sqlsdc.rewrite.order.analyst_scopes_in_order`).

    Raises:
        PolicyViolation: such a value is a struct or a list that may hold floats or intervals
            (or whose type the guard cannot tell), or a VARIANT, which SQL alone cannot write
            in one spelling; or its type is computed through too many tables or operations to
            be told.
    """
    walked = nodes(tree)
    for node in walked:  # first: a spelled output copies the aggregates it holds
        if isinstance(node, exp.Distinct) and isinstance(node.parent, (exp.AggFunc, exp.Order)):
            aggregate = node.parent if isinstance(node.parent, exp.AggFunc) else node.parent.parent
            if isinstance(aggregate, exp.Count):
                continue  # a count of classes, whichever value stands for each
            select = node.find_ancestor(exp.Select)
            if within is None or within(select):
                _spell_keys(select, node.expressions, (), sql, aggregate)
    for node in walked:
        if not isinstance(node, exp.Select) or (within is not None and not within(node)):
            continue
        group = node.args.get("group")
        if group is not None:
            _spell_keys(node, _group_keys(group), _READING, sql)
        if (
            node.args.get("distinct") is not None
            or node.args.get("limit") is not None
            or node.args.get("offset") is not None
            or _operand_of_set_operation(node)
        ):
            keys = [p.unalias() for p in node.expressions]
            _spell_keys(node, keys, ("expressions", "order"), sql)


def remember_chosen_type(node: exp.Expr) -> None:
    """Record on ``node`` of the analysed tree (a MIN, quantile or window) the type of the
    value it chooses, for :func:`in_one_spelling`: the rewrite rebuilds the aggregations'
    own nodes over cell columns, which have no type."""
    kind = _chosen_type(node)
    if kind is not None:
        node.meta[_CHOSEN_TYPE] = kind.sql("duckdb")


def in_one_spelling(value: exp.Expr, sql: str | None) -> None:
    """Replace ``value`` (a MIN, MAX, quantile, or a window returning one of the values it
    reads) by the same value in one spelling, if its type has several.

    Raises:
        PolicyViolation: its type has several spellings of one value that cannot be written
            in one (a struct or list holding floats), or the guard cannot tell its type.
    """
    recorded = value.meta.get(_CHOSEN_TYPE)
    kind = data_type(recorded, "duckdb") if recorded else _chosen_type(value)
    if kind is None or not (kind.this in ONE_SPELLING or kind.this in _SPELLED):
        raise PolicyViolation(
            f"{value.sql('duckdb')[:60]} returns one of the values it reads, the first among "
            "values SQL holds equal (-0.0 and 0.0, NaN and -NaN, 1 month and 30 days) in the "
            "order the engine reads them, and values of its type "
            f"({kind.sql('duckdb') if kind is not None else 'unknown'}) cannot be written in "
            "one spelling",
            "apply it to a number, string, date or timestamp (CAST the value to the type you "
            "mean, e.g. DOUBLE or VARCHAR)",
            sql,
        )
    if kind.this in _SPELLED:
        value.replace(_spelled(value.copy(), kind))


def in_one_spelling_already(value: exp.Expr) -> bool:
    """Whether every value ``value`` can take has one spelling (its type is known to be one
    of :data:`ONE_SPELLING`)."""
    kind = _kind(value, value.find_ancestor(exp.Select))
    return kind is not None and kind.this in ONE_SPELLING


def _chosen_type(node: exp.Expr) -> exp.DataType | None:
    """The type of what ``node`` returns if it chooses one of the values it reads (a MIN, a
    quantile, a window returning a row's value): its argument's. A quantile of integers
    interpolates a DOUBLE between two of them, which is never -0.0 or NaN."""
    function = node.this if isinstance(node, exp.Window) else node
    while isinstance(function, (exp.IgnoreNulls, exp.RespectNulls)):
        function = function.this
    if not isinstance(function, _CHOOSING):
        return None
    argument = function.this
    if isinstance(argument, exp.Grouping):
        return data_type("INT")
    if isinstance(argument, (exp.DateTrunc, exp.TimestampTrunc)):
        argument = argument.this  # a date or a timestamp, which sqlglot leaves unknown
    if isinstance(argument, exp.Null):
        return data_type("NULL")
    return _kind(argument, node.find_ancestor(exp.Select))


def _spelled(value: exp.Expr, kind: exp.DataType) -> exp.Expr:
    if kind.this is exp.DataType.Type.INTERVAL:
        spelled: exp.Expr = exp.Anonymous(this="normalized_interval", expressions=[value])
    else:
        spelled = exp.Case(
            ifs=[exp.If(this=exp.IsNan(this=value.copy()), true=exp.Abs(this=value.copy()))],
            default=exp.Add(this=value, expression=exp.Literal.number(0)),  # the type kept
        )  # fmt: skip
    spelled.type = kind
    return exp.Paren(this=spelled) if isinstance(spelled, exp.Case) else spelled


def _spell_keys(
    select: exp.Select | None,
    keys: list[exp.Expr],
    clauses: tuple[str, ...],
    sql: str | None,
    within=None,
) -> None:
    """Replace, in ``clauses`` of ``select`` or in the node ``within`` (not in subqueries, nor
    in GROUPING()), every occurrence of a key of a spelled type by its spelling; a projection
    keeps its name. A struct or list that may hold a spelled type, or a VARIANT, is refused."""
    typed = []
    for key in keys:
        if isinstance(key, exp.Literal):
            continue
        kind = _kind(key, select)
        if _unspellable(kind):
            raise PolicyViolation(
                f"{key.sql('duckdb')[:60]} is a struct, list or VARIANT the query keeps one of "
                "among equal ones (a group key, a DISTINCT or set operation's row, a LIMIT's "
                "row), the first the engine reads, and the values it may hold (-0.0 and 0.0, "
                "NaN and -NaN, 1 month and 30 days, 1.50 and 1.5) cannot be written in one "
                "spelling",
                "group, deduplicate or limit by the values it holds one by one, each CAST to "
                "the type you mean",
                sql,
            )
        if kind is not None and kind.this in _SPELLED:
            typed.append((key.copy(), kind))
    if not typed:
        return
    typed.sort(key=lambda pair: -sum(1 for _ in pair[0].walk()))  # a + b before a
    parts = [within] if within is not None else []
    for clause in clauses:
        value = select.args.get(clause)
        parts += value if isinstance(value, list) else [value]
    for part in parts:
        if part is not None:
            _replace_in(part, select, typed)


def _replace_in(part: exp.Expr, select: exp.Select, typed) -> None:
    pending = [part]
    while pending:
        node = pending.pop()
        match = next((kind for key, kind in typed if type(node) is type(key) and node == key),
                     None)  # fmt: skip
        if match is not None:
            value = node.copy()
            if isinstance(value, exp.Subquery):  # named in place: ``(SELECT ...) AS _col_0``
                value.set("alias", None)
            spelled = _spelled(value, match)
            if node.parent is select:  # an unnamed projection keeps its output name
                spelled = exp.alias_(spelled, node.alias_or_name) if node.alias_or_name else spelled
            node.replace(spelled)
            continue
        if isinstance(node, (exp.Query, exp.Grouping)):  # another scope; keys as written
            continue
        pending.extend(node.iter_expressions())


def _unspellable(kind: exp.DataType | None) -> bool:
    """Whether values of type ``kind`` may be equal in several spellings that SQL alone cannot
    rewrite in one: a struct or list that may hold a spelled type or one sqlglot cannot tell
    (a tuple's fields), or a VARIANT, equal to another whatever the type it holds (-0.0 and
    0.0, a DECIMAL 1.50 and 1.5)."""
    if _unknown(kind):
        return False
    if kind.this is exp.DataType.Type.VARIANT:
        return True
    if kind.this not in exp.DataType.NESTED_TYPES:
        return False
    inner = [t for t in kind.find_all(exp.DataType) if t is not kind]
    return not inner or any(t.this in _SPELLED or _unknown(t) for t in inner)


def _group_keys(group: exp.Group) -> list[exp.Expr]:
    """The expressions a GROUP BY groups by, out of ROLLUP, CUBE, GROUPING SETS and parens."""
    keys = []
    pending = list(group.expressions)
    while pending:
        node = pending.pop()
        if isinstance(node, (exp.Rollup, exp.Cube, exp.GroupingSets, exp.Tuple)):
            pending.extend(node.expressions)
        elif isinstance(node, exp.Paren):
            pending.append(node.this)
        else:
            keys.append(node)
    return keys


def _operand_of_set_operation(select: exp.Select) -> bool:
    node: exp.Expr = select
    while isinstance(node.parent, exp.Subquery):
        node = node.parent
    return isinstance(node.parent, _SET_OPERATIONS) and node.arg_key in ("this", "expression")


def _kind(value: exp.Expr, select: exp.Select | None, depth: int = 0) -> exp.DataType | None:
    """The type DuckDB gives ``value`` in ``select``, where it matters here: sqlglot's
    annotation, corrected where it differs (a DECIMAL divided or mixed with a DOUBLE is a
    DOUBLE, and so is its ``//``; a difference of timestamps an INTERVAL; EXTRACT(epoch),
    EXTRACT(julian) and MEDIAN of numbers DOUBLEs; FLOOR and CEIL of an integer DOUBLEs, and
    of a DECIMAL, a DOUBLE or an INTERVAL (and ROUND, DATE_TRUNC) that type; SUM, MIN, a
    LAG... of a DOUBLE or an INTERVAL one too, whatever sqlglot made of the argument; a tuple
    a STRUCT); and for a column of a derived table or CTE, that of the projection it names
    (sqlglot's, if any, is uncorrected).

    Raises:
        PolicyViolation: telling it takes more than :data:`_MAX_DEPTH` steps (a chain of CTEs).
    """
    if depth > _MAX_DEPTH:  # not unknown, which a key's spelling would take for one spelling
        raise PolicyViolation(
            "the guard cannot tell the type of a value computed through this many derived "
            "tables, CTEs or operations, nor so whether it must be written in one spelling",
            "pass it through fewer derived tables or CTEs",
        )
    if isinstance(value, (exp.Paren, exp.Neg, exp.Abs, exp.Alias)):
        return _kind(value.this, select, depth + 1)
    if isinstance(value, (exp.Cast, exp.TryCast)):
        return value.to
    if isinstance(value, exp.Column):  # sqlglot passes its own type on, wrong or not
        derived = _column_kind(value, select, depth)
        if derived is not None or _unknown(value.type):
            return derived
    if isinstance(value, (exp.Tuple, exp.Struct, exp.Array)) and _unknown(value.type):
        fields = [_kind(v.unalias(), select, depth + 1) for v in value.expressions]
        return exp.DataType(
            this=_T.LIST if isinstance(value, exp.Array) else _T.STRUCT,
            expressions=[f if f is not None else exp.DataType.build("UNKNOWN") for f in fields],
            nested=True,
        )  # a struct of its fields' types, or a list of its elements'
    if isinstance(value, (exp.Div, exp.IntDiv, exp.Add, exp.Sub, exp.Mul, exp.Mod)):
        return _arithmetic_kind(value, select, depth)
    if isinstance(value, exp.Extract) and value.name.upper() in _DOUBLE_PARTS:
        return data_type("DOUBLE")
    if isinstance(value, (exp.Window, exp.IgnoreNulls, exp.RespectNulls)):
        return _kind(value.this, select, depth + 1)
    if isinstance(value, (exp.Floor, exp.Ceil, exp.Round, exp.DateTrunc, exp.TimestampTrunc)):
        return _rounded_kind(value, _kind(value.this, select, depth + 1))
    if isinstance(value, _PASSING):  # their argument's type where it is spelled
        argument = value.this.this if isinstance(value.this, exp.Order) else value.this
        if isinstance(argument, exp.Distinct) and len(argument.expressions) == 1:
            argument = argument.expressions[0]  # SUM(DISTINCT x ORDER BY ...), rewritten
        argument = _kind(argument, select, depth + 1)
        if argument is not None and argument.this in _SPELLED:
            return argument
    if isinstance(value, _INTERPOLATING):
        argument = _kind(value.this, select, depth + 1)
        numeric = argument is not None and argument.this in exp.DataType.NUMERIC_TYPES
        return data_type("DOUBLE") if numeric else argument
    if isinstance(value, exp.Nullif):  # its first argument, or NULL
        return _kind(value.this, select, depth + 1)
    if isinstance(value, (exp.Case, exp.If, exp.Coalesce, exp.Greatest, exp.Least)):
        branches = [_kind(v, select, depth + 1) for v in _results(value) if v is not None]
        for wanted in _SPELLED:
            if any(b is not None and b.this is wanted for b in branches):
                return exp.DataType.build(wanted)
    return None if _unknown(value.type) else value.type


def _rounded_kind(value: exp.Expr, argument: exp.DataType | None) -> exp.DataType | None:
    """DuckDB's type of FLOOR, CEIL, ROUND or DATE_TRUNC of a value of type ``argument``:
    that type for a DECIMAL, a DOUBLE or an INTERVAL (and ROUND's of an integer), a DOUBLE
    for FLOOR and CEIL of anything else."""
    if argument is not None and (
        argument.this in (*_SPELLED, _T.DECIMAL)
        or (isinstance(value, exp.Round) and argument.this in exp.DataType.INTEGER_TYPES)
    ):
        return argument
    if isinstance(value, (exp.Floor, exp.Ceil)):
        return data_type("DOUBLE")
    return None if _unknown(value.type) else value.type


def _arithmetic_kind(value: exp.Binary, select, depth: int) -> exp.DataType | None:
    left = _kind(value.this, select, depth + 1)
    right = _kind(value.expression, select, depth + 1)
    if isinstance(value.this, exp.Null) or isinstance(value.expression, exp.Null):
        return None if _unknown(value.type) else value.type  # NULL, written in any spelling
    kinds = {k.this for k in (left, right) if k is not None}
    temporal = kinds & _TEMPORAL
    if temporal:  # a time and an interval or a number: a time; two times: an interval
        times = kinds - _STRINGS  # a string literal is read as the other side's type
        if isinstance(value, exp.Sub) and times <= _TEMPORAL and times - _NOT_TIMESTAMPS:
            return data_type("INTERVAL")
        if isinstance(value, exp.Sub) and times == {_T.DATE}:
            return data_type("BIGINT")  # days between two dates
        if not _unknown(value.type) and value.type.this in _TEMPORAL:
            return value.type
        return exp.DataType.build(sorted(temporal, key=lambda t: t.value)[0])
    if exp.DataType.Type.INTERVAL in kinds:
        return data_type("INTERVAL")
    if kinds & set(_FLOATS) or isinstance(value, exp.Div):
        return data_type("DOUBLE")
    if _T.DECIMAL in kinds and (
        isinstance(value, (exp.IntDiv, exp.Mod))
        or not kinds <= _EXACT_WITH_DECIMALS
        or left is None
        or right is None
    ):  # DuckDB's // of a DECIMAL divides as a DOUBLE, and a DECIMAL with a string or a
        # HUGEINT, or a remainder past 38 digits, is computed as one
        return data_type("DOUBLE")
    if isinstance(value, exp.IntDiv) and not kinds <= exp.DataType.INTEGER_TYPES:
        return data_type("DOUBLE")
    return None if _unknown(value.type) else value.type


def _results(value: exp.Expr) -> list[exp.Expr]:
    """The expressions whose value a CASE, IF, COALESCE, GREATEST or LEAST returns."""
    if isinstance(value, exp.Case):
        return [i.args["true"] for i in value.args.get("ifs") or []] + [value.args.get("default")]
    if isinstance(value, exp.If):
        return [value.args.get("true"), value.args.get("false")]
    return [value.this, *value.expressions]


def _unknown(kind: exp.DataType | None) -> bool:
    return kind is None or kind.this is exp.DataType.Type.UNKNOWN


def _column_kind(value: exp.Column, select, depth: int) -> exp.DataType | None:
    source = _source(select, value.table) if select is not None else None
    if source is None:
        return None
    first = source
    while not isinstance(first, exp.Select):
        if not isinstance(first, (*_SET_OPERATIONS, exp.Subquery)):
            return None
        first = first.this
    for projection in first.expressions:
        if projection.alias_or_name == value.name:
            return _kind(projection.unalias(), first, depth + 1)
    for projection in first.expressions:  # the rewrite's frames pass columns on by ``__s.*``
        if isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star):
            star = exp.column(value.name, projection.table)
            return _column_kind(star, first, depth + 1)
    return None


def _source(select: exp.Select, name: str) -> exp.Expr | None:
    """The query that ``name`` (a table's alias in ``select``) reads: a derived table or CTE."""
    sources = [select.args["from_"].this] if select.args.get("from_") else []
    sources += [join.this for join in select.args.get("joins") or []]
    for source in sources:
        if source.alias_or_name != name:
            continue
        if isinstance(source, exp.Subquery):
            return source.this
        if isinstance(source, exp.Table) and not source.db:
            return _cte(select, source.name)
    return None


def _cte(node: exp.Expr, name: str) -> exp.Expr | None:
    while node is not None:
        with_ = node.args.get("with_") if isinstance(node, exp.Query) else None
        for cte in with_.expressions if with_ is not None else []:
            if cte.alias == name:
                return cte.this
        node = node.parent
    return None

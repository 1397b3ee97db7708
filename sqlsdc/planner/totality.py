"""Totality: which expressions can never raise an error, whatever confidential values they see.

An error raised for some rows and not others answers a yes/no question about the data (e.g.
``CASE WHEN income > 40000 THEN CAST('x' AS INT) END`` fails exactly when someone earns more),
and DuckDB evaluates branches and casts lazily, per row. So every operation evaluated on
confidential rows must be total for its argument types, judged with DuckDB's typing rules
(a literal ``1.5`` is DECIMAL, ``1e3`` DOUBLE, ``15`` INTEGER; string literals are cast per row).
Constant sub-expressions are checked separately, by evaluating them once before the query.

This module judges the *value* arguments of a call; the arguments that must be literals (date
parts, formats, divisors, positions...) and the list of allowed functions are declared in
:mod:`sqlsdc.planner.signatures`. Anything not known here is refused (fail closed).
"""

from __future__ import annotations

import datetime as dt
import re

from sqlglot import exp

from sqlsdc.planner.allowlist import describe
from sqlsdc.planner.exact_mixing import DERIVED, mixing
from sqlsdc.planner.temporal_parts import TIMES, extract_problem, strftime_problem
from sqlsdc.written import written_name

DIALECT = "duckdb"
T = exp.DataType.Type
NUMERIC = {"integer", "decimal", "float"}
NARROW_INTEGERS = {T.TINYINT, T.SMALLINT, T.INT, T.BIGINT, T.UTINYINT, T.USMALLINT, T.UINT}

TOTALITY_HINT = (
    "on confidential values use operations that cannot fail: compare values of the same type, "
    "cast with TRY_CAST or to DOUBLE/VARCHAR, and compute on DOUBLE (e.g. CAST(age AS DOUBLE) * 2)"
)

_ALWAYS_TOTAL = (
    exp.Column,
    exp.Literal,
    exp.Null,
    exp.Boolean,
    exp.Paren,
    exp.Alias,
    exp.Exists,  # a boolean: its query is a scope of its own, checked there
    exp.Tuple,
    exp.Star,
    exp.Identifier,
    exp.DataType,
    exp.Var,
    exp.Distinct,
    exp.Count,
    exp.Avg,
    exp.DPipe,
    exp.Concat,
    exp.Grouping,
    exp.Group,
    exp.Rollup,
    exp.Cube,
    exp.GroupingSets,
    exp.Ordered,
    exp.Order,
    exp.WindowSpec,
    exp.DataTypeParam,
)
_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ)
_TEMPORAL = (
    exp.Extract,
    exp.Year,
    exp.Month,
    exp.Quarter,
    exp.DateTrunc,
    exp.TimestampTrunc,
    exp.TimeToStr,
)
_FLOAT_MATH = (
    exp.Abs,
    exp.Round,
    exp.Floor,
    exp.Ceil,
    exp.Sqrt,
    exp.Ln,
    exp.Log,
    exp.Exp,
    exp.Pow,
    exp.Sign,
)


def _unwrap(node: exp.Expr) -> exp.Expr:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def family(node: exp.Expr | None) -> str | None:
    """integer, decimal, float, text, temporal, boolean, null, or None when unknown."""
    if node is None:
        return None
    # the two commonest operands first (a long chain asks for thousands), as the tests below
    # decide them: a column by its derived family or its type, a literal by its spelling
    kind = type(node)
    if kind is exp.Column:
        meta = node.meta
        return meta[DERIVED][0] if DERIVED in meta else _type_family(node.type)
    if kind is exp.Literal:
        return _literal_family(node)
    node = _unwrap(node)
    if isinstance(node, exp.Null):
        return "null"
    if isinstance(node, exp.Literal):
        return _literal_family(node)
    if isinstance(node, exp.Neg):
        return family(node.this)
    if isinstance(node, exp.Subquery):
        projection = scalar_projection(node)
        return family(projection) if projection is not None else None
    if isinstance(node, exp.Column) and DERIVED in node.meta:
        return node.meta[DERIVED][0]
    if isinstance(node, _CHOICE_NODES):
        return _choice_family(node)
    if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Div)):
        families = {family(node.left), family(node.right)} - {"null"}
        if not families or not families <= NUMERIC:
            return None
        if isinstance(node, exp.Div) or "float" in families:
            return "float"
        return "decimal" if "decimal" in families else "integer"
    dtype = node.to if isinstance(node, (exp.Cast, exp.TryCast)) else node.type
    return _type_family(dtype)


def _literal_family(node: exp.Literal) -> str:
    if node.is_string:
        return "text"
    text = str(node.this).lower()
    return "float" if "e" in text else "decimal" if "." in text else "integer"


_CHOICE_NODES = (exp.Case, exp.If, exp.Coalesce, exp.Greatest, exp.Least, exp.Nullif)


def _choice_family(node: exp.Expr) -> str | None:
    """The family of a choice among values, from the values (sqlglot types a CASE of DECIMAL
    literals DOUBLE): one family, or among numbers the widest; None for a mix."""
    if isinstance(node, exp.Case):
        values = [i.args.get("true") for i in node.args.get("ifs", [])]
        values.append(node.args.get("default"))
    elif isinstance(node, exp.If):
        values = [node.args.get("true"), node.args.get("false")]
    elif isinstance(node, exp.Nullif):
        values = [node.this]
    else:
        values = [node.this, *node.expressions]
    families = {family(v) for v in values if v is not None} - {"null"}
    if not families:
        return "null"
    if families <= NUMERIC:
        return "float" if "float" in families else "decimal" if "decimal" in families else "integer"
    return families.pop() if len(families) == 1 else None


def scalar_projection(node: exp.Subquery) -> exp.Expr | None:
    """The one value a scalar subquery selects (its type is that value's, as the engine
    types it), or None for a set operation or several values."""
    select = node.this
    if not isinstance(select, exp.Select) or len(select.expressions) != 1:
        return None
    return select.expressions[0].unalias()


def _type_family(dtype: exp.DataType | None) -> str | None:
    if dtype is None:
        return None
    return _FAMILIES.get(dtype.this)


def _families() -> dict:
    """The family of each built-in type (``DataType.is_type`` compares built-in types by their
    ``this``; a lookup spares building the candidate types on every call)."""
    families: dict = {}
    for types, name in (
        ({T.UNKNOWN}, None),
        ({T.NULL}, "null"),
        ({T.DOUBLE, T.FLOAT}, "float"),
        (exp.DataType.REAL_TYPES, "decimal"),
        (exp.DataType.INTEGER_TYPES, "integer"),
        (exp.DataType.TEXT_TYPES, "text"),
        (exp.DataType.TEMPORAL_TYPES, "temporal"),
        ({T.BOOLEAN}, "boolean"),
        # a user's own codes and keys: DuckDB compares an ENUM with text as the text of its
        # label (no error, 'xx' matches no row), and a UUID with a UUID
        ({T.ENUM, T.ENUM8, T.ENUM16}, "text"),
        ({T.UUID}, "uuid"),
    ):
        for dtype in types:
            families.setdefault(dtype, name)  # the first match wins, as in a chain of tests
    families.pop(T.USERDEFINED, None)
    families.pop(T.BIT, None)  # a bit string: its casts to numbers fail for long strings
    return families


_FAMILIES = _families()


_INTEGER_RANGES = {
    T.TINYINT: (-(2**7), 2**7 - 1),
    T.SMALLINT: (-(2**15), 2**15 - 1),
    T.INT: (-(2**31), 2**31 - 1),
    T.BIGINT: (-(2**63), 2**63 - 1),
    T.INT128: (-(2**127), 2**127 - 1),
    T.UTINYINT: (0, 2**8 - 1),
    T.USMALLINT: (0, 2**16 - 1),
    T.UINT: (0, 2**32 - 1),
    T.UBIGINT: (0, 2**64 - 1),
    T.UINT128: (0, 2**128 - 1),
}
_ANY_INTEGER = (0, 2**7 - 1)  # holds in every integer type: for values of no known exact type
_DATE_TEXT = re.compile(r"\d{4}-\d{2}-\d{2}([ T]\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?)?")
_TIME_TEXT = re.compile(r"\d{2}:\d{2}(:\d{2}(\.\d{1,6})?)?")
_NANOSECOND_YEARS = (1678, 2261)  # TIMESTAMP_NS holds 1677-09-21 to 2262-04-11


STORED = "sqlsdc_stored"  # meta of a column read from a table (total_checks marks it)
NUMERIC_FAMILIES = frozenset({"integer", "decimal", "float"})


def _exact_type(node: exp.Expr) -> exp.DataType | None:
    """The type DuckDB gives ``node`` for sure: a stored column's type or a cast's target
    (sqlglot's inferred type of other expressions, and of a derived table's column, may be
    wider than DuckDB's: ``tinyint_col // 2`` is a TINYINT)."""
    node = _unwrap(node)
    if isinstance(node, (exp.Cast, exp.TryCast)):
        return node.to
    if isinstance(node, (exp.Year, exp.Month, exp.Quarter, exp.Length)):
        return exp.DataType.build("BIGINT")
    stored = isinstance(node, exp.Column) and node.meta.get(STORED)
    return node.type if stored else None


def _literal_converts(literal: exp.Literal, other: exp.Expr) -> bool:
    """Whether a string literal compared with ``other`` converts without error to its type.

    DuckDB casts the literal to the exact type of the other operand, row by row (it is not
    folded when the cast fails), so the text must fit that type: an integer within its range
    (``int_col = '99999999999'`` fails), a DECIMAL within its digits, a date or timestamp in
    the one spelling DuckDB reads in its type's range (Python's ``fromisoformat`` reads
    ``20200101`` and ``2020-W01-1`` too)."""
    text = str(literal.this)
    target, dtype = family(other), _exact_type(other)
    kind = dtype.this if dtype is not None else None
    if target == "integer":
        low, high = _INTEGER_RANGES.get(kind, _ANY_INTEGER)
        return re.fullmatch(r"[+-]?\d{1,40}", text) is not None and low <= int(text) <= high
    if target == "decimal":
        return kind is T.DECIMAL and _fits_decimal(text, dtype)
    if target == "float":
        # possessive: \d+\.?\d* split 40,000 digits before a letter in every way, in time
        # quadratic in the literal, holding the GIL (8.7 s at 20,000 digits; a statement of
        # the 1,000,000 characters allowed froze a whole server for hours; red team s35b)
        return re.fullmatch(r"[+-]?(?:\d++\.?\d*+|\.\d++)(?:[eE][+-]?\d++)?", text) is not None
    if target == "boolean":
        return text.lower() in {"true", "false", "t", "f", "1", "0"}
    if target == "temporal":
        return _temporal_text(text, {kind})
    if target == "uuid":
        return _UUID_TEXT.fullmatch(text) is not None
    return False


_UUID_TEXT = re.compile(
    r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"
)
"""The canonical spelling of a UUID, which DuckDB casts to one without error."""


def _fits_decimal(text: str, dtype: exp.DataType) -> bool:
    """Whether ``text`` is a plain decimal number that a DECIMAL ``dtype`` holds unrounded."""
    found = re.fullmatch(r"[+-]?(\d*)(?:\.(\d*))?", text)
    params = [p.this for p in dtype.expressions if isinstance(p, exp.DataTypeParam)]
    values = [int(p.this) for p in params if isinstance(p, exp.Literal)]
    precision, scale = {0: (18, 3), 1: (*values, 0)}.get(len(values), values[:2])
    if found is None or not (found.group(1) or found.group(2)):
        return False
    whole, fraction = found.group(1).lstrip("0"), found.group(2) or ""
    return len(whole) <= precision - scale and len(fraction) <= scale


def _temporal_text(text: str, kinds: set) -> bool:
    """Whether ``text`` converts to every temporal type of ``kinds`` (None: a type not known,
    so any): a time of day for TIME, else ``YYYY-MM-DD[ HH:MM[:SS[.ffffff]]]`` of years 1-9999
    (1678-2261 where a TIMESTAMP_NS may be the target)."""
    if kinds & {T.TIMETZ}:
        return False
    if kinds and kinds <= {T.TIME, T.TIME_NS}:
        if _TIME_TEXT.fullmatch(text) is None:
            return False
        try:
            dt.time.fromisoformat(text)
        except ValueError:
            return False
        return True
    if _DATE_TEXT.fullmatch(text) is None:
        return False
    try:
        value = dt.datetime.fromisoformat(text)
    except ValueError:
        return False
    if kinds & {T.TIMESTAMP_NS, None}:
        return _NANOSECOND_YEARS[0] <= value.year <= _NANOSECOND_YEARS[1]
    return True


def _comparable(a: exp.Expr, b: exp.Expr, fa: str | None, fb: str | None) -> bool:
    """Comparing ``a`` and ``b``, whose type families are ``fa`` and ``fb``, casts nothing that
    could fail."""
    if "null" in (fa, fb):
        return True
    if fa is None or fb is None:
        return False
    if fa == fb == "temporal":
        kinds = {_temporal_type(a), _temporal_type(b)}
        return len(kinds) == 1 or (_in_range(a, kinds) and _in_range(b, kinds))
    if fa == fb or (fa in NUMERIC and fb in NUMERIC):
        return True
    for text, other in ((a, b), (b, a)):
        text = _unwrap(text)
        if isinstance(text, exp.Literal) and text.is_string and _literal_converts(text, other):
            return True
    return False


def _same_family(values: list[exp.Expr]) -> str | None:
    values = [v for v in values if v is not None]
    families = {family(v) for v in values} - {"null"}
    if None in families:
        return "a value of unknown type"
    kinds = {_temporal_type(v) for v in values if family(v) != "null"}
    if families == {"temporal"} and len(kinds) > 1:
        if not all(_in_range(v, kinds) for v in values):
            return "mixing date and time types casts values"
    if len(families) <= 1 or families <= NUMERIC:
        return mixing(values, family)
    return "mixing types casts values"


def _comparison_problem(values: list[exp.Expr]) -> str | None:
    """Why comparing the first value with the others can raise, or None."""
    families = [family(v) for v in values]  # each asked once, for both tests
    first, first_family = values[0], families[0]
    for value, value_family in zip(values[1:], families[1:], strict=True):
        if not _comparable(first, value, first_family, value_family):
            return _enum_hint(values) or "comparing different types casts values"
    return mixing(values, family, families)


def _enum_hint(values: list[exp.Expr]) -> str | None:
    """Why a comparison of an ENUM column is refused, with the cast to write: the analyst's
    schema shows an ENUM as VARCHAR (its labels are values of the data), while the engine
    compares it as the ENUM, casting the other side to it."""
    for value in values:
        value = _unwrap(value)
        if (
            isinstance(value, exp.Column)
            and value.type
            and value.type.this == exp.DataType.Type.ENUM
        ):
            name = exp.column(value.name).sql("duckdb")
            return f"{name} is stored as an ENUM and compared as one: write CAST({name} AS VARCHAR)"
    return None


def _temporal_type(node: exp.Expr) -> exp.DataType.Type | None:
    """The exact type of a date or time value (None for NULL): values of two temporal types
    are compared or mixed by casting one to the other, which fails outside the target's range
    (a DATE beyond year 294246 is no TIMESTAMP, a TIMESTAMP beyond 2262 no TIMESTAMP_NS)."""
    node = _unwrap(node)
    if isinstance(node, exp.Null):
        return None
    dtype = node.to if isinstance(node, (exp.Cast, exp.TryCast)) else node.type
    return dtype.this if dtype is not None else None


def _in_range(node: exp.Expr, kinds: set) -> bool:
    """Whether every value ``node`` can take is NULL or a date/time literal that converts to
    every temporal type of ``kinds`` (:func:`_temporal_text`: years 1-9999, 1678-2261 when one
    is a TIMESTAMP_NS or not known), through CASE, IF, COALESCE, GREATEST, LEAST and
    DATE_TRUNC: casting them cannot fail, whichever rows choose among them."""
    node = _unwrap(node)
    if isinstance(node, exp.Null):
        return True
    if isinstance(node, (exp.Cast, exp.TryCast)):
        literal = _unwrap(node.this)
        return (
            isinstance(literal, exp.Literal)
            and literal.is_string
            and _temporal_text(str(literal.this), kinds | {_temporal_type(node)})
        )
    if isinstance(node, exp.Case):
        values = [i.args.get("true") for i in node.args.get("ifs", [])]
        values = [*values, node.args.get("default")]
        return all(_in_range(v, kinds) for v in values if v is not None)
    if isinstance(node, exp.If):
        values = [node.args.get("true"), node.args.get("false")]
        return all(_in_range(v, kinds) for v in values if v is not None)
    if isinstance(node, (exp.Coalesce, exp.Greatest, exp.Least)):
        return all(_in_range(v, kinds) for v in [node.this, *node.expressions])
    if isinstance(node, (exp.DateTrunc, exp.TimestampTrunc)):
        return _in_range(node.this, kinds)
    return False


def _temporal_partiality(n: exp.Expr, target: exp.Expr) -> str | None:
    """Why a date/time function can raise on some values of its argument's type (DuckDB 2.0):
    DATE_TRUNC of a DATE is a TIMESTAMP, out of range for dates beyond year 294246 (or before
    -290308), whatever the part; EXTRACT and STRFTIME allow the parts and formats of
    :mod:`sqlsdc.planner.temporal_parts` (STRFTIME of TIMESTAMP_S/_MS values none)."""
    kind = _temporal_type(target)
    if kind in TIMES and not isinstance(n, exp.Extract):
        return "a time of day has no date: only EXTRACT of its hour, minute or second"
    if isinstance(n, (exp.DateTrunc, exp.TimestampTrunc)) and kind is T.DATE:
        if _in_range(target, {T.DATE, T.TIMESTAMP}):
            return None
        return (
            "DATE_TRUNC of a DATE is a TIMESTAMP, and dates outside its range raise; "
            "use year(d), month(d), quarter(d) or strftime(d, '%Y-%m')"
        )
    if isinstance(n, exp.Extract):
        return extract_problem(n, kind)
    if isinstance(n, exp.TimeToStr):
        return strftime_problem(n, kind)
    return None


def _cast_is_total(source: exp.Expr, target: exp.DataType) -> bool:
    origin = family(source)
    if origin == "null" or target.is_type(*exp.DataType.TEXT_TYPES):
        return True
    if target.is_type(T.DOUBLE):
        return origin in NUMERIC | {"boolean"}
    if target.is_type(T.FLOAT):
        return origin in {"integer", "decimal", "boolean"}
    if target.is_type(T.BIGINT, T.INT128):
        dtype = _unwrap(source).type
        return origin == "boolean" or (
            origin == "integer" and dtype is not None and dtype.this in NARROW_INTEGERS
        )
    return False


def _type_name(node: exp.Expr) -> str:
    dtype = _unwrap(node).type
    return dtype.sql(DIALECT) if dtype is not None else "unknown"


def wide_exact(node: exp.Expr | None) -> bool:
    """Whether ``node``'s values are exact numbers too wide for DuckDB to sum without overflow.

    DuckDB sums and averages exact numbers in a 128-bit accumulator and raises on overflow
    ("Overflow in HUGEINT addition"): a 64-bit value needs 2^63 rows to get there, a HUGEINT
    or a DECIMAL stored in 128 bits (precision over 18) a few rows of large values, so whether
    the query fails would tell those values."""
    node = _unwrap(node) if node is not None else None
    if node is None:
        return False
    dtype = node.to if isinstance(node, (exp.Cast, exp.TryCast)) else node.type
    if dtype is None:
        return False
    if dtype.this in (T.INT128, T.UINT128, T.BIGNUM):
        return True
    if dtype.this is T.DECIMAL:
        precision = dtype.expressions[0].this if dtype.expressions else None  # DataTypeParam
        return isinstance(precision, exp.Literal) and int(precision.this) > 18
    return False


_TOTAL_CLASSES: dict[type, bool] = {}  # whether the tests below end at ``_ALWAYS_TOTAL``


def partiality(n: exp.Expr) -> str | None:
    """Why ``n`` can raise an error on some input of its argument types, or None if it cannot."""
    total = _TOTAL_CLASSES.get(n.__class__)
    if total is None:  # decided once per class: a long condition asks for thousands of nodes
        total = _TOTAL_CLASSES[n.__class__] = isinstance(n, _ALWAYS_TOTAL) and not isinstance(
            n, (exp.Case, exp.If, exp.Sum)
        )
    if total:
        return None
    if isinstance(n, (exp.And, exp.Or)):
        return condition_problem(n.left) or condition_problem(n.right)
    if isinstance(n, exp.Not):
        return condition_problem(n.this)
    if isinstance(n, exp.Is):  # IS TRUE / IS FALSE read their operand as a condition
        truth = isinstance(_unwrap(n.expression), exp.Boolean)
        return condition_problem(n.this) if truth else None
    if isinstance(n, exp.Case):
        values = [i.args.get("true") for i in n.args.get("ifs", [])] + [n.args.get("default")]
        operand = n.this  # CASE x WHEN v THEN ...: x = v, cast row by row like any comparison
        if operand is not None:
            compared = _comparison_problem([operand, *(i.this for i in n.args.get("ifs", []))])
            if compared:  # ``CASE occupation WHEN 1`` would fail only where a row reaches it
                return compared
        return _same_family(values)
    if isinstance(n, exp.If):  # a CASE's WHEN: its condition, or a value its operand is
        # compared with; or IF(condition, a, b)
        problem = None if simple_case_branch(n) else condition_problem(n.this)
        return problem or _same_family([n.args.get("true"), n.args.get("false")])
    if isinstance(n, exp.Sum):
        plain_column = isinstance(_unwrap(n.this), exp.Column)
        ok = family(n.this) in ("integer", "float", "null") or plain_column
        return None if ok else "a sum of DECIMAL expressions can overflow; cast to DOUBLE first"
    if isinstance(n, _ALWAYS_TOTAL):
        return None
    if isinstance(n, exp.Div):  # DOUBLE division: infinities and NaN, never an error
        operands = {family(n.left), family(n.right)} - {"null"}
        return None if operands <= NUMERIC else "dividing a value that is not a number casts it"
    if isinstance(n, (exp.Add, exp.Sub, exp.Mul)):
        return None if family(n) == "float" else "exact arithmetic can overflow"
    if isinstance(n, exp.Neg):
        return None if family(n.this) == "float" else "negation of an exact number can overflow"
    if isinstance(n, (exp.IntDiv, exp.Mod)):
        # the divisor is a positive literal (its role in sqlsdc.planner.signatures)
        return None if family(n.this) in NUMERIC else "the dividend is not a number"
    if isinstance(n, _COMPARISONS):
        return _comparison_problem([n.left, n.right])
    if isinstance(n, exp.In):
        if n.args.get("unnest") or n.args.get("field"):
            return "IN UNNEST/field is not supported"
        query = n.args.get("query")
        if query is not None:
            query = query.this if isinstance(query, exp.Subquery) else query
            if not isinstance(query, exp.Select) or len(query.expressions) != 1:
                return "IN with a subquery of another type casts values"
            return _comparison_problem([n.this, query.expressions[0]])
        return _comparison_problem([n.this, *n.expressions])
    if isinstance(n, exp.Between):
        return _comparison_problem([n.this, n.args["low"], n.args["high"]])
    if isinstance(n, (exp.Like, exp.ILike)):
        ok = family(n.this) in ("text", "null") and family(n.expression) in ("text", "null")
        return None if ok else "LIKE on a non-text value casts it"
    if isinstance(n, (exp.Coalesce, exp.Greatest, exp.Least)):
        return _same_family([n.this, *n.expressions])
    if isinstance(n, exp.Nullif):
        return _comparison_problem([n.this, n.expression])
    if isinstance(n, exp.TryCast):
        if family(n.this) is not None or n.to.is_type(*exp.DataType.TEXT_TYPES):
            return None
        return (
            f"TRY_CAST of a value of type {_type_name(n.this)} to {n.to.sql(DIALECT)} can fail "
            "in the engine; cast it to VARCHAR"
        )
    if isinstance(n, exp.Cast):
        if _cast_is_total(n.this, n.to):
            return None
        return f"casting {family(n.this) or 'this value'} to {n.to.sql(DIALECT)} can fail"
    if isinstance(n, _FLOAT_MATH):
        arguments = [a for a in n.iter_expressions()]
        if family(n.this) == "float" and all(family(a) in NUMERIC | {"null"} for a in arguments):
            return None
        name = written_name(n) or n.sql_name().lower()
        return f"{name}() on exact numbers can overflow; cast to DOUBLE first"
    if isinstance(n, (exp.Lower, exp.Upper, exp.Length, exp.Trim, exp.StartsWith)):
        return None if family(n.this) in ("text", "null") else "the argument is not text"
    if isinstance(n, exp.Substring):
        return None if family(n.this) in ("text", "null") else "the argument is not text"
    if isinstance(n, _TEMPORAL):
        target = n.expression if isinstance(n, exp.Extract) else n.this
        if family(target) != "temporal":
            return "the argument is not a date or timestamp"
        return _temporal_partiality(n, target)
    return f"{describe(n)} is not known to be error-free"


def simple_case_branch(node: exp.Expr) -> bool:
    """Whether ``node`` is a WHEN branch of a simple CASE (``CASE x WHEN 'a' THEN 1 END``),
    whose value is compared with the operand (checked as ``x = 'a'``), never read as a
    condition. Only a branch in the CASE's list of WHENs: sqlglot parses ``IF(c, a, b)`` as
    the same node, and one standing as the CASE's operand or ELSE (``CASE age WHEN 200 THEN
    1 ELSE IF(occupation, 1, 0) END``) reads its condition as a BOOLEAN, row by row (passed
    as a WHEN, it failed exactly where a row reached it; red team s42m)."""
    return (
        isinstance(node, exp.If)
        and node.arg_key == "ifs"
        and isinstance(node.parent, exp.Case)
        and node.parent.this is not None
    )


_CONDITION_FAMILIES = frozenset({"boolean", "null", "integer", "decimal", "float"})
# what is a truth value by its form, whatever type sqlglot gives it (comparisons, IN, BETWEEN,
# LIKE, IS, EXISTS, AND/OR, NOT, TRUE/FALSE, STARTS_WITH)
_PREDICATES = (exp.Predicate, exp.Connector, exp.Not, exp.Boolean, exp.StartsWith)


def condition_problem(node: exp.Expr | None) -> str | None:
    """Why ``node``, where it stands as a condition (WHERE, JOIN ON, HAVING, an operand of
    AND, OR or NOT, IS TRUE/FALSE, a CASE's WHEN), could raise: DuckDB casts it to BOOLEAN,
    row by row, and a text such as 'teacher' is no BOOLEAN, so ``WHERE (CASE WHEN <one
    person's cell> THEN occupation END) IS TRUE`` failed exactly when someone was in the
    cell (red team s42b). Numbers cast to BOOLEAN without error; a value of unknown type is
    refused unless it is a predicate by its form (fail closed): sqlglot gives an INTERVAL
    literal no type, and ``WHERE <one person's cell> AND INTERVAL 1 DAY`` passed as an
    untyped predicate, a constant whose cast to BOOLEAN failed exactly where a row reached
    it (red team s43a: a cell published as 3 shown to hold one person, and his occupation,
    education and income band, in 27 queries)."""
    if node is None:
        return None
    kind = family(node)
    if kind in _CONDITION_FAMILIES:
        return None
    if kind is None and isinstance(_unwrap(node), _PREDICATES):
        return None
    return (
        f"a value of type {kind or 'unknown'} used as a condition is cast to BOOLEAN, which "
        "fails for some values; compare it instead (e.g. occupation = 'teacher')"
    )


_INTERPOLATING = (exp.Median, exp.Quantile, exp.PercentileCont)
_MOMENTS = (
    exp.Avg,
    exp.Stddev,
    exp.StddevSamp,
    exp.StddevPop,
    exp.Variance,
    exp.VariancePop,
)


def aggregate_partiality(n: exp.Expr) -> str | None:
    """Why an aggregate of public values can raise an error on some values of its argument's
    type (DuckDB 2.0), or None. A quantile that interpolates (MEDIAN, QUANTILE_CONT) between two
    dates or intervals computes their difference, which fails for values far apart (``MEDIAN``
    of the first and last DATE: "can't be cast", of two huge INTERVALs "Could not convert
    Month to Microseconds"; red team s36b), and averages and moments are defined on numbers
    only: each takes a number here (the others choose a value, or count)."""
    if isinstance(n, _INTERPOLATING + _MOMENTS) and family(n.this) not in NUMERIC | {"null"}:
        return f"{describe(n)} of a value that is not a number can fail"
    return None


def set_operation_problem(values: list[exp.Expr]) -> str | None:
    """Why a column of a set operation whose branches select ``values`` can raise, or None.

    DuckDB casts each branch's value to the column's common type row by row, so the cast must
    be total whatever the rows: HUGEINT with DECIMAL(38, 0), UHUGEINT with BIGINT, TIMESTAMP
    with TIMESTAMP_NS, DATE with TIMESTAMP, or UUID with VARCHAR failed on the largest values
    (red team s36b). Text with numbers, dates or booleans is widened to VARCHAR when bound."""
    families = {family(v) for v in values} - {"null"}
    if "text" in families and families <= NUMERIC | {"text", "temporal", "boolean"}:
        return None
    return _same_family(values)

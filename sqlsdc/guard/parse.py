"""Parse step: SQL text to exactly one sqlglot SELECT or set operation, parameters bound.

Parameters are bound into the tree as literals before any check, so the checks see the real
values and nothing reaches the engine outside the checked tree.
"""

from __future__ import annotations

import datetime as dt
import decimal
import logging
import math
import re
from collections.abc import Mapping, Sequence

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from sqlsdc.engines.trees import nodes, of_kind
from sqlsdc.errors import PolicyViolation, ProgrammingError, SqlSyntaxError
from sqlsdc.guard.list_parameters import any_as_in, array_cast, is_any_operand, is_list, listed
from sqlsdc.guard.unbound import UNBOUND, unbound_null
from sqlsdc.planner.connectors import balance_connectors, depth
from sqlsdc.policy.model import DEFAULT_MAX_STATEMENT_CHARACTERS
from sqlsdc.written import remember_names

DIALECT = "duckdb"
SQLGLOT_META = exp.SQLGLOT_META  # a comment that sets marks on nodes (_check_marks)
MAX_DEPTH = 150  # tree levels after balancing AND/OR chains; real queries stay far below
MAX_SELECTS = 128  # SELECT blocks of one statement (CTEs, subqueries, set operations' branches)
logging.getLogger("sqlglot").setLevel(logging.ERROR)  # its fallback warnings are not for users
_LEADING_COMMENTS = re.compile(r"^(\s|--[^\n]*(\n|$)|/\*.*?\*/)*", re.S)
QUERY_TYPES = (exp.Select, exp.Union, exp.Intersect, exp.Except)


def parse_statement(
    sql: str,
    max_length: int = DEFAULT_MAX_STATEMENT_CHARACTERS,
    walked: list[exp.Expr] | None = None,
) -> exp.Expr:
    """Parse ``sql`` into one query tree or refuse it.

    The work of every later pass is bounded here: a statement longer than ``max_length``
    characters is refused before parsing, long AND/OR chains (which sqlglot parses as one
    nested node per operand) are rebuilt as balanced trees, and a tree still nested deeper
    than :data:`MAX_DEPTH` is refused as too complex, so no pass recurses without bound.
    ``walked``, when given, receives ``nodes()`` of the tree returned (from the walk that
    measures its depth).
    """
    if not isinstance(sql, str) or not sql.strip():
        raise PolicyViolation("empty statement", "send one SELECT query")
    if not sql.isascii():
        check_unicode(sql)
    if len(sql) > max_length:
        raise PolicyViolation(
            f"the statement is {len(sql):,} characters long; the limit is {max_length:,}",
            "shorten it (e.g. a range instead of a long IN list or OR chain), or ask an admin "
            "about the policy's `limits.max_statement_characters`",
        )
    try:
        text = number_placeholders(sql)  # tokenized: a TokenError is a syntax error too
        dialect = sqlglot.Dialect.get_or_raise(DIALECT)
        tokens = dialect.tokenize(text)  # kept: every comment, as _check_marks reads them
        statements = [s for s in dialect.parser().parse(tokens, text) if s]
    except RecursionError:
        raise too_complex(sql) from None
    except (ParseError, TokenError) as e:
        marker = _pyformat_marker(sql)
        if marker:
            raise SqlSyntaxError(
                f"the statement could not be parsed: {marker} is a parameter marker of other "
                "drivers (psycopg's pyformat), not of sqlsdc",
                "write ? for each parameter, bound in the order of the text (paramstyle "
                "qmark), or $1, $2 ... or $name: e.g. WHERE region = ?",
                sql,
            ) from None
        raise SqlSyntaxError(
            f"the statement could not be parsed: {_first_error(e)}",
            "write one SELECT query in DuckDB's SQL dialect",
            sql,
        ) from None
    if len(statements) != 1:
        raise PolicyViolation(
            f"{len(statements)} statements were sent; exactly one is allowed",
            "send one SELECT query per call",
            sql,
        )
    tree = _unparenthesized(statements[0], sql)
    if not isinstance(tree, QUERY_TYPES):
        words = _LEADING_COMMENTS.sub("", sql).split(None, 1) or [tree.key]
        kind = words[0].upper().rstrip(";")
        raise PolicyViolation(
            f"{kind} statements are not allowed",
            "only SELECT queries (and UNION/INTERSECT/EXCEPT of them) can be run",
            sql,
        )
    parsed = nodes(tree)  # one walk for the clause check and the chains to balance
    if SQLGLOT_META in text:
        _check_marks(tokens, sql)
    remember_names(parsed, text)  # refusals name functions as the statement wrote them
    _check_clauses(parsed, sql)
    _check_selects(parsed, sql)
    return _check_depth(balance_connectors(tree, parsed), sql, walked)


def _check_marks(tokens: list, sql: str) -> None:
    """Refuse a comment holding ``sqlglot.meta``: sqlglot reads ``x /* sqlglot.meta k=v */``
    as the mark ``k`` on the node before it, and the checks read their own marks there (a
    parameter not sent yet, a column read from a table, a constant the engine typed, the
    units a COUNT counts). Written by an analyst, ``NULL /* sqlglot.meta sqlsdc_unbound */``
    passed the class-break check and ``COUNT(*) /* sqlglot.meta sqlsdc_counted_units=a */``
    failed as a bug in sqlsdc (red team s50m). Every comment of the text's ``tokens`` is read,
    not only those left on the tree: the parser sets the marks before it drops some comments
    (``COUNT(*) FILTER (WHERE c) /* sqlglot.meta k */ FROM t`` marked the SELECT with ``k``
    and left the comment on no node: red team s50n)."""
    if any(SQLGLOT_META in comment for token in tokens for comment in token.comments):
        raise PolicyViolation(
            f"a comment holding {SQLGLOT_META!r} is not allowed (sqlglot reads it as marks "
            "on the query that its checks read)",
            "remove the comment",
            sql,
        )


def _unparenthesized(tree: exp.Expr, sql: str) -> exp.Expr:
    """The query of a statement written in parentheses, ``(SELECT ...)``, which means that
    query; with a clause outside them (``(SELECT ...) LIMIT 0``, a BI tool's probe) refused
    with the form to write instead (it was refused as "(SELECT statements are not allowed")."""
    while isinstance(tree, exp.Subquery) and isinstance(tree.this, (*QUERY_TYPES, exp.Subquery)):
        outside = sorted(k for k, v in tree.args.items() if k != "this" and v)
        if outside:
            clauses = ", ".join("ORDER BY" if k == "order" else k.upper() for k in outside)
            raise PolicyViolation(
                f"a query in parentheses with {clauses} outside them is not supported",
                "name it as a derived table and write the clause after it: SELECT * FROM "
                "(<query>) AS t LIMIT 0",
                sql,
            )
        tree = tree.this
    return tree


def _check_selects(parsed: list[exp.Expr], sql: str) -> None:
    """Refuse a statement of more than :data:`MAX_SELECTS` SELECT blocks. Each is a scope that
    name resolution (sqlglot's, which gives every CTE the ones before it) and the analysis
    weigh against the others, so their cost grows faster than the text: a 100 KB statement of
    a thousand CTEs took 16-22 s of CPU to check (red team s37); a UNION of that many
    branches is already nested deeper than :data:`MAX_DEPTH`."""
    selects = sum(1 for node in parsed if isinstance(node, exp.Select))
    if selects > MAX_SELECTS:
        raise SqlSyntaxError(
            f"the statement is too complex: it has {selects} SELECT blocks (CTEs, subqueries, "
            f"branches of UNION and the like); at most {MAX_SELECTS} are checked",
            "split the query into simpler ones",
            sql,
        )


def check_unicode(sql: str) -> None:
    """Refuse text that is not Unicode: lone surrogates (undecodable bytes that Python kept
    with ``surrogateescape``) would reach the engine, which fails on them."""
    try:
        sql.encode("utf-8")
    except UnicodeEncodeError as e:
        raise SqlSyntaxError(
            f"the statement is not UTF-8 text (character {e.start + 1} is an undecodable byte)",
            "save or send the query as UTF-8",
        ) from None


def number_placeholders(sql: str) -> str:
    """``sql`` with its ``?`` placeholders written ``$1``, ``$2``... in the order of the text.

    A ``?`` is the next parameter in the order it is written (PEP 249 ``qmark``, DuckDB);
    sqlglot's trees keep the clauses of a SELECT in another order (LIMIT and OFFSET before
    WHERE), so ``WHERE age > ? ... LIMIT ?`` bound by a walk of the tree gave the WHERE the
    LIMIT's value. Numbered, each is bound by its position in the text. ``?`` mixed with
    ``$n`` or ``$name`` parameters is refused, as DuckDB refuses it.
    """
    if "?" not in sql:
        return sql
    tokens = sqlglot.tokenize(sql, read=DIALECT)
    marks = [
        t
        for t in tokens
        if (t.token_type is TokenType.PLACEHOLDER and t.text == "?")
        or t.token_type is TokenType.QDCOLON  # ``?::INTEGER``, a cast of a placeholder
    ]
    if not marks:
        return sql
    if any(t.token_type is TokenType.PARAMETER for t in tokens):
        raise ProgrammingError("the query mixes ? placeholders with $n or $name parameters")
    parts, start = [], 0
    for number, mark in enumerate(marks, 1):
        cast = "::" if mark.token_type is TokenType.QDCOLON else ""
        parts += [sql[start : mark.start], f"${number}{cast}"]
        start = mark.end + 1
    return "".join([*parts, sql[start:]])


_INTEGER_RANGES = {  # the integer types a LIMIT literal may be cast to, and their ranges
    exp.DataType.Type.TINYINT: (-(2**7), 2**7 - 1),
    exp.DataType.Type.SMALLINT: (-(2**15), 2**15 - 1),
    exp.DataType.Type.INT: (-(2**31), 2**31 - 1),
    exp.DataType.Type.BIGINT: (-(2**63), 2**63 - 1),
    exp.DataType.Type.UTINYINT: (0, 2**8 - 1),
    exp.DataType.Type.USMALLINT: (0, 2**16 - 1),
    exp.DataType.Type.UINT: (0, 2**32 - 1),
    exp.DataType.Type.UBIGINT: (0, 2**64 - 1),
}
_DIGITS = re.compile(r"\d+")


def fold_limit_casts(walked: list[exp.Expr]) -> bool:
    """Replace ``LIMIT CAST(n AS INTEGER)`` (and OFFSET) by ``n`` where the cast cannot fail:
    ``n`` a whole-number literal within the integer type's range (changes the tree). True
    when something was replaced (``walked``, the tree's nodes, is then out of date).

    SQLAlchemy's PostgreSQL dialect writes ``.limit(3)`` as ``LIMIT %(param_1)s::INTEGER``,
    which the server binds to ``CAST(3 AS INT)``: a computed limit, refused in a statement
    over confidential rows (it could fail as the rows say), though this one is the constant
    3. A cast that could fail (``CAST(3.5 AS INT)``, ``CAST('x' AS INT)``, out of range) is
    left as it is, and refused as before. ``CAST(NULL AS INT)`` is ``NULL`` (no limit): a server
    client that describes a statement before binding it (pg8000, asyncpg) has it planned with
    NULL parameters, and SQLAlchemy's ``.limit(3)`` was refused there before any value was
    sent (red team s49e)."""
    folded = False
    for clause in of_kind(walked, (exp.Limit, exp.Offset)):
        value = clause.expression
        if not isinstance(value, exp.Cast) or value.to.this not in _INTEGER_RANGES:
            continue
        if isinstance(value.this, exp.Null):
            clause.set("expression", value.this)
            folded = True
            continue
        number = value.this.this if isinstance(value.this, exp.Neg) else value.this
        if not (isinstance(number, exp.Literal) and not number.is_string):
            continue
        text = number.this.strip()
        if not _DIGITS.fullmatch(text):
            continue
        signed = -int(text) if isinstance(value.this, exp.Neg) else int(text)
        low, high = _INTEGER_RANGES[value.to.this]
        if low <= signed <= high:
            clause.set("expression", value.this)
            folded = True
    return folded


def check_limits(
    tree: exp.Expr, sql: str | None = None, walked: list[exp.Expr] | None = None
) -> None:
    """Refuse a constant LIMIT or OFFSET that DuckDB cannot take (negative, not a number, or
    beyond BIGINT), parameters bound: the engine's error would reach the analyst only as a
    withheld engine failure. ``walked``: ``nodes(tree)``, when the caller has it."""
    found = walked if walked is not None else nodes(tree)
    for clause in of_kind(found, (exp.Limit, exp.Offset)):
        value = clause.expression
        negative = isinstance(value, exp.Neg)
        literal = value.this if negative else value
        if not isinstance(literal, exp.Literal):
            continue
        try:
            number = decimal.Decimal(literal.this.strip())
        except decimal.InvalidOperation:
            number = None
        if number is not None and negative:
            number = -number
        if number is None or not number.is_finite() or number < 0 or number >= 2**63:
            word = "LIMIT" if isinstance(clause, exp.Limit) else "OFFSET"
            raise SqlSyntaxError(
                f"{word} {value.sql(DIALECT)[:40]} is not valid: it takes a number of rows from "
                f"0 to {2**63 - 1}",
                f"e.g. {word} 10",
                sql,
            )


def too_complex(sql: str | None) -> PolicyViolation:
    """The refusal for a statement nested too deeply to check."""
    return SqlSyntaxError(
        "the statement is too complex: it is nested too deeply to be checked",
        "remove redundant parentheses or nesting, or split the query into simpler ones",
        sql,
    )


def _check_depth(tree: exp.Expr, sql: str, walked: list[exp.Expr] | None = None) -> exp.Expr:
    """Refuse a tree nested deeper than :data:`MAX_DEPTH` levels. ``walked``, when given,
    receives ``nodes(tree)``."""
    found: list[exp.Expr] = []
    if depth(tree, found) > MAX_DEPTH:
        raise too_complex(sql)
    if walked is not None:
        walked[:] = found
    return tree


def bind_parameters(
    tree: exp.Expr,
    params,
    sql: str | None = None,
    max_length: int = DEFAULT_MAX_STATEMENT_CHARACTERS,
) -> exp.Expr:
    """Copy of ``tree`` with ``?``, ``$n`` and ``$name`` placeholders replaced by literals,
    and ``x = ANY(?)`` of a list parameter by ``x IN (<its values>)``
    (:mod:`sqlsdc.guard.list_parameters`; with them written out, the statement must fit
    ``max_length`` characters).

    ``sql``, the text ``tree`` was parsed from, spares a statement without parameters the
    walk of its tree: placeholders are written with ``?`` or ``$``."""
    if params is not None and (
        isinstance(params, (str, bytes, bytearray)) or not isinstance(params, (Sequence, Mapping))
    ):  # a str is a sequence of characters: "18" would be two parameters
        raise ProgrammingError(
            f"parameters must be a list or tuple (or a dict for $name parameters), not "
            f"{type(params).__name__}; e.g. [value]"
        )
    given = not (params is None or (isinstance(params, (Sequence, Mapping)) and len(params) == 0))
    if not given and sql is not None and "?" not in sql and "$" not in sql:
        return tree
    placeholders = of_kind(nodes(tree), (exp.Placeholder, exp.Parameter))
    if not given:
        if placeholders:
            raise ProgrammingError(
                f"the query has {len(placeholders)} parameter(s) but none were given"
            )
        return tree
    tree = tree.copy()
    positional = not isinstance(params, Mapping)
    _check_count(placeholders, params, positional)
    counter = iter(range(len(placeholders)))

    def value_for(node: exp.Expr):
        name = node.name if isinstance(node, exp.Placeholder) else node.this.name
        if positional:
            index = int(name) - 1 if name.isdigit() else next(counter)
            if index >= len(params):
                raise ProgrammingError(f"the query needs more than {len(params)} parameters")
            return params[index]
        if name not in params:
            raise ProgrammingError(f"no value given for parameter ${name}")
        return params[name]

    bound: list[exp.Tuple] = []  # the list parameters of x = ANY(?)

    def replace(node: exp.Expr) -> exp.Expr:
        if isinstance(node, (exp.Placeholder, exp.Parameter)):
            value = value_for(node)
            if is_list(value) and is_any_operand(node):
                bound.append(listed(value, literal, sql, max_length, array_cast(node)))
                return bound[-1]
            return literal(value)
        return node

    tree = tree.transform(replace, copy=False)
    if bound:
        any_as_in(bound, sql, max_length)
    return tree


def _check_count(placeholders: list[exp.Expr], params, positional: bool) -> None:
    """Every given parameter is used: an extra one is a mistake, never silently ignored."""
    names = {p.name if isinstance(p, exp.Placeholder) else p.this.name for p in placeholders}
    if not positional:
        if extra := sorted(set(params) - names):
            raise ProgrammingError(f"parameters given but not in the query: {', '.join(extra)}")
        return
    numbered = [int(n) for n in names if n.isdigit()]
    if numbered and len(numbered) < len(names):
        # a named one took the next value in the order of the tree, which a ? or $n also took
        raise ProgrammingError(
            "the query mixes numbered parameters (? or $n) with named ones ($name or :name); "
            "number them all, or name them all and pass a dict"
        )
    needed = max(numbered) if numbered else len(placeholders)
    if len(params) != needed:
        raise ProgrammingError(f"the query has {needed} parameter(s) but {len(params)} were given")


def literal(value) -> exp.Expr:
    """A sqlglot literal for a Python parameter value."""
    if value is None:
        return exp.null()
    if value is UNBOUND:  # a statement described before its values are sent
        return unbound_null()
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    value = _built_in(value)
    if (special := _non_finite(value)) is not None:
        return exp.cast(exp.Literal.string(special), "DOUBLE")
    if isinstance(value, (int, float, decimal.Decimal)):
        try:
            return exp.Literal.number(value)
        except ValueError:  # more digits than Python writes out (sys.get_int_max_str_digits)
            raise ProgrammingError(
                "an int parameter has more digits than Python writes out; pass a smaller number"
            ) from None
    if isinstance(value, str):
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError as e:  # a lone surrogate: the engine fails on it
                raise ProgrammingError(
                    f"a str parameter is not UTF-8 text (character {e.start + 1} is an "
                    "undecodable byte); decode the value as UTF-8 before passing it"
                ) from None
        return exp.Literal.string(value)
    if isinstance(value, dt.datetime):  # an aware one keeps its instant (TIMESTAMP dropped it)
        zone = dt.datetime.utcoffset(value) is not None
        text = exp.Literal.string(dt.datetime.isoformat(value, sep=" "))
        return exp.cast(text, "TIMESTAMPTZ" if zone else "TIMESTAMP")
    if isinstance(value, dt.date):
        return exp.cast(exp.Literal.string(dt.date.isoformat(value)), "DATE")
    if isinstance(value, dt.time):  # sqlsdc.Time: PEP 249's constructor, refused until now
        zone = dt.time.utcoffset(value) is not None
        return exp.cast(exp.Literal.string(dt.time.isoformat(value)), "TIMETZ" if zone else "TIME")
    if isinstance(value, (bytes, bytearray, memoryview)):  # sqlsdc.Binary, as \xNN escapes
        text = "".join(f"\\x{byte:02X}" for byte in bytes(value))
        return exp.cast(exp.Literal.string(text), "BLOB")
    if isinstance(value, (list, tuple)):
        raise ProgrammingError(
            "a list parameter is bound only as the values of column = ANY(?), which is "
            "column IN (its values); pass one value per placeholder elsewhere"
        )
    raise ProgrammingError(
        f"parameters of type {type(value).__name__} are not supported; "
        "use str, int, float, bool, None, date, time, datetime or bytes"
    )


def _built_in(value):
    """``value`` as its built-in type when it is a subclass of int, float, Decimal or str:
    a number literal is written with ``str(value)``, so a subclass's own ``__str__`` (or
    ``is_finite``) wrote SQL text into the statement run that the check took for a constant
    (``age > ?`` with an int whose ``__str__`` is ``0 AND <a condition that fails for one
    person's income>`` was an error oracle). The base types' own conversions ignore
    overrides (numpy's float64 is a float subclass too)."""
    for base, exact in (
        (int, int.__int__),
        (float, float.__float__),
        (decimal.Decimal, decimal.Decimal),
        (str, str.__str__),
    ):
        if isinstance(value, base) and type(value) is not base:
            return exact(value)
    return value


def _non_finite(value) -> str | None:
    """``'nan'``, ``'inf'`` or ``'-inf'`` for a float or Decimal that is not finite, else None.

    Such a value cannot be a number literal: sqlglot prints it bare, and DuckDB reads a bare
    ``inf`` or ``nan`` as a column name (a column of that name, hidden ones too)."""
    if isinstance(value, decimal.Decimal) and not value.is_finite():
        return "nan" if value.is_nan() else ("-inf" if value.is_signed() else "inf")
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("-inf" if value < 0 else "inf")
    return None


def output_names(tree: exp.Expr) -> list[str]:
    """Result column names as DuckDB would give them, taken before qualification renames them."""
    select = tree
    while isinstance(select, (exp.Union, exp.Intersect, exp.Except)):
        select = select.this
    if isinstance(select, exp.Subquery):
        return output_names(select.this)
    names = []
    for projection in select.expressions:
        if isinstance(projection, exp.Alias):
            names.append(projection.alias)
        elif isinstance(projection, exp.Column) and not isinstance(projection.this, exp.Star):
            names.append(projection.name)
        elif isinstance(projection, exp.Count) and isinstance(projection.this, exp.Star):
            names.append("count_star()")
        else:
            names.append(projection.sql(DIALECT, normalize_functions="lower"))
    return names


_MISSING_PART = re.compile(r"Required keyword: '\w+' missing for <class '[\w.]*\.(\w+)'>")
_CLAUSES = {"Order": "ORDER BY", "Group": "GROUP BY", "Offset": "OFFSET", "Join": "JOIN"}


def _pyformat_marker(sql: str) -> str | None:
    """The first ``%s`` or ``%(name)s`` of ``sql`` outside literals, written without spaces:
    the parameters of psycopg and pandas' examples, which sqlglot reads as a modulo missing
    its operand ("MOD is incomplete", new user s38). Only asked once the parse failed, so a
    column named ``s`` after a ``%`` in a query that parses is left alone."""
    try:
        tokens = sqlglot.tokenize(sql, read=DIALECT)
    except TokenError:
        return None
    for i, token in enumerate(tokens):
        if token.token_type is not TokenType.MOD:
            continue
        after = tokens[i + 1 : i + 5]
        texts = [t.text for t in after]
        if after and texts[0] == "s" and after[0].start == token.end + 1:
            return "%s"
        if texts[:1] == ["("] and texts[2:4] == [")", "s"] and after[3].start == after[2].end + 1:
            return f"%({texts[1]})s"
    return None


def _first_error(error: Exception) -> str:
    errors = getattr(error, "errors", None)
    if errors:
        first = errors[0]
        description = str(first.get("description") or "syntax error").split(" but got <")[0]
        missing = _MISSING_PART.fullmatch(description)
        if missing:  # sqlglot's class name, in SQL's words
            name = missing.group(1)
            description = f"{_CLAUSES.get(name, name.upper())} is incomplete"
        return f"{description} (line {first.get('line')}, column {first.get('col')})"
    return str(error).splitlines()[0]


def _check_clauses(walked: list[exp.Expr], sql: str) -> None:
    """Refuse what sqlglot parses and DuckDB does not: ``GROUP BY`` with nothing after it; and
    ``DISTINCT ON``, which the guard never runs, before name resolution reads its tuple (it
    was refused as "Column 'region' could not be resolved"); and ``PIVOT``/``UNPIVOT``,
    never run either, before name resolution reads them: a PIVOT statement in a derived
    table failed as a bug in sqlsdc (sqlglot's scope asserts a derived table is a query) or
    was refused as "Column 'sex' could not be resolved" (red team s50j); and ``SUMMARIZE``
    and ``DESCRIBE`` in a derived table or CTE, refused as statements and failed there as the
    PIVOT did. ``walked``: every node of the parsed tree (``nodes(tree)``)."""
    for statement in of_kind(walked, (exp.Summarize, exp.Describe)):
        raise PolicyViolation(
            f"{statement.key.upper()} is not allowed",
            "only SELECT queries (and UNION/INTERSECT/EXCEPT of them) can be run",
            sql,
        )
    for pivot in of_kind(walked, exp.Pivot):
        kind = "UNPIVOT" if pivot.args.get("unpivot") else "PIVOT"
        raise PolicyViolation(
            f"{kind} is not allowed",
            "group by the column instead, e.g. SELECT region, sex, COUNT(*) FROM persons "
            "GROUP BY region, sex",
            sql,
        )
    for distinct in of_kind(walked, exp.Distinct):
        if distinct.args.get("on") is not None:
            raise PolicyViolation("DISTINCT ON is not allowed", "use GROUP BY", sql)
    for group in of_kind(walked, exp.Group):
        if not any(group.args.get(k) for k in ("expressions", "grouping_sets", "cube", "rollup",
                                                  "all")):  # fmt: skip
            raise SqlSyntaxError(
                "the statement could not be parsed: GROUP BY without any expression",
                "name the columns to group by, or leave GROUP BY out",
                sql,
            )

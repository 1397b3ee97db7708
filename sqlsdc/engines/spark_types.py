"""The DuckDB type class of every node of a tree that is to run on Spark.

Where DuckDB and Spark differ, some rewrites of :mod:`sqlsdc.engines.spark_semantics` depend on
the type of an argument (DuckDB averages integers over their exact sum, rounds DOUBLEs in binary),
and ``hash`` depends on the exact DuckDB type of each column it reads. :class:`Types` infers both
from the schemas of the views a tree reads, as DuckDB binds them: a class (INTEGER, DECIMAL,
DOUBLE, VARCHAR, BOOLEAN) for every node, and the DuckDB type of columns copied from DuckDB.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.scope import Scope, traverse_scope

from sqlsdc.engines.spark_portable import HASH_UDF, is_hash

DIALECT = "spark"

# DuckDB's type class of a value; enough to choose the rewrites above.
INT, DECIMAL, FLOAT, TEXT, BOOL, NULL, UNKNOWN = (
    "INTEGER", "DECIMAL", "DOUBLE", "VARCHAR", "BOOLEAN", "NULL", "unknown type"
)  # fmt: skip
NUMERIC = (INT, DECIMAL, FLOAT)


def type_class(dtype: str | exp.DataType) -> str:
    """DuckDB's class (INTEGER, DECIMAL, DOUBLE, VARCHAR, BOOLEAN) of a Spark or DuckDB type."""
    if isinstance(dtype, str):
        return _named_type_class(dtype)
    kind = dtype.this
    if kind in exp.DataType.INTEGER_TYPES:
        return INT
    if kind in exp.DataType.FLOAT_TYPES:
        return FLOAT
    if kind in exp.DataType.REAL_TYPES:
        return DECIMAL
    if kind in exp.DataType.TEXT_TYPES:
        return TEXT
    return {exp.DataType.Type.BOOLEAN: BOOL, exp.DataType.Type.NULL: NULL}.get(kind, UNKNOWN)


@functools.cache
def _named_type_class(name: str) -> str:
    if name.lower() == "void":  # Spark's type of an untyped NULL
        return NULL
    for dialect in (DIALECT, "duckdb"):
        try:
            return type_class(exp.DataType.build(name, dialect=dialect))
        except (sqlglot.errors.ParseError, ValueError):
            continue
    return UNKNOWN


def _unify(classes: Iterable[str]) -> str:
    """The class of a value that is one of several (CASE branches, operands), as DuckDB casts."""
    found = {c for c in classes if c != NULL}
    if len(found) <= 1:
        return found.pop() if found else NULL
    if found <= set(NUMERIC):
        return FLOAT if FLOAT in found else DECIMAL
    return UNKNOWN


class Types:
    """The DuckDB type class of every node of one tree, from the schemas of the views it reads;
    and, for the columns of views copied from DuckDB, their DuckDB type (:meth:`stored`)."""

    def __init__(self, tree: exp.Expr, schema: Mapping[str, Mapping[str, str]] | None,
                 duckdb_types: Mapping[str, Mapping[str, str]] | None = None):  # fmt: skip
        self.schema = {
            view.lower(): {column.lower(): type_class(t) for column, t in columns.items()}
            for view, columns in (schema or {}).items()
        }
        self.duckdb_types = {
            view.lower(): {column.lower(): t for column, t in columns.items()}
            for view, columns in (duckdb_types or {}).items()
        }
        self.spark_types = {  # the types as the schemas name them (Spark's, or DuckDB's)
            view.lower(): {column.lower(): str(t) for column, t in columns.items()}
            for view, columns in (schema or {}).items()
        }
        self.scope_of: dict[int, Scope] = {}
        for scope in traverse_scope(tree):  # innermost scopes first
            for node in scope.walk():
                if isinstance(node, exp.Column):
                    self.scope_of.setdefault(id(node), scope)
        self.memo: dict[int, str] = {}
        self.keep: list[exp.Expr] = []  # keeps classified nodes alive, so ids stay unique

    def of(self, node: exp.Expr) -> str:
        if id(node) not in self.memo:
            self.memo[id(node)] = UNKNOWN  # cycles (an alias naming itself) stay unknown
            self.keep.append(node)
            self.memo[id(node)] = self._infer(node)
        return self.memo[id(node)]

    def inherit(self, new: exp.Expr, old: exp.Expr) -> None:
        for node in (new, new.unnest()):
            self.keep.append(node)
            self.memo[id(node)] = self.of(old)

    def _infer(self, node: exp.Expr) -> str:
        if isinstance(node, exp.Literal):
            if node.is_string:
                return TEXT
            text = node.this.lower()
            return FLOAT if "e" in text else DECIMAL if "." in text else INT
        if isinstance(node, exp.Column):
            return self._column(node)
        if isinstance(node, exp.Cast):
            return type_class(node.to)
        if isinstance(node, (exp.Count, exp.RowNumber, exp.Rank, exp.DenseRank, exp.Grouping,
                             exp.Length, exp.IntDiv)):  # fmt: skip
            return INT
        if isinstance(node, (exp.Avg, exp.Div, exp.Sqrt)):
            return FLOAT
        if isinstance(node, (exp.Predicate, exp.Connector, exp.Not, exp.Boolean)):
            return BOOL
        if isinstance(node, exp.Null):
            return NULL
        if isinstance(node, (exp.Floor, exp.Ceil)):
            inner = self.of(node.this)
            return FLOAT if inner in (INT, FLOAT, NULL) else inner
        if isinstance(node, (exp.Add, exp.Sub, exp.Mul, exp.Mod)):
            return _unify([self.of(node.this), self.of(node.expression)])
        if isinstance(node, exp.Case):
            branches = [i.args["true"] for i in node.args["ifs"]] + [node.args.get("default")]
            return _unify(self.of(b) for b in branches if b is not None)
        if isinstance(node, exp.If):
            return _unify(self.of(b) for b in (node.args["true"], node.args.get("false")) if b)
        if isinstance(node, (exp.Coalesce, exp.Least, exp.Greatest)):
            return _unify(self.of(e) for e in [node.this, *node.expressions])
        if isinstance(node, exp.Distinct) and len(node.expressions) == 1:
            return self.of(node.expressions[0])
        if isinstance(node, (exp.Alias, exp.Paren, exp.Neg, exp.Abs, exp.Min, exp.Max, exp.Sum,
                             exp.Round, exp.Nullif, exp.Window, exp.Ordered, exp.Order,
                             exp.Bracket, exp.ArrayMax)):  # fmt: skip
            return self.of(node.this)
        if is_hash(node) or (isinstance(node, exp.Anonymous) and node.name.lower() == HASH_UDF):
            return INT  # DuckDB's UBIGINT; the UDF's DECIMAL(20, 0) holds the same integers
        return UNKNOWN

    def stored(self, node: exp.Expr) -> str | None:
        """The DuckDB type of the column whose values ``node`` is (through aliases, derived
        tables, MIN, MAX and ``CASE WHEN c THEN x END``, whose type is x's), if it reads a view
        copied from DuckDB; else None."""
        return self._declared(node, self.duckdb_types)

    def registered(self, node: exp.Expr) -> str | None:
        """The type of the column whose values ``node`` is, as the view's schema names it (as
        :meth:`stored`, for any registered view); else None."""
        return self._declared(node, self.spark_types)

    def _declared(self, node: exp.Expr, types: Mapping[str, Mapping[str, str]]) -> str | None:
        while isinstance(node, (exp.Alias, exp.Paren, exp.Min, exp.Max)) or _only_branch(node):
            if isinstance(node, exp.Case):
                node = node.args["ifs"][0].args["true"]
                continue
            if node.args.get("count") is not None:
                return None
            node = node.this
        if not isinstance(node, exp.Column):
            return None
        found = self.defined_as(node)
        if isinstance(found, tuple):
            return types.get(found[0], {}).get(found[1])
        return self._declared(found, types) if found is not None else None

    def defined_as(self, column: exp.Column) -> tuple[str, str] | exp.Expr | None:
        """What ``column`` reads: ``(view, column)`` of a table, the projection of a derived
        table or CTE that defines it, or None (unknown, a star, a set operation)."""
        scope = self.scope_of.get(id(column))
        if scope is None:
            return None
        if column.table:
            sources = [scope.sources.get(column.table)]
        else:
            sources = [s for s in selected(scope) if self._has(s, column.name)]
        if len(sources) != 1:
            return None
        source = sources[0]
        if isinstance(source, exp.Table):
            return source.name.lower(), column.name.lower()
        if isinstance(source, Scope):
            return self._projected(source, column.name)
        return None

    def _has(self, source: exp.Table | Scope, name: str) -> bool:
        if isinstance(source, exp.Table):
            return name.lower() in self.schema.get(source.name.lower(), {})
        return isinstance(source, Scope) and self._projected(source, name) is not None

    def _projected(self, scope: Scope, name: str) -> exp.Expr | None:
        """The expression of output column ``name`` of a one-branch scope (the first of that
        name, as in DuckDB), or None (a star, a set operation, no such column)."""
        if not isinstance(scope.expression, exp.Select):
            return None
        for projection in scope.expression.selects:
            if isinstance(projection, exp.Star) or isinstance(projection.this, exp.Star):
                return None
            if projection.alias_or_name == name:
                return projection
        return None

    def _column(self, column: exp.Column) -> str:
        scope = self.scope_of.get(id(column))
        if scope is None:
            return UNKNOWN
        if column.table:
            kind = self._output(scope.sources.get(column.table), column.name)
        else:  # ORDER BY names projections first, other clauses the tables first
            in_order = isinstance(column.find_ancestor(exp.Order, exp.Select), exp.Order)
            kind = self._projection(scope, column.name) if in_order else None
            if kind is None:
                found = [self._output(s, column.name) for s in selected(scope)]
                found = [k for k in found if k is not None]
                kind = found[0] if len(found) == 1 else None
        return UNKNOWN if kind is None else kind

    def _output(self, source: exp.Table | Scope | None, name: str) -> str | None:
        """The class of column ``name`` of a table or subquery; None if it has no such column."""
        if isinstance(source, exp.Table):
            return self.schema.get(source.name.lower(), {}).get(name.lower())
        if isinstance(source, Scope):
            return self._projection(source, name)
        return None

    def _projection(self, scope: Scope, name: str) -> str | None:
        """The class of output column ``name`` of a scope. As in DuckDB, the first projection of
        that name wins (``t.*`` included); set operations unify their branches."""
        selects = _branches(scope.expression)
        for position, projection in enumerate(selects[0].selects if selects else []):
            if isinstance(projection, exp.Star) or isinstance(projection.this, exp.Star):
                table = projection.table if isinstance(projection, exp.Column) else ""
                sources = [scope.sources.get(table)] if table else selected(scope)
                found = [k for k in (self._output(s, name) for s in sources) if k is not None]
                if found:
                    return found[0]
            elif projection.alias_or_name == name:
                same = [s.selects[position] for s in selects if len(s.selects) > position]
                return _unify(self.of(p) for p in same)
        return None


def _only_branch(node: exp.Expr) -> bool:
    """Whether ``node`` is ``CASE WHEN c THEN x END`` (one branch, NULL otherwise)."""
    if not isinstance(node, exp.Case) or node.this is not None or len(node.args["ifs"]) != 1:
        return False
    return isinstance(node.args.get("default"), (type(None), exp.Null))


def selected(scope: Scope) -> list[exp.Table | Scope]:
    """The tables and subqueries a scope's FROM and JOINs read (its ``sources`` also hold the
    CTEs it could read, which an unqualified column does not name)."""
    return [source for _node, source in scope.selected_sources.values()]


def _branches(expression: exp.Expr) -> list[exp.Select]:
    if isinstance(expression, exp.SetOperation):
        return _branches(expression.this) + _branches(expression.expression)
    if isinstance(expression, exp.Subquery):
        return _branches(expression.this)
    return [expression] if isinstance(expression, exp.Select) else []

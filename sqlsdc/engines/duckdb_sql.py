"""DuckDB SQL for protected trees: every built-in function schema-qualified, the printing copy
sharing what the generator only reads.

A user macro named like a built-in would otherwise win over it and silently undo a protection;
:class:`QualifiedDuckDB` writes ``system.main.f(...)`` for every call of a built-in, and
:func:`to_sql` prints a copy of the tree that refers to the parts the generator reads without
changing (:data:`PRINTED_AS_READ`) instead of copying them.
"""

from __future__ import annotations

import re

from sqlglot import exp
from sqlglot.dialects.duckdb import DuckDB

from sqlsdc.engines.duckdb import builtin_functions
from sqlsdc.engines.trees import copy_tree, release
from sqlsdc.errors import InterfaceError


class _QualifiedGenerator(DuckDB.Generator):
    """DuckDB SQL in which every call of a built-in function reads ``system.main.f(...)``.

    A user macro named like a built-in (``CREATE MACRO round(a, b) AS a``) would otherwise win
    over it and silently undo a protection (``shared/reference/ecosystem.md`` §2.1); a
    schema-qualified call always reaches the built-in. Qualifying in the generator covers every
    call, nested ones and those sqlglot writes under another name, whatever AST built them.
    """

    def func(
        self, name: str, *args, prefix: str = "(", suffix: str = ")", normalize: bool = True
    ) -> str:
        call = super().func(name, *args, prefix=prefix, suffix=suffix, normalize=normalize)
        if prefix == "(" and name.lower() in builtin_functions():
            return f"system.main.{call}"
        return call

    def identifier_sql(self, expression: exp.Identifier) -> str:
        """An identifier that is not a plain name (:data:`PLAIN_NAME`) is quoted even if its
        node says otherwise: sqlglot's ``qualify`` expands ``*`` into columns whose table is
        the alias unquoted, so ``SELECT * FROM regions "(SELECT MAX(income) FROM persons) AS
        leak, r", regions r`` printed the alias as SQL and read a person's income (red team
        s50e). Quoting a plain name changes nothing for DuckDB, whose names ignore case."""
        if not expression.quoted and expression.name and not PLAIN_NAME.match(expression.name):
            expression = exp.Identifier(this=expression.name, quoted=True)
        return super().identifier_sql(expression)

    def datetrunc_sql(self, expression: exp.DateTrunc) -> str:
        return self._total_truncation(expression, super().datetrunc_sql(expression))

    def timestamptrunc_sql(self, expression: exp.TimestampTrunc) -> str:
        return self._total_truncation(expression, super().timestamptrunc_sql(expression))

    def _total_truncation(self, expression: exp.Expr, truncated: str) -> str:
        """DATE_TRUNC to the year, quarter, month or ISO year raises for a timestamp of the
        type's first year (-290308: its 1 January is out of range), so whether a query that
        truncates stored values fails would tell whether a row of its cells holds one. Stored
        values of that year truncate to NULL, whatever the part (``epoch_us`` is total on
        every TIMESTAMP type and, with UTC sessions, compares instants alike; it is NULL for
        ±infinity, which truncate to themselves); constants are evaluated before the query
        and keep DuckDB's error."""
        if not any(isinstance(n, exp.Column) for n in expression.this.walk()):
            return truncated
        instant = self.func("epoch_us", expression.this)
        return f"CASE WHEN {instant} < {TRUNCATABLE_EPOCH_US} THEN NULL ELSE {truncated} END"


PLAIN_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
"""A name printed as it is; any other identifier is printed quoted."""

TRUNCATABLE_EPOCH_US = -9223371158400000000
"""``epoch_us(TIMESTAMP '-290307-01-01')``: DuckDB truncates every timestamp from there on."""


class QualifiedDuckDB(DuckDB):
    Generator = _QualifiedGenerator


def require_extensible_sqlglot() -> None:
    """Refuse to work with sqlglot's compiled build (the ``sqlglotc`` package, which
    ``sqlglot[c]`` or another tool may install): its classes cannot be subclassed from Python,
    so the generator above, and with it every check, would fail. The guard fails closed
    either way; this says why and what to do, before any query."""
    try:
        QualifiedDuckDB().generator()
    except TypeError as e:  # "interpreted classes cannot inherit from compiled"
        raise InterfaceError(
            f"sqlglot's compiled build is installed ({e}); sqlsdc extends sqlglot's SQL "
            "generator, which that build does not allow: run `pip uninstall sqlglotc`"
        ) from None


def to_sql(tree: exp.Expr) -> str:
    """DuckDB SQL for a protected tree, with built-in functions schema-qualified.

    The generator changes some trees it prints, so it prints a copy (sharing the type
    annotations, :func:`~sqlsdc.engines.trees.copy_tree`), released right after; the copy
    refers to the WHERE conditions, output expressions and group keys that the generator only
    reads instead of copying them (:func:`_read_only_parts`: a long condition or group key is
    most of a large statement)."""
    copy = copy_tree(tree, shared=_read_only_parts(tree))
    try:
        return QualifiedDuckDB().generate(copy, copy=False)
    finally:
        release([copy])


PRINTED_AS_READ = frozenset({
    exp.And, exp.Or, exp.Paren, exp.Not, exp.Between, exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT,
    exp.LTE, exp.Is, exp.In, exp.Column, exp.Identifier, exp.Literal, exp.Null, exp.Boolean,
    exp.Neg, exp.Case,
})  # fmt: skip
"""Classes whose SQL the generator writes by reading the node and its subtree only: it changes
neither (sqlglot 30.30: the base generator's connectors, comparisons, BETWEEN, IS, NOT, column,
identifier, literal, parenthesis and CASE, and DuckDB's IN, which builds a new tree only for an
IN UNNEST, whose UNNEST is no class of this set; its IS of a boolean prints a copy). A CASE's
WHEN branches (``If`` nodes in its ``ifs``) are read by the CASE's handler itself; an ``If``
anywhere else is printed by a handler that makes it the child of a new CASE, so it is not in
the set. The generator reaches a WHERE's condition through its SELECT and WHERE, an output's
expression through its SELECT and alias, and a group key through its SELECT and GROUP BY,
which read them too (DuckDB's SELECT transforms change only CONNECT BY and GENERATOR
queries), and prepares only the root it is given (DuckDB moves no CTE and adds no boolean
comparison). ``tests/test_guard_size.py`` pins the generator's handler of each class, so that
a sqlglot that prints one otherwise fails there first."""


def _printed_as_read(node: exp.Expr) -> bool:
    """Whether every node of ``node``'s subtree is of a :data:`PRINTED_AS_READ` class, or a WHEN
    branch of a CASE (its handler reads the branch); the walk stops at the first that is not."""
    Expr, If, Case = exp.Expr, exp.If, exp.Case
    stack = [node]
    push, pop = stack.append, stack.pop
    while stack:
        current = pop()
        if current.__class__ not in PRINTED_AS_READ and not (
            current.__class__ is If
            and current.parent.__class__ is Case
            and current.arg_key == "ifs"
        ):
            return False
        for value in current.args.values():
            if isinstance(value, Expr):
                push(value)
            elif type(value) is list:
                for item in value:
                    if isinstance(item, Expr):
                        push(item)
    return True


def _read_only_parts(tree: exp.Expr) -> set[int]:
    """The ids of the WHERE conditions, aliased output expressions and GROUP BY keys of
    ``tree`` that the generator prints without changing them (:func:`_printed_as_read`). The
    walk does not enter them."""
    found = set()
    Expr, Where, Select, Group, Alias = exp.Expr, exp.Where, exp.Select, exp.Group, exp.Alias
    stack = [tree]
    push, pop = stack.append, stack.pop
    while stack:
        node = pop()
        cls = node.__class__
        if cls is Where:
            parts = [node.args.get("this")]
        elif cls is Select:
            parts = [p.args.get("this") for p in node.expressions if p.__class__ is Alias]
        elif cls is Group:
            parts = list(node.expressions)
        else:
            parts = []
        for part in parts:
            if isinstance(part, Expr) and _printed_as_read(part):
                found.add(id(part))
        for value in node.args.values():
            if isinstance(value, Expr):
                if id(value) not in found:
                    push(value)
            elif type(value) is list:
                for item in value:
                    if isinstance(item, Expr) and id(item) not in found:
                        push(item)
    return found

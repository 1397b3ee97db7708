"""A protected DuckDB tree as Spark SQL that computes DuckDB's values: the four passes.

ARCHITECTURE.md §7: the rewriter emits one engine-neutral tree; DuckDB runs it embedded, Spark
runs it at scale. sqlglot transpiles syntax, not meaning: it passes unknown functions through
(``hash`` is a 64-bit hash in DuckDB and a 32-bit signed Murmur3 in Spark) and keeps operators
whose results differ per engine. So a tree reaches Spark only through four passes:

1. ``read_as_duckdb``: the tree is re-read from the DuckDB SQL that the DuckDB engine runs, so
   semantics that sqlglot's DuckDB generator adds become explicit nodes (a ``LEAST`` built by a
   rewrite is NULL if any argument is NULL in DuckDB SQL, but not in Spark SQL).
2. ``check_portable`` (:mod:`sqlsdc.engines.spark_portable`): every node must be a clause of
   ``PORTABLE_CLAUSES`` or a function or operator of ``PORTABLE_FUNCTIONS``, each tested on both
   engines in ``tests/test_spark.py``. Anything else raises
   :class:`~sqlsdc.errors.NotSupportedError` naming it, before Spark runs.
3. ``rename_tables``: ``sqlsdc.ptable`` becomes the temporary view ``sqlsdc__ptable``.
4. ``keep_duckdb_semantics`` (:mod:`sqlsdc.engines.spark_semantics`, which lists the
   differences found): where the engines differ, the node is rewritten so that Spark computes
   DuckDB's value, or refused. Some rewrites depend on the type of an argument, so column types
   come from the view schemas (:class:`sqlsdc.engines.spark.SparkEngine` passes them) through
   :mod:`sqlsdc.engines.spark_types`.

Between passes 3 and 4, a tree that reads a 32-bit FLOAT column is refused: DuckDB computes and
compares it in 32 bits, Spark in 64; and a SELECT whose grouping sets include ``()`` gets
DuckDB's grand totals over no rows, which Spark leaves out (:mod:`sqlsdc.engines.spark_sets`).
"""

from __future__ import annotations

from collections.abc import Mapping

import sqlglot
from sqlglot import exp
from sqlglot.optimizer.scope import traverse_scope

from sqlsdc.engines.spark_portable import check_duckdb_tree, has_star, is_hash
from sqlsdc.engines.spark_semantics import keep_duckdb_semantics
from sqlsdc.engines.spark_sets import keep_grand_totals
from sqlsdc.engines.spark_types import DIALECT, Types, selected
from sqlsdc.errors import NotSupportedError
from sqlsdc.written import carry_names


def to_spark_sql(
    tree: exp.Expr,
    schema: Mapping[str, Mapping[str, str]] | None = None,
    duckdb_types: Mapping[str, Mapping[str, str]] | None = None,
) -> str:
    """Spark SQL that computes what DuckDB computes for ``tree``; ``tree`` is not changed.

    ``schema`` maps view names to ``{column: type}`` (Spark or DuckDB type names); without it,
    rewrites that depend on a column's type refuse. ``duckdb_types`` maps the views copied from
    DuckDB to their columns' DuckDB types; without it, ``hash`` of a column is refused.

    Example:
        >>> tree = sqlglot.parse_one("SELECT p.v FROM sqlsdc.t AS p ORDER BY p.v", read="duckdb")
        >>> to_spark_sql(tree)
        'SELECT p.v FROM sqlsdc__t AS p ORDER BY p.v NULLS LAST'
    """
    return to_spark(tree, schema, duckdb_types).sql(dialect=DIALECT)


def to_spark(
    tree: exp.Expr,
    schema: Mapping[str, Mapping[str, str]] | None = None,
    duckdb_types: Mapping[str, Mapping[str, str]] | None = None,
) -> exp.Expr:
    """The Spark tree for a protected tree: the passes of this module on a private copy."""
    duckdb_tree = read_as_duckdb(tree)
    check_duckdb_tree(duckdb_tree)
    return translate(duckdb_tree, schema, duckdb_types)


def translate(duckdb_tree: exp.Expr, schema, duckdb_types=None) -> exp.Expr:
    """Passes 3 and 4 on a checked tree of our own (mutated)."""
    rename_tables(duckdb_tree)
    _check_no_32_bit_floats(duckdb_tree, schema or {})
    duckdb_tree = keep_grand_totals(duckdb_tree)
    return keep_duckdb_semantics(duckdb_tree, Types(duckdb_tree, schema, duckdb_types))


SINGLE_PRECISION = frozenset({"float", "real", "float4"})
"""Type names (Spark's, DuckDB's; lower case) of 32-bit floating-point columns."""


def _check_no_32_bit_floats(tree: exp.Expr, schema: Mapping[str, Mapping[str, str]]) -> None:
    """Refuse a tree that reads a 32-bit FLOAT column (by name or through a star) of a view it
    reads, other than as an argument of ``hash`` (hashed bit for bit). DuckDB computes with
    FLOAT in 32 bits (``r > 0.1`` casts 0.1 to FLOAT, ``r / 3`` is a FLOAT) where Spark widens
    to DOUBLE, so the same filter kept other rows: one DP cell identity, two exact values (red
    team s36e)."""
    named = {c.name.lower() for c in tree.find_all(exp.Column) if not is_hash(c.parent)}
    for scope in traverse_scope(tree):
        star = has_star(scope.expression)
        for source in selected(scope):
            if not isinstance(source, exp.Table):
                continue
            for column, kind in schema.get(source.name.lower(), {}).items():
                if kind.lower() in SINGLE_PRECISION and (star or column.lower() in named):
                    raise NotSupportedError(
                        f"{source.name}.{column} is a 32-bit FLOAT, which DuckDB computes and "
                        "compares in 32 bits and Spark in 64: not portable to Spark; run this "
                        "query on DuckDB, or store the column as DOUBLE"
                    )


def read_as_duckdb(tree: exp.Expr) -> exp.Expr:
    """A new tree parsed from the DuckDB SQL of ``tree``: what the DuckDB engine actually runs;
    its functions keep the names the statement wrote (refusals name them so)."""
    return carry_names(tree, sqlglot.parse_one(tree.sql(dialect="duckdb"), read="duckdb"))


def parse_duckdb_text(text: str) -> exp.Expr:
    """The tree of DuckDB SQL ``text`` that :func:`sqlsdc.engines.duckdb_sql.to_sql` wrote:
    its built-ins called ``system.main.f(...)`` (which sqlglot reads back as a column path to
    an anonymous function, not portable) are read as the plain calls they are, as the tree
    that text was written from holds them. A DP statement's count of a public table's rows
    (its answer's bound, before the charge) reached Spark only as such text, and was refused
    (a CTE of an outer join with a public table, answered on DuckDB; s50h)."""
    tree = sqlglot.parse_one(text, read="duckdb")
    qualified = [
        dot
        for dot in tree.find_all(exp.Dot)
        if isinstance(dot.expression, exp.Func) and _spells(dot.this, ("system", "main"))
    ]
    if not qualified:
        return tree
    for dot in qualified:
        dot.replace(dot.expression)
    return sqlglot.parse_one(tree.sql(dialect="duckdb"), read="duckdb")  # COUNT(*) as Count


def _spells(node: exp.Expr, names: tuple[str, ...]) -> bool:
    """Whether ``node`` is the dotted path of unquoted ``names`` (``system.main``)."""
    parts = []
    while isinstance(node, exp.Dot):
        parts.insert(0, node.expression)
        node = node.this
    parts.insert(0, node)
    return len(parts) == len(names) and all(
        isinstance(part, exp.Identifier) and not part.quoted and part.name.lower() == name
        for part, name in zip(parts, names, strict=True)
    )


def check_portable(tree: exp.Expr) -> None:
    """Raise NotSupportedError naming the first construct of ``tree`` not known to be portable."""
    check_duckdb_tree(read_as_duckdb(tree))


def rename_tables(tree: exp.Expr) -> exp.Expr:
    """Point tables at their Spark views (mutates ``tree``): ``sqlsdc.x`` → ``sqlsdc__x``."""
    for table in list(tree.find_all(exp.Table)):
        if table.args.get("db"):
            if not table.alias:
                table.set("alias", exp.TableAlias(this=exp.to_identifier(table.name)))
            table.set("this", exp.to_identifier(view_name(_qualified_name(table))))
            table.set("db", None)
    return tree


def view_name(name: str) -> str:
    """The Spark view of a DuckDB table: ``persons`` → ``persons``, ``sqlsdc.x`` → ``sqlsdc__x``."""
    table = exp.to_table(name)
    if table.catalog:
        raise NotSupportedError(f"table {name} names a database; Spark views have no database")
    if table.db and table.db.lower() != "main":
        return f"{table.db}__{table.name}".lower()
    return table.name.lower()


def tables_read(tree: exp.Expr) -> set[str]:
    """The DuckDB names (``persons``, ``sqlsdc.ptable``) of the tables a tree reads."""
    return tables_of(read_as_duckdb(tree))


def tables_of(duckdb_tree: exp.Expr) -> set[str]:
    names = set()
    for scope in traverse_scope(duckdb_tree):
        for source in scope.sources.values():
            if isinstance(source, exp.Table):
                names.add(_qualified_name(source))
    return names


def _qualified_name(table: exp.Table) -> str:
    if table.catalog:
        raise NotSupportedError(f"table {table.sql('duckdb')} names a database")
    return f"{table.db}.{table.name}".lower() if table.db else table.name.lower()

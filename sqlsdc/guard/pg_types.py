"""PostgreSQL's built-in types named with their schema, ``pg_catalog.int4``, as DuckDB's.

PostgreSQL clients and BI tools qualify the built-in types they cast to
(``CAST(x AS "pg_catalog"."int4")``, ``$1::pg_catalog.int8``); sqlglot reads such a name as a
user-defined type, which the guard refuses (a user-defined type is no built-in one). The
qualified spelling of the built-in types listed here is replaced by the type itself (a pure
rewrite of the tree's ``DataType`` nodes); any other qualified type (``public.int4``,
``pg_catalog.regclass``, a type of the analyst's making) is left as it is, and refused.
"""

from __future__ import annotations

from sqlglot import exp

BUILT_IN = frozenset(
    {
        "int2", "int4", "int8", "smallint", "integer", "bigint",
        "float4", "float8", "real", "numeric", "decimal",
        "text", "varchar", "bool", "boolean",
        "date", "time", "timestamp", "timestamptz",
    }
)  # fmt: skip
"""PostgreSQL's built-in types whose ``pg_catalog.`` spelling is accepted: each has a DuckDB
type of the same meaning (sqlglot's PostgreSQL dialect maps them: int4 INT, float8 DOUBLE,
bool BOOLEAN, numeric DECIMAL...)."""


def built_in_types(walked: list[exp.Expr]) -> bool:
    """Replace each ``pg_catalog.<t>`` type of :data:`BUILT_IN` in the tree walked by ``t``
    as PostgreSQL reads it (its modifiers kept: ``pg_catalog.numeric(10, 2)``). True when
    something was replaced (``walked`` is then out of date)."""
    replaced = False
    for node in walked:
        if not isinstance(node, exp.DataType) or node.this is not exp.DataType.Type.USERDEFINED:
            continue
        kind = node.args.get("kind")
        schema, _, name = str(kind or "").lower().rpartition(".")
        if schema != "pg_catalog" or name not in BUILT_IN:
            continue
        built = exp.DataType.build(name, dialect="postgres")
        if node.expressions:
            built.set("expressions", [e.copy() for e in node.expressions])
        node.replace(built)
        replaced = True
    return replaced

"""The answer of a DP query over its noisy cells given as list parameters, not registered views.

The protected SQL reads each DP stage's noisy cells from a relation of its own
(``__sqlsdc_dp_cells_0``, ...). Registering an Arrow table under that name and unregistering
it after the answer's transaction are two engine calls, about 1 ms of a small DP query's fixed
cost (benchmarks/README.md, "DP fixed cost, session 37"). A few cells of plain types go
instead as one list parameter per column, unnested in a subquery that takes the relation's
place: the same rows, the same types (each list cast to the column's DuckDB type, as the
ledger's parameters are, :func:`sqlsdc.catalog.store.as_parameters`), nothing left behind.

The text is built from the protected SQL's tree: parsed again, and used only when the parsed
tree prints back as exactly the text the guard checked (so the tree is that statement), with
every reference to a relation replaced and nothing else changed. Anything else (many cells,
a type whose Python values would not bind back exactly, a long text, a text that does not print
back) keeps the registered views.
"""

from __future__ import annotations

from functools import lru_cache

import pyarrow as pa
import sqlglot
from sqlglot import exp

from sqlsdc.catalog.store import as_parameters
from sqlsdc.engines import duckdb as engine
from sqlsdc.engines import duckdb_sql

# At most this many rows per relation: lists bind value by value, an Arrow table at once (8
# cells: 0.5 ms less as lists, in the query's flow; the cost of a list grows with its rows)
LISTED_ROWS = 64

# Texts of at most this many characters are listed (and their two listed texts kept, for up to
# 128 texts and shapes: 3 MiB at most); a longer answer keeps the registered views
LISTED_CHARACTERS = 8192

Shape = tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # (relation, ((column, type), ...))


def listed(sql: str, relations: dict[str, pa.Table]) -> tuple[str, str, list[list]] | None:
    """``sql`` reading ``relations`` from list parameters, the same text with a NULL list in
    place of each parameter (what DuckDB can say the tables of: it binds the constants of a
    text it reads the tables of, and refuses parameters there), and the parameters; or
    None."""
    if len(sql) > LISTED_CHARACTERS:
        return None
    shape, params = [], []
    for name, table in relations.items():
        if table.num_rows > LISTED_ROWS:
            return None
        columns = as_parameters(table, list(range(table.num_columns)))
        if columns is None or any(engine.is_wide_integer(field) for field in table.schema):
            return None  # HUGEINT values arrive as Decimal: registered (engine.register)
        kinds = engine.type_names(table.schema)
        shape.append((name, tuple(zip(table.column_names, kinds, strict=True))))
        params += columns
    texts = _listed_texts(sql, tuple(shape))
    return None if texts is None else (*texts, params)


@lru_cache(maxsize=128)
def _listed_texts(sql: str, shape: Shape) -> tuple[str, str] | None:
    """:func:`listed`'s two texts for one protected text and shape of relations (built
    once)."""
    try:
        tree = sqlglot.parse_one(sql, dialect="duckdb")
    except sqlglot.errors.ParseError:
        return None
    if duckdb_sql.to_sql(tree) != sql:
        return None
    sources, first = {}, 1
    for name, columns in shape:
        sources[name.lower()] = _unnested(columns, first)
        first += len(columns)
    replaced = []
    for table in list(tree.find_all(exp.Table)):
        source = sources.get(table.name.lower())
        if source is None or table.args.get("db") or table.args.get("catalog"):
            continue
        alias = table.alias or table.name
        table.replace(source.copy().subquery(alias))
        replaced.append(table.name.lower())
    if sorted(set(replaced)) != sorted(sources):
        return None  # a relation not read by name: keep the registered views
    text = duckdb_sql.to_sql(tree)
    for placeholder in list(tree.find_all(exp.Placeholder)):
        placeholder.replace(exp.null())
    return text, duckdb_sql.to_sql(tree)


def _unnested(columns: tuple[tuple[str, str], ...], first: int) -> exp.Select:
    """``SELECT unnest(CAST($first AS type[])) AS column, ...``: the columns in parallel."""
    return exp.select(*(
        exp.alias_(
            exp.func("unnest", exp.cast(exp.Placeholder(this=str(first + k)),
                                        exp.DataType.build(f"{kind}[]", dialect="duckdb"))),
            exp.to_identifier(name, quoted=True),
        )
        for k, (name, kind) in enumerate(columns)
    ))  # fmt: skip

"""An unnamed scalar subquery that GROUP BY or ORDER BY names by position gets a name.

sqlglot's ``qualify`` names an unnamed projection ``_col_N``; for a scalar subquery it does so
with the subquery's own table alias (``(SELECT ...) AS _col_2`` as a ``TableAlias``), and its
expansion of ``GROUP BY 2`` / ``ORDER BY 3`` then asserts that the projection is an ``Alias``:
``SELECT region, COUNT(*), (SELECT COUNT(*) FROM persons) FROM persons GROUP BY 1 ORDER BY 3``
failed as an internal error ("... AS _col_2 is not <class Alias>", red team s49a), though the
same query with ``AS t`` is answered (s48a's unnamed subquery beside an aggregate). Naming the
subquery before qualification, as sqlglot would, gives it the named query's checks and cells.
The result's column names are taken before this (:func:`sqlsdc.guard.parse.output_names`), so
the analyst still sees DuckDB's name for the column.

The ``ORDER BY`` of a set operation (``SELECT region, (SELECT ...) FROM regions UNION SELECT
region, 1 FROM regions ORDER BY 2``) names by position the columns of its leftmost SELECT, as
sqlglot's ``_select_by_pos`` reads them (``Union.selects``): those are named too (the same
internal error, red team s49k).
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.engines.trees import of_kind

__all__ = ["name_positioned_subqueries"]


def name_positioned_subqueries(walked: list[exp.Expr]) -> bool:
    """Wrap in an ``Alias`` each unnamed scalar subquery of a SELECT list that the SELECT's
    GROUP BY or ORDER BY names by its position (``walked``: the tree's nodes; the subquery
    node itself is kept, so they stay its nodes). True when something was named (``walked``
    then lacks the new aliases)."""
    named = False
    for query in of_kind(walked, (exp.Select, exp.SetOperation)):
        select = _leftmost(query)
        if select is None:
            continue
        projections = select.expressions
        taken = {p.alias_or_name.lower() for p in projections}
        for position in sorted(_positions(query)):
            if not 1 <= position <= len(projections):
                continue  # refused or failed as before
            projection = projections[position - 1]
            if not isinstance(projection, exp.Subquery) or projection.alias:
                continue
            name = f"_col_{position - 1}"  # the name sqlglot gives it
            while name in taken:
                name += "_"
            taken.add(name)
            alias = exp.Alias(alias=exp.to_identifier(name))
            projection.replace(alias)
            alias.set("this", projection)
            named = True
    return named


def _leftmost(query: exp.Expr) -> exp.Select | None:
    """The SELECT whose projections name the columns of ``query`` (a SELECT itself, or the
    leftmost SELECT of a set operation, through parentheses), else None."""
    while isinstance(query, (exp.SetOperation, exp.Subquery)):
        query = query.this
    return query if isinstance(query, exp.Select) else None


def _positions(query: exp.Expr) -> set[int]:
    """The positions (``2`` in ``GROUP BY 2``, ``ORDER BY 2 DESC``) ``query`` (a SELECT or a
    set operation) groups or orders by."""
    found = set()
    for clause in ("group", "order"):
        node = query.args.get(clause)
        for item in node.expressions if node is not None else ():
            item = item.this if isinstance(item, exp.Ordered) else item
            if isinstance(item, exp.Literal) and not item.is_string and item.name.isdecimal():
                found.add(int(item.name))
    return found

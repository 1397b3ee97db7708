"""Schema probes: statements that return no row whatever the data hold, which BI tools send to
learn a query's columns before they run it (Tableau ``SELECT * FROM (<query>) "Custom SQL
Query" LIMIT 0``; Metabase, Superset and JDBC tools ``SELECT * FROM (<query>) t WHERE 1=0``).

Their answer is the names and types of the columns, so the guard gives it from binding the
protected SQL (:mod:`~sqlsdc.guard.described`), after every check a query gets, without
running it: nothing is read, and no cell counts against a cell limit (a LIMIT's cells counted
as hidden, :mod:`~sqlsdc.guard.hidden_cells`, cost a BI tool's probe all the groups of its
query; red team s50e). A statement is a probe by its form alone (the text, never the data):
a SELECT or set operation whose outermost LIMIT is the literal 0, or a SELECT that neither
groups nor aggregates whose WHERE is a condition of constants only that is false. A WHERE
that reads a column (``WHERE n = 0``) is a query like any other.
"""

from __future__ import annotations

from sqlglot import exp
from sqlglot.optimizer.simplify import simplify

_CONSTANT = (exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.Not, exp.Connector,
             exp.Binary, exp.Neg, exp.Is)  # fmt: skip


def answers_no_row(tree: exp.Expr | None) -> bool:
    """Whether the statement ``tree`` returns no row by its form (module doc)."""
    if not isinstance(tree, exp.Query):
        return False
    limit = tree.args.get("limit")
    if isinstance(limit, exp.Limit):
        count = limit.expression
        if isinstance(count, exp.Literal) and not count.is_string and count.this == "0":
            return True
    if not isinstance(tree, exp.Select):
        return False
    where = tree.args.get("where")
    if where is None or tree.args.get("group") or tree.args.get("having"):
        return False
    if not _false(where.this):  # first: it stops at the condition's first column
        return False
    # an aggregate without GROUP BY answers one row over no row
    return not any(e.find(exp.AggFunc, exp.Window) for e in tree.expressions)


def _false(condition: exp.Expr) -> bool:
    """Whether ``condition`` is made of constants only (no column, function or subquery) and
    simplifies to FALSE."""
    if any(not isinstance(n, _CONSTANT) for n in condition.walk()):
        return False
    folded = simplify(condition.copy())
    return isinstance(folded, exp.Boolean) and folded.this is False

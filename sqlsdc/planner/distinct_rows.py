"""``SELECT DISTINCT`` of a statement's result as the ``GROUP BY`` of the same outputs.

BI tools fill their filter lists with ``SELECT DISTINCT region FROM persons [WHERE ...]``
(SQLAlchemy's ``select(...).distinct()`` too). Over confidential rows that is a list of rows,
refused; the rows DISTINCT keeps are exactly the groups of ``GROUP BY`` every output, and a
grouping without aggregates is already answered under the policy: a group is listed only
where the policy would publish it (its protected count reaches ``min_frequency``, exactly the
groups a count's result publishes under the threshold rule and rounding; the DP group release
under DP). So the statement's own SELECT is rewritten into that grouping, which then takes
every check a written one takes (roles: a measure or an identifier is no group key, so
``SELECT DISTINCT income`` stays refused; joins; class breaks; totality).

Only where the two are the same query in SQL: the statement's outermost SELECT (a DISTINCT
inside a subquery, derived table, CTE, set operation or aggregate is left as it is), reading
a table the policy does not make public, without GROUP BY, HAVING, QUALIFY, aggregates,
window functions or subqueries in its outputs and ORDER BY (DISTINCT applies after them, a
grouping before), and with at least one output that reads a column. Outputs that read no
column are constant: they are not keys (an integer literal key would be a position).
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.planner.scopes import NESTED
from sqlsdc.policy import Policy

_NOT_ROWS = (exp.AggFunc, exp.Window, *NESTED)  # values DISTINCT takes after they are computed


def distinct_as_groups(tree: exp.Expr, policy: Policy) -> bool:
    """Rewrite ``tree``'s own ``SELECT DISTINCT outputs`` into ``SELECT outputs ... GROUP BY``
    the outputs that read a column (changes the tree); True when it did. Run on the qualified
    tree, before its types are inferred (the keys are copies of the outputs, typed alike)."""
    if not isinstance(tree, exp.Select) or not _rewritable(tree, policy):
        return False
    keys = [o.unalias().copy() for o in tree.expressions if _reads_column(o)]
    tree.set("distinct", None)
    tree.set("group", exp.Group(expressions=keys))
    return True


def _rewritable(select: exp.Select, policy: Policy) -> bool:
    distinct = select.args.get("distinct")
    if distinct is None or distinct.args.get("on") is not None:
        return False
    if any(select.args.get(k) is not None for k in ("group", "having", "qualify")):
        return False
    if not _reads_confidential(select, policy):
        return False
    outputs = select.expressions
    if any(o.is_star for o in outputs) or not any(_reads_column(o) for o in outputs):
        return False
    order = select.args.get("order")
    computed = [*outputs, *(order.expressions if order is not None else [])]
    return not any(c.find(*_NOT_ROWS) for c in computed)


def _reads_column(output: exp.Expr) -> bool:
    return output.find(exp.Column) is not None


def _reads_confidential(select: exp.Select, policy: Policy) -> bool:
    """Whether a source of ``select`` is anything but a public table (a derived table or CTE
    may read confidential rows; the checks decide what it reads)."""
    sources = [select.args.get("from_"), *(select.args.get("joins") or [])]
    for source in (s.this for s in sources if s is not None):
        table = policy.table(source.name) if isinstance(source, exp.Table) else None
        if table is None or not table.is_public:
            return True
    return False

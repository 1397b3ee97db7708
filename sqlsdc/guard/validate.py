"""validate_release: the last pass before anything runs, independent of the passes before it.

It re-derives from the final tree alone that every read of a confidential table sits inside a
protected-cells subquery (directly, or through CTEs used only there), that no internal column
leaves the query, and that DuckDB's own parser sees no other table than the policy allows.

Then it proves, per protected-cells subquery, that what leaves it is protected:

* inside, every confidential row is aggregated before it reaches the boundary (no row-level
  value can be a "cell");
* outside, the query reads only the columns a mechanism marks as released — group keys
  ``__g<i>``/``__gg<i>``, protected values ``__y<i>``, statuses ``__e<i>``/``__p<i>``,
  accuracies ``__sd<i>``/``__hw<i>``, the protected group count ``__cn`` or contributor count
  ``__m<i>`` — and true values only
  under the threshold rule's own guard: a true aggregate ``__a<i>`` as the only branch of
  ``CASE WHEN __n<i> >= k``, a true unit count only in ``__n >= k``, with k at least the
  policy's minimum frequency. Frames that read no confidential table (DP's registered noisy
  cells, a stored suppression pattern) hold protected values only. A frame nested in another
  (a scalar subquery beside the aggregate) is proven on its own: ``__cells.x`` inside it names
  its own cells only where its source provably has ``x`` (DuckDB binds a column the inner
  source lacks to the outer ``__cells``); any other is proven against the outer frame.

A failure here is a bug in an earlier pass, so the query is refused rather than run.
"""

from __future__ import annotations

import re

from sqlglot import exp

from sqlsdc.catalog.schema import CATALOG_SCHEMA
from sqlsdc.catalog.store import PATTERN_PREFIX
from sqlsdc.engines.trees import nodes, of_kind
from sqlsdc.errors import InternalError
from sqlsdc.policy import Policy
from sqlsdc.rewrite.cells import ACCURACY_PREFIXES, CELLS, STATUS_PREFIX
from sqlsdc.rewrite.dp import RELATION_PREFIX

INTERNAL_COLUMNS = ("__rkey",)
CATALOG_TABLES = ("ptable_entries", "ckm_mix")  # catalog tables a protected query may read,
# with the protected universes of suppressed tables (``suppressed__<table>``)


def validate_release(tree: exp.Expr, policy: Policy) -> list[exp.Expr]:
    """Raise InternalError unless the protected ``tree`` reads confidential tables only
    inside protected cells and returns no internal column; its nodes (``nodes(tree)``), for
    the caller's next pass over the same tree."""
    found = nodes(tree)  # one walk: the checks below select from it
    ctes = {n.alias_or_name.lower(): n for n in of_kind(found, exp.CTE)}
    known: dict[int, bool] = {}  # whether each CTE is read only inside cells (_protected)
    tables = of_kind(found, exp.Table)
    for table in tables:
        if _catalog_lookup(table) or _noisy_cells(table):
            continue
        if (
            table.args.get("db")
            or table.args.get("catalog")
            or not isinstance(table.this, exp.Identifier)
        ):
            raise InternalError(f"unqualified base table expected, found {table.sql('duckdb')}")
        name = table.name.lower()
        if name in ctes:
            continue
        declared = policy.table(name)
        if declared is None:
            raise InternalError(f"undeclared table {name} in the protected query")
        if not declared.is_public and not _protected(table, ctes, set(), known):
            raise InternalError(f"confidential table {name} is read outside protected cells")
    for column in of_kind(found, exp.Column):
        if column.name.lower() in INTERNAL_COLUMNS and not _protected(column, ctes, set(), known):
            raise InternalError(f"internal column {column.name} in the protected query")
    hidden = (STATUS_PREFIX, *ACCURACY_PREFIXES)
    for name in _output_names(tree):
        if name.startswith("__") and not name.startswith(hidden):
            raise InternalError(f"internal column {name} would be returned")
    for cells in of_kind(found, exp.Subquery):
        if cells.alias == CELLS:
            inside = [t for t in tables if _inside(t, cells)]
            prove_cells(cells, inside, ctes, policy)
    return found


RELEASED = re.compile(r"__(g|gg|y|e|p|sd|hw|m|ma)\d+|__cn")
TRUE_AGGREGATE = re.compile(r"__a(\d+)")
TRUE_UNIT_COUNT = re.compile(r"__n(\d*)")


def prove_cells(cells: exp.Subquery, tables: list, ctes: dict[str, exp.CTE], policy) -> None:
    """Prove that the query around ``cells`` reads only protected values from it; ``tables``
    are the table references inside ``cells``."""
    confidential = False
    aggregating: dict[int, bool] = {}  # whether each select on the way aggregates
    for table in tables:
        if _catalog_lookup(table) or _noisy_cells(table):
            continue
        declared = policy.table(table.name)
        reads_rows = table.name.lower() in ctes or (declared is not None and not declared.is_public)
        if reads_rows and not _aggregated_between(table, cells, aggregating):
            raise InternalError(f"rows of {table.name} leave protected cells unaggregated")
        confidential |= reads_rows
    if not confidential:  # DP's noisy cells, a stored suppression pattern, public data
        return
    k = _min_frequency(tables, ctes, policy)
    consumer = cells.parent.parent if isinstance(cells.parent, exp.From) else None
    if not isinstance(consumer, exp.Select):
        raise InternalError("protected cells must be the FROM of a select")
    stack = [consumer]
    while stack:
        node = stack.pop()
        if node is cells:
            continue
        stack.extend(node.iter_expressions())
        if isinstance(node, exp.Star) and node.parent is consumer:
            raise InternalError("a select * over protected cells would release every column")
        if (
            isinstance(node, exp.Column)
            and node.table == CELLS
            and not _another_frames(node, consumer)
            and not _released(node, k)
        ):
            raise InternalError(f"{node.name} of protected cells is not a protected value")
        if isinstance(node, exp.Column) and not node.table and node.name.startswith("__"):
            raise InternalError(f"unqualified internal column {node.name} over protected cells")


def _another_frames(column: exp.Column, consumer: exp.Select) -> bool:
    """Whether ``column`` (``__cells.x``) reads the cells of a frame nested in ``consumer``'s
    rather than ``consumer``'s own: a select between them has a FROM or JOIN aliased
    ``__cells`` that provably HAS the column (s49j: a scalar subquery beside the aggregate has
    its own frame, proven by its own :func:`prove_cells`; s49a: a DP subquery's noisy
    ``__cells.__a0`` beside a CKM count was read as the outer frame's true count). An inner
    ``__cells`` shadows the outer one for a column only if it holds that column: DuckDB binds
    a qualified ``__cells.x`` that the inner source lacks to the outer ``__cells.x`` (s49l:
    ``(SELECT __cells.__a0 FROM (SELECT 1 AS __y9) AS __cells)`` beside a CKM sum returned the
    sum before its noise, and the proof let it through as the inner frame's). A source whose
    columns the tree does not show is not taken to have it: the column is proven here."""
    node = column.parent
    while node is not None and node is not consumer:
        if isinstance(node, exp.Select):
            sources = [node.args.get("from_"), *(node.args.get("joins") or [])]
            if any(s is not None and _holds(s.this, column.name) for s in sources):
                return True
        node = node.parent
    return False


NOISY_CELL_COLUMN = re.compile(r"__(g|a|p|sd|hw|dr|cl)\d+")  # what DP's relation registers


def _holds(source: exp.Expr, name: str) -> bool:
    """Whether ``source``, a FROM or JOIN item aliased ``__cells``, provably has the column
    ``name``: one of its select's outputs is named so, or it is DP's ``SELECT * FROM`` its
    registered noisy cells and ``name`` is of the columns the release registers."""
    if source.alias != CELLS or not isinstance(source, exp.Subquery):
        return False
    select = source.this
    if not isinstance(select, exp.Select):
        return False
    if any(e.alias_or_name == name and not isinstance(e, exp.Star) for e in select.expressions):
        return True
    read = select.args.get("from_")
    return (
        len(select.expressions) == 1
        and isinstance(select.expressions[0], exp.Star)
        and not select.args.get("joins")
        and read is not None
        and isinstance(read.this, exp.Table)
        and _noisy_cells(read.this)
        and NOISY_CELL_COLUMN.fullmatch(name) is not None
    )


def _released(column: exp.Column, k: int) -> bool:
    name = column.name
    if RELEASED.fullmatch(name):
        return True
    true_aggregate = TRUE_AGGREGATE.fullmatch(name)
    if true_aggregate:
        branch = column.parent
        case = branch.parent if isinstance(branch, exp.If) else None
        return (
            isinstance(case, exp.Case)
            and case.args.get("default") is None
            and len(case.args.get("ifs") or []) == 1
            and branch.args.get("true") is column
            and _guard_of(branch.this, k) == true_aggregate.group(1)
        )
    if TRUE_UNIT_COUNT.fullmatch(name):
        return _guard_of(column.parent, k) is not None and column.parent.this is column
    return False


def _guard_of(condition: exp.Expr, k: int) -> str | None:
    """The index i of a threshold guard ``__cells.__n<i> >= k'`` with k' >= k, else None."""
    if not isinstance(condition, exp.GTE) or not isinstance(condition.this, exp.Column):
        return None
    count, bound = condition.this, condition.expression
    match = TRUE_UNIT_COUNT.fullmatch(count.name)
    if count.table != CELLS or match is None or not isinstance(bound, exp.Literal):
        return None
    if bound.is_string or float(bound.this) < k:
        return None
    return match.group(1)


def _aggregated_between(node: exp.Expr, boundary: exp.Expr, aggregating: dict[int, bool]) -> bool:
    """Whether a select that aggregates (GROUP BY or an aggregate function) lies on the way
    from ``node`` up to ``boundary``; ``aggregating`` keeps the answer per select (a join of
    n tables asked it n times, each a walk of projections that name every table's units)."""
    current = node.parent
    while current is not None and current is not boundary:
        if isinstance(current, exp.Select):
            if id(current) not in aggregating:
                aggregating[id(current)] = current.args.get("group") is not None or any(
                    _is_aggregate(n) for p in current.expressions for n in nodes(p)
                )
            if aggregating[id(current)]:
                return True
        current = current.parent
    return False


AGGREGATE_NAMES = {"COUNT", "SUM", "AVG", "MIN", "MAX", "LIST", "QUANTILE_CONT"}


def _is_aggregate(node: exp.Expr) -> bool:
    """An aggregate call, also as the engine's SQL spells it (``system.main.COUNT(*)``, which
    sqlglot reads back as an anonymous function)."""
    if isinstance(node, exp.AggFunc):
        return not isinstance(node.parent, exp.Window)
    return isinstance(node, exp.Anonymous) and node.name.upper() in AGGREGATE_NAMES


def _min_frequency(tables: list, ctes: dict[str, exp.CTE], policy: Policy) -> int:
    """The smallest minimum frequency a threshold guard over cells reading ``tables`` must use."""
    bounds = []
    names = {t.name.lower() for t in tables}
    for name in list(names):
        if name in ctes:
            names |= {t.name.lower() for t in ctes[name].find_all(exp.Table)}
    for name in names:
        declared = policy.table(name)
        if declared is not None and not declared.is_public:
            bounds += [rule.min_frequency for rule in declared.protection.values()]
    return min(bounds, default=1)


def _noisy_cells(table: exp.Table) -> bool:
    """The noisy cells of a DP aggregation (registered by the connection), inside cells."""
    return (
        table.name.startswith(RELATION_PREFIX)
        and not table.args.get("db")
        and not table.args.get("catalog")
        and _protected(table, {}, set())
    )


def _catalog_lookup(table: exp.Table) -> bool:
    """A ptable read by a CKM frame or a suppression pattern, inside protected cells."""
    return (
        table.db == CATALOG_SCHEMA
        and not table.args.get("catalog")
        and (table.name in CATALOG_TABLES or table.name.startswith(PATTERN_PREFIX))
        and _protected(table, {}, set())
    )


def check_engine_tables(
    tables_read: set[str], tree: exp.Expr, policy: Policy, checked: tuple[str, ...] = ()
) -> None:
    """Compare the tables DuckDB says the SQL reads with the policy (defence in depth).

    DuckDB resolves CTE scopes itself (a CTE in scope is not a table it reads), so a name that
    is also a CTE elsewhere in the tree is not exempt: it would be a catalog object. A
    confidential table it reads must be one the protected ``tree`` reads (looked for only when
    it is not one of ``checked``, the tables of the analyst's query): any other was read by
    text the tree does not hold as a table (an alias printed unquoted as SQL: red team s50e)."""
    undeclared = {name for name in tables_read if policy.table(name) is None}
    named = {name.lower() for name in checked}
    unchecked = {
        name
        for name in tables_read
        if name not in undeclared and not policy.table(name).is_public and name.lower() not in named
    }
    if not undeclared and not unchecked:  # the usual case: no walk of the tree
        return
    # a CKM frame's ptable: walked on every new text (nodes: half the time of find_all's walk)
    tables = of_kind(nodes(tree), exp.Table)
    internal = {t.name for t in tables if _catalog_lookup(t) or _noisy_cells(t)}
    for name in sorted(undeclared - internal):
        raise InternalError(f"the engine would read undeclared table {name}")
    in_tree = {t.name.lower() for t in tables}
    for name in sorted(unchecked):
        if name.lower() not in in_tree:
            raise InternalError(
                f"the engine would read table {name}, which the protected query does not"
            )


def _protected(
    node: exp.Expr, ctes: dict[str, exp.CTE], seen: set[str], known: dict[int, bool] | None = None
) -> bool:
    """Whether ``node`` runs only inside protected cells: inside them, or in CTEs whose every
    use is. ``known`` keeps the answer per CTE: a chain of CTEs each read twice by the next
    asked it 2^k times (hours of checking for a statement of a kilobyte)."""
    known = {} if known is None else known
    current = node.parent
    while current is not None:
        if isinstance(current, exp.Subquery) and current.alias == CELLS:
            return True
        if isinstance(current, exp.CTE):
            name = current.alias_or_name.lower()
            if name in seen:
                return False
            if id(current) not in known:
                uses = [
                    t
                    for t in current.root().find_all(exp.Table)
                    if t.name.lower() == name and not _inside(t, current)
                ]  # unused CTEs never run
                known[id(current)] = all(_protected(t, ctes, seen | {name}, known) for t in uses)
            return known[id(current)]
        current = current.parent
    return False


def _inside(node: exp.Expr, container: exp.Expr) -> bool:
    current = node.parent
    while current is not None:
        if current is container:
            return True
        current = current.parent
    return False


def _output_names(tree: exp.Expr) -> list[str]:
    select = tree
    while isinstance(select, (exp.Union, exp.Intersect, exp.Except)):
        select = select.this
    while isinstance(select, exp.Subquery):
        select = select.this
    return [p.alias_or_name for p in select.expressions]

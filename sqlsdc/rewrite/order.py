"""The order of a protected result: a function of the released values only.

SQL leaves the order of rows to the engine wherever ORDER BY does not fix it, and DuckDB's
order comes from its hash tables: which groups a cell frame held, hidden ones included, and
which rows fell into them. Red team s33 read one person's age from it: with the groups keyed
``CASE WHEN municipality = 'R03-M005' AND age = 68 THEN 'R03-M007' ELSE municipality END``,
the released rows of the demo's region R03 came back in one order when the condition held for
the municipality's only inhabitant (their row joined the shown group) and in another when it
did not (their row made a hidden group of its own), whatever the noise on the counts. ORDER BY
with ties, and a LIMIT after it (or in a derived table), chose among tied rows the same way.

So a result that reads confidential rows is ordered by the query's ORDER BY, then by every
output column in turn (the hidden status and accuracy columns last: rows equal in every value,
a NULL published and a NULL suppressed, gave ``cursor.cell_status()`` in the engine's order),
and so is every derived table or CTE that keeps some of its rows (LIMIT, OFFSET): rows tied on
all of them are equal in everything the scope passes on, and which comes first tells nothing.
The extra keys only break ties, so a query's own order is kept.

Window functions read the order of their rows too: ROW_NUMBER, LAG, LEAD, FIRST_VALUE and
LAST_VALUE, and aggregates over a ROWS frame (a moving average). Their ORDER BY is extended by
what the scope releases (its other outputs and the window functions' arguments) and, over a
cell frame, by the cells' keys, which tell every cell of it apart. A FIRST_VALUE or LAST_VALUE
that had no ORDER BY and no frame keeps its whole partition as its frame. Not changed: RANK and
DENSE_RANK and aggregates over RANGE or GROUPS frames (peers share their result, so the order
among them does not matter). FIRST_VALUE and LAST_VALUE over a RANGE frame with an offset are
refused: the frame starts or ends among tied rows, and DuckDB orders such a frame by one key
only, so their ties cannot be broken. Rows tied on values SQL holds equal but a later scope
tells apart (-0.0 and 0.0: ``1 / x``) are ordered by their text too (``CAST(x AS VARCHAR)``)
in a window's ORDER BY (red team s34: ``ROW_NUMBER() OVER (ORDER BY x)`` numbered them as a
hidden group moved them); a LIMIT's rows are written in one spelling instead
(:mod:`sqlsdc.rewrite.spelling`).

Aggregates over released values (an outer query's, a window's) read the order of their inputs
too: a floating-point SUM, AVG, STDDEV or VARIANCE adds them in the order the engine gives
them, and values that cancel (1e16, 1.0, -1e16) turn that order into a different sum (red
team s33c: 2 or 3 on the demo, as the person's guessed age was right or not). They add their
inputs in the order of their values (``SUM(x ORDER BY x)``), after an ORDER BY of the query's.
MIN, MAX, the quantiles (MEDIAN, QUANTILE_DISC, QUANTILE_CONT) and the windows that return
one row's value return the first of equal values they read, and SQL holds -0.0 equal to 0.0,
-NaN equal to NaN and 30 days equal to 1 month: their result is written in one spelling, and
so are a GROUP BY's keys, DISTINCT rows and the rows of set operations and LIMITs
(:mod:`sqlsdc.rewrite.spelling`).
"""

from __future__ import annotations

import re

from sqlglot import exp

from sqlsdc.engines.trees import nodes, of_kind
from sqlsdc.errors import PolicyViolation
from sqlsdc.rewrite.cells import ACCURACY_PREFIXES, CELLS, STATUS_PREFIX
from sqlsdc.rewrite.spelling import (
    in_one_spelling,
    in_one_spelling_already,
    released_in_one_spelling,
    remember_chosen_type,
)
from sqlsdc.rewrite.sql import data_type

_QUERIES = (exp.Select, exp.Union, exp.Intersect, exp.Except)
_ORDERED = (exp.RowNumber, exp.Lag, exp.Lead, exp.FirstValue, exp.LastValue)
# aggregates whose floating-point result depends on the order they add their inputs in
_ACCUMULATING = (exp.Sum, exp.Avg, exp.Stddev, exp.StddevSamp, exp.StddevPop, exp.Variance,
                 exp.VariancePop)  # fmt: skip
# aggregates and windows that return one of the values they read, chosen among equal ones
# (a quantile picks the value at its rank, or two neighbours to interpolate between)
_CHOOSING = (exp.Min, exp.Max, exp.Median, exp.Quantile, exp.PercentileCont, exp.PercentileDisc)
_CHOSEN = (exp.FirstValue, exp.LastValue, exp.Lag, exp.Lead)
_HIDDEN = (STATUS_PREFIX, *ACCURACY_PREFIXES)
_CELL_KEY = re.compile(r"__gg?\d+")
# the nodes the order of rows reaches (one tuple, not built again for every node of the tree)
_ORDER_READERS = (*_QUERIES, *_ACCUMULATING, *_CHOOSING, exp.Window)


_ANALYST = "sdc_ordered_scope"  # meta key: a node of the analyst's query (mark_analyst_scopes)


def mark_analyst_scopes(tree: exp.Expr, rewritten: set[int]) -> None:
    """Mark the queries, windows and summing aggregates of the analyst's ``tree`` (before the
    rewrite copies it; the copies keep the mark), except the nodes in ``rewritten`` (ids of the
    aggregations the rewrite replaces by cell frames, and of their aggregates).

    :func:`in_released_order` leaves the cell frames' own queries alone (they keep no rows),
    but a frame holds the analyst's WHERE, and a subquery there may LIMIT, number or sum the
    released rows of another frame: ``WHERE municipality = (SELECT k FROM (<counts by a CASE
    key>) t LIMIT 1)`` counted the group DuckDB's hash order put first, 170 or 382 persons as
    one person's guessed age was right or not (red team s33c). The mark tells them apart."""
    for node in of_kind(nodes(tree), _ORDER_READERS):
        if id(node) not in rewritten:
            node.meta[_ANALYST] = True
            remember_chosen_type(node)


def in_released_order(tree: exp.Expr, sql: str) -> exp.Expr:
    """``tree`` (the root of a protected query of ``sql``) with its ORDER BY extended by the
    positions of all its columns (the query's own, then the hidden status and accuracy
    columns: rows equal in every value may differ in them, a NULL published and a NULL
    suppressed, and ``cursor.cell_status()`` releases them in the rows' order, red team s34),
    and every scope inside it that LIMITs or OFFSETs its rows by all of its columns;
    changed in place and returned. The cell frames (``__cells``) are the rewrite's and keep no
    rows; the analyst's scopes inside them (a subquery of a WHERE) are marked by
    :func:`mark_analyst_scopes` and ordered like the others.

    Raises:
        PolicyViolation: a FIRST_VALUE or LAST_VALUE over a RANGE frame with an offset.
    """
    _order_scopes(
        [n for n in of_kind(nodes(tree), _ORDER_READERS)
         if n is not tree and (n.meta.get(_ANALYST) or not _in_cells(n))],
        sql,
    )  # fmt: skip
    _break_ties(tree, len(_first_select(tree).expressions))
    return tree


def analyst_scopes_in_order(tree: exp.Expr, sql: str | None) -> exp.Expr:
    """``tree`` (a DP stage's exact cells, which the engine computes in a statement of their
    own) with the analyst's scopes in it (:func:`mark_analyst_scopes`: a subquery of the WHERE,
    a CTE the rows read) ordered as :func:`in_released_order` orders them; the stage's own
    nodes are left as they are. A LIMIT over a public join or DISTINCT picks the row the
    engine's threads give first (``age < (SELECT DISTINCT v FROM big LIMIT 1)``: 0 or 40 over
    runs), so one cell identity, and one noise, covered two populations, and two analysts
    differenced their exact counts (red team s36b). Changed in place and returned. ``sql``
    is the statement a refusal names (None: none; the caller adds it)."""
    _order_scopes([n for n in of_kind(nodes(tree), _ORDER_READERS) if n.meta.get(_ANALYST)], sql)
    released_in_one_spelling(tree, sql, within=lambda select: select.meta.get(_ANALYST))
    return tree


def _order_scopes(found: list[exp.Expr], sql: str | None) -> None:
    """Order the windows, LIMIT and OFFSET scopes, summing and choosing aggregates ``found``
    (:func:`in_released_order`)."""
    chosen = []
    for node in found:
        if isinstance(node, _ACCUMULATING):
            _add_in_order(node)
        elif isinstance(node, _CHOOSING):
            if _window_of(node) is None:  # a window's MIN is the window's value
                chosen.append(node)
        elif isinstance(node, exp.Window):
            if _untieable(node):
                raise PolicyViolation(
                    f"{_function(node).sql('duckdb')[:60]} over a RANGE frame with an offset "
                    "returns the first or last of rows tied on the ORDER BY, in an order the "
                    "engine chooses (which rows it groups, hidden ones included, decide it)",
                    "use a ROWS frame, or a RANGE frame bounded by UNBOUNDED and CURRENT ROW",
                    sql,
                )
            if _reads_order(node):
                _order_window(node)
            if isinstance(_function(node), (*_CHOSEN, *_CHOOSING)):
                chosen.append(node)
        elif node.args.get("limit") is not None or node.args.get("offset") is not None:
            _break_ties(node, len(_first_select(node).expressions))
    for node in chosen:
        in_one_spelling(node, sql)


def _window_of(node: exp.Expr) -> exp.Window | None:
    """The window whose function ``node`` is (``MIN(x) OVER ()``), if any."""
    parent = node.parent
    while isinstance(parent, (exp.IgnoreNulls, exp.RespectNulls)):
        parent = parent.parent
    return parent if isinstance(parent, exp.Window) and _function(parent) is node else None


def _add_in_order(aggregate: exp.Expr) -> None:
    """``aggregate`` adds its inputs in the order of their values (``SUM(x ORDER BY x)``),
    after an ORDER BY of its own, then of their text where one value has several spellings
    (:func:`_spellings`): NaN and -NaN are tied, and a sum or standard deviation of NaNs
    keeps the sign of the first it reads (red team s34: STDDEV gave 'nan' or '-nan' as a
    hidden group moved them). Inputs tied on all of it are equal, so the result is the same
    whatever order the engine reads them in."""
    argument = aggregate.this
    if isinstance(argument, exp.Order):
        order, argument = argument, argument.this
    else:
        order = exp.Order(this=argument)
        aggregate.set("this", order)
    keys = [argument]
    if isinstance(argument, exp.Distinct):  # SUM(DISTINCT x): one argument, ordered by it only
        keys = [argument.expressions[0]]
    else:
        keys += _spellings(keys)
    order.set("expressions", [*order.expressions, *(exp.Ordered(this=k.copy()) for k in keys)])


def _function(window: exp.Window) -> exp.Expr:
    function = window.this
    while isinstance(function, (exp.IgnoreNulls, exp.RespectNulls)):
        function = function.this
    return function


def _reads_order(window: exp.Window) -> bool:
    """Whether the window's result depends on the order of rows its ORDER BY leaves tied."""
    spec = window.args.get("spec")
    kind = str(spec.args.get("kind") or "").upper() if spec is not None else ""
    function = _function(window)
    if isinstance(function, _ORDERED):
        return True
    return kind == "ROWS"


def _untieable(window: exp.Window) -> bool:
    """A FIRST_VALUE or LAST_VALUE whose frame DuckDB orders by one key only."""
    spec = window.args.get("spec")
    return (
        isinstance(_function(window), (exp.FirstValue, exp.LastValue))
        and spec is not None
        and str(spec.args.get("kind") or "").upper() == "RANGE"
        and _has_offset(spec)
    )


def _has_offset(spec: exp.WindowSpec) -> bool:
    bounds = (spec.args.get("start"), spec.args.get("end"))
    return any(b is not None and str(b).upper() not in ("UNBOUNDED", "CURRENT ROW")
               for b in bounds)  # fmt: skip


def _order_window(window: exp.Window) -> None:
    select = window.find_ancestor(exp.Select)
    keys = _tiebreakers(select) if select is not None else []
    if not keys:
        return
    order = window.args.get("order")
    if (
        order is None
        and window.args.get("spec") is None
        and isinstance(_function(window), (exp.FirstValue, exp.LastValue))
    ):  # the whole partition, as without ORDER BY
        window.set("spec", exp.WindowSpec(kind="ROWS", start="UNBOUNDED",
                                          start_side="PRECEDING", end="UNBOUNDED",
                                          end_side="FOLLOWING"))  # fmt: skip
    existing = list(order.expressions) if order is not None else []
    keys += _spellings(keys)
    window.set("order", exp.Order(expressions=existing + [exp.Ordered(this=k) for k in keys]))


def _tiebreakers(select: exp.Select) -> list[exp.Expr]:
    """What ``select`` releases, to order its windows' rows by: its outputs that are no window
    and no hidden column, the arguments of its window functions, and the keys of a cell frame
    it reads (unique per cell). Rows equal in all of them are equal in what the scope shows."""
    found: dict[str, exp.Expr] = {}

    def add(value: exp.Expr | None) -> None:
        if value is None or isinstance(value, (exp.Literal, exp.Star)) or value.find(exp.Window):
            return  # COUNT(*)'s star is no value (DuckDB refuses ``ORDER BY *`` in a window)
        found.setdefault(value.sql(), value)

    for projection in select.expressions:
        if not projection.alias_or_name.startswith(_HIDDEN):
            add(projection.unalias())
    for window in select.find_all(exp.Window):
        if window.find_ancestor(exp.Select) is select:
            for argument in _function(window).iter_expressions():
                add(argument)
    for source in select.find_all(exp.Subquery):
        if (
            source.alias == CELLS
            and source.parent is not None
            and (source.parent.find_ancestor(exp.Select) is select)
        ):
            names = {a.alias for a in source.find_all(exp.Alias) if _CELL_KEY.fullmatch(a.alias)}
            for name in sorted(names, key=lambda n: (len(n), n)):
                add(exp.column(name, CELLS))
    return [value.copy() for value in found.values()]


def _spellings(keys: list[exp.Expr]) -> list[exp.Expr]:
    """``CAST(k AS VARCHAR)`` of each of ``keys`` whose type may spell one value in several
    ways (floats, intervals, nested or unknown types): rows tied on -0.0 and 0.0, NaN and
    -NaN or 1 month and 30 days are not equal in what a later scope reads of them (``1 / x``),
    so their order must not be the engine's (red team s34: ``ROW_NUMBER() OVER (ORDER BY
    x)`` numbered the -0.0 and 0.0 rows as a hidden group moved them). Their text tells them
    apart, and is a function of the value."""
    return [
        exp.Cast(this=k.copy(), to=data_type("VARCHAR"))
        for k in keys
        if not in_one_spelling_already(k) and not k.find(exp.Window)
    ]


def _break_ties(query: exp.Expr, outputs: int) -> None:
    """Order ``query`` by its own ORDER BY, then by its first ``outputs`` columns. Rows tied on
    all of them pass on equal values, each written in one spelling (a LIMIT scope's outputs
    and a set operation's operands by :mod:`sqlsdc.rewrite.spelling`, the result by the
    post-process), so which comes first tells nothing."""
    order = query.args.get("order")
    keys = list(order.expressions) if order is not None else []
    keys += [exp.Ordered(this=exp.Literal.number(i + 1)) for i in range(outputs)]
    query.set("order", exp.Order(expressions=keys))


def _first_select(query: exp.Expr) -> exp.Select:
    while not isinstance(query, exp.Select):
        query = query.this
    return query


def _in_cells(node: exp.Expr) -> bool:
    current = node.parent
    while current is not None:
        if isinstance(current, exp.Subquery) and current.alias == CELLS:
            return True
        current = current.parent
    return False

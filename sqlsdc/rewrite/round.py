"""Per-cell rounding as a rewrite: every published value is a multiple of the base.

Source: Cox & Kim, "Effects of Rounding on the Quality and Confidentiality of Statistical Data",
PSD 2006, LNCS 4302, pp. 48-56 (digest ``seed_2006_tabular.md`` §5.1, errata §12.5). With the
exact aggregate x = qB + r, 0 <= r < B, the rounding is adjacent: R(x) = x - r + (B if up else
0), where *up* is

* ``conventional``: 2r >= B (nearest multiple, halves up; Cox & Kim rule 1);
* ``modified_conventional``: 2r > B, or 2r = B and u < 1/2 (rule 2: for even B the half goes
  up or down with probability 1/2 each; for odd B this is conventional rounding);
* ``zero_restricted``: r > 0 and u < 1/2 (rule 3, 50/50: multiples stay, the preferred rule
  for confidentiality: uniform posteriors over the non-zero confidential values);
* ``unbiased``: u < r/B (rule 4: E[R(x) | x] = x, the only unbiased rule).

The uniform u of a cell is its cell key over 2^32: ``SUM(__rkey) % 2^32`` over the records
that contribute to the aggregate, the key of the cell key method (:mod:`sqlsdc.rewrite.ckm`:
each unit once when units repeat, so the same records give the same key whatever the query
joins to them). It is a keyed PRF of the cell's contributors: the record keys are uniform
secret integers, so u is uniform and unpredictable without them, and the same cell rounds the
same way in every query, for every user (ARCHITECTURE.md §3), so repeating or rephrasing a
query cannot average the rounding away. Magnitudes use the key rotated by 16 bits, so that a
count and a sum of the same records decide up/down on disjoint (independent) bits of the key.
The comparisons are integer arithmetic on the key (``u < 1/2`` is ``key < 2^31``, ``u < r/B``
is ``key·B < r·2^32``): no floating point decides a rounding of an integer cell.

Cells of fewer than ``min_frequency`` units are suppressed, as with the threshold rule
(:mod:`sqlsdc.rewrite.threshold`). Rounding alone does not protect small cells of magnitudes (a
sum over one business rounded to base 5 is that business's value within 5), and for counts
Cox & Kim's own disclosure rule (§5.2) names the values below B as the confidential ones, which
rounding only blurs; keeping the frequency rule makes ``round`` at least as safe as
``threshold``, with ``min_frequency: 1`` for plain rounding.

Every aggregate of a rounded kind is rounded as it is: COUNT and SUM. An AVG is refused: the
mean rounded by itself to the magnitudes' base is so much finer, relative to it, than the sum's
rounding that SUM(x)/AVG(x) was the exact number of contributors, and its difference over two
populations an exact small count (red team s37d: 116 where COUNT showed 120, a group of 4 behind
``AND NOT age = 43``). ``SUM(x) / COUNT(x)`` is a ratio of rounded values, and tells no more.

The frame has two layers: the aggregation ``__c`` (keys, exact values ``__a<i>``, unit counts
``__n<i>``, cell keys ``__k<i>``) and ``__cells`` over it, which carries only keys, unit counts
and the rounded values ``__y<i>``; exact values and keys never reach the outer query.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.catalog.ptables import KEY_MODULUS
from sqlsdc.errors import PolicyViolation
from sqlsdc.policy import AggregateKind, Method, Rounding
from sqlsdc.rewrite.cells import CELLS, Cells, Frame, inner_select, unit_count
from sqlsdc.rewrite.counted_units import counted_units_key, join_unit_keys, unit_lookups
from sqlsdc.rewrite.threshold import add_keys, at_least, group_condition, records_key, rotated

MECHANISM = "round"
AGGREGATION = "__c"
HALF = KEY_MODULUS // 2  # u < 1/2  <=>  key < 2^31


def round_frame(cells: Cells, twin: dict[int, exp.Expr]) -> Frame:
    """The ``__cells`` frame of an aggregation whose aggregates are rounded (or thresholded).

    Refuses aggregations that mix rounding with a method other than the threshold rule (cell
    key noise, suppression or DP): their frames would release the rounded aggregates unrounded.
    """
    plan = cells.plan
    methods = {a.rule.method for a in plan.aggregates}
    if other := methods - {Method.ROUND, Method.THRESHOLD}:
        raise PolicyViolation(
            "this query mixes rounded aggregates with aggregates protected by "
            + ", ".join(sorted(m.value for m in other)),
            "query the counts and the magnitudes separately, or give them the same method",
            cells.select.sql("duckdb"),
        )
    for spec in plan.aggregates:
        if spec.rule.method is Method.ROUND and isinstance(spec.node, exp.Avg):
            raise PolicyViolation(
                f"{spec.node.sql('duckdb')} under rounding: a mean rounded by itself and its "
                "rounded sum would tell the exact number of contributors",
                "divide the rounded sum by the rounded count: SUM(x) / COUNT(x)",
                cells.select.sql("duckdb"),
            )
    inner = inner_select(cells)
    add_keys(inner, cells)
    arguments = [cells.argument(i, twin) for i in range(len(cells.aggregates))]
    lookups = unit_lookups(plan, arguments, Method.ROUND)
    looked_up = join_unit_keys(inner, plan, arguments, lookups)
    for i, aggregate in enumerate(cells.aggregates):
        argument = arguments[i]
        inner.append("expressions", exp.alias_(aggregate.copy(), f"__a{i}"))
        inner.append("expressions", exp.alias_(unit_count(argument, plan.units), f"__n{i}"))
        if i in lookups:  # a distinct count of units: their own keys (counted_units)
            key = counted_units_key(looked_up[lookups[i]])
            inner.append("expressions", exp.alias_(key, f"__k{i}"))
        elif plan.aggregates[i].rule.method is Method.ROUND:
            inner.append("expressions", exp.alias_(cell_key(cells, i, argument), f"__k{i}"))
    group = group_condition(inner, cells)
    outer = exp.Select(
        expressions=[
            exp.alias_(exp.column(p.alias, AGGREGATION), p.alias)
            for p in inner.expressions
            if not p.alias.startswith(("__a", "__k"))
        ]
    )
    outer.set("from_", exp.From(this=inner.subquery(AGGREGATION, copy=False)))
    for i, spec in enumerate(plan.aggregates):
        exact = exp.column(f"__a{i}", AGGREGATION)
        if spec.rule.method is Method.ROUND:
            key = exp.column(f"__k{i}", AGGREGATION)
            if spec.kind is AggregateKind.MAGNITUDES:
                key = rotated(key, 16)
            exact = rounded(exact, key, spec.rule.base, spec.rule.rounding)
        counted = at_least_in(f"__n{i}", spec.min_frequency)
        published = exp.Case(ifs=[exp.If(this=counted, true=exact)])
        outer.append("expressions", exp.alias_(published, f"__y{i}"))

    def value(i: int) -> exp.Expr:
        return exp.column(f"__y{i}", CELLS)

    def published(i: int) -> exp.Expr:
        return at_least(f"__n{i}", plan.aggregates[i].min_frequency)

    return Frame(outer.subquery(CELLS, copy=False), value, published, group)


def rounded(x: exp.Expr, key: exp.Expr, base: int, rule: Rounding) -> exp.Expr:
    """``x - r + (base if up else 0)`` with ``r = ((x % base) + base) % base`` in [0, base).

    The double modulo gives the remainder of negative values too (``%`` keeps the sign of the
    dividend on DuckDB and Spark). ``key`` is the cell key in [0, 2^32), u = key / 2^32.

    Example:
        >>> rounded(exp.column("a"), exp.column("k"), 5, Rounding.CONVENTIONAL).sql()
        'a - (a % 5 + 5) % 5 + CASE WHEN 2 * ((a % 5 + 5) % 5) >= 5 THEN 5 ELSE 0 END'
    """
    b = exp.Literal.number(base)
    r = exp.Mod(
        this=exp.Paren(this=exp.Add(this=exp.Mod(this=x.copy(), expression=b), expression=b)),
        expression=b.copy(),
    )
    twice_r = exp.Mul(this=exp.Literal.number(2), expression=exp.Paren(this=r.copy()))
    coin = exp.LT(this=key.copy(), expression=exp.Literal.number(HALF))  # u < 1/2
    if rule is Rounding.CONVENTIONAL:
        up = exp.GTE(this=twice_r, expression=b.copy())
    elif rule is Rounding.MODIFIED_CONVENTIONAL:
        half = exp.and_(exp.EQ(this=twice_r.copy(), expression=b.copy()), coin)
        up = exp.or_(exp.GT(this=twice_r, expression=b.copy()), half)
    elif rule is Rounding.ZERO_RESTRICTED:
        up = exp.and_(exp.GT(this=r.copy(), expression=exp.Literal.number(0)), coin)
    elif rule is Rounding.UNBIASED:  # u < r/B  <=>  key·B < r·2^32
        up = exp.LT(
            this=exp.Mul(this=key.copy(), expression=b.copy()),
            expression=exp.Mul(
                this=exp.Paren(this=r.copy()), expression=exp.Literal.number(KEY_MODULUS)
            ),
        )
    else:  # pragma: no cover - the policy loader admits only the four rules
        raise ValueError(f"unknown rounding rule {rule!r}; this is a bug")
    step = exp.Case(ifs=[exp.If(this=up, true=b.copy())], default=exp.Literal.number(0))
    return exp.Add(this=exp.Sub(this=x.copy(), expression=r), expression=step)


def cell_key(cells: Cells, i: int, argument: exp.Expr | None) -> exp.Expr:
    """``SUM(rkey) % 2^32`` over the records behind aggregate i (as :mod:`sqlsdc.rewrite.ckm`)."""
    return records_key(cells.plan, argument, cells.plan.aggregates[i].argument)


def at_least_in(column: str, k: int) -> exp.Expr:
    return exp.GTE(this=exp.column(column, AGGREGATION), expression=exp.Literal.number(k))

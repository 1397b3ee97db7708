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
query cannot average the rounding away. Counts of rows and of units toss the cell key itself
(``COUNT(x)`` is ``COUNT(*)`` where x is never NULL, and a sum's n̂ is the count the query
shows); a distinct count of a dimension and a magnitude toss the coin of their own statistic,
the cell key (of a magnitude: of its non-zero rows, below) mixed with the statistic's salt
(:func:`sqlsdc.rewrite.ckm_mix.statistic_key_sql`, ``distinct:persons.age``,
``sum:persons.income``), as the cell key method keys their noise.
With one coin for all (a magnitude's was the key rotated by 16 bits), a statistic whose true
value the analyst knows told the coin of the others: group presence tells how many distinct
ages a cell has, so its rounded ``COUNT(DISTINCT age)`` said whether u < (d mod 5)/5, and
three such counts put the coin of the cell's ``COUNT(*)`` in a fifth of [0, 1), unbiased
rounding become rounding with a known threshold (red team s39a: the candidates of 176 of 201
counts narrowed from up to 9 to at most 5, the true one always among them).
The comparisons are integer arithmetic on the key (``u < 1/2`` is ``key < 2^31``, ``u < r/B``
is ``key·B < r·2^32``): no floating point decides the rounding of a count (nor of a sum
beside exact counts; the mean-before-sum value of a sum is a rational, below).

Cells of fewer than ``min_frequency`` units are suppressed, as with the threshold rule
(:mod:`sqlsdc.rewrite.threshold`). Rounding alone does not protect small cells of magnitudes (a
sum over one business rounded to base 5 is that business's value within 5), and for counts
Cox & Kim's own disclosure rule (§5.2) names the values below B as the confidential ones, which
rounding only blurs; keeping the frequency rule makes ``round`` at least as safe as
``threshold``, with ``min_frequency: 1`` for plain rounding.

Counts are rounded as they are. A magnitude is rounded *mean before sum* (Geyer, Tent, Reiffert,
Giessing, PSD 2022, §6.1(c), "MBS", digest ``seed_2022_part1.md`` §6: the sum published as the
mean times the protected count, so that published sum over published count is the mean), with
the rounding applied after the adjustment: a cell of n contributors with exact sum S, whose
contributor count the counts' rule publishes as n̂, publishes ``R_B(S·n̂/n)``, the rounded
mean times the rounded count. Rounded by itself, a sum of values the query pins (``SUM(age)
WHERE age = 94``, a measure at a class break) would be v·n rounded to B, which for v near or
above B tells n exactly where the counts are rounded to blur it (red team s37d: 700, so 7
persons, where COUNT(*) showed 5); so it is ``R_B(v·n̂)``, a function of v and the published
count.

* n is the cell's contributors, its rows of non-zero value ``COUNT(NULLIF(x, 0))`` (on a join
  the rows, as under CKM, not the units of another table), and n̂ that count as published: the
  same rows, cell key, base and rule, what ``COUNT(*) ... WHERE x <> 0`` shows. The sum's coin
  is the cell key of the same rows, mixed with its salt. A row of value 0 adds nothing to S
  and is no contributor (cellKey's ``use_zero_rkeys = FALSE``, as :mod:`sqlsdc.rewrite.ckm`):
  keyed and counted by every non-NULL row, one exact sum would draw a new coin and a new n̂/n
  for every set of zeros a query left out (``AND NOT (income = 0 AND age IN (...))``), and
  under ``unbiased`` rounding the share of its upper multiples would estimate r/B (200 such
  queries of region R01's income: 0.980 for r/B = 0.963, their mean within 2 of S with exact
  counts). Zeros change nothing the sum publishes, also ``SUM(age) WHERE (M AND age = 94) OR age =
  0`` (red team s38e): n, n̂ and the coin are those of the persons aged 94, and the sum is
  ``R_B(94·n̂)``. Rows of a small known non-zero value (``OR age = 1``) still dilute the mean
  and leave S within about B/2 of 94·k + m, m known within the counts' base: k told (open,
  strict xfail there). The frequency rule counts the same contributors, per unit
  (:func:`~sqlsdc.rewrite.cells.frequency_count`): zeros lift no small cell over it, and a cell
  of zeros only is suppressed.
* The mean's base is B/n̂: ``R_B(m·n̂)/n̂`` is the mean m rounded to a multiple of B/n̂, so the
  sum stays a multiple of B within B of ``m·n̂``. A base of its own for the mean would either
  round the sum by n̂ times it (a mean age rounded to 100 is 0) or leave sums that are not
  multiples of B.
* The sum carries the count's rounding, ``m·(n̂ − n)``, as under CKM (up to m·b/2 for
  conventional counts of base b); with unbiased rules for both it is unbiased (E[n̂] = n, and
  the sum's coin is independent of the count's). A cell whose contributors' count is published
  as 0 has sum 0 (n = 0, a cell of zeros only, is suppressed by the frequency rule). Negative
  sums round like positive ones (floor and remainder, not truncation).
* Margins (ROLLUP, CUBE, totals) are their own cells, rounded from their own mean and count:
  per-cell rounding is not additive, and a margin may differ from the sum of its
  published cells by more than the base. Controlled rounding (``sqlsdc protect --method
  round``, :func:`sqlsdc.tabular.controlled_round`) keeps margins additive and does not share
  this code.
* Where the counts are not rounded (the threshold rule publishes the exact count), n̂ = n and
  the sum is ``R_B(S)``. Beside CKM counts the planner refuses a rounded magnitude
  (:data:`sqlsdc.planner.plan._COUNTS_REVEALED_BY`: there is no rounded count, and a rounded
  pinned sum would tell the count the noise hides); DP and suppressed counts admit no rounded
  magnitudes at all. Joined tables whose counts follow different rules are refused here.

An AVG is the published sum over the published ``COUNT(x)``, ``R_B(S·n̂/n)/ĉ`` with ĉ the
count of every non-NULL row, zeros included, rounded with its own cell key (NULL when ĉ is 0),
exactly ``SUM(x) / COUNT(x)`` of the published values (zeros change it only through ĉ, as
under CKM): rounded by itself to the base, it would be so much finer than the sum that
SUM(x)/AVG(x) gave the exact number of contributors (red team s37d: 116 where COUNT showed
120); so that ratio is the published count.

The sum's value ``S·n̂/n`` is a rational: it is computed in DOUBLE (``CAST(S AS DOUBLE) · n̂ /
n``; exact when the mean is pinned and ``S·n̂`` is an integer below 2^53, as the quotient v·n̂
is then representable), rounded with floor and remainder, and published as ``(q + up)·B``
with q an integer, so that its digits are those of a multiple of B and never the low bits of
the quotient. Only an up/down choice within a DOUBLE's precision of its boundary can differ
from exact arithmetic. The sum keeps its type: q is cast to HUGEINT for a sum of integers or
decimals (below 2^63 times the rows, far from overflowing), and stays DOUBLE for a sum of
floating-point values, whose magnitude (up to 1e140 a value, :mod:`sqlsdc.guard.summable`)
would make a cast fail for some data only, an error that would tell it.

The frame has two layers: the aggregation ``__c`` (keys, exact values ``__a<i>``, unit counts
``__n<i>``, cell keys ``__k<i>``) and ``__cells`` over it, which carries only keys, unit counts
and the rounded values ``__y<i>`` (and, where the groups are data, the group's count for the
frequency rule, :func:`~sqlsdc.rewrite.threshold.group_condition`); exact values and cell keys
never reach the outer query.
With rounded counts a rounded magnitude adds its contributors ``__r<i>`` to the aggregation
(an AVG also its rows ``__ra<i>`` and their key ``__ka<i>``), and a layer ``__d`` between the
two adds their rounded counts n̂ as ``__d<i>`` and ĉ as ``__da<i>``; with exact counts an AVG
adds ``__ra<i>``.
"""

from __future__ import annotations

import re

from sqlglot import exp

from sqlsdc.catalog.ptables import KEY_MODULUS
from sqlsdc.errors import PolicyViolation
from sqlsdc.planner.normal_form import STATISTIC, SUMMED
from sqlsdc.policy import AggregateKind, Method, Policy, ProtectionRule, Rounding
from sqlsdc.rewrite.cells import (
    CELLS,
    Cells,
    Frame,
    FrameBuilder,
    frequency_count,
    inner_select,
    nonzero,
)
from sqlsdc.rewrite.ckm import statistic
from sqlsdc.rewrite.ckm_mix import join_mix, statistic_key_sql
from sqlsdc.rewrite.counted_units import counted_units_key, join_unit_keys, unit_lookups
from sqlsdc.rewrite.dominance import add_contributions, largest_needed, rules
from sqlsdc.rewrite.sql import cast, number
from sqlsdc.rewrite.threshold import (
    add_keys,
    at_least,
    group_condition,
    records_key,
    without_dominance,
)

MECHANISM = "round"
AGGREGATION = "__c"
COUNTED = "__d"  # the aggregation and the rounded contributor counts of its magnitudes
HALF = KEY_MODULUS // 2  # u < 1/2  <=>  key < 2^31
# what stays in the aggregation: exact values, cell keys and rows summed of the aggregates
# (the group's count ``__n`` goes on, for the group guard)
EXACT = re.compile(r"__[akrt]\d+|__[rk]a\d+|__x\d+_\d+|__gid")  # and the contributions (dominance)


def round_frame(policy: Policy) -> FrameBuilder:
    """The frame builder for aggregations whose aggregates are rounded, bound to the policy
    (whose counts' rule rounds the contributor count of a magnitude)."""

    def build(cells: Cells, twin: dict[int, exp.Expr]) -> Frame:
        return _frame(cells, twin, policy)

    return build


def _frame(cells: Cells, twin: dict[int, exp.Expr], policy: Policy) -> Frame:
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
    magnitudes = [
        i
        for i, spec in enumerate(plan.aggregates)
        if spec.rule.method is Method.ROUND and spec.kind is AggregateKind.MAGNITUDES
    ]
    count_rule = contributor_count_rule(policy, cells) if magnitudes else None
    inner = inner_select(cells)
    add_keys(inner, cells)
    arguments = [cells.argument(i, twin) for i in range(len(cells.aggregates))]
    lookups = unit_lookups(plan, arguments, Method.ROUND)
    looked_up = join_unit_keys(inner, plan, arguments, lookups)
    for i, aggregate in enumerate(cells.aggregates):
        argument = arguments[i]
        if i in magnitudes and isinstance(aggregate, exp.Avg):  # the sum, published over n̂
            aggregate = exp.Sum(this=aggregate.this.copy())
        inner.append("expressions", exp.alias_(aggregate.copy(), f"__a{i}"))
        counted = frequency_count(plan.aggregates[i], argument, plan.units)
        inner.append("expressions", exp.alias_(counted, f"__n{i}"))
        if i in magnitudes:
            add_contributor_counts(inner, cells, i, aggregate, argument, count_rule is not None)
        if i in lookups:  # a distinct count of units: their own keys (counted_units)
            key = counted_units_key(looked_up[lookups[i]])
            inner.append("expressions", exp.alias_(key, f"__k{i}"))
        elif plan.aggregates[i].rule.method is Method.ROUND:
            contributing = nonzero(argument) if i in magnitudes else argument
            inner.append("expressions", exp.alias_(cell_key(cells, i, contributing), f"__k{i}"))
    group = group_condition(inner, cells)
    inner = add_contributions(inner, cells, twin)
    source, table = inner.subquery(AGGREGATION, copy=False), AGGREGATION
    if magnitudes and count_rule is not None:
        means = {i for i in magnitudes if isinstance(plan.aggregates[i].node, exp.Avg)}
        source, table = with_rounded_counts(source, magnitudes, count_rule, means), COUNTED
    outer = exp.Select(
        expressions=[
            exp.alias_(exp.column(p.alias, table), p.alias)
            for p in inner.expressions
            if not EXACT.fullmatch(p.alias)
        ]
    )
    outer.set("from_", exp.From(this=source))
    if any(own_coin(spec) for spec in plan.aggregates):
        join_mix(outer)
    for i, spec in enumerate(plan.aggregates):
        exact = exp.column(f"__a{i}", table)
        if i in magnitudes:
            shape = (count_rule is not None, isinstance(spec.node, exp.Avg), integral(spec))
            exact = mean_before_sum(table, i, spec.rule, coin(table, i, spec), *shape)
        elif spec.rule.method is Method.ROUND:
            key = coin(table, i, spec)
            exact = rounded(exact, key, spec.rule.base, spec.rule.rounding)
        counted = exp.GTE(this=exp.column(f"__n{i}", table), expression=number(spec.min_frequency))
        shown = without_dominance(counted, spec, i, table)
        published = exp.Case(ifs=[exp.If(this=shown, true=exact)])
        outer.append("expressions", exp.alias_(published, f"__y{i}"))
        if shown is not counted:  # the dominance rule's verdict, for the status
            outer.append("expressions", exp.alias_(shown.copy(), f"__p{i}"))

    def value(i: int) -> exp.Expr:
        return exp.column(f"__y{i}", CELLS)

    def published(i: int) -> exp.Expr:
        if i in magnitudes and isinstance(plan.aggregates[i].node, exp.Avg):
            return exp.Not(this=exp.Is(this=value(i), expression=exp.null()))  # n̂ may be 0
        if largest_needed(rules(plan.aggregates[i])):
            return exp.column(f"__p{i}", CELLS)
        return at_least(f"__n{i}", plan.aggregates[i].min_frequency)

    return Frame(outer.subquery(CELLS, copy=False), value, published, group)


def contributor_count_rule(policy: Policy, cells: Cells) -> ProtectionRule | None:
    """The rule by which the counts of the aggregation's tables are published: a ``round``
    rule, whose rounding of a magnitude's contributor count is its n̂, or None where the counts
    are exact (the threshold rule: n̂ = n). Counts of other methods (CKM) are refused earlier
    (:data:`sqlsdc.planner.plan._COUNTS_REVEALED_BY`); joined tables whose counts differ in
    rule have no one published count of the sum's contributors, and are refused here."""
    rules = [policy.table(t).rule(AggregateKind.COUNTS) for t in cells.plan.tables]
    if len({(r.method, r.base, r.rounding) for r in rules}) == 1:
        rule = rules[0]
        if rule.method is Method.ROUND:
            return rule
        if rule.method is Method.THRESHOLD:
            return None
    raise PolicyViolation(
        "a rounded sum or average is published as its rounded mean times its contributors' "
        "published count, and the counts of "
        + ", ".join(sorted(set(cells.plan.tables)))
        + " are not all rounded (or all exact) by one rule",
        "aggregate each table on its own, or give their counts the same rounding rule",
        cells.select.sql("duckdb"),
    )


def add_contributor_counts(
    inner: exp.Select,
    cells: Cells,
    i: int,
    aggregate: exp.Expr,
    argument: exp.Expr | None,
    rounded_count: bool,
) -> None:
    """The counts magnitude i's mean before sum and mean divide by, in the aggregation: with
    rounded counts ``__r<i>``, its contributors n, the rows of non-zero value (``COUNT(NULLIF(x,
    0))``; on a join the rows, not the units of another table: the units of ``__n<i>`` are for
    the frequency rule); for an AVG ``__ra<i>``, every row of a value (``COUNT(x)``), and with
    rounded counts its cell key ``__ka<i>``, the key ``COUNT(x)`` is rounded with."""
    this = aggregate.this
    if rounded_count:
        contributors = (
            exp.Distinct(expressions=[nonzero(e) for e in this.expressions])
            if isinstance(this, exp.Distinct)
            else nonzero(this)
        )
        inner.append("expressions", exp.alias_(exp.Count(this=contributors), f"__r{i}"))
    if isinstance(cells.plan.aggregates[i].node, exp.Avg):
        inner.append("expressions", exp.alias_(exp.Count(this=this.copy()), f"__ra{i}"))
        if rounded_count:
            key = cell_key(cells, i, argument)
            inner.append("expressions", exp.alias_(key, f"__ka{i}"))


def with_rounded_counts(
    aggregation: exp.Subquery, magnitudes: list[int], rule, means: set[int]
) -> exp.Subquery:
    """The layer ``__d`` over the aggregation: its columns and, for each rounded magnitude i,
    ``__d<i>``: its contributors ``__r<i>`` rounded as the counts' ``rule`` rounds them, with
    their key ``__k<i>`` (unmixed): n̂, what ``COUNT(*) ... WHERE x <> 0`` publishes; for the
    ``means``, ``__da<i>``: every row of a value ``__ra<i>`` rounded with its key ``__ka<i>``,
    what ``COUNT(x)`` publishes."""
    layer = exp.Select(
        expressions=[
            exp.alias_(exp.column(p.alias, AGGREGATION), p.alias)
            for p in aggregation.this.expressions
        ]
    )
    for i in magnitudes:
        for suffix in ("", "a") if i in means else ("",):
            n = exp.column(f"__r{suffix}{i}", AGGREGATION)
            key = exp.column(f"__k{suffix}{i}", AGGREGATION)
            count = rounded(n, key, rule.base, rule.rounding)
            layer.append("expressions", exp.alias_(count, f"__d{suffix}{i}"))
    layer.set("from_", exp.From(this=aggregation))
    return layer.subquery(COUNTED, copy=False)


def own_coin(spec) -> bool:
    """A rounded statistic that tosses a coin of its own, not its records' cell key: a magnitude
    whose rule draws one (conventional rounding draws none), or a distinct count of a dimension
    (not of units): the statistics the cell key method keys apart (``_own_statistic`` there)."""
    if spec.rule.method is not Method.ROUND:
        return False
    if spec.kind is AggregateKind.MAGNITUDES:
        return spec.rule.rounding is not Rounding.CONVENTIONAL
    return isinstance(spec.node.this, exp.Distinct) and STATISTIC in spec.node.meta


def coin(table: str, i: int, spec) -> exp.Expr:
    """The key aggregate i tosses, in [0, 2^32): its cell key ``__k<i>``, mixed with the
    statistic's salt where it has a coin of its own (:func:`own_coin`; over a select that joins
    the mix), in parentheses: the rules multiply it."""
    key = exp.column(f"__k{i}", table)
    return exp.Paren(this=statistic_key_sql(key, statistic(spec))) if own_coin(spec) else key


def integral(spec) -> bool:
    """Whether a magnitude adds up integers or decimals: the planner marks the sums of
    floating-point (or untyped) values with the columns they add (``SUMMED``)."""
    return SUMMED not in spec.node.meta


def mean_before_sum(
    table: str,
    i: int,
    rule: ProtectionRule,
    key: exp.Expr,
    rounded_count: bool,
    mean: bool,
    whole: bool,
) -> exp.Expr:
    """``R_B(S·n̂/n)`` of aggregate i, the rounded mean of its contributors times their rounded
    count ``__d<i>``, its coin ``key`` (the statistic's own, :func:`coin`); n is ``__r<i>``, the
    rows of non-zero value (n = 0 only where S = 0 and n̂ = 0: divided by 1, not 0); ``whole``:
    S is a sum of integers or decimals. Without ``rounded_count`` the counts are exact: n̂ = n
    and the sum is ``R_B(S)``. An AVG is the sum over the published ``COUNT(x)``: ``__da<i>``
    rounded, ``__ra<i>`` exact (NULL where it is 0)."""
    total = exp.column(f"__a{i}", table)
    if rounded_count:
        n = exp.Coalesce(this=nonzero(exp.column(f"__r{i}", table)), expressions=[number(1)])
        scaled = exp.Mul(this=cast(total, "DOUBLE"), expression=exp.column(f"__d{i}", table))
        x = exp.Div(this=scaled, expression=n)
        value = rounded_rational(x, key, rule.base, rule.rounding, whole)
    else:
        value = rounded(total, key, rule.base, rule.rounding)
    if not mean:
        return value
    count = exp.column(f"__da{i}" if rounded_count else f"__ra{i}", table)
    positive = exp.GT(this=count.copy(), expression=number(0))
    quotient = exp.Div(this=exp.Paren(this=value), expression=count)
    return exp.Case(ifs=[exp.If(this=positive, true=quotient)])


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
    step = exp.Case(ifs=[exp.If(this=up(r, key, base, rule), true=b.copy())], default=number(0))
    return exp.Add(this=exp.Sub(this=x.copy(), expression=r), expression=step)


def rounded_rational(x: exp.Expr, key: exp.Expr, base: int, rule: Rounding, whole: bool):
    """``(q + up)·base`` for a DOUBLE x, with ``q = FLOOR(x / base)`` (cast to HUGEINT when
    ``whole``) and ``r = x - q·base``: the published value is a multiple of the base whatever
    the bits of x (``x - r`` in DOUBLE would carry them: ``r + base`` drops low bits of r).

    Example:
        >>> x, key = exp.column("x"), exp.column("k")
        >>> sql = rounded_rational(x, key, 5, Rounding.CONVENTIONAL, True).sql("duckdb")
        >>> sql.split(" + CASE WHEN ")  # the multiple below (INT128 is HUGEINT), and the step
        ['(CAST(FLOOR(x / 5) AS INT128)', '2 * (x - FLOOR(x / 5) * 5) >= 5 THEN 1 ELSE 0 END) * 5']
    """
    b = exp.Literal.number(base)
    q = exp.Floor(this=exp.Div(this=x.copy(), expression=b))
    r = exp.Sub(this=x.copy(), expression=exp.Mul(this=q.copy(), expression=b.copy()))
    step = exp.Case(ifs=[exp.If(this=up(r, key, base, rule), true=number(1))], default=number(0))
    multiple = exp.Add(this=cast(q, "HUGEINT") if whole else q, expression=step)
    return exp.Mul(this=exp.Paren(this=multiple), expression=b.copy())


def up(r: exp.Expr, key: exp.Expr, base: int, rule: Rounding) -> exp.Expr:
    """Whether a value of remainder ``r`` in [0, base) rounds up, by Cox & Kim's ``rule``."""
    b = exp.Literal.number(base)
    twice_r = exp.Mul(this=exp.Literal.number(2), expression=exp.Paren(this=r.copy()))
    coin = exp.LT(this=key.copy(), expression=exp.Literal.number(HALF))  # u < 1/2
    if rule is Rounding.CONVENTIONAL:
        return exp.GTE(this=twice_r, expression=b.copy())
    if rule is Rounding.MODIFIED_CONVENTIONAL:
        half = exp.and_(exp.EQ(this=twice_r.copy(), expression=b.copy()), coin)
        return exp.or_(exp.GT(this=twice_r, expression=b.copy()), half)
    if rule is Rounding.ZERO_RESTRICTED:
        return exp.and_(exp.GT(this=r.copy(), expression=number(0)), coin)
    if rule is Rounding.UNBIASED:  # u < r/B  <=>  key·B < r·2^32
        return exp.LT(
            this=exp.Mul(this=key.copy(), expression=b.copy()),
            expression=exp.Mul(
                this=exp.Paren(this=r.copy()), expression=exp.Literal.number(KEY_MODULUS)
            ),
        )
    raise ValueError(f"unknown rounding rule {rule!r}; this is a bug")  # pragma: no cover


def cell_key(cells: Cells, i: int, argument: exp.Expr | None) -> exp.Expr:
    """``SUM(rkey) % 2^32`` over the records behind aggregate i (as :mod:`sqlsdc.rewrite.ckm`)."""
    return records_key(cells.plan, argument, cells.plan.aggregates[i].argument)

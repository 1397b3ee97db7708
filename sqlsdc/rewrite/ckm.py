"""The cell key method (CKM) as a rewrite: every cell gets deterministic noise from its records.

Sources: Geyer, Tent, Reiffert, Giessing, "Perspectives for tabular data protection – how about
synthetic data?", PSD 2022 (digest ``seed_2022_part1.md`` §6); the sdcTools reference
implementation (τ-ARGUS, R packages ``ptable`` and ``cellKey``).

Counts (``cellKey`` ``$perturb`` for count variables): the cell key is
``SUM(__rkey) % 2^32`` over the cell's units (each unit once when units repeat), the integer
form of ``(Σ rkey) mod 1``; the count n is published as ``n + v`` where v is the entry of ptable
row ``min(n, max_i)`` whose key interval [lo, hi) holds the cell key.

Magnitudes (``cellKey`` ``.perturb_cell_flex``, flex function ``ck_flexparams``): the noise is
built from the cell's ``top_k`` largest contributions x_j (by absolute value, found with the
aggregates ``MAX(ABS(x))`` and ``MAX(ABS(x), k)``), one after the other; step j looks up v in the
magnitude ptable at ``a = |x_j / x_delta_j|`` (interpolated between rows, capped at the last row)
with the j-th scrambled cell key and adds ``sign(x̂)·|x_delta_j|·sign(v)·(μ_c + |v|)``, never
flipping the sign of the running value. A magnitude's key is the cell key plus the salt of its
statistic (:func:`sqlsdc.mechanisms.ckm.statistic_salt`), so different statistics of the same
records get independent noise; so does a distinct count of a dimension.

AVG is the protected sum over the protected count, n being the rows summed (on a join, those of
:attr:`CellPlan.row_source`) and n̂ its CKM count. With mean-before-sum (Geyer et al., PSD 2022,
§6.1(c), "MBS") the published sum is ``x̂·n̂/n`` and the published mean ``x̂/n`` — equal to the
published sum over the published count; without it they are ``x̂`` and ``x̂/n̂``. The guard has
already reduced every argument to one stored column (:mod:`sqlsdc.planner.normal_form`), so the
scale of x is the data's, not the analyst's.

The frame is a chain of subqueries over the aggregated cells only:
``__r`` (rows: keys, arguments, record keys) → ``__c`` (aggregation) → ptable joins for
counts → one compute and one lookup layer per contributor j → ``__cells``. Everything is plain
SQL built as sqlglot AST, the same on DuckDB and Spark.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sqlglot import exp

from sqlsdc.catalog.ptables import KEY_MODULUS, PTableKey, PTableRef
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.ckm import statistic_salt
from sqlsdc.planner.normal_form import STATISTIC
from sqlsdc.planner.plan import ProtectedAggregate
from sqlsdc.policy import AggregateKind, MagnitudeCkm, Method, Policy
from sqlsdc.rewrite.cells import CELLS, Cells, Frame, unit_count, when_present
from sqlsdc.rewrite.threshold import at_least

MECHANISM = "ckm"
PTABLE_ENTRIES = exp.Table(this=exp.to_identifier("ptable_entries"), db=exp.to_identifier("sqlsdc"))
PREV = "__s"


def ckm_frame(policy: Policy, ptables: Mapping[PTableKey, PTableRef]):
    """The frame builder for aggregations with a CKM aggregate, bound to the stored ptables."""

    def build(cells: Cells, twin: dict[int, exp.Expr]) -> Frame:
        return _Builder(cells, twin, policy, ptables).frame()

    return build


def ptable_ref(ptables: Mapping[PTableKey, PTableRef], key: PTableKey) -> PTableRef:
    if key not in ptables:
        raise PolicyViolation(
            f"the perturbation table for {key[0]} {key[1].as_dict()} is not in the catalog",
            "apply the policy again (`sqlsdc policy apply`) to generate it",
            "",
        )
    return ptables[key]


class _Builder:
    def __init__(self, cells: Cells, twin, policy: Policy, ptables):
        self.cells, self.twin, self.ptables = cells, twin, ptables
        self.plan = cells.plan
        self.count_rule = policy.table(self.plan.tables[0]).rule(AggregateKind.COUNTS)
        self.layer = 0

    # -- rows and aggregation ------------------------------------------------------------------

    def frame(self) -> Frame:
        rows = self._rows()
        cells = self._aggregation(rows)
        current = self._count_layer(cells)
        top_k = max((self._magnitude(i).top_k for i in self._ckm_magnitudes()), default=0)
        for j in range(1, top_k + 1):
            current = self._magnitude_step(current, j)
        final = self._select_from(current)
        for i, spec in enumerate(self.plan.aggregates):
            final.append("expressions", exp.alias_(self._final_value(i, spec), f"__y{i}"))
            final.append("expressions", exp.alias_(self._final_fault(i, spec), f"__e{i}"))
        source = final.subquery(CELLS)
        group = self._group_condition()

        def value(i: int) -> exp.Expr:
            return exp.column(f"__y{i}", CELLS)

        def published(i: int) -> exp.Expr:
            return exp.Not(this=exp.Is(this=value(i), expression=exp.null()))

        def fault(i: int) -> exp.Expr:
            own = exp.column(f"__e{i}", CELLS)
            if self.count_rule.method is not Method.CKM:
                return own
            return exp.or_(own, exp.Is(this=exp.column("__cn", CELLS), expression=exp.null()))

        return Frame(source, value, published, group, fault)

    def _rows(self) -> exp.Select:
        cells, plan = self.cells, self.plan
        rows = exp.Select()
        for key in ("from_", "joins", "where"):
            value = cells.select.args.get(key)
            if value is not None:
                rows.set(
                    key, [v.copy() for v in value] if isinstance(value, list) else value.copy()
                )
        for i, key in enumerate(cells.keys):
            rows.append("expressions", exp.alias_(key.copy(), f"__g{i}"))
        for i in range(len(plan.aggregates)):
            argument = cells.argument(i, self.twin)
            if argument is not None and self._value(i) == f"__v{i}":
                rows.append("expressions", exp.alias_(argument.copy(), f"__v{i}"))
        for t, rkey in enumerate(plan.rkeys):
            rows.append("expressions", exp.alias_(rkey.copy(), f"__rk{t}"))
        for t, unit in enumerate(plan.units or []):
            rows.append("expressions", exp.alias_(unit.copy(), f"__u{t}"))
        return rows

    def _value(self, i: int) -> str:
        """The rows' column holding aggregate i's argument: one column per distinct argument,
        so that the engine computes the aggregates of SUM(x) and AVG(x) once."""
        arguments = [self.cells.argument(k, self.twin) for k in range(i + 1)]
        first = next(k for k, a in enumerate(arguments) if a == arguments[i])
        return f"__v{first}"

    def _aggregation(self, rows: exp.Select) -> exp.Select:
        cells, plan = self.cells, self.plan
        r = "__r"
        keys = {key: exp.column(f"__g{i}", r) for i, key in enumerate(cells.keys)}

        def remap(node: exp.Expr) -> exp.Expr:
            return node.transform(lambda n: keys[n].copy() if n in keys else n, copy=True)

        agg = exp.Select(expressions=[])
        agg.set("from_", exp.From(this=rows.subquery(r)))
        group = cells.select.args.get("group")
        if group is not None:
            agg.set("group", remap(group))
        for i in range(len(cells.keys)):
            agg.append("expressions", exp.alias_(exp.column(f"__g{i}", r), f"__g{i}"))
        for i, grouping in enumerate(cells.groupings):
            agg.append("expressions", exp.alias_(remap(grouping), f"__gg{i}"))
        units = [exp.column(f"__u{t}", r) for t in range(len(plan.units or []))]
        for i, spec in enumerate(plan.aggregates):
            argument = exp.column(self._value(i), r) if spec.argument is not None else None
            aggregate = cells.aggregates[i]
            method = spec.rule.method
            if method is Method.CKM and spec.kind is AggregateKind.MAGNITUDES:
                if isinstance(aggregate.this, exp.Distinct):
                    raise PolicyViolation(
                        "the cell key method does not perturb sums or averages of DISTINCT values",
                        "remove DISTINCT",
                        cells.select.sql("duckdb"),
                    )
                agg.append("expressions", exp.alias_(exp.Sum(this=argument), f"__a{i}"))
            else:
                agg.append("expressions", exp.alias_(self._rebuilt(aggregate, argument), f"__a{i}"))
            if method is not Method.CKM:
                counted = unit_count(argument, units if plan.units is not None else None)
                agg.append("expressions", exp.alias_(counted, f"__n{i}"))
            elif spec.kind is AggregateKind.MAGNITUDES:  # a CKM count's n is __a
                counted = unit_count(argument, self._summed_units(i, units))
                agg.append("expressions", exp.alias_(counted, f"__n{i}"))
            if method is Method.CKM:
                key = self._cell_key(argument, spec)
                agg.append("expressions", exp.alias_(key, f"__k{i}"))
            if method is Method.CKM and spec.kind is AggregateKind.MAGNITUDES:
                for j in range(1, self._magnitude(i).top_k + 1):
                    agg.append("expressions", exp.alias_(self._top(i, j), f"__x{i}_{j}"))
        agg.append("expressions", exp.alias_(unit_count(None, units or None), "__n"))
        if self.count_rule.method is Method.CKM:
            agg.append("expressions", exp.alias_(self._cell_key(None, None), "__kn"))
        return agg

    def _summed_units(self, i: int, units: list[exp.Expr]) -> list[exp.Expr] | None:
        """The units whose rows a magnitude sums: its contributor count n, the denominator of
        AVG and of the mean-before-sum adjustment, must count the rows summed, not the units of
        another table of the join (``AVG(p.income)`` over persons ⋈ households divides by the
        persons). None: every row is its own unit. Those are the rows of the table the join's
        rows are (:attr:`CellPlan.row_source`), else of the one table the argument reads."""
        plan = self.plan
        if plan.units is None:
            return None
        if plan.row_source is not None:
            return [units[plan.row_source]]
        table = statistic(plan.aggregates[i]).split(":", 1)[1].split(".", 1)[0]
        positions = [t for t, name in enumerate(plan.tables) if name == table]
        if len(positions) != 1:
            raise PolicyViolation(
                "the cell key method cannot tell whose rows this sum or average adds up "
                f"({self.cells.aggregates[i].sql('duckdb')})",
                "join the other tables many-to-one onto their keys (e.g. persons p JOIN "
                "households h ON p.household_id = h.household_id)",
                self.cells.select.sql("duckdb"),
            )
        return [units[positions[0]]]

    @staticmethod
    def _rebuilt(aggregate: exp.AggFunc, argument: exp.Expr | None) -> exp.AggFunc:
        rebuilt = aggregate.copy()
        if argument is None:
            return rebuilt
        if isinstance(rebuilt.this, exp.Distinct):
            rebuilt.set("this", exp.Distinct(expressions=[argument]))
        else:
            rebuilt.set("this", argument)
        return rebuilt

    def _cell_key(self, argument: exp.Expr | None, aggregate=None) -> exp.Expr:
        """``SUM(rkey) % 2^32`` over the records counted: the rows of a single table, of the
        table whose rows the join's rows are (:attr:`CellPlan.row_source`), or the distinct
        units of the counted unit (``COUNT(DISTINCT unit)``) or, failing those, of every table.
        The same records give the same key, whichever tables the query joins to them.
        ``aggregate`` is the plan's aggregate (None: the group's count of units)."""
        plan = self.plan
        spec_argument = aggregate.argument if aggregate is not None else None
        rkeys = [exp.column(f"__rk{t}", "__r") for t in range(len(plan.rkeys))]
        counted = [t for t, unit in enumerate(plan.units or []) if unit == spec_argument]
        if plan.units is None:
            total = exp.Sum(this=when_present(rkeys[0], argument))
        elif not counted and plan.row_source is not None:
            total = exp.Sum(this=when_present(rkeys[plan.row_source], argument))
        else:
            parts = [
                exp.Coalesce(
                    this=exp.Sum(this=exp.Distinct(expressions=[when_present(rkeys[t], argument)])),
                    expressions=[exp.Literal.number(0)],
                )
                for t in counted or range(len(rkeys))
            ]
            total = parts[0]
            for part in parts[1:]:
                total = exp.Add(this=total, expression=part)
        total = exp.Coalesce(this=total, expressions=[exp.Literal.number(0)])
        if (
            aggregate is not None
            and isinstance(aggregate.node.this, exp.Distinct)
            and STATISTIC in aggregate.node.meta
        ):
            total = exp.Add(this=total, expression=_number(statistic_salt(statistic(aggregate))))
        return exp.Mod(this=exp.Paren(this=total), expression=exp.Literal.number(KEY_MODULUS))

    def _top(self, i: int, j: int) -> exp.Expr:
        """The j-th largest contribution (by absolute value) of the cell, NULL if there is none.

        Only |x_j| enters the perturbation (the sign cancels in x_j / x_delta and only
        |x_delta| is added), so x_1 is ``MAX(ABS(x))`` and x_j is element j of the top-k list
        aggregate ``MAX(ABS(x), k)`` (ties kept, NULLs ignored): one aggregate per cell in every
        grouping set, no sort of the rows."""
        value = exp.Abs(this=exp.column(self._value(i), "__r"))
        if j == 1:
            return exp.Max(this=value)
        top = exp.Max(this=value, count=exp.Literal.number(self._magnitude(i).top_k))
        return exp.Bracket(this=top, expressions=[exp.Literal.number(j)], offset=1, safe=True)

    # -- noise layers --------------------------------------------------------------------------

    def _select_from(self, previous: exp.Select) -> exp.Select:
        select = exp.Select(
            expressions=[exp.Column(this=exp.Star(), table=exp.to_identifier(PREV))]
        )
        select.set("from_", exp.From(this=previous.subquery(PREV)))
        return select

    def _join_ptable(self, select: exp.Select, alias: str, ptable: PTableRef, row, key, kind):
        """LEFT JOIN the ptable entry of row ``row`` whose key interval holds ``key``."""
        p = lambda column: exp.column(column, alias)  # noqa: E731
        condition = exp.and_(
            exp.EQ(this=p("ptable_id"), expression=exp.Literal.number(ptable.ptable_id)),
            exp.EQ(this=p("type"), expression=kind),
            exp.EQ(this=p("i"), expression=row),
            exp.LTE(this=p("lo"), expression=key),
            exp.GT(this=p("hi"), expression=key.copy()),
        )
        select.append(
            "joins",
            exp.Join(this=PTABLE_ENTRIES.copy().as_(alias), side="LEFT", on=condition),
        )

    def _count_layer(self, previous: exp.Select) -> exp.Select:
        """Perturbed counts ``__y<i>``, for magnitudes the protected contributor count, and the
        protected count of the group's units ``__cn`` that decides whether the group appears."""
        select = self._select_from(previous)
        prev = lambda c: exp.column(c, PREV)  # noqa: E731
        reused = self._count_of_units()
        if reused is not None:
            noise = exp.cast(exp.column("v", f"__pc{reused}"), "BIGINT")
            protected = exp.Add(this=prev(f"__a{reused}"), expression=noise)
            select.append("expressions", exp.alias_(protected, "__cn"))
        elif self.count_rule.method is Method.CKM:
            ptable = ptable_ref(self.ptables, ("counts", self.count_rule.ptable))
            row = exp.Least(this=prev("__n"), expressions=[_number(ptable.max_i)])
            kind = exp.Literal.string("all")
            self._join_ptable(select, "__pcn", ptable, row, prev("__kn"), kind)
            noise = exp.cast(exp.column("v", "__pcn"), "BIGINT")
            protected = exp.Add(this=prev("__n"), expression=noise)
            select.append("expressions", exp.alias_(protected, "__cn"))
        for i, spec in enumerate(self.plan.aggregates):
            if spec.rule.method is not Method.CKM:
                continue
            rule = spec.rule if spec.kind is AggregateKind.COUNTS else self.count_rule
            count = prev(f"__a{i}") if spec.kind is AggregateKind.COUNTS else prev(f"__n{i}")
            faults = []
            if rule.method is Method.CKM:
                ptable = ptable_ref(self.ptables, ("counts", rule.ptable))
                alias = f"__pc{i}"
                row = exp.Least(this=count, expressions=[_number(ptable.max_i)])
                self._join_ptable(
                    select, alias, ptable, row, prev(f"__k{i}"), exp.Literal.string("all")
                )
                noise = exp.cast(exp.column("v", alias), "BIGINT")
                protected = exp.Add(this=count.copy(), expression=noise)
                faults.append(_missing(alias))
            else:
                protected = exp.Case(
                    ifs=[exp.If(this=at_least_column(count, rule.min_frequency), true=count.copy())]
                )
            name = f"__c{i}" if spec.kind is AggregateKind.COUNTS else f"__m{i}"
            select.append("expressions", exp.alias_(protected, name))
            if spec.kind is AggregateKind.MAGNITUDES:
                start = exp.cast(prev(f"__a{i}"), "DOUBLE")
                select.append("expressions", exp.alias_(start, f"__o{i}_0"))
                salted = exp.Mod(
                    this=exp.Paren(
                        this=exp.Add(
                            this=prev(f"__k{i}"),
                            expression=_number(statistic_salt(statistic(spec))),
                        )
                    ),
                    expression=_number(KEY_MODULUS),
                )
                select.append("expressions", exp.alias_(salted, f"__q{i}"))
            select.append("expressions", exp.alias_(_any(faults), f"__e{i}_0"))
        return select

    def _magnitude_step(self, previous: exp.Select, j: int) -> exp.Select:
        """Contributor j: x_delta, the lookup position, the lookup, the added noise; one layer
        each, so that no expression is repeated inside another."""
        prev = lambda c: exp.column(c, PREV)  # noqa: E731
        steps = [i for i in self._ckm_magnitudes() if j <= self._magnitude(i).top_k]
        ratio = self._select_from(previous)
        for i in steps:
            m = self._magnitude(i)
            f2 = exp.Div(
                this=_number(2 * m.fp),
                expression=exp.Paren(
                    this=exp.Add(this=_number(m.fp), expression=exp.Abs(this=prev(f"__x{i}_{j}")))
                ),
            )
            ratio.append("expressions", exp.alias_(f2, f"__f{i}_{j}"))
        amplitude = self._select_from(ratio)
        for i in steps:
            m = self._magnitude(i)
            zs = _separation_point(m, self._small(m))
            x = prev(f"__x{i}_{j}")
            ax = exp.Abs(this=x)
            normal = exp.Case(
                ifs=[
                    exp.If(this=_lt(ax, zs), true=_number(1)),
                    exp.If(this=_lt(ax.copy(), m.fp), true=_mul(x, m.p_small)),
                ],
                default=exp.Mul(this=x.copy(), expression=_flex(ax.copy(), prev(f"__f{i}_{j}"), m)),
            )
            amplitude.append("expressions", exp.alias_(normal, f"__xd{i}_{j}"))
        rescaled = self._select_from(amplitude)
        for i in steps:
            m = self._magnitude(i)
            rescale = exp.LT(
                this=exp.Abs(this=prev(f"__o{i}_{j - 1}")),
                expression=exp.Abs(this=prev(f"__xd{i}_{j}")),
            )
            rescaled.append("expressions", exp.alias_(rescale, f"__rs{i}_{j}"))
            xj = exp.Case(
                ifs=[
                    exp.If(
                        this=rescale.copy(),
                        true=_div(prev(f"__o{i}_{j - 1}"), m.p_small * m.epsilon[j - 1]),
                    )
                ],
                default=prev(f"__x{i}_{j}"),
            )
            rescaled.append("expressions", exp.alias_(xj, f"__xj{i}_{j}"))
        compute = self._select_from(rescaled)
        for i in steps:
            m = self._magnitude(i)
            zs = _separation_point(m, self._small(m))
            rescale, xo = prev(f"__rs{i}_{j}"), prev(f"__o{i}_{j - 1}")
            small_x = _lt(exp.Abs(this=prev(f"__xj{i}_{j}")), zs)
            delta = exp.Case(
                ifs=[
                    exp.If(
                        this=rescale,
                        true=exp.Case(ifs=[exp.If(this=small_x, true=_number(1))], default=xo),
                    )
                ],
                default=prev(f"__xd{i}_{j}"),
            )
            uses_small = exp.Case(
                ifs=[exp.If(this=rescale.copy(), true=small_x.copy())],
                default=_lt(exp.Abs(this=prev(f"__x{i}_{j}")), zs),
            )
            zero = exp.and_(rescale.copy(), small_x.copy()) if j > 1 else exp.false()
            for name, value in (
                (f"__d{i}_{j}", delta),
                (f"__sm{i}_{j}", uses_small),
                (f"__z{i}_{j}", zero),
            ):
                compute.append("expressions", exp.alias_(value, name))
        position = self._select_from(compute)
        for i in steps:
            main, small = self._tables(i)
            cap = exp.Case(
                ifs=[exp.If(this=prev(f"__sm{i}_{j}"), true=_number(small.max_i if small else 0))],
                default=_number(main.max_i),
            )
            delta = prev(f"__d{i}_{j}")
            ratio = exp.Case(
                ifs=[exp.If(this=exp.EQ(this=delta, expression=_number(0)), true=_number(0))],
                default=exp.Abs(this=exp.Div(this=prev(f"__xj{i}_{j}"), expression=delta.copy())),
            )
            a = exp.Least(this=ratio, expressions=[cap], ignore_nulls=True)
            position.append("expressions", exp.alias_(a, f"__pa{i}_{j}"))
        rows = self._select_from(position)
        for i in steps:
            main, small = self._tables(i)
            a = prev(f"__pa{i}_{j}")
            for name, pick in (("__pl", _class_below), ("__ph", _class_above)):
                row = pick(a, main.classes)
                if small is not None:
                    row = exp.Case(
                        ifs=[exp.If(this=prev(f"__sm{i}_{j}"), true=pick(a, small.classes))],
                        default=row,
                    )
                rows.append("expressions", exp.alias_(row, f"{name}{i}_{j}"))
        lookup = self._select_from(rows)
        for i in self._ckm_magnitudes():
            m = self._magnitude(i)
            if j > m.top_k:
                lookup.append("expressions", exp.alias_(prev(f"__o{i}_{j - 1}"), f"__o{i}_{j}"))
                lookup.append("expressions", exp.alias_(prev(f"__e{i}_{j - 1}"), f"__e{i}_{j}"))
                continue
            v, fault = self._lookup(lookup, i, j, m)
            lookup.append("expressions", exp.alias_(v, f"__pv{i}_{j}"))
            lookup.append("expressions", exp.alias_(fault, f"__e{i}_{j}"))
        add = self._select_from(lookup)
        for i in self._ckm_magnitudes():
            if j <= self._magnitude(i).top_k:
                running = self._add_noise(i, j, self._magnitude(i))
                add.append("expressions", exp.alias_(running, f"__o{i}_{j}"))
        return add

    def _lookup(self, select: exp.Select, i: int, j: int, m: MagnitudeCkm):
        """Join the two ptable rows around ``a``; return (interpolated v, fault so far)."""
        prev = lambda c: exp.column(c, PREV)  # noqa: E731
        rule = self.plan.aggregates[i].rule
        main, small = self._tables(i)
        uses_small = prev(f"__sm{i}_{j}")
        ptable_id = exp.Case(
            ifs=[exp.If(this=uses_small, true=_number(small.ptable_id if small else -1))],
            default=_number(main.ptable_id),
        )
        if rule.ptable.parity:
            odd = exp.EQ(
                this=exp.Mod(this=prev(f"__n{i}"), expression=_number(2)), expression=_number(1)
            )
            kind = exp.Case(
                ifs=[exp.If(this=odd, true=exp.Literal.string("odd"))],
                default=exp.Literal.string("even"),
            )
        else:
            kind = exp.Literal.string("all")
        kind = exp.Case(
            ifs=[exp.If(this=uses_small.copy(), true=exp.Literal.string("all"))], default=kind
        )
        a, low_row, high_row = prev(f"__pa{i}_{j}"), prev(f"__pl{i}_{j}"), prev(f"__ph{i}_{j}")
        key = _scrambled(prev(f"__q{i}"), j - 1 + (0 if m.same_key else 1))
        values = []
        for suffix, row in (("lo", low_row), ("hi", high_row)):
            alias = f"__pm{i}_{j}{suffix}"
            condition = exp.and_(
                exp.EQ(this=exp.column("ptable_id", alias), expression=ptable_id.copy()),
                exp.EQ(this=exp.column("type", alias), expression=kind.copy()),
                exp.EQ(this=exp.column("i", alias), expression=row),
                exp.LTE(this=exp.column("lo", alias), expression=key.copy()),
                exp.GT(this=exp.column("hi", alias), expression=key.copy()),
            )
            select.append(
                "joins", exp.Join(this=PTABLE_ENTRIES.copy().as_(alias), side="LEFT", on=condition)
            )
            values.append(exp.column("v", alias))
        spread = exp.Sub(this=high_row.copy(), expression=low_row.copy())
        weight = exp.Case(
            ifs=[
                exp.If(
                    this=exp.GT(this=spread, expression=_number(0)),
                    true=exp.Div(
                        this=exp.Paren(this=exp.Sub(this=a.copy(), expression=low_row.copy())),
                        expression=exp.Paren(this=spread.copy()),
                    ),
                )
            ],
            default=_number(0),
        )
        v = exp.Add(
            this=_mul_expr(exp.Sub(this=_number(1), expression=weight), values[0]),
            expression=_mul_expr(weight.copy(), values[1]),
        )
        v = exp.Add(this=v, expression=self._spread(key, f"__pm{i}_{j}lo", uses_small, rule, m))
        skip = exp.or_(exp.Is(this=prev(f"__x{i}_{j}"), expression=exp.null()), prev(f"__z{i}_{j}"))
        fault = exp.and_(
            exp.Not(this=exp.Paren(this=skip)),
            exp.or_(_missing(f"__pm{i}_{j}lo"), _missing(f"__pm{i}_{j}hi")),
        )
        return v, exp.or_(prev(f"__e{i}_{j - 1}"), exp.Paren(this=fault))

    @staticmethod
    def _spread(key: exp.Expr, alias: str, uses_small: exp.Expr, rule, m: MagnitudeCkm):
        """(u − ½)/step: v spread over its grid cell by the key's place u in the entry
        (:meth:`sqlsdc.mechanisms.ckm.Lookup.interpolated` says why)."""
        lo, hi = exp.column("lo", alias), exp.column("hi", alias)
        place = exp.Div(
            this=exp.Paren(this=exp.Sub(this=exp.cast(key.copy(), "DOUBLE"), expression=lo)),
            expression=exp.Paren(this=exp.Sub(this=exp.cast(hi, "DOUBLE"), expression=lo.copy())),
        )
        small_step = m.small_cells.step if m.small_cells is not None else rule.ptable.step
        width = exp.Case(
            ifs=[exp.If(this=uses_small.copy(), true=_number(1 / small_step))],
            default=_number(1 / rule.ptable.step),
        )
        return _mul_expr(exp.Paren(this=exp.Sub(this=place, expression=_number(0.5))), width)

    def _add_noise(self, i: int, j: int, m: MagnitudeCkm) -> exp.Expr:
        """x̂_j = x̂_{j−1} + sign(x̂)·|x_delta|·sign(v)·(μ + |v|), never flipping the sign."""
        prev = lambda c: exp.column(c, PREV)  # noqa: E731
        v = prev(f"__pv{i}_{j}")
        xo = prev(f"__o{i}_{j - 1}")
        mu = m.mu_c if j == 1 and m.mu_c else 0.0
        if mu:
            sensitive = exp.LT(this=prev(f"__n{i}"), expression=_number(m.sensitive_below))
            mu_expr = exp.Case(ifs=[exp.If(this=sensitive, true=_number(mu))], default=_number(0))
        else:
            mu_expr = _number(0)
        size = _mul_expr(
            exp.Abs(this=prev(f"__d{i}_{j}")), exp.Add(this=mu_expr, expression=exp.Abs(this=v))
        )
        # a negative v may shrink |x̂| at most to 0; a NULL cap (v >= 0) is ignored by LEAST
        cap = exp.Case(
            ifs=[
                exp.If(
                    this=exp.LT(this=v.copy(), expression=_number(0)),
                    true=exp.Abs(this=xo.copy()),
                )
            ]
        )
        clamped = _mul_expr(
            _mul_expr(_sign(xo), _sign(v)),
            exp.Least(this=size, expressions=[cap], ignore_nulls=True),
        )
        skip = exp.or_(exp.Is(this=prev(f"__x{i}_{j}"), expression=exp.null()), prev(f"__z{i}_{j}"))
        added = exp.Case(ifs=[exp.If(this=skip, true=_number(0))], default=clamped)
        return exp.Add(this=xo.copy(), expression=exp.Paren(this=added))

    def _final_value(self, i: int, spec) -> exp.Expr:
        prev = lambda c: exp.column(c, PREV)  # noqa: E731
        if spec.rule.method is not Method.CKM:
            return exp.Case(
                ifs=[
                    exp.If(
                        this=at_least_column(prev(f"__n{i}"), spec.min_frequency),
                        true=prev(f"__a{i}"),
                    )
                ]
            )
        if spec.kind is AggregateKind.COUNTS:
            return prev(f"__c{i}")
        m = self._magnitude(i)
        perturbed = prev(f"__o{i}_{m.top_k}")
        count, true_count = prev(f"__m{i}"), prev(f"__n{i}")
        positive = exp.GT(this=count, expression=_number(0))
        if isinstance(self.cells.aggregates[i], exp.Avg):
            divisor = true_count if m.mean_before_sum else count.copy()
            value = exp.Div(this=perturbed, expression=divisor.copy())
            return exp.Case(ifs=[exp.If(this=positive, true=value)])
        if not m.mean_before_sum:
            return exp.Case(
                ifs=[
                    exp.If(
                        this=exp.Not(this=exp.Is(this=count.copy(), expression=exp.null())),
                        true=perturbed,
                    )
                ]
            )
        adjusted = exp.Div(this=_mul_expr(perturbed, count.copy()), expression=true_count.copy())
        return exp.Case(
            ifs=[exp.If(this=positive, true=adjusted)],
            default=exp.Case(
                ifs=[exp.If(this=exp.EQ(this=count.copy(), expression=_number(0)), true=_number(0))]
            ),
        )

    def _count_of_units(self) -> int | None:
        """An aggregate that is already the group's CKM count of units (COUNT(*) when each row
        is a unit): its perturbed value is the group's, so no second ptable lookup is needed."""
        if self.plan.units is not None or self.count_rule.method is not Method.CKM:
            return None
        for i, spec in enumerate(self.plan.aggregates):
            if spec.kind is AggregateKind.COUNTS and spec.argument is None:
                if spec.rule == self.count_rule:
                    return i
        return None

    def _group_condition(self) -> exp.Expr:
        """Whether a group appears: decided on the protected count of its units, never on the
        true count, so that presence tells no more than a published count would. A group
        whose count would be published as 0 is left out; where the group's existence is the
        whole release (no aggregate, or rows an outer query can count or test), its protected
        count must reach the minimum frequency. Without CKM counts, the true count must."""
        k = self.plan.group_min_frequency
        if self.count_rule.method is not Method.CKM:
            return at_least("__n", k if k is not None else self.count_rule.min_frequency)
        if k is None:  # a missing ptable entry keeps the group, whose cells then fail
            count = exp.column("__cn", CELLS)
            return exp.or_(
                exp.GT(this=count, expression=_number(0)),
                exp.Is(this=count.copy(), expression=exp.null()),
            )
        return at_least("__cn", k)

    def _final_fault(self, i: int, spec) -> exp.Expr:
        if spec.rule.method is not Method.CKM:
            return exp.false()
        steps = self._magnitude(i).top_k if spec.kind is AggregateKind.MAGNITUDES else 0
        return exp.column(f"__e{i}_{steps}", PREV)

    # -- helpers -------------------------------------------------------------------------------

    def _ckm_magnitudes(self) -> list[int]:
        return [
            i
            for i, a in enumerate(self.plan.aggregates)
            if a.rule.method is Method.CKM and a.kind is AggregateKind.MAGNITUDES
        ]

    def _magnitude(self, i: int) -> MagnitudeCkm:
        return self.plan.aggregates[i].rule.magnitude

    def _tables(self, i: int) -> tuple[PTableRef, PTableRef | None]:
        """The magnitude ptable of aggregate i and its small-cells ptable, if any."""
        main = ptable_ref(self.ptables, ("magnitudes", self.plan.aggregates[i].rule.ptable))
        return main, self._small(self._magnitude(i))

    def _small(self, m: MagnitudeCkm) -> PTableRef | None:
        if m.small_cells is None:
            return None
        return ptable_ref(self.ptables, ("small_cells", m.small_cells))


def statistic(aggregate: ProtectedAggregate) -> str:
    """What an aggregate measures, independent of its rows: ``sum:persons.income``,
    ``distinct:persons.municipality`` (the guard's normal form records the base columns)."""
    kind = "distinct" if isinstance(aggregate.node.this, exp.Distinct) else "sum"
    columns = aggregate.node.meta.get(STATISTIC)
    if columns is None:
        columns = (aggregate.argument or exp.Star()).sql("duckdb")
    return f"{kind}:{columns.removeprefix('distinct:')}"


def _separation_point(m: MagnitudeCkm, small: PTableRef | None) -> float:
    """z_s = sqrt(m1²) / (sqrt(Σ ε_j²) · p_small) (cellKey ``ck_params_nums``); 0 if no table."""
    if small is None:
        return 0.0
    return math.sqrt(small.m1sq) / (math.sqrt(sum(e * e for e in m.epsilon)) * m.p_small)


def _flex(x: exp.Expr, f2: exp.Column, m: MagnitudeCkm) -> exp.Expr:
    """m(x) = p_lg·(1 + ((p_sm·x − p_lg·fp)/(p_lg·fp))·f2^q) with f2 = 2fp/(fp + x) (cellKey
    ``.para_m``). An integer q is written as a product, which every engine computes to the same
    bits; POWER (other q) may differ in the last bit between DuckDB and Spark."""
    f1 = exp.Div(
        this=exp.Paren(this=exp.Sub(this=_mul(x, m.p_small), expression=_number(m.p_large * m.fp))),
        expression=_number(m.p_large * m.fp),
    )
    if float(m.q).is_integer():
        power: exp.Expr = f2.copy()
        for _ in range(int(m.q) - 1):
            power = exp.Mul(this=power, expression=f2.copy())
    else:
        power = exp.Pow(this=f2.copy(), expression=_number(m.q))
    return _mul_expr(
        _number(m.p_large),
        exp.Paren(this=exp.Add(this=_number(1), expression=_mul_expr(f1, power))),
    )


def _scrambled(key: exp.Expr, rotations: int) -> exp.Expr:
    """The cell key rotated left by 4·r bits: the integer analogue of cellKey's
    ``.scramble_ckeys`` (which moves the first decimal digit of the key to the end)."""
    if rotations == 0:
        return key
    bits = 4 * rotations
    low = 2 ** (32 - bits)
    kept = exp.Mul(
        this=exp.Paren(this=exp.Mod(this=key, expression=_number(low))), expression=_number(2**bits)
    )
    moved = exp.cast(exp.Floor(this=exp.Div(this=key.copy(), expression=_number(low))), "BIGINT")
    return exp.Paren(this=exp.Add(this=kept, expression=moved))


def _class_below(a: exp.Expr, classes: tuple[float, ...]) -> exp.Expr:
    """The largest ptable row at or below ``a`` (the smallest row if there is none)."""
    ifs = [
        exp.If(this=exp.GTE(this=a.copy(), expression=_number(c)), true=_number(c))
        for c in reversed(classes)
    ]
    return exp.Case(ifs=ifs, default=_number(classes[0]))


def _class_above(a: exp.Expr, classes: tuple[float, ...]) -> exp.Expr:
    """The smallest ptable row at or above ``a`` (the largest row if there is none)."""
    ifs = [
        exp.If(this=exp.LTE(this=a.copy(), expression=_number(c)), true=_number(c)) for c in classes
    ]
    return exp.Case(ifs=ifs, default=_number(classes[-1]))


def _sign(value: exp.Expr) -> exp.Expr:
    return exp.Case(
        ifs=[
            exp.If(this=exp.GT(this=value.copy(), expression=_number(0)), true=_number(1)),
            exp.If(this=exp.LT(this=value.copy(), expression=_number(0)), true=_number(-1)),
        ],
        default=_number(0),
    )


def _missing(alias: str) -> exp.Expr:
    return exp.Is(this=exp.column("lo", alias), expression=exp.null())


def _any(conditions: list[exp.Expr]) -> exp.Expr:
    return exp.or_(*conditions) if conditions else exp.false()


def at_least_column(column: exp.Expr, k: int) -> exp.Expr:
    return exp.GTE(this=column.copy(), expression=exp.Literal.number(k))


def _number(value: float) -> exp.Expr:
    """A numeric literal: integers as such, other numbers as DOUBLE (exponent notation)."""
    magnitude = abs(value)
    if float(magnitude).is_integer() and magnitude < 2**53:
        literal = exp.Literal.number(int(magnitude))
    else:
        literal = exp.Literal.number(f"{float(magnitude):.17e}")
    return exp.Neg(this=literal) if value < 0 else literal


def _lt(value: exp.Expr, bound: float) -> exp.Expr:
    return exp.LT(this=value.copy(), expression=_number(bound))


def _mul(value: exp.Expr, factor: float) -> exp.Expr:
    return _mul_expr(value.copy(), _number(factor))


def _mul_expr(a: exp.Expr, b: exp.Expr) -> exp.Expr:
    return exp.Mul(this=_paren(a), expression=_paren(b))


def _div(value: exp.Expr, divisor: float) -> exp.Expr:
    return exp.Div(this=_paren(value.copy()), expression=_number(divisor))


def _paren(node: exp.Expr) -> exp.Expr:
    if isinstance(node, (exp.Column, exp.Literal, exp.Paren, exp.Func)):
        return node
    return exp.Paren(this=node)

"""The cell key method's magnitude layers: one compute and one ptable-lookup layer per
contributor j (cellKey ``.perturb_cell_flex``; Geyer et al., PSD 2022, §2–§6), mixed into the
CKM frame builder of :mod:`sqlsdc.rewrite.ckm`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from sqlglot import exp

from sqlsdc.catalog.ptables import PTableKey, PTableRef
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.ckm import REMAINDER_FLOOR
from sqlsdc.policy import AggregateKind, MagnitudeCkm, Method
from sqlsdc.rewrite.sql import cast, div, lt, missing, mul, mul_expr, number

PREV = "__s"
PTABLE_ENTRIES = exp.Table(this=exp.to_identifier("ptable_entries"), db=exp.to_identifier("sqlsdc"))


def ptable_ref(ptables: Mapping[PTableKey, PTableRef], key: PTableKey) -> PTableRef:
    if key not in ptables:
        raise PolicyViolation(
            f"the perturbation table for {key[0]} {key[1].as_dict()} is not in the catalog",
            "apply the policy again (`sqlsdc policy apply`) to generate it",
            "",
        )
    return ptables[key]


class MagnitudeLayers:
    """The layers of magnitude cells; ``self.plan``, ``self.cells``, ``self.ptables``,
    ``self._select_from`` and ``self._join_ptable`` come from the CKM builder."""

    def _magnitude_step(self, previous: exp.Select, j: int) -> exp.Select:
        """Contributor j: x_delta, the lookup position, the lookup, the added noise; one layer
        each, so that no expression is repeated inside another."""
        prev = lambda c: exp.column(c, PREV)  # noqa: E731
        steps = [i for i in self._ckm_magnitudes() if j <= self._magnitude(i).top_k]
        ratio = self._select_from(previous)
        for i in steps:
            m = self._magnitude(i)
            f2 = exp.Div(
                this=number(2 * m.fp),
                expression=exp.Paren(
                    this=exp.Add(this=number(m.fp), expression=exp.Abs(this=prev(f"__x{i}_{j}")))
                ),
            )
            ratio.append("expressions", exp.alias_(f2, f"__f{i}_{j}"))
        amplitude = self._select_from(ratio)
        for i in steps:
            m = self._magnitude(i)
            zs = _separation_point(m, self._small(m))
            x = prev(f"__x{i}_{j}")
            ax = exp.Abs(this=x)
            # x_delta = x_j·ε_j·m(|x_j|) (sqlsdc.mechanisms.ckm.amplitude)
            weight = m.epsilon[j - 1]
            large = exp.Mul(this=x.copy(), expression=_flex(ax.copy(), prev(f"__f{i}_{j}"), m))
            normal = exp.Case(
                ifs=[
                    exp.If(this=lt(ax, zs), true=number(1)),
                    exp.If(this=lt(ax.copy(), m.fp), true=mul(x, weight * m.p_small)),
                ],
                default=large if weight == 1 else mul_expr(large, number(weight)),
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
                        true=div(prev(f"__o{i}_{j - 1}"), m.p_small * m.epsilon[j - 1]),
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
            small_x = lt(exp.Abs(this=prev(f"__xj{i}_{j}")), zs)
            delta = exp.Case(
                ifs=[
                    exp.If(
                        this=rescale,
                        true=exp.Case(ifs=[exp.If(this=small_x, true=number(1))], default=xo),
                    )
                ],
                default=prev(f"__xd{i}_{j}"),
            )
            uses_small = exp.Case(
                ifs=[exp.If(this=rescale.copy(), true=small_x.copy())],
                default=lt(exp.Abs(this=prev(f"__x{i}_{j}")), zs),
            )
            # j >= 2 below z_s, rescaled or not, adds nothing (mechanisms.ckm.perturb_magnitude)
            below = lt(exp.Abs(this=prev(f"__x{i}_{j}")), zs)
            either = exp.or_(below, exp.and_(rescale.copy(), small_x.copy()))
            zero = exp.Paren(this=either) if j > 1 else exp.false()
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
                ifs=[exp.If(this=prev(f"__sm{i}_{j}"), true=number(small.max_i if small else 0))],
                default=number(main.max_i),
            )
            delta = prev(f"__d{i}_{j}")
            # the running value's position |x̂/x_delta| (τ-ARGUS, cellKey)
            ratio = exp.Case(
                ifs=[exp.If(this=exp.EQ(this=delta, expression=number(0)), true=number(0))],
                default=exp.Abs(
                    this=exp.Div(this=prev(f"__o{i}_{j - 1}"), expression=delta.copy())
                ),
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
            ifs=[exp.If(this=uses_small, true=number(small.ptable_id if small else -1))],
            default=number(main.ptable_id),
        )
        if rule.ptable.parity:
            odd = exp.or_(  # a cell perturbed as one contribution has one: odd
                exp.EQ(
                    this=exp.Mod(this=prev(f"__n{i}"), expression=number(2)),
                    expression=number(1),
                ),
                prev(f"__fl{i}"),
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
                    this=exp.GT(this=spread, expression=number(0)),
                    true=exp.Div(
                        this=exp.Paren(this=exp.Sub(this=a.copy(), expression=low_row.copy())),
                        expression=exp.Paren(this=spread.copy()),
                    ),
                )
            ],
            default=number(0),
        )
        v = exp.Add(
            this=mul_expr(exp.Sub(this=number(1), expression=weight), values[0]),
            expression=mul_expr(weight.copy(), values[1]),
        )
        v = exp.Add(this=v, expression=self._spread(key, f"__pm{i}_{j}lo", uses_small, rule, m))
        skip = exp.or_(exp.Is(this=prev(f"__x{i}_{j}"), expression=exp.null()), prev(f"__z{i}_{j}"))
        fault = exp.and_(
            exp.Not(this=exp.Paren(this=skip)),
            exp.or_(missing(f"__pm{i}_{j}lo"), missing(f"__pm{i}_{j}hi")),
        )
        return v, exp.or_(prev(f"__e{i}_{j - 1}"), exp.Paren(this=fault))

    @staticmethod
    def _spread(key: exp.Expr, alias: str, uses_small: exp.Expr, rule, m: MagnitudeCkm):
        """(u − ½)/step: v spread over its grid cell by the key's place u in the entry
        (:meth:`sqlsdc.mechanisms.ckm.Lookup.interpolated` says why)."""
        lo, hi = exp.column("lo", alias), exp.column("hi", alias)
        place = exp.Div(
            this=exp.Paren(this=exp.Sub(this=cast(key.copy(), "DOUBLE"), expression=lo)),
            expression=exp.Paren(this=exp.Sub(this=cast(hi, "DOUBLE"), expression=lo.copy())),
        )
        small_step = m.small_cells.step if m.small_cells is not None else rule.ptable.step
        width = exp.Case(
            ifs=[exp.If(this=uses_small.copy(), true=number(1 / small_step))],
            default=number(1 / rule.ptable.step),
        )
        return mul_expr(exp.Paren(this=exp.Sub(this=place, expression=number(0.5))), width)

    def _add_noise(self, i: int, j: int, m: MagnitudeCkm) -> exp.Expr:
        """x̂_j = x̂_{j−1} + sign(x̂)·|x_delta|·sign(v)·(μ + |v|), never flipping the sign nor
        leaving |x̂| in (0, REMAINDER_FLOOR·|x_delta|)
        (:data:`~sqlsdc.mechanisms.ckm.REMAINDER_FLOOR`)."""
        prev = lambda c: exp.column(c, PREV)  # noqa: E731
        v = prev(f"__pv{i}_{j}")
        xo = prev(f"__o{i}_{j - 1}")
        mu = m.mu_c if j == 1 and m.mu_c else 0.0
        if mu:
            sensitive = _sensitive(prev, i, m)
            mu_expr = exp.Case(ifs=[exp.If(this=sensitive, true=number(mu))], default=number(0))
        else:
            mu_expr = number(0)
        amplitude = exp.Abs(this=prev(f"__d{i}_{j}"))
        size = mul_expr(amplitude, exp.Add(this=mu_expr, expression=exp.Abs(this=v)))
        # a negative v that would leave |x̂| under REMAINDER_FLOOR·|x_delta| (0 included) takes
        # it to 0: below that the published bits resolve the noise finer than one key (s42h)
        remainder = exp.Sub(this=exp.Abs(this=xo.copy()), expression=size.copy())
        floor = mul_expr(number(REMAINDER_FLOOR), amplitude.copy())
        to_zero = exp.and_(
            exp.LT(this=v.copy(), expression=number(0)),
            exp.LT(this=remainder, expression=floor),
        )
        clamped = mul_expr(
            mul_expr(_sign(xo), _sign(v)),
            exp.Case(ifs=[exp.If(this=to_zero, true=exp.Abs(this=xo.copy()))], default=size),
        )
        skip = exp.or_(exp.Is(this=prev(f"__x{i}_{j}"), expression=exp.null()), prev(f"__z{i}_{j}"))
        added = exp.Case(ifs=[exp.If(this=skip, true=number(0))], default=clamped)
        return exp.Add(this=xo.copy(), expression=exp.Paren(this=added))

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


def _sensitive(prev, i: int, m: MagnitudeCkm) -> exp.Expr:
    """Whether magnitude i's first contributor gets μ_c: cellKey's n < ``sensitive_below``,
    or under a mean floor the protected count n̂ (``__m<i>``) under max(``sensitive_below``,
    ``mean_below``) (:func:`sqlsdc.mechanisms.ckm.is_sensitive` says why)."""
    if m.mean_below <= 2:
        return exp.LT(this=prev(f"__n{i}"), expression=number(m.sensitive_below))
    if m.sensitive_below <= 1:
        return exp.false()
    bound = max(m.sensitive_below, m.mean_below)
    return exp.LT(this=prev(f"__m{i}"), expression=number(bound))


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
        this=exp.Paren(this=exp.Sub(this=mul(x, m.p_small), expression=number(m.p_large * m.fp))),
        expression=number(m.p_large * m.fp),
    )
    if float(m.q).is_integer():
        power: exp.Expr = f2.copy()
        for _ in range(int(m.q) - 1):
            power = exp.Mul(this=power, expression=f2.copy())
    else:
        power = exp.Pow(this=f2.copy(), expression=number(m.q))
    return mul_expr(
        number(m.p_large),
        exp.Paren(this=exp.Add(this=number(1), expression=mul_expr(f1, power))),
    )


def _scrambled(key: exp.Expr, rotations: int) -> exp.Expr:
    """The cell key rotated left by 4·r bits: the integer analogue of cellKey's
    ``.scramble_ckeys`` (which moves the first decimal digit of the key to the end)."""
    if rotations == 0:
        return key
    bits = 4 * rotations
    low = 2 ** (32 - bits)
    kept = exp.Mul(
        this=exp.Paren(this=exp.Mod(this=key, expression=number(low))), expression=number(2**bits)
    )
    moved = cast(exp.Floor(this=exp.Div(this=key.copy(), expression=number(low))), "BIGINT")
    return exp.Paren(this=exp.Add(this=kept, expression=moved))


def _class_below(a: exp.Expr, classes: tuple[float, ...]) -> exp.Expr:
    """The largest ptable row at or below ``a`` (the smallest row if there is none)."""
    ifs = [
        exp.If(this=exp.GTE(this=a.copy(), expression=number(c)), true=number(c))
        for c in reversed(classes)
    ]
    return exp.Case(ifs=ifs, default=number(classes[0]))


def _class_above(a: exp.Expr, classes: tuple[float, ...]) -> exp.Expr:
    """The smallest ptable row at or above ``a`` (the largest row if there is none)."""
    ifs = [
        exp.If(this=exp.LTE(this=a.copy(), expression=number(c)), true=number(c)) for c in classes
    ]
    return exp.Case(ifs=ifs, default=number(classes[-1]))


def _sign(value: exp.Expr) -> exp.Expr:
    return exp.Case(
        ifs=[
            exp.If(this=exp.GT(this=value.copy(), expression=number(0)), true=number(1)),
            exp.If(this=exp.LT(this=value.copy(), expression=number(0)), true=number(-1)),
        ],
        default=number(0),
    )

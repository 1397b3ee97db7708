"""The cell key method (CKM) as a rewrite: every cell gets deterministic noise from its records.

Sources: Geyer, Tent, Reiffert, Giessing, "Perspectives for tabular data protection – how about
synthetic data?", PSD 2022 (digest ``seed_2022_part1.md`` §6); the sdcTools reference
implementation (τ-ARGUS, R packages ``ptable`` and ``cellKey``).

Counts (``cellKey`` ``$perturb`` for count variables): the cell key is
``SUM(__rkey) % 2^32`` over the cell's units (each unit once when units repeat), the integer
form of ``(Σ rkey) mod 1``; the count n is published as ``n + v`` where v is the entry of ptable
row ``min(n, max_i)`` whose key interval [lo, hi) holds the cell key.

Magnitudes (``cellKey`` ``.perturb_cell_flex``, flex function ``ck_flexparams``): the
contributors of a sum are its records of non-zero value, as in cellKey (``ck_params_nums``
``use_zero_rkeys = FALSE``, its default: a numeric variable's cell key sums the record keys of
the units that contribute to it, NULL and 0 being no contribution). A record of value 0 adds
nothing to the sum and changes nothing it publishes: its key, its contributor count, their
protected count, its largest contributions. Keyed by all its records, a sum drew new noise for
every set of zeros a query left out (``AND NOT (income = 0 AND age = a)``: the same exact sum
with 16 independent noises, whose average converges on it; red team s30b). The noise is built
from the cell's ``top_k`` largest contributions x_j (by absolute value, found with the
aggregates ``MAX(ABS(x))`` and ``MAX(ABS(x), k)``), one after the other; step j looks up v in the
magnitude ptable at ``a = |x̂ / x_delta_j|``, x̂ the running value (interpolated between rows,
capped at the last row), with the j-th scrambled cell key, x_delta_j = x_j·ε_j·m(|x_j|), and
adds ``sign(x̂)·|x_delta_j|·sign(v)·(μ_c + |v|)``, never
flipping the sign of the running value, v spread over its grid cell. A magnitude's key is the
cell key through the secret mix of its statistic (:func:`sqlsdc.mechanisms.ckm.statistic_key`,
constants read from ``sqlsdc.ckm_mix``), so different statistics of the same records get
unlinkable noise; so does a distinct count of a dimension. A distinct count of units is keyed
by those units' own record keys, however the query reaches them
(:mod:`sqlsdc.rewrite.counted_units`).

A sum is published mean before sum (Geyer et al., PSD 2022, §6.1(c), "MBS"; the ABS's
"perturbed estimates", Thompson, Broadfoot & Elazar 2013: the mean times the perturbed
contributor count) over its contributors: ``(x̂/n)·n̂``, n its non-zero records (on a join,
units of :attr:`CellPlan.row_source`) and n̂ their protected count, the one ``COUNT(*) ...
WHERE x <> 0`` publishes (under a frequency rule for counts, n itself from the minimum up). The
policy refuses ``mean_before_sum: false``, whose sum x̂ of values a query pins would be an
exact count (red team s37a). AVG is that published sum over the protected count of all its non-NULL
values, zeros included (``COUNT(x)``'s published value): the mean a user computes from the
published sum and count. It is not ``x̂/n`` with the true count of all values: x̂ is the same
for every set of zeros, so two such means of one sum would have the ratio of their true
counts, exact to the record. In a cell without zeros both counts are one count of one key,
and the mean is x̂/n up to rounding. The guard has already reduced every
argument to one stored column (:mod:`sqlsdc.planner.normal_form`), so the scale of x is the
data's, not the analyst's.

A count of one table's rows in cells of a coarser table's columns (persons by household size,
:attr:`CellPlan.per_unit_counts`, :mod:`sqlsdc.planner.coarser_units`) is such a sum over the
coarser units: each contributes c_h, its counted rows of the cell (computed on the rows by
window functions over the cell's keys and the unit), with that table's magnitude rule, its
count rule for n̂ (its units' plain key) and a noise key of the contributions (unit, c_h) and
of the rows counted (their record keys: red team s45d).

The frame is a chain of subqueries over the aggregated cells only:
``__r`` (rows: keys, arguments, record keys) → ``__c`` (aggregation) → ptable joins for
counts → one compute and one lookup layer per contributor j → ``__cells``. Everything is plain
SQL built as sqlglot AST, the same on DuckDB and Spark.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlglot import exp

from sqlsdc.catalog.ptables import KEY_MODULUS, PTableKey, PTableRef
from sqlsdc.engines.trees import copy_tree
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms.ckm import PUBLISHED_BITS
from sqlsdc.mechanisms.parameters import UnitNoise
from sqlsdc.planner.normal_form import STATISTIC
from sqlsdc.planner.plan import CellPlan, ProtectedAggregate
from sqlsdc.policy import AggregateKind, Method, Policy
from sqlsdc.rewrite.cells import (
    CELLS,
    Cells,
    Frame,
    frequency_count,
    nonzero,
    unit_count,
    when_present,
)
from sqlsdc.rewrite.ckm_magnitudes import PREV, PTABLE_ENTRIES, MagnitudeLayers, ptable_ref
from sqlsdc.rewrite.ckm_mix import join_mix, mix_missing, statistic_key_sql
from sqlsdc.rewrite.counted_units import counted_units_key, join_unit_keys, unit_lookups
from sqlsdc.rewrite.dominance import largest_needed, rules
from sqlsdc.rewrite.noised_conditions import noise_conditions, policy_lookup
from sqlsdc.rewrite.sql import any_, at_least_column, cast, missing, mul_expr, number, paren
from sqlsdc.rewrite.threshold import at_least
from sqlsdc.rewrite.unit_noise import noised

MECHANISM = "ckm"

MAX_PTABLE_LOOKUPS = 64
"""The most perturbation-table lookups the cell-key frames of one statement may join: one per
statistic for its count (two for a mean: of its non-zero and of its non-NULL values), one for
the groups of an aggregation with a magnitude (at most: the count of the first one's non-NULL
values), and two per contributor of a magnitude's top k. Each is a LEFT JOIN in a layer that
carries every statistic's columns, and DuckDB binds and plans such a frame in time that grows
with about the cube of its statistics, before it runs anything and beyond the statement
timeout's reach, holding Python's GIL (every thread of a server stops): 64 CKM sums of one
aggregation took 28 s of CPU, 300 ran 600 s under a 30 s timeout (red team s38a). 64 lookups
(64 counts, 21 sums, 12 sums of a top-2 table) bind in about a second."""


def refuse_many_lookups(cells: Iterable[CellPlan]) -> None:
    """Refuse a statement whose cell-key frames would join more than :data:`MAX_PTABLE_LOOKUPS`
    perturbation-table rows (see there), before anything is rewritten or run."""
    lookups = 0
    for cell in cells:
        if cell.mechanism is not Method.CKM:
            continue
        magnitudes = [
            a
            for a in cell.aggregates
            if a.rule.method is Method.CKM and a.kind is AggregateKind.MAGNITUDES
        ]
        lookups += 1 if magnitudes else 0  # at most one count of every value, for the groups
        for aggregate in cell.aggregates:
            if aggregate.rule.method is Method.CKM:
                lookups += 1
        for aggregate in magnitudes:
            lookups += 2 * aggregate.rule.magnitude.top_k + isinstance(aggregate.node, exp.Avg)
    if lookups > MAX_PTABLE_LOOKUPS:
        raise PolicyViolation(
            f"the statement asks for too many statistics protected by the cell key method at "
            f"once: they need {lookups:,} perturbation-table lookups, at most "
            f"{MAX_PTABLE_LOOKUPS:,} (a count needs one, a sum or mean three or more)",
            "ask the statistics in several statements",
            "",
        )


def ckm_frame(policy: Policy, ptables: Mapping[PTableKey, PTableRef]):
    """The frame builder for aggregations with a CKM aggregate, bound to the stored ptables."""

    def build(cells: Cells, twin: dict[int, exp.Expr]) -> Frame:
        return _Builder(cells, twin, policy, ptables).frame()

    return build


class _Builder(MagnitudeLayers):
    def __init__(self, cells: Cells, twin, policy: Policy, ptables):
        self.cells, self.twin, self.ptables, self.policy = cells, twin, ptables, policy
        self.noised_rows = False  # a condition compares x·m (:meth:`_rows`)
        self.plan = cells.plan
        self.count_rule = policy.table(self._counted_table()).rule(AggregateKind.COUNTS)
        self.layer = 0
        self.lookups = unit_lookups(self.plan, self._arguments(), Method.CKM)
        self.per_unit = self.plan.per_unit_counts
        self.unit_rule = {
            i: policy.table(self.plan.tables[t]).rule(AggregateKind.COUNTS)
            for i, t in self.per_unit.items()
        }
        self.all_counts = self._all_counts()

    def _counted_table(self) -> str:
        """The table whose count rule protects this aggregation's counts of units (a sum's n̂,
        its floor, the group's presence): the table whose rows the join's rows are
        (:attr:`CellPlan.row_source`), else the only one. Not the first table of FROM: with
        households first and their own count ptable, a sum of persons took its n̂ from the
        households' ptable at the persons' key, a second noisy count of the same persons
        beside their COUNT(*) (red team s42a)."""
        plan = self.plan
        return plan.tables[plan.row_source if plan.row_source is not None else 0]

    # -- rows and aggregation ------------------------------------------------------------------

    def frame(self) -> Frame:
        self._refuse_dominance()
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
        source = final.subquery(CELLS, copy=False)
        group = self._group_condition()

        def value(i: int) -> exp.Expr:
            return exp.column(f"__y{i}", CELLS)

        def published(i: int) -> exp.Expr:
            return exp.Not(this=exp.Is(this=value(i), expression=exp.null()))

        def fault(i: int) -> exp.Expr:
            own = exp.column(f"__e{i}", CELLS)
            if self.count_rule.method is not Method.CKM:
                return own
            presence = exp.column(self._presence_column(), CELLS)
            return exp.or_(own, exp.Is(this=presence, expression=exp.null()))

        return Frame(source, value, published, group, fault)

    def _refuse_dominance(self) -> None:
        """A threshold or rounded magnitude beside a CKM one (tables of a join whose counts are
        not CKM: beside CKM counts the planner refuses it) would be published here without
        its dominance rule (:mod:`sqlsdc.rewrite.dominance`): refused."""
        for i, spec in enumerate(self.plan.aggregates):
            if spec.rule.method is not Method.CKM and largest_needed(rules(spec)):
                raise PolicyViolation(
                    f"{self.cells.aggregates[i].sql('duckdb')[:80]} is protected by "
                    f"{spec.rule.method.value} and its dominance rule, and this aggregation "
                    "has aggregates protected by the cell key method",
                    "ask the sums of each table in a query of their own",
                    self.cells.text(),
                )

    def _rows(self) -> exp.Select:
        cells, plan = self.cells, self.plan
        rows = cells.rows()
        for i in range(len(plan.aggregates)):
            argument = cells.argument(i, self.twin)
            if i in self.per_unit:
                unit = plan.units[self.per_unit[i]]
                contribution = self._contribution(argument, unit)
                rows.append("expressions", exp.alias_(contribution, f"__v{i}", copy=False))
                records = self._counted_records_key(argument, unit)
                rows.append("expressions", exp.alias_(records, f"__vr{i}", copy=False))
            elif argument is not None and self._value(i) == f"__v{i}":
                value = copy_tree(argument)
                if (noise := self._unit_noise(i)) is not None:
                    rkey = copy_tree(plan.rkeys[self._noised_unit(i)])
                    value = noised(value, rkey, self._measures(i), noise)
                rows.append("expressions", exp.alias_(value, f"__v{i}", copy=False))
        # a condition on a unit-noised measure compares x·m, as the sums add it (s45l)
        self.noised_rows = noise_conditions(
            rows, policy_lookup(self.policy), cells.text, cells.select
        )
        if any(self._unit_noise(i) is not None for i in range(len(plan.aggregates))):
            join_mix(rows)
        for t, rkey in enumerate(plan.rkeys):
            rows.append("expressions", exp.alias_(copy_tree(rkey), f"__rk{t}", copy=False))
        for t, unit in enumerate(plan.units or []):
            rows.append("expressions", exp.alias_(copy_tree(unit), f"__u{t}", copy=False))
        looked_up = join_unit_keys(rows, plan, self._arguments(), self.lookups)
        for j, key in enumerate(looked_up):
            rows.append("expressions", exp.alias_(key, f"__rr{j}"))
        return rows

    def _contribution(self, argument: exp.Expr | None, unit: exp.Expr) -> exp.Expr:
        """A count protected as a sum over a coarser table's units (:attr:`CellPlan.
        per_unit_counts`): on one row of each (cell, unit) the unit's counted rows of the cell
        c_h, NULL on its other rows, so that the aggregation's SUM, top contributions, count of
        contributors and key see each unit once with its c_h (the frame's grouping is the
        rows' keys: no grouping sets, :mod:`sqlsdc.planner.coarser_units`)."""
        counted = exp.Count(this=exp.Star() if argument is None else copy_tree(argument))
        return self._per_unit_first(counted, unit)

    def _counted_records_key(self, argument: exp.Expr | None, unit: exp.Expr) -> exp.Expr:
        """On the row that holds a unit's contribution c_h (:meth:`_contribution`), the sum of
        the record keys of the rows it counts (persons: their ``__rkey``), NULL elsewhere; the
        contributions key (:meth:`_contributions_key`) adds it, so that the noise is a function
        of the records counted, as a count's is, and not of (unit, c_h) alone."""
        rkey = cast(copy_tree(self.plan.rkeys[self.plan.row_source]), "BIGINT")
        return self._per_unit_first(exp.Sum(this=when_present(rkey, argument)), unit)

    def _per_unit_first(self, function: exp.Expr, unit: exp.Expr) -> exp.Expr:
        """``function`` over the rows of one (cell, unit), on the first of them only."""
        partition = [copy_tree(key) for key in self.cells.keys] + [copy_tree(unit)]

        def over(function: exp.Expr, ordered: bool) -> exp.Window:
            order = exp.Order(expressions=[exp.Ordered(this=copy_tree(unit))]) if ordered else None
            return exp.Window(
                this=function, partition_by=[p.copy() for p in partition], order=order
            )

        first = exp.EQ(this=over(exp.RowNumber(), True), expression=number(1))
        return exp.Case(ifs=[exp.If(this=first, true=over(function, False))])

    def _arguments(self) -> list[exp.Expr | None]:
        return [self.cells.argument(i, self.twin) for i in range(len(self.plan.aggregates))]

    def _value(self, i: int) -> str:
        """The rows' column holding aggregate i's argument: one column per distinct argument,
        so that the engine computes the aggregates of SUM(x) and AVG(x) once."""
        if i in self.per_unit:
            return f"__v{i}"
        arguments = [self.cells.argument(k, self.twin) for k in range(i + 1)]
        noise = self._unit_noise(i)
        first = next(
            k
            for k, a in enumerate(arguments)
            if a == arguments[i] and k not in self.per_unit and self._unit_noise(k) == noise
        )
        return f"__v{first}"

    def _unit_noise(self, i: int) -> UnitNoise | None:
        """The permanent unit noise of aggregate i: a CKM magnitude (not a count protected as
        one, :attr:`CellPlan.per_unit_counts`) whose table's rule asks for it."""
        spec = self.plan.aggregates[i]
        if spec.rule.method is not Method.CKM or spec.kind is not AggregateKind.MAGNITUDES:
            return None
        if i in self.per_unit or spec.argument is None:
            return None
        return spec.rule.magnitude.unit_noise

    def _measures(self, i: int) -> tuple[str, ...]:
        """``table.column`` of each column magnitude i is a function of (``income``, or
        ``income`` and ``weight`` for ``SUM(income * weight)``): each multiplies its values by
        its own factors, salted by its name (:func:`sqlsdc.mechanisms.unit_noise.salt_name`)."""
        return tuple(statistic(self.plan.aggregates[i]).split(":", 1)[1].split(", "))

    def _noised_unit(self, i: int) -> int:
        """The position in the plan's record keys of the table magnitude i sums: the unit whose
        factor multiplies each of its values: of a table read twice, the instance whose column it
        sums; refused when that is not one instance."""
        tables = {measure.split(".", 1)[0] for measure in self._measures(i)}
        table = min(tables)
        positions = [t for t, name in enumerate(self.plan.tables) if name == table]
        argument = self.cells.argument(i, self.twin)
        if len(positions) > 1 and isinstance(argument, exp.Column) and argument.table:
            # the table read twice (a self-join): the instance the summed column is read from
            rkeys = self.plan.rkeys
            positions = [
                t for t in positions if t < len(rkeys) and rkeys[t].table == argument.table
            ]
        if len(tables) != 1 or len(positions) != 1 or len(self.plan.rkeys) != len(self.plan.tables):
            raise PolicyViolation(
                "the cell key method cannot tell whose values this sum or average adds up "
                f"({self.cells.aggregates[i].sql('duckdb')[:80]}): its table's values carry "
                "a permanent noise factor per unit",
                "read the table once in the query",
                self.cells.text(),
            )
        return positions[0]

    def _aggregation(self, rows: exp.Select) -> exp.Select:
        cells, plan = self.cells, self.plan
        r = "__r"
        keys = {key: exp.column(f"__g{i}", r) for i, key in enumerate(cells.keys)}

        def remap(node: exp.Expr) -> exp.Expr:  # a copy reading each key from the rows
            return copy_tree(node, replaced=keys)

        agg = exp.Select(expressions=[])
        agg.set("from_", exp.From(this=rows.subquery(r, copy=False)))
        group = cells.select.args.get("group")
        if group is not None:
            agg.set("group", remap(group))
        for i in range(len(cells.keys)):
            agg.append("expressions", exp.alias_(exp.column(f"__g{i}", r), f"__g{i}"))
        for i, grouping in enumerate(cells.groupings):
            agg.append("expressions", exp.alias_(remap(grouping), f"__gg{i}"))
        units = [exp.column(f"__u{t}", r) for t in range(len(plan.units or []))]
        for i, spec in enumerate(plan.aggregates):
            argument = None
            if spec.argument is not None or i in self.per_unit:
                argument = exp.column(self._value(i), r)
            aggregate = cells.aggregates[i]
            method = spec.rule.method
            if method is Method.CKM and spec.kind is AggregateKind.MAGNITUDES:
                if isinstance(aggregate.this, exp.Distinct):
                    raise PolicyViolation(
                        "the cell key method does not perturb sums or averages of DISTINCT values",
                        "remove DISTINCT",
                        cells.text(),
                    )
                agg.append("expressions", exp.alias_(exp.Sum(this=argument), f"__a{i}"))
            else:
                agg.append("expressions", exp.alias_(self._rebuilt(aggregate, argument), f"__a{i}"))
            if method is not Method.CKM:
                counted = frequency_count(spec, argument, units if plan.units is not None else None)
                agg.append("expressions", exp.alias_(counted, f"__n{i}"))
            elif spec.kind is AggregateKind.MAGNITUDES:  # a CKM count's n is __a
                summed = self._summed_units(i, units)
                counted = unit_count(nonzero(argument), summed)
                agg.append("expressions", exp.alias_(counted, f"__n{i}"))
                if self.all_counts.get(i) == i:
                    agg.append("expressions", exp.alias_(unit_count(argument, summed), f"__na{i}"))
                    if self.count_rule.method is Method.CKM:
                        key = self._cell_key(argument, spec)
                        agg.append("expressions", exp.alias_(key, f"__ka{i}"))
            if method is Method.CKM and i in self.lookups:
                looked_up = exp.column(f"__rr{self.lookups[i]}", "__r")
                key = counted_units_key(looked_up)
                agg.append("expressions", exp.alias_(key, f"__k{i}"))
            elif method is Method.CKM:
                contributing = argument
                if spec.kind is AggregateKind.MAGNITUDES:
                    contributing = nonzero(argument)
                key = self._cell_key(contributing, spec)
                agg.append("expressions", exp.alias_(key, f"__k{i}"))
                if i in self.per_unit:
                    mixed = self._contributions_key(i, contributing)
                    agg.append("expressions", exp.alias_(mixed, f"__kv{i}"))
            if method is Method.CKM and spec.kind is AggregateKind.MAGNITUDES:
                for j in range(1, self._magnitude(i).top_k + 1):
                    agg.append("expressions", exp.alias_(self._top(i, j), f"__t{i}_{j}"))
        # the group's units: the join's rows when they are the driver's units, one each
        group_units = None if plan.rows_are_units else units or None
        if self._presence_column() == "__cn" or self.count_rule.method is not Method.CKM:
            agg.append("expressions", exp.alias_(unit_count(None, group_units), "__n"))
        if self._presence_column() == "__cn" and self._count_of_units() is None:
            agg.append("expressions", exp.alias_(self._cell_key(None, None), "__kn"))
        return agg

    def _summed_units(self, i: int, units: list[exp.Expr]) -> list[exp.Expr] | None:
        """The units whose rows a magnitude sums: its counts (of non-zero values, the n of the
        mean-before-sum adjustment; of non-NULL values, AVG's) must count the rows summed, not
        the units of another table of the join (``AVG(p.income)`` over persons ⋈ households
        divides by the persons). None: every row is its own unit. Those are the rows of the
        table the join's rows are (:attr:`CellPlan.row_source`), else of the one table the
        argument reads."""
        plan = self.plan
        if plan.units is None:
            return None
        if i in self.per_unit:
            return [units[self.per_unit[i]]]
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
                self.cells.text(),
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
        per_unit = [t for k, t in self.per_unit.items() if plan.aggregates[k] is aggregate]
        if per_unit:  # one row per (cell, unit) holds its contribution: each unit's key once
            total = exp.Sum(this=when_present(rkeys[per_unit[0]], argument))
        elif plan.units is None:
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
        return exp.Mod(this=exp.Paren(this=total), expression=exp.Literal.number(KEY_MODULUS))

    def _contributions_key(self, i: int, contribution: exp.Expr) -> exp.Expr:
        """The key of a count protected as a sum over coarser units (:attr:`CellPlan.
        per_unit_counts`) that its noise is drawn with: ``(SUM((rkey·(2·c_h + 1)) % 2^32) +
        SUM(r_h)) % 2^32`` over the contributing units, r_h the sum of the record keys of the
        rows unit h contributes (:meth:`_counted_records_key`): a function of the
        contributions (unit, c_h) and of the records counted, as a count's key is of its
        records. Keyed by the units alone, the same households with other counted persons drew
        the same noise: under the mean floor its factor cancelled in the ratio of two such
        counts (adults and persons of 17 and over, by municipality and size: 66 of 91 cells
        told the exact ratio of their true counts). Keyed by (unit, c_h) alone, every cell of
        one member of a household drew that household's one noise: grouped by the persons'
        age, sex, education and occupation, equal published values joined the members of 88
        households of region R01 exactly, all their records, in one query (red team s45d).
        Its count of contributors n̂ keeps the units' plain key (``__k``): the households' own
        count of them, one noise whatever is counted in them."""
        rkey = cast(exp.column(f"__rk{self.per_unit[i]}", "__r"), "BIGINT")
        odd = exp.Add(
            this=mul_expr(number(2), cast(contribution.copy(), "BIGINT")), expression=number(1)
        )
        term = exp.Mod(this=exp.Paren(this=mul_expr(rkey, odd)), expression=number(KEY_MODULUS))
        records = exp.Mod(
            this=exp.Paren(this=exp.column(f"__vr{i}", "__r")), expression=number(KEY_MODULUS)
        )
        parts = [
            exp.Coalesce(this=exp.Sum(this=t), expressions=[number(0)]) for t in (term, records)
        ]
        total = exp.Add(this=parts[0], expression=parts[1])
        return exp.Mod(this=exp.Paren(this=total), expression=number(KEY_MODULUS))

    def _top(self, i: int, j: int) -> exp.Expr:
        """The j-th largest contribution (by absolute value) of the cell, NULL if there is none.

        Only |x_j| enters the perturbation (only |x̂ / x_delta| and
        |x_delta| enter it), so x_1 is ``MAX(ABS(x))`` and x_j is element j of the top-k list
        aggregate ``MAX(ABS(x), k)`` (ties kept, NULLs ignored): one aggregate per cell in every
        grouping set, no sort of the rows. The value is made a DOUBLE before ``ABS``: the
        absolute value of the smallest integer of its type (``ABS(-2147483648)``) raises an
        error in the engine, which would tell that a cell holds that value. A 0 is no
        contribution (:func:`nonzero`): NULL, tested on the aggregate (zeros come last in the
        list), not on every row."""
        value = exp.Abs(this=exp.cast(exp.column(self._value(i), "__r"), exp.DataType.Type.DOUBLE))
        if j == 1:
            return nonzero(exp.Max(this=value))
        top = exp.Max(this=value, count=exp.Literal.number(self._magnitude(i).top_k))
        return nonzero(
            exp.Bracket(this=top, expressions=[exp.Literal.number(j)], offset=1, safe=True)
        )

    # -- noise layers --------------------------------------------------------------------------

    def _select_from(self, previous: exp.Select) -> exp.Select:
        select = exp.Select(
            expressions=[exp.Column(this=exp.Star(), table=exp.to_identifier(PREV))]
        )
        select.set("from_", exp.From(this=previous.subquery(PREV, copy=False)))
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
        """Perturbed counts ``__y<i>``; for magnitudes the protected count of their non-zero
        contributors ``__m<i>`` and, where needed, of their non-NULL values ``__ma<i>``; and the
        protected count of the group's units ``__cn`` that decides whether the group appears."""
        select = self._select_from(previous)
        prev = lambda c: exp.column(c, PREV)  # noqa: E731
        reused = self._count_of_units()
        if reused is not None:
            noise = cast(exp.column("v", f"__pc{reused}"), "BIGINT")
            protected = exp.Add(this=prev(f"__a{reused}"), expression=noise)
            select.append("expressions", exp.alias_(protected, "__cn"))
        elif self.count_rule.method is Method.CKM and self._presence_column() == "__cn":
            ptable = ptable_ref(self.ptables, ("counts", self.count_rule.ptable))
            row = exp.Least(this=prev("__n"), expressions=[number(ptable.max_i)])
            kind = exp.Literal.string("all")
            self._join_ptable(select, "__pcn", ptable, row, prev("__kn"), kind)
            noise = cast(exp.column("v", "__pcn"), "BIGINT")
            protected = exp.Add(this=prev("__n"), expression=noise)
            select.append("expressions", exp.alias_(protected, "__cn"))
        if self.noised_rows or any(self._own_statistic(spec) for spec in self.plan.aggregates):
            join_mix(select)  # the keys' salts; the test of its row (noised conditions)
        for i, spec in enumerate(self.plan.aggregates):
            if spec.rule.method is not Method.CKM:
                continue
            rule = spec.rule if spec.kind is AggregateKind.COUNTS else self.count_rule
            rule = self.unit_rule.get(i, rule)  # the coarser units' count: n̂ of the floor
            count = prev(f"__a{i}") if spec.kind is AggregateKind.COUNTS else prev(f"__n{i}")
            key = prev(f"__k{i}")
            if spec.kind is AggregateKind.COUNTS and self._own_statistic(spec):
                key = statistic_key_sql(key, statistic(spec))
            faults: list[exp.Expr] = []
            protected = self._protected_count(select, rule, count, key, f"__pc{i}", faults)
            name = f"__c{i}" if spec.kind is AggregateKind.COUNTS else f"__m{i}"
            select.append("expressions", exp.alias_(protected, name))
            owner = self.all_counts.get(i)
            if owner == i:
                every = self._protected_count(
                    select, rule, prev(f"__na{i}"), prev(f"__ka{i}"), f"__pca{i}", faults
                )
                select.append("expressions", exp.alias_(every, f"__ma{i}"))
            elif owner is not None and rule.method is Method.CKM:
                faults.append(missing(f"__pca{owner}"))
            if self._unit_noise(i) is not None or self.noised_rows:
                faults.append(mix_missing())  # the rows' factors were NULL: never a silent 0
            if spec.kind is AggregateKind.MAGNITUDES:
                self._contributions(select, i, protected)
                own = prev(f"__kv{i}" if i in self.per_unit else f"__k{i}")
                salted = statistic_key_sql(own, self._statistic(i))
                select.append("expressions", exp.alias_(salted, f"__q{i}"))
            select.append("expressions", exp.alias_(any_(faults), f"__e{i}_0"))
        return select

    def _contributions(self, select: exp.Select, i: int, protected: exp.Expr) -> None:
        """The running value ``__o<i>_0`` and the contributions ``__x<i>_<j>`` the noise layers
        start from: the sum and its largest values, or, in a cell of 2 or more contributors
        whose protected count ``protected`` (``__m<i>``'s expression) is under ``mean_below``
        (``__fl<i>``), its mean and that mean as its one contribution, the cell perturbed as n
        times a cell of one (:func:`sqlsdc.mechanisms.ckm.mean_below`: decided by the true
        count, the floor was a bit of it); and ``__w<i>``, what the perturbed value is divided
        by for the published mean (n, or 1)."""
        prev = lambda c: exp.column(c, PREV)  # noqa: E731
        m = self._magnitude(i)
        total = cast(prev(f"__a{i}"), "DOUBLE")
        if m.mean_below <= 2:
            select.append("expressions", exp.alias_(exp.false(), f"__fl{i}"))
            select.append("expressions", exp.alias_(prev(f"__n{i}"), f"__w{i}"))
            select.append("expressions", exp.alias_(total, f"__o{i}_0"))
            for j in range(1, m.top_k + 1):
                select.append("expressions", exp.alias_(prev(f"__t{i}_{j}"), f"__x{i}_{j}"))
            return

        def floored() -> exp.Expr:
            n = prev(f"__n{i}")
            return exp.and_(
                exp.GT(this=n, expression=number(1)),
                exp.LT(this=protected.copy(), expression=number(m.mean_below)),
            )

        mean = exp.Div(this=total, expression=prev(f"__n{i}"))
        select.append("expressions", exp.alias_(floored(), f"__fl{i}"))
        divisor = exp.Case(ifs=[exp.If(this=floored(), true=number(1))], default=prev(f"__n{i}"))
        select.append("expressions", exp.alias_(divisor, f"__w{i}"))
        start = exp.Case(ifs=[exp.If(this=floored(), true=mean)], default=total.copy())
        select.append("expressions", exp.alias_(start, f"__o{i}_0"))
        for j in range(1, m.top_k + 1):
            one = exp.Abs(this=mean.copy()) if j == 1 else exp.null()
            x = exp.Case(ifs=[exp.If(this=floored(), true=one)], default=prev(f"__t{i}_{j}"))
            select.append("expressions", exp.alias_(x, f"__x{i}_{j}"))

    def _protected_count(self, select, rule, count, key, alias: str, faults: list) -> exp.Expr:
        """The count ``count`` protected by ``rule``: ``n + v`` from the ptable row LEFT JOINed
        as ``alias`` at ``key`` (its absence appended to ``faults``), or under a frequency rule
        the count itself where it reaches the rule's minimum, else NULL."""
        if rule.method is not Method.CKM:
            reaches = at_least_column(count, rule.min_frequency)
            return exp.Case(ifs=[exp.If(this=reaches, true=count.copy())])
        ptable = ptable_ref(self.ptables, ("counts", rule.ptable))
        row = exp.Least(this=count, expressions=[number(ptable.max_i)])
        self._join_ptable(select, alias, ptable, row, key, exp.Literal.string("all"))
        faults.append(missing(alias))
        return exp.Add(this=count.copy(), expression=cast(exp.column("v", alias), "BIGINT"))

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
        count = prev(f"__m{i}")
        positive = exp.GT(this=count, expression=number(0))
        # (x̂/n)·n̂, not (x̂·n̂)/n: the contributors' mean times their protected count, so the
        # sum's bits are a function of released values; rounded from x̂·n̂ they told which true
        # counts n some x̂ fits beside the mean (red team s37a). Published to PUBLISHED_BITS
        # bits: all 53 placed the noise on its lattice of keys, which told n (red team s40a)
        mean = exp.Div(this=perturbed, expression=prev(f"__w{i}"))
        adjusted = significant(mul_expr(mean, count.copy()))
        total = exp.Case(
            ifs=[exp.If(this=positive, true=adjusted)],
            default=exp.Case(
                ifs=[exp.If(this=exp.EQ(this=count.copy(), expression=number(0)), true=number(0))]
            ),
        )
        if not isinstance(self.cells.aggregates[i], exp.Avg):
            return total
        # the published sum over the protected count of every non-NULL value, zeros included
        every = prev(f"__ma{self.all_counts[i]}")
        mean = exp.Div(this=exp.Paren(this=total), expression=every)
        return exp.Case(
            ifs=[exp.If(this=exp.GT(this=every.copy(), expression=number(0)), true=mean)]
        )

    def _statistic(self, i: int) -> str:
        """The name that salts magnitude i's key: a count over a coarser table's units has one
        name whatever its spelling (``COUNT(*)``, ``COUNT(x)``), so that spellings of one
        count of one set of units draw one noise, not several to average."""
        spec = self.plan.aggregates[i]
        if i in self.per_unit:
            return f"count:{self._counted_table()}@{self.plan.tables[self.per_unit[i]]}"
        return statistic(spec)

    @staticmethod
    def _own_statistic(spec) -> bool:
        """A CKM magnitude, or a distinct count of a dimension (not of units):
        statistics that look their noise up with a key of their own."""
        if spec.rule.method is not Method.CKM:
            return False
        if spec.kind is AggregateKind.MAGNITUDES:
            return True
        return isinstance(spec.node.this, exp.Distinct) and STATISTIC in spec.node.meta

    def _count_of_units(self) -> int | None:
        """An aggregate that is already the group's CKM count of units (COUNT(*) when each row
        is a unit): its perturbed value is the group's, so no second ptable lookup is needed."""
        if not self.plan.rows_are_units or self.count_rule.method is not Method.CKM:
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
        presence = self._presence_column()
        if k is None:  # a missing ptable entry keeps the group, whose cells then fail
            count = exp.column(presence, CELLS)
            return exp.or_(
                exp.GT(this=count, expression=number(0)),
                exp.Is(this=count.copy(), expression=exp.null()),
            )
        return at_least(presence, k)

    def _presence_column(self) -> str:
        """The protected count that decides whether a group appears: the group's own count of
        units ``__cn`` (reusing a COUNT(*) of the query when there is one), or, when the query
        counts nothing, the protected count of the non-NULL values of its first magnitude
        ``__ma<i>`` (``COUNT(x)``'s value; not that of its non-zero contributors: a group whose
        values are all 0 has a sum, 0), so that a sum needs no count of rows and its lookup.
        Either is a published protected count: a group appears exactly when one of its
        protected counts is positive. In cells a coarser table's columns define, the
        published count of that table's units the planner chose (``__y<i>`` of
        :attr:`CellPlan.presence`, :mod:`sqlsdc.planner.coarser_units`): persons appear by
        household size as the households do."""
        if self.plan.presence is not None:
            return f"__y{self.plan.presence}"
        if self.count_rule.method is Method.CKM and self._count_of_units() is None:
            for i, spec in enumerate(self.plan.aggregates):
                if spec.rule.method is Method.CKM and spec.kind is AggregateKind.MAGNITUDES:
                    return f"__ma{i}"
        return "__cn"

    def _all_counts(self) -> dict[int, int]:
        """The magnitudes that need the protected count of all their non-NULL values beside
        that of their non-zero contributors ``__m<i>``, each mapped to the aggregate whose
        ``__ma<k>`` it reads (the first of its argument): an AVG divides by it, and the first
        magnitude of a query that counts nothing shows its groups by it."""
        presence, owners, found = self._presence_column(), {}, {}
        for i in self._ckm_magnitudes():
            if isinstance(self.cells.aggregates[i], exp.Avg) or presence == f"__ma{i}":
                found[i] = owners.setdefault(self._value(i), i)
        return found

    def _final_fault(self, i: int, spec) -> exp.Expr:
        if spec.rule.method is not Method.CKM:
            return exp.false()
        steps = self._magnitude(i).top_k if spec.kind is AggregateKind.MAGNITUDES else 0
        return exp.column(f"__e{i}_{steps}", PREV)

    # -- helpers -------------------------------------------------------------------------------


def significant(value: exp.Expr) -> exp.Expr:
    """``value`` (a DOUBLE) rounded to :data:`~sqlsdc.mechanisms.ckm.PUBLISHED_BITS`
    significant bits, ``value·C − (value·C − value)`` with C = 2^(53 − bits) + 1 (Veltkamp's
    split; :func:`sqlsdc.mechanisms.ckm.published_value` says why): IEEE arithmetic that every
    engine computes alike, no LOG or ROUND whose last bits could differ."""
    splitter = number(2 ** (53 - PUBLISHED_BITS) + 1)
    scaled = mul_expr(value.copy(), splitter)
    return exp.Paren(
        this=exp.Sub(
            this=scaled,
            expression=exp.Paren(this=exp.Sub(this=scaled.copy(), expression=paren(value))),
        )
    )


def statistic(aggregate: ProtectedAggregate) -> str:
    """What an aggregate measures, independent of its rows: ``sum:persons.income``,
    ``distinct:persons.municipality`` (the guard's normal form records the base columns)."""
    kind = "distinct" if isinstance(aggregate.node.this, exp.Distinct) else "sum"
    columns = aggregate.node.meta.get(STATISTIC)
    if columns is None:
        columns = (aggregate.argument or exp.Star()).sql("duckdb")
    return f"{kind}:{columns.removeprefix('distinct:')}"

"""The suppression universe of a confidential table: the one table every release is cut from.

Under ``method: suppress`` the policy names the dimensions (``suppression.dimensions``; a
hierarchy stands for all its levels). Their cross-classification with every margin and
sub-total is protected once, for the unit counts and for every measure: the cells are computed
in SQL (per unit summed first, then per inner cell the units, the sum and the largest unit
contributions), margins, primary rules, secondary suppression and the attacker audit run on
those aggregated cells with :func:`sqlsdc.tabular.protect`. Queries then read cells of this
pattern, so no combination of releases can reveal more than the one audited table does — the
covering-table approach τ-ARGUS takes for linked tables (Hundepool et al., *Statistical
Disclosure Control*, 2012, §4.4.5; de Wolf & Giessing 2009, "Adjusting the τ-ARGUS modular
approach to deal with linked tables").

When the data or the policy change, the universe is protected again, and what earlier patterns
released stays as it was (the ledger's promise): a cell suppressed before stays suppressed, and a
cell published before whose value is unchanged is known to the attacker, so it stays published
(even when stricter rules now flag it) and the new pattern cannot rely on hiding it. Differencing
old and new releases therefore recovers no suppressed cell.

The pattern is one row per cell: ``__level`` (bit ``j`` set when universe column ``j`` is a
total in that cell), the universe columns as text (None where a total; codes are compared as
text, as in τ-ARGUS code lists), and per aggregate the published value (None when suppressed),
its status and, for measures, the number of contributors.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from sqlglot import exp

from sqlsdc.errors import TabularError
from sqlsdc.policy import AggregateKind, ColumnRole, Method, Policy, ProtectionRule

if TYPE_CHECKING:
    import pandas as pd

LEVEL = "__level"
COUNT = "count"  # the aggregate name of unit counts
STATUS, VALUE, CONTRIBUTORS = "__status", "__value", "__n"
SPREAD = "__spread"  # the most inner cells a unit of the cell lies in
SEEN = "__seen"  # a count's values published by this and every earlier pattern (JSON list)
EVERY = "__every"  # whether every unit of the table has a value of the measure (AVG's condition)
LAYOUT = 2  # the stored pattern's columns: one stored with another layout is made again


@dataclass(frozen=True)
class Universe:
    """What one confidential table's suppression protects.

    ``groups`` are the universe dimensions as ``(name, level columns coarse to fine)``; a flat
    dimension is a group of one column. ``columns`` flattens them: bit ``j`` of ``__level``
    refers to ``columns[j]``.
    """

    table: str
    unit: str
    groups: tuple[tuple[str, tuple[str, ...]], ...]
    measures: tuple[str, ...]
    counts: ProtectionRule | None  # None when counts are not protected by suppression
    magnitudes: ProtectionRule | None
    secondary: str
    cost: str
    time_limit: float
    # the policy's ``bounds: [lo, hi]`` of each measure, which an analyst reads (``sqlsdc
    # policy show``): every audit assumes the attacker knows them (red team s44i)
    bounds: tuple[tuple[str, tuple[float, float]], ...] = ()
    # the policy's GaussSuppression singleton method (``suppression: singleton``, red team s44o)
    singleton: str = "anySumAudit"

    def bound(self, measure: str) -> tuple[float, float] | None:
        """The policy's bounds of one value of ``measure``, or None."""
        return dict(self.bounds).get(measure)

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c for _name, levels in self.groups for c in levels)

    @property
    def aggregates(self) -> tuple[str, ...]:
        """``count`` (when counts are suppressed) and every measure (when magnitudes are)."""
        return ((COUNT,) if self.counts else ()) + (self.measures if self.magnitudes else ())

    def rules(self, aggregate: str) -> list:
        """The primary rules of one aggregate (policy ``rules``, or the defaults)."""
        from sqlsdc.tabular.rules import FrequencyRule, PPercentRule, parse_rule

        rule = self.counts if aggregate == COUNT else self.magnitudes
        if rule.rules:
            return [parse_rule(r) for r in rule.rules]
        defaults = [FrequencyRule(min_freq=rule.min_frequency)]
        return defaults if aggregate == COUNT else [PPercentRule(), *defaults]

    def settings(self) -> dict:
        """Everything of the policy the pattern depends on (part of its fingerprint)."""
        settings = {
            "groups": self.groups,
            "measures": self.measures,
            "rules": {a: [repr(r) for r in self.rules(a)] for a in self.aggregates},
            "secondary": self.secondary,
            "cost": self.cost,
            "layout": LAYOUT,
        }
        if self.bounds and self.magnitudes:  # read by the measures' audits only (s44i)
            settings["bounds"] = [[m, list(b)] for m, b in self.bounds]
        if self.singleton != "anySum":  # anySum, the default of older catalogs, keeps the
            # fingerprints they stored; any other method, the default anySumAudit too, changes them
            settings["singleton"] = self.singleton
        return settings


def universe_of(policy: Policy, table_name: str) -> Universe:
    """The universe the policy declares for a table whose counts or magnitudes are suppressed."""
    table = policy.table(table_name)
    spec = table.suppression
    if spec is None:
        raise TabularError(f"table {table.name} has no suppression universe in the policy")
    groups = tuple((name, tuple(table.hierarchies.get(name, (name,)))) for name in spec.dimensions)
    measures = tuple(c.name for c in table.columns.values() if c.role is ColumnRole.MEASURE)
    rules = {k: table.rule(k) for k in AggregateKind}
    return Universe(
        table=table.name,
        unit=table.privacy_unit,
        groups=groups,
        measures=measures,
        counts=_if_suppress(rules[AggregateKind.COUNTS]),
        magnitudes=_if_suppress(rules[AggregateKind.MAGNITUDES]),
        secondary=spec.secondary.value,
        cost=spec.cost,
        time_limit=spec.time_limit,
        bounds=tuple(
            (c.name, (float(c.bounds[0]), float(c.bounds[1])))
            for c in table.columns.values()
            if c.role is ColumnRole.MEASURE and c.bounds is not None
        ),
        singleton=spec.singleton,
    )


def _if_suppress(rule: ProtectionRule) -> ProtectionRule | None:
    return rule if rule.method is Method.SUPPRESS else None


def top_k(universe: Universe) -> int:
    """Largest contributions per cell the magnitude rules read."""
    from sqlsdc.tabular.rules import required_top_k

    if not universe.magnitudes or not universe.measures:
        return 0
    return max(required_top_k(universe.rules(m)) for m in universe.measures)


def inner_cells_sql(universe: Universe) -> exp.Select:
    """Per inner cell of the universe: ``__units`` and, per measure, ``<m>__sum``,
    ``<m>__n`` (units with a value), ``<m>__nz`` (units whose total is not 0: the frequency
    rule's contributors, :func:`_zero_cells_counted`) and ``<m>__top`` (largest unit
    contributions, a list).

    A unit's rows in one cell are one contribution (summed first), as the rules require.
    ``__spread`` is the most inner cells any unit of the cell lies in: margins add up the inner
    cells' units and take their largest contributions from the inner cells, which is right only
    when it is 1 (:func:`protect_universe` refuses more).
    """
    dims = [exp.column(c) for c in universe.columns]
    unit = exp.column(universe.unit)
    per_unit = exp.select(unit, *[d.copy() for d in dims]).from_(universe.table)
    for m in universe.measures:
        per_unit = per_unit.select(exp.alias_(exp.Sum(this=exp.column(m)), m))
    cells_of_unit = exp.Window(this=exp.Count(this=exp.Star()), partition_by=[unit.copy()])
    per_unit = per_unit.select(exp.alias_(cells_of_unit, SPREAD))
    per_unit = per_unit.group_by(unit.copy(), *[d.copy() for d in dims])
    # each key named as the universe names it: DuckDB names a result column as the table
    # spells it: a table's NACE is no 'nace' (test_a_table_whose_columns_are_named_in_capitals)
    keys = [exp.alias_(exp.column(c), c, quoted=True) for c in universe.columns]
    cells = exp.select(*keys).from_(per_unit.subquery("__u"))
    cells = cells.select(
        exp.alias_(exp.Count(this=exp.Star()), "__units"),
        exp.alias_(exp.Max(this=exp.column(SPREAD)), SPREAD),
    )
    k = top_k(universe)
    zero = exp.Literal.number(0)
    for m in universe.measures if universe.magnitudes else ():
        x = exp.column(m)
        cells = cells.select(
            exp.alias_(exp.Sum(this=x.copy()), f"{m}__sum"),
            exp.alias_(exp.Count(this=x.copy()), f"{m}__n"),
            exp.alias_(exp.Count(this=exp.Nullif(this=x.copy(), expression=zero)), f"{m}__nz"),
            exp.alias_(exp.Max(this=x.copy(), count=exp.Literal.number(k)), f"{m}__top"),
        )
    cells = cells.group_by(*[d.copy() for d in dims])
    return cells.order_by(*[exp.Ordered(this=d.copy(), nulls_first=True) for d in dims])


def fingerprint(universe: Universe, cells: pd.DataFrame) -> str:
    """Changes whenever the inner cells (data) or the policy settings of the pattern change.

    Sums of floating-point measures are read to :data:`SUM_DIGITS` significant digits: the
    engine adds a cell's rows in no fixed order, so the last bits of ``income__sum`` differed
    from one computation to the next, and every opening that read the pattern protected the
    universe anew (session 40: 165 of the demo's persons cells, two computations in a row)."""
    digest = hashlib.sha256(json.dumps(universe.settings(), sort_keys=True).encode())
    steady = cells.copy()
    for column in steady.columns:
        if steady[column].dtype == object:  # lists of largest contributions
            steady[column] = steady[column].map(_steady)
    digest.update(steady.to_csv(index=False, float_format=f"%.{SUM_DIGITS}g").encode())
    return digest.hexdigest()


SUM_DIGITS = 13  # a cent of a sum below 10^11; summation order moves the 16th


def _steady(value):
    """A list of floats as text to :data:`SUM_DIGITS` digits; anything else as it is."""
    if isinstance(value, list | tuple | np.ndarray):
        return "[" + ",".join(f"{float(v):.{SUM_DIGITS}g}" for v in value) + "]"
    return value

"""The key of a distinct count of units: the counted units' own record keys, however the query
reaches them.

``COUNT(DISTINCT persons.household_id)`` counts households, as ``COUNT(DISTINCT
h.household_id)`` over persons ⋈ households and ``COUNT(*)`` of households do. The cell key
method (and rounding's coin) must give one set of households one key whichever of these an
analyst writes, or each spelling draws its own noise of one number and their average converges
on it (red team s29b). Rows that carry the counted unit's record key (a one-row-per-unit table
counting its own unit, or a unit the plan exposes: :attr:`CellPlan.units`) are keyed as they
are; otherwise the units' keys are looked up with a LEFT JOIN of the counted table on the
counted column (``ON persons.household_id = __ref0.__ru``), one row per unit, so the join never
repeats the query's rows. The value joined is a stored identifier passed through unchanged (the
guard refuses computed identifiers), never a value the analyst chooses.

A value that matches no unit (an orphan reference) is still counted, as SQL counts it, and is a
unit of its own: its key is the secret mix of the statistic keys (:mod:`sqlsdc.rewrite.ckm_mix`)
applied to DuckDB's ``hash`` of the value, salted by the counted table and column. The cell key
is the sum over the set of units counted (Thompson, Broadfoot & Elazar 2013, the ABS method;
sdcTools ``cellKey``: "the same set of contributors always gives the same key", digest
``seed_2022_part1.md`` §6): a function of which units a cell counts, not of the rows that name
them. Keyed by the persons naming it (the rows' key), an orphan would draw new noise of one
count under every filter that dropped some of its persons and kept the orphan (red team
s30c). A cell with orphans still gets other noise than the same units without them,
and not that of its persons' ``COUNT(*)``. The mix is keyed (124 secret bits, never in the SQL
text) but not a cryptographic PRF; the values it mixes are identifiers, which a query can
neither filter on nor compute. The same value is one unit in every table that names it when
those columns hold it alike: DuckDB's ``hash`` of an integer is the same at every width
(INTEGER, BIGINT, HUGEINT, DECIMAL of scale 0 hash 5 alike, red team s38e), but a VARCHAR '5'
keys apart from 5.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.catalog.keys import RKEY
from sqlsdc.catalog.ptables import KEY_MODULUS
from sqlsdc.planner.plan import CellPlan, CountedUnits
from sqlsdc.policy import Method
from sqlsdc.rewrite.ckm_mix import join_mix, statistic_key_sql

LOOKUP, UNIT = "__ref", "__ru"  # a lookup of record keys, its unit column


def unit_lookups(
    plan: CellPlan, arguments: list[exp.Expr | None], method: Method
) -> dict[int, int]:
    """The aggregates of ``method`` that count units whose record keys the rows do not carry,
    each mapped to its lookup (one per counted table and column). ``arguments``: the
    aggregates' arguments in the tree being rewritten."""
    found: list[tuple[str, exp.Expr]] = []
    lookups: dict[int, int] = {}
    for i, spec in enumerate(plan.aggregates):
        counted = spec.counted
        if counted is None or spec.rule.method is not method:
            continue
        if plan.units is None and not counted.referenced:
            continue  # one row per unit, counting its own unit: the rows' keys
        if plan.units is not None and spec.argument in plan.units:
            continue  # a unit the rows carry, with its key
        key = (counted.table, arguments[i])
        if key not in found:
            found.append(key)
        lookups[i] = found.index(key)
    return lookups


def join_unit_keys(
    select: exp.Select, plan: CellPlan, arguments: list[exp.Expr | None], lookups: dict[int, int]
) -> list[exp.Expr]:
    """Append one ``LEFT JOIN`` of record keys per lookup to ``select`` (mutated: a select the
    caller built), and the mix when there is one, and return each lookup's key of the unit a
    row names: the looked-up record key, else (an orphan) the key of the value, NULL for NULL."""
    keys = []
    for j in sorted(set(lookups.values())):
        i = min(i for i, looked_up in lookups.items() if looked_up == j)
        alias = f"{LOOKUP}{j}"
        counted = plan.aggregates[i].counted
        lookup = unit_keys(counted).subquery(alias)
        on = exp.EQ(this=arguments[i].copy(), expression=exp.column(UNIT, alias))
        select.append("joins", exp.Join(this=lookup, side="LEFT", on=on))
        orphan = orphan_key(arguments[i], counted)
        keys.append(exp.Coalesce(this=exp.column(RKEY, alias), expressions=[orphan]))
    if keys:
        join_mix(select)
    return keys


def orphan_key(value: exp.Expr, counted: CountedUnits) -> exp.Expr:
    """``CASE WHEN value IS NOT NULL THEN mix(hash(value) % 2^32) END``: the key of a value that
    names no unit of ``counted`` (its own, whichever rows name it), in [0, 2^32); NULL counts
    nothing and keys nothing (``hash(NULL)`` is a constant, not NULL)."""
    hashed = exp.Mod(
        this=exp.Anonymous(this="hash", expressions=[value.copy()]),
        expression=exp.Literal.number(KEY_MODULUS),
    )
    key = statistic_key_sql(hashed, f"unit:{counted.table}.{counted.column}")
    present = exp.Not(this=exp.Is(this=value.copy(), expression=exp.null()))
    return exp.Case(ifs=[exp.If(this=present, true=key)])


def unit_keys(counted: CountedUnits) -> exp.Select:
    """One row per unit of the counted table with its record key (all rows of a unit share
    one): ``SELECT unit AS __ru, __rkey FROM table``, grouped by the unit unless the table has
    one row per unit."""
    unit = exp.column(counted.column, "__t")
    key = exp.column(RKEY, "__t")
    select = exp.Select(
        expressions=[
            exp.alias_(unit, UNIT),
            exp.alias_(key if counted.unique else exp.Min(this=key), RKEY),
        ]
    )
    table = exp.Table(this=exp.to_identifier(counted.table)).as_("__t")
    select.set("from_", exp.From(this=table))
    return select if counted.unique else select.group_by(unit.copy(), copy=False)


def counted_units_key(key: exp.Expr) -> exp.Expr:
    """``SUM(DISTINCT key) % 2^32`` over a cell's rows, ``key`` a lookup's key of the unit each
    row names (:func:`join_unit_keys`): each unit counted once, whichever rows name it."""
    total = exp.Coalesce(
        this=exp.Sum(this=exp.Distinct(expressions=[key.copy()])),
        expressions=[exp.Literal.number(0)],
    )
    return exp.Mod(this=exp.Paren(this=total), expression=exp.Literal.number(KEY_MODULUS))

"""A protection job's WHERE as the rows it keeps: a unit-noised measure compared as x·m.

Under the cell key method a table's magnitudes may carry permanent unit noise
(:mod:`sqlsdc.mechanisms.unit_noise`): every contribution x enters every sum as x·m, and the
query path compares x·m wherever such a measure is compared at a class break
(:mod:`sqlsdc.rewrite.noised_conditions`, red team s45l). A job whose WHERE compared the stored
x (``WHERE employees >= 10``) beside the queries' sums of x·m told, for the units near the
break, which side of 1 their factor lies on. So :func:`sqlsdc.jobs.tabulation.parse_job`
converts the WHERE once, with the query path's own rewrite, and every reader of
:attr:`~sqlsdc.jobs.tabulation.JobSpec.where` (the cells, the population identity, the
differencing and held-cut checks, stored outputs re-parsed) sees the x·m comparison.

Those readers put the WHERE into selects of their own over the table (``SELECT ... FROM
table WHERE ...``, ``bool_and(COALESCE(where, FALSE))``), which do not join the secret mix: the
mix's constants are therefore read by scalar subqueries of ``sqlsdc.ckm_mix`` (one row), so
the condition is a function of the table's row alone. The SQL names the catalog table, never
the constants. A comparison the rewrite cannot compute on x·m (a function of the column) is
refused, as in a query (fail closed); a stored output's SQL is read as its cells were
tabulated then.
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.errors import PolicyViolation, TabularError
from sqlsdc.policy import Policy
from sqlsdc.rewrite.ckm_mix import CKM_MIX, MIX
from sqlsdc.rewrite.noised_conditions import any_unit_noise, noise_conditions, policy_lookup


def noised_where(
    select: exp.Select, policy: Policy, sql: str, *, stored: bool = False
) -> exp.Expr | None:
    """The WHERE condition of the job ``select`` (one aggregation of one table) with each
    compared unit-noised measure replaced by x·m, the mix's constants read by scalar
    subqueries; None without a WHERE. Only the WHERE is converted (a copy of it, over the
    job's FROM). ``sql``: the job's text, which a refusal shows.

    Raises:
        TabularError: a comparison reads such a measure as a function of it
            (``employees * 2 >= 20``), which cannot be compared as x·m. A ``stored`` output's
            SQL is not refused: no such job was stored with its WHERE converted, so its
            cells were tabulated by the WHERE as written, which is returned."""
    where = select.args.get("where")
    if where is None:
        return None
    if not any_unit_noise(policy):
        return where.this
    probe = exp.Select(expressions=[exp.Star()], from_=select.args["from_"].copy())
    probe.set("where", where.copy())
    lookup = policy_lookup(policy)
    table = probe.args["from_"].this
    measures = [c for c in probe.args["where"].find_all(exp.Column) if lookup(table.name, c.name)]
    try:
        converted = noise_conditions(probe, lookup, lambda: sql)
        _refuse_unconverted(probe, measures, lookup, table.name)
    except PolicyViolation as refusal:
        if stored:
            return where.this
        raise TabularError(f"the job's WHERE: {refusal}") from None
    if not converted:
        return where.this
    condition = probe.args["where"].this
    for column in list(condition.find_all(exp.Column)):
        if column.table == MIX:
            column.replace(exp.select(column.name).from_(CKM_MIX.copy()).subquery())
    return condition


def _refuse_unconverted(probe: exp.Select, measures: list[exp.Column], lookup, table: str) -> None:
    """Refuse a unit-noised measure of ``measures`` (the WHERE's columns before the
    conversion) that the conversion left reading the stored x: one the WHERE reads otherwise
    than compared in the job's own select (inside a subquery, ``(SELECT employees >= 10)``,
    ``EXISTS (SELECT 1 WHERE employees >= 10)``, or a function no comparison holds,
    ``list_contains([10, 20], employees)``) would keep the rows of x beside sums of x·m (red
    team s46j: 226 enterprises kept where ``employees >= 10`` keeps the 216 of x·m). A test
    ``IS [NOT] NULL`` is the same of x and x·m and stays."""
    left = {id(c) for c in probe.find_all(exp.Column)}
    for column in measures:
        if id(column) not in left:
            continue  # converted: replaced by x·m
        if isinstance(column.parent, exp.Is) and isinstance(column.parent.expression, exp.Null):
            continue
        name, _noise = lookup(table, column.name)
        raise PolicyViolation(
            f"{column.parent.sql('duckdb')[:80]}: {name} carries a permanent noise factor per "
            "unit, and a condition on it compares the noised value x·m; this one reads the "
            "stored value (in a subquery, or through a function)",
            f"compare {column.name} as it is with a class break in the job's own WHERE "
            f"({column.name} >= break), or test it IS NULL",
        )

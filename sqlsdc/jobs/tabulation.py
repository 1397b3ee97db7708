"""What a protection job tabulates, and its table built from inner cells computed in SQL.

A job's SQL is one aggregation of one confidential table (:func:`parse_job`, a
:class:`JobSpec`). Its inner cells are computed in SQL (:func:`cells_sql`: one row per inner
cell with units, total and the largest unit contributions as the list aggregate
``MAX(x, k)``), and margins, rules and the method then run on a :class:`~sqlsdc.tabular.model.Table`
built from those aggregated cells (:func:`cells_table`), whose dimensions fold a declared
hierarchy's grouped levels into one (:func:`table_dims`). No database is read here; the job
(:mod:`sqlsdc.jobs.job`) runs the SQL, and the checks against stored outputs parse their SQL
with :func:`parse_job` too.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from difflib import get_close_matches

import numpy as np
import pandas as pd
import sqlglot
from sqlglot import exp

from sqlsdc.catalog.keys import RKEY
from sqlsdc.errors import SqlSyntaxError, TabularError
from sqlsdc.jobs.noised_where import noised_where
from sqlsdc.mechanisms.parameters import UnitNoise
from sqlsdc.policy import AggregateKind, ColumnRole, Policy
from sqlsdc.rewrite.ckm_mix import join_mix
from sqlsdc.rewrite.unit_noise import noised
from sqlsdc.tabular.model import Hierarchy, Table
from sqlsdc.tabular.rules import FrequencyRule, default_rules


@dataclass(frozen=True)
class JobSpec:
    """What a protection job tabulates: ``SELECT dims, SUM(measure)|COUNT(*) FROM table``.

    A frequency table counts units (the rules protect units); ``rows`` is set when the SQL
    counts rows (``COUNT(*)``), which are the units only where each unit has one row (checked
    by :meth:`sqlsdc.jobs.job.Job.tabulate`); ``COUNT(DISTINCT unit)`` counts units in any
    table."""

    table: str
    dims: tuple[str, ...]
    measure: str | None  # None: a frequency table
    unit: str
    where: exp.Expr | None  # the rows kept: a unit-noised measure compared as x·m (noised_where)
    rows: bool = False
    unit_noise: UnitNoise | None = None  # a sum's permanent unit noise (:func:`measure_sum`)
    written: exp.Expr | None = None  # the WHERE as the SQL writes it (:func:`population_where`)


def population_where(spec: JobSpec) -> exp.Expr | None:
    """The WHERE that names a job's population in the ledger and in the identities of its kept
    cells: as its SQL writes it (``employees >= 10``), as the query path names a population by
    the WHERE it analysed, never the x·m condition :attr:`JobSpec.where` computes its rows by
    (:mod:`sqlsdc.jobs.noised_where`: about 4 KB of SQL per ledger row, the same rows). Only
    a name: every reader of rows reads :attr:`JobSpec.where`."""
    return spec.where if spec.written is None else spec.written


def parse_job(sql: str, policy: Policy, *, stored: bool = False) -> JobSpec:
    """Check a job's SQL against the policy: one confidential table, dimensions as keys.

    ``stored``: the SQL of an output stored earlier, which its readers hold whatever the policy
    now says of its columns; any column of the table is then taken as a dimension or measure
    (else, once ``occupation`` is no dimension any more, a table by occupation would be left
    out of the checks of later jobs, and a job of the same people less one stored: red team
    s38b)."""
    try:
        tree = sqlglot.parse_one(sql, read="duckdb")
    except sqlglot.errors.ParseError as e:
        raise SqlSyntaxError(f"the job's SQL does not parse: {e}") from None  # exit code 6
    shape = (
        "SELECT dim, ..., SUM(measure) | COUNT(*) | COUNT(DISTINCT unit) FROM table [WHERE ...] "
        "GROUP BY dim, ..."
    )
    if not isinstance(tree, exp.Select) or tree.args.get("joins") or tree.args.get("with_"):
        raise TabularError(f"a protection job is one aggregation of one table: {shape}")
    source = tree.args.get("from_")
    if source is None or not isinstance(source.this, exp.Table):
        raise TabularError(f"a protection job reads one table: {shape}")
    table = policy.declared(source.this.name)
    if table.is_public:
        raise TabularError(f"{source.this.name} is not a confidential table of the policy")
    group = tree.args.get("group")
    keys = [e for e in (group.expressions if group else [])]
    aggregates = [e.unalias() for e in tree.expressions if e.unalias().find(exp.AggFunc)]
    dims = tuple(k.name.lower() for k in keys if isinstance(k, exp.Column))
    if (
        len(dims) != len(keys)
        or not dims
        or any(
            table.column(d) is None
            or (table.column(d).role is not ColumnRole.DIMENSION and not stored)
            for d in dims
        )
    ):
        raise TabularError(_not_by_dimensions(keys, table, stored, shape))
    if len(aggregates) != 1:
        raise TabularError(f"a protection job has exactly one aggregate: {shape}")
    aggregate = aggregates[0]
    counted = aggregate.this.expressions if isinstance(aggregate.this, exp.Distinct) else []
    rows = isinstance(aggregate, exp.Count) and isinstance(aggregate.this, exp.Star)
    if rows:
        measure = None
    elif (
        isinstance(aggregate, exp.Count)
        and len(counted) == 1
        and isinstance(counted[0], exp.Column)
        and counted[0].name.lower() == table.privacy_unit.lower()
    ):
        measure = None
    elif isinstance(aggregate, exp.Sum) and isinstance(aggregate.this, exp.Column):
        measure = aggregate.this.name.lower()
        declared = table.column(measure)
        if declared is None or (declared.role is not ColumnRole.MEASURE and not stored):
            raise TabularError(
                f"{_what_column_is(measure, table, ColumnRole.MEASURE)}: SUM a measure of "
                f"{table.name} ({_names(table, ColumnRole.MEASURE)})"
            )
    else:
        raise TabularError(
            f"the aggregate must be SUM(measure) or COUNT(*) (or COUNT(DISTINCT "
            f"{table.privacy_unit})): {shape}"
        )
    written = tree.args.get("where")
    where = noised_where(tree, policy, sql, stored=stored)  # x·m: a unit-noised measure compared
    noise = _unit_noise(table) if measure is not None else None
    return JobSpec(table.name, dims, measure, table.privacy_unit, where, rows, noise,
                   written and written.this)  # fmt: skip


def _not_by_dimensions(keys: list[exp.Expr], table, stored: bool, shape: str) -> str:
    """Why a job's GROUP BY is refused, naming the key at fault and the table's dimensions:
    "group by dimension columns of T only" left a misspelt ``nac`` or an identifier to be
    found by eye (new user s47f)."""
    dimensions = _names(table, ColumnRole.DIMENSION)
    if not keys:
        why = "the SQL has no GROUP BY"
    else:
        key = next(
            k for k in keys
            if not isinstance(k, exp.Column)
            or table.column(k.name) is None
            or (table.column(k.name).role is not ColumnRole.DIMENSION and not stored)
        )  # fmt: skip
        if isinstance(key, exp.Column):
            why = _what_column_is(key.name.lower(), table, ColumnRole.DIMENSION)
        else:
            why = f"{key.sql('duckdb')} is an expression, not a column"
    return (
        f"{why}: a protection job groups by dimension columns of {table.name} "
        f"({dimensions}): {shape}"
    )


def _what_column_is(name: str, table, wanted: ColumnRole) -> str:
    """``name`` is not of the ``wanted`` role in ``table``: it is no column of it (and the
    close names of that role), or its role."""
    column = table.column(name)
    if column is None:
        close = get_close_matches(name, [n for n, c in table.columns.items()
                                         if c.role is wanted], n=2)  # fmt: skip
        guess = f" (did you mean {' or '.join(close)}?)" if close else ""
        return f"{table.name} has no column {name}{guess}"
    return f"{name} is {_ARTICLE[column.role]} {column.role.value} column of {table.name}"


_ARTICLE = {role: "an" if role.value[0] in "aeiou" else "a" for role in ColumnRole}


def _names(table, role: ColumnRole) -> str:
    """The table's columns of ``role``, for a message."""
    return ", ".join(sorted(n for n, c in table.columns.items() if c.role is role)) or "none"


def _unit_noise(table) -> UnitNoise | None:
    """The permanent unit noise of the table's CKM magnitudes, which a job's sums carry too."""
    rule = table.rule(AggregateKind.MAGNITUDES)
    return None if rule.magnitude is None else rule.magnitude.unit_noise


def measure_sum(spec: JobSpec) -> exp.Expr:
    """``SUM(measure)`` as the job adds it up: each value times its unit's permanent factor
    when the table's magnitudes carry unit noise (:mod:`sqlsdc.mechanisms.unit_noise`), the
    contributions the query path sums, so that a job's cell and a query's padded average tell
    the same x·m and never x (a job's sum of the stored values beside it would tell m).
    Read from :func:`job_source`."""
    x: exp.Expr = exp.column(spec.measure)
    if spec.unit_noise is not None:
        x = noised(x, exp.column(RKEY), (f"{spec.table}.{spec.measure}",), spec.unit_noise)
    return exp.Sum(this=x)


def job_source(select: exp.Select, spec: JobSpec) -> exp.Select:
    """``select`` FROM the job's table, joined to the secret mix when its sums carry unit
    noise (:func:`measure_sum`)."""
    select = select.from_(exp.to_table(spec.table))
    if spec.unit_noise is not None:
        join_mix(select)
    return select


def cells_sql(spec: JobSpec, top_k: int) -> str:
    """Inner cells: units, total and the ``top_k`` largest unit contributions, per unit summed
    first (a unit's rows are one contribution), ``spread``: the most inner cells any unit of
    the cell lies in (1 when every unit is in one cell, which the margins' counts and largest
    contributions assume), and ``rows``: the most rows a unit of the cell has. A sum's cells
    count also ``nz``, the units whose total is not 0, and ``nv``, those with a value."""
    unit = exp.column(spec.unit)
    contribution = measure_sum(spec) if spec.measure else exp.Literal.number(1)
    per_unit = job_source(exp.select(unit, *(exp.column(d) for d in spec.dims)), spec)
    cells_of_unit = exp.Window(this=exp.Count(this=exp.Star()), partition_by=[unit.copy()])
    per_unit = per_unit.select(
        exp.alias_(contribution, "x"),
        exp.alias_(cells_of_unit, "k"),
        exp.alias_(exp.Count(this=exp.Star()), "r"),
    )
    if spec.where is not None:
        per_unit = per_unit.where(spec.where.copy())
    per_unit = per_unit.group_by(unit.copy(), *(exp.column(d) for d in spec.dims))
    # each key named as the spec names it (lower case): DuckDB names a result column as the
    # table spells it, and a table's NACE would leave the cells without a 'nace'
    # (test_a_job_on_columns_named_in_capitals)
    keys = (exp.alias_(exp.column(d), d, quoted=True) for d in spec.dims)
    cells = exp.select(*keys).from_(per_unit.subquery("u"))
    cells = cells.select(
        exp.alias_(exp.Count(this=exp.Star()), "n"),
        exp.alias_(exp.Max(this=exp.column("k")), "spread"),
        exp.alias_(exp.Max(this=exp.column("r")), "rows"),
        exp.alias_(exp.Sum(this=exp.column("x")), "value"),
    )
    if spec.measure:  # the frequency rule's contributors (:func:`cells_table`)
        x = exp.column("x")
        cells = cells.select(
            exp.alias_(exp.Count(this=exp.Nullif(this=x, expression=exp.Literal.number(0))), "nz"),
            exp.alias_(exp.Count(this=x.copy()), "nv"),
        )
    if top_k:
        top = exp.Max(this=exp.column("x"), count=exp.Literal.number(top_k))
        cells = cells.select(exp.alias_(top, "top"))
    return cells.group_by(*(exp.column(d) for d in spec.dims)).sql("duckdb")


def table_dims(spec: JobSpec, policy: Policy) -> list[str]:
    """The dimension columns of a job's table: the levels of a declared hierarchy that the job
    groups by from its top (``geography: [region, municipality]``) fold into one dimension
    named after it, the other keys stay as they are."""
    dims, folded = [], set()
    for name, levels in policy.table(spec.table).hierarchies.items():
        present = [level for level in levels if level in spec.dims]
        if len(present) >= 2 and present == list(levels)[: len(present)]:
            folded |= set(present)
            dims.append(name)
    return dims + [d for d in spec.dims if d not in folded]


def cells_table(frame: pd.DataFrame, spec: JobSpec, policy: Policy, top_k: int) -> Table:
    """A :class:`Table` from inner cells (dimensions: :func:`table_dims`): a hierarchy's
    dimension holds municipality codes in inner cells and region codes in sub-totals."""
    dims, hierarchies = table_dims(spec, policy), {}
    cells = frame[["n", "value"]].copy()
    for name, levels in policy.table(spec.table).hierarchies.items():
        if name in dims:
            present = [level for level in levels if level in spec.dims]
            hierarchies[name] = Hierarchy.from_levels(
                frame.astype({p: str for p in present}), present
            )
            cells[name] = frame[present[-1]].astype(str)
    for d in dims:
        if d not in hierarchies:
            cells[d] = frame[d].astype(str)
    tops = []
    if top_k:
        for j in range(top_k):
            name = f"top{j + 1}"
            cells[name] = [  # no list where every contribution is NULL (pandas NA)
                t[j] if isinstance(t, list | tuple | np.ndarray) and len(t) > j else 0.0
                for t in frame["top"]
            ]
            tops.append(name)
    table = Table.from_cells(cells, dims, top=tops, hierarchies=hierarchies or None)
    if "nz" not in frame.columns:
        return table
    summed = {}
    for count in ("nz", "nv"):
        other = Table.from_cells(cells.assign(n=frame[count]), dims, top=[],
                                 hierarchies=hierarchies or None)  # fmt: skip
        if not other.cells[dims].equals(table.cells[dims]):  # pragma: no cover - same input
            raise TabularError("the job's cells came out in another order; this is a bug")
        summed[count] = other.n
    counted = np.where(summed["nz"] > 0, summed["nz"], summed["nv"])
    return dataclasses.replace(table, cells=table.cells.assign(**{CONTRIBUTORS: counted}))


CONTRIBUTORS = "contributors"  # a sum's cells: the frequency rule's count (:func:`rated`)


def rated(table: Table) -> Table:
    """``table`` as its rules read it: a sum's ``n`` the units whose total in the cell is not
    0 (margins summed), a cell of zeros only counting its units with a value instead, as the
    query path counts a magnitude's contributors
    (:func:`sqlsdc.tabular.universe_pattern._zero_cells_counted`; GaussSuppression's
    ``NContributorsRule`` with ``remove0 = TRUE``); a count's ``n`` as it is. The job still
    publishes ``n``, every unit its WHERE keeps in the cell. Red team s40b: counted with their
    zeros and NULLs, 6 municipality x sex cells of 3-4 incomes on the demo passed ``freq:5``
    and were published."""
    if CONTRIBUTORS not in table.cells.columns:
        return table
    return dataclasses.replace(table, cells=table.cells.assign(n=table.cells[CONTRIBUTORS]))


def rules_of(policy: Policy, spec: JobSpec, rules=None) -> list:
    """A job's primary rules: ``rules``, or the defaults, the frequency rule with the policy's
    minimum frequency for the job's table, plus the p%-rule (p = 10) for magnitudes
    (:func:`sqlsdc.jobs.job.job_rules`)."""
    if rules is not None:
        return list(rules)
    table_rule = policy.table(spec.table).protection
    counts = next(iter(table_rule.values())).min_frequency
    found = [FrequencyRule(min_freq=counts)]
    if spec.measure is not None:
        found = default_rules(False)[1:] + found
    return found

"""Stored values a protected sum may add up: finite, and small enough that no sum overflows.

A SUM or AVG over a floating-point column is NaN or infinite as soon as one of its rows holds
NaN or ±infinity, or its values add up past the largest double (about 1.8e308). Whatever
mechanism protects the cell, such a value survives it (NaN plus noise is NaN), and a WHERE
clause narrowing the cell to one person would tell whether that person holds it. An error or
a NULL in its place would tell the same.

So the columns a query sums are checked over their whole table, before anything is run or
charged: each value must be NaN-free, finite and at most :data:`SUMMABLE_MAGNITUDE` in
magnitude. The answer is a fact about the table, the same for every query, and a table that
fails refuses every sum over that column until an admin corrects the data. With the bound, a
cell of up to 10^12 rows of products of a measure and a weight stays below 10^293, far from
overflow, and so does its cell-key perturbation. Integer and DECIMAL(p <= 18) columns cannot
fail it and are not scanned (:mod:`sqlsdc.planner.aggregates` marks the columns to check).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import pyarrow as pa
from sqlglot import exp

from sqlsdc.errors import PolicyViolation

SUMMABLE_MAGNITUDE = 1e140
"""The largest magnitude of a floating-point value that a protected sum adds up."""

Checked = dict[tuple[str, str], bool]
"""(table, column) -> whether every stored value of the column may be summed."""


def check_summable(
    columns: Iterable[tuple[str, str]], checked: Checked, run: Callable[[exp.Select], pa.Table]
) -> None:
    """Refuse a query that sums a column holding a value it cannot add up (module docstring).

    ``checked`` caches the answers (the caller clears it when the data may have changed);
    columns not in it are scanned, one statement per table, by ``run``.

    Raises:
        PolicyViolation: a column holds NaN, ±infinity or a value beyond the bound.
    """
    columns = sorted(set(columns))
    unknown: dict[str, list[str]] = {}
    for table, column in columns:
        if (table, column) not in checked:
            unknown.setdefault(table, []).append(column)
    for table, names in unknown.items():
        found = run(_scan(table, names)).to_pylist()[0]
        for i, column in enumerate(names):
            checked[(table, column)] = not found[f"c{i}"]
    bad = [f"{table}.{column}" for table, column in columns if not checked[(table, column)]]
    if bad:
        raise PolicyViolation(
            f"{', '.join(bad)} {'holds' if len(bad) == 1 else 'hold'} values that no protected "
            f"sum can add up (NaN, ±infinity or beyond ±{SUMMABLE_MAGNITUDE:g}): its cells "
            "would tell which rows hold them",
            "ask an admin to correct or remove those values; counts are still answered",
        )


def _scan(table: str, columns: list[str]) -> exp.Select:
    """One row: for each column, whether any of its values is NaN, infinite or too large
    (NaN compares above every number in DuckDB and Spark, so ``NOT |x| <= bound`` holds
    for it; NULLs are not summed and pass, as does an empty table)."""
    bound = exp.Literal.number(repr(SUMMABLE_MAGNITUDE))
    flags = []
    for i, column in enumerate(columns):
        value = exp.Abs(this=exp.cast(exp.column(column, quoted=True), "DOUBLE"))
        bad = exp.Not(this=exp.LTE(this=value, expression=bound.copy()))
        flag = exp.Case(ifs=[exp.If(this=bad, true=exp.Literal.number(1))])
        flags.append(exp.alias_(exp.Max(this=flag), f"c{i}"))
    return exp.select(*flags).from_(exp.table_(table, quoted=True))

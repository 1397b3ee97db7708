"""Notes at ``policy apply`` on dimensions that are classes of a unit-noised measure.

A dimension that is, in the stored data, the class of a measure carrying permanent unit noise
(the demo's ``size_class`` of ``employees``) tells the class of the stored x, which the x·m
comparisons and sums hide (red team s46j: the branch of m of 26 of 1,000 enterprises, x within
2.4 %). Declared ``classes_of`` it is read as the class of x·m
(:mod:`sqlsdc.rewrite.derived_classes`); left undeclared it is a policy mistake, which this
cheap test of the stored data tells the admin applying the policy: a dimension whose values
each hold a separate range of the measure (a monotone step function of it, two values or
more). A declared one whose stored values disagree with the class of the stored measure is
told too (the declaration describes other data).
"""

from __future__ import annotations

from sqlglot import exp

from sqlsdc.policy import AggregateKind, ColumnRole, Policy


def class_notes(con, policy: Policy) -> list[str]:
    """The notes for ``policy`` over the data of ``con`` (a table missing is not noted here)."""
    notes = []
    for table in policy.confidential_tables:
        magnitude = table.rule(AggregateKind.MAGNITUDES).magnitude
        if magnitude is None or magnitude.unit_noise is None:
            continue
        measures = [c for c in table.columns.values()
                    if c.role in (ColumnRole.MEASURE, ColumnRole.WEIGHT)]  # fmt: skip
        for dim in table.columns.values():
            if dim.role is not ColumnRole.DIMENSION:
                continue
            if dim.classes_of is not None:
                notes += _disagreeing(con, table.name, dim)
                continue
            for measure in measures:
                ranges = _ranges(con, table.name, dim.name, measure.name)
                if ranges is not None:
                    notes.append(_undeclared(table.name, dim.name, measure.name, ranges))
    return notes


def _ranges(con, table: str, dim: str, measure: str) -> list[tuple] | None:
    """``dim``'s values with the least and greatest of ``measure`` over their rows, by the
    least, when the values hold separate ranges of the measure (two values or more)."""
    rows = _value_ranges(con, table, dim, measure)
    if rows is None or len(rows) < 2 or len(rows) > 100:
        return None
    if any(low[2] >= high[1] for low, high in zip(rows, rows[1:], strict=False)):
        return None
    return rows


def _value_ranges(con, table: str, dim: str, measure: str) -> list[tuple] | None:
    d, x = exp.column(dim, quoted=True), exp.column(measure, quoted=True)
    query = (
        exp.select(d, exp.Min(this=x.copy()), exp.Max(this=x.copy()))
        .from_(exp.to_table(table))
        .where(
            exp.and_(
                exp.Not(this=exp.Is(this=d.copy(), expression=exp.null())),
                exp.Not(this=exp.Is(this=x.copy(), expression=exp.null())),
            )
        )  # fmt: skip
        .group_by(d.copy())
        .order_by(exp.Min(this=x.copy()))
    )
    try:
        return con.execute(query.sql("duckdb")).fetchall()
    except Exception:  # noqa: BLE001 - a note only: a column the engine cannot read is not one
        return None


def _undeclared(table: str, dim: str, measure: str, ranges: list[tuple]) -> str:
    starts = ", ".join(str(r[1]) for r in ranges[1:])
    labels = ", ".join(str(r[0]) for r in ranges)
    return (
        f"{table}.{dim} looks like a class of {measure} (each of its {len(ranges)} values holds "
        f"a separate range of it; in the stored data classes 2 on start at {starts}), which "
        "carries unit noise: as stored it tells the class of x that the x·m conditions and "
        f"sums hide; declare it `classes_of: {{measure: {measure}, breaks: [...], labels: "
        f"[{labels}]}}` so that it is read as the class of x·m"
    )


def _disagreeing(con, table: str, dim) -> list[str]:
    """A note when some stored value of ``dim`` holds values of the measure outside its
    declared class (or is no declared label)."""
    classes = dim.classes_of
    bounds = [float("-inf"), *classes.breaks, float("inf")]
    interval = {label: (bounds[i], bounds[i + 1]) for i, label in enumerate(classes.labels)}
    wrong = []
    for value, least, most in _value_ranges(con, table, dim.name, classes.measure) or []:
        low, high = interval.get(value, (0.0, float("-inf")))
        if not low <= least <= most < high:
            wrong.append(str(value))
    if not wrong:
        return []
    return [
        f"{table}.{dim.name} is declared the class of {classes.measure}, and its stored "
        f"value(s) {', '.join(wrong)} hold values of {classes.measure} outside their class; "
        "every query and job reads the class of the noised value x·m, not the stored column"
    ]

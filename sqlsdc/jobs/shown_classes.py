"""A file that shows a unit-noised measure shows its derived class as the class of that value.

A job reads a dimension declared the class of a unit-noised measure (the demo's
``enterprises.size_class``, the class of ``employees``) as the class of x·m
(:mod:`sqlsdc.jobs.class_views`): the class its queries publish. An anonymised file that shows
the measure x too (exactly, renamed, or as any expression of it) would show, for a unit near a
break, a class that is not the class of its shown x, and so the side of 1 its secret factor m
lies on, which undoes its unit noise (red team s47n: ``sqlsdc anonymize --from enterprises``
with a step on turnover only, 17 of the demo's 1,000 enterprises shown with a class that
contradicts their employees, e.g. 9 employees beside 'small').

Such a file shows the class of the measure as read (the stored x: a function of what it
shows beside it, so it tells nothing about m). When a perturbative step (microaggregation,
noise, rank swapping, shuffling, PRAM) changes the measure, neither class is right: the class
of x would tell what the perturbation hides, the class of x·m would tell m; the job is refused
with what to write instead (band the measure after its perturbation with ``recode``, or leave
one of the two out). A class column that is not a plain copy (``upper(size_class)``) is read
from the class of x too: the view the job reads is replaced, so every spelling reads it.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from sqlsdc.errors import MicrodataError
from sqlsdc.microdata.steps import NON_PERTURBATIVE, Step
from sqlsdc.policy import Policy
from sqlsdc.rewrite.derived_classes import DerivedClass, class_case, derived_classes


def shown_pairs(
    policy: Policy, read: Sequence[str], sources: dict[str, tuple[set[str], str | None]]
) -> dict[str, list[tuple[DerivedClass, list[str]]]]:
    """table → the derived classes of the tables ``read`` that the file shows beside their
    measure, each with the file's columns computed from the measure (``sources``: each file
    column with the source columns it is computed from, as
    :func:`sqlsdc.jobs.risk_keys.source_columns` gives)."""
    reads = {t.lower() for t in read}
    found: dict[str, list[tuple[DerivedClass, list[str]]]] = {}
    for table, columns in derived_classes(policy).items():
        if table not in reads:
            continue
        for how in columns.values():
            measure, dimension = how.classes.measure.lower(), how.column.lower()
            shows_class = any(dimension in leaves for leaves, _copy in sources.values())
            measures = [c for c, (leaves, _copy) in sources.items() if measure in leaves]
            if shows_class and measures:
                found.setdefault(table, []).append((how, measures))
    return found


def refuse_perturbed_measures(
    pairs: dict[str, list[tuple[DerivedClass, list[str]]]], steps: Sequence[Step]
) -> None:
    """Refuse a perturbative step on a measure shown beside its derived class."""
    for table, shown in pairs.items():
        for how, measures in shown:
            for step in steps:
                changed = [c for c in step.columns if c in measures]
                if changed and step.method not in NON_PERTURBATIVE:
                    breaks = "/".join(str(b) for b in how.classes.breaks)
                    raise MicrodataError(
                        f"the file would show {how.column} of {table}, the class of "
                        f"{how.classes.measure}, beside {changed[0]} perturbed by "
                        f"{step.text()}: the class of the true value would tell what the "
                        "perturbation hides, the class of its noised value (what queries "
                        "publish) the unit's secret noise factor. Leave "
                        f"{how.column} out and band the perturbed value after the step "
                        f"(--step recode:{changed[0]}:breaks={breaks}), or leave "
                        f"{changed[0]} out"
                    )


def read_classes_of_shown_values(con, policy: Policy, tables: Sequence[str]) -> None:
    """Replace the job's temporary view of each of ``tables`` (:mod:`sqlsdc.jobs.class_views`)
    by one whose derived class dimensions are the class of the stored measure x: the rest of
    the job reads the file's class as the file shows it."""
    (catalog,) = con.execute("SELECT current_database()").fetchone()
    for table in tables:
        replaced = [
            exp.alias_(class_case(exp.column(how.classes.measure), how.classes), how.column)
            for how in derived_classes(policy)[table.lower()].values()
        ]
        stored = exp.Table(this=exp.to_identifier(table), db=exp.to_identifier("main"),
                           catalog=exp.to_identifier(catalog, quoted=True))  # fmt: skip
        view = exp.Create(
            this=exp.to_table(table),
            kind="VIEW",
            replace=True,
            expression=exp.select(exp.Star(replace=replaced)).from_(stored),
            properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
        )
        con.execute(view.sql("duckdb"))

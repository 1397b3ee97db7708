"""A job reads a dimension declared the class of a unit-noised measure as the class of x·m.

The guarded query path reads such a dimension (the demo's ``enterprises.size_class``, the
class of ``employees``) as the class of the noised value x·m that every sum adds
(:mod:`sqlsdc.rewrite.derived_classes`, red team s46j). The back-end jobs (tabulation,
suppression, rounding, CTA, anonymisation, synthesis) read their tables in many places, each
by its name; so for the time of a job its connection holds a temporary view of that name
(``temp.main.enterprises``, which DuckDB resolves before the stored table) with the dimension
replaced: every job reads the same class of x·m as the queries, and no job reads the stored
class. The view is dropped when the job ends (a connection handed to the job lives on).
"""

from __future__ import annotations

from contextlib import contextmanager

from sqlglot import exp

from sqlsdc.policy import Policy
from sqlsdc.rewrite.derived_classes import class_view, derived_classes


@contextmanager
def classes_of_noised_values(con, policy: Policy):
    """Within the block, ``con`` reads each table with a derived class dimension through a
    temporary view of the same name (:func:`sqlsdc.rewrite.derived_classes.class_view`)."""
    tables = sorted(derived_classes(policy))
    if not tables:
        yield
        return
    (catalog,) = con.execute("SELECT current_database()").fetchone()
    made = []
    try:
        for table in tables:
            view = exp.Create(
                this=exp.to_table(table),
                kind="VIEW",
                replace=True,
                expression=class_view(table, policy, catalog),
                properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
            )
            con.execute(view.sql("duckdb"))
            made.append(table)
        yield
    finally:
        for table in made:
            name = exp.Table(this=exp.to_identifier(table), db=exp.to_identifier("main"),
                             catalog=exp.to_identifier("temp"))  # fmt: skip
            drop = exp.Drop(tables=[name], kind="VIEW", exists=True)
            con.execute(drop.sql("duckdb"))

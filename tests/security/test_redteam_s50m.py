"""Red team s50m: marks an analyst writes on the query's nodes.

sqlglot reads a comment holding ``sqlglot.meta`` as marks on the node before it
(``x /* sqlglot.meta k=v, k2 */`` sets ``x.meta["k"] = "v"`` and ``x.meta["k2"] = True``), and
the guard's checks keep their own marks in the same place: a parameter not sent yet
(``sqlsdc_unbound``, s50m's describe), a column read from a table (``sqlsdc_stored``), a
constant the engine typed (``sqlsdc_engine_typed``), the units a COUNT counts
(``sqlsdc_counted_units``). Found on h50-s50m before the fix:
``employees > NULL /* sqlglot.meta sqlsdc_unbound */`` passed the class-break check (it ran;
no row, as any comparison with NULL) and ``COUNT(*) /* sqlglot.meta sqlsdc_counted_units=a */``
failed as a bug in sqlsdc (an AttributeError, 1 query). A comment holding ``sqlglot.meta`` is
now refused at parse (the text's string literals and quoted names may hold the words).
Held (int50 and after): a forged ``sqlsdc_statistic`` on COUNT and SUM (the analysis sets
its own over it: the same cells, 3 labels tried) and ``sqlsdc_engine_typed`` on a summed
measure (the same answer).
"""

from __future__ import annotations

import pytest

from sqlsdc.errors import PolicyViolation

GROUPED = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) AS n FROM enterprises WHERE employees > NULL "
        "/* sqlglot.meta sqlsdc_unbound */",
        "SELECT region, COUNT(*) /* sqlglot.meta sqlsdc_counted_units=a */ AS n FROM persons "
        "GROUP BY region",
        "SELECT region, SUM(income /* sqlglot.meta sqlsdc_engine_typed */) AS s FROM persons "
        "GROUP BY region",
        f"/* sqlglot.meta sqlsdc_stored */ {GROUPED}",
        f"{GROUPED} -- sqlglot.meta case_sensitive",
    ],
)
def test_a_comment_that_marks_nodes_is_refused(module_analyst, sql):
    with pytest.raises(PolicyViolation, match="sqlglot.meta"):
        module_analyst.execute(sql)
    with pytest.raises(PolicyViolation, match="sqlglot.meta"):
        module_analyst.describe(sql)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, COUNT(*) AS n FROM persons WHERE region <> 'sqlglot.meta' GROUP BY region",
        'SELECT region AS "sqlglot.meta", COUNT(*) AS n FROM persons GROUP BY region',
        f"{GROUPED} /* a plain comment */",
    ],
)
def test_the_words_outside_a_comment_are_answered(module_analyst, sql):
    assert len(module_analyst.execute(sql).fetchall()) == 8

"""Refusals speak the analyst's SQL: no internal column (``__cells.__ma0``), no stand-in of the
canonical identity (``SQLSDC_SUBQUERY('{...}')``) in a message (s49a's finding, s49j).

A grouped query keyed by ``(SELECT SUM(income) FROM persons)`` was refused as a condition on the
unit-noised income, naming ``__cells.__ma0 >= 10``: the conversion of conditions on a noised
measure (:mod:`sqlsdc.rewrite.noised_conditions`) read the guards of the subquery's protected
cells, rewritten before the query around it, as conditions of the analyst's; it is answered
now. A DP group key of that form named the canonical stand-in of the subquery.
"""

from __future__ import annotations

import re

import pytest

from sqlsdc.errors import Error

S = "(SELECT SUM(income) FROM persons)"
C = "(SELECT COUNT(*) FROM persons)"
D = "(SELECT COUNT(*) FROM benefits)"
REFUSED = [
    f"SELECT region, SUM(income * {C}) FROM persons GROUP BY 1",
    f"SELECT region, SUM(income) FROM persons WHERE income > {S} GROUP BY 1",
    f"SELECT region, COUNT(*) FROM persons GROUP BY region, income > {S}",
    f"SELECT region, SUM(CASE WHEN income > {S} THEN 1 ELSE 0 END) FROM persons GROUP BY 1",
    f"SELECT region, COUNT(*) FROM persons WHERE income IN ({S}) GROUP BY 1",
    f"SELECT region, COUNT(DISTINCT {C}) FROM persons GROUP BY 1",
    f"SELECT region, SUM(income) FILTER (WHERE income > {S}) FROM persons GROUP BY 1",
    f"SELECT region, COUNT(*) FROM persons GROUP BY 1 QUALIFY COUNT(*) > {S}",
    f"SELECT region, COUNT(*) FROM persons GROUP BY 1 LIMIT {C}",
    "SELECT region, COUNT(*) FROM persons GROUP BY 1 HAVING COUNT(*) > ALL "
    "(SELECT COUNT(*) FROM benefits GROUP BY scheme)",
    "SELECT region, AVG(income) FROM persons WHERE income >= "
    "(SELECT AVG(income) FROM persons WHERE income >= 20000) GROUP BY 1",
    f"SELECT region, COUNT(*), {D} FROM persons GROUP BY 1",
    f"SELECT scheme, COUNT(*) FROM benefits WHERE amount > {S} GROUP BY 1",
    "SELECT (SELECT SUM(amount) FROM benefits) AS s, COUNT(*) FROM benefits GROUP BY 1",
    f"SELECT {C} AS s, COUNT(*) FROM benefits GROUP BY s",
    "SELECT (SELECT MAX(income) FROM persons) AS m, COUNT(*) FROM persons",
    "SELECT person_id, COUNT(*) FROM benefits GROUP BY 1",
]
INTERNAL = re.compile(r"__\w+|SQLSDC_\w+")


@pytest.mark.parametrize("sql", REFUSED)
def test_no_refusal_names_an_internal_column(ckm, sql):
    """Fails on int49 for the DP group keys (SQLSDC_SUBQUERY('{...}'))."""
    with pytest.raises(Error) as refused:
        ckm.execute(sql).fetchall()
    assert not INTERNAL.findall(str(refused.value)), str(refused.value)


@pytest.mark.parametrize("spelt", [f"{S} AS s", S])
def test_a_group_key_of_a_protected_sum_is_answered_with_it(ckm, spelt):
    """Fails on int49: refused, naming __cells.__ma0 (a condition on the noised income)."""
    rows = ckm.execute(f"SELECT {spelt}, COUNT(*) FROM persons GROUP BY 1").fetchall()
    total = ckm.execute("SELECT SUM(income) FROM persons").fetchone()[0]
    count = ckm.execute("SELECT COUNT(*) FROM persons").fetchone()[0]
    assert rows == [(total, count)]

"""Red-team round s34d, with an analyst's connection only, against session 34's faster guard on
long AND/OR chains (:mod:`sqlsdc.planner.repeated_columns`): the ranges of one column written
alike in a chain of more than 16 operands are resolved and typed once (the others get copies of
the first one's column after ``qualify`` and ``annotate_types``), and the values of a long IN
list are set aside while both passes run; the checks between the passes read the first column.

What was found, and closed:

* **refusals quoted a statement with holes**: the allowlist runs between the two passes, while
  the columns and literal bounds of the grouped ranges and all but the first value of a long IN
  list are set aside, and its refusal quotes the refused node: ``QUALIFY persons.age BETWEEN 0
  AND 1 OR  BETWEEN  AND  OR ...`` for a chain of 17 ranges (16 were quoted whole), and
  ``MD5(CAST(persons.age IN (0) AS TEXT))`` for a list of 20 ages. The decision was the same
  (only columns, identifiers and literals are set aside, all allowed); the text was not the
  analyst's statement. The refusal now quotes the tree with everything put back.

Tried and held (no test added), each statement checked with the grouping and without it
(``GROUP_FROM`` 16 and 10**9; same refusal text or same protected SQL): 2,050 random statements
(about 500 accepted) with chains of 17 to 25 ranges (one to three groups, shuffled, among other
operands, AND and OR, bounds ``?``, negative, column-valued) in WHERE, HAVING, JOIN ON, GROUP
BY, ORDER BY, CASE in SUM, derived tables, CTEs, IN and EXISTS subqueries, UNION branches,
GROUP BY ALL, over persons, households, benefits (DP) and regions; the column written ``age``,
``AGE``, ``"age"``, ``p.age``, ``P.age``, ``"p".age``, ``persons.age``, an output alias (``x``,
``n``), a derived table's renamed column, a CTE's column of another type, ``__rkey`` and
``__x`` (reserved), ``foo`` (unknown), measures and weights (class breaks), identifiers
(WHERE), correlated references (``p.age`` inside EXISTS), ambiguous names in joins, USING and
NATURAL joins (COALESCE), struct fields, lambdas, ORDER BY output names of a set operation; 512
``?`` bounds and IN values of 16 Python types (str, Decimal, 10**20, 10**40, NaN, date, bytes,
None, bool...) against INTEGER, VARCHAR, measure and weight columns, at the head and the tail.
One form differs and was left: ``SELECT (<chain>) AS f ... GROUP BY 1 ORDER BY (<chain>)``
(or an aggregate of the chain repeated in ORDER BY): sqlglot replaces an ORDER BY expression
equal to a projection by its alias, and the ORDER BY copy, its columns set aside, is not equal,
so the protected SQL orders by the rewritten expression (``__cells.__y1``) instead of the output.
The order is the same: CKM perturbs the repeated aggregate with the same cell key, and DP
reads both outputs from one noisy statistic (same cost, same rows).
"""

from __future__ import annotations

import pytest

from sqlsdc.errors import PolicyViolation


def _ranges(count: int) -> str:
    return " OR ".join(f"age BETWEEN {a} AND {a + 1}" for a in range(count))


def _refusal(con, sql: str) -> str:
    with pytest.raises(PolicyViolation) as refused:
        con.execute(sql)
    return str(refused.value)


@pytest.mark.parametrize(
    "template",
    [
        "SELECT region, COUNT(*) FROM persons GROUP BY region QUALIFY {chain}",
        "SELECT region, COUNT(*) FROM persons WHERE MD5(CAST(({chain}) AS VARCHAR)) = 'a' "
        "GROUP BY region",
    ],
    ids=["qualify", "function"],
)
def test_a_refused_long_chain_of_ranges_is_quoted_as_written(module_analyst, template):
    """Before: ``QUALIFY persons.age BETWEEN 0 AND 1 OR  BETWEEN  AND  OR  BETWEEN ...`` for 17
    ranges or more; 16 were quoted whole (the quote is cut at 80 characters, so both say the
    same)."""
    short = _refusal(module_analyst, template.format(chain=_ranges(16)))
    long = _refusal(module_analyst, template.format(chain=_ranges(20)))
    assert "persons.age BETWEEN 1 AND 2" in short
    assert long == short.replace(_ranges(16), _ranges(20))


def test_a_refused_long_in_list_is_quoted_as_written(module_analyst):
    """Before: ``MD5(CAST(persons.age IN (0) AS TEXT))``, the list's first value alone."""
    ages = ", ".join(str(a) for a in range(20))
    message = _refusal(
        module_analyst,
        f"SELECT region, COUNT(*) FROM persons WHERE MD5(CAST(age IN ({ages}) AS VARCHAR)) = 'a' "
        "GROUP BY region",
    )
    assert "persons.age IN (0, 1, 2, 3" in message

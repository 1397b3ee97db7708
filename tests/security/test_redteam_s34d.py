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

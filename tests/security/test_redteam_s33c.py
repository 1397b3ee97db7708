"""Red-team round of session 33 (third), with an analyst's connection only, against the order
of released rows (``sqlsdc.rewrite.order``) and the jobs' one-protection rule.

What was found, and closed:

* **floating-point aggregates over released values add them in the engine's order**: an outer
  ``SUM``/``AVG``/``STDDEV``/``VARIANCE`` over a derived table or CTE of cells, or such a
  window aggregate (``OVER ()``, a RANGE or GROUPS frame, whose peers the tie-breakers cannot
  split), added its inputs in the order DuckDB's hash table gave the rows, which the hidden
  groups move. With values that cancel (``1e16`` for one shown group, ``-1e16`` for another,
  ``1.0`` for the rest) the sum counts only the ``1.0`` added after the cancellation: on the
  demo, 2 when the one person of R08-M019 was aged 66 and 3 (4 as a DOUBLE) when nobody met
  the condition, a noise-free yes/no answer about one person (red team s33 had left "the last
  bits" open). Such aggregates now add their inputs in the order of their values (``SUM(x
  ORDER BY x)``, after an ORDER BY of the query's own), so the result is a function of the
  released values; Spark, which has no ordered aggregates, drops the ORDER BY where the sum is
  exact (integers, decimals) and refuses the others.
"""

from __future__ import annotations

import pytest

RARE = "municipality = 'R08-M019' AND age = 66"  # one person of the demo (seed 7)
NOBODY = "municipality = 'R08-M019' AND age = 200"
CANCELLING = (
    "CAST(CASE WHEN k = 'R08-M003' THEN 1e16 WHEN k = 'R08-M013' THEN -1e16 ELSE 1.0 END AS DOUBLE)"
)


def _answer(con, condition: str, template: str) -> list:
    """``template`` with ``{inner}`` the counts of region R08 by municipality, rows meeting
    ``condition`` counted in R08-M001 instead of their own municipality."""
    key = f"CASE WHEN {condition} THEN 'R08-M001' ELSE municipality END"
    inner = f"SELECT {key} AS k, COUNT(*) AS n FROM persons WHERE region = 'R08' GROUP BY k"
    return con.execute(template.format(inner=inner, x=CANCELLING, key=key)).fetchall()


@pytest.mark.parametrize(
    "template",
    [
        "SELECT SUM({x}) FROM ({inner}) t",
        "SELECT SUM(CASE WHEN k = 'R08-M003' THEN 1e16 WHEN k = 'R08-M013' THEN -1e16 "
        "ELSE 1.0 END) FROM ({inner}) t",
        "SELECT AVG({x}) FROM ({inner}) t",
        "SELECT SUM({x} ORDER BY n >= 0) FROM ({inner}) t",
        "SELECT n >= 0, SUM({x}) FROM ({inner}) t GROUP BY 1",
        "WITH c AS ({inner}) SELECT SUM({x}) FROM c",
        "SELECT SUM({x}) FROM ({inner} UNION ALL {inner}) t",
        "SELECT k, SUM({x}) OVER () FROM ({inner}) t",
        "SELECT k, SUM({x}) OVER (ORDER BY n >= 0) FROM ({inner}) t",
        "SELECT k, AVG({x}) OVER (ORDER BY n >= 0 GROUPS BETWEEN 1 PRECEDING AND 1 FOLLOWING) "
        "FROM ({inner}) t",
    ],
)
def test_floating_point_aggregates_over_released_values_do_not_read_the_engine_s_order(
    ckm, template
):
    """Before: 2.0 for the person's true age and 3.0 or 4.0 for nobody (the values summed are
    functions of the shown groups' keys, the same groups in both cases; which depends on the
    record keys drawn). Now equal, and the sum in the order of values (-1e16 swallows every
    1.0 added to it, 1e16 then cancels it)."""
    rare, nobody = _answer(ckm, RARE, template), _answer(ckm, NOBODY, template)
    assert rare == nobody
    assert {v for row in rare for v in row if isinstance(v, float)} == {0.0}


def test_a_standard_deviation_over_released_values_does_not_read_the_engine_s_order(ckm):
    template = "SELECT STDDEV({x}), VAR_POP({x}) FROM ({inner}) t"
    assert _answer(ckm, RARE, template) == _answer(ckm, NOBODY, template)


def test_a_window_sum_over_a_group_key_adds_in_the_order_of_values(ckm):
    template = (
        "SELECT {key} AS k, SUM(CAST(CASE WHEN {key} = 'R08-M003' THEN 1e16 WHEN {key} = "
        "'R08-M013' THEN -1e16 ELSE 1.0 END AS DOUBLE)) OVER () AS s FROM persons "
        "WHERE region = 'R08' GROUP BY k"
    )
    rare, nobody = _answer(ckm, RARE, template), _answer(ckm, NOBODY, template)
    assert rare == nobody
    assert {row[1] for row in rare} == {0.0}  # -1e16 + (1 + ... + 1) + 1e16, in value order

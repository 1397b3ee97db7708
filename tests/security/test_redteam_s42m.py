"""Red team s42m: today's guard changes (session 42): conditions read as BOOLEAN
(``planner/totality.condition_problem``), the simple CASE checked as ``x = v`` (s42b) and its
WHEN branch no constant of its own (``planner/total_checks``), the one private in-memory
DuckDB instance per process (s42e), CKM's REMAINDER_FLOOR (s42j).

Attacked as an analyst on the demo (20,000 persons, CKM). Every attack tried, one line each
(W: worked, fixed here; O: worked, left open; H: held):

- W  **An IF standing as a simple CASE's operand or ELSE.** sqlglot parses ``IF(c, a, b)``
     as the node of a CASE's WHEN branch (``exp.If``), and both s42b's check (a simple
     CASE's WHEN value is compared, not read as a condition) and the lead's (a simple CASE's
     WHEN is no constant of its own) asked only whether the node's parent was a simple
     CASE. So ``IF(occupation, 1, 0)`` as the ELSE or the operand of ``CASE age WHEN 200
     ...`` was never checked as a condition (nor, with a constant condition, evaluated
     alone), and DuckDB cast the text to BOOLEAN on the rows that reached it: ``WHERE CASE
     WHEN age > 93 THEN (CASE age WHEN 200 THEN 1 ELSE IF(occupation, 1, 0) END) ELSE 0 END
     = 1`` failed in the engine and ``age > 94`` answered: the oldest person's age (94) by
     bisection, one query per bit, whatever the noise (any cell's presence likewise); so did
     ``IF(name, 1, 0)`` in a simple CASE's ELSE in a public subquery beside ``age > 93``
     (DuckDB drops the subquery where its statistics prove the rows empty). Scored on a
     hidden cell: R05-M015 x 94 x M (one person, published as no row) failed and x F (none)
     answered, and the person's occupation followed in 11 queries, exactly. Fixed: only a
     branch in the CASE's list of WHENs is a compared value (``totality.simple_case_branch``);
     an IF elsewhere is read as one.
- H  simple CASE against the engine, each as ``CASE WHEN age > 93 THEN (...) END`` and ``> 94``
     (the oldest is 94), outcomes compared: 155 conditions, 310 queries, 0 differ. WHEN values of
     other types than the operand (text vs numbers both ways, '94' / '94.5', DATE, TIME,
     INTERVAL, BLOB, BOOLEAN, lists, structs, rows, COLLATE, NULL, HUGEINT / UBIGINT
     literals, a DECIMAL of 28-33 digits beside INTEGER and BIGINT ids, scalar subqueries
     of public text or numbers), mixed WHEN types, nested simple CASEs (operand, WHEN, THEN,
     ELSE), text results used as conditions, derived tables and CTEs of text columns, public
     subqueries, QUALIFY / HAVING / window / aggregate text conditions (allow-list or
     condition check); measures as operand or WHEN value (class breaks refuse them).
- H  positions: GROUP BY, ORDER BY, HAVING, JOIN ON (confidential and public), FILTER
     (refused), inside COUNT/SUM, under DP (``benefits``: refused before any charge;
     computed DP group keys are refused for want of a domain); parameters (``?`` with
     'x', 1, a date; ``CASE ? WHEN age``) and through ``sqlsdc serve`` with psycopg, client-
     and server-side binding (``CASE age WHEN $1`` with '94', a 22-digit text, 5 for a text
     column, ``IF($1, ...)``): every case refused or answered alike on both sides.
- H  released values: ``CASE COUNT(*) WHEN 'abc'`` / ``COUNT(*) = 'abc'`` fail only where a
     cell is published (R05-M015 x 94 x M, one person, answers as the empty x F does).
- H  noisy verification: CASE is not accepted in a verification's WHERE at all.
- H  the shared in-memory instance (read, not broken): analysts reach it only with
     constants (no table, column or subquery; allow-listed functions, none reading
     settings, files, sequences or randomness); per-thread cursors, interrupts per cursor;
     temporary views are registered on file connections only; its configuration is locked.
     A refusal it caches is per guard context and data-free. Not measured: a constant
     making DuckDB invalidate the instance (Internal/FatalException) would make other
     sessions' constants refused ("raises an error") until replaced: availability only.
- H  (analysis) REMAINDER_FLOOR's 0: unreachable on the demo (measures are non-negative;
     ``SUM(income - k)`` is SUM(income) - k·n̂, ``SUM(income - weight)`` refused). Where
     reachable, a 0 tells |x|/x_delta in [1, μ+|v|+1/2) with x unknown (the shown value is
     0), and a non-zero value x_delta <= 2|x̂|, i.e. x_1 <= 10|x̂| (p_small 0.2), beside
     the rescaling branch's x_1 <= 5|x|: no exact value or membership follows.
"""

from __future__ import annotations

import pytest

import sqlsdc
from sqlsdc import PolicyViolation

# the oldest person of the demo is 94: on int42 each failed in the engine for ``age > 93``
# and answered for ``age > 94`` (or failed for both: the constant below)
IF_OUTSIDE_THE_WHENS = [
    "SELECT COUNT(*) FROM persons WHERE CASE WHEN age > {a} THEN (CASE age WHEN 200 THEN 1 "
    "ELSE IF(occupation, 1, 0) END) ELSE 0 END = 1",
    "SELECT COUNT(*) FROM persons WHERE CASE WHEN age > {a} THEN (CASE IF(occupation, 1, 0) "
    "WHEN 1 THEN 1 END) ELSE 0 END = 1",
    "SELECT sex, COUNT(CASE WHEN age > {a} THEN CASE region WHEN 'x' THEN 1 ELSE "
    "IF(municipality, 1, 0) END END) FROM persons GROUP BY sex",
    "SELECT COUNT(*) FROM persons WHERE CASE WHEN age > {a} THEN (CASE age WHEN 200 THEN 1 "
    "ELSE IF('x', 1, 0) END) ELSE 0 END = 1",
    # in a public scope: DuckDB drops the subquery where its statistics prove age > 94 empty
    "SELECT COUNT(*) FROM persons WHERE age > {a} AND region IN (SELECT region FROM regions "
    "WHERE (CASE name WHEN 'x' THEN 1 ELSE IF(name, 1, 0) END) = 1)",
]


@pytest.mark.parametrize("sql", IF_OUTSIDE_THE_WHENS)
@pytest.mark.parametrize("age", [93, 94])
def test_an_if_as_a_simple_cases_operand_or_else_reads_its_condition(ckm_db, sql, age):
    """Before: the first three and the last failed in the engine for ``age > 93`` and
    answered for ``age > 94`` (the oldest person's age, one bit per query). Now refused alike
    on both sides, from the types, before anything runs."""
    with sqlsdc.connect(ckm_db, "analyst") as con:
        with pytest.raises(PolicyViolation, match="cast to BOOLEAN|raises an error"):
            con.execute(sql.format(a=age))


def test_an_if_of_a_comparison_in_a_simple_cases_else_is_still_answered(ckm_db):
    """An IF whose condition is a comparison is total wherever it stands."""
    with sqlsdc.connect(ckm_db, "analyst") as con:
        rows = con.execute(
            "SELECT sex, COUNT(CASE occupation WHEN 'professionals' THEN 1 "
            "ELSE IF(age > 50, 1, NULL) END) AS n FROM persons GROUP BY sex"
        ).fetchall()
        assert {r[0] for r in rows} == {"F", "M"} and all(r[1] > 1000 for r in rows)


@pytest.mark.parametrize("sex", ["M", "F"])
def test_a_hidden_one_person_cell_is_not_proved_by_an_if_in_a_simple_cases_else(ckm_db, sex):
    """R05-M015 x 94 x M holds one person (published as no row), x F none. Before: the
    statement failed in the engine for M and was answered for F (the cell's presence in 2
    queries, whatever the noise), and with ``AND occupation = '<each of 11>'`` the person's
    occupation in 11 more ('not_employed', exact). Now refused on both sides."""
    cell = f"municipality = 'R05-M015' AND age = 94 AND sex = '{sex}'"
    with sqlsdc.connect(ckm_db, "analyst") as con:
        with pytest.raises(PolicyViolation, match="cast to BOOLEAN"):
            con.execute(
                f"SELECT COUNT(*) FROM persons WHERE CASE WHEN {cell} THEN (CASE age WHEN 200 "
                "THEN 1 ELSE IF(occupation, 1, 0) END) ELSE 0 END = 1"
            )

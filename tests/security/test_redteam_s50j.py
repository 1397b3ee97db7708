"""Red team s50j: identifiers after s50e's quoting, and schema probes that are not probes.

No disclosure found. Fixed (fail-closed before, but failing as "a bug in sqlsdc", SQLSTATE
XX000 through the server): a PIVOT/UNPIVOT statement, SUMMARIZE or DESCRIBE in a derived
table or CTE, and ``t.*`` inside an expression over a derived table (the last tests below).
The attacks 1-3 HELD on int50; they are kept as regression tests because each places an
analyst's text where sqlglot prints a name (s50e's leak printed a quoted alias expanded by
``*`` as SQL, reading the largest income of the demo in one query).

1. A quoted name that is SQL text, in every other place a name is printed: a CTE name, the
   column list of a derived table or of a CTE, a column alias read through a derived table,
   a set operation or ``JOIN ... USING``, a GROUP BY / ORDER BY by alias, the alias of an
   aggregating derived table joined with a public one. Each answers the public or protected
   rows under that name, never the confidential value.
2. A quoted alias that is a keyword or a schema name (``union``, ``limit``, ``sample``,
   ``positional``, ``sqlsdc``, ``main`` ...): the same rows as any alias.
3. Probes that are not probes, and probes of other forms: a LIMIT 0 inside a derived table,
   ``WHERE NULL`` and ``WHERE NOT NULL IS NULL``, ``LIMIT '0'`` / ``LIMIT 00``: no row
   (whether answered as a probe or run), and a computed ``LIMIT -0`` is refused as computed.
"""

from __future__ import annotations

import pytest

from sqlsdc.errors import PolicyViolation

LEAK = "(SELECT MAX(income) FROM persons) AS leak, r"
Q = f'"{LEAK}"'


@pytest.mark.parametrize(
    ("sql", "rows"),
    [
        (f"WITH {Q} AS (SELECT * FROM regions) SELECT * FROM {Q}", 8),
        (f"WITH {Q} AS (SELECT * FROM regions) SELECT * FROM {Q}, regions r", 64),
        (f"SELECT * FROM (SELECT region FROM regions) t({Q})", 8),
        (f"SELECT * FROM (SELECT region, name FROM regions) t(a, {Q})", 8),
        (f"WITH t({Q}) AS (SELECT region FROM regions) SELECT * FROM t", 8),
        (f"SELECT * FROM (SELECT region AS {Q} FROM regions) t", 8),
        (
            f"SELECT * FROM (SELECT region AS {Q} FROM regions) a "
            f"JOIN (SELECT region AS {Q} FROM regions) b USING ({Q})",
            8,
        ),  # fmt: skip
        (
            f"SELECT * FROM (SELECT region AS {Q} FROM regions "
            "UNION ALL SELECT name FROM regions) t",
            16,
        ),  # fmt: skip
        (f"SELECT region AS {Q} FROM regions ORDER BY {Q}", 8),
        (f"SELECT region AS {Q}, COUNT(*) AS n FROM persons GROUP BY {Q}", 8),
        (f"SELECT * FROM (SELECT region AS {Q}, COUNT(*) AS n FROM persons GROUP BY 1) t", 8),
        (
            f"SELECT * FROM (SELECT region, COUNT(*) AS n FROM persons GROUP BY region) {Q}, "
            "regions r",
            64,
        ),  # fmt: skip
        (f"SELECT {Q}.region, COUNT(*) AS n FROM persons {Q} GROUP BY 1", 8),
        (f"SELECT * FROM regions {Q} JOIN regions r ON {Q}.region = r.region", 8),
    ],
)
def test_a_quoted_name_that_is_sql_is_a_name_wherever_it_stands(analyst, raw, sql, rows):
    cursor = analyst.execute(sql)
    answer = cursor.fetchall()
    names = [d[0] for d in cursor.description]
    (truth,) = raw.execute("SELECT MAX(income) FROM persons").fetchone()
    assert "leak" not in names
    assert len(answer) == rows
    assert not any(isinstance(v, int | float) and abs(v - truth) < 1 for row in answer for v in row)


@pytest.mark.parametrize(
    "alias",
    [
        "union",
        "select",
        "limit",
        "sample",
        "positional",
        "asof",
        "qualify",
        "sqlsdc",
        "main",
        "pg_catalog",
        "information_schema",
        "t.x",
        "1x",
    ],  # fmt: skip
)
def test_a_keyword_or_schema_name_as_a_quoted_alias_is_an_alias(analyst, alias):
    public = analyst.execute(f'SELECT * FROM regions "{alias}", regions r').fetchall()
    grouped = analyst.execute(
        "SELECT * FROM (SELECT region, COUNT(*) AS n FROM persons GROUP BY region) "
        f'"{alias}" ORDER BY 1'
    ).fetchall()
    plain = analyst.execute(
        "SELECT region, COUNT(*) AS n FROM persons GROUP BY region ORDER BY 1"
    ).fetchall()
    assert len(public) == 64
    assert grouped == plain


GROUPED = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT * FROM ({GROUPED} LIMIT 0) t",
        f"SELECT * FROM ({GROUPED}) t WHERE NULL",
        f"SELECT * FROM ({GROUPED}) t WHERE NOT NULL IS NULL",
        f"SELECT * FROM ({GROUPED}) t LIMIT '0'",
        f"SELECT * FROM ({GROUPED}) t LIMIT 00",
    ],
)
def test_forms_near_a_probe_answer_no_row_with_the_querys_columns(analyst, sql):
    cursor = analyst.execute(sql)
    assert cursor.fetchall() == []
    assert [d[0] for d in cursor.description] == ["region", "n"]


def test_a_computed_zero_limit_is_refused_as_computed(analyst):
    with pytest.raises(PolicyViolation, match="computed"):
        analyst.execute(f"SELECT * FROM ({GROUPED}) t LIMIT -0")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM (PIVOT persons ON sex USING SUM(income) GROUP BY municipality) t",
        "SELECT * FROM (UNPIVOT households ON size INTO NAME k VALUE v) t",
        "SELECT * FROM regions r JOIN (PIVOT persons ON sex USING COUNT(*) GROUP BY region) p "
        "USING (region)",
        "SELECT (SELECT COUNT(*) FROM (PIVOT persons ON sex USING COUNT(*)) p) AS x",
        "SELECT * FROM (PIVOT persons ON sex USING SUM(income) GROUP BY municipality)",
        "WITH p AS (PIVOT persons ON sex USING COUNT(*) GROUP BY region) SELECT * FROM p",
        "SELECT * FROM persons PIVOT (COUNT(*) FOR sex IN ('F', 'M'))",
    ],
)
def test_a_pivot_anywhere_is_refused_as_a_pivot(analyst, sql):
    """A PIVOT statement in a derived table failed as a bug in sqlsdc ("the guard failed on
    this query: AssertionError", 4 of these) or was refused for a column it could not resolve
    ("Column 'sex' could not be resolved. did you mean sex?", 2): fail-closed, but a BI tool
    showed an internal error. Fails on int50."""
    with pytest.raises(PolicyViolation, match=r"^(UN)?PIVOT is not allowed"):
        analyst.execute(sql)


@pytest.mark.parametrize(
    ("sql", "word"),
    [
        ("SELECT * FROM (SUMMARIZE persons) t", "SUMMARIZE"),
        ("SELECT * FROM (SUMMARIZE SELECT income FROM persons) t", "SUMMARIZE"),
        ("WITH t AS (SUMMARIZE persons) SELECT * FROM t", "SUMMARIZE"),
        ("SELECT * FROM (DESCRIBE persons) t", "DESCRIBE"),
    ],
)
def test_summarize_or_describe_in_a_derived_table_is_refused_as_such(analyst, sql, word):
    """SUMMARIZE (whose answer is each column's min, max and quantiles) and DESCRIBE in a
    derived table failed as a bug in sqlsdc (sqlglot's scope asserts a derived table is a
    query; "the guard failed on this query: AssertionError"): fail-closed, nothing ran, but
    an internal error. Fails on int50."""
    with pytest.raises(PolicyViolation, match=f"^{word} is not allowed"):
        analyst.execute(sql)


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT * FROM ({GROUPED}) t WHERE (t.*) IS NOT NULL",
        f"SELECT * FROM ({GROUPED}) t WHERE t.* IS NULL",
        f"SELECT * FROM ({GROUPED}) t ORDER BY t.*",
        f"SELECT * FROM ({GROUPED}) t JOIN regions r ON (t.*) IS NOT NULL",
    ],
)
def test_a_derived_tables_star_inside_an_expression_is_refused(analyst, sql):
    """``t.*`` inside an expression over a derived table failed as a bug in sqlsdc ("column
    t.* could not be resolved for the cell identity"); over a table it was refused. Fails on
    int50."""
    with pytest.raises(PolicyViolation, match=r"t\.\* \(every column of t\) cannot be used"):
        analyst.execute(sql)


@pytest.mark.parametrize("parens", [1, 2])
def test_a_query_in_parentheses_is_that_query(analyst, parens):
    """The lead's follow-up of s50j's leftover: ``(SELECT ...)`` was refused as "(SELECT
    statements are not allowed"; it means its query, and is answered as that query is."""
    wrapped = "(" * parens + GROUPED + ")" * parens
    assert analyst.execute(wrapped).fetchall() == analyst.execute(GROUPED).fetchall()


@pytest.mark.parametrize(("outside", "said"), [("LIMIT 0", "LIMIT"), ("ORDER BY 1", "ORDER BY")])
def test_a_clause_outside_a_query_in_parentheses_is_refused_with_the_form_to_write(
    analyst, outside, said
):
    """``(SELECT ...) LIMIT 0`` (a probe some BI tools send) is refused saying to name the
    query as a derived table, not as "(SELECT statements are not allowed"."""
    with pytest.raises(PolicyViolation, match=f"with {said} outside them.*AS t LIMIT 0"):
        analyst.execute(f"({GROUPED}) {outside}")

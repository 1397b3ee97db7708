"""Red-team round of session 30 (third), with an analyst's connection only, against the two
changes merged that day: CKM distinct counts of units keyed by the counted units' record keys
(``sqlsdc.rewrite.counted_units``) and the factoring of multi-column filter rows
(``sqlsdc.planner.connectors.factor_conjunctions``).

What succeeded, and was closed:

* a distinct count of households through persons (``COUNT(DISTINCT persons.hid)``) took the
  households' record keys but the persons' protection rule: with households' counts under
  another ptable (or rounding), the households of a group were released twice with one key
  through two ptables, two comonotone noises of one number (200 groups: the exact count in
  2 %, the pair's support 13 of the 45 independent pairs). The counted table's rule now joins
  the rules compared, as a join's tables do: a distinct count of units whose table is
  protected otherwise is refused.
* a DoS: factoring chose its column by scanning every row for every column named in more than
  16 rows, quadratic in the chain. Factoring runs at parse time, before names are resolved, so
  invented columns count: a 1 MB chain (the default ``limits.max_statement_characters``) of rows
  of 8 equalities over 5,000 columns took 135 s in the parser (28 s with 1,000 columns; a
  100 KB one 0.5 s). The rows' other terms are now keyed once per column of a row: 1.5 s of
  factoring for the same 1 MB (parse_statement in all 8 s, most of it sqlglot's parse).

What held (one test each below): ...
"""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc
from tests.security.test_redteam_s28e import rows

GROUPS = 200
IDENTIFIER = {"role": "identifier"}


def two_rules_db(path, persons_counts: dict, households_counts: dict):
    """200 groups of 30 households of 3 persons; persons' and households' counts protected
    by their own rules."""
    with duckdb.connect(str(path)) as con:
        con.execute(
            "CREATE TABLE households AS SELECT i AS hid, 'g' || (i // 30) AS g "
            f"FROM range({GROUPS * 30}) r(i)"
        )
        con.execute(
            "CREATE TABLE persons AS SELECT i AS pid, i // 3 AS hid, 'g' || (i // 90) AS g "
            f"FROM range({GROUPS * 90}) r(i)"
        )
    sqlsdc.init(
        path,
        {
            "protection": {"min_frequency": 1, "counts": persons_counts},
            "tables": {
                "persons": {
                    "privacy_unit": "pid",
                    "columns": {
                        "pid": IDENTIFIER,
                        "hid": {**IDENTIFIER, "references": "households.hid"},
                        "g": {"role": "dimension"},
                    },
                },
                "households": {
                    "privacy_unit": "hid",
                    "protection": {"counts": households_counts},
                    "columns": {"hid": IDENTIFIER, "g": {"role": "dimension"}},
                },
            },
            "users": {"analyst": {"role": "analyst"}, "admin": {"role": "admin"}},
        },
    )
    return path


CKM = {"method": "ckm", "ptable": {"D": 5, "V": 3, "js": 2}}


@pytest.mark.parametrize(
    "households",
    [
        {"method": "ckm", "ptable": {"D": 2, "V": 1}},
        {"method": "round", "base": 10, "rounding": "unbiased"},
    ],
    ids=["other-ptable", "rounding"],
)
def test_a_distinct_count_of_units_protected_by_another_rule_is_refused(tmp_path, households):
    """One key through two rules gives coupled noises: ``COUNT(DISTINCT hid)`` of persons and
    ``COUNT(*)`` of households must not both be released when the rules differ."""
    con = sqlsdc.connect(two_rules_db(tmp_path / "two.duckdb", CKM, households), user="analyst")
    assert len(rows(con, "SELECT g, COUNT(*) FROM households GROUP BY g")) == GROUPS
    assert len(rows(con, "SELECT g, COUNT(*) FROM persons GROUP BY g")) == GROUPS
    for sql in (
        "SELECT g, COUNT(DISTINCT hid) FROM persons GROUP BY g",
        "SELECT p.g, COUNT(DISTINCT p.hid) FROM (SELECT g, hid FROM persons) AS p GROUP BY 1",
    ):
        with pytest.raises(sqlsdc.PolicyViolation, match="counts units of households"):
            rows(con, sql)
    con.close()


def test_a_distinct_count_of_units_under_the_same_rule_is_their_count(tmp_path):
    con = sqlsdc.connect(two_rules_db(tmp_path / "one.duckdb", CKM, CKM), user="analyst")
    distinct = rows(con, "SELECT g, COUNT(DISTINCT hid) FROM persons GROUP BY g")
    assert distinct == rows(con, "SELECT g, COUNT(*) FROM households GROUP BY g")
    assert len(distinct) == GROUPS
    con.close()


def test_factoring_a_chain_of_many_columns_is_linear(monkeypatch):
    """Factoring chose its column by scanning every row for every column in more than 16 rows:
    a 1 MB chain of rows of 8 equalities over 5,000 invented columns (under the default
    statement limit, factored before names are resolved) took 135 s in the parser. Each row's
    other terms are now keyed once per column of the row: one ``_rest`` per row, for the
    column chosen."""
    from sqlsdc.guard.parse import parse_statement
    from sqlsdc.planner import connectors

    calls = []
    rest = connectors._rest
    monkeypatch.setattr(connectors, "_rest", lambda *a: calls.append(1) or rest(*a))
    n, columns = 2000, 500  # every column in 32 rows, each row with another set
    chain = " OR ".join(
        "(" + " AND ".join(f"c{(i * 8 + j) % columns} = {i}" for j in range(8)) + ")"
        for i in range(n)
    )
    parse_statement(f"SELECT COUNT(*) FROM persons WHERE {chain}")
    assert len(calls) <= n, len(calls)

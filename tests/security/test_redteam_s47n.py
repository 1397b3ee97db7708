"""Red team s47n: spellings that might still read the STORED class of a unit-noised measure.

s47d made the demo's ``enterprises.size_class`` the class of x·m on every reader (the query
path rewrites each column reading it, the jobs read a temporary view). The attack here: any
spelling that still reads the stored column. The oracle is differential: a copy of the database
whose stored size_class is rotated (micro -> large -> small -> medium -> micro), same secrets
and record keys, must give every analyst query the same answer (or the same refusal) as the
original; a spelling that reads the stored column answers differently.

Held (67 spellings tried, 0 read the stored class): GROUPING SETS, ROLLUP, CUBE, GROUP BY ALL,
COUNT(DISTINCT size_class), a window over grouped cells, a self join ON size_class, a join to
a public table beside size_class, derived tables and CTEs with column aliases, FROM-first and
TABLE, a scalar subquery as the compared value, quoted and upper-case names, functions of the
class (upper, LIKE, ||, length, ANY). Refused before the rewrite: table column aliases
``enterprises AS e(a, b, c, d, s)``, ``#5``, COLUMNS(), ``(e).size_class``, ``e['size_class']``,
struct_extract, PIVOT, QUALIFY, USING SAMPLE, LATERAL, schema- or catalog-qualified names, a CTE
named like the table, correlated and IN subqueries. Jobs (protect round, anonymize, synthesize
parametric) store the same table on both copies; a job's ``main.enterprises`` resolves to the
view, ``<catalog>.main.enterprises`` is refused. The server's ``public.enterprises`` is the plain
name before the guard; its shadow catalog holds no data.

Finding (fixed): ``sqlsdc verify`` ran a synthetic output's source SQL on the raw connection,
so its confidential side grouped by the STORED size_class while the synthesis (a job) had read
the class of x·m: by size_class it compared two populations, and its minimum-frequency
suppression was an exact threshold on the stored class's count (demo seed 5, admin interval
mode: 'large' suppressed on the true data, released on a copy whose stored class differs).
Analysts' noisy mode is differentially private on either reading (charged before the read),
so no analyst learned a value from it; the invariant "the stored column is never read" broke.

Cost: a query reading no table with a derived class walked its rewritten tree twice (about
2 ms of CPU for a persons query of 7,000 characters); now none (the pipeline passes the
tables the statement reads).
"""

from __future__ import annotations

import shutil
from unittest.mock import MagicMock

import duckdb
import pytest
import sqlglot

import sqlsdc
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.errors import Error
from sqlsdc.rewrite.derived_classes import derive_classes, refuse_derived_classes

POISONS = (  # rotated (a bijection: changes every cell) and collapsed (changes the distinct count)
    "UPDATE enterprises SET size_class = CASE size_class WHEN 'micro' THEN 'large' "
    "WHEN 'large' THEN 'small' WHEN 'small' THEN 'medium' ELSE 'micro' END",
    "UPDATE enterprises SET size_class = 'micro'",
)


@pytest.fixture(scope="module")
def twins(tmp_path_factory):
    """(the demo database, copies whose stored size_class is poisoned by each of POISONS)."""
    folder = tmp_path_factory.mktemp("s47n")
    path = folder / "demo.duckdb"
    build_demo_database(path, persons=4_000, seed=5)
    copies = []
    for i, poison in enumerate(POISONS):
        copies.append(folder / f"poisoned{i}.duckdb")
        shutil.copy(path, copies[-1])
        con = duckdb.connect(str(copies[-1]))
        try:
            assert con.execute(poison).fetchone()[0] > 100  # rows changed
        finally:
            con.close()
    return path, copies


def _answer(path, sql: str):
    with sqlsdc.connect(path, user="analyst") as analyst:
        try:
            return sorted(map(repr, analyst.execute(sql).fetchall()))
        except Error as refused:
            return f"refused: {type(refused).__name__}: {refused}"


SPELLINGS = [
    "SELECT size_class, COUNT(*) FROM enterprises GROUP BY size_class",
    "SELECT size_class, region, COUNT(*) FROM enterprises "
    "GROUP BY GROUPING SETS ((size_class), (region), ())",
    "SELECT size_class, COUNT(*) FROM enterprises GROUP BY ROLLUP (size_class)",
    "SELECT size_class, nace, SUM(turnover) FROM enterprises GROUP BY CUBE (size_class, nace)",
    "SELECT size_class, COUNT(*) FROM enterprises GROUP BY ALL",
    "SELECT COUNT(DISTINCT size_class) FROM enterprises",
    "SELECT region, COUNT(DISTINCT size_class) FROM enterprises GROUP BY region",
    "SELECT nace, COUNT(*), SUM(COUNT(*)) OVER (PARTITION BY nace) FROM enterprises "
    "GROUP BY nace, size_class",
    "SELECT e.nace, COUNT(*) FROM enterprises e JOIN enterprises f "
    "ON e.size_class = f.size_class AND e.enterprise_id = f.enterprise_id GROUP BY e.nace",
    "SELECT e.nace, COUNT(*) FROM enterprises e JOIN regions r "
    "ON r.region = e.region AND e.size_class = 'micro' GROUP BY e.nace",
    "SELECT x.sc, COUNT(*) FROM (SELECT * FROM enterprises) AS x(a, b, c, d, sc) GROUP BY 1",
    "WITH x(a, b, c, d, sc) AS (SELECT * FROM enterprises) SELECT sc, COUNT(*) FROM x GROUP BY 1",
    "SELECT size_class, COUNT(*) FROM (FROM enterprises) GROUP BY 1",
    "SELECT size_class, COUNT(*) FROM (TABLE enterprises) GROUP BY 1",
    "SELECT nace, COUNT(*) FROM enterprises WHERE size_class = (SELECT 'micro') GROUP BY nace",
    "SELECT nace, COUNT(*) FROM enterprises AS size_class "
    "WHERE size_class.size_class = 'micro' GROUP BY nace",
    "SELECT nace, COUNT(*) FROM enterprises WHERE length(size_class) = 5 GROUP BY nace",
    "SELECT nace, COUNT(*) FROM enterprises WHERE size_class = ANY(['micro']) GROUP BY nace",
    "SELECT s, COUNT(*) FROM enterprises AS e(a, b, c, d, s) GROUP BY s",
    "SELECT (e).size_class, COUNT(*) FROM enterprises e GROUP BY 1",
    "SELECT struct_extract(e, 'size_class'), COUNT(*) FROM enterprises e GROUP BY 1",
    "SELECT * FROM (PIVOT enterprises ON size_class USING COUNT(*) GROUP BY nace)",
    "SELECT size_class, COUNT(*) FROM enterprises USING SAMPLE 50% GROUP BY size_class",
]


@pytest.mark.parametrize("sql", SPELLINGS)
def test_no_spelling_reads_the_stored_class(twins, sql):
    """The same answer (or refusal) whether the stored class is the true one or poisoned."""
    path, copies = twins
    expected = _answer(path, sql)
    for poisoned in copies:
        assert _answer(poisoned, sql) == expected


def test_a_statement_reading_no_derived_class_is_not_walked():
    """derive_classes and refuse_derived_classes, told the statement reads only persons, do not
    touch its tree (fails on main: no ``reads``; every query walked its tree twice)."""
    tree = MagicMock()
    derive_classes(tree, demo_policy(), reads=["persons", "regions"])
    refuse_derived_classes(tree, demo_policy(), reads=["persons"])
    assert tree.mock_calls == []


def test_a_statement_reading_enterprises_is_still_derived():
    """``reads`` naming the table in any case keeps the rewrite (fail closed)."""
    tree = sqlglot.parse_one("SELECT e.size_class FROM enterprises AS e")
    derive_classes(tree, demo_policy(), reads=["ENTERPRISES"])
    assert "e.size_class" not in tree.sql("duckdb") and "__mix" in tree.sql("duckdb")
    with pytest.raises(sqlsdc.PolicyViolation, match="class of a measure"):
        refuse_derived_classes(
            sqlglot.parse_one("SELECT e.size_class FROM enterprises AS e"),
            demo_policy(),
            reads=["enterprises"],
        )


VERIFIED = "SELECT size_class, AVG(turnover) FROM ent_syn GROUP BY size_class"


def _verified(source, folder) -> str:
    """The admin's verification (interval mode) by size_class of a synthesis of enterprises."""
    from sqlsdc.synth import synthesize

    path = folder / source.name
    shutil.copy(source, path)
    synthesize(path, user="admin", into="ent_syn", method="parametric", seed=0,
               sql="SELECT nace, size_class, turnover FROM enterprises")  # fmt: skip
    with sqlsdc.connect(path, user="admin") as admin:
        return str(admin.verify(VERIFIED, mode="interval"))


def test_verification_reads_the_class_the_synthesis_read(twins, tmp_path):
    """The verification server's confidential side read the output's source SQL on the stored
    table, while the synthesis read the class of x·m: by size_class it compared two different
    populations, and its minimum-frequency suppression was an exact threshold on the stored
    class (demo seed 5: 'large' suppressed or released as the stored column said). Now it reads
    the source as the job did (fails on main: the rotated copy answers otherwise)."""
    path, (rotated, _collapsed) = twins
    verified = _verified(path, tmp_path)
    assert "size_class" in verified and "released" in verified
    assert _verified(rotated, tmp_path) == verified

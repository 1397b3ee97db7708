"""Red team s35d: an analyst (not admin) against the day's merge: the DP charge that writes its
pending audit entry in the ledger's transaction, the DP refusals moved before the charge, and
red team s35c's CKM refusals (distinct counts of joined columns, total public parts, public
joins on unique keys).

What broke (fixed here):

- **A failing constant in a public scope.** Red team s35c made what a public scope computes
  from public columns total, but a constant reads no column: ``code IN (SELECT code FROM codes
  WHERE CAST('x' AS INTEGER) = 1)`` (or ``(SELECT 1 // 0)``, ``CAST(300 AS TINYINT)``, a
  constant in a window or an aggregate of a public subquery) failed in the engine next to
  ``age > 98`` and answered next to ``age > 99``: DuckDB drops the subquery its table
  statistics prove unused, so the bisection read the oldest person's age (99) exactly. A
  public scope's constants are now evaluated apart from the file, as a confidential scope's
  are (``planner/total_checks.py`` ``_check_constants``): refused whatever the data.

- **A scalar subquery of several rows.** DuckDB raises when a scalar subquery returns more
  than one row, on public rows alone (``code = (SELECT code FROM codes)``, ``(SELECT
  MIN(code) FROM codes GROUP BY label)``, a UNION), and the same skipping decided whether it
  ran: ``age > 98`` failed, ``age > 99`` answered. A scalar subquery of a statement that
  reads confidential rows must now return at most one row by its form: an aggregate without
  GROUP BY, a SELECT without FROM, LIMIT 1, or a unique key of its one source equated to a
  literal (``planner/multiplicity.py`` ``_check_scalar_rows``); so too a scalar subquery of
  confidential groups.

- **A public SUM that can overflow.** Aggregates of public values were left out of the
  public totality check ("their arguments are checked"), but DuckDB adds up HUGEINT and
  DECIMAL(p > 18) in their own type: ``code IN (SELECT MIN(code) FROM codes HAVING SUM(big)
  > 0)`` failed for ``age > 98`` and answered for ``age > 99`` on a public table with a
  HUGEINT column near its limit. Such a SUM or AVG is now refused (``_check_public_sum``);
  integers up to BIGINT, DECIMAL(18) and floats (or a CAST to them) are summed as before.

What held is pinned below.

- **Stopped after the charge, asked again.** A cancel (the statement timeout's interrupt, a
  server's CancelRequest) as the charge returns, or as the exact cells are computed, leaves
  one ledger row; the statement asked again is not charged and answers exactly the cells a
  fresh connection of the same user reads (the noise is a function of the cell, and the
  cached cells are this user's). Measured outside the suite: a 3,000,000-row table under
  timeouts of 0.05-0.095 s (the analyst's ``connect(timeout=...)``): 0.05 s stopped before
  the charge (nothing charged), 0.055-0.085 s after it (one row each, "asking it again is
  not charged again"), and each asked again answered once more with no second row; four
  threads of one user asking one statement at once were charged once, with one answer.
  (Changed since, s41j: a statement stopped before its cells were drawn and cached is charged
  again when asked again, as red team s41b found each such asking a free, fresh timing of
  the engine's work; one stopped after its cells were drawn keeps them and is not.)
- **Refusals before the charge.** Expressions that could fail on confidential values
  (overflowing products and sums, narrowing casts, data divisors), unbounded sums and private
  group keys without a domain are refused with nothing charged. The ``LIMIT 0`` key-type
  check reads no data: DuckDB 2.0 answered ``LIMIT 0`` over a failing CAST, a MATERIALIZED
  CTE and a failing scalar subquery on 5,000,000 rows in under 3 ms, without error. The
  float-sum scan is a fact of the whole column (fixed bound 1e140), not of the query.
- **CKM refusals through other forms.** Distinct counts of a joined column through a CTE,
  UNION ALL, a scalar subquery, GROUPING SETS, ROLLUP, CUBE, NATURAL and USING joins, a
  self-join along the key; non-total public parts through CTEs, UNION/INTERSECT/EXCEPT,
  scalar subqueries, EXISTS, HAVING, ORDER BY, LIMIT, window ORDER BY, GROUPING SETS and a
  CASE guard; multiplying public joins through a CTE, a scalar subquery, EXISTS, inequality
  joins and a join with released cells: all refused. Heavy work on public rows without a join
  (repeat, lpad, range/unnest, list_sum, WITH RECURSIVE) is refused by the function list.
  Counting released groups (``COUNT(*)`` over a grouped derived table, ``COUNT(DISTINCT)``
  over released cells) gave the same answer for the true and a false guess (the one-person
  cell is not released).

Open (not tests): the statement timeout still fires after the charge when the exact cells
take long, and how long they take depends on the data (the cost of a probe is its charge;
red team s35c's timing note); not measured further here. The class behind the three breaks
is wide: any error DuckDB raises at run time on public rows alone is an oracle of the
confidential side's statistics; expressions, constants, scalar subqueries and sums are
checked now, other run-time errors of public operators were not enumerated exhaustively.
Observed, not a leak: a public window ``OVER (ORDER BY code, 1)`` next to confidential rows is
refused as "DuckDB refuses the text" though DuckDB answers it alone.
"""

from __future__ import annotations

import shutil

import duckdb
import pytest

import sqlsdc
from sqlsdc.guard import dp_charge
from tests.dp_persons import document
from tests.security.test_redteam_s28e import CKM, rows
from tests.security.test_redteam_s35c import lookup_db
from tests.test_charge_faults import charges_and_entries

BY_REGION = "SELECT region, COUNT(*) FROM persons WHERE age >= {} GROUP BY region"


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """The DP persons database, built once for the module: each test changes a copy."""
    path = tmp_path_factory.mktemp("s35d_dp") / "dp.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE persons AS SELECT i AS pid, ['N', 'S', 'E', 'W'][1 + i % 4] AS "
                "region, i % 90 AS age FROM range(4000) t(i)")  # fmt: skip
    con.close()
    sqlsdc.init(path, document(30))
    return path


@pytest.fixture
def db(template, tmp_path):
    path = tmp_path / template.name
    shutil.copy(template, path)
    return path


def answer(db, sql: str) -> list[tuple]:
    con = sqlsdc.connect(db, user="ana")
    try:
        return sorted(con.execute(sql).fetchall())
    finally:
        con.close()


@pytest.mark.parametrize(
    ("where", "said", "charges"),
    [("charge", "its cells were not released: asking it again is charged again", 2),
     ("release", "its cells were kept: asking it again is not charged again", 1)],
)  # fmt: skip
def test_a_statement_stopped_after_its_charge_is_paid_and_answers_the_same_cells(
    db, monkeypatch, where, said, charges
):
    """A cancel as the charge returns: nothing released, so the statement asked again is
    charged again (red team s41b: a statistic counts as paid once its cells are cached, else
    every asking computed them again for free); once the exact cells are computed and their
    noise drawn: the cells are kept, and asking again is free. Either way, asked again on the
    same connection, then on a fresh one: the same cells, no further row."""
    con = sqlsdc.connect(db, user="ana")
    real = getattr(dp_charge, where)
    armed = [True]

    def stopping(*args, **kwargs):
        done = real(*args, **kwargs)
        if armed and armed.pop():
            con.interrupt()  # the statement timeout's interrupt, a CancelRequest
        return done

    monkeypatch.setattr(dp_charge, where, stopping)
    sql = BY_REGION.format(5)
    with pytest.raises(sqlsdc.Error, match=said):
        con.execute(sql).fetchall()
    again = sorted(con.execute(sql).fetchall())
    con.close()
    assert answer(db, sql) == again
    ledger, audit = charges_and_entries(db)
    assert len(ledger) == charges
    (decision, reason, _sql) = audit[ledger[0][0]]  # the cancelled statement's own entry
    assert decision == "refused" and reason.startswith("QueryCanceled")


def test_concurrent_asks_of_one_user_are_charged_once(db):
    """Four threads of one user ask one DP statement at once: one charge, one answer (the
    others wait for the one that charged to cache its cells, :mod:`sqlsdc.guard.dp_in_flight`,
    and are answered from the cache)."""
    import threading

    sql = BY_REGION.format(7)
    got: list = [None] * 4
    threads = [threading.Thread(target=lambda i=i: got.__setitem__(i, answer(db, sql)))
               for i in range(4)]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert got[0] and all(g == got[0] for g in got)
    assert len(charges_and_entries(db)[0]) == 1


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT SUM(age * 4611686018427387904) FROM persons",
        "SELECT SUM(CAST(age AS TINYINT) * CAST(100 AS TINYINT)) FROM persons",
        "SELECT SUM(age // (age - 5)) FROM persons",
        "SELECT AVG(age + 9223372036854775000) FROM persons",
        "SELECT region, SUM(age) FROM persons GROUP BY region",
        "SELECT age * 4611686018427387904 AS a, COUNT(*) FROM persons GROUP BY a",
        "SELECT MEDIAN(age * 4611686018427387904) FROM persons",
        "SELECT age, COUNT(*) FROM persons GROUP BY age",
    ],
)
def test_dp_refusals_come_before_the_charge(db, sql):
    con = sqlsdc.connect(db, user="ana")
    with pytest.raises(sqlsdc.PolicyViolation):
        con.execute(sql)
    con.close()
    assert charges_and_entries(db)[0] == []


MOVED = "CASE WHEN t.age = {} THEN 'c19' ELSE t.code END"
HEAVY = "codes a, codes b, codes c, codes d, codes e, codes f"
HEAVY_WHERE = "a.label || b.label || c.label || d.label || e.label || f.label = 'z'"
REFUSED = [
    # distinct counts of a joined column
    f"WITH x AS (SELECT c.label FROM t JOIN codes c ON c.code = {MOVED}) "
    "SELECT COUNT(DISTINCT label) FROM x",
    f"SELECT COUNT(DISTINCT v) FROM (SELECT c.label AS v FROM t JOIN codes c ON c.code = {MOVED}"
    " UNION ALL SELECT t.code FROM t WHERE t.age < 0) u",
    f"SELECT COUNT(DISTINCT (SELECT c.label FROM codes c WHERE c.code = {MOVED})) FROM t",
    f"SELECT t.code, COUNT(DISTINCT c.label) FROM t JOIN codes c ON c.code = {MOVED} "
    "GROUP BY GROUPING SETS ((t.code), ())",
    f"SELECT t.code, COUNT(DISTINCT c.label) FROM t JOIN codes c ON c.code = {MOVED} "
    "GROUP BY ROLLUP (t.code)",
    f"SELECT COUNT(DISTINCT c.label) FROM t JOIN codes c ON c.code = {MOVED} GROUP BY CUBE (t.age)",
    f"SELECT COUNT(DISTINCT code) FROM (SELECT {MOVED.replace('t.', '')} AS code FROM t) d "
    "JOIN codes USING (code)",
    f"SELECT COUNT(DISTINCT label) FROM (SELECT {MOVED.replace('t.', '')} AS code FROM t) d "
    "NATURAL JOIN codes",
    "SELECT COUNT(DISTINCT u.code) FROM t JOIN t u ON u.pid = t.pid WHERE t.age <> {}",
    f"SELECT COUNT(DISTINCT c.label) OVER () FROM t JOIN codes c ON c.code = {MOVED}",
    # public parts that could fail
    "WITH h AS (SELECT code FROM codes WHERE CAST(label AS INTEGER) > 0) "
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN (SELECT code FROM h)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code = "
    "(SELECT MIN(code) FROM codes WHERE CAST(label AS INTEGER) > 0)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN (SELECT code FROM codes EXCEPT "
    "SELECT code FROM codes WHERE CAST(label AS INTEGER) > 0)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND EXISTS "
    "(SELECT 1 FROM codes WHERE CAST(label AS INTEGER) > 0)",
    "SELECT t.code, COUNT(*) FROM t WHERE age > {} GROUP BY t.code HAVING t.code IN "
    "(SELECT code FROM codes WHERE CAST(label AS INTEGER) > 0)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN "
    "(SELECT code FROM codes ORDER BY CAST(label AS INTEGER) LIMIT 5)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN (SELECT code FROM codes LIMIT "
    "(SELECT CAST(MIN(label) AS INTEGER) FROM codes))",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN (SELECT code FROM (SELECT code, "
    "ROW_NUMBER() OVER (ORDER BY CAST(label AS INTEGER)) AS rn FROM codes) w WHERE rn < 5)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN (SELECT MIN(code) FROM codes "
    "GROUP BY GROUPING SETS ((code), (CAST(label AS INTEGER))))",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN (SELECT code FROM codes WHERE "
    "CASE WHEN label = 'x' THEN CAST(label AS INTEGER) ELSE 1 END > 0)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN "
    "(SELECT code FROM codes WHERE 1 // (length(label) - 7) > 0)",
    # public work that multiplies rows, or grows without a join
    f"WITH h AS (SELECT a.code FROM {HEAVY} WHERE {HEAVY_WHERE}) "
    "SELECT COUNT(*) FROM t WHERE age = {} AND code IN (SELECT code FROM h)",
    f"SELECT COUNT(*) FROM t WHERE age = {{}} AND code = (SELECT MIN(a.code) FROM {HEAVY} "
    f"WHERE {HEAVY_WHERE})",
    f"SELECT COUNT(*) FROM t WHERE age = {{}} AND EXISTS (SELECT 1 FROM {HEAVY} "
    f"WHERE {HEAVY_WHERE})",
    "SELECT COUNT(*) FROM t WHERE age = {} AND code IN "
    "(SELECT a.code FROM codes a JOIN codes b ON a.label < b.label)",
    "WITH x AS (SELECT code, COUNT(*) AS n FROM t WHERE age = {} GROUP BY code) SELECT "
    "COUNT(*) FROM x, codes a, codes b, codes c WHERE a.label || b.label || c.label = 'z'",
    "SELECT COUNT(*) FROM t WHERE age = {} AND code IN "
    "(SELECT code FROM codes WHERE length(repeat(label, 100000000)) = 3)",
    "SELECT COUNT(*) FROM t WHERE age = {} AND code IN (SELECT code FROM (SELECT code, "
    "unnest(range(10000000)) AS x FROM codes) z WHERE x = -1)",
    "WITH RECURSIVE r(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM r WHERE n < 100000000) "
    "SELECT COUNT(*) FROM t WHERE age = {} AND code IN (SELECT 'c01' FROM r WHERE n = 0)",
]


@pytest.fixture(scope="module")
def lookup(tmp_path_factory):
    con = lookup_db(tmp_path_factory.mktemp("s35d") / "lookup.duckdb")
    yield con
    con.close()


@pytest.mark.parametrize("attack", REFUSED)
def test_s35c_refusals_hold_through_other_forms(lookup, attack):
    for guess in (98, 99):
        with pytest.raises(sqlsdc.PolicyViolation):
            rows(lookup, attack.format(guess))


@pytest.mark.parametrize(
    "attack",
    [
        f"SELECT COUNT(*) FROM (SELECT c.label FROM t JOIN codes c ON c.code = {MOVED} "
        "GROUP BY c.label) g",
        "WITH x AS (SELECT code, COUNT(*) AS n FROM t WHERE age > {} GROUP BY code) "
        "SELECT COUNT(DISTINCT c.label) FROM x JOIN codes c ON c.code = x.code",
    ],
)
def test_counting_released_groups_tells_nothing_of_one_person(lookup, attack):
    """The one person aged 99 makes a group of one: not released, so not counted."""
    assert rows(lookup, attack.format(98)) == rows(lookup, attack.format(99))


CONSTANT_ORACLES = [
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN "
    "(SELECT code FROM codes WHERE CAST('x' AS INTEGER) = 1)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN "
    "(SELECT code FROM codes WHERE (SELECT 1 // 0) = 1)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN "
    "(SELECT CAST(CAST('x' AS INTEGER) AS VARCHAR))",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN "
    "(SELECT code FROM codes WHERE CAST(300 AS TINYINT) = 0)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN (SELECT code FROM (SELECT code, "
    "LAG(CAST('x' AS INT)) OVER (ORDER BY code) AS v FROM codes) w)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN (SELECT code FROM (SELECT code, "
    "ROW_NUMBER() OVER (ORDER BY CAST('x' AS INT)) AS v FROM codes) w)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN (SELECT MIN(code) FROM codes "
    "GROUP BY label HAVING MAX(CAST('x' AS INT)) > 0)",
]


@pytest.mark.parametrize("attack", CONSTANT_ORACLES)
def test_a_failing_constant_in_a_public_scope_tells_nothing_of_the_statistics(lookup, attack):
    """Broke: red team s35c made a public scope's expressions of public columns total, but not
    its constants. With the first form ``age > 98`` failed in the engine and ``age > 99``
    answered (DuckDB dropped the subquery its statistics proved unused): the one oldest
    person's age, 99, by bisection. A public scope's constants are now evaluated apart from
    the file, as a confidential scope's are: refused whatever the data."""
    for bound in (98, 99):
        with pytest.raises(sqlsdc.PolicyViolation, match="raises an error"):
            rows(lookup, attack.format(bound))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM t WHERE age > 50 AND code IN (SELECT code FROM codes WHERE "
        "1 + 1 = 2 AND label <> CAST(1 AS VARCHAR))",
        "SELECT COUNT(*) FROM t WHERE age > 50 AND code IN (SELECT code FROM codes WHERE "
        "2147483647 + 1 = 0 OR TRUE)",
        "SELECT COUNT(*) FROM t WHERE age > 50 AND code IN (SELECT MIN(code) FROM codes "
        "GROUP BY label HAVING COUNT(*) > 0 AND SUM(1) >= 1 ORDER BY 1 LIMIT 100)",
        "SELECT COUNT(*) FROM t WHERE age > 50 AND code IN (SELECT code FROM codes WHERE "
        "DATE '2020-01-01' + INTERVAL 1 DAY > DATE '2019-01-01')",
        "WITH x AS (SELECT code, COUNT(*) AS n FROM t WHERE age > 50 GROUP BY code) "
        "SELECT c.label, x.n, 'k' || 'l' FROM codes c LEFT JOIN x ON x.code = c.code",
    ],
)
def test_total_constants_in_public_scopes_are_answered(lookup, sql):
    assert rows(lookup, sql)


SCALAR_ORACLES = [
    "SELECT COUNT(*) FROM t WHERE age > {} AND code = (SELECT code FROM codes)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code = (SELECT MIN(code) FROM codes GROUP BY label)",
    "SELECT COUNT(*) FROM t WHERE age > {} AND EXISTS (SELECT 1 FROM codes WHERE code = "
    "(SELECT code FROM codes))",
    "SELECT COUNT(*) FROM t WHERE age > {} AND code IN (SELECT code FROM codes WHERE label = "
    "(SELECT label FROM codes))",
    "SELECT (SELECT COUNT(*) FROM t WHERE age >= {} GROUP BY code)",
]


@pytest.mark.parametrize("attack", SCALAR_ORACLES)
def test_a_scalar_subquery_of_several_rows_tells_nothing_of_the_statistics(lookup, attack):
    """Broke: a scalar subquery that returns several rows raises in DuckDB, on public rows
    alone, but only where the plan keeps it: ``age > 98 AND code = (SELECT code FROM codes)``
    failed and ``age > 99`` answered (the oldest person's age, by bisection). A scalar
    subquery of a statement that reads confidential rows must now return at most one row by
    its form (an aggregate without GROUP BY, no FROM, LIMIT 1, or a unique key of its one
    source equated to a literal), whatever the data."""
    for bound in (98, 99):
        with pytest.raises(sqlsdc.PolicyViolation, match="more than one row"):
            rows(lookup, attack.format(bound))


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM t WHERE age > 50 AND code = (SELECT MIN(code) FROM codes)",
        "SELECT COUNT(*) FROM t WHERE age > 50 AND code = "
        "(SELECT code FROM codes ORDER BY code LIMIT 1)",
        "SELECT COUNT(*) FROM t WHERE age > 50 AND code = (SELECT 'c01')",
        "SELECT (SELECT n FROM (SELECT code, COUNT(*) AS n FROM t GROUP BY code) s "
        "WHERE s.code = 'c01')",
        "SELECT (SELECT COUNT(*) FROM t WHERE age > 50), (SELECT MAX(label) FROM codes)",
    ],
)
def test_scalar_subqueries_of_one_row_are_answered(lookup, sql):
    assert rows(lookup, sql)


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """``lookup_db``'s persons with a public ``codes`` that has a HUGEINT and a DECIMAL(38, 0)
    column (each value near its type's limit)."""
    path = tmp_path_factory.mktemp("s35d_wide") / "wide.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t AS SELECT i AS pid, 'c0' || (i % 10) AS code, CASE WHEN i = 1234 "
                "THEN 99 ELSE i % 90 END AS age FROM range(2000) r(i)")  # fmt: skip
    con.execute("CREATE TABLE codes AS SELECT 'c' || lpad(CAST(i AS VARCHAR), 2, '0') AS code, "
                "CAST('100000000000000000000000000000000000000' AS HUGEINT) AS big, "
                "CAST(99999999999999999999999999999999999999 AS DECIMAL(38, 0)) AS dec, "
                "i AS small FROM range(20) r(i)")  # fmt: skip
    con.close()
    document = {
        "tables": {
            "t": {
                "privacy_unit": "pid",
                "columns": {
                    "pid": {"role": "identifier"},
                    "code": {"role": "dimension"},
                    "age": {"role": "dimension", "bounds": [0, 120]},
                },
                "protection": CKM,
            },
            "codes": {
                "kind": "public",
                "key": "code",
                "columns": {c: {"role": "dimension"} for c in ("code", "big", "dec", "small")},
            },
        },
        "users": {"analyst": {"role": "analyst"}, "admin": {"role": "admin"}},
    }
    sqlsdc.init(path, document)
    con = sqlsdc.connect(path, user="analyst")
    yield con
    con.close()


@pytest.mark.parametrize(
    "aggregate", ["SUM(big)", "SUM(dec)", "AVG(big)", "SUM(big) OVER ()", "AVG(dec + 0)"]
)
def test_a_public_sum_that_can_overflow_tells_nothing_of_the_statistics(wide, aggregate):
    """Broke: ``age > 98 AND code IN (SELECT MIN(code) FROM codes HAVING SUM(big) > 0)``
    failed in the engine (the HUGEINT sum overflows) and ``age > 99`` answered: the oldest
    person's age. A SUM or AVG of public values that DuckDB adds up in their own type
    (HUGEINT, DECIMAL wider than 18 digits) is now refused whatever the data."""
    sql = (
        "SELECT COUNT(*) FROM t WHERE age > {} AND code IN (SELECT code FROM (SELECT code, "
        f"{aggregate} AS s FROM codes GROUP BY code, big, dec) w WHERE s > 0)"
    )
    if "OVER" in aggregate:
        sql = sql.replace(" GROUP BY code, big, dec", "")
    for bound in (98, 99):
        with pytest.raises(sqlsdc.PolicyViolation, match="overflow"):
            rows(wide, sql.format(bound))
    # smaller types are summed in HUGEINT (integers) or reach infinity (floats)
    assert rows(wide, "SELECT COUNT(*) FROM t WHERE age > 50 AND code IN (SELECT MIN(code) "
                "FROM codes HAVING SUM(small) > 0 AND AVG(CAST(big AS DOUBLE)) > 0)")  # fmt: skip

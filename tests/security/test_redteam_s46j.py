"""Red team s46j: today's merged changes (session 46, round 2), as an analyst.

Findings (each test fails on int46):

- The audit entry of a statement without parameters could end with a forged values line:
  int46 appended ``-- parameters: (none)`` only when the text held ``\\n-- parameters: ``, but
  a ``--`` comment runs to ``\\n`` alone for the engine, while a reader (``str.splitlines``, a
  spreadsheet opening ``sqlsdc audit --format csv``, a terminal) also breaks lines at
  ``\\r``, ``\\x0b``, ``\\x0c``, ``\\x1c``-``\\x1e``, ``\\x85``, ``\\u2028``, ``\\u2029``. So
  ``SELECT COUNT(*) FROM persons WHERE region = 'R01'\\r-- parameters: 'R09'`` ran (R01's
  count, 1 query) and its entry's last line read as values the guard never bound; an
  indented ``  -- parameters:`` line too. 9 separators and the indented spelling, all 10
  forged on int46; now each entry ends with the guard's ``(none)`` line.
- A protection job's WHERE (s46c: converted to compare x·m) still kept the rows of the stored x
  where the conversion does not reach: a comparison in a subquery of the WHERE
  (``(SELECT employees >= 10)``, ``EXISTS (SELECT 1 WHERE employees >= 10)``) or a function
  no comparison holds (``list_contains``, ``LIKE``/``GLOB`` of a cast). On the seed-7 CKM demo
  the job by nace stored 226 enterprises where ``employees >= 10`` keeps the 216 of x·m (14
  on the other side of 10): s46c's finding again (the side of m of the units near a break,
  beside the queries' sums of x·m). 6 of 6 shapes accepted on int46; now refused (fail
  closed) like a function of the measure, with what to write instead. Admins write jobs, so
  the attacker is the analyst reading an output an admin tabulated this way in good faith.

Fixed in s47d (a strict xfail until then; the policy declares ``size_class`` ``classes_of``
employees, read as the class of x·m): the demo's ``size_class`` was the class of
the stored employees (1-9, 10-49, 50-249, 250+) published as a dimension, so it tells what the
conversion to x·m hides: ``WHERE employees < 10 GROUP BY size_class`` publishes a 'small' row,
and beside a padded average of y = x·m (s44j) it gives the branch of m of 26 of 1,000
enterprises (centred estimate within 2.4 % of x on average, where |m - 1| is about 8 %).

Held (numbers of statements tried):

- s46c's conversion: 40 WHERE spellings of ``employees >= 10`` in a job (NOT, BETWEEN, IN,
  parentheses, alias, IS TRUE, CASE, COALESCE, OR FALSE): each keeps the rows of x·m or is
  refused; a stored output tabulated by x before s46c beside a new job of the same written
  WHERE: 5 shapes (same SQL into another name; by region; nace × region; nace × size_class,
  counts and sums): the revision/earlier-suppression audits refused 4, and by region
  published only the totals (226 vs 216: the net count of units crossing, no unit's value).
- s46a: 90 query spellings of ``COUNT(*) ... WHERE income >= 100000`` on the CKM demo
  (parenthesized tables with aliases and column lists, ((persons AS p)) AS q, joins to a
  parenthesized table with ON/USING, CTEs, quoted and schema/catalog-qualified names,
  LATERAL, VALUES, NATURAL JOIN, FILTER, ANY/ALL, casts, IS TRUE, GROUP BY ALL): every one
  answered the x·m count (2,737) or was refused.
- s46g: the login bound per address (success forgets only its own attempt; IPv4-mapped IPv6
  counted as its IPv4); the statement rate's log reading is per user (no other user's
  refusal depends on it).
- s46d: 54 grouping-set shapes x 3 demos (threshold, CKM, rounding) on Spark against DuckDB
  (DISTINCT and windows over two grand totals, ORDER BY/LIMIT/OFFSET, a parenthesized table,
  a CTE, UNION ALL of two ROLLUPs, HAVING COUNT(*) = 0, ``GROUP BY (), ROLLUP (region), ()``,
  joins, COUNT(DISTINCT), MIN): 147 compared (the rest refused on DuckDB), 0 differences,
  0 Spark refusals.
- s46c's population names: 4 spellings of one WHERE (``NOT employees < 10``, ``... IS TRUE``,
  ``AND employees IS NOT NULL``) as jobs by nace × region: the same 18 published cells; the
  mix never readable by an analyst (``sqlsdc.ckm_mix``, ``ckm_mix``, ``__mix`` as a table,
  alias or column: 12 statements refused).
- s46a with column aliases: ``(persons) AS p(..., income, ..., age)`` swapping names: the
  planner follows the alias (``age`` is the measure), sums carry the factor (the same 5
  answers as by name), conditions refused.
"""

from __future__ import annotations

import shutil

import pytest

import sqlsdc
from sqlsdc.demo.build import demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import TabularError
from sqlsdc.guard.audited_parameters import audited_text
from sqlsdc.jobs.class_views import classes_of_noised_values
from sqlsdc.jobs.protect import protect_query
from sqlsdc.jobs.tabulation import parse_job
from sqlsdc.mechanisms.ckm import MixKeys
from sqlsdc.mechanisms.unit_noise import unit_factor
from sqlsdc.policy import AggregateKind
from tests.security.test_redteam_s44e import _rows

FORGED = "-- parameters: 'R09'"
SEPARATORS = ["\r", "\r\n", "\x0b", "\x0c", "\x1c", "\x1e", "\x85", "\u2028", "\u2029"]


@pytest.mark.parametrize("separator", SEPARATORS, ids=[repr(s) for s in SEPARATORS])
def test_a_forged_values_line_after_any_line_break_is_closed(separator):
    sql = f"SELECT COUNT(*) FROM persons WHERE region = 'R01'{separator}{FORGED}"
    assert audited_text(sql, None).splitlines()[-1] == "-- parameters: (none)"
    indented = f"SELECT 1\n   --  PARAMETERS : 'R09'{separator}"
    assert audited_text(indented, ()).splitlines()[-1] == "-- parameters: (none)"
    assert audited_text("SELECT 1 -- no values here", None) == "SELECT 1 -- no values here"


def test_the_logged_entry_of_a_forged_line_ends_with_the_guards(fresh_demo_db):
    """End to end: the statement runs (the engine reads ``\\r-- ...`` as a comment) and its
    audit entry's last line, split as a reader splits it, is the guard's."""
    sql = f"SELECT COUNT(*) FROM persons WHERE region = 'R01'\u2028{FORGED}"
    with sqlsdc.connect(fresh_demo_db, user="analyst") as con:
        ((count,),) = con.execute(sql).fetchall()
        ((plain,),) = con.execute("SELECT COUNT(*) FROM persons WHERE region = 'R01'").fetchall()
    assert count == plain
    ((text,),) = _rows(
        fresh_demo_db,
        "SELECT sql_text FROM sqlsdc.audit WHERE user_name = 'analyst' AND sql_text LIKE ?",
        ["%R09%"],
    )
    assert text.splitlines()[-1] == "-- parameters: (none)"
    assert text.startswith(sql)


# --- a job's WHERE reads a unit-noised measure only as the conversion computes x·m -------------


UNCONVERTED = [  # int46 kept these rows by the stored x (226 enterprises on the seed-7 demo)
    "(SELECT employees >= 10)",
    "EXISTS (SELECT 1 WHERE employees >= 10)",
    "(SELECT e.employees) >= 10",
    "list_contains([10, 20], employees)",
    "employees::VARCHAR LIKE '1_'",
    "employees GLOB '1*'",
]


@pytest.mark.parametrize("where", UNCONVERTED)
def test_a_jobs_where_reading_the_stored_measure_is_refused(where):
    """Second finding (fails on int46): a job's WHERE on a unit-noised measure that the
    conversion to x·m does not reach (a comparison inside a subquery of the WHERE, a
    function no comparison holds) kept the rows of the stored x, silently: on the seed-7 CKM
    demo ``WHERE (SELECT employees >= 10)`` stored an output by nace of 226 enterprises where
    ``employees >= 10`` keeps the 216 of x·m (14 differ), the side of m s46c closes. Refused
    now, as a function of the measure is; a test IS NULL and the plain class stay."""
    alias = "e " if "e.employees" in where else ""
    sql = f"SELECT nace, COUNT(*) FROM enterprises {alias}WHERE {where} GROUP BY nace"
    with pytest.raises(TabularError, match="x·m"):
        parse_job(sql, demo_policy())
    assert parse_job(sql, demo_policy(), stored=True).where is not None  # as it was tabulated


def test_a_jobs_null_test_and_classes_of_a_noised_measure_stay():
    policy = demo_policy()
    for where in ("employees IS NULL", "employees IS NOT NULL AND employees >= 10",
                  "region IN (SELECT region FROM enterprises WHERE employees >= 10)"):  # fmt: skip
        spec = parse_job(f"SELECT nace, COUNT(*) FROM enterprises WHERE {where} GROUP BY nace",
                         policy)  # fmt: skip
        assert spec.where is not None
    plain = parse_job("SELECT nace, COUNT(*) FROM enterprises WHERE employees IS NULL "
                      "GROUP BY nace", policy)  # fmt: skip
    assert "ckm_mix" not in plain.where.sql("duckdb")


def test_a_stored_job_by_a_subquery_of_the_measure_is_refused(ckm_db, tmp_path):
    """End to end (int46 stored it, its cells those of the stored x)."""
    path = tmp_path / "demo.duckdb"
    shutil.copy(ckm_db, path)
    with pytest.raises(TabularError, match="x·m"):
        protect_query(path, "admin", "SELECT nace, COUNT(*) FROM enterprises "
                      "WHERE (SELECT employees >= 10) GROUP BY nace", into="t")  # fmt: skip


# --- a dimension computed from a unit-noised measure publishes the class of x ------------------


def _branch_told(x: float, y: float, noise) -> float | None:
    """The centred estimate of x from y = x·m when a size class's break (10, 50, 250
    employees) separates the two branches of x given y, y/[a, b] and y/[2 − b, 2 − a]
    (s45l), so that the unit's class of x tells the branch; else None."""
    high = (y / noise.b, y / noise.a)  # m > 1
    low = (y / (2 - noise.a), y / (2 - noise.b))  # m < 1
    for cut in (10, 50, 250):
        if high[1] < cut <= low[0] or low[1] < cut <= high[0]:
            branch = low if (cut <= x) == (low[0] >= cut) else high
            return (branch[0] + branch[1]) / 2
    return None


def test_a_dimension_of_the_measures_class_does_not_tell_the_branch_of_m(ckm_db, tmp_path):
    """s46j's finding, fixed in s47d: the demo's size_class was the class of the stored
    employees (micro 1-9, small 10-49, medium 50-249, large 250+), so ``WHERE employees < 10
    GROUP BY size_class`` published a 'small' row (9 on the test demo, 15 on seed 7) and,
    beside a padded average of y = x·m (s44j), the class told the branch of m of 26 of 1,000
    enterprises (centred estimate within 2.4 % of x, where |m - 1| is about 8 %). The policy
    now declares it ``classes_of`` employees, read as the class of y everywhere: the class a
    job reads of each unit is the class of its y, a function of y alone, so it tells nothing of
    the branch of m; and the query publishes micro alone."""
    noise = demo_policy().table("enterprises").rule(AggregateKind.MAGNITUDES).magnitude.unit_noise
    con = open_database(ckm_db, writes_data=False)
    try:
        keys = MixKeys(*con.execute("SELECT * FROM sqlsdc.ckm_mix").fetchall()[0])
        rows = con.execute("SELECT employees, __rkey FROM enterprises ORDER BY __rkey").fetchall()
        with classes_of_noised_values(con, demo_policy()):
            read = [c for (c,) in con.execute("SELECT size_class FROM enterprises "
                                              "ORDER BY __rkey").fetchall()]  # fmt: skip
    finally:
        con.close()
    ys = [x * unit_factor(key, "enterprises.employees", noise, keys) for x, key in rows]
    near = [i for i, (x, _k) in enumerate(rows) if _branch_told(x, ys[i], noise) is not None]
    labels = ("micro", "small", "medium", "large")
    of_y = [labels[sum(y >= cut for cut in (10, 50, 250))] for y in ys]
    told = [i for i in near if read[i] != of_y[i]]  # a class other than y's: told by x
    path = tmp_path / "demo.duckdb"
    shutil.copy(ckm_db, path)
    with sqlsdc.connect(path, user="analyst") as analyst:
        published = analyst.execute(
            "SELECT size_class, COUNT(*) FROM enterprises WHERE employees < 10 "
            "GROUP BY size_class ORDER BY size_class"
        ).fetchall()
    assert len(near) > 10 and read == of_y
    assert told == [] and [c for c, _n in published] == ["micro"]

"""Red team s38a: an analyst's guarded connection against the demo policy (cell key method)
and its variants, after session 37's changes.

What broke (fixed here):

- **Threshold magnitudes beside cell-key counts.** A policy that declares ``counts: {method:
  ckm, ...}`` alone (or ``magnitudes: {method: threshold}`` beside it) leaves SUM and AVG to the
  threshold rule, which publishes them exactly. Red team s36b and s37d refused such magnitudes
  beside DP and rounded counts, not beside the cell key method's: ``SUM(income) / AVG(income)``
  of R01-M007 x F was 116.0 where ``COUNT(income)`` showed 115, and with ``AND NOT age = 43``
  112.0 where it showed 113: the 4 persons aged 43 there, exactly, a group the count noise
  (D = 5) was to blur; ``SUM(age) WHERE age = c`` is c times the exact count. Such a SUM or AVG
  is refused at query time now (``planner.plan._COUNTS_REVEALED_BY``), counts are answered.
- **Many cell-key statistics in one statement hung the guard past its timeout.** Every CKM
  statistic is one LEFT JOIN of the perturbation table per lookup (a count one, a sum 1 + 2 x
  top_k) in layers that carry every statistic's columns; DuckDB binds and plans such a frame
  in time growing with about the cube of its statistics, before it runs anything, where
  ``interrupt()`` does not reach, holding the GIL (every thread of a ``sqlsdc serve`` process
  stops). ``SELECT SUM(CASE WHEN age = k ... THEN income END) ...`` for 300 values of k
  (23 KB of SQL) ran 604 s under a 30 s statement timeout; 64 such sums took 28 s of CPU
  in DuckDB (an interrupt sent after 1 s was ignored). And the ledger's INSERT for a result
  copied its UNION ALL chain once per cell (cubic in the cells: 64 counts spent 55 s in
  sqlglot's deepcopy after the answer). A statement's CKM frames may now join at most 64
  perturbation-table rows (``rewrite.ckm.refuse_many_lookups``: 64 counts, 21 sums, 12 sums
  of a top-2 table, about 1.7 s of CPU each on a loaded 2-core machine), and the ledger's
  chain is built without copies (64 counts: 15 s to 1.7 s; 128: 110 s to 9.5 s).
- **The ledger's INSERT grew with cells times columns** (each UNION ALL branch unnested every
  list parameter of the result again) and runs after the answer, outside the timeout: 400
  threshold counts of one statement took 60 s of CPU. The release source is now one CTE every
  branch reads (400: 7 s), and ``cells._lift`` finds each position's aggregates in one walk.

Left open:

- Aggregations that look nothing up (threshold, rounding, suppression) have no bound on their
  number of statistics but the statement's size: 400 threshold counts still take about 7 s
  of CPU (roughly quadratic, in the rewrite and in DuckDB). A bound on released values per
  statement is a product decision (dashboards ask many); the CKM frame's own cost (about the
  cube of its statistics) would go with a frame that looks statistics up as rows, one join
  per layer, instead of one join per statistic.
- Zero-valued contributors give the same sum fresh noise: ``SUM(income) WHERE <cell> OR
  (income = 0 AND <elsewhere>)`` has the cell's true sum and another cell key (1,879 persons
  have income 0 on the demo, and 0 is a class break): the averaging over padded unions the
  README's threat model lists for counts, for sums.

What held (20,000-person demo, tried by hand): under the cell key method a SUM is keyed by its
contributors (padding the WHERE with NULL-income rows, or a CASE filter, gave the same value);
``CASE ... ELSE 0`` padding, ``POW(weight, 2)``, ``weight * CAST(weight AS DOUBLE)``, ``weight *
(weight + 1)``, ``income * income``, ``income * age`` and integer ``age - 60`` were refused;
ROLLUP and GROUPING SETS of an empty and of a one-person population looked as their counts
do, and a global aggregate of an empty population gives no row, as a hidden one; ``AVG(age)
WHERE age = 37`` by municipality shows interpolated noise (no rational n/12 to read);
sqlglot's simplify kept three-valued logic (``NOT (a = b AND NOT a = b)`` stays ``a <> b OR
a = b``, ``a = a`` is not TRUE); cell-key counts beside suppressed or rounded magnitudes
(refused at query time). Timing: CONCAT of 20,000 stored columns in a WHERE costs its check
(16 µs per character of SQL, linear) far more than the engine (0.7 s for 4,098 rows), and a
derived column at the 1,024-value bound costs 25 µs per row: no person shows on the clock.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import sqlsdc
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.errors import PolicyViolation
from sqlsdc.policy import load_policy


@pytest.fixture(scope="module")
def ckm_threshold_db(tmp_path_factory) -> Path:
    """The demo with cell-key counts and the default (threshold) magnitudes."""
    document = demo_policy().document_dict()
    document["protection"]["magnitudes"] = {"method": "threshold"}
    document["tables"]["enterprises"].pop("protection", None)
    path = tmp_path_factory.mktemp("s38a") / "ckm_threshold.duckdb"
    policy = load_policy(document, name="ckm-counts-threshold-magnitudes")
    build_demo_database(path, persons=20_000, seed=7, policy=policy)
    return path


@pytest.fixture(scope="module")
def ckm_threshold(ckm_threshold_db):
    con = sqlsdc.connect(ckm_threshold_db, user="analyst")
    yield con
    con.close()


CELL = "FROM persons WHERE municipality = 'R01-M007' AND sex = 'F'"


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT SUM(income) / AVG(income) {CELL} AND NOT age = 43",
        f"SELECT SUM(income) {CELL}",
        f"SELECT AVG(income) {CELL}",
        f"SELECT COUNT(*), AVG(income) {CELL}",
        "SELECT SUM(age) FROM persons WHERE age = 43 AND municipality = 'R01-M007'",
        "SELECT region, SUM(turnover) FROM enterprises GROUP BY region",
    ],
)
def test_threshold_magnitudes_beside_ckm_counts_are_refused(ckm_threshold, sql):
    with pytest.raises(PolicyViolation, match="are protected by the cell key method"):
        ckm_threshold.execute(sql).fetchall()


def test_ckm_counts_beside_threshold_magnitudes_are_answered(ckm_threshold):
    (count,) = ckm_threshold.execute(f"SELECT COUNT(income) {CELL}").fetchall()
    assert count[0] > 0


def _sums(n: int) -> str:
    return ", ".join(f"SUM(CASE WHEN age = {k} THEN income END) AS s{k}" for k in range(n))


@pytest.mark.parametrize(
    "sql",
    [
        f"SELECT {_sums(22)} FROM persons",  # 66 lookups: 22 counts and 44 magnitude rows
        "SELECT "
        + ", ".join(f"COUNT(CASE WHEN age = {k} THEN 1 END)" for k in range(65))
        + " FROM persons",
        # the frames of one statement together: two aggregations of 11 sums each
        f"SELECT * FROM (SELECT {_sums(11)} FROM persons WHERE sex = 'F') AS f, "
        f"(SELECT {_sums(11)} FROM persons WHERE sex = 'M') AS m",
    ],
    ids=["22 sums", "65 counts", "two frames"],
)
def test_many_cell_key_statistics_in_one_statement_are_refused(ckm, sql):
    with pytest.raises(PolicyViolation, match="too many statistics protected by the cell key"):
        ckm.execute(sql).fetchall()


def test_cell_key_statistics_up_to_the_bound_are_answered(ckm):
    (row,) = ckm.execute(f"SELECT {_sums(21)} FROM persons").fetchall()
    assert len(row) == 21

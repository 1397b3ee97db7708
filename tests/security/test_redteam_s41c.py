"""Red team s41c: replaced jobs, each cell's side kept per job name across versions (session 41).

Attacked as a reader who keeps every version of a job's table (``--replace`` overwrites it in
the database, not in the readers' copies). Real DuckDB files; the jobs' fixed secret.

- W  a CTA job of turnover by nace x region (``nk:1,60``, ``freq:3``) replaced by a job of
     another population under the same name (employees by nace x region), then, after one
     enterprise's turnover was revised, by the first job again: the third read only the
     second, whose values are of another original and were not held, so the first version's
     sides were lost (s40d's LP alternation turned them round): 39 cells crossed, the mean of
     the two versions gave 38 turnovers within 0.5.
- W  a rounding job (persons aged 80 or over by region x education, base 5) replaced after
     each of six one-person changes: 6 of the 26 cells that never changed were rounded both
     ways, leaving 4 possible counts instead of 9.
- W  a CTA job of incomes aged 85+ by region x education (``freq:10,30``) respelled seven
     times (case, column order, an alias, ``85 <= age``, ``age > 84``, ``NOT age < 85``,
     parentheses) and stored with ``--replace`` on the same data: the secret factors were
     keyed by the SQL text, so each respelling drew new ones, and a cell moved further
     whenever its new level was beyond its old distance: from 1.11 to 1.40 levels to 1.45
     to 1.49, which puts an original within 0.6 % where one version left 5.5 %.
- W  (found with the fix above) the same job replaced after one income of each sensitive
     cell grew by 50,000: with each cell's factor kept, the versions held ``x·(1 + 0.3·f)``
     and ``(x + d)·(1 + 0.3·f)`` (or ``1 − 0.3·f`` for both), so ``v1·d / (v2 − v1)`` gave
     2 of 4 sensitive incomes to 1e-9 to whoever knew ``d``. Fixed: a factor is keyed by the
     cell's original value too, so a cell whose value changed draws another.
- O  five monthly updates (one income of each sensitive cell +1,000): a cell moved down and
     held at its value while its original grows drifted to 1.48 levels. Analysed in session
     42 (s42i): a reader who knows the changes intersects the versions' ranges (R01 primary:
     31 % of the cell -> 5.8 %), and a fresh level at each change, which ends the drift,
     narrows them further (1.7 %). Closed in s43d: each such update is refused (one unit
     changed in the cells it moves; jobs/adjusted_revisions.py); both tests below check it.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
import pytest

from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import TabularError
from sqlsdc.jobs.adjust import cta_query, round_query
from sqlsdc.tabular.rules import DominanceRule, FrequencyRule

TURNOVER = "SELECT nace, region, SUM(turnover) FROM enterprises GROUP BY nace, region"
EMPLOYEES = "SELECT nace, region, SUM(employees) FROM enterprises GROUP BY nace, region"
TURNOVER_RULES = [DominanceRule(n=1, k=60), FrequencyRule(3)]


def _stored(db, name: str, dims: list[str]) -> pd.Series:
    con = duckdb.connect(str(db), read_only=True)
    try:
        frame = con.sql(f"SELECT * FROM protected.{name}").df()
    finally:
        con.close()
    return frame.astype({d: str for d in dims}).set_index(dims)["value"].astype(float)


def _originals(db, sql: str, dims: list[str]) -> pd.DataFrame:
    """Every cell of ``sql``'s table (CUBE of its dimensions), value ``v`` and units ``n``."""
    con = open_database(db)
    try:
        named = ", ".join(f"COALESCE(CAST({d} AS VARCHAR), 'Total') AS {d}" for d in dims)
        return con.sql(sql.format(named=named, cube=", ".join(dims))).df().set_index(dims)
    finally:
        con.close()


TURNOVER_CELLS = (
    "SELECT {named}, SUM(turnover) AS v, COUNT(*) AS n FROM enterprises GROUP BY CUBE ({cube})"
)


def test_a_cta_replaced_by_another_population_and_back_after_new_data_keeps_the_first_sides(
    jobs_demo_db,
):
    db, dims = jobs_demo_db, ["nace", "region"]
    cta_query(db, "admin", TURNOVER, into="t", rules=TURNOVER_RULES)
    first, before = _stored(db, "t", dims), _originals(db, TURNOVER_CELLS, dims).v
    cta_query(db, "admin", EMPLOYEES, into="t", rules=TURNOVER_RULES, replace=True)
    employees = _stored(db, "t", dims)
    con = open_database(db)
    try:  # new data: the dominant firm of (A, R06) revised, its cell no longer sensitive
        con.execute(
            "UPDATE enterprises SET turnover = 1000000 "
            "WHERE nace = 'A' AND region = 'R06' AND turnover > 2e9"
        )
    finally:
        con.close()
    # Before s41c the third version crossed 39 cells of the first, 38 of them to within 0.5 of
    # the original by the mean of the two. Since s43d it is refused: one firm was revised since
    # the first version, whose units are kept (the employees version between changes nothing)
    with pytest.raises(TabularError, match="fewer units changed than the rules allow"):
        cta_query(db, "admin", TURNOVER, into="t", rules=TURNOVER_RULES, replace=True)
    pd.testing.assert_series_equal(_stored(db, "t", dims), employees)
    assert len(first) == len(before) > 50


OLD80 = "SELECT region, education, COUNT(*) FROM persons WHERE age >= 80 GROUP BY region, education"
OLD80_CELLS = "SELECT {named}, COUNT(*) AS v FROM persons WHERE age >= 80 GROUP BY CUBE ({cube})"


def test_a_rounding_replaced_after_one_person_changes_rounds_no_unchanged_cell_both_ways(
    jobs_demo_db,
):
    db, dims = jobs_demo_db, ["region", "education"]
    round_query(db, "admin", OLD80, into="r", base=5)
    versions, originals = [_stored(db, "r", dims)], [_originals(db, OLD80_CELLS, dims).v]
    for region in ["R01", "R02", "R03", "R04", "R05", "R06"]:
        con = open_database(db)
        try:  # one person of the region turns 80
            con.execute(
                "UPDATE persons SET age = 80 WHERE person_id = (SELECT min(person_id) FROM "
                f"persons WHERE age = 79 AND region = '{region}')"
            )
        finally:
            con.close()
        try:
            report = round_query(db, "admin", OLD80, into="r", base=5, replace=True)
        except TabularError as refusal:  # it moved a cell a person entered (s43d)
            assert "fewer units changed than the rules allow" in str(refusal)
            versions.append(versions[-1])
        else:
            assert report.details["same_multiple"] >= report.details["published_before"] - 6
            versions.append(_stored(db, "r", dims))
        originals.append(_originals(db, OLD80_CELLS, dims).v)
    published = pd.concat(versions, axis=1).fillna(0.0)
    values = pd.concat(originals, axis=1).reindex(published.index).fillna(0.0)
    unchanged = values.nunique(axis=1) == 1
    both_ways = published.nunique(axis=1) > 1
    assert unchanged.sum() >= 20
    assert int((unchanged & both_ways).sum()) == 0  # was 7 of 29: 4 candidates instead of 9


OLD_INCOME = (
    "SELECT region, education, SUM(income) FROM persons WHERE age >= 85 GROUP BY region, education"
)
RESPELLED = [
    "select region, education, sum(income) from persons where age >= 85 group by region, education",
    "SELECT education, region, SUM(income) FROM persons WHERE 85 <= age GROUP BY education, region",
    "SELECT region, education, SUM(income) AS total FROM persons WHERE age >= 85 "
    "GROUP BY region, education",
    "SELECT region, education, SUM(income) FROM persons WHERE age > 84 GROUP BY region, education",
    "SELECT region, education, SUM(income) FROM persons WHERE NOT age < 85 "
    "GROUP BY region, education",
    "SELECT region, education, SUM(income) FROM persons WHERE (age >= 85) "
    "GROUP BY region, education",
    "SELECT  region ,education, SUM( income )\nFROM persons\nWHERE age>=85\n"
    "GROUP BY region,education",
]


def _old_income_cta(db) -> None:
    """The CTA of everyone aged 85+'s incomes by region and education (protection levels 30 %
    of each sensitive cell), stored as ``t``: the first version of the tests below."""
    cta_query(db, "admin", OLD_INCOME, into="t", rules=[FrequencyRule(10, 30)])


@pytest.mark.parametrize(
    "spellings",
    [  # each replacement is checked against every earlier version: 7 cost 28 checks, ~10 s
        pytest.param(RESPELLED[1:2] + RESPELLED[3:4], id="order-and-85-le-age-then-age-gt-84"),
        pytest.param(RESPELLED, id="all-seven", marks=pytest.mark.slow),
    ],
)
def test_a_cta_respelled_and_replaced_on_the_same_data_is_the_same_table(
    jobs_state, tmp_path, spellings
):
    """The quick run replaces the table twice: the columns in another order with ``85 <=
    age`` (the same canonical population), then ``age > 84`` (the same rows by the data
    only); CI replaces it with all seven respellings."""
    db, dims = jobs_state(_old_income_cta, tmp_path), ["region", "education"]
    rules = [FrequencyRule(10, 30)]
    first = _stored(db, "t", dims)
    differ = 0
    for sql in spellings:
        cta_query(db, "admin", sql, into="t", rules=rules, replace=True)
        again = _stored(db, "t", dims).reindex(first.index)
        differ += int(not np.allclose(again.to_numpy(), first.to_numpy(), rtol=1e-9))
    assert differ == 0  # was 7 of 7 (2 of 2)
    con = duckdb.connect(str(db), read_only=True)
    try:  # one population: age > 84 is the same rows as age >= 85 (the simplifier cannot tell)
        sql = "SELECT count(DISTINCT population) FROM sqlsdc.job_cells WHERE name = 'protected.t'"
        assert con.execute(sql).fetchall() == [(1,)]
    finally:
        con.close()


def test_a_cta_replaced_after_a_known_change_does_not_give_the_original(jobs_state, tmp_path):
    """A reader who knows how much one income of a sensitive cell grew (the person, say)."""
    db, dims = jobs_state(_old_income_cta, tmp_path), ["region", "education"]
    rules = [FrequencyRule(10, 30)]
    cells_sql = (
        "SELECT {named}, SUM(income) AS v, COUNT(*) AS n FROM persons WHERE age >= 85 "
        "GROUP BY CUBE ({cube})"
    )
    first, cells = _stored(db, "t", dims), _originals(db, cells_sql, dims)
    small = cells[cells.n < 10]
    grew = 50_000.0
    con = open_database(db)
    try:  # one person of each sensitive cell earns 50,000 more
        for region, education in small.index:
            con.execute(
                "UPDATE persons SET income = income + ? WHERE person_id = (SELECT min(person_id) "
                "FROM persons WHERE age >= 85 AND region = ? AND education = ?)",
                [grew, region, education],
            )
    finally:
        con.close()
    # one income per cell: refused since s43d
    with pytest.raises(TabularError, match="fewer units changed than the rules allow"):
        cta_query(db, "admin", OLD_INCOME, into="t", rules=rules, replace=True)
    second = _stored(db, "t", dims)
    frame = small.join(first.rename("v1")).join(second.rename("v2"))
    # both versions x·(1 + 0.3·f) and (x + grew)·(1 + 0.3·f) when the factor f is kept
    scale = (frame.v2 - frame.v1) / grew
    guess = frame.v1 / scale
    assert int(((guess - frame.v).abs() < 0.5).sum()) == 0  # was 2 of 4 (R05, R06 primary)


def _one_income_grows(db, cells) -> None:
    """One income (aged 85+) of each (region, education) of ``cells`` grows by 1,000."""
    con = open_database(db)
    try:
        for region, education in cells:
            con.execute(
                "UPDATE persons SET income = income + 1000 WHERE person_id = (SELECT "
                "min(person_id) FROM persons WHERE age >= 85 AND region = ? AND education = ?)",
                [region, education],
            )
    finally:
        con.close()


def test_monthly_updates_do_not_push_a_held_cell_towards_the_largest_level(jobs_state, tmp_path):
    """Was a strict xfail (R01 and R06 primary 1.11 and 1.27 levels -> 1.48 in five monthly
    updates of +1,000: the replacement held each sensitive cell at least as far as before).
    Since s43d each update, one income of a sensitive cell, is refused: its cells moved while
    one unit changed in them (jobs/adjusted_revisions.py); readers hold the first version."""
    db, dims = jobs_state(_old_income_cta, tmp_path), ["region", "education"]
    rules = [FrequencyRule(10, 30)]
    cells_sql = (
        "SELECT {named}, SUM(income) AS v, COUNT(*) AS n FROM persons WHERE age >= 85 "
        "GROUP BY CUBE ({cube})"
    )
    cells = _originals(db, cells_sql, dims)
    small = cells[cells.n < 10].index

    first = _stored(db, "t", dims)
    for _ in range(5):
        _one_income_grows(db, small)  # by 1,000: 0.1 to 1 % of the cell
        with pytest.raises(TabularError, match="fewer units changed than the rules allow"):
            cta_query(db, "admin", OLD_INCOME, into="t", rules=rules, replace=True)
    pd.testing.assert_series_equal(_stored(db, "t", dims), first)


def test_a_catalog_made_before_kept_cells_keeps_the_replaced_versions_sides(jobs_state, tmp_path):
    """Without ``sqlsdc.job_cells`` (a catalog no job stored into since), the output replaced
    is read as before, and the replacement starts keeping its cells."""
    db, dims = jobs_state(_old_income_cta, tmp_path), ["region", "education"]
    first = _stored(db, "t", dims)
    con = open_database(db)
    try:
        con.execute("DROP TABLE sqlsdc.job_cells")
    finally:
        con.close()
    cta_query(db, "admin", OLD_INCOME, into="t", rules=[FrequencyRule(10, 40)], replace=True)
    cells_sql = (
        "SELECT {named}, SUM(income) AS v, COUNT(*) AS n FROM persons WHERE age >= 85 "
        "GROUP BY CUBE ({cube})"
    )
    cells = _originals(db, cells_sql, dims)
    small = cells[cells.n < 10].join(first.rename("v1")).join(_stored(db, "t", dims).rename("v2"))
    assert len(small) == 4
    assert ((small.v2 - small.v) * (small.v1 - small.v) > 0).all()  # each on its side
    con = duckdb.connect(str(db), read_only=True)
    try:
        kept = con.execute("SELECT count(*) FROM sqlsdc.job_cells").fetchall()[0][0]
    finally:
        con.close()
    assert kept == len(cells)


def _consistent(published: list[pd.Series], changes: list[float], level: float) -> pd.Series:
    """Per cell, the total length of the originals of the first version consistent with every
    version, for a reader who knows the change of the original since the first (``changes``)
    and that a sensitive cell is published at ``x·(1 ± level·f)``, f in [1, 1.5), on one side
    in every version (the side held); relative to the original."""
    lengths = 0.0
    for side in (1.0, -1.0):
        low = pd.Series(-np.inf, index=published[0].index)
        high = pd.Series(np.inf, index=published[0].index)
        for p, d in zip(published, changes, strict=True):
            near, far = 1.0 + side * level, 1.0 + side * level * 1.5
            ends = [p / near - d, p / far - d]
            low = np.maximum(low, np.minimum(*ends))
            high = np.minimum(high, np.maximum(*ends))
        lengths = lengths + (high - low).clip(lower=0.0)
    return lengths


@pytest.mark.slow
def test_monthly_updates_leave_a_reader_who_knows_them_the_first_versions_range(jobs_demo_db):
    db, dims = jobs_demo_db, ["region", "education"]
    cells_sql = (
        "SELECT {named}, SUM(income) AS v, COUNT(*) AS n FROM persons WHERE age >= 85 "
        "GROUP BY CUBE ({cube})"
    )
    cta_query(db, "admin", OLD_INCOME, into="t", rules=[FrequencyRule(10, 30)])
    cells = _originals(db, cells_sql, dims)
    small = cells[(cells.n < 10) & (cells.n > 1)].index  # one income changes: a cell of 2+
    originals, published = cells.v.reindex(small), [_stored(db, "t", dims).reindex(small)]
    for _ in range(5):  # was a strict xfail (s42i): R01 primary 31 % of the cell -> 5.8 %
        _one_income_grows(db, small)  # by 1,000, as the reader knows
        try:  # refused since s43d: one income changed in each cell (jobs/adjusted_revisions.py)
            cta_query(db, "admin", OLD_INCOME, into="t", rules=[FrequencyRule(10, 30)],
                      replace=True)  # fmt: skip
        except TabularError as refusal:
            assert "fewer units changed than the rules allow" in str(refusal)
        published.append(_stored(db, "t", dims).reindex(small))
    changes = [1000.0 * t for t in range(len(published))]
    first = _consistent(published[:1], changes[:1], 0.3) / originals
    every = _consistent(published, changes, 0.3) / originals
    assert (every > 0).all()  # the reader's model holds: the original is among them
    assert (every >= 0.8 * first).all(), pd.DataFrame({"first": first, "every": every})

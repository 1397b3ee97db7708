"""s46c: a protection job's WHERE on a unit-noised measure keeps the rows whose x·m passes it.

Under the demo policy enterprises' employees and turnover carry permanent unit noise: every
sum adds x·m, and since session 45 every query's condition at a class break compares x·m
(:mod:`sqlsdc.rewrite.noised_conditions`). A job's WHERE compared the stored x, so a job by
``employees >= 10`` beside the queries' sums told the side of 1 of the factors of the units
near 10. :func:`~sqlsdc.jobs.tabulation.parse_job` now converts the WHERE once
(:mod:`sqlsdc.jobs.noised_where`), and every reader of ``JobSpec.where`` sees x·m.

Every test here but the identity's first assertions fails on main (int45): the job's rows were
those of x.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import sqlglot
from sqlglot import exp

from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import TabularError
from sqlsdc.jobs.exact_release import Release, held_cuts, tells
from sqlsdc.jobs.kept_cells import _population
from sqlsdc.jobs.protect import protect_query
from sqlsdc.jobs.stored_tables import same_rows
from sqlsdc.jobs.tabulation import cells_sql, parse_job, population_where
from sqlsdc.mechanisms.ckm import MixKeys
from sqlsdc.mechanisms.unit_noise import unit_factor
from sqlsdc.policy import AggregateKind

POLICY = demo_policy()
NOISE = POLICY.table("enterprises").rule(AggregateKind.MAGNITUDES).magnitude.unit_noise


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A CKM demo database (the demo policy as shipped: 1,000 enterprises), closed."""
    path = tmp_path_factory.mktemp("s46c") / "demo.duckdb"
    build_demo_database(path, persons=20_000, seed=7)
    return path


@pytest.fixture(scope="module")
def enterprises(built):
    """Per enterprise: (id, nace, employees x, its x·m, turnover·m) by the Python reference
    :func:`unit_factor`."""
    con = open_database(built)
    try:
        keys = MixKeys(*con.execute("SELECT * FROM sqlsdc.ckm_mix").fetchall()[0])
        rows = con.execute(
            "SELECT enterprise_id, nace, __rkey, employees, turnover FROM enterprises"
        ).fetchall()
    finally:
        con.close()
    return [
        (
            e,
            nace,
            x,
            x * unit_factor(k, "enterprises.employees", NOISE, keys),
            t * unit_factor(k, "enterprises.turnover", NOISE, keys),
        )  # fmt: skip
        for e, nace, k, x, t in rows
    ]


def _flipped(enterprises) -> int:
    """An enterprise of 10 or more employees whose x·m is under 10."""
    return next(e for e, _n, x, y, _t in enterprises if x >= 10 > y)


def test_a_jobs_cells_by_a_class_are_those_of_x_m(built, enterprises):
    """The inner cells of ``SUM(turnover) ... WHERE employees >= 10`` by nace count the
    enterprises whose employees·m is 10 or more and add their turnover·m (int45: those whose
    stored employees are, 8 of 1,000 enterprises on the other side of 10 here)."""
    spec = parse_job(
        "SELECT nace, SUM(turnover) FROM enterprises WHERE employees >= 10 GROUP BY nace", POLICY
    )
    con = open_database(built)
    try:
        found = con.execute(f"SELECT nace, n, value FROM ({cells_sql(spec, 0)})").fetchall()
    finally:
        con.close()
    expected, by_x = {}, {}
    for _e, nace, x, y, t in enterprises:
        if y >= 10:
            n, total = expected.get(nace, (0, 0.0))
            expected[nace] = (n + 1, total + t)
        if x >= 10:
            by_x[nace] = by_x.get(nace, 0) + 1
    assert {k: n for k, (n, _t) in expected.items()} != by_x  # the test tells x·m from x
    cells = {nace: (n, value) for nace, n, value in found}
    assert cells.keys() == expected.keys() and len(cells) >= 10
    for nace, (n, total) in expected.items():
        assert cells[nace][0] == n
        assert cells[nace][1] == pytest.approx(total, rel=1e-9)


def test_two_spellings_of_a_class_are_one_population(built, enterprises):
    """``employees >= 10`` and ``10 <= employees`` keep the same rows (those of x·m) and are
    one canonical population for the job's kept cells, named by the WHERE as written (the
    ledger's too), never by the 4 KB of SQL that computes x·m."""
    first, second = (
        parse_job(f"SELECT nace, COUNT(*) FROM enterprises WHERE {w} GROUP BY nace", POLICY)
        for w in ("employees >= 10", "10 <= employees")
    )
    assert population_where(first).sql("duckdb") == "employees >= 10"
    assert "ckm_mix" in first.where.sql("duckdb")  # the rows: x·m
    con = open_database(built)
    try:
        assert same_rows(con, "enterprises", first.where, second.where)
        stored_x = sqlglot.parse_one("employees >= 10", read="duckdb")
        assert not same_rows(con, "enterprises", first.where, stored_x)
        kept = con.execute(
            f"SELECT count(*) FROM enterprises WHERE {first.where.sql('duckdb')}"
        ).fetchone()[0]
        mine, theirs = (_population(SimpleNamespace(con=con, spec=s)) for s in (first, second))
    finally:
        con.close()
    assert kept == sum(y >= 10 for _e, _n, _x, y, _t in enterprises)
    assert mine == theirs and "ckm_mix" not in mine and "employees" in mine


def test_a_files_exact_column_does_not_tell_the_jobs_rows(built):
    """A file holding employees as they are tells of each record whether ``employees >= 10``
    holds of x, not of x·m: its cut no longer counts as telling which records the job counts
    (int45 :func:`held_cuts` returned it, and the checks took the file's records outside the
    job for counts of its own cells, the units near 10 among them)."""
    spec = parse_job(
        "SELECT nace, COUNT(*) FROM enterprises WHERE employees >= 10 GROUP BY nace", POLICY
    )
    column = exp.column("employees")
    file = Release("file", None, (), exact=(("employees", column),), held=frozenset({"employees"}))
    con = open_database(built)
    try:
        assert held_cuts(con, spec, file) == []
        assert not tells(con, spec, file)
    finally:
        con.close()


def test_a_function_of_a_noised_measure_is_refused():
    """A condition the rewrite cannot compute on x·m is refused (fail closed), as in a query;
    a stored output's SQL is read as it was tabulated."""
    sql = "SELECT nace, COUNT(*) FROM enterprises WHERE employees * 2 >= 20 GROUP BY nace"
    with pytest.raises(TabularError, match="x·m"):
        parse_job(sql, POLICY)
    assert parse_job(sql, POLICY, stored=True).where.sql("duckdb") == "employees * 2 >= 20"


def test_the_differencing_check_sees_the_units_x_m_moves(built, tmp_path, enterprises):
    """Beside a stored job of ``employees >= 10`` by nace, one by region that adds a single
    enterprise of 10 employees whose x·m is under 10 differs from it by that one unit: refused
    by the differencing check (int45: the same rows by x, refused only as the same cells).
    The stored job's ledger names its population as written."""
    import shutil

    path = tmp_path / "demo.duckdb"
    shutil.copy(built, path)
    protect_query(
        path, "admin",
        "SELECT nace, COUNT(*) FROM enterprises WHERE employees >= 10 GROUP BY nace", into="a",
    )  # fmt: skip
    flipped = _flipped(enterprises)
    with pytest.raises(TabularError, match=r"differ by only 1 unit\(s\)"):
        protect_query(
            path, "admin",
            "SELECT region, COUNT(*) FROM enterprises "
            f"WHERE employees >= 10 OR enterprise_id = {flipped} GROUP BY region", into="b",
        )  # fmt: skip
    con = open_database(path)
    try:
        cells = [c for (c,) in con.execute("SELECT DISTINCT cell FROM sqlsdc.ledger").fetchall()]
    finally:
        con.close()
    named = [c for c in cells if "employees" in c]
    assert named and all("employees >= 10" in c and "ckm_mix" not in c for c in named)

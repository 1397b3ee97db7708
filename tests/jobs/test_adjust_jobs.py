"""Rounding and adjustment jobs on a real demo database: `round_query`, `cta_query`,
`ipf_query` and `sqlsdc protect --method round|cta|ipf` (subprocess).

Expected sensitive cells and their protection levels are computed independently, from the raw
rows (read through an unguarded connection) with `build_table` and `apply_rules`; the stored
tables are then checked against them: additive, sensitive cells at least a level away,
multiples of the base, margins as given, registered with their quality report.
"""

from __future__ import annotations

import importlib
import json

import cli_fork
import numpy as np
import pandas as pd
import pytest
from firms_db import firms_db

from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import AccessDenied, TabularError, VerificationError
from sqlsdc.jobs.adjust import cta_query, ipf_query, round_query
from sqlsdc.tabular.model import build_table
from sqlsdc.tabular.rules import DominanceRule, FrequencyRule, apply_rules

TURNOVER = "SELECT nace, region, SUM(turnover) FROM enterprises GROUP BY nace, region"
OLD = "SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 GROUP BY region, education"
OLD_INCOME = (
    "SELECT region, education, SUM(income) FROM persons WHERE age >= 85 GROUP BY region, education"
)
TURNOVER_RULES = [DominanceRule(n=1, k=60), FrequencyRule(3)]
QUALITY_KEYS = {"hd", "rad", "aad", "chi2", "max_additivity_error", "max_abs_change"}


@pytest.fixture()
def db(jobs_demo_db):
    return jobs_demo_db


def raw(db, sql):
    con = open_database(db)
    try:
        return con.sql(sql).df()
    finally:
        con.close()


def stored(db, name):
    """The stored table and its ``sqlsdc.outputs`` row (method, report as a dict)."""
    con = open_database(db)
    try:
        frame = con.sql(f"SELECT * FROM protected.{name}").df()
        rows = con.execute(
            "SELECT method, created_by, report FROM sqlsdc.outputs WHERE name = ?",
            [f"protected.{name}"],
        ).fetchall()
    finally:
        con.close()
    (method, by, report), *_ = rows
    return frame, method, by, json.loads(report)


def expected(db, dims, measure, rules, where=""):
    """All cells of the raw table with the rules' sensitive cells and levels (a unit without a
    value of ``measure`` counts in its cell with 0, as in the jobs)."""
    columns = ", ".join([*dims, *([f"COALESCE({measure}, 0) AS {measure}"] if measure else [])])
    table = build_table(raw(db, f"SELECT {columns} FROM {where}"), dims, measure, top_k=2)
    found = apply_rules(table, rules)
    cells = table.cells[[*dims, "value"]].astype({d: str for d in dims})
    return cells.assign(sensitive=found.primary, upl=found.upl, lpl=found.lpl)


def published(frame, cells, dims):
    """The stored value of every cell of ``cells`` (missing rows are cells published as 0)."""
    values = frame.set_index(dims)["value"]
    index = pd.MultiIndex.from_frame(cells[dims])
    return values.reindex(index).fillna(0.0).to_numpy(np.float64)


def assert_additive(frame, dims, tol=1e-6):
    """Every margin of a flat 2-D table equals the sum of its stored inner cells."""
    a, b = dims
    full = frame.set_index(dims)["value"]
    inner = frame[(frame[a] != "Total") & (frame[b] != "Total")]
    for dim in dims:
        sums = inner.groupby(dim)["value"].sum()
        for code, total in sums.items():
            key = (code, "Total") if dim == a else ("Total", code)
            assert full.get(key, 0.0) == pytest.approx(total, abs=tol, rel=1e-9), key
    assert full.get(("Total", "Total"), 0.0) == pytest.approx(inner["value"].sum(), rel=1e-9)


def assert_protected(values, cells):
    s = cells["sensitive"].to_numpy()
    a = cells["value"].to_numpy(np.float64)
    tol = 1e-6 * np.maximum(1.0, np.abs(a))
    moved_up = values >= a + cells["upl"].to_numpy() - tol
    moved_down = values <= a - cells["lpl"].to_numpy() + tol
    assert s.sum() > 0
    assert np.all((moved_up | moved_down)[s]), cells[s & ~(moved_up | moved_down)]


def test_cta_job_moves_every_sensitive_cell_and_stores_only_dims_and_values(db):
    report = cta_query(db, "admin", TURNOVER, into="turnover_cta", rules=TURNOVER_RULES)
    frame, method, by, record = stored(db, "turnover_cta")
    assert set(frame.columns) == {"nace", "region", "value"}  # no flags, levels or originals
    assert frame["value"].notna().all() and (frame["value"] != 0).all()
    assert_additive(frame, ["nace", "region"], tol=1e-3)
    cells = expected(db, ["nace", "region"], "turnover", TURNOVER_RULES, "enterprises")
    assert_protected(published(frame, cells, ["nace", "region"]), cells)
    assert report.sensitive == int(cells["sensitive"].sum())
    assert (method, by) == ("cta", "admin") and record["status"] == report.status == "optimal"
    assert QUALITY_KEYS <= set(record["quality"]) and record["quality"]["max_abs_change"] > 0


def test_cta_levels_are_secretly_enlarged_and_the_same_for_the_same_job(db):
    cta_query(db, "admin", OLD_INCOME, into="a", rules=[FrequencyRule(10)])
    first = stored(db, "a")[0]
    cta_query(db, "admin", OLD_INCOME, into="a", rules=[FrequencyRule(10)], replace=True)
    frame = stored(db, "a")[0]
    pd.testing.assert_frame_equal(first, frame)  # same job, same secret factors
    cells = expected(db, ["region", "education"], "income", [FrequencyRule(10)],
                     "persons WHERE age >= 85")  # fmt: skip
    values = published(frame, cells, ["region", "education"])
    s = cells["sensitive"].to_numpy()
    a = cells["value"].to_numpy()
    # not exactly original ± 30 %: the published value must not give the original away
    assert not np.any(np.isclose(values[s], 1.3 * a[s]) | np.isclose(values[s], 0.7 * a[s]))


def test_round_job_stores_multiples_of_the_base_additively(db):
    report = round_query(db, "admin", OLD, into="old_r5", base=5)
    frame, method, _, record = stored(db, "old_r5")
    assert set(frame.columns) == {"region", "education", "value"}
    assert frame["value"].dtype == np.int64  # BIGINT, as a count (was DOUBLE: 3525.0)
    assert np.all(frame["value"] % 5 == 0) and (frame["value"] != 0).all()
    assert_additive(frame, ["region", "education"], tol=0)
    truth = raw(db, "SELECT region, education, count(*) AS n FROM persons WHERE age >= 85 "
                    "GROUP BY region, education")  # fmt: skip
    truth["rounded"] = published(frame, truth.astype({"region": str}), ["region", "education"])
    assert np.all(np.abs(truth["rounded"] - truth["n"]) < 5)  # zero-restricted: adjacent multiples
    assert report.status in ("optimal", "feasible") and method == "round"
    assert record["details"]["base"] == 5 and record["quality"]["max_additivity_error"] == 0


def margins_file(tmp_path, db, scale=1.02, aggregate="count(*)"):
    """Region totals of ``aggregate`` scaled by ``scale`` and education totals scaled to the
    same grand total."""
    regions = raw(db, f"SELECT region, 'Total' AS education, {aggregate} AS value FROM persons "
                      "WHERE age >= 85 GROUP BY region")  # fmt: skip
    regions["value"] = regions["value"] * scale
    levels = raw(db, f"SELECT 'Total' AS region, education, {aggregate} AS value FROM persons "
                     "WHERE age >= 85 GROUP BY education")  # fmt: skip
    levels["value"] = levels["value"] * regions["value"].sum() / levels["value"].sum()
    path = tmp_path / "margins.csv"
    pd.concat([regions, levels]).to_csv(path, index=False)
    return path


def test_ipf_job_meets_the_given_margins_and_protects_sensitive_cells(db, tmp_path):
    path = margins_file(tmp_path, db, aggregate="sum(income)")
    rules = [FrequencyRule(10)]
    report = ipf_query(db, "admin", OLD_INCOME, into="old_ipf", margins=path, rules=rules)
    frame, method, _, record = stored(db, "old_ipf")
    assert_additive(frame, ["region", "education"])
    given = pd.read_csv(path)
    got = published(frame, given.astype(str).assign(value=given["value"]), ["region", "education"])
    assert np.allclose(got, given["value"], rtol=1e-7)
    cells = expected(db, ["region", "education"], "income", rules,
                     "persons WHERE age >= 85")  # fmt: skip
    inner = ((cells["region"] != "Total") & (cells["education"] != "Total")).to_numpy()
    cells = cells[inner]
    assert_protected(published(frame, cells, ["region", "education"]), cells)
    assert method == "ipf" and report.status == "converged" and report.sensitive > 0
    assert record["details"]["margins_given"] == len(given)


def test_ipf_job_refuses_incomplete_margins_and_writes_nothing(db, tmp_path):
    path = margins_file(tmp_path, db)
    lines = path.read_text().splitlines()
    path.write_text("\n".join(lines[:-1]) + "\n")  # one education total missing
    with pytest.raises(TabularError, match="give every cell of a margin"):
        ipf_query(db, "admin", OLD, into="old_ipf", margins=path)
    con = open_database(db)
    try:
        tables = con.sql("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'protected'")
        assert tables.fetchall() == []
        assert con.sql("SELECT count(*) FROM sqlsdc.outputs").fetchall() == [(0,)]
    finally:
        con.close()


@pytest.mark.parametrize(
    "run",
    [
        lambda db, user: round_query(db, user, OLD, into="x", base=5),
        lambda db, user: cta_query(db, user, OLD, into="x"),
        lambda db, user: ipf_query(db, user, OLD, into="x", margins=pd.DataFrame()),
    ],
    ids=["round", "cta", "ipf"],
)
def test_adjustment_jobs_are_for_admins(db, run):
    with pytest.raises(AccessDenied, match="not an admin"):
        run(db, "analyst")


def test_cta_intervals_are_refused_for_counts(db):
    with pytest.raises(TabularError, match="fewer units than the minimum frequency"):
        cta_query(db, "admin", OLD, into="x", intervals=True)


def test_cli_cta_with_intervals_in_a_subprocess(db):
    command = ["protect", str(db), "--method", "cta", "--intervals", "--sql", TURNOVER,
               "--into", "turnover_cta", "--rule", "nk:1,60", "--rule", "freq:3"]  # fmt: skip
    result = cli_fork.run([*command, "--format", "json"], timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["method"] == "cta" and report["name"] == "protected.turnover_cta"
    assert QUALITY_KEYS <= set(report["quality"]) and "[5/5] storing" in result.stderr
    frame, _, _, record = stored(db, "turnover_cta")
    assert record["quality"]["hd"] == pytest.approx(report["quality"]["hd"])
    cells = expected(db, ["nace", "region"], "turnover", TURNOVER_RULES, "enterprises")
    flagged = frame.set_index(["nace", "region"])["lower_bound"].notna()
    truth = cells.set_index(["nace", "region"])
    assert flagged.sum() == truth["sensitive"].loc[flagged.index].sum() > 0
    both = frame[flagged.to_numpy()].merge(
        truth.reset_index(), on=["nace", "region"], suffixes=("", "_raw")
    )
    assert (both["lower_bound"] <= both["value_raw"]).all()  # intervals hold the original ...
    assert (both["value_raw"] <= both["upper_bound"]).all()
    assert (both["lower_bound"] <= both["value"]).all()  # ... and the published value
    assert (both["value"] <= both["upper_bound"]).all()
    assert (both["upper_bound"] - both["lower_bound"] >= both["upl"] + both["lpl"] - 1e-6).all()
    wrong = cli_fork.run(["protect", db, "--method", "round", "--sql", OLD, "--into", "r"])
    assert wrong.returncode == 2 and "needs --base" in wrong.stderr


def test_cta_job_on_the_demo_turnover_table_keeps_the_table_near_the_original(db):
    """Issue 18: with the default rules, the LP's costs 1/|a| (1e-11..1e-7) were below HiGHS's
    dual tolerance; it moved most cells to 0 (total 161e9 -> 107e9) and said "optimal"."""
    report = cta_query(db, "admin", TURNOVER, into="turnover_cta")
    frame, _, _, record = stored(db, "turnover_cta")
    rules = [DominanceRule(n=1, k=85), FrequencyRule(3)]  # near the defaults; levels differ
    cells = expected(db, ["nace", "region"], "turnover", rules, "enterprises")
    values = published(frame, cells, ["nace", "region"])
    original = cells["value"].to_numpy(np.float64)
    assert np.count_nonzero(values == 0) == np.count_nonzero(original == 0)
    # the free-direction MILP (same job, same secret levels) is at least as good as the LP
    milp = cta_query(db, "admin", TURNOVER, into="turnover_cta", method="milp", replace=True)
    assert milp.details["objective"] <= report.details["objective"] * (1 + 1e-6)
    assert report.details["objective"] < report.sensitive
    assert_additive(frame, ["nace", "region"], tol=1e-3)
    assert record["status"] == report.status == "optimal"
    check = record["details"]["verification"]
    assert check["passed"] and check["protection"] == 0 and check["bounds"] == 0
    # the reported cost is the cost of the stored table, Σ |change| / |original|
    moved = np.abs(values - original) / np.where(original != 0, np.abs(original), 1.0)
    assert record["details"]["objective"] == pytest.approx(moved.sum(), rel=1e-6)


@pytest.mark.parametrize("method", ["milp"])
def test_cta_job_other_methods_pass_verification(db, method):
    report = cta_query(db, "admin", TURNOVER, into="t", method=method, rules=TURNOVER_RULES)
    assert report.status == "optimal" and report.details["verification"]["passed"]
    frame = stored(db, "t")[0]
    cells = expected(db, ["nace", "region"], "turnover", TURNOVER_RULES, "enterprises")
    assert_protected(published(frame, cells, ["nace", "region"]), cells)


def test_a_job_whose_result_fails_verification_stores_nothing(db, monkeypatch):
    """A broken solution (one sensitive cell left at its original value, margins not updated)
    is refused with VerificationError, nothing is stored, and the audit names the failure."""
    cta_module = importlib.import_module("sqlsdc.tabular.cta")
    real = cta_module.cta

    def broken(*args, **kwargs):
        out = real(*args, **kwargs)
        i = np.flatnonzero(out["sensitive"].to_numpy() & (out["change"].to_numpy() != 0))[0]
        out.loc[i, "adjusted"] = out.loc[i, "value"]
        return out

    monkeypatch.setattr(cta_module, "cta", broken)
    with pytest.raises(VerificationError, match="fails verification and is not stored") as e:
        # the policy's rules: with nk(1,60) some secret protection levels have no feasible
        # table (the job then refuses truthfully, which is not what this test is about)
        cta_query(db, "admin", TURNOVER, into="broken")
    assert e.value.status == "verification_failed"
    assert any(p.startswith("protection: 1 cell(s)") for p in e.value.problems)
    con = open_database(db)
    try:
        tables = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = 'broken'")
        assert tables.fetchall() == [(0,)]
        outputs = con.execute(
            "SELECT count(*) FROM sqlsdc.outputs WHERE name = 'protected.broken'"
        ).fetchall()
        ((decision, reason),) = con.execute(
            "SELECT decision, reason FROM sqlsdc.audit ORDER BY query_id DESC LIMIT 1"
        ).fetchall()
    finally:
        con.close()
    assert outputs == [(0,)] and decision == "failed"
    assert reason.startswith("verification_failed: ")


def test_round_job_reports_its_verification(db):
    report = round_query(db, "admin", OLD, into="old_r5", base=5)
    check = report.details["verification"]
    assert check["passed"] and check["multiples"] == 0 and check["max_distance"] < 5


def test_ipf_job_reports_its_verification(db, tmp_path):
    # a count table is raked when its rules flag no cell (sensitive counts are refused)
    report = ipf_query(db, "admin", OLD, into="old_ipf", margins=margins_file(tmp_path, db),
                       rules=[])  # fmt: skip
    check = report.details["verification"]
    assert report.details["converged"] and check["passed"]
    assert check["max_margin_error"] <= 2e-9 * 10_000


# Same rows as OLD, written otherwise: one set of cells.
OLD_AGAIN = (
    "SELECT region, education, COUNT(*) FROM persons WHERE NOT age < 85 GROUP BY region, education"
)


def _outputs(db) -> list[tuple]:
    return raw(db, "SELECT name, method FROM sqlsdc.outputs ORDER BY name").values.tolist()


def _last_audit(db) -> tuple:
    return tuple(raw(db, "SELECT decision, reason FROM sqlsdc.audit ORDER BY query_id DESC "
                         "LIMIT 1").iloc[0])  # fmt: skip


def test_two_roundings_of_the_same_cells_are_refused(db):
    """Bases 3 and 5 of one count leave only the values both allow (a 7 published as 6 and 5:
    5 <= x < 8 and 2.5 <= x < 7.5 give x in {5, 6, 7}; with more bases, one value)."""
    round_query(db, "admin", OLD, into="old_r3", base=3)
    with pytest.raises(TabularError, match=r"protected.old_r3 already releases these cells.*round"):
        round_query(db, "admin", OLD_AGAIN, into="old_r5", base=5)
    assert _outputs(db) == [["protected.old_r3", "round"]]
    decision, reason = _last_audit(db)
    assert decision == "refused" and "already releases these cells" in reason
    round_query(db, "admin", OLD, into="old_r3", base=3, replace=True)  # its own replacement
    # another population is other cells
    round_query(db, "admin", OLD.replace("85", "90"), into="older_r5", base=5)
    assert [name for name, _ in _outputs(db)] == ["protected.old_r3", "protected.older_r5"]


def test_a_suppression_and_an_adjustment_of_the_same_cells_are_refused(db, tmp_path):
    """A cell the suppression job hides would have a rounded or raked value next to it, and
    the suppression job's exact values would tell how far each adjusted cell moved."""
    from sqlsdc.jobs.protect import protect_query

    protect_query(db, "admin", OLD, into="old_suppressed")
    with pytest.raises(TabularError, match="protected by method suppress; this job .method round"):
        round_query(db, "admin", OLD_AGAIN, into="old_r5", base=5)
    with pytest.raises(TabularError, match="protected by method suppress; this job .method ipf"):
        ipf_query(db, "admin", OLD, into="old_ipf", margins=margins_file(tmp_path, db), rules=[])
    # replacing the output itself by another method is refused too: its cells are released
    with pytest.raises(TabularError, match="protected by method suppress; this job .method round"):
        round_query(db, "admin", OLD, into="old_suppressed", base=5, replace=True)
    assert _outputs(db) == [["protected.old_suppressed", "suppress"]]
    # and the other way round
    round_query(db, "admin", OLD_INCOME.replace("SUM(income)", "COUNT(*)").replace("85", "80"),
                into="r5", base=5)  # fmt: skip
    with pytest.raises(TabularError, match="protected by method round; this job .method suppress"):
        protect_query(db, "admin", OLD.replace("85", "80"), into="s")


def test_cta_and_ipf_jobs_of_a_sum_count_the_non_zero_contributors(tmp_path):
    """The frequency rule of a CTA or IPF job of a sum counts the units whose total in the cell
    is not 0, as suppression jobs and the query path do (s40k): a cell of 2 turnovers and 8
    zeros and one of 4 turnovers and 2 NULLs are sensitive under ``freq:5``; counted with their
    zeros and NULLs (10 and 6 units) they were not, and CTA found nothing to protect. IPF reads
    the same rules (``jobs.adjust``)."""
    cells = [("C", "N", [500.0, 700.0] + [0.0] * 8), ("C", "S", [300.0, 400.0, 500.0, 600.0,
             None, None]), ("G", "N", [float(v) for v in range(100, 140)]),
             ("G", "S", [float(v) for v in range(200, 240)])]  # fmt: skip
    db = firms_db(tmp_path, cells)
    sql = "SELECT nace, region, SUM(turnover) FROM firms GROUP BY nace, region"
    report = cta_query(db, "chief", sql, into="zeros_cta", rules=[FrequencyRule(5)])
    assert report.sensitive == 2


def test_a_rounding_of_whole_turnovers_is_audited_as_a_reader_reads_it(tmp_path):
    """Two firms of 578 make a sensitive cell of 1,156 (frequency rule: levels 30 %, 346.8);
    rounded down to 1,002 with base 501, ``R + base`` lies 347 above it, and the per-cell check
    stored the table (before s42). Every turnover is a whole number, so a reader knows the cell
    is at most 1,002 + 500: 346 above, short of its level. The attacker's audit (windows of the
    published multiples, additivity, whole numbers, no negative sums) refuses it and names the
    cell; twice the base stores, with the audit's figures in the report."""
    cells = [("C", "N", [578.0, 578.0]), ("C", "S", [float(v) for v in range(300, 340)]),
             ("G", "N", [float(v) for v in range(100, 140)]),
             ("G", "S", [float(v) for v in range(200, 240)])]  # fmt: skip
    db = firms_db(tmp_path, cells)
    sql = "SELECT nace, region, SUM(turnover) FROM firms GROUP BY nace, region"
    with pytest.raises(TabularError, match=r"published 1 cell\(s\) of this sum that the rules "
                       r"flag closer .* e\.g\. \{'nace': 'C', 'region': 'N'\}; round to a "
                       "larger base"):  # fmt: skip
        round_query(db, "chief", sql, into="whole", base=501)
    report = round_query(db, "chief", sql, into="whole", base=1002)
    assert report.details["audit"]["cells"] == 1

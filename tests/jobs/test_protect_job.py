"""Suppression jobs on a real demo database: `protect_query` and `sqlsdc protect` (subprocess).

Expected primary cells are computed from the raw rows with plain SQL; the stored table is then
attacked with the audit LP built from the stored (published) cells only.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import cli_fork
import numpy as np
import pytest
from firms_db import firms_db

from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import AccessDenied, SqlSyntaxError, TabularError
from sqlsdc.jobs.protect import protect_query
from sqlsdc.tabular.model import Table
from sqlsdc.tabular.rules import DominanceRule, FrequencyRule, PPercentRule, parse_rule

TURNOVER = "SELECT nace, region, SUM(turnover) FROM enterprises GROUP BY nace, region"
PERSONS_GEO = (
    "SELECT region, municipality, education, COUNT(*) FROM persons "
    "WHERE age >= 80 GROUP BY region, municipality, education"
)


@pytest.fixture()
def db(pristine_demo_db, tmp_path):
    path = tmp_path / "demo.duckdb"
    shutil.copy(pristine_demo_db, path)
    return path


def stored(db, name):
    con = open_database(db)
    try:
        frame = con.sql(f"SELECT * FROM protected.{name}").df()
        outputs = con.sql("SELECT name, method, created_by FROM sqlsdc.outputs").fetchall()
    finally:
        con.close()
    return frame, outputs


def test_magnitude_job_suppresses_dominated_cells_and_passes_the_audit(db):
    report = protect_query(
        db, "admin", TURNOVER, into="turnover", rules=[DominanceRule(n=1, k=60), FrequencyRule(3)]
    )
    frame, outputs = stored(db, "turnover")
    con = open_database(db)
    raw = con.sql(
        "SELECT nace, region, count(*) AS n, sum(turnover) AS t, max(turnover) AS x1 "
        "FROM enterprises GROUP BY nace, region"
    ).df()
    con.close()
    unsafe = raw[(raw.x1 > 0.6 * raw.t) | (raw.n < 3)]
    cells = frame.set_index(["nace", "region"])
    for row in unsafe.itertuples():
        cell = cells.loc[(row.nace, row.region)]
        assert cell.status == "primary" and np.isnan(cell.value), row
    assert report.primary == (frame.status == "primary").sum() >= len(unsafe) > 0
    assert report.secondary == (frame.status == "secondary").sum() > 0
    assert frame.loc[frame.status != "published", "value"].isna().all()
    assert frame.loc[frame.status == "published", "value"].notna().all()
    assert report.audit_passed and "nk(1,60)" in report.rules_fired
    assert set(report.rules_fired) <= {"nk(1,60)", FrequencyRule(3).name}
    assert ("protected.turnover", "suppress", "admin") in outputs
    assert not {"upl", "lpl", "top1"} & set(frame.columns)  # levels would reveal contributions
    hidden = frame[frame.status != "published"]
    assert (hidden.lower_bound < hidden.upper_bound).all()
    shown = frame[frame.status == "published"]
    assert shown[["lower_bound", "upper_bound"]].isna().all(axis=None)
    truth = raw.set_index(["nace", "region"])
    for row in hidden.itertuples():  # the stored interval holds the true value
        if (row.nace, row.region) in truth.index:
            assert row.lower_bound - 1e-6 <= truth.loc[(row.nace, row.region), "t"]
            assert truth.loc[(row.nace, row.region), "t"] <= row.upper_bound + 1e-6


def test_no_suppressed_cell_can_be_recomputed_from_the_stored_table(db):
    from sqlsdc.tabular.attacker import audit_intervals

    protect_query(db, "admin", PERSONS_GEO, into="old_people", rules=[FrequencyRule(5)])
    frame, _ = stored(db, "old_people")
    con = open_database(db)
    truth = con.sql(
        "SELECT region, municipality, education, count(*) AS n FROM persons WHERE age >= 80 "
        "GROUP BY region, municipality, education"
    ).df()
    con.close()
    assert {"geography", "education", "status"} <= set(frame.columns)
    inner = truth.assign(geography=truth.municipality, value=truth.n.astype(float))
    table = Table.from_cells(
        inner[["geography", "education", "value", "n"]].astype({"geography": str}),
        ["geography", "education"],
        hierarchies={"geography": _geography(truth)},
    )
    order = table.cells.set_index(["geography", "education"]).index
    status = frame.set_index(["geography", "education"]).loc[order, "status"].to_numpy()
    suppressed = status != "published"
    result = audit_intervals(
        table.A,
        table.values,
        suppressed,
        lower=np.zeros(len(order)),
        upper=np.full(len(order), np.inf),
        integer=True,
    )
    primary = status == "primary"
    assert primary.any()
    assert np.all(result.hi[primary] > result.lo[primary])  # no unsafe cell is pinned down
    assert np.all((result.lo <= table.values + 1e-9) & (table.values <= result.hi + 1e-9))


def _geography(truth):
    from sqlsdc.tabular.model import Hierarchy

    return Hierarchy.from_levels(truth.astype({"region": str, "municipality": str}),
                                 ["region", "municipality"])  # fmt: skip


def test_hierarchies_of_the_policy_give_subtotals(db):
    protect_query(db, "admin", PERSONS_GEO, into="old_people", rules=[FrequencyRule(3)])
    frame, _ = stored(db, "old_people")
    codes = set(frame.geography)
    assert "Total" in codes and any(c.startswith("R") and len(c) == 3 for c in codes)
    assert len(codes) > 20  # municipalities and regions in one hierarchical dimension


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT region, SUM(income) FROM persons p JOIN households h ON "
         "p.household_id = h.household_id GROUP BY region", "one aggregation of one table"),
        ("SELECT region, AVG(income) FROM persons GROUP BY region", "SUM\\(measure\\) or COUNT"),
        ("SELECT person_id, COUNT(*) FROM persons GROUP BY person_id", "dimension columns"),
        ("SELECT region, SUM(age) FROM persons GROUP BY region",
         "age is a dimension column of persons: SUM a measure of persons \\(income\\)"),
        ("SELECT name, COUNT(*) FROM regions GROUP BY name", "not a confidential table"),
        ("SELECT region, COUNT(*), SUM(income) FROM persons GROUP BY region", "exactly one"),
    ],
)  # fmt: skip
def test_jobs_refuse_what_they_cannot_protect(db, sql, message):
    with pytest.raises(TabularError, match=message):
        protect_query(db, "admin", sql, into="x")


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT nac, COUNT(*) FROM enterprises GROUP BY nac",
         "enterprises has no column nac \\(did you mean nace\\?\\): a protection job groups by "
         "dimension columns of enterprises \\(nace, region, size_class\\)"),
        ("SELECT nace, enterprise_id, COUNT(*) FROM enterprises GROUP BY nace, enterprise_id",
         "enterprise_id is an identifier column of enterprises: "),
        ("SELECT employees, COUNT(*) FROM enterprises GROUP BY employees",
         "employees is a measure column of enterprises: "),
        ("SELECT UPPER(nace), COUNT(*) FROM enterprises GROUP BY UPPER(nace)",
         "UPPER\\(nace\\) is an expression, not a column: "),
        ("SELECT COUNT(*) FROM enterprises", "the SQL has no GROUP BY: "),
        ("SELECT nace, SUM(turnovr) FROM enterprises GROUP BY nace",
         "enterprises has no column turnovr \\(did you mean turnover\\?\\): SUM a measure of "
         "enterprises \\(employees, turnover\\)"),
    ],
)  # fmt: skip
def test_a_refused_job_sql_names_the_column_at_fault_and_the_allowed_ones(sql, message):
    """A misspelt or wrong column in a job's SQL is named, with the table's dimensions (or
    measures) to choose from: every such SQL got "group by dimension columns of T only" or
    "turnovr is not a measure of T" (new user s47f)."""
    from sqlsdc.jobs.tabulation import parse_job
    from sqlsdc.policy import load_policy

    policy = load_policy(Path(__file__).parents[2] / "schemas" / "examples" / "demo.yaml")
    with pytest.raises(TabularError, match=message):
        parse_job(sql, policy)


def test_a_job_sql_that_does_not_parse_is_a_syntax_error(db):
    """As a query's (the CLI's exit code 6): it was a TabularError, exit 1."""
    with pytest.raises(SqlSyntaxError, match="the job's SQL does not parse"):
        protect_query(db, "admin", "SELECT region, COUNT(* FROM persons", into="x")


def test_jobs_are_for_admins_and_do_not_overwrite(db):
    with pytest.raises(AccessDenied, match="not an admin"):
        protect_query(db, "analyst", TURNOVER, into="t")
    rules = [DominanceRule(n=1, k=60), FrequencyRule(3)]
    protect_query(db, "admin", TURNOVER, into="t", rules=rules)
    with pytest.raises(TabularError, match="pass --replace"):
        protect_query(db, "admin", TURNOVER, into="t", rules=rules)
    protect_query(db, "admin", TURNOVER, into="t", rules=rules, replace=True)
    with pytest.raises(TabularError, match="plain name"):
        protect_query(db, "admin", TURNOVER, into="t; DROP TABLE persons", replace=True)


def test_an_output_name_in_another_case_is_the_same_table(db):
    """DuckDB's names are case-insensitive: --into T when protected.t existed replaced its data
    without --replace, and left sqlsdc.outputs naming both."""
    rules = [DominanceRule(n=1, k=60), FrequencyRule(3)]
    protect_query(db, "admin", TURNOVER, into="t", rules=rules)
    before, _ = stored(db, "t")
    for replace in (False, True):
        with pytest.raises(TabularError, match="protected.t exists; names are case-insensitive"):
            protect_query(db, "admin", PERSONS_GEO, into="T", rules=rules, replace=replace)
    after, outputs = stored(db, "t")
    assert after.equals(before) and [o[0] for o in outputs] == ["protected.t"]


def test_rule_syntax():
    assert parse_rule("freq:3") == FrequencyRule(min_freq=3)
    assert parse_rule("nk:2,85") == DominanceRule(n=2, k=85.0)
    assert parse_rule("p:15") == PPercentRule(p=15.0)
    with pytest.raises(TabularError, match="unknown rule"):
        parse_rule("dominance:1")
    with pytest.raises(TabularError, match=r"needs 1 number\(s\) \(p\)"):
        parse_rule("p:1,2")
    with pytest.raises(TabularError, match="must be numbers"):
        parse_rule("nk:a,b")


def test_cli_protect_in_a_subprocess(db):
    command = ["protect", str(db), "--sql", TURNOVER, "--into", "turnover"]
    command += ["--rule", "nk:1,60", "--rule", "freq:3"]
    result = cli_fork.run([*command, "--format", "json"], timeout=300)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert (
        report["audit_passed"] and report["primary"] > 0 and report["name"] == "protected.turnover"
    )
    denied = cli_fork.run([*command, "--user", "analyst"])
    assert denied.returncode == 5 and "not an admin" in denied.stderr
    again = cli_fork.run(command, timeout=300)
    assert again.returncode == 1 and "--replace" in again.stderr and "Traceback" not in again.stderr


def test_counts_of_a_stored_table_are_integers(db):
    """A suppression job's unit counts are BIGINT, NULL where suppressed, and so is a frequency
    table's value (they were DOUBLE: 829.0 enterprises, new user s38); a sum stays DOUBLE."""
    for sql, into in ((TURNOVER, "turnover"), (PERSONS_GEO, "old")):
        done = cli_fork.run(["protect", str(db), "--sql", sql, "--into", into], timeout=300)
        assert done.returncode == 0, done.stderr
    con = open_database(db)
    try:
        types = dict(
            con.execute(
                "SELECT table_name || '.' || column_name, data_type FROM "
                "information_schema.columns WHERE table_schema = 'protected' "
                "AND column_name IN ('n', 'value')"
            ).fetchall()
        )
        nulls = con.execute(
            "SELECT count(*) FILTER (WHERE n IS NULL), count(*) FILTER "
            "(WHERE status <> 'published') FROM protected.old"
        ).fetchone()
    finally:
        con.close()  # fmt: skip
    assert types == {"turnover.n": "BIGINT", "turnover.value": "DOUBLE", "old.n": "BIGINT",
                     "old.value": "BIGINT"}  # fmt: skip
    assert nulls[0] == nulls[1] > 0


def test_a_job_on_columns_named_in_capitals(tmp_path):
    """A table made from a CSV with headers NACE and Region: `sqlsdc protect` (a real process)
    was an internal error, KeyError 'nace', exit 70 (DuckDB names a result column as the
    table spells it, the job looked it up in lower case); new user s38."""
    import duckdb
    import yaml

    import sqlsdc

    db = tmp_path / "caps.duckdb"
    with duckdb.connect(db) as raw:
        raw.execute("CREATE TABLE Firms AS SELECT 'F' || range AS FirmID, ['C', 'G'][range % 2 "
                    "+ 1] AS NACE, ['N', 'S'][range // 2 % 2 + 1] AS Region, range::DOUBLE AS "
                    "Turnover FROM range(300)")  # fmt: skip
    dim = {"role": "dimension"}
    policy = {"tables": {"Firms": {"privacy_unit": "FirmID", "columns": {
        "FirmID": {"role": "identifier"}, "NACE": dim, "Region": dim,
        "Turnover": {"role": "measure", "bounds": [0, 1000]}}}},
        "users": {"chief": {"role": "admin"}}}  # fmt: skip
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(policy))
    sqlsdc.init(db, tmp_path / "p.yaml", applied_by="chief")
    # the rounded counts leave out one firm of each cell: a suppression job of a sum publishes
    # its cells' counts, which another method may not release again (red team s42c)
    for method, sql in (("suppress", "SUM(Turnover)"), ("round", "COUNT(*)")):
        base = ["--base", "5"] if method == "round" else []
        where = " WHERE Turnover >= 4" if method == "round" else ""
        done = cli_fork.run(["protect", str(db), "--as", "chief", "--method", method, *base,
                             "--into", method, "--sql", f"SELECT NACE, Region, {sql} FROM "
                             f"Firms{where} GROUP BY NACE, Region"], timeout=300)  # fmt: skip
        assert done.returncode == 0, done.stderr
    frame, _outputs = stored(db, "suppress")
    assert list(frame.columns[:2]) == ["nace", "region"] and len(frame) == 9


def test_the_package_audit_stays_the_function():
    import sqlsdc.tabular
    import sqlsdc.tabular.attacker  # noqa: F401  (a submodule import rebinds its package name)

    assert callable(sqlsdc.tabular.audit) and sqlsdc.tabular.audit.__module__.endswith(".api")


def test_an_interrupt_after_the_job_is_stored_is_no_bug(db, monkeypatch):
    """A Ctrl-C or SIGTERM that lands once the job is stored (accepted, with its ledger rows)
    wrote a second, "failed" audit entry with the same query id: the duplicate key reached the
    user as "internal error ... a bug in sqlsdc". The accepted entry and the output stand."""
    from sqlsdc.jobs.job import Job

    stored_job = Job.store

    def store_then_interrupted(self, *args, **kwargs):
        stored_job(self, *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(Job, "store", store_then_interrupted)
    with pytest.raises(KeyboardInterrupt):
        protect_query(db, "admin", PERSONS_GEO, into="old_people", rules=[FrequencyRule(3)])
    con = open_database(db)
    try:
        decisions = con.sql("SELECT decision FROM sqlsdc.audit").fetchall()
    finally:
        con.close()
    assert decisions == [("accepted",)]
    assert len(stored(db, "old_people")[0]) > 0


@pytest.mark.parametrize("limit", [float("nan"), float("inf"), 0, -1, "60"])
def test_a_time_limit_that_is_no_positive_number_is_refused_before_the_job(jobs_demo_db, limit):
    """The CLI refuses these already; through the API NaN and infinity reached the solvers as
    a raw ValueError or OverflowError."""
    from sqlsdc.jobs.adjust import cta_query, round_query

    sql = "SELECT region, sex, COUNT(*) FROM persons WHERE age >= 90 GROUP BY region, sex"
    for job in (
        lambda: protect_query(jobs_demo_db, "admin", sql, into="t", time_limit=limit),
        lambda: round_query(jobs_demo_db, "admin", sql, into="t", base=3, time_limit=limit),
        lambda: cta_query(jobs_demo_db, "admin", sql, into="t", time_limit=limit),
    ):
        with pytest.raises(TabularError, match="time_limit must be a positive number"):
            job()


@pytest.mark.parametrize("into", ["persons", "Persons", "__x"])
def test_an_output_named_like_a_policy_table_or_reserved_is_refused(jobs_demo_db, into):
    """``protect --into persons`` put a table ``persons`` beside the confidential one in the
    release database."""
    from sqlsdc.errors import MicrodataError
    from sqlsdc.jobs.anonymize import anonymize

    sql = "SELECT region, sex, COUNT(*) FROM persons WHERE age >= 90 GROUP BY region, sex"
    with pytest.raises(TabularError, match="table of the policy|reserved"):
        protect_query(jobs_demo_db, "admin", sql, into=into)
    with pytest.raises(MicrodataError, match="table of the policy|reserved|plain name"):
        anonymize(jobs_demo_db, user="admin", into=into, source="persons",
                  steps=["topcode:income:upper=200000"])  # fmt: skip


def test_a_sum_job_counts_the_non_zero_contributors_and_publishes_every_unit(tmp_path):
    """The frequency rule of a sum job counts the units whose total in the cell is not 0 (a
    cell of zeros only: its units with a value), as the query path does; the published ``n``
    stays every unit of the cell (red team s40b: cells of 3-4 incomes with zeros and NULLs
    passed ``freq:5``)."""
    # (C, N): 2 turnovers and 8 zeros; (C, S): 4 and 2 NULLs; (G, N): 3 zeros only;
    # (G, S): 40 turnovers of 1-40
    cells = [("C", "N", [5.0, 7.0] + [0.0] * 8), ("C", "S", [3.0, 4.0, 5.0, 6.0, None, None]),
             ("G", "N", [0.0] * 3), ("G", "S", [float(v) for v in range(1, 41)])]  # fmt: skip
    db = firms_db(tmp_path, cells)
    protect_query(db, "chief", "SELECT nace, region, SUM(turnover) FROM firms GROUP BY nace, "
                  "region", into="zeros", rules=[FrequencyRule(5)])  # fmt: skip
    frame, _outputs = stored(db, "zeros")
    status = {(r.nace, r.region): (r.status, r.rule) for r in frame.itertuples()}
    for cell in (("C", "N"), ("C", "S"), ("G", "N")):
        assert status[cell] == ("primary", FrequencyRule(5).name), cell
    units = {
        ("C", "N"): 10,
        ("C", "S"): 6,
        ("G", "N"): 3,
        ("G", "S"): 40,
        ("C", "Total"): 16,
        ("G", "Total"): 43,
        ("Total", "N"): 13,
        ("Total", "S"): 46,
        ("Total", "Total"): 59,
    }
    shown = frame[frame.status == "published"]
    assert len(shown) >= 3  # every unit, zeros and NULLs included
    assert {(r.nace, r.region): r.n for r in shown.itertuples()} == {
        (r.nace, r.region): units[r.nace, r.region] for r in shown.itertuples()
    }


def test_a_job_stopped_in_its_checks_is_audited_as_failed(db, monkeypatch):
    """Ctrl-C while a job's checks read the data (the first seconds of a job on a large
    table, before "[1/3] computing the cells") left no audit entry at all, though the README
    says a job stopped so is audited ``failed`` (new user s46i: 2 of 2 protect jobs on 100,000
    persons stopped at 2 s and 6 s). KeyboardInterrupt stands for the signal, raised where the
    checks run."""
    import sqlsdc.jobs.job as job_module

    def stopped(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(job_module, "refuse_job", stopped)
    with pytest.raises(KeyboardInterrupt):
        protect_query(db, "admin", TURNOVER, into="stopped")
    con = open_database(db)
    try:
        entries = con.execute(
            "SELECT decision, reason FROM sqlsdc.audit WHERE sql_text = ?", [TURNOVER]
        ).fetchall()
        stored_names = con.execute("SELECT name FROM sqlsdc.outputs").fetchall()
    finally:
        con.close()
    assert entries == [("failed", "interrupted (Ctrl-C)")]  # main: []
    assert stored_names == []


def test_a_job_says_it_is_checking_before_its_checks_read_the_data(db, monkeypatch):
    """The checks against earlier releases read the data before "[1/3] computing the cells":
    on the default demo's million persons a suppression job said nothing for 90 s (new user
    s47f). Their step is announced before they run, and the CLI counts every step."""
    from sqlsdc.cli.protect import STEPS

    import sqlsdc.jobs.job as job_module

    said: list[str] = []
    checks = job_module.refuse_job
    seen_at_checks: list[list[str]] = []

    def watched(*args, **kwargs):
        seen_at_checks.append(list(said))
        return checks(*args, **kwargs)

    monkeypatch.setattr(job_module, "refuse_job", watched)
    protect_query(db, "admin", TURNOVER, into="t", progress=said.append)
    assert seen_at_checks == [["checking it against the earlier releases"]]
    assert said[1:] == ["computing the cells in SQL", "primary and secondary suppression, audit",
                        "storing protected.t"]  # fmt: skip
    assert len(said) == STEPS["suppress"]

"""Red team s37c: back-end jobs, the release database and the live server.

Each test is an attack that worked before its fix (the commit that adds the test fixes it).
"""

from __future__ import annotations

import shutil
import threading
from fractions import Fraction

import cli_fork
import numpy as np
import pandas as pd
import pytest

from sqlsdc.catalog.budget import BudgetKey
from sqlsdc.catalog.budget_admin import set_limit
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.adjust import cta_query, ipf_query, round_query
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.mechanisms.accountant import BudgetLimit
from sqlsdc.synth import synthesize
from sqlsdc.tabular.rules import FrequencyRule

OLD = "persons WHERE age >= 85"


def _true_margins(db, where: str) -> pd.DataFrame:
    """The exact margins of the income table by region x education: what the README tells an
    admin to write when no census is at hand."""
    con = open_database(db)
    try:
        return con.sql(
            "SELECT COALESCE(region, 'Total') AS region, COALESCE(CAST(education AS VARCHAR), "
            f"'Total') AS education, SUM(income) AS value FROM persons WHERE {where} "
            "GROUP BY CUBE (region, education) HAVING region IS NULL OR education IS NULL"
        ).df()
    finally:
        con.close()


def _lonely(db) -> tuple[str, float]:
    """A municipality with one person aged 85 or over, and that person's income."""
    con = open_database(db)
    try:
        return con.sql(
            "SELECT municipality, any_value(income) FROM persons WHERE age >= 85 "
            "GROUP BY municipality HAVING count(*) = 1 ORDER BY municipality LIMIT 1"
        ).fetchall()[0]
    finally:
        con.close()


IPF_SQL = (
    "SELECT region, education, SUM(income) FROM persons WHERE age >= 85 GROUP BY region, education"
)


def _minus(municipality: str) -> str:
    return (
        "SELECT sex, SUM(income) FROM persons WHERE age >= 85 AND municipality <> "
        f"'{municipality}' GROUP BY sex"
    )


def test_ipf_margins_and_a_suppression_job_of_one_person_fewer(jobs_demo_db):
    """An IPF job publishes its given margins as they are (exact, when the admin wrote them
    from the data as the README shows); a suppression job over the same population less one
    person published its total exactly too, and the two totals differed by that person's
    income: the differencing check ignored IPF outputs. Now the second job is refused."""
    municipality, _income = _lonely(jobs_demo_db)
    ipf_query(jobs_demo_db, "admin", IPF_SQL, into="inc_ipf",
              margins=_true_margins(jobs_demo_db, "age >= 85"))  # fmt: skip
    with pytest.raises(TabularError, match="differ by only 1 unit"):
        protect_query(jobs_demo_db, "admin", _minus(municipality), into="inc_minus")


def _inc_minus(db) -> None:
    """The suppression job of everyone aged 85+ less the lonely person, stored."""
    municipality, _income = _lonely(db)
    protect_query(db, "admin", _minus(municipality), into="inc_minus")


def test_suppression_job_then_ipf_of_one_person_more(jobs_state, tmp_path):
    """The same attack in the other order: the IPF job is checked against the suppression
    output already stored."""
    jobs_demo_db = jobs_state(_inc_minus, tmp_path)
    with pytest.raises(TabularError, match="differ by only 1 unit"):
        ipf_query(jobs_demo_db, "admin", IPF_SQL, into="inc_ipf",
                  margins=_true_margins(jobs_demo_db, "age >= 85"))  # fmt: skip


# ------------------------------------------------------------- fault injection: a full disk

GEO = (
    "SELECT region, municipality, education, COUNT(*) FROM persons WHERE age >= 85 "
    "GROUP BY region, municipality, education"
)


def _limited(kilobytes: int) -> dict:
    """Limits of a child process that may write files of at most ``kilobytes`` (a full disk for
    every file that would grow beyond: the write fails with EFBIG, Python ignores SIGXFSZ)."""
    return {"RLIMIT_FSIZE": (kilobytes * 1024, kilobytes * 1024)}


def test_a_job_whose_commit_finds_the_disk_full_says_so_and_audits_why(jobs_demo_db):
    """The job's COMMIT failed (the write-ahead log could not grow); DuckDB ends such a
    transaction itself, so the job's ROLLBACK raised "no transaction is active", which hid the
    disk-full error: the command ended as "internal error ... a bug in sqlsdc" (exit 70) and
    the audit entry gave the rollback as the reason. Now: exit 9 (engine or file-system
    failure), the reason is the write that failed, and nothing is stored."""
    done = cli_fork.run(
        ["protect", jobs_demo_db, "--as", "admin", "--into", "old_people", "--rule", "freq:5",
         "--sql", GEO],
        limits=_limited(100), timeout=300,
    )  # fmt: skip
    assert done.returncode == 9, done.stderr
    assert "internal error" not in done.stderr and "rollback" not in done.stderr.lower()
    con = open_database(jobs_demo_db)
    try:
        (decision, reason), *_ = con.sql(
            "SELECT decision, reason FROM sqlsdc.audit ORDER BY query_id DESC"
        ).fetchall()
        stored = con.sql("SELECT count(*) FROM sqlsdc.outputs").fetchall()[0][0]
        ledger = con.sql("SELECT count(*) FROM sqlsdc.ledger").fetchall()[0][0]
    finally:
        con.close()
    assert decision == "failed" and "rollback" not in reason.lower(), reason
    assert stored == 0 and ledger == 0


def test_a_release_written_to_a_full_disk_fails_as_the_file_system_not_as_a_bug(jobs_demo_db):
    """The release file could not be written (its checkpoint found no room): the command
    said "internal error ... a bug in sqlsdc" (exit 70). Now exit 9; the publication is
    audited ``failed`` with the write that failed, and no file or half-written file is left."""
    out = jobs_demo_db.with_name("release.duckdb")
    done = cli_fork.run(
        ["publish", jobs_demo_db, out, "--as", "admin", "--for", "analyst", "--query",
         "by_region=SELECT region, sex, COUNT(*) AS n FROM persons GROUP BY ALL"],
        limits=_limited(200), timeout=300,
    )  # fmt: skip
    assert done.returncode == 9, done.stderr
    assert "internal error" not in done.stderr
    con = open_database(jobs_demo_db)
    try:
        ((decision, reason),) = con.sql(
            "SELECT decision, reason FROM sqlsdc.audit WHERE sql_text LIKE '{\"publish\"%'"
        ).fetchall()
    finally:
        con.close()
    assert decision == "failed" and "write" in reason.lower(), reason
    assert not [p for p in out.parent.iterdir() if p.name.startswith(out.name)]


# ------------------------------------------------------ two jobs at once in one process

AGED = "SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 GROUP BY region, education"


def test_two_jobs_of_the_same_cells_in_two_threads_are_not_both_stored(jobs_demo_db):
    """A job checks the stored outputs when it starts and stores its own seconds later. Two
    jobs of one process (threads of an admin's notebook or service) ran their checks before
    either had stored: a suppression and a rounding of the same cells were both stored, and
    ``sqlsdc publish`` would have released the rounded values of the hidden cells. (Processes
    take turns on the file's lock; threads of one process share it.) Now jobs on one database
    take turns in a process too, and the second is refused."""
    protect_query(jobs_demo_db, "admin", "SELECT sex, COUNT(*) FROM persons WHERE age >= 90 "
                  "GROUP BY sex", into="other", rules=[FrequencyRule(1)])  # fmt: skip
    outcomes: dict[str, object] = {}

    def run(name, job):
        try:
            outcomes[name] = job()
        except TabularError as refusal:
            outcomes[name] = refusal

    threads = [
        threading.Thread(target=run, args=("suppress", lambda: protect_query(
            jobs_demo_db, "admin", AGED, into="aged_sup", rules=[FrequencyRule(5)]))),
        threading.Thread(target=run, args=("round", lambda: round_query(
            jobs_demo_db, "admin", AGED, into="aged_r5", base=5))),
    ]  # fmt: skip
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    refused = [o for o in outcomes.values() if isinstance(o, TabularError)]
    assert len(refused) == 1 and "already releases these cells" in str(refused[0])
    con = open_database(jobs_demo_db)
    try:
        names = {n for (n,) in con.sql("SELECT name FROM sqlsdc.outputs").fetchall()}
    finally:
        con.close()
    assert len(names & {"protected.aged_sup", "protected.aged_r5"}) == 1


# ------------------------------------------- DP syntheses of one seed at two privacy levels


def test_two_dp_syntheses_of_one_seed_at_two_epsilons_draw_independent_noise(jobs_demo_db):
    """The noise of a DP synthesis was keyed by the secret, the seed, the data and the cell,
    not by the scale: two jobs with the same seed (the default, 0) at ε = 1/12 and 5/12 read
    the same random bits. The discrete Laplace sampler turns them into X and X // 5 (its
    scales 12 and 12/5 share the numerator), so two outputs of ``dp-catall`` on one cell (the
    women, ``--levels sex=F``: the number of records is the noisy count) gave the count
    (exactly, or as one of two values), for ε = 1/2 charged in all, with seeds 0, 1 and 2
    alike. Now the scale is part of the key and the two noises are independent: the attack no
    longer gives the count."""
    con = open_database(jobs_demo_db)
    try:
        limit = BudgetLimit(epsilon=Fraction(5))
        set_limit(con, admin="admin", key=BudgetKey("*", "persons"), limit=limit, reason="s37c")
        ((women,),) = con.sql("SELECT count(*) FROM persons WHERE sex = 'F'").fetchall()
    finally:
        con.close()
    recovered = 0
    for seed in (0, 1, 2):
        found = {}
        for epsilon in ("1/12", "5/12"):
            report = synthesize(jobs_demo_db, user="admin", source="persons",
                                into=f"women_{seed}_{epsilon.replace('/', '_')}",
                                method="dp-catall", epsilon=epsilon, columns=["sex"],
                                levels={"sex": ["F"]}, seed=seed)  # fmt: skip
            found[epsilon] = report.records
        pinned = _pinned(found["1/12"], found["5/12"])
        recovered += women in pinned and len(pinned) <= 2
    assert recovered < 3  # independent noise: by chance at most now and then, never three times


def _pinned(first: int, second: int) -> set[int]:
    """The counts c for which some X >= 0 and one sign give ``first`` = c ± X and ``second`` =
    c ± X // 5: what the two outputs leave open when both noises come from the same bits."""
    return {first - sign * x for x in range(0, 2000) for sign in (1, -1)
            if first - sign * x + sign * (x // 5) == second}  # fmt: skip


# ---------------------------------------------------------------- hostile job parameters


@pytest.mark.parametrize("seconds", [1e300, 1e13, float("inf"), float("nan"), 0, -1])
def test_a_time_limit_beyond_a_day_is_refused_before_the_job_runs(jobs_demo_db, seconds):
    """``--time-limit 1e300`` reached GLOP, whose limit is int64 milliseconds: the job ended as
    "internal error ... OverflowError" (exit 70). Now it is refused as a bad value."""
    with pytest.raises(TabularError, match="time_limit must be a positive number"):
        protect_query(jobs_demo_db, "admin", IPF_SQL, into="slow", time_limit=seconds)


# ------------------------------------- stored outputs on hostile data: checked, or refused

HOSTILE = {
    "negative": "UPDATE persons SET income = -income WHERE age >= 85 AND sex = 'F'",
    "zeros": "UPDATE persons SET income = 0 WHERE age >= 85 AND region IN ('R01', 'R02')",
    "huge": "UPDATE persons SET income = 1e15 WHERE person_id IN (SELECT min(person_id) "
    "FROM persons WHERE age >= 85 GROUP BY region)",
    "singleton": "DELETE FROM persons WHERE age >= 85 AND person_id <> (SELECT min(person_id) "
    "FROM persons WHERE age >= 85)",
}


def _additive(frame: pd.DataFrame, dims: list[str]) -> float:
    """The largest additivity error of a stored region x education table (cells left out
    are 0), relative to the largest value: every total is the sum of its inner cells."""
    cells = frame.set_index(dims)["value"].astype(float)
    worst = 0.0
    for d in dims:
        other = [o for o in dims if o != d][0]
        for code in frame[other].unique():
            inner = [k for k in cells.index if k[dims.index(other)] == code
                     and k[dims.index(d)] != "Total"]  # fmt: skip
            total = tuple("Total" if x == d else code for x in dims)
            worst = max(worst, abs(cells.get(total, 0.0) - sum(cells[k] for k in inner)))
    return worst / max(1.0, float(cells.abs().max()))


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_jobs_on_hostile_values_store_only_what_passes_their_own_checks(jobs_demo_db, case):
    """Issue 18 (must-have 2) on hostile data: negative values, zeros, one huge contribution
    per region, a population of one person. Each job either refuses or stores a table that
    holds its own constraints when read back from the database alone: finite values, and
    additive (rounding, CTA, IPF), multiples of the base (rounding), the given margins
    (IPF), and for suppression published cells equal to the data with every hidden cell
    inside its stored interval."""
    con = open_database(jobs_demo_db)
    try:
        con.execute(HOSTILE[case])
        truth = con.sql(
            "SELECT COALESCE(region, 'Total') AS region, COALESCE(CAST(education AS VARCHAR), "
            "'Total') AS education, SUM(income) AS t, COUNT(*) AS n FROM persons "
            "WHERE age >= 85 GROUP BY CUBE (region, education)"
        ).df().set_index(["region", "education"])  # fmt: skip
    finally:
        con.close()
    margins = _true_margins(jobs_demo_db, "age >= 85")
    counts = IPF_SQL.replace("SUM(income)", "COUNT(*)")
    jobs = {  # one database per method: they would refuse each other's cells
        "round": lambda db: round_query(db, "admin", counts, into="out", base=5),
        "cta": lambda db: cta_query(db, "admin", IPF_SQL, into="out", rules=[FrequencyRule(30)]),
        "ipf": lambda db: ipf_query(
            db, "admin", IPF_SQL, into="out", margins=margins, rules=[FrequencyRule(3)]
        ),
        "suppress": lambda db: protect_query(
            db, "admin", IPF_SQL, into="out", rules=[FrequencyRule(3)]
        ),
    }
    stored = 0
    for method, run in jobs.items():
        db = jobs_demo_db.with_name(f"{method}.duckdb")
        shutil.copy(jobs_demo_db, db)
        try:
            run(db)
        except TabularError:
            continue
        stored += 1
        con = open_database(db)
        try:
            frame = con.sql("SELECT * FROM protected.out").df()
        finally:
            con.close()
        dims = ["region", "education"]
        values = frame["value"].to_numpy(float)
        assert np.isfinite(values[~np.isnan(values)]).all(), method
        if method == "suppress":
            shown = frame[frame.status == "published"].set_index(dims)
            assert np.allclose(shown["value"], truth.loc[shown.index, "t"], rtol=1e-9)
            hidden = frame[frame.status != "published"].set_index(dims)
            t = truth.reindex(hidden.index)["t"].fillna(0.0)
            slack = 1e-6 * np.maximum(1.0, t.abs())
            assert ((hidden.lower_bound - slack <= t) & (t <= hidden.upper_bound + slack)).all()
            continue
        assert _additive(frame, dims) <= 1e-9, method
        if method == "round":
            assert np.allclose(values % 5, 0), values
        if method == "ipf":
            given = margins.set_index(dims)["value"]
            got = frame.set_index(dims)["value"].reindex(given.index).fillna(0.0)
            assert np.allclose(got, given, rtol=1e-6, atol=1e-6)
    assert stored >= 1  # not everything refused: the checks ran on something


# ------------------------------------------------- an anonymised file next to a job


def test_an_anonymised_file_and_a_suppression_job_of_one_person_fewer(jobs_demo_db):
    """An anonymised file of everyone aged 85 or over (income only top-coded, far above any
    income: unchanged) and a suppression job of their incomes by sex, less the one person of
    a municipality: the file's total less the job's is that person's income, which names
    their record in the file (and so their education) and ties it to a municipality the
    file does not show. The differencing check read tabular outputs only; now it compares
    anonymised files of the job's table too."""
    municipality, _income = _lonely(jobs_demo_db)
    anonymize(jobs_demo_db, user="admin", into="aged_file", steps=["topcode:income:upper=1e9"],
              sql="SELECT region, sex, education, income FROM persons WHERE age >= 85")  # fmt: skip
    with pytest.raises(TabularError, match="differ by only 1 unit"):
        protect_query(jobs_demo_db, "admin", _minus(municipality), into="inc_minus")


def test_a_suppression_job_then_an_anonymised_file_of_one_person_more(jobs_state, tmp_path):
    """The other order of the attack above: the suppression job first, then the file. The
    anonymisation job was not checked against the exact tables stored before it; now the file
    is checked as the exact tables of its unperturbed columns."""
    jobs_demo_db = jobs_state(_inc_minus, tmp_path)
    with pytest.raises(MicrodataError, match="differ by only 1 unit"):
        anonymize(
            jobs_demo_db,
            user="admin",
            into="aged_file",
            steps=["topcode:income:upper=1e9"],
            sql="SELECT region, sex, education, income FROM persons WHERE age >= 85",
        )


# ------------------------------- the README's seniors file next to the README's old_people

SENIORS = "SELECT * FROM persons WHERE region = 'R01' AND age >= 65"
OLD_PEOPLE = (
    "SELECT region, municipality, education, COUNT(*) FROM persons WHERE age >= 90 "
    "GROUP BY region, municipality, education"
)
SENIOR_STEPS = ("microaggregate:income:k=5", "pram:occupation:p=0.8")  # perturbed: not exact


def _seniors(db, breaks: str, *steps: str):
    """The README's file: R01 aged 65 or over, age banded at ``breaks``."""
    return anonymize(db, user="admin", into="seniors_r01", sql=SENIORS, seed=7,
                     steps=[f"recode:age:breaks={breaks}", *SENIOR_STEPS, *steps])  # fmt: skip


def _old_people(db):
    return protect_query(db, "admin", OLD_PEOPLE, into="old_people", rules=[FrequencyRule(5)])


def test_the_seniors_file_then_old_people(jobs_demo_db):
    """The README's file of R01 aged 65 or over, age banded 65/75/85 (its band counts are
    exact), then a suppression job of everyone aged 90 or over by municipality and education:
    a cell of the file's 85+ band less the job's cell is the number of 85-89-year-olds of that
    municipality and education (on the README's demo of a million, R01-M001 primary: 8), a
    cell of all its ages less the job's that of the 65-89-year-olds (here R01-M001 tertiary:
    2). The job is refused, naming the file."""
    _seniors(jobs_demo_db, "65/75/85")
    with pytest.raises(
        TabularError,
        match=r"protected\.seniors_r01 overlap and differ by only \d unit",
    ):  # the first cell found may be either side's (s38e: a cut of a cell the job splits)
        _old_people(jobs_demo_db)


def test_old_people_then_the_seniors_file(jobs_state, tmp_path):
    """The other order, the one the README ran: the anonymisation job was not checked against
    the exact tables stored before it; now it is, and refused naming the table."""
    jobs_demo_db = jobs_state(_old_people, tmp_path)
    with pytest.raises(
        MicrodataError,
        match=r"protected\.old_people and that of the file "
        r"protected\.seniors_r01 overlap and differ by only \d unit",
    ):
        _seniors(jobs_demo_db, "65/75/85")
    con = open_database(jobs_demo_db)
    try:
        ((stored,),) = con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = "
                                   "'seniors_r01'").fetchall()  # fmt: skip
        ((audited,),) = con.execute("SELECT decision FROM sqlsdc.audit ORDER BY query_id DESC "
                                    "LIMIT 1").fetchall()  # fmt: skip
    finally:
        con.close()
    assert (stored, audited) == (0, "refused")


@pytest.mark.parametrize("first", ["file", "table"])
def test_a_band_that_aligns_with_the_table_tells_nothing_new(jobs_state, tmp_path, first):
    """Age banded 65/75/85/90: the file's own cells tell of each record whether old_people
    counts it (aged 90 or over: the band >=90), so its records outside the job are counts of
    its own cells, and the job's cells are the file's >=90 band or hold units outside R01 by
    more than the minimum frequency. Both orders are allowed."""
    jobs = [_aligned_seniors, _old_people]
    if first == "table":
        jobs.reverse()
    jobs[1](jobs_state(jobs[0], tmp_path))


def _aligned_seniors(db) -> None:
    _seniors(db, "65/75/85/90")


def test_a_local_suppression_of_age_spoils_the_alignment(jobs_state, tmp_path):
    """The same aligned bands, but a local suppression that blanked some ages: those records'
    band is unknown, so the file no longer tells which of its records the job counts, and the
    job's cells less the file's coarser cells count a few of them: refused."""
    jobs_demo_db = jobs_state(_old_people, tmp_path)
    with pytest.raises(MicrodataError, match="differ by only"):
        _seniors(jobs_demo_db, "65/75/85/90", "suppress:municipality,sex,age:k=5,importance=1/2/3")


def _education_difference(db) -> tuple[str, str]:
    """A job population and a file population that differ on both sides in total (the file
    lacks ten or more people of other educations in R02, the job lacks one person aged 85 or
    over alone in their municipality) but on one side only, by that one person, within their
    education."""
    municipality, _income = _lonely(db)
    con = open_database(db)
    try:
        ((education, region),) = con.execute(
            "SELECT CAST(education AS VARCHAR), region FROM persons WHERE age >= 85 AND "
            "municipality = ?", [municipality]).fetchall()  # fmt: skip
        other = "R02" if region != "R02" else "R03"
        ((lacking,),) = con.execute(
            "SELECT count(*) FROM persons WHERE age >= 85 AND region = ? AND "
            "CAST(education AS VARCHAR) <> ?", [other, education]).fetchall()  # fmt: skip
    finally:
        con.close()
    assert lacking >= 10
    job = ("SELECT education, COUNT(*) FROM persons WHERE age >= 85 AND municipality <> "
           f"'{municipality}' GROUP BY education")  # fmt: skip
    file = ("SELECT education, sex FROM persons WHERE age >= 85 AND NOT (region = "
            f"'{other}' AND CAST(education AS VARCHAR) <> '{education}')")  # fmt: skip
    return job, file


def _by_education(db) -> None:
    """The job of everyone aged 85+ but the lonely person, by education, stored."""
    job, _file = _education_difference(db)
    protect_query(db, "admin", job, into="by_education")


@pytest.mark.parametrize("steps", [["suppress:sex,education:k=1"], ["pram:education:p=0.8"]],
                         ids=["exact", "pram"])  # fmt: skip
def test_a_perturbed_column_is_no_exact_cell(jobs_state, tmp_path, steps):
    """With education as it was, the file's cell of the lonely person's education holds the
    job's cell and that one person more: refused. PRAM'd, the file has no exact cell by
    education, and its totals differ from the job's on both sides: allowed."""
    jobs_demo_db = jobs_state(_by_education, tmp_path)
    _job, file = _education_difference(jobs_demo_db)
    if steps[0].startswith("pram"):
        anonymize(jobs_demo_db, user="admin", into="aged_file", sql=file, steps=steps)
        return
    with pytest.raises(MicrodataError, match=r"differ by only 1 unit.*education = "):
        anonymize(jobs_demo_db, user="admin", into="aged_file", sql=file, steps=steps)


def test_an_exact_table_places_a_locally_suppressed_value(jobs_demo_db):
    """A file of everyone aged 85 or over with municipality, sex and education made
    3-anonymous by suppressing municipalities, then a suppression job of the same people by
    municipality: a municipality's published count less the file's records showing it is the
    number of the file's blanked records that live there (R01-M001: 4, of 453 blanked). The
    file's blanked records are a cell of their own: refused, naming the file and the cell."""
    anonymize(jobs_demo_db, user="admin", into="aged_file", sql="SELECT municipality, sex, "
              "education FROM persons WHERE age >= 85",
              steps=["suppress:municipality,sex,education:k=3,importance=3/2/1"])  # fmt: skip
    with pytest.raises(TabularError, match=r"aged_file blanked values of municipality .*"
                       r"\(municipality = 'R01-M001'\) .* only 4 unit"):  # fmt: skip
        protect_query(jobs_demo_db, "admin", "SELECT municipality, COUNT(*) FROM persons WHERE "
                      "age >= 85 GROUP BY municipality", into="aged_by_municipality",
                      rules=[FrequencyRule(5)])  # fmt: skip

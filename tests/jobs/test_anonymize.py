"""The anonymisation job and its CLI on real demo databases (issue 20)."""

from __future__ import annotations

import json

import cli_fork
import duckdb
import pandas as pd
import pytest
from db_reads import protected_tables

from sqlsdc.errors import AccessDenied, MicrodataError, NotFoundError
from sqlsdc.jobs.anonymize import anonymize, stored_report
from sqlsdc.microdata.risk import frequencies

KEYS = ["municipality", "sex", "age", "education"]  # the finest geography the file shows
STEPS = [
    "recode:age:breaks=15/30/45/65",
    "suppress:municipality,sex,age,education:k=3",
    "microaggregate:income:k=5",
    "pram:occupation:p=0.8,invariant=1",
]


def _read(db, sql):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.sql(sql).df()
    finally:
        con.close()


def _last_audit(db):
    return _read(db, "SELECT decision, reason FROM sqlsdc.audit ORDER BY query_id DESC LIMIT 1")


def test_job_stores_a_k_anonymous_file_with_report_and_audit(fresh_demo_db):
    report = anonymize(fresh_demo_db, user="admin", source="persons", into="persons_sdc",
                       steps=STEPS, keys=KEYS, seed=4)  # fmt: skip
    stored = _read(fresh_demo_db, "SELECT * FROM protected.persons_sdc")
    assert len(stored) == report.records > 0
    assert not {"person_id", "household_id", "__rkey"} & set(stored.columns)
    assert set(report.dropped) == {"person_id", "household_id", "__rkey"}
    assert (frequencies(stored, KEYS)["fk"] >= 3).all()  # k-anonymous on the keys
    assert report.after["violations"]["3"] == 0 and report.before["violations"]["3"] > 0
    assert report.after["global_risk"] < report.before["global_risk"]
    assert report.weights == "weight"
    income = stored["income"].dropna()
    assert income.groupby(income).size().min() >= 5  # every income value shared by ≥ 5
    assert 0 < report.information_loss["income"]["il"] < 100
    assert report.linkage["columns"] == ["income"] and report.linkage["euclidean"] <= 0.25
    record = _read(fresh_demo_db, "SELECT method, report FROM sqlsdc.outputs")
    assert record["method"].tolist() == ["anonymize"]
    assert json.loads(record["report"][0])["seed"] == 4
    assert stored_report(fresh_demo_db, "persons_sdc", user="admin")["steps"][0]["step"] == STEPS[0]
    # names are case-insensitive, and a missing output is "not found" (exit 8) as in synth-report
    assert stored_report(fresh_demo_db, "Persons_SDC", user="admin")["seed"] == 4
    with pytest.raises(NotFoundError, match="protected.nosuch does not exist"):
        stored_report(fresh_demo_db, "nosuch", user="admin")
    assert _last_audit(fresh_demo_db)["decision"][0] == "accepted"
    ledger = _read(fresh_demo_db, "SELECT cell, column_name, mechanism, status FROM sqlsdc.ledger")
    assert sorted(ledger["column_name"]) == sorted(stored.columns)
    assert set(ledger["cell"]) == {"protected.persons_sdc <- persons"}
    assert set(ledger["mechanism"]) == {"anonymize"} and set(ledger["status"]) == {"published"}


def test_same_seed_same_output_other_seed_other_draws(fresh_demo_db):
    run = dict(user="admin", source="persons", steps=["pram:occupation:p=0.7"], keys=KEYS)
    anonymize(fresh_demo_db, into="a", seed=1, **run)
    anonymize(fresh_demo_db, into="b", seed=1, **run)
    anonymize(fresh_demo_db, into="c", seed=2, **run)
    a, b, c = (_read(fresh_demo_db, f"SELECT occupation FROM protected.{n}") for n in "abc")
    assert a.equals(b) and not a.equals(c)


def test_sql_source(fresh_demo_db):
    report = anonymize(fresh_demo_db, user="admin", into="adults",
                       sql="SELECT person_id, region, sex, income FROM persons WHERE age >= 18",
                       steps=["topcode:income:upper=100000"], keys=["region", "sex"])  # fmt: skip
    stored = _read(fresh_demo_db, "SELECT * FROM protected.adults")
    assert list(stored.columns) == ["region", "sex", "income"] and report.dropped == ["person_id"]
    assert stored["income"].max() <= 100000


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM read_csv('/etc/passwd')",
        "SELECT * FROM sqlsdc.secrets",
        "SELECT s.* FROM persons p, sqlsdc.secrets s",
        "SELECT * FROM persons WHERE age > (SELECT count(*) FROM sqlsdc.ledger)",
        "SELECT * FROM protected.earlier",
        "SELECT * FROM duckdb_settings()",
        "DROP TABLE persons",
        "SELECT 1; DROP TABLE persons",
    ],
)
def test_sql_reads_the_policy_tables_only(fresh_demo_db, sql):
    with pytest.raises(MicrodataError, match="policy's tables only|one SELECT"):
        anonymize(fresh_demo_db, user="admin", into="x", sql=sql, steps=["pram:sex:p=0.9"])
    assert _last_audit(fresh_demo_db)["decision"][0] == "refused"
    assert len(_read(fresh_demo_db, "SELECT * FROM persons")) > 0


def test_a_join_using_is_refused_with_the_way_round(fresh_demo_db):
    """DuckDB 2.0 cannot list the tables of JOIN ... USING; the error says to write ON."""
    using = "SELECT p.sex, h.tenure FROM persons p JOIN households h USING (household_id)"
    with pytest.raises(MicrodataError, match=r"JOIN \.\.\. ON a\.key = b\.key"):
        anonymize(fresh_demo_db, user="admin", into="x", sql=using, steps=["pram:sex:p=0.9"])
    on = using.replace("USING (household_id)", "ON p.household_id = h.household_id")
    report = anonymize(fresh_demo_db, user="admin", into="x", sql=on, steps=["pram:sex:p=0.9"])
    assert report.columns == ["sex", "tenure"]


def test_sql_with_a_cte(fresh_demo_db):
    sql = "WITH a AS (SELECT region, sex FROM persons) SELECT * FROM a"
    report = anonymize(fresh_demo_db, user="admin", into="x", sql=sql, steps=["pram:sex:p=0.9"])
    assert report.columns == ["region", "sex"]


def test_derived_identifiers_traced_with_one_qualification(fresh_demo_db, monkeypatch):
    """Every output column's lineage from one qualification of the query (session 44: one per
    column before, 11 for ``SELECT *`` of persons); identifiers under other names, in a CTE and
    in another case are still dropped, and the other columns kept."""
    from sqlglot.optimizer import qualify

    calls = []
    real = qualify.qualify
    monkeypatch.setattr(qualify, "qualify", lambda *a, **k: calls.append(1) or real(*a, **k))
    sql = ("WITH c AS (SELECT person_id + 0 AS pid, household_id AS \"HH\", region, sex, age "
           "FROM persons) SELECT pid, \"HH\", region, sex, age FROM c")  # fmt: skip
    report = anonymize(fresh_demo_db, user="admin", into="x", sql=sql, steps=["pram:sex:p=0.9"])
    assert report.columns == ["region", "sex", "age"]
    assert sorted(report.dropped) == ["HH", "pid"]
    assert len(calls) == 1  # was 5, one per column


@pytest.mark.parametrize(
    ("kwargs", "error", "match", "decision"),
    [
        ({"user": "analyst"}, AccessDenied, "not an admin", "refused"),
        ({"source": "regions"}, MicrodataError, "not a confidential table", "refused"),
        ({"into": "bad name"}, MicrodataError, "plain name", "refused"),
        ({"steps": ["pram:nope:p=0.5"]}, MicrodataError, "not in the data", "failed"),
    ],
)
def test_refused_and_failed_jobs_store_nothing(fresh_demo_db, kwargs, error, match, decision):
    run = {"user": "admin", "source": "persons", "into": "x", "steps": ["pram:sex:p=0.9"]}
    with pytest.raises(error, match=match):
        anonymize(fresh_demo_db, **{**run, **kwargs})
    assert _last_audit(fresh_demo_db)["decision"][0] == decision
    assert protected_tables(fresh_demo_db) == []


def test_cli_session_anonymize_report_publish(tmp_path, sqlsdc_in_process):
    """The README session in real processes (:mod:`cli_fork`): demo → anonymize → report →
    publish; then two usage errors, in process."""
    db, out = tmp_path / "micro-demo.duckdb", tmp_path / "release.duckdb"

    def sqlsdc(*args):
        return cli_fork.run(args, timeout=300)

    assert sqlsdc("demo", "--db", db, "--persons", 5000, "--seed", 3).returncode == 0
    run = sqlsdc("anonymize", db, "--from", "persons", "--into", "persons_sdc",
                 "--step", STEPS[0], "--step", STEPS[1], "--step", STEPS[2],
                 "--keys", ",".join(KEYS), "--seed", 7)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "stored protected.persons_sdc" in run.stdout and "records with fk < 3" in run.stdout
    report = sqlsdc("microdata-report", db, "persons_sdc", "--format", "json")
    assert report.returncode == 0, report.stderr
    assert json.loads(report.stdout)["after"]["violations"]["3"] == 0
    withheld = sqlsdc("publish", db, out)
    assert withheld.returncode == 0 and "withheld persons_sdc (anonymize)" in withheld.stdout
    published = sqlsdc("publish", db, out, "--include", "persons_sdc", "--force")
    assert published.returncode == 0 and "persons_sdc: 5000 rows" in published.stdout
    assert len(_read(out, "SELECT * FROM persons_sdc")) == 5000
    again = sqlsdc_in_process(
        "anonymize", db, "--from", "persons", "--into", "persons_sdc", "--step", "x"
    )
    assert again.returncode == 2 and "Traceback" not in again.stderr  # a usage error (s44g)
    assert "Invalid value for '--step' / '--steps': unknown step 'x'" in again.stderr
    neither = sqlsdc_in_process("anonymize", db, "--into", "y", "--step", STEPS[0])
    assert neither.returncode == 2 and "--from TABLE or --sql QUERY" in neither.stderr


SWAP_KEYS = ["municipality", "sex", "age"]


def test_household_swapping_and_household_risk(fresh_demo_db):
    """The household identifier is read for the swap and the household risk, and left out of
    the stored file like every direct identifier; SUDA and interval disclosure are reported."""
    report = anonymize(fresh_demo_db, user="admin", source="persons", into="swapped",
                       steps=["swap:region,municipality:household=household_id,risk=age/sex,"
                              "k=3,rate=0.05", "noise:income:c=0.2"],
                       keys=SWAP_KEYS, household="household_id", seed=2)  # fmt: skip
    stored = _read(fresh_demo_db, "SELECT * FROM protected.swapped")
    assert "household_id" not in stored.columns and "household_id" in report.dropped
    swap = report.steps[0]
    assert swap["swapped_households"] > 0 and swap["realised_rate"] >= 0.05
    original = _read(fresh_demo_db, "SELECT * FROM persons ORDER BY ALL")
    assert len(stored) == len(original)

    # the file is stored sorted by its values (no row order of the source): compare counts
    def counts(frame, columns):
        return frame.value_counts(columns).sort_index()

    moved = ["region", "municipality", "sex", "age"]
    assert not counts(stored, moved).equals(counts(original, moved))  # people moved ...
    pd.testing.assert_series_equal(
        counts(stored, ["sex", "age"]), counts(original, ["sex", "age"])
    )  # fmt: skip (... only)
    for side in (report.before, report.after):
        assert side["households"]["households"] > 0
        assert side["suda"]["keys"] == SWAP_KEYS
    assert 0 <= report.linkage["interval_disclosure"] <= 100
    with pytest.raises(MicrodataError, match="household column"):
        anonymize(fresh_demo_db, user="admin", source="persons", into="x", household="nope",
                  steps=["topcode:income:upper=1"])  # fmt: skip


@pytest.mark.slow  # three jobs, plots and processes of their own (~3-4 s of CPU)
def test_risk_utility_comparison_of_candidate_settings(fresh_demo_db, tmp_path,
                                                      sqlsdc_in_process):  # fmt: skip
    """Three settings of the same job side by side: stronger k, less risk, more loss; the
    comparison as JSON and as a plot (PNG and an HTML page with the table). The first plot and
    the refusals run in processes of their own (:mod:`cli_fork`), the other plots in this one
    (a process that draws imports matplotlib: 0.4 s of CPU each)."""
    pytest.importorskip("matplotlib")
    for k in (3, 5, 10):
        anonymize(fresh_demo_db, user="admin", source="persons", into=f"k{k}", keys=KEYS,
                  steps=[STEPS[0], f"suppress:municipality,sex,age,education:k={k}",
                         f"microaggregate:income:k={k}"])  # fmt: skip

    def report(*args):
        return cli_fork.run(["microdata-report", fresh_demo_db, "k3", "k5", "k10", *args],
                            timeout=120)  # fmt: skip

    run = report("--format", "json", "--plot", tmp_path / "tradeoff.html")
    assert run.returncode == 0, run.stderr
    rows = json.loads(run.stdout)
    assert [r["name"] for r in rows] == ["protected.k3", "protected.k5", "protected.k10"]
    risk = [r["expected_reidentifications"] for r in rows]
    loss = [r["information_loss"] for r in rows]
    assert risk == sorted(risk, reverse=True) and loss == sorted(loss)
    assert rows[2]["suppressed"] >= rows[0]["suppressed"] and rows[0]["below_3"] == 0
    page = (tmp_path / "tradeoff.html").read_text()
    assert "data:image/png;base64," in page and "protected.k10" in page
    png = sqlsdc_in_process("microdata-report", fresh_demo_db, "k3", "k5", "k10", "--plot",
                            tmp_path / "tradeoff.png")  # fmt: skip
    assert png.returncode == 0 and "protected.k5" in png.stdout
    assert (tmp_path / "tradeoff.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    bad = report("--plot", tmp_path / "tradeoff.pdf")
    assert bad.returncode != 0 and "Traceback" not in bad.stderr and ".png or .html" in bad.stderr
    # an existing plot is not overwritten without --force (it was, silently)
    kept = report("--plot", tmp_path / "tradeoff.png")
    assert kept.returncode == 1 and "tradeoff.png exists; pass --force" in kept.stderr
    forced = sqlsdc_in_process("microdata-report", fresh_demo_db, "k3", "k5", "k10", "--plot",
                               tmp_path / "tradeoff.png", "--force")  # fmt: skip
    assert forced.returncode == 0 and "wrote" in forced.stderr
    missing = report("--plot", tmp_path / "no" / "t.png")
    assert missing.returncode == 8 and "does not exist" in missing.stderr


@pytest.mark.parametrize("job", ["anonymize", "synthesize"])
def test_a_record_job_stopped_while_reading_is_audited_as_failed(job, fresh_demo_db, monkeypatch):
    """Ctrl-C while an anonymisation or synthesis read its records left no audit entry (the
    entry's id was taken, none written; new user s46i): KeyboardInterrupt stands for the
    signal, raised where the records are read."""
    import sqlsdc.jobs.anonymize as anonymize_module
    import sqlsdc.synth.job as synth_module

    def stopped(*_args, **_kwargs):
        raise KeyboardInterrupt

    module = anonymize_module if job == "anonymize" else synth_module
    monkeypatch.setattr(module, "read_records", stopped)
    with pytest.raises(KeyboardInterrupt):
        if job == "anonymize":
            anonymize(fresh_demo_db, user="admin", source="persons", into="stopped",
                      steps=["microaggregate:income:k=5"])  # fmt: skip
        else:
            synth_module.synthesize(fresh_demo_db, user="admin", source="persons",
                                    into="stopped", method="parametric")  # fmt: skip
    with duckdb.connect(str(fresh_demo_db), read_only=True) as con:
        entries = con.execute(
            "SELECT decision, reason FROM sqlsdc.audit WHERE sql_text LIKE '%stopped%'"
        ).fetchall()
        stored_names = con.execute("SELECT name FROM sqlsdc.outputs").fetchall()
    assert entries == [("failed", "interrupted (Ctrl-C)")]  # main: []
    assert stored_names == []

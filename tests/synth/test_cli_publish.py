"""``sqlsdc synthesize`` through a process of its own (:mod:`cli_fork`), and ``sqlsdc publish``
of a synthetic output."""

from __future__ import annotations

import json

import cli_fork
import duckdb
from sqlsdc.cli.errors import NOT_FOUND

from sqlsdc.release import Withheld, publish


def _sqlsdc(*args):
    return cli_fork.run(args, timeout=120)


def test_cli_synthesize_json_budget_and_exit_codes(fresh_demo_db, sqlsdc_in_process):
    """Both methods in real processes; the refusals, the grant and --help in this one."""
    done = _sqlsdc("synthesize", fresh_demo_db, "--from", "persons", "--into", "syn",
                   "--method", "parametric", "--columns", "sex,age,income", "--seed", "4",
                   "--format", "json")  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["method"] == "parametric" and report["records"] == 20_000
    assert report["columns"] == ["sex", "age", "income"] and report["seed"] == 4
    dp = ["synthesize", fresh_demo_db, "--from", "persons", "--into", "dp", "--method",
          "dp-ipf", "--epsilon", "1", "--columns", "sex,education,age",
          "--bins", "age=0,15,30,45,65,111", "--zero", "age=[0-15),education=tertiary"]  # fmt: skip
    refused = sqlsdc_in_process(*dp)
    assert refused.returncode == 7 and "no ε budget applies" in refused.stderr
    granted = sqlsdc_in_process("budget", fresh_demo_db, "set", "--for", "*", "--table", "persons",
                      "--epsilon", "2", "--reason", "synthetic persons")  # fmt: skip
    assert granted.returncode == 0, granted.stderr
    done = _sqlsdc(*dp)
    assert done.returncode == 0, done.stderr
    assert "ε = 1 charged; 3 margins" in done.stdout and "IPF converged" in done.stdout
    numeric = sqlsdc_in_process("synthesize", fresh_demo_db, "--from", "persons", "--into", "dp2",
                      "--method", "dp-ipf", "--epsilon", "1", "--columns", "sex,age")  # fmt: skip
    assert numeric.returncode == 1 and "--bins age=" in numeric.stderr
    assert "Traceback" not in numeric.stderr
    assert sqlsdc_in_process("synthesize", "--help").returncode == 0


def test_publish_releases_listed_or_included_synthetic_files_only(fresh_demo_db, tmp_path,
                                                                   sqlsdc_in_process):  # fmt: skip
    """A synthetic file the policy does not list under ``releases:`` is a candidate: withheld
    unless ``include`` names it; a name that is no stored file is refused before anything."""
    from sqlsdc.errors import NotFoundError
    from sqlsdc.synth import synthesize

    for into in ("persons_syn", "candidate_syn"):
        synthesize(fresh_demo_db, user="admin", source="persons", into=into,
                   method="parametric", columns=["region", "sex", "income"], copies=2,
                   rows=50)  # fmt: skip
    withheld = publish(fresh_demo_db, tmp_path / "withheld.duckdb", "admin")
    assert withheld.withheld == (Withheld("candidate_syn", "synthesize"),
                                 Withheld("persons_syn", "synthesize"))  # fmt: skip
    assert withheld.to_dict()["withheld"][0] == {"table": "candidate_syn", "method": "synthesize"}
    assert not {"persons_syn", "candidate_syn"} & {t.table for t in withheld.tables}
    con = duckdb.connect(str(tmp_path / "withheld.duckdb"), read_only=True)
    try:
        names = {r[0] for r in con.sql("SELECT table_name FROM duckdb_tables()").fetchall()}
    finally:
        con.close()
    assert not {"persons_syn", "candidate_syn"} & names
    cli = sqlsdc_in_process("publish", fresh_demo_db, tmp_path / "cli.duckdb")
    assert cli.returncode == 0, cli.stderr
    assert ("withheld persons_syn (synthesize): not listed under releases: (publish it with "
            "--include)") in cli.stdout  # fmt: skip
    unknown = sqlsdc_in_process(
        "publish",
        fresh_demo_db,
        tmp_path / "none.duckdb",
        "--include",
        "persons",
        "--query",
        "n=SELECT COUNT(*) FROM persons",
    )
    assert unknown.returncode == NOT_FOUND and "Traceback" not in unknown.stderr
    assert "--include persons: no synthetic or anonymised output of that name" in unknown.stderr
    assert not (tmp_path / "none.duckdb").exists()
    with duckdb.connect(str(fresh_demo_db), read_only=True) as source:
        last = source.execute("SELECT decision, sql_text FROM sqlsdc.audit ORDER BY query_id DESC")
        decision, request = last.fetchone()
        assert decision == "refused" and '"include": ["persons"]' in request
        ran = source.execute(
            "SELECT count(*) FROM sqlsdc.audit WHERE sql_text LIKE 'SELECT COUNT%'"
        )
        assert ran.fetchone()[0] == 0  # refused before the query ran (and was charged)
    try:
        publish(fresh_demo_db, tmp_path / "x.duckdb", "admin", include=["nope"])
    except NotFoundError:
        pass
    else:
        raise AssertionError("an unknown --include name was accepted")

    out = tmp_path / "release.duckdb"
    report = publish(fresh_demo_db, out, "admin", include=["Persons_Syn"])
    assert report.withheld == (Withheld("candidate_syn", "synthesize"),)
    entry = next(t for t in report.tables if t.table == "persons_syn")
    assert entry.source == "job" and entry.method == "synthesize" and entry.rows == 100
    con = duckdb.connect(str(out), read_only=True)
    try:
        rows = con.sql("SELECT * FROM persons_syn ORDER BY ALL").df()
        contents = con.sql("SELECT * FROM release_contents WHERE table_name = 'persons_syn'").df()
    finally:
        con.close()
    source = duckdb.connect(str(fresh_demo_db), read_only=True)
    try:
        stored = source.sql("SELECT * FROM protected.persons_syn ORDER BY ALL").df()
    finally:
        source.close()
    assert rows.equals(stored) and list(rows.columns)[0] == "synthetic_copy"
    assert len(contents) == 1

"""``sqlsdc synthesize`` through a process of its own (:mod:`cli_fork`), and ``sqlsdc publish``
of a synthetic output."""

from __future__ import annotations

import json

import cli_fork
import duckdb

from sqlsdc.release import publish


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


def test_publish_releases_the_synthetic_table(fresh_demo_db, tmp_path):
    from sqlsdc.synth import synthesize

    synthesize(fresh_demo_db, user="admin", source="persons", into="persons_syn",
               method="parametric", columns=["region", "sex", "income"], copies=2,
               rows=50)  # fmt: skip
    out = tmp_path / "release.duckdb"
    report = publish(fresh_demo_db, out, "admin")
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

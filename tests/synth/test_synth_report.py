"""``sqlsdc synth-report``: the report of a stored synthetic table, through the Python API and
a real process (:mod:`cli_fork`), on a real demo database. The synthetic table and its
``sqlsdc.outputs`` row are written here as the synthesis job stores them (CONTRACTS19)."""

from __future__ import annotations

import json
from datetime import datetime

import cli_fork
import duckdb
import numpy as np
import pytest

from sqlsdc.errors import AccessDenied, NotFoundError
from sqlsdc.synth.cart import SynthesisError, synthesize_cart
from sqlsdc.synth.report import synth_report

SOURCE = "SELECT region, sex, age, education, income FROM persons WHERE person_id <= 3000"


@pytest.fixture(scope="module")
def synth_db(pristine_demo_db, tmp_path_factory):
    path = tmp_path_factory.mktemp("synth") / "demo.duckdb"
    path.write_bytes(pristine_demo_db.read_bytes())
    con = duckdb.connect(str(path))
    original = con.sql(SOURCE).df()
    syn, details = synthesize_cart(original, rng=np.random.default_rng(0))
    con.execute("CREATE SCHEMA IF NOT EXISTS protected")
    con.register("syn", syn)
    con.execute("CREATE TABLE protected.persons_syn AS SELECT * FROM syn")
    report = {"synthetic": True, "method": "cart", "source": "persons", "source_sql": SOURCE,
              "columns": list(syn.columns), "seed": 0, "epsilon": None, "copies": 1,
              "parameters": details}  # fmt: skip
    con.execute(
        "INSERT INTO sqlsdc.outputs VALUES (?, 'synthesize', ?, ?, 'admin', 1, ?, NULL)",
        ["protected.persons_syn", SOURCE, datetime(2026, 1, 1), json.dumps(report)],
    )
    con.close()
    return path


def test_report_measures_and_files(synth_db, tmp_path):
    pytest.importorskip("matplotlib")
    r = synth_report(synth_db, "protected.persons_syn", user="admin", keys=["region", "sex",
                     "age"], target="education", out=tmp_path)  # fmt: skip
    assert r["records"]["original"] == r["records"]["synthetic"] > 0
    assert r["utility"]["quality"]["score"] > 0.9
    assert len(r["utility"]["two_way"]["tables"]) == 10
    assert 0 <= r["disclosure"]["identical_share"] <= 1
    assert r["disclosure"]["replicated_uniques"]["columns"] == ["region", "sex", "age"]
    assert 0 <= r["disclosure"]["tcap"]["tcap"] <= 1
    for kind in ("json", "html", "utility_pairs", "marginals"):
        assert (tmp_path / r["files"][kind].split("/")[-1]).stat().st_size > 0
    page = (tmp_path / "report.html").read_text()
    assert "SDMetrics quality score" in page and "data:image/png;base64," in page
    stored = json.loads((tmp_path / "report.json").read_text())
    assert stored["utility"]["quality"]["score"] == pytest.approx(r["utility"]["quality"]["score"])


@pytest.mark.slow  # measures against all the demo persons
def test_report_against_a_confidential_table(synth_db, tmp_path):
    r = synth_report(synth_db, "persons_syn", user="admin", against="persons", out=tmp_path)
    assert r["source"] == "persons" and r["records"]["original"] > r["records"]["synthetic"]
    with pytest.raises(SynthesisError, match="the source has no column"):
        synth_report(synth_db, "persons_syn", user="admin", against="households", out=tmp_path)


def test_report_refusals(synth_db, tmp_path):
    with pytest.raises(AccessDenied, match="not an admin"):
        synth_report(synth_db, "persons_syn", user="analyst", out=tmp_path)
    with pytest.raises(NotFoundError, match=r"does not exist \(stored: .*persons_syn"):
        synth_report(synth_db, "protected.nothing", user="admin", out=tmp_path)  # what is there
    with pytest.raises(NotFoundError, match="the policy declares no table 'sqlsdc.prf_secret'"):
        synth_report(synth_db, "persons_syn", user="admin", against="sqlsdc.prf_secret",
                     out=tmp_path)  # fmt: skip
    with pytest.raises(SynthesisError, match="'regions' is not a confidential table"):
        synth_report(synth_db, "persons_syn", user="admin", against="regions", out=tmp_path)
    with pytest.raises(SynthesisError, match="needs --keys"):
        synth_report(synth_db, "persons_syn", user="admin", target="sex", out=tmp_path)


@pytest.mark.slow  # three reports
def test_cli_subprocess_json_and_text(synth_db, tmp_path, sqlsdc_in_process):
    """JSON from a real process; the text report and the refusal in this one."""
    command = ["synth-report", str(synth_db), "--table", "protected.persons_syn",
               "--out", str(tmp_path)]  # fmt: skip
    done = cli_fork.run([*command, "--format", "json"])
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["table"] == "protected.persons_syn" and result["files"]["html"]
    kept = sqlsdc_in_process(*command)  # the report of the first run is not overwritten
    assert kept.returncode == 1 and "holds a report; pass --force" in kept.stderr
    text = sqlsdc_in_process(*command, "--force")
    assert text.returncode == 0 and "SDMetrics quality score" in text.stdout
    denied = sqlsdc_in_process(*command, "--force", "--as", "analyst")
    assert denied.returncode != 0 and "not an admin" in denied.stderr
    assert "Traceback" not in denied.stderr


def test_reports_are_audited_with_who_asked_and_refusals(synth_db, tmp_path):
    """The report reads confidential records: each request leaves an audit entry."""
    synth_report(synth_db, "persons_syn", user="admin", out=tmp_path)
    with pytest.raises(AccessDenied):
        synth_report(synth_db, "persons_syn", user="analyst", out=tmp_path)
    con = duckdb.connect(str(synth_db), read_only=True)
    entries = con.execute("SELECT user_name, decision, sql_text FROM sqlsdc.audit "
                          "ORDER BY query_id DESC LIMIT 2").fetchall()  # fmt: skip
    con.close()
    assert [(u, d) for u, d, _ in entries] == [("analyst", "refused"), ("admin", "accepted")]
    assert all("synth-report" in text for _u, _d, text in entries)

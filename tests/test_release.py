"""The release database (`sqlsdc publish`): protected outputs only, readable by other processes
with plain DuckDB and with SQLAlchemy's duckdb_engine (the driver BI tools use)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import cli_fork
import pytest

import sqlsdc
from sqlsdc import release_private
from sqlsdc.engines.duckdb import open_database
from sqlsdc.jobs.protect import protect_query
from sqlsdc.release import publish

CONFIDENTIAL = {"persons", "households", "enterprises"}

READER = r"""
import json, sys
import duckdb
import sqlalchemy

path = sys.argv[1]
con = duckdb.connect(path, read_only=True)
schemas = sorted({r[0] for r in con.sql(
    "SELECT schema_name FROM duckdb_tables() WHERE database_name = current_database()"
).fetchall()})
tables = {}
for (name,) in con.sql("SELECT table_name FROM duckdb_tables() ORDER BY 1").fetchall():
    relation = con.table(name)
    tables[name] = {"columns": relation.columns, "rows": len(relation.fetchall())}
macros = con.sql("SELECT count(*) FROM duckdb_functions() WHERE NOT internal").fetchall()[0][0]
views = con.sql("SELECT count(*) FROM duckdb_views() WHERE NOT internal").fetchall()[0][0]
con.close()
engine = sqlalchemy.create_engine(f"duckdb:///{path}", connect_args={"read_only": True})
with engine.connect() as connection:
    names = sqlalchemy.inspect(connection).get_table_names()
    via_sqlalchemy = {
        n: len(connection.execute(sqlalchemy.text(f'SELECT * FROM "{n}"')).fetchall())
        for n in names
    }
print(json.dumps({"schemas": schemas, "tables": tables, "macros": macros, "views": views,
                  "sqlalchemy": via_sqlalchemy}))
"""


def read_in_another_process(path) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", READER, str(path)], capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def test_release_lists_and_reads_in_another_process(released):
    db, out, report = released
    seen = read_in_another_process(out)
    expected = {"old_people", "suppressed_enterprises", "suppressed_persons", "persons_by_region",
                "release_contents"}  # fmt: skip
    assert set(seen["tables"]) == expected == set(seen["sqlalchemy"])
    assert seen["schemas"] == ["main"] and seen["macros"] == 0 and seen["views"] == 0
    for name, table in seen["tables"].items():
        assert table["rows"] == seen["sqlalchemy"][name] > 0
        assert not any(c.startswith("__") for c in table["columns"]), name
    assert {t.table: t.rows for t in report.tables} == {
        n: t["rows"] for n, t in seen["tables"].items() if n != "release_contents"
    }


def test_release_holds_nothing_confidential(released):
    db, out, _report = released
    source = open_database(db)
    try:
        secrets = [r[0] for r in source.sql("SELECT material FROM sqlsdc.secrets").fetchall()]
    finally:
        source.close()
    content = out.read_bytes()
    assert secrets and not any(bytes(s) in content for s in secrets)
    release = open_database(out, read_only=True)
    try:
        names = {r[0] for r in release.sql("SELECT table_name FROM duckdb_tables()").fetchall()}
        columns = {r[0] for r in release.sql(
            "SELECT column_name FROM duckdb_columns() WHERE NOT internal").fetchall()}  # fmt: skip
        contents = release.sql("SELECT table_name, source, method FROM release_contents").fetchall()
        pattern = release.sql(
            "SELECT nace, region, count, count_status, turnover_status FROM suppressed_enterprises"
        ).df()
    finally:
        release.close()
    assert not names & CONFIDENTIAL
    assert not {"__rkey", "__level", "income__n", "turnover__n", "upl", "lpl"} & columns
    assert ("persons_by_region", "query", "suppress") in contents
    assert ("suppressed_enterprises", "suppression", "suppress") in contents
    assert set(pattern["count_status"]) <= {"published", "suppressed"}
    assert pattern.loc[pattern["count_status"] == "suppressed", "count"].isna().all()


def test_released_cells_are_the_guarded_answers(released):
    db, out, _report = released
    with sqlsdc.connect(db, user="analyst") as con:
        answer = con.execute(
            "SELECT nace, region, COUNT(*) AS n FROM enterprises GROUP BY nace, region "
            "ORDER BY nace, region"
        ).fetchall()
    release = open_database(out, read_only=True)
    try:
        stored = release.sql(
            "SELECT nace, region, count FROM suppressed_enterprises "
            "WHERE nace IS NOT NULL AND region IS NOT NULL ORDER BY nace, region"
        ).fetchall()
        margins = release.sql(  # a margin's code is NULL, as ROLLUP writes it (README)
            "SELECT region, count FROM suppressed_enterprises WHERE nace IS NULL ORDER BY region"
        ).fetchall()
    finally:
        release.close()
    assert stored == answer
    with sqlsdc.connect(db, user="analyst") as con:
        rolled = con.execute("SELECT region, COUNT(*) FROM enterprises GROUP BY ROLLUP (region) "
                             "ORDER BY region").fetchall()  # fmt: skip
    assert margins == rolled and margins[-1][0] is None


def test_publish_refusals(suppress_template, tmp_path, sqlsdc_in_process):
    """The first refusal in a real process (:mod:`cli_fork`), the others in this one."""
    db = tmp_path / "demo.duckdb"
    shutil.copy(suppress_template, db)
    out = tmp_path / "release.duckdb"
    denied = cli_fork.run(["publish", db, out, "--as", "analyst"], timeout=300)
    assert denied.returncode == 5 and "not an admin" in denied.stderr and not out.exists()

    def cli(*args):
        return sqlsdc_in_process("publish", db, out, *args)

    for acting in ("--as", "--user"):  # --as names the acting administrator, as everywhere
        denied = cli(acting, "analyst")
        assert denied.returncode == 5 and "not an admin" in denied.stderr and not out.exists()
    refused = cli("--query", "rows=SELECT person_id, income FROM persons", "--for", "analyst")
    assert refused.returncode == 3 and not out.exists()
    assert not list(tmp_path.glob("*.partial"))
    malformed = cli("--query", "SELECT 1")
    assert malformed.returncode == 2 and "NAME=SQL" in malformed.stderr  # a usage error
    done = cli("--format", "json")
    assert done.returncode == 0, done.stderr
    assert {t["table"] for t in json.loads(done.stdout)["tables"]} == {
        "suppressed_enterprises", "suppressed_persons"
    }  # fmt: skip
    again = cli()
    assert again.returncode == 1 and "--replace" in again.stderr
    assert cli("--replace").returncode == 0
    with pytest.raises(sqlsdc.Error, match="another file"):
        publish(db, db, "admin")
    swapped = sqlsdc_in_process("publish", out, tmp_path / "again.duckdb")  # DB and OUT swapped
    assert swapped.returncode == 8 and "is a release database written by" in swapped.stderr
    with pytest.raises(sqlsdc.Error, match="name the confidential database"):
        sqlsdc.connect(out, user="analyst")  # it said to `sqlsdc init` the release


def test_released_job_output_does_not_tell_which_cells_are_sensitive(suppress_template, tmp_path):
    """The stored job output keeps primary/secondary and the rule for admins; the release shows
    published/suppressed only, as the released suppression patterns do."""
    db, out = tmp_path / "demo.duckdb", tmp_path / "release.duckdb"
    shutil.copy(suppress_template, db)
    protect_query(db, "admin", "SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 "
                  "GROUP BY region, education", into="old", time_limit=10)  # fmt: skip
    publish(db, out, "admin")
    source = open_database(db)
    try:
        stored = source.sql("SELECT status FROM protected.old").df()
    finally:
        source.close()
    release = open_database(out, read_only=True)
    try:
        shown = release.sql("SELECT * FROM old").df()
    finally:
        release.close()
    assert {"primary", "secondary"} <= set(stored["status"])
    assert "rule" not in shown.columns
    assert set(shown["status"]) == {"published", "suppressed"}
    assert (shown["status"] == "suppressed").sum() == stored["status"].isin(
        ["primary", "secondary"]
    ).sum()


def test_publish_refuses_names_that_differ_only_in_case_before_running_anything(
    suppress_template, tmp_path
):
    """DuckDB table names are case-insensitive: such a request is refused before any query runs
    (nothing audited as accepted, nothing charged) and leaves no partial file behind."""
    db, out = tmp_path / "demo.duckdb", tmp_path / "release.duckdb"
    shutil.copy(suppress_template, db)
    by_region = "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"
    requests = [
        {"ByRegion": by_region, "byregion": by_region},
        {"Suppressed_Persons": by_region},  # a released suppression pattern's name
        {"Release_Contents": by_region},
    ]
    for queries in requests:
        with pytest.raises(sqlsdc.Error, match="differ only in case|must be a plain name"):
            publish(db, out, "admin", queries=queries, analyst="analyst")
    entries = sqlsdc.admin.audit(db, "admin", limit=100)
    assert set(entries["user_name"]) == {"admin"}  # no guarded query ran as the analyst
    assert set(entries["decision"]) <= {"refused", "failed"} and len(entries) == len(requests)
    assert not out.exists() and {p.name for p in tmp_path.iterdir()} == {db.name, db.name + ".lock"}


def test_an_interrupt_after_the_release_is_recorded_is_no_bug(suppress_template, tmp_path,
                                                              monkeypatch):  # fmt: skip
    """A Ctrl-C or SIGTERM that lands once the release is recorded (while the catalog closes)
    wrote a second, "failed" entry with the same query id: the duplicate key ended as
    "internal error ... a bug in sqlsdc" (seen with `timeout -s TERM 3 sqlsdc publish`). The
    accepted entry stands (its cells are in the ledger), the file is not put in place, and the
    interrupt reaches the caller as the interrupt."""
    import sqlsdc.release as release

    db, out = tmp_path / "demo.duckdb", tmp_path / "release.duckdb"
    shutil.copy(suppress_template, db)
    recorded = release._record

    def record_then_interrupted(*args, **kwargs):
        recorded(*args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(release, "_record", record_then_interrupted)
    queries = {"by_region": "SELECT region, COUNT(*) AS n FROM persons GROUP BY region"}
    with pytest.raises(KeyboardInterrupt):
        publish(db, out, "admin", queries=queries, analyst="analyst")
    entries = sqlsdc.admin.audit(db, "admin", limit=100)
    published = entries[entries["sql_text"].str.startswith('{"publish"')]
    assert published["decision"].tolist() == ["accepted"]
    assert not out.exists() and {p.name for p in tmp_path.iterdir()} == {db.name, db.name + ".lock"}


def test_an_interrupt_in_the_checks_is_audited_as_failed(suppress_template, tmp_path,
                                                          monkeypatch):  # fmt: skip
    """A Ctrl-C while a publication's checks read the catalog (before "writing ...") left no
    audit entry at all (new user s46i: `sqlsdc publish` stopped at 2 s left none): it is
    ``failed``, "interrupted (Ctrl-C)", and nothing is written."""
    import sqlsdc.release as release

    db, out = tmp_path / "demo.duckdb", tmp_path / "release.duckdb"
    shutil.copy(suppress_template, db)

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(release, "_check_file_pairs", interrupted)
    with pytest.raises(KeyboardInterrupt):
        publish(db, out, "admin")
    entries = sqlsdc.admin.audit(db, "admin", limit=100)
    published = entries[entries["sql_text"].str.startswith('{"publish"')]
    assert published[["decision", "reason"]].values.tolist() == [
        ["failed", "interrupted (Ctrl-C)"]
    ]  # main: no entry
    assert not out.exists() and {p.name for p in tmp_path.iterdir()} == {db.name, db.name + ".lock"}


def test_a_policy_applied_while_a_publication_is_checked_stops_it(
    suppress_template, tmp_path, monkeypatch
):
    """``publish`` checks what it releases in one opening of the file and reads it in a second
    (red team s39b): a policy applied by another admin in between (here, in a real process,
    right before the second opening) was not checked. The publication now stops, writes
    nothing and is audited as failed; run again, it publishes under the new policy."""
    import sqlsdc.release as release

    db = tmp_path / "demo.duckdb"
    shutil.copy(suppress_template, db)
    out = tmp_path / "release.duckdb"
    policy = tmp_path / "policy.yaml"
    shown = cli_fork.run(["policy", "show", db], timeout=300, check=True)
    policy.write_text(shown.stdout)
    collect = release._collect

    def after_another_admin(*args, **kwargs):
        cli_fork.run(["policy", "apply", db, policy, "--as", "admin"], timeout=300, check=True)
        return collect(*args, **kwargs)

    monkeypatch.setattr(release, "_collect", after_another_admin)
    with pytest.raises(sqlsdc.OperationalError, match="changed while this publication"):
        publish(db, out, "admin")
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
    raw = open_database(db)
    try:
        last = raw.execute("SELECT decision FROM sqlsdc.audit ORDER BY logged_at DESC LIMIT 1")
        last = last.fetchone()
    finally:
        raw.close()
    assert last == ("failed",)
    monkeypatch.setattr(release, "_collect", collect)
    assert publish(db, out, "admin").policy_version == 2 and out.exists()


def test_only_the_partial_folders_no_process_holds_are_removed(tmp_path):
    """A running publication holds its private folder's lock (:func:`release_private.claim`):
    the removal of dead publications' folders leaves it, another user's link and names of
    other targets alone, and removes the folder no process holds."""
    out = tmp_path / "release.duckdb"
    running = release_private.claim([out], 7)
    (release_private.private_folder(out, 7) / "release.duckdb").write_bytes(b"half")
    dead = release_private.private_folder(out, 5)
    dead.mkdir(mode=0o700)
    (dead / "release.duckdb").write_bytes(b"left by a killed publication")
    other = tmp_path / "other.duckdb.5.partial"
    other.mkdir()
    link = tmp_path / "release.duckdb.6.partial"
    link.symlink_to(other, target_is_directory=True)
    try:
        assert release_private.remove_leftovers(out) == [dead]
        assert (release_private.private_folder(out, 7) / "release.duckdb").read_bytes() == b"half"
        assert other.is_dir() and link.is_symlink() and not dead.exists()
    finally:
        release_private.let_go(running)
    assert release_private.remove_leftovers(out) == [release_private.private_folder(out, 7)]

"""Red team s36c: back-end jobs, `sqlsdc publish` (the release database and its Parquet copy)
and the query-time suppression, attacked by an analyst who combines live answers with
published tables, by a BI user holding only the release files, and by bad command-line input.

What broke (fixed here):

- **`publish --parquet DIR --replace` deleted whatever DIR held.** The old folder is renamed
  aside and removed as a whole once the new one is in place, and nothing checked that it was
  a release: ``sqlsdc publish conf.duckdb release.duckdb --parquet . --replace`` (or any folder
  holding the database, or a parent of it) deleted the confidential database with its catalog
  and audit log (the publication's own accepted entry and ledger rows with it), and every
  other file there. Only an earlier release folder (its ``manifest.json`` and the files it
  lists, nothing else) is replaced now (``release_parquet.check_replaceable``), checked with
  the request, before anything is charged. Nor is OUT (or DIR) a file kept beside the
  database any more: ``publish conf.duckdb conf.duckdb.wal`` wrote the release where DuckDB
  keeps its write-ahead log, and the next opening of the database deleted it as a stray log;
  over ``conf.duckdb.lock`` (``--force``) the new file would let two processes write at once.

- **Differencing a job's table and another release of populations a few units apart.** A job
  over ``WHERE age >= 1`` by geography x sex on the suppression demo was accepted next to the
  live pattern of every person (its WHERE drops rows, so it is not the live universe), and
  the release file held both: in 144 cells published by both, the difference was the count
  (1-4) of persons aged 0 there (one girl aged 0 in R01-M001), cells the policy's ``freq:5``
  hides. So with a suppression job of ``age >= 80`` next to one of ``age >= 85`` (their cells
  all differ, so they were not "the same cells"), and with ``SUM(turnover) ... WHERE employees
  >= 10`` next to the live enterprises pattern: the turnover of a cell's few small firms. A
  job publishing exact values (suppression, CTA) is now refused when a cell it shares with an
  exact release of the same table and aggregate has overlapping populations that differ, on
  one side only, by fewer units than the minimum frequency (``jobs/differencing.py``).
  Left open: the two patterns together (a cell one hides and the other publishes, the LP over
  both with non-negative differences: on the demo it pinned 60 of the ``age >= 1`` job's
  secondaries, no primary) and rounded tables next to others (allowed by red team s33c).

- **Suppression jobs of the same rows, read together.** Red team s32b made a job keep the
  cells another suppression output of the same rows hid, but it still hid cells the other
  had published, and audited its pattern alone. After nace x region (``freq:3``), the nace x
  region x size_class job hid nine (nace, region) totals the first published: the two tables
  together pinned eleven of its primaries exactly ((M, R01, micro) = 1; (M, R01) = 2 with two
  listed inner cells). A job now publishes the cells such outputs published with the same
  value (``forced``, as the query path keeps its earlier pattern), and is refused when they
  leave a primary unprotectable. Tables coding a shared cell differently (region x education
  next to geography x education, whose region subtotals are the same cells) were not matched
  at all; the attacker LP over every such output and the job (``jobs/linked_audit.py``, over
  the cross-classification of all their dimensions) now refuses the job when a primary is
  narrower than its levels. Before, municipality x education then municipality x sex of
  ``age >= 80`` left counts of 9 at [1, 11] and 7 at [1, 9] (30 % needed).

- **A sum job over a cell of NULL measures** stopped on a ``TypeError`` (the largest
  contributions of such a cell are SQL NULL, read as pandas ``NA``); it is now the job's clear
  refusal of missing values.

What held (tried, not kept as tests): the release file and its Parquet copy hold no ``__``
column, no rule and no primary/secondary distinction, no column comments, only the
``ARROW:schema`` key in Parquet metadata; a suppression job's published ``lower_bound`` /
``upper_bound`` equal an independent attacker LP over its published cells (132 and 8 cells);
27 rephrasings of a cell or its complement (``<>``, ``IN``, ``OR``, ``NOT``, ``LIKE``,
``BETWEEN``, row values, ``||``, CASE groups, FILTER, ``COUNT(col)``, ``SUM(age)``) were
refused or answered from the live pattern; a rounding job (base 3) next to the CKM answers of
its cells (D = 5) narrowed 22 of 341 cells and pinned none, next to a live rounding to base 5
none of 350.

Left open: a job over a DP table (``benefits``) is accepted and publishes exact counts beside
the analysts' budget (a policy decision); differences of rounded or raked tables of nested
populations, and the p% rule on a difference group of at least the minimum frequency; the
API's ``time_limit=nan`` raises ``ValueError`` (the CLI refuses it).
"""

from __future__ import annotations

import json

import pytest
from db_reads import read

from sqlsdc.errors import Error, TabularError
from sqlsdc.jobs.adjust import cta_query
from sqlsdc.jobs.protect import protect_query
from sqlsdc.release import publish
from sqlsdc.tabular.rules import FrequencyRule


@pytest.fixture()
def in_a_folder(pristine_demo_db, tmp_path, copy_database):
    """The demo database in a folder of its own, next to a file of the admin's."""
    folder = tmp_path / "work"
    folder.mkdir()
    db = copy_database(pristine_demo_db, folder)
    (folder / "notes.txt").write_text("the admin's notes\n")
    return db


@pytest.mark.parametrize("where", ["database's folder", "its parent", "another folder"])
def test_replacing_a_parquet_folder_that_is_no_release_is_refused(in_a_folder, tmp_path, where):
    db = in_a_folder
    target = {"database's folder": db.parent, "its parent": tmp_path}.get(where)
    if target is None:
        target = tmp_path / "photos"
        target.mkdir()
        (target / "holiday.jpg").write_bytes(b"\xff\xd8")
    with pytest.raises(Error, match="not an earlier release folder"):
        publish(db, tmp_path / "release.duckdb", "admin", parquet=target, replace=True)
    assert db.exists() and (db.parent / "notes.txt").exists()
    assert not (tmp_path / "release.duckdb").exists()
    assert read(db, "SELECT decision FROM sqlsdc.audit ORDER BY query_id DESC LIMIT 1") == [
        ("refused",)
    ]
    if where == "another folder":
        assert (target / "holiday.jpg").exists()


def test_an_earlier_release_folder_is_still_replaced(in_a_folder, tmp_path):
    db, folder = in_a_folder, tmp_path / "parquet"
    first = publish(db, tmp_path / "release.duckdb", "admin", parquet=folder)
    second = publish(db, tmp_path / "release.duckdb", "admin", parquet=folder, replace=True)
    manifest = json.loads((folder / "manifest.json").read_text())
    assert manifest["release_id"] == second.release_id > first.release_id
    (folder / "extra.csv").write_text("a,b\n")  # no longer only a release
    with pytest.raises(Error, match="not an earlier release folder"):
        publish(db, tmp_path / "release.duckdb", "admin", parquet=folder, replace=True)
    assert (folder / "extra.csv").exists()


@pytest.mark.parametrize("end", [".wal", ".lock", ".waiting"])
def test_the_release_is_no_file_kept_beside_the_database(in_a_folder, tmp_path, end):
    db = in_a_folder
    beside = db.with_name(db.name + end)
    with pytest.raises(Error, match="kept beside the database"):
        publish(db, beside, "admin", replace=True)
    with pytest.raises(Error, match="kept beside the database"):
        publish(db, tmp_path / "release.duckdb", "admin", parquet=beside, replace=True)
    assert not beside.exists() or end == ".lock"


OLD = "SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 GROUP BY region, education"


@pytest.fixture()
def suppress_db(suppress_template, tmp_path, copy_database):
    return copy_database(suppress_template, tmp_path)


def _stored(db) -> list[tuple]:
    return read(db, "SELECT name FROM sqlsdc.outputs ORDER BY name")


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT region, municipality, sex, COUNT(*) FROM persons WHERE age >= 1 "
        "GROUP BY region, municipality, sex",
        "SELECT nace, region, SUM(turnover) FROM enterprises WHERE employees >= 10 "
        "GROUP BY nace, region",
    ],
    ids=["persons-but-babies", "turnover-of-larger-firms"],
)
def test_a_job_a_few_units_off_the_live_pattern_is_refused(suppress_db, sql):
    with pytest.raises(TabularError, match="overlap and differ by only"):
        protect_query(suppress_db, "admin", sql, into="near", time_limit=10)
    assert _stored(suppress_db) == []
    decision, reason = read(suppress_db, "SELECT decision, reason FROM sqlsdc.audit "
                                         "ORDER BY query_id DESC LIMIT 1")[0]  # fmt: skip
    assert decision == "refused" and "differ by only" in reason
    # populations that differ by at least the minimum frequency in every shared cell stay
    # allowed: one far from the whole table (red team s30f), the babies by region (10 or more)
    protect_query(suppress_db, "admin", OLD, into="old", time_limit=10)
    by_region = "SELECT region, COUNT(*) FROM persons WHERE age >= 1 GROUP BY region"
    protect_query(suppress_db, "admin", by_region, into="by_region", time_limit=10)


def test_exact_jobs_of_nested_populations_are_refused(jobs_demo_db):
    """Before: ``age >= 80`` was stored next to ``age >= 85``; the difference of two published
    cells counted the persons aged 80-84 there, down to 1."""
    db = jobs_demo_db
    protect_query(db, "admin", OLD, into="s85")
    wider = OLD.replace("age >= 85", "age >= 80")
    with pytest.raises(TabularError, match="protected.s85 overlap and differ by only"):
        protect_query(db, "admin", wider, into="s80")
    with pytest.raises(TabularError, match="protected.s85 overlap and differ by only"):
        cta_query(db, "admin", wider, into="c80")
    assert _stored(db) == [("protected.s85",)]
    # a population disjoint from the first shares no unit: nothing to difference
    protect_query(db, "admin", OLD.replace("age >= 85", "age < 20"), into="young")


NACE_REGION = "SELECT nace, region, COUNT(*) FROM enterprises GROUP BY nace, region"
NACE_REGION_SIZE = (
    "SELECT nace, region, size_class, COUNT(*) FROM enterprises GROUP BY nace, region, size_class"
)


def test_a_finer_table_cannot_hide_what_a_coarser_one_published(jobs_demo_db):
    """Before: stored, and with the coarser table's published (M, R01) total, its (M, R01,
    micro) and (M, R01, small) primaries were pinned at 1."""
    rule = [FrequencyRule(3)]
    protect_query(jobs_demo_db, "admin", NACE_REGION, into="two", rules=rule)
    with pytest.raises(TabularError, match="are public, and with this table's cells they reveal"):
        protect_query(jobs_demo_db, "admin", NACE_REGION_SIZE, into="three", rules=rule)
    assert _stored(jobs_demo_db) == [("protected.two",)]


def _by(dims: str) -> str:
    return f"SELECT {dims}, COUNT(*) FROM persons WHERE age >= 80 GROUP BY {dims}"


@pytest.mark.slow  # two suppression jobs of 80+ by geography (~4-6 s of CPU each order)
@pytest.mark.parametrize("order", ["regions-first", "municipalities-first"])
def test_tables_coding_shared_cells_otherwise_are_audited_together(jobs_demo_db, order):
    """Region subtotals of a geography table are the cells of a region table."""
    jobs = [("r", _by("region, education")), ("g", _by("region, municipality, education"))]
    first, second = jobs if order == "regions-first" else jobs[::-1]
    protect_query(jobs_demo_db, "admin", first[1], into=first[0])
    with pytest.raises(TabularError, match=f"read together with protected.{first[0]}"):
        protect_query(jobs_demo_db, "admin", second[1], into=second[0])
    assert _stored(jobs_demo_db) == [(f"protected.{first[0]}",)]


def test_a_sum_over_a_cell_of_null_measures_is_a_clear_refusal(jobs_demo_db):
    """Some municipality x education cell of persons aged 80+ has NULL incomes only."""
    sql = _by("municipality, education").replace("COUNT(*)", "SUM(income)")
    with pytest.raises(TabularError, match="missing values"):
        protect_query(jobs_demo_db, "admin", sql, into="incomes")

"""Earlier versions of anonymised files in the differencing check.

A file stored ``replace=True`` is gone from ``sqlsdc.outputs``, but its readers keep it: the
check reads every version from ``sqlsdc.output_versions`` and the jobs' audit entries
(:mod:`sqlsdc.jobs.output_history`). A job of its table is compared with every earlier
version (as with a replaced job's tables); a file released is compared with the earlier
versions of files that were released while current, never with candidates replaced unreleased.
"""

from __future__ import annotations

import pytest

from sqlsdc import admin
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.output_history import earlier_versions
from sqlsdc.jobs.protect import protect_query
from sqlsdc.policy import load_policy
from sqlsdc.tabular.rules import FrequencyRule

SENIORS = "FROM persons WHERE region = 'R01' AND age >= 65"


def _seniors(db, *, replace: bool = False, banded: bool = True):
    """The README's seniors file (age banded 65/75/85), or the same people without age."""
    if banded:
        return anonymize(db, user="admin", into="seniors_r01", sql=f"SELECT * {SENIORS}", seed=7,
                         steps=["recode:age:breaks=65/75/85", "microaggregate:income:k=5"],
                         replace=replace)  # fmt: skip
    return anonymize(db, user="admin", into="seniors_r01", seed=7, replace=replace,
                     sql=f"SELECT region, education, sex {SENIORS}",
                     steps=["suppress:region,education,sex:k=1"])  # fmt: skip


def _aged_84_file(db):
    """Everyone aged 84 or over, age banded at 84: its band less the seniors' ``>=85`` is the
    one person aged 84 of (R01, upper secondary)."""
    return anonymize(db, user="admin", into="aged_84", seed=7,
                     sql="SELECT region, education, age FROM persons WHERE age >= 84",
                     steps=["recode:age:breaks=84"])  # fmt: skip


def _releasing(db, *names):
    _version, document, _history = admin.show(db)
    admin.apply(db, load_policy({**document, "releases": list(names)}), "admin")


def _seniors_stored(db) -> None:
    _seniors(db)


def _seniors_replaced_unbanded(db) -> None:
    """The seniors file, replaced by the same people without age."""
    _seniors(db)
    _seniors(db, replace=True, banded=False)


def test_every_version_is_kept_with_its_definition(jobs_demo_db):
    """Both versions are in ``output_versions``; the first is an earlier version, with the
    request and the report it was stored with, and not released (no policy listed it)."""
    first = _seniors(jobs_demo_db)
    _seniors(jobs_demo_db, replace=True, banded=False)
    con = open_database(jobs_demo_db)
    try:
        stored = con.sql("SELECT name, method FROM sqlsdc.output_versions WHERE name = "
                         "'protected.seniors_r01'").fetchall()  # fmt: skip
        (earlier,) = [v for v in earlier_versions(con) if v.name == "protected.seniors_r01"]
    finally:
        con.close()
    assert stored == [("protected.seniors_r01", "anonymize")] * 2
    assert "recode:age:breaks=65/75/85" in earlier.sql
    assert first.steps[0]["step"] in earlier.report and not earlier.released
    assert earlier.records is None  # nothing blanked: its definition is enough


def test_a_file_released_after_a_released_file_was_replaced(jobs_demo_db):
    """The seniors file, listed under ``releases:``, replaced by one without age (its readers
    keep the first, band ``>=85``); then a file of everyone aged 84 or over banded at 84 is
    stored next to the released files: compared with the second version only it was stored,
    next to the first it is refused, naming that version."""
    _releasing(jobs_demo_db, "seniors_r01")
    _seniors(jobs_demo_db)
    _seniors(jobs_demo_db, replace=True, banded=False)
    with pytest.raises(MicrodataError, match=r"seniors_r01 as job \d+ stored it .*differ by only"):
        _aged_84_file(jobs_demo_db)


def test_a_candidate_replaced_unreleased_is_no_release(jobs_state, tmp_path):
    """The same, the seniors file never listed: its first version reached no reader, so the
    file of everyone aged 84 or over is stored (candidates are compared once released), and
    a policy listing both files now compares the current versions only."""
    jobs_demo_db = jobs_state(_seniors_replaced_unbanded, tmp_path)
    _aged_84_file(jobs_demo_db)
    _releasing(jobs_demo_db, "seniors_r01", "aged_84")


def test_a_job_next_to_a_replaced_file_that_blanked_values(jobs_demo_db):
    """A file of everyone aged 85+ whose local suppression blanked 453 municipalities,
    replaced by one without municipality: its records as readers hold them are kept, and a
    table of the same people by municipality is refused by the cells the blanked values leave
    short, naming the first version."""
    sql = "SELECT municipality, sex, education FROM persons WHERE age >= 85"
    anonymize(jobs_demo_db, user="admin", into="aged_file", sql=sql,
              steps=["suppress:municipality,sex,education:k=3,importance=3/2/1"])  # fmt: skip
    anonymize(jobs_demo_db, user="admin", into="aged_file", replace=True,
              sql="SELECT sex, education FROM persons WHERE age >= 85",
              steps=["suppress:sex,education:k=1"])  # fmt: skip
    with pytest.raises(TabularError, match=r"aged_file as job \d+ stored it blanked values of "
                       r"municipality"):  # fmt: skip
        protect_query(jobs_demo_db, "admin", "SELECT municipality, COUNT(*) FROM persons WHERE "
                      "age >= 85 GROUP BY municipality", into="aged_table",
                      rules=[FrequencyRule(5)])  # fmt: skip


def test_a_file_replaced_before_the_catalog_kept_versions_is_not_compared(jobs_state, tmp_path):
    """An earlier version known from its audit entry only (a catalog older than
    ``output_versions``): its columns and blanked values are unknown, so it counts as a file
    the check cannot compare, and a job of its table is refused (fail closed)."""
    jobs_demo_db = jobs_state(_seniors_replaced_unbanded, tmp_path)
    con = open_database(jobs_demo_db)
    try:
        con.execute("DELETE FROM sqlsdc.output_versions")
    finally:
        con.close()
    with pytest.raises(
        TabularError,
        match=r"seniors_r01 as job \d+ stored it \(before the "
        r"catalog kept output versions: its columns are unknown\) reads persons",
    ):
        protect_query(jobs_demo_db, "admin", "SELECT region, education, COUNT(*) FROM persons "
                      "WHERE age >= 95 GROUP BY region, education", into="aged_95",
                      rules=[FrequencyRule(5)])  # fmt: skip


def test_a_job_along_the_bands_of_every_version_is_stored(jobs_state, tmp_path):
    """The seniors file replaced by one with other bands below 85: a job of everyone aged 85
    or over by region and education is along the band ``>=85`` of both versions, and stored.
    Three releases of a cell make a signed-sum check: a job's own small cell (9 persons aged
    85+ of R01 with primary education) is no sum of several releases."""
    jobs_demo_db = jobs_state(_seniors_stored, tmp_path)
    anonymize(jobs_demo_db, user="admin", into="seniors_r01", seed=7, replace=True,
              sql=f"SELECT * {SENIORS}",
              steps=["recode:age:breaks=65/70/85", "microaggregate:income:k=5"])  # fmt: skip
    protect_query(jobs_demo_db, "admin", "SELECT region, education, COUNT(*) FROM persons "
                  "WHERE age >= 85 GROUP BY region, education", into="aged_85",
                  rules=[FrequencyRule(5)])  # fmt: skip


def test_a_version_published_with_include_is_held(jobs_state, tmp_path):
    """The seniors file never listed but published with ``--include``, then replaced: the
    publication's readers keep the first version, and the file of everyone aged 84 or over is
    refused next to it."""
    from sqlsdc.release import publish

    jobs_demo_db = jobs_state(_seniors_stored, tmp_path)
    publish(jobs_demo_db, tmp_path / "release.duckdb", "admin", include=["seniors_r01"])
    _seniors(jobs_demo_db, replace=True, banded=False)
    with pytest.raises(MicrodataError, match=r"seniors_r01 as job \d+ stored it .*differ by only"):
        _aged_84_file(jobs_demo_db)

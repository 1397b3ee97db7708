"""Red team s38e: the three changes merged in session 38, attacked with an analyst's guarded
connection (rounding mean before sum, the counted-units key) and as an admin running jobs in
the order a careless office would (anonymised files in the jobs' differencing check).

DRAFT
"""

from __future__ import annotations

import pytest

from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.tabular.rules import FrequencyRule

# ------------------------------------------ a job that splits a band of an anonymised file

SENIORS = "SELECT * FROM persons WHERE region = 'R01' AND age >= 65"


def _seniors(db):
    """The README's file: R01 aged 65 or over, age banded 65/75/85 (exact band counts)."""
    return anonymize(db, user="admin", into="seniors_r01", sql=SENIORS, seed=7,
                     steps=["recode:age:breaks=65/75/85", "microaggregate:income:k=5"])  # fmt: skip


def _aged(db, least: int):
    """Everyone aged ``least`` or over by region and education, suppression at 5."""
    return protect_query(db, "admin", "SELECT region, education, COUNT(*) FROM persons WHERE "
                         f"age >= {least} GROUP BY region, education", into=f"aged_{least}",
                         rules=[FrequencyRule(5)])  # fmt: skip


def _aged_84_of_r01(db) -> dict:
    con = open_database(db)
    try:
        return dict(con.execute("SELECT CAST(education AS VARCHAR), count(*) FROM persons WHERE "
                                "region = 'R01' AND age = 84 GROUP BY 1").fetchall())  # fmt: skip
    finally:
        con.close()


@pytest.mark.parametrize("first", ["file", "job"])
def test_a_job_that_splits_a_band_less_the_band_above_it(jobs_demo_db, first):
    """The README's seniors file (R01 aged 65+, age banded 65/75/85), and a suppression job of
    everyone aged 84 or over by region and education: the job's cell (R01, upper secondary),
    60 persons, less the file's cell (R01, upper secondary, >=85), 59, is the one person aged
    84. The check compared the job's cell with the file's same cell (65+: 117 more, on the
    file's side, allowed) and with its cuts only for the file's units outside the job, so
    the job was stored, in either order."""
    assert _aged_84_of_r01(jobs_demo_db)["upper_secondary"] == 1
    if first == "file":
        _seniors(jobs_demo_db)
        with pytest.raises(TabularError, match=r"differ by only \d unit.*age = '>=85'"):
            _aged(jobs_demo_db, 84)
    else:
        _aged(jobs_demo_db, 84)
        with pytest.raises(MicrodataError, match=r"differ by only \d unit.*age = '>=85'"):
            _seniors(jobs_demo_db)


@pytest.mark.parametrize("first", ["file", "job"])
def test_a_job_along_the_file_s_bands_is_still_stored(jobs_demo_db, first):
    """Aged 85 or over is the file's band ``>=85``: its records outside the job are its own
    cells, nothing new; both orders are stored."""
    jobs = [lambda: _seniors(jobs_demo_db), lambda: _aged(jobs_demo_db, 85)]
    for job in jobs if first == "file" else jobs[::-1]:
        job()

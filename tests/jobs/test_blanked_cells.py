"""An anonymised file's locally suppressed values next to an exact table of the same units.

A file shows a cell of a column that local suppression blanked short of its blanked records
there, so an exact table of the same people by that column (or by a coarser one the column
determines) less the file's shown records is the number of blanked records in the cell: the
differencing check refuses the second release when that is fewer than the minimum frequency,
whichever comes first (:func:`sqlsdc.jobs.differencing.refuse_small_differences`,
:func:`~sqlsdc.jobs.differencing.refuse_file_differences`).
"""

from __future__ import annotations

import duckdb
import pytest
import sqlglot
from sqlglot import exp

from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.blanked_cells import blanked_difference
from sqlsdc.jobs.exact_release import Release
from sqlsdc.jobs.protect import protect_query
from sqlsdc.jobs.tabulation import JobSpec
from sqlsdc.tabular.rules import FrequencyRule

AGED = "FROM persons WHERE age >= 85"


def _file(db, columns: str, step: str) -> None:
    anonymize(db, user="admin", into="aged_file", sql=f"SELECT {columns} {AGED}", steps=[step])


def _table(db, dims: str) -> None:
    protect_query(db, "admin", f"SELECT {dims}, COUNT(*) {AGED} GROUP BY {dims}",
                  into="aged_table", rules=[FrequencyRule(5)])  # fmt: skip


def _both(db, first: str, file: tuple[str, str], dims: str) -> None:
    """The file and the table, in the order ``first`` names."""
    jobs = [lambda: _file(db, *file), lambda: _table(db, dims)]
    for job in jobs if first == "file" else jobs[::-1]:
        job()


BLANKED_MUNICIPALITIES = ("municipality, sex, education",
                          "suppress:municipality,sex,education:k=3,importance=3/2/1")  # fmt: skip


def test_the_table_after_the_file_names_the_file_and_the_cell(jobs_demo_db):
    """The file blanked 453 municipalities; one municipality's count less its shown records
    leaves a few of them."""
    _file(jobs_demo_db, *BLANKED_MUNICIPALITIES)
    with pytest.raises(TabularError, match=r"protected\.aged_file blanked values of "
                       r"municipality .* cell \(municipality = 'R0\d-M\d+'\) .* only [1-9] "
                       r"unit"):  # fmt: skip
        _table(jobs_demo_db, "municipality")


def test_the_file_after_the_table_names_the_table_and_the_cell(jobs_demo_db):
    _table(jobs_demo_db, "municipality")
    with pytest.raises(MicrodataError, match=r"the file protected\.aged_file blanked values "
                       r"of municipality .*aged_table publishes .* cell \(municipality = "
                       r"'R0\d-M\d+'\)"):  # fmt: skip
        _file(jobs_demo_db, *BLANKED_MUNICIPALITIES)


@pytest.mark.parametrize("first", ["file", "table"])
def test_a_coarser_table_sums_the_blanked_records_of_its_municipalities(jobs_demo_db, first):
    """2-anonymous on municipality x sex: 70 municipalities blanked, 5 of them in each of R02
    and R03 (of 446 and 393 persons aged 85 or over). The file has no region; its
    municipalities determine it, so a region's count less the file's records of its
    municipalities is that region's blanked records."""
    file = ("municipality, sex", "suppress:municipality,sex:k=2,importance=2/1")
    with pytest.raises((MicrodataError, TabularError), match=r"region = 'R0[23]'.* only 5 unit"):
        _both(jobs_demo_db, first, file, "region")


@pytest.mark.parametrize("first", ["file", "table"])
def test_a_column_the_file_did_not_blank_is_allowed(jobs_demo_db, first):
    """Sex and education blanked, municipality as it was: the table by municipality and the
    file's municipalities differ nowhere."""
    file = ("municipality, sex, education", "suppress:sex,education:k=3,importance=2/1")
    _both(jobs_demo_db, first, file, "municipality")


def test_a_table_by_another_column_is_allowed(jobs_demo_db):
    """The municipalities blanked, the table by sex: the file shows every record's sex."""
    _both(jobs_demo_db, "file", BLANKED_MUNICIPALITIES, "sex")


# The cells on a small table of their own: 12 persons in each of M1 and M2 (region R1) and
# M3 (R2), 6 of each aged 90 or over, and 3 more in R2 whose municipality is missing in the
# table itself; the file holds everyone, and blanks the municipality (or sex) of a few.
BAND = sqlglot.parse_one("CASE WHEN age >= 90 THEN '>=90' ELSE '<90' END")


@pytest.fixture()
def small(tmp_path):
    con = duckdb.connect(str(tmp_path / "small.duckdb"))
    people = [(m, r, s, a) for m, r in [("M1", "R1"), ("M2", "R1"), ("M3", "R2")]
              for s in ("F", "M") for a in (70, 71, 72, 90, 91, 92)]  # fmt: skip
    people += [(None, "R2", "F", 75)] * 3
    con.execute("CREATE TABLE persons (pid INTEGER, municipality VARCHAR, region VARCHAR, "
                "sex VARCHAR, age INTEGER)")  # fmt: skip
    con.executemany("INSERT INTO persons VALUES (?, ?, ?, ?, ?)",
                    [(i, *p) for i, p in enumerate(people)])  # fmt: skip
    yield con
    con.close()


def _shown(con, blank_municipality: str = "FALSE", blank_sex: str = "FALSE") -> None:
    """The file of everyone: municipality and sex as they are or blanked where the conditions
    hold, age by the band."""
    con.execute(
        "CREATE OR REPLACE TABLE file AS SELECT CASE WHEN " + blank_municipality + " THEN NULL "
        "ELSE municipality END AS municipality, CASE WHEN " + blank_sex + " THEN NULL ELSE sex "
        "END AS sex, CASE WHEN age >= 90 THEN '>=90' ELSE '<90' END AS age FROM persons"
    )


def _release(blanked: set[str], *, band: bool = False) -> Release:
    exact = [("municipality", exp.column("municipality")), ("sex", exp.column("sex"))]
    exact += [("age", BAND.copy())] if band else []
    plain = ("municipality", "sex")
    return Release("the file", None, plain, tuple(exact), frozenset({"municipality", "sex", "age"}),
                   frozenset(blanked), exp.table_("file"))  # fmt: skip


def _job(dims: str, where: str | None = None) -> JobSpec:
    condition = sqlglot.parse_one(where) if where else None
    return JobSpec("persons", tuple(dims.split(",")), None, "pid", condition)


def test_a_cell_short_of_a_few_blanked_records_is_found(small):
    """Two of M1 blanked: M1's count less its shown records is 2. The file's missing
    category (the table's 3 missing municipalities and the 2 blanked) is never such a cell."""
    _shown(small, "pid IN (0, 1)")
    found = blanked_difference(small, _job("municipality"), _release({"municipality"}), 5)
    assert found == ({"municipality": "M1"}, 2, ["municipality"])


def test_enough_blanked_records_in_every_cell_are_allowed(small):
    """Six of M1 blanked, none elsewhere: 6 is no small difference."""
    _shown(small, "pid < 6")
    assert blanked_difference(small, _job("municipality"), _release({"municipality"}), 5) is None


def test_a_coarser_table_adds_the_blanked_records_of_its_municipalities(small):
    """One blanked in M1 and one in M2: by region R1 the difference is 2. Seven blanked in
    R1 are no small difference, but one in M3 is, with R2's three persons whose municipality
    the table itself lacks (the file places them in no region either): 4."""
    _shown(small, "pid IN (0, 12)")
    assert blanked_difference(small, _job("region"), _release({"municipality"}), 5) == (
        {"region": "R1"}, 2, ["municipality"])  # fmt: skip
    _shown(small, "pid IN (0, 1, 2, 3, 12, 13, 14, 24)")
    assert blanked_difference(small, _job("region"), _release({"municipality"}), 5) == (
        {"region": "R2"}, 4, ["municipality"])  # fmt: skip


def test_several_blanked_columns_make_cells_of_their_combinations(small):
    """Six municipalities of M1 blanked (no small difference) and the sex of one woman of
    M2: the table by municipality x sex finds M2's women short of her."""
    _shown(small, "pid < 6", "pid = 12")
    release = _release({"municipality", "sex"})
    assert blanked_difference(small, _job("municipality,sex"), release, 5) == (
        {"municipality": "M2", "sex": "F"}, 1, ["municipality", "sex"])  # fmt: skip


def test_a_table_of_part_of_the_file_is_compared_where_the_file_tells_its_members(small):
    """The table counts those aged 90 or over, the file everyone, one of M1's 90-year-olds
    and one younger person with their municipality blanked. With the age band, the reader
    knows which of the file's records the table counts: M1's six less its five shown
    90-year-olds is the blanked one. Without the band the file's records of M1 are of both
    kinds, and nothing is placed."""
    _shown(small, "pid IN (0, 3)")
    job = _job("municipality", "age >= 90")
    found = blanked_difference(small, job, _release({"municipality"}, band=True), 5)
    assert found == ({"municipality": "M1"}, 1, ["municipality"])
    assert blanked_difference(small, job, _release({"municipality"}), 5) is None


def test_a_file_without_blanked_values_costs_no_query(small):
    """No local suppression: the check returns before it reads anything (the file's records
    are not even there)."""
    assert blanked_difference(small, _job("municipality"), _release(set()), 5) is None

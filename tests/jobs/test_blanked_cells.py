"""An anonymised file's locally suppressed values next to an exact table of the same units.

A file shows a cell of a column that local suppression blanked short of its blanked records
there, so an exact table of the same people by that column (or by a coarser one the column
determines) less the file's shown records is the number of blanked records in the cell: the
differencing check refuses the second release when that is fewer than the minimum frequency,
whichever comes first (:func:`sqlsdc.jobs.differencing.refuse_small_differences`,
:func:`~sqlsdc.jobs.differencing.refuse_file_differences`).
"""

from __future__ import annotations

import pytest

from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
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

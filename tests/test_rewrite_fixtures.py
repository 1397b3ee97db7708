"""Golden fixtures of the rewrite passes (sqlglot-style input/expected pairs): the threshold
frame on the threshold demo, the cell key method's on the demo as shipped, rounding's on the
threshold demo with counts and magnitudes rounded. Each expected SQL is also run on DuckDB.
Regenerate a file after a deliberate change of a pass and review the diff: it is the change of
the SQL every query of that shape runs."""

from __future__ import annotations

from pathlib import Path

import pytest

import sqlsdc
from sqlsdc.engines.duckdb import open_database


@pytest.fixture
def analyst(module_analyst):
    """One connection for the module (conftest's ``module_analyst``): the fixtures are only
    explained."""
    return module_analyst


FIXTURES = Path(__file__).parent / "fixtures"


def load_pairs(name: str) -> list[tuple[str, str, str]]:
    """``(title, input SQL, expected SQL)`` from a fixture file of commented statement pairs."""
    pairs, title, statements = [], "", []
    for line in (FIXTURES / name).read_text().splitlines():
        if line.startswith("--"):
            title = line[2:].strip()
        elif line.strip():
            statements.append(line.strip().rstrip(";"))
            if len(statements) == 2:
                pairs.append((title, *statements))
                statements = []
    return pairs


PAIRS = load_pairs("threshold.sql")
CKM_PAIRS = load_pairs("ckm.sql")
ROUND_PAIRS = load_pairs("round.sql")


def test_fixture_files_are_complete():
    assert len(PAIRS) >= 8 and len(CKM_PAIRS) >= 7 and len(ROUND_PAIRS) >= 5


@pytest.fixture(scope="module")
def rounded_db(rounded_template, tmp_path_factory, copy_database):
    """The demo with counts rounded to 5 (unbiased), magnitudes to 100 (conventional)."""
    return copy_database(rounded_template, tmp_path_factory.mktemp("round-fixtures"))


@pytest.mark.parametrize("title, sql, expected", PAIRS, ids=[p[0] for p in PAIRS])
def test_rewrite(analyst, raw, title, sql, expected):
    assert analyst.explain(sql).sql == expected
    # the expected SQL runs on DuckDB and has the query's columns plus status columns
    protected = raw.sql(expected).to_arrow_table()
    original = raw.sql(sql).to_arrow_table()
    assert protected.column_names[: original.num_columns] == original.column_names
    assert protected.num_rows == original.num_rows


@pytest.mark.parametrize("title, sql, expected", CKM_PAIRS, ids=[p[0] for p in CKM_PAIRS])
def test_ckm_rewrite(ckm, raw_ckm, title, sql, expected):
    assert ckm.explain(sql).sql == expected
    # the expected SQL runs on DuckDB: the query's columns plus status columns, and no group
    # that the unprotected query does not have (groups published as 0 are left out)
    protected = raw_ckm.sql(expected).to_arrow_table()
    original = raw_ckm.sql(sql).to_arrow_table()
    assert protected.column_names[: original.num_columns] == original.column_names
    assert protected.num_rows <= original.num_rows


@pytest.mark.parametrize("title, sql, expected", ROUND_PAIRS, ids=[p[0] for p in ROUND_PAIRS])
def test_round_rewrite(rounded_db, title, sql, expected):
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        assert con.explain(sql).sql == expected
    raw = open_database(rounded_db)
    try:
        protected = raw.sql(expected).to_arrow_table()
        original = raw.sql(sql).to_arrow_table()
    finally:
        raw.close()
    assert protected.column_names[: original.num_columns] == original.column_names
    assert protected.num_rows == original.num_rows

"""Red-team round of session 28 (fourth), against the parts of a DP cell's identity other
than its population: the canonical GROUP BY keys, the encoded key values of a row, the
aggregate texts (measure and calibration), the cached-answer path and the check cache. Two
cells of different exact values under one identity get one noise, and the difference of their
released values is the exact difference of their counts.

What succeeded, and was closed: DECIMAL group keys of more than 28 significant digits
(``encode_key_value`` normalised them in Python's default 28-digit context, so the groups
``1.00000000000000000000000000001`` and ``...02`` of one query were one cell, one noise);
data versions blind to values DuckDB hashes alike but functions tell apart (a table reloaded
with ``-0.0`` for ``0.0``, ``-nan`` for ``nan`` or ``INTERVAL '30 days'`` for ``'1 month'``
kept its version, so ``WHERE 1 / x < 0`` got the old noise over a new exact count); a
NULL group of a string key from the data (``CASE WHEN clinic = 'a' THEN 'y' END``) failed
with Arrow's own error (pandas' ``str`` dtype made the NULL a NaN, which Arrow could not take
back to a string key), so no NULL-producing string key could be released, and with a
quantile the NULL cell was not found (a raw ``KeyError``).
The areas that held are pinned below, one test each.
"""

from __future__ import annotations

from contextlib import closing
from decimal import Decimal

import duckdb
import pytest
import test_redteam_s28b
from test_dp_query import dp_document, make_db

import sqlsdc
import sqlsdc.guard.dp_charge as dp_charge
from sqlsdc.engines.duckdb_schema import data_version
from sqlsdc.mechanisms.dp_cells import encode_key_value

dp_db, ana = test_redteam_s28b.dp_db, test_redteam_s28b.ana  # DP counts, private visits groups


@pytest.fixture
def drawn(monkeypatch):
    """The cells each DP release of the test draws (identities and values)."""
    cells = []
    release = dp_charge.release

    def recording(*args, **kwargs):
        out = release(*args, **kwargs)
        cells.extend(out.cells)
        return out

    monkeypatch.setattr(dp_charge, "release", recording)
    return cells


# --- key values -------------------------------------------------------------------------------


def test_decimal_keys_are_encoded_exactly():
    assert encode_key_value(Decimal("1.00000000000000000000000000001")) != encode_key_value(
        Decimal("1.00000000000000000000000000002")
    )
    assert encode_key_value(Decimal("1.10")) == encode_key_value(Decimal("1.1")) == "d:1.1"
    assert encode_key_value(Decimal("100")) == "d:1E+2"  # the encoding of version 1 kept


def test_two_decimal_groups_beyond_28_digits_are_two_cells(ana, drawn):
    """Both groups got the noise of one cell: released minus exact was the same for both."""
    sql = (
        "SELECT CASE WHEN clinic = 'a' THEN 1.00000000000000000000000000001 "
        "ELSE 1.00000000000000000000000000002 END AS k, COUNT(*) FROM visits GROUP BY k"
    )
    assert len(ana.execute(sql).fetchall()) == 2
    digests = [c.identity.digest for c in drawn]
    assert len(digests) == len(set(digests)) == 4  # two groups, two statistics each


# --- data versions ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("column", "before", "after"),
    [
        ("DOUBLE", "'0.0'::DOUBLE", "'-0.0'::DOUBLE"),  # 1 / x: inf and -inf
        ("DOUBLE", "'nan'::DOUBLE", "-'nan'::DOUBLE"),  # CAST(x AS VARCHAR): nan and -nan
        ("INTERVAL", "INTERVAL '1 month'", "INTERVAL '30 days'"),  # date_part('month', x)
        ("DOUBLE[]", "['0.0'::DOUBLE]", "['-0.0'::DOUBLE]"),
    ],
    ids=["zero", "nan", "interval", "nested"],
)
def test_values_equal_to_duckdb_but_told_apart_change_the_data_version(column, before, after):
    """DuckDB hashes values that compare equal alike: a table reloaded with ``-0.0`` for
    ``0.0`` kept its data version, so ``WHERE 1 / x < 0`` got the old noise over a new exact
    count (the difference of two releases was exact)."""
    con = duckdb.connect()
    con.execute(f'CREATE TABLE t (k INTEGER, "x""y" {column})')
    versions = []
    for value in (before, after):
        con.execute("DELETE FROM t")
        con.execute(f"INSERT INTO t VALUES (1, {value})")
        versions.append(data_version(con, "t"))
    assert versions[0] != versions[1]
    assert con.execute('SELECT "x""y" = ' + before + " FROM t").fetchone() == (True,)


def test_a_table_without_such_columns_keeps_its_data_version():
    """Versions (and so the cells already released) of other tables are unchanged."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t AS SELECT 1 AS k, 'a' AS s, DATE '2020-01-01' AS d")
    row = con.execute("SELECT count(*), bit_xor(hash(t)), sum(hash(t)) FROM t").fetchone()
    assert data_version(con, "t") == ":".join(map(str, row))


# --- what held ---------------------------------------------------------------------------------


def _stage(con, sql: str, params=None):
    (stage,) = con.explain(sql, params).dp_stages
    return stage


@pytest.mark.parametrize(
    ("a", "b"),
    [
        ("length(clinic) / 2", "length(clinic) // 2"),  # decimal and integer division
        ("lower(clinic)", "upper(clinic)"),
        ("substr(clinic, 1, 1)", "substr(clinic, 2, 1)"),
        ("CASE WHEN clinic = 'a' THEN 'x' END", "CASE WHEN clinic = 'a' THEN 'x' ELSE '' END"),
    ],
    ids=["division", "case", "substr", "null-bucket"],
)
def test_keys_of_other_meanings_have_other_names(ana, a, b):
    sql = "SELECT {} AS k, COUNT(*) FROM visits GROUP BY k"
    assert _stage(ana, sql.format(a)).keys != _stage(ana, sql.format(b)).keys


def test_an_empty_string_and_null_are_two_cells(ana, drawn):
    """Both released (the NULL group failed), each with its own noise."""
    sql = "SELECT CASE WHEN clinic = 'a' THEN '' END AS k, COUNT(*) FROM visits GROUP BY k"
    assert {row[0] for row in ana.execute(sql).fetchall()} == {"", None}
    digests = [c.identity.digest for c in drawn]
    assert len(digests) == len(set(digests)) == 4


@pytest.fixture(scope="module")
def quantiles(tmp_path_factory):
    """ana on visits whose magnitudes spend epsilon (quantiles of private groups)."""
    path = tmp_path_factory.mktemp("s28d") / "dp.duckdb"
    document = dp_document()
    document["tables"]["visits"]["protection"]["magnitudes"] = {
        "method": "dp",
        "spend": {"epsilon": 1},
    }
    make_db(path, document)
    with closing(sqlsdc.connect(path, "ana")) as con:
        yield con


def test_a_null_group_gets_its_quantile(quantiles):
    """The histogram's NULL key came back NaN from pandas and the cell was not found (a
    ``KeyError`` reached the analyst)."""
    sql = (
        "SELECT CASE WHEN clinic = 'a' THEN 'y' END AS k, MEDIAN(cost), COUNT(*) FROM visits "
        "GROUP BY k"
    )
    rows = {row[0]: row for row in quantiles.execute(sql).fetchall()}
    assert set(rows) == {"y", None}
    assert 0 < rows[None][1] < 150


def test_each_count_is_its_own_statistic(ana):
    """Rows, units, non-NULL values and distinct values of one cell: four exact values, four
    (measure, calibration) pairs, so never one noise."""
    counts = ["COUNT(*)", "COUNT(DISTINCT pid)", "COUNT(cost)", "COUNT(DISTINCT clinic)"]
    named = set()
    for count in counts:
        stage = _stage(ana, f"SELECT clinic, {count} FROM visits GROUP BY clinic")
        named |= {(s.measure, s.calibration.describe()) for s in stage.statistics}
    assert len(named) == len(counts) + 1  # and the units count that selects the groups
    with pytest.raises(sqlsdc.PolicyViolation, match="FILTER is not allowed"):
        ana.explain("SELECT clinic, COUNT(*) FILTER (WHERE cost > 50) FROM visits GROUP BY clinic")


def test_cached_cells_answer_only_their_own_query(ana, drawn):
    """A repeated query is answered from the cache; another population draws its own."""
    whole = "SELECT sex, COUNT(*) FROM persons GROUP BY sex"
    first = ana.execute(whole).fetchall()
    assert ana.execute(whole).fetchall() == first
    before = {c.identity.digest for c in drawn}
    ana.execute("SELECT sex, COUNT(*) FROM persons WHERE age > 50 GROUP BY sex").fetchall()
    assert len({c.identity.digest for c in drawn} - before) == 2


def test_parameters_of_one_value_and_other_spellings_are_checked_apart(ana):
    """The check cache keys parameters by type and spelling (``sqlsdc.guard.statement.freeze``)."""
    sql = "SELECT sex, COUNT(*) FROM persons WHERE CAST(? AS VARCHAR) = region GROUP BY sex"
    scopes = {_stage(ana, sql, [v]).scope for v in (1, 1.0, True, Decimal("1.00"), -0.0, 0.0)}
    assert len(scopes) == 6

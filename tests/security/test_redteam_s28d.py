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
kept its version, so ``WHERE 1 / x < 0`` got the old noise over a new exact count).
The areas that held are pinned below, one test each.
"""

from __future__ import annotations

from decimal import Decimal

import duckdb
import pytest
import test_redteam_s28b

import sqlsdc.guard.connection as connection
from sqlsdc.engines.duckdb import data_version
from sqlsdc.mechanisms.dp_cells import encode_key_value

dp_db, ana = test_redteam_s28b.dp_db, test_redteam_s28b.ana  # DP counts, private visits groups


@pytest.fixture
def drawn(monkeypatch):
    """The cells each DP release of the test draws (identities and values)."""
    cells = []
    release = connection.release

    def recording(*args, **kwargs):
        out = release(*args, **kwargs)
        cells.extend(out.cells)
        return out

    monkeypatch.setattr(connection, "release", recording)
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

"""Attempts to reach the cell key method's secrets (record keys, ptables) or to undo its noise."""

from __future__ import annotations

import pytest

import sqlsdc

SECRETS = [
    "SELECT SUM(__rkey) FROM persons",
    "SELECT region, SUM(__rkey) % 4294967296 FROM persons GROUP BY region",
    "SELECT region, COUNT(*) FROM persons WHERE __rkey < 100 GROUP BY region",
    "SELECT __rkey, COUNT(*) FROM persons GROUP BY __rkey",
    "SELECT p.region, COUNT(*) FROM persons p GROUP BY p.region HAVING MAX(p.__rkey) > 0",
    "SELECT * FROM sqlsdc.ptable_entries",
    "SELECT COUNT(*) FROM sqlsdc.ptable_entries",
    "SELECT COUNT(*) FROM ptable_entries",
    "SELECT COUNT(*) FROM sqlsdc.ptables",
    "SELECT COUNT(*) FROM sqlsdc.key_events",
    "SELECT COUNT(*) FROM persons p JOIN sqlsdc.ptable_entries e ON e.i = p.age",
    "SELECT region, COUNT(*) FROM (SELECT region FROM persons) AS __cells GROUP BY region",
    "WITH __cells AS (SELECT region FROM persons) SELECT region, COUNT(*) FROM __cells "
    "GROUP BY region",
]


@pytest.mark.parametrize("sql", SECRETS)
def test_record_keys_and_ptables_are_out_of_reach(ckm, sql):
    with pytest.raises(sqlsdc.Error):
        ckm.execute(sql)


def test_internal_cell_columns_cannot_be_selected(ckm):
    for column in ("__y0", "__k0", "__x0_1", "__a0", "__n0"):
        with pytest.raises(sqlsdc.Error):
            ckm.execute(f"SELECT region, COUNT(*) FROM persons GROUP BY region ORDER BY {column}")


def test_repeating_a_query_cannot_average_the_noise(ckm, ckm_db):
    sql = "SELECT municipality, COUNT(*) AS n FROM persons GROUP BY municipality ORDER BY 1"
    first = ckm.execute(sql).fetchall()
    for _ in range(5):
        assert ckm.execute(sql + " ").fetchall() == first  # not the cache: other text
    with sqlsdc.connect(ckm_db, "analyst") as other:
        assert other.execute(sql).fetchall() == first


def test_splitting_a_cell_gives_noisy_parts_not_an_exact_difference(ckm, raw_ckm):
    """Total minus all-but-one-age does not reveal the count of that age exactly, for most
    municipalities (each cell carries its own noise)."""
    total = dict(ckm.execute("SELECT municipality, COUNT(*) FROM persons GROUP BY 1").fetchall())
    rest = dict(
        ckm.execute(
            "SELECT municipality, COUNT(*) FROM persons WHERE age <> 37 GROUP BY 1"
        ).fetchall()
    )
    truth = dict(
        raw_ckm.execute(
            "SELECT municipality, count(*) FROM persons WHERE age = 37 GROUP BY 1"
        ).fetchall()
    )
    exact = [m for m in truth if total[m] - rest.get(m, 0) == truth[m]]
    assert len(exact) < 0.5 * len(truth)

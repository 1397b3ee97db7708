"""Red team s50d: the policy's cell limits (s49i, s49n) attacked from the analyst's side.

Found: an answer that does not show every GROUP BY key released many values as one cell. The
ledger names a cell by the query's canonical population (its group keys among it) and the key
values the answer shows; ``SELECT COUNT(*) FROM persons WHERE education = 'tertiary' GROUP BY
municipality ORDER BY municipality`` gave 155 counts, one per municipality in the order of
their names, all under one identity: charged 22 cells (1, and the groups published as 0) where
showing the names cost 176, on the 20,000-person demo. So a day of 5,000 cells of persons held
about 30 such statements' 4,500 counts of random age halves by municipality... 150 times the
limit's cells; ``GROUP BY municipality, age`` (3,979 counts) was charged 3,110 where its 7,088
groups are. Fixed: values of one answer sharing an identity are counted one each, with the
cells the statement hides (once per statement), so such an answer costs its groups as the
same answer with its keys shown does.
"""

from __future__ import annotations

import shutil

import duckdb
import pytest

import sqlsdc
from sqlsdc.catalog.cell_limits import CellLimitReached
from sqlsdc.demo.build import build_demo_database, demo_policy
from sqlsdc.policy import load_policy


def _policy(limits):
    document = demo_policy().document_dict()
    document["users"] = {"admin": {"role": "admin"}, "analyst": {"role": "analyst"}}
    document["budgets"] = [b for b in document.get("budgets", []) if b.get("user") != "analyst"]
    document["cell_limits"] = limits
    return load_policy(document, name="s50d")


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    path = tmp_path_factory.mktemp("s50d") / "demo.duckdb"
    build_demo_database(path, persons=4000, seed=49, policy=_policy([]))
    return path


def _fresh(template, tmp_path, name, cells):
    path = tmp_path / f"{name}.duckdb"
    shutil.copy(template, path)
    limits = [{"user": "analyst", "table": "persons", "cells": cells}]
    sqlsdc.admin.apply(path, _policy(limits), "admin")
    return path


def _used(db) -> int:
    usage = sqlsdc.admin.cell_limit_usage(db, "admin", who="analyst")
    return int(usage["used"].iloc[0])


def _groups(db, sql: str) -> int:
    raw = duckdb.connect(str(db), read_only=True)
    (n,) = raw.execute(f"SELECT COUNT(*) FROM ({sql})").fetchone()
    raw.close()
    return n


HIDDEN = "SELECT COUNT(*) FROM persons WHERE education = 'tertiary' GROUP BY municipality"
SHOWN = HIDDEN.replace("COUNT(*)", "municipality, COUNT(*)")


@pytest.mark.parametrize("keys", ["municipality", "municipality, sex"])
def test_values_of_keys_not_shown_are_cells(template, tmp_path, keys):
    """Old: the counts of every municipality (in the order of their names) were one cell and
    the groups published as 0; now every group is a cell, as when the names are shown."""
    db = _fresh(template, tmp_path, "hidden", 100_000)
    sql = f"{HIDDEN.replace('municipality', keys)} ORDER BY {keys}"
    with sqlsdc.connect(db, user="analyst") as con:
        rows = con.execute(sql).fetchall()
    groups = _groups(db, HIDDEN.replace("municipality", keys))
    assert len(rows) > 20
    assert _used(db) == groups  # old: 1 + the groups published as 0 (39 of 137, 84 of 232)
    # the same statement again is free, as its cells are
    with sqlsdc.connect(db, user="analyst") as con:
        assert con.execute(sql).fetchall() == rows
    assert _used(db) == groups


def test_keys_not_shown_cost_what_keys_shown_cost(template, tmp_path):
    hidden, shown = (_fresh(template, tmp_path, n, 100_000) for n in ("a", "b"))
    with sqlsdc.connect(hidden, user="analyst") as con:
        n = len(con.execute(f"{HIDDEN}, age // 10").fetchall())
    with sqlsdc.connect(shown, user="analyst") as con:
        assert len(con.execute(f"{SHOWN}, age // 10").fetchall()) == n
    assert _used(hidden) == _used(shown)  # old: 244 against 341


def test_a_limit_refuses_values_it_cannot_hold(template, tmp_path):
    """Under a limit of 20 cells, one statement released the count of every municipality in
    the order of their names, charged 1 cell (none published as 0); now refused."""
    db = _fresh(template, tmp_path, "limit", 20)
    sql = "SELECT COUNT(*) FROM persons GROUP BY municipality ORDER BY municipality"
    with sqlsdc.connect(db, user="analyst") as con, pytest.raises(CellLimitReached):
        con.execute(sql).fetchall()  # old: 182 counts

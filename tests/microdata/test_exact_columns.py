"""Which columns of an anonymised file are exact, and their SQL form for the differencing check."""

from __future__ import annotations

import duckdb
import numpy as np
import pandas as pd
from sqlglot import exp

from sqlsdc.jobs.record_files import _coarsened
from sqlsdc.microdata.negligible import perturbed_columns
from sqlsdc.microdata.perturb import recode, top_code
from sqlsdc.microdata.steps import exact_columns, parse_step

COLUMNS = ["region", "municipality", "sex", "age", "education", "occupation", "income"]


def test_perturbative_steps_take_a_column_out_and_coarsening_steps_are_kept_in_order():
    steps = [
        parse_step(s)
        for s in (
            "recode:age:breaks=65/75/85",
            "suppress:municipality,sex,age:k=3",
            "topcode:income:upper=200000",
            "pram:occupation:p=0.8",
            "swap:region:household=household_id",
            "shuffle:income:given=age",  # changes income, not age
        )
    ]
    found = {c: [s.method for s in r] for c, r in exact_columns(steps, COLUMNS).items()}
    assert found == {
        "municipality": ["suppress"],
        "sex": ["suppress"],
        "age": ["recode", "suppress"],
        "education": [],
    }


def test_a_coarsening_after_a_perturbation_leaves_the_column_perturbed():
    steps = [parse_step("noise:income:c=0.1"), parse_step("topcode:income:upper=1e6")]
    assert "income" not in exact_columns(steps, COLUMNS)


def test_the_sql_bands_and_clips_are_the_steps_own_values():
    """The check cuts cells by the SQL form of the steps: it must give the labels and values
    the steps give the records (edges, below the first break, missing values)."""
    values = pd.Series([np.nan, 0, 64, 64.5, 65, 74.99, 75, 85, 89, 90, 110], dtype=float)
    con = duckdb.connect()
    con.register("t", pd.DataFrame({"age": values}))
    for text, expected in (
        ("recode:age:breaks=65/75/85/90", recode(values, [65, 75, 85, 90])),
        ("topcode:age:upper=85,lower=1", top_code(values, upper=85, lower=1)),
    ):
        sql = _coarsened(exp.column("age"), [parse_step(text)]).sql("duckdb")
        got = [r[0] for r in con.execute(f"SELECT {sql} FROM t").fetchall()]
        assert [None if pd.isna(v) else v for v in expected] == got, text


def test_a_step_that_changed_too_few_records_leaves_its_columns_exact():
    """A cell of 10 units left as it was with probability 1/2 or more under PRAM (0.9 under a
    targeted swap): the column is exact (:mod:`sqlsdc.microdata.negligible`); a missing count
    keeps it perturbed."""
    pram = {
        "sex": {"changed": 2, "values": 20_000},
        "municipality": {"changed": 2_000, "values": 20_000},
        "occupation": {"changed": 0},
        "education": {"changed": 5},
    }
    columns = ("sex", "municipality", "occupation", "education")
    assert perturbed_columns("pram", columns, pram) == ("municipality", "education")
    # a log without values: the file's records (at least as many) are the denominator
    assert perturbed_columns("pram", columns, pram, 20_000) == ("municipality",)
    assert perturbed_columns("pram", ("sex",), {"sex": {"changed": 1339, "values": 20_000}}) == ()
    assert perturbed_columns("pram", ("sex",), {"sex": {"changed": 1340, "values": 20_000}}) == (
        "sex",
    )
    swap = {"households": 8655, "swapped_households": 2}
    assert perturbed_columns("swap", ("region", "municipality"), swap) == ()
    swap = {"households": 8655, "swapped_households": 1200}
    assert perturbed_columns("swap", ("region",), swap) == ("region",)
    assert perturbed_columns("swap", ("region",), {}) == ("region",)
    assert perturbed_columns("noise", ("income",), {"c": 1e-9}) == ("income",)

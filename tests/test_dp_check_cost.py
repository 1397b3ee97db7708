"""What the check of a new DP statement text no longer computes, with the same outcome: the
types of the rewrite's casts parsed once per name (``rewrite.sql.data_type``), the
aggregation's SQL printed only for a refusal of its stage, and the plan of an aggregate's
noise computed once per (aggregate, bounding, spend). Timings in benchmarks/README.md,
"DP fixed cost of a new text, session 42"."""

from __future__ import annotations

import sys
from fractions import Fraction

import pytest
from sqlglot import exp
from test_dp_query import dp_document, make_db

import sqlsdc
from sqlsdc.errors import PolicyViolation
from sqlsdc.mechanisms import accountant
from sqlsdc.mechanisms.accountant import Aggregate, Bounding, PrivacyCost, plan_aggregate
from sqlsdc.rewrite import dp as rewrite_dp


@pytest.fixture(scope="module")
def dp_db(tmp_path_factory):
    path = tmp_path_factory.mktemp("dp_check_cost") / "dp.duckdb"
    make_db(path, dp_document())
    return path


def _rewrite_frames() -> bool:
    """Whether a module of ``sqlsdc/rewrite`` is on the stack."""
    frame = sys._getframe(1)
    while frame is not None:
        if "sqlsdc/rewrite/" in frame.f_code.co_filename.replace("\\", "/"):
            return True
        frame = frame.f_back
    return False


def test_the_rewrite_of_a_dp_count_parses_no_type_name(dp_db, monkeypatch):
    """The status and accuracy columns of a DP count are NULLs cast to VARCHAR and DOUBLE;
    sqlglot parsed each type name at each cast (60-100 µs, five per position): 0.3 ms of
    every new text's check. The rewrite now copies types parsed once per process."""
    parsed_in_rewrite = []
    original = exp.DataType.from_str

    def from_str(cls, *args, **kwargs):
        if _rewrite_frames():
            parsed_in_rewrite.append(args[0])
        return original(*args, **kwargs)

    monkeypatch.setattr(exp.DataType, "from_str", classmethod(from_str))
    with sqlsdc.connect(dp_db, "ana") as con:
        con.explain("SELECT region, COUNT(*) FROM persons WHERE age <> 16 GROUP BY region")
        parsed_in_rewrite.clear()  # each name's first parse, kept from then on
        query = con.explain("SELECT region, COUNT(*) FROM persons WHERE age <> 17 GROUP BY region")
    assert "CAST(NULL AS DOUBLE) AS __sdc_sd_0" in query.sql
    assert "CAST(NULL AS TEXT) AS __sdc_status_0" in query.sql
    assert parsed_in_rewrite == []


def test_a_type_name_is_parsed_once_and_handed_out_as_copies():
    from sqlsdc.rewrite.sql import cast, data_type

    first, second = data_type("DOUBLE"), data_type("DOUBLE")
    assert first == exp.DataType.build("DOUBLE") and first is not second
    first.set("this", exp.DataType.Type.BIGINT)  # a copy changed changes no later one
    assert data_type("DOUBLE") == exp.DataType.build("DOUBLE")
    assert data_type("INTEGER[]", "duckdb") == exp.DataType.build("INTEGER[]", dialect="duckdb")
    value = exp.column("x")
    assert cast(value, "BIGINT") == exp.cast(value, "BIGINT")
    assert cast(value, "BIGINT").this is not value  # the value is copied, as exp.cast does


def test_a_dp_check_prints_the_aggregation_only_to_refuse_it(dp_db, monkeypatch):
    """The stage's exact cells printed the analyst's aggregation (0.2-0.3 ms) for the message
    of a refusal that almost never comes; a refusal there still names it."""
    printed = []
    original = exp.Select.sql

    def sql(self, *args, **kwargs):
        printed.append(1)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(exp.Select, "sql", sql)
    with sqlsdc.connect(dp_db, "ana") as con:
        con.explain("SELECT region, COUNT(*) FROM persons WHERE age <> 18 GROUP BY region")
    assert printed == []


def test_a_refusal_of_a_dp_stage_names_its_aggregation(dp_db, monkeypatch):
    def refused(tree, sql):
        raise PolicyViolation("refused in the stage", "", sql)

    monkeypatch.setattr(rewrite_dp, "analyst_scopes_in_order", refused)
    with sqlsdc.connect(dp_db, "ana") as con:
        with pytest.raises(PolicyViolation, match="refused in the stage") as e:
            con.explain("SELECT region, COUNT(*) FROM persons WHERE age > 3 GROUP BY region")
    assert e.value.sql == (
        "SELECT persons.region AS region, COUNT(*) AS _col_1 FROM persons AS persons "
        "WHERE persons.age > 3 GROUP BY persons.region"
    )


def test_an_aggregate_s_plan_is_computed_once_per_value():
    """Equal bounding, spend and alpha give the same (immutable) plan object: computing it
    (exact shares, the noise's variance and interval) took 0.2-0.25 ms of every DP check."""
    bounding = Bounding(max_groups=2, max_rows=3, lower=0, upper=100)
    again = Bounding(max_groups=2, max_rows=3, lower=Fraction(0), upper=Fraction(100))
    cost = PrivacyCost(epsilon=Fraction(1, 2))
    plan = plan_aggregate(Aggregate.AVG, bounding, cost)
    assert plan_aggregate("avg", again, PrivacyCost(epsilon="1/2")) is plan
    assert plan == accountant._plan(Aggregate.AVG, bounding, cost, None, None)  # as computed
    median = plan_aggregate(Aggregate.QUANTILE, bounding, cost, alpha=Fraction(1, 2))
    assert plan_aggregate(Aggregate.QUANTILE, bounding, cost, alpha=Fraction(1, 2)) is median
    with pytest.raises(TypeError, match="alpha must be exact"):  # as before: no float
        plan_aggregate(Aggregate.QUANTILE, bounding, cost, alpha=0.5)
    weighted = plan_aggregate(Aggregate.AVG, bounding, cost, weights=(1, 1))
    assert weighted == plan and weighted is not plan  # weights: computed, not kept

"""The synthesis job on real demo databases: storage, audit, keyed reproducibility, the DP
budget (one charge, refusals that store nothing), margins from SQL, caps and refusals."""

from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pytest
from db_reads import protected_tables

from sqlsdc.catalog.budget import BudgetKey
from sqlsdc.catalog.budget_admin import set_limit
from sqlsdc.errors import AccessDenied, BudgetExhausted, MicrodataError, SynthesisError
from sqlsdc.mechanisms.accountant import BudgetLimit
from sqlsdc.synth import synthesize

DP = {"columns": ["sex", "education", "age"], "bins": {"age": [0, 15, 30, 45, 65, 111]}}


def _read(db, sql, params=None):
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(sql, params or []).df()
    finally:
        con.close()


def _budget(db, epsilon):
    con = duckdb.connect(str(db))
    try:
        limit = BudgetLimit(epsilon=Fraction(epsilon))
        set_limit(con, admin="admin", key=BudgetKey("*", "persons"), limit=limit, reason="tests")
    finally:
        con.close()


def _spends(db):
    return _read(db, "SELECT query_id, user_name, tables, epsilon FROM sqlsdc.budget_spend "
                     "WHERE list_contains(tables, 'persons') ORDER BY seq")  # fmt: skip


def _audit(db):
    return _read(db, "SELECT query_id, decision, reason FROM sqlsdc.audit ORDER BY query_id")


def test_parametric_job_stores_table_view_record_ledger_and_audit(fresh_demo_db):
    report = synthesize(fresh_demo_db, user="admin", source="persons", into="persons_syn",
                        method="parametric", seed=3)  # fmt: skip
    stored = _read(fresh_demo_db, "SELECT * FROM protected.persons_syn")
    view = _read(fresh_demo_db, "SELECT * FROM synthetic.persons_syn")
    assert len(stored) == len(view) == report.records == 20_000
    assert not {"person_id", "household_id", "__rkey"} & set(stored.columns)
    assert set(report.dropped) == {"person_id", "household_id", "__rkey"}
    record = _read(fresh_demo_db, "SELECT name, method, sql_text, report FROM sqlsdc.outputs")
    assert record["name"].tolist() == ["protected.persons_syn"]
    assert record["method"].tolist() == ["synthesize"]
    stored_report = json.loads(record["report"][0])
    assert stored_report["synthetic"] is True and stored_report["method"] == "parametric"
    assert stored_report["seed"] == 3 and stored_report["epsilon"] is None
    assert stored_report["copies"] == 1 and stored_report["source"] == "persons"
    assert record["sql_text"][0] == stored_report["source_sql"]
    assert stored_report["source_sql"].startswith("SELECT region, municipality, sex, age")
    ledger = _read(fresh_demo_db, "SELECT cell, column_name, mechanism FROM sqlsdc.ledger")
    assert sorted(ledger["column_name"]) == sorted(stored.columns)
    assert set(ledger["cell"]) == {"protected.persons_syn <- persons"}
    assert _audit(fresh_demo_db)["decision"].iloc[-1] == "accepted"
    assert _spends(fresh_demo_db).empty  # not DP: nothing charged


def test_same_seed_and_secret_same_data(fresh_demo_db):
    for into, seed in (("a", 5), ("b", 5), ("c", 6)):
        synthesize(fresh_demo_db, user="admin", source="persons", into=into,
                   method="parametric", seed=seed, columns=["region", "age", "income"])  # fmt: skip
    a, b, c = (_read(fresh_demo_db, f"SELECT * FROM protected.{t}") for t in "abc")
    assert a.equals(b) and not a.equals(c)
    con = duckdb.connect(str(fresh_demo_db))  # another database secret: other data
    con.execute("UPDATE sqlsdc.secrets SET material = ? WHERE name = 'prf'", [b"\x01" * 32])
    con.close()
    synthesize(fresh_demo_db, user="admin", source="persons", into="d", method="parametric",
               seed=5, columns=["region", "age", "income"])  # fmt: skip
    assert not a.equals(_read(fresh_demo_db, "SELECT * FROM protected.d"))


def test_dp_ipf_charges_once_and_reproduces(fresh_demo_db):
    _budget(fresh_demo_db, 3)
    first = synthesize(fresh_demo_db, user="admin", source="persons", into="dp1",
                       method="dp-ipf", epsilon="1", seed=1, **DP)  # fmt: skip
    spends = _spends(fresh_demo_db)
    assert len(spends) == 1 and spends["epsilon"][0] == "1"
    accepted = _audit(fresh_demo_db).iloc[-1]
    assert accepted["decision"] == "accepted" and spends["query_id"][0] == accepted["query_id"]
    assert first.epsilon == "1" and first.parameters["scale"] == "3"  # K·M/ε = 1·3/1
    assert first.details["ipf"]["converged"]
    synthesize(fresh_demo_db, user="admin", source="persons", into="dp2", method="dp-ipf",
               epsilon="1", seed=1, **DP)  # fmt: skip
    one, two = (_read(fresh_demo_db, f"SELECT * FROM protected.{t}") for t in ("dp1", "dp2"))
    assert one.equals(two)
    assert len(_spends(fresh_demo_db)) == 2  # each job pays
    truth = _read(fresh_demo_db, "SELECT education, count(*) AS n FROM persons GROUP BY ALL")
    synth = one.groupby("education").size()
    for level, n in zip(truth["education"], truth["n"], strict=True):
        assert abs(synth[level] - n) < 0.05 * len(one)  # margins kept within the noise
    assert set(one["age"].dropna()) <= {"[0-15)", "[15-30)", "[30-45)", "[45-65)", "[65-111)"}


def test_exhausted_budget_refuses_and_stores_nothing(fresh_demo_db):
    with pytest.raises(BudgetExhausted, match="no ε budget applies"):
        synthesize(fresh_demo_db, user="admin", source="persons", into="dp", method="dp-ipf",
                   epsilon="1", **DP)  # fmt: skip
    _budget(fresh_demo_db, "1/2")
    with pytest.raises(BudgetExhausted, match="only ε = 0.5 remains"):
        synthesize(fresh_demo_db, user="admin", source="persons", into="dp", method="dp-ipf",
                   epsilon="1", **DP)  # fmt: skip
    synthesize(fresh_demo_db, user="admin", source="persons", into="dp", method="dp-catall",
               epsilon="1/2", **DP)  # exactly the budget  # fmt: skip
    with pytest.raises(BudgetExhausted):
        synthesize(fresh_demo_db, user="admin", source="persons", into="dp2", method="dp-ipf",
                   epsilon="1/1000", **DP)  # fmt: skip
    assert protected_tables(fresh_demo_db) == ["dp"]
    audit = _audit(fresh_demo_db)["decision"].tolist()
    assert audit[-4:] == ["refused", "refused", "accepted", "refused"]
    assert len(_spends(fresh_demo_db)) == 1


def test_structural_zeros_strata_and_missing_level(fresh_demo_db):
    _budget(fresh_demo_db, 10)
    report = synthesize(
        fresh_demo_db, user="admin", source="persons", into="dpz", method="dp-ipf",
        epsilon="2", columns=["education", "age"], bins={"age": [0, 15, 30, 45, 65, 111]},
        zeros=[{"age": "[0-15)", "education": "tertiary"}], stratify="sex", missing=["education"],
    )  # fmt: skip
    out = _read(fresh_demo_db, "SELECT * FROM protected.dpz")
    assert list(out.columns) == ["education", "age", "sex"]
    assert out.loc[out["age"] == "[0-15)", "education"].ne("tertiary").all()
    assert [part["stratum"] for part in report.details["ipf"]] == [0, 1]
    assert report.parameters["margins"] == [["education", "age", "sex"]]
    assert set(out["sex"]) == {"F", "M"}
    assert report.parameters["levels"]["education"][-1] is None


def test_copies_and_rows(fresh_demo_db):
    synthesize(fresh_demo_db, user="admin", source="persons", into="two", method="parametric",
               copies=2, rows=100, columns=["sex", "income"])  # fmt: skip
    out = _read(fresh_demo_db, "SELECT * FROM protected.two")
    assert list(out.columns) == ["synthetic_copy", "sex", "income"]
    assert out.groupby("synthetic_copy").size().to_dict() == {1: 100, 2: 100}
    assert not np.array_equal(out["income"][:100], out["income"][100:])


@pytest.fixture(scope="module")
def budget_5_template(pristine_demo_db, tmp_path_factory, copy_database) -> Path:
    """The demo with a budget of epsilon 5 on persons for every user, built once (the 14
    refusals below each start from it)."""
    path = copy_database(pristine_demo_db, tmp_path_factory.mktemp("budget-5"))
    _budget(path, 5)
    return path


@pytest.fixture
def budget_5_db(budget_5_template, tmp_path, copy_database) -> Path:
    return copy_database(budget_5_template, tmp_path)


@pytest.mark.parametrize(
    ("changes", "error", "match"),
    [
        (
            {"columns": ["sex", "age"], "bins": {}},
            SynthesisError,
            "'age' has no public levels.*--bins age",
        ),
        ({"columns": ["sex", "region"]}, SynthesisError, "--levels region"),
        ({"columns": ["sex", "person_id"]}, SynthesisError, "identifier column"),
        ({"epsilon": None}, SynthesisError, "needs --epsilon"),
        ({"epsilon": "0"}, SynthesisError, "must be positive"),
        ({"max_cells": 10}, SynthesisError, "above the cap of 10"),
        ({"source": None, "sql": "SELECT sex FROM persons"}, SynthesisError, "--from TABLE"),
        ({"margins": [["sex", "nope"]]}, SynthesisError, "not variables"),
        ({"margins": [["sex", "age"]]}, SynthesisError, "not in any: \\['education'\\]"),
        ({"zeros": [{"sex": "X"}]}, SynthesisError, "not a level of sex"),
        ({"bins": {"age": [5]}}, SynthesisError, "two increasing breaks"),
        ({"user": "analyst"}, AccessDenied, "not an admin"),
        ({"into": "persons"}, MicrodataError, "name of a table of the policy"),
        ({"into": "bad name"}, MicrodataError, "plain name"),
    ],
)
def test_refusals_are_audited_and_leave_nothing(budget_5_db, changes, error, match):
    fresh_demo_db = budget_5_db
    arguments = {"user": "admin", "source": "persons", "into": "x", "method": "dp-ipf",
                 "epsilon": "1", **DP, **changes}  # fmt: skip
    with pytest.raises(error, match=match):
        synthesize(fresh_demo_db, **arguments)
    assert protected_tables(fresh_demo_db) == []
    assert _spends(fresh_demo_db).empty
    if error is not AccessDenied:
        assert _audit(fresh_demo_db)["decision"].iloc[-1] == "refused"


def test_non_dp_refusals(fresh_demo_db):
    with pytest.raises(SynthesisError, match="not differentially private"):
        synthesize(fresh_demo_db, user="admin", source="persons", into="x",
                   method="parametric", epsilon="1")  # fmt: skip
    with pytest.raises(SynthesisError, match="unknown method"):
        synthesize(fresh_demo_db, user="admin", source="persons", into="x", method="gan")
    with pytest.raises(SynthesisError, match="never synthesised"):
        synthesize(fresh_demo_db, user="admin", source="persons", into="x",
                   method="parametric", columns=["sex", "person_id"])  # fmt: skip
    with pytest.raises(MicrodataError, match="policy's tables only"):
        synthesize(fresh_demo_db, user="admin", sql="SELECT * FROM sqlsdc.secrets", into="x",
                   method="parametric")  # fmt: skip
    synthesize(fresh_demo_db, user="admin", into="q", method="parametric",
               sql="SELECT region, income FROM persons WHERE age > 60", rows=1000)  # fmt: skip
    q = _read(fresh_demo_db, "SELECT report FROM sqlsdc.outputs")
    assert json.loads(q["report"][0])["source_sql"].endswith("WHERE age > 60")
    with pytest.raises(MicrodataError, match="exists; pass --replace"):
        synthesize(fresh_demo_db, user="admin", source="persons", into="q", method="parametric")


def test_cart_says_each_variable_as_it_starts(fresh_demo_db):
    """`sqlsdc synthesize --method cart` said "fitting cart to 1000000 records" and then
    nothing for minutes on the default demo; it now says each variable as it starts, with the
    copy when there are several (new user s47f)."""
    said: list[str] = []
    synthesize(fresh_demo_db, user="admin", source="persons", into="syn", method="cart",
               copies=2, rows=100, columns=["sex", "age", "income"],
               progress=said.append)  # fmt: skip
    steps = [s for s in said if "cart:" in s]
    variables = ["sex", "age", "income"]
    assert steps == [f"copy {c} of 2: cart: {v} ({i} of 3)"
                     for c in (1, 2) for i, v in enumerate(variables, 1)]  # fmt: skip
    assert said.index(steps[0]) > next(i for i, s in enumerate(said) if s.startswith("fitting"))
    out = _read(fresh_demo_db, "SELECT * FROM protected.syn")
    assert out.groupby("synthetic_copy").size().to_dict() == {1: 100, 2: 100}

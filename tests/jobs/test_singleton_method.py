"""The singleton method of secondary suppression, the admin's choice (s44p, red team s44o 2.).

GaussSuppression's ``singletonMethod`` (SSBtools): the policy's ``suppression: singleton`` for
the query path, ``sqlsdc protect --singleton`` / ``protect_query(singleton=)`` for jobs, recorded
in the job's report so that a revision (``--replace``) is protected the same way.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import yaml
from scipy.optimize import linprog
from sqlsdc.cli.protect import protect as protect_command

from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import PolicyError, TabularError
from sqlsdc.jobs.protect import protect_query
from sqlsdc.policy import load_policy
from sqlsdc.policy.validate import policy_schema
from sqlsdc.tabular.api import protect
from sqlsdc.tabular.gauss import SINGLETON_METHODS
from sqlsdc.tabular.rules import parse_rule
from sqlsdc.tabular.universe import COUNT, VALUE, Universe, universe_of
from sqlsdc.tabular.universe_pattern import protect_universe

EXAMPLE = Path(__file__).resolve().parents[2] / "schemas" / "examples" / "suppress.yaml"
OLD = "SELECT region, education, COUNT(*) FROM persons WHERE age >= 80 GROUP BY region, education"


def _policy(singleton=None):
    doc = yaml.safe_load(EXAMPLE.read_text())
    if singleton is not None:
        doc["tables"]["enterprises"]["suppression"]["singleton"] = singleton
    return load_policy(doc, name="singleton")


def test_the_policy_names_the_singleton_method_and_refuses_others():
    assert universe_of(_policy(), "enterprises").singleton == "anySumAudit"  # s46f
    assert universe_of(_policy("anySum"), "enterprises").singleton == "anySum"
    assert universe_of(_policy("subSpace"), "enterprises").singleton == "subSpace"
    for wrong in ("subspace", "sub2Sum", 3):
        with pytest.raises(PolicyError, match=r"suppression\.singleton: .* is not one of: anySum"):
            _policy(wrong)


def test_the_singleton_method_is_part_of_the_patterns_fingerprint_but_for_anysum():
    """``anySum``, the default until s46f, keeps the settings (so the fingerprints) of patterns
    stored before s44p; any other method, the default ``anySumAudit`` too, changes them: the
    guard protects the table again, keeping what it released (tabular/universe.py)."""
    before = universe_of(_policy("anySum"), "enterprises").settings()
    assert "singleton" not in before
    default = universe_of(_policy(), "enterprises").settings()
    assert default == {**before, "singleton": "anySumAudit"}
    chosen = universe_of(_policy("subSpace"), "enterprises").settings()
    assert chosen == {**before, "singleton": "subSpace"}


def _recorded(db, name):
    con = open_database(db)
    try:
        return json.loads(
            con.execute("SELECT report FROM sqlsdc.outputs WHERE name = ?", [name]).fetchone()[0]
        )["singleton"]
    finally:
        con.close()


def test_a_revision_keeps_the_jobs_singleton_method(jobs_demo_db):
    db = jobs_demo_db
    """Fails before s44p (no ``singleton`` parameter): the first version's method is recorded,
    and ``--replace`` without a method reuses it; a new output starts from the default,
    anySumAudit since s46f."""
    first = protect_query(db, "admin", OLD, into="old", rules=[parse_rule("freq:3")],
                          singleton="subSpace", time_limit=10)  # fmt: skip
    assert first.singleton == "subSpace" and _recorded(db, "protected.old") == "subSpace"
    again = protect_query(db, "admin", OLD, into="old", rules=[parse_rule("freq:3")],
                          replace=True, time_limit=10)  # fmt: skip
    assert again.singleton == "subSpace" and _recorded(db, "protected.old") == "subSpace"
    other = protect_query(db, "admin", OLD.replace("region, education", "education"),
                          into="other", rules=[parse_rule("freq:3")], time_limit=10)  # fmt: skip
    assert other.singleton == "anySumAudit"
    with pytest.raises(TabularError, match="unknown singleton_method 'subspace'"):
        protect_query(db, "admin", OLD, into="bad", singleton="subspace")


def test_the_cli_option(jobs_demo_db, sqlsdc_in_process):
    db = jobs_demo_db
    base = ["protect", db, "--sql", OLD, "--rule", "freq:3", "--format", "json"]
    done = sqlsdc_in_process(*base, "--into", "old", "--singleton", "subSpace")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["singleton"] == "subSpace"
    wrong = sqlsdc_in_process(*base, "--into", "x", "--singleton", "subspace")
    assert wrong.returncode == 2 and "'subspace' is not one of" in wrong.stderr
    elsewhere = sqlsdc_in_process("protect", db, "--sql", OLD, "--method", "round", "--base",
                                  "5", "--into", "r", "--singleton", "subSpace")  # fmt: skip
    assert elsewhere.returncode == 2
    assert "--singleton belongs to --method suppress, not round" in elsewhere.stderr


COUNTS = [[3, 1, 1, 0], [0, 0, 1, 8], [5, 12, 3, 3], [12, 5, 5, 3]]  # red team s44o's 4 x 4


def _universe(singleton: str):
    return Universe(
        table="persons",
        unit="person_id",
        groups=(("r", ("r",)), ("c", ("c",))),
        measures=(),
        counts=SimpleNamespace(rules=["freq:3"], min_frequency=3),
        magnitudes=None,
        secondary="gauss",
        cost="value",
        time_limit=10.0,
        singleton=singleton,
    )


def _r1c2_given_r0c1(pattern) -> tuple[float, float]:
    """What the respondent of r0c1 (one person) knows of r1c2 (one person) from the pattern's
    published counts: the LP interval with r0c1 fixed at 1."""
    leaves = [(f"r{i}", f"c{j}") for i in range(4) for j in range(4) if COUNTS[i][j]]
    shown = pattern[pattern[f"{COUNT}{VALUE}"].notna()]
    cover = np.array([[(pd.isna(p.r) or p.r == a) and (pd.isna(p.c) or p.c == b)
                       for a, b in leaves] for p in shown.itertuples()], float)  # fmt: skip
    values = shown[f"{COUNT}{VALUE}"].to_numpy(float)
    bounds = [(1.0, 1.0) if leaf == ("r0", "c1") else (0.0, None) for leaf in leaves]
    target = np.array([float(leaf == ("r1", "c2")) for leaf in leaves])
    lo = linprog(target, A_eq=cover, b_eq=values, bounds=bounds, method="highs")
    hi = linprog(-target, A_eq=cover, b_eq=values, bounds=bounds, method="highs")
    assert lo.status == hi.status == 0
    return lo.fun, -hi.fun


def test_the_query_paths_pattern_follows_the_policys_singleton_method():
    """The live pattern of a universe whose policy says ``subSpace``, or the default
    ``anySumAudit``, leaves r1c2 an interval to the respondent of r0c1; under ``anySum`` it is
    computed exactly (s44o 2.)."""
    cells = pd.DataFrame([{"r": f"r{i}", "c": f"c{j}", "__units": k, "__spread": 1}
                          for i, row in enumerate(COUNTS)
                          for j, k in enumerate(row) if k])  # fmt: skip
    lo, hi = _r1c2_given_r0c1(protect_universe(_universe("anySum"), cells)[0])
    assert hi - lo < 1e-6  # anySum's residual risk, as README says
    for chosen in ("subSpace", "anySumAudit"):
        lo, hi = _r1c2_given_r0c1(protect_universe(_universe(chosen), cells)[0])
        assert hi - lo > 0.5, (chosen, lo, hi)


def test_the_policy_the_cli_and_gauss_name_the_same_methods():
    suppression = policy_schema()["$defs"]["table"]["properties"]["suppression"]
    assert tuple(suppression["properties"]["singleton"]["enum"]) == SINGLETON_METHODS
    option = next(p for p in protect_command.params if p.name == "singleton")
    assert tuple(option.type.choices) == SINGLETON_METHODS


@pytest.mark.parametrize("method", ["gauss", "optimal", "hitas"])
def test_protect_refuses_an_unknown_singleton_method_with_every_secondary_method(method):
    """Before the walk: optimal and HiTaS run GaussSuppression only when a table has
    singletons, so a misspelt method would have passed unseen on tables without."""
    frame = pd.DataFrame({"r": list("aabb"), "c": list("xyxy")})
    with pytest.raises(TabularError, match="unknown singleton_method 'subspace'; use one of"):
        protect(frame, ["r", "c"], None, method=method, singleton_method="subspace")
    with pytest.raises(TabularError, match="'sub2Sum' is not implemented"):
        protect(frame, ["r", "c"], None, method=method, singleton_method="sub2Sum")

"""Red team s35: an analyst's guarded connection against differential privacy.

What broke (fixed here):

- Noisy verification (``con.verify(..., mode="noisy")``, the DP verification server of
  synthetic outputs) ran the analyst's WHERE and inputs on every confidential row, and an
  engine error there failed the request: ``income * k > age`` overflows BIGINT exactly when
  some income reaches 2^63 / k, ``code = 7`` fails for a code that is not a number. The error
  is an exact answer whatever the noise, the charge is a few 10^-9 of epsilon (the analyst's
  own epsilon, rounded to the 10^-9 grid), and failed requests are not counted against the
  per-output limit: bisection read the largest income of the source to the unit in 40
  requests. Each analyst expression is now evaluated under ``TRY`` (a row that would raise
  reads as NULL, on the synthetic and the confidential side alike).
- DP exact cells cast each clamped measure to BIGINT grid units; bounds to 1e15 and a
  granularity to 1e-6 (both allowed) give 1e21 units, and the cast failed exactly for the
  cells holding a value beyond 2^63 units: an existence oracle behind the noise. Such grids
  are refused from the policy alone (sums of squares: beyond 2^40 units).
- Bounding kept a person's groups of smallest hash(record key, key) up to the max_groups-th
  smallest hash: ties were all kept. DuckDB's string hash is no PRF (a multiply-xor over
  8-byte words): three strings of one hash are solved for in seconds, and with private
  groups the analyst writes the keys (CASE WHEN clinic = 'a' THEN s1 ...): a person counted
  in three groups under max_groups 2, every calibration and the selection's delta off.
  Groups are now ranked by hash then key (exactly max_groups kept), and rows of one hash by
  their values (the unit row cap, quantile rows).
- A DP aggregation whose aggregate argument or group key held a subquery of protected cells
  (``COUNT(CASE WHEN x > (SELECT AVG(x) FROM t) THEN 1 END)``) reached the engine check as
  "a bug in sqlsdc" (InternalError, undeclared relation); it is refused like the same
  subquery in WHERE.
- The bounding report was drawn and charged for queries that never show it (groups alone,
  VAR, STDDEV and quantiles: cell_accuracy lists COUNT, SUM and AVG only); over-charging,
  not a leak, fixed: such queries build no report.

What held (pinned below, briefly): one cell identity never covers two exact values over
spellings of populations, keys, AVG/VAR/STDDEV next to their own SUM and COUNT, the unit row
cap and the bounding report (also over ~2,000 generated queries, 40,000 cells, outside the
suite); centred AVG/VAR components are scaled to their centred bounds (and, measured outside
the suite, every statistic's residual, the report's included, has the calibrated sd within
±20%); private selection's delta is charged once per population.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent.parent))
from test_dp_query import dp_document, make_db, pin_noise  # noqa: E402

import sqlsdc  # noqa: E402
from sqlsdc.admin import apply  # noqa: E402
from sqlsdc.catalog import store  # noqa: E402
from sqlsdc.engines.duckdb import open_database  # noqa: E402
from sqlsdc.errors import InternalError, PolicyViolation  # noqa: E402
from sqlsdc.guard.dp_cell_keys import _mechanisms, _space  # noqa: E402
from sqlsdc.mechanisms.accountant import Statistic  # noqa: E402
from sqlsdc.mechanisms.dp_cells import cell_digests, cell_identity  # noqa: E402
from sqlsdc.policy import load_policy  # noqa: E402

# --- noisy verification: an error oracle on the confidential records -----------------------

TARGET_INCOME = 912_345  # the largest income of the source, one person's
SOURCE = "SELECT region, age, code, income FROM persons"
INT64_MAX = 2**63 - 1


@pytest.fixture(scope="module")
def verify_db(tmp_path_factory) -> Path:
    """Persons with a BIGINT income and a text code, DP-protected, and a released synthetic
    output of them (a bootstrap with incomes scaled down: the synthetic side never reaches
    the largest confidential income, and its codes are all numbers)."""
    path = tmp_path_factory.mktemp("s35_verify") / "db.duckdb"
    rng = np.random.default_rng(1)
    n = 3000
    persons = pd.DataFrame({
        "pid": np.arange(n),
        "region": rng.choice(["a", "b"], n),
        "age": rng.integers(18, 90, n).astype("int32"),
        "code": rng.integers(100, 999, n).astype(str),
        "income": rng.gamma(2, 20000, n).astype("int64"),
    })  # fmt: skip
    persons.loc[17, "income"] = TARGET_INCOME
    persons.loc[17, "code"] = "X17"  # one person's code is not a number
    con = duckdb.connect(str(path))
    con.register("frame", persons)
    con.execute("CREATE TABLE persons AS SELECT * FROM frame")
    con.close()
    columns = {"pid": {"role": "identifier"}, "region": {"role": "dimension", "domain": ["a", "b"]},
               "age": {"role": "dimension"}, "code": {"role": "dimension"},
               "income": {"role": "measure", "bounds": [0, 1000000]}}  # fmt: skip
    dp = {"method": "dp", "spend": {"epsilon": 1}}
    sqlsdc.init(path, {
        "tables": {"persons": {"privacy_unit": "pid", "columns": columns,
                               "protection": {"counts": dp, "magnitudes": dp}}},
        "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}},
        "budgets": [{"user": "*", "epsilon": 1}],
    })  # fmt: skip
    con = open_database(path)
    try:
        data = con.execute(SOURCE).df()
        synthetic = data.sample(len(data), replace=True, random_state=3).reset_index(drop=True)
        synthetic["income"] = (synthetic["income"] * 0.7).round().astype("int64")
        synthetic["code"] = rng.integers(100, 999, n).astype(str)
        con.register("frame", synthetic)
        con.execute("CREATE SCHEMA IF NOT EXISTS protected")
        con.execute("CREATE TABLE protected.syn AS SELECT * FROM frame")
        version, document = store.current_policy(con)[:2]
        report = json.dumps({"synthetic": True, "source_sql": SOURCE, "copies": 1})
        store.record_output(con, "protected.syn", "synthesize", SOURCE, "admin", version, report)
    finally:
        con.close()
    apply(path, load_policy({**document, "releases": ["syn"]}, name="s35"), "admin")
    return path


def _answered(path: Path, sql: str) -> bool:
    """Whether a noisy verification of ``sql`` is answered (True) or fails (False)."""
    with sqlsdc.connect(path, "ana") as con:
        try:
            con.verify(sql, mode="noisy", epsilon="1e-6")
        except sqlsdc.Error:
            return False
    return True


def _at_least(t: int) -> str:
    """A request whose WHERE overflows BIGINT exactly on rows with income >= t: with
    k = (2^63 - 1) // (t - 1), (t - 1) k fits and t k does not. ``> age`` keeps DuckDB from
    moving the constant to the other side (``income * k > 0`` is ``income > 0`` to it)."""
    return f"SELECT COUNT(*) FROM syn WHERE income * {INT64_MAX // (t - 1)} > age"


def test_verification_fails_alike_on_either_side_of_a_confidential_income(verify_db):
    """Before the fix, the first request failed (some income >= 912,345) and the second was
    answered (none >= 912,346): one bit about one person per request, exact, for 10^-9 of
    epsilon, and bisection from 1 to 2^40 read the income in 40 requests."""
    assert _answered(verify_db, _at_least(TARGET_INCOME))
    assert _answered(verify_db, _at_least(TARGET_INCOME + 1))


def test_verification_fails_alike_whether_a_confidential_code_is_a_number(verify_db):
    """``code = 7`` casts every code to an integer: before the fix it failed on the
    confidential side only (one person's code is 'X17'), after a charge, telling that some
    code is not a number; ``code = '7'`` compares text and never failed. Since s42b (TRY let
    ``code = 7 OR code = 8`` fail all the same) a comparison that casts a text column is
    refused from the columns' types, before anything runs or is charged."""
    with sqlsdc.connect(verify_db, "ana") as con:
        spent = con.remaining_budget()[0].spent
        with pytest.raises(PolicyViolation, match="could raise an error"):
            con.verify("SELECT COUNT(*) FROM syn WHERE code = 7", mode="noisy", epsilon="1e-6")
        assert con.remaining_budget()[0].spent == spent
    assert _answered(verify_db, "SELECT COUNT(*) FROM syn WHERE code = '7'")


def test_verification_still_counts_and_sums(verify_db):
    """TRY changes no answer that does not raise: a count of a text column (cast to DOUBLE
    before, which failed on every text) counts its values."""
    with sqlsdc.connect(verify_db, "ana") as con:
        answer = con.verify("SELECT region, COUNT(code), SUM(income) FROM syn GROUP BY region",
                            mode="noisy", epsilon="1/100")  # fmt: skip
    assert len(answer.cells) == 4
    assert all(c["status"] == "released" and 0 <= c["fm_noisy"] <= 1 for c in answer.cells)


# --- DP aggregations over protected cells -----------------------------------------------------


@pytest.fixture(scope="module")
def dp_db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("s35_dp") / "dp.duckdb"
    make_db(path, dp_document())
    pin_noise(path, b"red team s35, fixed secret......")
    return path


def _spent(path: Path, user: str = "ana"):
    with sqlsdc.connect(path, user) as con:
        return con.remaining_budget()[0].spent


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT clinic, COUNT(CASE WHEN cost > (SELECT AVG(cost) FROM visits) THEN 1 END) "
        "FROM visits GROUP BY clinic",
        "SELECT region, COUNT(CASE WHEN (SELECT COUNT(*) FROM visits) > 5 THEN 1 END) "
        "FROM persons GROUP BY region",
        "SELECT clinic, (SELECT COUNT(*) FROM persons) > 5 AS big, COUNT(*) FROM visits "
        "GROUP BY 1, 2",
    ],
    ids=["argument", "argument-other-table", "private-key"],
)
def test_protected_cells_inside_a_dp_aggregation_are_refused_not_a_bug(dp_db, sql):
    before = _spent(dp_db)
    with sqlsdc.connect(dp_db, "ana") as con:
        with pytest.raises(PolicyViolation, match="cannot read the results of another") as e:
            con.execute(sql)
    assert not isinstance(e.value, InternalError)
    assert _spent(dp_db) == before


def test_a_grid_beyond_exact_integers_is_refused_before_any_charge(tmp_path):
    """The policy allows bounds to 1e15 and granularities to 1e-6: 1e21 grid units. The
    exact cells cast each clamped value to BIGINT, which failed for values beyond 2^63 grid
    units (9.2e12 here): SUM(turnover) WHERE age >= 30 failed and WHERE age < 30 was answered,
    an exact existence oracle for one enterprise of turnover 2.5e13, behind epsilon 1. Such a
    grid is now refused from the policy alone; a sum of squares needs a finer limit (2^40)."""
    path = tmp_path / "big.duckdb"
    rng = np.random.default_rng(1)
    frame = pd.DataFrame({"pid": np.arange(300), "age": rng.integers(18, 90, 300),
                          "turnover": rng.gamma(2, 1e6, 300)})  # fmt: skip
    frame.loc[17, ["age", "turnover"]] = [50, 2.5e13]
    con = duckdb.connect(str(path))
    con.register("frame", frame)
    con.execute("CREATE TABLE ent AS SELECT * FROM frame")
    con.close()
    dp = {"method": "dp", "spend": {"epsilon": 1}}
    columns = {"pid": {"role": "identifier"}, "age": {"role": "dimension"},
               "turnover": {"role": "measure", "bounds": [0, 1e15]}}  # fmt: skip
    sqlsdc.init(path, {
        "tables": {"ent": {"privacy_unit": "pid", "columns": columns, "dp": {"granularity": "1e-6"},
                           "protection": {"counts": dp, "magnitudes": dp}}},
        "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}},
        "budgets": [{"user": "*", "epsilon": 100}],
    })  # fmt: skip
    with sqlsdc.connect(path, "ana") as con:
        for where in ("age >= 30", "age < 30"):
            with pytest.raises(PolicyViolation, match="more than exact integer arithmetic"):
                con.execute(f"SELECT SUM(turnover) FROM ent WHERE {where}")
        assert con.remaining_budget()[0].spent.epsilon == 0
        assert con.execute("SELECT COUNT(*) FROM ent WHERE age >= 30").fetchall()


COLLIDING = ("EbfpXv6DhL2zvEae", "GMEGbs6lNJG3CaJz", "Fb6hQGuE1GLcHxVp")
"""Three strings of one DuckDB hash: the string hash is a multiply-xor over 8-byte words, so
for any first words the second can be solved for (here among letters and digits, in seconds);
with one hash they hash alike combined with any record key."""


def test_colliding_group_keys_do_not_let_a_unit_exceed_max_groups(dp_db):
    """visits keeps at most max_groups = 2 private groups per person, chosen by the smallest
    hash(record key, key). With the three clinics mapped to three strings of one hash, every
    hash tied and the cut (hash <= the 2nd smallest) kept all three groups of a person who
    visited all three clinics: the units over all groups summed 6,382 against the bound's
    5,374, one person moved three cells, and every DP statistic and the private selection's
    (epsilon, delta) were calibrated for two. Ranked by hash then key, exactly two are kept."""
    raw = duckdb.connect()
    assert len({raw.execute("SELECT hash(?::VARCHAR)", [s]).fetchone()[0] for s in COLLIDING}) == 1
    raw.close()
    a, b, c = COLLIDING
    sql = (
        f"SELECT CASE WHEN clinic = 'a' THEN '{a}' WHEN clinic = 'b' THEN '{b}' ELSE '{c}' END "
        "AS g, COUNT(DISTINCT pid) FROM visits WHERE clinic <> 'rare' GROUP BY 1"
    )
    with sqlsdc.connect(dp_db, "admin") as con:
        con.set_dp_noise(False)
        units = sum(n for _g, n in con.execute(sql).fetchall())
    raw = open_database(dp_db)
    try:
        (bound,) = raw.execute(
            "SELECT SUM(LEAST(k, 2)) FROM (SELECT pid, COUNT(DISTINCT clinic) AS k FROM visits "
            "WHERE clinic <> 'rare' GROUP BY pid)"
        ).fetchone()
    finally:
        raw.close()
    assert units == bound


@pytest.fixture(scope="module")
def report_db(tmp_path_factory) -> Path:
    document = dp_document()
    document["tables"]["visits"]["dp"]["bounding_report"] = {"epsilon": "1/2"}
    path = tmp_path_factory.mktemp("s35_report") / "dp.duckdb"
    make_db(path, document)
    pin_noise(path, b"red team s35, fixed secret......")
    return path


@pytest.mark.parametrize(
    ("sql", "report"),
    [
        ("SELECT clinic FROM visits WHERE cost > 20 GROUP BY clinic", False),
        ("SELECT clinic, VAR_SAMP(cost) FROM visits WHERE cost > 21 GROUP BY clinic", False),
        ("SELECT clinic, STDDEV(cost) FROM visits WHERE cost > 22 GROUP BY clinic", False),
        ("SELECT clinic, AVG(cost) FROM visits WHERE cost > 23 GROUP BY clinic", True),
    ],
)
def test_the_bounding_report_is_charged_only_where_it_is_shown(report_db, sql, report):
    """visits' selection costs epsilon 1, its counts and magnitudes rho, its bounding report
    epsilon 1/2. The report's shares come with the intervals of COUNT, SUM and AVG; a query of
    groups alone, or of VAR or quantiles, paid the report's 1/2 and showed nothing of it."""
    with sqlsdc.connect(report_db, "ana") as con:
        before = con.remaining_budget()[0].spent.epsilon
        cur = con.execute(sql)
        cur.fetchall()
        paid = con.remaining_budget()[0].spent.epsilon - before
        accuracy = cur.cell_accuracy()
    assert paid == (Fraction(3, 2) if report else 1)
    assert report == (not accuracy.empty and accuracy["dropped"].notna().any())


# --- what held ---------------------------------------------------------------------------


SPELLINGS = [
    "SELECT clinic, COUNT(*), SUM(cost) FROM visits GROUP BY clinic",
    "SELECT v.clinic AS c, SUM(v.cost), COUNT(*) FROM visits AS v GROUP BY v.clinic",
    "SELECT clinic, AVG(cost), SUM(cost) FROM visits GROUP BY clinic",
    "SELECT clinic, AVG(cost) FROM visits GROUP BY clinic",
    "SELECT clinic, VAR_SAMP(cost), COUNT(cost) FROM visits GROUP BY clinic",
    "SELECT clinic, STDDEV_POP(cost) FROM (SELECT * FROM visits WHERE cost > 10) s GROUP BY clinic",
    "WITH s AS (SELECT * FROM visits WHERE NOT cost <= 10) SELECT clinic, VARIANCE(cost) "
    "FROM s GROUP BY clinic",
    "SELECT clinic, COUNT(*) FROM visits WHERE cost > 10 GROUP BY clinic",
    "SELECT clinic, COUNT(cost), COUNT(DISTINCT pid) FROM visits GROUP BY clinic",
    "SELECT clinic, 'k' AS k, COUNT(*) FROM visits GROUP BY 1, 2",
    "SELECT COUNT(*), AVG(cost) FROM visits WHERE clinic <> 'a'",
    "SELECT region, COUNT(*), AVG(income) FROM persons GROUP BY region",
    "SELECT region, SUM(income), AVG(income) FROM persons WHERE age >= 40 GROUP BY region",
    "SELECT p.region, VAR_POP(p.income) FROM persons p WHERE NOT p.age < 40 GROUP BY p.region",
]


def test_one_cell_identity_never_covers_two_exact_values(dp_db):
    """Every cell of every spelling, named as its noise is named (the stage's space and
    mechanism, the cell's keys), against its exact bounded value from the stage's own SQL:
    a name that came back over another value would give its exact difference."""
    with sqlsdc.connect(dp_db, "ana") as con:
        stages = [s for sql in SPELLINGS for s in con.explain(sql).dp_stages]
    seen: dict[str, int] = {}
    shared = 0
    raw = open_database(dp_db)
    try:
        for stage in stages:
            space = _space(stage, defaultdict(str))
            exact = raw.execute(stage.sql).to_arrow_table()
            keys = {f"__g{j}": exact.column(f"__g{j}").to_pylist() for j in range(len(stage.keys))}
            for column, mechanism in _mechanisms(stage).items():
                digests = (cell_digests(keys, space, {column: mechanism}) if keys
                           else [cell_identity(space, mechanism, {}).digest])  # fmt: skip
                for digest, value in zip(digests, exact.column(column).to_pylist(), strict=True):
                    value = int(value or 0)
                    shared += digest in seen
                    assert seen.setdefault(digest, value) == value
    finally:
        raw.close()
    assert shared > 20  # the spellings do share cells (AVG with its own SUM, aliases, ...)


def _scales(con, sql) -> dict:
    stage = con.explain(sql).dp_stages[0]
    return {(s.calibration.statistic, s.measure): s.calibration.scale for s in stage.statistics}


def test_avg_and_variance_components_are_calibrated_to_their_centred_bounds(dp_db):
    """persons (one row each, magnitudes at epsilon 1, income in [0, 100000] on the grid 10):
    a lone AVG(income) splits epsilon in two and centres on 50000, so its sum's scale is 5000
    grid units / (1/2) = 10000 and its count's 1 / (1/2) = 2; next to SUM(income) it reuses
    that sum (10000 / 1) and pays its count alone at the full epsilon; VAR_SAMP splits it in
    three over the centred values."""
    with sqlsdc.connect(dp_db, "ana") as con:
        alone = _scales(con, "SELECT region, AVG(income) FROM persons GROUP BY region")
        with_sum = _scales(con, "SELECT region, SUM(income), AVG(income) FROM persons "
                                "GROUP BY region")  # fmt: skip
        variance = _scales(con, "SELECT region, VAR_SAMP(income) FROM persons GROUP BY region")
    centred = '("persons"."income") - 50000'
    assert alone[(Statistic.SUM, centred)] == 10000
    assert alone[(Statistic.COUNT, centred)] == 2
    assert with_sum[(Statistic.SUM, '"persons"."income"')] == 10000
    assert with_sum[(Statistic.COUNT, '"persons"."income"')] == 1
    assert variance[(Statistic.SUM_SQUARES, centred)] == 5000**2 * 3
    assert variance[(Statistic.SUM, centred)] == 5000 * 3
    assert variance[(Statistic.COUNT, centred)] == 3


def test_private_selection_charges_its_delta_once_per_population(dp_db):
    """Group-only queries over private groups pay the selection (epsilon and delta) once;
    asking again, or the same groups with a count, reuses the decisions."""
    with sqlsdc.connect(dp_db, "bob") as con:
        first = con.remaining_budget()[0].spent
        groups = con.execute("SELECT clinic FROM visits WHERE cost > 50 GROUP BY clinic").fetchall()
        paid = con.remaining_budget()[0].spent
        again = con.execute("SELECT clinic FROM visits WHERE cost > 50 GROUP BY clinic").fetchall()
        counted = con.execute("SELECT clinic, COUNT(*) FROM visits WHERE cost > 50 "
                              "GROUP BY clinic").fetchall()  # fmt: skip
        last = con.remaining_budget()[0].spent
    assert groups == again and {c for c, _n in counted} == {c for (c,) in groups}
    assert paid.delta - first.delta == Fraction(1, 10**6)
    assert last.delta == paid.delta

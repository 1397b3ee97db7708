"""Red team s37d: an analyst's guarded connection against cell suppression in the query path
(one covering table per confidential table, README "Table protection by cell suppression") and
the threshold rule.

What broke (fixed here):

- **Counts suppressed, magnitudes not.** A policy could protect a table's counts by suppression
  and its magnitudes by another method (``threshold``, ``ckm`` or ``round``, own or inherited
  from the policy's top level). Those methods publish a cell's SUM and AVG exactly or with a
  small error, so ``SUM(m)/AVG(m)`` is the cell's unit count, and under filters the suppression
  shape refuses. On the demo with ``magnitudes: {method: threshold}``: the count of enterprises
  in (G, R05) is suppressed, ``SELECT COUNT(*) FROM enterprises`` publishes 1000 and ``SELECT
  SUM(turnover)/AVG(turnover) FROM enterprises WHERE NOT (nace = 'G' AND region = 'R05')``
  gives 995.0: the hidden count 5, exactly (CKM with mean before sum: 994.99999; rounding to
  1000: 995.01). The policy is refused now unless magnitudes are protected by suppression (or
  DP) too.
- **Under rounding, SUM/AVG was the exact number of contributors.** ``method: round`` rounded
  an AVG by itself to the magnitudes' base (100 on a mean of about 50,000), far finer than the
  sum's relative rounding, so ``SUM(income)/AVG(income)`` of R01-M007 x F was 116.004 where
  ``COUNT(*)`` showed 120 (116 have an income), and the same with ``AND NOT age = 43`` 111.97:
  a group of 4, exactly, which count rounding to base 5 was to blur. AVG under rounding was
  refused, then (session 38) made the published sum over the published count (below): SUM/AVG
  is the rounded count.
- **Under rounding, a sum of pinned values told its count.** A SUM rounded by itself of values
  the query pins (``SUM(age) ... WHERE age = 94 AND region = 'R02'``) was 94·n rounded to 100:
  R02-M018 showed COUNT(*) 5 and SUM(age) 700, so 7 persons. A rounded sum is published mean
  before sum now, ``R_B(S·n̂/n)`` with n̂ the cell's published COUNT(x) (500 there, as in every
  cell published as 5); beside CKM counts a rounded SUM or AVG is refused (no rounded count).
- **Rounded counts beside CKM or threshold magnitudes.** With ``counts: {method: round, base:
  5}`` and the demo's CKM magnitudes (mean before sum), the published sum is the published mean
  times the count, and beside rounded counts that count is the exact one: ``SUM(income)/
  AVG(income)`` of R01-M007 x F ``AND NOT age = 43`` was 112.0 where ``COUNT(*)`` showed 115
  (threshold magnitudes: exact). Such a SUM or AVG is refused at query time now, as one beside
  DP counts is (red team s36b).

Open, documented as a strict expected failure (README threat model): a suppressed count is
protected to its τ-ARGUS safety range (30 % of its value), so an attacker LP may prove it below
``min_freq`` (4 of 59 ``freq:5`` primaries of geography x sex are [1, 4]).

What held (20,000-person demo; the suppression demo of ``conftest.py`` and ``suppress.yaml``):
an attacker LP (scipy HiGHS, inner cells at least 1 as listing tells) over every grouping set
of enterprises nace x region (counts, turnover, employees), of persons geography x sex and
geography x education (counts, income), and of region, municipality and sex named as three
dimensions, left every suppressed cell an interval; the released pattern of ``sqlsdc publish``
carries no contributor counts and no primary/secondary split; COUNT(*), COUNT(DISTINCT unit),
SUM and AVG of one cell agree on its status (AVG only where sum and count are, and only when
every unit of the table has a value); a conflicting ``WHERE nace = 'C' AND nace = 'D'`` and an
unknown code give 0 like SQL, a suppressed cell NULL; a declared domain value absent from the
data is no cell; ``cell_accuracy()`` is empty and ``explain`` shows the pattern read; households
under suppression could not be counted through persons (``COUNT(DISTINCT household_id)``,
joins: refused as another method); DP magnitudes beside suppressed counts give SUM/AVG as a
noisy count (their ε). Under the threshold rule a SUM counts contributors (``WHERE income IS
NULL OR age >= 100`` shows counts and hides every sum), MAX/MEDIAN/STDDEV, COUNT(DISTINCT
measure) and products of measures are refused. Not a leak of the guard: a published SUM of 0
over a cell whose units all lack the measure (group disclosure of zeros; τ-ARGUS's zero rule
is not among the policy's rules).
"""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
from scipy import sparse
from scipy.optimize import linprog

import sqlsdc
from sqlsdc import admin
from sqlsdc.demo.build import demo_policy
from sqlsdc.engines.duckdb import open_database
from sqlsdc.policy import load_policy

MIXED = {
    "threshold": {"method": "threshold"},
    "ckm": {
        "method": "ckm",
        "ptable": {"D": 4, "V": 1, "step": 12},
        "top_k": 1,
        "flex": {"fp": 20000, "p_small": 0.2, "p_large": 0.05, "q": 3},
        "mean_before_sum": True,
    },
    "round": {"method": "round", "base": 1000},
}


@pytest.mark.parametrize("method", sorted(MIXED))
def test_counts_suppressed_with_magnitudes_another_way_are_refused(make_suppress_document, method):
    document = make_suppress_document()
    document["tables"]["enterprises"]["protection"]["magnitudes"] = MIXED[method]
    with pytest.raises(sqlsdc.PolicyError, match="publishes each cell's count as SUM"):
        load_policy(document)


def test_inherited_magnitudes_count_too(make_suppress_document):
    document = make_suppress_document()
    del document["tables"]["enterprises"]["protection"]["magnitudes"]  # the top level's CKM
    with pytest.raises(sqlsdc.PolicyError, match="enterprises.protection.magnitudes: method ckm"):
        load_policy(document)


def test_suppressed_counts_and_magnitudes_still_load(make_suppress_document):
    load_policy(make_suppress_document())


def test_nested_codes_as_separate_dimensions_keep_every_count_hidden(
    suppress_template, make_suppress_document, tmp_path
):
    """A universe naming region, municipality and sex as three dimensions (municipality nested
    in region, not declared as a hierarchy) has margins equal to single inner cells, e.g.
    (municipality, sex) over regions; no released cell may give a suppressed one away, and an
    attacker LP over every grouping set (inner cells at least 1, as listing tells) leaves each
    suppressed count an interval."""
    path = tmp_path / "flat.duckdb"
    shutil.copy(suppress_template, path)
    document = make_suppress_document()
    document["tables"]["persons"]["suppression"]["dimensions"] = ["region", "municipality", "sex"]
    admin.apply(path, load_policy(document), "admin")
    dims = ["region", "municipality", "sex"]
    with sqlsdc.connect(path, user="analyst") as con:
        rows = con.execute(
            "SELECT region, municipality, sex, COUNT(*) FROM persons GROUP BY CUBE(region, "
            "municipality, sex)"
        ).fetchall()
    inner = np.array([r[:3] for r in rows if None not in r[:3]], dtype=object)
    assert any(r[3] is None for r in rows if None not in r[:3])

    def covers(cells) -> np.ndarray:
        """Row i: which inner cells the cell ``cells[i]`` adds up (its keys that are not
        totals equal). Vectorised, and the LP's matrix sparse: the same LPs, 196 hidden
        cells' two each, in ~1.6 s of CPU instead of ~2.5-3.7 s."""
        cells = np.array(cells, dtype=object)
        hit = np.ones((len(cells), len(inner)), dtype=bool)
        for j in range(len(dims)):
            given = np.array([v is not None for v in cells[:, j]])
            hit[given] &= cells[given, j][:, None] == inner[None, :, j]
        return hit.astype(float)

    published = [r for r in rows if r[3] is not None]
    a_eq = sparse.csr_array(covers([r[:3] for r in published]))
    b_eq = np.array([r[3] for r in published], dtype=float)
    hidden = [r[:3] for r in rows if r[3] is None]
    for cell, c in zip(hidden, covers(hidden), strict=True):
        low = linprog(c, A_eq=a_eq, b_eq=b_eq, bounds=(1, None), method="highs")
        high = linprog(-c, A_eq=a_eq, b_eq=b_eq, bounds=(1, None), method="highs")
        assert low.status == 0 and high.status in (0, 3)
        assert high.status == 3 or -high.fun - low.fun >= 1, cell


def test_no_suppressed_count_is_provably_below_the_frequency_threshold(suppress_template, tmp_path):
    """persons under ``freq:5`` on geography x sex: every primary's attacker interval reaches
    5 (it does not: 4 of 59 are [1, 4]). On a copy: the template is shared by every test of
    the worker, and an analyst's query would leave its audit entry in it."""
    db = tmp_path / "suppress.duckdb"
    shutil.copy(suppress_template, db)
    sets = "(region, municipality, sex), (region, municipality), (region, sex), (region), (sex), ()"
    with sqlsdc.connect(db, user="analyst") as con:
        rows = con.execute(
            f"SELECT region, municipality, sex, COUNT(*) FROM persons GROUP BY GROUPING SETS "
            f"({sets})"
        ).fetchall()
    raw = open_database(db)
    try:
        truth = {
            tuple(r[:3]): r[3]
            for r in raw.execute(
                "SELECT region, municipality, sex, COUNT(*) FROM persons GROUP BY ALL"
            ).fetchall()
        }
    finally:
        raw.close()
    index = [r[:3] for r in rows if None not in r[:3]]

    def covers(cell) -> np.ndarray:
        return np.array(
            [all(cell[j] is None or cell[j] == key[j] for j in range(3)) for key in index],
            dtype=float,
        )

    published = [r for r in rows if r[3] is not None]
    a_eq = np.array([covers(r[:3]) for r in published])
    b_eq = np.array([r[3] for r in published], dtype=float)
    below = []
    for cell in (r[:3] for r in rows if r[3] is None and None not in r[:3]):
        if truth[cell] >= 5:
            continue
        high = linprog(-covers(cell), A_eq=a_eq, b_eq=b_eq, bounds=(1, None), method="highs")
        if high.status == 0 and -high.fun < 5:
            below.append((cell, truth[cell], -high.fun))
    assert not below, below


@pytest.fixture(scope="module")
def rounded_db(rounded_template, tmp_path_factory, copy_database):
    return copy_database(rounded_template, tmp_path_factory.mktemp("s37d-round"))


def conventional(x: float, base: int = 100) -> int:
    """Conventional rounding to ``base`` (halves up), the rule of ``rounded_db``'s magnitudes."""
    return math.floor(x / base + 0.5) * base


def truth(db, sql: str) -> dict:
    raw = open_database(db)
    try:
        return {tuple(r[:-1]): r[-1] for r in raw.execute(sql).fetchall()}
    finally:
        raw.close()


def test_a_rounded_mean_is_the_published_sum_over_the_published_count(rounded_db):
    """AVG under rounding is ``SUM(x) / COUNT(x)`` of the published values (mean before sum):
    SUM/AVG is the rounded count, where AVG rounded by itself made it the exact one."""
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        rows = con.execute(
            "SELECT municipality, sex, COUNT(income), SUM(income), AVG(income), "
            "SUM(income) / AVG(income) FROM persons WHERE region = 'R01' GROUP BY ALL"
        ).fetchall()
        (ratio,) = con.execute(
            "SELECT SUM(income) / AVG(income) FROM persons WHERE NOT age = 43"
        ).fetchone()
        (count,) = con.execute("SELECT COUNT(income) FROM persons WHERE NOT age = 43").fetchone()
    shown = [r for r in rows if r[4] is not None]
    assert len(shown) > 20
    assert all(r[4] == r[3] / r[2] for r in shown)
    # a sum published as 0 (its non-zero incomes' count rounded to 0) has mean 0: 0/0 is NaN
    assert all(r[5] == pytest.approx(r[2]) for r in shown if r[3] != 0)
    assert all(math.isnan(r[5]) for r in shown if r[3] == 0)
    assert all(r[2] % 5 == 0 and r[3] % 100 == 0 for r in shown)
    assert ratio == pytest.approx(count) and count % 5 == 0
    # the attack of s37d: R01-M007 x F had 116 incomes and 4 of them aged 43
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        cell = "FROM persons WHERE municipality = 'R01-M007' AND sex = 'F'"
        whole = con.execute(f"SELECT SUM(income) / AVG(income) {cell}").fetchone()[0]
        rest = con.execute(f"SELECT SUM(income) / AVG(income) {cell} AND NOT age = 43").fetchone()
    assert round(whole) % 5 == 0 and round(rest[0]) % 5 == 0


def test_a_mean_of_rounded_parts_tells_only_the_rounded_count(rounded_db):
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        rows = con.execute(
            "SELECT municipality, sex, COUNT(income) AS n, SUM(income) / (SUM(income) / "
            "COUNT(income)) AS ratio FROM persons WHERE region = 'R01' GROUP BY ALL"
        ).fetchall()
    shown = [r for r in rows if r[3] is not None and r[2] and not math.isnan(r[3])]  # 0/(0/0)
    assert shown
    assert all(r[3] == pytest.approx(r[2]) and r[2] % 5 == 0 for r in shown)


def test_a_rounded_sum_of_a_pinned_dimension_does_not_tell_the_count(rounded_db):
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        rows = con.execute(
            "SELECT municipality, COUNT(*), SUM(age) FROM persons WHERE age = 94 AND "
            "region = 'R02' GROUP BY 1"
        ).fetchall()
    told = []
    for municipality, count, total in rows:
        if total is None:
            continue
        # conventional rounding to 100 of 94·n, for every n the rounded count allows
        candidates = [n for n in range(1, 200) if (94 * n + 50) // 100 * 100 == total]
        if len(candidates) == 1 and candidates[0] % 5:
            told.append((municipality, count, candidates[0]))
    assert not told, told


# -- abuse of mean before sum: the published sum is R_B(S·n̂/n), n̂ the published COUNT(x) ------


@pytest.mark.parametrize("pin", [7, 43, 94])
def test_a_pinned_sum_is_a_function_of_the_pin_and_the_published_count(rounded_db, pin):
    """For every pin, each cell's sum is R_100(v·n̂): cells of different true counts with one
    published count publish one sum, so neither the sum nor the mean it implies tells n."""
    sql = (
        "SELECT municipality, COUNT(*), SUM(age), SUM(age) / COUNT(age), AVG(age) "
        f"FROM persons WHERE age = {pin} GROUP BY 1"
    )
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        rows = [r for r in con.execute(sql).fetchall() if r[2] is not None]
    exact = truth(
        rounded_db, f"SELECT municipality, COUNT(*) FROM persons WHERE age = {pin} GROUP BY 1"
    )
    assert len(rows) > 10
    true_counts_by_shown = {}
    for municipality, count, total, ratio, mean in rows:
        assert total == conventional(pin * count)
        if count:
            assert ratio == mean == total / count
        else:  # a count published as 0: the sum is 0 and the mean undefined
            assert total == 0 and mean is None
        true_counts_by_shown.setdefault(count, set()).add(exact[(municipality,)])
    # some published count stands for several true counts, all with the same published sum
    assert any(len(true) > 1 for true in true_counts_by_shown.values())


def test_constants_around_a_pinned_sum_tell_only_the_published_count(rounded_db):
    """``SUM(age - 94)`` over persons aged 94 is ``SUM(age) - 94·COUNT(age)`` of published
    values (constants after protection): R_100(94·n̂) - 94·n̂, never 0 because n is exact."""
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        rows = con.execute(
            "SELECT municipality, COUNT(age), SUM(CAST(age AS DOUBLE) - 94) FROM persons "
            "WHERE age = 94 "
            "GROUP BY 1"
        ).fetchall()
    shown = [r for r in rows if r[2] is not None]
    assert shown and all(r[2] == conventional(94 * r[1]) - 94 * r[1] for r in shown)


def test_the_estimate_of_n_from_sum_and_rounded_mean_is_the_published_count(rounded_db):
    """An attacker dividing the published sum by the published mean (AVG, or SUM/COUNT), over
    cells whose values are not pinned, gets the published count, never a finer one: a true
    count that is not a multiple of 5 is not recovered in any cell."""
    sql = (
        "SELECT municipality, sex, education, COUNT(income), SUM(income), AVG(income) "
        "FROM persons GROUP BY ALL"
    )
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        rows = [r for r in con.execute(sql).fetchall() if r[5] is not None and r[5] != 0]
    exact = truth(
        rounded_db,
        "SELECT municipality, sex, education, COUNT(income) FROM persons GROUP BY ALL",
    )
    assert len(rows) > 300
    recovered = 0
    for *key, count, total, mean in rows:
        estimate = round(total / mean)
        assert estimate == count and count % 5 == 0
        recovered += estimate == exact[tuple(key)] and exact[tuple(key)] % 5 != 0
    assert recovered == 0


@pytest.mark.parametrize(
    "source",
    [
        # by p.region: by the households' tenure a count of persons is refused (s43i)
        "persons p JOIN households h ON p.household_id = h.household_id GROUP BY p.region",
        "benefits p GROUP BY p.scheme",  # a person's rows repeat (one per month)
        "persons p JOIN regions r ON p.region = r.region GROUP BY r.name",  # a public table
    ],
)
def test_a_mean_is_over_the_rows_summed_not_the_units(rounded_db, source):
    """n of ``R(S·n̂/n)`` is COUNT(x), the rows summed, as the query's COUNT(x) counts them: over
    persons ⋈ households the persons (dividing by the households' count made AVG(p.income)
    2.3 times the mean), over benefits the rows; n̂ is that COUNT(x) as published."""
    key = source.rsplit(" ", 1)[1]
    sql = f"SELECT {key}, COUNT(p.{{m}}), SUM(p.{{m}}), AVG(p.{{m}}) FROM {source}"
    measure = "income" if "persons" in source else "amount"
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        rows = con.execute(sql.format(m=measure)).fetchall()
    exact = truth(rounded_db, f"SELECT {key}, AVG(p.{measure}) FROM {source}")
    assert len(rows) >= 3
    for group, count, total, mean in rows:
        assert count % 5 == 0 and total % 100 == 0 and mean == total / count
        assert mean == pytest.approx(exact[(group,)], rel=0.01)


def test_a_rounded_total_is_its_own_cell_not_the_sum_of_its_rows(rounded_db):
    """ROLLUP's total is rounded from its own mean and count: per-cell rounding is not
    additive (README), and the total tells no count its rows hide."""
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        rows = con.execute(
            "SELECT region, COUNT(income), SUM(income) FROM persons GROUP BY ROLLUP (region)"
        ).fetchall()
    total = next(r for r in rows if r[0] is None)
    parts = [r for r in rows if r[0] is not None]
    assert total[1] % 5 == 0 and total[2] % 100 == 0 and all(r[2] % 100 == 0 for r in parts)
    mean = total[2] / total[1]
    assert abs(sum(r[2] for r in parts) - total[2]) < 2.5 * mean * len(parts) + 50 * len(parts)


@pytest.fixture(scope="module")
def rounded_counts_db(pristine_demo_db, tmp_path_factory, copy_database):
    """Counts rounded to 5, magnitudes by the demo's cell key method (mean before sum)."""
    path = copy_database(pristine_demo_db, tmp_path_factory.mktemp("s37d-round-counts"))
    document = demo_policy().document_dict()
    document["protection"]["min_frequency"] = 3
    document["protection"]["counts"] = {"method": "round", "base": 5}
    document["tables"]["persons"].pop("protection", None)
    document["tables"]["households"].pop("protection", None)
    admin.apply(path, load_policy(document), "admin")
    return path


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT SUM(income) / AVG(income) FROM persons WHERE municipality = 'R01-M007' "
        "AND sex = 'F' AND NOT age = 43",
        "SELECT region, SUM(income) FROM persons GROUP BY region",
        "SELECT AVG(income) FROM persons",
    ],
)
def test_magnitudes_beside_rounded_counts_that_tell_the_count_are_refused(rounded_counts_db, sql):
    with sqlsdc.connect(rounded_counts_db, user="analyst") as con:
        assert con.execute("SELECT COUNT(*) FROM persons").fetchall()[0][0] % 5 == 0
        with pytest.raises(sqlsdc.PolicyViolation, match="counts of persons are rounded"):
            con.execute(sql)


@pytest.fixture(scope="module")
def ckm_counts_db(pristine_demo_db, tmp_path_factory, copy_database):
    """Counts by the demo's cell key method, magnitudes left to the default (threshold)."""
    path = copy_database(pristine_demo_db, tmp_path_factory.mktemp("s37d-ckm-counts"))
    document = demo_policy().document_dict()
    document["protection"].pop("magnitudes")
    document["protection"]["min_frequency"] = 3
    for table in document["tables"].values():
        table.pop("protection", None)
        table.pop("dp", None)
    admin.apply(path, load_policy(document), "admin")
    return path


@pytest.mark.parametrize(
    "sql",
    [
        # exact: 94·n, the count CKM perturbs (R03-M013 showed 11 where 12 = 1128/94)
        "SELECT municipality, COUNT(*), SUM(age) FROM persons WHERE age = 94 GROUP BY 1",
        "SELECT SUM(income) / AVG(income) FROM persons WHERE NOT age = 43",
        "SELECT region, AVG(age) FROM persons GROUP BY region",
    ],
)
def test_exact_magnitudes_beside_ckm_counts_are_refused(ckm_counts_db, sql):
    """Session 38: a policy declaring only CKM counts left SUM and AVG to the threshold rule,
    whose pinned sum (and SUM/AVG) is the exact count the noise hides: refused, as beside DP
    (s36b) and rounded (s37d) counts; the counts are still answered."""
    with sqlsdc.connect(ckm_counts_db, user="analyst") as con:
        assert con.execute("SELECT region, COUNT(*) FROM persons GROUP BY region").fetchall()
        with pytest.raises(sqlsdc.PolicyViolation, match="protected by the cell key method"):
            con.execute(sql)

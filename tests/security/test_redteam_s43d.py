"""Red team s43d: revisions of rounding, CTA and IPF jobs, and count jobs beside sum jobs.

A reader keeps every version of a job's table and every other output of the same rows. After
new data, two versions differ by the contribution of the units that changed in between
(:mod:`sqlsdc.jobs.revisions` protects this for suppression jobs). Here: a CTA and a rounding
stored again with ``--replace`` after one unit changed (:mod:`sqlsdc.jobs.adjusted_revisions`),
and a count job stored after a sum job whose ``n`` counts the same units.
"""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest

from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import TabularError
from sqlsdc.jobs.adjust import cta_query, ipf_query, round_query
from sqlsdc.jobs.protect import protect_query
from sqlsdc.tabular.rules import DominanceRule, FrequencyRule

TURNOVER = "SELECT nace, region, SUM(turnover) FROM enterprises GROUP BY nace, region"
FIRMS = "SELECT nace, region, COUNT(*) FROM enterprises GROUP BY nace, region"
RULES = [DominanceRule(n=1, k=60), FrequencyRule(3)]
NEW_FIRM = (
    "INSERT INTO enterprises SELECT max(enterprise_id) + 1, NULL, 'C', 'R02', "
    "any_value(size_class), 5, {turnover}, 4242 FROM enterprises"
)
OLD80 = "SELECT region, education, COUNT(*) FROM persons WHERE age >= 80 GROUP BY region, education"


def change(db, sql: str) -> None:
    con = open_database(db)
    try:
        con.execute(sql)
    finally:
        con.close()


def stored(db, name: str, dims=("nace", "region"), columns="value") -> pd.DataFrame:
    con = duckdb.connect(str(db), read_only=True)
    try:
        frame = con.sql(f"SELECT {', '.join(dims)}, {columns} FROM protected.{name}").df()
    finally:
        con.close()
    return frame.set_index(list(dims))


def test_a_cta_replaced_after_one_new_firm_does_not_publish_its_turnover(jobs_demo_db):
    """Before: (C, R02) and R02's total of the two versions differed by exactly 1,234,567, the
    new firm's turnover (and (C, R03) and R03's total by minus that, to keep C's total)."""
    db = jobs_demo_db
    cta_query(db, "admin", TURNOVER, into="t", rules=RULES)
    first = stored(db, "t")["value"]
    change(db, NEW_FIRM.format(turnover=1234567))
    with pytest.raises(TabularError, match=r"fewer units changed than the rules allow"):
        cta_query(db, "admin", TURNOVER, into="t", rules=RULES, replace=True)
    second = stored(db, "t")["value"]  # what readers hold: the first version only
    difference = second.sub(first, fill_value=0.0).abs()
    assert not ((difference - 1234567).abs() < 1234567 * 0.1).any()


def test_a_rounding_of_counts_replaced_after_one_person_turned_80_does_not_tell_their_cell(
    jobs_demo_db,
):
    """Before: of six updates (one person of each region R01-R06 turns 80), five left the
    rounding to base 5 as it was and one (R03) moved exactly the four cells that hold the
    person's region and education (R03's total 570 -> 575, its count exactly): the person's
    education, to a reader who knows the person turned 80. Now a
    version that moves a cell while fewer units than the minimum frequency changed in some
    cell is refused; a version that publishes the same table is stored."""
    db, dims = jobs_demo_db, ("region", "education")
    round_query(db, "admin", OLD80, into="r", base=5)
    versions, refused = [stored(db, "r", dims)["value"]], 0
    for region in ["R01", "R02", "R03"]:  # R04-R06 moved nothing either way
        change(db, "UPDATE persons SET age = 80 WHERE person_id = (SELECT min(person_id) FROM "
                   f"persons WHERE age = 79 AND region = '{region}')")  # fmt: skip
        try:
            round_query(db, "admin", OLD80, into="r", base=5, replace=True)
        except TabularError as refusal:
            assert "population of its own" in str(refusal)
            refused += 1
            continue
        versions.append(stored(db, "r", dims)["value"])
    assert refused >= 1  # was 0
    for later in versions[1:]:  # every stored version is the first table again
        pd.testing.assert_series_equal(later.sort_index(), versions[0].sort_index())


@pytest.mark.parametrize("order", ["sum first", "count first"])
def test_a_count_job_beside_a_sum_job_of_other_data_does_not_count_the_new_firm(
    jobs_demo_db, order
):
    """Before (sum first): the sum job showed (C, R02)'s 12 enterprises, R02's 195 and 1,000
    in all; one firm of turnover 0 entered (C, R02), and a new count job of the same rows
    showed 13, 196 and 1,001: the firm's cell. The count job was compared with the sum job's
    published n, not with its kept units, which are those of another aggregate."""
    db = jobs_demo_db
    first, second = (TURNOVER, FIRMS) if order == "sum first" else (FIRMS, TURNOVER)
    rules = {TURNOVER: RULES, FIRMS: [FrequencyRule(3)]}
    protect_query(db, "admin", first, into="a", rules=rules[first])
    before = stored(db, "a", columns="n")["n"]
    change(db, NEW_FIRM.format(turnover=0))
    protect_query(db, "admin", second, into="b", rules=rules[second])
    after = stored(db, "b", columns="n")["n"]
    both = pd.DataFrame({"before": before, "after": after}).dropna()
    assert len(both) > 20
    assert (both.before == both.after).all(), both[both.before != both.after]


OLD_INCOME = (
    "SELECT region, education, SUM(income) FROM persons WHERE age >= 85 GROUP BY region, education"
)


def test_an_ipf_to_public_margins_replaced_after_one_known_income_change_gives_no_original(
    jobs_demo_db,
):
    """Before: raked to the same public education margins (2 % above the originals) in both
    versions, after one income of (R04, primary) (13 persons) grew by 50,000, the primary
    column's raked cells were all scaled by one ratio (X + d) / X and its sensitive cells (fixed
    at safe values) did not move: a reader who knew d read X, the raked cells' share of the
    margin, and from it the originals of R02, R03 and R07's primary incomes exactly (3 of 3),
    and which 4 cells of the column have fewer than 10 persons."""
    db, dims, d = jobs_demo_db, ("region", "education"), 50_000.0
    con = open_database(db)
    try:
        margins = con.sql(
            "SELECT 'Total' AS region, CAST(education AS VARCHAR) AS education, "
            "round(SUM(income) * 1.02) AS value FROM persons WHERE age >= 85 GROUP BY education"
        ).df()
    finally:
        con.close()
    rules = [FrequencyRule(10)]
    ipf_query(db, "admin", OLD_INCOME, into="t", margins=margins, rules=rules)
    first = stored(db, "t", dims)["value"]
    change(db, "UPDATE persons SET income = income + 50000 WHERE person_id = (SELECT "
               "min(person_id) FROM persons WHERE age >= 85 AND region = 'R04' AND "
               "education = 'primary')")  # fmt: skip
    try:
        ipf_query(db, "admin", OLD_INCOME, into="t", margins=margins, rules=rules, replace=True)
    except TabularError as refusal:  # since s43d
        assert "fewer units changed than the rules allow" in str(refusal)
    second = stored(db, "t", dims)["value"]  # what readers hold
    con = duckdb.connect(str(db), read_only=True)
    try:
        truth = con.sql(
            "SELECT region, SUM(income) AS v FROM persons WHERE age >= 85 "
            "AND education = 'primary' GROUP BY region"
        ).df().set_index("region")["v"]  # fmt: skip
    finally:
        con.close()
    column = [k for k in first.index if k[1] == "primary" and k[0] not in ("Total", "R04")]
    fixed = [k for k in column if abs(first[k] - second[k]) < 1e-6]
    raked = [k for k in column if k not in fixed]
    share = float(margins.set_index("education").loc["primary", "value"])
    share -= sum(first[k] for k in fixed)
    exact = 0
    for k in raked:  # the reader's X from the ratio of two versions, then x = p * X / M
        x = first[k] * (d / (first[k] / second[k] - 1.0)) / share
        exact += abs(x - truth[k[0]]) < 0.5
    assert exact == 0  # was 3 of 3


def test_the_live_suppression_pattern_after_one_new_firm_does_not_give_its_turnover(
    suppress_template, tmp_path
):
    import shutil

    import sqlsdc

    db = tmp_path / "changing.duckdb"
    shutil.copy(suppress_template, db)
    sql = (
        "SELECT nace, region, SUM(turnover) AS t, COUNT(*) AS n FROM enterprises "
        "GROUP BY CUBE(nace, region)"
    )
    with sqlsdc.connect(db, user="analyst") as con:
        before = con.execute(sql).df()
    change(db, NEW_FIRM.format(turnover=1234567))
    with sqlsdc.connect(db, user="analyst") as con:
        after = con.execute(sql).df()
    both = before.merge(after, on=["nace", "region"], suffixes=("_1", "_2"))
    exact = ((both.t_2 - both.t_1) - 1234567).abs() < 1.0
    assert int(exact.sum()) == 0  # 3: (C, R02), R02, the grand total

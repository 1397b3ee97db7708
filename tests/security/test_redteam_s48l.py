"""Red team s48l: a CTA or rounding job's output beside the live CKM answers of the same cells.

Attacked as an analyst of the CKM demo (``sqlsdc.connect(..., user="analyst")``) who also reads
every job output (as if each were under ``releases:``), with the code and the policy; scored
against the raw data (demo, 20,000 persons, seed 20260101; enterprises' turnover by nace x
region: 144 inner cells, CTA ``lp`` with the default rules, 116 of 171 cells sensitive, 28
inner cells published exactly).

Held (the guards below keep the reasons):

- CKM noise read off the exact CTA cells: live ``SUM(turnover)`` minus the CTA value of the 28
  exact cells is each cell's CKM noise, but its ratio to the top contribution x1·m ranged
  0.02-1.72 (one draw of v per cell, top_k 2): x1 to within a factor of about 3;
  live unions of the exact cells (``WHERE (nace=.. AND region=..) OR ...``) give more draws,
  as padding with cells read live does without any job.
- A sensitive cell pinned by averaging: 40 live unions of the cell with 1-4 exact CTA cells
  each (80 queries per cell, 12 largest sensitive cells) put its sum within 1.18 % of x1
  (median) of the job's value; the same unions with the pads read live instead (pure CKM,
  no job) within 0.97 %: the CTA's exact cells add nothing the live path does not give. Both
  converge on the sum of x·m (the permanent unit noise), whose distance from the raw sum was
  5.4-14.0 % of the raw x1 in those 12 cells: the floor the README documents. The guard:
  every cell a CTA job publishes exactly is a sum of x·m, never of the raw values
  (:func:`test_exact_cta_cells_are_sums_of_noised_values`).
- The CTA's direction read from the live answer (a moved sensitive cell is ``x(1 ± 0.3f)``,
  the live one ``x`` ± its noise): the original then lies within ±5-12 % — of x·m again.
- Controlled rounding of counts to base 3 beside live CKM counts of the same cells (persons
  aged 85+ by municipality x education, 415 inner cells, 193 of 1 or 2 persons): the rounding
  window and the count ptable's support (D 5, V 3, js 2) left no cell with one candidate
  count (2 candidates: 107 cells, 4-5: 308); none of 1 or 2 proved
  (:func:`test_rounded_counts_beside_live_counts_prove_no_small_cell`).

Open (amplified, the class of ``test_redteam3``'s strict xfail, "averaging over padded
unions", a documented limit of the cell key method): a job's exactly published counts serve
as noiseless paddings. n(A) = n̂(A ∪ B) − n(B) + v with n(B) from the job's output (a
suppression job of persons by region x education x sex hides none of its 135 cells; an IPF
job of a count table with no sensitive cell publishes exact counts too) draws one noise per
query, variance 3, where n̂(A ∪ B) − n̂(B) draws two in two queries (variance 6).
20 cells of 1-9 persons aged 85+ (municipality x education x sex): the mean rounded to the
exact count for 15, 17, 18 of 20 with 8, 16, 32 queries per cell, against 11, 13, 15 of 20
with the paddings read live (16, 32, 64 queries); the likeliest count under the public
ptable instead of the rounded mean: 14 of 16 cells from 20 queries each on the tests' demo
(:func:`test_exact_job_counts_as_paddings_do_not_give_small_counts`). Not fixed: the cure of
the class is differential privacy (README); publishing a job's counts as the live CKM
counts, or refusing exact count jobs on CKM tables, are the lead's call (see the report).
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import sqlsdc
from sqlsdc.jobs.adjust import cta_query, round_query
from sqlsdc.jobs.protect import protect_query
from sqlsdc.mechanisms.ptable import count_ptable
from tests.jobs.test_anonymize import _read as _raw  # a query's rows as a DataFrame

TURNOVER = "SELECT nace, region, SUM(turnover) FROM enterprises GROUP BY nace, region"
OLD = "WHERE age >= 85"


@pytest.fixture
def ckm_copy(ckm_db, tmp_path):
    """A private copy of the CKM demo, for jobs."""
    path = tmp_path / "demo.duckdb"
    shutil.copy(ckm_db, path)
    return path


def test_exact_cta_cells_are_sums_of_noised_values(ckm_copy):
    """Every cell a CTA job stores differs from the raw sum of its turnovers, and the
    non-sensitive cells (published exactly) differ from the live CKM answer: the analyst who
    subtracts reads CKM noise on the sums of x·m, and averages of live unions converge on x·m,
    never on x (the unit noise's floor). A guard: it passes on main."""
    cta_query(ckm_copy, "admin", TURNOVER, into="turnover_cta")
    stored = _raw(ckm_copy, "SELECT nace, region, value FROM protected.turnover_cta")
    raw = _raw(ckm_copy, "SELECT nace, region, SUM(turnover) AS x FROM enterprises GROUP BY ALL")
    cells = stored.merge(raw, on=["nace", "region"])
    assert len(cells) > 50
    assert not np.isclose(cells["value"], cells["x"], rtol=1e-9, atol=0).any()
    con = sqlsdc.connect(ckm_copy, user="analyst")
    try:
        live = con.execute(TURNOVER.replace("SUM(turnover)", "SUM(turnover) AS s")).df()
    finally:
        con.close()
    both = cells.merge(live, on=["nace", "region"])
    assert not np.isclose(both["value"], both["s"], rtol=1e-9, atol=0).any()


def test_rounded_counts_beside_live_counts_prove_no_small_cell(ckm_copy):
    """A count table rounded to base 3 (every inner cell published as 0 or a multiple of 3,
    cells published as 0 left out) and the live CKM counts of the same cells: for no cell do
    the rounding window (r - 3, r + 3) and the ptable rows that can give the live count leave
    one candidate count of 1 or 2."""
    sql = (
        "SELECT region, municipality, education, COUNT(*) FROM persons "
        f"{OLD} GROUP BY region, municipality, education"
    )
    round_query(ckm_copy, "admin", sql, into="old_r3", base=3)
    stored = _raw(ckm_copy, "SELECT geography, education, value FROM protected.old_r3")
    stored = stored[stored["geography"].str.contains("-")]  # municipalities: inner cells
    rounded = {(g, e): v for g, e, v in stored.itertuples(index=False)}
    con = sqlsdc.connect(ckm_copy, user="analyst")
    try:
        live = con.execute(sql.replace("COUNT(*)", "COUNT(*) AS n")).df()
    finally:
        con.close()
    shown = {(m, e): n for m, e, n in live[["municipality", "education", "n"]].itertuples(False)}
    raw = _raw(ckm_copy, f"SELECT municipality, education FROM persons {OLD} GROUP BY ALL")
    table = count_ptable(5, 3, 2)  # the demo's counts: {D: 5, V: 3, js: 2}
    top = max(table.classes)
    support = {n: {n + r.v for r in table.row(min(n, top)) if r.p > 0} for n in range(1, 400)}
    proved = 0
    for m, e in raw.itertuples(index=False):
        r = int(rounded.get((m, e), 0))
        nh = int(shown.get((m, e), 0))
        candidates = [n for n in range(max(1, r - 2), r + 3) if nh in support[n]]
        assert candidates, (m, e)
        proved += len(candidates) == 1 and candidates[0] <= 2
    assert len(raw) > 300
    assert proved == 0


@pytest.mark.slow
@pytest.mark.xfail(
    strict=True,
    reason=(
        "OPEN, the documented limit of CKM 'averaging over padded unions' (test_redteam3), "
        "made cheaper by a job's exact counts as paddings: 14 of 16 small counts exact "
        "from 20 queries each (one noise per query instead of two)"
    ),
)
def test_exact_job_counts_as_paddings_do_not_give_small_counts(ckm_copy):
    """16 cells of 1-9 persons aged 85+ by municipality x education x sex; for each, 20 live
    counts of the cell OR one published cell of a suppression job of persons by region x
    education x sex of another region (disjoint), less that cell's published count: the mean
    the likeliest count under the public ptable (each draw is n + v, v from the ptable's row
    of the union's count, 8 and more here) is exact for at most 6 of the 16 (the security
    property; the attack
    got 14 of 16 on one build, the rounded mean 11; P(X <= 6) < 0.001 at p = 0.8)."""
    job = "SELECT region, education, sex, COUNT(*) FROM persons GROUP BY region, education, sex"
    protect_query(ckm_copy, "admin", job, into="persons_by_region")
    pads = _raw(
        ckm_copy,
        "SELECT region, education, sex, n FROM protected.persons_by_region "
        "WHERE region <> 'Total' AND education <> 'Total' AND sex <> 'Total' "
        "AND n IS NOT NULL ORDER BY ALL",
    )
    cells = (
        _raw(
            ckm_copy,
            "SELECT region, municipality, education, sex, COUNT(*) AS n FROM persons "
            f"{OLD} GROUP BY ALL HAVING COUNT(*) <= 9 ORDER BY ALL",
        )
        .iloc[::7]
        .head(16)
    )
    assert len(cells) == 16
    con = sqlsdc.connect(ckm_copy, user="analyst")
    exact = 0
    try:
        for i, t in enumerate(cells.itertuples(index=False)):
            target = (
                f"(municipality = '{t.municipality}' AND education = '{t.education}' "
                f"AND sex = '{t.sex}' AND age >= 85)"
            )
            others = pads[pads["region"] != t.region]
            draws = []
            for p in others.iloc[i % 2 :: 2].head(20).itertuples(index=False):
                pad = f"(region = '{p.region}' AND education = '{p.education}' AND sex = '{p.sex}')"
                sql = f"SELECT COUNT(*) FROM persons WHERE {target} OR {pad}"
                row = con.execute(sql).fetchone()
                draws.append((0 if row is None else int(row[0])) - int(p.n))
            exact += _likeliest(draws) == t.n
    finally:
        con.close()
    assert exact <= 6, f"{exact} of 16 small counts exact from 20 queries each"


def _likeliest(draws: list[int]) -> int:
    """The count c that makes ``draws`` (each c + v, v from the demo's count ptable row 8:
    D 5, V 3, js 2) most likely."""
    row = {r.v: r.p for r in count_ptable(5, 3, 2).row(8)}

    def loglik(c: int) -> float:
        return sum(np.log(row.get(d - c, 1e-300)) for d in draws)

    return max(range(0, 40), key=loglik)

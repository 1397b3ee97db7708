"""Red team s47c: the back-end jobs' release checks that session 46 left open.

The attacker reads every job output and anonymised file the admin stored (``protected.*``)
and combines their exact cells; 20,000-person jobs demo (threshold policy, default job rules
``freq:10`` and ``p:10`` for sums). Findings:

1. A population of nine values of a dimension. Turnover of the micro and medium firms of every
   activity by nace (T2), of nine activities' large and medium firms by region (T1), and of
   their micro firms by region (T3): T1's total less T2's nine cells plus T3's total is the
   nine activities' large firms, chosen as one firm: its 237,073,633 exactly (3 jobs, 0
   queries). The three-table checks merged the cells of a population of 2 to 8 values only
   (``isolated_groups.MERGED_VALUES``); now of up to 10,000.
2. A stale anonymised file. A file of R02's firms (region exact, turnover as it is), then a
   new R02 firm loaded, then turnover of R02 and R03 by size class and of R03 by region: T2's
   total less T3's R03 less the file's records was the new firm's 7,654,321 exactly (1 file, 2
   jobs, 0 queries). The stale-release check knew jobs' kept units only; a file's records
   are now compared with the data under its population, cell by cell of its exact columns,
   and a changed file in a sum with the new release refuses it (its change is unknown by
   unit). The pair alone did it too: the file, the new firm, then R02 by region (T1 less the
   file), or R02 by region, the new firm, then the file (the file less T1: a stale job's cell
   over the same units was left to the revision rules, which judge a job, not a file).
3. Open (strict xfail): a two-sided pair difference beside a live query. Turnover of an
   activity's firms by region, and of its firms but its one large firm plus 40 micro firms of
   another activity in that firm's region by size class: T1 - T2 = the firm - the micro
   firms, which the analyst asks live; T1 - T2 + the answer was the firm's 237,073,633 (2
   jobs, 1 query). The pairwise check refuses one-sided differences only. Refusing a side of
   1-9 units beside one of 10 or more fixes it, but refused the setups of 20 earlier tests
   (s37c, s38b, s38f, s46b, test_record_files, test_blanked_cells), so it is left to the
   lead. Under the threshold policy live queries alone difference so (README, "The threshold
   rule alone does not stop differencing": R02's total less R02 without its large firm was
   that firm's 149,435,156); under CKM the live answer is noisy, but by the micro firms' noise,
   not the large firm's.

Held (one line each):
- suppression of R02+R03 by region, then CTA or rounding (base 1,000,000) of R02 by size class
  (a table whose total is a cell of the other), or of R02+R03 by region x size class: refused
  as a second protection of the same cells (4 jobs).
- the stale-release check's cell codes: text codes ('R02', NULL as 'None') and integer codes
  ('25', pandas' nullable Int32) read alike on both sides; one slip fixed: an integer NULL
  code was NaN, no change of the NULL cell (judged in coarser cells only), now 'None'.
"""

from __future__ import annotations

import json

import duckdb
import pytest

import sqlsdc
from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.jobs.stale_releases import _inside
from tests.security.test_redteam_s46b import BOTH_BY_SIZE, NEW_FIRM, _change_the_data


def _nine_activities(db) -> tuple[list[str], float]:
    """An activity of one large firm (the largest such) and eight of none: the firm's turnover."""
    with duckdb.connect(str(db), read_only=True) as raw:
        large = dict(raw.execute(
            "SELECT nace, count(*) FROM enterprises WHERE size_class = 'large' GROUP BY nace"
        ).fetchall())  # fmt: skip
        naces = [n for (n,) in raw.execute(
            "SELECT DISTINCT nace FROM enterprises ORDER BY nace").fetchall()]  # fmt: skip
        firm, truth = raw.execute(
            "SELECT nace, turnover FROM enterprises WHERE size_class = 'large' AND nace IN "
            f"({', '.join(repr(n) for n, k in large.items() if k == 1)}) "
            "ORDER BY turnover DESC LIMIT 1"
        ).fetchone()
    others = [n for n in naces if n not in large]
    assert len(others) >= 8
    return [firm, *others[:8]], truth


def test_a_population_of_nine_values_takes_part_as_the_sum_of_their_cells(jobs_demo_db):
    """T1 - T2(nine naces) + T3 is the nine naces' large firms, one firm (s47c demo: its
    237,073,633 exactly). Fails on main (all three stored, the firm's turnover recovered)."""
    naces, truth = _nine_activities(jobs_demo_db)
    listed = ", ".join(f"'{n}'" for n in naces)
    protect_query(jobs_demo_db, "admin", "SELECT nace, SUM(turnover) FROM enterprises WHERE "
                  "size_class IN ('micro', 'medium') GROUP BY nace", into="t2")  # fmt: skip
    protect_query(jobs_demo_db, "admin", "SELECT region, SUM(turnover) FROM enterprises WHERE "
                  f"nace IN ({listed}) AND size_class IN ('large', 'medium') GROUP BY region",
                  into="t1")  # fmt: skip
    sql = (
        "SELECT region, SUM(turnover) FROM enterprises WHERE "
        f"nace IN ({listed}) AND size_class = 'micro' GROUP BY region"
    )
    with pytest.raises(TabularError, match=r"p\(10\)|isolate"):
        protect_query(jobs_demo_db, "admin", sql, into="t3")
        with duckdb.connect(str(jobs_demo_db), read_only=True) as raw:  # pragma: no cover
            (t1,) = raw.execute("SELECT value FROM protected.t1 WHERE region = 'Total'").fetchone()
            (t3,) = raw.execute("SELECT value FROM protected.t3 WHERE region = 'Total'").fetchone()
            (t2,) = raw.execute(
                f"SELECT sum(value) FROM protected.t2 WHERE nace IN ({listed})"
            ).fetchone()
        assert t1 - t2 + t3 == pytest.approx(truth)  # pragma: no cover - reached on main only


R02_FILE = "SELECT region, turnover, employees FROM enterprises WHERE region = 'R02'"
R03 = "SELECT region, SUM(turnover) FROM enterprises WHERE region = 'R03' GROUP BY region"


def _t2_less_t3_less_file(db) -> float:
    with duckdb.connect(str(db), read_only=True) as raw:
        (t2,) = raw.execute("SELECT value FROM protected.t2 WHERE size_class = 'Total'").fetchone()
        (t3,) = raw.execute("SELECT value FROM protected.t3 WHERE region = 'R03'").fetchone()
        (records,) = raw.execute("SELECT SUM(turnover) FROM protected.fl").fetchone()
    return t2 - t3 - records


def test_a_stale_file_beside_two_new_jobs_keeps_a_new_firm_hidden(jobs_demo_db):
    """A file of R02's firms, a new R02 firm, then R02 and R03 by size class and R03 by region:
    T2 - T3 - the file was the new firm's 7,654,321 exactly. Fails on main (stored)."""
    anonymize(jobs_demo_db, user="admin", into="fl", sql=R02_FILE,
              steps=["noise:employees:c=0.5"])  # fmt: skip
    _change_the_data(jobs_demo_db, NEW_FIRM.format("R02"))
    protect_query(jobs_demo_db, "admin", BOTH_BY_SIZE, into="t2")
    with pytest.raises(TabularError, match=r"protected\.fl was published before the data"):
        protect_query(jobs_demo_db, "admin", R03, into="t3")
        assert _t2_less_t3_less_file(jobs_demo_db) == pytest.approx(7654321.0)  # pragma: no cover


def test_a_file_beside_two_new_jobs_after_a_change_elsewhere_refuses_nothing(jobs_demo_db):
    """The same file and jobs with the new firm loaded in R05: the file's records are the data
    under its population now, so T2 - T3 - the file is nothing and both jobs are stored."""
    anonymize(jobs_demo_db, user="admin", into="fl", sql=R02_FILE,
              steps=["noise:employees:c=0.5"])  # fmt: skip
    _change_the_data(jobs_demo_db, NEW_FIRM.format("R05"))
    protect_query(jobs_demo_db, "admin", BOTH_BY_SIZE, into="t2")
    protect_query(jobs_demo_db, "admin", R03, into="t3")
    assert _t2_less_t3_less_file(jobs_demo_db) == pytest.approx(0.0, abs=1e-3)


R02 = "SELECT region, SUM(turnover) FROM enterprises WHERE region = 'R02' GROUP BY region"


def test_a_job_over_a_stale_files_population_keeps_a_new_firm_hidden(jobs_demo_db):
    """A file of R02's firms, a new R02 firm, then turnover of R02 by region: T1 less the
    file's records was the new firm's 7,654,321 (1 file, 1 job). Fails on main (stored)."""
    anonymize(jobs_demo_db, user="admin", into="fl", sql=R02_FILE,
              steps=["noise:employees:c=0.5"])  # fmt: skip
    _change_the_data(jobs_demo_db, NEW_FIRM.format("R02"))
    with pytest.raises(TabularError, match=r"protected\.fl was published before the data"):
        protect_query(jobs_demo_db, "admin", R02, into="t1")


def test_a_file_over_a_stale_jobs_population_keeps_a_new_firm_hidden(jobs_demo_db):
    """Turnover of R02 by region, a new R02 firm, then a file of R02's firms: the file's
    records less T1 was the new firm's 7,654,321 (1 job, 1 file): the pair was left to the
    revision rules, which judge a job, not a file. Fails on main (stored)."""
    protect_query(jobs_demo_db, "admin", R02, into="t1")
    _change_the_data(jobs_demo_db, NEW_FIRM.format("R02"))
    with pytest.raises(MicrodataError, match=r"protected\.t1 was published before the data"):
        anonymize(jobs_demo_db, user="admin", into="fl", sql=R02_FILE,
                  steps=["noise:employees:c=0.5"])  # fmt: skip


@pytest.mark.xfail(
    strict=True,
    reason="red team s47c, open: a two-sided pair difference A - B whose B (40 micro firms) "
    "the analyst asks live gave one firm's 237,073,633 (2 jobs, 1 query). Judging each side "
    "(a side of 1-9 units beside one of 10+ refused) fixes it but refused 20 setups of "
    "earlier red-team tests (s37c, s38b, s38f, s46b, test_record_files), which are "
    "themselves instances of it",
)
def test_a_two_sided_difference_beside_a_live_query_keeps_a_firm_hidden(jobs_demo_db):
    """Turnover of activity E's firms by region (T1), of E's firms but the large one and of
    another activity's micro firms of that firm's region by size class (T2): their totals
    differ on both sides, by the large firm (one unit) and by the micro firms (40), which the
    analyst asks live (the threshold policy answers a cell of 40 firms). T1 - T2 + the live
    answer was the firm's 237,073,633 exactly (2 jobs, 1 query). Fails on main (stored)."""
    with duckdb.connect(str(jobs_demo_db), read_only=True) as raw:
        g, truth, region = raw.execute(
            "SELECT nace, turnover, region FROM enterprises WHERE size_class = 'large' AND nace "
            "IN (SELECT nace FROM enterprises WHERE size_class = 'large' GROUP BY nace HAVING "
            "count(*) = 1) ORDER BY turnover DESC LIMIT 1"
        ).fetchone()
        (m,) = raw.execute(
            "SELECT nace FROM enterprises WHERE size_class = 'micro' AND nace <> ? AND region = ? "
            "GROUP BY nace HAVING count(*) >= 10 ORDER BY count(*) DESC, nace LIMIT 1",
            [g, region],
        ).fetchone()
    other = f"(nace = '{m}' AND size_class = 'micro' AND region = '{region}')"
    protect_query(jobs_demo_db, "admin", "SELECT region, SUM(turnover) FROM enterprises "
                  f"WHERE nace = '{g}' GROUP BY region", into="t1")  # fmt: skip
    sql = (
        "SELECT size_class, SUM(turnover) FROM enterprises WHERE "
        f"(nace = '{g}' AND size_class <> 'large') OR {other} GROUP BY size_class"
    )
    with pytest.raises(TabularError, match=r"differ by only 1 unit"):
        protect_query(jobs_demo_db, "admin", sql, into="t2")
        with duckdb.connect(str(jobs_demo_db), read_only=True) as raw:  # pragma: no cover
            (t1,) = raw.execute("SELECT value FROM protected.t1 WHERE region = 'Total'").fetchone()
            (t2,) = raw.execute(
                "SELECT value FROM protected.t2 WHERE size_class = 'Total'"
            ).fetchone()
        analyst = sqlsdc.connect(str(jobs_demo_db), user="analyst")  # pragma: no cover
        (live,) = analyst.execute(f"SELECT SUM(turnover) FROM enterprises WHERE {other}").fetchone()
        assert t1 - t2 + live == pytest.approx(truth)  # pragma: no cover - reached on main only


def test_a_null_code_of_a_number_column_is_the_null_cell():
    """A NULL age is NaN in the kept codes (pandas' nullable Int32 as text): it lies in the cell
    None as the engine gives it. Fails on main (NaN != 'None')."""
    frame = duckdb.connect().sql("SELECT * FROM (VALUES (25), (NULL)) t(age)").df()
    codes = [json.loads(json.dumps({"age": c})) for c in frame["age"].astype(str)]
    assert _inside(codes[1], {"age": None}, None)
    assert not _inside(codes[0], {"age": None}, None)
    assert _inside(codes[0], {"age": 25}, None)

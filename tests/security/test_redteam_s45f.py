"""Red team s45f: back-end jobs and released tables (session 45).

1. Two jobs over other rows whose cells are sums of each other's. Enterprises' turnover by
   region x nace suppressed (``nk:1,60``, ``freq:3``: 85 primaries on the 20,000-person demo),
   then the same turnover over ``nace IN`` (one hidden activity of a region and that region's
   published ones) by region: no cell of the second table is a cell of the first, so
   ``_share_a_cell`` paired nothing and both were stored, as a second suppression job (nothing
   sensitive in it) or a rounding to base 5. The region's cell less its published activities
   is the hidden one: on the s45f demo (R04, H) = 23,879,637 exactly (suppression) or within
   4 (rounding), where the first job's audit reported [0, 79,696,326]; its largest firm holds
   22,018,831 of it (2 jobs, 0 queries). Counts alike: everyone aged 90+ by municipality x
   education (``freq:5``), then R01's 90+ by education rounded to base 3, narrowed 31 of R01's
   46 hidden cells (e.g. [1, 58] -> [1, 9]; none below its 30 % level). Now a pair of jobs
   of which a cell of one is the union of inner cells of the other is refused as two
   protections of the same cells are (``sqlsdc.jobs.cell_unions``).
2. A count job by suppression beside a sum job's ``n``: never compared. Over R01's hidden G
   (2 firms) and its four published activities, by region: R01's count less the four ``n``
   was 2. Now refused unless the rows are the same (then each keeps what the other hid).
3. The live pattern (``suppress.yaml``: enterprises by nace x region): a job over ``nace IN
   ('A','B','D','F','G','H')`` by region gave its hidden (R04, H) exactly (1 job, 1 analyst
   query); a file of the enterprises of ``nace IN ('A','B','G')``, region exact, gave (R01, G)'s
   count of 2 as 12 records less 5 and 5. Now refused (``live_cells``).
4. A file beside a suppression job's ``n``: a file of ``nace IN ('C','G')``, region exact, gave
   (R01, G)'s 2 as 12 records less the job's 10. Now refused (``differencing._refuse_pair``).
5. The difference of two exact releases was asked for the minimum frequency only, not for p%
   or dominance: all of R02 less R02 without J was J's 364,839,073 over 14 firms, 91 % of it
   one firm's (p:10 flags it; each job's cell passed). Now the job's rules are applied to the
   difference's units (``sqlsdc.jobs.dominated_differences``, s45n) and the second job is
   refused; a difference no rule flags stays allowed.

Held (one line each):
- a90 (90+ by municipality x education) then the same over ``region = 'R01'`` as a second
  suppression job: refused (shared cells, s33c).
- a rounding of 89+ by region x education, and of 80+ by region x sex, beside a90: stored; the
  nested populations differ by 10 or more in every cell (the differencing check), no cell a
  sum of a90's.
- the same over ``nace IN (...) AND employees >= 10`` (not whole cells): the region's cell less
  the published ones bounds (R04, H) below by -8,431,571 (the small firms' 32,311,208 unknown).
- the live CKM answers beside the suppression job: each hidden primary estimated as its row's
  exact total less the published cells less the CKM values of the other hidden cells (1 query):
  1 of 29 primaries within 20 % of its largest firm; the CKM noise of the others, millions,
  adds up.
- the release database (``sqlsdc publish``) shows a suppressed cell as ``suppressed`` with its
  audited bounds only: no primary/secondary status, rule or the report's ``cost`` (the sum of
  the secondary cells under ``--cost value``).
"""

from __future__ import annotations

import duckdb
import pytest

import sqlsdc
from sqlsdc.errors import MicrodataError, TabularError
from sqlsdc.jobs.adjust import round_query
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.tabular.rules import parse_rule

A90 = (
    "SELECT municipality, education, COUNT(*) FROM persons WHERE age >= 90 "
    "GROUP BY municipality, education"
)
R01_ROUNDED = (
    "SELECT education, COUNT(*) FROM persons WHERE age >= 90 AND region = 'R01' GROUP BY education"
)
RULES = [parse_rule("nk:1,60"), parse_rule("freq:3")]
SUPPRESSED = "SELECT region, nace, SUM(turnover) FROM enterprises GROUP BY region, nace"


def _one_hidden_cell(db, rule: str = "") -> tuple[str, list[str], float]:
    """A region, a set of activities holding exactly one of its hidden primaries (whose rule
    names ``rule``) and all its published ones, and that hidden cell's value, from the
    suppression job ``by_nace`` (its sum; its count of firms when ``rule`` is ``freq``)."""
    aggregate = "COUNT(*)" if rule == "freq" else "SUM(turnover)"
    with duckdb.connect(str(db), read_only=True) as con:
        cells = con.sql(
            "SELECT region, nace, value, status, rule FROM protected.by_nace "
            "WHERE region <> 'Total' AND nace <> 'Total'"
        ).df()
        for region, rows in cells.groupby("region"):
            hidden = rows[
                rows.value.isna() & (rows.status == "primary") & rows.rule.str.contains(rule)
            ]
            shown = rows[rows.value.notna()]
            if len(hidden) and len(shown):
                chosen = hidden.nace.iloc[0]
                (truth,) = con.execute(
                    f"SELECT {aggregate} FROM enterprises WHERE region = ? AND nace = ?",
                    [region, chosen],
                ).fetchone()
                return region, sorted([chosen, *shown.nace]), float(truth)
    raise AssertionError("no region with a hidden primary and a published cell")


def _subset_sql(activities: list[str]) -> str:
    listed = ", ".join(f"'{a}'" for a in activities)
    return f"SELECT region, SUM(turnover) FROM enterprises WHERE nace IN ({listed}) GROUP BY region"


def _recovered(db, name: str, region: str, activities: list[str], column="value") -> float:
    """What a reader of both tables computes: the region's cell of ``name`` less the
    published cells (``column``: ``value``, or the counts ``n``) of ``by_nace`` among the
    activities."""
    with duckdb.connect(str(db), read_only=True) as con:
        (total,) = con.execute(
            f"SELECT value FROM protected.{name} WHERE region = ?", [region]
        ).fetchone()
        (shown,) = con.execute(
            f"SELECT SUM({column}) FROM protected.by_nace WHERE region = ? AND nace IN "
            f"({', '.join('?' for _ in activities)})",
            [region, *activities],
        ).fetchone()
    return float(total) - float(shown)


def test_a_job_whose_cells_add_up_a_suppressed_tables_cells_is_refused(jobs_demo_db):
    """Fails on main (both jobs stored; the hidden cell recovered exactly)."""
    protect_query(jobs_demo_db, "admin", SUPPRESSED, into="by_nace", rules=RULES)
    region, activities, truth = _one_hidden_cell(jobs_demo_db)
    sql = _subset_sql(activities)

    with pytest.raises(TabularError, match="add up to one another"):
        protect_query(jobs_demo_db, "admin", sql, into="subset", rules=RULES)
        # what main released: the hidden primary, exactly
        recovered = _recovered(jobs_demo_db, "subset", region, activities)
        assert recovered == pytest.approx(truth)  # pragma: no cover - reached on main only


def test_a_count_job_of_other_rows_beside_a_sum_jobs_counts_is_refused(jobs_demo_db):
    """The sum job's ``n`` hides the count of a primary of 1 or 2 firms; a count job by
    suppression over that cell's activity and its region's published ones, by region, gave it
    as the region's count less the published ``n`` (s45f demo: (R01, G), 2 firms). Count jobs
    by suppression were not compared with a sum job's counts at all. Fails on main."""
    protect_query(jobs_demo_db, "admin", SUPPRESSED, into="by_nace", rules=RULES)
    region, activities, truth = _one_hidden_cell(jobs_demo_db, "freq")
    assert truth in (1, 2)
    listed = ", ".join(f"'{a}'" for a in activities)
    sql = f"SELECT region, COUNT(*) FROM enterprises WHERE nace IN ({listed}) GROUP BY region"
    with pytest.raises(TabularError, match="share or add up to these"):
        protect_query(jobs_demo_db, "admin", sql, into="firms", rules=[parse_rule("freq:3")])
        recovered = _recovered(jobs_demo_db, "firms", region, activities, "n")
        assert recovered == truth  # pragma: no cover - reached on main only


def test_the_other_order_is_refused_too(jobs_demo_db):
    """R01's 90+ by education rounded to base 3 first, then 90+ by municipality x education
    suppressed: refused all the same. Fails on main."""
    round_query(jobs_demo_db, "admin", R01_ROUNDED, into="r90", base=3)
    with pytest.raises(TabularError, match="add up to one another"):
        protect_query(jobs_demo_db, "admin", A90, into="a90", rules=[parse_rule("freq:5")])


def test_a_count_rounding_of_a_sub_population_beside_a_suppressed_count_is_refused(
    jobs_demo_db,
):
    """90+ by municipality x education suppressed, R01's 90+ by education rounded to base 3
    (each cell the sum of R01's municipalities of that education). Fails on main."""
    protect_query(jobs_demo_db, "admin", A90, into="a90", rules=[parse_rule("freq:5")])
    with pytest.raises(TabularError, match="add up to one another"):
        round_query(jobs_demo_db, "admin", R01_ROUNDED, into="r90", base=3)


def test_nested_populations_of_other_cells_stay_allowed(jobs_demo_db):
    """A rounding of 80+ by region x sex beside 90+ by municipality x education suppressed: no
    cell of either is a sum of the other's inner cells; stored as before."""
    protect_query(jobs_demo_db, "admin", A90, into="a90", rules=[parse_rule("freq:5")])
    report = round_query(
        jobs_demo_db,
        "admin",
        "SELECT region, sex, COUNT(*) FROM persons WHERE age >= 80 GROUP BY region, sex",
        into="r80",
        base=3,
    )
    assert report is not None


def test_a_job_whose_cells_add_up_the_live_patterns_cells_is_refused(
    suppress_template, copy_database, tmp_path
):
    """The guard's pattern of enterprises by nace x region (the suppression demo) hides a cell
    of a region; a job of turnover over that activity and the region's published ones, by
    region, shares no cell with the pattern, and its region's cell less the published cells
    an analyst reads was the hidden one (s45f demo: (R04, H), 23,879,637, exactly). Fails on
    main."""
    db = copy_database(suppress_template, tmp_path)
    by_region = _live_cells(db, "SUM(turnover)")
    region, row = next(
        (r, row)
        for r, row in sorted(by_region.items())
        if any(v is None for v in row.values()) and any(v is not None for v in row.values())
    )
    hidden = sorted(n for n, v in row.items() if v is None)[0]
    shown = sorted(n for n, v in row.items() if v is not None)
    with duckdb.connect(str(db), read_only=True) as raw:
        (truth,) = raw.execute(
            "SELECT SUM(turnover) FROM enterprises WHERE region = ? AND nace = ?", [region, hidden]
        ).fetchone()
    sql = _subset_sql([hidden, *shown])
    with pytest.raises(TabularError, match="add up to cells of that pattern"):
        protect_query(db, "admin", sql, into="subset", rules=[parse_rule("freq:3")])
        with duckdb.connect(str(db), read_only=True) as raw:
            (total,) = raw.execute(
                "SELECT value FROM protected.subset WHERE region = ?", [region]
            ).fetchone()
        recovered = total - sum(row[n] for n in shown)
        assert recovered == pytest.approx(truth)  # pragma: no cover - reached on main only


def test_a_file_whose_counts_add_up_the_live_patterns_counts_is_refused(
    suppress_template, copy_database, tmp_path
):
    """An anonymised file of the enterprises of a hidden count's activity and its region's
    published ones, region exact (employees noised): its region's records less the published
    counts were the hidden count (s45f demo: (R01, G), 2 firms, from 12 records less 5 and
    5). Fails on main."""
    db = copy_database(suppress_template, tmp_path)
    by_region = _live_cells(db, "COUNT(*)")
    _file_of_two_activities(
        db, by_region, "add up to cells of that pattern|is the sum of two or more inner cells"
    )


def _live_cells(db, aggregate: str) -> dict[str, dict[str, float | None]]:
    """The live pattern's cells of ``aggregate`` by region and nace, as the analyst reads them
    (None: suppressed)."""
    with sqlsdc.connect(db, user="analyst") as con:
        cells = con.execute(
            f"SELECT region, nace, {aggregate} AS v FROM enterprises GROUP BY region, nace"
        ).fetchall()
    by_region: dict[str, dict[str, float | None]] = {}
    for region, nace, value in cells:
        by_region.setdefault(region, {})[nace] = value
    return by_region


def _file_of_two_activities(db, by_region, refusal: str) -> None:
    """Anonymise the enterprises of a hidden count's activity and a published one of its
    region (:func:`_far_apart`), region exact, and expect ``refusal``; on main, the file's
    records of the region less the published count are the hidden one (a count of 1 or 2
    where the sum job's freq rule hid it)."""
    with duckdb.connect(str(db), read_only=True) as raw:
        region, hidden, shown, truth = _far_apart(raw, by_region)
    listed = ", ".join(f"'{a}'" for a in [hidden, *shown])
    sql = f"SELECT region, employees FROM enterprises WHERE nace IN ({listed})"
    with pytest.raises(MicrodataError, match=refusal):
        anonymize(db, user="admin", into="grp", sql=sql, steps=["noise:employees:c=0.5"])
        with duckdb.connect(str(db), read_only=True) as raw:
            (records,) = raw.execute(
                "SELECT COUNT(*) FROM protected.grp WHERE region = ?", [region]
            ).fetchone()
        published = sum(by_region[region][n] for n in shown)
        assert records - published == truth  # pragma: no cover - reached on main only


def _far_apart(raw, by_region) -> tuple[str, str, list[str], int]:
    """A region, a hidden count of it, one published count of it, and the hidden count's
    truth, such that every region holds none or 10 or more firms outside the two activities
    (the differencing check refuses a file whose region cell is a few firms short of the
    pattern's region total; the attack needs only the two cells)."""
    outside = raw.execute(
        "SELECT region, nace, COUNT(*) FROM enterprises GROUP BY region, nace"
    ).fetchall()
    for region, row in sorted(by_region.items()):
        for hidden in sorted(n for n, v in row.items() if v is None):
            for shown in sorted(n for n, v in row.items() if v is not None):
                left: dict[str, int] = {}
                for r, n, k in outside:
                    if n not in (hidden, shown):
                        left[r] = left.get(r, 0) + k
                if all(k == 0 or k >= 10 for k in left.values()):
                    (truth,) = raw.execute(
                        "SELECT COUNT(*) FROM enterprises WHERE region = ? AND nace = ?",
                        [region, hidden],
                    ).fetchone()
                    return region, hidden, [shown], truth
    raise AssertionError("no such pair of activities")


def test_a_file_whose_counts_add_up_a_suppression_jobs_counts_is_refused(jobs_demo_db):
    """Turnover by region x nace suppressed (its ``n`` hides a count of 1 or 2 firms), then a
    file of the enterprises of that activity and one its region publishes, region exact: the
    file's records of the region less the published ``n`` were the hidden count (s45f demo:
    (R01, G), 12 - 10 = 2). Fails on main."""
    protect_query(jobs_demo_db, "admin", SUPPRESSED, into="by_nace", rules=RULES)
    with duckdb.connect(str(jobs_demo_db), read_only=True) as raw:
        cells = raw.execute(
            "SELECT region, nace, n, rule FROM protected.by_nace "
            "WHERE region <> 'Total' AND nace <> 'Total'"
        ).fetchall()
        by_region: dict[str, dict[str, int | None]] = {}
        for region, nace, n, rule in cells:
            if n is not None or "freq" in rule:  # the hidden ones: counts of 1 or 2
                by_region.setdefault(region, {})[nace] = n
    _file_of_two_activities(jobs_demo_db, by_region, "is the sum of two or more inner cells")


def _dominated_group(raw) -> tuple[str, str, float]:
    """A region and activity of 10 or more firms (the minimum frequency the differencing check
    asks of a difference) that p:10 flags, while the region's cells with and without it pass
    p:10 (the jobs' default rules publish both)."""

    def p_sensitive(values) -> bool:
        ordered = sorted(values, reverse=True) + [0.0, 0.0]
        return sum(ordered) - ordered[0] - ordered[1] < 0.10 * ordered[0]

    rows = raw.execute("SELECT region, nace, turnover FROM enterprises").fetchall()
    for region in sorted({r for r, _n, _t in rows}):
        mine = [(n, t) for r, n, t in rows if r == region]
        for nace in sorted({n for n, _t in mine}):
            group = [t for n, t in mine if n == nace]
            rest = [t for n, t in mine if n != nace]
            if len(group) >= 10 and p_sensitive(group) and not p_sensitive(rest):
                if not p_sensitive([t for _n, t in mine]):
                    return region, nace, float(sum(group))
    raise AssertionError("no dominated activity of 10 or more firms")


def test_two_jobs_whose_difference_is_a_dominated_group_are_refused(jobs_demo_db):
    """Two suppression jobs of turnover with the default rules (freq, p:10): a region, and the
    region without one activity of 10 or more firms that p:10 flags. Each cell passes its
    rules and the two populations differ by 10 or more firms, so both are stored; their
    difference is the activity's total, which tells its largest firm within p %."""
    with duckdb.connect(str(jobs_demo_db), read_only=True) as raw:
        region, nace, truth = _dominated_group(raw)
    whole = (
        f"SELECT region, SUM(turnover) FROM enterprises WHERE region = '{region}' GROUP BY region"
    )
    without = whole.replace("GROUP BY", f"AND nace <> '{nace}' GROUP BY")
    try:
        protect_query(jobs_demo_db, "admin", whole, into="whole")
        protect_query(jobs_demo_db, "admin", without, into="without")
    except TabularError as refused:
        assert "p(10)" in str(refused) and "whole" in str(refused)
        return  # refused: the group stays unknown
    with duckdb.connect(str(jobs_demo_db), read_only=True) as raw:
        (a,) = raw.execute(
            "SELECT value FROM protected.whole WHERE region = ?", [region]
        ).fetchone()
        (b,) = raw.execute(
            "SELECT value FROM protected.without WHERE region = ?", [region]
        ).fetchone()
    assert a is None or b is None or a - b != pytest.approx(truth)

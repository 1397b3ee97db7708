"""Red team s38e: the three changes merged in session 38, attacked with an analyst's guarded
connection (rounding mean before sum; the counted-units key) and as an admin running jobs in
the order a careless office would (anonymised files in the jobs' differencing check).

Closed here (each test failed before its fix):

- **A job that splits a band of a file, less the band above.** The README's seniors file (R01
  aged 65+, age banded 65/75/85) and a suppression job of everyone aged 84+ by region and
  education: the job's (R01, upper secondary), 60, less the file's (R01, upper secondary,
  ``>=85``), 59, is the one person aged 84. The check compared a job's cell with a file's cut
  only for the file's units outside the job; now a cell is compared with the other release's
  inner cells that cover it, and the units of those cells that lie in the cell's own release
  but in another of its inner cells, only partly covered (the file's band 75-84 less its
  84-year-old), count as a difference (``sqlsdc.jobs.differencing._uncovered``, after the
  merge with red team s38b's covering cells). Both orders; a job along the file's bands is
  still stored.
- **A release, then suppression switched on.** A file of everyone aged 1+ (income only
  top-coded), or an exact job of their counts, stored under the threshold policy, then
  ``admin.apply`` of suppression by geography x sex: the pattern's cell less the file's gave
  90 cells of 1-4 persons aged 0 (and their incomes). The check ran only when a job or a file
  was stored; ``apply_policy`` now checks each suppression pattern against the exact tables
  and files stored (``sqlsdc.jobs.protect.refuse_pattern_differences``).
- **A file whose query is not a plain WHERE.** s37c's file of everyone aged 85+ written as a
  derived table, a CTE, a join with a public table or a UNION ALL was left out of the check,
  next to the suppression job of the same people but one, in either order. Such a file cannot
  be compared: it is refused next to an exact table of a table it reads, and a job (or a
  pattern) next to it (``sqlsdc.jobs.record_files.opaque_tables``); alone it is stored.
- **Two anonymised files of one table** were not compared: after the seniors file, a file
  of everyone aged 84+ banded at 84 gave the person aged 84 again (either order), once both
  are released. Each file's counts by its plain columns are now compared with the other's
  cells and cuts where files become released together
  (``sqlsdc.jobs.file_pairs.refuse_file_pairs``): a file stored next to a file listed under
  ``releases:`` (or listed itself), a policy listing both, a ``publish`` holding both
  (``--include``). Candidates withheld are stored side by side, as the README's comparison of
  settings needs.
- **One income padded with zero incomes** (session 39): ``SUM(income) WHERE (municipality =
  M AND age = 94) OR income = 0`` passed the frequency rule on 1,877 zero incomes and was the
  lone 94-year-old's income rounded to 100 (exact under the threshold rule). Magnitudes under
  threshold and round now have a dominance rule on the per-unit contributions, the p%-rule by
  default (``sqlsdc.rewrite.dominance``): T − x1 − x2 = 0 < 10 % of x1, suppressed.
- **A small cell padded with zeros passed the frequency rule** (session 39): under the
  threshold rule (min_frequency 10, p%-rule) a cell of 3-9 non-zero incomes suppressed alone
  was published exactly with ``OR income = 0`` (29 of 30 tried); under rounding within the
  base. The frequency rule of a magnitude now counts its contributors, the units of non-zero
  value (GaussSuppression's ``NContributorsRule``, ``remove0 = TRUE``;
  ``sqlsdc.rewrite.cells.frequency_count``): the zeros lift no cell over it, and a cell of
  zeros only is suppressed. Rows of other known values still pad (open, above).

- **A replaced file was forgotten by the check**, though its readers keep it: the job of
  aged 84+ after the seniors file was replaced by one without age was stored. The catalog
  keeps every output's definition since session 39 (``sqlsdc.jobs.output_history``), and a
  job is compared with every earlier version of a file (test below; more in
  ``tests/jobs/test_output_history.py``), as with a replaced job's tables (red team s38b).

Left open (strict xfail):

- **A rounded pinned sum diluted by small values tells the count** (design). ``SUM(age) WHERE
  (municipality = M AND age = 94) OR age = 0``: the 144 babies added 0 to S and 144 to n, so
  n̂/n was within 4 % of 1 and the sum R_100(94·k) give or take 25: k exactly in most
  municipalities (R02-M018: 700, so 7, where COUNT shows 5 or 10). Closed for zeros in session
  39: a rounded sum's contributors are its rows of non-zero value (n, n̂ and the coin), so the
  padded sum is the unpadded R_100(94·n̂) (test below). Rows of a small known non-zero value
  (``OR age = 1``, 132 persons) still dilute: S = 94·k + m, m known within the counts' base,
  is published within B/2 + mean·b, and k is told (34 of 40 municipalities; the padding also
  keeps the p%-rule from firing on one or two persons). Mean before sum's error is the mean
  times the count's rounding; it needs one that scales with the largest contributions. The
  dominance rule closes one or two persons only where nothing pads them: k equal
  contributions v leave T − x1 − x2 = (k − 2)·v, at least 10 % of x1 = v from k = 3; no
  contribution dominates, and what the sum tells is the count k, which a rule on
  contributions does not judge.
- Two files are compared cut against cell, not cut against cut.
- Not a test (an observation): an orphan's key is the keyed mix (quadratic maps mod a prime,
  not a PRF) of ``hash`` of a stored value an analyst may know, where the mix had only
  secret cell keys as inputs before; its outputs show only through a cell's noise or
  rounding coin, and no practical recovery of the constants was found. A keyed hash (e.g.
  ``sha256`` of a secret joined from the catalog and the value) would remove the question.
- Not a test (a timing): the check's CUBE over a file's exact cut columns is exponential. A
  20,000-row table with a job stored, then a file of every column (microaggregated measure):
  6 dimensions 0.65 s CPU, 10 dimensions 6 s, 12 dimensions 30 s CPU (82 s wall); each later
  job and ``admin.apply`` repeats it per stored file.

Tried and held: rounding (20,000-person demo, counts base 5 unbiased, magnitudes base 100) —
NULL rows added to a cell (``OR income IS NULL``) change neither n nor the key (the key sums
records where the argument is present); HAVING/ORDER BY on SUM read the published values;
``SUM(CASE ... ELSE 0 END)`` refused (pads the cell); negation, products and exact arithmetic
that can overflow refused; constants and ``* 1e300`` applied after protection; a sum over a
join whose rows repeat refused; an all-NULL cell gives NULL count, sum and mean alike (no
oracle); a count published as 0 gives sum 0 and AVG NULL. Counted units — every spelling
(join either way, derived table) of the households of a region gives one answer, and under
rounding so do the households of a scheme's recipients through benefits ⋈ persons (⋈
households), in either order and over any months; an
identifier cast, a CASE or an arithmetic on it, DISTINCT rows, IN subqueries, ``hash()``, the
catalog's ``sqlsdc.ckm_mix``, the alias ``__mix`` and its columns are refused; integer widths
of a reference hash alike in DuckDB (INTEGER, BIGINT, HUGEINT, DECIMAL of scale 0: one orphan
key; VARCHAR does not, which needs the admin to store references with two types); keys are
distinct per table, so SUM(DISTINCT key) loses no unit. Files — populations written two ways
(``age >= 65``, ``NOT age < 65``) are compared by row membership; a band of a dimension written
in SQL (``CASE WHEN age >= 85 ...``) is a cut like a recode (test below); ORDER BY and LIMIT
in a file's query keep its WHERE.
"""

from __future__ import annotations

import math
import re

import pytest

import sqlsdc
from sqlsdc import admin
from sqlsdc.engines.duckdb import open_database
from sqlsdc.errors import MicrodataError, PolicyError, PolicyViolation, TabularError
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.policy import load_policy
from sqlsdc.release import publish
from sqlsdc.tabular.rules import FrequencyRule

# ------------------------------------------ a job that splits a band of an anonymised file

SENIORS = "SELECT * FROM persons WHERE region = 'R01' AND age >= 65"


def _seniors(db):
    """The README's file: R01 aged 65 or over, age banded 65/75/85 (exact band counts)."""
    return anonymize(db, user="admin", into="seniors_r01", sql=SENIORS, seed=7,
                     steps=["recode:age:breaks=65/75/85", "microaggregate:income:k=5"])  # fmt: skip


def _aged(db, least: int):
    """Everyone aged ``least`` or over by region and education, suppression at 5."""
    return protect_query(db, "admin", "SELECT region, education, COUNT(*) FROM persons WHERE "
                         f"age >= {least} GROUP BY region, education", into=f"aged_{least}",
                         rules=[FrequencyRule(5)])  # fmt: skip


def _aged_84_of_r01(db) -> dict:
    con = open_database(db)
    try:
        return dict(con.execute("SELECT CAST(education AS VARCHAR), count(*) FROM persons WHERE "
                                "region = 'R01' AND age = 84 GROUP BY 1").fetchall())  # fmt: skip
    finally:
        con.close()


def _aged_84(db) -> None:
    _aged(db, 84)


def _aged_85(db) -> None:
    _aged(db, 85)


@pytest.mark.parametrize("first", ["file", "job"])
def test_a_job_that_splits_a_band_less_the_band_above_it(jobs_state, tmp_path, first):
    """The README's seniors file (R01 aged 65+, age banded 65/75/85), and a suppression job of
    everyone aged 84 or over by region and education: the job's cell (R01, upper secondary),
    60 persons, less the file's cell (R01, upper secondary, >=85), 59, is the one person aged
    84. The check compared the job's cell with the file's same cell (65+: 117 more, on the
    file's side, allowed) and with its cuts only for the file's units outside the job, so
    the job was stored, in either order. The check refuses it now at the first cell it meets
    (R01, lower secondary: the file's cells that cover the job's hold 5 persons aged 75-83
    too); the coarser file of the next test shows the band itself."""
    jobs_demo_db = jobs_state(_seniors if first == "file" else _aged_84, tmp_path)
    assert _aged_84_of_r01(jobs_demo_db)["upper_secondary"] == 1
    if first == "file":
        with pytest.raises(TabularError, match=r"seniors_r01 overlap and differ by only \d unit"):
            _aged(jobs_demo_db, 84)
    else:
        with pytest.raises(MicrodataError, match=r"seniors_r01 overlap and differ by only \d unit"):
            _seniors(jobs_demo_db)


@pytest.mark.parametrize("first", ["file", "job"])
def test_a_band_written_in_sql_is_a_cut_too(jobs_demo_db, first):
    """The seniors' band written as a CASE in the file's query (and its population as ``NOT
    age < 65``), no other column but region and education: the same cut, refused at the band
    ``85+`` itself, in either order."""

    def file():
        anonymize(jobs_demo_db, user="admin", into="band_file", seed=7,
                  sql="SELECT region, education, CASE WHEN age >= 85 THEN '85+' ELSE '65-84' END "
                  "AS band FROM persons WHERE region = 'R01' AND NOT age < 65",
                  steps=["suppress:region,education,band:k=1"])  # fmt: skip

    if first == "file":
        file()
        with pytest.raises(TabularError, match=r"differ by only \d unit.*band = '85\+'"):
            _aged(jobs_demo_db, 84)
    else:
        _aged(jobs_demo_db, 84)
        with pytest.raises(MicrodataError, match=r"differ by only \d unit.*band = '85\+'"):
            file()


@pytest.mark.parametrize("first", ["file", "job"])
def test_a_job_along_the_file_s_bands_is_still_stored(jobs_state, tmp_path, first):
    """Aged 85 or over is the file's band ``>=85``: its records outside the job are its own
    cells, nothing new; both orders are stored."""
    jobs = [_seniors, _aged_85]
    if first == "job":
        jobs.reverse()
    jobs[1](jobs_state(jobs[0], tmp_path))


# --------------------------------------- a file (or a job), then suppression switched on


def _suppression(db):
    from tests.conftest import suppress_document

    admin.apply(db, load_policy(suppress_document()), "admin")


@pytest.mark.parametrize("kind", ["file", "job"])
def test_a_release_then_suppression_switched_on(jobs_demo_db, kind):
    """A file of everyone aged 1 or over (income only top-coded far above any income), or an
    exact suppression job of their number by municipality and sex, stored under the
    threshold policy; then the admin applies suppression of persons by geography x sex. The
    pattern's cell less the file's is the persons aged 0 of the cell (90 cells of 1-4, with
    their incomes): the check ran only when a job or a file was stored, against the pattern
    then in force. Applying the policy is refused now, naming both."""
    if kind == "file":
        sql = "SELECT region, municipality, sex, income FROM persons WHERE age >= 1"
        anonymize(jobs_demo_db, user="admin", into="nonzero", sql=sql,
                  steps=["topcode:income:upper=1e9"])  # fmt: skip
    else:
        protect_query(jobs_demo_db, "admin", "SELECT municipality, sex, COUNT(*) FROM persons "
                      "WHERE age >= 1 GROUP BY municipality, sex", into="nonzero",
                      rules=[FrequencyRule(5)])  # fmt: skip
    with pytest.raises(PolicyError, match=r"suppression pattern of persons and that of .*nonzero "
                       r"overlap and differ by only \d unit"):  # fmt: skip
        _suppression(jobs_demo_db)
    assert admin.show(jobs_demo_db)[0] == 1  # the policy in force is still the first


def test_a_file_of_the_whole_table_then_suppression_is_refused(jobs_demo_db):
    """No unit off in any cell, but every cell of the pattern in the file, the hidden ones too
    (red team s39b: was allowed here; ``sqlsdc.jobs.live_cells``)."""
    anonymize(jobs_demo_db, user="admin", into="everyone", steps=["topcode:income:upper=1e9"],
              sql="SELECT region, municipality, sex, income FROM persons")  # fmt: skip
    with pytest.raises(PolicyError, match="holds the same units as a cell of that pattern"):
        _suppression(jobs_demo_db)
    assert admin.show(jobs_demo_db)[0] == 1


# ------------------------------------------------------- rounding: mean before sum diluted


@pytest.fixture(scope="module")
def rounded_db(rounded_template, tmp_path_factory, copy_database):
    """Counts rounded to 5 (unbiased), magnitudes to 100 (conventional), as in s37d."""
    return copy_database(rounded_template, tmp_path_factory.mktemp("s38e-round"))


@pytest.fixture(scope="module")
def unbiased_db(rounded_template, tmp_path_factory, copy_database):
    """``rounded_db`` with magnitudes rounded unbiased (a coin per sum, from its cell key)."""
    path = copy_database(rounded_template, tmp_path_factory.mktemp("s39-unbiased"))
    _version, document, _history = admin.show(path)
    document["protection"]["magnitudes"]["rounding"] = "unbiased"
    admin.apply(path, load_policy(document), "admin")
    return path


def test_rows_of_value_zero_give_an_unbiased_sum_no_new_coin(unbiased_db):
    """The children of region R01 have income 0; leaving out those of some ages keeps the exact
    sum S. Keyed by every row, each of 200 such queries drew its own coin for R_100(S) (counts
    exact) and its own n̂/n beside rounded counts: on a build of the demo 2 values whose share
    of the upper one, 0.980, told r/B = 0.963, the mean of 200 within 2 of S (exact counts), and
    125 values whose mean converged on S (rounded counts). The sum's coin, n and n̂ are now
    those of its non-zero rows, and its AVG's count that of ``COUNT(income)``: one sum."""
    base = "SELECT SUM(income), AVG(income), COUNT(income) FROM persons WHERE region = 'R01'"
    cells = set()
    with sqlsdc.connect(unbiased_db, user="analyst") as con:
        for ages in ["0", "1", "2, 3", "4, 5, 6", "0, 15", "7, 8, 9, 10, 11"]:
            padded = f"{base} AND NOT (income = 0 AND age IN ({ages}))"
            cells.add(con.execute(padded).fetchone())
        plain = con.execute(base).fetchone()
    assert len({total for total, _mean, _count in cells}) == 1
    assert {total for total, _m, _c in cells} == {plain[0]}
    for total, mean, count in cells:  # the mean: that sum over the published COUNT(income)
        assert count % 5 == 0 and mean == total / count
    # a cell of zeros only has no contributor: the frequency rule suppresses its sum and mean
    # (session 39), and publishes the count of its rows
    with sqlsdc.connect(unbiased_db, user="analyst") as con:
        children = con.execute(f"{base} AND age < 16").fetchone()
    assert children[:2] == (None, None) and children[2] >= 100


def _aged_94(db) -> list[tuple[str, int]]:
    """(municipality, persons aged 94) where that count is no multiple of the counts' base."""
    raw = open_database(db)
    try:
        return raw.execute("SELECT municipality, count(*) FROM persons WHERE age = 94 "
                           "GROUP BY 1 HAVING count(*) % 5 <> 0 ORDER BY 1").fetchall()  # fmt: skip
    finally:
        raw.close()


def test_a_pinned_sum_padded_with_zeros_is_the_unpadded_sum(rounded_db):
    """``SUM(age) WHERE (municipality = M AND age = 94) OR age = 0``: the babies added 0 to S and
    144 to n, so n̂/n was within 4 % of 1 and the sum R_100(94·k) give or take 25: 700 for
    R02-M018's 7 persons aged 94, where COUNT shows 5 or 10 (s38e's strict xfail). A sum's
    contributors are its rows of non-zero value (session 39, as under CKM): n, n̂ and the coin
    are those of the persons aged 94, and the padded sum is the unpadded one, R_100(94·n̂) with
    n̂ their published count: nothing the count does not tell."""
    counts = _aged_94(rounded_db)
    told, published = [], 0
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        for municipality, k in counts[:40]:
            cell = f"municipality = '{municipality}' AND age = 94"
            (alone,) = con.execute(f"SELECT SUM(age) FROM persons WHERE {cell}").fetchone()
            (total,) = con.execute(
                f"SELECT SUM(age) FROM persons WHERE ({cell}) OR age = 0"
            ).fetchone()
            assert total == alone
            if total is None:  # one or two persons: dominated (the p%-rule), suppressed
                continue
            published += 1
            (shown,) = con.execute(f"SELECT COUNT(*) FROM persons WHERE {cell}").fetchone()
            assert total == math.floor(94 * shown / 100 + 0.5) * 100  # conventional R_100
            candidates = [n for n in range(1, 60) if abs(94 * n - total) < 50]
            if candidates == [k]:
                told.append((municipality, k, total))
    assert len(counts) >= 20 and published >= 5
    assert not told, told


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="open (design): mean before sum's error is the mean times the count's rounding, "
    "S·(n̂ − n)/n, plus B/2; m rows of a small known value w (age = 1) in the cell make the mean "
    "small and add w·m to S, with m published within the counts' base b: S = 94·k + w·m is "
    "told within B/2 + w·b + mean·b, under 94/2 for B = 100, b = 5, w = 1, so k exactly. Rows "
    "of value 0 no longer do this (they are no contributors); closing it for w > 0 needs an "
    "error that scales with the largest contributions (a base of about b·x1, or CKM's flex "
    "noise), not with the mean",
)
def test_a_pinned_sum_diluted_by_small_values_does_not_tell_the_count(rounded_db):
    """``SUM(age) WHERE (municipality = M AND age = 94) OR age = 1``: the demo's 132 persons aged
    1 add 132 to S and to n, so n̂/n is within 4 % of 1 and the published sum is 94·k + m
    rounded to 100, give or take the mean (about 1.5) times 4; with m within 4 of the
    published ``COUNT(*) WHERE age = 1``, one k fits (34 of 40 municipalities on a build of
    the demo). The padding's small contributions also keep the p%-rule from firing on the
    one or two persons aged 94 that the cell alone suppresses."""
    counts = _aged_94(rounded_db)
    told = []
    with sqlsdc.connect(rounded_db, user="analyst") as con:
        (ones,) = con.execute("SELECT COUNT(*) FROM persons WHERE age = 1").fetchone()
        for municipality, k in counts[:40]:
            (total,) = con.execute(
                f"SELECT SUM(age) FROM persons WHERE (municipality = '{municipality}' AND "
                "age = 94) OR age = 1"
            ).fetchone()
            if total is None:
                continue
            fits = [
                n
                for n in range(1, 60)
                if any(
                    abs(94 * n + m - total) < 50 + 0.05 * total for m in range(ones - 4, ones + 5)
                )
            ]
            if fits == [k]:
                told.append((municipality, k, total))
    assert len(counts) >= 20
    assert not told, told


def test_a_small_cell_padded_with_zeros_stays_suppressed(demo_db):
    """Threshold rule, min_frequency 10, p%-rule: ``SUM(income) WHERE (municipality = M AND sex =
    S AND age = 50) OR income = 0`` for cells of 3 to 9 non-zero incomes that are suppressed
    alone (29 of 30 published exactly on a build of the demo, session 39). The frequency rule of
    a magnitude counts its contributors, the units of non-zero value (session 39, as
    GaussSuppression's ``NContributorsRule``): the zeros lift no cell over it."""
    raw = open_database(demo_db)
    try:
        cells = raw.execute(
            "SELECT municipality, sex, sum(income) FROM persons WHERE age = 50 AND income <> 0 "
            "GROUP BY 1, 2 HAVING count(*) BETWEEN 3 AND 9 ORDER BY 1, 2 LIMIT 20"
        ).fetchall()
    finally:
        raw.close()
    told, hidden = [], 0
    with sqlsdc.connect(demo_db, user="analyst") as con:
        for municipality, sex, total in cells:
            cell = f"municipality = '{municipality}' AND sex = '{sex}' AND age = 50"
            (alone,) = con.execute(f"SELECT SUM(income) FROM persons WHERE {cell}").fetchone()
            if alone is not None:
                continue
            hidden += 1
            (padded,) = con.execute(
                f"SELECT SUM(income) FROM persons WHERE ({cell}) OR income = 0"
            ).fetchone()
            if padded is not None and abs(float(padded) - float(total)) < 0.01:
                told.append((municipality, sex, padded))
    assert hidden >= 10
    assert not told, told


# ------------------------------------------ a file whose population is no WHERE on the table

OPAQUE = [
    "SELECT * FROM (SELECT region, sex, education, income FROM persons WHERE age >= 85) AS t",
    "WITH t AS (SELECT region, sex, education, income FROM persons WHERE age >= 85) "
    "SELECT * FROM t",
    "SELECT p.region, p.sex, p.education, p.income FROM persons AS p JOIN regions AS r "
    "ON p.region = r.region WHERE p.age >= 85",
    "SELECT region, sex, education, income FROM persons WHERE age >= 85 UNION ALL "
    "SELECT region, sex, education, income FROM persons WHERE age < 0",
]


def _lonely_minus(db) -> str:
    """s37c's job: incomes of everyone aged 85+ by sex, less the one of a municipality."""
    con = open_database(db)
    try:
        ((municipality,),) = con.execute(
            "SELECT municipality FROM persons WHERE age >= 85 GROUP BY municipality "
            "HAVING count(*) = 1 ORDER BY municipality LIMIT 1"
        ).fetchall()
    finally:
        con.close()
    return (
        "SELECT sex, SUM(income) FROM persons WHERE age >= 85 AND municipality <> "
        f"'{municipality}' GROUP BY sex"
    )


def _inc_minus(db) -> None:
    """s37c's job stored (the first step of the ``job`` cases below)."""
    protect_query(db, "admin", _lonely_minus(db), into="inc_minus")


def _no_job(db) -> None:
    """Nothing stored (the demo of ``jobs_demo_db``)."""


@pytest.mark.parametrize("sql", OPAQUE, ids=["derived", "cte", "join", "union"])
@pytest.mark.parametrize("first", ["job", "file"])
def test_a_file_written_as_a_subquery_cte_join_or_union_is_not_left_out(
    jobs_state, tmp_path, sql, first
):
    """s37c's attack (the file of everyone aged 85+, income only top-coded, and a suppression
    job of the same people but one) with the file's query written as a derived table, a CTE,
    a join with a public table or a union: its population was no WHERE on persons, so the
    file was left out of the check and both were stored. Such a file cannot be compared: it
    is refused next to an exact table of persons, and a job next to it."""
    jobs_demo_db = jobs_state(_inc_minus if first == "job" else _no_job, tmp_path)
    job = _lonely_minus(jobs_demo_db)

    def file():
        anonymize(jobs_demo_db, user="admin", into="aged_file", sql=sql,
                  steps=["topcode:income:upper=1e9"])  # fmt: skip

    if first == "job":
        with pytest.raises(MicrodataError, match="population is no WHERE on persons"):
            file()
    else:
        file()
        with pytest.raises(TabularError, match="population is no WHERE on persons"):
            protect_query(jobs_demo_db, "admin", job, into="inc_minus")


def test_a_file_as_a_subquery_with_no_exact_table_is_stored(jobs_demo_db):
    anonymize(jobs_demo_db, user="admin", into="aged_file", sql=OPAQUE[1],
              steps=["topcode:income:upper=1e9"])  # fmt: skip


def _aged_84_file(db):
    """Everyone aged 84 or over, age banded at 84."""
    return anonymize(db, user="admin", into="aged_84", seed=7,
                     sql="SELECT region, education, age FROM persons WHERE age >= 84",
                     steps=["recode:age:breaks=84"])  # fmt: skip


def _releasing(db, *names):
    """Apply the policy in force again, with ``releases:`` listing ``names``."""
    _version, document, _history = admin.show(db)
    admin.apply(db, load_policy({**document, "releases": list(names)}), "admin")


@pytest.mark.parametrize("listed", ["first", "second"])
@pytest.mark.parametrize("first", ["seniors", "aged_84"])
def test_two_files_whose_bands_differ_by_one_year(jobs_demo_db, first, listed):
    """The README's seniors file (band ``>=85``) and a file of everyone aged 84 or over with
    age banded at 84: the second's (R01, upper secondary, ``>=84``) less the first's (R01,
    upper secondary, ``>=85``) is the one person aged 84. Two files of one table were not
    compared; now each file's counts by its columns kept as they are are compared with the
    other's cells and cuts, in either order, when one of them is released (listed under
    ``releases:``, which the guard shows to analysts and ``publish`` copies): the second
    stored next to the released first, and the released second next to the first stored."""
    files = {
        "seniors": lambda: _seniors(jobs_demo_db),
        "aged_84": lambda: _aged_84_file(jobs_demo_db),
    }
    second = "aged_84" if first == "seniors" else "seniors"
    names = {"seniors": "seniors_r01", "aged_84": "aged_84"}
    _releasing(jobs_demo_db, names[first if listed == "first" else second])
    files[first]()
    with pytest.raises(
        MicrodataError,
        match=r"(aged_84 and that of .*seniors_r01|seniors_r01 and that of .*aged_84) overlap "
        r"and differ by only \d unit",
    ):
        files[second]()


def test_withheld_candidates_are_compared_once_released_together(
    jobs_state, tmp_path, sqlsdc_in_process
):
    """The same two files stored as candidates, neither released: both are stored (an admin
    compares settings side by side, README) and reported by ``microdata-report``. Releasing
    both is refused, naming both files and the cell: a policy listing both (the policy in
    force stays), and a publication that includes both (exit 3, nothing written, audited as
    refused); either alone is published."""
    jobs_demo_db = jobs_state(_seniors, tmp_path)
    _aged_84_file(jobs_demo_db)
    report = sqlsdc_in_process("microdata-report", jobs_demo_db, "seniors_r01", "aged_84",
                               "--format", "json")  # fmt: skip
    assert report.returncode == 0, report.stderr
    assert "protected.aged_84" in report.stdout and "protected.seniors_r01" in report.stdout
    both = r"aged_84 and .*seniors_r01.* differ by only \d+ unit"
    version = admin.show(jobs_demo_db)[0]
    with pytest.raises(PolicyError, match=r"releases: lists .*" + both):
        _releasing(jobs_demo_db, "seniors_r01", "aged_84")
    assert admin.show(jobs_demo_db)[0] == version
    out = tmp_path / "release.duckdb"
    refused = sqlsdc_in_process("publish", jobs_demo_db, out, "--include", "seniors_r01",
                                "--include", "aged_84")  # fmt: skip
    assert refused.returncode == 3, refused.stderr
    assert re.search(r"publication would hold .*" + both, refused.stderr.replace("\n", " "))
    assert not out.exists() and not list(tmp_path.glob("*.partial"))
    assert admin.audit(jobs_demo_db, "admin", limit=1)["decision"].tolist() == ["refused"]
    _releasing(jobs_demo_db, "seniors_r01")
    with pytest.raises(PolicyViolation, match="publication would hold .*" + both):
        publish(jobs_demo_db, out, "admin", include=["aged_84"])
    report = publish(jobs_demo_db, out, "admin")
    assert [t.table for t in report.tables if t.method == "anonymize"] == ["seniors_r01"]
    assert [w.table for w in report.withheld] == ["aged_84"]


def test_a_job_next_to_a_replaced_file(jobs_state, tmp_path):
    """The seniors file (band ``>=85``) replaced by one without age, then the job of everyone
    aged 84+ by region and education: compared with the new file only, it was stored, and a
    reader of the first file got the person aged 84 as before. Compared with the first
    version too (``sqlsdc.jobs.output_history``), it is refused."""
    jobs_demo_db = jobs_state(_seniors, tmp_path)
    anonymize(jobs_demo_db, user="admin", into="seniors_r01", seed=7, replace=True,
              sql="SELECT region, education, sex FROM persons WHERE region = 'R01' AND age >= 65",
              steps=["suppress:region,education,sex:k=1"])  # fmt: skip
    with pytest.raises(TabularError, match="differ by only"):
        _aged(jobs_demo_db, 84)


def test_a_job_next_to_a_replaced_job(jobs_state, tmp_path):
    """Everyone aged 85+ by region and education, replaced by everyone aged 60+, then everyone
    aged 84+: compared with the 60+ table only, it was stored; next to the first table (as
    its readers hold it: ``sqlsdc.jobs.protect.exact_tables`` reads a replaced job's earlier
    versions from the jobs' audit entries, red team s38b) it is refused, the person aged 84 of
    (R01, upper secondary)."""
    jobs_demo_db = jobs_state(_aged_85, tmp_path)
    protect_query(jobs_demo_db, "admin", "SELECT region, education, COUNT(*) FROM persons WHERE "
                  "age >= 60 GROUP BY region, education", into="aged_85", replace=True,
                  rules=[FrequencyRule(5)])  # fmt: skip
    # the first version shares cells with the 84+ table (those without a person aged 84): a
    # second protection of them beside a version its readers keep (red team s41k)
    with pytest.raises(TabularError, match="differ by only|as job 1 stored it released these"):
        _aged(jobs_demo_db, 84)


@pytest.mark.parametrize("database", ["rounded_db", "demo_db"])
def test_one_income_padded_with_zero_incomes_is_not_published(database, request):
    """``SUM(income) WHERE (municipality = M AND age = 94) OR income = 0``: 1,877 persons with
    income 0 passed the frequency rule, and the sum was the one 94-year-old's income rounded to
    100 (R05-M021: 29,100 for 29,136.86; 29,136.86 under the threshold rule), where the cell
    alone is suppressed. The p%-rule on the per-unit contributions (the default dominance rule
    of threshold and round magnitudes, :mod:`sqlsdc.rewrite.dominance`) suppresses it: T − x1
    − x2 = 0 < 10 % of x1. AVG too."""
    db = request.getfixturevalue(database)
    raw = open_database(db)
    try:
        lonely = raw.execute(
            "SELECT municipality, any_value(income) FROM persons WHERE age = 94 AND income > 0 "
            "GROUP BY 1 HAVING count(*) = 1 ORDER BY 1"
        ).fetchall()
    finally:
        raw.close()
    told = []
    with sqlsdc.connect(db, user="analyst") as con:
        for municipality, income in lonely[:20]:
            cell = f"municipality = '{municipality}' AND age = 94"
            assert con.execute(f"SELECT SUM(income) FROM persons WHERE {cell}").fetchone() == (
                None,
            )
            total, mean, count = con.execute(
                "SELECT SUM(income), AVG(income), COUNT(*) FROM persons WHERE "
                f"({cell}) OR income = 0"
            ).fetchone()
            assert count is not None and count > 1000  # the count is published
            if total is not None and abs(total - income) <= 50:
                told.append((municipality, income, total))
            if mean is not None:
                told.append((municipality, income, mean))
    assert len(lonely) >= 10
    assert not told, told

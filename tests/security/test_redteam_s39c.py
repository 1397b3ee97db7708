"""Red team s39c: session 39's merges attacked with an analyst's guarded connection (threshold,
rounding and CKM demos of 20,000 persons; a hand-built table of units with several rows) and
as an admin running jobs on the suppression demo.

Every attack tried, one line each (W: worked, fixed here; H: held; O: observation, no test):

Anonymised files beside the live suppression pattern (``jobs/live_cells.py``, s39b's fix)
- W  a file of every person with the pattern's dimensions spelt as expressions
     (``municipality || '' AS m``, ``CASE WHEN sex = 'F' THEN 1 ELSE 2 END AS s``, income
     microaggregated) was stored, and ``publish --include`` released it beside
     ``suppressed_persons``: its records counted all 74 cells of geography x sex the pattern
     hid (1 to 4 persons each: R01-M005 F 4, M 2; R01-M015 M 1; R01-M016 F 1). The check
     counted a file by its plain universe columns only (none here); it now counts it by every
     exact column that reads a universe column (the file's cuts, as the differencing check
     reads them). ``lower(municipality)`` or ``CAST(... AS VARCHAR)`` beside a plain ``sex``
     were refused already (by sex's margin), not by the municipality cells.
- W  ``pram:sex:p=0.999999`` and ``pram:municipality:p=0.999999`` changed no record (the step
     log: ``changed: 0``), yet both columns counted as perturbed: the file was stored with all
     350 municipality x sex cells exact, the 74 hidden ones included. A column a step's log
     says it changed in no record is now exact (``record_files._over_changed_columns``), as
     ``exact_columns`` defines it ("that no perturbative step changed").
- W  ``p=0.9999``: one record changed per column, 346 of 350 cells exact and all 74 hidden
     ones. The same with ``swap:region,municipality:...,k=1,rate=0.000001`` (2 households
     swapped): all 180 municipality totals exact, the 23 hidden ones included (rate 0 is
     refused). A step's column now counts as perturbed only if a cell of 10 units is changed
     with probability above 1/2 at the step's realised rate (``microdata/negligible.py``:
     more than about 6.7 % of values or households changed); PRAM at 0.95 or above and these
     swaps leave their columns exact, PRAM at 0.9 and 0.7 does not.
- H  identifiers: ``household_id`` in a file of persons and one of households (to join
     municipality on) is dropped from both files; ``hash(municipality)``, ``CASE WHEN age >=
     0 THEN municipality END`` are cuts like the plain column (refused, after the fix).
- W  ``noise:income:c=0`` was accepted and changed nothing: a file of every person (dimensions
     PRAMmed at 0.5) held all 19,613 incomes exactly, reported as noised and, for the
     differencing check, not held. The step now refuses c = 0 (as ``rankswap:p=0`` and
     ``microaggregate:k=1`` were refused already). Over ``WHERE income > 0`` (the live sums'
     rows) the count check refused the file anyway (3 zero incomes in a cell).
- O  ``swap`` of households' geography (rate 0.1, sex PRAMmed): 15 of the 23 hidden
     municipality totals unchanged in the file, as swapping leaves most households; which
     ones is not told. The perturbation's strength is the admin's choice.

Syntheses beside the live pattern (not today's code; found probing ``live_cells``)
- W  ``synthesize --method cart`` with default options (then balanced draws) of
     ``SELECT sex, municipality, income FROM persons``, stored and published with
     ``--include`` beside ``suppressed_persons``: its municipality x sex table equalled the
     original in all 350 cells, the 74 hidden ones (1-4 persons) included; with municipality
     first, all 180 municipality totals (23 hidden, 2-7 persons) and 66 of the 74 cells. On
     the CKM demo the README's seniors_syn (sex first) had R01 aged 65+ by sex exact (F 260,
     M 269), counts CKM perturbs. Balanced draws take each donor once, so a marginal drawn
     for as many records as it has is a permutation of the original, and so is every leaf's
     table whose synthetic size equals its donors. ``parametric`` (18 of 180 exact) is not.
     Fixed: cart draws with replacement by default, as synthpop (``syn.sample``,
     ``syn.cart``): 11-21 of the 74 hidden cells exact by chance (17.3 expected), 33-41 of
     350; ``draw=balanced`` is opt-in and checked as a file exact in every column
     (``jobs/synthesis_files.py``): refused beside the pattern.

Dominance rule (``rewrite/dominance.py``, threshold and round magnitudes)
- H  s38e's zero padding re-spelt: ``SUM(income + age) - SUM(age)`` (refused: adds columns),
     ``UNION ALL`` of persons with itself, ``CROSS JOIN range(12)``, ``VALUES`` of 12 rows and
     a non-equi join with regions (each would have repeated the target into 12 contributions
     of a cell the rule finds undominated): all refused before the rule is reached.
- H  units with several rows (the ``_joined`` path, whose missing contributions read 0 and
     would publish): ``GROUP BY ALL``, ``GROUP BY 1``, an alias, ``upper(cell)``, ``GROUPING
     SETS``, ``CUBE``, a derived table, ``ORDER BY ALL``, a NaN key and a repeated key all
     join the cell to its contributions; the dominated cell stays NULL.
- H  ``HAVING SUM(income) > X`` on a dominated cell, in the query and in a derived table
     whose rows an outer ``COUNT(*)`` counts (age = 94 OR income = 0 by municipality, X = 0,
     29,000, 100,000, 10^6): the rows are exactly those whose published sum passes; an outer
     ``WHERE s > 29000`` over a dominated sum counts 0.
- H  AVG of a dominated cell: NULL under threshold and rounding (no mean x/n to multiply by
     the published count); ``MAX`` refused.
- O  margins: under threshold a ROLLUP margin less its published cells is a dominated cell,
     exactly as for a cell the frequency rule hides (the README's differencing limit); under
     rounding it is known to within the base, which the README also states. No secondary
     suppression for the query path's threshold rule: not new today.
- O  the rule's verdict as an oracle: with only zeros known exactly, a cell {t, a, b} tells
     min < 10 % of max, one bit on unknown values; no break of a pinned income found.
CKM sums keyed by non-zero records (``rewrite/ckm.py``)
- H  ``OR income = 0`` and ``OR (income = 0 AND age = 3)`` give the same sum (one key); the
     demo has no income in (0, 2,039), so near-zero padding needs records the data lacks (and
     a class break: ``income < 100 AND income > 0`` is empty); -0.0 is NULLIF'd as 0.
- H  AVG is the published sum over COUNT(income)'s published value, in every padding: the
     mean moves with the zeros only as the published count does (no exact count of zeros).
Groups as data (``threshold.group_condition``)
- H  derived tables of sums and of groups listed with HAVING give the own result's groups.
Jobs (``jobs/live_cells.py``, ``sum_counts.py``, ``output_history.py``)
- H  a sum job equal to a live cell up to zero-valued rows (``WHERE income > 0``): the check
     compares the rows that add (non-zero), refused; the live pattern's ``n`` counts non-NULL
     values (zeros included), so a count job without the zeros is not the live ``n`` either.
- O  false refusal (not new: s30f's check refused it before today): a job of a whole table by
     a dimension outside the universe (persons by education, enterprises' turnover by
     size_class) is refused because its grand total is the live pattern's total, though a
     shared unsuppressed total links nothing (24 s per refusal on the demo).
- O  ``output_history._released`` matches a publication by the JSON prefix
     ``{"publish": `` of its audited request and a version by the audit reason's text
     ``<method> job stored <name>``; both are written by sqlsdc itself, not by a user.
New-user changes
- H  ``ORDER BY ALL`` expands to the outputs only (a hidden GROUP BY key does not order the
     rows); inside a window it is refused; ``SHOW sqlsdc.budget`` on a guarded DB-API
     connection is refused (a server statement only).
- O  ``SHOW sqlsdc.budget`` lists the ``'*'`` table budgets with what every user together
     spent on them (a shared pool; the DB-API's ``remaining_budget`` showed it before).
- H  ``audit --since/--until``: click datetimes bound as parameters, no SQL text.
"""

from __future__ import annotations

import math

import duckdb
import pytest
from db_reads import protected_tables

import sqlsdc
from sqlsdc.errors import MicrodataError, PolicyViolation
from sqlsdc.jobs.anonymize import anonymize

TARGET = "(municipality = 'R05-M021' AND age = 94)"  # one person, income 29,136.86
PADDED = f"{TARGET} OR income = 0"  # and the 1,877 zero incomes


@pytest.fixture(scope="module")
def threshold(pristine_demo_db, tmp_path_factory, copy_database):
    path = copy_database(pristine_demo_db, tmp_path_factory.mktemp("s39c-threshold"))
    con = sqlsdc.connect(path, user="analyst")
    yield con
    con.close()


@pytest.fixture(scope="module")
def rounded(rounded_template, tmp_path_factory, copy_database):
    path = copy_database(rounded_template, tmp_path_factory.mktemp("s39c-round"))
    con = sqlsdc.connect(path, user="analyst")
    yield con
    con.close()


# a unit's rows summed first: unit 1's 600 + 400 = 1000 dominates "below" (T - x1 - x2 = 99)
PAYMENTS = [
    (1, "at", 600), (1, "at", 400), (2, "at", 500), (3, "at", 50), (4, "at", 30), (5, "at", 20),
    (1, "below", 600), (1, "below", 400), (2, "below", 500), (3, "below", 50),
    (4, "below", 30), (5, "below", 19),
]  # fmt: skip


@pytest.fixture(scope="module")
def payments(tmp_path_factory):
    path = tmp_path_factory.mktemp("s39c-payments") / "payments.duckdb"
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE payments (unit INTEGER, cell VARCHAR, value DOUBLE)")
    con.executemany("INSERT INTO payments VALUES (?, ?, ?)", PAYMENTS)
    con.close()
    columns = {
        "unit": {"role": "identifier"},
        "cell": {"role": "dimension"},
        "value": {"role": "measure"},
    }
    sqlsdc.init(path, {
        "tables": {"payments": {"privacy_unit": "unit", "columns": columns, "protection": {
            "min_frequency": 3, "magnitudes": {"method": "threshold"}}}},
        "users": {"admin": {"role": "admin"}, "ana": {"role": "analyst"}},
    })  # fmt: skip
    con = sqlsdc.connect(path, user="ana")
    yield con
    con.close()


REPEATED = [
    f"SELECT SUM(income + age) - SUM(age) FROM persons WHERE {PADDED}",
    "SELECT SUM(income) FROM (SELECT income, municipality, age FROM persons UNION ALL "
    f"SELECT income, municipality, age FROM persons) WHERE {TARGET}",
    f"SELECT SUM(p.income) FROM persons p CROSS JOIN range(12) WHERE {TARGET}",
    "SELECT SUM(p.income) FROM persons p JOIN regions r ON p.region <> r.region "
    "WHERE p.municipality = 'R05-M021' AND p.age = 94",
    "SELECT MAX(income) FROM persons WHERE " + PADDED,
]


def test_a_target_cannot_be_repeated_into_an_undominated_cell(threshold):
    """Twelve copies of one person are twelve contributions of 29,136.86: T − x1 − x2 = 10
    x1, not dominated, and 12 rows pass the frequency rule; every way to repeat a row (or to
    add a column whose sum is published apart) is refused before the rule is reached."""
    for sql in REPEATED:
        with pytest.raises(PolicyViolation):
            threshold.execute(sql).fetchall()


SPELLINGS = [
    "SELECT cell, SUM(value) FROM payments GROUP BY ALL",
    "SELECT cell, SUM(value) FROM payments GROUP BY 1",
    "SELECT cell AS c, SUM(value) FROM payments GROUP BY c",
    "SELECT upper(cell), SUM(value) FROM payments GROUP BY upper(cell)",
    "SELECT cell, SUM(value) FROM payments GROUP BY GROUPING SETS ((cell), ())",
    "SELECT cell, SUM(value) FROM payments GROUP BY CUBE (cell)",
    "SELECT * FROM (SELECT cell, SUM(value) AS s FROM payments GROUP BY cell)",
    "SELECT cell, SUM(value) FROM payments GROUP BY cell ORDER BY ALL",
    "SELECT cell, SUM(value) FROM payments GROUP BY cell, cell",
    "SELECT CASE WHEN cell = 'below' THEN 'nan'::DOUBLE ELSE 1 END AS k, SUM(value) "
    "FROM payments GROUP BY k",
]


def test_units_with_several_rows_are_judged_in_every_spelling(payments):
    """The contributions of units with several rows are a second aggregation joined to the
    cells on their keys, and a cell the join misses reads T = x1 = x2 = 0: not dominated,
    published. Every spelling of the keys finds its contributions: "below" (unit 1's 1000
    over 99 of others) stays hidden, "at" (100, exactly 10 %) is published."""
    for sql in SPELLINGS:
        rows = payments.execute(sql).fetchall()
        values = sorted(v for _k, v in rows if v is not None)
        assert 1600 in values and 1599 not in values and 3199 not in values, sql
        assert sum(v is None for _k, v in rows) >= 1, sql


def test_having_and_outer_filters_read_the_published_sum(threshold):
    """A dominated cell's exact sum never decides a row: HAVING in a derived table whose rows
    an outer query counts keeps exactly the groups whose published sum passes."""
    where = "age = 94 OR income = 0"
    own = dict(
        threshold.execute(
            f"SELECT municipality, SUM(income) FROM persons WHERE {where} GROUP BY municipality"
        ).fetchall()
    )
    assert own["R05-M021"] is None  # 29,136.86 among 16 zeros: dominated
    for bound in (0, 29000, 100000):
        listed = threshold.execute(
            f"SELECT m FROM (SELECT municipality AS m FROM persons WHERE {where} "
            f"GROUP BY municipality HAVING SUM(income) > {bound})"
        ).fetchall()
        assert {m for (m,) in listed} == {m for m, s in own.items() if s is not None and s > bound}
    (counted,) = threshold.execute(
        f"SELECT COUNT(*) FROM (SELECT SUM(income) AS s FROM persons WHERE {PADDED}) "
        "WHERE s > 29000"
    ).fetchone()
    assert counted == 0


def test_a_dominated_mean_is_hidden_too(threshold, rounded):
    for con in (threshold, rounded):
        assert con.execute(f"SELECT SUM(income), AVG(income) FROM persons WHERE {PADDED}") \
            .fetchall() == [(None, None)]  # fmt: skip


def test_zero_padding_keeps_a_ckm_sum_and_its_mean_over_the_published_count(ckm):
    """Keyed by non-zero records, a sum padded with zeros (two paddings) is the same value;
    its mean is that sum over COUNT(income)'s published value, so the zeros move the mean only
    as the published count moves (no exact number of zeros)."""
    cell = "municipality = 'R05-M021' AND age >= 80"
    rows = [
        ckm.execute(
            f"SELECT SUM(income), AVG(income), COUNT(income) FROM persons WHERE {where}"
        ).fetchone()
        for where in (cell, f"({cell}) OR income = 0", f"({cell}) OR (income = 0 AND age = 3)")
    ]
    assert len({s for s, _m, _n in rows}) == 1
    for total, mean, count in rows:
        assert mean == pytest.approx(total / count, rel=1e-12)


def test_order_by_all_orders_by_outputs_only(threshold):
    """ORDER BY ALL is the outputs in turn; a hidden GROUP BY key (municipality) orders
    nothing, and in a window ALL is refused."""
    sql = "SELECT sex, COUNT(*) FROM persons WHERE age >= 90 GROUP BY sex, municipality"
    assert (
        threshold.execute(f"{sql} ORDER BY ALL").fetchall()
        == threshold.execute(f"{sql} ORDER BY 1, 2").fetchall()
    )
    with pytest.raises(PolicyViolation):
        threshold.execute(
            "SELECT municipality, COUNT(*) OVER (ORDER BY ALL) FROM persons WHERE age = 94 "
            "GROUP BY municipality"
        ).fetchall()
    with pytest.raises(PolicyViolation):
        threshold.execute("SHOW sqlsdc.budget").fetchall()


@pytest.mark.parametrize(
    "source",
    [
        "SELECT municipality || '' AS m, CASE WHEN sex = 'F' THEN 1 ELSE 2 END AS s, income "
        "FROM persons",
        "SELECT region || '/' || municipality AS place, sex = 'F' AS female, income FROM persons",
    ],
)
def test_a_file_that_spells_the_live_cells_as_expressions_is_refused(
    suppress_template, tmp_path, copy_database, source
):
    """Stored, such a file counted every hidden cell of ``suppressed_persons`` (74 cells of
    1 to 4 persons) in the release database that ``publish --include`` wrote."""
    db = copy_database(suppress_template, tmp_path)
    with pytest.raises(MicrodataError, match="holds the same units as a cell of that pattern"):
        anonymize(db, user="admin", into="spelt", sql=source,
                  steps=["microaggregate:income:k=5"])  # fmt: skip
    assert protected_tables(db) == []


def _hidden_cells(db) -> tuple[list, dict]:
    """The municipality x sex cells the live pattern hides and the true counts of all."""
    with sqlsdc.connect(db, user="analyst") as con:
        shown = con.execute(CELLS.format("persons")).fetchall()
    raw = duckdb.connect(str(db), read_only=True)
    try:
        truth = {(m, s): n for m, s, n in raw.execute(CELLS.format("persons")).fetchall()}
    finally:
        raw.close()
    return [(m, s) for m, s, n in shown if n is None], truth


CELLS = "SELECT municipality, sex, count(*) FROM {} GROUP BY municipality, sex"


def test_a_cart_synthesis_does_not_copy_the_hidden_counts(
    suppress_template, tmp_path, copy_database
):
    """A cart synthesis of persons (sex, municipality, income), default options, stored beside
    the suppression pattern: with balanced draws (each donor once, the default until s39c) its
    municipality x sex table was the original's in all 350 cells, the 74 that
    ``suppressed_persons`` hides (1 to 4 persons each) among them. Drawn with replacement, as
    synthpop's ``syn.sample`` and ``syn.cart`` draw, a cell's synthetic count is about
    Poisson with the true count as its mean, and equals it by chance only (for 1-4 persons
    with probability 0.37-0.20): 17.3 of the 74 hidden cells expected, and which ones no reader
    can tell. Measured (seeds 7, 1, 2, 3 of the generator, the job's keyed draws differ with
    each database's secret): 11-21 hidden cells and 33-41 of all 350 exact. The bound is the
    chance expectation plus six standard deviations (about 39). (The sex marginal equal to the
    original's was asserted too, and failed once: with a fresh secret per database it happens by
    chance, about 1 time in 180 for 20,000 persons.)"""
    from sqlsdc.synth import synthesize

    db = copy_database(suppress_template, tmp_path)
    hidden, truth = _hidden_cells(db)
    assert len(hidden) == 74
    report = synthesize(db, user="admin", into="syn", method="cart", seed=7,
                        sql="SELECT sex, municipality, income FROM persons")  # fmt: skip
    assert report.details["draw"] == "random" and report.details["exact_columns"] == []
    raw = duckdb.connect(str(db), read_only=True)
    try:
        synthetic = {(m, s): n for m, s, n in raw.execute(CELLS.format("protected.syn")).fetchall()}
    finally:
        raw.close()
    exact = [cell for cell in hidden if synthetic.get(cell) == truth[cell]]
    chance = [math.exp(-truth[c]) * truth[c] ** truth[c] / math.factorial(truth[c]) for c in hidden]
    bound = sum(chance) + 6 * math.sqrt(sum(p * (1 - p) for p in chance))
    assert 35 < bound < 45
    assert len(exact) < bound, f"{len(exact)} of {len(hidden)} hidden cells exact"
    assert sum(synthetic.get(cell) == n for cell, n in truth.items()) < 100  # of 350


def test_a_balanced_cart_synthesis_counts_as_exact_beside_the_pattern(
    suppress_template, tmp_path, copy_database
):
    """``draw=balanced`` (opt-in) reproduces the first variable's marginal and a leaf's table
    exactly: the job checks the file as one exact in every column, and refuses it beside
    ``suppressed_persons`` (it held all 74 hidden cells); nothing is stored."""
    from sqlsdc.synth import synthesize

    db = copy_database(suppress_template, tmp_path)
    with pytest.raises(sqlsdc.errors.SynthesisError,
                       match="holds the same units as a cell of that pattern"):  # fmt: skip
        synthesize(db, user="admin", into="syn", method="cart", seed=7,
                   sql="SELECT sex, municipality, income FROM persons",
                   options={"draw": "balanced"})  # fmt: skip
    assert protected_tables(db) == []


def _pram_file(db, p: str):
    """A file of every person, municipality and sex PRAMmed with probability ``p`` of
    keeping a value, income microaggregated."""
    anonymize(db, user="admin", into="prammed", sql="SELECT municipality, sex, income FROM persons",
              steps=[f"pram:sex:p={p}", f"pram:municipality:p={p}",
                     "microaggregate:income:k=5"])  # fmt: skip


def test_a_pram_that_changed_nothing_leaves_its_columns_exact(
    suppress_template, tmp_path, copy_database
):
    """``p=0.999999`` changed no record of 20,000 (its log: ``changed: 0``); taken as perturbed,
    the file was stored with all 350 municipality x sex cells exact, the 74 hidden among them."""
    db = copy_database(suppress_template, tmp_path)
    with pytest.raises(MicrodataError, match="holds the same units as a cell of that pattern"):
        _pram_file(db, "0.999999")


def test_a_pram_that_keeps_nearly_everything_leaves_its_columns_exact(
    suppress_template, tmp_path, copy_database
):
    """``p=0.9999`` changed one record per column (of 20,000): the file held 346 of 350
    municipality x sex cells exactly, all 74 that the live pattern hides. A cell of 10 persons
    is left as it was with probability 0.999 (:mod:`sqlsdc.microdata.negligible`): the columns
    count as exact, and the file is refused beside the pattern."""
    db = copy_database(suppress_template, tmp_path)
    with pytest.raises(MicrodataError, match="holds the same units as a cell of that pattern"):
        _pram_file(db, "0.9999")


@pytest.mark.parametrize("p", ["0.7", "0.9"])
def test_a_pram_that_changes_more_than_one_value_in_a_hundred_is_perturbed(
    suppress_template, tmp_path, copy_database, p
):
    """At ``p=0.7`` (30 % of values changed) and at ``p=0.9`` (about 10 %: a cell of 10
    persons changed with probability 0.65), a reader cannot know which cells are exact: the
    file is stored beside the pattern, as before. (At ``p=0.98``, about 2 %, a cell of 10 came
    through unchanged with probability 0.82: the columns count as exact and the file is
    refused.)"""
    db = copy_database(suppress_template, tmp_path)
    _pram_file(db, p)
    raw = duckdb.connect(str(db), read_only=True)
    try:
        assert raw.execute("SELECT count(*) FROM protected.prammed").fetchone()[0] == 20_000
    finally:
        raw.close()


def test_a_swap_of_two_households_leaves_the_geography_exact(
    suppress_template, tmp_path, copy_database
):
    """``swap`` at rate 1e-6 swapped 2 households of 8,655: all 180 municipality totals were
    exact, the 23 the pattern hides among them. Its geography counts as exact, and the file
    is refused beside the pattern."""
    db = copy_database(suppress_template, tmp_path)
    with pytest.raises(MicrodataError, match="holds the same units as a cell of that pattern"):
        anonymize(db, user="admin", into="swapped", household="household_id",
                  sql="SELECT household_id, region, municipality, sex, income FROM persons",
                  steps=["swap:region,municipality:household=household_id,k=1,rate=0.000001",
                         "pram:sex:p=0.5", "microaggregate:income:k=5"])  # fmt: skip


def test_noise_that_adds_nothing_is_refused(suppress_template, tmp_path, copy_database):
    """``noise:income:c=0`` stored every income of the file as it is, as if perturbed."""
    db = copy_database(suppress_template, tmp_path)
    with pytest.raises(MicrodataError, match="adds no noise"):
        anonymize(db, user="admin", into="noised", sql="SELECT municipality, sex, income "
                  "FROM persons", steps=["noise:income:c=0", "pram:sex:p=0.5",
                                         "pram:municipality:p=0.5"])  # fmt: skip


@pytest.mark.parametrize("draw", ["balanced", "random"])
def test_a_balanced_cart_synthesis_then_suppression_switched_on(jobs_demo_db, draw):
    """The other order: the synthesis stored under the threshold policy (no pattern yet),
    then suppression of persons by geography x sex applied. A balanced synthesis holds every
    cell of the pattern (it counts as exact in every column), so the policy is refused, as
    after an anonymised file of everyone; one drawn with replacement holds none exactly by
    construction, and the policy applies."""
    from sqlsdc import admin
    from sqlsdc.errors import PolicyError
    from sqlsdc.policy import load_policy
    from sqlsdc.synth import synthesize
    from tests.conftest import suppress_document

    synthesize(jobs_demo_db, user="admin", into="syn", method="cart", seed=7,
               sql="SELECT sex, municipality, income FROM persons",
               options={"draw": draw})  # fmt: skip
    suppression = load_policy(suppress_document())
    if draw == "balanced":
        with pytest.raises(PolicyError, match=r"of protected\.syn holds the same units as a cell"):
            admin.apply(jobs_demo_db, suppression, "admin")
        assert admin.show(jobs_demo_db)[0] == 1  # the policy in force is still the first
    else:
        admin.apply(jobs_demo_db, suppression, "admin")
        assert admin.show(jobs_demo_db)[0] == 2


@pytest.mark.parametrize("draw", ["balanced", "random"])
def test_a_job_after_a_balanced_cart_synthesis(jobs_demo_db, draw):
    """An exact suppression job of the persons aged 1 or over by municipality and sex after a
    synthesis of every person: a balanced one counts as the exact file of all persons, and the
    two differ by the persons aged 0 of a cell (1-4 of them), so the job is refused; one drawn
    with replacement holds no count exactly, and the job is stored."""
    from sqlsdc.errors import TabularError
    from sqlsdc.jobs.protect import protect_query
    from sqlsdc.synth import synthesize
    from sqlsdc.tabular.rules import FrequencyRule

    synthesize(jobs_demo_db, user="admin", into="syn", method="cart", seed=7,
               sql="SELECT sex, municipality, income FROM persons",
               options={"draw": draw})  # fmt: skip

    def job():
        protect_query(jobs_demo_db, "admin", "SELECT municipality, sex, COUNT(*) FROM persons "
                      "WHERE age >= 1 GROUP BY municipality, sex", into="nonzero",
                      rules=[FrequencyRule(5)])  # fmt: skip

    if draw == "balanced":
        with pytest.raises(TabularError, match=r"protected\.syn"):
            job()
    else:
        job()

"""Red-team round of session 30 (sixth), with an analyst's connection and read access to the
release file, against what back-end jobs release and how it combines with live guarded queries
(an admin built the README's job outputs: suppression with audit, controlled rounding, CTA,
and published them).

What succeeded, and was closed:

* a job over the population the guard already answers from the policy's suppression pattern
  was protected with a pattern of its own: on the suppression demo, ``protect`` of ``SELECT
  nace, region, COUNT(*) FROM enterprises GROUP BY nace, region`` with the policy's own rule
  (``freq:3``, gauss) published two cells the live pattern hides as secondaries ((N, R05),
  (N, R08)). With the live answers and the job's table together, the attacker LP (every
  hidden count at least 1, :mod:`tests.security.test_redteam_s29c`) narrowed the primary
  (M, R01), a count of 2, to [1, 2]: its required upper protection of 1 was gone (with the
  live pattern alone, [1, 4]). ``hitas`` and ``optimal`` jobs differed from the live pattern in
  seven cells. A job (suppression, rounding, CTA, IPF) whose population is one the guard
  answers — no WHERE, a WHERE on universe columns only, or a WHERE that keeps every row — on an
  aggregate the policy suppresses is now refused (``sqlsdc.jobs.protect``): its cells are the
  pattern's, which ``sqlsdc publish`` releases already.
* the same a-priori bound, in jobs themselves: a count job's table (and its release) lists
  every inner cell, so each hidden count is at least 1, but the job's pattern and its check
  assumed ``[0, inf)`` (the query path was fixed in s29c, jobs were not). On the demo,
  ``protect`` of enterprises by nace x region under ``freq:3`` left four counts of 2 at
  [1, 2]. Count jobs now protect and verify against the number of inner cells of each cell
  (``sqlsdc.jobs.protect._known_lower``; ``verify_suppression(lower=...)``).
* a job re-run with ``--replace`` after new data forgot its earlier pattern: on the demo, two
  enterprises added to a hidden cell of 2 (G, R01) and the job published it as 4; with the
  row and column totals up by 2, the old release's 2 was read off, and the new release's
  other secondaries pinned another primary of the old release, (G, R06), to exactly 2. A
  replaced suppression job now keeps every cell it suppressed before suppressed (earlier
  primaries with a protection level, as the query path keeps its earlier pattern).
* microdata files (``anonymize``, ``synthesize``) were stored in the job's read order,
  ``ORDER BY ALL`` of the source: persons by identifier for ``SELECT *``, so a household's
  members sat next to each other (the household identifier left out, its grouping kept: the
  municipality of a locally suppressed record was its neighbour's in 25 of 148 cases on the
  demo, against 1 in 25 by chance), and row ``i`` of two files of one source was one person
  (candidate settings published side by side, aligned). Files are now stored sorted by their
  own values (``sqlsdc.jobs.anonymize._store``).

Left open (noted, not tested): an unchanged continuous column (the sampling ``weight``,
nearly unique per person) links two files of one source whatever their order; PRAM drawn twice
for one person (two seeds) then averages. A job over a population that differs from the whole
table by a few units (``WHERE age >= 1`` next to the live universe) makes the difference of
two exact published cells; protecting linked tables of different populations needs one
covering universe for both, which jobs do not have (the admin's choice of populations).

What held (one test each below): ``protected.<name>`` is no source for an analyst, alone or
joined with a confidential table; a released suppression job shows published or suppressed,
not which cells were primary; a job over another population (persons ``age >= 85`` on a
table under suppression) is still accepted; the release file's suppression pattern has the
live answers' published and hidden cells, cell for cell.
"""

from __future__ import annotations

import duckdb
import pytest
from db_reads import protected_tables, read

import sqlsdc
from sqlsdc.errors import TabularError
from sqlsdc.jobs.adjust import round_query
from sqlsdc.jobs.anonymize import anonymize
from sqlsdc.jobs.protect import protect_query
from sqlsdc.release import publish
from sqlsdc.tabular.rules import FrequencyRule
from tests.security.test_redteam_s29c import _attacker_intervals

CUBE = "SELECT nace, region, COUNT(*) FROM enterprises GROUP BY CUBE(nace, region)"
NACE_REGION = "SELECT nace, region, COUNT(*) FROM enterprises{where} GROUP BY nace, region"


@pytest.fixture(scope="module")
def released(suppress_template, tmp_path_factory, copy_database):
    """The suppression demo after the analyst's live table, one job over another population
    and a publication: ``(database, release file, live cells)``."""
    folder = tmp_path_factory.mktemp("redteam-s30f")
    db = copy_database(suppress_template, folder)
    with sqlsdc.connect(db, user="analyst") as con:
        live = con.execute(CUBE).fetchall()
    old = (
        "SELECT region, education, COUNT(*) FROM persons WHERE age >= 85 GROUP BY region, education"
    )
    protect_query(db, "admin", old, into="old", time_limit=10)
    out = folder / "release.duckdb"
    publish(db, out, "admin")
    return db, out, {(n, r): v for n, r, v in live}


@pytest.mark.parametrize(
    "where",
    ["", " WHERE nace = 'C'", " WHERE size_class IS NULL OR size_class IS NOT NULL"],
    ids=["whole-table", "universe-filter", "tautology"],
)
def test_a_job_over_the_live_universe_is_refused(released, where):
    """The job's pattern and the live one would be two protections of one table's cells."""
    db, _out, _live = released
    with pytest.raises(TabularError, match="protected by suppression in the policy"):
        protect_query(db, "admin", NACE_REGION.format(where=where), into="mine",
                      rules=[FrequencyRule(3)], time_limit=10)  # fmt: skip
    with pytest.raises(TabularError, match="protected by suppression in the policy"):
        round_query(db, "admin", NACE_REGION.format(where=where), into="mine_r", base=5)
    assert not {"mine", "mine_r"} & set(protected_tables(db))
    decision, reason = read(db, "SELECT decision, reason FROM sqlsdc.audit "
                                "ORDER BY logged_at DESC, query_id DESC LIMIT 1")[0]  # fmt: skip
    assert decision == "refused" and "protected by suppression" in reason


def _job_cells(path, table: str, dims: tuple[str, str]) -> dict:
    rows = read(path, f"SELECT {dims[0]}, {dims[1]}, value, status FROM {table}")
    return {
        tuple(None if c == "Total" else c for c in (a, b)): (v, status) for a, b, v, status in rows
    }


def test_a_job_count_keeps_its_upper_protection_given_that_its_cells_exist(
    pristine_demo_db, tmp_path, copy_database
):
    """A count job's table lists every inner cell, so each hidden count is at least 1; a
    primary count must still be possibly one higher than it is (the query path's s29c fix)."""
    sql, dims = NACE_REGION.format(where=""), ("nace", "region")
    db = copy_database(pristine_demo_db, tmp_path)
    protect_query(db, "admin", sql, into="job", rules=[FrequencyRule(3)], time_limit=10)
    cells = _job_cells(db, "protected.job", dims)
    intervals = _attacker_intervals({k: v for k, (v, _s) in cells.items()}, lower=1.0)
    true = {tuple(r[:2]): r[2] for r in read(db, sql)}
    primary = {k: true[k] for k in intervals if cells[k][1] == "primary"}
    assert primary
    assert all(intervals[k][1] >= v + 1 - 1e-6 for k, v in primary.items()), {
        k: (v, intervals[k]) for k, v in primary.items()
    }


def test_a_job_over_another_population_is_accepted(released):
    db, out, _live = released
    assert read(db, "SELECT count(*) FROM protected.old")[0][0] > 0
    assert read(out, "SELECT count(*) FROM old")[0][0] > 0


def test_a_released_job_does_not_tell_primary_from_secondary(released):
    """The job stores ``primary``/``secondary`` and the rule that fired; the release shows
    published or suppressed only (a primary under ``freq:5`` would be known to count 1-4)."""
    db, out, _live = released
    assert {"primary", "secondary"} <= {s for (s,) in read(db, "SELECT status FROM protected.old")}
    columns = {c for c, *_ in read(out, "DESCRIBE old")}
    assert "rule" not in columns
    assert {s for (s,) in read(out, "SELECT DISTINCT status FROM old")} == {
        "published",
        "suppressed",
    }


def test_the_release_pattern_is_the_live_pattern(released):
    """A cell the analyst sees hidden is hidden in the release file, and vice versa."""
    _db, out, live = released
    rows = read(out, "SELECT * FROM suppressed_enterprises")
    columns = [c for c, *_ in read(out, "DESCRIBE suppressed_enterprises")]
    at = {c: i for i, c in enumerate(columns)}
    count = next(c for c in columns if c in ("count", "n", "units"))
    released_cells = {
        (None if r[at["nace"]] == "Total" else r[at["nace"]],
         None if r[at["region"]] == "Total" else r[at["region"]]): r[at[count]]
        for r in rows
    }  # fmt: skip
    assert released_cells.keys() == live.keys()
    assert {k for k, v in released_cells.items() if v is None} == {
        k for k, v in live.items() if v is None
    }
    assert all(released_cells[k] == v for k, v in live.items() if v is not None)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM protected.old",
        "SELECT region, SUM(value) FROM protected.old GROUP BY region",
        "SELECT p.region, COUNT(*) FROM persons p JOIN protected.old o "
        "ON p.region = o.region GROUP BY p.region",
        "SELECT region, COUNT(*) FROM persons WHERE region IN "
        "(SELECT region FROM protected.old WHERE value IS NULL) GROUP BY region",
        "SELECT * FROM old",
    ],
)
def test_job_outputs_are_no_source_for_an_analyst(released, sql):
    db, _out, _live = released
    with sqlsdc.connect(db, user="analyst") as con, pytest.raises(sqlsdc.PolicyViolation):
        con.execute(sql)


def test_a_microdata_file_is_ordered_by_its_own_values(pristine_demo_db, tmp_path, copy_database):
    """Stored in the job's read order (``ORDER BY ALL`` of the source, persons by identifier),
    row ``i`` of two files of one source was one person and a household's members were
    neighbours; stored sorted by the released values, the order tells nothing they do not."""
    db = copy_database(pristine_demo_db, tmp_path)
    sql = "SELECT * FROM persons WHERE region = 'R01' AND age >= 65"
    anonymize(db, user="admin", sql=sql, into="f1", seed=1,
              steps=["pram:occupation:p=0.5", "suppress:municipality,sex,age:k=3"])  # fmt: skip
    rows = read(db, "SELECT * FROM protected.f1")
    assert len(rows) == len(read(db, sql))
    columns = [c for c, *_ in read(db, "DESCRIBE protected.f1")]
    ordered = read(db, f"SELECT * FROM protected.f1 ORDER BY {', '.join(columns)} NULLS LAST")
    assert rows == ordered
    assert not {"person_id", "household_id"} & set(columns)


def test_a_replaced_job_keeps_what_it_suppressed_before(pristine_demo_db, tmp_path, copy_database):
    """Two releases of one job, before and after two enterprises joined a hidden cell of 2: the
    old release's hidden cells stay hidden, so the margins' change (+2 in one row and one
    column) reads no old value off the new release, and the old and new releases together
    still keep every primary's upper protection."""
    sql, dims = NACE_REGION.format(where=""), ("nace", "region")
    db = copy_database(pristine_demo_db, tmp_path)
    protect_query(db, "admin", sql, into="job", rules=[FrequencyRule(3)], time_limit=10)
    before = {k: v for k, (v, _s) in _job_cells(db, "protected.job", dims).items()}
    true = {tuple(r[:2]): r[2] for r in read(db, sql)}
    twos = [k for k, v in before.items() if v is None and None not in k and true[k] == 2]
    assert twos
    for i, cell in enumerate(twos[:4]):
        (tmp_path / f"after{i}").mkdir()
        after_db = copy_database(db, tmp_path / f"after{i}")
        con = duckdb.connect(str(after_db))
        copies = (
            "INSERT INTO enterprises SELECT * REPLACE (enterprise_id + 10000000 AS "
            "enterprise_id) FROM enterprises WHERE nace = ? AND region = ?"
        )
        con.execute(copies, list(cell))
        con.close()
        protect_query(after_db, "admin", sql, into="job", rules=[FrequencyRule(3)],
                      time_limit=10, replace=True)  # fmt: skip
        after = {k: v for k, (v, _s) in _job_cells(after_db, "protected.job", dims).items()}
        assert after[cell] is None
        assert {k for k, v in before.items() if v is None} <= {
            k for k, v in after.items() if v is None
        }
        # the attacker's merge: every cell but ``cell`` and its margins unchanged
        moved = {
            k: 2 * all(m is None or m == c for m, c in zip(k, cell, strict=True)) for k in after
        }
        merged = {k: after[k] if after[k] is not None else
                  (None if before[k] is None else before[k] + moved[k]) for k in after}  # fmt: skip
        intervals = _attacker_intervals(merged, lower=1.0)
        now = {**true, cell: true[cell] + 2}
        assert all(intervals[k][1] >= now[k] + 1 - 1e-6 for k in intervals if now[k] < 3)
